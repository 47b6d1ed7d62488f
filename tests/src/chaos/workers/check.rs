//! The end-of-workload checks of the task-worker chaos test: every run's outcome and
//! blackboard against its plan, every task's history in the event log (attempts dispatched in
//! order, each retry between two of them, one completion or thrown error from the last attempt,
//! one consumption of it), every effect key once in the effects file, and nothing left queued
//! or leased. Problems are collected, not asserted one by one, so a failing run shows the whole
//! picture.

use std::collections::{BTreeMap, HashMap};

use arbor_shared::{
    json::from_proto_struct,
    proto::runner::v1::{self as rpb, EventKind as K, TaskState, event::Detail},
};
use serde_json::{Value as Json, json};

use super::{Behaviour, SUCCEED_ON, Said, WorkPlan, transcript::check_transcript};
use crate::chaos::Report;

/// Everything the checks look at, gathered while runner-svc still ran.
pub struct Evidence<'a> {
    pub plans: &'a [WorkPlan],
    pub runs: &'a HashMap<String, rpb::Run>,
    pub log: &'a [rpb::Event],
    pub tasks: &'a [rpb::Task],
    pub effects: &'a str,
    pub said: &'a [Said],
}

/// What the log says about one task (by its id, which is also its suspension's request id).
#[derive(Debug, Default)]
pub(super) struct TaskLog {
    pub(super) suspended: usize,
    pub(super) withdrawn: usize,
    /// (seq, attempt, worker)
    pub(super) dispatched: Vec<(u64, u32, String)>,
    pub(super) completed: Vec<(u64, u32, String)>,
    pub(super) failed: Vec<(u64, rpb::TaskFailed)>,
    /// (seq, decision id)
    pub(super) consumed: Vec<(u64, String)>,
}

/// Counts for the summary.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) tasks: usize,
    pub(super) dispatches: usize,
    pub(super) lease_expiries: usize,
    pub(super) retryable_failures: usize,
    pub(super) executions: usize,
    pub(super) effects_rerun: usize,
    pub(super) outcomes: BTreeMap<String, usize>,
}

