//! A Python program against the real binaries: the approval loop of
//! `tests/clients/python/approval_loop.py`, written with the `arbor-client` package, runs to
//! RUN_SUCCEEDED, and what it says is checked against the services themselves. (The packages'
//! own tests, their README examples and the follow-across-a-restart checks are in `clients/`.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::{Cluster, Profile, flow, process::workspace_root, tools::python_client};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_runs_the_approval_loop_to_success() {
    let root = workspace_root();
    let client_dir = root.join("tests/clients/python");
    let python = python_client();
    let cluster = Cluster::start(Profile::Debug).await;

    let out = tokio::process::Command::new(&python)
        .arg(client_dir.join("approval_loop.py"))
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
