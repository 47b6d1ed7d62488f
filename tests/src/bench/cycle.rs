//! The durable approval cycle: SubmitRun → gate suspends → decision → resume → RUN_SUCCEEDED,
//! N times at concurrency K, decided either by an approval-svc policy rule or by a simulated
//! person who follows WatchApprovals and calls ApprovalService.Resolve; on the embedded store or
//! on PostgreSQL, with one or more replicas of each service.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use tokio::sync::oneshot;

use super::{
    cluster::{APPROVER, APPROVERS, BenchCluster, READER, Rules, SUBMITTER, Spec, Store},
    procstat,
};

/// Who decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decider {
    /// A policy rule in approval-svc auto-approves.
    Policy,
    /// A simulated person follows WatchApprovals and resolves each request.
    Person,
    /// An approval rule asks two of three people; two simulated people vote on each request.
    TwoOfThree,
}

impl Decider {
    pub fn label(self) -> &'static str {
        match self {
            Self::Policy => "policy",
            Self::Person => "person",
            Self::TwoOfThree => "2-of-3",
        }
    }
}

pub const TREE: &str = r#"{"id": "bench-cycle", "version": 1, "root": {"type": "sequence", "name": "main", "children": [
  {"type": "set", "name": "plan", "key": "plan", "value": {"service": "billing", "replicas": 3}},
  {"type": "approval", "name": "gate", "title": "Deploy?", "context": ["plan"],
   "child": {"type": "tool", "name": "deploy", "tool": "ledger.append", "args": {"entry": {"$ref": "plan"}}, "output": "receipt"}},
  {"type": "set", "name": "done", "key": "done", "value": true}
]}}"#;

#[derive(Default)]
struct Track {
    suspended: Option<Instant>,
    resumed: Option<Instant>,
    /// The runner's own times of the two events (wall clock, ms).
    suspended_ms: Option<i64>,
    resumed_ms: Option<i64>,
    done: Option<Instant>,
    failed: bool,
    waiter: Option<oneshot::Sender<()>>,
}

pub struct CycleResult {
    /// `sled` or `postgres`.
    pub store: &'static str,
    /// Replicas of runner-svc (and of approval-svc).
    pub replicas: usize,
    pub decider: Decider,
    pub concurrency: usize,
    pub cycles: usize,
    pub elapsed: Duration,
    pub submit_to_done: Vec<Duration>,
    pub suspend_to_resume: Vec<Duration>,
    /// CPU seconds, summed over the replicas.
    pub runner_cpu: f64,
    pub approval_cpu: f64,
    /// CPU seconds of the PostgreSQL server, where there is one.
    pub db_cpu: Option<f64>,
    /// Peak RSS, summed over the replicas.
    pub runner_peak_rss: u64,
    pub approval_peak_rss: u64,
    /// Data dirs, or the growth of the one database (then all in `runner_bytes`).
    pub runner_bytes: u64,
    pub approval_bytes: u64,
    pub failed: usize,
    /// Runs whose end the driver did not see within [`RUN_PATIENCE`].
    pub unfinished: usize,
    pub fsyncs: Option<u64>,
    /// The runners' transactions run again after a conflict (see `Meters`).
    pub conflicts: Option<u64>,
    /// Events the runners' streams read from the store, not from memory (see `Meters`).
    pub streamed_from_store: Option<u64>,
    /// Bytes of WAL PostgreSQL wrote during the cycles, where there is a PostgreSQL.
    pub wal_bytes: Option<f64>,
    /// Where suspended → resumed went, per run (wall-clock ms, whole milliseconds): the runner's
    /// suspension event → the request stored at approval-svc → its decision → the runner's
    /// resume event.
    pub stages: [Vec<i64>; 3],
    /// Mean time from a request's arrival at approval-svc to its decision (its own histogram).
    pub decide_ms: Option<f64>,
}

impl CycleResult {
    pub fn cycles_per_s(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU of every process of the system (services and database) per cycle, in ms.
    pub fn cpu_ms_per_cycle(&self) -> f64 {
        (self.runner_cpu + self.approval_cpu + self.db_cpu.unwrap_or(0.0)) * 1e3
            / self.cycles.max(1) as f64
    }
}

type Tracks = Arc<Mutex<HashMap<String, Track>>>;

/// How long a driver waits for its run's end before it counts the run as unfinished and moves
/// on (so a stalled configuration ends with a row that says so instead of hanging the bench).
pub const RUN_PATIENCE: Duration = Duration::from_secs(30);

fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter().map(|p| procstat::cpu_seconds(*p)).sum()
}

