//! What the fuzz targets share: the real trees whose checkpoints seed the corpus, a tool registry
//! over a throwaway ledger, and the checks each target makes on one input.

use std::sync::OnceLock;

use arbor_runner_svc::engine::{
    self, Checkpoint, Decision, GuardConfig, LedgerTool, TickEnv, ToolRegistry, TreeFormat,
    TreeSpec, parse_tree, validate_decision,
};
use arbor_runner_svc::store::Store;
use arbor_shared::domain::{RunMode, SuspensionCategory, SuspensionState};
use serde_json::{Value as Json, json};

/// Documents of the trees the checkpoint corpus was made from: the demo tree and the chaos
/// suite's workload trees.
pub const TREES: [&str; 3] = [
    include_str!("../../../deploy/demo/deploy-service.json"),
    include_str!("../../../tests/trees/chaos-flow.json"),
    include_str!("../../../tests/trees/chaos-skip.json"),
];

/// The parsed `TREES`. They are known-good documents, so a parse failure is a bug worth a crash.
pub fn specs() -> &'static [TreeSpec] {
    static SPECS: OnceLock<Vec<TreeSpec>> = OnceLock::new();
    SPECS.get_or_init(|| {
        TREES
            .iter()
            .map(|doc| match parse_tree(doc, TreeFormat::Json) {
                Ok(spec) => spec,
                Err(v) => panic!("a corpus tree no longer validates: {v:?}"),
            })
            .collect()
    })
}

/// Builtin tools over a ledger in a scratch store (one per process: a fuzz loop must not open a
/// database per input).
pub fn tools() -> &'static ToolRegistry {
    static TOOLS: OnceLock<ToolRegistry> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("arbor-fuzz-ledger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ledger = Store::open(&dir, 1 << 20)
            .map_err(|e| e.to_string())
            .and_then(|store| LedgerTool::new(store).map_err(|e| e.to_string()));
        match ledger {
            Ok(ledger) => ToolRegistry::with_builtins(ledger, GuardConfig::default()),
            Err(e) => panic!("cannot open a scratch ledger: {e}"),
        }
    })
}

pub const RUN_ID: &str = "fuzz-run";
pub const THREAD_ID: &str = "fuzz-thread";
pub const T0: u64 = 1_700_000_000_000;

pub fn env<'a>(spec: &'a TreeSpec, now_ms: u64) -> TickEnv<'a> {
    TickEnv {
        run_id: RUN_ID,
        thread_id: THREAD_ID,
        tree_id: spec.id(),
        tree_version: spec.version(),
        submitted_by: "fuzz",
        now_ms,
        mode: RunMode::Yield,
        tools: tools(),
    }
}

/// The decision a cooperative client would send for an active suspension: approve (with edited
/// args for tool approvals), a text for user input, a success for external work.
pub fn answer(record: &engine::SuspensionRecord, decision_id: &str) -> Decision {
    let result = match record.category {
        SuspensionCategory::RequireApproval => {
            if record.payload.get("kind").and_then(Json::as_str) == Some("tool") {
                json!({"entry": {"edited": true}})
            } else {
                Json::Null
            }
        }
        SuspensionCategory::RequireUserInput => json!({"text": "fuzz"}),
        SuspensionCategory::RequireExternalExecution => {
            json!({"status": "succeeded", "result": {"ok": true}})
        }
    };
    Decision::resume(&record.request_id, decision_id, result)
}

/// Everything the runner does with stored checkpoint bytes, none of which may panic: decode, and
/// when the bytes decode into a checkpoint of a known tree, validate decisions against it, tick
/// it with them and halt it. A decoded checkpoint must also survive an encode/decode round trip
/// unchanged.
pub fn exercise_checkpoint(bytes: &[u8]) {
    let Ok(ck) = Checkpoint::decode(bytes) else {
        return;
    };
    let again = Checkpoint::decode(&ck.encode());
    assert_eq!(
        again.as_ref(),
        Ok(&ck),
        "encode/decode round trip changed the checkpoint"
    );
    for spec in specs() {
        if ck.check_matches(spec).is_err() {
            continue;
        }
        let decisions: Vec<Decision> = ck
            .suspensions()
            .filter(|s| s.state == SuspensionState::Active)
            .enumerate()
            .filter_map(|(i, s)| validate_decision(s, answer(s, &format!("d{i}"))).ok())
            .collect();
        let mut ticked = ck.clone();
        let _ = engine::tick(spec, &mut ticked, decisions, &env(spec, T0));
        let _ = ticked.encode();
        let mut halted = ck.clone();
        let _ = engine::halt(spec, &mut halted, "fuzz");
    }
}

/// The `tree_parse` input: the first byte picks the format (even: JSON, odd: YAML) so one corpus
/// serves both parsers, the rest is the document. Inputs that are not UTF-8 are skipped.
pub fn exercise_tree_input(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let format = if selector & 1 == 0 {
        TreeFormat::Json
    } else {
        TreeFormat::Yaml
    };
    exercise_tree(text, format);
}

/// Parses a tree document; a document that validates must print canonical JSON that parses
/// again into the same tree.
pub fn exercise_tree(document: &str, format: TreeFormat) {
    let Ok(spec) = parse_tree(document, format) else {
        return;
    };
    let canonical = spec.canonical_json();
    match parse_tree(&canonical, TreeFormat::Json) {
        Ok(again) => assert_eq!(again, spec, "canonical JSON parsed into another tree"),
        Err(v) => panic!("canonical JSON of a valid tree does not validate: {v:?}"),
    }
    // A valid tree must also give a fresh checkpoint that fits it and survives a round trip.
    let ck = Checkpoint::new(&spec, THREAD_ID, Default::default());
    assert_eq!(ck.check_matches(&spec), Ok(()));
    assert_eq!(Checkpoint::decode(&ck.encode()).as_ref(), Ok(&ck));
}
