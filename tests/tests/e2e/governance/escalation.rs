//! A stage's deadline with `on_timeout = "escalate"`: stage 1 passes its deadline one approval
//! short, stage 2 opens for the directors, the run keeps waiting, and goes on once stage 2's
//! quorum is met.

use std::sync::Arc;

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::{WAIT, eventually, flow::vote};
use rpb::DecisionKind as K;
use tonic::Code;

use super::{
    DIRECTORS, Env, Expect, PAYMENTS, actions, payment, progress,
    quorum::{refused, settled},
};
use apb::{ApprovalState as S, AuditAction as A};

pub async fn a_deadline_opens_stage_two(env: Arc<Env>) -> Vec<Expect> {
    let args = payment(7000, "escalate-co");
    let a = env.submit("escalate", &args).await;
    assert_eq!(a.on_deadline, "escalate");
    assert!(a.next_deadline.is_some());
    let id = a.request_id.clone();
    let a = vote(&mut env.approvals("pia", 0), &id, K::Approve, None, "")
        .await
        .unwrap();
    assert_eq!(a.governance.as_ref().unwrap().eligible, PAYMENTS);
    assert_eq!(
        progress(&a),
        "1 of 2 in payments",
        "one short at the deadline"
    );

    let reader = env.approvals(super::READER, 1);
    let a = eventually("stage 2 to open at stage 1's deadline", WAIT, || {
        let (mut reader, id) = (reader.clone(), id.clone());
        async move {
            let a = arbor_tests::flow::get_approval(&mut reader, &id).await;
            (a.governance.as_ref()?.stage == 1).then_some(a)
        }
    })
    .await;
    assert_eq!(a.state, S::Pending as i32);
    let g = a.governance.clone().unwrap();
    assert_eq!(g.stages, ["payments", "directors"]);
    assert_eq!(g.eligible, DIRECTORS);
    assert_eq!(progress(&a), "0 of 2 in directors");
    let run = env.wait_run("escalate", rpb::RunStatus::Suspended).await;
    assert_eq!(run.suspensions[0].request_id, id, "the run still waits");
    refused(&env, "pia", &a, K::Approve, "", Code::PermissionDenied).await;

    let a = vote(&mut env.approvals("dora", 1), &id, K::Approve, None, "")
        .await
        .unwrap();
    assert_eq!(
        (a.state, progress(&a)),
        (S::Pending as i32, "1 of 2 in directors".into())
    );
    let a = vote(&mut env.approvals("dan", 0), &id, K::Approve, None, "")
        .await
        .unwrap();
    assert_eq!(a.state, S::Resolved as i32);
    let d = a.decision.unwrap();
    assert_eq!(d.kind(), K::Approve);
    assert_eq!(d.voters, ["pia", "dora", "dan"]);

    let (_, audit) = settled(&env, "escalate", rpb::RunStatus::Succeeded).await;
    assert_eq!(
        actions(&audit),
        [
            A::StageOpened,
            A::Voted,
            A::Escalated,
            A::Voted,
            A::Voted,
            A::Decided,
            A::Delivered,
            A::Acked
        ]
    );
    let escalated = audit.iter().find(|e| e.action() == A::Escalated).unwrap();
    assert_eq!(escalated.actor, "timeout");
    vec![("escalate".into(), Some(args))]
}
