//! The approval loop of DESIGN §6 through both real binaries: approve and reject paths, the
//! event order, the approval acked and pruned, crash/restart of each service (`consumed_crash` too), bad input, and
//! what a runner that is away costs approval-svc (`runner_away`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod consumed_crash;
mod runner_away;

use arbor_shared::proto::{
    approval::v1 as apb,
    runner::v1::{self as rpb, runner_service_client::RunnerServiceClient},
};
use arbor_tests::{Cluster, Profile, WAIT, eventually, gate_tree};
use tonic::{Code, transport::Channel};

async fn register_and_submit(runner: &mut RunnerServiceClient<Channel>, tree: String) -> rpb::Run {
    let tree = runner
        .register_tree(rpb::RegisterTreeRequest {
            document: tree,
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
            tree_version: tree.version,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
}

/// Waits for the run's approval to show up as PENDING in approval-svc.
async fn pending_approval(cluster: &Cluster, run_id: &str) -> apb::Approval {
    let approvals = cluster.approval_client().await;
    eventually("the approval to be pending", WAIT, || {
        let mut approvals = approvals.clone();
        let run_id = run_id.to_string();
        async move {
            let page = approvals
                .list_approvals(apb::ListApprovalsRequest {
                    filter: Some(apb::ApprovalFilter {
                        run_id,
                        states: vec![apb::ApprovalState::Pending as i32],
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
                .ok()?
                .into_inner();
            page.approvals.into_iter().next()
        }
    })
    .await
}

async fn run_status(runner: &mut RunnerServiceClient<Channel>, run_id: &str) -> rpb::Run {
    runner
        .get_run(rpb::GetRunRequest {
            run_id: run_id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
}

async fn wait_run(cluster: &Cluster, run_id: &str, status: rpb::RunStatus) -> rpb::Run {
    let runner = cluster.runner_client().await;
    eventually(&format!("run {run_id} to be {status:?}"), WAIT, || {
        let mut runner = runner.clone();
        async move {
            let run = run_status(&mut runner, run_id).await;
            (run.status == status as i32).then_some(run)
        }
    })
    .await
}

/// The events of a finished run. Streams carry only durable events, and GetRun can show the
/// final status a moment before the flush that makes the run's last events durable, so this
/// waits until the terminal event is there.
async fn events_of(runner: &mut RunnerServiceClient<Channel>, run_id: &str) -> Vec<rpb::Event> {
    use rpb::EventKind as K;
    let terminal = [
        K::RunSucceeded,
        K::RunFailed,
        K::RunCancelled,
        K::RunSuperseded,
    ];
    eventually("the run's terminal event to be streamed", WAIT, || {
        let mut runner = runner.clone();
        let run_id = run_id.to_string();
        async move {
            let mut stream = runner
                .stream_events(rpb::StreamEventsRequest {
                    after_seq: Some(0),
                    filter: Some(rpb::EventFilter {
                        run_id,
                        ..Default::default()
                    }),
                    follow: false,
                    ..Default::default()
                })
                .await
                .ok()?
                .into_inner();
            let mut out = Vec::new();
            while let Some(item) = stream.message().await.ok()? {
                out.push(item.event?);
            }
            let last = out.last().and_then(|e| K::try_from(e.kind).ok())?;
            terminal.contains(&last).then_some(out)
        }
    })
    .await
}

async fn wait_approval_state(
    cluster: &Cluster,
    request_id: &str,
    state: apb::ApprovalState,
) -> apb::Approval {
    let approvals = cluster.approval_client().await;
    eventually(
        &format!("approval {request_id} to be {state:?}"),
        WAIT,
        || {
            let mut approvals = approvals.clone();
            let request_id = request_id.to_string();
            async move {
                let a = approvals
                    .get_approval(apb::GetApprovalRequest { request_id })
                    .await
                    .ok()?
                    .into_inner()
                    .approval?;
                (a.state == state as i32).then_some(a)
            }
        },
    )
    .await
}

fn decide(request_id: &str, decision: rpb::DecisionKind, reason: &str) -> apb::ResolveRequest {
    apb::ResolveRequest {
        request_id: request_id.into(),
        decision: decision as i32,
        reason: reason.into(),
        ..Default::default()
    }
}

fn kinds_of_interest(events: &[rpb::Event]) -> Vec<(u64, rpb::EventKind)> {
    use rpb::EventKind as K;
    events
        .iter()
        .filter_map(|e| {
            let k = K::try_from(e.kind).ok()?;
            matches!(
                k,
                K::ApprovalRequested
                    | K::ExecutionSuspended
                    | K::ApprovalResolved
                    | K::ExecutionResumed
                    | K::ApprovalConsumed
                    | K::RunSucceeded
                    | K::RunFailed
            )
            .then_some((e.seq, k))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_gate_runs_to_success_with_events_in_order_and_the_approval_pruned() {
    let cluster = Cluster::start(Profile::Debug).await;
    let mut runner = cluster.runner_client().await;
    let run = register_and_submit(&mut runner, gate_tree("ship", "failure")).await;
    let approval = pending_approval(&cluster, &run.run_id).await;
    let request = approval.request.clone().unwrap();
    assert_eq!(request.title, "Ship it?");
    assert!(request.context.unwrap().fields["plan"].kind.is_some());

    let resolved = cluster
        .approval_client()
        .await
        .resolve(decide(
            &approval.request_id,
            rpb::DecisionKind::Approve,
            "looks good",
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!resolved.duplicate);

    let done = wait_run(&cluster, &run.run_id, rpb::RunStatus::Succeeded).await;
    let bb = done.blackboard.unwrap();
    assert!(bb.fields.contains_key("receipt"), "the gated tool ran");
    assert!(bb.fields.contains_key("done"));

    let events = events_of(&mut runner, &run.run_id).await;
    let got = kinds_of_interest(&events);
    use rpb::EventKind as K;
    let want = [
        K::ApprovalRequested,
        K::ExecutionSuspended,
        K::ApprovalResolved,
        K::ExecutionResumed,
        K::ApprovalConsumed,
        K::RunSucceeded,
    ];
    assert_eq!(
        got.iter().map(|(_, k)| *k).collect::<Vec<_>>(),
        want,
        "events: {got:?}"
    );
    assert!(
        got.windows(2).all(|w| w[0].0 < w[1].0),
        "seq strictly increasing: {got:?}"
    );

    let pruned =
        wait_approval_state(&cluster, &approval.request_id, apb::ApprovalState::Pruned).await;
    assert_eq!(
        pruned.decision.unwrap().kind,
        rpb::DecisionKind::Approve as i32
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_gate_fails_the_run_and_the_tool_never_runs() {
    let cluster = Cluster::start(Profile::Debug).await;
    let mut runner = cluster.runner_client().await;
    let run = register_and_submit(&mut runner, gate_tree("ship-reject", "failure")).await;
    let approval = pending_approval(&cluster, &run.run_id).await;
    cluster
        .approval_client()
        .await
        .resolve(decide(
            &approval.request_id,
            rpb::DecisionKind::Reject,
            "not today",
        ))
        .await
        .unwrap();
    let failed = wait_run(&cluster, &run.run_id, rpb::RunStatus::Failed).await;
    assert!(
        failed.error.contains("not today") || failed.error.contains("reject"),
        "error: {}",
        failed.error
    );
    assert!(!failed.blackboard.unwrap().fields.contains_key("receipt"));
    let events = events_of(&mut runner, &run.run_id).await;
    let kinds: Vec<_> = kinds_of_interest(&events)
        .into_iter()
        .map(|(_, k)| k)
        .collect();
    use rpb::EventKind as K;
    assert_eq!(
        kinds,
        [
            K::ApprovalRequested,
            K::ExecutionSuspended,
            K::ApprovalResolved,
            K::ExecutionResumed,
            K::ApprovalConsumed,
            K::RunFailed
        ]
    );
    wait_approval_state(&cluster, &approval.request_id, apb::ApprovalState::Pruned).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_killed_while_suspended_keeps_the_run_and_completes_after_restart() {
    let mut cluster = Cluster::start(Profile::Debug).await;
    let mut runner = cluster.runner_client().await;
    let run = register_and_submit(&mut runner, gate_tree("ship-crash", "failure")).await;
    let approval = pending_approval(&cluster, &run.run_id).await;

    cluster.runner.kill().await;
    cluster.runner.start().await;
    let mut runner = cluster.runner_client().await;
    let restored = run_status(&mut runner, &run.run_id).await;
    assert_eq!(restored.status, rpb::RunStatus::Suspended as i32);
    assert_eq!(restored.suspensions[0].request_id, approval.request_id);

    cluster
        .approval_client()
        .await
        .resolve(decide(&approval.request_id, rpb::DecisionKind::Approve, ""))
        .await
        .unwrap();
    wait_run(&cluster, &run.run_id, rpb::RunStatus::Succeeded).await;
    wait_approval_state(&cluster, &approval.request_id, apb::ApprovalState::Pruned).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_svc_killed_between_decision_and_delivery_delivers_exactly_once() {
    let mut cluster = Cluster::start(Profile::Debug).await;
    let mut runner = cluster.runner_client().await;
    let run = register_and_submit(&mut runner, gate_tree("ship-deliver", "failure")).await;
    let approval = pending_approval(&cluster, &run.run_id).await;

    // With the runner down the decision can be stored but not delivered.
    cluster.runner.kill().await;
    cluster
        .approval_client()
        .await
        .resolve(decide(&approval.request_id, rpb::DecisionKind::Approve, ""))
        .await
        .unwrap();
    wait_approval_state(&cluster, &approval.request_id, apb::ApprovalState::Resolved).await;
    cluster.approval.kill().await;

    cluster.runner.start().await;
    let mut runner = cluster.runner_client().await;
    assert_eq!(
        run_status(&mut runner, &run.run_id).await.status,
        rpb::RunStatus::Suspended as i32
    );
    cluster.approval.start().await;

    let done = wait_run(&cluster, &run.run_id, rpb::RunStatus::Succeeded).await;
    wait_approval_state(&cluster, &approval.request_id, apb::ApprovalState::Pruned).await;
    let events = events_of(&mut runner, &run.run_id).await;
    let count = |k: rpb::EventKind| events.iter().filter(|e| e.kind == k as i32).count();
    assert_eq!(count(rpb::EventKind::ApprovalResolved), 1, "delivered once");
    assert_eq!(count(rpb::EventKind::ApprovalConsumed), 1, "consumed once");
    assert_eq!(
        done.blackboard.unwrap().fields["receipt"]
            .kind
            .as_ref()
            .map(|_| ()),
        Some(())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_right_code_and_changes_nothing() {
    let cluster = Cluster::start(Profile::Debug).await;
    let mut runner = cluster.runner_client().await;
    let mut approvals = cluster.approval_client().await;

    // Invalid tree: INVALID_ARGUMENT naming the bad path; nothing registered.
    let bad = r#"{"id": "bad", "version": 1, "root": {"type": "sequence", "children": [{"type": "nope"}]}}"#;
    let err = runner
        .register_tree(rpb::RegisterTreeRequest {
            document: bad.into(),
            format: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("$.root.children[0].type"),
        "{}",
        err.message()
    );
    let violations = arbor_shared::status::field_violations(&err);
    assert!(
        violations
            .iter()
            .any(|v| v.field == "$.root.children[0].type")
    );
    let missing = runner
        .get_tree(rpb::GetTreeRequest {
            tree_id: "bad".into(),
            version: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    // Unknown run and unknown request ids: NOT_FOUND.
    let err = runner
        .get_run(rpb::GetRunRequest {
            run_id: "no-such-run".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = approvals
        .resolve(decide("no-such-request", rpb::DecisionKind::Approve, ""))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let run = register_and_submit(&mut runner, gate_tree("ship-bad", "failure")).await;
    let approval = pending_approval(&cluster, &run.run_id).await;
    let err = runner
        .resolve(rpb::ResolveRequest {
            run_id: run.run_id.clone(),
            request_id: "0000000000000000000000000000000000000000".into(),
            decision_id: "d1".into(),
            action: rpb::ResolveAction::Resume as i32,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // The first decision stands: a different one is FAILED_PRECONDITION, the same one is OK.
    let first = approvals
        .resolve(decide(
            &approval.request_id,
            rpb::DecisionKind::Reject,
            "no",
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!first.duplicate);
    let err = approvals
        .resolve(decide(
            &approval.request_id,
            rpb::DecisionKind::Approve,
            "yes",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let again = approvals
        .resolve(decide(
            &approval.request_id,
            rpb::DecisionKind::Reject,
            "no",
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(again.duplicate);
    let failed = wait_run(&cluster, &run.run_id, rpb::RunStatus::Failed).await;
    assert!(
        !failed.blackboard.unwrap().fields.contains_key("receipt"),
        "the rejected tool never ran"
    );
    let stored = approvals
        .get_approval(apb::GetApprovalRequest {
            request_id: approval.request_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(
        stored.decision.unwrap().kind,
        rpb::DecisionKind::Reject as i32
    );
}
