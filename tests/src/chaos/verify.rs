//! The end-of-workload checks: every run's outcome, every approval consumed exactly once and
//! pruned, every ledger side effect exactly once, and an event log without gaps as a durable
//! subscriber saw it. Problems are collected, not asserted one by one, so a failing run shows
//! the whole picture.

use std::collections::{BTreeMap, HashMap};

use arbor_runner_svc::{
    ServeConfig, open_runner,
    store::{Store, T},
};
use arbor_shared::{
    json::from_proto_struct,
    proto::{
        approval::v1 as apb,
        runner::v1::{self as rpb, EventKind as K},
    },
};
use serde_json::{Value as Json, json};

use super::{
    plan::{Plan, STEPS, TreeChoice},
    recorder::Seen,
};
use crate::clients::{ApprovalClient, RunnerClient};

/// What the checks found.
#[derive(Debug, Default)]
pub struct Report {
    pub facts: Vec<String>,
    pub problems: Vec<String>,
}

impl Report {
    pub fn fact(&mut self, s: impl Into<String>) {
        self.facts.push(s.into());
    }

    pub fn problem(&mut self, s: impl Into<String>) {
        self.problems.push(s.into());
    }

    pub fn print(&self, title: &str) {
        println!("== {title}");
        for f in &self.facts {
            println!("   {f}");
        }
        if self.problems.is_empty() {
            println!("   all checks passed");
        } else {
            println!("   {} PROBLEMS (first 40):", self.problems.len());
            for p in self.problems.iter().take(40) {
                println!("   - {p}");
            }
        }
    }

    pub fn assert_ok(&self) {
        assert!(
            self.problems.is_empty(),
            "{} problems, first: {:?}",
            self.problems.len(),
            self.problems.iter().take(10).collect::<Vec<_>>()
        );
    }
}

