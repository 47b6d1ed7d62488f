//! Decorators: inverter, force_success, force_failure, retry, repeat, timeout.

use super::Ctx;
use crate::engine::TickStatus;
use crate::engine::checkpoint::NodeData;

fn only_child(cx: &Ctx<'_>, idx: usize) -> Option<usize> {
    cx.node(idx).children.first().copied()
}

pub(super) fn inverter(cx: &mut Ctx<'_>, idx: usize) -> TickStatus {
    let Some(child) = only_child(cx, idx) else {
        return cx.fail("decorator without a child");
    };
    match cx.tick(child) {
        TickStatus::Running => TickStatus::Running,
        TickStatus::Failure => TickStatus::Success,
        TickStatus::Success => {
            let loc = cx.locator(idx);
            cx.fail(format!("inverter '{loc}': child succeeded"))
        }
    }
}

pub(super) fn force(cx: &mut Ctx<'_>, idx: usize, outcome: TickStatus) -> TickStatus {
    let Some(child) = only_child(cx, idx) else {
        return cx.fail("decorator without a child");
    };
    match cx.tick(child) {
        TickStatus::Running => TickStatus::Running,
        _ if outcome == TickStatus::Failure => {
            let loc = cx.locator(idx);
            cx.fail(format!("force_failure '{loc}'"))
        }
        _ => outcome,
    }
}

fn count(cx: &Ctx<'_>, idx: usize) -> u32 {
    match cx.ck.nodes[idx].data {
        NodeData::Counter { count } => count,
        _ => 0,
    }
}

fn set_count(cx: &mut Ctx<'_>, idx: usize, value: u32) {
    if let NodeData::Counter { count } = &mut cx.ck.nodes[idx].data {
        *count = value;
    }
}

/// Re-enters a failing child until it succeeds or `max_attempts` attempts failed. Synchronous
/// failures are retried within the tick (bounded by the attempts and the tick's work budget).
/// A guard refusal that no wait can cure (deny, budget spent) fails it at once with the guard's
/// reason; a rate-limited tool below it waits for its window instead of failing (see `tool`).
pub(super) fn retry(cx: &mut Ctx<'_>, idx: usize, max_attempts: u32) -> TickStatus {
    let Some(child) = only_child(cx, idx) else {
        return cx.fail("decorator without a child");
    };
    let mut failed = count(cx, idx);
    loop {
        match cx.tick(child) {
            TickStatus::Running => {
                set_count(cx, idx, failed);
                return TickStatus::Running;
            }
            TickStatus::Success => return TickStatus::Success,
            // The refusal stays the reason, so an outer retry gives up too.
            TickStatus::Failure if cx.refused() => return TickStatus::Failure,
            TickStatus::Failure => {
                failed += 1;
                if failed >= max_attempts {
                    let loc = cx.locator(idx);
                    let why = cx.take_error();
                    return cx.fail(format!(
                        "retry '{loc}': {max_attempts} attempts failed (last: {why})"
                    ));
                }
            }
        }
    }
}

/// Runs the child `count` times in a row; a failure fails the repeat.
pub(super) fn repeat(cx: &mut Ctx<'_>, idx: usize, times: u32) -> TickStatus {
    let Some(child) = only_child(cx, idx) else {
        return cx.fail("decorator without a child");
    };
    let mut done = count(cx, idx);
    loop {
        match cx.tick(child) {
            TickStatus::Running => {
                set_count(cx, idx, done);
                return TickStatus::Running;
            }
            TickStatus::Failure => return TickStatus::Failure,
            TickStatus::Success => {
                done += 1;
                if done >= times {
                    return TickStatus::Success;
                }
            }
        }
    }
}

/// Fails (halting the child and withdrawing its suspensions) once the absolute deadline set on
/// first entry has passed; the deadline is in the checkpoint, so it survives a restore.
pub(super) fn timeout(cx: &mut Ctx<'_>, idx: usize, ms: u64) -> TickStatus {
    let Some(child) = only_child(cx, idx) else {
        return cx.fail("decorator without a child");
    };
    let now = cx.env.now_ms;
    let deadline = match &mut cx.ck.nodes[idx].data {
        NodeData::Timer { deadline } => *deadline.get_or_insert(now.saturating_add(ms)),
        _ => now.saturating_add(ms),
    };
    let loc = cx.locator(idx);
    if now >= deadline {
        cx.halt_children(idx, &format!("timeout '{loc}' fired"));
        return cx.fail(format!("timeout '{loc}' fired after {ms} ms"));
    }
    let status = cx.tick(child);
    if status == TickStatus::Running {
        cx.wake_at(deadline);
    }
    status
}
