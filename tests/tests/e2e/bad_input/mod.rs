//! Bad input, table-driven, over every RPC of both services (authentication on): malformed and
//! oversized trees, deep nesting, unknown and stale ids, wrong enum values, empty and huge
//! strings, messages over the 4 MiB limit, schema violations, missing / unknown / expired
//! credentials and wrong roles. Each row names the call and the status code it must get; after
//! every row the observable state of both services (runs, jobs, event log, approvals, audit,
//! trees) must be exactly what it was.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{future::Future, pin::Pin, time::Duration};

use arbor_shared::{
    json::{to_proto_struct, to_proto_value},
    proto::{
        approval::v1::{self as apb, approval_service_client::ApprovalServiceClient},
        runner::v1::{self as rpb, runner_service_client::RunnerServiceClient},
    },
};
use arbor_testkit::PgCluster;
use arbor_tests::{
    Cluster, Profile,
    auth::Tokens,
    clients::{ApprovalClient, RunnerClient, approvals_as, lazy_channel, runner_as},
    gate_tree, secured,
    snapshot::{Probes, Snapshot},
};
use serde_json::json;
use tonic::{Code, Status};

mod governance;

type Call = Pin<Box<dyn Future<Output = Result<(), Status>> + Send>>;

struct Case {
    name: &'static str,
    /// Any of these codes is right (tonic answers an oversized message with OUT_OF_RANGE; some
    /// stacks say RESOURCE_EXHAUSTED).
    expect: &'static [Code],
    call: Call,
}

fn case<F>(name: &'static str, expect: &'static [Code], call: F) -> Case
where
    F: Future<Output = Result<(), Status>> + Send + 'static,
{
    Case {
        name,
        expect,
        call: Box::pin(call),
    }
}

/// Drops the response: rows only care about the status.
fn unit<T>(r: Result<tonic::Response<T>, Status>) -> Result<(), Status> {
    r.map(|_| ())
}

const INVALID: &[Code] = &[Code::InvalidArgument];
const NOT_FOUND: &[Code] = &[Code::NotFound];
const PRECONDITION: &[Code] = &[Code::FailedPrecondition];
const EXISTS: &[Code] = &[Code::AlreadyExists];
const DENIED: &[Code] = &[Code::PermissionDenied];
const UNAUTHENTICATED: &[Code] = &[Code::Unauthenticated];
const OUT_OF_RANGE: &[Code] = &[Code::OutOfRange];
const TOO_BIG: &[Code] = &[Code::OutOfRange, Code::ResourceExhausted];

const MIB: usize = 1 << 20;

/// The state every row starts from.
struct Fixture {
    tokens: Tokens,
    runner_url: String,
    approval_url: String,
    /// Suspended at its gate (submitted by sam); `gate_request` pending in approval-svc.
    gate_run: String,
    gate_request: String,
    /// Submitted by bob (submitter and approver); `own_request` pending.
    own_request: String,
    /// Waiting for user input (a string of 3 to 10 characters).
    input_run: String,
    input_request: String,
    /// Waiting for an external result.
    external_run: String,
    external_request: String,
    /// Approved and finished; its request was consumed and its approval pruned.
    done_run: String,
    done_request: String,
    done_job: String,
    /// Cancelled; its request was withdrawn and its approval cancelled.
    cancelled_run: String,
    cancelled_request: String,
}

fn input_tree() -> String {
    json!({"id": "bi-input", "version": 1, "root": {"type": "user_input", "name": "ask",
        "input_kind": "text", "prompt": "Name?",
        "schema": {"type": "string", "minLength": 3, "maxLength": 10}, "output": "answer"}})
    .to_string()
}

fn external_tree() -> String {
    json!({"id": "bi-external", "version": 1, "root": {"type": "external", "name": "job",
        "execution_kind": "batch", "task": {"n": 1}, "output": "out"}})
    .to_string()
}

async fn submit(runner: &mut RunnerClient, tree: &str, run_id: &str) {
    secured::submit(runner, tree, run_id).await;
}

async fn wait_status(runner: &RunnerClient, run_id: &str, status: rpb::RunStatus) -> rpb::Run {
    secured::wait_run(runner, run_id, status).await
}

async fn approval_of(
    approvals: &ApprovalClient,
    run_id: &str,
    state: apb::ApprovalState,
) -> String {
    secured::wait_approval(approvals, run_id, state)
        .await
        .request_id
}

