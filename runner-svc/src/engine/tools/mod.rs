//! Tools a tree can call: the `Tool` trait, the registry with its guard configuration, and the
//! built-ins (`echo`, `math.add`, `ledger.append`).

mod builtins;
mod guard;
mod ledger;

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value as Json;

pub use builtins::{Echo, MathAdd};
pub use guard::{GuardConfig, GuardRule, Policy, RateLimit};
pub use ledger::LedgerTool;

pub(crate) use guard::Guards;

/// One call of a tool, as the tool sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub tool: String,
    pub args: Json,
    pub run_id: String,
    /// `{locator}#{attempt}`: the same for a replay of the same call.
    pub tool_call_id: String,
    /// `{run_id}:{tool_call_id}`: a tool with side effects must apply them at most once per key.
    pub idempotency_key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    #[error("invalid arguments: {0}")]
    InvalidArgs(String),
    #[error("storage failed: {0}")]
    Storage(String),
    #[error("{0}")]
    Failed(String),
}

pub trait Tool: Send + Sync {
    fn name(&self) -> &str;
    fn call(&self, call: &ToolCall) -> Result<Json, ToolError>;
}

/// The tools of a runner process and the guards every call passes.
pub struct ToolRegistry {
    tools: HashMap<String, Arc<dyn Tool>>,
    /// Tools served by task workers (the runner's configured task types).
    remote: std::collections::BTreeSet<String>,
    guards: Guards,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.tools.keys().collect();
        names.sort();
        f.debug_struct("ToolRegistry")
            .field("tools", &names)
            .field("remote", &self.remote)
            .field("guards", &self.guards.config())
            .finish()
    }
}

impl ToolRegistry {
    /// An empty registry. Guard rules whose glob does not compile deny every tool (fail closed);
    /// `GuardConfig::validate` reports them up front.
    pub fn new(guards: GuardConfig) -> Self {
        Self {
            tools: HashMap::new(),
            remote: Default::default(),
            guards: Guards::new(guards),
        }
    }

    /// `echo`, `math.add` and `ledger.append`.
    pub fn with_builtins(ledger: LedgerTool, guards: GuardConfig) -> Self {
        let mut registry = Self::new(guards);
        registry.register(Echo);
        registry.register(MathAdd);
        registry.register(ledger);
        registry
    }

    /// Adds a tool, replacing one of the same name.
    pub fn register(&mut self, tool: impl Tool + 'static) {
        self.tools.insert(tool.name().to_string(), Arc::new(tool));
    }

    /// Declares a tool that task workers serve; a built-in of the same name stays built in.
    pub fn declare_remote(&mut self, name: impl Into<String>) {
        self.remote.insert(name.into());
    }

    /// Whether task workers serve `name` (configured here; a tree may declare more).
    pub fn is_remote(&self, name: &str) -> bool {
        !self.tools.contains_key(name) && self.remote.contains(name)
    }

    pub fn get(&self, name: &str) -> Option<&dyn Tool> {
        self.tools.get(name).map(|t| t.as_ref())
    }

    /// Built-in and remote tools.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tools.keys().map(String::as_str).collect();
        names.extend(self.remote.iter().map(String::as_str));
        names.sort_unstable();
        names.dedup();
        names
    }

    pub(crate) fn guards(&self) -> &Guards {
        &self.guards
    }
}
