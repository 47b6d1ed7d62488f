//! Deadlines: a pending approval whose deadline passes expires with its on_timeout decision,
//! is delivered with source TIMEOUT, and is audited as a timeout, also when approval-svc is
//! restarted on the same data while the deadline is pending.

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use arbor_shared::{
    proto::{
        approval::v1::{ApprovalState, AuditAction},
        runner::v1::{self as runner_pb, DecisionKind, DecisionSource, ResolveAction},
    },
    time::{now_ms, timestamp},
};
use support::*;

fn with_deadline(
    id: &str,
    in_ms: u64,
    on_timeout: runner_pb::TimeoutAction,
) -> runner_pb::ApprovalRequested {
    runner_pb::ApprovalRequested {
        deadline: Some(timestamp(now_ms() + in_ms)),
        on_timeout: on_timeout as i32,
        ..node_request(id, "run-1")
    }
}

async fn delivered(runner: &FakeRunner, id: &str) -> runner_pb::ResolveRequest {
    eventually("the timeout decision at the runner", WAIT, || async {
        runner.resolves_for(id).into_iter().next()
    })
    .await
}

#[tokio::test]
async fn an_expired_approval_is_delivered_with_source_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    let svc = Svc::start(config(dir.path(), &runner.url())).await;
    let mut client = svc.client().await;
    runner.push_request(with_deadline(
        "reject-me",
        300,
        runner_pb::TimeoutAction::Reject,
    ));
    runner.push_request(with_deadline(
        "approve-me",
        300,
        runner_pb::TimeoutAction::Approve,
    ));
    runner.push_request(with_deadline(
        "decided",
        300,
        runner_pb::TimeoutAction::Reject,
    ));
    wait_for(&client, "decided", "pending", state(ApprovalState::Pending)).await;
    client
        .resolve(resolve_req("decided", DecisionKind::Approve))
        .await
        .unwrap();

    for (id, kind, action) in [
        ("reject-me", DecisionKind::Reject, ResolveAction::Cancel),
        ("approve-me", DecisionKind::Approve, ResolveAction::Resume),
    ] {
        let a = wait_for(&client, id, "expired", state(ApprovalState::Expired)).await;
        let d = a.decision.unwrap();
        assert_eq!(
            (d.kind, d.source),
            (kind as i32, DecisionSource::Timeout as i32)
        );
        let call = delivered(&runner, id).await;
        assert_eq!(call.action, action as i32);
        assert_eq!(call.source, DecisionSource::Timeout as i32);
        assert_eq!(call.decision_id, d.decision_id);
        let expired = audit_actions(&mut client, id)
            .await
            .into_iter()
            .find(|e| e.action == AuditAction::Expired as i32)
            .unwrap();
        assert_eq!(expired.actor, "timeout");
        assert_eq!(expired.source, DecisionSource::Timeout as i32);
    }
    // A decision taken in time is not overridden by the deadline.
    let decided = get(&mut client, "decided").await;
    assert_eq!(decided.state, ApprovalState::Resolved as i32);
    assert_eq!(
        decided.decision.unwrap().source,
        DecisionSource::Person as i32
    );

    // The expired approval finishes like any other once the run consumes it.
    let d = get(&mut client, "reject-me").await.decision.unwrap();
    runner.push_consumed("run-1", "reject-me", &d.decision_id);
    wait_for(&client, "reject-me", "pruned", state(ApprovalState::Pruned)).await;
    svc.stop().await;
}

#[tokio::test]
async fn a_deadline_survives_a_restart_of_approval_svc() {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    let deadline_in = 2_000;
    let deadline_at = now_ms() + deadline_in;
    let svc = Svc::start(config(dir.path(), &runner.url())).await;
    let client = svc.client().await;
    runner.push_request(with_deadline(
        "r1",
        deadline_in,
        runner_pb::TimeoutAction::Reject,
    ));
    wait_for(&client, "r1", "pending", state(ApprovalState::Pending)).await;
    svc.stop().await;
    assert!(
        now_ms() < deadline_at,
        "the restart must happen before the deadline"
    );

    let svc = Svc::start(config(dir.path(), &runner.url())).await;
    let mut client = svc.client().await;
    let a = get(&mut client, "r1").await;
    assert_eq!(a.state, ApprovalState::Pending as i32, "not expired early");
    let a = wait_for(&client, "r1", "expired", state(ApprovalState::Expired)).await;
    assert!(now_ms() >= deadline_at);
    assert_eq!(a.decision.unwrap().source, DecisionSource::Timeout as i32);
    let call = delivered(&runner, "r1").await;
    assert_eq!(call.action, ResolveAction::Cancel as i32);
    svc.stop().await;
}
