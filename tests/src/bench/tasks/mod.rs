//! Task workers: dispatch → completion latency with one task in flight (a Python worker on the
//! `arbor-client` package's `Worker`, `clients/python`, and the bench's Rust worker next to it
//! to show what is Python's), and throughput with 64 in flight (the Rust worker, so the figure measures
//! Arbor, not Python), next to the policy-path approval cycle at K=64 of the same run. The runs
//! are a `repeat` over one remote tool the tree declares in `task_types`, so each run asks for
//! its tasks back to back.

use std::{
    collections::HashMap,
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use arbor_shared::{
    auth::BearerToken,
    json::to_proto_value,
    proto::runner::v1::{self as rpb, worker_service_client::WorkerServiceClient},
};
use serde_json::json;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    sync::mpsc,
};
use tokio_util::sync::CancellationToken;

use super::{
    Meters,
    cluster::{BenchCluster, Runner, SUBMITTER, Spec, Store, WORKER},
    cycle::{self, CycleResult, Decider},
    procstat::{self, pct_ms},
};
use crate::{process::workspace_root, tools};

mod report;
mod workers;

pub use report::print;
use workers::{Done, Keeper, Worker, python_setup, python_worker, rust_worker};

pub const TASK_TYPE: &str = "bench.echo";
const TREE_ID: &str = "bench-tasks";
/// Tasks the Rust worker holds at once; the policy cycle it is compared with runs at this K.
pub const IN_FLIGHT: usize = 64;
/// With one run per slot, a slot would sit empty while its run resumes and asks for its next
/// task; twice as many runs keep tasks queued behind the 64 leased ones.
const RUNS_AT_ONCE: usize = 2 * IN_FLIGHT;
/// No task finished for this long: the measurement ends with what it has, marked unfinished.
const PATIENCE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct TaskOptions {
    /// Tasks measured one at a time, per worker (after one warm-up run).
    pub latency_tasks: usize,
    /// Tasks measured at 64 in flight (after a warm-up).
    pub throughput_tasks: usize,
    /// Tasks per run (the tree's `repeat` count).
    pub repeat: usize,
    /// Policy-path cycles at K=64 to compare with, when the cycle section has no such row.
    pub cycles: usize,
    /// Cycles run before those (see [`Options::warmup`](super::Options::warmup)).
    pub warmup: usize,
}

pub struct LatencyResult {
    pub worker: &'static str,
    pub tasks: usize,
    /// Activation received → CompleteTask OK, in the worker.
    pub act_ack: Vec<Duration>,
    /// Activation → the next activation of the same run.
    pub round_trip: Vec<Duration>,
    /// CompleteTask OK → the next activation of the same run: the runner's share.
    pub ack_next: Vec<Duration>,
    /// Activation received → handler returned, where the worker says (the Python Worker).
    pub handoff: Vec<Duration>,
    /// Wall time per task, a new run every `repeat` tasks included.
    pub mean: Duration,
    /// Mean ms from a task's queueing to its dispatch (the runner's counters, ms resolution).
    pub queue_wait_ms: f64,
    pub refused: usize,
    pub unfinished: bool,
}

/// Where the kept runs are, averaged over scrapes of the runner's gauges.
#[derive(Debug, Clone, Copy, Default)]
pub struct Whereabouts {
    pub tasks_leased: f64,
    pub tasks_queued: f64,
    /// Runs waiting for their next step (mailbox jobs queued), and being stepped.
    pub steps_waiting: f64,
    pub steps_running: f64,
}

pub struct ThroughputResult {
    pub tasks: usize,
    pub elapsed: Duration,
    pub act_ack: Vec<Duration>,
    pub whereabouts: Whereabouts,
    pub queue_wait_ms: f64,
    pub runner_cpu: f64,
    pub approval_cpu: f64,
    pub db_cpu: Option<f64>,
    pub fsyncs: Option<u64>,
    pub refused: usize,
    pub unfinished: bool,
}

