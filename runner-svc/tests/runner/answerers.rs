//! Who may answer a run's questions, and what a run's nodes show, over gRPC on a real socket with
//! authentication on: a `user_input` node's `answerers` (an identity, or `group:NAME` from the
//! tokens file) are the only callers besides operators and services; a node naming no one is
//! answered by the run's submitter. `GetRunNodes` shows each node's status as the run left it.

use std::time::Duration;

use arbor_runner_svc::runs::RunView;
use arbor_shared::{
    auth::{Authenticator, BearerToken, hash_token},
    domain::{RunStatus, SuspensionState},
    json::to_proto_value,
    proto::runner::v1::{self as pb, runner_service_client::RunnerServiceClient},
    testing::eventually,
};
use serde_json::{Value as Json, json};
use tonic::{Code, service::interceptor::InterceptedService, transport::Channel};

use crate::common::{Backend, Served};

type Client = RunnerServiceClient<InterceptedService<Channel, BearerToken>>;

const WAIT: Duration = Duration::from_secs(20);

/// sub and sam submit; alice, bob and carol approve (bob writes, in group `writers`); olga operates.
fn tokens() -> Authenticator {
    let mut text = String::new();
    for (name, role, groups) in [
        ("sub", "submitter", ""),
        ("sam", "submitter", ""),
        ("alice", "approver", ""),
        ("bob", "approver", "'writers'"),
        ("carol", "approver", "'readers'"),
        ("olga", "operator", ""),
    ] {
        text.push_str(&format!(
            "[[principal]]\nname = '{name}'\nroles = ['{role}']\ngroups = [{groups}]\n\
             token_sha256 = '{}'\n",
            hash_token(&format!("{name}-token"))
        ));
    }
    Authenticator::from_toml(&text).unwrap()
}