pub fn check(ev: &Evidence<'_>, report: &mut Report) {
    for (i, e) in ev.log.iter().enumerate() {
        if e.seq != i as u64 + 1 {
            report.problem(format!("event log: position {i} holds seq {}", e.seq));
            break;
        }
    }
    let mut logs: HashMap<String, TaskLog> = HashMap::new();
    let mut finished: HashMap<String, Vec<K>> = HashMap::new();
    for e in ev.log {
        match &e.detail {
            Some(Detail::ExecutionSuspended(d)) => {
                logs.entry(d.request_id.clone()).or_default().suspended += 1
            }
            Some(Detail::SuspensionWithdrawn(d)) => {
                logs.entry(d.request_id.clone()).or_default().withdrawn += 1
            }
            Some(Detail::TaskDispatched(d)) => logs
                .entry(d.task_id.clone())
                .or_default()
                .dispatched
                .push((e.seq, d.attempt, d.worker_id.clone())),
            Some(Detail::TaskCompleted(d)) => logs
                .entry(d.task_id.clone())
                .or_default()
                .completed
                .push((e.seq, d.attempt, d.worker_id.clone())),
            Some(Detail::TaskFailed(d)) => {
                let l = logs.entry(d.task_id.clone()).or_default();
                l.failed.push((e.seq, d.clone()));
            }
            Some(Detail::ApprovalConsumed(d)) => logs
                .entry(d.request_id.clone())
                .or_default()
                .consumed
                .push((e.seq, d.decision_id.clone())),
            Some(Detail::RunFinished(_)) => finished
                .entry(e.run_id.clone())
                .or_default()
                .push(K::try_from(e.kind).unwrap_or(K::Unspecified)),
            Some(Detail::JobDeadLettered(_)) => {
                report.problem(format!("{}: job dead-lettered", e.run_id))
            }
            _ => {}
        }
    }
    let mut effects: HashMap<&str, usize> = HashMap::new();
    for line in ev.effects.lines() {
        *effects.entry(line).or_default() += 1;
    }
    let mut by_run: HashMap<&str, Vec<&rpb::Task>> = HashMap::new();
    for t in ev.tasks {
        if t.state == TaskState::Queued as i32 || t.state == TaskState::Leased as i32 {
            report.problem(format!(
                "{} task {} ({}) left {:?} at attempt {}",
                t.run_id,
                t.task_id,
                t.node_locator,
                TaskState::try_from(t.state),
                t.attempt
            ));
        }
        by_run.entry(t.run_id.as_str()).or_default().push(t);
    }
    let mut tally = Tally::default();
    for plan in ev.plans {
        let terminal = finished.get(&plan.run_id).cloned().unwrap_or_default();
        check_run(
            plan,
            ev.runs.get(&plan.run_id),
            &terminal,
            by_run.remove(plan.run_id.as_str()).unwrap_or_default(),
            &logs,
            &effects,
            &mut tally,
            report,
        );
    }
    for (run_id, tasks) in by_run {
        report.problem(format!(
            "{} tasks of an unplanned run {run_id}",
            tasks.len()
        ));
    }
    let planned: usize = ev.plans.iter().map(|p| p.effect_keys().len()).sum();
    if effects.len() != planned {
        report.problem(format!(
            "the effects file holds {} keys, the plans call for {planned}",
            effects.len()
        ));
    }
    check_transcript(ev, &logs, &mut tally, report);
    for (outcome, n) in &tally.outcomes {
        report.fact(format!("runs {outcome}: {n}"));
    }
    report.fact(format!(
        "events in the log: {}; tasks {}, dispatched {} times; retries after a lease expiry {}, \
         after a retryable failure {}",
        ev.log.len(),
        tally.tasks,
        tally.dispatches,
        tally.lease_expiries,
        tally.retryable_failures
    ));
    report.fact(format!(
        "executions the workers started {}; effect tasks run more than once {}; keys in the \
         effects file {}",
        tally.executions,
        tally.effects_rerun,
        effects.len()
    ));
}

/// Numbers as f64, so `2` and `2.0` (what a protobuf Value holds) compare equal.
fn norm(v: &Json) -> Json {
    match v {
        Json::Number(n) => json!(n.as_f64()),
        Json::Array(a) => Json::Array(a.iter().map(norm).collect()),
        Json::Object(o) => Json::Object(o.iter().map(|(k, v)| (k.clone(), norm(v))).collect()),
        other => other.clone(),
    }
}

/// The blackboard key a node's output (or business error) lands on.
fn output_key(node: &str) -> &'static str {
    match node {
        "charge" => "charge",
        "label" => "label",
        "flaky" => "flaky",
        "gamble" => "gamble_error",
        "refund" => "refund",
        _ => "doom_error",
    }
}