impl ThroughputResult {
    pub fn tasks_per_s(&self) -> f64 {
        self.tasks as f64 / self.elapsed.as_secs_f64()
    }

    /// Tasks the worker held on average (Little's law: rate × time held).
    pub fn held(&self) -> f64 {
        let n = self.act_ack.len().max(1) as f64;
        self.tasks_per_s() * self.act_ack.iter().map(Duration::as_secs_f64).sum::<f64>() / n
    }

    pub fn cpu_ms_per_task(&self) -> f64 {
        (self.runner_cpu + self.approval_cpu + self.db_cpu.unwrap_or(0.0)) * 1e3
            / self.tasks.max(1) as f64
    }
}

pub struct TaskRow {
    pub store: &'static str,
    /// The Python worker's, then the Rust worker's.
    pub latency: Vec<LatencyResult>,
    pub throughput: ThroughputResult,
    /// The policy-path approval cycle at K=64 on the same store.
    pub policy_cycles_per_s: f64,
}

fn tree(repeat: usize) -> String {
    json!({"id": TREE_ID, "version": 1, "task_types": [TASK_TYPE],
        "root": {"type": "repeat", "name": "loop", "count": repeat,
            "child": {"type": "tool", "name": "call", "tool": TASK_TYPE,
                      "args": {"n": 1}, "output": "out"}}})
    .to_string()
}

/// Both services (approval-svc follows the runner as in production, deciding nothing here) on
/// a fresh store, with the repeat tree registered.
async fn start(store: &Store, name: &str, repeat: usize) -> (BenchCluster, Runner) {
    let spec = Spec {
        store,
        replicas: 1,
        approval: true,
        rules: super::cluster::Rules::Ask,
        runner_args: &[],
        approval_args: &[],
        name,
    };
    let cluster = BenchCluster::start_spec(&spec).await;
    let mut runner = cluster.runner_as(SUBMITTER).await;
    let document = tree(repeat);
    let req = rpb::RegisterTreeRequest {
        document,
        format: 0,
    };
    runner.register_tree(req).await.expect("register the tree");
    (cluster, runner)
}

/// The runner's dispatch counters: (dispatches, summed ms from due to dispatched).
async fn dispatch_counters(cluster: &BenchCluster) -> (f64, f64) {
    let s = crate::scrape::scrape(&cluster.runners[0].metrics_url()).await;
    (
        s.value("arbor_runner_task_dispatches_total", &[]),
        s.value("arbor_runner_task_dispatch_wait_ms_total", &[]),
    )
}

fn queue_wait_ms(before: (f64, f64), after: (f64, f64)) -> f64 {
    (after.1 - before.1) / (after.0 - before.0).max(1.0)
}

fn ns(from: u64, to: u64) -> Duration {
    Duration::from_nanos(to.saturating_sub(from))
}

