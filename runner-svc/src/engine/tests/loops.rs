//! Loops keep checkpoints bounded: tool-call records and settled suspensions are pruned once
//! their node moved on, replays still find the in-flight call, and a pruned decision is still
//! known for what it was.

use serde_json::json;

use super::harness::{Harness, approve};
use crate::engine::{Checkpoint, Decision, Effect, PAST_KEPT, TickStatus};

/// `repeat` of `n` iterations of a `ledger.append` call and a 1 ms wait, so every tick is one
/// iteration and the run is persisted between them.
fn ledger_loop(n: u32) -> serde_json::Value {
    json!({"type": "repeat", "name": "loop", "count": n, "child": {"type": "sequence", "children": [
        {"type": "tool", "name": "append", "tool": "ledger.append",
         "args": {"entry": {"n": 1}}, "output": "receipt"},
        {"type": "wait", "ms": 1}
    ]}})
}

/// Ticks (restoring from bytes each time, as the runner does) until the run leaves running;
/// returns the checkpoint size after every tick.
fn run_to_end(h: &mut Harness, decide: impl Fn(&Harness) -> Vec<Decision>) -> Vec<usize> {
    let mut sizes = Vec::new();
    loop {
        let decisions = decide(h);
        let out = h.decide(decisions);
        sizes.push(h.ck.encode().len());
        if out.status != TickStatus::Running {
            assert_eq!(out.status, TickStatus::Success, "{}", out.error);
            return sizes;
        }
        h.restore();
        h.now += 1;
    }
}

#[test]
fn a_repeat_of_a_thousand_tool_calls_keeps_its_checkpoint_bounded() {
    let mut h = Harness::new(ledger_loop(1_000));
    let sizes = run_to_end(&mut h, |_| Vec::new());
    // Tick k ran the tool of iteration k.
    assert_eq!(sizes.len(), 1_001);
    let (tenth, last) = (sizes[10], sizes[1_000]);
    assert!(
        last <= 2 * tenth,
        "checkpoint grew from {tenth} bytes after the tenth iteration to {last} after the last"
    );
    assert!(h.ck.interaction.tool_calls.is_empty(), "the loop is done");
    // Every iteration was one call, with its own key, written once.
    let keys: std::collections::BTreeSet<String> =
        h.ledger.entries().into_iter().map(|(k, _)| k).collect();
    assert_eq!(h.ledger.count(), 1_000);
    assert_eq!(keys.len(), 1_000);
    assert!(keys.contains("run-1:append#999"));
    assert_eq!(h.ck.tool_calls_used(), 1_000);
}

#[test]
fn a_replay_finds_the_in_flight_call_and_never_reruns_a_pruned_one() {
    let mut h = Harness::new(json!({"type": "repeat", "count": 5, "child":
        {"type": "tool", "name": "append", "tool": "ledger.append", "policy": "ask",
         "args": {"entry": {"n": 1}}}}));
    h.tick();
    for _ in 0..3 {
        let rid = h.only_active();
        h.decide(vec![approve(&rid)]);
        h.restore();
    }
    // Iteration 3 waits for its approval: only its call is on record.
    let calls: Vec<&String> = h.ck.interaction.tool_calls.keys().collect();
    assert_eq!(calls, ["append#3"]);
    let committed = h.ck.encode();
    let rid = h.only_active();
    assert_eq!(h.decide(vec![approve(&rid)]).status, TickStatus::Running);
    assert_eq!(h.ledger.count(), 4);
    // A crash before that step committed: the replay finds the call and repeats it under the
    // same key, so the ledger does not write twice.
    h.ck = Checkpoint::decode(&committed).unwrap();
    h.decide(vec![approve(&rid)]);
    assert_eq!(h.ledger.count(), 4);
    let rid = h.only_active();
    assert_eq!(h.decide(vec![approve(&rid)]).status, TickStatus::Success);
    let keys: Vec<String> = h.ledger.entries().into_iter().map(|(k, _)| k).collect();
    let want: Vec<String> = (0..5).map(|i| format!("run-1:append#{i}")).collect();
    assert_eq!(keys, want);
}

