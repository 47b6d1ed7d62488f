//! Leaves that wait for the outside world: `user_input` (a person answers) and `external` (some
//! other system reports a result).

use arbor_shared::domain::{SuspensionCategory, SuspensionState};
use serde_json::{Map, Value as Json};

use super::{Ctx, task};
use crate::engine::interaction::{Decision, SuspensionRecord};
use crate::engine::spec::{ExternalSpec, InputSpec};
use crate::engine::{TaskKind, TickStatus};

pub(super) fn user_input(cx: &mut Ctx<'_>, idx: usize, spec: &InputSpec) -> TickStatus {
    let rid = cx.request_id(idx, "user_input");
    let Some(decision) = cx.take_decision(&rid) else {
        if !cx.ck.interaction.suspensions.contains_key(&rid) {
            let mut payload = Map::new();
            payload.insert("input_kind".into(), spec.input_kind.as_str().into());
            payload.insert("prompt".into(), spec.prompt.clone().into());
            for (key, value) in [("schema", &spec.schema), ("default", &spec.default)] {
                if let Some(v) = value {
                    payload.insert(key.into(), v.clone());
                }
            }
            if !spec.options.is_empty() {
                payload.insert("options".into(), Json::Array(spec.options.clone()));
            }
            answerers(&mut payload, &spec.answerers);
            let record = record(
                cx,
                idx,
                SuspensionCategory::RequireUserInput,
                &spec.prompt,
                rid,
            );
            cx.suspend(
                idx,
                SuspensionRecord {
                    payload: Json::Object(payload),
                    ..record
                },
            );
        }
        return TickStatus::Running;
    };
    let loc = cx.locator(idx);
    if decision.action.is_cancel() {
        return cx.fail(format!("user input '{loc}' cancelled: {}", decision.reason));
    }
    output(cx, idx, spec.output.as_deref(), input_value(decision))
}

/// Who may answer, for Resolve's check and for whoever shows the request; left out when the node
/// names no one (the default rule applies).
fn answerers(payload: &mut Map<String, Json>, answerers: &[String]) {
    if !answerers.is_empty() {
        payload.insert(
            "answerers".into(),
            Json::Array(answerers.iter().cloned().map(Json::String).collect()),
        );
    }
}

/// The answer's value; `validate_decision` has normally turned `{"text": s}` into `{"value": s}`.
fn input_value(decision: Decision) -> Json {
    match decision.result {
        Json::Object(mut map) if map.len() == 1 => match map.remove("value") {
            Some(v) => v,
            None => map.remove("text").unwrap_or(Json::Null),
        },
        other => other,
    }
}

pub(super) fn external(cx: &mut Ctx<'_>, idx: usize, spec: &ExternalSpec) -> TickStatus {
    let rid = cx.request_id(idx, "external");
    let loc = cx.locator(idx);
    let waiting = cx.ck.interaction.suspensions.contains_key(&rid);
    // The task is resolved once, when the node first suspends; a replay finds the record.
    let task = if waiting {
        Json::Null
    } else {
        match cx.resolve(&spec.task) {
            Ok(t) => t,
            Err(e) => return cx.fail(format!("external '{loc}': {e}")),
        }
    };
    let mut payload = Map::new();
    payload.insert("execution_kind".into(), spec.execution_kind.clone().into());
    payload.insert("task".into(), task.clone());
    if let Some(hint) = &spec.callback_hint {
        payload.insert("callback_hint".into(), hint.clone().into());
    }
    answerers(&mut payload, &spec.answerers);
    let ask = task::Ask {
        idempotency_key: format!("{}:{rid}", cx.env.run_id),
        request_id: rid,
        task_type: &spec.execution_kind,
        kind: TaskKind::External,
        args: task,
        options: &spec.options,
        message: format!("waiting for {} ({loc})", spec.execution_kind),
        payload: Json::Object(payload),
    };
    match task::wait(cx, idx, ask) {
        Ok(decision) => task::outcome(
            cx,
            idx,
            "external",
            decision,
            spec.output.as_deref(),
            &spec.options,
        ),
        Err(running) => running,
    }
}

fn output(cx: &mut Ctx<'_>, idx: usize, key: Option<&str>, value: Json) -> TickStatus {
    let Some(key) = key else {
        return TickStatus::Success;
    };
    match cx.write(key, value) {
        Ok(()) => TickStatus::Success,
        Err(e) => {
            let loc = cx.locator(idx);
            cx.fail(format!("'{loc}': {e}"))
        }
    }
}

fn record(
    cx: &Ctx<'_>,
    idx: usize,
    category: SuspensionCategory,
    message: &str,
    request_id: String,
) -> SuspensionRecord {
    SuspensionRecord {
        request_id,
        category,
        message: message.to_string(),
        payload: Json::Null,
        state: SuspensionState::Active,
        node_locator: cx.locator(idx).to_string(),
        created_at_ms: cx.env.now_ms,
        approval: None,
        consumed_decision_id: None,
    }
}
