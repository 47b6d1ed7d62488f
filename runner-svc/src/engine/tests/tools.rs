//! Tool leaves: built-ins, the guard pipeline, every decision kind and what a node allows, and
//! exactly-once ledger writes.

use arbor_shared::domain::{ApprovalKind, DecisionKind};
use serde_json::{Value as Json, json};

use super::harness::{Harness, approve, reject, suspended};
use crate::engine::tools::{GuardRule, Policy, RateLimit};
use crate::engine::{Decision, GuardConfig, TickStatus};

fn ledger_node(extra: Json) -> Json {
    let mut node = json!({"type": "tool", "name": "append", "tool": "ledger.append",
        "args": {"entry": {"amount": {"$ref": "amount"}}}, "output": "receipt"});
    for (k, v) in extra.as_object().unwrap() {
        node[k] = v.clone();
    }
    node
}

#[test]
fn echo_and_math_add_write_their_outputs() {
    let mut h = Harness::new(json!({"type": "sequence", "children": [
        {"type": "tool", "tool": "echo", "args": {"said": {"$ref": "x"}}, "output": "echoed"},
        {"type": "tool", "tool": "math.add", "args": {"a": {"$ref": "x"}, "b": 2.5}, "output": "sum"},
        {"type": "tool", "tool": "math.add", "args": {"values": [1, 2, 3]}, "output": "ints"}
    ]}))
    .input(json!({"x": 1}));
    assert_eq!(h.tick().status, TickStatus::Success);
    assert_eq!(h.bb("echoed"), json!({"said": 1}));
    assert_eq!(h.bb("sum"), json!(3.5));
    assert_eq!(h.bb("ints"), json!(6));
}

#[test]
fn tool_errors_and_unknown_tools_fail_the_node() {
    let mut h = Harness::new(json!({"type": "tool", "name": "bad", "tool": "math.add",
        "args": {"a": "x", "b": 1}}));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(
        out.error,
        "tool 'math.add' (bad) failed: invalid arguments: operand 0 is not a number"
    );
    let mut h = Harness::new(json!({"type": "tool", "name": "n", "tool": "nope"}));
    assert_eq!(h.tick().error, "tool 'n': unknown tool 'nope'");
}

#[test]
fn ledger_append_writes_once_under_the_idempotency_key() {
    let mut h = Harness::new(ledger_node(json!({}))).input(json!({"amount": 7}));
    let before = h.ck.encode();
    assert_eq!(h.tick().status, TickStatus::Success);
    assert_eq!(h.ledger.count(), 1);
    let (key, entry) = h.ledger.entries().remove(0);
    assert_eq!(key, "run-1:append#0");
    assert_eq!(entry["entry"], json!({"amount": 7}));
    assert_eq!(h.bb("receipt"), entry);
    // A crash before the checkpoint was committed replays the same call: no second write.
    h.ck = crate::engine::Checkpoint::decode(&before).unwrap();
    assert_eq!(h.tick().status, TickStatus::Success);
    assert_eq!(h.ledger.count(), 1);
    assert_eq!(h.bb("receipt"), entry);
}

#[test]
fn deny_by_node_policy_or_glob_rule_never_runs_the_tool() {
    let mut h = Harness::new(ledger_node(json!({"policy": "deny"}))).input(json!({"amount": 1}));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(out.error, "tool 'ledger.append' (append) denied by policy");
    assert_eq!(h.ledger.count(), 0);

    let guards = GuardConfig {
        rules: vec![
            GuardRule {
                tool: "echo".into(),
                policy: Policy::Allow,
            },
            GuardRule {
                tool: "ledger.*".into(),
                policy: Policy::Deny,
            },
        ],
        ..GuardConfig::default()
    };
    let mut h =
        Harness::with_guards(ledger_node(json!({})), guards.clone()).input(json!({"amount": 1}));
    assert!(h.tick().error.ends_with("denied by policy"));
    // A node's own policy overrides the server rules.
    let mut h = Harness::with_guards(ledger_node(json!({"policy": "allow"})), guards)
        .input(json!({"amount": 1}));
    assert_eq!(h.tick().status, TickStatus::Success);
}