#[test]
fn approvals_in_a_loop_stop_growing_once_the_past_is_full() {
    let n = PAST_KEPT as u32 + 40;
    let mut h = Harness::new(json!({"type": "repeat", "count": n, "child":
        {"type": "tool", "name": "t", "tool": "echo", "policy": "ask"}}));
    let sizes = run_to_end(&mut h, |h| {
        h.active().iter().map(|s| approve(&s.request_id)).collect()
    });
    let full = sizes[PAST_KEPT + 10];
    let last = sizes[sizes.len() - 2];
    // The call ids grow by a digit at most; nothing else does.
    assert!(
        last <= full + 8,
        "{full} bytes once full, {last} at the end"
    );
    assert_eq!(h.ck.interaction.past.len(), PAST_KEPT);
    assert!(h.ck.interaction.suspensions.is_empty());
}

#[test]
fn a_pruned_decision_is_still_known_for_what_it_was() {
    let mut h = Harness::new(json!({"type": "repeat", "count": 3, "child":
        {"type": "user_input", "name": "ask", "input_kind": "text", "prompt": "?"}}));
    h.tick();
    let first = h.only_active();
    let answer = Decision::resume(&first, "d-1", json!({"text": "a"}));
    h.decide(vec![answer.clone()]);
    let second = h.only_active();
    assert_ne!(first, second);
    assert!(
        h.ck.suspension(&first).is_none(),
        "pruned with its node's attempt"
    );
    let past = h.ck.past_request(&first).unwrap();
    assert_eq!(past.decision_id.as_deref(), Some("d-1"));
    assert!(
        h.ck.consumed_decisions()
            .any(|(r, d)| r == first && d == "d-1")
    );
    // The same decision again changes nothing; another one for it is dropped.
    let before = h.ck.clone();
    let out = h.decide(vec![answer]);
    assert!(
        out.effects
            .iter()
            .all(|e| !matches!(e, Effect::Discarded { .. }))
    );
    assert_eq!(h.only_active(), second);
    let other = Decision::resume(&first, "d-other", json!({"text": "b"}));
    let out = h.decide(vec![other]);
    assert!(
        out.effects.iter().any(
            |e| matches!(e, Effect::Discarded { decision_id, .. } if decision_id == "d-other")
        )
    );
    assert_eq!(h.ck.blackboard(), before.blackboard());
}

#[test]
fn withdrawn_requests_are_remembered_as_withdrawn() {
    let mut h = Harness::new(json!({"type": "retry", "max_attempts": 3, "child":
        {"type": "timeout", "ms": 10, "child":
            {"type": "user_input", "name": "ask", "input_kind": "text", "prompt": "?"}}}));
    h.tick();
    let first = h.only_active();
    h.now += 10;
    h.tick();
    assert_ne!(h.only_active(), first);
    assert!(h.ck.suspension(&first).is_none());
    assert_eq!(h.ck.past_request(&first).unwrap().decision_id, None);
}

#[test]
fn version_one_checkpoints_are_read_and_lose_their_old_call_records() {
    let mut h = Harness::new(ledger_loop(3));
    h.tick();
    h.restore();
    let mut ck = h.ck.clone();
    // A version 1 run kept the records of earlier iterations.
    let mut old = ck.interaction.tool_calls.get("append#1").cloned();
    assert!(old.is_none());
    old = Some(crate::engine::interaction::store::ToolCallRecord {
        node: 2,
        tool: "ledger.append".into(),
        args: json!({}),
        state: crate::engine::interaction::store::ToolCallState::Succeeded,
    });
    // The tool node's attempt is 1 (iteration 0 finished): `append#0` is the old one.
    assert_eq!(ck.nodes[2].attempt, 1);
    ck.interaction
        .tool_calls
        .insert("append#0".into(), old.clone().unwrap());
    ck.interaction
        .tool_calls
        .insert("append#1".into(), old.unwrap());
    // A version 1 body is this one without its empty past and without its outcomes.
    ck.outcomes.clear();
    let v3 = ck.encode();
    assert_eq!(v3[0], 3);
    assert_eq!(
        v3[v3.len() - 2..],
        [0, 0],
        "an empty past and no outcomes end the body"
    );
    let mut v1 = v3[..v3.len() - 2].to_vec();
    v1[0] = 1;
    let back = Checkpoint::decode(&v1).unwrap();
    let calls: Vec<&String> = back.interaction.tool_calls.keys().collect();
    assert_eq!(calls, ["append#1"]);
    assert_eq!(back.blackboard(), ck.blackboard());
    assert_eq!(back.step(), ck.step());
}
