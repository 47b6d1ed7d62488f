//! User input and external execution: payloads, decision validation and normalisation, outputs.

use arbor_shared::domain::{SuspensionCategory, SuspensionState};
use serde_json::{Value as Json, json};

use super::harness::{Harness, reject, suspended};
use crate::engine::{Decision, SuspensionRecord, TickStatus, validate_decision};

fn asked(node: Json) -> (Harness, SuspensionRecord) {
    let mut h = Harness::new(node).input(json!({"job": "build-42"}));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Running);
    let record = suspended(&out.effects).remove(0);
    (h, record)
}

#[test]
fn user_input_payload_and_text_normalisation() {
    let (mut h, record) = asked(
        json!({"type": "user_input", "name": "notes", "input_kind": "text",
        "prompt": "Release notes?", "schema": {"type": "string", "minLength": 1},
        "default": "none", "output": "notes"}),
    );
    assert_eq!(record.category, SuspensionCategory::RequireUserInput);
    assert_eq!(record.message, "Release notes?");
    assert!(record.approval.is_none());
    assert_eq!(
        record.payload,
        json!({"input_kind": "text", "prompt": "Release notes?",
        "schema": {"type": "string", "minLength": 1}, "default": "none"})
    );

    let d = Decision::resume(&record.request_id, "d1", json!({"text": "fixed bugs"}));
    let d = validate_decision(&record, d).unwrap();
    assert_eq!(d.result, json!({"value": "fixed bugs"}));
    assert_eq!(h.decide(vec![d]).status, TickStatus::Success);
    assert_eq!(h.bb("notes"), json!("fixed bugs"));
}

#[test]
fn user_input_values_are_checked_against_kind_options_and_schema() {
    let (_, text) = asked(
        json!({"type": "user_input", "input_kind": "text", "prompt": "p",
        "schema": {"type": "string", "minLength": 3}}),
    );
    let err = validate_decision(
        &text,
        Decision::resume(&text.request_id, "d", json!({"text": "ab"})),
    )
    .unwrap_err();
    assert_eq!(err.field, "result.value");
    assert!(
        err.description.contains("does not match the schema"),
        "{err}"
    );
    let err = validate_decision(
        &text,
        Decision::resume(&text.request_id, "d", json!({"value": 5})),
    )
    .unwrap_err();
    assert_eq!(err.description, "must be a string");
    let err = validate_decision(
        &text,
        Decision::resume(&text.request_id, "d", json!("bare")),
    )
    .unwrap_err();
    assert_eq!(err.field, "result");

    let (_, select) = asked(
        json!({"type": "user_input", "input_kind": "select", "prompt": "p",
        "options": ["red", "green"]}),
    );
    assert!(
        validate_decision(
            &select,
            Decision::resume(&select.request_id, "d", json!({"value": "red"}))
        )
        .is_ok()
    );
    let err = validate_decision(
        &select,
        Decision::resume(&select.request_id, "d", json!({"value": "blue"})),
    )
    .unwrap_err();
    assert!(
        err.description.starts_with("must be one of the options"),
        "{err}"
    );

    let (_, number) = asked(
        json!({"type": "user_input", "input_kind": "number", "prompt": "p",
        "schema": {"$schema": "http://json-schema.org/draft-07/schema#", "maximum": 10}}),
    );
    assert!(
        validate_decision(
            &number,
            Decision::resume(&number.request_id, "d", json!({"value": 7}))
        )
        .is_ok()
    );
    let err = validate_decision(
        &number,
        Decision::resume(&number.request_id, "d", json!({"value": 11})),
    )
    .unwrap_err();
    assert!(
        err.description.contains("does not match the schema"),
        "{err}"
    );
    let err = validate_decision(
        &number,
        Decision::resume(&number.request_id, "d", json!({"text": "7"})),
    )
    .unwrap_err();
    assert_eq!(err.description, "must be a number");
}

