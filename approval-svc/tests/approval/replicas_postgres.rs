//! Several approval-svc processes on one PostgreSQL database, through `run` on ephemeral ports
//! against the fake runner: one leader follows the runner and delivers, every replica answers
//! and watches, a decision taken on any of them reaches the runner, the next replica takes over
//! when the leader goes, and health follows the database.

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use arbor_approval_svc::runner::subscriber::SUBSCRIPTION_HEALTH;
use arbor_shared::proto::{
    approval::v1::{self as pb, ApprovalState, AuditAction, ChangeKind},
    runner::v1::DecisionKind,
};
use arbor_testkit::PgCluster;
use std::time::Duration;

use support::*;
use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

fn pg_config(
    url: &str,
    runner: &FakeRunner,
    dir: &tempfile::TempDir,
) -> arbor_approval_svc::ServeConfig {
    let mut cfg = config(dir.path(), &runner.url());
    cfg.store_url = Some(url.to_string());
    cfg
}

async fn health_of(svc: &Svc, service: &str) -> Option<i32> {
    let mut health = HealthClient::new(svc.channel());
    let request = HealthCheckRequest {
        service: service.into(),
    };
    Some(health.check(request).await.ok()?.into_inner().status)
}

async fn wait_health(svc: &Svc, service: &str, want: ServingStatus, what: &str) {
    eventually(what, WAIT, || async {
        (health_of(svc, service).await == Some(want as i32)).then_some(())
    })
    .await;
}

/// What `client`'s replica answers to `GetLeader` (its name, whether it leads, the leader's
/// name) once it names a leader.
async fn leader_seen_by(client: &Client) -> (String, bool, String) {
    eventually("a leader named", WAIT, || {
        let mut client = client.clone();
        async move {
            let r = client.get_leader(pb::GetLeaderRequest {}).await.ok()?;
            let r = r.into_inner();
            (!r.leader.is_empty()).then_some((r.replica, r.leading, r.leader))
        }
    })
    .await
}

