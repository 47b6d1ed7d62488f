//! Composites: sequence and selector (with memory), parallel, reactive sequence.

use super::Ctx;
use crate::engine::TickStatus;
use crate::engine::checkpoint::NodeData;
use crate::engine::checkpoint::NodeStatus;

fn cursor(cx: &Ctx<'_>, idx: usize) -> usize {
    match cx.ck.nodes[idx].data {
        NodeData::Composite { cursor } => cursor as usize,
        _ => 0,
    }
}

fn set_cursor(cx: &mut Ctx<'_>, idx: usize, at: usize) {
    if let NodeData::Composite { cursor } = &mut cx.ck.nodes[idx].data {
        *cursor = u32::try_from(at).unwrap_or(u32::MAX);
    }
}

/// Ticks children in order from the remembered cursor until one does not return `go_on`.
fn with_memory(cx: &mut Ctx<'_>, idx: usize, go_on: TickStatus) -> TickStatus {
    let children = &cx.node(idx).children;
    let mut at = cursor(cx, idx);
    while let Some(&child) = children.get(at) {
        match cx.tick(child) {
            TickStatus::Running => {
                set_cursor(cx, idx, at);
                return TickStatus::Running;
            }
            s if s == go_on => at += 1,
            done => return done,
        }
    }
    go_on
}

pub(super) fn sequence(cx: &mut Ctx<'_>, idx: usize) -> TickStatus {
    with_memory(cx, idx, TickStatus::Success)
}

pub(super) fn selector(cx: &mut Ctx<'_>, idx: usize) -> TickStatus {
    let status = with_memory(cx, idx, TickStatus::Failure);
    if status == TickStatus::Failure {
        return cx.fail_quietly(idx);
    }
    status
}

/// Ticks every unfinished child; succeeds once `threshold` children succeeded, fails once that
/// can no longer happen, halting the children still running either way. In Yield mode a new
/// suspension stops the remaining children for this tick.
pub(super) fn parallel(cx: &mut Ctx<'_>, idx: usize, threshold: usize) -> TickStatus {
    let children = &cx.node(idx).children;
    let (mut successes, mut failures, mut skipped) = (0usize, 0usize, false);
    for &child in children {
        match cx.ck.nodes[child].status {
            NodeStatus::Success => successes += 1,
            NodeStatus::Failure => failures += 1,
            NodeStatus::Idle | NodeStatus::Running if cx.stop_siblings() => skipped = true,
            NodeStatus::Idle | NodeStatus::Running => match cx.tick(child) {
                TickStatus::Success => successes += 1,
                TickStatus::Failure => failures += 1,
                TickStatus::Running => {}
            },
        }
    }
    let loc = cx.locator(idx);
    if successes >= threshold {
        cx.halt_children(idx, &format!("parallel '{loc}' succeeded"));
        return TickStatus::Success;
    }
    if failures > children.len().saturating_sub(threshold) {
        cx.halt_children(idx, &format!("parallel '{loc}' failed"));
        return TickStatus::Failure;
    }
    if skipped {
        cx.yield_now();
    }
    TickStatus::Running
}

/// Re-ticks every child from the first on each tick: a child that starts running halts the
/// running children after it, a failure halts them all.
pub(super) fn reactive_sequence(cx: &mut Ctx<'_>, idx: usize) -> TickStatus {
    let node = cx.node(idx);
    for (i, &child) in node.children.iter().enumerate() {
        match cx.tick(child) {
            TickStatus::Success => {}
            TickStatus::Running => {
                if let Some(&next) = node.children.get(i + 1) {
                    let loc = cx.locator(child);
                    cx.halt_range(next..node.end, &format!("'{loc}' is running again"));
                }
                set_cursor(cx, idx, i);
                return TickStatus::Running;
            }
            TickStatus::Failure => {
                let loc = cx.locator(child);
                cx.halt_children(idx, &format!("'{loc}' failed"));
                return TickStatus::Failure;
            }
        }
    }
    TickStatus::Success
}
