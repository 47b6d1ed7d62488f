//! Policy chain tests: each level can allow, deny or ask, earlier levels win, and requests of an
//! unknown kind are rejected whatever the rules say.

use super::*;

const FILE: &str = r#"
default = "ask"

[[request]]
name = "vip-request"
request_id = "req-vip"
action = "allow"

[[request]]
name = "frozen-run"
run_id = "run-frozen"
action = "deny"
reason = "run is frozen"

[[request]]
name = "careful-run"
run_id = "run-careful"
action = "ask"

[[tool]]
name = "read-only"
tool = "search.*"
action = "allow"

[[tool]]
name = "no-shell"
tool = "shell.*"
action = "deny"

[[tool]]
name = "ledger-ask"
tool = "ledger.*"
action = "ask"

[[node]]
name = "sandbox"
tree = "sandbox-*"
action = "allow"

[[node]]
name = "prod-gates"
tree = "deploy-*"
node = "approve-prod*"
action = "deny"

[[node]]
name = "deploy-ask"
tree = "deploy-*"
action = "ask"
"#;

fn policy() -> Policy {
    Policy::from_toml(FILE).unwrap()
}

fn tool(name: &'static str) -> Subject<'static> {
    Subject {
        request_id: "r",
        run_id: "run",
        kind: Some(ApprovalKind::Tool),
        tool_name: name,
        tree_id: "other",
        node_name: "n",
    }
}

fn node(tree: &'static str, name: &'static str) -> Subject<'static> {
    Subject {
        request_id: "r",
        run_id: "run",
        kind: Some(ApprovalKind::Node),
        tool_name: "",
        tree_id: tree,
        node_name: name,
    }
}

fn verdict(s: Subject<'_>) -> (Action, String) {
    let v = policy().evaluate(&s);
    (v.action, v.rule)
}

#[test]
fn request_level_allow_deny_ask() {
    let mut s = tool("shell.exec");
    s.request_id = "req-vip";
    assert_eq!(verdict(s), (Action::Allow, "vip-request".into()));
    let mut s = tool("search.web");
    s.run_id = "run-frozen";
    assert_eq!(verdict(s), (Action::Deny, "frozen-run".into()));
    let mut s = tool("search.web");
    s.run_id = "run-careful";
    assert_eq!(verdict(s), (Action::Ask, "careful-run".into()));
}

#[test]
fn tool_level_allow_deny_ask() {
    assert_eq!(
        verdict(tool("search.web")),
        (Action::Allow, "read-only".into())
    );
    assert_eq!(verdict(tool("shell.rm")), (Action::Deny, "no-shell".into()));
    assert_eq!(
        verdict(tool("ledger.append")),
        (Action::Ask, "ledger-ask".into())
    );
}

#[test]
fn node_level_allow_deny_ask() {
    assert_eq!(
        verdict(node("sandbox-1", "gate")),
        (Action::Allow, "sandbox".into())
    );
    assert_eq!(
        verdict(node("deploy-svc", "approve-prod-eu")),
        (Action::Deny, "prod-gates".into())
    );
    assert_eq!(
        verdict(node("deploy-svc", "approve-staging")),
        (Action::Ask, "deploy-ask".into())
    );
}

#[test]
fn earlier_levels_win() {
    // A request rule beats a tool rule that would deny.
    let mut s = tool("shell.rm");
    s.request_id = "req-vip";
    assert_eq!(verdict(s).0, Action::Allow);
    // A tool rule beats a node rule for the same approval.
    let mut s = tool("shell.rm");
    s.tree_id = "sandbox-1";
    assert_eq!(verdict(s), (Action::Deny, "no-shell".into()));
    // An `ask` match stops the chain: the node rule below it is not consulted.
    let mut s = tool("ledger.append");
    s.tree_id = "sandbox-1";
    assert_eq!(verdict(s), (Action::Ask, "ledger-ask".into()));
    // Tool rules never match node gates, even when the glob would.
    let p = Policy::from_toml("[[tool]]\ntool = '*'\naction = 'allow'").unwrap();
    assert_eq!(p.evaluate(&node("t", "n")).action, Action::Ask);
}

