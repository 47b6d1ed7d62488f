//! The governance cases of the conformance suite: votes in stages with a quorum, vetoes and
//! counted rejections, a stage too small to pass, a stage's deadline escalating, delegates,
//! claims, edits that make votes stale, digests, and many voters at once, on every backend.

use std::sync::Arc;

use arbor_approval_svc::{
    ApprovalStore, Error,
    approvals::plan,
    governance::seat::Delegation,
    lifecycle::ApprovalState,
    model::{Approval, AuditAction, AuditQuery, NewDecision},
    policy::Policy,
};
use arbor_shared::{
    auth::{Directory, Principal, Role},
    digest,
    domain::{DecisionKind, DecisionSource},
};
use serde_json::json;
use tonic::Code;

use super::{Backend, tool};

/// Who is who: `ann` submits the runs and is in `payments` herself.
fn directory() -> Directory {
    let p = |name: &str, groups: &[&str]| Principal {
        name: name.into(),
        roles: vec![Role::Approver],
        groups: groups.iter().map(|g| g.to_string()).collect(),
    };
    let mut people = vec![
        p("ann", &["payments"]),
        p("bob", &["payments"]),
        p("cat", &["payments"]),
        p("dan", &["payments"]),
        p("eve", &["risk"]),
        p("max", &["managers"]),
    ];
    people.extend((0..16).map(|i| p(&format!("v{i:02}"), &["crowd"])));
    Directory::of(people)
}

const TWO_OF_PAYMENTS: &str = r#"
[[approval]]
name = "four-eyes"
tool = "ledger.*"
[[approval.stage]]
name = "finance"
approvers = ["group:payments"]
required = 2
"#;

/// Stores tool request `id` (submitted by `ann`) under `rules`, as the service does.
async fn put<S: ApprovalStore>(store: &S, id: &str, rules: &str) -> Approval {
    let policy = Policy::from_toml(rules).unwrap();
    let dir = directory();
    let mut request = tool(id, "run-1");
    request.submitted_by = "ann".into();
    let decide = move |a: &Approval| plan(&policy, &dir, a);
    let mut puts = store
        .put_and_decide_requests(vec![(request, None, String::new())], decide)
        .await
        .unwrap();
    store.flush().await.unwrap();
    puts.remove(0).approval
}

fn vote(by: &str, kind: DecisionKind) -> NewDecision {
    NewDecision {
        not_by_submitter: true,
        ..NewDecision::person(kind, by)
    }
}

async fn cast<S: ApprovalStore>(store: &S, id: &str, by: &str, kind: DecisionKind) -> Approval {
    store
        .resolve_request(id, vote(by, kind))
        .await
        .unwrap_or_else(|e| panic!("{by}'s vote: {e}"))
        .approval
}

fn actions<S: ApprovalStore>(store: &S, id: &str) -> Vec<(AuditAction, String)> {
    store
        .audit(&AuditQuery::Request(id.into()), 100, None)
        .unwrap()
        .items
        .into_iter()
        .map(|e| (e.action, e.actor))
        .collect()
}

pub async fn two_of_a_group_decide_once_and_the_submitter_is_not_one<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    let a = put(&store, "q1", TWO_OF_PAYMENTS).await;
    let g = a.ext.governance.as_ref().unwrap();
    assert_eq!(g.eligible, ["bob", "cat", "dan"], "ann submitted the run");
    let err = store
        .resolve_request("q1", vote("ann", DecisionKind::Approve))
        .await;
    assert_eq!(err.unwrap_err().code(), Code::PermissionDenied);
    let eve = store
        .resolve_request("q1", vote("eve", DecisionKind::Approve))
        .await;
    assert!(matches!(eve, Err(Error::NotEligible { .. })), "{eve:?}");
    assert_eq!(
        cast(&store, "q1", "bob", DecisionKind::Approve).await.state,
        ApprovalState::Pending
    );
    // A second vote of the same seat replaces the first: still one of two.
    let again = cast(&store, "q1", "bob", DecisionKind::Approve).await;
    assert_eq!(again.state, ApprovalState::Pending);
    let decided = cast(&store, "q1", "cat", DecisionKind::Approve).await;
    assert_eq!(decided.state, ApprovalState::Resolved);
    let d = decided.decision.as_ref().unwrap();
    assert_eq!(
        (d.kind, d.source),
        (DecisionKind::Approve, DecisionSource::Person)
    );
    assert_eq!(decided.ext.voters, ["bob", "cat"]);
    assert_eq!(decided.ext.decided_digest, decided.request.args_digest());
    // A later vote changes nothing: the first decision stands.
    let late = store
        .resolve_request("q1", vote("dan", DecisionKind::Reject))
        .await;
    assert_eq!(late.unwrap_err().code(), Code::FailedPrecondition);
    let trail: Vec<AuditAction> = actions(&store, "q1").into_iter().map(|(a, _)| a).collect();
    use AuditAction::*;
    assert_eq!(
        trail,
        [Requested, StageOpened, Voted, Voted, Voted, Decided]
    );
    drop(store);
    let reopened = B::open(place).await;
    assert_eq!(
        reopened.get("q1").unwrap().unwrap(),
        decided,
        "votes are durable"
    );
}