#[test]
fn the_budget_counts_calls_per_run() {
    let guards = GuardConfig {
        budget_per_run: Some(2),
        ..GuardConfig::default()
    };
    let mut h = Harness::with_guards(
        json!({"type": "repeat", "count": 3, "child": {"type": "tool", "tool": "echo"}}),
        guards,
    );
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Failure);
    assert!(
        out.error.contains("over budget: 2 calls per run"),
        "{}",
        out.error
    );
    assert_eq!(h.ck.tool_calls_used(), 2);
}

#[test]
fn the_rate_limit_refuses_calls_beyond_the_window() {
    let guards = GuardConfig {
        rate_limit: Some(RateLimit {
            calls: 2,
            window_ms: 1000,
        }),
        ..GuardConfig::default()
    };
    let mut h = Harness::with_guards(
        json!({"type": "repeat", "count": 3, "child": {"type": "tool", "tool": "echo"}}),
        guards,
    );
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Failure);
    assert!(out.error.ends_with("rate limited"), "{}", out.error);
}

/// A tool approval asked of `ledger.append` with `amount: 5`, and its request id.
fn asked(extra: Json) -> (Harness, crate::engine::SuspensionRecord) {
    let mut node = json!({"policy": "ask"});
    for (k, v) in extra.as_object().unwrap() {
        node[k] = v.clone();
    }
    let mut h = Harness::new(ledger_node(node)).input(json!({"amount": 5}));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Running);
    let record = suspended(&out.effects).remove(0);
    (h, record)
}

fn decide(kind: DecisionKind, rid: &str, result: Json) -> Decision {
    Decision::approval(rid, "d1", kind, result)
}

fn allowed(extra: Json) -> Vec<DecisionKind> {
    asked(extra).1.approval.unwrap().allowed_decisions
}

#[test]
fn ask_suspends_with_a_tool_approval_and_approve_runs_the_original_args() {
    let (mut h, record) = asked(json!({}));
    let req = record.approval.clone().unwrap();
    assert_eq!(req.kind, ApprovalKind::Tool);
    assert_eq!(req.tool_name, "ledger.append");
    assert_eq!(req.tool_args, json!({"entry": {"amount": 5}}));
    assert_eq!(req.tool_call_id, "append#0");
    assert_eq!(
        req.allowed_decisions,
        vec![DecisionKind::Approve, DecisionKind::Reject]
    );
    assert_eq!(
        record.payload["allowed_decisions"],
        json!(["approve", "reject"])
    );
    assert!(
        h.ck.interaction
            .progress
            .contains_key("tool:append:append#0")
    );
    assert_eq!(h.ledger.count(), 0);
    let out = h.decide(vec![decide(
        DecisionKind::Approve,
        &record.request_id,
        Json::Null,
    )]);
    assert_eq!(out.status, TickStatus::Success);
    assert_eq!(h.ledger.entries()[0].1["entry"], json!({"amount": 5}));
    assert!(h.ck.interaction.progress.is_empty());
}

#[test]
fn allowed_decisions_follow_allow_edit_allow_respond_and_resume_mode() {
    use DecisionKind::{Approve, Edit, Reject, Respond};
    assert_eq!(
        allowed(json!({"allow_edit": true})),
        [Approve, Reject, Edit]
    );
    assert_eq!(
        allowed(json!({"allow_respond": true})),
        [Approve, Reject, Respond]
    );
    assert_eq!(
        allowed(json!({"allow_edit": true, "allow_respond": true})),
        [Approve, Reject, Edit, Respond]
    );
    assert_eq!(
        allowed(json!({"resume_mode": "replay_tool_call"})),
        [Approve, Reject]
    );
    assert_eq!(
        allowed(json!({"resume_mode": "pass_decision_to_tool"})),
        [Approve, Reject, Edit]
    );
    assert_eq!(
        allowed(json!({"resume_mode": "use_decision_as_tool_result", "allow_edit": true})),
        [Approve, Reject, Edit, Respond]
    );
}

