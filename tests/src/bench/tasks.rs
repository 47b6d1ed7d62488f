//! Task workers: dispatch → completion latency with one task in flight (a Python worker over
//! `tests/clients/python/arbor_worker.py`, and the bench's Rust worker next to it to show what
//! is Python's), and throughput with 64 in flight (the Rust worker, so the figure measures
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

/// One finished task as its worker saw it: times on the worker's monotonic clock, in ns.
struct Done {
    run_id: String,
    recv_ns: u64,
    /// When the handler returned (the Python helper's hand-off to its handler thread before).
    handled_ns: Option<u64>,
    ack_ns: u64,
    accepted: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Worker {
    Python,
    Rust,
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
    /// Activation received → handler returned, where the worker says (the Python helper).
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

/// Keeps runs going: submits `n` at the start, and another each time a run's last task is
/// done, so the number of runs asking for tasks stays the same.
struct Keeper {
    runner: Runner,
    repeat: usize,
    done_per_run: HashMap<String, usize>,
}

impl Keeper {
    fn new(runner: Runner, repeat: usize, n: usize) -> Self {
        let keeper = Self {
            runner,
            repeat,
            done_per_run: HashMap::new(),
        };
        (0..n).for_each(|_| keeper.submit());
        keeper
    }

    fn submit(&self) {
        let mut runner = self.runner.clone();
        tokio::spawn(async move {
            let tree_id = TREE_ID.into();
            let req = rpb::SubmitRunRequest {
                tree_id,
                ..Default::default()
            };
            if let Err(e) = runner.submit_run(req).await {
                eprintln!("  submit failed: {e}");
            }
        });
    }

    fn task_done(&mut self, run_id: &str) {
        let n = self.done_per_run.entry(run_id.to_string()).or_default();
        *n += 1;
        if *n == self.repeat {
            self.done_per_run.remove(run_id);
            self.submit();
        }
    }
}

/// The venv of the polyglot tests, and stubs of the worker service in a directory of the
/// bench's own (the tests regenerate `target/py-gen` per process and may be running).
fn python_setup() -> (PathBuf, PathBuf) {
    let root = workspace_root();
    let requirements = root.join("tests/clients/python/requirements.txt");
    let python = tools::python_venv("py-venv", &requirements);
    let out = tools::target_dir().join("bench-py-gen");
    std::fs::create_dir_all(&out).expect("stub dir");
    tools::run(
        std::process::Command::new(&python)
            .args(["-m", "grpc_tools.protoc", "-I"])
            .arg(root.join("proto"))
            .arg(format!("--python_out={}", out.display()))
            .arg(format!("--grpc_python_out={}", out.display()))
            .arg("arbor/runner/v1/worker_service.proto"),
        "generating the Python worker stubs from proto/",
    );
    (python, out)
}

/// One `done run=… recv=… ack=… accepted=…` line of bench_worker.py.
fn parse_done(line: &str) -> Option<Done> {
    let (mut run_id, mut recv_ns, mut handled_ns, mut ack_ns) = (None, None, None, None);
    let mut accepted = false;
    for field in line.strip_prefix("done ")?.split_whitespace() {
        match field.split_once('=')? {
            ("run", v) => run_id = Some(v.to_string()),
            ("recv", v) => recv_ns = v.parse().ok(),
            ("handled", v) => handled_ns = v.parse().ok(),
            ("ack", v) => ack_ns = v.parse().ok(),
            ("accepted", v) => accepted = v == "true",
            _ => {}
        }
    }
    Some(Done {
        run_id: run_id?,
        recv_ns: recv_ns?,
        handled_ns,
        ack_ns: ack_ns?,
        accepted,
    })
}

/// bench_worker.py with max_in_flight=1; its `done` lines arrive on the returned channel once
/// it has issued StreamTasks.
async fn python_worker(
    cluster: &BenchCluster,
    (python, stubs): &(PathBuf, PathBuf),
) -> (tokio::process::Child, mpsc::UnboundedReceiver<Done>) {
    let mut child = tokio::process::Command::new(python)
        .arg(workspace_root().join("tests/clients/python/bench_worker.py"))
        .arg("--stubs")
        .arg(stubs)
        .args(["--runner", &cluster.runners[0].addr.to_string()])
        .args([
            "--token",
            WORKER,
            "--types",
            TASK_TYPE,
            "--max-in-flight",
            "1",
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start bench_worker.py");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    while let Ok(Ok(Some(line))) = tokio::time::timeout(PATIENCE, lines.next_line()).await {
        if line == "ready" {
            break;
        }
    }
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(done) = parse_done(&line)
                && tx.send(done).is_err()
            {
                return;
            }
        }
    });
    (child, rx)
}