pub async fn a_veto_or_counted_rejections_decide_reject<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    put(&store, "veto", TWO_OF_PAYMENTS).await;
    cast(&store, "veto", "bob", DecisionKind::Approve).await;
    let vetoed = cast(&store, "veto", "dan", DecisionKind::Reject).await;
    assert_eq!(vetoed.state, ApprovalState::Resolved);
    let d = vetoed.decision.unwrap();
    assert_eq!(d.kind, DecisionKind::Reject);
    assert!(d.reason.contains("vetoed by dan"), "{}", d.reason);

    let counting = TWO_OF_PAYMENTS.replace("required = 2", "required = 2\non_reject = \"count\"");
    put(&store, "count", &counting).await;
    let one = cast(&store, "count", "bob", DecisionKind::Reject).await;
    assert_eq!(
        one.state,
        ApprovalState::Pending,
        "two approvals are still possible"
    );
    let two = cast(&store, "count", "cat", DecisionKind::Reject).await;
    assert_eq!(two.decision.unwrap().kind, DecisionKind::Reject);
}

pub async fn a_stage_too_small_for_its_quorum_rejects_at_once<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    let rules = TWO_OF_PAYMENTS.replace("required = 2", "required = 4");
    let a = put(&store, "small", &rules).await;
    assert_eq!(a.state, ApprovalState::Resolved);
    let d = a.decision.unwrap();
    assert_eq!(
        (d.kind, d.source),
        (DecisionKind::Reject, DecisionSource::Policy)
    );
    assert!(
        d.reason.contains("needs 4 approvals and has 3"),
        "{}",
        d.reason
    );
    let trail: Vec<AuditAction> = actions(&store, "small")
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert_eq!(trail, [AuditAction::Requested, AuditAction::Decided]);
}

pub async fn a_stage_deadline_escalates_to_the_next_stage<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    let rules = r#"
[[approval]]
tool = "ledger.*"
[[approval.stage]]
name = "finance"
approvers = ["user:bob", "user:cat"]
required = "all"
deadline = "50ms"
on_timeout = "escalate"
[[approval.stage]]
name = "managers"
approvers = ["group:managers"]
"#;
    let a = put(&store, "esc", rules).await;
    assert!(a.deadline_ms() > 0);
    assert_eq!(
        store.next_deadline().unwrap().map(|(_, id)| id).as_deref(),
        Some("esc")
    );
    cast(&store, "esc", "bob", DecisionKind::Approve).await;
    tokio::time::sleep(std::time::Duration::from_millis(80)).await;
    let escalated = store.expire("esc").await.unwrap();
    assert_eq!(escalated.state, ApprovalState::Pending, "stage 2 waits");
    let g = escalated.ext.governance.as_ref().unwrap();
    assert_eq!(
        (g.current, g.eligible.clone()),
        (1, vec!["max".to_string()])
    );
    let decided = cast(&store, "esc", "max", DecisionKind::Approve).await;
    assert_eq!(decided.decision.unwrap().kind, DecisionKind::Approve);
    let trail: Vec<AuditAction> = actions(&store, "esc").into_iter().map(|(a, _)| a).collect();
    use AuditAction::*;
    assert_eq!(
        trail,
        [Requested, StageOpened, Voted, Escalated, Voted, Decided]
    );
}

pub async fn a_delegate_fills_the_delegators_seat<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    put(&store, "del", TWO_OF_PAYMENTS).await;
    let now = store.now_ms();
    store
        .delegate(Delegation {
            id: "d1".into(),
            from: "bob".into(),
            to: "eve".into(),
            starts_ms: now - 1000,
            ends_ms: now + 3_600_000,
            scope: "ledger.*".into(),
            created_by: "bob".into(),
            created_at_ms: now,
        })
        .await
        .unwrap();
    assert_eq!(store.delegations().await.unwrap().len(), 1);
    cast(&store, "del", "eve", DecisionKind::Approve).await;
    // bob and his delegate fill one seat: bob's own vote replaces eve's, still one of two.
    let one = cast(&store, "del", "bob", DecisionKind::Approve).await;
    assert_eq!(one.state, ApprovalState::Pending);
    let trail = store
        .audit(&AuditQuery::Request("del".into()), 100, None)
        .unwrap()
        .items;
    let by_eve = trail.iter().find(|e| e.actor == "eve").unwrap();
    assert_eq!(by_eve.ext.on_behalf_of, "bob");
    store.revoke_delegation("d1", |_| Ok(())).await.unwrap();
    let refused = store
        .resolve_request("del", vote("eve", DecisionKind::Approve))
        .await;
    assert!(
        matches!(refused, Err(Error::NotEligible { .. })),
        "revoked: {refused:?}"
    );
}

