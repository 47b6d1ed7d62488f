//! Checks a decision against the suspension it resolves before the runner accepts it, and
//! normalises user input (`{"text": s}` becomes `{"value": s}`).

use arbor_shared::domain::{ResolveAction, SuspensionCategory, SuspensionState};
use serde_json::{Map, Value as Json, json};

use super::{Decision, DecisionError, SuspensionRecord, input};

/// Returns the normalised decision, or what is wrong with it as a path into the decision.
pub fn validate_decision(
    record: &SuspensionRecord,
    mut decision: Decision,
) -> Result<Decision, DecisionError> {
    if decision.request_id != record.request_id {
        return Err(DecisionError::new(
            "request_id",
            "does not name this suspension",
        ));
    }
    if decision.decision_id.is_empty() {
        return Err(DecisionError::new("decision_id", "is required"));
    }
    if record.state != SuspensionState::Active {
        return Err(DecisionError::new(
            "request_id",
            format!("suspension is {:?}, not active", record.state),
        ));
    }
    if decision.action == ResolveAction::Cancel {
        return Ok(decision);
    }
    match record.category {
        SuspensionCategory::RequireApproval => {}
        SuspensionCategory::RequireUserInput => {
            let value = user_value(&decision.result)?;
            let payload = &record.payload;
            let kind = payload
                .get("input_kind")
                .and_then(Json::as_str)
                .and_then(input::parse_kind)
                .ok_or_else(|| {
                    DecisionError::new("request_id", "suspension payload has no input_kind")
                })?;
            let options = payload
                .get("options")
                .and_then(Json::as_array)
                .cloned()
                .unwrap_or_default();
            input::check_value(kind, &options, payload.get("schema"), &value)
                .map_err(|e| DecisionError::new("result.value", e))?;
            decision.result = json!({ "value": value });
        }
        SuspensionCategory::RequireExternalExecution => {
            decision.result = external_result(&decision.result)?;
        }
    }
    Ok(decision)
}

fn user_value(result: &Json) -> Result<Json, DecisionError> {
    let shape = || DecisionError::new("result", "must be {\"value\": …} or {\"text\": \"…\"}");
    let map = result
        .as_object()
        .filter(|m| m.len() == 1)
        .ok_or_else(shape)?;
    if let Some(value) = map.get("value") {
        return Ok(value.clone());
    }
    match map.get("text") {
        Some(Json::String(text)) => Ok(Json::String(text.clone())),
        Some(_) => Err(DecisionError::new("result.text", "must be a string")),
        None => Err(shape()),
    }
}

fn external_result(result: &Json) -> Result<Json, DecisionError> {
    let map = result.as_object().ok_or_else(|| {
        DecisionError::new(
            "result",
            "must be {\"status\": \"succeeded\"|\"failed\", \"result\": …}",
        )
    })?;
    if let Some(key) = map.keys().find(|k| *k != "status" && *k != "result") {
        return Err(DecisionError::new(format!("result.{key}"), "unknown field"));
    }
    let status = match map.get("status").and_then(Json::as_str) {
        Some(status @ ("succeeded" | "failed")) => status,
        _ => {
            return Err(DecisionError::new(
                "result.status",
                "must be \"succeeded\" or \"failed\"",
            ));
        }
    };
    let mut normal = Map::new();
    normal.insert("status".into(), status.into());
    normal.insert(
        "result".into(),
        map.get("result").cloned().unwrap_or(Json::Null),
    );
    Ok(Json::Object(normal))
}
