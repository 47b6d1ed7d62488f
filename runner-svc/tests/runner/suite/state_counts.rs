//! The state counts `/metrics` reports (runs by status, active suspensions by category, jobs by
//! status) move in the same transactions as the records: after runs finish, suspend, resume,
//! get cancelled and are compacted away they equal a pass over every record, and a database
//! written before the counts existed gets them built when it opens.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::{self, Backend};
use common::{approve_first, wait_status};

use std::{sync::Arc, time::Duration};

use arbor_runner_svc::{
    counts::Tally,
    engine::{GuardConfig, LedgerTool, ToolRegistry, TreeFormat},
    mailbox::SystemClock,
    pool,
    retention::RetentionConfig,
    runs::{Runner, RunnerOptions, SubmitInput, records},
    store::Store,
};
use arbor_shared::domain::RunStatus;
use tokio_util::sync::CancellationToken;

const QUICK: &str = r#"{"id": "quick", "version": 1, "root": {"type": "set", "name": "s", "key": "x", "value": 1}}"#;
const GATED: &str = r#"{"id": "gated", "version": 1, "root":
  {"type": "approval", "name": "ok", "title": "Continue?", "child": {"type": "succeed", "name": "go"}}}"#;

/// Index of a run status in `Tally::runs`, of a job status in `Tally::jobs`.
fn run(s: RunStatus) -> usize {
    arbor_runner_svc::counts::RUN_STATUSES
        .iter()
        .position(|x| *x == s)
        .unwrap()
}

fn stored_equals_scan(store: &Store) -> Tally {
    let stored = Tally::stored(store).unwrap();
    let scanned = Tally::scan(store).unwrap();
    assert_eq!(
        stored, scanned,
        "stored counts differ from a pass over the records"
    );
    assert_eq!(scanned.unreadable, 0);
    stored
}

pub async fn counts_follow_runs_through_suspension_resume_cancel_and_retention(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    let ledger = LedgerTool::new(store.clone()).unwrap();
    let tools = ToolRegistry::with_builtins(ledger, GuardConfig::default());
    let runner = Runner::open(
        store.clone(),
        Arc::new(SystemClock::default()),
        Arc::new(tools),
        RunnerOptions::default(),
    )
    .await
    .unwrap();
    runner.register_tree(QUICK, TreeFormat::Json).await.unwrap();
    runner.register_tree(GATED, TreeFormat::Json).await.unwrap();
    let stop = CancellationToken::new();
    let _workers = pool::spawn(runner.clone(), 2, stop.clone());
    assert_eq!(stored_equals_scan(&store), Tally::default());

    let submit = |tree: &str| SubmitInput {
        tree_id: tree.into(),
        submitted_by: "alice".into(),
        ..Default::default()
    };
    let mut quick = Vec::new();
    for _ in 0..3 {
        quick.push(runner.submit(submit("quick")).await.unwrap().run.run_id);
    }
    let mut gated = Vec::new();
    for _ in 0..4 {
        gated.push(runner.submit(submit("gated")).await.unwrap().run.run_id);
    }
    for id in &quick {
        wait_status(&runner, id, RunStatus::Succeeded).await;
    }
    for id in &gated {
        wait_status(&runner, id, RunStatus::Suspended).await;
    }
    let c = stored_equals_scan(&store);
    assert_eq!(c.runs[run(RunStatus::Succeeded)], 3);
    assert_eq!(c.runs[run(RunStatus::Suspended)], 4);
    assert_eq!(c.suspensions, [4, 0, 0]);

    // One is approved and finishes; one is cancelled while suspended (its request withdrawn).
    approve_first(&runner, &gated[0], "d-1").await;
    runner.cancel_run(&gated[1], "not needed").await.unwrap();
    wait_status(&runner, &gated[0], RunStatus::Succeeded).await;
    wait_status(&runner, &gated[1], RunStatus::Cancelled).await;
    let c = stored_equals_scan(&store);
    assert_eq!(c.runs[run(RunStatus::Succeeded)], 4);
    assert_eq!(c.runs[run(RunStatus::Cancelled)], 1);
    assert_eq!(c.runs[run(RunStatus::Suspended)], 2);
    assert_eq!(c.suspensions, [2, 0, 0]);

    // A parked run that fails without a new checkpoint (its resume job dead-lettered) stops
    // counting its suspension; revived by a requeue, it counts again. Both write only the run.
    let set_status = |status: RunStatus| {
        let id = gated[2].clone();
        store
            .transact(move |tx| {
                let mut run = records::get_run(tx, &id)?.unwrap();
                run.status = status;
                records::put_run(tx, &run)
            })
            .unwrap();
    };
    set_status(RunStatus::Failed);
    let c = stored_equals_scan(&store);
    assert_eq!(c.runs[run(RunStatus::Failed)], 1);
    assert_eq!(c.suspensions, [1, 0, 0]);
    set_status(RunStatus::Suspended);
    let c = stored_equals_scan(&store);
    assert_eq!(c.runs[run(RunStatus::Failed)], 0);
    assert_eq!(c.suspensions, [2, 0, 0]);

    // Retention removes the finished runs and their final jobs; the parked ones stay counted.
    let drop_finished = RetentionConfig {
        events_acked: Duration::ZERO,
        events_max: Duration::from_secs(3600),
        finished: Duration::ZERO,
        interval: Duration::from_secs(3600),
    };
    let compacted = runner
        .compact(&drop_finished, arbor_shared::time::now_ms() + 1)
        .await
        .unwrap();
    assert_eq!(compacted.runs, 5);
    let c = stored_equals_scan(&store);
    assert_eq!(c.runs.iter().sum::<u64>(), 2);
    assert_eq!(c.runs[run(RunStatus::Suspended)], 2);
    assert_eq!(c.suspensions, [2, 0, 0]);
    stop.cancel();
}