pub async fn a_claim_held_by_another_is_refused<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    let mut request = tool("cl", "run-1");
    request.submitted_by = "ann".into();
    store.put_request(request, None).await.unwrap();
    let claimed = store.claim("cl", "bob", 60_000, false).await.unwrap();
    assert_eq!(claimed.ext.claim.as_ref().unwrap().by, "bob");
    let other = store.claim("cl", "cat", 0, false).await;
    assert!(matches!(other, Err(Error::Claimed { .. })), "{other:?}");
    let decide = store
        .resolve_request("cl", vote("cat", DecisionKind::Approve))
        .await;
    assert_eq!(decide.unwrap_err().code(), Code::FailedPrecondition);
    assert_eq!(
        store.get("cl").unwrap().unwrap().state,
        ApprovalState::Pending
    );
    let moved = store.reassign("cl", "bob", "cat", false).await.unwrap();
    assert_eq!(moved.ext.claim.as_ref().unwrap().by, "cat");
    let commented = store
        .comment("cl", "cat", "checking the amount")
        .await
        .unwrap();
    assert_eq!(
        commented.ext.comments[0].args_digest,
        commented.args_digest()
    );
    cast(&store, "cl", "cat", DecisionKind::Approve).await;
    let trail: Vec<AuditAction> = actions(&store, "cl").into_iter().map(|(a, _)| a).collect();
    use AuditAction::*;
    assert_eq!(trail, [Requested, Claimed, Reassigned, Commented, Decided]);
}

pub async fn an_edit_makes_votes_stale_and_a_stale_digest_changes_nothing<B: Backend>(
    place: &B::Place,
) {
    let store = B::open(place).await;
    let a = put(&store, "ed", TWO_OF_PAYMENTS).await;
    let first = a.args_digest();
    cast(&store, "ed", "bob", DecisionKind::Approve).await;
    let mut edit = vote("cat", DecisionKind::Edit);
    edit.args = json!({"entry": {"amount": 5}});
    let edited = store.resolve_request("ed", edit).await.unwrap().approval;
    let second = digest::of(&json!({"entry": {"amount": 5}}));
    assert_eq!(edited.args_digest(), second);
    let stale = NewDecision {
        expected_digest: first.clone(),
        ..vote("dan", DecisionKind::Approve)
    };
    let refused = store.resolve_request("ed", stale).await;
    assert!(
        matches!(refused, Err(Error::StaleDigest { .. })),
        "{refused:?}"
    );
    assert_eq!(
        store.get("ed").unwrap().unwrap(),
        edited,
        "a refused vote changes nothing"
    );
    // The editor's own approval does not count; bob's was of the old arguments.
    let by_editor = cast(&store, "ed", "cat", DecisionKind::Approve).await;
    assert_eq!(by_editor.state, ApprovalState::Pending);
    cast(&store, "ed", "bob", DecisionKind::Approve).await;
    let current = NewDecision {
        expected_digest: second.clone(),
        ..vote("dan", DecisionKind::Approve)
    };
    let decided = store.resolve_request("ed", current).await.unwrap().approval;
    let d = decided.decision.as_ref().unwrap();
    assert_eq!(
        (d.kind, d.args.clone()),
        (DecisionKind::Edit, json!({"entry": {"amount": 5}}))
    );
    assert_eq!(decided.ext.decided_digest, second);
    let g = decided.ext.governance.as_ref().unwrap();
    assert!(
        g.votes
            .iter()
            .any(|v| v.seat == "bob" && v.stale && v.digest == first)
    );
}

pub async fn sixteen_voters_at_once_decide_once<B: Backend>(place: &B::Place) {
    let store = Arc::new(B::open(place).await);
    let rules = TWO_OF_PAYMENTS
        .replace("group:payments", "group:crowd")
        .replace("required = 2", "required = 12");
    put(&*store, "many", &rules).await;
    let voters = (0..16).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .resolve_request("many", vote(&format!("v{i:02}"), DecisionKind::Approve))
                .await
        })
    });
    let outcomes = futures_util::future::join_all(voters).await;
    let taken: Vec<Approval> = outcomes
        .into_iter()
        .map(|o| o.unwrap())
        .filter_map(|o| o.ok().map(|r| r.approval))
        .collect();
    let decided = taken
        .iter()
        .filter(|a| a.state == ApprovalState::Resolved)
        .count();
    assert!(decided >= 1, "the twelfth vote decides");
    let a = store.get("many").unwrap().unwrap();
    let decision_id = a.decision.as_ref().unwrap().decision_id.clone();
    assert!(
        taken
            .iter()
            .filter_map(|a| a.decision.as_ref())
            .all(|d| d.decision_id == decision_id),
        "one decision"
    );
    let trail = actions(&*store, "many");
    let voted = trail
        .iter()
        .filter(|(a, _)| *a == AuditAction::Voted)
        .count();
    let decided_entries = trail
        .iter()
        .filter(|(a, _)| *a == AuditAction::Decided)
        .count();
    assert_eq!(decided_entries, 1, "decided exactly once: {trail:?}");
    assert!(voted >= 12, "every counted vote is audited: {trail:?}");
    assert_eq!(store.undelivered().unwrap().len(), 1, "delivered once");
}
