//! runner-svc's Prometheus metrics. Nothing is double-booked: run, suspension and job counts are
//! read from sled at scrape time (one pass over runs and jobs, checkpoints only of unfinished
//! runs), and the counters come from where the runner already counts (group commit, reaper).
//! A scrape therefore always agrees with what `ListRuns` / `ListJobs` would answer.

use std::sync::Arc;

use arbor_shared::{
    domain::{JobStatus, RunStatus, SuspensionCategory, SuspensionState},
    metrics::{Samples, ScrapeCollector},
};
use prometheus_client::registry::Registry;

use crate::{
    engine::Checkpoint,
    mailbox::Job,
    runs::{RunRecord, Runner},
    store::{T, codec},
};

const RUN_STATUSES: [RunStatus; 7] = [
    RunStatus::Queued,
    RunStatus::Running,
    RunStatus::Suspended,
    RunStatus::Succeeded,
    RunStatus::Failed,
    RunStatus::Cancelled,
    RunStatus::Superseded,
];

const CATEGORIES: [SuspensionCategory; 3] = [
    SuspensionCategory::RequireApproval,
    SuspensionCategory::RequireUserInput,
    SuspensionCategory::RequireExternalExecution,
];

const JOB_STATUSES: [JobStatus; 6] = [
    JobStatus::Queued,
    JobStatus::Claimed,
    JobStatus::Accepted,
    JobStatus::DeadLetter,
    JobStatus::Cancelled,
    JobStatus::Superseded,
];

fn run_status_label(s: RunStatus) -> &'static str {
    match s {
        RunStatus::Queued => "queued",
        RunStatus::Running => "running",
        RunStatus::Suspended => "suspended",
        RunStatus::Succeeded => "succeeded",
        RunStatus::Failed => "failed",
        RunStatus::Cancelled => "cancelled",
        RunStatus::Superseded => "superseded",
    }
}

fn category_label(c: SuspensionCategory) -> &'static str {
    match c {
        SuspensionCategory::RequireApproval => "require_approval",
        SuspensionCategory::RequireUserInput => "require_user_input",
        SuspensionCategory::RequireExternalExecution => "require_external_execution",
    }
}

fn job_status_label(s: JobStatus) -> &'static str {
    match s {
        JobStatus::Queued => "queued",
        JobStatus::Claimed => "claimed",
        JobStatus::Accepted => "accepted",
        JobStatus::DeadLetter => "dead_letter",
        JobStatus::Cancelled => "cancelled",
        JobStatus::Superseded => "superseded",
    }
}

/// A registry whose one collector reads `runner` on every scrape.
pub fn registry(runner: Arc<Runner>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ScrapeCollector::new(move |s| sample(&runner, s))));
    registry
}

fn sample(runner: &Runner, s: &mut Samples) {
    let store = runner.store();
    let mut runs = [0u64; RUN_STATUSES.len()];
    let mut suspensions = [0u64; CATEGORIES.len()];
    let mut unreadable = 0u64;
    for entry in store.tree(T::Runs).iter() {
        let Ok((_, bytes)) = entry else {
            unreadable += 1;
            continue;
        };
        let Ok(run) = codec::decode::<RunRecord>("run", &bytes) else {
            unreadable += 1;
            continue;
        };
        if let Some(i) = RUN_STATUSES.iter().position(|s| *s == run.status) {
            runs[i] += 1;
        }
        if run.status.is_terminal() {
            continue;
        }
        let ck = store
            .tree(T::Checkpoints)
            .get(run.run_id.as_bytes())
            .ok()
            .flatten()
            .and_then(|b| Checkpoint::decode(&b).ok());
        for susp in ck.iter().flat_map(|ck| ck.suspensions()) {
            if susp.state != SuspensionState::Active {
                continue;
            }
            if let Some(i) = CATEGORIES.iter().position(|c| *c == susp.category) {
                suspensions[i] += 1;
            }
        }
    }
    for (status, n) in RUN_STATUSES.iter().zip(runs) {
        s.gauge(
            "arbor_runner_runs",
            "Runs by status.",
            &[("status", run_status_label(*status))],
            n as f64,
        );
    }
    for (category, n) in CATEGORIES.iter().zip(suspensions) {
        s.gauge(
            "arbor_runner_active_suspensions",
            "Active suspensions of unfinished runs, by category.",
            &[("category", category_label(*category))],
            n as f64,
        );
    }

    let mut jobs = [0u64; JOB_STATUSES.len()];
    for entry in store.tree(T::Jobs).iter() {
        let Some(job) = entry
            .ok()
            .and_then(|(_, b)| codec::decode::<Job>("job", &b).ok())
        else {
            unreadable += 1;
            continue;
        };
        if let Some(i) = JOB_STATUSES.iter().position(|s| *s == job.status) {
            jobs[i] += 1;
        }
    }
    for (status, n) in JOB_STATUSES.iter().zip(jobs) {
        s.gauge(
            "arbor_runner_mailbox_jobs",
            "Mailbox jobs by status (queued is the mailbox depth).",
            &[("status", job_status_label(*status))],
            n as f64,
        );
    }
    s.gauge(
        "arbor_runner_unreadable_records",
        "Run or job records that did not decode during this scrape (should be 0).",
        &[],
        unreadable as f64,
    );

    let events = runner.events();
    let last = events.durable_seq();
    s.gauge(
        "arbor_runner_event_last_seq",
        "Seq of the last durable event.",
        &[],
        last as f64,
    );
    for (subscriber, acked) in events.cursors().unwrap_or_default() {
        s.gauge(
            "arbor_runner_subscriber_lag_events",
            "Durable events a durable subscriber has not acked yet (last seq - acked cursor).",
            &[("subscriber", &subscriber)],
            last.saturating_sub(acked) as f64,
        );
    }
    s.counter(
        "arbor_runner_fsyncs",
        "Group-commit flushes (fsyncs) of the runner database.",
        &[],
        store.flush_count(),
    );
    s.counter(
        "arbor_runner_lease_takeovers",
        "Jobs whose lease expired (or whose process died) and went back to the queue.",
        &[],
        runner.lease_takeovers(),
    );
}