async fn as_(served: &Served, name: &str) -> Client {
    let channel = Channel::from_shared(served.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let token = format!("{name}-token");
    RunnerServiceClient::with_interceptor(channel, BearerToken::new(Some(&token)).unwrap())
}

async fn register(c: &mut Client, doc: Json) -> Result<(), tonic::Status> {
    c.register_tree(pb::RegisterTreeRequest {
        document: doc.to_string(),
        format: pb::TreeFormat::Json.into(),
    })
    .await
    .map(|_| ())
}

fn asking(id: &str, answerers: Option<Json>) -> Json {
    let mut ask = json!({"type": "user_input", "name": "notes", "input_kind": "text",
        "prompt": "Release notes?", "output": "notes"});
    if let Some(a) = answerers {
        ask["answerers"] = a;
    }
    json!({"id": id, "version": 1, "root": {"type": "sequence", "name": "s", "children": [
        {"type": "set", "name": "first", "key": "a", "value": 1},
        ask,
        {"type": "set", "name": "last", "key": "b", "value": 2}]}})
}

async fn submit(c: &mut Client, tree: &str) -> String {
    c.submit_run(pb::SubmitRunRequest {
        tree_id: tree.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .run
    .unwrap()
    .run_id
}

async fn suspended(served: &Served, run_id: &str) -> RunView {
    eventually(&format!("run {run_id} to suspend"), WAIT, || async {
        let view = served.runner.get_run(run_id).unwrap();
        (view.run.status == RunStatus::Suspended).then_some(view)
    })
    .await
}

async fn answer(c: &mut Client, run_id: &str, request_id: &str, text: &str) -> tonic::Result<()> {
    c.resolve(pb::ResolveRequest {
        run_id: run_id.into(),
        request_id: request_id.into(),
        decision_id: format!("answer-{text}"),
        action: pb::ResolveAction::Resume.into(),
        result: Some(to_proto_value(&json!({"text": text}))),
        ..Default::default()
    })
    .await
    .map(|_| ())
}

/// Refused with PERMISSION_DENIED naming who may answer, and the run as it was.
async fn refused(served: &Served, c: &mut Client, run_id: &str, request_id: &str, who: &str) {
    let before = served.runner.get_run(run_id).unwrap();
    let err = answer(c, run_id, request_id, "nope").await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains(who), "{}", err.message());
    let after = served.runner.get_run(run_id).unwrap();
    assert_eq!(after.run.status, RunStatus::Suspended);
    assert_eq!(after.suspensions.len(), 1);
    assert_eq!(after.suspensions[0].state, SuspensionState::Active);
    assert_eq!(after.blackboard, before.blackboard);
    assert_eq!(after.run.updated_at_ms, before.run.updated_at_ms);
}

async fn succeeded_with(served: &Served, run_id: &str, notes: &str) {
    eventually(&format!("run {run_id} to succeed"), WAIT, || async {
        let view = served.runner.get_run(run_id).unwrap();
        (view.run.status == RunStatus::Succeeded).then_some(())
    })
    .await;
    let view = served.runner.get_run(run_id).unwrap();
    assert_eq!(view.blackboard["notes"], json!(notes));
}

#[tokio::test]
async fn named_answerers_and_their_groups_answer_and_no_one_else() {
    let dir = tempfile::tempdir().unwrap();
    let served = Backend::Sled.serve_with_auth(dir.path(), tokens()).await;
    let mut sub = as_(&served, "sub").await;
    let named = Some(json!(["alice", "group:writers"]));
    register(&mut sub, asking("named", named)).await.unwrap();

    let run = submit(&mut sub, "named").await;
    let view = suspended(&served, &run).await;
    let ask = &view.suspensions[0];
    assert_eq!(ask.payload["answerers"], json!(["alice", "group:writers"]));
    let rid = ask.request_id.clone();

    // Neither another approver, nor the submitter when the node names others.
    let mut carol = as_(&served, "carol").await;
    refused(&served, &mut carol, &run, &rid, "alice, group:writers").await;
    refused(&served, &mut sub, &run, &rid, "alice, group:writers").await;
    // Carol may not even read the run; bob, a member of `writers`, may while it waits for him.
    let read = |c: &mut Client| {
        let mut c = c.clone();
        let run = run.clone();
        async move {
            c.get_run(pb::GetRunRequest { run_id: run })
                .await
                .map(|_| ())
        }
    };
    assert_eq!(
        read(&mut carol).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let mut bob = as_(&served, "bob").await;
    read(&mut bob).await.unwrap();

    // A member of the named group answers.
    answer(&mut bob, &run, &rid, "from bob").await.unwrap();
    succeeded_with(&served, &run, "from bob").await;
    // Once answered, the run waits for bob no more: he reads it no more.
    assert_eq!(
        read(&mut bob).await.unwrap_err().code(),
        Code::PermissionDenied
    );

    // The named identity answers.
    let run = submit(&mut sub, "named").await;
    let rid = suspended(&served, &run).await.suspensions[0]
        .request_id
        .clone();
    let mut alice = as_(&served, "alice").await;
    answer(&mut alice, &run, &rid, "from alice").await.unwrap();
    succeeded_with(&served, &run, "from alice").await;
    served.stop().await;
}

#[tokio::test]
async fn a_node_naming_no_one_is_answered_by_the_runs_submitter_and_operators() {
    let dir = tempfile::tempdir().unwrap();
    let served = Backend::Sled.serve_with_auth(dir.path(), tokens()).await;
    let mut sub = as_(&served, "sub").await;
    register(&mut sub, asking("default", None)).await.unwrap();

    let run = submit(&mut sub, "default").await;
    let view = suspended(&served, &run).await;
    assert!(view.suspensions[0].payload.get("answerers").is_none());
    let rid = view.suspensions[0].request_id.clone();
    // Another submitter and any approver: refused (they could answer any run's input before).
    for who in ["sam", "alice"] {
        let mut c = as_(&served, who).await;
        refused(&served, &mut c, &run, &rid, "the run's submitter 'sub'").await;
    }
    answer(&mut sub, &run, &rid, "mine").await.unwrap();
    succeeded_with(&served, &run, "mine").await;

    let run = submit(&mut sub, "default").await;
    let rid = suspended(&served, &run).await.suspensions[0]
        .request_id
        .clone();
    let mut olga = as_(&served, "olga").await;
    answer(&mut olga, &run, &rid, "operator").await.unwrap();
    succeeded_with(&served, &run, "operator").await;
    served.stop().await;
}

#[tokio::test]
async fn an_external_result_comes_only_from_those_the_node_names() {
    let dir = tempfile::tempdir().unwrap();
    let served = Backend::Sled.serve_with_auth(dir.path(), tokens()).await;
    let mut sub = as_(&served, "sub").await;
    let doc = json!({"id": "ext", "version": 1, "root": {"type": "external", "name": "backup",
        "execution_kind": "backup", "task": {"db": "billing"}, "output": "backup",
        "answerers": ["group:writers"]}});
    register(&mut sub, doc).await.unwrap();
    let run = submit(&mut sub, "ext").await;
    let view = suspended(&served, &run).await;
    assert_eq!(
        view.suspensions[0].payload["answerers"],
        json!(["group:writers"])
    );
    let rid = view.suspensions[0].request_id.clone();
    let report = |c: &mut Client| {
        let mut c = c.clone();
        let (run, rid) = (run.clone(), rid.clone());
        async move {
            c.resolve(pb::ResolveRequest {
                run_id: run,
                request_id: rid,
                decision_id: "backup-done".into(),
                action: pb::ResolveAction::Resume.into(),
                result: Some(to_proto_value(
                    &json!({"status": "succeeded", "result": {"bytes": 42}}),
                )),
                ..Default::default()
            })
            .await
        }
    };
    // The submitter and a reader-group member are not writers.
    for who in ["sub", "carol"] {
        let mut c = as_(&served, who).await;
        let err = report(&mut c).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{who}: {err:?}");
        assert!(err.message().contains("group:writers"), "{}", err.message());
    }
    assert_eq!(
        served.runner.get_run(&run).unwrap().run.status,
        RunStatus::Suspended
    );
    let mut bob = as_(&served, "bob").await;
    report(&mut bob).await.unwrap();
    eventually("the run to succeed", WAIT, || async {
        let view = served.runner.get_run(&run).unwrap();
        (view.run.status == RunStatus::Succeeded).then_some(())
    })
    .await;
    assert_eq!(
        served.runner.get_run(&run).unwrap().blackboard["backup"],
        json!({"bytes": 42})
    );
    served.stop().await;
}

#[tokio::test]
async fn answerers_that_name_no_one_or_no_name_are_refused_at_registration() {
    let dir = tempfile::tempdir().unwrap();
    let served = Backend::Sled.serve_with_auth(dir.path(), tokens()).await;
    let mut sub = as_(&served, "sub").await;
    for (bad, field) in [
        (json!([]), "answerers"),
        (json!(["alice", "group:pay ments"]), "answerers[1]"),
        (json!("alice"), "answerers"),
    ] {
        let err = register(&mut sub, asking("bad", Some(bad.clone())))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad}");
        let details = format!("{:?}", err.details());
        assert!(
            err.message().contains(field) || details.contains(field),
            "{bad}: {err:?}"
        );
    }
    served.stop().await;
}

#[tokio::test]
async fn run_nodes_show_done_waiting_and_idle_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let served = Backend::Sled.serve_with_auth(dir.path(), tokens()).await;
    let mut sub = as_(&served, "sub").await;
    let doc = json!({"id": "gated", "version": 1, "root": {"type": "sequence", "children": [
        {"type": "set", "name": "first", "key": "a", "value": 1},
        {"type": "approval", "name": "gate", "title": "Go?",
         "child": {"type": "set", "name": "inner", "key": "b", "value": 2}},
        {"type": "user_input", "name": "notes", "input_kind": "text", "prompt": "Notes?"},
        {"type": "set", "name": "last", "key": "c", "value": 3}]}});
    register(&mut sub, doc).await.unwrap();
    let run = submit(&mut sub, "gated").await;
    suspended(&served, &run).await;

    use pb::NodeStatus as S;
    assert_eq!(
        nodes_of(&mut sub, &run).await,
        rows(&[
            ("root", "sequence", "", 0, S::Running),
            ("first", "set", "first", 1, S::Success),
            ("gate", "approval", "gate", 1, S::Waiting),
            ("inner", "set", "inner", 2, S::Idle),
            ("notes", "user_input", "notes", 1, S::Idle),
            ("last", "set", "last", 1, S::Idle),
        ])
    );
    // The waiting node is the one the suspension names.
    let view = served.runner.get_run(&run).unwrap();
    assert_eq!(view.suspensions[0].node_locator, "gate");

    // Same readers as GetRun: another submitter may not; an approver may (an approval waits).
    let ask = |c: &mut Client, run_id: &str| {
        let mut c = c.clone();
        let run_id = run_id.to_string();
        async move {
            c.get_run_nodes(pb::GetRunNodesRequest { run_id })
                .await
                .map(|r| r.into_inner().nodes.len())
        }
    };
    let mut sam = as_(&served, "sam").await;
    assert_eq!(
        ask(&mut sam, &run).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let mut carol = as_(&served, "carol").await;
    assert_eq!(ask(&mut carol, &run).await.unwrap(), 6);
    // Bad ids.
    assert_eq!(
        ask(&mut sub, "").await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        ask(&mut sub, "no-such-run").await.unwrap_err().code(),
        Code::NotFound
    );

    // Past the gate, waiting for the notes: the gate and its child are done, though the child's
    // status went back to idle when the gate finished.
    crate::common::approve_first(&served.runner, &run, "go").await;
    eventually("the run to wait for the notes", WAIT, || async {
        let view = served.runner.get_run(&run).unwrap();
        view.suspensions
            .iter()
            .any(|s| s.node_locator == "notes")
            .then_some(())
    })
    .await;
    assert_eq!(
        nodes_of(&mut sub, &run).await,
        rows(&[
            ("root", "sequence", "", 0, S::Running),
            ("first", "set", "first", 1, S::Success),
            ("gate", "approval", "gate", 1, S::Success),
            ("inner", "set", "inner", 2, S::Success),
            ("notes", "user_input", "notes", 1, S::Waiting),
            ("last", "set", "last", 1, S::Idle),
        ])
    );
    served.stop().await;
}

type NodeRow = (String, String, String, u32, pb::NodeStatus);

fn rows(expected: &[(&str, &str, &str, u32, pb::NodeStatus)]) -> Vec<NodeRow> {
    expected
        .iter()
        .map(|(l, k, n, d, s)| (l.to_string(), k.to_string(), n.to_string(), *d, *s))
        .collect()
}

/// GetRunNodes as `c`: each node's locator, kind, name, depth and status.
async fn nodes_of(c: &mut Client, run_id: &str) -> Vec<NodeRow> {
    c.get_run_nodes(pb::GetRunNodesRequest {
        run_id: run_id.into(),
    })
    .await
    .unwrap()
    .into_inner()
    .nodes
    .iter()
    .map(|n| {
        let status = n.status();
        (
            n.locator.clone(),
            n.kind.clone(),
            n.name.clone(),
            n.depth,
            status,
        )
    })
    .collect()
}
