//! The fields of each node type: which are allowed, which are required, and how they are typed.

use arbor_shared::domain::TimeoutAction;
use serde_json::{Map, Value as Json};

use super::fields::{Fields, unknown_word};
use super::{
    CondOp, ConditionSpec, ExternalSpec, GateSpec, InputKind, InputSpec, MAX_NODES, NodeKind,
    OnReject, TaskOptions, ToolOnReject, ToolSpec,
};
use crate::engine::interaction::input;
use crate::engine::tools::Policy;

const MAX_COUNT: u64 = 1_000_000;
const MAX_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

pub(super) const COMPOSITES: &[&str] = &["sequence", "selector", "parallel", "reactive_sequence"];
pub(super) const DECORATORS: &[&str] = &[
    "inverter",
    "force_success",
    "force_failure",
    "retry",
    "repeat",
    "timeout",
    "approval",
];
const LEAVES: &[&str] = &[
    "condition",
    "set",
    "wait",
    "succeed",
    "fail",
    "log",
    "tool",
    "user_input",
    "external",
];

/// Dotted blackboard path: non-empty segments.
pub(super) fn valid_key(key: &str) -> bool {
    key.split('.').all(|s| !s.is_empty())
}

/// Reads the type-specific fields. `None` when the type is unknown or a field is unusable (the
/// violation is already recorded).
pub(super) fn read_kind(ty: &str, f: &mut Fields<'_>) -> Option<NodeKind> {
    let allowed: &[&str] = match ty {
        "sequence" | "selector" | "reactive_sequence" => &["children"],
        "parallel" => &["children", "success_threshold"],
        "inverter" | "force_success" | "force_failure" => &["child"],
        "retry" => &["child", "max_attempts"],
        "repeat" => &["child", "count"],
        "timeout" => &["child", "ms"],
        "approval" => &[
            "child",
            "phase",
            "on_reject",
            "title",
            "context",
            "deadline_ms",
            "on_timeout",
        ],
        "condition" => &["key", "op", "value"],
        "set" => &["key", "value"],
        "wait" => &["ms"],
        "succeed" => &[],
        "fail" | "log" => &["message"],
        "tool" => &[
            "tool",
            "args",
            "policy",
            "allow_edit",
            "allow_respond",
            "resume_mode",
            "on_reject",
            "reject_output",
            "output",
            "attempts",
            "backoff_ms",
            "error_output",
        ],
        "user_input" => &[
            "input_kind",
            "prompt",
            "schema",
            "default",
            "options",
            "output",
            "answerers",
        ],
        "external" => &[
            "execution_kind",
            "task",
            "callback_hint",
            "output",
            "answerers",
            "attempts",
            "backoff_ms",
            "error_output",
        ],
        "" => return None,
        other => {
            f.violation(
                "type",
                format!(
                    "unknown node type '{other}'; expected one of: {}",
                    [COMPOSITES, DECORATORS, LEAVES].concat().join(", ")
                ),
            );
            return None;
        }
    };
    let mut known = vec!["type", "name"];
    known.extend_from_slice(allowed);
    f.deny_unknown(&known);
    match ty {
        "sequence" => Some(NodeKind::Sequence),
        "selector" => Some(NodeKind::Selector),
        "reactive_sequence" => Some(NodeKind::ReactiveSequence),
        "parallel" => {
            let t = f.opt_uint("success_threshold", 1, MAX_NODES as u64);
            // 0 stands for "all children" until the children are counted.
            let threshold = if f.has("success_threshold") {
                usize::try_from(t?).ok()?
            } else {
                0
            };
            Some(NodeKind::Parallel {
                success_threshold: threshold,
            })
        }
        "inverter" => Some(NodeKind::Inverter),
        "force_success" => Some(NodeKind::ForceSuccess),
        "force_failure" => Some(NodeKind::ForceFailure),
        "retry" => Some(NodeKind::Retry {
            max_attempts: u32::try_from(f.uint("max_attempts", 1, MAX_COUNT)?).ok()?,
        }),
        "repeat" => Some(NodeKind::Repeat {
            count: u32::try_from(f.uint("count", 1, MAX_COUNT)?).ok()?,
        }),
        "timeout" => Some(NodeKind::Timeout {
            ms: f.uint("ms", 1, MAX_MS)?,
        }),
        "approval" => read_gate(f),
        "condition" => read_condition(f),
        "set" => {
            let key = read_key(f, "key");
            let value = f.any("value");
            if let Some(v) = &value {
                check_refs(f, "value", v);
            }
            Some(NodeKind::Set {
                key: key?,
                value: value?,
            })
        }
        "wait" => Some(NodeKind::Wait {
            ms: f.uint("ms", 1, MAX_MS)?,
        }),
        "succeed" => Some(NodeKind::Succeed),
        "fail" => Some(NodeKind::Fail {
            message: f.opt_string("message").unwrap_or_default(),
        }),
        "log" => Some(NodeKind::Log {
            message: f.string("message")?,
        }),
        "tool" => read_tool(f),
        "user_input" => read_user_input(f),
        "external" => read_external(f),
        _ => None,
    }
}

