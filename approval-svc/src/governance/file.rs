//! The `[[approval]]` rules of the policy file: parsing and validation. Every mistake names the
//! rule, its line and, for a value out of a set, the accepted values.

use globset::{Glob, GlobMatcher};
use serde::Deserialize;
use serde_json::Value as Json;
use toml::Spanned;

use super::{ApprovalRule, OnReject, OnTimeout, Op, Required, Rules, StageSpec, When};

/// One `[[approval]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    name: Option<String>,
    tool: Option<String>,
    tree: Option<String>,
    node: Option<String>,
    #[serde(default)]
    when: Vec<WhenFile>,
    #[serde(default)]
    editor_counts: bool,
    #[serde(default, rename = "stage")]
    stages: Vec<StageFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WhenFile {
    arg: String,
    gt: Option<toml::Value>,
    gte: Option<toml::Value>,
    lt: Option<toml::Value>,
    lte: Option<toml::Value>,
    eq: Option<toml::Value>,
    ne: Option<toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StageFile {
    name: Option<String>,
    approvers: Vec<String>,
    #[serde(default)]
    exclude: Vec<String>,
    #[serde(default = "one")]
    required: RequiredFile,
    #[serde(default)]
    per_group: u32,
    #[serde(default = "veto")]
    on_reject: OnRejectFile,
    deadline: Option<String>,
    #[serde(default = "reject")]
    on_timeout: OnTimeoutFile,
    #[serde(default)]
    escalate_to: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RequiredFile {
    Count(i64),
    Text(String),
}

fn one() -> RequiredFile {
    RequiredFile::Count(1)
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum OnRejectFile {
    Veto,
    Count,
}

fn veto() -> OnRejectFile {
    OnRejectFile::Veto
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum OnTimeoutFile {
    Reject,
    Approve,
    Escalate,
    Remind,
}

fn reject() -> OnTimeoutFile {
    OnTimeoutFile::Reject
}

const REFERENCE_KINDS: &str = "user:NAME, group:NAME or role:NAME";

/// The line (from 1) of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

fn glob(pattern: &Option<String>, at: &str) -> Result<Option<GlobMatcher>, String> {
    pattern
        .as_ref()
        .map(|p| {
            Glob::new(p)
                .map(|g| g.compile_matcher())
                .map_err(|e| format!("{at}: bad glob {p:?}: {e}"))
        })
        .transpose()
}

fn check_refs(refs: &[String], what: &str, at: &str) -> Result<(), String> {
    for r in refs {
        let ok = match r.split_once(':') {
            Some(("user" | "group", name)) => arbor_shared::auth::valid_name(name),
            Some(("role", name)) => arbor_shared::auth::Role::parse(name).is_some(),
            _ => false,
        };
        if !ok {
            return Err(format!(
                "{at}: {what} {r:?} is not a reference (accepted: {REFERENCE_KINDS}; roles: \
                 submitter, approver, operator, service, worker, reader)"
            ));
        }
    }
    Ok(())
}

fn when(w: WhenFile, at: &str) -> Result<When, String> {
    let ops = [
        (Op::Gt, w.gt),
        (Op::Gte, w.gte),
        (Op::Lt, w.lt),
        (Op::Lte, w.lte),
        (Op::Eq, w.eq),
        (Op::Ne, w.ne),
    ];
    let mut given = ops.into_iter().filter_map(|(op, v)| Some((op, v?)));
    let (Some((op, value)), None) = (given.next(), given.next()) else {
        return Err(format!(
            "{at}: a `when` needs exactly one of gt, gte, lt, lte, eq, ne"
        ));
    };
    if !w.arg.starts_with('/') {
        return Err(format!(
            "{at}: when.arg {:?} must be a JSON pointer such as \"/amount\"",
            w.arg
        ));
    }
    let value: Json = serde_json::to_value(&value).map_err(|e| format!("{at}: {e}"))?;
    if !matches!(op, Op::Eq | Op::Ne) && !value.is_number() {
        return Err(format!("{at}: gt, gte, lt and lte compare numbers"));
    }
    Ok(When {
        arg: w.arg,
        op,
        value,
    })
}

fn stage(s: StageFile, index: usize, at: &str) -> Result<StageSpec, String> {
    let name = s.name.unwrap_or_else(|| format!("stage {}", index + 1));
    let at = format!("{at} stage '{name}'");
    if s.approvers.is_empty() {
        return Err(format!(
            "{at}: approvers must name at least one reference ({REFERENCE_KINDS})"
        ));
    }
    check_refs(&s.approvers, "approver", &at)?;
    check_refs(&s.exclude, "exclude", &at)?;
    check_refs(&s.escalate_to, "escalate_to", &at)?;
    let bad_required = || {
        format!(
            "{at}: required must be a number of approvals (1 or more), \"all\" or a percentage such as \"50%\""
        )
    };
    let required = match s.required {
        RequiredFile::Count(n) if n >= 1 && n <= i64::from(u32::MAX) => Required::Count(n as u32),
        RequiredFile::Text(t) if t == "all" => Required::All,
        RequiredFile::Text(t) => match t.strip_suffix('%').map(str::parse::<u32>) {
            Some(Ok(p)) if (1..=100).contains(&p) => Required::Percent(p),
            _ => return Err(bad_required()),
        },
        RequiredFile::Count(_) => return Err(bad_required()),
    };
    if s.per_group > 0 && !s.approvers.iter().any(|r| r.starts_with("group:")) {
        return Err(format!(
            "{at}: per_group needs at least one group: approver"
        ));
    }
    let deadline_ms = match &s.deadline {
        None => 0,
        Some(d) => humantime::parse_duration(d)
            .map_err(|e| format!("{at}: deadline {d:?} is not a duration such as \"30m\": {e}"))?
            .as_millis()
            .max(1) as u64,
    };
    let on_timeout = match s.on_timeout {
        OnTimeoutFile::Reject => OnTimeout::Reject,
        OnTimeoutFile::Approve => OnTimeout::Approve,
        OnTimeoutFile::Escalate => OnTimeout::Escalate,
        OnTimeoutFile::Remind => OnTimeout::Remind,
    };
    if deadline_ms == 0 && on_timeout != OnTimeout::Reject {
        return Err(format!("{at}: on_timeout needs a deadline"));
    }
    Ok(StageSpec {
        name,
        approvers: s.approvers,
        exclude: s.exclude,
        required,
        per_group: s.per_group,
        on_reject: match s.on_reject {
            OnRejectFile::Veto => OnReject::Veto,
            OnRejectFile::Count => OnReject::Count,
        },
        deadline_ms,
        on_timeout,
        escalate_to: s.escalate_to,
    })
}

/// The approval rules of the policy file `text`, whose `[[approval]]` tables are `rules`.
pub fn parse_rules(text: &str, rules: Vec<Spanned<RuleFile>>) -> Result<Rules, String> {
    let mut out: Vec<ApprovalRule> = Vec::new();
    for (i, spanned) in rules.into_iter().enumerate() {
        let line = line_of(text, spanned.span().start);
        let r = spanned.into_inner();
        let at = format!("approval[{i}] (line {line})");
        let name = r.name.clone().unwrap_or_else(|| format!("approval[{i}]"));
        if out.iter().any(|o| o.name == name) {
            return Err(format!("{at}: two approval rules are named {name:?}"));
        }
        if r.stages.is_empty() {
            return Err(format!(
                "{at}: an approval rule needs at least one [[approval.stage]]"
            ));
        }
        let stages = r
            .stages
            .into_iter()
            .enumerate()
            .map(|(j, s)| stage(s, j, &at))
            .collect::<Result<Vec<_>, _>>()?;
        let when = r
            .when
            .into_iter()
            .map(|w| when(w, &at))
            .collect::<Result<Vec<_>, _>>()?;
        out.push(ApprovalRule {
            tool: glob(&r.tool, &at)?,
            tree: glob(&r.tree, &at)?,
            node: glob(&r.node, &at)?,
            name,
            when,
            editor_counts: r.editor_counts,
            stages,
        });
    }
    Ok(Rules(out))
}
