//! The `approval` gate: phases, rejection outcomes, the request it makes, and its progress record.

use arbor_shared::domain::{
    ApprovalKind, ApprovalPhase, DecisionKind, SuspensionCategory, SuspensionState, TimeoutAction,
};
use serde_json::{Value as Json, json};

use super::harness::{Harness, T0, approve, reject, suspended};
use crate::engine::{Effect, TickStatus};

fn gate(extra: Json) -> Json {
    let mut g = json!({"type": "approval", "name": "approve-deploy",
        "title": "Deploy billing?", "context": ["plan", "missing"],
        "child": {"type": "set", "key": "deployed", "value": true}});
    for (k, v) in extra.as_object().unwrap() {
        g[k] = v.clone();
    }
    json!({"type": "sequence", "children": [
        {"type": "set", "key": "plan", "value": {"replicas": 3}}, g]})
}

#[test]
fn before_gate_asks_with_a_complete_request_then_runs_the_child() {
    let mut h = Harness::new(gate(json!({"deadline_ms": 60000})));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Running);
    assert_eq!(out.next_wake_ms, None);
    let records = suspended(&out.effects);
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.category, SuspensionCategory::RequireApproval);
    assert_eq!(record.state, SuspensionState::Active);
    assert_eq!(record.node_locator, "approve-deploy");
    assert_eq!(record.message, "Deploy billing?");
    let req = record.approval.as_ref().unwrap();
    assert_eq!(req.request_id, record.request_id);
    assert_eq!(req.kind, ApprovalKind::Node);
    assert_eq!(req.phase, ApprovalPhase::Before);
    assert_eq!(req.title, "Deploy billing?");
    assert_eq!(
        Json::Object(req.context.clone()),
        json!({"plan": {"replicas": 3}, "missing": null})
    );
    assert_eq!(
        req.allowed_decisions,
        vec![DecisionKind::Approve, DecisionKind::Reject]
    );
    assert_eq!(req.deadline_ms, T0 + 60000);
    assert_eq!(req.on_timeout, TimeoutAction::Reject);
    assert_eq!(
        (req.run_id.as_str(), req.thread_id.as_str()),
        ("run-1", "thread-1")
    );
    assert_eq!((req.tree_id.as_str(), req.tree_version), ("t", 1));
    assert_eq!(req.submitted_by, "alice");
    assert_eq!(h.bb("deployed"), json!(null));

    // Ticking again while waiting changes nothing and emits nothing.
    let idle = h.tick();
    assert_eq!(idle.status, TickStatus::Running);
    assert!(idle.effects.is_empty(), "{:?}", idle.effects);

    let rid = record.request_id.clone();
    let out = h.decide(vec![approve(&rid)]);
    assert_eq!(out.status, TickStatus::Success);
    assert_eq!(
        out.effects,
        vec![Effect::Consumed {
            request_id: rid.clone(),
            decision_id: format!("d-{rid}")
        }]
    );
    assert_eq!(h.bb("deployed"), json!(true));
    // The gate is done with its request: the run remembers only which decision cleared it.
    assert!(h.ck.suspension(&rid).is_none());
    assert_eq!(
        h.ck.past_request(&rid).unwrap().decision_id.as_deref(),
        Some(format!("d-{rid}").as_str())
    );
    assert!(h.ck.pending_decision(&rid).is_none());
}

#[test]
fn rejected_gate_fails_with_the_reason_and_skips_the_child() {
    let mut h = Harness::new(gate(json!({})));
    h.tick();
    let rid = h.only_active();
    let out = h.decide(vec![reject(&rid, "not today")]);
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(out.error, "approval 'approve-deploy' rejected: not today");
    assert_eq!(h.bb("deployed"), json!(null));
}

#[test]
fn success_skip_turns_a_rejection_into_success_without_the_child() {
    let mut h = Harness::new(gate(json!({"on_reject": "success_skip"})));
    h.tick();
    let rid = h.only_active();
    assert_eq!(
        h.decide(vec![reject(&rid, "skip")]).status,
        TickStatus::Success
    );
    assert_eq!(h.bb("deployed"), json!(null));
}

