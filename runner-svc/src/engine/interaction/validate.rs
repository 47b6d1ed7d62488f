//! Checks a decision against the suspension it resolves before the runner accepts it, and
//! normalises user input (`{"text": s}` becomes `{"value": s}`).

use arbor_shared::domain::{DecisionKind, SuspensionCategory, SuspensionState, Verdict};
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
    if record.category == SuspensionCategory::RequireApproval {
        decision.action = Verdict::of(approval_kind(record, &decision)?);
        return Ok(decision);
    }
    if decision.action.kind().is_some() {
        return Err(DecisionError::new(
            "decision_kind",
            "only approvals take a decision kind; resume or cancel user input and external results",
        ));
    }
    if decision.action.is_cancel() {
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

/// The kind an approval decision applies, if the node honours it. A plain cancel is a reject
/// and a plain resume without a result an approve (callers that predate decision kinds); a plain
/// resume with a result is ambiguous and must say EDIT or RESPOND.
fn approval_kind(record: &SuspensionRecord, d: &Decision) -> Result<DecisionKind, DecisionError> {
    let kind = match d.action.kind() {
        Some(kind) => kind,
        None if d.action.is_cancel() => DecisionKind::Reject,
        None if d.result.is_null() => DecisionKind::Approve,
        None => {
            return Err(DecisionError::new(
                "decision_kind",
                "an approval decision that carries a result must say EDIT or RESPOND",
            ));
        }
    };
    let allowed: &[DecisionKind] = match &record.approval {
        Some(a) => &a.allowed_decisions,
        None => &[DecisionKind::Approve, DecisionKind::Reject],
    };
    if !allowed.contains(&kind) {
        let names: Vec<&str> = allowed.iter().map(|k| k.as_str()).collect();
        return Err(DecisionError::not_allowed(
            "decision_kind",
            format!(
                "{} is not allowed for this request; allowed: {}",
                kind.as_str(),
                names.join(", ")
            ),
        ));
    }
    match kind {
        DecisionKind::Edit if d.result.is_null() => Err(DecisionError::new(
            "result",
            "an EDIT decision carries the edited arguments",
        )),
        DecisionKind::Approve if !d.result.is_null() => Err(DecisionError::new(
            "result",
            "an APPROVE decision carries no result (EDIT changes the arguments)",
        )),
        _ => Ok(kind),
    }
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