/// Runs `cycles` cycles at `concurrency` against a fresh cluster on `store` with `replicas`
/// replicas of each service. Driver `i` submits to runner replica `i % replicas`, as a client
/// behind a load balancer would, and waits for its run's end on the client's one event stream,
/// open on replica 0: it carries every replica's events. The client does the same work however
/// many replicas there are (one stream, every event once), so what a second replica costs or
/// brings is the services' own.
pub async fn run(
    store: &Store,
    replicas: usize,
    decider: Decider,
    cycles: usize,
    warmup: usize,
    concurrency: usize,
) -> CycleResult {
    let name = format!("cycle_{}_r{replicas}_k{concurrency}", decider.label());
    let cluster = BenchCluster::start_spec(&Spec {
        store,
        replicas,
        approval: true,
        rules: match decider {
            Decider::Policy => Rules::AutoApprove,
            Decider::Person => Rules::Ask,
            Decider::TwoOfThree => Rules::TwoOfThree,
        },
        runner_args: &[],
        approval_args: &[],
        name: &name,
    })
    .await;
    let mut runners = Vec::new();
    for i in 0..replicas {
        runners.push(cluster.runner_at(i, SUBMITTER).await);
    }
    runners[0]
        .clone()
        .register_tree(rpb::RegisterTreeRequest {
            document: TREE.into(),
            format: 0,
        })
        .await
        .expect("register the bench tree");

    // The one follower, and the map of what it saw.
    let tracks = Tracks::default();
    let follower = tokio::spawn(follow(cluster.runner_at(0, READER).await, tracks.clone()));
    let person = match decider {
        Decider::Person | Decider::TwoOfThree => {
            // Each of the people who vote, on every approval-svc replica.
            let voters = match decider {
                Decider::Person => &APPROVERS[..1],
                _ => &APPROVERS[..2],
            };
            let mut resolvers = Vec::new();
            for i in 0..replicas {
                for token in voters {
                    resolvers.push(cluster.approvals_at(i, token).await);
                }
            }
            Some(tokio::spawn(person(resolvers, voters.len())))
        }
        Decider::Policy => None,
    };

    // Cycles run and not measured: what is measured is the steady state, with every replica's
    // connections made and statements prepared (more replicas have more to warm up), not how
    // a fresh cluster starts.
    if warmup > 0 {
        let (_, warm) = drive(&runners, &tracks, warmup, concurrency).await;
        let mut map = tracks.lock().expect("tracks");
        for id in warm {
            map.remove(&id);
        }
    }
    let (runner_pids, approval_pids) = (cluster.runner_pids(), cluster.approval_pids());
    let db_before = cluster.db.as_ref().map_or(0, |db| db.bytes());
    let meters_before = super::Meters::read(&cluster, decider.label()).await;
    let (r_cpu0, a_cpu0) = (cpu_of(&runner_pids), cpu_of(&approval_pids));
    let db_cpu0 = cluster.db.as_ref().map(|db| db.server_cpu());
    let pg_stats = super::PG_STATS.load(Ordering::Relaxed);
    if let Some(db) = cluster.db.as_ref().filter(|_| pg_stats) {
        db.reset_statements();
    }
    let wal0 = cluster.db.as_ref().and_then(|db| db.wal_bytes());
    let start = Instant::now();
    let (mut submit_to_done, owned) = drive(&runners, &tracks, cycles, concurrency).await;
    let elapsed = start.elapsed();
    let runner_cpu = cpu_of(&runner_pids) - r_cpu0;
    let approval_cpu = cpu_of(&approval_pids) - a_cpu0;
    let db_cpu = cluster
        .db
        .as_ref()
        .zip(db_cpu0)
        .map(|(db, c0)| db.server_cpu() - c0);
    let wal_bytes = cluster
        .db
        .as_ref()
        .and_then(|db| Some(db.wal_bytes()? - wal0?));
    if let Some(db) = cluster.db.as_ref().filter(|_| pg_stats) {
        super::print_statements(&name, cycles, &db.statements());
        super::print_table_writes(cycles, &db.table_writes());
    }
    let meters = super::Meters::read(&cluster, decider.label()).await;
    let fsyncs = meters.fsyncs_since(&meters_before);
    let conflicts = meters.conflicts_since(&meters_before);
    let streamed_from_store = meters.streamed_from_store_since(&meters_before);
    let decide_ms = meters.decide_ms_since(&meters_before);
    follower.abort();
    if let Some(p) = person {
        p.abort();
    }
    // Each run as the client's stream saw it.
    let mut seen: HashMap<String, Track> = HashMap::new();
    {
        let mut map = tracks.lock().expect("tracks");
        for id in owned {
            if let Some(t) = map.remove(&id) {
                seen.insert(id, t);
            }
        }
    }
    let stages = stages(&cluster, &seen).await;
    let (mut suspend_to_resume, mut failed, mut unfinished) = (Vec::new(), 0, 0);
    for t in seen.values() {
        if let (Some(s), Some(r)) = (t.suspended, t.resumed) {
            suspend_to_resume.push(r - s);
        }
        failed += usize::from(t.failed);
        unfinished += usize::from(t.done.is_none());
    }
    submit_to_done.sort();
    suspend_to_resume.sort();
    let (runner_bytes, approval_bytes) = cluster.stored_bytes(db_before);
    let peak = |pids: &[u32]| pids.iter().map(|p| procstat::peak_rss(*p)).sum();
    let result = CycleResult {
        store: store.label(),
        replicas,
        decider,
        concurrency,
        cycles,
        elapsed,
        submit_to_done,
        suspend_to_resume,
        runner_cpu,
        approval_cpu,
        db_cpu,
        wal_bytes,
        runner_peak_rss: peak(&runner_pids),
        approval_peak_rss: peak(&approval_pids),
        runner_bytes,
        approval_bytes,
        failed,
        unfinished,
        fsyncs,
        conflicts,
        streamed_from_store,
        stages,
        decide_ms,
    };
    cluster.stop().await;
    result
}

