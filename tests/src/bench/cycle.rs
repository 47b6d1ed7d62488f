//! The durable approval cycle: SubmitRun → gate suspends → decision → resume → RUN_SUCCEEDED,
//! N times at concurrency K, decided either by an approval-svc policy rule or by a simulated
//! person who follows WatchApprovals and calls ApprovalService.Resolve.

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
    cluster::{APPROVER, BenchCluster, SUBMITTER},
    procstat,
};

/// Who decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decider {
    /// A policy rule in approval-svc auto-approves.
    Policy,
    /// A simulated person follows WatchApprovals and resolves each request.
    Person,
}

impl Decider {
    pub fn label(self) -> &'static str {
        match self {
            Self::Policy => "policy",
            Self::Person => "person",
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
    pub decider: Decider,
    pub concurrency: usize,
    pub cycles: usize,
    pub elapsed: Duration,
    pub submit_to_done: Vec<Duration>,
    pub suspend_to_resume: Vec<Duration>,
    pub runner_cpu: f64,
    pub approval_cpu: f64,
    pub runner_peak_rss: u64,
    pub approval_peak_rss: u64,
    pub runner_bytes: u64,
    pub approval_bytes: u64,
    pub failed: usize,
    pub fsyncs: Option<u64>,
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
}

/// Runs `cycles` cycles at `concurrency` against a fresh cluster.
pub async fn run(decider: Decider, cycles: usize, concurrency: usize) -> CycleResult {
    let cluster = BenchCluster::start(decider == Decider::Policy, &[]).await;
    let mut runner = cluster.runner_as(SUBMITTER).await;
    runner
        .register_tree(rpb::RegisterTreeRequest {
            document: TREE.into(),
            format: 0,
        })
        .await
        .expect("register the bench tree");

    let tracks: Arc<Mutex<HashMap<String, Track>>> = Arc::default();
    let follower = tokio::spawn(follow(runner.clone(), tracks.clone()));
    let person = match decider {
        Decider::Person => Some(tokio::spawn(person(cluster.approvals_as(APPROVER).await))),
        Decider::Policy => None,
    };

    let runner_pid = cluster.runner.pid().unwrap_or(0);
    let approval_pid = cluster.approval.pid().unwrap_or(0);
    let meters_before = super::Meters::read(&cluster, decider.label()).await;
    let (r_cpu0, a_cpu0) = (
        procstat::cpu_seconds(runner_pid),
        procstat::cpu_seconds(approval_pid),
    );
    let remaining = Arc::new(AtomicUsize::new(cycles));
    let start = Instant::now();
    let mut drivers = Vec::new();
    for _ in 0..concurrency {
        let (mut runner, tracks, remaining) = (runner.clone(), tracks.clone(), remaining.clone());
        drivers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
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
                    let _ = tokio::time::timeout(Duration::from_secs(120), rx).await;
                }
                let done = tracks
                    .lock()
                    .expect("tracks")
                    .get(&run.run_id)
                    .and_then(|t| t.done);
                latencies.push(done.unwrap_or_else(Instant::now) - t0);
            }
            latencies
        }));
    }
    let mut submit_to_done = Vec::new();
    for d in drivers {
        submit_to_done.extend(d.await.expect("driver"));
    }
    let elapsed = start.elapsed();
    let runner_cpu = procstat::cpu_seconds(runner_pid) - r_cpu0;
    let approval_cpu = procstat::cpu_seconds(approval_pid) - a_cpu0;
    let meters = super::Meters::read(&cluster, decider.label()).await;
    let fsyncs = meters.fsyncs_since(&meters_before);
    let decide_ms = meters.decide_ms_since(&meters_before);
    follower.abort();
    if let Some(p) = person {
        p.abort();
    }
    let stages = stages(&cluster, &tracks).await;
    let (mut suspend_to_resume, mut failed) = (Vec::new(), 0);
    for t in tracks.lock().expect("tracks").values() {
        if let (Some(s), Some(r)) = (t.suspended, t.resumed) {
            suspend_to_resume.push(r - s);
        }
        failed += usize::from(t.failed);
    }
    submit_to_done.sort();
    suspend_to_resume.sort();
    let result = CycleResult {
        decider,
        concurrency,
        cycles,
        elapsed,
        submit_to_done,
        suspend_to_resume,
        runner_cpu,
        approval_cpu,
        runner_peak_rss: procstat::peak_rss(runner_pid),
        approval_peak_rss: procstat::peak_rss(approval_pid),
        runner_bytes: procstat::dir_bytes(&cluster.runner.data_dir),
        approval_bytes: procstat::dir_bytes(&cluster.approval.data_dir),
        failed,
        fsyncs,
        stages,
        decide_ms,
    };
    cluster.stop().await;
    result
}

/// Follows the event stream and timestamps each run's suspension, resume and finish on arrival.
fn wall_ms(t: &prost_types::Timestamp) -> i64 {
    t.seconds * 1000 + i64::from(t.nanos) / 1_000_000
}

/// Splits each run's suspended → resumed by the approval's own timestamps (every approval is
/// read back from approval-svc once the cycles are done).
async fn stages(cluster: &BenchCluster, tracks: &Mutex<HashMap<String, Track>>) -> [Vec<i64>; 3] {
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
        let map = tracks.lock().expect("tracks");
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
        drop(map);
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

async fn follow(mut runner: super::cluster::Runner, tracks: Arc<Mutex<HashMap<String, Track>>>) {
    use rpb::EventKind as K;
    let mut stream = runner
        .stream_events(rpb::StreamEventsRequest {
            follow: true,
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
        .await
        .expect("follow events")
        .into_inner();
    while let Ok(Some(item)) = stream.message().await {
        let Some(event) = item.event else { continue };
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
    }
}

/// A person at a screen: sees every new pending approval and approves it.
async fn person(approvals: super::cluster::Approvals) {
    let mut watch = approvals
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
    while let Ok(Some(change)) = watch.message().await {
        let Some(approval) = change.approval else {
            continue;
        };
        if approval.state != apb::ApprovalState::Pending as i32 {
            continue;
        }
        let mut approvals = approvals.clone();
        tokio::spawn(async move {
            let _ = approvals
                .resolve(apb::ResolveRequest {
                    request_id: approval.request_id,
                    decision: arbor_shared::proto::runner::v1::DecisionKind::Approve as i32,
                    reason: "looks right".into(),
                    ..Default::default()
                })
                .await;
        });
    }
}
