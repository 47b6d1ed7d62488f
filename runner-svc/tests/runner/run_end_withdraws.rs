//! A run whose job dead-letters while it waits on an approval: the step that fails the run also
//! withdraws that approval (SUSPENSION_WITHDRAWN right before RUN_FAILED), so nothing stays open
//! after the run ended; an operator's requeue revives the run, and it asks anew.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use crate::common;

use arbor_runner_svc::{
    engine::{Tool, ToolCall, ToolError, TreeFormat},
    mailbox::{Job, MailboxStore},
    runs::{Processed, ResolveInput, RunRecord, Runner, SubmitInput},
};
use arbor_shared::domain::{
    DecisionSource, EventDetail, EventKind, JobStatus, RunStatus, SuspensionCategory, Verdict,
};
use serde_json::{Value as Json, json};

/// Panics on its first call (a bug in a tool), which fails the job that ran it.
struct PanicsOnce(AtomicBool);

impl Tool for PanicsOnce {
    fn name(&self) -> &str {
        "panics-once"
    }

    fn call(&self, _call: &ToolCall) -> Result<Json, ToolError> {
        if !self.0.swap(true, Ordering::SeqCst) {
            panic!("tool bug");
        }
        Ok(json!("fine"))
    }
}

const TREE: &str = r#"{"id": "dies", "version": 1, "root": {"type": "parallel", "name": "both",
  "children": [
    {"type": "approval", "name": "gate", "title": "Go?", "child": {"type": "succeed"}},
    {"type": "sequence", "name": "work", "children": [
      {"type": "user_input", "name": "ask", "input_kind": "text", "prompt": "?"},
      {"type": "tool", "name": "buggy", "tool": "panics-once"}
    ]}
  ]}}"#;

/// A runner whose `panics-once` tool fails its first call, with `tree` registered.
async fn runner_with(dir: &std::path::Path, tree: &str) -> Arc<Runner> {
    let runner = common::Backend::Sled
        .open_runner(dir, |tools| {
            tools.register(PanicsOnce(AtomicBool::new(false)))
        })
        .await;
    runner.register_tree(tree, TreeFormat::Json).await.unwrap();
    runner
}