#[test]
fn ask_by_glob_rule_then_edit_runs_the_edited_args() {
    let guards = GuardConfig {
        rules: vec![GuardRule {
            tool: "ledger.*".into(),
            policy: Policy::Ask,
        }],
        ..GuardConfig::default()
    };
    let mut h = Harness::with_guards(ledger_node(json!({"allow_edit": true})), guards)
        .input(json!({"amount": 5}));
    h.tick();
    let rid = h.only_active();
    let out = h.decide(vec![decide(
        DecisionKind::Edit,
        &rid,
        json!({"entry": {"amount": 4}}),
    )]);
    assert_eq!(out.status, TickStatus::Success);
    assert_eq!(h.ledger.entries()[0].1["entry"], json!({"amount": 4}));
}

#[test]
fn respond_never_runs_the_tool_and_approve_still_does() {
    let (mut h, record) = asked(json!({"allow_respond": true}));
    let out = h.decide(vec![decide(
        DecisionKind::Respond,
        &record.request_id,
        json!({"stand_in": true}),
    )]);
    assert_eq!(out.status, TickStatus::Success);
    assert_eq!(h.bb("receipt"), json!({"stand_in": true}));
    assert_eq!(h.ledger.count(), 0);

    let (mut h, record) = asked(json!({"allow_respond": true}));
    let out = h.decide(vec![decide(
        DecisionKind::Approve,
        &record.request_id,
        Json::Null,
    )]);
    assert_eq!(out.status, TickStatus::Success);
    assert_eq!(h.ledger.entries()[0].1["entry"], json!({"amount": 5}));
}

#[test]
fn decisions_without_a_kind_apply_as_the_node_allows() {
    // Inbox records written before decisions carried their kind: a resume with a result was an
    // edit or a respond, as the node's resume mode said.
    let legacy = |rid: &str| Decision::resume(rid, "d1", json!({"entry": {"amount": 9}}));
    let (mut h, record) = asked(json!({"resume_mode": "pass_decision_to_tool"}));
    h.decide(vec![legacy(&record.request_id)]);
    assert_eq!(h.ledger.entries()[0].1["entry"], json!({"amount": 9}));
    let (mut h, record) = asked(json!({"resume_mode": "use_decision_as_tool_result"}));
    h.decide(vec![legacy(&record.request_id)]);
    assert_eq!(h.ledger.count(), 0);
    assert_eq!(h.bb("receipt"), json!({"entry": {"amount": 9}}));
    let (mut h, record) = asked(json!({}));
    h.decide(vec![legacy(&record.request_id)]);
    assert_eq!(h.ledger.entries()[0].1["entry"], json!({"amount": 5}));
}

#[test]
fn reject_never_runs_the_tool_and_on_reject_says_what_the_node_returns() {
    for extra in [
        json!({}),
        json!({"allow_edit": true}),
        json!({"allow_respond": true}),
    ] {
        let (mut h, record) = asked(extra.clone());
        let out = h.decide(vec![reject(&record.request_id, "too much")]);
        assert_eq!(out.status, TickStatus::Failure);
        assert_eq!(out.error, "tool call rejected: too much");
        assert_eq!(h.ledger.count(), 0, "{extra}");
        // The node is done with the call: its record is gone, and a new entry is a new call.
        assert!(h.ck.interaction.tool_calls.is_empty());
        assert_eq!(h.ck.nodes[0].attempt, 1);
    }
    let (mut h, record) = asked(json!({"on_reject": "skip"}));
    let out = h.decide(vec![decide(
        DecisionKind::Reject,
        &record.request_id,
        Json::Null,
    )]);
    assert_eq!(out.status, TickStatus::Success);
    assert_eq!((h.ledger.count(), h.bb("receipt")), (0, Json::Null));
    let (mut h, record) = asked(json!({"on_reject": "skip",
        "reject_output": {"skipped": true, "amount": {"$ref": "amount"}}}));
    let out = h.decide(vec![reject(&record.request_id, "no")]);
    assert_eq!(out.status, TickStatus::Success);
    assert_eq!(h.ledger.count(), 0);
    assert_eq!(h.bb("receipt"), json!({"skipped": true, "amount": 5}));
}

