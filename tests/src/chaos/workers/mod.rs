//! The task-worker chaos workload: seeded runs of `chaos-workers` (every tool served by Python
//! task worker processes), the feed that submits them (paced by disruptions) and notices them
//! finish, and the reads of what the runner holds at the end. The worker processes are in
//! [`pool`], the checks in [`check`] and [`transcript`].

pub mod check;
pub mod pool;
pub mod transcript;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering},
    },
    time::Duration,
};

use arbor_shared::{
    json::to_proto_struct,
    proto::runner::v1::{self as rpb, RunStatus, worker_service_client::WorkerServiceClient},
};
use serde_json::{Value as Json, json};
use tokio::task::JoinHandle;
use tonic::{Code, transport::Channel};

pub use check::{Evidence, check};
pub use pool::{Said, WorkerPool};
pub use transcript::check_subscriber;

use super::driver::list_runs;
use crate::clients::{RunnerClient, is_transient};

/// The workload tree: an effect and an upper-casing always, then (as planned) a flaky tool, a
/// business error caught by a selector whose fallback is a second effect, and an uncaught one.
pub const WORKERS_TREE: &str = include_str!("../../../trees/chaos-workers.json");
pub const TREE_ID: &str = "chaos-workers";
/// The attempt on which the `flaky` tool succeeds (the worker fails it retryably before).
pub const SUCCEED_ON: u32 = 2;
/// Codes of the caught business error.
const CODES: [&str; 3] = ["E_DECLINED", "E_LIMIT", "E_FRAUD"];
const WORDS: [&str; 6] = ["alpha", "bravo", "delta", "kilo", "oscar", "zulu"];

/// What the test worker does with a task type (the part after its last '.').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    Effect,
    Upper,
    Flaky,
    Raise,
}

impl Behaviour {
    pub fn task_type(self) -> &'static str {
        match self {
            Self::Effect => "py.effect",
            Self::Upper => "py.upper",
            Self::Flaky => "py.flaky",
            Self::Raise => "py.raise",
        }
    }
}

/// One run of the workload.
#[derive(Debug, Clone)]
pub struct WorkPlan {
    pub index: usize,
    pub run_id: String,
    /// How long the charge effect takes (so kills land in the middle of it).
    pub charge_ms: u64,
    pub text: String,
    pub flaky: bool,
    /// The caught business error's code and how long the refund effect that follows takes.
    pub risky: Option<(&'static str, u64)>,
    /// An uncaught business error at the end: the run fails.
    pub fatal: bool,
}

impl WorkPlan {
    /// `count` runs drawn from `seed`: half with the flaky tool, two in five with the caught
    /// error, one in eight failing on the uncaught one.
    pub fn generate(seed: u64, count: usize, prefix: &str) -> Vec<WorkPlan> {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x7a5c_0fee);
        (0..count)
            .map(|index| WorkPlan {
                index,
                run_id: format!("{prefix}-{seed:x}-{index:04}"),
                charge_ms: rng.u64(0..=400),
                text: format!("order {index} {}", WORDS[rng.usize(0..WORDS.len())]),
                flaky: rng.bool(),
                risky: (rng.u8(0..5) < 2)
                    .then(|| (CODES[rng.usize(0..CODES.len())], rng.u64(0..=400))),
                fatal: rng.u8(0..8) == 0,
            })
            .collect()
    }

    pub fn input(&self) -> Json {
        let (code, refund_ms) = self.risky.unwrap_or(("", 0));
        json!({"plan": {
            "order": self.index, "charge_ms": self.charge_ms, "text": self.text,
            "flaky": self.flaky, "succeed_on": SUCCEED_ON,
            "risky": self.risky.is_some(), "code": code, "refund_ms": refund_ms,
            "fatal": self.fatal,
        }})
    }

    /// The tool nodes that become tasks, in order.
    pub fn tasks(&self) -> Vec<(&'static str, Behaviour)> {
        let mut out = vec![("charge", Behaviour::Effect), ("label", Behaviour::Upper)];
        if self.flaky {
            out.push(("flaky", Behaviour::Flaky));
        }
        if self.risky.is_some() {
            out.push(("gamble", Behaviour::Raise));
            out.push(("refund", Behaviour::Effect));
        }
        if self.fatal {
            out.push(("doom", Behaviour::Raise));
        }
        out
    }

    pub fn expected_status(&self) -> RunStatus {
        if self.fatal {
            RunStatus::Failed
        } else {
            RunStatus::Succeeded
        }
    }

    /// The idempotency key of the (only) call of tool node `node`: `{run_id}:{tool_call_id}`,
    /// the call id being the node's locator and its first attempt (`#0`).
    pub fn key(&self, node: &str) -> String {
        format!("{}:{node}#0", self.run_id)
    }

    /// Keys the effects file must hold exactly once.
    pub fn effect_keys(&self) -> Vec<String> {
        self.tasks()
            .into_iter()
            .filter(|(_, b)| *b == Behaviour::Effect)
            .map(|(node, _)| self.key(node))
            .collect()
    }
}

