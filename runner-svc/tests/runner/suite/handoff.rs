//! A job queued while a worker of the process waits for work is claimed by the transaction that
//! queues it and handed to that worker — a submission's start job, a decision's wake-up — and
//! a job its thread cannot run yet (another job of the thread is claimed) stays queued for the
//! usual claim, which takes it once the thread is free.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::{self, Backend};

use std::time::Duration;

use arbor_runner_svc::{
    engine::TreeFormat,
    mailbox::MailboxStore,
    pool,
    runs::{Runner, RunnerOptions, SubmitInput},
};
use arbor_shared::{
    domain::{JobStatus, RunStatus},
    testing::eventually,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);
const GATED: &str = r#"{"id": "gated", "version": 1, "root": {"type": "sequence", "name": "main", "children": [
  {"type": "approval", "name": "ok", "title": "Go on?", "child": {"type": "set", "name": "s", "key": "x", "value": 1}}
]}}"#;
const HELD: &str = r#"{"id": "held", "version": 1, "root": {"type": "tool", "name": "work", "tool": "hold", "args": {}}}"#;
const WAITS: &str = r#"{"id": "waits", "version": 1, "root": {"type": "sequence", "name": "main", "children": [
  {"type": "wait", "name": "a-while", "ms": 400}, {"type": "set", "name": "s", "key": "x", "value": 1}
]}}"#;
/// How long an idle worker that knows of no delayed job sleeps before it looks at the queue.
const IDLE: Duration = Duration::from_secs(5);
const QUICK: &str = r#"{"id": "quick", "version": 1, "root": {"type": "set", "name": "s", "key": "x", "value": 1}}"#;

fn submit(tree: &str, thread: &str) -> SubmitInput {
    SubmitInput {
        tree_id: tree.into(),
        thread_id: thread.into(),
        submitted_by: "alice".into(),
        ..Default::default()
    }
}

async fn wait_idle(runner: &Runner, workers: usize) {
    eventually(
        &format!("{workers} workers waiting for work"),
        Duration::from_secs(20),
        || async { (runner.idle_workers() == workers).then_some(()) },
    )
    .await
}

pub async fn a_submission_and_a_decision_hand_their_job_to_the_waiting_worker(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let runner = b.open_runner(dir.path(), |_| {}).await;
    runner.register_tree(GATED, TreeFormat::Json).await.unwrap();
    let stop = CancellationToken::new();
    let _workers = pool::spawn(runner.clone(), 1, stop.clone());

    // On a shared store the idle worker also looks for work once a second, and is not idle
    // while it looks: a step made then takes no worker and its job is claimed as usual. Such
    // a run still succeeds; runs are started until one hands over both of its jobs.
    for attempt in 1.. {
        assert!(attempt <= 20, "no run found the worker idle at both steps");
        wait_idle(&runner, 1).await;
        let (taken, handed) = (runner.hand_offs_taken(), runner.jobs_handed_off());
        let submitted = runner
            .submit(submit("gated", &format!("t-{attempt}")))
            .await
            .unwrap();
        let submission_handed = runner.hand_offs_taken() > taken;
        if submission_handed {
            // Counted before SubmitRun answers: the job was claimed in the submission's
            // transaction.
            assert_eq!(runner.jobs_handed_off(), handed + 1);
        }
        let run_id = submitted.run.run_id;
        common::wait_status(&runner, &run_id, RunStatus::Suspended).await;
        let start = runner.mailbox().get(&submitted.job_id).unwrap().unwrap();
        assert_eq!(start.status, JobStatus::Accepted);
        assert_eq!(start.attempt_count, 1, "claimed once");

        wait_idle(&runner, 1).await;
        let (taken, handed) = (runner.hand_offs_taken(), runner.jobs_handed_off());
        common::approve_first(&runner, &run_id, &format!("d-{attempt}")).await;
        let decision_handed = runner.hand_offs_taken() > taken;
        if decision_handed {
            assert_eq!(
                runner.jobs_handed_off(),
                handed + 1,
                "the decision's wake-up was handed over"
            );
        }
        common::wait_status(&runner, &run_id, RunStatus::Succeeded).await;
        assert_eq!(runner.get_run(&run_id).unwrap().blackboard["x"], json!(1));
        if submission_handed && decision_handed {
            break;
        }
    }
    stop.cancel();
}

