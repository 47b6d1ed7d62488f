//! Authentication and roles through both release binaries: what each role may and may not do,
//! that only approval-svc's service identity resolves approvals on the runner, that nobody
//! approves a run they submitted, that missing / unknown / expired tokens are UNAUTHENTICATED,
//! and that a service without tokens refuses to listen beyond loopback unless `--insecure`. Read
//! rights (who reads which runs, events and approvals) are in `auth/reads.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use arbor_shared::{
    json::to_proto_value,
    proto::{approval::v1 as apb, runner::v1 as rpb},
};
use arbor_tests::{
    Binaries, Cluster, Profile, Service, ServiceKind, WAIT,
    auth::{APPROVER, SUBMITTER_APPROVER, Tokens},
    chaos::verify::full_log,
    clients::{approvals_as, runner_as, workers_as},
    eventually, gate_tree,
    process::{free_port, run_to_exit},
    secured::{register, submit, wait_approval, wait_run},
};
use serde_json::json;
use tonic::Code;

mod reads;

fn code<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

fn decide(request_id: &str, decision: rpb::DecisionKind) -> apb::ResolveRequest {
    apb::ResolveRequest {
        request_id: request_id.into(),
        decision: decision as i32,
        ..Default::default()
    }
}

/// The demo tree: a gate around a ledger append, then user input.
fn demo() -> String {
    arbor_tests::demo_tree()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_may_do_its_job_and_nothing_else() {
    let (cluster, t) = Cluster::start_secure(Profile::Debug).await;
    let (r, a) = (cluster.runner.url(), cluster.approval.url());
    let mut sam = runner_as(&r, Some(&t.submitter));
    let mut alice_r = runner_as(&r, Some(&t.approver));
    let mut olga = runner_as(&r, Some(&t.operator));
    let mut svc = runner_as(&r, Some(&t.service));
    let mut bob_r = runner_as(&r, Some(&t.submitter_approver));
    let mut alice = approvals_as(&a, Some(&t.approver));
    let mut sam_a = approvals_as(&a, Some(&t.submitter));

    // Submitter: registers and submits; approver: neither.
    register(&mut sam, demo()).await;
    let refused = alice_r
        .register_tree(rpb::RegisterTreeRequest {
            document: gate_tree("alice-tree", "failure"),
            format: 0,
        })
        .await;
    assert_eq!(code(refused), Code::PermissionDenied, "approver registers");
    let refused = alice_r
        .submit_run(rpb::SubmitRunRequest {
            tree_id: "deploy-service".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(refused), Code::PermissionDenied, "approver submits");
    submit(&mut sam, "deploy-service", "auth-run").await;
    let approval = wait_approval(&alice, "auth-run", apb::ApprovalState::Pending).await;
    let request_id = approval.request_id.clone();
    assert_eq!(approval.request.unwrap().submitted_by, "sam");

    // Submitter: may not read or decide approvals, nor resolve them on the runner.
    let listed = sam_a
        .list_approvals(apb::ListApprovalsRequest::default())
        .await;
    assert_eq!(
        code(listed),
        Code::PermissionDenied,
        "submitter lists approvals"
    );
    let decided = sam_a
        .resolve(decide(&request_id, rpb::DecisionKind::Approve))
        .await;
    assert_eq!(code(decided), Code::PermissionDenied, "submitter decides");
    // Only the service identity may resolve an approval on the runner: not the submitter,
    // not an approver going around approval-svc, not an operator.
    for (who, client) in [
        ("submitter", &mut sam),
        ("approver", &mut alice_r),
        ("operator", &mut olga),
    ] {
        let direct = client
            .resolve(rpb::ResolveRequest {
                run_id: "auth-run".into(),
                request_id: request_id.clone(),
                decision_id: format!("direct-{who}"),
                action: rpb::ResolveAction::Resume as i32,
                ..Default::default()
            })
            .await;
        assert_eq!(
            code(direct),
            Code::PermissionDenied,
            "{who} resolves an approval on the runner"
        );
    }

    // Jobs are for operators: a submitter may neither list nor requeue them.
    let jobs = sam.list_jobs(rpb::ListJobsRequest::default()).await;
    assert_eq!(code(jobs), Code::PermissionDenied, "submitter lists jobs");
    let job_id = olga
        .list_jobs(rpb::ListJobsRequest {
            run_id: "auth-run".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs[0]
        .job_id
        .clone();
    let requeue = |job_id: String| rpb::RequeueJobRequest { job_id };
    assert_eq!(
        code(sam.requeue_job(requeue(job_id.clone())).await),
        Code::PermissionDenied,
        "submitter requeues"
    );
    assert_eq!(
        code(alice_r.requeue_job(requeue(job_id.clone())).await),
        Code::PermissionDenied,
        "approver requeues"
    );
    // The operator gets past the role check (the job is not dead-lettered).
    assert_eq!(
        code(olga.requeue_job(requeue(job_id)).await),
        Code::FailedPrecondition,
        "operator requeues"
    );

    // Another submitter may not cancel or interrupt sam's work.
    let cancel = bob_r
        .cancel_run(rpb::CancelRunRequest {
            run_id: "auth-run".into(),
            reason: "mine now".into(),
        })
        .await;
    assert_eq!(
        code(cancel),
        Code::PermissionDenied,
        "another submitter cancels"
    );
    let interrupt = bob_r
        .interrupt_thread(rpb::InterruptThreadRequest {
            thread_id: "auth-run".into(),
            reason: "mine now".into(),
            next: None,
        })
        .await;
    assert_eq!(
        code(interrupt),
        Code::PermissionDenied,
        "another submitter interrupts"
    );

    // Durable cursors decide what a subscriber will never see again: only services and
    // operators may move them, so nobody else can make approval-svc skip events.
    let ack = |seq: u64| rpb::AckRequest {
        subscriber_id: "approval-svc".into(),
        seq,
    };
    assert_eq!(
        code(sam.ack(ack(1)).await),
        Code::PermissionDenied,
        "submitter moves approval-svc's cursor"
    );
    assert_eq!(
        code(alice_r.ack(ack(1)).await),
        Code::PermissionDenied,
        "approver moves approval-svc's cursor"
    );

    // Approver decides; approval-svc (service) delivers; the submitter answers the user input.
    let decided = alice
        .resolve(decide(&request_id, rpb::DecisionKind::Approve))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        decided.approval.unwrap().decision.unwrap().decided_by,
        APPROVER
    );
    let input = eventually("the run to wait for release notes", WAIT, || {
        let mut sam = sam.clone();
        async move {
            let run = sam
                .get_run(rpb::GetRunRequest {
                    run_id: "auth-run".into(),
                })
                .await
                .ok()?
                .into_inner()
                .run?;
            run.suspensions
                .into_iter()
                .find(|s| s.category == rpb::SuspensionCategory::RequireUserInput as i32)
        }
    })
    .await;
    sam.resolve(rpb::ResolveRequest {
        run_id: "auth-run".into(),
        request_id: input.request_id.clone(),
        decision_id: "notes".into(),
        action: rpb::ResolveAction::Resume as i32,
        result: Some(to_proto_value(&json!({"text": "Billing v2"}))),
        ..Default::default()
    })
    .await
    .unwrap();
    wait_run(&sam, "auth-run", rpb::RunStatus::Succeeded).await;
    // The runner records who decided: the approver, passed on by the service identity.
    let log = full_log(&mut olga).await.unwrap();
    let resolved: Vec<_> = log
        .iter()
        .filter_map(|e| match &e.detail {
            Some(rpb::event::Detail::ApprovalResolved(d)) if d.request_id == request_id => {
                Some(d.decided_by.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(resolved, [APPROVER]);
    // approval-svc's own identity moves its cursor.
    let last = log.last().unwrap().seq;
    assert_eq!(
        code(svc.ack(ack(last)).await),
        Code::Ok,
        "service acks its cursor"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_approves_a_run_they_submitted() {
    let (cluster, t) = Cluster::start_secure(Profile::Debug).await;
    let mut bob_r = runner_as(&cluster.runner.url(), Some(&t.submitter_approver));
    let mut bob = approvals_as(&cluster.approval.url(), Some(&t.submitter_approver));
    let mut alice = approvals_as(&cluster.approval.url(), Some(&t.approver));
    register(&mut bob_r, gate_tree("own-gate", "failure")).await;
    submit(&mut bob_r, "own-gate", "bobs-run").await;
    let approval = wait_approval(&alice, "bobs-run", apb::ApprovalState::Pending).await;
    assert_eq!(approval.request.unwrap().submitted_by, SUBMITTER_APPROVER);

    for decision in [rpb::DecisionKind::Approve, rpb::DecisionKind::Reject] {
        let own = bob.resolve(decide(&approval.request_id, decision)).await;
        assert_eq!(
            code(own),
            Code::PermissionDenied,
            "bob decides his own run ({decision:?})"
        );
    }
    let bulk = bob
        .bulk_resolve(apb::BulkResolveRequest {
            request_ids: vec![approval.request_id.clone()],
            decision: rpb::DecisionKind::Approve as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        bulk.items[0].code,
        Code::PermissionDenied as i32,
        "bulk decision on his own run"
    );
    let still = wait_approval(&alice, "bobs-run", apb::ApprovalState::Pending).await;
    assert!(still.decision.is_none());

    alice
        .resolve(decide(&approval.request_id, rpb::DecisionKind::Approve))
        .await
        .unwrap();
    wait_run(&bob_r, "bobs-run", rpb::RunStatus::Succeeded).await;
    let audit = alice
        .get_audit_log(apb::GetAuditLogRequest {
            request_id: approval.request_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let deciders: Vec<_> = audit
        .entries
        .iter()
        .filter(|e| e.action == apb::AuditAction::Decided as i32)
        .map(|e| e.actor.clone())
        .collect();
    assert_eq!(deciders, [APPROVER]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_unknown_and_expired_tokens_are_unauthenticated_on_both_services() {
    let (cluster, t) = Cluster::start_secure(Profile::Debug).await;
    for (what, token) in [
        ("missing", None),
        ("unknown", Some("no-such-token")),
        ("expired", Some(t.expired.as_str())),
    ] {
        let mut runner = runner_as(&cluster.runner.url(), token);
        let mut approvals = approvals_as(&cluster.approval.url(), token);
        let listed = runner.list_runs(rpb::ListRunsRequest::default()).await;
        assert_eq!(code(listed), Code::Unauthenticated, "runner, {what} token");
        let submitted = runner
            .submit_run(rpb::SubmitRunRequest {
                tree_id: "x".into(),
                ..Default::default()
            })
            .await;
        assert_eq!(
            code(submitted),
            Code::Unauthenticated,
            "runner submit, {what} token"
        );
        let pending = approvals
            .list_approvals(apb::ListApprovalsRequest::default())
            .await;
        assert_eq!(
            code(pending),
            Code::Unauthenticated,
            "approval-svc, {what} token"
        );
        let decided = approvals
            .resolve(decide("x", rpb::DecisionKind::Approve))
            .await;
        assert_eq!(
            code(decided),
            Code::Unauthenticated,
            "approval-svc resolve, {what} token"
        );
    }
    // The same calls with a valid token get past authentication.
    let mut olga = runner_as(&cluster.runner.url(), Some(&t.operator));
    assert_eq!(
        code(olga.list_runs(rpb::ListRunsRequest::default()).await),
        Code::Ok
    );
}

/// Tasks are for workers: only the `worker` (or `service`) role takes, heartbeats and completes
/// them, operators may list them, and a worker's token does nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_workers_take_and_finish_tasks() {
    let (cluster, t) = Cluster::start_secure(Profile::Debug).await;
    let r = cluster.runner.url();
    let mut sam = runner_as(&r, Some(&t.submitter));
    let tree = json!({"id": "auth-remote", "version": 1, "task_types": ["auth.echo"],
        "root": {"type": "tool", "name": "call", "tool": "auth.echo",
                 "args": {"n": 1}, "output": "out"}});
    register(&mut sam, tree.to_string()).await;
    submit(&mut sam, "auth-remote", "auth-remote-run").await;
    let poll = |wait_ms| rpb::PollTasksRequest {
        worker_id: "w".into(),
        task_types: vec!["auth.*".into()],
        max_tasks: 1,
        lease_ms: 30_000,
        wait_ms,
    };
    for (who, token) in [
        ("submitter", Some(t.submitter.as_str())),
        ("operator", Some(t.operator.as_str())),
        ("approver", Some(t.approver.as_str())),
    ] {
        let taken = workers_as(&r, token).poll_tasks(poll(0)).await;
        assert_eq!(code(taken), Code::PermissionDenied, "{who} takes tasks");
    }
    let anonymous = workers_as(&r, None).poll_tasks(poll(0)).await;
    assert_eq!(code(anonymous), Code::Unauthenticated);
    let listed = workers_as(&r, Some(&t.submitter))
        .list_tasks(rpb::ListTasksRequest::default())
        .await;
    assert_eq!(
        code(listed),
        Code::PermissionDenied,
        "submitter lists tasks"
    );

    let mut wendy = workers_as(&r, Some(&t.worker));
    let task = wendy
        .poll_tasks(poll(10_000))
        .await
        .unwrap()
        .into_inner()
        .tasks
        .pop()
        .expect("the worker takes the task");
    // Only the lease holder's token acts on it: the role alone is not enough.
    let foreign = workers_as(&r, Some(&t.service))
        .complete_task(rpb::CompleteTaskRequest {
            task_id: task.task_id.clone(),
            lease_token: "not-the-lease".into(),
            output: Some(to_proto_value(&json!({"n": 0}))),
        })
        .await;
    assert_eq!(code(foreign), Code::Aborted);
    let done = wendy
        .complete_task(rpb::CompleteTaskRequest {
            task_id: task.task_id.clone(),
            lease_token: task.lease_token.clone(),
            output: Some(to_proto_value(&json!({"n": 2}))),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(done.accepted);
    let run = wait_run(&sam, "auth-remote-run", rpb::RunStatus::Succeeded).await;
    assert_eq!(
        arbor_shared::json::from_proto_struct(run.blackboard.as_ref().unwrap())["out"],
        json!({"n": 2})
    );
    let listed = workers_as(&r, Some(&t.operator))
        .list_tasks(rpb::ListTasksRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.tasks.len(), 1);
    assert_eq!(listed.tasks[0].worker_id, "w");
    // A worker's token submits nothing.
    let mut wendy_r = runner_as(&r, Some(&t.worker));
    let submitted = wendy_r
        .submit_run(rpb::SubmitRunRequest {
            tree_id: "auth-remote".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(submitted), Code::PermissionDenied, "worker submits");
}

/// approval-svc holding an operator's token instead of its service identity (enough to follow
/// the runner's log as a durable subscriber, which an approver's token is not) cannot slip a
/// decision into a run: the runner refuses the delivery and the run stays suspended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_service_identity_delivers_decisions_to_the_runner() {
    let mut cluster = Cluster::prepare(Profile::Debug, Vec::new(), Vec::new());
    let t = Tokens::write(cluster.dir.path());
    std::fs::write(&t.runner_token_file, &t.operator).unwrap();
    cluster.runner.extra_args.extend(t.runner_args());
    cluster.approval.extra_args.extend(t.approval_args());
    let runner_url = cluster.runner.url();
    cluster.start_routed(&runner_url).await;
    let mut sam = runner_as(&cluster.runner.url(), Some(&t.submitter));
    let alice = approvals_as(&cluster.approval.url(), Some(&t.approver));
    register(&mut sam, gate_tree("wrong-identity", "failure")).await;
    submit(&mut sam, "wrong-identity", "guarded-run").await;
    let approval = wait_approval(&alice, "guarded-run", apb::ApprovalState::Pending).await;
    alice
        .clone()
        .resolve(decide(&approval.request_id, rpb::DecisionKind::Approve))
        .await
        .unwrap();
    let refused = eventually("the runner to refuse the delivery", WAIT, || {
        let mut alice = alice.clone();
        let id = approval.request_id.clone();
        async move {
            let a = alice
                .get_approval(apb::GetApprovalRequest { request_id: id })
                .await
                .ok()?
                .into_inner()
                .approval?;
            (a.delivery_attempts > 0 && !a.last_delivery_error.is_empty()).then_some(a)
        }
    })
    .await;
    assert!(
        refused
            .last_delivery_error
            .to_lowercase()
            .contains("permission"),
        "{}",
        refused.last_delivery_error
    );
    assert_eq!(
        refused.state,
        apb::ApprovalState::Resolved as i32,
        "still waiting to deliver"
    );
    let run = wait_run(&sam, "guarded-run", rpb::RunStatus::Suspended).await;
    assert_eq!(run.suspensions[0].request_id, approval.request_id);
}

async fn refuses_public_bind_without_tokens(kind: ServiceKind) {
    let bins = Binaries::get(Profile::Debug);
    let binary = match kind {
        ServiceKind::Runner => bins.runner.clone(),
        ServiceKind::Approval => bins.approval.clone(),
    };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let args = vec![
        "serve".to_string(),
        "--listen".into(),
        format!("0.0.0.0:{port}"),
        "--data-dir".into(),
        dir.path().join("data").display().to_string(),
    ];
    let exited = run_to_exit(&binary, &args, Duration::from_secs(20)).await;
    assert!(
        !exited.timed_out,
        "{kind:?} kept running on 0.0.0.0 without tokens"
    );
    assert_ne!(exited.code, Some(0), "{kind:?} exit code");
    assert!(
        exited.code.is_some(),
        "{kind:?} ended by a signal: {}",
        exited.stderr
    );
    assert!(
        exited.stderr.contains("without authentication") && exited.stderr.contains("--insecure"),
        "{kind:?} says why and what to do: {}",
        exited.stderr
    );
    assert!(!exited.stderr.contains("panicked"), "{}", exited.stderr);

    // --insecure: serves on every interface (reached here through loopback), stops cleanly.
    let mut service = Service::new(kind, binary, dir.path(), vec!["--insecure".into()]);
    service.addr = format!("0.0.0.0:{port}").parse().unwrap();
    service.start().await;
    assert_eq!(service.stop().await, Some(0), "{kind:?} stops cleanly");
    let log = std::fs::read_to_string(&service.log).unwrap();
    assert!(
        log.contains("WITHOUT authentication"),
        "{kind:?} warns: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_only_loopback_unless_insecure() {
    refuses_public_bind_without_tokens(ServiceKind::Runner).await;
    refuses_public_bind_without_tokens(ServiceKind::Approval).await;
}
