//! The loop with the runner, against an in-test RunnerService on 127.0.0.1:0: subscription
//! (store, then ack; replay, reconnect, lost cursor), delivery (retry with the same decision id,
//! refusal), consumption (ack → prune), cancellation, and policy decisions on the same path.

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use arbor_approval_svc::{policy::Policy, runner::SUBSCRIBER_ID};
use arbor_shared::digest;
use arbor_shared::proto::{
    approval::v1::{self as pb, ApprovalState, AuditAction},
    runner::v1::{self as runner_pb, DecisionKind, DecisionSource, ResolveAction},
};
use support::*;
use tonic::Code;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

async fn setup() -> (tempfile::TempDir, FakeRunner, Svc, Client) {
    setup_with(|_| {}).await
}

async fn setup_with(
    tweak: impl FnOnce(&mut arbor_approval_svc::ServeConfig),
) -> (tempfile::TempDir, FakeRunner, Svc, Client) {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    let mut cfg = config(dir.path(), &runner.url());
    tweak(&mut cfg);
    let svc = Svc::start(cfg).await;
    let client = svc.client().await;
    (dir, runner, svc, client)
}

async fn wait_cursor(runner: &FakeRunner, seq: u64) {
    eventually("the runner cursor to be acked", WAIT, || async {
        (runner.cursor(SUBSCRIBER_ID) >= seq).then_some(())
    })
    .await;
}

async fn wait_resolves(runner: &FakeRunner, id: &str, n: usize) -> Vec<runner_pb::ResolveRequest> {
    eventually("Resolve calls at the runner", WAIT, || async {
        let calls = runner.resolves_for(id);
        (calls.len() >= n).then_some(calls)
    })
    .await
}

/// The trail of an approval decided, delivered and consumed.
const CONSUMED: [AuditAction; 5] = [
    AuditAction::Requested,
    AuditAction::Decided,
    AuditAction::Delivered,
    AuditAction::Acked,
    AuditAction::Pruned,
];

/// The runner asks for approval `r1` of `run-1`, and a person decides it `kind`.
async fn decide_r1(runner: &FakeRunner, client: &mut Client, kind: DecisionKind) {
    runner.push_request(node_request("r1", "run-1"));
    wait_for(client, "r1", "r1 pending", state(ApprovalState::Pending)).await;
    client.resolve(resolve_req("r1", kind)).await.unwrap();
}

fn actions(entries: &[pb::AuditEntry]) -> Vec<AuditAction> {
    entries
        .iter()
        .map(|e| AuditAction::try_from(e.action).unwrap())
        .collect()
}

