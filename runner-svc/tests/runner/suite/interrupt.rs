//! InterruptThread: the thread's queued jobs become Superseded, the running run is cancelled
//! cooperatively (after its current step, its pending suspension withdrawn), the replacement run
//! starts at the new generation, and `MailboxInterrupt` counts it all.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::{self, Backend};

use std::{sync::Arc, time::Duration};

use arbor_runner_svc::{
    engine::{GuardConfig, ToolRegistry, TreeFormat},
    mailbox::{JobFilter, MailboxStore, SystemClock},
    pool,
    runs::{Runner, RunnerOptions, SubmitInput},
};
use arbor_shared::{
    domain::{EventKind, JobKind, JobStatus, RunStatus},
    testing::eventually,
};
use tokio_util::sync::CancellationToken;

const BUSY: &str = r#"{"id": "busy", "version": 1, "root": {"type": "sequence", "name": "main", "children": [
  {"type": "tool", "name": "work", "tool": "hold", "args": {}},
  {"type": "approval", "name": "ok", "title": "Continue?", "child": {"type": "succeed", "name": "go"}}
]}}"#;
const WAIT: Duration = Duration::from_secs(20);
const QUICK: &str = r#"{"id": "quick", "version": 1, "root": {"type": "set", "name": "s", "key": "x", "value": 1}}"#;

pub async fn interrupt_supersedes_queued_work_and_cancels_the_running_run(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    let ledger = arbor_runner_svc::engine::LedgerTool::new(store.clone()).unwrap();
    let (hold, entered_rx, release_tx) = common::Hold::new();
    let mut tools = ToolRegistry::with_builtins(ledger, GuardConfig::default());
    tools.register(hold);
    let runner = Runner::open(
        store,
        Arc::new(SystemClock::default()),
        Arc::new(tools),
        RunnerOptions::default(),
    )
    .await
    .unwrap();
    runner.register_tree(BUSY, TreeFormat::Json).await.unwrap();
    runner.register_tree(QUICK, TreeFormat::Json).await.unwrap();
    let stop = CancellationToken::new();
    let _workers = pool::spawn(runner.clone(), 2, stop.clone());

    let submit = |tree: &str| SubmitInput {
        tree_id: tree.into(),
        thread_id: "chat-1".into(),
        submitted_by: "alice".into(),
        ..Default::default()
    };
    let busy = runner.submit(submit("busy")).await.unwrap().run;
    tokio::task::spawn_blocking(move || entered_rx.recv().unwrap())
        .await
        .unwrap();
    // The thread is busy: these two wait in the mailbox.
    let queued_a = runner.submit(submit("quick")).await.unwrap().run;
    let queued_b = runner.submit(submit("quick")).await.unwrap().run;

    let (intr, next) = runner
        .interrupt("chat-1", "user sent a new message", Some(submit("quick")))
        .await
        .unwrap();
    assert_eq!(intr.new_generation, 1);
    assert_eq!(intr.superseded_count, 2);
    let active = intr.active_job.expect("the running job");
    assert_eq!(active.run_id, busy.run_id);
    assert_eq!(active.status, JobStatus::Claimed);
    let next = next.expect("replacement run").run;
    assert_eq!(next.generation, 1);

    for run in [&queued_a, &queued_b] {
        let view = runner.get_run(&run.run_id).unwrap();
        assert_eq!(view.run.status, RunStatus::Superseded);
    }

    // The running step finishes (it reaches the approval gate), then the cancel job halts it.
    release_tx.send(()).unwrap();
    let busy_run = eventually("the running run to be cancelled", WAIT, || async {
        let v = runner.get_run(&busy.run_id).unwrap();
        v.run.status.is_terminal().then_some(v)
    })
    .await;
    assert_eq!(busy_run.run.status, RunStatus::Cancelled);
    assert!(
        busy_run.suspensions.is_empty(),
        "its approval was withdrawn"
    );
    let next_run = eventually("the replacement run to finish", WAIT, || async {
        let v = runner.get_run(&next.run_id).unwrap();
        v.run.status.is_terminal().then_some(v)
    })
    .await;
    assert_eq!(next_run.run.status, RunStatus::Succeeded);

    let jobs = runner
        .mailbox()
        .list(
            &JobFilter {
                mailbox_id: "chat-1".into(),
                ..JobFilter::default()
            },
            "",
            100,
        )
        .unwrap();
    let superseded: Vec<_> = jobs
        .iter()
        .filter(|j| j.status == JobStatus::Superseded)
        .map(|j| j.run_id.clone())
        .collect();
    assert_eq!(superseded.len(), 2);
    assert!(superseded.contains(&queued_a.run_id) && superseded.contains(&queued_b.run_id));
    assert!(
        jobs.iter()
            .any(|j| j.kind == JobKind::Cancel && j.status == JobStatus::Accepted)
    );

    let events = runner.events().read_after(0, 10_000).await.unwrap();
    let of = |run: &str, k: EventKind| {
        events
            .iter()
            .filter(|e| e.run_id == run && e.kind() == k)
            .count()
    };
    assert_eq!(of(&queued_a.run_id, EventKind::RunSuperseded), 1);
    assert_eq!(of(&queued_b.run_id, EventKind::RunSuperseded), 1);
    assert_eq!(of(&busy.run_id, EventKind::ApprovalRequested), 1);
    assert_eq!(of(&busy.run_id, EventKind::SuspensionWithdrawn), 1);
    assert_eq!(of(&busy.run_id, EventKind::RunCancelled), 1);
    assert_eq!(
        of(&queued_a.run_id, EventKind::RunStarted),
        0,
        "superseded runs never ran"
    );
    // The state counts moved with every supersede, cancel and withdrawal.
    let store = runner.store();
    assert_eq!(
        arbor_runner_svc::counts::Tally::stored(store).unwrap(),
        arbor_runner_svc::counts::Tally::scan(store).unwrap()
    );
    stop.cancel();
}
