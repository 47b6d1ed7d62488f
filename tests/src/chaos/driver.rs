//! The simulated people: a submitter that submits the planned runs (and answers user input and
//! external work through `RunnerService.Resolve`), and an approver that decides approvals through
//! `ApprovalService.Resolve`. Both treat a dead or restarting service as a reason to retry, never
//! as an answer, and retry only with the same idempotency keys (run id, decision id, decision).

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

use arbor_shared::{
    json::{to_proto_struct, to_proto_value},
    proto::{
        approval::v1 as apb,
        runner::v1::{self as rpb, RunStatus, SuspensionCategory},
    },
};
use tokio::task::JoinHandle;
use tonic::Code;

use super::plan::{FLOW_TREE, Plan, SKIP_TREE};
use crate::clients::{ApprovalClient, RunnerClient, is_transient};

/// How the workload is driven.
#[derive(Debug, Clone)]
pub struct DriveConfig {
    /// Runs in flight at most (submitted and not finished).
    pub concurrency: usize,
    /// Spread submissions over this many disruptions: run `i` is submitted only once
    /// `i * pace / runs` disruptions have happened, so crashes land all through the workload.
    pub pace: u32,
    /// Pause between polls of the actors.
    pub poll: Duration,
}

/// State shared by the actors and the test.
pub struct Shared {
    pub plans: Vec<Plan>,
    pub by_run: HashMap<String, usize>,
    /// Disruptions (kills, cuts, stalls) so far; bumped by the test.
    pub disruptions: AtomicU32,
    submitted: AtomicU64,
    terminal: Mutex<HashMap<String, i32>>,
    /// Unexpected answers (anything that is not success, a duplicate or a transient failure).
    problems: Mutex<Vec<String>>,
    pub stop: AtomicBool,
    pub counters: Counters,
}

#[derive(Debug, Default)]
pub struct Counters {
    pub submit_retries: AtomicU64,
    pub decisions: AtomicU64,
    pub decision_duplicates: AtomicU64,
    pub decision_retries: AtomicU64,
    pub inputs: AtomicU64,
    pub input_duplicates: AtomicU64,
    pub input_retries: AtomicU64,
}

impl Shared {
    pub fn new(plans: Vec<Plan>) -> Arc<Shared> {
        let by_run = plans.iter().map(|p| (p.run_id.clone(), p.index)).collect();
        Arc::new(Shared {
            plans,
            by_run,
            disruptions: AtomicU32::new(0),
            submitted: AtomicU64::new(0),
            terminal: Mutex::new(HashMap::new()),
            problems: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            counters: Counters::default(),
        })
    }

    pub fn submitted(&self) -> usize {
        self.submitted.load(Ordering::Relaxed) as usize
    }

    pub fn finished(&self) -> usize {
        self.terminal.lock().expect("terminal").len()
    }

    /// Every planned run has been submitted and seen finished.
    pub fn all_finished(&self) -> bool {
        self.finished() == self.plans.len()
    }

    pub fn problem(&self, p: String) {
        self.problems.lock().expect("problems").push(p);
    }

