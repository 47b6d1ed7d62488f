//! Read rights through both release binaries: a submitter reads its own runs, threads and
//! events and nobody else's; an approver reads approvals and the runs waiting for one;
//! operators, services and readers read everything; a principal without the right is refused
//! on every read RPC.

use std::collections::BTreeSet;

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::{
    Cluster, Profile,
    auth::Tokens,
    clients::{RunnerClient, approvals_as, runner_as, workers_as},
    gate_tree,
    secured::{register, submit, wait_approval, wait_run},
};
use serde_json::json;
use tonic::Code;

use super::code;

fn input_tree() -> String {
    json!({"id": "reads-input", "version": 1, "root": {"type": "user_input", "name": "ask",
        "input_kind": "text", "prompt": "Name?", "output": "answer"}})
    .to_string()
}

/// Every run a principal's ListRuns shows, read one run per page.
async fn listed(runner: &RunnerClient) -> Result<BTreeSet<String>, Code> {
    let mut runner = runner.clone();
    let (mut ids, mut page_token) = (BTreeSet::new(), String::new());
    loop {
        let page = runner
            .list_runs(rpb::ListRunsRequest {
                page_size: 1,
                page_token,
                ..Default::default()
            })
            .await
            .map_err(|s| s.code())?
            .into_inner();
        ids.extend(page.runs.into_iter().map(|r| r.run_id));
        if page.next_page_token.is_empty() {
            return Ok(ids);
        }
        page_token = page.next_page_token;
    }
}

