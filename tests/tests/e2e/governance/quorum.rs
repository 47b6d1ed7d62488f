//! Quorum, veto and counted rejections, and a stage whose eligible set cannot reach its quorum:
//! the approval after each vote, the decision and its voters, the audit and the run.

use std::sync::Arc;

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::{WAIT, eventually, flow::vote};
use rpb::DecisionKind as K;
use tonic::Code;

use super::{Env, Expect, PAYMENTS, actions, payment, progress, votes};
use apb::{ApprovalState as S, AuditAction as A};

/// Waits for the run to end with `status` and the approval to be consumed (ACKED, or PRUNED
/// already when the run failed); returns the approval and its audit.
pub async fn settled(
    env: &Env,
    run_id: &str,
    status: rpb::RunStatus,
) -> (apb::Approval, Vec<apb::AuditEntry>) {
    env.wait_run(run_id, status).await;
    let reader = env.approvals(super::READER, 0);
    let a = eventually(&format!("{run_id}'s approval to be consumed"), WAIT, || {
        let mut reader = reader.clone();
        async move {
            let filter = apb::ApprovalFilter {
                run_id: run_id.into(),
                states: vec![S::Acked as i32, S::Pruned as i32],
                ..Default::default()
            };
            let page = reader
                .list_approvals(apb::ListApprovalsRequest {
                    filter: Some(filter),
                    ..Default::default()
                })
                .await
                .ok()?;
            page.into_inner().approvals.into_iter().next()
        }
    })
    .await;
    let audit = env.audit(&a.request_id).await;
    assert_eq!(
        env.resolved_events(run_id).await,
        1,
        "{run_id} took in one decision"
    );
    (a, audit)
}

/// A refused vote: `code`, and the approval exactly as it was.
pub async fn refused(env: &Env, who: &str, a: &apb::Approval, kind: K, digest: &str, code: Code) {
    let mut client = env.approvals(who, 1);
    let err = vote(&mut client, &a.request_id, kind, None, digest)
        .await
        .expect_err("the vote is refused");
    assert_eq!(err.code(), code, "{who}'s {kind:?}: {err}");
    let now = arbor_tests::flow::get_approval(&mut client, &a.request_id).await;
    assert_eq!(&now, a, "a refused vote by {who} changes nothing");
}

/// Two of three from `payments`: the submitter (a member) and `pam` (excluded by the rule) are
/// not eligible; one approval leaves the request PENDING, the second decides it. A payment
/// under the rule's threshold is not governed: one approver decides it.
pub async fn two_of_three_without_the_submitter(env: Arc<Env>) -> Vec<Expect> {
    let small = payment(500, "quorum-co");
    let a = env.submit("quorum-small", &small).await;
    assert!(a.governance.is_none(), "500 is under the rule's threshold");
    vote(
        &mut env.approvals("alice", 0),
        &a.request_id,
        K::Approve,
        None,
        "",
    )
    .await
    .unwrap();
    env.wait_run("quorum-small", rpb::RunStatus::Succeeded)
        .await;

    let big = payment(5000, "quorum-co");
    let a = env.submit("quorum", &big).await;
    let g = a.governance.clone().expect("governed");
    assert_eq!(g.rule, "big-payments");
    assert_eq!(g.eligible, ["paul", "pete", "pia"], "without sam and pam");
    assert_eq!(g.required, 2);
    assert_eq!(progress(&a), "0 of 2 in payments");
    assert!(a.args_digest.starts_with("sha256:"), "{}", a.args_digest);
    refused(&env, "pam", &a, K::Approve, "", Code::PermissionDenied).await;
    assert!(!env.actionable("pam", "quorum").await, "pam is excluded");
    assert!(env.actionable("pete", "quorum").await);

    let a = vote(
        &mut env.approvals("pia", 0),
        &a.request_id,
        K::Approve,
        None,
        "",
    )
    .await
    .unwrap();
    assert_eq!(a.state, S::Pending as i32, "one approval of two");
    assert_eq!(progress(&a), "1 of 2 in payments");
    assert_eq!(a.governance.as_ref().unwrap().seats_left, ["paul", "pete"]);
    let a = vote(
        &mut env.approvals("paul", 1),
        &a.request_id,
        K::Approve,
        None,
        "",
    )
    .await
    .unwrap();
    assert_eq!(a.state, S::Resolved as i32, "the second approval decides");
    let d = a.decision.clone().unwrap();
    assert_eq!(
        (d.kind(), d.voters.clone()),
        (K::Approve, vec!["pia".into(), "paul".into()])
    );
    assert_eq!(d.args_digest, a.args_digest);

    let (_, audit) = settled(&env, "quorum", rpb::RunStatus::Succeeded).await;
    assert_eq!(
        actions(&audit),
        [
            A::StageOpened,
            A::Voted,
            A::Voted,
            A::Decided,
            A::Delivered,
            A::Acked
        ]
    );
    assert_eq!(
        votes(&audit),
        [
            ("pia".into(), String::new(), K::Approve),
            ("paul".into(), String::new(), K::Approve)
        ]
    );
    vec![
        ("quorum-small".into(), Some(small)),
        ("quorum".into(), Some(big)),
    ]
}