    pub fn problems(&self) -> Vec<String> {
        self.problems.lock().expect("problems").clone()
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Registers both workload trees (retrying while the runner is unreachable).
pub async fn register_trees(runner: &mut RunnerClient) {
    for doc in [FLOW_TREE, SKIP_TREE] {
        let mut tries = 0;
        loop {
            match runner
                .register_tree(rpb::RegisterTreeRequest {
                    document: doc.to_string(),
                    format: rpb::TreeFormat::Json as i32,
                })
                .await
            {
                Ok(_) => break,
                Err(e) if is_transient(&e) && tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("registering a workload tree failed: {e}"),
            }
        }
    }
}

/// Starts the actors; they stop when `shared.stop` is set.
pub fn spawn(
    shared: Arc<Shared>,
    cfg: DriveConfig,
    submitter: RunnerClient,
    approver: ApprovalClient,
) -> Vec<JoinHandle<()>> {
    spawn_spread(shared, cfg, vec![submitter], vec![approver])
}

/// Starts the actors over several replicas: the submitter spreads its runs over `runners`
/// (moving to the next replica when one does not answer), every runner replica gets an answerer
/// and every approval replica an approver. Answerers and approvers thus race each other with the
/// same decisions on different replicas: exactly one of each must win.
pub fn spawn_spread(
    shared: Arc<Shared>,
    cfg: DriveConfig,
    runners: Vec<RunnerClient>,
    approvers: Vec<ApprovalClient>,
) -> Vec<JoinHandle<()>> {
    assert!(!runners.is_empty() && !approvers.is_empty());
    let mut actors = vec![tokio::spawn(submit_loop(
        shared.clone(),
        cfg.clone(),
        runners.clone(),
    ))];
    for runner in runners {
        actors.push(tokio::spawn(answer_loop(
            shared.clone(),
            cfg.clone(),
            runner,
        )));
    }
    for approver in approvers {
        actors.push(tokio::spawn(approve_loop(
            shared.clone(),
            cfg.clone(),
            approver,
        )));
    }
    actors
}

async fn submit_loop(shared: Arc<Shared>, cfg: DriveConfig, mut runners: Vec<RunnerClient>) {
    let total = shared.plans.len();
    for i in 0..total {
        loop {
            if shared.stopped() {
                return;
            }
            let in_flight = shared.submitted().saturating_sub(shared.finished());
            let paced = u64::from(shared.disruptions.load(Ordering::Relaxed)) * total as u64
                >= i as u64 * u64::from(cfg.pace);
            if in_flight < cfg.concurrency && paced {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let plan = &shared.plans[i];
        let request = rpb::SubmitRunRequest {
            tree_id: plan.tree.id().to_string(),
            tree_version: 1,
            run_id: plan.run_id.clone(),
            // A retry after a lost answer must not start a second run: NEVER makes it
            // ALREADY_EXISTS instead.
            restore_policy: rpb::RestorePolicy::Never as i32,
            input: Some(to_proto_struct(
                &plan.input().as_object().cloned().unwrap_or_default(),
            )),
            ..Default::default()
        };
        let mut at = i % runners.len();
        loop {
            if shared.stopped() {
                return;
            }
            match runners[at].submit_run(request.clone()).await {
                Ok(_) => break,
                Err(e) if e.code() == Code::AlreadyExists => break,
                Err(e) if is_transient(&e) => {
                    shared
                        .counters
                        .submit_retries
                        .fetch_add(1, Ordering::Relaxed);
                    at = (at + 1) % runners.len();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => {
                    shared.problem(format!("SubmitRun {} answered {e}", plan.run_id));
                    break;
                }
            }
        }
        shared.submitted.fetch_add(1, Ordering::Relaxed);
    }
}

/// Lists runs with the given statuses, every page.
pub async fn list_runs(
    runner: &mut RunnerClient,
    statuses: &[RunStatus],
) -> Result<Vec<rpb::Run>, tonic::Status> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = runner
            .list_runs(rpb::ListRunsRequest {
                statuses: statuses.iter().map(|s| *s as i32).collect(),
                page_size: 1000,
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        out.extend(page.runs);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        page_token = page.next_page_token;
    }
}

const TERMINAL: [RunStatus; 4] = [
    RunStatus::Succeeded,
    RunStatus::Failed,
    RunStatus::Cancelled,
    RunStatus::Superseded,
];

/// The submitter's other job: answer user input and external work, and notice finished runs.
async fn answer_loop(shared: Arc<Shared>, cfg: DriveConfig, mut runner: RunnerClient) {
    let mut answered: HashSet<String> = HashSet::new();
    while !shared.stopped() {
        tokio::time::sleep(cfg.poll).await;
        if let Ok(runs) = list_runs(&mut runner, &TERMINAL).await {
            let mut terminal = shared.terminal.lock().expect("terminal");
            for run in runs {
                if shared.by_run.contains_key(&run.run_id) {
                    terminal.insert(run.run_id, run.status);
                }
            }
        }
        let Ok(suspended) = list_runs(&mut runner, &[RunStatus::Suspended]).await else {
            continue;
        };
        for run in suspended {
            let Some(&i) = shared.by_run.get(&run.run_id) else {
                continue;
            };
            let plan = &shared.plans[i];
            for s in &run.suspensions {
                if answered.contains(&s.request_id) {
                    continue;
                }
                let result = match SuspensionCategory::try_from(s.category) {
                    Ok(SuspensionCategory::RequireUserInput) => {
                        serde_json::json!({"text": plan.note()})
                    }
                    Ok(SuspensionCategory::RequireExternalExecution) => plan.external_result(),
                    _ => continue,
                };
                let request = rpb::ResolveRequest {
                    run_id: run.run_id.clone(),
                    request_id: s.request_id.clone(),
                    // Derived from the request: a retry after a lost answer is a duplicate,
                    // never a second decision.
                    decision_id: format!("answer-{}", s.request_id),
                    action: rpb::ResolveAction::Resume as i32,
                    result: Some(to_proto_value(&result)),
                    ..Default::default()
                };
                match runner.resolve(request).await {
                    Ok(r) => {
                        let counter = if r.into_inner().duplicate {
                            &shared.counters.input_duplicates
                        } else {
                            &shared.counters.inputs
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        answered.insert(s.request_id.clone());
                    }
                    Err(e) if is_transient(&e) => {
                        shared
                            .counters
                            .input_retries
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        shared.problem(format!(
                            "RunnerService.Resolve {} {} answered {e}",
                            run.run_id, s.request_id
                        ));
                        answered.insert(s.request_id.clone());
                    }
                }
            }
        }
    }
}

/// Lists approvals in the given states, every page.
pub async fn list_approvals(
    approvals: &mut ApprovalClient,
    states: &[apb::ApprovalState],
) -> Result<Vec<apb::Approval>, tonic::Status> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = approvals
            .list_approvals(apb::ListApprovalsRequest {
                filter: Some(apb::ApprovalFilter {
                    states: states.iter().map(|s| *s as i32).collect(),
                    ..Default::default()
                }),
                page_size: 1000,
                page_token: page_token.clone(),
            })
            .await?
            .into_inner();
        out.extend(page.approvals);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        page_token = page.next_page_token;
    }
}

/// The decision the plan calls for on an approval.
pub fn decision_for(plan: &Plan, approval: &apb::Approval) -> apb::ResolveRequest {
    let tool = approval
        .request
        .as_ref()
        .is_some_and(|r| r.kind == rpb::ApprovalKind::Tool as i32);
    let mut request = apb::ResolveRequest {
        request_id: approval.request_id.clone(),
        ..Default::default()
    };
    if tool {
        request.decision = rpb::DecisionKind::Edit as i32;
        request.args = Some(to_proto_value(&plan.edited_args()));
        request.reason = "edited before approval".into();
    } else if plan.approve_gate {
        request.decision = rpb::DecisionKind::Approve as i32;
        request.reason = "fine".into();
    } else {
        request.decision = rpb::DecisionKind::Reject as i32;
        request.reason = format!("order {} rejected", plan.index);
    }
    request
}

async fn approve_loop(shared: Arc<Shared>, cfg: DriveConfig, mut approvals: ApprovalClient) {
    while !shared.stopped() {
        tokio::time::sleep(cfg.poll).await;
        let Ok(pending) = list_approvals(&mut approvals, &[apb::ApprovalState::Pending]).await
        else {
            continue;
        };
        for approval in pending {
            let run_id = approval
                .request
                .as_ref()
                .map(|r| r.run_id.clone())
                .unwrap_or_default();
            let Some(&i) = shared.by_run.get(&run_id) else {
                continue;
            };
            let request = decision_for(&shared.plans[i], &approval);
            match approvals.resolve(request).await {
                Ok(r) => {
                    let counter = if r.into_inner().duplicate {
                        &shared.counters.decision_duplicates
                    } else {
                        &shared.counters.decisions
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if is_transient(&e) => {
                    shared
                        .counters
                        .decision_retries
                        .fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => shared.problem(format!(
                    "ApprovalService.Resolve {} answered {e}",
                    approval.request_id
                )),
            }
        }
    }
}