#[test]
fn validation_refuses_decisions_the_node_does_not_honour() {
    use crate::engine::validate_decision;
    let (_, record) = asked(json!({}));
    let rid = record.request_id.clone();
    for kind in [DecisionKind::Edit, DecisionKind::Respond] {
        let err = validate_decision(&record, decide(kind, &rid, json!({"entry": 1}))).unwrap_err();
        assert!(err.not_allowed, "{kind:?}: {err}");
        assert_eq!(err.field, "decision_kind");
    }
    // A plain resume with a result does not say whether it edits or responds.
    let err = validate_decision(&record, Decision::resume(&rid, "d", json!(1))).unwrap_err();
    assert!(!err.not_allowed);
    let err =
        validate_decision(&record, decide(DecisionKind::Approve, &rid, json!(1))).unwrap_err();
    assert_eq!(err.field, "result");
    // Older callers' plain decisions are read as approve and reject.
    let d = validate_decision(&record, Decision::resume(&rid, "d", Json::Null)).unwrap();
    assert_eq!(d.action, arbor_shared::domain::Verdict::Approve);
    let d = validate_decision(&record, reject(&rid, "no")).unwrap();
    assert_eq!(d.action, arbor_shared::domain::Verdict::Reject);

    let (_, record) = asked(json!({"allow_edit": true}));
    let err = validate_decision(
        &record,
        decide(DecisionKind::Edit, &record.request_id, Json::Null),
    )
    .unwrap_err();
    assert_eq!(err.field, "result");
    assert!(
        validate_decision(
            &record,
            decide(DecisionKind::Edit, &record.request_id, json!({}))
        )
        .is_ok()
    );
}

#[test]
fn a_retried_tool_asks_again_with_a_new_call_id() {
    let mut h = Harness::new(json!({"type": "retry", "max_attempts": 2, "child":
        {"type": "tool", "name": "t", "tool": "echo", "policy": "ask"}}));
    h.tick();
    let first = h.only_active();
    h.decide(vec![reject(&first, "no")]);
    let second = h.only_active();
    assert_ne!(first, second);
    let req = h.ck.suspension(&second).unwrap().approval.clone().unwrap();
    assert_eq!(req.tool_call_id, "t#1");
    assert_eq!(h.decide(vec![approve(&second)]).status, TickStatus::Success);
}

#[test]
fn guard_config_deserialises_and_validates_its_globs() {
    let config: GuardConfig = serde_json::from_value(json!({
        "rules": [{"tool": "ledger.*", "policy": "ask"}, {"tool": "*", "policy": "allow"}],
        "budget_per_run": 10,
        "rate_limit": {"calls": 5, "window_ms": 1000}
    }))
    .unwrap();
    assert_eq!(config.rules[0].policy, Policy::Ask);
    assert!(config.validate().is_ok());
    assert!(serde_json::from_value::<GuardConfig>(json!({"rulez": []})).is_err());

    let bad = GuardConfig {
        rules: vec![GuardRule {
            tool: "ledger.[".into(),
            policy: Policy::Allow,
        }],
        rate_limit: Some(RateLimit {
            calls: 0,
            window_ms: 10,
        }),
        ..GuardConfig::default()
    };
    let fields: Vec<String> = bad
        .validate()
        .unwrap_err()
        .into_iter()
        .map(|v| v.field)
        .collect();
    assert_eq!(fields, vec!["rules[0].tool", "rate_limit"]);
    // A rule that does not compile denies everything rather than allowing by accident.
    let mut h = Harness::with_guards(json!({"type": "tool", "tool": "echo"}), bad);
    assert!(h.tick().error.ends_with("denied by policy"));
}

#[test]
fn decisions_and_records_survive_postcard() {
    let mut h = Harness::new(ledger_node(json!({"policy": "ask"}))).input(json!({"amount": 5}));
    let out = h.tick();
    let record = suspended(&out.effects).remove(0);
    let bytes = postcard::to_stdvec(&record).unwrap();
    assert_eq!(
        postcard::from_bytes::<crate::engine::SuspensionRecord>(&bytes).unwrap(),
        record
    );
    let d = Decision::resume(
        &record.request_id,
        "d1",
        json!({"entry": {"nested": [1, null]}}),
    );
    let bytes = postcard::to_stdvec(&d).unwrap();
    assert_eq!(postcard::from_bytes::<Decision>(&bytes).unwrap(), d);
}