#[test]
fn no_match_uses_the_configured_default() {
    assert_eq!(
        verdict(node("misc", "gate")),
        (Action::Ask, DEFAULT_RULE.into())
    );
    let deny = Policy::from_toml("default = 'deny'").unwrap();
    let v = deny.evaluate(&node("misc", "gate"));
    assert_eq!(v.action, Action::Deny);
    assert_eq!(
        v.decision().unwrap().kind,
        arbor_shared::domain::DecisionKind::Reject
    );
    assert_eq!(
        Policy::default().evaluate(&tool("x")).action,
        Action::Ask,
        "without a policy file everything waits for a person"
    );
}

#[test]
fn unknown_kind_is_rejected_whatever_the_rules_say() {
    let p = Policy::from_toml("default = 'allow'\n[[request]]\nrequest_id='r'\naction='allow'")
        .unwrap();
    let mut s = node("sandbox-1", "gate");
    s.kind = None;
    let v = p.evaluate(&s);
    assert_eq!(v.action, Action::Deny);
    assert_eq!(v.rule, UNKNOWN_KIND_RULE);
    let d = v.decision().unwrap();
    assert_eq!(d.kind, arbor_shared::domain::DecisionKind::Reject);
    assert_eq!(d.source, arbor_shared::domain::DecisionSource::Policy);
}

#[test]
fn decisions_name_their_rule() {
    let v = policy().evaluate(&tool("shell.rm"));
    let d = v.decision().unwrap();
    assert_eq!(d.rule, "no-shell");
    assert_eq!(d.reason, "denied by policy rule no-shell");
    assert!(policy().evaluate(&tool("ledger.x")).decision().is_none());
}

#[test]
fn bad_files_say_where() {
    let cases = [
        ("[[request]]\naction='allow'", "request[0]"),
        (
            "[[request]]\nrun_id='a'\nrequest_id='b'\naction='allow'",
            "request[0]",
        ),
        ("[[tool]]\ntool='a[b'\naction='deny'", "tool[0]"),
        ("[[tool]]\ntool='a'\naction='maybe'", "maybe"),
        ("[[node]]\ntree='x'\naction='ask'\ncolour='red'", "colour"),
        (
            "[[tool]]\nname='x'\ntool='a'\naction='ask'\n[[node]]\nname='x'\naction='ask'",
            "named",
        ),
    ];
    for (text, needle) in cases {
        let err = Policy::from_toml(text).unwrap_err();
        assert!(err.contains(needle), "{text:?}: {err}");
    }
}

#[test]
fn unnamed_rules_are_named_by_position() {
    let p = Policy::from_toml("[[tool]]\ntool='a*'\naction='allow'").unwrap();
    assert_eq!(p.evaluate(&tool("abc")).rule, "tool[0]");
}

#[test]
fn approval_rule_mistakes_name_the_line_and_the_accepted_values() {
    let cases = [
        (
            "default = \"ask\"\n\n[[approval]]\ntool = \"pay*\"\n[[approval.stage]]\napprovers = [\"team:x\"]\n",
            &["approval[0] (line 3)", "user:NAME, group:NAME or role:NAME"][..],
        ),
        (
            "[[approval]]\n[[approval.stage]]\napprovers = [\"user:a\"]\nrequired = \"most\"\n",
            &["line 1", "\"all\" or a percentage"],
        ),
        (
            "[[approval]]\n[[approval.stage]]\napprovers = [\"user:a\"]\non_reject = \"never\"\n",
            &["line 4", "veto", "count"],
        ),
        (
            "[[approval]]\n[[approval.stage]]\napprovers = [\"user:a\"]\non_timeout = \"escalate\"\n",
            &["on_timeout needs a deadline"],
        ),
        (
            "[[approval]]\n[[approval.stage]]\napprovers = [\"role:boss\"]\n",
            &["roles: submitter, approver"],
        ),
        (
            "[[approval]]\ntool = \"x\"\n",
            &["at least one [[approval.stage]]"],
        ),
    ];
    for (text, wanted) in cases {
        let err = Policy::from_toml(text).unwrap_err();
        for w in wanted {
            assert!(err.contains(w), "{text:?}: {err:?} lacks {w:?}");
        }
    }
}
