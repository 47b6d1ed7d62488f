//! Parallel (thresholds, Yield and Wait modes) and the reactive sequence.

use arbor_shared::domain::RunMode;
use serde_json::json;

use super::harness::{Harness, T0, approve, reject, suspended, withdrawn};
use crate::engine::TickStatus;

fn two_gates(threshold: Option<u64>) -> serde_json::Value {
    let mut p = json!({"type": "parallel", "name": "both", "children": [
        {"type": "approval", "name": "a", "child": {"type": "set", "key": "a", "value": 1}},
        {"type": "approval", "name": "b", "child": {"type": "set", "key": "b", "value": 1}}
    ]});
    if let Some(t) = threshold {
        p["success_threshold"] = json!(t);
    }
    p
}

#[test]
fn wait_mode_suspends_every_branch_in_one_tick() {
    let mut h = Harness::new(two_gates(None));
    h.mode = RunMode::Wait;
    let out = h.tick();
    assert_eq!(suspended(&out.effects).len(), 2);
    assert_eq!(out.next_wake_ms, None);
    let ids: Vec<String> = h.active().iter().map(|r| r.request_id.clone()).collect();
    // Each branch is resumed by its own id.
    assert_eq!(h.decide(vec![approve(&ids[0])]).status, TickStatus::Running);
    assert_eq!(h.decide(vec![approve(&ids[1])]).status, TickStatus::Success);
    assert_eq!((h.bb("a"), h.bb("b")), (json!(1), json!(1)));
}

#[test]
fn yield_mode_stops_at_the_first_suspension_and_asks_for_another_tick() {
    let mut h = Harness::new(two_gates(None));
    let out = h.tick();
    let first = suspended(&out.effects);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].node_locator, "a");
    assert_eq!(out.next_wake_ms, Some(T0));
    let out = h.tick();
    let second = suspended(&out.effects);
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].node_locator, "b");
    assert_eq!(out.next_wake_ms, None, "parked: nothing can progress");
}

#[test]
fn threshold_success_halts_the_other_branches() {
    let mut h = Harness::new(two_gates(Some(1)));
    h.mode = RunMode::Wait;
    h.tick();
    let ids: Vec<(String, String)> = h
        .active()
        .iter()
        .map(|r| (r.node_locator.clone(), r.request_id.clone()))
        .collect();
    let a = &ids.iter().find(|(l, _)| l == "a").unwrap().1;
    let b = &ids.iter().find(|(l, _)| l == "b").unwrap().1;
    let out = h.decide(vec![approve(a)]);
    assert_eq!(out.status, TickStatus::Success);
    assert_eq!(withdrawn(&out.effects), vec![b.clone()]);
    assert_eq!(h.bb("b"), json!(null));
}

#[test]
fn parallel_fails_once_the_threshold_is_out_of_reach() {
    let mut h = Harness::new(two_gates(None));
    h.mode = RunMode::Wait;
    h.tick();
    let rid = h.active()[0].request_id.clone();
    let out = h.decide(vec![reject(&rid, "no")]);
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(withdrawn(&out.effects).len(), 1);
    assert!(h.active().is_empty());
}

#[test]
fn parallel_counts_finished_children_across_ticks_and_restores() {
    let mut h = Harness::new(json!({"type": "parallel", "children": [
        {"type": "set", "key": "x", "value": 1},
        {"type": "wait", "ms": 100},
        {"type": "user_input", "input_kind": "text", "prompt": "?", "output": "answer"}
    ]}));
    h.mode = RunMode::Wait;
    assert_eq!(h.tick().next_wake_ms, Some(T0 + 100));
    h.restore();
    h.now += 100;
    assert_eq!(h.tick().status, TickStatus::Running);
    let rid = h.only_active();
    let out = h.decide(vec![crate::engine::Decision::resume(
        &rid,
        "d",
        json!({"text": "hi"}),
    )]);
    assert_eq!(out.status, TickStatus::Success);
    assert_eq!(h.bb("answer"), json!("hi"));
}

#[test]
fn reactive_sequence_halts_the_running_child_when_a_condition_flips() {
    let mut h = Harness::new(json!({"type": "reactive_sequence", "children": [
        {"type": "condition", "name": "still-wanted", "key": "wanted", "op": "truthy"},
        {"type": "approval", "name": "g", "child": {"type": "succeed"}}
    ]}))
    .input(json!({"wanted": true}));
    h.tick();
    let rid = h.only_active();
    assert!(
        h.tick().effects.is_empty(),
        "re-checks without asking again"
    );
    h.ck.blackboard.insert("wanted".into(), json!(false));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(withdrawn(&out.effects), vec![rid]);
    assert!(out.error.contains("still-wanted"), "{}", out.error);
}

#[test]
fn reactive_sequence_halts_a_later_child_when_an_earlier_one_runs_again() {
    let mut h = Harness::new(json!({"type": "reactive_sequence", "children": [
        {"type": "selector", "children": [
            {"type": "condition", "key": "ready", "op": "truthy"},
            {"type": "user_input", "name": "ask-ready", "input_kind": "json", "prompt": "ready?"}
        ]},
        {"type": "approval", "name": "g", "child": {"type": "succeed"}}
    ]}))
    .input(json!({"ready": true}));
    h.tick();
    let gate = h.only_active();
    h.ck.blackboard.insert("ready".into(), json!(false));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Running);
    assert_eq!(withdrawn(&out.effects), vec![gate]);
    assert_eq!(h.active()[0].node_locator, "ask-ready");
}
