//! Clients in other languages against the real binaries, with stubs made from `proto/` only:
//! the Python approval loop runs to RUN_SUCCEEDED, and the Node durable subscriber sees every
//! event of a run exactly once across a runner restart while it follows.
//!
//! The tests install what they need on first use (a virtualenv with pinned grpcio packages in
//! `target/py-venv`, stubs in `target/py-gen`, `npm ci` in `tests/clients/node`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    process::Stdio,
    sync::{Arc, Mutex},
};

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::{
    Cluster, Profile, WAIT, eventually, flow, gate_tree,
    process::workspace_root,
    tools::{npm_ci, python_stubs, python_venv},
};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_runs_the_approval_loop_to_success() {
    let root = workspace_root();
    let client_dir = root.join("tests/clients/python");
    let python = python_venv("py-venv", &client_dir.join("requirements.txt"));
    let stubs = python_stubs(&python);
    let cluster = Cluster::start(Profile::Debug).await;

    let out = tokio::process::Command::new(&python)
        .arg(client_dir.join("approval_loop.py"))
        .arg("--stubs")
        .arg(&stubs)
        .args(["--runner", &cluster.runner.addr.to_string()])
        .args(["--approval", &cluster.approval.addr.to_string()])
        .args(["--timeout", "60"])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "approval_loop.py failed ({}):\n{stdout}\n{stderr}",
        out.status
    );

    // What the client says, checked against the runner itself.
    let run_id = stdout
        .lines()
        .find_map(|l| l.strip_prefix("submitted run "))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the client printed its run id")
        .to_string();
    for step in [
        "registered tree",
        "approval pending",
        "approved: state=APPROVAL_STATE_RESOLVED",
        "RUN_SUCCEEDED",
    ] {
        assert!(stdout.contains(step), "missing {step:?} in:\n{stdout}");
    }
    flow::wait_run(&cluster, &run_id, rpb::RunStatus::Succeeded).await;
    let approval = flow::approval_of(&cluster, &run_id, apb::ApprovalState::Pruned).await;
    let decision = approval.decision.unwrap();
    assert_eq!(decision.reason, "approved from Python");
    assert_eq!(decision.kind, rpb::DecisionKind::Approve as i32);
}

/// The lines a child process prints, collected as they arrive.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn snapshot(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn any(&self, pred: impl Fn(&str) -> bool) -> bool {
        self.0.lock().unwrap().iter().any(|l| pred(l))
    }
}

fn processed_seqs(lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("event seq="))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_subscriber_sees_every_seq_once_across_a_runner_restart() {
    let node_dir = npm_ci(&workspace_root().join("tests/clients/node"));
    let mut cluster = Cluster::start(Profile::Debug).await;
    let run = flow::submit(&cluster, gate_tree("node-followed", "failure"), None).await;
    let pending = flow::approval_of(&cluster, &run.run_id, apb::ApprovalState::Pending).await;
    let before_restart = flow::events_of(&cluster, &run.run_id)
        .await
        .last()
        .unwrap()
        .seq;

    let subscriber = format!("node-{}", uuid::Uuid::new_v4().simple());
    let mut child = tokio::process::Command::new("node")
        .arg(node_dir.join("subscriber.js"))
        .args(["--runner", &cluster.runner.addr.to_string()])
        .args(["--subscriber", &subscriber])
        .args(["--run", &run.run_id])
        .args(["--after", "0"])
        .args(["--until", "RUN_SUCCEEDED"])
        .args(["--timeout-ms", "60000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs (is Node.js installed and on PATH?)");
    let lines = Lines::default();
    let reader = {
        let lines = lines.clone();
        let stdout = child.stdout.take().unwrap();
        tokio::spawn(async move {
            let mut stdout = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = stdout.next_line().await {
                lines.0.lock().unwrap().push(line);
            }
        })
    };

    // The subscriber has processed and acked everything up to the suspension…
    let acked = format!("acked seq={before_restart}");
    eventually(
        "the subscriber to ack the suspension's events",
        WAIT,
        || {
            let done = lines.any(|l| l == acked);
            async move { done.then_some(()) }
        },
    )
    .await;

    // …when the runner dies under it and comes back on the same address and data.
    cluster.runner.kill().await;
    cluster.runner.start().await;
    eventually("the subscriber to notice and reconnect", WAIT, || {
        let seen = lines.any(|l| l.starts_with("reconnect "));
        async move { seen.then_some(()) }
    })
    .await;

    // The run goes on (approval-svc reconnects too) while the subscriber follows.
    flow::approve(&cluster, &pending.request_id).await;
    flow::wait_run(&cluster, &run.run_id, rpb::RunStatus::Succeeded).await;
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("the subscriber exits after RUN_SUCCEEDED")
        .unwrap();
    reader.await.unwrap();
    let seen = lines.snapshot();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use tokio::io::AsyncReadExt;
        let _ = e.read_to_string(&mut stderr).await;
    }
    let transcript = seen.join("\n");
    println!("{transcript}");
    assert!(
        status.success(),
        "subscriber failed ({status}):\n{transcript}\n{stderr}"
    );
    assert_eq!(seen.last().map(String::as_str), Some("done"));

    let want: Vec<u64> = flow::events_of(&cluster, &run.run_id)
        .await
        .iter()
        .map(|e| e.seq)
        .collect();
    let got = processed_seqs(&seen);
    assert_eq!(
        got, want,
        "every seq of the run, once, in order:\n{transcript}"
    );
    assert_eq!(
        want,
        (1..=want.len() as u64).collect::<Vec<_>>(),
        "the run's seqs are gap-free"
    );
    assert!(
        got.iter().any(|s| *s > before_restart),
        "events after the restart were seen"
    );
}