/// Registers the workload tree (retrying while the runner is unreachable).
pub async fn register_tree(runner: &mut RunnerClient) {
    for _ in 0..100 {
        match runner
            .register_tree(rpb::RegisterTreeRequest {
                document: WORKERS_TREE.to_string(),
                format: rpb::TreeFormat::Json as i32,
            })
            .await
        {
            Ok(_) => return,
            Err(e) if is_transient(&e) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("registering {TREE_ID} failed: {e}"),
        }
    }
    panic!("registering {TREE_ID}: runner-svc never answered");
}

/// Submits the planned runs (run `i` once `i * pace / runs` disruptions have happened, so kills
/// land all through the workload) and notices them finish.
pub struct Feed {
    pub plans: Vec<WorkPlan>,
    pub disruptions: AtomicU32,
    submitted: AtomicUsize,
    submit_retries: AtomicUsize,
    finished: Mutex<HashMap<String, i32>>,
    problems: Mutex<Vec<String>>,
    stop: AtomicBool,
}

impl Feed {
    /// Starts the submitter and the watcher on `runner`.
    pub fn start(
        plans: Vec<WorkPlan>,
        pace: u32,
        runner: RunnerClient,
    ) -> (Arc<Feed>, Vec<JoinHandle<()>>) {
        let feed = Arc::new(Feed {
            plans,
            disruptions: AtomicU32::new(0),
            submitted: AtomicUsize::new(0),
            submit_retries: AtomicUsize::new(0),
            finished: Mutex::new(HashMap::new()),
            problems: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let actors = vec![
            tokio::spawn(submit(feed.clone(), pace, runner.clone())),
            tokio::spawn(watch(feed.clone(), runner)),
        ];
        (feed, actors)
    }

    pub fn disrupted(&self) {
        self.disruptions.fetch_add(1, Ordering::Relaxed);
    }

    pub fn submitted(&self) -> usize {
        self.submitted.load(Ordering::Relaxed)
    }

    pub fn submit_retries(&self) -> usize {
        self.submit_retries.load(Ordering::Relaxed)
    }

    pub fn finished(&self) -> usize {
        self.finished.lock().expect("finished").len()
    }

    pub fn all_finished(&self) -> bool {
        self.finished() == self.plans.len()
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    pub fn problems(&self) -> Vec<String> {
        self.problems.lock().expect("problems").clone()
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

async fn submit(feed: Arc<Feed>, pace: u32, mut runner: RunnerClient) {
    let total = feed.plans.len() as u64;
    for (i, plan) in feed.plans.iter().enumerate() {
        while u64::from(feed.disruptions.load(Ordering::Relaxed)) * total
            < i as u64 * u64::from(pace)
        {
            if feed.stopped() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let request = rpb::SubmitRunRequest {
            tree_id: TREE_ID.to_string(),
            tree_version: 1,
            run_id: plan.run_id.clone(),
            // A retry after a lost answer must not start a second run.
            restore_policy: rpb::RestorePolicy::Never as i32,
            input: Some(to_proto_struct(
                plan.input().as_object().expect("an object"),
            )),
            ..Default::default()
        };
        loop {
            if feed.stopped() {
                return;
            }
            match runner.submit_run(request.clone()).await {
                Ok(_) => break,
                Err(e) if e.code() == Code::AlreadyExists => break,
                Err(e) if is_transient(&e) => {
                    feed.submit_retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => {
                    let problem = format!("SubmitRun {} answered {e}", plan.run_id);
                    feed.problems.lock().expect("problems").push(problem);
                    break;
                }
            }
        }
        feed.submitted.fetch_add(1, Ordering::Relaxed);
    }
}

async fn watch(feed: Arc<Feed>, mut runner: RunnerClient) {
    let ours: std::collections::HashSet<String> =
        feed.plans.iter().map(|p| p.run_id.clone()).collect();
    let terminal = [
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
        RunStatus::Superseded,
    ];
    while !feed.stopped() {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(runs) = list_runs(&mut runner, &terminal).await {
            let mut finished = feed.finished.lock().expect("finished");
            for run in runs.into_iter().filter(|r| ours.contains(&r.run_id)) {
                finished.insert(run.run_id, run.status);
            }
        }
    }
}

/// Final views of the planned runs; a run the runner does not know is left out (the checks
/// then report it missing).
pub async fn final_runs(
    runner: &mut RunnerClient,
    plans: &[WorkPlan],
) -> HashMap<String, rpb::Run> {
    let mut out = HashMap::new();
    for plan in plans {
        let request = rpb::GetRunRequest {
            run_id: plan.run_id.clone(),
        };
        match runner.get_run(request).await {
            Ok(r) => {
                out.insert(plan.run_id.clone(), r.into_inner().run.unwrap_or_default());
            }
            Err(e) if e.code() == tonic::Code::NotFound => {}
            Err(e) => panic!("GetRun {}: {e}", plan.run_id),
        }
    }
    out
}

/// Every task the runner holds, every page.
pub async fn all_tasks(
    client: &mut WorkerServiceClient<Channel>,
) -> Result<Vec<rpb::Task>, tonic::Status> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_tasks(rpb::ListTasksRequest {
                page_size: 1000,
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        out.extend(page.tasks);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        page_token = page.next_page_token;
    }
}