fn read_key(f: &mut Fields<'_>, field: &str) -> Option<String> {
    let key = f.string(field)?;
    if !valid_key(&key) {
        f.violation(field, "must be a dotted path with non-empty segments");
        return None;
    }
    Some(key)
}

fn read_opt_key(f: &mut Fields<'_>, field: &str) -> Option<Option<String>> {
    if !f.has(field) {
        return Some(None);
    }
    read_key(f, field).map(Some)
}

/// `{"$ref": …}` must name a dotted path.
fn check_refs(f: &mut Fields<'_>, field: &str, value: &Json) {
    match value {
        Json::Object(map) => {
            if let Some(target) = map.get("$ref") {
                let ok = map.len() == 1 && target.as_str().is_some_and(valid_key);
                if !ok {
                    f.violation(
                        field,
                        "a \"$ref\" object must hold exactly one dotted path string",
                    );
                }
                return;
            }
            for (k, v) in map {
                check_refs(f, &format!("{field}.{k}"), v);
            }
        }
        Json::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                check_refs(f, &format!("{field}[{i}]"), v);
            }
        }
        _ => {}
    }
}

fn read_condition(f: &mut Fields<'_>) -> Option<NodeKind> {
    let key = read_key(f, "key");
    let op = match f.string("op") {
        Some(op) => {
            let parsed = CondOp::parse(&op);
            if parsed.is_none() {
                let names: Vec<&str> = CondOp::ALL.iter().map(|o| o.as_str()).collect();
                f.violation("op", unknown_word(&Json::String(op), &names));
            }
            parsed
        }
        None => None,
    };
    let value = f.get("value").cloned();
    if let Some(op) = op {
        if op.needs_value() && value.is_none() {
            f.violation("value", "is required for this operator");
        }
        if !op.needs_value() && value.is_some() {
            f.violation("value", "is not used by this operator");
        }
    }
    Some(NodeKind::Condition(Box::new(ConditionSpec {
        key: key?,
        op: op?,
        value: value.unwrap_or(Json::Null),
    })))
}

fn read_gate(f: &mut Fields<'_>) -> Option<NodeKind> {
    let phase = f.opt_word(
        "phase",
        &[
            ("before", (true, false)),
            ("after", (false, true)),
            ("both", (true, true)),
        ],
    );
    let on_reject = f.opt_word(
        "on_reject",
        &[
            ("failure", OnReject::Failure),
            ("success_skip", OnReject::SuccessSkip),
        ],
    );
    let on_timeout = f.opt_word(
        "on_timeout",
        &[
            ("reject", TimeoutAction::Reject),
            ("approve", TimeoutAction::Approve),
        ],
    );
    let title = f.opt_string("title");
    let context = f.opt_string_list("context");
    for (i, key) in context.iter().enumerate() {
        if !valid_key(key) {
            f.violation(
                &format!("context[{i}]"),
                "must be a dotted path with non-empty segments",
            );
        }
    }
    let deadline_ms = f.opt_uint("deadline_ms", 0, MAX_MS);
    let bad = (f.has("phase") && phase.is_none())
        || (f.has("on_reject") && on_reject.is_none())
        || (f.has("on_timeout") && on_timeout.is_none())
        || (f.has("deadline_ms") && deadline_ms.is_none());
    if bad {
        return None;
    }
    let (before, after) = phase.unwrap_or((true, false));
    Some(NodeKind::Approval(Box::new(GateSpec {
        before,
        after,
        on_reject: on_reject.unwrap_or(OnReject::Failure),
        title: title.unwrap_or_default(),
        context,
        deadline_ms: deadline_ms.unwrap_or(0),
        on_timeout: on_timeout.unwrap_or_default(),
    })))
}