#[test]
fn decisions_for_other_or_inactive_requests_are_refused() {
    let (mut h, record) = asked(json!({"type": "user_input", "input_kind": "json", "prompt": "p"}));
    let err = validate_decision(&record, Decision::resume("other", "d", json!({"value": 1})))
        .unwrap_err();
    assert_eq!(err.field, "request_id");
    let err = validate_decision(
        &record,
        Decision::resume(&record.request_id, "", json!({"value": 1})),
    )
    .unwrap_err();
    assert_eq!(err.field, "decision_id");
    h.decide(vec![Decision::resume(
        &record.request_id,
        "d",
        json!({"value": {"any": [1]}}),
    )]);
    assert_eq!(
        h.ck.past_request(&record.request_id)
            .unwrap()
            .decision_id
            .as_deref(),
        Some("d")
    );
    let cleared = SuspensionRecord {
        state: SuspensionState::Cleared,
        ..record.clone()
    };
    let err = validate_decision(
        &cleared,
        Decision::resume(&record.request_id, "d2", json!({"value": 1})),
    )
    .unwrap_err();
    assert!(err.description.contains("not active"), "{err}");
}

#[test]
fn cancelled_user_input_fails_the_node() {
    let (mut h, record) =
        asked(json!({"type": "user_input", "name": "q", "input_kind": "text", "prompt": "p"}));
    let d = validate_decision(&record, reject(&record.request_id, "gone")).unwrap();
    let out = h.decide(vec![d]);
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(out.error, "user input 'q' cancelled: gone");
}

#[test]
fn external_payload_resolves_refs_and_results_drive_the_outcome() {
    let node = json!({"type": "external", "name": "ci", "execution_kind": "ci.pipeline",
        "task": {"job": {"$ref": "job"}}, "callback_hint": "webhook", "output": "ci"});
    let (mut h, record) = asked(node.clone());
    assert_eq!(
        record.category,
        SuspensionCategory::RequireExternalExecution
    );
    assert_eq!(
        record.payload,
        json!({"execution_kind": "ci.pipeline",
        "task": {"job": "build-42"}, "callback_hint": "webhook"})
    );
    let d = Decision::resume(
        &record.request_id,
        "d",
        json!({"status": "succeeded", "result": {"ok": 1}}),
    );
    let d = validate_decision(&record, d).unwrap();
    assert_eq!(h.decide(vec![d]).status, TickStatus::Success);
    assert_eq!(h.bb("ci"), json!({"ok": 1}));

    let (mut h, record) = asked(node);
    let d = Decision::resume(
        &record.request_id,
        "d",
        json!({"status": "failed", "result": "red"}),
    );
    let out = h.decide(vec![validate_decision(&record, d).unwrap()]);
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(out.error, "external 'ci' failed: red");

    for bad in [
        json!({"status": "done"}),
        json!("x"),
        json!({"status": "failed", "extra": 1}),
    ] {
        let d = Decision::resume(&record.request_id, "d", bad.clone());
        assert!(validate_decision(&record, d).is_err(), "{bad}");
    }
    let d = Decision::resume(&record.request_id, "d", json!({"status": "succeeded"}));
    assert_eq!(
        validate_decision(&record, d).unwrap().result,
        json!({"status": "succeeded", "result": null})
    );
}

#[test]
fn external_with_a_missing_ref_fails_instead_of_asking() {
    let mut h = Harness::new(
        json!({"type": "external", "name": "x", "execution_kind": "k",
        "task": {"$ref": "nope"}}),
    );
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(out.error, "external 'x': blackboard has no 'nope'");
}

#[test]
fn a_respond_on_an_approval_may_carry_any_result() {
    let mut h = Harness::new(
        json!({"type": "tool", "tool": "echo", "policy": "ask", "allow_respond": true}),
    );
    let out = h.tick();
    let record = suspended(&out.effects).remove(0);
    let d = Decision::approval(
        &record.request_id,
        "d",
        arbor_shared::domain::DecisionKind::Respond,
        json!([1, "anything"]),
    );
    assert_eq!(validate_decision(&record, d.clone()).unwrap(), d);
}

#[test]
fn a_default_that_breaks_the_schema_is_a_validation_error() {
    let doc = json!({"id": "t", "version": 1, "root": {"type": "user_input", "input_kind": "number",
        "prompt": "p", "schema": {"minimum": 5}, "default": 1}});
    let errs =
        crate::engine::parse_tree(&doc.to_string(), crate::engine::TreeFormat::Json).unwrap_err();
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "$.root.default");
}