/// Runs `cycles` cycles from `concurrency` drivers, driver `i` submitting to runner replica
/// `i % replicas` and waiting for its run's end on the client's one stream; answers each
/// cycle's SubmitRun → end latency (unsorted) and the runs started.
async fn drive(
    runners: &[super::cluster::Runner],
    tracks: &Tracks,
    cycles: usize,
    concurrency: usize,
) -> (Vec<Duration>, Vec<String>) {
    let replicas = runners.len();
    let remaining = Arc::new(AtomicUsize::new(cycles));
    let mut drivers = Vec::new();
    for i in 0..concurrency {
        let replica = i % replicas;
        let (mut runner, tracks, remaining) =
            (runners[replica].clone(), tracks.clone(), remaining.clone());
        drivers.push(tokio::spawn(async move {
            let (mut latencies, mut mine) = (Vec::new(), Vec::new());
            while remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let t0 = Instant::now();
                let run = runner
                    .submit_run(rpb::SubmitRunRequest {
                        tree_id: "bench-cycle".into(),
                        ..Default::default()
                    })
                    .await
                    .expect("submit")
                    .into_inner()
                    .run
                    .expect("run");
                let rx = {
                    let mut map = tracks.lock().expect("tracks");
                    let t = map.entry(run.run_id.clone()).or_default();
                    if t.done.is_some() {
                        None
                    } else {
                        let (tx, rx) = oneshot::channel();
                        t.waiter = Some(tx);
                        Some(rx)
                    }
                };
                if let Some(rx) = rx {
                    let _ = tokio::time::timeout(RUN_PATIENCE, rx).await;
                }
                let done = tracks
                    .lock()
                    .expect("tracks")
                    .get(&run.run_id)
                    .and_then(|t| t.done);
                latencies.push(done.unwrap_or_else(Instant::now) - t0);
                mine.push(run.run_id);
            }
            (latencies, mine)
        }));
    }
    let (mut submit_to_done, mut owned) = (Vec::new(), Vec::new());
    for d in drivers {
        let (latencies, mine) = d.await.expect("driver");
        submit_to_done.extend(latencies);
        owned.extend(mine);
    }
    (submit_to_done, owned)
}

/// Follows the event stream and timestamps each run's suspension, resume and finish on arrival.
fn wall_ms(t: &prost_types::Timestamp) -> i64 {
    t.seconds * 1000 + i64::from(t.nanos) / 1_000_000
}