fn rate_limited(calls: u32) -> GuardConfig {
    GuardConfig {
        rate_limit: Some(RateLimit {
            calls,
            window_ms: 1000,
        }),
        ..GuardConfig::default()
    }
}

#[test]
fn a_retry_around_a_rate_limited_tool_waits_for_the_window_without_spending_attempts() {
    use super::harness::T0;
    use crate::engine::checkpoint::NodeData;
    let mut h = Harness::with_guards(
        json!({"type": "sequence", "children": [
            {"type": "tool", "name": "first", "tool": "ledger.append", "args": {"entry": {"n": 1}}},
            {"type": "retry", "name": "again", "max_attempts": 2, "child":
                {"type": "tool", "name": "second", "tool": "ledger.append",
                 "args": {"entry": {"n": 2}}}}
        ]}),
        rate_limited(1),
    );
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Running, "{}", out.error);
    assert_eq!(
        out.next_wake_ms,
        Some(T0 + 1000),
        "wakes when the window has room"
    );
    let logged: Vec<&str> = out
        .effects
        .iter()
        .filter_map(|e| match e {
            crate::engine::Effect::Log { message, .. } => Some(message.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(logged[0].starts_with("tool 'ledger.append' (second) rate limited: waiting"));
    assert_eq!(h.ledger.count(), 1);
    let no_attempt_spent = |h: &Harness| {
        assert_eq!(h.ck.nodes[2].data, NodeData::Counter { count: 0 });
        assert_eq!(h.ck.nodes[3].attempt, 0);
    };
    no_attempt_spent(&h);
    // Woken early (a restart, another decision): still waiting, nothing asked or said again.
    h.now = T0 + 500;
    h.restore();
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Running);
    assert_eq!(out.next_wake_ms, Some(T0 + 1000));
    assert!(out.effects.is_empty(), "{:?}", out.effects);
    no_attempt_spent(&h);
    h.now = T0 + 1000;
    assert_eq!(h.tick().status, TickStatus::Success);
    // The call that went through is the retry's first attempt.
    let keys: Vec<String> = h.ledger.entries().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["run-1:first#0", "run-1:second#0"]);
}

#[test]
fn a_rate_limited_tool_whose_failure_a_selector_handles_does_not_wait() {
    let mut h = Harness::with_guards(
        json!({"type": "retry", "max_attempts": 3, "child": {"type": "sequence", "children": [
            {"type": "tool", "tool": "echo"},
            {"type": "selector", "children": [
                {"type": "tool", "name": "limited", "tool": "echo"},
                {"type": "set", "key": "fell_back", "value": true}
            ]}
        ]}}),
        rate_limited(1),
    );
    assert_eq!(h.tick().status, TickStatus::Success);
    assert_eq!(h.bb("fell_back"), json!(true));
}

#[test]
fn a_retry_gives_up_at_once_on_a_refusal_no_wait_can_cure() {
    let budget = GuardConfig {
        budget_per_run: Some(1),
        ..GuardConfig::default()
    };
    let mut h = Harness::with_guards(
        json!({"type": "sequence", "children": [
            {"type": "tool", "name": "first", "tool": "echo"},
            {"type": "retry", "max_attempts": 5, "child": {"type": "tool", "name": "second", "tool": "echo"}}
        ]}),
        budget,
    );
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(
        out.error,
        "tool 'echo' (second) over budget: 1 calls per run"
    );
    assert_eq!(h.ck.nodes[3].attempt, 1, "tried once, not five times");

    // Nested retries give up too, with the guard's reason.
    let mut h = Harness::new(json!({"type": "retry", "max_attempts": 3, "child":
        {"type": "retry", "max_attempts": 3, "child":
            {"type": "tool", "name": "t", "tool": "echo", "policy": "deny"}}}));
    let out = h.tick();
    assert_eq!(out.status, TickStatus::Failure);
    assert_eq!(out.error, "tool 'echo' (t) denied by policy");
    assert_eq!(h.ck.nodes[2].attempt, 1);
}
