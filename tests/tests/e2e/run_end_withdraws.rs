//! An approval never outlives its run as PENDING: a run that ends in any way while an approval
//! of it waits — succeeded (a parallel branch finished it), failed (a branch's input was
//! cancelled; or the approval itself was decided on the runner directly), cancelled, interrupted
//! — leaves that approval CANCELLED in approval-svc, with an audit entry saying why. (A run that
//! is superseded never started, so it never asked anything; a dead-lettered run withdraws its
//! requests in the runner's own test, `runner-svc/tests/runner/run_end_withdraws.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arbor_shared::{
    json::to_proto_value,
    proto::{approval::v1 as apb, runner::v1 as rpb},
};
use arbor_tests::{
    Cluster, Profile,
    auth::Tokens,
    clients::{approvals_as, runner_as},
    secured::{register, submit, wait_approval, wait_run},
};
use serde_json::json;

/// A gate that waits for a person next to a user input, under a parallel that needs
/// `threshold` of the two.
fn tree(id: &str, threshold: u32) -> String {
    json!({"id": id, "version": 1, "root": {"type": "parallel", "name": "both",
    "success_threshold": threshold, "children": [
        {"type": "approval", "name": "gate", "title": "Go?", "child": {"type": "succeed"}},
        {"type": "user_input", "name": "note", "input_kind": "text", "prompt": "Note?"}
    ]}})
    .to_string()
}

struct Case {
    cluster: Cluster,
    tokens: Tokens,
}

impl Case {
    async fn start() -> Case {
        let (cluster, tokens) = Cluster::start_secure(Profile::Debug).await;
        Case { cluster, tokens }
    }

    fn runner(&self, token: &str) -> arbor_tests::clients::RunnerClient {
        runner_as(&self.cluster.runner.url(), Some(token))
    }

    fn approvals(&self, token: &str) -> arbor_tests::clients::ApprovalClient {
        approvals_as(&self.cluster.approval.url(), Some(token))
    }

    /// Submits a run of `tree` and waits until its approval is PENDING; returns the run and
    /// the request id of its user input.
    async fn waiting(&self, tree_doc: String, run_id: &str) -> (String, String) {
        let mut runner = self.runner(&self.tokens.submitter);
        let tree = register(&mut runner, tree_doc).await;
        submit(&mut runner, &tree.id, run_id).await;
        let approval = wait_approval(
            &self.approvals(&self.tokens.approver),
            run_id,
            apb::ApprovalState::Pending,
        )
        .await;
        let run = wait_run(&runner, run_id, rpb::RunStatus::Suspended).await;
        let input = run
            .suspensions
            .iter()
            .find(|s| s.category == rpb::SuspensionCategory::RequireUserInput as i32)
            .map(|s| s.request_id.clone())
            .unwrap_or_default();
        (approval.request_id, input)
    }

    /// The approval ends CANCELLED, and its last audit entry says so with `why` in the reason.
    async fn cancelled_because(&self, run_id: &str, request_id: &str, why: &str) {
        wait_approval(
            &self.approvals(&self.tokens.approver),
            run_id,
            apb::ApprovalState::Cancelled,
        )
        .await;
        let entries = self
            .approvals(&self.tokens.operator)
            .get_audit_log(apb::GetAuditLogRequest {
                request_id: request_id.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .entries;
        let last = entries.last().unwrap();
        assert_eq!(
            last.action,
            apb::AuditAction::Cancelled as i32,
            "{entries:?}"
        );
        assert!(
            last.reason.contains(why),
            "reason {:?} should say {why:?}",
            last.reason
        );
    }

    async fn answer_input(&self, run_id: &str, request_id: &str, action: rpb::ResolveAction) {
        self.runner(&self.tokens.submitter)
            .resolve(rpb::ResolveRequest {
                run_id: run_id.into(),
                request_id: request_id.into(),
                decision_id: format!("input-{run_id}"),
                action: action as i32,
                result: Some(to_proto_value(&json!({"text": "done"}))),
                reason: "not needed".into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_ends_in_any_way_cancels_its_pending_approvals() {
    let case = Case::start().await;
    let runner = case.runner(&case.tokens.submitter);

    // Succeeded: the other branch of a one-of-two parallel finished the run.
    let (gate, input) = case.waiting(tree("one-of-two", 1), "succeeds").await;
    case.answer_input("succeeds", &input, rpb::ResolveAction::Resume)
        .await;
    wait_run(&runner, "succeeds", rpb::RunStatus::Succeeded).await;
    case.cancelled_because("succeeds", &gate, "parallel 'both' succeeded")
        .await;

    // Failed: the other branch of a two-of-two parallel was cancelled.
    let (gate, input) = case.waiting(tree("two-of-two", 2), "fails").await;
    case.answer_input("fails", &input, rpb::ResolveAction::Cancel)
        .await;
    wait_run(&runner, "fails", rpb::RunStatus::Failed).await;
    case.cancelled_because("fails", &gate, "parallel 'both' failed")
        .await;

    // Failed: someone with the runner's service role rejected the approval there directly.
    let (gate, _) = case.waiting(tree("two-of-two", 2), "rejected-direct").await;
    case.runner(&case.tokens.service)
        .resolve(rpb::ResolveRequest {
            run_id: "rejected-direct".into(),
            request_id: gate.clone(),
            decision_id: "direct".into(),
            decision_kind: rpb::DecisionKind::Reject as i32,
            reason: "no".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_run(&runner, "rejected-direct", rpb::RunStatus::Failed).await;
    case.cancelled_because("rejected-direct", &gate, "consumed decision 'direct'")
        .await;

    // Cancelled.
    let (gate, _) = case.waiting(tree("two-of-two", 2), "cancelled").await;
    case.runner(&case.tokens.operator)
        .cancel_run(rpb::CancelRunRequest {
            run_id: "cancelled".into(),
            reason: "changed my mind".into(),
        })
        .await
        .unwrap();
    wait_run(&runner, "cancelled", rpb::RunStatus::Cancelled).await;
    case.cancelled_because("cancelled", &gate, "changed my mind")
        .await;

    // Interrupted: the thread's started run is cancelled.
    let (gate, _) = case.waiting(tree("two-of-two", 2), "interrupted").await;
    case.runner(&case.tokens.operator)
        .interrupt_thread(rpb::InterruptThreadRequest {
            thread_id: "interrupted".into(),
            reason: "new plan".into(),
            next: None,
        })
        .await
        .unwrap();
    wait_run(&runner, "interrupted", rpb::RunStatus::Cancelled).await;
    case.cancelled_because("interrupted", &gate, "new plan")
        .await;
}
