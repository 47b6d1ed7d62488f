//! Decorators (inverter, force_*, retry, repeat, timeout) and the durable `wait` leaf.

use serde_json::json;

use super::harness::{Harness, T0, approve, reject, suspended, withdrawn};
use crate::engine::{Effect, TickStatus};

#[test]
fn inverter_and_force_decorators_map_outcomes() {
    let cases = [
        (
            json!({"type": "inverter", "child": {"type": "fail"}}),
            TickStatus::Success,
        ),
        (
            json!({"type": "inverter", "name": "inv", "child": {"type": "succeed"}}),
            TickStatus::Failure,
        ),
        (
            json!({"type": "force_success", "child": {"type": "fail"}}),
            TickStatus::Success,
        ),
        (
            json!({"type": "force_failure", "child": {"type": "succeed"}}),
            TickStatus::Failure,
        ),
    ];
    for (node, want) in cases {
        assert_eq!(Harness::new(node.clone()).tick().status, want, "{node}");
    }
    let out =
        Harness::new(json!({"type": "inverter", "name": "inv", "child": {"type": "succeed"}}))
            .tick();
    assert_eq!(out.error, "inverter 'inv': child succeeded");
}

#[test]
fn decorators_pass_running_through() {
    for ty in ["inverter", "force_success", "force_failure"] {
        let mut h = Harness::new(json!({"type": ty, "child": {"type": "wait", "ms": 10}}));
        assert_eq!(h.tick().status, TickStatus::Running, "{ty}");
    }
}

#[test]
fn retry_reenters_a_failing_child_up_to_max_attempts() {
    // The child fails until the counter reaches 3: each attempt increments it first.
    let child = json!({"type": "sequence", "children": [
        {"type": "tool", "tool": "math.add", "args": {"a": {"$ref": "n"}, "b": 1}, "output": "n"},
        {"type": "condition", "key": "n", "op": "ge", "value": 3}
    ]});
    let mut h = Harness::new(json!({"type": "retry", "max_attempts": 3, "child": child.clone()}))
        .input(json!({"n": 0}));
    assert_eq!(h.tick().status, TickStatus::Success);
    assert_eq!(h.bb("n"), json!(3));

    let mut h =
        Harness::new(json!({"type": "retry", "name": "r", "max_attempts": 2, "child": child}))
            .input(json!({"n": 0}));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(h.bb("n"), json!(2));
    assert!(
        out.error
            .starts_with("retry 'r': 2 attempts failed (last: condition"),
        "{}",
        out.error
    );
}

#[test]
fn retry_keeps_its_count_across_suspensions_and_restores() {
    let mut h = Harness::new(json!({"type": "retry", "max_attempts": 2,
        "child": {"type": "approval", "name": "g", "child": {"type": "succeed"}}}));
    h.tick();
    let first = h.only_active();
    h.decide(vec![reject(&first, "no")]);
    h.restore();
    let second = h.only_active();
    assert_ne!(first, second);
    let out = h.decide(vec![reject(&second, "still no")]);
    assert_eq!(out.status, TickStatus::Failure);
    assert!(out.error.contains("still no"), "{}", out.error);
}

#[test]
fn repeat_runs_the_child_count_times_and_stops_on_failure() {
    let add = json!({"type": "tool", "tool": "math.add", "args": {"a": {"$ref": "n"}, "b": 1}, "output": "n"});
    let mut h =
        Harness::new(json!({"type": "repeat", "count": 4, "child": add})).input(json!({"n": 0}));
    assert_eq!(h.tick().status, TickStatus::Success);
    assert_eq!(h.bb("n"), json!(4));

    let mut h = Harness::new(json!({"type": "repeat", "count": 4, "child": {"type": "sequence", "children": [
        {"type": "condition", "key": "n", "op": "lt", "value": 2},
        {"type": "tool", "tool": "math.add", "args": {"a": {"$ref": "n"}, "b": 1}, "output": "n"}
    ]}}))
    .input(json!({"n": 0}));
    assert_eq!(h.tick().status, TickStatus::Failure);
    assert_eq!(h.bb("n"), json!(2));
}