#[test]
fn after_gate_runs_the_child_first_and_reject_decides_the_outcome() {
    for (on_reject, want) in [
        ("failure", TickStatus::Failure),
        ("success_skip", TickStatus::Success),
    ] {
        let mut h = Harness::new(gate(json!({"phase": "after", "on_reject": on_reject})));
        let out = h.tick();
        assert_eq!(h.bb("deployed"), json!(true), "child ran before asking");
        let req = suspended(&out.effects)[0].approval.clone().unwrap();
        assert_eq!(req.phase, ApprovalPhase::After);
        let rid = h.only_active();
        assert_eq!(h.decide(vec![reject(&rid, "undo")]).status, want);
    }
}

#[test]
fn both_phases_ask_twice_with_different_ids() {
    let mut h = Harness::new(gate(json!({"phase": "both"})));
    h.tick();
    let before = h.only_active();
    let out = h.decide(vec![approve(&before)]);
    assert_eq!(out.status, TickStatus::Running);
    assert_eq!(h.bb("deployed"), json!(true));
    let after = h.only_active();
    assert_ne!(before, after);
    assert_eq!(h.decide(vec![approve(&after)]).status, TickStatus::Success);
}

#[test]
fn a_restore_after_the_before_phase_never_asks_again() {
    let mut h = Harness::new(json!({"type": "approval", "name": "g", "phase": "both",
        "child": {"type": "wait", "ms": 1000}}));
    h.tick();
    let before = h.only_active();
    let out = h.decide(vec![approve(&before)]);
    assert_eq!(out.status, TickStatus::Running);
    assert_eq!(out.next_wake_ms, Some(T0 + 1000));
    h.restore();
    h.now += 1000;
    let out = h.tick();
    let asked = suspended(&out.effects);
    assert_eq!(asked.len(), 1);
    assert_eq!(
        asked[0].approval.as_ref().unwrap().phase,
        ApprovalPhase::After
    );
    assert_eq!(h.ck.suspensions().count(), 2);
}

#[test]
fn the_progress_record_uses_the_gate_key() {
    let mut h = Harness::new(gate(json!({})));
    h.tick();
    assert!(
        h.ck.interaction
            .progress
            .contains_key("node:approve-deploy:approve-deploy")
    );
    let rid = h.only_active();
    h.decide(vec![approve(&rid)]);
    assert!(h.ck.interaction.progress.is_empty());
}

#[test]
fn decisions_are_idempotent_and_stale_ones_are_discarded() {
    let mut h = Harness::new(gate(json!({})));
    h.tick();
    let rid = h.only_active();
    let out = h.decide(vec![approve(&rid), approve(&rid)]);
    assert_eq!(out.status, TickStatus::Success);
    let consumed = out
        .effects
        .iter()
        .filter(|e| matches!(e, Effect::Consumed { .. }))
        .count();
    assert_eq!(consumed, 1);
    // Redelivery of the consumed decision: silently ignored. Another decision: discarded.
    let out = h.decide(vec![approve(&rid), reject("unknown", "x")]);
    assert_eq!(
        out.effects,
        vec![Effect::Discarded {
            request_id: "unknown".into(),
            decision_id: "d-unknown".into()
        }]
    );
}

#[test]
fn halt_withdraws_the_pending_approval_and_finishes_the_run() {
    let mut h = Harness::new(gate(json!({})));
    h.tick();
    let rid = h.only_active();
    let effects = crate::engine::halt(&h.spec, &mut h.ck, "run cancelled");
    assert_eq!(super::harness::withdrawn(&effects), vec![rid.clone()]);
    // Halted, the gate will never ask under that id again: the run remembers it as withdrawn.
    assert!(h.ck.suspension(&rid).is_none());
    assert_eq!(h.ck.past_request(&rid).unwrap().decision_id, None);
    assert_eq!(h.ck.error(), "halted: run cancelled");
    let late = h.decide(vec![approve(&rid)]);
    assert_eq!(late.status, TickStatus::Failure);
    assert!(matches!(late.effects[..], [Effect::Discarded { .. }]));
    assert_eq!(h.bb("deployed"), json!(null));
}