/// Splits each run's suspended → resumed by the approval's own timestamps (every approval is
/// read back from approval-svc once the cycles are done).
async fn stages(cluster: &BenchCluster, map: &HashMap<String, Track>) -> [Vec<i64>; 3] {
    let mut approvals = cluster.approvals_as(APPROVER).await;
    let mut out: [Vec<i64>; 3] = Default::default();
    let mut token = String::new();
    loop {
        let Ok(page) = approvals
            .list_approvals(apb::ListApprovalsRequest {
                page_size: 1000,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
        else {
            return out;
        };
        let page = page.into_inner();
        for a in &page.approvals {
            let Some(run_id) = a.request.as_ref().map(|r| r.run_id.as_str()) else {
                continue;
            };
            let Some(t) = map.get(run_id) else { continue };
            let arrived = a.created_at.as_ref().map(wall_ms);
            let decided = a
                .decision
                .as_ref()
                .and_then(|d| d.decided_at.as_ref())
                .map(wall_ms);
            if let (Some(s), Some(a), Some(d), Some(r)) =
                (t.suspended_ms, arrived, decided, t.resumed_ms)
            {
                out[0].push(a - s);
                out[1].push(d - a);
                out[2].push(r - d);
            }
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    for v in &mut out {
        v.sort_unstable();
    }
    out
}

async fn follow(mut runner: super::cluster::Runner, tracks: Tracks) {
    use rpb::EventKind as K;
    // A stream that ends (a slow reader dropped, a replica's error) is resumed after the last
    // event seen, as a client would; why it ended is printed.
    let mut after = 0;
    loop {
        let opened = runner
            .stream_events(rpb::StreamEventsRequest {
                follow: true,
                after_seq: Some(after),
                filter: Some(rpb::EventFilter {
                    kinds: vec![
                        K::ExecutionSuspended as i32,
                        K::ExecutionResumed as i32,
                        K::RunSucceeded as i32,
                        K::RunFailed as i32,
                    ],
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await;
        let mut stream = match opened {
            Ok(s) => s.into_inner(),
            Err(e) => {
                eprintln!("  (event stream not opened: {e}; trying again)");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
        };
        let ended = loop {
            let item = match stream.message().await {
                Ok(Some(item)) => item,
                Ok(None) => break "the server closed it".to_string(),
                Err(e) => break e.to_string(),
            };
            let Some(event) = item.event else { continue };
            after = after.max(event.seq);
            let now = Instant::now();
            let at = event.time.as_ref().map(wall_ms);
            let mut map = tracks.lock().expect("tracks");
            let t = map.entry(event.run_id).or_default();
            match K::try_from(event.kind) {
                Ok(K::ExecutionSuspended) => (t.suspended, t.suspended_ms) = (Some(now), at),
                Ok(K::ExecutionResumed) => (t.resumed, t.resumed_ms) = (Some(now), at),
                Ok(K::RunSucceeded | K::RunFailed) => {
                    t.failed = event.kind == K::RunFailed as i32;
                    t.done = Some(now);
                    if let Some(w) = t.waiter.take() {
                        let _ = w.send(());
                    }
                }
                _ => {}
            }
        };
        eprintln!("  (event stream ended after seq {after}: {ended}; resuming)");
    }
}

/// People at their screens: each new pending approval (seen on replica 0's watch) is approved by
/// `voters` of them at once (one, or two for the 2-of-3 rule), the resolves spread round-robin
/// over the approval-svc replicas (`resolvers` holds each voter's client on each replica, voters
/// next to each other).
async fn person(resolvers: Vec<super::cluster::Approvals>, voters: usize) {
    let mut watch = resolvers[0]
        .clone()
        .watch_approvals(apb::WatchApprovalsRequest {
            filter: Some(apb::ApprovalFilter {
                states: vec![apb::ApprovalState::Pending as i32],
                ..Default::default()
            }),
        })
        .await
        .expect("watch approvals")
        .into_inner();
    let mut next = 0;
    while let Ok(Some(change)) = watch.message().await {
        let Some(approval) = change.approval else {
            continue;
        };
        // A new request only: a vote's change of a pending approval is no new work.
        if approval.state != apb::ApprovalState::Pending as i32
            || change.change != apb::ChangeKind::Created as i32
        {
            continue;
        }
        let replica = next % (resolvers.len() / voters);
        next += 1;
        for v in 0..voters {
            let mut approvals = resolvers[replica * voters + v].clone();
            let request_id = approval.request_id.clone();
            tokio::spawn(async move {
                let _ = approvals
                    .resolve(apb::ResolveRequest {
                        request_id,
                        decision: arbor_shared::proto::runner::v1::DecisionKind::Approve as i32,
                        reason: "looks right".into(),
                        ..Default::default()
                    })
                    .await;
            });
        }
    }
}
