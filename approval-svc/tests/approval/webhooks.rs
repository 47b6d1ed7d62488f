//! Signed webhooks to a real HTTP receiver: requested, decided and expired messages reach it on
//! sled and on PostgreSQL, their signatures verify with the published `standardwebhooks`
//! crate, a receiver failing its first answers still gets each message (once, deduplicated by
//! `webhook-id`), and an endpoint that hangs never delays a decision.

use std::time::Duration;

use arbor_approval_svc::{ServeConfig, webhooks::WebhookConfig};
use arbor_shared::{
    proto::{approval::v1::ApprovalState, runner::v1 as runner_pb},
    time::{now_ms, timestamp},
};
use arbor_testkit::{
    PgCluster,
    webhooks::{Received, WebhookReceiver},
};

use crate::support::*;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One endpoint wanting the three events that exist today, retried quickly.
fn with_webhooks(mut cfg: ServeConfig, receiver: &WebhookReceiver) -> ServeConfig {
    cfg.webhooks = WebhookConfig::parse(&format!(
        "link_base = \"https://inbox.example\"\nretry_min_ms = 20\nretry_max_ms = 200\n\
         timeout_ms = 1000\n[[endpoint]]\nname = \"receiver\"\nurl = \"{}\"\n\
         secret = \"{SECRET}\"\nevents = [\"requested\", \"decided\", \"expired\"]\n",
        receiver.url()
    ))
    .unwrap();
    cfg
}

async fn message(receiver: &WebhookReceiver, kind: &str, id: &str) -> Received {
    eventually(&format!("{kind} of {id} at the receiver"), WAIT, || async {
        receiver.about(kind, id).into_iter().next()
    })
    .await
}

/// Two approvals requested, one decided by a person, one expired by its deadline: every
/// message arrives, signed, with the approval's data and its deep link.
async fn requested_decided_and_expired_are_delivered(cfg: ServeConfig, runner: &FakeRunner) {
    let receiver = WebhookReceiver::start(SECRET).await;
    let svc = Svc::start(with_webhooks(cfg, &receiver)).await;
    let client = svc.client().await;
    runner.push_request(node_request("hook-decided", "run-1"));
    runner.push_request(runner_pb::ApprovalRequested {
        deadline: Some(timestamp(now_ms() + 300)),
        ..node_request("hook-expired", "run-2")
    });
    wait_for(
        &client,
        "hook-decided",
        "pending",
        state(ApprovalState::Pending),
    )
    .await;
    client
        .clone()
        .resolve(pb_resolve("hook-decided"))
        .await
        .unwrap();

    let requested = message(&receiver, "approval.requested", "hook-decided").await;
    let data = &requested.body["data"];
    assert_eq!(data["run_id"], "run-1");
    assert_eq!(data["thread_id"], "thread-run-1");
    assert_eq!(data["tree_id"], "deploy-service");
    assert_eq!(data["state"], "PENDING");
    assert_eq!(data["link"], "https://inbox.example/approvals/hook-decided");
    assert!(requested.id.starts_with("msg_"), "{}", requested.id);
    assert!(requested.body["timestamp"].as_str().unwrap().ends_with('Z'));

    let decided = message(&receiver, "approval.decided", "hook-decided").await;
    assert_eq!(decided.body["data"]["state"], "RESOLVED");
    assert_eq!(decided.body["data"]["decision"]["kind"], "APPROVE");
    assert_eq!(decided.body["data"]["decision"]["reason"], "ship it");

    message(&receiver, "approval.requested", "hook-expired").await;
    let expired = message(&receiver, "approval.expired", "hook-expired").await;
    assert_eq!(expired.body["data"]["state"], "EXPIRED");
    assert_eq!(expired.body["data"]["decision"]["decided_by"], "timeout");

    assert!(receiver.forged().is_empty(), "{:?}", receiver.forged());
    assert!(receiver.unique().iter().all(|r| r.accepted == 1));
    assert_eq!(receiver.unique().len(), 4, "{:?}", receiver.unique());
    svc.stop().await;
}