/// One run at a time, each asking for `repeat` tasks back to back, served with one task in
/// flight; the first run warms up and is not counted.
async fn latency(
    store: &Store,
    worker: Worker,
    python: &PathBuf,
    tasks: usize,
    repeat: usize,
) -> LatencyResult {
    let (cluster, runner) = start(store, "tasks_latency", repeat).await;
    let (child, mut rx) = match worker {
        Worker::Python => {
            let (child, rx) = python_worker(&cluster, python).await;
            (Some(child), rx)
        }
        Worker::Rust => (None, rust_worker(&cluster, 1).await),
    };
    let mut keeper = Keeper::new(runner, repeat, 1);
    let (warm, total) = (repeat, repeat + tasks.div_ceil(repeat) * repeat);
    let mut seen: Vec<Done> = Vec::with_capacity(total);
    let (mut counters_before, mut unfinished) = ((0.0, 0.0), false);
    while seen.len() < total {
        let Ok(Some(done)) = tokio::time::timeout(PATIENCE, rx.recv()).await else {
            unfinished = true;
            break;
        };
        keeper.task_done(&done.run_id);
        seen.push(done);
        if seen.len() == warm {
            counters_before = dispatch_counters(&cluster).await;
        }
    }
    let queue_wait_ms = queue_wait_ms(counters_before, dispatch_counters(&cluster).await);
    drop(rx);
    if let Some(mut child) = child {
        if let Some(pid) = child.id() {
            use nix::sys::signal::{Signal, kill};
            let _ = kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
        let _ = tokio::time::timeout(Duration::from_secs(15), child.wait()).await;
    }
    cluster.stop().await;

    let measured = seen.get(warm..).unwrap_or_default();
    let mut act_ack: Vec<_> = measured.iter().map(|d| ns(d.recv_ns, d.ack_ns)).collect();
    let mut handoff: Vec<_> = measured
        .iter()
        .filter_map(|d| Some(ns(d.recv_ns, d.handled_ns?)))
        .collect();
    let (mut round_trip, mut ack_next) = (Vec::new(), Vec::new());
    for pair in measured.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.run_id == b.run_id {
            round_trip.push(ns(a.recv_ns, b.recv_ns));
            ack_next.push(ns(a.ack_ns, b.recv_ns));
        }
    }
    let mean = match (seen.get(warm.wrapping_sub(1)), measured.last()) {
        (Some(first), Some(last)) => ns(first.ack_ns, last.ack_ns) / measured.len() as u32,
        _ => Duration::ZERO,
    };
    for v in [&mut act_ack, &mut round_trip, &mut ack_next, &mut handoff] {
        v.sort();
    }
    LatencyResult {
        worker: if worker == Worker::Python {
            "python"
        } else {
            "rust"
        },
        tasks: measured.len(),
        act_ack,
        round_trip,
        ack_next,
        handoff,
        mean,
        queue_wait_ms,
        refused: measured.iter().filter(|d| !d.accepted).count(),
        unfinished,
    }
}

fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter().map(|p| procstat::cpu_seconds(*p)).sum()
}

