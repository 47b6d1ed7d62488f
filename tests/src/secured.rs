//! Steps through the secured clients: waiting for the states a test steers runs and approvals
//! into, registering and submitting as a given principal.

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};

use crate::{
    WAIT,
    clients::{ApprovalClient, RunnerClient},
    eventually,
};

/// Waits until `run_id` has `status` (for SUSPENDED: with an active suspension).
pub async fn wait_run(runner: &RunnerClient, run_id: &str, status: rpb::RunStatus) -> rpb::Run {
    eventually(&format!("run {run_id} to be {status:?}"), WAIT, || {
        let mut runner = runner.clone();
        let run_id = run_id.to_string();
        async move {
            let run = runner
                .get_run(rpb::GetRunRequest { run_id })
                .await
                .ok()?
                .into_inner()
                .run?;
            let suspended_ok = status != rpb::RunStatus::Suspended || !run.suspensions.is_empty();
            (run.status == status as i32 && suspended_ok).then_some(run)
        }
    })
    .await
}

/// Waits until approval-svc holds an approval of `run_id` in `state`; returns it.
pub async fn wait_approval(
    approvals: &ApprovalClient,
    run_id: &str,
    state: apb::ApprovalState,
) -> apb::Approval {
    eventually(
        &format!("{run_id}'s approval to be {state:?}"),
        WAIT,
        || {
            let mut approvals = approvals.clone();
            let run_id = run_id.to_string();
            async move {
                let page = approvals
                    .list_approvals(apb::ListApprovalsRequest {
                        filter: Some(apb::ApprovalFilter {
                            run_id,
                            states: vec![state as i32],
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .await
                    .ok()?
                    .into_inner();
                page.approvals.into_iter().next()
            }
        },
    )
    .await
}

/// Registers `document` (JSON) as `who`.
pub async fn register(runner: &mut RunnerClient, document: String) -> rpb::Tree {
    runner
        .register_tree(rpb::RegisterTreeRequest {
            document,
            format: rpb::TreeFormat::Json as i32,
        })
        .await
        .expect("RegisterTree")
        .into_inner()
        .tree
        .expect("tree")
}

/// Submits a run of `tree_id` with a chosen run id.
pub async fn submit(runner: &mut RunnerClient, tree_id: &str, run_id: &str) -> rpb::Run {
    submit_input(runner, tree_id, run_id, serde_json::Map::new()).await
}

/// Submits a run of `tree_id` with a chosen run id and `input` as its initial blackboard.
pub async fn submit_input(
    runner: &mut RunnerClient,
    tree_id: &str,
    run_id: &str,
    input: serde_json::Map<String, serde_json::Value>,
) -> rpb::Run {
    runner
        .submit_run(rpb::SubmitRunRequest {
            tree_id: tree_id.into(),
            run_id: run_id.into(),
            input: (!input.is_empty()).then(|| arbor_shared::json::to_proto_struct(&input)),
            ..Default::default()
        })
        .await
        .expect("SubmitRun")
        .into_inner()
        .run
        .expect("run")
}
