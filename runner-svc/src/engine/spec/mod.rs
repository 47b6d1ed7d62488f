//! Tree specifications: the immutable, validated form of a tree document. Runtime state lives in
//! the checkpoint; nothing here changes while a run ticks.

mod fields;
mod kinds;
mod parse;

use arbor_shared::domain::{DecisionKind, TimeoutAction};
use arbor_shared::status::FieldViolation;
use serde_json::Value as Json;

use super::tools::Policy;

/// Deepest nesting a document may have (root is depth 1).
pub const MAX_DEPTH: usize = 64;
/// Most nodes a document may have.
pub const MAX_NODES: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeFormat {
    Json,
    Yaml,
}

/// A parsed and validated tree. Nodes are kept in pre-order, so a node's subtree is the index
/// range `index..end` and the checkpoint can index runtime state by the same number.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeSpec {
    pub(crate) id: String,
    pub(crate) version: u32,
    pub(crate) nodes: Vec<NodeSpec>,
    pub(crate) document: Json,
    /// Tools this tree expects task workers to serve (`task_types`), besides those the runner
    /// is configured with.
    pub(crate) task_types: Vec<String>,
}

impl TreeSpec {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// The document as canonical JSON: keys sorted, no insignificant whitespace.
    pub fn canonical_json(&self) -> String {
        self.document.to_string()
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Node locators in pre-order (a node's `name`, else its path; the root's path is `root`).
    pub fn locators(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|n| n.locator.as_str())
    }

    /// A violation for every `tool` node naming a tool that `known` does not have, at the
    /// node's `tool` field; the description lists the tools there are.
    pub fn unknown_tools(&self, known: &[&str]) -> Vec<FieldViolation> {
        let mut out = Vec::new();
        let mut known = known.to_vec();
        known.extend(self.task_types.iter().map(String::as_str));
        if let Some(root) = self.document.get("root") {
            unknown_tools_at(root, "$.root", &known, &mut out);
        }
        out
    }

    /// The task types the tree declares (`task_types`).
    pub fn task_types(&self) -> &[String] {
        &self.task_types
    }
}

fn unknown_tools_at(node: &Json, path: &str, known: &[&str], out: &mut Vec<FieldViolation>) {
    if node.get("type").and_then(Json::as_str) == Some("tool")
        && let Some(tool) = node.get("tool").and_then(Json::as_str)
        && !known.contains(&tool)
    {
        out.push(FieldViolation::new(
            format!("{path}.tool"),
            format!(
                "unknown tool '{tool}'; this runner has: {}",
                known.join(", ")
            ),
        ));
    }
    if let Some(child) = node.get("child") {
        unknown_tools_at(child, &format!("{path}.child"), known, out);
    }
    for (i, child) in node
        .get("children")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        unknown_tools_at(child, &format!("{path}.children[{i}]"), known, out);
    }
}

/// Parses and validates a tree document; returns every violation, each with its JSON path.
pub fn parse_tree(document: &str, format: TreeFormat) -> Result<TreeSpec, Vec<FieldViolation>> {
    let value: Json = match format {
        TreeFormat::Json => serde_json::from_str(document).map_err(|e| {
            // serde_json stops at 128 levels of JSON, which a tree of ~64 composites reaches.
            let why = if e.to_string().contains("recursion limit") {
                format!("nesting deeper than {MAX_DEPTH} nodes ({e})")
            } else {
                format!("not valid JSON: {e}")
            };
            vec![FieldViolation::new("$", why)]
        })?,
        TreeFormat::Yaml => {
            check_yaml_flow_depth(document)?;
            serde_yaml_ng::from_str(document)
                .map_err(|e| vec![FieldViolation::new("$", format!("not valid YAML: {e}"))])?
        }
    };
    parse::parse_document(value)
}

/// Deepest `[` / `{` nesting a YAML document may have: what serde_json allows a JSON document.
pub const MAX_YAML_FLOW_DEPTH: usize = 128;

