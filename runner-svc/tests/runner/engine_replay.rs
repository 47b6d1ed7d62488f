//! Crash-replay property: a run that keeps crashing between a tick and its commit, and continues
//! from the last committed checkpoint bytes, ends exactly like an uninterrupted run — same
//! outcome, blackboard and effects — and its ledger holds each appended call exactly once.

// Helpers outside `#[test]` functions are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use arbor_runner_svc::engine::{
    Checkpoint, Decision, Effect, GuardConfig, LedgerTool, SuspensionRecord, TickEnv, TickOutput,
    TickStatus, Tool, ToolCall, ToolError, ToolRegistry, TreeFormat, TreeSpec, parse_tree, tick,
    validate_decision,
};
use arbor_shared::domain::{DecisionKind, RunMode, SuspensionCategory, SuspensionState};
use proptest::prelude::*;
use serde_json::{Map, Value as Json, json};

const T0: u64 = 1_700_000_000_000;
const MAX_STEPS: usize = 400;

/// `ledger.append` that also remembers every idempotency key it was called with (repeats too).
struct CountingLedger {
    inner: LedgerTool,
    keys: Arc<Mutex<Vec<String>>>,
}

impl Tool for CountingLedger {
    fn name(&self) -> &str {
        "ledger.append"
    }

    fn call(&self, call: &ToolCall) -> Result<Json, ToolError> {
        self.keys.lock().unwrap().push(call.idempotency_key.clone());
        self.inner.call(call)
    }
}

struct World {
    _dir: tempfile::TempDir,
    ledger: LedgerTool,
    keys: Arc<Mutex<Vec<String>>>,
    tools: ToolRegistry,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let store = arbor_runner_svc::store::Store::open(dir.path(), 1 << 20).unwrap();
    let ledger = LedgerTool::new(store).unwrap();
    let keys = Arc::new(Mutex::new(Vec::new()));
    let mut tools = ToolRegistry::new(GuardConfig::default());
    tools.register(CountingLedger {
        inner: ledger.clone(),
        keys: keys.clone(),
    });
    World {
        _dir: dir,
        ledger,
        keys,
        tools,
    }
}

fn leaf() -> impl Strategy<Value = Json> {
    prop_oneof![
        2 => (0u32..8).prop_map(|n| json!({"type": "set", "key": format!("k{n}"), "value": n})),
        1 => (0u32..8).prop_map(|n| json!({"type": "condition", "key": format!("k{n}"), "op": "exists"})),
        1 => Just(json!({"type": "succeed"})),
        1 => Just(json!({"type": "fail", "message": "scripted failure"})),
        1 => (500u64..3000).prop_map(|ms| json!({"type": "wait", "ms": ms})),
        4 => (0u32..100, any::<bool>(), 0usize..3, 0u32..4).prop_map(|(n, ask, mode, out)| {
            let modes = ["replay_tool_call", "pass_decision_to_tool", "use_decision_as_tool_result"];
            json!({"type": "tool", "tool": "ledger.append",
                "args": {"entry": {"n": n, "seed": {"$ref": "seed"}}},
                "policy": if ask { "ask" } else { "allow" }, "resume_mode": modes[mode],
                "output": format!("out{out}")})
        }),
        2 => (any::<bool>(), 0u32..4).prop_map(|(text, out)| json!({"type": "user_input",
            "input_kind": if text { "text" } else { "number" }, "prompt": "?",
            "output": format!("in{out}")})),
    ]
}

fn node() -> impl Strategy<Value = Json> {
    leaf().prop_recursive(5, 60, 4, |inner| {
        prop_oneof![
            3 => prop::collection::vec(inner.clone(), 1..5)
                .prop_map(|c| json!({"type": "sequence", "children": c})),
            2 => prop::collection::vec(inner.clone(), 1..4)
                .prop_map(|c| json!({"type": "selector", "children": c})),
            2 => (prop::collection::vec(inner.clone(), 1..4), any::<prop::sample::Index>()).prop_map(
                |(c, t)| {
                    let threshold = t.index(c.len()) + 1;
                    json!({"type": "parallel", "success_threshold": threshold, "children": c})
                }
            ),
            3 => (inner.clone(), 0usize..3, any::<bool>()).prop_map(|(c, phase, skip)| {
                let phase = ["before", "after", "both"][phase];
                json!({"type": "approval", "phase": phase,
                    "on_reject": if skip { "success_skip" } else { "failure" },
                    "context": ["seed"], "child": c})
            }),
            1 => (inner.clone(), 1u32..3)
                .prop_map(|(c, n)| json!({"type": "retry", "max_attempts": n, "child": c})),
            1 => (inner.clone(), 1u32..3)
                .prop_map(|(c, n)| json!({"type": "repeat", "count": n, "child": c})),
            1 => (inner.clone(), 1000u64..8000)
                .prop_map(|(c, ms)| json!({"type": "timeout", "ms": ms, "child": c})),
            1 => inner.clone().prop_map(|c| json!({"type": "force_success", "child": c})),
            1 => inner.prop_map(|c| json!({"type": "inverter", "child": c})),
        ]
    })
}

fn tree() -> impl Strategy<Value = TreeSpec> {
    prop::collection::vec(node(), 1..5).prop_map(|body| {
        let mut children = vec![json!({"type": "set", "key": "seed", "value": {"planned": true}})];
        children.extend(body);
        let doc = json!({"id": "replay", "version": 1,
            "root": {"type": "sequence", "children": children}});
        parse_tree(&doc.to_string(), TreeFormat::Json).expect("generated trees are valid")
    })
}

