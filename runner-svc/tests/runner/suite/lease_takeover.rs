//! Fencing under a stalled worker: the first worker stalls past its lease, the reaper hands the
//! job to a second worker that resumes the run from its checkpoint and completes it, and the
//! first worker's late write is refused (ABORTED) — the final state is the second worker's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::Backend;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
        mpsc,
    },
    time::Duration,
};

use arbor_runner_svc::{
    engine::{GuardConfig, LedgerTool, Tool, ToolCall, ToolError, ToolRegistry, TreeFormat},
    mailbox::{MailboxConfig, MailboxStore, SystemClock},
    runs::{Runner, RunnerOptions, SubmitInput},
};
use arbor_shared::domain::{EventKind, JobStatus, RunStatus};
use serde_json::{Value as Json, json};

/// Blocks its first call until released; later calls return at once.
struct Stall {
    calls: AtomicU32,
    release: Mutex<Option<mpsc::Receiver<()>>>,
    entered: Mutex<Option<mpsc::Sender<()>>>,
}

impl Tool for Stall {
    fn name(&self) -> &str {
        "stall"
    }

    fn call(&self, _call: &ToolCall) -> Result<Json, ToolError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n == 0 {
            if let Some(tx) = self.entered.lock().unwrap().take() {
                tx.send(()).unwrap();
            }
            let rx = self.release.lock().unwrap().take().unwrap();
            rx.recv().unwrap();
            return Ok(json!({"worker": "first"}));
        }
        Ok(json!({"worker": "second"}))
    }
}

const TREE: &str = r#"{
  "id": "stalls", "version": 1,
  "root": {"type": "sequence", "name": "main", "children": [
    {"type": "tool", "name": "record", "tool": "ledger.append", "args": {"entry": "once"}, "output": "receipt"},
    {"type": "tool", "name": "slow", "tool": "stall", "args": {}, "output": "who"},
    {"type": "set", "name": "finish", "key": "finished", "value": true}
  ]}
}"#;

pub async fn a_stalled_worker_loses_its_lease_and_its_late_write_is_refused(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    let ledger = LedgerTool::new(store.clone()).unwrap();
    let (release_tx, release_rx) = mpsc::channel();
    let (entered_tx, entered_rx) = mpsc::channel();
    let mut tools = ToolRegistry::with_builtins(ledger.clone(), GuardConfig::default());
    tools.register(Stall {
        calls: AtomicU32::new(0),
        release: Mutex::new(Some(release_rx)),
        entered: Mutex::new(Some(entered_tx)),
    });
    let opts = RunnerOptions {
        mailbox: MailboxConfig {
            lease: Duration::from_millis(200),
            ..MailboxConfig::default()
        },
        ..RunnerOptions::default()
    };
    let runner = Runner::open(
        store,
        Arc::new(SystemClock::default()),
        Arc::new(tools),
        opts,
    )
    .await
    .unwrap();
    runner.register_tree(TREE, TreeFormat::Json).await.unwrap();
    let run = runner
        .submit(SubmitInput {
            tree_id: "stalls".into(),
            submitted_by: "test".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run;

    // Worker 1 claims and stalls inside the tick, without heartbeats (a frozen process).
    let first = runner.mailbox().claim("worker-1").unwrap().unwrap();
    let stalled = {
        let runner = runner.clone();
        let first = first.clone();
        tokio::spawn(async move { runner.process(&first).await })
    };
    tokio::task::spawn_blocking(move || entered_rx.recv().unwrap())
        .await
        .unwrap();

    // Its lease runs out; the reaper returns the job to the queue.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(runner.reap().await.unwrap(), 1);
    let requeued = runner.mailbox().get(&first.job.job_id).unwrap().unwrap();
    assert_eq!(requeued.status, JobStatus::Queued);

    // Worker 2 takes the run over from its checkpoint and completes it.
    let second = runner.mailbox().claim("worker-2").unwrap().unwrap();
    assert_eq!(second.job.job_id, first.job.job_id);
    assert_ne!(second.token, first.token);
    assert_eq!(second.job.attempt_count, 2);
    let outcome = runner.process(&second).await;
    assert_eq!(
        outcome,
        arbor_runner_svc::runs::Processed::Done(RunStatus::Succeeded)
    );

    // Worker 1 wakes up and tries to commit: refused, nothing of its state lands.
    release_tx.send(()).unwrap();
    let late = stalled.await.unwrap();
    assert_eq!(late, arbor_runner_svc::runs::Processed::LostClaim);

    let view = runner.get_run(&run.run_id).unwrap();
    assert_eq!(view.run.status, RunStatus::Succeeded);
    assert_eq!(view.blackboard["who"], json!({"worker": "second"}));
    assert_eq!(view.blackboard["finished"], json!(true));
    assert_eq!(ledger.count(), 1, "the side effect happened once");
    let job = runner.mailbox().get(&first.job.job_id).unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Accepted);
    assert_eq!(job.claimed_by, "worker-2");

    let events = runner.events().read_after(0, 1000).await.unwrap();
    let count = |k: EventKind| events.iter().filter(|e| e.kind() == k).count();
    assert_eq!(count(EventKind::RunSucceeded), 1);
    assert_eq!(
        count(EventKind::RunStarted),
        1,
        "only the winner's step was written"
    );
    assert_eq!(
        count(EventKind::CheckpointRestored),
        1,
        "the takeover restored the checkpoint"
    );
}