/// The YAML parser re-checks every open flow level at each token, so a document of nested
/// `{a: {a: …` costs time quadratic in its depth (400 KB took 17 s of CPU) before any recursion
/// limit applies. This linear scan refuses such documents first. It counts every bracket, also
/// inside quotes and comments: that can only refuse a document with more than 128 of them
/// unclosed, while skipping quoted text would let a crafted stray quote hide the real nesting.
fn check_yaml_flow_depth(document: &str) -> Result<(), Vec<FieldViolation>> {
    let mut depth = 0usize;
    for b in document.bytes() {
        match b {
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_YAML_FLOW_DEPTH {
                    return Err(vec![FieldViolation::new(
                        "$",
                        format!("YAML nested deeper than {MAX_YAML_FLOW_DEPTH} flow levels"),
                    )]);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeSpec {
    pub name: Option<String>,
    /// `name` if the node has one, else its path (`0/2/1`; `root` for the root).
    pub locator: String,
    pub children: Vec<usize>,
    /// One past the last node of this subtree.
    pub end: usize,
    pub kind: NodeKind,
}

impl NodeSpec {
    pub fn name_or_empty(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NodeKind {
    Sequence,
    Selector,
    Parallel { success_threshold: usize },
    ReactiveSequence,
    Inverter,
    ForceSuccess,
    ForceFailure,
    Retry { max_attempts: u32 },
    Repeat { count: u32 },
    Timeout { ms: u64 },
    Approval(Box<GateSpec>),
    Condition(Box<ConditionSpec>),
    Set { key: String, value: Json },
    Wait { ms: u64 },
    Succeed,
    Fail { message: String },
    Log { message: String },
    Tool(Box<ToolSpec>),
    UserInput(Box<InputSpec>),
    External(Box<ExternalSpec>),
}

impl NodeKind {
    /// The node type as a tree document spells it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Sequence => "sequence",
            Self::Selector => "selector",
            Self::Parallel { .. } => "parallel",
            Self::ReactiveSequence => "reactive_sequence",
            Self::Inverter => "inverter",
            Self::ForceSuccess => "force_success",
            Self::ForceFailure => "force_failure",
            Self::Retry { .. } => "retry",
            Self::Repeat { .. } => "repeat",
            Self::Timeout { .. } => "timeout",
            Self::Approval(_) => "approval",
            Self::Condition(_) => "condition",
            Self::Set { .. } => "set",
            Self::Wait { .. } => "wait",
            Self::Succeed => "succeed",
            Self::Fail { .. } => "fail",
            Self::Log { .. } => "log",
            Self::Tool(_) => "tool",
            Self::UserInput(_) => "user_input",
            Self::External(_) => "external",
        }
    }

    /// Whether nodes of this kind own suspension or tool-call records.
    pub fn keeps_records(&self) -> bool {
        matches!(
            self,
            Self::Approval(_) | Self::Tool(_) | Self::UserInput(_) | Self::External(_)
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CondOp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
    Exists,
    NotExists,
    Truthy,
}

impl CondOp {
    pub const ALL: [Self; 9] = [
        Self::Eq,
        Self::Ne,
        Self::Gt,
        Self::Ge,
        Self::Lt,
        Self::Le,
        Self::Exists,
        Self::NotExists,
        Self::Truthy,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "eq" => Self::Eq,
            "ne" => Self::Ne,
            "gt" => Self::Gt,
            "ge" => Self::Ge,
            "lt" => Self::Lt,
            "le" => Self::Le,
            "exists" => Self::Exists,
            "not_exists" => Self::NotExists,
            "truthy" => Self::Truthy,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Eq => "eq",
            Self::Ne => "ne",
            Self::Gt => "gt",
            Self::Ge => "ge",
            Self::Lt => "lt",
            Self::Le => "le",
            Self::Exists => "exists",
            Self::NotExists => "not_exists",
            Self::Truthy => "truthy",
        }
    }

    pub fn needs_value(self) -> bool {
        !matches!(self, Self::Exists | Self::NotExists | Self::Truthy)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ConditionSpec {
    pub key: String,
    pub op: CondOp,
    pub value: Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnReject {
    Failure,
    SuccessSkip,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GateSpec {
    pub before: bool,
    pub after: bool,
    pub on_reject: OnReject,
    pub title: String,
    pub context: Vec<String>,
    /// Relative to the moment the request is made; 0 = no deadline.
    pub deadline_ms: u64,
    pub on_timeout: TimeoutAction,
}

/// What a rejected tool call makes of its node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ToolOnReject {
    Failure,
    /// The node succeeds without running the tool; `output` (if any) is written to the node's
    /// output key as the call's stand-in result.
    Skip {
        output: Option<Json>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolSpec {
    pub tool: String,
    pub args: Json,
    pub policy: Option<Policy>,
    /// An approver may change the arguments (EDIT).
    pub allow_edit: bool,
    /// An approver may answer in the tool's place (RESPOND): the tool never runs.
    pub allow_respond: bool,
    pub on_reject: ToolOnReject,
    pub output: Option<String>,
    /// Used when the tool is served by task workers.
    pub task: TaskOptions,
}

/// How a task of a node is tried: `attempts` in all (lease expiries and retryable failures
/// count), `backoff_ms` before the second (doubling after), and the blackboard key a business
/// error's `{code, message}` is written to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskOptions {
    pub attempts: u32,
    pub backoff_ms: u64,
    pub error_output: Option<String>,
}

impl Default for TaskOptions {
    fn default() -> Self {
        Self {
            attempts: 3,
            backoff_ms: 1000,
            error_output: None,
        }
    }
}

impl ToolSpec {
    /// The decisions this call's approval honours, in the order they are offered.
    pub fn allowed_decisions(&self) -> Vec<DecisionKind> {
        let mut kinds = vec![DecisionKind::Approve, DecisionKind::Reject];
        if self.allow_edit {
            kinds.push(DecisionKind::Edit);
        }
        if self.allow_respond {
            kinds.push(DecisionKind::Respond);
        }
        kinds
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InputKind {
    Text,
    Select,
    Number,
    Json,
}

impl InputKind {
    pub const ALL: [Self; 4] = [Self::Text, Self::Select, Self::Number, Self::Json];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Select => "select",
            Self::Number => "number",
            Self::Json => "json",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct InputSpec {
    pub input_kind: InputKind,
    pub prompt: String,
    pub schema: Option<Json>,
    pub default: Option<Json>,
    pub options: Vec<Json>,
    pub output: Option<String>,
    /// Who may answer: identities and `group:NAME`s; empty: the default rule (docs/auth.md).
    pub answerers: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ExternalSpec {
    pub execution_kind: String,
    pub task: Json,
    pub callback_hint: Option<String>,
    pub output: Option<String>,
    pub options: TaskOptions,
    /// Who may supply the result: identities and `group:NAME`s; empty: the default rule.
    pub answerers: Vec<String>,
}
