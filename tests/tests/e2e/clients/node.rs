//! The Node package: `tsc --noEmit`, its `node --test` suite (on the built JS) against a
//! secured pair, its README's examples as written (compiled against the packed package in a
//! fresh project), and its follow iterator across a runner kill.

use serde_json::json;

use super::*;
use arbor_tests::tools::{node_client, run};

fn package() -> PathBuf {
    root().join("clients/node")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_package_type_checks_and_passes_its_tests_against_the_services() {
    node_client(); // npm ci and the build (dist/ holds the compiled tests too)
    run(
        std::process::Command::new("npm")
            .args(["run", "--silent", "typecheck"])
            .current_dir(package()),
        "tsc --noEmit on clients/node",
    );
    let (cluster, tokens) = Cluster::start_secure(arbor_tests::Profile::Debug).await;
    // The test files only (the shared helpers module is no test of its own).
    let mut tests: Vec<String> = std::fs::read_dir(package().join("dist/test"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".test.js"))
        .map(|name| format!("dist/test/{name}"))
        .collect();
    tests.sort();
    assert!(tests.len() >= 3, "the package's built tests: {tests:?}");
    let mut cmd = Command::new("node");
    cmd.arg("--test")
        .args(&tests)
        .current_dir(package())
        .envs(service_env(&cluster, &tokens));
    suite(cmd, "node --test on clients/node").await;
}

/// The TypeScript examples compiled against the installed package, in the fresh project that
/// `node_client` made: as a user who ran `npm install` would.
fn build_examples(examples: &[(String, String)]) -> PathBuf {
    let modules = node_client();
    let project = modules.parent().unwrap().to_path_buf();
    let dir = project.join("examples");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, code) in examples {
        std::fs::write(dir.join(format!("{name}.ts")), code).unwrap();
    }
    let tsc = package().join("node_modules/.bin/tsc");
    run(
        std::process::Command::new(tsc)
            .args(["--strict", "--target", "ES2022", "--module", "commonjs"])
            .args(["--esModuleInterop", "--skipLibCheck", "--types", "node"])
            .arg("--typeRoots")
            .arg(package().join("node_modules/@types"))
            .arg("--outDir")
            .arg(dir.join("out"))
            .args(examples.iter().map(|(n, _)| dir.join(format!("{n}.ts"))))
            .current_dir(&project),
        "tsc: the README's TypeScript examples against the installed arbor-client",
    );
    dir.join("out")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_readme_examples_run_as_written() {
    let examples = readme_examples(
        &package().join("README.md"),
        "ts",
        &["tool", "approve", "suspensions"],
    );
    let out = build_examples(&examples);
    let cluster = Cluster::start(arbor_tests::Profile::Debug).await;
    let example = |name: &str, extra: &[(&str, &str)]| {
        let mut cmd = Command::new("node");
        cmd.arg(out.join(format!("{name}.js")))
            .env("ARBOR_RUNNER", cluster.runner.addr.to_string())
            .env("ARBOR_APPROVAL", cluster.approval.addr.to_string())
            .envs(extra.iter().map(|(k, v)| (*k, *v)));
        cmd
    };

    // Follow every suspension of a thread, then approve them all from TypeScript.
    let thread = format!("node-example-{}", uuid::Uuid::new_v4().simple());
    let follower = Running::spawn(example("suspensions", &[("ARBOR_THREAD", &thread)]));
    let first = flow::submit(&cluster, gate_tree("node-example-gate", "failure"), None).await;
    let mut runner = cluster.runner_client().await;
    let req = rpb::SubmitRunRequest {
        tree_id: first.tree_id.clone(),
        thread_id: thread.clone(),
        ..Default::default()
    };
    let run_id = runner
        .submit_run(req)
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
        .run_id;
    follower
        .line("the follower to print the run's suspension", |l| {
            l.contains(&run_id) && l.contains("Ship it?")
        })
        .await;
    for id in [&run_id, &first.run_id] {
        flow::approval_of(&cluster, id, apb::ApprovalState::Pending).await;
    }
    Running::spawn(example("approve", &[]))
        .success("the approve example")
        .await;
    for id in [&run_id, &first.run_id] {
        flow::wait_run(&cluster, id, rpb::RunStatus::Succeeded).await;
    }
    follower.kill().await;

    // A tool in TypeScript: it serves a run, then stops cleanly on SIGTERM.
    let tool = Running::spawn(example("tool", &[]));
    let doc = json!({"id": "node-example-tool", "version": 1, "task_types": ["node.greet"],
        "root": {"type": "tool", "name": "greet", "tool": "node.greet",
                 "args": {"name": "Ada"}, "output": "greeting"}});
    let run = flow::submit(&cluster, doc.to_string(), None).await;
    let done = flow::wait_run(&cluster, &run.run_id, rpb::RunStatus::Succeeded).await;
    let board = serde_json::Value::Object(arbor_shared::json::from_proto_struct(
        done.blackboard.as_ref().unwrap(),
    ));
    assert_eq!(
        board["greeting"],
        json!({"greeting": "Hello, Ada"}),
        "{board}"
    );
    tool.terminate("the tool example").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_follow_resumes_across_a_runner_kill_with_every_event_once() {
    let modules = node_client();
    follow_across_a_runner_kill("node", |addr, subscriber, run_id| {
        let mut cmd = Command::new("node");
        cmd.arg(root().join("tests/clients/node/follow.js"))
            .env("NODE_PATH", &modules)
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