pub async fn a_job_whose_thread_is_busy_stays_queued_until_the_thread_is_free(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (hold, entered_rx, release_tx) = common::Hold::new();
    let runner = b
        .open_runner(dir.path(), |tools| tools.register(hold))
        .await;
    runner.register_tree(HELD, TreeFormat::Json).await.unwrap();
    runner.register_tree(QUICK, TreeFormat::Json).await.unwrap();
    let stop = CancellationToken::new();
    let _workers = pool::spawn(runner.clone(), 2, stop.clone());
    wait_idle(&runner, 2).await;

    let held = runner.submit(submit("held", "t-1")).await.unwrap().run;
    assert_eq!(runner.jobs_handed_off(), 1);
    tokio::task::spawn_blocking(move || entered_rx.recv().unwrap())
        .await
        .unwrap();
    wait_idle(&runner, 1).await;

    // The other worker waits, but the thread's job is claimed: this one must wait its turn.
    let next = runner.submit(submit("quick", "t-1")).await.unwrap();
    assert_eq!(
        runner.jobs_handed_off(),
        1,
        "a busy thread's job is not handed over"
    );
    let job = runner.mailbox().get(&next.job_id).unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Queued);
    // The worker let go goes back to waiting (the queue has nothing it may claim).
    wait_idle(&runner, 1).await;
    assert_eq!(
        runner.get_run(&next.run.run_id).unwrap().run.status,
        RunStatus::Queued
    );

    // The thread's next job runs once the thread is free, not after an idle worker's sleep
    // ends (5 s): a look saw it waiting, so the worker that finishes the thread's job looks.
    let released = std::time::Instant::now();
    release_tx.send(()).unwrap();
    common::wait_status(&runner, &held.run_id, RunStatus::Succeeded).await;
    common::wait_status(&runner, &next.run.run_id, RunStatus::Succeeded).await;
    assert!(
        released.elapsed() < IDLE / 2,
        "the thread's next job waited {:?} after the thread was free",
        released.elapsed()
    );
    let job = runner.mailbox().get(&next.job_id).unwrap().unwrap();
    assert_eq!(job.attempt_count, 1);
    assert_eq!(runner.jobs_handed_off(), 1);
    stop.cancel();
}

/// A step that sets a timer wakes a worker to learn when it is due (the worker that ran the step
/// does not look at the queue after every job), and a worker that knows of a timer runs it when
/// due even when a job it was handed meanwhile kept it busy.
pub async fn a_timer_set_by_a_step_runs_when_due_after_its_worker_ran_something_else(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let runner = b.open_runner(dir.path(), |_| {}).await;
    runner.register_tree(WAITS, TreeFormat::Json).await.unwrap();
    runner.register_tree(QUICK, TreeFormat::Json).await.unwrap();
    let stop = CancellationToken::new();
    let _workers = pool::spawn(runner.clone(), 1, stop.clone());
    wait_idle(&runner, 1).await;

    let submitted = std::time::Instant::now();
    let waits = runner.submit(submit("waits", "t-1")).await.unwrap().run;
    eventually("the run to wait for its timer", WAIT, || async {
        let run = runner.get_run(&waits.run_id).unwrap().run;
        (run.step >= 1 && runner.idle_workers() == 1).then_some(())
    })
    .await;
    // The one worker is handed another run while the timer is pending.
    let quick = runner.submit(submit("quick", "t-2")).await.unwrap().run;
    common::wait_status(&runner, &quick.run_id, RunStatus::Succeeded).await;
    common::wait_status(&runner, &waits.run_id, RunStatus::Succeeded).await;
    let took = submitted.elapsed();
    assert!(
        took >= Duration::from_millis(400),
        "the timer ran early: {took:?}"
    );
    assert!(
        took < IDLE / 2,
        "the timer of 400 ms ran after {took:?}: no worker knew when it was due"
    );
    stop.cancel();
}

/// A caller that goes away once its submission is committing (a client whose connection is cut,
/// or whose deadline passes, drops the RPC) does not take the hand-off with it: the job the
/// transaction claimed still reaches the worker taken for it, and runs at once — not after the
/// claim's lease (30 s) runs out.
pub async fn a_hand_off_whose_caller_went_away_still_reaches_its_worker(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let options = RunnerOptions::default();
    assert!(
        options.mailbox.lease > WAIT,
        "a lease longer than the test waits"
    );
    let runner = b.open_runner_with(dir.path(), |_| {}, options).await;
    runner.register_tree(QUICK, TreeFormat::Json).await.unwrap();
    let stop = CancellationToken::new();
    let _workers = pool::spawn(runner.clone(), 1, stop.clone());

    // On a shared store the idle worker also looks for work once a second, and is not idle
    // while it looks: a submission made then takes no worker and is claimed as usual, so it
    // is submitted again (under another id) until one takes the worker.
    let mut attempt = 0;
    let gone = loop {
        attempt += 1;
        assert!(attempt <= 20, "no submission found the worker idle");
        wait_idle(&runner, 1).await;
        let taken = runner.hand_offs_taken();
        let mut input = submit("quick", &format!("t-{attempt}"));
        input.run_id = format!("gone-{attempt}");
        let gone = input.run_id.clone();
        {
            // Polled once: the worker is taken and the transaction sent to the store; then
            // dropped.
            let mut submission = std::pin::pin!(runner.submit(input));
            assert!(futures_util::poll!(submission.as_mut()).is_pending());
        }
        if runner.hand_offs_taken() > taken {
            break gone;
        }
        eventually("the submission without a hand-off to run", WAIT, || async {
            (runner.get_run(&gone).ok()?.run.status == RunStatus::Succeeded).then_some(())
        })
        .await;
    };
    eventually(
        "the submission to commit without its caller",
        WAIT,
        || async { runner.run_record(&gone).ok() },
    )
    .await;
    eventually(
        "the run to succeed, its job handed to the worker",
        WAIT,
        || async { (runner.get_run(&gone).ok()?.run.status == RunStatus::Succeeded).then_some(()) },
    )
    .await;
    assert_eq!(runner.jobs_handed_off(), 1, "the claim reached its worker");
    assert_eq!(runner.lease_takeovers(), 0, "no lease had to run out");
    stop.cancel();
}
