//! A run under test: a parsed spec, its checkpoint, a tool registry over a ledger in a temporary store,
//! and a movable clock.

use arbor_shared::domain::{RunMode, SuspensionState};
use serde_json::{Map, Value as Json};

use crate::engine::{
    Checkpoint, Decision, Effect, GuardConfig, LedgerTool, SuspensionRecord, TickEnv, TickOutput,
    ToolRegistry, TreeFormat, TreeSpec, parse_tree, tick,
};

pub const T0: u64 = 1_700_000_000_000;

pub struct Harness {
    pub spec: TreeSpec,
    pub ck: Checkpoint,
    pub tools: ToolRegistry,
    pub ledger: LedgerTool,
    pub now: u64,
    pub mode: RunMode,
    pub run_id: String,
    _dir: tempfile::TempDir,
}

pub fn spec(doc: &Json) -> TreeSpec {
    match parse_tree(&doc.to_string(), TreeFormat::Json) {
        Ok(spec) => spec,
        Err(violations) => panic!("invalid test tree: {violations:?}"),
    }
}

pub fn tree(root: Json) -> Json {
    serde_json::json!({"id": "t", "version": 1, "root": root})
}

impl Harness {
    pub fn new(root: Json) -> Self {
        Self::with_guards(root, GuardConfig::default())
    }

    pub fn with_guards(root: Json, guards: GuardConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path(), 1 << 20).unwrap();
        let ledger = LedgerTool::new(store).unwrap();
        let spec = spec(&tree(root));
        let ck = Checkpoint::new(&spec, "thread-1", Map::new());
        Self {
            tools: ToolRegistry::with_builtins(ledger.clone(), guards),
            spec,
            ck,
            ledger,
            now: T0,
            mode: RunMode::Yield,
            run_id: "run-1".into(),
            _dir: dir,
        }
    }

    pub fn input(mut self, input: Json) -> Self {
        self.ck = Checkpoint::new(&self.spec, "thread-1", input.as_object().unwrap().clone());
        self
    }

    pub fn env(&self) -> TickEnv<'_> {
        TickEnv {
            run_id: &self.run_id,
            thread_id: "thread-1",
            tree_id: self.spec.id(),
            tree_version: self.spec.version(),
            submitted_by: "alice",
            now_ms: self.now,
            mode: self.mode,
            tools: &self.tools,
        }
    }

    pub fn tick(&mut self) -> TickOutput {
        self.decide(Vec::new())
    }

    pub fn decide(&mut self, decisions: Vec<Decision>) -> TickOutput {
        let env = TickEnv {
            run_id: &self.run_id,
            thread_id: "thread-1",
            tree_id: self.spec.id(),
            tree_version: self.spec.version(),
            submitted_by: "alice",
            now_ms: self.now,
            mode: self.mode,
            tools: &self.tools,
        };
        tick(&self.spec, &mut self.ck, decisions, &env)
    }

    /// Encodes and decodes the checkpoint, as a restart would.
    pub fn restore(&mut self) {
        self.ck = Checkpoint::decode(&self.ck.encode()).unwrap();
    }

    pub fn active(&self) -> Vec<SuspensionRecord> {
        self.ck
            .suspensions()
            .filter(|s| s.state == SuspensionState::Active)
            .cloned()
            .collect()
    }

    /// The one active suspension's id.
    pub fn only_active(&self) -> String {
        let active = self.active();
        assert_eq!(active.len(), 1, "active suspensions: {active:?}");
        active[0].request_id.clone()
    }

    pub fn bb(&self, key: &str) -> Json {
        crate::engine::blackboard::get(self.ck.blackboard(), key)
            .cloned()
            .unwrap_or(Json::Null)
    }
}

pub fn approve(rid: &str) -> Decision {
    Decision::resume(rid, &format!("d-{rid}"), Json::Null)
}

pub fn reject(rid: &str, reason: &str) -> Decision {
    Decision::cancel(rid, &format!("d-{rid}"), reason)
}

pub fn suspended(effects: &[Effect]) -> Vec<SuspensionRecord> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Suspended { record } => Some(record.clone()),
            _ => None,
        })
        .collect()
}

pub fn withdrawn(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Withdrawn { request_id, .. } => Some(request_id.clone()),
            _ => None,
        })
        .collect()
}