/// The scripted person: approve, reject, edit or respond, and answer inputs, chosen by the id.
fn decide(record: &SuspensionRecord) -> Decision {
    let h = u8::from_str_radix(&record.request_id[..2], 16).unwrap();
    let id = format!("dec-{}", record.request_id);
    let rid = record.request_id.as_str();
    let decision = match record.category {
        SuspensionCategory::RequireApproval => {
            // Any decision the request allows.
            let allowed = &record.approval.as_ref().unwrap().allowed_decisions;
            let kind = allowed[h as usize % allowed.len()];
            let result = match kind {
                DecisionKind::Edit => json!({"entry": {"edited": h}}),
                DecisionKind::Respond => json!({"stand_in": h}),
                DecisionKind::Approve | DecisionKind::Reject => Json::Null,
            };
            Decision::approval(rid, &id, kind, result)
        }
        SuspensionCategory::RequireUserInput => {
            if record.payload["input_kind"] == "text" {
                Decision::resume(rid, &id, json!({"text": format!("answer {h}")}))
            } else {
                Decision::resume(rid, &id, json!({"value": h}))
            }
        }
        SuspensionCategory::RequireExternalExecution => {
            Decision::resume(rid, &id, json!({"status": "succeeded", "result": h}))
        }
    };
    validate_decision(record, decision).expect("scripted decisions are valid")
}

fn active_decisions(ck: &Checkpoint) -> Vec<Decision> {
    ck.suspensions()
        .filter(|s| s.state == SuspensionState::Active)
        .map(decide)
        .collect()
}

struct Outcome {
    status: TickStatus,
    error: String,
    blackboard: Map<String, Json>,
    effects: Vec<Effect>,
    suspensions: Vec<SuspensionRecord>,
}

fn env<'a>(w: &'a World, step: usize, mode: RunMode) -> TickEnv<'a> {
    TickEnv {
        run_id: "run-7",
        thread_id: "thread-7",
        tree_id: "replay",
        tree_version: 1,
        submitted_by: "alice",
        now_ms: T0 + step as u64 * 1000,
        mode,
        tools: &w.tools,
    }
}

/// Ticks until the run finishes, feeding scripted decisions. With a crash plan, every tick starts
/// from the last committed bytes, and a planned crash first runs the tick and throws its result
/// away (its tool calls did happen: the ledger keeps them).
fn run(spec: &TreeSpec, mode: RunMode, w: &World, crashes: Option<&[bool]>) -> Outcome {
    let mut ck = Checkpoint::new(spec, "thread-7", Map::new());
    let mut committed = ck.encode();
    let mut decisions = Vec::new();
    let mut effects = Vec::new();
    for step in 0..MAX_STEPS {
        let out: TickOutput = match crashes {
            None => tick(spec, &mut ck, decisions.clone(), &env(w, step, mode)),
            Some(plan) => {
                if plan[step % plan.len()] {
                    let mut lost = Checkpoint::decode(&committed).unwrap();
                    tick(spec, &mut lost, decisions.clone(), &env(w, step, mode));
                }
                ck = Checkpoint::decode(&committed).unwrap();
                let out = tick(spec, &mut ck, decisions.clone(), &env(w, step, mode));
                committed = ck.encode();
                out
            }
        };
        effects.extend(out.effects);
        if out.status != TickStatus::Running {
            return Outcome {
                status: out.status,
                error: out.error,
                blackboard: ck.blackboard().clone(),
                effects,
                suspensions: ck.suspensions().cloned().collect(),
            };
        }
        decisions = active_decisions(&ck);
        assert!(
            !decisions.is_empty() || out.next_wake_ms.is_some(),
            "run parked with nothing to wake it"
        );
    }
    panic!("run did not finish in {MAX_STEPS} steps");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn crash_replay_matches_an_uninterrupted_run(
        spec in tree(),
        wait_mode in any::<bool>(),
        crashes in prop::collection::vec(any::<bool>(), 1..16),
    ) {
        let mode = if wait_mode { RunMode::Wait } else { RunMode::Yield };
        let plain_world = world();
        let plain = run(&spec, mode, &plain_world, None);
        let crashy_world = world();
        let crashy = run(&spec, mode, &crashy_world, Some(&crashes));

        prop_assert_eq!(plain.status, crashy.status);
        prop_assert_eq!(&plain.error, &crashy.error);
        prop_assert_eq!(&plain.blackboard, &crashy.blackboard);
        prop_assert_eq!(&plain.effects, &crashy.effects);
        prop_assert_eq!(&plain.suspensions, &crashy.suspensions);

        // Never the same suspension announced twice.
        let announced: Vec<&str> = plain.effects.iter().filter_map(|e| match e {
            Effect::Suspended { record } => Some(record.request_id.as_str()),
            _ => None,
        }).collect();
        let distinct: BTreeSet<&str> = announced.iter().copied().collect();
        prop_assert_eq!(announced.len(), distinct.len());

        // Exactly once: one ledger record per distinct call, whatever the number of attempts.
        for w in [&plain_world, &crashy_world] {
            let attempted: BTreeSet<String> = w.keys.lock().unwrap().iter().cloned().collect();
            prop_assert_eq!(w.ledger.count(), attempted.len());
        }
        prop_assert_eq!(plain_world.ledger.entries(), crashy_world.ledger.entries());
    }
}