/// The whole event log, read with a plain (non-durable) stream from the beginning.
pub async fn full_log(runner: &mut RunnerClient) -> Result<Vec<rpb::Event>, tonic::Status> {
    let mut stream = runner
        .stream_events(rpb::StreamEventsRequest {
            after_seq: Some(0),
            follow: false,
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(item) = stream.message().await? {
        if let Some(e) = item.event {
            out.push(e);
        }
    }
    Ok(out)
}

/// Final views of the planned runs. A run the runner does not know is left out (the checks
/// then report it missing).
pub async fn final_runs(
    runner: &mut RunnerClient,
    plans: &[Plan],
) -> Result<HashMap<String, rpb::Run>, tonic::Status> {
    let mut out = HashMap::new();
    for plan in plans {
        let answer = runner
            .get_run(rpb::GetRunRequest {
                run_id: plan.run_id.clone(),
            })
            .await;
        let run = match answer {
            Ok(r) => r.into_inner().run.unwrap_or_default(),
            Err(e) if e.code() == tonic::Code::NotFound => continue,
            Err(e) => return Err(e),
        };
        out.insert(plan.run_id.clone(), run);
    }
    Ok(out)
}

/// DECIDED audit entries per request id, for every planned run.
pub async fn decided_counts(
    approvals: &mut ApprovalClient,
    plans: &[Plan],
) -> Result<HashMap<String, usize>, tonic::Status> {
    let mut out: HashMap<String, usize> = HashMap::new();
    for plan in plans {
        let mut page_token = String::new();
        loop {
            let page = approvals
                .get_audit_log(apb::GetAuditLogRequest {
                    run_id: plan.run_id.clone(),
                    page_size: 1000,
                    page_token: page_token.clone(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            for entry in page.entries {
                if entry.action == apb::AuditAction::Decided as i32 {
                    *out.entry(entry.request_id).or_default() += 1;
                }
            }
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
    }
    Ok(out)
}

/// The ledger of a stopped runner: idempotency key (`{run_id}:{tool_call_id}`) → receipt.
pub async fn read_ledger(data_dir: &std::path::Path) -> BTreeMap<String, Json> {
    let cfg = ServeConfig {
        data_dir: data_dir.to_path_buf(),
        ..ServeConfig::default()
    };
    let runner = match open_runner(&cfg).await {
        Ok(r) => r,
        Err(e) => panic!("cannot open the stopped runner's data: {e}"),
    };
    ledger_of(runner.store())
}

/// The ledger the runner replicas on PostgreSQL database `url` share, read through the same
/// storage seam the runner writes it with.
pub async fn read_ledger_postgres(url: &str) -> BTreeMap<String, Json> {
    let store = match Store::open_postgres(url).await {
        Ok(s) => s,
        Err(e) => panic!("cannot open the runner's PostgreSQL store: {e}"),
    };
    // The backend's reads block on the database: not on a runtime thread.
    tokio::task::spawn_blocking(move || ledger_of(&store))
        .await
        .expect("reading the ledger")
}

fn ledger_of(store: &Store) -> BTreeMap<String, Json> {
    store
        .tree(T::Ledger)
        .iter()
        .map(|entry| {
            let (k, v) = entry.expect("ledger entry");
            (
                String::from_utf8_lossy(&k).into_owned(),
                serde_json::from_slice(&v).unwrap_or(Json::Null),
            )
        })
        .collect()
}

/// Everything the checks look at.
pub struct Evidence<'a> {
    pub plans: &'a [Plan],
    pub runs: &'a HashMap<String, rpb::Run>,
    pub log: &'a [rpb::Event],
    pub recorded: &'a BTreeMap<u64, Seen>,
    pub recorder_problems: &'a [String],
    pub approvals: &'a [apb::Approval],
    pub decided: &'a HashMap<String, usize>,
    pub ledger: &'a BTreeMap<String, Json>,
}

pub fn check(ev: &Evidence<'_>, report: &mut Report) {
    check_runs(ev, report);
    check_events(ev, report);
    check_subscriber(ev, report);
    check_approvals(ev, report);
    check_ledger(ev, report);
}

fn status_name(code: i32) -> String {
    rpb::RunStatus::try_from(code)
        .map(|s| format!("{s:?}"))
        .unwrap_or_else(|_| code.to_string())
}

fn check_runs(ev: &Evidence<'_>, report: &mut Report) {
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for plan in ev.plans {
        let Some(run) = ev.runs.get(&plan.run_id) else {
            report.problem(format!("{}: run missing", plan.run_id));
            continue;
        };
        let tree = match plan.tree {
            TreeChoice::Flow => "flow",
            TreeChoice::Skip => "skip",
        };
        let gate = if plan.approve_gate {
            "approved"
        } else {
            "rejected"
        };
        *outcomes
            .entry(format!("{tree}/{gate} -> {}", status_name(run.status)))
            .or_default() += 1;
        if run.status != plan.expected_status() as i32 {
            report.problem(format!(
                "{}: status {} (expected {:?}); error: {}",
                plan.run_id,
                status_name(run.status),
                plan.expected_status(),
                run.error
            ));
            continue;
        }
        let bb = Json::Object(
            run.blackboard
                .as_ref()
                .map(from_proto_struct)
                .unwrap_or_default(),
        );
        for step in STEPS {
            let receipt = &bb[format!("{step}_receipt")];
            let expected = plan.expected_steps().contains(&step);
            if expected && receipt["entry"] != plan.expected_entry(step) {
                report.problem(format!(
                    "{}: {step}_receipt {receipt} does not hold {}",
                    plan.run_id,
                    plan.expected_entry(step)
                ));
            }
            if !expected && !receipt.is_null() {
                report.problem(format!(
                    "{}: {step} ran although it should not have: {receipt}",
                    plan.run_id
                ));
            }
        }
        if plan.reaches_end() {
            if bb["note"] != json!(plan.note()) {
                report.problem(format!("{}: note is {}", plan.run_id, bb["note"]));
            }
            if bb["shipment"] != plan.external_result()["result"] {
                report.problem(format!("{}: shipment is {}", plan.run_id, bb["shipment"]));
            }
        }
    }
    for (outcome, n) in outcomes {
        report.fact(format!("runs {outcome}: {n}"));
    }
}

fn kind(e: &Seen) -> Option<K> {
    K::try_from(e.kind).ok()
}

fn check_events(ev: &Evidence<'_>, report: &mut Report) {
    let log: Vec<Seen> = ev.log.iter().map(Seen::of).collect();
    for (i, e) in log.iter().enumerate() {
        if e.seq != i as u64 + 1 {
            report.problem(format!("event log: position {i} holds seq {}", e.seq));
            break;
        }
    }
    report.fact(format!("events in the log: {}", log.len()));

    #[derive(Default)]
    struct PerRequest {
        run_id: String,
        requested: usize,
        suspended: usize,
        resolved: Vec<String>,
        consumed: Vec<String>,
        withdrawn: usize,
    }
    let mut requests: BTreeMap<String, PerRequest> = BTreeMap::new();
    let mut finished: HashMap<String, Vec<K>> = HashMap::new();
    let mut approvals_per_run: HashMap<String, usize> = HashMap::new();
    for e in &log {
        let Some(k) = kind(e) else {
            report.problem(format!("seq {}: unknown kind {}", e.seq, e.kind));
            continue;
        };
        if !e.request_id.is_empty() {
            let r = requests.entry(e.request_id.clone()).or_default();
            r.run_id = e.run_id.clone();
            match k {
                K::ApprovalRequested => {
                    r.requested += 1;
                    *approvals_per_run.entry(e.run_id.clone()).or_default() += 1;
                }
                K::ExecutionSuspended => r.suspended += 1,
                K::ApprovalResolved => r.resolved.push(e.decision_id.clone()),
                K::ApprovalConsumed => r.consumed.push(e.decision_id.clone()),
                K::SuspensionWithdrawn => r.withdrawn += 1,
                _ => {}
            }
        }
        match k {
            K::RunSucceeded | K::RunFailed | K::RunCancelled | K::RunSuperseded => {
                finished.entry(e.run_id.clone()).or_default().push(k)
            }
            K::JobDeadLettered => report.problem(format!("{}: job dead-lettered", e.run_id)),
            _ => {}
        }
    }
    let mut consumed_once = 0;
    for (request_id, r) in &requests {
        let ok = r.suspended == 1
            && r.requested <= 1
            && r.resolved.len() == 1
            && r.consumed == r.resolved
            && r.withdrawn == 0;
        if ok {
            consumed_once += 1;
        } else {
            report.problem(format!(
                "{} request {request_id}: APPROVAL_REQUESTED x{}, EXECUTION_SUSPENDED x{}, \
                 APPROVAL_RESOLVED {:?}, APPROVAL_CONSUMED {:?}, withdrawn x{}",
                r.run_id, r.requested, r.suspended, r.resolved, r.consumed, r.withdrawn
            ));
        }
    }
    report.fact(format!(
        "suspensions (approvals, inputs, external work): {}, each suspended, resolved and \
         consumed exactly once: {consumed_once}",
        requests.len()
    ));
    for plan in ev.plans {
        let got = approvals_per_run.get(&plan.run_id).copied().unwrap_or(0);
        if got != plan.expected_approvals() {
            report.problem(format!(
                "{}: {got} approvals requested, expected {}",
                plan.run_id,
                plan.expected_approvals()
            ));
        }
        let want = match plan.expected_status() {
            rpb::RunStatus::Succeeded => K::RunSucceeded,
            _ => K::RunFailed,
        };
        let got = finished.get(&plan.run_id).cloned().unwrap_or_default();
        if got != [want] {
            report.problem(format!(
                "{}: terminal events {got:?}, expected [{want:?}]",
                plan.run_id
            ));
        }
    }
}

fn check_subscriber(ev: &Evidence<'_>, report: &mut Report) {
    for p in ev.recorder_problems {
        report.problem(format!("durable subscriber: {p}"));
    }
    let last = ev.log.last().map_or(0, |e| e.seq);
    let seen: Vec<u64> = ev.recorded.keys().copied().collect();
    let complete = seen.len() as u64 == last && seen.iter().zip(1..).all(|(s, n)| *s == n);
    if !complete {
        let missing: Vec<u64> = (1..=last)
            .filter(|s| !ev.recorded.contains_key(s))
            .take(20)
            .collect();
        report.problem(format!(
            "durable subscriber saw {} events for a log of {last}; missing (first 20): {missing:?}",
            seen.len()
        ));
    }
    let differing = ev
        .log
        .iter()
        .filter(|e| ev.recorded.get(&e.seq).is_some_and(|s| *s != Seen::of(e)))
        .count();
    if differing > 0 {
        report.problem(format!(
            "durable subscriber: {differing} events differ from the log"
        ));
    }
    report.fact(format!(
        "durable subscriber: seq 1..={} seen, gap-free: {complete}",
        seen.last().copied().unwrap_or(0)
    ));
}

fn check_approvals(ev: &Evidence<'_>, report: &mut Report) {
    let by_run: HashMap<&str, &Plan> = ev.plans.iter().map(|p| (p.run_id.as_str(), p)).collect();
    let mut pruned = 0;
    for a in ev.approvals {
        let req = a.request.clone().unwrap_or_default();
        let Some(plan) = by_run.get(req.run_id.as_str()) else {
            continue;
        };
        if a.state == apb::ApprovalState::Pruned as i32 {
            pruned += 1;
        } else {
            report.problem(format!(
                "{} approval {}: state {:?}, last delivery error: {}",
                plan.run_id,
                a.request_id,
                apb::ApprovalState::try_from(a.state),
                a.last_delivery_error
            ));
        }
        let want = if req.kind == rpb::ApprovalKind::Tool as i32 {
            rpb::DecisionKind::Edit
        } else if plan.approve_gate {
            rpb::DecisionKind::Approve
        } else {
            rpb::DecisionKind::Reject
        };
        let got = a.decision.as_ref().map(|d| d.kind);
        if got != Some(want as i32) {
            report.problem(format!(
                "{} approval {}: decision {got:?}, expected {want:?}",
                plan.run_id, a.request_id
            ));
        }
        let decided = ev.decided.get(&a.request_id).copied().unwrap_or(0);
        if decided != 1 {
            report.problem(format!(
                "{} approval {}: {decided} DECIDED audit entries",
                plan.run_id, a.request_id
            ));
        }
    }
    let expected: usize = ev.plans.iter().map(Plan::expected_approvals).sum();
    if ev.approvals.len() != expected {
        report.problem(format!(
            "approval-svc holds {} approvals, the plans ask for {expected}",
            ev.approvals.len()
        ));
    }
    report.fact(format!(
        "approvals: {} (expected {expected}), PRUNED: {pruned}",
        ev.approvals.len()
    ));
}

fn check_ledger(ev: &Evidence<'_>, report: &mut Report) {
    let mut expected_total = 0;
    for plan in ev.plans {
        let prefix = format!("{}:", plan.run_id);
        let run = ev.runs.get(&plan.run_id);
        let bb = run
            .and_then(|r| r.blackboard.as_ref())
            .map(from_proto_struct)
            .unwrap_or_default();
        for step in STEPS {
            let keys: Vec<&String> = ev
                .ledger
                .keys()
                .filter(|k| {
                    k.strip_prefix(&prefix)
                        .and_then(|rest| rest.split('#').next())
                        == Some(step)
                })
                .collect();
            let want = usize::from(plan.expected_steps().contains(&step));
            expected_total += want;
            if keys.len() != want {
                report.problem(format!(
                    "{}: ledger has {} records for {step}, expected {want}: {keys:?}",
                    plan.run_id,
                    keys.len()
                ));
                continue;
            }
            if let Some(key) = keys.first() {
                let record = &ev.ledger[*key];
                if record["entry"] != plan.expected_entry(step) {
                    report.problem(format!(
                        "{}: ledger {key} holds {record}, expected entry {}",
                        plan.run_id,
                        plan.expected_entry(step)
                    ));
                }
                if bb.get(&format!("{step}_receipt")) != Some(record) {
                    report.problem(format!(
                        "{}: the run's {step}_receipt is not the ledger's record {record}",
                        plan.run_id
                    ));
                }
            }
        }
    }
    let ours = ev
        .ledger
        .keys()
        .filter(|k| {
            ev.plans
                .iter()
                .any(|p| k.starts_with(&format!("{}:", p.run_id)))
        })
        .count();
    if ours != expected_total {
        report.problem(format!(
            "ledger holds {ours} records of the workload, expected {expected_total}"
        ));
    }
    report.fact(format!(
        "ledger records: {ours} (expected {expected_total}), each exactly once"
    ));
}
