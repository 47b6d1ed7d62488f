//! Sequences, selectors and the plain leaves (condition, set, succeed, fail).

use serde_json::json;

use super::harness::Harness;
use crate::engine::{NodeStatus, TickStatus};

#[test]
fn sequence_runs_children_in_order_and_writes_the_blackboard() {
    let mut h = Harness::new(json!({"type": "sequence", "children": [
        {"type": "set", "key": "a", "value": 1},
        {"type": "set", "key": "b.c", "value": {"x": {"$ref": "a"}}},
        {"type": "condition", "key": "b.c.x", "op": "eq", "value": 1.0},
        {"type": "succeed"}
    ]}));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Success);
    assert_eq!(out.error, "");
    assert_eq!(h.bb("b"), json!({"c": {"x": 1}}));
    assert_eq!(h.ck.root_status(), NodeStatus::Success);
    assert_eq!(h.ck.step(), 1);
}

#[test]
fn sequence_stops_at_the_first_failure_with_its_message() {
    let mut h = Harness::new(json!({"type": "sequence", "children": [
        {"type": "set", "key": "a", "value": 1},
        {"type": "fail", "message": "boom"},
        {"type": "set", "key": "never", "value": 1}
    ]}));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(out.error, "boom");
    assert_eq!(h.bb("never"), json!(null));
}

#[test]
fn selector_takes_the_first_success() {
    let mut h = Harness::new(json!({"type": "selector", "children": [
        {"type": "condition", "key": "missing", "op": "exists"},
        {"type": "set", "key": "picked", "value": "second"},
        {"type": "set", "key": "picked", "value": "third"}
    ]}));
    assert_eq!(h.tick().status, TickStatus::Success);
    assert_eq!(h.bb("picked"), json!("second"));
}

#[test]
fn selector_fails_when_every_child_fails() {
    let mut h = Harness::new(json!({"type": "selector", "name": "pick", "children": [
        {"type": "fail"}, {"type": "fail", "message": "no"}
    ]}));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(out.error, "selector 'pick': every child failed");
}

#[test]
fn conditions_cover_every_operator() {
    let cases = [
        ("n", "eq", Some(json!(3)), true),
        ("n", "ne", Some(json!(3)), false),
        ("n", "gt", Some(json!(2)), true),
        ("n", "ge", Some(json!(3)), true),
        ("n", "lt", Some(json!(3)), false),
        ("n", "le", Some(json!(3.5)), true),
        ("s", "gt", Some(json!("a")), true),
        ("s", "gt", Some(json!(1)), false),
        ("s", "exists", None, true),
        ("nope", "exists", None, false),
        ("nope", "not_exists", None, true),
        ("empty", "truthy", None, false),
        ("list.0", "truthy", None, true),
        ("nope", "eq", Some(json!(null)), true),
    ];
    for (key, op, value, expected) in cases {
        let mut node = json!({"type": "condition", "key": key, "op": op});
        if let Some(v) = value {
            node["value"] = v;
        }
        let mut h =
            Harness::new(node.clone()).input(json!({"n": 3, "s": "b", "empty": "", "list": [1]}));
        let status = h.tick().status;
        let want = if expected {
            TickStatus::Success
        } else {
            TickStatus::Failure
        };
        assert_eq!(status, want, "{node}");
    }
}

#[test]
fn condition_value_may_reference_the_blackboard() {
    let mut h =
        Harness::new(json!({"type": "condition", "key": "a", "op": "eq", "value": {"$ref": "b"}}))
            .input(json!({"a": [1, 2], "b": [1, 2]}));
    assert_eq!(h.tick().status, TickStatus::Success);
}

#[test]
fn a_missing_ref_is_a_failure_with_a_clear_error() {
    let mut h = Harness::new(json!({"type": "set", "name": "copy", "key": "x",
        "value": {"deep": [{"$ref": "plan.target"}]}}));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(out.error, "set 'copy': blackboard has no 'plan.target'");
}

#[test]
fn setting_below_a_scalar_fails() {
    let mut h =
        Harness::new(json!({"type": "set", "key": "a.b", "value": 1})).input(json!({"a": 5}));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Failure);
    assert!(out.error.contains("'a' is not an object"), "{}", out.error);
}

#[test]
fn a_finished_run_keeps_its_outcome() {
    let mut h = Harness::new(json!({"type": "fail", "message": "done"}));
    assert_eq!(h.tick().status, TickStatus::Failure);
    let again = h.tick();
    assert_eq!(again.status, TickStatus::Failure);
    assert_eq!(again.error, "done");
    assert_eq!(h.ck.error(), "done");
}
