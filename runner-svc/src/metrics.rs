//! runner-svc's Prometheus metrics. Nothing is double-booked: run, suspension and job counts are
//! the state counts the store keeps in the same transactions as the records they count
//! (`counts`), and the counters come from where the runner already counts (group commit,
//! reaper). A scrape therefore agrees with what `ListRuns` / `ListJobs` would answer, and costs
//! the same however many runs are stored.

use std::sync::Arc;

use arbor_shared::metrics::{Samples, ScrapeCollector};
use prometheus_client::registry::Registry;

use crate::{counts::Counted, runs::Runner};

/// A registry whose one collector reads `runner` on every scrape.
pub fn registry(runner: Arc<Runner>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ScrapeCollector::new(move |s| sample(&runner, s))));
    registry
}

fn sample(runner: &Runner, s: &mut Samples) {
    let store = runner.store();
    match crate::counts::Tally::stored(store) {
        Ok(tally) => {
            for c in Counted::all() {
                let g = c.gauge();
                s.gauge(g.family, g.help, &[g.label], tally.get(c) as f64);
            }
        }
        Err(e) => tracing::warn!("metrics: cannot read the state counts: {e}"),
    }

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
        "arbor_runner_store_conflicts",
        "Transactions run again because they conflicted with another (PostgreSQL: serialisation failures, deadlocks, unique violations; always 0 on sled).",
        &[],
        store.stats().conflicts,
    );
    let (memory, store) = events.events_read();
    for (from, n) in [("memory", memory), ("store", store)] {
        s.counter(
            "arbor_runner_stream_events_read",
            "Events read for streams, by where from: memory (the last 1,024 seqs: what this process committed, and other replicas' events a stream near the head already read) or the store.",
            &[("from", from)],
            n,
        );
    }
    s.counter(
        "arbor_runner_lease_takeovers",
        "Jobs whose lease expired (or whose process died) and went back to the queue.",
        &[],
        runner.lease_takeovers(),
    );
    s.counter(
        "arbor_runner_jobs_handed_off",
        "Jobs claimed by the transaction that queued them, for a worker of this process that waited for work.",
        &[],
        runner.jobs_handed_off(),
    );

    tasks(runner, s);
}

/// Tasks of task workers: queued and leased now (from the store's indexes, whatever replica
/// took them), and this process's counters of dispatches, outcomes and lease expiries.
fn tasks(runner: &Runner, s: &mut Samples) {
    let (queued, leased) = runner.live_task_counts();
    for (state, n) in [("queued", queued), ("leased", leased)] {
        s.gauge(
            "arbor_runner_tasks",
            "Tasks waiting for a worker (queued) or held by one (leased).",
            &[("state", state)],
            n as f64,
        );
    }
    let m = &runner.task_metrics;
    let read = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    for (outcome, counter) in [
        ("completed", &m.completed),
        ("failed", &m.failed),
        ("errored", &m.errored),
        ("cancelled", &m.cancelled),
    ] {
        s.counter(
            "arbor_runner_tasks_ended",
            "Tasks ended by this process, by outcome (failed: attempts spent or not retryable).",
            &[("outcome", outcome)],
            read(counter),
        );
    }
    s.counter(
        "arbor_runner_task_dispatches",
        "Task attempts leased to workers by this process.",
        &[],
        read(&m.dispatched),
    );
    s.counter(
        "arbor_runner_task_dispatch_wait_ms",
        "Sum over dispatches of the wait from due to dispatched (ms); divide by dispatches for \
         the mean dispatch latency.",
        &[],
        read(&m.dispatch_wait_ms),
    );
    s.counter(
        "arbor_runner_task_lease_expiries",
        "Task leases that ran out (the worker stopped heartbeating or died) and were reaped here.",
        &[],
        read(&m.lease_expiries),
    );
    s.counter(
        "arbor_runner_task_releases",
        "Task leases their workers gave back (ReleaseTask, e.g. while draining): queued again \
         without spending an attempt.",
        &[],
        read(&m.released),
    );
}