async fn fixture(cluster: &Cluster, tokens: Tokens) -> Fixture {
    let runner_url = cluster.runner.url();
    let approval_url = cluster.approval.url();
    let mut sam = runner_as(&runner_url, Some(&tokens.submitter));
    let mut bob = runner_as(&runner_url, Some(&tokens.submitter_approver));
    let operator = runner_as(&runner_url, Some(&tokens.operator));
    let alice = approvals_as(&approval_url, Some(&tokens.approver));
    for doc in [
        gate_tree("bi-gate", "failure"),
        input_tree(),
        external_tree(),
    ] {
        sam.register_tree(rpb::RegisterTreeRequest {
            document: doc,
            format: 0,
        })
        .await
        .unwrap();
    }
    submit(&mut sam, "bi-gate", "bi-gate-run").await;
    submit(&mut bob, "bi-gate", "bi-own-run").await;
    submit(&mut sam, "bi-input", "bi-input-run").await;
    submit(&mut sam, "bi-external", "bi-external-run").await;
    submit(&mut sam, "bi-gate", "bi-done-run").await;
    submit(&mut sam, "bi-gate", "bi-cancelled-run").await;

    let done_request = approval_of(&alice, "bi-done-run", apb::ApprovalState::Pending).await;
    alice
        .clone()
        .resolve(apb::ResolveRequest {
            request_id: done_request.clone(),
            decision: rpb::DecisionKind::Approve as i32,
            ..Default::default()
        })
        .await
        .unwrap();
    wait_status(&operator, "bi-done-run", rpb::RunStatus::Succeeded).await;
    approval_of(&alice, "bi-done-run", apb::ApprovalState::Pruned).await;

    let cancelled_request =
        approval_of(&alice, "bi-cancelled-run", apb::ApprovalState::Pending).await;
    operator
        .clone()
        .cancel_run(rpb::CancelRunRequest {
            run_id: "bi-cancelled-run".into(),
            reason: "fixture".into(),
        })
        .await
        .unwrap();
    wait_status(&operator, "bi-cancelled-run", rpb::RunStatus::Cancelled).await;
    approval_of(&alice, "bi-cancelled-run", apb::ApprovalState::Cancelled).await;

    let gate_request = approval_of(&alice, "bi-gate-run", apb::ApprovalState::Pending).await;
    let own_request = approval_of(&alice, "bi-own-run", apb::ApprovalState::Pending).await;
    let input = wait_status(&operator, "bi-input-run", rpb::RunStatus::Suspended).await;
    let external = wait_status(&operator, "bi-external-run", rpb::RunStatus::Suspended).await;
    let done_job = operator
        .clone()
        .list_jobs(rpb::ListJobsRequest {
            run_id: "bi-done-run".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs[0]
        .job_id
        .clone();
    Fixture {
        tokens,
        runner_url,
        approval_url,
        gate_run: "bi-gate-run".into(),
        gate_request,
        own_request,
        input_run: "bi-input-run".into(),
        input_request: input.suspensions[0].request_id.clone(),
        external_run: "bi-external-run".into(),
        external_request: external.suspensions[0].request_id.clone(),
        done_run: "bi-done-run".into(),
        done_request,
        done_job,
        cancelled_run: "bi-cancelled-run".into(),
        cancelled_request,
    }
}

/// Tree ids the bad documents use: none of them may get registered.
const BAD_TREE_IDS: &[&str] = &["bad", "bi-gate", "deep", "huge", "many", "yaml"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_right_code_and_changes_nothing() {
    let (cluster, tokens) = Cluster::start_secure(Profile::Debug).await;
    every_row(&cluster, tokens).await;
}

/// The same table with both services on one PostgreSQL database: a value the database cannot
/// hold (a NUL in a text column) is refused by the service, never passed on to fail there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_right_code_and_changes_nothing_on_postgresql() {
    let url = tokio::task::spawn_blocking(|| PgCluster::shared().fresh_database("bad_input"))
        .await
        .unwrap();
    let store = vec!["--store".to_string(), url];
    let (cluster, tokens) = Cluster::start_secure_with(Profile::Debug, store.clone(), store).await;
    every_row(&cluster, tokens).await;
}

/// Every row of the table against `cluster`, each followed by a look at the state of both
/// services.
async fn every_row(cluster: &Cluster, tokens: Tokens) {
    let fx = fixture(cluster, tokens).await;
    let mut op_runner = runner_as(&fx.runner_url, Some(&fx.tokens.operator));
    let mut op_approvals = approvals_as(&fx.approval_url, Some(&fx.tokens.operator));
    let probes = Probes {
        audit_runs: vec![
            fx.gate_run.clone(),
            fx.done_run.clone(),
            fx.cancelled_run.clone(),
            "bi-own-run".into(),
        ],
        tree_ids: BAD_TREE_IDS.iter().map(|s| s.to_string()).collect(),
    };
    // The approval-svc acks its cursor a moment after its last write; wait until the state is
    // still, so every difference below is the row's doing.
    let mut before = Snapshot::take(&mut op_runner, &mut op_approvals, &probes).await;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let again = Snapshot::take(&mut op_runner, &mut op_approvals, &probes).await;
        if again == before {
            break;
        }
        before = again;
    }

    let mut cases = runner_cases(&fx);
    cases.extend(approval_cases(&fx));
    cases.extend(governance::cases(&fx));
    cases.extend(credential_cases(&fx));
    println!("bad input: {} cases", cases.len());
    let mut failures = Vec::new();
    for c in cases {
        let got = match tokio::time::timeout(Duration::from_secs(30), c.call).await {
            Ok(Ok(())) => Code::Ok,
            Ok(Err(status)) => status.code(),
            Err(_) => Code::DeadlineExceeded,
        };
        let after = Snapshot::take(&mut op_runner, &mut op_approvals, &probes).await;
        let changed = before.diff(&after);
        let ok = c.expect.contains(&got) && changed.is_empty();
        println!(
            "{} {:<52} expected {:?} got {got:?}{}",
            if ok { "ok  " } else { "FAIL" },
            c.name,
            c.expect,
            if changed.is_empty() {
                String::new()
            } else {
                format!("; state changed: {changed:?}")
            }
        );
        if !ok {
            failures.push(c.name);
        }
        if !changed.is_empty() {
            before = after;
        }
    }
    assert!(failures.is_empty(), "failed rows: {failures:?}");
    assert!(cluster.runner.is_running() && cluster.approval.is_running());
}

fn deep_tree(depth: usize) -> String {
    let mut node = json!({"type": "succeed"});
    for _ in 0..depth {
        node = json!({"type": "inverter", "child": node});
    }
    json!({"id": "deep", "version": 1, "root": node}).to_string()
}

fn runner_cases(fx: &Fixture) -> Vec<Case> {
    let sam = runner_as(&fx.runner_url, Some(&fx.tokens.submitter));
    let bob = runner_as(&fx.runner_url, Some(&fx.tokens.submitter_approver));
    let alice = runner_as(&fx.runner_url, Some(&fx.tokens.approver));
    let olga = runner_as(&fx.runner_url, Some(&fx.tokens.operator));
    // approval-svc's identity: the only one that gets past the role check for approvals.
    let svc = runner_as(&fx.runner_url, Some(&fx.tokens.service));
    // A task worker: reads tasks, no run.
    let wendy = runner_as(&fx.runner_url, Some(&fx.tokens.worker));
    let get_run = |who: &RunnerClient, run_id: &str| {
        let (mut who, run_id) = (who.clone(), run_id.to_string());
        async move { unit(who.get_run(rpb::GetRunRequest { run_id }).await) }
    };
    let events_of = |run_id: &str, thread_id: &str| rpb::StreamEventsRequest {
        after_seq: Some(0),
        filter: Some(rpb::EventFilter {
            run_id: run_id.into(),
            thread_id: thread_id.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let register = |doc: String, format: rpb::TreeFormat| {
        let mut sam = sam.clone();
        async move {
            unit(
                sam.register_tree(rpb::RegisterTreeRequest {
                    document: doc,
                    format: format as i32,
                })
                .await,
            )
        }
    };
    let json_doc =
        |root: serde_json::Value| json!({"id": "bad", "version": 1, "root": root}).to_string();
    let submit = |who: &RunnerClient, r: rpb::SubmitRunRequest| {
        let mut who = who.clone();
        async move { unit(who.submit_run(r).await) }
    };
    let gate_submit = |f: fn(&mut rpb::SubmitRunRequest)| {
        let mut r = rpb::SubmitRunRequest {
            tree_id: "bi-gate".into(),
            ..Default::default()
        };
        f(&mut r);
        r
    };
    let resolve = |who: &RunnerClient, r: rpb::ResolveRequest| {
        let mut who = who.clone();
        async move { unit(who.resolve(r).await) }
    };
    let input_resolve = |result: serde_json::Value| rpb::ResolveRequest {
        run_id: fx.input_run.clone(),
        request_id: fx.input_request.clone(),
        decision_id: "bad-input".into(),
        action: rpb::ResolveAction::Resume as i32,
        result: Some(to_proto_value(&result)),
        ..Default::default()
    };
    let stream = |who: &RunnerClient, r: rpb::StreamEventsRequest| {
        let mut who = who.clone();
        async move {
            let mut s = who.stream_events(r).await?.into_inner();
            // Errors after the call are the stream's first item.
            match tokio::time::timeout(Duration::from_millis(500), s.message()).await {
                Ok(Err(e)) => Err(e),
                _ => Ok(()),
            }
        }
    };
    let gate = |name: &str| json!({"type": "sequence", "name": name, "children": [{"type": "succeed", "name": format!("{name}-x")}]});
    vec![
        case("RegisterTree: not JSON", INVALID, register("{".into(), rpb::TreeFormat::Json)),
        case("RegisterTree: empty document", INVALID, register(String::new(), rpb::TreeFormat::Json)),
        case("RegisterTree: document is an array", INVALID, register("[1,2]".into(), rpb::TreeFormat::Json)),
        case("RegisterTree: unknown node type", INVALID, register(json_doc(json!({"type": "teleport"})), rpb::TreeFormat::Json)),
        case("RegisterTree: empty sequence", INVALID, register(json_doc(json!({"type": "sequence", "children": []})), rpb::TreeFormat::Json)),
        case("RegisterTree: duplicate node names", INVALID, register(json_doc(json!({"type": "sequence", "children": [gate("a"), gate("a")]})), rpb::TreeFormat::Json)),
        case("RegisterTree: missing id", INVALID, register(json!({"version": 1, "root": {"type": "succeed"}}).to_string(), rpb::TreeFormat::Json)),
        case("RegisterTree: version 0", INVALID, register(json!({"id": "bad", "version": 0, "root": {"type": "succeed"}}).to_string(), rpb::TreeFormat::Json)),
        case("RegisterTree: parallel threshold above children", INVALID, register(json_doc(json!({"type": "parallel", "success_threshold": 5, "children": [{"type": "succeed"}]})), rpb::TreeFormat::Json)),
        case("RegisterTree: unknown field", INVALID, register(json_doc(json!({"type": "succeed", "colour": "red"})), rpb::TreeFormat::Json)),
        case("RegisterTree: bad $ref", INVALID, register(json_doc(json!({"type": "set", "key": "k", "value": {"$ref": ""}})), rpb::TreeFormat::Json)),
        case("RegisterTree: user_input schema is not a schema", INVALID, register(json_doc(json!({"type": "user_input", "input_kind": "text", "prompt": "?", "schema": {"type": 12}})), rpb::TreeFormat::Json)),
        case("RegisterTree: wrong enum value (policy)", INVALID, register(json_doc(json!({"type": "tool", "tool": "echo", "policy": "sometimes"})), rpb::TreeFormat::Json)),
        case("RegisterTree: a tool no runner has", INVALID, register(json_doc(json!({"type": "tool", "tool": "shell.exec"})), rpb::TreeFormat::Json)),
        case("RegisterTree: resume_mode contradicting allow_edit", INVALID, register(json_doc(json!({"type": "tool", "tool": "echo", "policy": "ask", "resume_mode": "pass_decision_to_tool", "allow_edit": false})), rpb::TreeFormat::Json)),
        case("RegisterTree: nesting 65 nodes deep", INVALID, register(deep_tree(65), rpb::TreeFormat::Json)),
        case("RegisterTree: JSON nested 100000 arrays deep", INVALID, register(format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)), rpb::TreeFormat::Json)),
        case("RegisterTree: YAML nested 100000 sequences deep", INVALID, register(format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)), rpb::TreeFormat::Yaml)),
        case("RegisterTree: YAML nested 100000 mappings deep", INVALID, register("{a: ".repeat(100_000), rpb::TreeFormat::Yaml)),
        case("RegisterTree: YAML alias bomb", INVALID, register(
            "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\ni: [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n".into(),
            rpb::TreeFormat::Yaml)),
        case("RegisterTree: malformed YAML", INVALID, register("id: [unclosed\n".into(), rpb::TreeFormat::Yaml)),
        case("RegisterTree: unknown format enum", INVALID, {
            let mut sam = sam.clone();
            async move { unit(sam.register_tree(rpb::RegisterTreeRequest { document: gate_tree("bad", "failure"), format: 42 }).await) }
        }),
        case("RegisterTree: other document, same id and version", EXISTS, register(gate_tree("bi-gate", "success_skip"), rpb::TreeFormat::Json)),
        case("RegisterTree: 3 MiB id", INVALID, register(json!({"id": "h".repeat(3 * MIB), "version": 1, "root": {"type": "succeed"}}).to_string(), rpb::TreeFormat::Json)),
        case("RegisterTree: 1 MiB node name", INVALID, register(json!({"id": "huge", "version": 1, "root": {"type": "succeed", "name": "n".repeat(MIB)}}).to_string(), rpb::TreeFormat::Json)),
        case("RegisterTree: more than 100000 nodes", INVALID, register(json!({"id": "many", "version": 1, "root": {"type": "sequence", "children": vec![json!({"type": "succeed"}); 100_001]}}).to_string(), rpb::TreeFormat::Json)),
        case("RegisterTree: message over 4 MiB", TOO_BIG, register(json!({"id": "huge", "version": 1, "root": {"type": "log", "message": "m".repeat(5 * MIB)}}).to_string(), rpb::TreeFormat::Json)),
        case("RegisterTree: approver may not register", DENIED, {
            let mut alice = alice.clone();
            async move { unit(alice.register_tree(rpb::RegisterTreeRequest { document: gate_tree("bad", "failure"), format: 0 }).await) }
        }),
        case("GetTree: empty id", INVALID, { let mut s = sam.clone(); async move { unit(s.get_tree(rpb::GetTreeRequest { tree_id: String::new(), version: 0 }).await) } }),
        case("GetTree: unknown id", NOT_FOUND, { let mut s = sam.clone(); async move { unit(s.get_tree(rpb::GetTreeRequest { tree_id: "nope".into(), version: 0 }).await) } }),
        case("GetTree: unknown version", NOT_FOUND, { let mut s = sam.clone(); async move { unit(s.get_tree(rpb::GetTreeRequest { tree_id: "bi-gate".into(), version: 99 }).await) } }),
        case("GetTree: 1 MiB id", INVALID, { let mut s = sam.clone(); async move { unit(s.get_tree(rpb::GetTreeRequest { tree_id: "t".repeat(MIB), version: 0 }).await) } }),
        case("SubmitRun: unknown tree", NOT_FOUND, submit(&sam, rpb::SubmitRunRequest { tree_id: "nope".into(), ..Default::default() })),
        case("SubmitRun: unknown tree version", NOT_FOUND, submit(&sam, gate_submit(|r| r.tree_version = 99))),
        case("SubmitRun: empty tree id", INVALID, submit(&sam, rpb::SubmitRunRequest::default())),
        case("SubmitRun: thread id with spaces and slashes", INVALID, submit(&sam, gate_submit(|r| r.thread_id = "a b/c".into()))),
        case("SubmitRun: 1 MiB thread id", INVALID, submit(&sam, gate_submit(|r| r.thread_id = "t".repeat(MIB)))),
        case("SubmitRun: run id with NUL", INVALID, submit(&sam, gate_submit(|r| r.run_id = "a\0b".into()))),
        case("SubmitRun: existing run id, restore NEVER", EXISTS, submit(&sam, gate_submit(|r| { r.run_id = "bi-gate-run".into(); r.restore_policy = rpb::RestorePolicy::Never as i32; }))),
        case("SubmitRun: restore REQUIRED without a checkpoint", PRECONDITION, submit(&sam, gate_submit(|r| { r.run_id = "no-such-run".into(); r.restore_policy = rpb::RestorePolicy::Required as i32; }))),
        case("SubmitRun: restore a finished run", PRECONDITION, submit(&sam, gate_submit(|r| { r.run_id = "bi-done-run".into(); r.restore_policy = rpb::RestorePolicy::IfExists as i32; }))),
        case("SubmitRun: unknown mode enum", INVALID, submit(&sam, gate_submit(|r| r.mode = 9))),
        case("SubmitRun: unknown origin enum", INVALID, submit(&sam, gate_submit(|r| r.origin = 9))),
        case("SubmitRun: unknown restore policy enum", INVALID, submit(&sam, gate_submit(|r| r.restore_policy = 9))),
        case("SubmitRun: reserved priority i32::MAX", INVALID, submit(&sam, gate_submit(|r| r.priority = i32::MAX))),
        case("SubmitRun: 1 MiB dedupe key", INVALID, submit(&sam, gate_submit(|r| r.dedupe_key = "d".repeat(MIB)))),
        case("SubmitRun: input over 4 MiB", TOO_BIG, submit(&sam, gate_submit(|r| r.input = Some(to_proto_struct(json!({"blob": "b".repeat(5 * MIB)}).as_object().unwrap()))))),
        case("SubmitRun: approver may not submit", DENIED, submit(&alice, gate_submit(|_| {}))),
        case("GetRun: empty id", INVALID, { let mut s = sam.clone(); async move { unit(s.get_run(rpb::GetRunRequest { run_id: String::new() }).await) } }),
        case("GetRun: unknown id", NOT_FOUND, { let mut s = sam.clone(); async move { unit(s.get_run(rpb::GetRunRequest { run_id: "nope".into() }).await) } }),
        case("GetRun: 1 MiB id", INVALID, { let mut s = sam.clone(); async move { unit(s.get_run(rpb::GetRunRequest { run_id: "r".repeat(MIB) }).await) } }),
        case("ListRuns: unknown status enum", INVALID, { let mut s = sam.clone(); async move { unit(s.list_runs(rpb::ListRunsRequest { statuses: vec![99], ..Default::default() }).await) } }),
        case("ListRuns: UNSPECIFIED status", INVALID, { let mut s = sam.clone(); async move { unit(s.list_runs(rpb::ListRunsRequest { statuses: vec![0], ..Default::default() }).await) } }),
        case("ListRuns: a run id as page token", INVALID, { let mut s = sam.clone(); async move { unit(s.list_runs(rpb::ListRunsRequest { page_token: "bi-gate-run".into(), ..Default::default() }).await) } }),
        case("ListRuns: garbled page token", INVALID, { let mut s = sam.clone(); async move { unit(s.list_runs(rpb::ListRunsRequest { page_token: "%%%".into(), ..Default::default() }).await) } }),
        case("CancelRun: empty id", INVALID, { let mut s = olga.clone(); async move { unit(s.cancel_run(rpb::CancelRunRequest { run_id: String::new(), reason: String::new() }).await) } }),
        case("CancelRun: unknown run", NOT_FOUND, { let mut s = olga.clone(); async move { unit(s.cancel_run(rpb::CancelRunRequest { run_id: "nope".into(), reason: String::new() }).await) } }),
        case("CancelRun: finished run", PRECONDITION, { let mut s = olga.clone(); let id = fx.done_run.clone(); async move { unit(s.cancel_run(rpb::CancelRunRequest { run_id: id, reason: String::new() }).await) } }),
        case("CancelRun: submitter cancels another's run", DENIED, { let mut s = bob.clone(); let id = fx.gate_run.clone(); async move { unit(s.cancel_run(rpb::CancelRunRequest { run_id: id, reason: String::new() }).await) } }),
        case("CancelRun: approver may not cancel", DENIED, { let mut s = alice.clone(); let id = fx.gate_run.clone(); async move { unit(s.cancel_run(rpb::CancelRunRequest { run_id: id, reason: String::new() }).await) } }),
        case("InterruptThread: empty thread", INVALID, { let mut s = olga.clone(); async move { unit(s.interrupt_thread(rpb::InterruptThreadRequest::default()).await) } }),
        case("InterruptThread: 1 MiB thread id", INVALID, { let mut s = olga.clone(); async move { unit(s.interrupt_thread(rpb::InterruptThreadRequest { thread_id: "t".repeat(MIB), ..Default::default() }).await) } }),
        case("InterruptThread: replacement run of an unknown tree", NOT_FOUND, { let mut s = olga.clone(); let t = fx.gate_run.clone(); async move { unit(s.interrupt_thread(rpb::InterruptThreadRequest { thread_id: t, reason: "x".into(), next: Some(rpb::SubmitRunRequest { tree_id: "nope".into(), ..Default::default() }) }).await) } }),
        case("InterruptThread: replacement run with a bad enum", INVALID, { let mut s = olga.clone(); let t = fx.gate_run.clone(); async move { unit(s.interrupt_thread(rpb::InterruptThreadRequest { thread_id: t, reason: "x".into(), next: Some(rpb::SubmitRunRequest { tree_id: "bi-gate".into(), mode: 9, ..Default::default() }) }).await) } }),
        case("InterruptThread: replacement run id already taken", EXISTS, { let mut s = olga.clone(); let t = fx.gate_run.clone(); async move { unit(s.interrupt_thread(rpb::InterruptThreadRequest { thread_id: t, reason: "x".into(), next: Some(rpb::SubmitRunRequest { tree_id: "bi-gate".into(), run_id: "bi-done-run".into(), restore_policy: rpb::RestorePolicy::Never as i32, ..Default::default() }) }).await) } }),
        case("InterruptThread: approver may not interrupt", DENIED, { let mut s = alice.clone(); let t = fx.gate_run.clone(); async move { unit(s.interrupt_thread(rpb::InterruptThreadRequest { thread_id: t, ..Default::default() }).await) } }),
        case("StreamEvents: unknown kind in filter", INVALID, stream(&olga, rpb::StreamEventsRequest { filter: Some(rpb::EventFilter { kinds: vec![99], ..Default::default() }), ..Default::default() })),
        case("StreamEvents: 1 MiB subscriber id", INVALID, stream(&olga, rpb::StreamEventsRequest { subscriber_id: "s".repeat(MIB), ..Default::default() })),
        case("StreamEvents: cursor beyond the end of the log", OUT_OF_RANGE, stream(&olga, rpb::StreamEventsRequest { after_seq: Some(1 << 40), follow: true, ..Default::default() })),
        case("Resolve: unknown run", NOT_FOUND, resolve(&sam, rpb::ResolveRequest { run_id: "nope".into(), request_id: "r".into(), decision_id: "d".into(), action: 1, ..Default::default() })),
        case("Resolve: unknown request", NOT_FOUND, resolve(&sam, rpb::ResolveRequest { run_id: fx.input_run.clone(), request_id: "f".repeat(40), decision_id: "d".into(), action: 1, ..Default::default() })),
        case("Resolve: empty decision id", INVALID, resolve(&sam, rpb::ResolveRequest { decision_id: String::new(), ..input_resolve(json!({"text": "valid"})) })),
        case("Resolve: 1 MiB request id", INVALID, resolve(&sam, rpb::ResolveRequest { request_id: "r".repeat(MIB), ..input_resolve(json!({"text": "valid"})) })),
        case("Resolve: UNSPECIFIED action", INVALID, resolve(&sam, rpb::ResolveRequest { action: 0, ..input_resolve(json!({"text": "valid"})) })),
        case("Resolve: unknown action enum", INVALID, resolve(&sam, rpb::ResolveRequest { action: 7, ..input_resolve(json!({"text": "valid"})) })),
        case("Resolve: unknown source enum", INVALID, resolve(&sam, rpb::ResolveRequest { source: 9, ..input_resolve(json!({"text": "valid"})) })),
        case("Resolve: input violates the schema (too short)", INVALID, resolve(&sam, input_resolve(json!({"text": "x"})))),
        case("Resolve: input violates the schema (not a string)", INVALID, resolve(&sam, input_resolve(json!({"value": 42})))),
        case("Resolve: input of the wrong shape", INVALID, resolve(&sam, input_resolve(json!({"answer": "valid"})))),
        case("Resolve: input result missing", INVALID, resolve(&sam, rpb::ResolveRequest { result: None, ..input_resolve(json!(null)) })),
        case("Resolve: external result with a bad status", INVALID, resolve(&sam, rpb::ResolveRequest { run_id: fx.external_run.clone(), request_id: fx.external_request.clone(), decision_id: "bad-ext".into(), action: 1, result: Some(to_proto_value(&json!({"status": "maybe"}))), ..Default::default() })),
        case("Resolve: external result with an unknown field", INVALID, resolve(&sam, rpb::ResolveRequest { run_id: fx.external_run.clone(), request_id: fx.external_request.clone(), decision_id: "bad-ext".into(), action: 1, result: Some(to_proto_value(&json!({"status": "succeeded", "extra": 1}))), ..Default::default() })),
        case("Resolve: result over 4 MiB", TOO_BIG, resolve(&sam, input_resolve(json!({"text": "b".repeat(5 * MIB)})))),
        case("Resolve: consumed request, new decision id", PRECONDITION, resolve(&svc, rpb::ResolveRequest { run_id: fx.done_run.clone(), request_id: fx.done_request.clone(), decision_id: "late".into(), action: 1, ..Default::default() })),
        case("Resolve: withdrawn request", PRECONDITION, resolve(&svc, rpb::ResolveRequest { run_id: fx.cancelled_run.clone(), request_id: fx.cancelled_request.clone(), decision_id: "late".into(), action: 1, ..Default::default() })),
        case("Resolve: a decision kind on user input", INVALID, resolve(&sam, rpb::ResolveRequest { decision_kind: rpb::DecisionKind::Approve as i32, ..input_resolve(json!({"text": "valid"})) })),
        case("Resolve: a decision kind contradicting the action", INVALID, resolve(&svc, rpb::ResolveRequest { run_id: fx.gate_run.clone(), request_id: fx.gate_request.clone(), decision_id: "direct".into(), action: rpb::ResolveAction::Resume as i32, decision_kind: rpb::DecisionKind::Reject as i32, ..Default::default() })),
        case("Resolve: unknown decision kind enum", INVALID, resolve(&svc, rpb::ResolveRequest { run_id: fx.gate_run.clone(), request_id: fx.gate_request.clone(), decision_id: "direct".into(), decision_kind: 17, ..Default::default() })),
        case("Resolve: EDIT on a gate, which allows approve and reject", PRECONDITION, resolve(&svc, rpb::ResolveRequest { run_id: fx.gate_run.clone(), request_id: fx.gate_request.clone(), decision_id: "direct".into(), decision_kind: rpb::DecisionKind::Edit as i32, result: Some(to_proto_value(&json!({"x": 1}))), ..Default::default() })),
        case("Resolve: an approval with a result and no kind", INVALID, resolve(&svc, rpb::ResolveRequest { run_id: fx.gate_run.clone(), request_id: fx.gate_request.clone(), decision_id: "direct".into(), action: 1, result: Some(to_proto_value(&json!({"x": 1}))), ..Default::default() })),
        case("Resolve: approver resolves an approval on the runner", DENIED, resolve(&alice, rpb::ResolveRequest { run_id: fx.gate_run.clone(), request_id: fx.gate_request.clone(), decision_id: "direct".into(), action: 1, ..Default::default() })),
        case("Resolve: submitter resolves an approval on the runner", DENIED, resolve(&sam, rpb::ResolveRequest { run_id: fx.gate_run.clone(), request_id: fx.gate_request.clone(), decision_id: "direct".into(), action: 1, ..Default::default() })),
        case("Ack: beyond the last event", INVALID, { let mut s = olga.clone(); async move { unit(s.ack(rpb::AckRequest { subscriber_id: "bi".into(), seq: 1 << 40 }).await) } }),
        case("Ack: empty subscriber id", INVALID, { let mut s = olga.clone(); async move { unit(s.ack(rpb::AckRequest { subscriber_id: String::new(), seq: 1 }).await) } }),
        case("Ack: 1 MiB subscriber id", INVALID, { let mut s = olga.clone(); async move { unit(s.ack(rpb::AckRequest { subscriber_id: "s".repeat(MIB), seq: 1 }).await) } }),
        case("ListJobs: submitter may not list jobs", DENIED, { let mut s = sam.clone(); async move { unit(s.list_jobs(rpb::ListJobsRequest::default()).await) } }),
        case("ListJobs: unknown status enum", INVALID, { let mut s = olga.clone(); async move { unit(s.list_jobs(rpb::ListJobsRequest { statuses: vec![42], ..Default::default() }).await) } }),
        case("ListJobs: garbled page token", INVALID, { let mut s = olga.clone(); async move { unit(s.list_jobs(rpb::ListJobsRequest { page_token: "0123456789abcdef".into(), ..Default::default() }).await) } }),
        case("RequeueJob: empty id", INVALID, { let mut s = olga.clone(); async move { unit(s.requeue_job(rpb::RequeueJobRequest { job_id: String::new() }).await) } }),
        case("RequeueJob: unknown job", NOT_FOUND, { let mut s = olga.clone(); async move { unit(s.requeue_job(rpb::RequeueJobRequest { job_id: "nope".into() }).await) } }),
        case("RequeueJob: job is not dead-lettered", PRECONDITION, { let mut s = olga.clone(); let j = fx.done_job.clone(); async move { unit(s.requeue_job(rpb::RequeueJobRequest { job_id: j }).await) } }),
        case("RequeueJob: submitter may not requeue", DENIED, { let mut s = sam.clone(); let j = fx.done_job.clone(); async move { unit(s.requeue_job(rpb::RequeueJobRequest { job_id: j }).await) } }),
        // Read rights: a submitter reads its own runs, an approver runs waiting for an approval.
        case("GetRun: submitter reads another's run", DENIED, get_run(&sam, "bi-own-run")),
        case("GetRun: approver reads a run with no approval waiting", DENIED, get_run(&alice, &fx.input_run)),
        case("GetRun: worker may not read runs", DENIED, get_run(&wendy, &fx.gate_run)),
        case("ListRuns: worker may not list runs", DENIED, { let mut s = wendy.clone(); async move { unit(s.list_runs(rpb::ListRunsRequest::default()).await) } }),
        case("GetTree: approver may not read trees", DENIED, { let mut s = alice.clone(); async move { unit(s.get_tree(rpb::GetTreeRequest { tree_id: "bi-gate".into(), version: 0 }).await) } }),
        case("GetTree: worker may not read trees", DENIED, { let mut s = wendy.clone(); async move { unit(s.get_tree(rpb::GetTreeRequest { tree_id: "bi-gate".into(), version: 0 }).await) } }),
        case("SubmitRun: another's run id resubmitted", DENIED, submit(&bob, gate_submit(|r| { r.run_id = "bi-input-run".into(); r.restore_policy = rpb::RestorePolicy::IfExists as i32; }))),
        case("StreamEvents: submitter follows another's run", DENIED, stream(&bob, events_of(&fx.input_run, ""))),
        case("StreamEvents: submitter follows a thread of another's runs", DENIED, stream(&bob, events_of("", &fx.input_run))),
        case("StreamEvents: submitter follows the whole log", DENIED, stream(&sam, rpb::StreamEventsRequest { after_seq: Some(0), ..Default::default() })),
        case("StreamEvents: submitter resumes a named subscriber", DENIED, stream(&sam, rpb::StreamEventsRequest { subscriber_id: "approval-svc".into(), ..events_of(&fx.gate_run, "") })),
        case("StreamEvents: unknown run for a submitter", NOT_FOUND, stream(&sam, events_of("nope", ""))),
        case("StreamEvents: worker follows a run", DENIED, stream(&wendy, events_of(&fx.gate_run, ""))),
        case("ListJobs: approver may not list jobs", DENIED, { let mut s = alice.clone(); async move { unit(s.list_jobs(rpb::ListJobsRequest::default()).await) } }),
    ]
}