async fn fresh_database() -> String {
    tokio::task::spawn_blocking(|| PgCluster::shared().fresh_database("approval_replicas"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_share_one_store_and_the_next_leads_when_the_leader_goes() {
    let url = fresh_database().await;
    let runner = FakeRunner::start().await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let named = |dir, name: &str| {
        let mut cfg = pg_config(&url, &runner, dir);
        cfg.replica_name = Some(name.into());
        cfg
    };
    let a = Svc::start(named(&dir_a, "a")).await;
    wait_health(&a, SUBSCRIPTION_HEALTH, ServingStatus::Serving, "A to lead").await;
    let b = Svc::start(named(&dir_b, "b")).await;
    wait_health(&b, "", ServingStatus::Serving, "B to serve").await;
    assert_eq!(
        health_of(&b, SUBSCRIPTION_HEALTH).await,
        Some(ServingStatus::NotServing as i32),
        "B does not follow the runner while A leads"
    );
    let (client_a, mut client_b) = (a.client().await, b.client().await);
    // Each names A as the leader; only A says it leads.
    assert_eq!(
        leader_seen_by(&client_a).await,
        ("a".into(), true, "a".into())
    );
    assert_eq!(
        leader_seen_by(&client_b).await,
        ("b".into(), false, "a".into())
    );

    // A watcher on B sees what the leader stored.
    let mut watch = client_b
        .watch_approvals(pb::WatchApprovalsRequest { filter: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        watch.message().await.unwrap().unwrap().change,
        ChangeKind::SnapshotEnd as i32
    );
    // B listens for other replicas' changes on a connection it opens in the background:
    // warm-up requests until its watcher sees one.
    let deadline = tokio::time::Instant::now() + WAIT;
    for i in 0.. {
        assert!(
            tokio::time::Instant::now() < deadline,
            "B's watcher hears nothing"
        );
        runner.push_request(tool_request(&format!("warm-{i}"), "run-0", "ledger.append"));
        let heard = tokio::time::timeout(Duration::from_millis(300), watch.message()).await;
        if heard.is_ok() {
            break;
        }
    }
    // The next item about `id` (late warm-ups are passed over), within `WAIT`.
    let mut next = async |id: &str| {
        tokio::time::timeout(WAIT, async {
            loop {
                let item = watch.message().await.unwrap().unwrap();
                if item.approval.as_ref().is_some_and(|a| a.request_id == id) {
                    return item;
                }
            }
        })
        .await
        .expect("a watch item in time")
    };
    runner.push_request(tool_request("r1", "run-1", "ledger.append"));
    let created = next("r1").await;
    assert_eq!(created.change, ChangeKind::Created as i32);

    // A decision taken on B (which does not lead) reaches the runner once, through A.
    client_b
        .resolve(resolve_req("r1", DecisionKind::Approve))
        .await
        .unwrap();
    let calls = eventually("the decision at the runner", WAIT, || async {
        let calls = runner.resolves_for("r1");
        (!calls.is_empty()).then_some(calls)
    })
    .await;
    eventually("the delivery recorded", WAIT, || {
        let mut c = client_a.clone();
        async move {
            audit_actions(&mut c, "r1")
                .await
                .iter()
                .any(|e| e.action == AuditAction::Delivered as i32)
                .then_some(())
        }
    })
    .await;
    assert_eq!(runner.resolves_for("r1"), calls, "delivered once");
    let resolved = next("r1").await;
    assert_eq!(resolved.change, ChangeKind::Updated as i32);
    assert_eq!(
        resolved.approval.unwrap().state,
        ApprovalState::Resolved as i32
    );

    // The leader goes; B takes over the event stream.
    a.stop().await;
    wait_health(&b, SUBSCRIPTION_HEALTH, ServingStatus::Serving, "B to lead").await;
    assert_eq!(
        leader_seen_by(&client_b).await,
        ("b".into(), true, "b".into())
    );
    runner.push_request(tool_request("r2", "run-1", "ledger.append"));
    wait_for(
        &client_b,
        "r2",
        "r2 stored by B",
        state(ApprovalState::Pending),
    )
    .await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_and_answers_follow_the_database() {
    let cluster = tokio::task::spawn_blocking(PgCluster::start).await.unwrap();
    let url = cluster.fresh_database("approval_outage");
    let cluster = std::sync::Arc::new(cluster);
    let runner = FakeRunner::start().await;
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::start(pg_config(&url, &runner, &dir)).await;
    wait_health(&svc, SUBSCRIPTION_HEALTH, ServingStatus::Serving, "to lead").await;
    runner.push_request(tool_request("r1", "run-1", "ledger.append"));
    let mut client = svc.client().await;
    wait_for(&client, "r1", "r1 pending", state(ApprovalState::Pending)).await;

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop_immediate())
        .await
        .unwrap();
    wait_health(
        &svc,
        "",
        ServingStatus::NotServing,
        "NOT_SERVING without the database",
    )
    .await;
    let err = client
        .get_approval(pb::GetApprovalRequest {
            request_id: "r1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let err = client
        .resolve(resolve_req("r1", DecisionKind::Approve))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.start_again())
        .await
        .unwrap();
    wait_health(
        &svc,
        "",
        ServingStatus::Serving,
        "SERVING once the database is back",
    )
    .await;
    assert_eq!(
        get(&mut client, "r1").await.state,
        ApprovalState::Pending as i32
    );
    // The leadership went with the old session and is taken again: events are followed.
    runner.push_request(tool_request("r2", "run-1", "ledger.append"));
    wait_for(
        &client,
        "r2",
        "r2 stored after the outage",
        state(ApprovalState::Pending),
    )
    .await;
    client
        .resolve(resolve_req("r2", DecisionKind::Approve))
        .await
        .unwrap();
    eventually("the decision at the runner", WAIT, || async {
        (!runner.resolves_for("r2").is_empty()).then_some(())
    })
    .await;
    svc.stop().await;
}

/// The leader hands the decisions it takes to its delivery as it writes them: a person's
/// through `Resolve` and the policy's as the request is stored both reach the runner without
/// delivery reading them back from the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_delivers_the_decisions_it_takes_without_reading_them_back() {
    const EACH: usize = 5;
    let cluster = PgCluster::start_with(&["shared_preload_libraries=pg_stat_statements"]);
    let url = cluster.fresh_database("handed");
    cluster
        .psql(&url, "CREATE EXTENSION pg_stat_statements")
        .unwrap();
    let runner = FakeRunner::start().await;
    runner.with(|s| s.auto_consume = true);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = pg_config(&url, &runner, &dir);
    cfg.policy = arbor_approval_svc::policy::Policy::from_toml(
        r#"
        [[tool]]
        name = "read-only"
        tool = "search.*"
        action = "allow"
        "#,
    )
    .unwrap();
    let svc = Svc::start(cfg).await;
    wait_health(
        &svc,
        SUBSCRIPTION_HEALTH,
        ServingStatus::Serving,
        "it to lead",
    )
    .await;
    let mut client = svc.client().await;
    // Calls of delivery's reads: of the approvals named to it, and of the whole outbox.
    let delivery_reads = || -> u64 {
        let out = cluster
            .psql(
                &url,
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE dbid = \
                 (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND query LIKE '%FROM approval_records r LEFT JOIN approval_traces%' \
                 AND query LIKE '%awaiting_delivery%'",
            )
            .unwrap();
        out.trim().parse().unwrap()
    };
    cluster
        .psql(&url, "SELECT pg_stat_statements_reset()")
        .unwrap();

    for i in 0..EACH {
        runner.push_request(node_request(&format!("person-{i}"), &format!("run-p{i}")));
        runner.push_request(tool_request(
            &format!("policy-{i}"),
            &format!("run-a{i}"),
            "search.web",
        ));
    }
    for i in 0..EACH {
        let id = format!("person-{i}");
        wait_for(&client, &id, "pending", state(ApprovalState::Pending)).await;
        client
            .resolve(resolve_req(&id, DecisionKind::Approve))
            .await
            .unwrap();
    }
    for i in 0..EACH {
        for id in [format!("person-{i}"), format!("policy-{i}")] {
            wait_for(&client, &id, "pruned", state(ApprovalState::Pruned)).await;
            assert_eq!(runner.resolves_for(&id).len(), 1, "{id} delivered once");
        }
    }
    assert_eq!(
        delivery_reads(),
        0,
        "delivery read back decisions it was handed"
    );
    svc.stop().await;
}
