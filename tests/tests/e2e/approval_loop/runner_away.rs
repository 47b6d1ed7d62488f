//! A runner that is away costs approval-svc little: with 10,000 decisions waiting to be
//! delivered and runner-svc stopped, approval-svc uses under a tenth of a core and logs under
//! 100 lines in a minute, probing the runner instead of sweeping its backlog. Once the runner is
//! back every decision is delivered: each run resumes once and its gated tool runs once.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use arbor_shared::{
    procstat::cpu_seconds,
    proto::{approval::v1 as apb, runner::v1 as rpb},
};
use arbor_tests::{
    Cluster, Profile, WAIT,
    chaos::verify::{full_log, read_ledger},
    clients::{approvals_as, runner_as},
    eventually, gate_tree,
    scrape::scrape,
    secured::submit,
};

const RUNS: usize = 10_000;
/// Runs submitted at once.
const SUBMITTERS: usize = 32;
/// How long approval-svc's CPU and log are watched while the runner is away.
const WINDOW: Duration = Duration::from_secs(60);
/// Deadline for piling up (and later draining) the runs: thousands of runs through debug
/// builds on a shared machine.
const BULK_WAIT: Duration = Duration::from_secs(900);

/// The value of the unlabelled sample `name` on approval-svc's `/metrics`.
async fn metric(cluster: &Cluster, name: &str) -> f64 {
    scrape(&cluster.approval.metrics_url())
        .await
        .value(name, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_away_costs_approval_svc_little_and_gets_every_decision_once_back() {
    let mut cluster = Cluster::start(Profile::Debug).await;
    let mut runner = runner_as(&cluster.runner.url(), None);
    runner
        .register_tree(rpb::RegisterTreeRequest {
            document: gate_tree("away", "failure"),
            format: 0,
        })
        .await
        .unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let submitters: Vec<_> = (0..SUBMITTERS)
        .map(|_| {
            let (mut runner, next) = (runner.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= RUNS {
                        return;
                    }
                    submit(&mut runner, "away", &format!("away-{i}")).await;
                }
            })
        })
        .collect();
    for s in submitters {
        s.await.unwrap();
    }
    eventually("every approval to be pending", BULK_WAIT, || async {
        (metric(&cluster, "arbor_approval_pending").await == RUNS as f64).then_some(())
    })
    .await;

    // The runner goes; every approval is decided while it is away.
    assert_eq!(cluster.runner.stop().await, Some(0));
    let approvals = approvals_as(&cluster.approval.url(), None);
    let mut decided = 0;
    while decided < RUNS {
        let resp = approvals
            .clone()
            .bulk_resolve(apb::BulkResolveRequest {
                filter: Some(apb::ApprovalFilter {
                    states: vec![apb::ApprovalState::Pending as i32],
                    ..Default::default()
                }),
                decision: rpb::DecisionKind::Approve as i32,
                reason: "while the runner is away".into(),
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(
            !resp.items.is_empty(),
            "{decided} decided, none left pending"
        );
        decided += resp.items.iter().filter(|i| i.code == 0).count();
    }
    eventually("delivery to pause", WAIT, || async {
        (metric(&cluster, "arbor_approval_delivery_paused").await == 1.0).then_some(())
    })
    .await;

    // The minute watched: approval-svc holds every decision and only probes the runner.
    let pid = cluster.approval.pid().unwrap();
    let retries = metric(&cluster, "arbor_approval_delivery_retries_total").await;
    let (cpu, logged) = (
        cpu_seconds(pid),
        cluster.approval.log_since_start().lines().count(),
    );
    // Not a wait for something to happen: the window over which the cost is measured.
    tokio::time::sleep(WINDOW).await;
    let cpu_share = (cpu_seconds(pid) - cpu) / WINDOW.as_secs_f64();
    let lines: Vec<String> = cluster
        .approval
        .log_since_start()
        .lines()
        .skip(logged)
        .map(str::to_string)
        .collect();
    let probes = metric(&cluster, "arbor_approval_delivery_retries_total").await - retries;
    eprintln!(
        "runner away for {WINDOW:?} with {RUNS} decisions pending: approval-svc used {:.2} % of \
         a core, logged {} lines, made {probes} delivery attempts",
        cpu_share * 100.0,
        lines.len()
    );
    assert!(
        cpu_share < 0.10,
        "approval-svc used {:.1} % of a core while the runner was away",
        cpu_share * 100.0
    );
    assert!(
        lines.len() < 100,
        "{} lines logged in a minute while the runner was away:\n{}",
        lines.len(),
        lines[..lines.len().min(20)].join("\n")
    );
    assert!(
        (1.0..=20.0).contains(&probes),
        "{probes} delivery attempts in a minute: probing, not sweeping the backlog"
    );
    assert!(metric(&cluster, "arbor_approval_delivery_backlog").await >= 1.0);

    // The runner comes back: every decision is delivered and every run resumes, once.
    cluster.runner.start().await;
    let succeeded = cluster.runner.metrics_url();
    eventually("every run to succeed", BULK_WAIT, || async {
        let runs = scrape(&succeeded).await;
        (runs.value("arbor_runner_runs", &[("status", "succeeded")]) == RUNS as f64).then_some(())
    })
    .await;
    let mut runner = runner_as(&cluster.runner.url(), None);
    let log = full_log(&mut runner).await.unwrap();
    for kind in [
        rpb::EventKind::ApprovalResolved,
        rpb::EventKind::ExecutionResumed,
        rpb::EventKind::ApprovalConsumed,
    ] {
        let mut per_run: BTreeMap<&str, usize> = BTreeMap::new();
        for e in log.iter().filter(|e| e.kind == kind as i32) {
            *per_run.entry(&e.run_id).or_default() += 1;
        }
        assert_eq!(per_run.len(), RUNS, "{kind:?} of every run");
        assert!(per_run.values().all(|n| *n == 1), "{kind:?} once per run");
    }
    eventually("approval-svc to empty its backlog", WAIT, || async {
        (metric(&cluster, "arbor_approval_delivery_backlog").await == 0.0).then_some(())
    })
    .await;
    assert_eq!(
        metric(&cluster, "arbor_approval_delivery_paused").await,
        0.0
    );

    assert_eq!(cluster.approval.stop().await, Some(0));
    assert_eq!(cluster.runner.stop().await, Some(0));
    let ledger = read_ledger(&cluster.runner.data_dir).await;
    assert_eq!(ledger.len(), RUNS, "one ship per run");
}