#[test]
fn repeat_with_a_waiting_child_resumes_its_count() {
    let mut h = Harness::new(json!({"type": "repeat", "count": 2, "child":
        {"type": "user_input", "input_kind": "number", "prompt": "n?", "output": "last"}}));
    h.tick();
    let a = h.only_active();
    assert_eq!(
        h.decide(vec![crate::engine::Decision::resume(
            &a,
            "d1",
            json!({"value": 1})
        )])
        .status,
        TickStatus::Running
    );
    h.restore();
    let b = h.only_active();
    assert_ne!(a, b);
    assert_eq!(
        h.decide(vec![crate::engine::Decision::resume(
            &b,
            "d2",
            json!({"value": 2})
        )])
        .status,
        TickStatus::Success
    );
    assert_eq!(h.bb("last"), json!(2));
}

#[test]
fn wait_is_a_durable_timer_that_survives_restore() {
    let mut h = Harness::new(json!({"type": "sequence", "children": [
        {"type": "wait", "ms": 5000}, {"type": "set", "key": "done", "value": true}]}));
    let out = h.tick();
    assert_eq!(
        (out.status, out.next_wake_ms),
        (TickStatus::Running, Some(T0 + 5000))
    );
    h.now += 4000;
    h.restore();
    let out = h.tick();
    assert_eq!(
        out.next_wake_ms,
        Some(T0 + 5000),
        "the deadline is absolute"
    );
    h.now = T0 + 5000;
    assert_eq!(h.tick().status, TickStatus::Success);
    assert_eq!(h.bb("done"), json!(true));
}

#[test]
fn timeout_fires_halts_the_child_and_withdraws_its_suspension() {
    let mut h = Harness::new(
        json!({"type": "timeout", "name": "limit", "ms": 1000, "child":
        {"type": "approval", "name": "g", "child": {"type": "succeed"}}}),
    );
    let out = h.tick();
    assert_eq!(out.next_wake_ms, Some(T0 + 1000));
    let rid = h.only_active();
    h.restore();
    h.now += 1000;
    // A decision racing with the deadline is discarded: the timeout wins.
    let out = h.decide(vec![approve(&rid)]);
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(out.error, "timeout 'limit' fired after 1000 ms");
    assert_eq!(withdrawn(&out.effects), vec![rid.clone()]);
    assert!(out.effects.contains(&Effect::Discarded {
        request_id: rid.clone(),
        decision_id: format!("d-{rid}")
    }));
    assert!(h.active().is_empty());
}

#[test]
fn timeout_passes_a_fast_child_through() {
    let mut h =
        Harness::new(json!({"type": "timeout", "ms": 1000, "child": {"type": "wait", "ms": 10}}));
    let out = h.tick();
    assert_eq!(out.next_wake_ms, Some(T0 + 10), "the earliest timer wins");
    h.now += 10;
    assert_eq!(h.tick().status, TickStatus::Success);
}

#[test]
fn log_emits_an_effect() {
    let mut h = Harness::new(json!({"type": "log", "name": "hello", "message": "hi"}));
    let out = h.tick();
    assert_eq!(
        out.effects,
        vec![Effect::Log {
            node_locator: "hello".into(),
            message: "hi".into()
        }]
    );
    assert!(suspended(&out.effects).is_empty());
}

#[test]
fn nested_repeats_are_bounded_by_the_work_budget() {
    let mut h = Harness::new(json!({"type": "repeat", "count": 1000000, "child":
        {"type": "repeat", "count": 1000000, "child": {"type": "succeed"}}}));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Running);
    assert_eq!(
        out.next_wake_ms,
        Some(T0),
        "asks to be ticked again at once"
    );
}
