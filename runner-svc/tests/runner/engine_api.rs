//! The demo tree of DESIGN §1a driven through the engine's public API only, the way the runner
//! drives it: tick, persist, publish effects, validate decisions, restore from bytes. (The root is
//! named `release` here: in DESIGN it shares the name `deploy` with the tool node, which the
//! unique-name rule of DESIGN §2 refuses.)

use arbor_runner_svc::engine::{
    Checkpoint, Decision, Effect, GuardConfig, LedgerTool, NodeStatus, TickEnv, TickStatus,
    ToolRegistry, TreeFormat, halt, parse_tree, tick, validate_decision,
};
use arbor_shared::domain::{
    ApprovalKind, ApprovalPhase, RunMode, SuspensionCategory, SuspensionState,
};
use serde_json::{Map, json};

const DEMO: &str = r#"{
  "id": "deploy-service", "version": 1,
  "root": {"type": "sequence", "name": "release", "children": [
    {"type": "set", "name": "plan", "key": "plan", "value": {"service": "billing", "replicas": 3}},
    {"type": "approval", "name": "approve-deploy", "phase": "before", "on_reject": "failure",
     "title": "Deploy billing with 3 replicas?", "context": ["plan"],
     "child": {"type": "tool", "name": "deploy", "tool": "ledger.append",
               "args": {"entry": {"$ref": "plan"}}, "output": "deploy_receipt"}},
    {"type": "user_input", "name": "release-notes", "input_kind": "text",
     "prompt": "Release notes?", "schema": {"type": "string", "minLength": 1}, "output": "notes"}
  ]}
}"#;

fn env<'a>(tools: &'a ToolRegistry, now_ms: u64) -> TickEnv<'a> {
    TickEnv {
        run_id: "run-1",
        thread_id: "thread-1",
        tree_id: "deploy-service",
        tree_version: 1,
        submitted_by: "alice",
        now_ms,
        mode: RunMode::Yield,
        tools,
    }
}

#[test]
fn the_design_demo_tree_as_written_is_refused_for_its_duplicate_name() {
    let as_written = DEMO.replace(r#""name": "release""#, r#""name": "deploy""#);
    let errors = parse_tree(&as_written, TreeFormat::Json).unwrap_err();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].field, "$.root.children[1].child.name");
}

#[test]
fn the_demo_tree_runs_to_completion_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let store = arbor_runner_svc::store::Store::open(dir.path(), 1 << 20).unwrap();
    let ledger = LedgerTool::new(store).unwrap();
    let tools = ToolRegistry::with_builtins(ledger.clone(), GuardConfig::default());
    let spec = parse_tree(DEMO, TreeFormat::Json).unwrap();
    assert_eq!(spec.node_count(), 5);

    // Start: the gate asks, with everything a person needs.
    let mut ck = Checkpoint::new(&spec, "thread-1", Map::new());
    let out = tick(&spec, &mut ck, vec![], &env(&tools, 1_000));
    assert_eq!(out.status, TickStatus::Running);
    let [Effect::Suspended { record }] = &out.effects[..] else {
        panic!("expected one suspension: {:?}", out.effects)
    };
    let request = record.approval.as_ref().unwrap();
    assert_eq!(request.kind, ApprovalKind::Node);
    assert_eq!(request.phase, ApprovalPhase::Before);
    assert_eq!(request.node_locator, "approve-deploy");
    assert_eq!(request.title, "Deploy billing with 3 replicas?");
    assert_eq!(
        request.context["plan"],
        json!({"service": "billing", "replicas": 3})
    );
    let gate_id = record.request_id.clone();
    let mut bytes = ck.encode();

    // A restart: the restored run re-finds its suspension and announces nothing again.
    let mut ck = Checkpoint::decode(&bytes).unwrap();
    ck.check_matches(&spec).unwrap();
    assert_eq!(
        ck.suspension(&gate_id).unwrap().state,
        SuspensionState::Active
    );
    let out = tick(&spec, &mut ck, vec![], &env(&tools, 2_000));
    assert!(out.effects.is_empty());

    // The approval arrives; the deploy runs once and the run asks for release notes.
    let approve = validate_decision(
        ck.suspension(&gate_id).unwrap(),
        Decision::resume(&gate_id, "dec-1", json!(null)),
    )
    .unwrap();
    let out = tick(&spec, &mut ck, vec![approve], &env(&tools, 3_000));
    assert_eq!(out.status, TickStatus::Running);
    assert!(
        matches!(&out.effects[0], Effect::Consumed { decision_id, .. } if decision_id == "dec-1")
    );
    let Effect::Suspended { record: notes } = &out.effects[1] else {
        panic!("expected the input request: {:?}", out.effects)
    };
    assert_eq!(notes.category, SuspensionCategory::RequireUserInput);
    assert_eq!(ledger.count(), 1);
    assert_eq!(
        ck.blackboard()["deploy_receipt"]["entry"]["replicas"],
        json!(3)
    );
    bytes = ck.encode();

    // An empty answer breaks the schema and is refused before it reaches the tree.
    let mut ck = Checkpoint::decode(&bytes).unwrap();
    let record = ck.suspension(&notes.request_id).unwrap().clone();
    let err = validate_decision(
        &record,
        Decision::resume(&record.request_id, "dec-2", json!({"text": ""})),
    )
    .unwrap_err();
    assert_eq!(err.field, "result.value");
    let answer = validate_decision(
        &record,
        Decision::resume(
            &record.request_id,
            "dec-2",
            json!({"text": "Faster invoices"}),
        ),
    )
    .unwrap();
    let out = tick(&spec, &mut ck, vec![answer], &env(&tools, 4_000));
    assert_eq!(out.status, TickStatus::Success);
    assert_eq!(ck.root_status(), NodeStatus::Success);
    assert_eq!(ck.blackboard()["notes"], json!("Faster invoices"));
    assert_eq!(ledger.count(), 1);
    let consumed: Vec<(&str, &str)> = ck.consumed_decisions().collect();
    assert_eq!(consumed.len(), 2);
}

#[test]
fn cancelling_a_run_withdraws_its_pending_approval() {
    let dir = tempfile::tempdir().unwrap();
    let store = arbor_runner_svc::store::Store::open(dir.path(), 1 << 20).unwrap();
    let ledger = LedgerTool::new(store).unwrap();
    let tools = ToolRegistry::with_builtins(ledger.clone(), GuardConfig::default());
    let spec = parse_tree(DEMO, TreeFormat::Json).unwrap();
    let mut ck = Checkpoint::new(&spec, "thread-1", Map::new());
    tick(&spec, &mut ck, vec![], &env(&tools, 1_000));
    let effects = halt(&spec, &mut ck, "cancelled by alice");
    let [Effect::Withdrawn { reason, .. }] = &effects[..] else {
        panic!("expected one withdrawal: {effects:?}")
    };
    assert_eq!(reason, "cancelled by alice");
    assert_eq!(ck.root_status(), NodeStatus::Failure);
    assert_eq!(ledger.count(), 0);
}
