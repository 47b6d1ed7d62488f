//! A database that stops answering (a stalled connection: nothing refused, nothing closed) while
//! clients read through both services: the reads wait for it, and nothing else does. Health
//! checks are answered at once, and the reads finish once the database answers again. A read
//! that waited on a runtime thread would stop the whole service once there are as many reads
//! as threads: health checks, streams and every other RPC with it. And a database server that
//! restarts (immediate mode, as a crash): once the replicas say SERVING again, the first write
//! on each of them answers OK, none of them handing it a connection the old server closed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_testkit::PgCluster;
use arbor_tests::{
    Profile, WAIT,
    clients::{approvals_as, runner_as},
    flow::decide,
    gate_tree,
    process::{Replicas, Service},
    proxy::Proxy,
    secured::{register, submit, wait_approval},
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// How long a health check may take while reads wait for the database.
const ANSWER_WITHIN: Duration = Duration::from_secs(3);

async fn health(service: &Service) -> HealthClient<tonic::transport::Channel> {
    HealthClient::new(service.channel().await)
}

/// The overall health status, or `None` when no answer came within [`ANSWER_WITHIN`].
async fn check(client: &mut HealthClient<tonic::transport::Channel>) -> Option<i32> {
    let asked = client.check(HealthCheckRequest {
        service: String::new(),
    });
    match tokio::time::timeout(ANSWER_WITHIN, asked).await {
        Ok(answer) => Some(answer.expect("a health answer").into_inner().status),
        Err(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_waiting_for_a_stalled_database_leave_the_services_answering() {
    let url = tokio::task::spawn_blocking(|| PgCluster::shared().fresh_database("db_stall"))
        .await
        .unwrap();
    let proxy = Proxy::start(PgCluster::shared().addr()).await;
    let through_proxy = PgCluster::shared().through(&url, proxy.addr());
    assert_ne!(through_proxy, url, "the URL names the cluster's address");
    let mut replicas = Replicas::prepare(
        Profile::Debug,
        &through_proxy,
        (1, 1),
        Vec::new(),
        Vec::new(),
    );
    replicas.start_all().await;
    let runner_url = replicas.runner_urls()[0].clone();
    let approval_url = replicas.approval_urls()[0].clone();
    let (runner, approvals) = (
        runner_as(&runner_url, None),
        approvals_as(&approval_url, None),
    );
    // Answered while the database answers.
    runner
        .clone()
        .list_runs(rpb::ListRunsRequest::default())
        .await
        .unwrap();
    let err = approvals
        .clone()
        .get_approval(apb::GetApprovalRequest {
            request_id: "nobody".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    let mut runner_health = health(&replicas.runners[0]).await;
    let mut approval_health = health(&replicas.approvals[0]).await;
    assert_eq!(
        check(&mut runner_health).await,
        Some(ServingStatus::Serving as i32)
    );
    assert_eq!(
        check(&mut approval_health).await,
        Some(ServingStatus::Serving as i32)
    );

    proxy.stall();
    // More reads than either service has runtime threads (one per core), each waiting for the
    // database.
    let reads = 2 * std::thread::available_parallelism().map_or(2, |n| n.get()) + 2;
    let mut waiting = Vec::new();
    for _ in 0..reads {
        let mut runner = runner.clone();
        waiting.push(tokio::spawn(async move {
            runner
                .list_runs(rpb::ListRunsRequest::default())
                .await
                .map(|_| ())
        }));
        let mut approvals = approvals.clone();
        waiting.push(tokio::spawn(async move {
            approvals
                .get_approval(apb::GetApprovalRequest {
                    request_id: "nobody".into(),
                })
                .await
                .map(|_| ())
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "the reads wait for the stalled database"
    );
    assert!(
        check(&mut runner_health).await.is_some(),
        "runner-svc answers no health check while {reads} reads wait for the database"
    );
    assert!(
        check(&mut approval_health).await.is_some(),
        "approval-svc answers no health check while {reads} reads wait for the database"
    );

    proxy.restore();
    for read in waiting {
        let outcome = tokio::time::timeout(WAIT, read)
            .await
            .expect("a read finishes once the database answers again")
            .unwrap();
        // Answered or refused as unavailable (a connection the pool gave up on meanwhile).
        if let Err(status) = outcome {
            assert!(
                matches!(
                    status.code(),
                    tonic::Code::NotFound | tonic::Code::Unavailable
                ),
                "{status:?}"
            );
        }
    }
    // SERVING again, as the harness waits for at start-up.
    replicas.runners[0].wait_serving(WAIT).await;
    replicas.approvals[0].wait_serving(WAIT).await;
    replicas.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_write_on_every_replica_after_a_database_restart_succeeds() {
    let pg = PgCluster::start();
    let mut replicas = Replicas::prepare(Profile::Debug, &pg.url(), (2, 2), vec![], vec![]);
    replicas.start_all().await;
    let runners: Vec<_> = replicas
        .runner_urls()
        .iter()
        .map(|u| runner_as(u, None))
        .collect();
    let approvals: Vec<_> = (replicas.approval_urls().iter())
        .map(|u| approvals_as(u, None))
        .collect();
    // One approval for each approval replica to decide after the restart.
    register(&mut runners[0].clone(), gate_tree("restart", "failure")).await;
    let mut pending = Vec::new();
    for (i, runner) in runners.iter().enumerate() {
        let run_id = format!("restart-{i}");
        submit(&mut runner.clone(), "restart", &run_id).await;
        pending.push(wait_approval(&approvals[i], &run_id, apb::ApprovalState::Pending).await);
    }

    tokio::task::block_in_place(|| pg.restart_immediate());
    for s in replicas
        .runners
        .iter_mut()
        .chain(replicas.approvals.iter_mut())
    {
        s.wait_serving(WAIT).await;
    }
    // Each replica's first write, once: neither helper retries.
    for (i, runner) in runners.iter().enumerate() {
        register(
            &mut runner.clone(),
            gate_tree(&format!("after-restart-{i}"), "failure"),
        )
        .await;
    }
    for (approval, a) in pending.iter().zip(&approvals) {
        decide(
            &mut a.clone(),
            &approval.request_id,
            rpb::DecisionKind::Approve,
            None,
        )
        .await;
    }
    assert!(replicas.stop_all().await.is_empty());
}