#[allow(clippy::too_many_arguments)]
fn check_run(
    plan: &WorkPlan,
    run: Option<&rpb::Run>,
    terminal: &[K],
    tasks: Vec<&rpb::Task>,
    logs: &HashMap<String, TaskLog>,
    effects: &HashMap<&str, usize>,
    tally: &mut Tally,
    report: &mut Report,
) {
    let id = &plan.run_id;
    let Some(run) = run else {
        report.problem(format!("{id}: run missing"));
        return;
    };
    let status = rpb::RunStatus::try_from(run.status).unwrap_or(rpb::RunStatus::Unspecified);
    let shape = format!(
        "{}{}{} -> {status:?}",
        if plan.flaky { "flaky+" } else { "" },
        if plan.risky.is_some() { "caught+" } else { "" },
        if plan.fatal { "fatal" } else { "plain" },
    );
    *tally.outcomes.entry(shape).or_default() += 1;
    if status != plan.expected_status() {
        report.problem(format!(
            "{id}: status {status:?} (expected {:?}); error: {}",
            plan.expected_status(),
            run.error
        ));
    }
    let want_end = match plan.expected_status() {
        rpb::RunStatus::Succeeded => K::RunSucceeded,
        _ => K::RunFailed,
    };
    if terminal != [want_end] {
        report.problem(format!(
            "{id}: terminal events {terminal:?}, expected [{want_end:?}]"
        ));
    }
    if plan.fatal && !run.error.contains("maybe-fatal") {
        report.problem(format!(
            "{id}: error {:?} does not name maybe-fatal",
            run.error
        ));
    }
    let bb = Json::Object(
        run.blackboard
            .as_ref()
            .map(from_proto_struct)
            .unwrap_or_default(),
    );
    let planned = plan.tasks();
    for t in &tasks {
        if !planned.iter().any(|(node, _)| *node == t.node_locator) {
            report.problem(format!(
                "{id}: unplanned task {} at {}",
                t.task_id, t.node_locator
            ));
        }
    }
    for (node, behaviour) in &planned {
        let found: Vec<&&rpb::Task> = tasks.iter().filter(|t| t.node_locator == *node).collect();
        let [task] = found.as_slice() else {
            report.problem(format!("{id}: {} tasks at {node}, expected 1", found.len()));
            continue;
        };
        tally.tasks += 1;
        let Some((worker, attempt)) = check_task(plan, node, *behaviour, task, logs, tally, report)
        else {
            continue;
        };
        let (code, message) = match *node {
            "gamble" => (plan.risky.map_or("", |r| r.0), "declined".to_string()),
            _ => ("E_FATAL", plan.text.clone()),
        };
        let want = match behaviour {
            Behaviour::Effect => {
                json!({"key": plan.key(node), "worker": worker, "attempt": attempt})
            }
            Behaviour::Upper => json!({"text": plan.text.to_uppercase(), "worker": worker}),
            Behaviour::Flaky => json!({"attempt": attempt}),
            Behaviour::Raise => json!({"code": code, "message": message, "node": node}),
        };
        let got = &bb[output_key(node)];
        if norm(got) != norm(&want) {
            report.problem(format!(
                "{id}: blackboard {} is {got}, expected {want} (the result of attempt {attempt} \
                 by {worker})",
                output_key(node)
            ));
        }
        if *behaviour == Behaviour::Flaky && attempt < SUCCEED_ON {
            report.problem(format!("{id}: flaky completed on attempt {attempt}"));
        }
    }
    for node in ["flaky", "gamble", "refund", "doom"] {
        if !planned.iter().any(|(n, _)| *n == node) && !bb[output_key(node)].is_null() {
            report.problem(format!(
                "{id}: {} is {} although {node} should not have run",
                output_key(node),
                bb[output_key(node)]
            ));
        }
    }
    let done = if plan.fatal { Json::Null } else { json!(true) };
    if bb["done"] != done {
        report.problem(format!("{id}: done is {}", bb["done"]));
    }
    for key in plan.effect_keys() {
        let n = effects.get(key.as_str()).copied().unwrap_or(0);
        if n != 1 {
            report.problem(format!("{id}: effect {key} applied {n} times"));
        }
    }
}