fn pb_resolve(id: &str) -> arbor_shared::proto::approval::v1::ResolveRequest {
    arbor_shared::proto::approval::v1::ResolveRequest {
        reason: "ship it".into(),
        ..resolve_req(id, runner_pb::DecisionKind::Approve)
    }
}

#[tokio::test]
async fn webhooks_on_sled_are_signed_and_carry_each_event() {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    requested_decided_and_expired_are_delivered(config(dir.path(), &runner.url()), &runner).await;
}

#[tokio::test]
async fn webhooks_on_postgres_are_signed_and_carry_each_event() {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    let url = tokio::task::spawn_blocking(|| PgCluster::shared().fresh_database("webhooks"))
        .await
        .unwrap();
    let mut cfg = config(dir.path(), &runner.url());
    cfg.store_url = Some(url);
    requested_decided_and_expired_are_delivered(cfg, &runner).await;
}

#[tokio::test]
async fn webhooks_reach_a_receiver_that_fails_its_first_answers_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    let receiver = WebhookReceiver::start(SECRET).await;
    receiver.fail_next(3);
    let svc = Svc::start(with_webhooks(config(dir.path(), &runner.url()), &receiver)).await;
    let client = svc.client().await;
    for i in 0..3 {
        runner.push_request(node_request(&format!("flaky-{i}"), "run-1"));
    }
    for i in 0..3 {
        let id = format!("flaky-{i}");
        wait_for(&client, &id, "pending", state(ApprovalState::Pending)).await;
        client.clone().resolve(pb_resolve(&id)).await.unwrap();
    }
    eventually("six messages accepted", WAIT, || async {
        (receiver.unique().len() == 6).then_some(())
    })
    .await;
    assert!(receiver.calls() >= 9, "3 failed calls, then 6 accepted");
    for i in 0..3 {
        let id = format!("flaky-{i}");
        assert_eq!(receiver.about("approval.requested", &id).len(), 1);
        assert_eq!(receiver.about("approval.decided", &id).len(), 1);
    }
    // An endpoint's messages go oldest first: each request before its decision.
    let order: Vec<(String, String)> = receiver
        .unique()
        .iter()
        .map(|r| {
            let d = &r.body["data"]["request_id"];
            (
                r.body["type"].as_str().unwrap().into(),
                d.as_str().unwrap().into(),
            )
        })
        .collect();
    for i in 0..3 {
        let id = format!("flaky-{i}");
        let at = |kind: &str| order.iter().position(|(k, r)| k == kind && *r == id);
        assert!(
            at("approval.requested") < at("approval.decided"),
            "{order:?}"
        );
    }
    assert!(receiver.forged().is_empty());
    svc.stop().await;
}

#[tokio::test]
async fn webhooks_to_a_hanging_endpoint_do_not_delay_decisions() {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    let receiver = WebhookReceiver::start(SECRET).await;
    receiver.hang(true);
    let mut cfg = with_webhooks(config(dir.path(), &runner.url()), &receiver);
    // Longer than this test waits for any decision.
    cfg.webhooks.retry.timeout = Duration::from_secs(600);
    let svc = Svc::start(cfg).await;
    let client = svc.client().await;
    for i in 0..5 {
        runner.push_request(node_request(&format!("held-{i}"), "run-1"));
    }
    eventually("the first message held by the endpoint", WAIT, || async {
        (receiver.calls() > 0).then_some(())
    })
    .await;
    for i in 0..5 {
        let id = format!("held-{i}");
        wait_for(&client, &id, "pending", state(ApprovalState::Pending)).await;
        let answered = tokio::time::timeout(WAIT, client.clone().resolve(pb_resolve(&id))).await;
        assert!(
            answered.unwrap().is_ok(),
            "a decision answers while the endpoint hangs"
        );
        wait_for(&client, &id, "resolved", state(ApprovalState::Resolved)).await;
    }
    assert!(receiver.unique().is_empty());
    receiver.hang(false);
    eventually("every message once the endpoint answers", WAIT, || async {
        (receiver.unique().len() == 10).then_some(())
    })
    .await;
    svc.stop().await;
}
