//! Votes are bound to what they agree to: an approver's EDIT makes the approvals before it
//! stale and the editor's own approval does not count; a vote bound to the old digest is
//! refused and changes nothing; the ledger holds the edited arguments, once.

use std::sync::Arc;

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::flow::vote;
use rpb::DecisionKind as K;
use tonic::Code;

use super::{
    Env, Expect, actions, payment, progress,
    quorum::{refused, settled},
};
use apb::{ApprovalState as S, AuditAction as A};

pub async fn an_edit_makes_votes_stale(env: Arc<Env>) -> Vec<Expect> {
    let a = env.submit("edited", &payment(9000, "edit-co")).await;
    let (id, asked) = (a.request_id.clone(), a.args_digest.clone());
    let a = vote(&mut env.approvals("pia", 0), &id, K::Approve, None, &asked)
        .await
        .unwrap();
    assert_eq!(progress(&a), "1 of 2 in payments");

    let edited = payment(4200, "edit-co");
    let a = vote(
        &mut env.approvals("paul", 1),
        &id,
        K::Edit,
        Some(edited.clone()),
        &asked,
    )
    .await
    .unwrap();
    assert_eq!(
        a.state,
        S::Pending as i32,
        "an edit is a proposal, not a decision"
    );
    let now = a.args_digest.clone();
    assert_ne!(now, asked, "the digest follows the edit");
    let g = a.governance.clone().unwrap();
    assert_eq!((g.proposal(), g.proposed_by.as_str()), (K::Edit, "paul"));
    assert_eq!(
        progress(&a),
        "0 of 2 in payments",
        "pia's approval is stale"
    );
    assert!(g.votes.iter().all(|v| v.stale), "{:?}", g.votes);

    refused(
        &env,
        "pete",
        &a,
        K::Approve,
        &asked,
        Code::FailedPrecondition,
    )
    .await;

    let a = vote(&mut env.approvals("paul", 0), &id, K::Approve, None, &now)
        .await
        .unwrap();
    assert_eq!(
        progress(&a),
        "0 of 2 in payments",
        "the editor's vote does not count"
    );
    let a = vote(&mut env.approvals("pete", 1), &id, K::Approve, None, &now)
        .await
        .unwrap();
    assert_eq!(
        (a.state, progress(&a)),
        (S::Pending as i32, "1 of 2 in payments".into())
    );
    let a = vote(&mut env.approvals("pia", 0), &id, K::Approve, None, &now)
        .await
        .unwrap();
    assert_eq!(a.state, S::Resolved as i32);
    let d = a.decision.unwrap();
    assert_eq!(d.kind(), K::Edit);
    assert_eq!(d.args_digest, now);
    assert_eq!(
        arbor_shared::json::from_optional_value(d.args.as_ref()),
        edited
    );
    assert_eq!(
        d.voters,
        ["pete", "pia"],
        "the editor's vote did not decide"
    );

    let (_, audit) = settled(&env, "edited", rpb::RunStatus::Succeeded).await;
    assert_eq!(
        actions(&audit),
        [
            A::StageOpened,
            A::Voted,
            A::Proposed,
            A::Voted,
            A::Voted,
            A::Voted,
            A::Decided,
            A::Delivered,
            A::Acked
        ]
    );
    let proposed = audit.iter().find(|e| e.action() == A::Proposed).unwrap();
    assert_eq!(
        (proposed.actor.as_str(), proposed.args_digest.as_str()),
        ("paul", now.as_str())
    );
    vec![("edited".into(), Some(edited))]
}
