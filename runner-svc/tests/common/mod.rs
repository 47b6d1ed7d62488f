//! Helpers the runner's integration tests share.
//!
//! **The storage conformance suite.** The tests of this directory that exercise the mailbox
//! (`mailbox_model`, `mailbox_concurrency`, `lease_takeover`, `interrupt`), the event log and its
//! cursors (`slow_subscriber`, `retention`) and the state counts (`state_counts`) reach storage
//! only through `store::Store`, opened by [`open_store`]: they are written against the storage
//! seam, not against sled. A new backend passes the same suite by being what [`open_store`]
//! returns.

#![allow(clippy::unwrap_used, clippy::panic, dead_code)]

use std::time::Duration;

use arbor_runner_svc::runs::{ResolveInput, Runner};
use arbor_shared::{
    domain::{DecisionSource, RunStatus, Verdict},
    testing::eventually,
};

/// Waits (20 s at most) until the run has `want`; for `Suspended`, also until its request is out.
pub async fn wait_status(runner: &Runner, run_id: &str, want: RunStatus) {
    let what = format!("run {run_id} to become {want:?}");
    eventually(&what, Duration::from_secs(20), || async {
        let view = runner.get_run(run_id).unwrap();
        let settled = match want {
            RunStatus::Suspended => view.run.status == want && !view.suspensions.is_empty(),
            _ => view.run.status == want,
        };
        settled.then_some(())
    })
    .await
}

/// A person approves the run's first active suspension.
pub async fn approve_first(runner: &Runner, run_id: &str, decision_id: &str) {
    let request_id = runner.get_run(run_id).unwrap().suspensions[0]
        .request_id
        .clone();
    runner
        .resolve(ResolveInput {
            run_id: run_id.to_string(),
            request_id,
            decision_id: decision_id.into(),
            action: Verdict::Resume,
            result: serde_json::Value::Null,
            reason: "fine".into(),
            decided_by: "bob".into(),
            source: DecisionSource::Person,
            may_resolve_approvals: true,
            trace: None,
        })
        .await
        .unwrap();
}

/// The store under test, on a new or existing database in `dir` (sled, the embedded backend).
pub fn open_store(dir: &std::path::Path) -> arbor_runner_svc::store::Store {
    arbor_runner_svc::store::Store::open(dir, 16 << 20).unwrap()
}

/// [`open_store`] on a database whose previous handle is still letting go of it.
pub async fn reopen_store(dir: &std::path::Path) -> arbor_runner_svc::store::Store {
    arbor_runner_svc::store::Store::open_waiting(dir, 16 << 20, Duration::from_secs(10))
        .await
        .unwrap()
}

/// A runner on a new database in `dir`, with the built-in tools plus what `register` adds, and
/// no workers: a test claims and processes jobs itself, or spawns workers.
pub async fn open_runner(
    dir: &std::path::Path,
    register: impl FnOnce(&mut arbor_runner_svc::engine::ToolRegistry),
) -> std::sync::Arc<Runner> {
    use arbor_runner_svc::{
        engine::{GuardConfig, LedgerTool, ToolRegistry},
        mailbox::SystemClock,
    };
    let store = open_store(dir);
    let mut tools = ToolRegistry::with_builtins(
        LedgerTool::new(store.clone()).unwrap(),
        GuardConfig::default(),
    );
    register(&mut tools);
    Runner::open(
        store,
        std::sync::Arc::new(SystemClock::default()),
        std::sync::Arc::new(tools),
        arbor_runner_svc::runs::RunnerOptions::default(),
    )
    .await
    .unwrap()
}