fn approval_cases(fx: &Fixture) -> Vec<Case> {
    let alice = approvals_as(&fx.approval_url, Some(&fx.tokens.approver));
    let bob = approvals_as(&fx.approval_url, Some(&fx.tokens.submitter_approver));
    let sam = approvals_as(&fx.approval_url, Some(&fx.tokens.submitter));
    let svc = approvals_as(&fx.approval_url, Some(&fx.tokens.service));
    let resolve = |who: &ApprovalClient, r: apb::ResolveRequest| {
        let mut who = who.clone();
        async move { unit(who.resolve(r).await) }
    };
    let on_gate = |decision: rpb::DecisionKind| apb::ResolveRequest {
        request_id: fx.gate_request.clone(),
        decision: decision as i32,
        ..Default::default()
    };
    let bulk = |who: &ApprovalClient, r: apb::BulkResolveRequest| {
        let mut who = who.clone();
        async move {
            let items = who.bulk_resolve(r).await?.into_inner().items;
            // A bulk call answers per item; a failed item is the row's answer.
            match items.into_iter().find(|i| i.code != 0) {
                Some(item) => Err(Status::new(Code::from(item.code), item.message)),
                None => Ok(()),
            }
        }
    };
    let list = |who: &ApprovalClient, r: apb::ListApprovalsRequest| {
        let mut who = who.clone();
        async move { unit(who.list_approvals(r).await) }
    };
    let watch = |who: &ApprovalClient, filter: Option<apb::ApprovalFilter>| {
        let mut who = who.clone();
        async move {
            let mut s = who
                .watch_approvals(apb::WatchApprovalsRequest { filter })
                .await?
                .into_inner();
            match tokio::time::timeout(Duration::from_millis(500), s.message()).await {
                Ok(Err(e)) => Err(e),
                _ => Ok(()),
            }
        }
    };
    let audit = |who: &ApprovalClient, r: apb::GetAuditLogRequest| {
        let mut who = who.clone();
        async move { unit(who.get_audit_log(r).await) }
    };
    let states = |s: Vec<i32>| apb::ListApprovalsRequest {
        filter: Some(apb::ApprovalFilter {
            states: s,
            ..Default::default()
        }),
        ..Default::default()
    };
    vec![
        case(
            "ListApprovals: unknown state enum",
            INVALID,
            list(&alice, states(vec![99])),
        ),
        case(
            "ListApprovals: bad page token",
            INVALID,
            list(
                &alice,
                apb::ListApprovalsRequest {
                    page_token: "not-a-token".into(),
                    ..Default::default()
                },
            ),
        ),
        case(
            "ListApprovals: hex page token it did not hand out",
            INVALID,
            list(
                &alice,
                apb::ListApprovalsRequest {
                    page_token: "00aa".into(),
                    ..Default::default()
                },
            ),
        ),
        case(
            "ListApprovals: bad tool-name glob",
            INVALID,
            list(
                &alice,
                apb::ListApprovalsRequest {
                    filter: Some(apb::ApprovalFilter {
                        tool_name: "[".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ),
        ),
        case(
            "ListApprovals: run id with NUL in filter",
            INVALID,
            list(
                &alice,
                apb::ListApprovalsRequest {
                    filter: Some(apb::ApprovalFilter {
                        run_id: "run\0".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ),
        ),
        case(
            "ListApprovals: min age above max age",
            INVALID,
            list(
                &alice,
                apb::ListApprovalsRequest {
                    filter: Some(apb::ApprovalFilter {
                        min_age_ms: 10,
                        max_age_ms: 5,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ),
        ),
        case(
            "ListApprovals: submitter may not read approvals",
            DENIED,
            list(&sam, apb::ListApprovalsRequest::default()),
        ),
        case("GetApproval: submitter may not read approvals", DENIED, {
            let mut s = sam.clone();
            let id = fx.gate_request.clone();
            async move {
                unit(
                    s.get_approval(apb::GetApprovalRequest { request_id: id })
                        .await,
                )
            }
        }),
        case("GetApproval: empty id", INVALID, {
            let mut a = alice.clone();
            async move {
                unit(
                    a.get_approval(apb::GetApprovalRequest {
                        request_id: String::new(),
                    })
                    .await,
                )
            }
        }),
        case("GetApproval: unknown id", NOT_FOUND, {
            let mut a = alice.clone();
            async move {
                unit(
                    a.get_approval(apb::GetApprovalRequest {
                        request_id: "nope".into(),
                    })
                    .await,
                )
            }
        }),
        case("GetApproval: 1 MiB id", INVALID, {
            let mut a = alice.clone();
            async move {
                unit(
                    a.get_approval(apb::GetApprovalRequest {
                        request_id: "r".repeat(MIB),
                    })
                    .await,
                )
            }
        }),
        case(
            "Resolve: UNSPECIFIED decision",
            INVALID,
            resolve(&alice, on_gate(rpb::DecisionKind::Unspecified)),
        ),
        case(
            "Resolve: unknown decision enum",
            INVALID,
            resolve(
                &alice,
                apb::ResolveRequest {
                    decision: 9,
                    ..on_gate(rpb::DecisionKind::Approve)
                },
            ),
        ),
        case(
            "Resolve: EDIT without args",
            INVALID,
            resolve(&alice, on_gate(rpb::DecisionKind::Edit)),
        ),
        case(
            "Resolve: RESPOND without result",
            INVALID,
            resolve(&alice, on_gate(rpb::DecisionKind::Respond)),
        ),
        case(
            "Resolve: APPROVE with args",
            INVALID,
            resolve(
                &alice,
                apb::ResolveRequest {
                    args: Some(to_proto_value(&json!({"a": 1}))),
                    ..on_gate(rpb::DecisionKind::Approve)
                },
            ),
        ),
        case(
            "Resolve: EDIT on a gate that does not allow it",
            PRECONDITION,
            resolve(
                &alice,
                apb::ResolveRequest {
                    args: Some(to_proto_value(&json!({"a": 1}))),
                    ..on_gate(rpb::DecisionKind::Edit)
                },
            ),
        ),
        case(
            "Resolve: reason over 4096 bytes",
            INVALID,
            resolve(
                &alice,
                apb::ResolveRequest {
                    reason: "r".repeat(5000),
                    ..on_gate(rpb::DecisionKind::Reject)
                },
            ),
        ),
        case(
            "Resolve: args over 4 MiB",
            TOO_BIG,
            resolve(
                &alice,
                apb::ResolveRequest {
                    args: Some(to_proto_value(&json!({"blob": "b".repeat(5 * MIB)}))),
                    ..on_gate(rpb::DecisionKind::Edit)
                },
            ),
        ),
        case(
            "Resolve: empty request id",
            INVALID,
            resolve(
                &alice,
                apb::ResolveRequest {
                    request_id: String::new(),
                    ..on_gate(rpb::DecisionKind::Approve)
                },
            ),
        ),
        case(
            "Resolve: 1 MiB request id",
            INVALID,
            resolve(
                &alice,
                apb::ResolveRequest {
                    request_id: "r".repeat(MIB),
                    ..on_gate(rpb::DecisionKind::Approve)
                },
            ),
        ),
        case(
            "Resolve: unknown request",
            NOT_FOUND,
            resolve(
                &alice,
                apb::ResolveRequest {
                    request_id: "nope".into(),
                    ..on_gate(rpb::DecisionKind::Approve)
                },
            ),
        ),
        case(
            "Resolve: pruned request (decided and consumed)",
            PRECONDITION,
            resolve(
                &alice,
                apb::ResolveRequest {
                    request_id: fx.done_request.clone(),
                    ..on_gate(rpb::DecisionKind::Reject)
                },
            ),
        ),
        case(
            "Resolve: cancelled request",
            PRECONDITION,
            resolve(
                &alice,
                apb::ResolveRequest {
                    request_id: fx.cancelled_request.clone(),
                    ..on_gate(rpb::DecisionKind::Approve)
                },
            ),
        ),
        case(
            "Resolve: submitter may not decide",
            DENIED,
            resolve(&sam, on_gate(rpb::DecisionKind::Approve)),
        ),
        case(
            "Resolve: service identity may not decide",
            DENIED,
            resolve(&svc, on_gate(rpb::DecisionKind::Approve)),
        ),
        case(
            "Resolve: approving a run one submitted",
            DENIED,
            resolve(
                &bob,
                apb::ResolveRequest {
                    request_id: fx.own_request.clone(),
                    ..on_gate(rpb::DecisionKind::Approve)
                },
            ),
        ),
        case(
            "BulkResolve: ids and filter together",
            INVALID,
            bulk(
                &alice,
                apb::BulkResolveRequest {
                    request_ids: vec![fx.gate_request.clone()],
                    filter: Some(apb::ApprovalFilter::default()),
                    decision: 1,
                    ..Default::default()
                },
            ),
        ),
        case(
            "BulkResolve: neither ids nor filter",
            INVALID,
            bulk(
                &alice,
                apb::BulkResolveRequest {
                    decision: 1,
                    ..Default::default()
                },
            ),
        ),
        case(
            "BulkResolve: 1001 ids",
            INVALID,
            bulk(
                &alice,
                apb::BulkResolveRequest {
                    request_ids: (0..1001).map(|i| format!("id-{i}")).collect(),
                    decision: 1,
                    ..Default::default()
                },
            ),
        ),
        case(
            "BulkResolve: an empty id",
            INVALID,
            bulk(
                &alice,
                apb::BulkResolveRequest {
                    request_ids: vec![fx.gate_request.clone(), String::new()],
                    decision: 1,
                    ..Default::default()
                },
            ),
        ),
        case(
            "BulkResolve: EDIT without args",
            INVALID,
            bulk(
                &alice,
                apb::BulkResolveRequest {
                    request_ids: vec![fx.gate_request.clone()],
                    decision: rpb::DecisionKind::Edit as i32,
                    ..Default::default()
                },
            ),
        ),
        case(
            "BulkResolve: unknown state in filter",
            INVALID,
            bulk(
                &alice,
                apb::BulkResolveRequest {
                    filter: Some(apb::ApprovalFilter {
                        states: vec![77],
                        ..Default::default()
                    }),
                    decision: 1,
                    ..Default::default()
                },
            ),
        ),
        case(
            "BulkResolve: unknown id (item)",
            NOT_FOUND,
            bulk(
                &alice,
                apb::BulkResolveRequest {
                    request_ids: vec!["nope".into()],
                    decision: 1,
                    ..Default::default()
                },
            ),
        ),
        case(
            "BulkResolve: own run (item)",
            DENIED,
            bulk(
                &bob,
                apb::BulkResolveRequest {
                    request_ids: vec![fx.own_request.clone()],
                    decision: 1,
                    ..Default::default()
                },
            ),
        ),
        case(
            "BulkResolve: submitter may not decide",
            DENIED,
            bulk(
                &sam,
                apb::BulkResolveRequest {
                    request_ids: vec![fx.gate_request.clone()],
                    decision: 1,
                    ..Default::default()
                },
            ),
        ),
        case(
            "WatchApprovals: unknown state in filter",
            INVALID,
            watch(
                &alice,
                Some(apb::ApprovalFilter {
                    states: vec![99],
                    ..Default::default()
                }),
            ),
        ),
        case(
            "WatchApprovals: bad glob",
            INVALID,
            watch(
                &alice,
                Some(apb::ApprovalFilter {
                    tool_name: "a[".into(),
                    ..Default::default()
                }),
            ),
        ),
        case(
            "WatchApprovals: thread id with NUL in filter",
            INVALID,
            watch(
                &alice,
                Some(apb::ApprovalFilter {
                    thread_id: "t\0".into(),
                    ..Default::default()
                }),
            ),
        ),
        case(
            "WatchApprovals: submitter may not watch",
            DENIED,
            watch(&sam, None),
        ),
        case(
            "GetAuditLog: neither request nor run",
            INVALID,
            audit(&alice, apb::GetAuditLogRequest::default()),
        ),
        case(
            "GetAuditLog: both request and run",
            INVALID,
            audit(
                &alice,
                apb::GetAuditLogRequest {
                    request_id: fx.gate_request.clone(),
                    run_id: fx.gate_run.clone(),
                    ..Default::default()
                },
            ),
        ),
        case(
            "GetAuditLog: unknown request",
            NOT_FOUND,
            audit(
                &alice,
                apb::GetAuditLogRequest {
                    request_id: "nope".into(),
                    ..Default::default()
                },
            ),
        ),
        case(
            "GetAuditLog: request id with NUL",
            INVALID,
            audit(
                &alice,
                apb::GetAuditLogRequest {
                    request_id: "r\0".into(),
                    ..Default::default()
                },
            ),
        ),
        case(
            "GetAuditLog: run id with NUL",
            INVALID,
            audit(
                &alice,
                apb::GetAuditLogRequest {
                    run_id: "run\0".into(),
                    ..Default::default()
                },
            ),
        ),
        case(
            "GetAuditLog: bad page token",
            INVALID,
            audit(
                &alice,
                apb::GetAuditLogRequest {
                    run_id: fx.gate_run.clone(),
                    page_token: "zz".into(),
                    ..Default::default()
                },
            ),
        ),
        case(
            "GetAuditLog: submitter may not read the audit log",
            DENIED,
            audit(
                &sam,
                apb::GetAuditLogRequest {
                    run_id: fx.gate_run.clone(),
                    ..Default::default()
                },
            ),
        ),
    ]
}

/// A client that sends `authorization` verbatim (`None`: no header at all).
fn raw_auth(
    header: Option<&'static str>,
) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, Status> + Clone {
    move |mut req: tonic::Request<()>| {
        if let Some(h) = header {
            req.metadata_mut()
                .insert("authorization", h.parse().unwrap());
        }
        Ok(req)
    }
}

fn credential_cases(fx: &Fixture) -> Vec<Case> {
    let runner = |token: Option<&str>| runner_as(&fx.runner_url, token);
    let approvals = |token: Option<&str>| approvals_as(&fx.approval_url, token);
    let list_runs = |mut c: RunnerClient| async move {
        unit(c.list_runs(rpb::ListRunsRequest::default()).await)
    };
    let submit = |mut c: RunnerClient| async move {
        unit(
            c.submit_run(rpb::SubmitRunRequest {
                tree_id: "bi-gate".into(),
                ..Default::default()
            })
            .await,
        )
    };
    let decide = |mut c: ApprovalClient, id: String| async move {
        unit(
            c.resolve(apb::ResolveRequest {
                request_id: id,
                decision: 1,
                ..Default::default()
            })
            .await,
        )
    };
    let runner_raw = |h: Option<&'static str>| {
        RunnerServiceClient::with_interceptor(lazy_channel(&fx.runner_url), raw_auth(h))
    };
    let approvals_raw = |h: Option<&'static str>| {
        ApprovalServiceClient::with_interceptor(lazy_channel(&fx.approval_url), raw_auth(h))
    };
    let id = fx.gate_request.clone();
    vec![
        case(
            "runner: no credentials",
            UNAUTHENTICATED,
            list_runs(runner(None)),
        ),
        case(
            "runner: unknown token",
            UNAUTHENTICATED,
            submit(runner(Some("not-a-token"))),
        ),
        case(
            "runner: expired token",
            UNAUTHENTICATED,
            submit(runner(Some(&fx.tokens.expired))),
        ),
        case("runner: Basic instead of Bearer", UNAUTHENTICATED, {
            let mut c = runner_raw(Some("Basic c2FtOnNhbQ=="));
            async move {
                unit(
                    c.submit_run(rpb::SubmitRunRequest {
                        tree_id: "bi-gate".into(),
                        ..Default::default()
                    })
                    .await,
                )
            }
        }),
        case("runner: Bearer without a token", UNAUTHENTICATED, {
            let mut c = runner_raw(Some("Bearer "));
            async move { unit(c.list_runs(rpb::ListRunsRequest::default()).await) }
        }),
        case("runner: stream without credentials", UNAUTHENTICATED, {
            let mut c = runner_raw(None);
            async move {
                unit(
                    c.stream_events(rpb::StreamEventsRequest {
                        follow: true,
                        ..Default::default()
                    })
                    .await,
                )
            }
        }),
        case("runner: resolve without credentials", UNAUTHENTICATED, {
            let mut c = runner_raw(None);
            let (run, req) = (fx.input_run.clone(), fx.input_request.clone());
            async move {
                unit(
                    c.resolve(rpb::ResolveRequest {
                        run_id: run,
                        request_id: req,
                        decision_id: "d".into(),
                        action: 1,
                        result: Some(to_proto_value(&json!({"text": "valid"}))),
                        ..Default::default()
                    })
                    .await,
                )
            }
        }),
        case("runner: ack without credentials", UNAUTHENTICATED, {
            let mut c = runner_raw(None);
            async move {
                unit(
                    c.ack(rpb::AckRequest {
                        subscriber_id: "approval-svc".into(),
                        seq: 1,
                    })
                    .await,
                )
            }
        }),
        case(
            "approval: no credentials",
            UNAUTHENTICATED,
            decide(approvals(None), id.clone()),
        ),
        case(
            "approval: unknown token",
            UNAUTHENTICATED,
            decide(approvals(Some("not-a-token")), id.clone()),
        ),
        case(
            "approval: expired token",
            UNAUTHENTICATED,
            decide(approvals(Some(&fx.tokens.expired)), id.clone()),
        ),
        case("approval: Basic instead of Bearer", UNAUTHENTICATED, {
            let mut c = approvals_raw(Some("Basic YWxpY2U6YWxpY2U="));
            async move { unit(c.list_approvals(apb::ListApprovalsRequest::default()).await) }
        }),
        case("approval: watch without credentials", UNAUTHENTICATED, {
            let mut c = approvals_raw(None);
            async move {
                unit(
                    c.watch_approvals(apb::WatchApprovalsRequest::default())
                        .await,
                )
            }
        }),
    ]
}