/// One REJECT decides REJECT at once under `on_reject = "veto"`, whatever was approved before.
pub async fn a_veto_rejects_at_once(env: Arc<Env>) -> Vec<Expect> {
    let a = env.submit("veto", &payment(5000, "veto-co")).await;
    assert_eq!(a.governance.as_ref().unwrap().eligible, PAYMENTS);
    let a = vote(
        &mut env.approvals("pia", 0),
        &a.request_id,
        K::Approve,
        None,
        "",
    )
    .await
    .unwrap();
    assert_eq!(progress(&a), "1 of 2 in payments");
    let a = vote(
        &mut env.approvals("paul", 1),
        &a.request_id,
        K::Reject,
        None,
        "",
    )
    .await
    .unwrap();
    assert_eq!(a.state, S::Resolved as i32);
    let d = a.decision.clone().unwrap();
    assert_eq!(d.kind(), K::Reject);
    assert!(d.reason.contains("vetoed by paul"), "{}", d.reason);
    let late = vote(
        &mut env.approvals("pete", 0),
        &a.request_id,
        K::Approve,
        None,
        "",
    )
    .await;
    assert_eq!(late.unwrap_err().code(), Code::FailedPrecondition);

    let (_, audit) = settled(&env, "veto", rpb::RunStatus::Failed).await;
    assert_eq!(
        votes(&audit),
        [
            ("pia".into(), String::new(), K::Approve),
            ("paul".into(), String::new(), K::Reject)
        ]
    );
    vec![("veto".into(), None)]
}

/// Under `on_reject = "count"` a REJECT only counts: three of four needed, the first REJECT
/// leaves the request PENDING, the second puts three approvals out of reach and decides.
pub async fn counted_rejections_decide_once_out_of_reach(env: Arc<Env>) -> Vec<Expect> {
    let a = env.submit("count", &payment(5000, "count-co")).await;
    let id = a.request_id.clone();
    let a = vote(&mut env.approvals("pia", 0), &id, K::Reject, None, "")
        .await
        .unwrap();
    assert_eq!(
        a.state,
        S::Pending as i32,
        "three approvals are still possible"
    );
    assert_eq!(progress(&a), "0 of 3 in payments");
    let a = vote(&mut env.approvals("pete", 1), &id, K::Approve, None, "")
        .await
        .unwrap();
    assert_eq!(
        (a.state, progress(&a)),
        (S::Pending as i32, "1 of 3 in payments".into())
    );
    let a = vote(&mut env.approvals("paul", 0), &id, K::Reject, None, "")
        .await
        .unwrap();
    assert_eq!(
        a.state,
        S::Resolved as i32,
        "two left of four cannot make three"
    );
    let d = a.decision.unwrap();
    assert_eq!(d.kind(), K::Reject);
    assert!(
        d.reason.contains("can no longer reach 3 approvals"),
        "{}",
        d.reason
    );
    let (_, audit) = settled(&env, "count", rpb::RunStatus::Failed).await;
    assert_eq!(votes(&audit).len(), 3);
    vec![("count".into(), None)]
}

/// A stage that needs two approvals from a group of one is decided REJECT when the request
/// arrives, saying why; nobody is asked.
pub async fn a_stage_too_small_rejects_at_once(env: Arc<Env>) -> Vec<Expect> {
    env.start("too-few", &payment(5000, "tiny-co")).await;
    let (a, audit) = settled(&env, "too-few", rpb::RunStatus::Failed).await;
    let d = a.decision.unwrap();
    assert_eq!(
        (d.kind(), d.source()),
        (K::Reject, rpb::DecisionSource::Policy)
    );
    assert!(
        d.reason.contains("needs 2 approvals and has 1 eligible"),
        "{}",
        d.reason
    );
    assert!(votes(&audit).is_empty());
    assert_eq!(actions(&audit), [A::Decided, A::Delivered, A::Acked]);
    vec![("too-few".into(), None)]
}
