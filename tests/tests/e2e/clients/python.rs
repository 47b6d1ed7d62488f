//! The Python package: mypy (strict), its pytest suite against a secured pair, its README's
//! examples as written, and its follow iterator across a runner kill.

use serde_json::json;

use super::*;
use arbor_tests::tools::{python_client, run, target_dir};

fn package() -> PathBuf {
    root().join("clients/python")
}

/// A python of the package's virtualenv, with bytecode and caches kept out of the checkout.
fn python(py: &Path) -> Command {
    let mut cmd = Command::new(py);
    cmd.env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1");
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_package_type_checks_and_passes_its_tests_against_the_services() {
    let py = python_client();
    run(
        std::process::Command::new(&py)
            .args(["-m", "mypy", "--cache-dir"])
            .arg(target_dir().join("mypy-cache"))
            .current_dir(package()),
        "mypy --strict on clients/python (pyproject.toml [tool.mypy])",
    );
    let (cluster, tokens) = Cluster::start_secure(arbor_tests::Profile::Debug).await;
    let mut cmd = python(&py);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(package())
        .envs(service_env(&cluster, &tokens));
    suite(cmd, "pytest clients/python/tests").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_readme_examples_run_as_written() {
    let py = python_client();
    let examples = readme_examples(
        &package().join("README.md"),
        "python",
        &["approve", "tool", "suspensions"],
    );
    let dir = scratch("python-examples");
    for (name, code) in &examples {
        std::fs::write(dir.join(format!("{name}.py")), code).unwrap();
    }
    let cluster = Cluster::start(arbor_tests::Profile::Debug).await;
    let example = |name: &str, extra: &[(&str, &str)]| {
        let mut cmd = python(&py);
        cmd.arg(dir.join(format!("{name}.py")))
            .env("ARBOR_RUNNER", cluster.runner.addr.to_string())
            .env("ARBOR_APPROVAL", cluster.approval.addr.to_string())
            .envs(extra.iter().map(|(k, v)| (*k, *v)));
        cmd
    };

    // Follow every suspension of a thread: two runs in it, each suspended at its gate.
    let thread = format!("py-example-{}", uuid::Uuid::new_v4().simple());
    let follower = Running::spawn(example("suspensions", &[("ARBOR_THREAD", &thread)]));
    let tree = flow::submit(&cluster, gate_tree("py-example-gate", "failure"), None).await;
    let mut runner = cluster.runner_client().await;
    let mut runs = Vec::new();
    for _ in 0..2 {
        let req = rpb::SubmitRunRequest {
            tree_id: tree.tree_id.clone(),
            thread_id: thread.clone(),
            ..Default::default()
        };
        runs.push(
            runner
                .submit_run(req)
                .await
                .unwrap()
                .into_inner()
                .run
                .unwrap()
                .run_id,
        );
    }
    for run_id in &runs {
        follower
            .line("the follower to print the run's suspension", |l| {
                l.contains(run_id) && l.contains("Ship it?")
            })
            .await;
    }

    // Approve from Python: every pending approval (three: the two of the thread, and the first).
    for run_id in runs.iter().chain([&tree.run_id]) {
        flow::approval_of(&cluster, run_id, apb::ApprovalState::Pending).await;
    }
    Running::spawn(example("approve", &[]))
        .success("the approve example")
        .await;
    for run_id in runs.iter().chain([&tree.run_id]) {
        flow::wait_run(&cluster, run_id, rpb::RunStatus::Succeeded).await;
    }
    follower.kill().await;

    // A tool in Python: it serves a run, then stops cleanly on SIGTERM.
    let tool = Running::spawn(example("tool", &[]));
    let doc = json!({"id": "py-example-tool", "version": 1, "task_types": ["py.summarise"],
        "root": {"type": "tool", "name": "summarise", "tool": "py.summarise",
                 "args": {"text": "one two three"}, "output": "summary"}});
    let run = flow::submit(&cluster, doc.to_string(), None).await;
    let done = flow::wait_run(&cluster, &run.run_id, rpb::RunStatus::Succeeded).await;
    let board = serde_json::Value::Object(arbor_shared::json::from_proto_struct(
        done.blackboard.as_ref().unwrap(),
    ));
    assert_eq!(
        board["summary"],
        json!({"summary": "one two three"}),
        "{board}"
    );
    tool.terminate("the tool example").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_follow_resumes_across_a_runner_kill_with_every_event_once() {
    let py = python_client();
    follow_across_a_runner_kill("py", |addr, subscriber, run_id| {
        let mut cmd = python(&py);
        cmd.arg(root().join("tests/clients/python/follow.py"))
            .args([
                "--runner",
                addr,
                "--subscriber",
                subscriber,
                "--run",
                run_id,
            ]);
        cmd
    })
    .await;
}
