//! Nodes whose result comes from a task worker: a remote `tool` call (after its guards and
//! approval) and an `external` node. The node suspends, asks for the task in the same step, and
//! reads the task's outcome from the decision the runner delivers when the task ends.

use arbor_shared::domain::{SuspensionCategory, SuspensionState};
use serde_json::{Value as Json, json};

use super::Ctx;
use crate::engine::interaction::{Decision, SuspensionRecord};
use crate::engine::spec::TaskOptions;
use crate::engine::{Effect, TaskKind, TaskOrder, TickStatus};

/// Blackboard key of a business error when the node names no `error_output`.
pub(crate) const DEFAULT_ERROR_KEY: &str = "last_error";

/// What a waiting node asks for.
pub(super) struct Ask<'a> {
    pub request_id: String,
    pub task_type: &'a str,
    pub kind: TaskKind,
    pub args: Json,
    pub idempotency_key: String,
    pub options: &'a TaskOptions,
    pub message: String,
    pub payload: Json,
}

/// Suspends with the task on the first tick, then waits; returns the task's outcome once
/// delivered.
pub(super) fn wait(cx: &mut Ctx<'_>, idx: usize, ask: Ask<'_>) -> Result<Decision, TickStatus> {
    if let Some(decision) = cx.take_decision(&ask.request_id) {
        return Ok(decision);
    }
    if !cx.ck.interaction.suspensions.contains_key(&ask.request_id) {
        let locator = cx.locator(idx).to_string();
        cx.suspend(
            idx,
            SuspensionRecord {
                request_id: ask.request_id.clone(),
                category: SuspensionCategory::RequireExternalExecution,
                message: ask.message,
                payload: ask.payload,
                state: SuspensionState::Active,
                node_locator: locator.clone(),
                created_at_ms: cx.env.now_ms,
                approval: None,
                consumed_decision_id: None,
            },
        );
        cx.effects.push(Effect::TaskQueued {
            order: Box::new(TaskOrder {
                task_id: ask.request_id,
                task_type: ask.task_type.to_string(),
                kind: ask.kind,
                args: ask.args,
                idempotency_key: ask.idempotency_key,
                max_attempts: ask.options.attempts,
                backoff_ms: ask.options.backoff_ms,
                node_locator: locator,
            }),
        });
    }
    Err(TickStatus::Running)
}

/// Applies a task's outcome: `{status: succeeded, result}` is the node's output, `failed` fails
/// it, `error` (a business error) writes `{code, message}` to the error key and fails it.
pub(super) fn outcome(
    cx: &mut Ctx<'_>,
    idx: usize,
    what: &str,
    decision: Decision,
    output: Option<&str>,
    options: &TaskOptions,
) -> TickStatus {
    let loc = cx.locator(idx);
    if decision.action.is_cancel() {
        return cx.fail(format!("{what} '{loc}' cancelled: {}", decision.reason));
    }
    let status = decision.result.get("status").and_then(Json::as_str);
    match status {
        Some("failed") => {
            let error = decision.result.get("result").cloned().unwrap_or(Json::Null);
            let error = error
                .as_str()
                .map_or_else(|| error.to_string(), str::to_string);
            cx.fail(format!("{what} '{loc}' failed: {error}"))
        }
        Some("error") => {
            let code = decision.result.get("code").cloned().unwrap_or(Json::Null);
            let message = decision
                .result
                .get("message")
                .cloned()
                .unwrap_or(Json::Null);
            let key = options.error_output.as_deref().unwrap_or(DEFAULT_ERROR_KEY);
            let error = json!({"code": code, "message": message, "node": loc});
            if let Err(e) = cx.write(key, error) {
                return cx.fail(format!("{what} '{loc}': {e}"));
            }
            let code = code.as_str().unwrap_or_default().to_string();
            let message = message.as_str().unwrap_or_default().to_string();
            cx.fail(format!("{what} '{loc}' raised {code}: {message}"))
        }
        _ => {
            let result = decision.result.get("result").cloned().unwrap_or(Json::Null);
            let Some(key) = output else {
                return TickStatus::Success;
            };
            match cx.write(key, result) {
                Ok(()) => TickStatus::Success,
                Err(e) => cx.fail(format!("{what} '{loc}': {e}")),
            }
        }
    }
}