/// One StreamTasks stream; each activation is completed at once on its own tokio task, so up
/// to `max_in_flight` CompleteTask calls are in flight together on the one channel.
async fn rust_worker(
    cluster: &BenchCluster,
    max_in_flight: usize,
) -> mpsc::UnboundedReceiver<Done> {
    let token = BearerToken::new(Some(WORKER)).expect("ascii token");
    let mut workers =
        WorkerServiceClient::with_interceptor(cluster.runners[0].channel().await, token);
    let request = rpb::StreamTasksRequest {
        worker_id: "bench-rust".into(),
        task_types: vec![TASK_TYPE.into()],
        max_in_flight: max_in_flight as u32,
        lease_ms: 30_000,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let origin = Instant::now();
    let ns = move || origin.elapsed().as_nanos() as u64;
    tokio::spawn(async move {
        let mut stream = match workers.stream_tasks(request).await {
            Ok(s) => s.into_inner(),
            Err(e) => return eprintln!("  StreamTasks refused: {e}"),
        };
        let output = to_proto_value(&json!({"ok": true}));
        loop {
            let task = match stream.message().await {
                Ok(Some(rpb::StreamTasksResponse { task: Some(task) })) => task,
                Ok(Some(_)) => continue,
                // Once the measurement has dropped its receiver the end is expected.
                _ if tx.is_closed() => return,
                Ok(None) => return eprintln!("  the runner ended the task stream"),
                Err(e) => return eprintln!("  task stream broke: {e}"),
            };
            let recv_ns = ns();
            let (mut workers, tx, output) = (workers.clone(), tx.clone(), output.clone());
            tokio::spawn(async move {
                let req = rpb::CompleteTaskRequest {
                    task_id: task.task_id,
                    lease_token: task.lease_token,
                    output: Some(output),
                };
                let reply = workers.complete_task(req).await;
                let _ = tx.send(Done {
                    run_id: task.run_id,
                    recv_ns,
                    handled_ns: None,
                    ack_ns: ns(),
                    accepted: reply.is_ok_and(|r| r.into_inner().accepted),
                });
            });
        }
    });
    rx
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
    python: &(PathBuf, PathBuf),
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

pub fn print(rows: &[TaskRow], repeat: usize) {
    println!(
        "\ntask workers, one task in flight (runs of repeat×{repeat} over one remote tool, one run \
         at a time; python = bench_worker.py on the arbor_worker.py helper, max_in_flight=1; \
         rust = the bench's own worker, max_in_flight=1)"
    );
    println!(
        "{:<8} {:<6} {:>6} {:>11} {:>7} {:>14} {:>7} {:>12} {:>7} {:>10} {:>9} {:>7}",
        "store",
        "worker",
        "tasks",
        "act→ack p50",
        "p99",
        "round trip p50",
        "p99",
        "ack→next p50",
        "p99",
        "queue wait",
        "mean/task",
        "refused"
    );
    for r in rows {
        for l in &r.latency {
            println!(
                "{:<8} {:<6} {:>6} {:>11.2} {:>7.2} {:>14.2} {:>7.2} {:>12.2} {:>7.2} {:>10.2} {:>9.2} {:>7}{}",
                r.store,
                l.worker,
                l.tasks,
                pct_ms(&l.act_ack, 0.5),
                pct_ms(&l.act_ack, 0.99),
                pct_ms(&l.round_trip, 0.5),
                pct_ms(&l.round_trip, 0.99),
                pct_ms(&l.ack_next, 0.5),
                pct_ms(&l.ack_next, 0.99),
                l.queue_wait_ms,
                l.mean.as_secs_f64() * 1e3,
                l.refused,
                if l.unfinished { "  UNFINISHED" } else { "" }
            );
        }
    }
    for r in rows {
        for l in r.latency.iter().filter(|l| !l.handoff.is_empty()) {
            println!(
                "         {} {}: activation → its handler, in the helper: p50 {:.2} ms, p99 {:.2} ms",
                r.store,
                l.worker,
                pct_ms(&l.handoff, 0.5),
                pct_ms(&l.handoff, 0.99)
            );
        }
    }
    println!(
        "(ms, on the worker's clock. act→ack = activation received → CompleteTask OK: dispatch → \
         completion (the TASK_DISPATCHED commit precedes the send; the completion's commit \
         precedes the OK). round trip = activation → the next activation of the same run: \
         CompleteTask, the run resumes and queues its next task, the dispatch commit. ack→next = \
         the runner's share of it. queue wait = queued → dispatched, mean of the runner's \
         counters (ms resolution). mean/task = wall time / tasks, a new run every {repeat} tasks \
         included)"
    );
    println!(
        "\ntask workers, {IN_FLIGHT} in flight (the bench's Rust worker: one StreamTasks stream, \
         max_in_flight={IN_FLIGHT}, each activation completed at once; {RUNS_AT_ONCE} runs of \
         repeat×{repeat} kept going)"
    );
    println!(
        "{:<8} {:>7} {:>8} {:>11} {:>7} {:>6} {:>10} {:>8} {:>8} {:>8} {:>11} {:>10} {:>12} {:>7}",
        "store",
        "tasks",
        "tasks/s",
        "act→ack p50",
        "p99",
        "held",
        "queue wait",
        "run CPU",
        "appr CPU",
        "pg CPU",
        "CPU ms/task",
        "fsync/task",
        "policy cyc/s",
        "ratio"
    );
    for r in rows {
        let t = &r.throughput;
        let per_task = |f: u64| format!("{:.2}", f as f64 / t.tasks.max(1) as f64);
        println!(
            "{:<8} {:>7} {:>8.0} {:>11.2} {:>7.2} {:>6.1} {:>10.2} {:>7.1}s {:>7.1}s {:>8} {:>11.3} {:>10} {:>12.0} {:>6.2}×{}",
            r.store,
            t.tasks,
            t.tasks_per_s(),
            pct_ms(&t.act_ack, 0.5),
            pct_ms(&t.act_ack, 0.99),
            t.held(),
            t.queue_wait_ms,
            t.runner_cpu,
            t.approval_cpu,
            t.db_cpu.map_or_else(|| "-".into(), |c| format!("{c:.1}s")),
            t.cpu_ms_per_task(),
            t.fsyncs.map_or_else(|| "n/a".into(), per_task),
            r.policy_cycles_per_s,
            t.tasks_per_s() / r.policy_cycles_per_s,
            if t.unfinished { "  UNFINISHED" } else { "" }
        );
        let w = &t.whereabouts;
        println!(
            "         the {RUNS_AT_ONCE} runs on average: {:.1} tasks leased, {:.1} queued; {:.1} runs \
             waiting for a step, {:.1} being stepped; {} completions refused",
            w.tasks_leased, w.tasks_queued, w.steps_waiting, w.steps_running, t.refused
        );
    }
    println!(
        "(act→ack in ms, as above; held = tasks the worker held on average (rate × hold time); \
         fsync/task = flushes of both services per task (on PostgreSQL: committed batch \
         transactions); the runs' whereabouts are the runner's gauges scraped every 200 ms; policy cyc/s = the \
         policy-path approval cycle at K={IN_FLIGHT} on the same store in this run; ratio = \
         tasks/s ÷ policy cyc/s)"
    );
    print_ratios(rows);
}

/// The targets are set on sled; PostgreSQL's figures are held against them too, marked
/// as such, and divided by sled's.
fn print_ratios(rows: &[TaskRow]) {
    println!(
        "\nratios against the targets (task workers; Zeebe publishes p50 14 ms / p99 390 ms for job push activation)"
    );
    for r in rows {
        let verdict = |ok: bool| {
            let mark = if ok { "PASS" } else { "FAIL" };
            match r.store {
                "sled" => mark.to_string(),
                _ => format!("({mark}; the targets are set on sled)"),
            }
        };
        let Some(py) = r.latency.first() else {
            continue;
        };
        let (p50, p99) = (pct_ms(&py.act_ack, 0.5), pct_ms(&py.act_ack, 0.99));
        let (tps, cps) = (r.throughput.tasks_per_s(), r.policy_cycles_per_s);
        let x = tps / cps;
        let s = r.store;
        println!(
            "  {s:<8} python, one in flight: act→ack p50 {p50:.2} ms (target ≤ 3 ms) {}",
            verdict(p50 <= 3.0)
        );
        println!(
            "  {s:<8} python, one in flight: act→ack p99 {p99:.2} ms (target ≤ 15 ms) {}",
            verdict(p99 <= 15.0)
        );
        println!(
            "  {s:<8} tasks/s at {IN_FLIGHT} in flight ÷ policy cycles/s at K={IN_FLIGHT}: {tps:.0} / {cps:.0} = {x:.2}×  (target ≥ 2.00×) {}",
            verdict(x >= 2.0)
        );
    }
    let find = |s: &str| rows.iter().find(|r| r.store == s);
    if let (Some(pg), Some(sl)) = (find("postgres"), find("sled")) {
        let (a, b) = (pg.throughput.tasks_per_s(), sl.throughput.tasks_per_s());
        println!(
            "  postgres/sled tasks/s at {IN_FLIGHT} in flight: {a:.0} / {b:.0} = {:.2}×",
            a / b
        );
        for (i, l) in sl.latency.iter().enumerate() {
            let Some(p) = pg.latency.get(i) else { continue };
            for (what, pv, sv) in [
                ("act→ack", &p.act_ack, &l.act_ack),
                ("round trip", &p.round_trip, &l.round_trip),
            ] {
                let (a, b) = (pct_ms(pv, 0.5), pct_ms(sv, 0.5));
                println!(
                    "  postgres/sled {} {what} p50, one in flight: {a:.2} / {b:.2} ms = {:.2}×",
                    l.worker,
                    a / b
                );
            }
        }
    }
}
