//! approval-svc killed as the run consumes its decision: the approval's ack and prune become
//! durable with the flush before the next cursor ack, so a kill before that flush loses them and
//! the replayed `APPROVAL_CONSUMED` finishes them, once.

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::{Cluster, Profile, gate_tree};

use super::{decide, pending_approval, register_and_submit, wait_approval_state, wait_run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_svc_killed_as_the_decision_is_consumed_prunes_it_once_after_restart() {
    let mut cluster = Cluster::start(Profile::Debug).await;
    let mut runner = cluster.runner_client().await;
    let run = register_and_submit(&mut runner, gate_tree("ship-consumed", "failure")).await;
    let approval = pending_approval(&cluster, &run.run_id).await;
    cluster
        .approval_client()
        .await
        .resolve(decide(&approval.request_id, rpb::DecisionKind::Approve, ""))
        .await
        .unwrap();
    wait_run(&cluster, &run.run_id, rpb::RunStatus::Succeeded).await;
    // At once: the consumption is applied as soon as the event arrives, and the cursor acked
    // (after a flush) up to 100 ms later.
    cluster.approval.kill().await;
    cluster.approval.start().await;

    wait_approval_state(&cluster, &approval.request_id, apb::ApprovalState::Pruned).await;
    let audit = cluster
        .approval_client()
        .await
        .get_audit_log(apb::GetAuditLogRequest {
            request_id: approval.request_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    use apb::AuditAction as A;
    for action in [A::Decided, A::Delivered, A::Acked, A::Pruned] {
        let n = audit.iter().filter(|e| e.action == action as i32).count();
        assert_eq!(n, 1, "{action:?} recorded once: {audit:?}");
    }
}