/// The run ids of the events a (non-following) stream from the start delivers.
async fn streamed(
    runner: &RunnerClient,
    run_id: &str,
    thread_id: &str,
    subscriber_id: &str,
) -> Result<BTreeSet<String>, Code> {
    let mut runner = runner.clone();
    let mut stream = runner
        .stream_events(rpb::StreamEventsRequest {
            after_seq: Some(0),
            subscriber_id: subscriber_id.into(),
            filter: Some(rpb::EventFilter {
                run_id: run_id.into(),
                thread_id: thread_id.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .map_err(|s| s.code())?
        .into_inner();
    let mut runs = BTreeSet::new();
    while let Some(item) = stream.message().await.map_err(|s| s.code())? {
        runs.insert(item.event.expect("an event").run_id);
    }
    Ok(runs)
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submitters_read_their_own_runs_and_approvers_what_they_decide() {
    let (cluster, t) = Cluster::start_secure(Profile::Debug).await;
    let r = cluster.runner.url();
    let mut sam = runner_as(&r, Some(&t.submitter));
    let mut bob = runner_as(&r, Some(&t.submitter_approver));
    let alice = runner_as(&r, Some(&t.approver));
    let olga = runner_as(&r, Some(&t.operator));
    let rita = runner_as(&r, Some(&t.reader));
    register(&mut sam, gate_tree("reads-gate", "failure")).await;
    register(&mut sam, input_tree()).await;
    // sam's run waits for an approval, bob's for user input, and a run of sam's queues in
    // bob's thread behind it.
    submit(&mut sam, "reads-gate", "sams-run").await;
    submit(&mut bob, "reads-input", "bobs-run").await;
    sam.submit_run(rpb::SubmitRunRequest {
        tree_id: "reads-input".into(),
        run_id: "sams-guest-run".into(),
        thread_id: "bobs-run".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    wait_run(&olga, "sams-run", rpb::RunStatus::Suspended).await;
    wait_run(&olga, "bobs-run", rpb::RunStatus::Suspended).await;

    // GetRun: one's own runs; an approver also the runs waiting for an approval.
    for (who, client, run, expect) in [
        ("sam", &sam, "sams-run", Code::Ok),
        ("sam", &sam, "bobs-run", Code::PermissionDenied),
        ("sam", &sam, "no-such-run", Code::NotFound),
        ("bob", &bob, "bobs-run", Code::Ok),
        ("bob", &bob, "sams-run", Code::Ok),
        ("bob", &bob, "sams-guest-run", Code::PermissionDenied),
        ("alice", &alice, "sams-run", Code::Ok),
        ("alice", &alice, "bobs-run", Code::PermissionDenied),
        ("olga", &olga, "bobs-run", Code::Ok),
        ("rita", &rita, "sams-guest-run", Code::Ok),
    ] {
        let got = client
            .clone()
            .get_run(rpb::GetRunRequest { run_id: run.into() })
            .await;
        assert_eq!(code(got), expect, "{who} reads {run}");
    }

    // ListRuns shows what the caller may read, page by page, rather than failing.
    let all = set(&["bobs-run", "sams-guest-run", "sams-run"]);
    assert_eq!(listed(&sam).await, Ok(set(&["sams-guest-run", "sams-run"])));
    assert_eq!(listed(&bob).await, Ok(set(&["bobs-run", "sams-run"])));
    assert_eq!(listed(&alice).await, Ok(set(&["sams-run"])));
    assert_eq!(listed(&olga).await, Ok(all.clone()));
    assert_eq!(listed(&rita).await, Ok(all.clone()));

    // StreamEvents: one's own runs and threads; in a shared thread only one's own runs' events.
    let denied = Err(Code::PermissionDenied);
    assert_eq!(
        streamed(&sam, "sams-run", "", "").await,
        Ok(set(&["sams-run"]))
    );
    assert_eq!(streamed(&sam, "bobs-run", "", "").await, denied);
    assert_eq!(
        streamed(&sam, "", "bobs-run", "").await,
        Ok(set(&["sams-guest-run"]))
    );
    assert_eq!(
        streamed(&bob, "", "bobs-run", "").await,
        Ok(set(&["bobs-run"]))
    );
    assert_eq!(
        streamed(&alice, "sams-run", "", "").await,
        Ok(set(&["sams-run"]))
    );
    assert_eq!(streamed(&alice, "bobs-run", "", "").await, denied);
    assert_eq!(streamed(&alice, "", "bobs-run", "").await, denied);
    // The whole log is for operators, services and readers; a named (durable) subscription
    // for those who may move its cursor.
    assert_eq!(streamed(&sam, "", "", "").await, denied);
    assert_eq!(streamed(&bob, "", "", "").await, denied);
    assert_eq!(streamed(&olga, "", "", "").await, Ok(all.clone()));
    assert_eq!(streamed(&rita, "", "", "").await, Ok(all.clone()));
    assert_eq!(streamed(&rita, "", "", "dashboard").await, denied);
    assert_eq!(streamed(&sam, "sams-run", "", "sams-cursor").await, denied);

    // Resubmitting another's run id neither resumes it nor shows it.
    let taken = sam
        .submit_run(rpb::SubmitRunRequest {
            tree_id: "reads-input".into(),
            run_id: "bobs-run".into(),
            restore_policy: rpb::RestorePolicy::IfExists as i32,
            ..Default::default()
        })
        .await;
    assert_eq!(
        code(taken),
        Code::PermissionDenied,
        "sam resubmits bob's run"
    );

    // approval-svc: approvers and readers read approvals; a reader decides nothing.
    let a = cluster.approval.url();
    let approval = wait_approval(
        &approvals_as(&a, Some(&t.approver)),
        "sams-run",
        apb::ApprovalState::Pending,
    )
    .await;
    let mut rita_a = approvals_as(&a, Some(&t.reader));
    let seen = rita_a
        .get_approval(apb::GetApprovalRequest {
            request_id: approval.request_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(seen.approval.unwrap().request_id, approval.request_id);
    let decided = rita_a
        .resolve(apb::ResolveRequest {
            request_id: approval.request_id.clone(),
            decision: rpb::DecisionKind::Approve as i32,
            ..Default::default()
        })
        .await;
    assert_eq!(code(decided), Code::PermissionDenied, "a reader decides");
    let submitted = rita
        .clone()
        .submit_run(rpb::SubmitRunRequest {
            tree_id: "reads-gate".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(submitted), Code::PermissionDenied, "a reader submits");
    assert_eq!(
        listed(&olga).await,
        Ok(all),
        "the refused calls added nothing"
    );
}

/// The read RPCs of both services.
#[derive(Debug, Clone, Copy)]
enum Read {
    GetTree,
    GetRun,
    ListRuns,
    StreamRun,
    StreamThread,
    StreamLog,
    ListJobs,
    ListTasks,
    ListApprovals,
    GetApproval,
    WatchApprovals,
    GetAuditLog,
}

/// What the reads of the table are about: sam's run, waiting for an approval.
struct Target<'a> {
    cluster: &'a Cluster,
    request_id: String,
}

impl Target<'_> {
    async fn read(&self, rpc: Read, token: &str) -> Code {
        const RUN: &str = "table-run";
        let runner = runner_as(&self.cluster.runner.url(), Some(token));
        let mut approvals = approvals_as(&self.cluster.approval.url(), Some(token));
        let request_id = self.request_id.clone();
        match rpc {
            Read::GetTree => code(
                runner
                    .clone()
                    .get_tree(rpb::GetTreeRequest {
                        tree_id: "table-gate".into(),
                        version: 0,
                    })
                    .await,
            ),
            Read::GetRun => code(
                runner
                    .clone()
                    .get_run(rpb::GetRunRequest { run_id: RUN.into() })
                    .await,
            ),
            Read::ListRuns => listed(&runner).await.err().unwrap_or(Code::Ok),
            Read::StreamRun => streamed(&runner, RUN, "", "")
                .await
                .err()
                .unwrap_or(Code::Ok),
            Read::StreamThread => streamed(&runner, "", RUN, "")
                .await
                .err()
                .unwrap_or(Code::Ok),
            Read::StreamLog => streamed(&runner, "", "", "")
                .await
                .err()
                .unwrap_or(Code::Ok),
            Read::ListJobs => code(
                runner
                    .clone()
                    .list_jobs(rpb::ListJobsRequest::default())
                    .await,
            ),
            Read::ListTasks => code(
                workers_as(&self.cluster.runner.url(), Some(token))
                    .list_tasks(rpb::ListTasksRequest::default())
                    .await,
            ),
            Read::ListApprovals => code(
                approvals
                    .list_approvals(apb::ListApprovalsRequest::default())
                    .await,
            ),
            Read::GetApproval => code(
                approvals
                    .get_approval(apb::GetApprovalRequest { request_id })
                    .await,
            ),
            Read::WatchApprovals => match approvals
                .watch_approvals(apb::WatchApprovalsRequest::default())
                .await
            {
                Ok(s) => code(s.into_inner().message().await.map(tonic::Response::new)),
                Err(s) => s.code(),
            },
            Read::GetAuditLog => code(
                approvals
                    .get_audit_log(apb::GetAuditLogRequest {
                        request_id,
                        ..Default::default()
                    })
                    .await,
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_is_refused_without_the_right_and_answered_with_it() {
    let (cluster, t) = Cluster::start_secure(Profile::Debug).await;
    let mut sam = runner_as(&cluster.runner.url(), Some(&t.submitter));
    register(&mut sam, gate_tree("table-gate", "failure")).await;
    submit(&mut sam, "table-gate", "table-run").await;
    let approval = wait_approval(
        &approvals_as(&cluster.approval.url(), Some(&t.approver)),
        "table-run",
        apb::ApprovalState::Pending,
    )
    .await;
    let target = Target {
        cluster: &cluster,
        request_id: approval.request_id,
    };
    let Tokens {
        submitter: sam,
        approver: alice,
        operator: olga,
        service: svc,
        submitter_approver: bob,
        worker: wendy,
        reader: rita,
        ..
    } = &t;
    use Read::*;
    // (read, refused, answered): the refused hold no right to that read (a worker reads no run,
    // a submitter no approval, only operators, services and readers read the whole log);
    // operators, services and readers read everything.
    let table: [(Read, Vec<&String>, Vec<&String>); 12] = [
        (GetTree, vec![wendy, alice], vec![sam, olga, svc, rita]),
        (GetRun, vec![wendy], vec![sam, alice, bob, olga, svc, rita]),
        (ListRuns, vec![wendy], vec![sam, alice, olga, svc, rita]),
        (StreamRun, vec![wendy], vec![sam, alice, olga, svc, rita]),
        (StreamThread, vec![wendy], vec![sam, alice, olga, svc, rita]),
        (
            StreamLog,
            vec![wendy, sam, alice, bob],
            vec![olga, svc, rita],
        ),
        (ListJobs, vec![wendy, sam, alice], vec![olga, svc, rita]),
        (ListTasks, vec![sam, alice], vec![wendy, olga, svc, rita]),
        (
            ListApprovals,
            vec![sam, wendy],
            vec![alice, bob, olga, svc, rita],
        ),
        (
            GetApproval,
            vec![sam, wendy],
            vec![alice, bob, olga, svc, rita],
        ),
        (
            WatchApprovals,
            vec![sam, wendy],
            vec![alice, olga, svc, rita],
        ),
        (GetAuditLog, vec![sam, wendy], vec![alice, olga, svc, rita]),
    ];
    let name = |token: &str| token.split('-').next().unwrap_or_default().to_string();
    let mut wrong = Vec::new();
    for (rpc, refused, answered) in &table {
        for token in refused {
            let got = target.read(*rpc, token).await;
            if got != Code::PermissionDenied {
                wrong.push(format!("{rpc:?} as {}: {got:?}, not refused", name(token)));
            }
        }
        for token in answered {
            let got = target.read(*rpc, token).await;
            if got != Code::Ok {
                wrong.push(format!("{rpc:?} as {}: {got:?}, not answered", name(token)));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