/// `resume_mode`, the older way to say what a tool approval allows: `pass_decision_to_tool`
/// allows EDIT, `use_decision_as_tool_result` allows RESPOND, `replay_tool_call` neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResumeMode {
    ReplayToolCall,
    UseDecisionAsToolResult,
    PassDecisionToTool,
}

fn read_tool(f: &mut Fields<'_>) -> Option<NodeKind> {
    let tool = f.string("tool");
    let args = f.get("args").cloned().unwrap_or(Json::Object(Map::new()));
    check_refs(f, "args", &args);
    let policy = f.opt_word(
        "policy",
        &[
            ("allow", Policy::Allow),
            ("deny", Policy::Deny),
            ("ask", Policy::Ask),
        ],
    );
    let resume_mode = f.opt_word(
        "resume_mode",
        &[
            ("replay_tool_call", ResumeMode::ReplayToolCall),
            (
                "use_decision_as_tool_result",
                ResumeMode::UseDecisionAsToolResult,
            ),
            ("pass_decision_to_tool", ResumeMode::PassDecisionToTool),
        ],
    );
    let allow_edit = f.opt_bool("allow_edit");
    let allow_respond = f.opt_bool("allow_respond");
    let implied = |mode: ResumeMode| (resume_mode == Some(mode)).then_some(true);
    let mut consistent = true;
    for (key, given, mode) in [
        ("allow_edit", allow_edit, ResumeMode::PassDecisionToTool),
        (
            "allow_respond",
            allow_respond,
            ResumeMode::UseDecisionAsToolResult,
        ),
    ] {
        if given == Some(false) && implied(mode).is_some() {
            f.violation(key, "contradicts resume_mode; give one of the two");
            consistent = false;
        }
    }
    let skip = f.opt_word("on_reject", &[("failure", false), ("skip", true)]);
    let reject_output = f.get("reject_output").cloned();
    if reject_output.is_some() && skip != Some(true) {
        f.violation("reject_output", "is only used with on_reject: skip");
    }
    if let Some(v) = &reject_output {
        check_refs(f, "reject_output", v);
    }
    let output = read_opt_key(f, "output");
    let task = read_task_options(f);
    let bad = (f.has("policy") && policy.is_none())
        || (f.has("resume_mode") && resume_mode.is_none())
        || (f.has("allow_edit") && allow_edit.is_none())
        || (f.has("allow_respond") && allow_respond.is_none())
        || (f.has("on_reject") && skip.is_none())
        || !consistent;
    if bad {
        return None;
    }
    let on_reject = if skip == Some(true) {
        ToolOnReject::Skip {
            output: reject_output,
        }
    } else {
        ToolOnReject::Failure
    };
    Some(NodeKind::Tool(Box::new(ToolSpec {
        tool: tool?,
        args,
        policy,
        allow_edit: allow_edit
            .or(implied(ResumeMode::PassDecisionToTool))
            .unwrap_or(false),
        allow_respond: allow_respond
            .or(implied(ResumeMode::UseDecisionAsToolResult))
            .unwrap_or(false),
        on_reject,
        output: output?,
        task: task?,
    })))
}