/// Checks one task's history in the log; returns the worker and attempt whose result the run
/// took.
fn check_task(
    plan: &WorkPlan,
    node: &str,
    behaviour: Behaviour,
    task: &rpb::Task,
    logs: &HashMap<String, TaskLog>,
    tally: &mut Tally,
    report: &mut Report,
) -> Option<(String, u32)> {
    let at = format!("{} {node} (task {})", plan.run_id, task.task_id);
    let want_state = if behaviour == Behaviour::Raise {
        TaskState::Errored
    } else {
        TaskState::Completed
    };
    if task.state != want_state as i32 {
        report.problem(format!(
            "{at}: state {:?}, expected {want_state:?}; last error: {}",
            TaskState::try_from(task.state),
            task.last_error
        ));
    }
    if task.task_type != behaviour.task_type() || task.idempotency_key != plan.key(node) {
        report.problem(format!(
            "{at}: type {} key {}, expected {} {}",
            task.task_type,
            task.idempotency_key,
            behaviour.task_type(),
            plan.key(node)
        ));
    }
    let Some(l) = logs.get(&task.task_id) else {
        report.problem(format!("{at}: no event about it in the log"));
        return None;
    };
    if l.suspended != 1 || l.withdrawn != 0 {
        report.problem(format!(
            "{at}: EXECUTION_SUSPENDED x{}, SUSPENSION_WITHDRAWN x{}",
            l.suspended, l.withdrawn
        ));
    }
    tally.dispatches += l.dispatched.len();
    let n = task.attempt;
    let attempts: Vec<u32> = l.dispatched.iter().map(|d| d.1).collect();
    if attempts != (1..=n).collect::<Vec<_>>() {
        report.problem(format!(
            "{at}: TASK_DISPATCHED attempts {attempts:?}, expected 1..={n} in order"
        ));
        return None;
    }
    // Every attempt but the last ended in a retry, between its dispatch and the next one.
    let (retries, ends): (Vec<_>, Vec<_>) = l.failed.iter().partition(|(_, f)| f.will_retry);
    let retried: Vec<u32> = retries.iter().map(|(_, f)| f.attempt).collect();
    if retried != (1..n).collect::<Vec<_>>() {
        report.problem(format!(
            "{at}: retries after attempts {retried:?}, dispatched {n}"
        ));
    }
    for (seq, f) in &retries {
        let i = f.attempt as usize;
        let between =
            i < l.dispatched.len() && l.dispatched[i - 1].0 < *seq && *seq < l.dispatched[i].0;
        let cause_ok = f.cause == "lease_expired"
            || (f.cause == "failed" && behaviour == Behaviour::Flaky && f.attempt < SUCCEED_ON);
        if !between || !cause_ok {
            report.problem(format!(
                "{at}: retry at seq {seq} (cause {}) out of place",
                f.cause
            ));
        }
        match f.cause.as_str() {
            "lease_expired" => tally.lease_expiries += 1,
            _ => tally.retryable_failures += 1,
        }
    }
    let (last_seq, _, last_worker) = l.dispatched[n as usize - 1].clone();
    let end_seq = match behaviour {
        Behaviour::Raise => {
            let ok = l.completed.is_empty()
                && matches!(ends.as_slice(), [(s, f)] if *s > last_seq && f.attempt == n
                    && f.cause == "error" && f.worker_id == last_worker);
            if !ok {
                report.problem(format!(
                    "{at}: TASK_COMPLETED {:?}, final TASK_FAILED {:?}; expected one thrown \
                     error from attempt {n} by {last_worker}",
                    l.completed, ends
                ));
                return None;
            }
            ends[0].0
        }
        _ => {
            let ok = ends.is_empty()
                && matches!(l.completed.as_slice(), [(s, a, w)] if *s > last_seq && *a == n
                    && *w == last_worker);
            if !ok {
                report.problem(format!(
                    "{at}: TASK_COMPLETED {:?}, final TASK_FAILED {:?}; expected one completion \
                     of attempt {n} by {last_worker}",
                    l.completed, ends
                ));
                return None;
            }
            l.completed[0].0
        }
    };
    let decision = format!("task:{}:{n}", task.task_id);
    if !matches!(l.consumed.as_slice(), [(s, d)] if *s > end_seq && *d == decision) {
        report.problem(format!(
            "{at}: APPROVAL_CONSUMED {:?}, expected once, of {decision}, after seq {end_seq}",
            l.consumed
        ));
    }
    Some((last_worker, n))
}
