//! A slow tool never stalls the runtime: a tick runs on a blocking thread, so while a tool takes
//! its time, the runtime thread that serves RPCs, streams and lease heartbeats goes on — here
//! on a runtime with one thread, which a blocked tick would have frozen.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use crate::common;

use arbor_runner_svc::{
    engine::{Tool, ToolCall, ToolError, TreeFormat},
    mailbox::MailboxStore,
    runs::{Processed, SubmitInput},
};
use arbor_shared::domain::RunStatus;
use serde_json::{Value as Json, json};

const SLOW: Duration = Duration::from_millis(1500);

struct Slow;

impl Tool for Slow {
    fn name(&self) -> &str {
        "slow"
    }

    fn call(&self, _call: &ToolCall) -> Result<Json, ToolError> {
        std::thread::sleep(SLOW);
        Ok(json!("done"))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_slow_tool_leaves_the_runtime_free() {
    let dir = tempfile::tempdir().unwrap();
    let runner = common::Backend::Sled
        .open_runner(dir.path(), |tools| tools.register(Slow))
        .await;
    runner
        .register_tree(
            r#"{"id": "slow", "version": 1, "root": {"type": "tool", "name": "t", "tool": "slow", "output": "out"}}"#,
            TreeFormat::Json,
        )
        .await
        .unwrap();
    let run = runner
        .submit(SubmitInput {
            tree_id: "slow".into(),
            submitted_by: "alice".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run;
    let claim = runner.mailbox().claim("w").unwrap().unwrap();
    let started = Instant::now();
    let worker = tokio::spawn({
        let runner = runner.clone();
        async move { runner.process(&claim).await }
    });
    // Meanwhile this one runtime thread keeps serving: a timer and a read both complete long
    // before the tool returns.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let view = runner.get_run(&run.run_id).unwrap();
    assert_ne!(view.run.status, RunStatus::Succeeded);
    assert!(
        started.elapsed() < SLOW / 2,
        "the runtime was blocked for {:?}",
        started.elapsed()
    );
    assert_eq!(worker.await.unwrap(), Processed::Done(RunStatus::Succeeded));
    assert!(started.elapsed() >= SLOW);
    assert_eq!(
        runner.get_run(&run.run_id).unwrap().blackboard["out"],
        json!("done")
    );
}
