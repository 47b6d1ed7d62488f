//! Tests of the counting rules, on rules parsed from policy text as a user writes them.

use arbor_shared::{
    auth::{Directory, Principal, Role},
    domain::DecisionKind,
};
use serde_json::json;

use super::*;

fn dir() -> Directory {
    let p = |name: &str, groups: &[&str]| Principal {
        name: name.into(),
        roles: vec![Role::Approver],
        groups: groups.iter().map(|g| g.to_string()).collect(),
    };
    Directory::of([
        p("ann", &["payments"]),
        p("bob", &["payments"]),
        p("cat", &["payments", "risk"]),
        p("dan", &["payments"]),
        p("eve", &["risk"]),
        p("max", &["managers"]),
    ])
}

fn rule(stages: &str) -> ApprovalRule {
    #[derive(serde::Deserialize)]
    struct File {
        approval: Vec<toml::Spanned<crate::governance::RuleFile>>,
    }
    let text = format!("[[approval]]\nname = \"r\"\ntool = \"pay*\"\n{stages}");
    let file: File = toml::from_str(&text).unwrap();
    crate::governance::parse_rules(&text, file.approval)
        .unwrap()
        .0[0]
        .clone()
}

fn vote(g: &mut Governance, seat: &str, kind: DecisionKind) -> Tally {
    let digest = g.proposal.digest.clone();
    let stage = g.current;
    cast(
        g,
        Vote {
            seat: seat.into(),
            by: seat.into(),
            kind,
            digest,
            stage,
            at_ms: 1,
            reason: String::new(),
            stale: false,
        },
    );
    tally(g)
}

const TWO_OF_PAYMENTS: &str =
    "[[approval.stage]]\nname = \"finance\"\napprovers = [\"group:payments\"]\nrequired = 2\n";

#[test]
fn two_of_a_group_without_the_submitter() {
    let (mut g, opened) = start(&rule(TWO_OF_PAYMENTS), "d1".into(), &dir(), "ann", 0);
    opened.unwrap();
    assert_eq!(
        g.eligible,
        ["bob", "cat", "dan"],
        "the submitter is not eligible"
    );
    assert_eq!(vote(&mut g, "bob", DecisionKind::Approve), Tally::Pending);
    // A seat's second vote replaces its first: still one approval.
    assert_eq!(vote(&mut g, "bob", DecisionKind::Approve), Tally::Pending);
    assert_eq!(
        progress(&g),
        (1, vec!["cat".to_string(), "dan".to_string()])
    );
    assert_eq!(vote(&mut g, "cat", DecisionKind::Approve), Tally::Passed);
}

#[test]
fn one_reject_vetoes_by_default() {
    let (mut g, _) = start(&rule(TWO_OF_PAYMENTS), "d1".into(), &dir(), "", 0);
    vote(&mut g, "bob", DecisionKind::Approve);
    let Tally::Rejected(why) = vote(&mut g, "dan", DecisionKind::Reject) else {
        panic!("a veto decides")
    };
    assert!(why.contains("vetoed by dan"), "{why}");
}

#[test]
fn counted_rejections_decide_once_approval_is_out_of_reach() {
    let stages = format!("{TWO_OF_PAYMENTS}on_reject = \"count\"\nexclude = [\"user:ann\"]\n");
    let (mut g, _) = start(&rule(&stages), "d1".into(), &dir(), "", 0);
    assert_eq!(g.eligible, ["bob", "cat", "dan"]);
    assert_eq!(vote(&mut g, "bob", DecisionKind::Reject), Tally::Pending);
    assert!(matches!(
        vote(&mut g, "cat", DecisionKind::Reject),
        Tally::Rejected(why) if why.contains("can no longer reach 2")
    ));
}

#[test]
fn a_stage_smaller_than_its_quorum_cannot_open() {
    let stages = "[[approval.stage]]\napprovers = [\"group:risk\"]\nrequired = 3\n";
    let (_, opened) = start(&rule(stages), "d1".into(), &dir(), "", 0);
    let why = opened.unwrap_err();
    assert!(why.contains("needs 3 approvals and has 2"), "{why}");
}

#[test]
fn per_group_needs_approvals_from_each_group() {
    let stages = "[[approval.stage]]\napprovers = [\"group:payments\", \"group:risk\"]\n\
                  required = 2\nper_group = 1\n";
    let (mut g, _) = start(&rule(stages), "d1".into(), &dir(), "", 0);
    vote(&mut g, "ann", DecisionKind::Approve);
    assert_eq!(vote(&mut g, "bob", DecisionKind::Approve), Tally::Pending);
    assert_eq!(vote(&mut g, "eve", DecisionKind::Approve), Tally::Passed);
}

#[test]
fn an_edit_makes_earlier_approvals_stale_and_the_editor_does_not_count() {
    let (mut g, _) = start(&rule(TWO_OF_PAYMENTS), "d1".into(), &dir(), "", 0);
    vote(&mut g, "ann", DecisionKind::Approve);
    let proposal = Proposal {
        kind: DecisionKind::Edit,
        payload: json!({"amount": 5}),
        digest: "d2".into(),
        by: "bob".into(),
    };
    propose(&mut g, proposal, 2, "smaller");
    assert_eq!(progress(&g).0, 0, "ann's approval was of the old arguments");
    assert!(g.votes.iter().any(|v| v.seat == "ann" && v.stale));
    assert_eq!(vote(&mut g, "bob", DecisionKind::Approve), Tally::Pending);
    assert_eq!(
        progress(&g).0,
        0,
        "the editor's own approval does not count"
    );
    assert_eq!(vote(&mut g, "cat", DecisionKind::Approve), Tally::Pending);
    assert_eq!(vote(&mut g, "ann", DecisionKind::Approve), Tally::Passed);
    assert_eq!(
        g.voters(),
        ["cat", "ann"],
        "the editor's vote did not decide"
    );
}

#[test]
fn escalation_widens_a_stage_and_keeps_its_votes() {
    let stages = "[[approval.stage]]\napprovers = [\"user:bob\", \"user:cat\"]\nrequired = \"all\"\n\
                  deadline = \"1h\"\non_timeout = \"escalate\"\nescalate_to = [\"group:managers\"]\n";
    let (mut g, _) = start(&rule(stages), "d1".into(), &dir(), "", 0);
    assert_eq!(g.stage_deadline_ms, 3_600_000);
    vote(&mut g, "bob", DecisionKind::Approve);
    assert!(can_escalate(&g, ""));
    escalate(&mut g, "").unwrap();
    assert!(
        !can_escalate(&g, ""),
        "a second deadline finds nobody more to add"
    );
    assert_eq!(g.eligible, ["bob", "cat", "max"]);
    assert_eq!(
        g.required, 3,
        "\"all\" is counted again over the widened stage"
    );
    assert_eq!(vote(&mut g, "max", DecisionKind::Approve), Tally::Pending);
    assert_eq!(vote(&mut g, "cat", DecisionKind::Approve), Tally::Passed);
}

#[test]
fn a_principal_counts_in_one_stage_only() {
    let stages = format!(
        "{TWO_OF_PAYMENTS}[[approval.stage]]\nname = \"risk\"\napprovers = [\"group:risk\"]\n"
    );
    let (mut g, _) = start(&rule(&stages), "d1".into(), &dir(), "", 0);
    vote(&mut g, "bob", DecisionKind::Approve);
    assert_eq!(vote(&mut g, "cat", DecisionKind::Approve), Tally::Passed);
    open(&mut g, 1, "", 10).unwrap();
    assert_eq!(g.eligible, ["eve"], "cat approved in stage 1");
}