/// Submits a run of `tree_id` on `thread_id` (empty: a thread of its own) with one attempt.
async fn submit_one_attempt(runner: &Runner, tree_id: &str, thread_id: &str) -> RunRecord {
    runner
        .submit(SubmitInput {
            tree_id: tree_id.into(),
            thread_id: thread_id.into(),
            max_attempts: 1,
            submitted_by: "alice".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run
}

/// An operator requeues the dead-lettered job.
async fn requeue_dead_letter(runner: &Runner) -> Job {
    let dead = runner
        .mailbox()
        .list(&Default::default(), "", 100)
        .unwrap()
        .into_iter()
        .find(|j| j.status == JobStatus::DeadLetter)
        .unwrap();
    runner.requeue_job(&dead.job_id).await.unwrap()
}

async fn process_next(runner: &Arc<Runner>) -> Processed {
    let claim = runner.mailbox().claim("w").unwrap().expect("a job to do");
    runner.process(&claim).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_run_withdraws_its_open_approval_in_the_same_step() {
    let dir = tempfile::tempdir().unwrap();
    let runner = runner_with(dir.path(), TREE).await;
    let run = submit_one_attempt(&runner, "dies", "").await;
    assert_eq!(
        process_next(&runner).await,
        Processed::Done(RunStatus::Suspended)
    );
    let view = runner.get_run(&run.run_id).unwrap();
    let of = |c: SuspensionCategory| {
        view.suspensions
            .iter()
            .find(|s| s.category == c)
            .unwrap()
            .request_id
            .clone()
    };
    let (gate, input) = (
        of(SuspensionCategory::RequireApproval),
        of(SuspensionCategory::RequireUserInput),
    );

    // The input resumes the run into the buggy tool: the job fails with its one attempt.
    runner
        .resolve(ResolveInput {
            run_id: run.run_id.clone(),
            request_id: input.clone(),
            decision_id: "d-input".into(),
            action: Verdict::Resume,
            result: json!({"text": "go"}),
            reason: String::new(),
            decided_by: "bob".into(),
            source: DecisionSource::Person,
            may_resolve_approvals: false,
            answerer: None,
            trace: None,
            args_digest: String::new(),
        })
        .await
        .unwrap();
    assert!(matches!(process_next(&runner).await, Processed::Failed(_)));

    let view = runner.get_run(&run.run_id).unwrap();
    assert_eq!(view.run.status, RunStatus::Failed);
    assert!(view.suspensions.is_empty(), "{:?}", view.suspensions);
    let events: Vec<_> = runner
        .events()
        .read_after(0, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.run_id == run.run_id)
        .collect();
    let tail: Vec<EventKind> = events
        .iter()
        .rev()
        .take(4)
        .rev()
        .map(|e| e.kind())
        .collect();
    assert_eq!(
        tail,
        [
            EventKind::JobDeadLettered,
            EventKind::SuspensionWithdrawn,
            EventKind::SuspensionWithdrawn,
            EventKind::RunFailed
        ]
    );
    let withdrawn: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.detail {
            EventDetail::SuspensionWithdrawn { request_id, .. } => Some(request_id.as_str()),
            _ => None,
        })
        .collect();
    assert!(withdrawn.contains(&gate.as_str()) && withdrawn.contains(&input.as_str()));
    let seqs: Vec<u64> = events.iter().rev().take(4).map(|e| e.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] == w[1] + 1),
        "one step, in order: {seqs:?}"
    );

    // Revived by an operator, the run asks anew instead of waiting on withdrawn requests.
    requeue_dead_letter(&runner).await;
    assert_eq!(
        process_next(&runner).await,
        Processed::Done(RunStatus::Suspended)
    );
    let view = runner.get_run(&run.run_id).unwrap();
    let fresh: Vec<&str> = view
        .suspensions
        .iter()
        .map(|s| s.request_id.as_str())
        .collect();
    assert_eq!(fresh.len(), 2, "{fresh:?}");
    assert!(!fresh.contains(&gate.as_str()) && !fresh.contains(&input.as_str()));
}

const BUGGY_FIRST: &str = r#"{"id": "buggy-first", "version": 1, "root": {"type": "sequence",
  "name": "main", "children": [
    {"type": "tool", "name": "buggy", "tool": "panics-once"},
    {"type": "set", "name": "done", "key": "x", "value": 1}
  ]}}"#;

/// A run that failed as a dead letter before its thread was interrupted, revived by an
/// operator's requeue afterwards, runs: the requeued job joins the thread's current generation
/// instead of being superseded when claimed, which would leave the revived run queued for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_revived_after_its_thread_was_interrupted_runs() {
    let dir = tempfile::tempdir().unwrap();
    let runner = runner_with(dir.path(), BUGGY_FIRST).await;
    let run = submit_one_attempt(&runner, "buggy-first", "chat-1").await;
    assert!(matches!(process_next(&runner).await, Processed::Failed(_)));
    assert_eq!(
        runner.get_run(&run.run_id).unwrap().run.status,
        RunStatus::Failed
    );

    let (intr, _) = runner
        .interrupt("chat-1", "user sent a new message", None)
        .await
        .unwrap();
    assert_eq!(intr.new_generation, 1);
    let requeued = requeue_dead_letter(&runner).await;
    assert_eq!(requeued.generation, 1);
    let view = runner.get_run(&run.run_id).unwrap();
    assert_eq!(
        (view.run.status, view.run.generation),
        (RunStatus::Queued, 1)
    );

    assert_eq!(
        process_next(&runner).await,
        Processed::Done(RunStatus::Succeeded)
    );
}
