//! The `tool` leaf: guard pipeline (policy → budget → rate limit → ask), the optional approval
//! suspension and the decision it applies (approve, edit, respond, reject), and the call itself
//! with an idempotency key, so a replay after a crash repeats the same call id and key.
//!
//! Under a `retry` (with nothing in between that handles the failure itself), a guard refusal
//! does not spend the retry's attempts: a rate-limited call parks the node until the rate
//! limit's window has room (a durable deadline in the node's state, reported as the tick's wake
//! time), then passes the guards again under the same call id; a refusal that no wait can cure
//! (policy deny, budget spent) fails the retry at once with the guard's reason.

use arbor_shared::domain::{
    ApprovalKind, ApprovalPhase, ApprovalRequest, DecisionKind, SuspensionCategory,
    SuspensionState, TimeoutAction,
};
use serde_json::{Map, Value as Json, json};

use super::{Ctx, task};
use crate::engine::checkpoint::NodeData;
use crate::engine::interaction::SuspensionRecord;
use crate::engine::interaction::request_id;
use crate::engine::interaction::store::{Progress, ProgressEntry, ToolCallRecord, ToolCallState};
use crate::engine::spec::{ToolOnReject, ToolSpec};
use crate::engine::tools::{Policy, ToolCall};
use crate::engine::{Effect, TaskKind, TickStatus};

/// Why a new call was turned away.
enum Refusal {
    /// An ordinary node failure: arguments that do not resolve, an unknown tool.
    Failed(String),
    /// Policy deny or budget spent: waiting cannot cure it.
    Final(String),
    /// The rate limit's window has no room before `until`.
    RateLimited { error: String, until: u64 },
}

pub(super) fn tool(cx: &mut Ctx<'_>, idx: usize, spec: &ToolSpec) -> TickStatus {
    let loc = cx.locator(idx);
    let call_id = format!("{loc}#{}", cx.attempt(idx));
    if !cx.ck.interaction.tool_calls.contains_key(&call_id) {
        let parked = parked_until(cx, idx);
        if let Some(until) = parked
            && cx.env.now_ms < until
        {
            cx.wake_at(until);
            return TickStatus::Running;
        }
        match admit(cx, idx, spec, &call_id) {
            Ok(()) => set_parked(cx, idx, None),
            Err(Refusal::RateLimited { error, until }) if cx.retried => {
                if parked.is_none() {
                    cx.effects.push(Effect::Log {
                        node_locator: loc.to_string(),
                        message: format!("{error}: waiting for the window (until {until} ms)"),
                    });
                }
                set_parked(cx, idx, Some(until));
                cx.wake_at(until);
                return TickStatus::Running;
            }
            Err(Refusal::Failed(error) | Refusal::RateLimited { error, .. }) => {
                return cx.fail(error);
            }
            Err(Refusal::Final(error)) => return cx.refuse(error),
        }
    }
    let Some(record) = cx.ck.interaction.tool_calls.get(&call_id) else {
        return cx.fail(format!("tool '{loc}': call record missing"));
    };
    match record.state.clone() {
        ToolCallState::AwaitingApproval { request_id } => {
            await_approval(cx, idx, spec, &call_id, &request_id)
        }
        ToolCallState::Approved => execute(cx, idx, spec, &call_id),
        ToolCallState::Succeeded
        | ToolCallState::Failed { .. }
        | ToolCallState::Cancelled { .. } => {
            cx.fail(format!("tool '{loc}': call {call_id} already finished"))
        }
    }
}

/// When a node parked on the rate limit may ask again (kept in its leaf deadline).
fn parked_until(cx: &Ctx<'_>, idx: usize) -> Option<u64> {
    cx.ck.nodes[idx].data.deadline()
}

fn set_parked(cx: &mut Ctx<'_>, idx: usize, until: Option<u64>) {
    if let NodeData::Leaf { deadline } = &mut cx.ck.nodes[idx].data {
        *deadline = until;
    }
}

