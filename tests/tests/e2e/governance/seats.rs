//! Who fills a seat: a delegate votes in the delegator's seat (the audit names both, and the
//! two together fill one seat), and a claim keeps everyone but its holder out until released.

use std::sync::Arc;

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::flow::{delegate, vote};
use rpb::DecisionKind as K;
use tonic::Code;

use super::{
    DELEGATE, Env, Expect, actions, payment, progress,
    quorum::{refused, settled},
    votes,
};
use apb::{ApprovalState as S, AuditAction as A};

pub async fn a_delegate_fills_the_delegator_s_seat(env: Arc<Env>) -> Vec<Expect> {
    let args = payment(3000, "deleg-co");
    let a = env.submit("delegated", &args).await;
    let id = a.request_id.clone();
    refused(&env, DELEGATE, &a, K::Approve, "", Code::PermissionDenied).await;
    assert!(!env.actionable(DELEGATE, "delegated").await);
    let d = delegate(&mut env.approvals("pia", 0), DELEGATE, 3_600_000).await;
    assert_eq!((d.from.as_str(), d.to.as_str()), ("pia", DELEGATE));
    assert!(
        env.actionable(DELEGATE, "delegated").await,
        "pia's seat is open"
    );

    let a = vote(&mut env.approvals("pia", 1), &id, K::Approve, None, "")
        .await
        .unwrap();
    assert_eq!(progress(&a), "1 of 2 in payments");
    assert!(
        !env.actionable(DELEGATE, "delegated").await,
        "pia filled her seat"
    );
    let a = vote(&mut env.approvals(DELEGATE, 0), &id, K::Approve, None, "")
        .await
        .unwrap();
    assert_eq!(a.state, S::Pending as i32);
    assert_eq!(
        progress(&a),
        "1 of 2 in payments",
        "pia and her delegate fill one seat"
    );
    let live: Vec<(&str, &str)> = a
        .governance
        .as_ref()
        .unwrap()
        .votes
        .iter()
        .filter(|v| !v.stale)
        .map(|v| (v.principal.as_str(), v.delegate.as_str()))
        .collect();
    assert_eq!(live, [("pia", DELEGATE)]);

    let a = vote(&mut env.approvals("paul", 1), &id, K::Approve, None, "")
        .await
        .unwrap();
    assert_eq!(a.state, S::Resolved as i32);
    assert_eq!(a.decision.unwrap().voters, ["dana for pia", "paul"]);
    let (_, audit) = settled(&env, "delegated", rpb::RunStatus::Succeeded).await;
    assert_eq!(
        votes(&audit),
        [
            ("pia".into(), String::new(), K::Approve),
            (DELEGATE.into(), "pia".into(), K::Approve),
            ("paul".into(), String::new(), K::Approve)
        ]
    );
    vec![("delegated".into(), Some(args))]
}

async fn claim(
    env: &Env,
    who: &str,
    id: &str,
    release: bool,
) -> Result<apb::Approval, tonic::Status> {
    let r = env
        .approvals(who, 0)
        .claim(apb::ClaimRequest {
            request_id: id.into(),
            ttl_ms: 0,
            release,
        })
        .await?;
    Ok(r.into_inner().approval.unwrap())
}

pub async fn a_claim_keeps_others_out(env: Arc<Env>) -> Vec<Expect> {
    let args = payment(3000, "claim-co");
    let a = env.submit("claimed", &args).await;
    let id = a.request_id.clone();
    let a = claim(&env, "paul", &id, false).await.unwrap();
    assert_eq!(a.claim.as_ref().unwrap().principal, "paul");
    let err = claim(&env, "pete", &id, false).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("paul"), "names the holder: {err}");
    refused(&env, "pete", &a, K::Approve, "", Code::FailedPrecondition).await;
    assert!(!env.actionable("pete", "claimed").await);
    assert!(env.actionable("paul", "claimed").await);

    let a = vote(&mut env.approvals("paul", 1), &id, K::Approve, None, "")
        .await
        .unwrap();
    assert_eq!(progress(&a), "1 of 2 in payments");
    let a = claim(&env, "paul", &id, true).await.unwrap();
    assert!(a.claim.is_none());
    let a = vote(&mut env.approvals("pete", 0), &id, K::Approve, None, "")
        .await
        .unwrap();
    assert_eq!(a.state, S::Resolved as i32);
    assert_eq!(a.decision.unwrap().voters, ["paul", "pete"]);
    let (_, audit) = settled(&env, "claimed", rpb::RunStatus::Succeeded).await;
    assert_eq!(
        actions(&audit),
        [
            A::StageOpened,
            A::Claimed,
            A::Voted,
            A::Released,
            A::Voted,
            A::Decided,
            A::Delivered,
            A::Acked
        ]
    );
    vec![("claimed".into(), Some(args))]
}
