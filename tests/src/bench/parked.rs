//! Parked runs: N runs suspended at a gate at once. The runner's memory while they wait, how long
//! a restart (after SIGKILL) takes until health says SERVING, and how fast they drain when every
//! approval is decided in bulk.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};

use super::{
    cluster::{APPROVER, BenchCluster, READER, SUBMITTER},
    cycle::TREE,
    procstat,
};

#[derive(Debug, Clone)]
pub struct ParkedResult {
    pub runs: usize,
    pub park_elapsed: Duration,
    pub runner_rss_parked: u64,
    /// One scrape of the runner's `/metrics` while every run is parked.
    pub metrics_scrape: Duration,
    pub runner_rss_after_restart: u64,
    pub restart_to_serving: Duration,
    pub drain_elapsed: Duration,
    pub runner_bytes: u64,
}

impl ParkedResult {
    pub fn drain_per_s(&self) -> f64 {
        self.runs as f64 / self.drain_elapsed.as_secs_f64()
    }
}

async fn count_events(
    mut runner: super::cluster::Runner,
    kind: rpb::EventKind,
    counter: Arc<AtomicUsize>,
) {
    let Ok(stream) = runner
        .stream_events(rpb::StreamEventsRequest {
            follow: true,
            filter: Some(rpb::EventFilter {
                kinds: vec![kind as i32],
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
    else {
        return;
    };
    let mut stream = stream.into_inner();
    while let Ok(Some(_)) = stream.message().await {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

async fn wait_count(counter: &AtomicUsize, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(3600);
    while counter.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn run(runs: usize) -> ParkedResult {
    let mut cluster = BenchCluster::start(false, &[]).await;
    let mut runner = cluster.runner_as(SUBMITTER).await;
    runner
        .register_tree(rpb::RegisterTreeRequest {
            document: TREE.into(),
            format: 0,
        })
        .await
        .expect("register");
    let suspended = Arc::new(AtomicUsize::new(0));
    let follower = tokio::spawn(count_events(
        cluster.runner_as(READER).await,
        rpb::EventKind::ExecutionSuspended,
        suspended.clone(),
    ));

    let start = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut submitters = Vec::new();
    for _ in 0..64 {
        let (mut runner, next) = (runner.clone(), next.clone());
        submitters.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < runs {
                runner
                    .submit_run(rpb::SubmitRunRequest {
                        tree_id: "bench-cycle".into(),
                        ..Default::default()
                    })
                    .await
                    .expect("submit");
            }
        }));
    }
    for s in submitters {
        s.await.expect("submitter");
    }
    wait_count(&suspended, runs, "every run to suspend").await;
    let park_elapsed = start.elapsed();
    follower.abort();
    // Let the page cache settle to what parked runs need, then read memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let runner_rss_parked = procstat::rss(cluster.runners[0].pid().unwrap_or(0));
    let t = Instant::now();
    crate::scrape::scrape(&cluster.runners[0].metrics_url()).await;
    let metrics_scrape = t.elapsed();

    cluster.runners[0].kill().await;
    let t = Instant::now();
    cluster.runners[0].start().await;
    let restart_to_serving = t.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let runner_rss_after_restart = procstat::rss(cluster.runners[0].pid().unwrap_or(0));

    let succeeded = Arc::new(AtomicUsize::new(0));
    let follower = tokio::spawn(count_events(
        cluster.runner_as(READER).await,
        rpb::EventKind::RunSucceeded,
        succeeded.clone(),
    ));
    let mut approvals = cluster.approvals_as(APPROVER).await;
    // approval-svc reconnects to the restarted runner on its own; wait until it holds them all.
    let t = Instant::now();
    let mut decided = 0;
    while decided < runs {
        let resp = approvals
            .bulk_resolve(apb::BulkResolveRequest {
                filter: Some(apb::ApprovalFilter {
                    states: vec![apb::ApprovalState::Pending as i32],
                    ..Default::default()
                }),
                decision: rpb::DecisionKind::Approve as i32,
                reason: "bulk".into(),
                limit: 1000,
                ..Default::default()
            })
            .await
            .expect("bulk resolve")
            .into_inner();
        let ok = resp.items.iter().filter(|i| i.code == 0).count();
        decided += ok;
        if ok == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    wait_count(&succeeded, runs, "every parked run to finish").await;
    let drain_elapsed = t.elapsed();
    follower.abort();
    let result = ParkedResult {
        runs,
        park_elapsed,
        runner_rss_parked,
        metrics_scrape,
        runner_rss_after_restart,
        restart_to_serving,
        drain_elapsed,
        runner_bytes: procstat::dir_bytes(&cluster.runners[0].data_dir),
    };
    cluster.stop().await;
    result
}
