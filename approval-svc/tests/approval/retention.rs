//! Retention in the running service: it compacts in the background, and over gRPC a
//! retained-away id is NOT_FOUND. What compaction removes and keeps is the store's business,
//! tested against every backend in `conformance` (`final_approvals_and_their_audit_go_...`).

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use arbor_approval_svc::retention::RetentionConfig;
use arbor_shared::proto::{approval::v1 as pb, runner::v1 as runner_pb};
use support::*;
use tonic::Code;

#[tokio::test]
async fn the_service_compacts_in_the_background_and_answers_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    let mut cfg = config(dir.path(), &runner.url());
    cfg.retention = RetentionConfig {
        keep: Duration::ZERO,
        interval: Duration::from_millis(50),
    };
    let svc = Svc::start(cfg).await;
    let mut client = svc.client().await;

    runner.push_request(tool_request("done", "run-1", "ledger.append"));
    runner.push_request(tool_request("waiting", "run-2", "ledger.append"));
    wait_for(
        &client,
        "done",
        "pending",
        state(pb::ApprovalState::Pending),
    )
    .await;
    let decided = client
        .resolve(resolve_req("done", runner_pb::DecisionKind::Approve))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    let decision_id = decided.decision.unwrap().decision_id;
    eventually("the decision at the runner", WAIT, || async {
        (!runner.resolves_for("done").is_empty()).then_some(())
    })
    .await;
    runner.push_consumed("run-1", "done", &decision_id);

    // Once pruned (and the cursor acked past it) the approval and its audit trail go.
    eventually("the pruned approval to be compacted", WAIT, || async {
        let mut c = client.clone();
        let gone = c
            .get_approval(pb::GetApprovalRequest {
                request_id: "done".into(),
            })
            .await
            .err()
            .is_some_and(|s| s.code() == Code::NotFound);
        gone.then_some(())
    })
    .await;
    let err = client
        .get_audit_log(pb::GetAuditLogRequest {
            request_id: "done".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let run_audit = client
        .get_audit_log(pb::GetAuditLogRequest {
            run_id: "run-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(run_audit.entries.is_empty());

    // The pending one stays: retention has run since the other one was pruned.
    let waiting = get(&mut client, "waiting").await;
    assert_eq!(waiting.state, pb::ApprovalState::Pending as i32);
    svc.stop().await;
}