/// `attempts`, `backoff_ms` and `error_output` of a node served by task workers.
fn read_task_options(f: &mut Fields<'_>) -> Option<TaskOptions> {
    let attempts = f.opt_uint("attempts", 1, 100);
    let backoff_ms = f.opt_uint("backoff_ms", 0, 3_600_000);
    let error_output = read_opt_key(f, "error_output");
    let defaults = TaskOptions::default();
    let bad =
        (f.has("attempts") && attempts.is_none()) || (f.has("backoff_ms") && backoff_ms.is_none());
    if bad {
        return None;
    }
    Some(TaskOptions {
        attempts: attempts.map_or(defaults.attempts, |a| a as u32),
        backoff_ms: backoff_ms.unwrap_or(defaults.backoff_ms),
        error_output: error_output?,
    })
}

fn read_external(f: &mut Fields<'_>) -> Option<NodeKind> {
    let execution_kind = f.string("execution_kind");
    let task = f.any("task");
    if let Some(task) = &task {
        check_refs(f, "task", task);
    }
    let callback_hint = f.opt_string("callback_hint");
    let output = read_opt_key(f, "output");
    let options = read_task_options(f);
    let answerers = read_answerers(f);
    Some(NodeKind::External(Box::new(ExternalSpec {
        execution_kind: execution_kind?,
        task: task?,
        callback_hint,
        output: output?,
        options: options?,
        answerers,
    })))
}

fn read_user_input(f: &mut Fields<'_>) -> Option<NodeKind> {
    let input_kind = match f.string("input_kind") {
        Some(kind) => {
            let parsed = input::parse_kind(&kind);
            if parsed.is_none() {
                let names: Vec<&str> = InputKind::ALL.iter().map(|k| k.as_str()).collect();
                f.violation("input_kind", unknown_word(&Json::String(kind), &names));
            }
            parsed
        }
        None => None,
    };
    let prompt = f.string("prompt");
    let schema = f.get("schema").cloned();
    let mut schema_ok = true;
    if let Some(schema) = &schema
        && let Err(e) = input::compile_schema(schema)
    {
        f.violation("schema", e);
        schema_ok = false;
    }
    let options = match f.get("options") {
        None => Vec::new(),
        Some(Json::Array(items)) => items.clone(),
        Some(_) => {
            f.violation("options", "must be an array");
            Vec::new()
        }
    };
    if input_kind == Some(InputKind::Select) && options.is_empty() {
        f.violation("options", "a select input needs at least one option");
    }
    if input_kind.is_some_and(|k| k != InputKind::Select) && f.has("options") {
        f.violation("options", "only a select input has options");
    }
    let default = f.get("default").cloned();
    if let (Some(kind), Some(value), true) = (input_kind, &default, schema_ok)
        && let Err(e) = input::check_value(kind, &options, schema.as_ref(), value)
    {
        f.violation("default", e);
    }
    let output = read_opt_key(f, "output");
    let answerers = read_answerers(f);
    Some(NodeKind::UserInput(Box::new(InputSpec {
        input_kind: input_kind?,
        prompt: prompt?,
        schema,
        default,
        options,
        output: output?,
        answerers,
    })))
}

/// `answerers`: identities as the tokens file names them, or `group:NAME`.
fn read_answerers(f: &mut Fields<'_>) -> Vec<String> {
    let answerers = f.opt_string_list("answerers");
    for (i, who) in answerers.iter().enumerate() {
        let name = who.strip_prefix("group:").unwrap_or(who);
        if !arbor_shared::auth::valid_name(name) {
            f.violation(
                &format!("answerers[{i}]"),
                format!(
                    "{who:?} is neither an identity nor `group:NAME` (letters, digits, '-', '_' \
                     and '.')"
                ),
            );
        }
    }
    // An empty list would read as "no one may answer" to some and "the default" to others.
    if f.get("answerers")
        .and_then(Json::as_array)
        .is_some_and(Vec::is_empty)
    {
        f.violation(
            "answerers",
            "must name at least one identity or group (leave it out for the default rule)",
        );
    }
    answerers
}