/// The guard pipeline for a new call; on success the call record exists (approved or awaiting
/// approval) and counts against the run's budget.
fn admit(cx: &mut Ctx<'_>, idx: usize, spec: &ToolSpec, call_id: &str) -> Result<(), Refusal> {
    let loc = cx.locator(idx);
    let name = &spec.tool;
    let args = cx
        .resolve(&spec.args)
        .map_err(|e| Refusal::Failed(format!("tool '{loc}': {e}")))?;
    if cx.env.tools.get(name).is_none() && !is_remote(cx, name) {
        return Err(Refusal::Failed(format!(
            "tool '{loc}': unknown tool '{name}'"
        )));
    }
    let guards = cx.env.tools.guards();
    let policy = spec.policy.unwrap_or_else(|| guards.policy_for(name));
    if policy == Policy::Deny {
        return Err(Refusal::Final(format!(
            "tool '{name}' ({loc}) denied by policy"
        )));
    }
    if let Some(budget) = guards.budget_per_run()
        && cx.ck.interaction.budget_used >= budget
    {
        return Err(Refusal::Final(format!(
            "tool '{name}' ({loc}) over budget: {budget} calls per run"
        )));
    }
    if let Err(until) = guards.admit(name, cx.env.now_ms) {
        let error = format!("tool '{name}' ({loc}) rate limited");
        return Err(Refusal::RateLimited { error, until });
    }
    cx.ck.interaction.budget_used += 1;
    let state = if policy == Policy::Ask {
        let rid = request_id(
            cx.env.thread_id,
            cx.env.run_id,
            loc,
            call_id,
            cx.attempt(idx),
        );
        ToolCallState::AwaitingApproval { request_id: rid }
    } else {
        ToolCallState::Approved
    };
    cx.ck.interaction.tool_calls.insert(
        call_id.to_string(),
        ToolCallRecord {
            node: idx as u32,
            tool: name.clone(),
            args,
            state,
        },
    );
    Ok(())
}

/// The call's arguments as the guards (and any EDIT) left them.
fn call_args(cx: &Ctx<'_>, call_id: &str) -> Json {
    cx.ck
        .interaction
        .tool_calls
        .get(call_id)
        .map_or(Json::Null, |r| r.args.clone())
}

fn set_state(cx: &mut Ctx<'_>, call_id: &str, state: ToolCallState) {
    if let Some(record) = cx.ck.interaction.tool_calls.get_mut(call_id) {
        record.state = state;
    }
}

fn await_approval(
    cx: &mut Ctx<'_>,
    idx: usize,
    spec: &ToolSpec,
    call_id: &str,
    rid: &str,
) -> TickStatus {
    let progress_key = format!("tool:{}:{call_id}", cx.locator(idx));
    let Some(decision) = cx.take_decision(rid) else {
        if !cx.ck.interaction.suspensions.contains_key(rid) {
            let record = approval_record(cx, idx, spec, call_id, rid);
            cx.suspend(idx, record);
        }
        cx.ck.interaction.progress.insert(
            progress_key,
            ProgressEntry {
                node: idx as u32,
                progress: Progress::ToolApproval {
                    request_id: rid.to_string(),
                },
            },
        );
        return TickStatus::Running;
    };
    cx.ck.interaction.progress.remove(&progress_key);
    match decision.approval_kind(&spec.allowed_decisions()) {
        DecisionKind::Approve => {}
        DecisionKind::Edit => {
            if let Some(record) = cx.ck.interaction.tool_calls.get_mut(call_id) {
                record.args = decision.result;
            }
        }
        DecisionKind::Respond => {
            set_state(cx, call_id, ToolCallState::Succeeded);
            return write_output(cx, idx, spec, decision.result);
        }
        DecisionKind::Reject => {
            set_state(
                cx,
                call_id,
                ToolCallState::Cancelled {
                    reason: decision.reason.clone(),
                },
            );
            return rejected(cx, idx, spec, &decision.reason);
        }
    }
    set_state(cx, call_id, ToolCallState::Approved);
    execute(cx, idx, spec, call_id)
}

/// A rejected call never runs; `on_reject` says whether its node fails or succeeds without it.
fn rejected(cx: &mut Ctx<'_>, idx: usize, spec: &ToolSpec, reason: &str) -> TickStatus {
    match &spec.on_reject {
        ToolOnReject::Failure => cx.fail(format!("tool call rejected: {reason}")),
        ToolOnReject::Skip { output: None } => TickStatus::Success,
        ToolOnReject::Skip {
            output: Some(stand_in),
        } => match cx.resolve(stand_in) {
            Ok(value) => write_output(cx, idx, spec, value),
            Err(e) => {
                let loc = cx.locator(idx);
                cx.fail(format!("tool '{loc}': reject_output: {e}"))
            }
        },
    }
}

/// Served by task workers: configured in the runner, or declared by the tree.
fn is_remote(cx: &Ctx<'_>, name: &str) -> bool {
    cx.env.tools.is_remote(name) || cx.spec.task_types.iter().any(|t| t == name)
}

