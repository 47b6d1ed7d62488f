//! Checks of what the worker processes printed and of what the durable subscriber saw, against
//! the event log.

use std::collections::{BTreeMap, HashMap};

use arbor_shared::proto::runner::v1 as rpb;

use super::check::{Evidence, Tally, TaskLog};
use crate::chaos::{Report, recorder::Seen};

/// What the worker processes printed, against the log: every execution they started was a
/// durable dispatch to that very process, each (task, attempt) went to one process only, every
/// attempt carried the task's idempotency key, and each result was handed in once.
pub(super) fn check_transcript(
    ev: &Evidence<'_>,
    logs: &HashMap<String, TaskLog>,
    tally: &mut Tally,
    report: &mut Report,
) {
    let keys: HashMap<&str, (&str, &str)> = ev
        .tasks
        .iter()
        .map(|t| {
            (
                t.task_id.as_str(),
                (t.idempotency_key.as_str(), t.task_type.as_str()),
            )
        })
        .collect();
    let mut executed: HashMap<(String, u32), Vec<&str>> = HashMap::new();
    let mut per_task: HashMap<String, usize> = HashMap::new();
    let mut handed_in: HashMap<String, Vec<&str>> = HashMap::new();
    for s in ev.said {
        let words: HashMap<&str, &str> = s
            .line
            .split(' ')
            .take_while(|w| !w.starts_with("args="))
            .filter_map(|w| w.split_once('='))
            .collect();
        let id = words.get("id").copied().unwrap_or_default();
        match s.line.split(' ').next() {
            Some("task") => {
                let attempt = words
                    .get("attempt")
                    .and_then(|a| a.parse().ok())
                    .unwrap_or(0);
                executed
                    .entry((id.to_string(), attempt))
                    .or_default()
                    .push(&s.worker);
                *per_task.entry(id.to_string()).or_default() += 1;
                tally.executions += 1;
                let want = keys.get(id).map(|k| k.0);
                if words.get("key").copied() != want {
                    report.problem(format!(
                        "worker {}: task {id} attempt {attempt} came with key {:?}, the task's \
                         is {want:?}",
                        s.worker,
                        words.get("key")
                    ));
                }
            }
            Some("completed") | Some("threw") => {
                if words.get("accepted") == Some(&"false") {
                    report.problem(format!("worker {}: {}", s.worker, s.line));
                }
                handed_in.entry(id.to_string()).or_default().push(&s.worker);
            }
            Some("cancelled") => report.problem(format!("worker {}: {}", s.worker, s.line)),
            _ => {}
        }
    }
    for ((id, attempt), by) in &executed {
        let dispatched = logs
            .get(id)
            .and_then(|l| l.dispatched.iter().find(|d| d.1 == *attempt));
        match dispatched {
            Some((_, _, worker)) if by.as_slice() == [worker.as_str()] => {}
            _ => report.problem(format!(
                "task {id} attempt {attempt} executed by {by:?}, dispatched {:?}",
                dispatched.map(|d| &d.2)
            )),
        }
    }
    for (id, by) in &handed_in {
        let l = logs.get(id);
        let taker = l.and_then(|l| {
            l.completed.first().map(|c| c.2.as_str()).or_else(|| {
                l.failed
                    .iter()
                    .find(|(_, f)| !f.will_retry)
                    .map(|(_, f)| f.worker_id.as_str())
            })
        });
        if by.len() != 1 || Some(by[0]) != taker {
            report.problem(format!(
                "task {id}: results accepted from {by:?}, the log took one from {taker:?}"
            ));
        }
    }
    tally.effects_rerun = per_task
        .iter()
        .filter(|(id, n)| **n > 1 && keys.get(id.as_str()).is_some_and(|k| k.1 == "py.effect"))
        .count();
}

/// The durable subscriber saw seq 1..=last exactly as the log holds it, across the restarts.
pub fn check_subscriber(
    log: &[rpb::Event],
    recorded: &BTreeMap<u64, Seen>,
    problems: &[String],
    report: &mut Report,
) {
    for p in problems {
        report.problem(format!("durable subscriber: {p}"));
    }
    let last = log.last().map_or(0, |e| e.seq);
    let complete = recorded.len() as u64 == last && recorded.keys().zip(1..).all(|(s, n)| *s == n);
    if !complete {
        let missing: Vec<u64> = (1..=last)
            .filter(|s| !recorded.contains_key(s))
            .take(20)
            .collect();
        report.problem(format!(
            "durable subscriber saw {} events of {last}; missing (first 20): {missing:?}",
            recorded.len()
        ));
    }
    let differing = log
        .iter()
        .filter(|e| recorded.get(&e.seq).is_some_and(|s| *s != Seen::of(e)))
        .count();
    if differing > 0 {
        report.problem(format!(
            "durable subscriber: {differing} events differ from the log"
        ));
    }
    report.fact(format!(
        "durable subscriber: seq 1..={last} seen, gap-free: {complete}"
    ));
}