#[tokio::test]
async fn a_decision_travels_to_the_run_and_is_pruned_once_consumed() {
    let (_dir, runner, svc, mut client) = setup().await;
    let seq = runner.push_request(tool_request("r1", "run-1", "ledger.append"));
    wait_for(&client, "r1", "r1 pending", state(ApprovalState::Pending)).await;
    // The cursor is acked only once the request is durable here.
    wait_cursor(&runner, seq).await;

    let decided = client
        .resolve(pb::ResolveRequest {
            args: Some(arbor_shared::json::to_proto_value(
                &serde_json::json!({"replicas": 1}),
            )),
            reason: "one is enough".into(),
            ..resolve_req("r1", DecisionKind::Edit)
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    let decision_id = decided.decision.clone().unwrap().decision_id;

    let call = wait_resolves(&runner, "r1", 1).await.remove(0);
    assert_eq!(call.run_id, "run-1");
    assert_eq!(call.decision_id, decision_id);
    assert_eq!(call.action, ResolveAction::Resume as i32);
    assert_eq!(call.decided_by, "anonymous");
    assert_eq!(call.source, DecisionSource::Person as i32);
    assert_eq!(call.reason, "one is enough");
    let result = arbor_shared::json::from_optional_value(call.result.as_ref());
    assert_eq!(result, serde_json::json!({"replicas": 1}));
    // The runner runs the edit only with arguments of the digest decided on.
    assert_eq!(call.args_digest, digest::of(&result));
    assert_eq!(decided.decision.unwrap().args_digest, call.args_digest);
    let delivered = wait_for(&client, "r1", "delivery recorded", |a| {
        a.delivery_attempts == 1
    })
    .await;
    assert_eq!(delivered.state, ApprovalState::Resolved as i32);

    let consumed = runner.push_consumed("run-1", "r1", &decision_id);
    let pruned = wait_for(&client, "r1", "r1 pruned", state(ApprovalState::Pruned)).await;
    assert!(pruned.request.unwrap().tool_args.is_none());
    wait_cursor(&runner, consumed).await;
    assert_eq!(actions(&audit_actions(&mut client, "r1").await), CONSUMED);
    assert_eq!(runner.resolves_for("r1").len(), 1, "delivered exactly once");
    svc.stop().await;
}

/// Each decision tells the runner the digest of what the run is to go on with: an approve the
/// request's arguments (kept after they are pruned), a response its result, a reject none.
#[tokio::test]
async fn the_runner_is_told_the_digest_each_decision_runs_with() {
    let (_dir, runner, svc, mut client) = setup().await;
    let answer = serde_json::json!({"status": "skipped"});
    for (id, kind) in [
        ("approve", DecisionKind::Approve),
        ("respond", DecisionKind::Respond),
        ("reject", DecisionKind::Reject),
    ] {
        runner.push_request(tool_request(id, &format!("run-{id}"), "ledger.append"));
        wait_for(&client, id, "pending", state(ApprovalState::Pending)).await;
        let result =
            (kind == DecisionKind::Respond).then(|| arbor_shared::json::to_proto_value(&answer));
        client
            .resolve(pb::ResolveRequest {
                result,
                ..resolve_req(id, kind)
            })
            .await
            .unwrap();
    }
    let asked = digest::of(&serde_json::json!({"entry": {"replicas": 3}}));
    for (id, want) in [
        ("approve", asked.clone()),
        ("respond", digest::of(&answer)),
        ("reject", String::new()),
    ] {
        let call = wait_resolves(&runner, id, 1).await.remove(0);
        assert_eq!(call.args_digest, want, "{id}");
    }

    let decision_id = get(&mut client, "approve")
        .await
        .decision
        .unwrap()
        .decision_id;
    runner.push_consumed("run-approve", "approve", &decision_id);
    let pruned = wait_for(&client, "approve", "pruned", state(ApprovalState::Pruned)).await;
    assert!(pruned.request.unwrap().tool_args.is_none());
    assert_eq!(pruned.decision.unwrap().args_digest, asked);
    svc.stop().await;
}

#[tokio::test]
async fn duplicate_events_and_late_duplicates_are_harmless() {
    let (_dir, runner, svc, mut client) = setup().await;
    runner.with(|s| {
        s.duplicate_events = true;
        s.auto_consume = true;
    });
    decide_r1(&runner, &mut client, DecisionKind::Approve).await;
    let pruned = wait_for(&client, "r1", "r1 pruned", state(ApprovalState::Pruned)).await;
    let decision_id = pruned.decision.unwrap().decision_id;

    // The runner re-emits the request and the consumption with new seqs (e.g. after a replay).
    runner.push_request(node_request("r1", "run-1"));
    let last = runner.push_consumed("run-1", "r1", &decision_id);
    wait_cursor(&runner, last).await;

    let a = get(&mut client, "r1").await;
    assert_eq!(a.state, ApprovalState::Pruned as i32);
    assert_eq!(runner.resolves_for("r1").len(), 1);
    let acts = actions(&audit_actions(&mut client, "r1").await);
    assert_eq!(acts, CONSUMED);
    svc.stop().await;
}

#[tokio::test]
async fn the_one_process_on_the_embedded_store_leads_and_says_so() {
    let (_dir, _runner, svc, client) =
        setup_with(|cfg| cfg.replica_name = Some("solo".into())).await;
    let got = eventually("the process to lead", WAIT, || {
        let mut client = client.clone();
        async move {
            let r = client.get_leader(pb::GetLeaderRequest {}).await.ok()?;
            Some(r.into_inner()).filter(|r| r.leading)
        }
    })
    .await;
    assert_eq!(
        got,
        pb::GetLeaderResponse {
            replica: "solo".into(),
            leading: true,
            leader: "solo".into()
        }
    );
    svc.stop().await;
}

#[tokio::test]
async fn delivery_retries_transient_failures_with_the_same_decision_id() {
    let (_dir, runner, svc, mut client) = setup().await;
    runner.with(|s| {
        s.resolve_script = [Code::Unavailable, Code::Unavailable, Code::Internal].into();
    });
    decide_r1(&runner, &mut client, DecisionKind::Reject).await;
    let calls = wait_resolves(&runner, "r1", 4).await;
    assert!(calls.iter().all(|c| c.decision_id == calls[0].decision_id));
    assert!(
        calls
            .iter()
            .all(|c| c.action == ResolveAction::Cancel as i32)
    );
    let a = wait_for(&client, "r1", "delivered", |a| {
        a.delivery_attempts == 4 && a.last_delivery_error.is_empty()
    })
    .await;
    assert_eq!(a.state, ApprovalState::Resolved as i32);
    assert_eq!(
        runner.with(|s| s.accepted.get("r1").cloned()),
        Some(calls[0].decision_id.clone())
    );
    svc.stop().await;
}

#[tokio::test]
async fn a_refused_delivery_cancels_the_approval_and_stops_retrying() {
    let (_dir, runner, svc, mut client) = setup().await;
    runner.push_request(node_request("dead", "run-1"));
    runner.push_request(node_request("gone", "run-1"));
    wait_for(
        &client,
        "gone",
        "gone pending",
        state(ApprovalState::Pending),
    )
    .await;
    runner.with(|s| {
        s.dead.insert("dead".into());
        s.resolve_script = [Code::NotFound].into();
    });
    for id in ["gone", "dead"] {
        client
            .resolve(resolve_req(id, DecisionKind::Approve))
            .await
            .unwrap();
        let a = wait_for(&client, id, "cancelled", state(ApprovalState::Cancelled)).await;
        assert_eq!(a.delivery_attempts, 1);
        let entries = audit_actions(&mut client, id).await;
        let last = entries.last().unwrap();
        assert_eq!(last.action, AuditAction::Cancelled as i32);
        assert!(last.reason.contains("runner refused"), "{}", last.reason);
    }
    assert_eq!(runner.resolves_for("gone").len(), 1);
    assert_eq!(runner.resolves_for("dead").len(), 1);
    svc.stop().await;
}

#[tokio::test]
async fn withdrawals_and_cancelled_or_superseded_runs_cancel_pending_approvals() {
    let (_dir, runner, svc, mut client) = setup().await;
    runner.push_request(node_request("a1", "run-a"));
    runner.push_request(node_request("a2", "run-a"));
    runner.push_request(node_request("b1", "run-b"));
    runner.push_withdrawn("run-a", "a1");
    wait_for(
        &client,
        "a1",
        "a1 cancelled",
        state(ApprovalState::Cancelled),
    )
    .await;
    assert_eq!(
        get(&mut client, "a2").await.state,
        ApprovalState::Pending as i32
    );

    runner.push_run_finished("run-a", runner_pb::RunStatus::Cancelled);
    wait_for(
        &client,
        "a2",
        "a2 cancelled",
        state(ApprovalState::Cancelled),
    )
    .await;
    assert_eq!(
        get(&mut client, "b1").await.state,
        ApprovalState::Pending as i32
    );
    runner.push_run_finished("run-b", runner_pb::RunStatus::Superseded);
    wait_for(
        &client,
        "b1",
        "b1 cancelled",
        state(ApprovalState::Cancelled),
    )
    .await;

    let err = client
        .resolve(resolve_req("a2", DecisionKind::Approve))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let entries = audit_actions(&mut client, "b1").await;
    assert_eq!(entries.last().unwrap().reason, "run superseded");
    assert!(runner.with(|s| s.resolves.is_empty()));
    svc.stop().await;
}

#[tokio::test]
async fn policy_decisions_take_the_same_path_as_people() {
    let policy = Policy::from_toml(
        r#"
        [[tool]]
        name = "read-only"
        tool = "search.*"
        action = "allow"
        [[tool]]
        name = "no-shell"
        tool = "shell.*"
        action = "deny"
        "#,
    )
    .unwrap();
    let (_dir, runner, svc, mut client) = setup_with(|c| c.policy = policy).await;
    runner.with(|s| s.auto_consume = true);
    runner.push_request(tool_request("s", "run-1", "search.web"));
    runner.push_request(tool_request("x", "run-1", "shell.exec"));
    runner.push_request(tool_request("l", "run-1", "ledger.append"));
    let mut odd = node_request("odd", "run-1");
    odd.kind = 42;
    runner.push_request(odd);

    for (id, action, rule) in [
        ("s", ResolveAction::Resume, "read-only"),
        ("x", ResolveAction::Cancel, "no-shell"),
        ("odd", ResolveAction::Cancel, "unknown-kind"),
    ] {
        let a = wait_for(&client, id, "pruned", state(ApprovalState::Pruned)).await;
        let d = a.decision.unwrap();
        assert_eq!(d.source, DecisionSource::Policy as i32, "{id}");
        assert_eq!(d.rule, rule);
        let call = &runner.resolves_for(id)[0];
        assert_eq!(call.action, action as i32, "{id}");
        assert_eq!(call.source, DecisionSource::Policy as i32);
        let decided = audit_actions(&mut client, id)
            .await
            .into_iter()
            .find(|e| e.action == AuditAction::Decided as i32)
            .unwrap();
        assert_eq!(
            (decided.actor.as_str(), decided.rule.as_str()),
            (rule, rule)
        );
    }
    let odd = get(&mut client, "odd").await;
    assert_eq!(
        odd.request.unwrap().kind,
        42,
        "the unknown kind is shown as sent"
    );
    assert_eq!(
        get(&mut client, "l").await.state,
        ApprovalState::Pending as i32
    );
    svc.stop().await;
}

#[tokio::test]
async fn the_subscription_reconnects_and_resumes_from_the_acked_cursor() {
    let (_dir, runner, svc, client) = setup_with(|c| {
        c.runner_token = Some("svc-token".into());
    })
    .await;
    let first = runner.push_request(node_request("r1", "run-1"));
    wait_for(&client, "r1", "r1 pending", state(ApprovalState::Pending)).await;
    wait_cursor(&runner, first).await;
    runner.kick_streams();
    eventually("a new stream", WAIT, || async {
        (runner.with(|s| s.stream_calls) >= 2).then_some(())
    })
    .await;
    runner.push_request(node_request("r2", "run-1"));
    wait_for(&client, "r2", "r2 pending", state(ApprovalState::Pending)).await;
    // The replay from the acked cursor did not create r1 twice.
    let mut c = client.clone();
    assert_eq!(audit_actions(&mut c, "r1").await.len(), 1);
    let tokens = runner.with(|s| s.tokens.clone());
    assert!(
        tokens
            .iter()
            .all(|t| t.as_deref() == Some("Bearer svc-token")),
        "{tokens:?}"
    );
    svc.stop().await;
}

#[tokio::test]
async fn acks_are_batched_and_reach_the_last_event() {
    let (_dir, runner, svc, _client) = setup().await;
    let mut last = 0;
    for i in 0..300 {
        last = runner.push(
            &format!("run-{i}"),
            runner_pb::EventKind::RunStarted,
            Some(runner_pb::event::Detail::RunStarted(
                runner_pb::RunStarted {
                    tree_id: "t".into(),
                    tree_version: 1,
                    attempt: 1,
                },
            )),
        );
    }
    wait_cursor(&runner, last).await;
    let acks = runner.with(|s| s.acks.clone());
    assert!(acks.len() < 30, "{} acks for 300 events", acks.len());
    assert!(acks.windows(2).all(|w| w[0] < w[1]), "acks move forward");
    svc.stop().await;
}

#[tokio::test]
async fn a_lost_cursor_is_reported_and_retried_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    for i in 0..5 {
        runner.push_request(node_request(&format!("old{i}"), "run-1"));
    }
    runner.compact(5);
    let svc = Svc::start(config(dir.path(), &runner.url())).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(svc.channel());
    let check = HealthCheckRequest {
        service: arbor_approval_svc::runner::subscriber::SUBSCRIPTION_HEALTH.into(),
    };
    eventually("several refused attempts", WAIT, || async {
        (runner.with(|s| s.stream_calls) >= 3).then_some(())
    })
    .await;
    let status = health
        .check(check.clone())
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::NotServing as i32);
    // The service itself still answers (people can decide what it has).
    let overall = health
        .check(HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(overall, ServingStatus::Serving as i32);
    assert_eq!(runner.cursor(SUBSCRIBER_ID), 0, "nothing was skipped");

    // An operator reconciles and moves the cursor; the subscription recovers by itself.
    runner.with(|s| s.cursors.insert(SUBSCRIBER_ID.into(), 5));
    runner.push_request(node_request("new", "run-1"));
    let client = svc.client().await;
    wait_for(&client, "new", "new pending", state(ApprovalState::Pending)).await;
    eventually("subscription healthy", WAIT, || {
        let mut h = health.clone();
        let c = check.clone();
        async move {
            let s = h.check(c).await.ok()?.into_inner().status;
            (s == ServingStatus::Serving as i32).then_some(())
        }
    })
    .await;
    svc.stop().await;
}

/// The runner's acceptance of a decision is recorded with its consumption, in the same write:
/// the trail holds DELIVERED ahead of ACKED, both stamped with that write's time, even though
/// the consumption came well after the runner accepted the decision.
#[tokio::test]
async fn a_delivery_is_recorded_with_the_consumption_that_follows_it() {
    let (_dir, runner, svc, mut client) = setup().await;
    decide_r1(&runner, &mut client, DecisionKind::Approve).await;
    let call = wait_resolves(&runner, "r1", 1).await.remove(0);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    runner.push_consumed("run-1", "r1", &call.decision_id);
    let pruned = wait_for(&client, "r1", "r1 pruned", state(ApprovalState::Pruned)).await;
    assert_eq!(pruned.delivery_attempts, 1);
    let trail = audit_actions(&mut client, "r1").await;
    assert_eq!(actions(&trail), CONSUMED);
    let time = |action: AuditAction| {
        let entry = trail.iter().find(|e| e.action == action as i32).unwrap();
        entry.time.as_ref().map(|t| (t.seconds, t.nanos))
    };
    assert_eq!(time(AuditAction::Delivered), time(AuditAction::Acked));
    assert_eq!(runner.resolves_for("r1").len(), 1, "delivered once");
    svc.stop().await;
}

/// A run cancelled while the runner's acceptance of its decision waits to be recorded: the
/// delivery is recorded first, so the trail says the decision reached the run before the
/// approval was cancelled with it.
#[tokio::test]
async fn a_run_cancelled_after_its_decision_was_accepted_keeps_the_delivery_in_the_trail() {
    let (_dir, runner, svc, mut client) = setup().await;
    decide_r1(&runner, &mut client, DecisionKind::Approve).await;
    wait_resolves(&runner, "r1", 1).await;
    runner.push_run_finished("run-1", runner_pb::RunStatus::Cancelled);
    let cancelled = wait_for(
        &client,
        "r1",
        "r1 cancelled",
        state(ApprovalState::Cancelled),
    )
    .await;
    assert_eq!(cancelled.delivery_attempts, 1, "{cancelled:?}");
    assert_eq!(
        actions(&audit_actions(&mut client, "r1").await),
        vec![
            AuditAction::Requested,
            AuditAction::Decided,
            AuditAction::Delivered,
            AuditAction::Cancelled
        ]
    );
    svc.stop().await;
}