fn execute(cx: &mut Ctx<'_>, idx: usize, spec: &ToolSpec, call_id: &str) -> TickStatus {
    let loc = cx.locator(idx);
    let Some(tool) = cx.env.tools.get(&spec.tool) else {
        if is_remote(cx, &spec.tool) {
            return execute_remote(cx, idx, spec, call_id);
        }
        return cx.fail(format!("tool '{loc}': unknown tool '{}'", spec.tool));
    };
    let args = call_args(cx, call_id);
    let call = ToolCall {
        tool: spec.tool.clone(),
        args,
        run_id: cx.env.run_id.to_string(),
        tool_call_id: call_id.to_string(),
        idempotency_key: format!("{}:{call_id}", cx.env.run_id),
    };
    match tool.call(&call) {
        Ok(result) => {
            set_state(cx, call_id, ToolCallState::Succeeded);
            write_output(cx, idx, spec, result)
        }
        Err(e) => {
            let error = format!("tool '{}' ({loc}) failed: {e}", spec.tool);
            set_state(
                cx,
                call_id,
                ToolCallState::Failed {
                    error: error.clone(),
                },
            );
            cx.fail(error)
        }
    }
}

/// The call becomes a task (after the guards and any approval), with the call's idempotency
/// key; the node waits for the task's outcome.
fn execute_remote(cx: &mut Ctx<'_>, idx: usize, spec: &ToolSpec, call_id: &str) -> TickStatus {
    let loc = cx.locator(idx);
    let args = call_args(cx, call_id);
    let key = format!("{}:{call_id}", cx.env.run_id);
    let rid = request_id(
        cx.env.thread_id,
        cx.env.run_id,
        loc,
        &format!("task:{call_id}"),
        cx.attempt(idx),
    );
    let payload = json!({
        "execution_kind": "task",
        "task_type": spec.tool,
        "task_id": rid,
        "tool_call_id": call_id,
        "args": args,
        "idempotency_key": key,
    });
    let ask = task::Ask {
        request_id: rid,
        task_type: &spec.tool,
        kind: TaskKind::Tool,
        args,
        idempotency_key: key,
        options: &spec.task,
        message: format!("waiting for task '{}' ({loc})", spec.tool),
        payload,
    };
    let decision = match task::wait(cx, idx, ask) {
        Ok(decision) => decision,
        Err(running) => return running,
    };
    let status = task::outcome(
        cx,
        idx,
        "tool",
        decision,
        spec.output.as_deref(),
        &spec.task,
    );
    let state = match status {
        TickStatus::Success => ToolCallState::Succeeded,
        _ => ToolCallState::Failed {
            error: "the task failed".into(),
        },
    };
    set_state(cx, call_id, state);
    status
}

fn write_output(cx: &mut Ctx<'_>, idx: usize, spec: &ToolSpec, result: Json) -> TickStatus {
    let Some(key) = &spec.output else {
        return TickStatus::Success;
    };
    match cx.write(key, result) {
        Ok(()) => TickStatus::Success,
        Err(e) => {
            let loc = cx.locator(idx);
            cx.fail(format!("tool '{loc}': {e}"))
        }
    }
}

fn approval_record(
    cx: &Ctx<'_>,
    idx: usize,
    spec: &ToolSpec,
    call_id: &str,
    rid: &str,
) -> SuspensionRecord {
    let env = cx.env;
    let node = cx.node(idx);
    let args = call_args(cx, call_id);
    let title = format!("Allow tool '{}' ({})?", spec.tool, node.locator);
    let allowed = spec.allowed_decisions();
    let payload = json!({
        "kind": "tool",
        "tool": spec.tool,
        "args": args,
        "tool_call_id": call_id,
        "allowed_decisions": allowed.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
    });
    let approval = ApprovalRequest {
        request_id: rid.to_string(),
        run_id: env.run_id.to_string(),
        thread_id: env.thread_id.to_string(),
        tree_id: env.tree_id.to_string(),
        tree_version: env.tree_version,
        node_locator: node.locator.clone(),
        node_name: node.name_or_empty().to_string(),
        kind: ApprovalKind::Tool,
        tool_name: spec.tool.clone(),
        tool_args: args,
        tool_call_id: call_id.to_string(),
        title: title.clone(),
        context: Map::new(),
        phase: ApprovalPhase::Before,
        deadline_ms: 0,
        on_timeout: TimeoutAction::Reject,
        allowed_decisions: allowed,
        submitted_by: env.submitted_by.to_string(),
        requested_at_ms: env.now_ms,
    };
    SuspensionRecord {
        request_id: rid.to_string(),
        category: SuspensionCategory::RequireApproval,
        message: title,
        payload,
        state: SuspensionState::Active,
        node_locator: node.locator.clone(),
        created_at_ms: env.now_ms,
        approval: Some(approval),
        consumed_decision_id: None,
    }
}