/// Averages the runner's task and mailbox gauges over scrapes every 200 ms until `stop`.
async fn whereabouts(url: String, stop: CancellationToken) -> Whereabouts {
    let (mut sum, mut n) = ([0.0; 4], 0.0);
    while !stop.is_cancelled() {
        let s = crate::scrape::scrape(&url).await;
        for (i, (family, label, value)) in [
            ("arbor_runner_tasks", "state", "leased"),
            ("arbor_runner_tasks", "state", "queued"),
            ("arbor_runner_mailbox_jobs", "status", "queued"),
            ("arbor_runner_mailbox_jobs", "status", "claimed"),
        ]
        .into_iter()
        .enumerate()
        {
            sum[i] += s.value(family, &[(label, value)]);
        }
        n += 1.0;
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    let [a, b, c, d] = sum.map(|v| v / f64::max(n, 1.0));
    Whereabouts {
        tasks_leased: a,
        tasks_queued: b,
        steps_waiting: c,
        steps_running: d,
    }
}

/// 128 runs of the repeat tree kept going against the Rust worker at 64 in flight; `tasks`
/// completions counted after a warm-up of a tenth as many (at least two per run).
async fn throughput(store: &Store, tasks: usize, repeat: usize) -> ThroughputResult {
    let (cluster, runner) = start(store, "tasks_throughput", repeat).await;
    let mut rx = rust_worker(&cluster, IN_FLIGHT).await;
    let mut keeper = Keeper::new(runner, repeat, RUNS_AT_ONCE);
    let warm = (tasks / 10).max(2 * RUNS_AT_ONCE);
    let (runner_pids, approval_pids) = (cluster.runner_pids(), cluster.approval_pids());
    let stop = CancellationToken::new();
    let (mut counted, mut act_ack, mut refused, mut unfinished) = (0, Vec::new(), 0, false);
    let (mut before, mut sampler, mut start) = (None, None, Instant::now());
    while counted < warm + tasks {
        let Ok(Some(d)) = tokio::time::timeout(PATIENCE, rx.recv()).await else {
            unfinished = true;
            break;
        };
        keeper.task_done(&d.run_id);
        counted += 1;
        if counted == warm {
            let cpu = (cpu_of(&runner_pids), cpu_of(&approval_pids));
            let db = cluster.db.as_ref().map(|db| db.server_cpu());
            let meters = Meters::read(&cluster, "policy").await;
            before = Some((meters, cpu, db, dispatch_counters(&cluster).await));
            let url = cluster.runners[0].metrics_url();
            sampler = Some(tokio::spawn(whereabouts(url, stop.clone())));
            start = Instant::now();
        } else if counted > warm {
            refused += usize::from(!d.accepted);
            act_ack.push(ns(d.recv_ns, d.ack_ns));
        }
    }
    let elapsed = start.elapsed();
    let (runner_cpu, approval_cpu) = (cpu_of(&runner_pids), cpu_of(&approval_pids));
    let db_cpu = cluster.db.as_ref().map(|db| db.server_cpu());
    let meters = Meters::read(&cluster, "policy").await;
    let counters = dispatch_counters(&cluster).await;
    stop.cancel();
    let whereabouts = match sampler {
        Some(s) => s.await.unwrap_or_default(),
        None => Whereabouts::default(),
    };
    drop(rx);
    cluster.stop().await;
    let (m0, (r0, a0), db0, c0) = before.unwrap_or_default();
    act_ack.sort();
    ThroughputResult {
        tasks: act_ack.len(),
        elapsed,
        act_ack,
        whereabouts,
        queue_wait_ms: queue_wait_ms(c0, counters),
        runner_cpu: runner_cpu - r0,
        approval_cpu: approval_cpu - a0,
        db_cpu: db_cpu.zip(db0).map(|(b, a)| b - a),
        fsyncs: meters.fsyncs_since(&m0),
        refused,
        unfinished,
    }
}

/// Every store of the run: latency (Python, then Rust), throughput, and the policy cycle at
/// K=64 (from `cycles` when the cycle section measured it, else measured here).
pub async fn run(stores: &[Store], opts: &TaskOptions, cycles: &[CycleResult]) -> Vec<TaskRow> {
    let python = python_setup();
    let mut rows = Vec::new();
    for store in stores {
        let label = store.label();
        let mut latencies = Vec::new();
        for worker in [Worker::Python, Worker::Rust] {
            let l = latency(store, worker, &python, opts.latency_tasks, opts.repeat).await;
            eprintln!(
                "tasks: {label} one in flight ({}), {} tasks: act→ack p50 {:.2} ms, p99 {:.2} ms",
                l.worker,
                l.tasks,
                pct_ms(&l.act_ack, 0.5),
                pct_ms(&l.act_ack, 0.99)
            );
            latencies.push(l);
            super::settle().await;
        }
        let throughput = throughput(store, opts.throughput_tasks, opts.repeat).await;
        eprintln!(
            "tasks: {label} {IN_FLIGHT} in flight, {} tasks: {:.0} tasks/s",
            throughput.tasks,
            throughput.tasks_per_s()
        );
        super::settle().await;
        let known = cycles.iter().find(|c| {
            c.store == label
                && c.replicas == 1
                && c.decider == Decider::Policy
                && c.concurrency == IN_FLIGHT
        });
        let policy_cycles_per_s = match known {
            Some(c) => c.cycles_per_s(),
            None => {
                let c = cycle::run(
                    store,
                    1,
                    Decider::Policy,
                    opts.cycles,
                    opts.warmup,
                    IN_FLIGHT,
                )
                .await;
                eprintln!(
                    "tasks: {label} policy cycle K={IN_FLIGHT}, N={}: {:.0} cycles/s",
                    opts.cycles,
                    c.cycles_per_s()
                );
                c.cycles_per_s()
            }
        };
        rows.push(TaskRow {
            store: label,
            latency: latencies,
            throughput,
            policy_cycles_per_s,
        });
    }
    rows
}
