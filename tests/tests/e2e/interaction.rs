//! The three suspension kinds through gRPC and both real binaries: user input (a schema
//! violation is refused and the run stays suspended, then valid input is accepted), external
//! results, and a tool call approved with edited arguments.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arbor_shared::{
    json::{from_proto_struct, to_proto_value},
    proto::{
        approval::v1 as apb,
        runner::v1::{self as rpb, runner_service_client::RunnerServiceClient},
    },
};
use arbor_tests::{Cluster, Profile, WAIT, eventually};
use serde_json::json;
use tonic::{Code, transport::Channel};

async fn submit(runner: &mut RunnerServiceClient<Channel>, tree: serde_json::Value) -> String {
    let tree = runner
        .register_tree(rpb::RegisterTreeRequest {
            document: tree.to_string(),
            format: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .tree
        .unwrap();
    runner
        .submit_run(rpb::SubmitRunRequest {
            tree_id: tree.id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
        .run_id
}

async fn waiting(
    runner: &RunnerServiceClient<Channel>,
    run_id: &str,
    category: rpb::SuspensionCategory,
) -> rpb::Suspension {
    eventually("the run to suspend", WAIT, || {
        let mut runner = runner.clone();
        let run_id = run_id.to_string();
        async move {
            let run = runner
                .get_run(rpb::GetRunRequest { run_id })
                .await
                .ok()?
                .into_inner()
                .run?;
            run.suspensions
                .into_iter()
                .find(|s| s.category == category as i32)
        }
    })
    .await
}

async fn finished(runner: &RunnerServiceClient<Channel>, run_id: &str) -> rpb::Run {
    eventually("the run to finish", WAIT, || {
        let mut runner = runner.clone();
        let run_id = run_id.to_string();
        async move {
            let run = runner
                .get_run(rpb::GetRunRequest { run_id })
                .await
                .ok()?
                .into_inner()
                .run?;
            matches!(
                rpb::RunStatus::try_from(run.status),
                Ok(rpb::RunStatus::Succeeded | rpb::RunStatus::Failed)
            )
            .then_some(run)
        }
    })
    .await
}

fn answer(
    run_id: &str,
    request_id: &str,
    decision_id: &str,
    result: serde_json::Value,
) -> rpb::ResolveRequest {
    rpb::ResolveRequest {
        run_id: run_id.into(),
        request_id: request_id.into(),
        decision_id: decision_id.into(),
        action: rpb::ResolveAction::Resume as i32,
        result: Some(to_proto_value(&result)),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_input_is_validated_against_its_schema_and_external_results_resume() {
    let cluster = Cluster::start(Profile::Debug).await;
    let mut runner = cluster.runner_client().await;
    let run_id = submit(
        &mut runner,
        json!({"id": "ask", "version": 1, "root": {"type": "sequence", "name": "main", "children": [
            {"type": "user_input", "name": "replicas", "input_kind": "number", "prompt": "How many replicas?",
             "schema": {"type": "integer", "minimum": 1, "maximum": 10}, "output": "replicas"},
            {"type": "external", "name": "provision", "execution_kind": "webhook",
             "task": {"replicas": {"$ref": "replicas"}}, "output": "provisioned"}
        ]}}),
    )
    .await;

    let input = waiting(&runner, &run_id, rpb::SuspensionCategory::RequireUserInput).await;
    assert_eq!(
        input.reason,
        rpb::SuspensionReason::AwaitingUserInput as i32
    );
    let err = runner
        .resolve(answer(
            &run_id,
            &input.request_id,
            "d-bad",
            json!({"value": 42}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("result.value"), "{}", err.message());
    let still = waiting(&runner, &run_id, rpb::SuspensionCategory::RequireUserInput).await;
    assert_eq!(
        still.request_id, input.request_id,
        "the run stays suspended on the same request"
    );

    runner
        .resolve(answer(
            &run_id,
            &input.request_id,
            "d-good",
            json!({"value": 3}),
        ))
        .await
        .unwrap();
    let external = waiting(
        &runner,
        &run_id,
        rpb::SuspensionCategory::RequireExternalExecution,
    )
    .await;
    let payload = arbor_shared::json::from_optional_value(external.payload.as_ref());
    assert_eq!(
        payload["task"],
        json!({"replicas": 3}),
        "the task saw the input"
    );
    runner
        .resolve(answer(
            &run_id,
            &external.request_id,
            "d-ext",
            json!({"status": "succeeded", "result": {"cluster": "eu-1"}}),
        ))
        .await
        .unwrap();
    let run = finished(&runner, &run_id).await;
    assert_eq!(
        run.status,
        rpb::RunStatus::Succeeded as i32,
        "{}",
        run.error
    );
    let bb = from_proto_struct(&run.blackboard.unwrap());
    assert_eq!(bb["replicas"], json!(3));
    assert_eq!(bb["provisioned"], json!({"cluster": "eu-1"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_approved_with_edited_arguments_runs_with_the_edit() {
    let cluster = Cluster::start(Profile::Debug).await;
    let mut runner = cluster.runner_client().await;
    let run_id = submit(
        &mut runner,
        json!({"id": "edit", "version": 1, "root": {"type": "tool", "name": "scale", "tool": "ledger.append",
            "policy": "ask", "resume_mode": "pass_decision_to_tool",
            "args": {"entry": {"replicas": 30}}, "output": "receipt"}}),
    )
    .await;
    let approvals = cluster.approval_client().await;
    let pending = eventually("the tool approval", WAIT, || {
        let mut approvals = approvals.clone();
        let run_id = run_id.clone();
        async move {
            approvals
                .list_approvals(apb::ListApprovalsRequest {
                    filter: Some(apb::ApprovalFilter {
                        run_id,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
                .ok()?
                .into_inner()
                .approvals
                .into_iter()
                .next()
        }
    })
    .await;
    let request = pending.request.clone().unwrap();
    assert_eq!(request.kind, rpb::ApprovalKind::Tool as i32);
    assert_eq!(request.tool_name, "ledger.append");
    assert!(
        request
            .allowed_decisions
            .contains(&(rpb::DecisionKind::Edit as i32))
    );

    let edited = json!({"entry": {"replicas": 3}});
    approvals
        .clone()
        .resolve(apb::ResolveRequest {
            request_id: pending.request_id.clone(),
            decision: rpb::DecisionKind::Edit as i32,
            reason: "30 is too many".into(),
            args: Some(to_proto_value(&edited)),
            ..Default::default()
        })
        .await
        .unwrap();
    let run = finished(&runner, &run_id).await;
    assert_eq!(
        run.status,
        rpb::RunStatus::Succeeded as i32,
        "{}",
        run.error
    );
    let bb = from_proto_struct(&run.blackboard.unwrap());
    assert_eq!(
        bb["receipt"]["entry"],
        json!({"replicas": 3}),
        "the tool ran with the edited args"
    );
}
