//! Soak: steady traffic through both release binaries (authentication on, retention on in both)
//! for `ARBOR_SOAK_MINUTES` (10 by default). Every 30 s it prints both services' RSS and the sizes
//! of their sled directories; at the end the second half of the run must not have grown them much
//! (they level off), work must have kept flowing, and both services must stop cleanly.
//!
//! `cargo test -p arbor-tests --release --test e2e soak:: -- --ignored --nocapture`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use arbor_tests::{
    Cluster, Profile,
    auth::Tokens,
    chaos::{self, DriveConfig, Plan, Workload},
    process::dir_size,
};

/// Retention short enough that a 10-minute soak reaches its steady state: acked events go after
/// 30 s, finished runs and final jobs after 60 s, compaction every 5 s.
const RETENTION: [&str; 6] = [
    "--event-retention-acked-ms",
    "30000",
    "--finished-retention-ms",
    "60000",
    "--compact-interval-ms",
    "5000",
];

/// Final approvals (pruned or cancelled) go after 60 s, compaction every 5 s.
const APPROVAL_RETENTION: [&str; 4] = [
    "--approval-retention-ms",
    "60000",
    "--compact-interval-ms",
    "5000",
];

/// How much the second half may add: sled grows in segments and reclaims them lazily, so a
/// steady state still moves; growth with the work done would double the figures.
const LEVEL_OFF: f64 = 1.35;

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    finished: usize,
    runner_rss_kib: u64,
    approval_rss_kib: u64,
    runner_dir: u64,
    approval_dir: u64,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "soak: minutes of traffic; cargo test -p arbor-tests --release --test e2e soak:: -- --ignored --nocapture"]
async fn steady_traffic_levels_off() {
    let minutes: u64 = std::env::var("ARBOR_SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(10);
    let seed = chaos::seed();
    let mut cluster = Cluster::prepare(
        Profile::Release,
        RETENTION.iter().map(|s| s.to_string()).collect(),
        APPROVAL_RETENTION.iter().map(|s| s.to_string()).collect(),
    );
    let tokens = Tokens::write(cluster.dir.path());
    cluster.runner.extra_args.extend(tokens.runner_args());
    cluster.approval.extra_args.extend(tokens.approval_args());
    let runner_url = cluster.runner.url();
    cluster.start_routed(&runner_url).await;
    println!("soak: seed {seed}, {minutes} minutes");

    let workload = Workload::start(
        &cluster,
        &tokens,
        Plan::generate(seed, 1_000_000, "soak"),
        DriveConfig {
            concurrency: 16,
            pace: 0,
            poll: Duration::from_millis(50),
        },
    )
    .await;
    let started = Instant::now();
    let sample = |cluster: &Cluster, workload: &Workload| Sample {
        at: started.elapsed(),
        finished: workload.shared.finished(),
        runner_rss_kib: cluster.runner.rss_kib().unwrap_or(0),
        approval_rss_kib: cluster.approval.rss_kib().unwrap_or(0),
        runner_dir: dir_size(&cluster.runner.data_dir),
        approval_dir: dir_size(&cluster.approval.data_dir),
    };
    println!("   time   runs done   runner RSS  approval RSS   runner dir  approval dir");
    let mut samples = Vec::new();
    let total = Duration::from_secs(minutes * 60);
    while started.elapsed() < total {
        tokio::time::sleep(Duration::from_secs(30).min(total)).await;
        let s = sample(&cluster, &workload);
        println!(
            "{:>6.0}s {:>11} {:>9.1} MiB {:>9.1} MiB {:>8.1} MiB {:>9.1} MiB",
            s.at.as_secs_f64(),
            s.finished,
            s.runner_rss_kib as f64 / 1024.0,
            s.approval_rss_kib as f64 / 1024.0,
            mib(s.runner_dir),
            mib(s.approval_dir),
        );
        samples.push(s);
    }
    let problems = workload.stop().await;
    // What retention did: both services log every compaction pass that removed something.
    for (name, log) in [
        ("runner", &cluster.runner.log),
        ("approval-svc", &cluster.approval.log),
    ] {
        let log = std::fs::read_to_string(log).unwrap_or_default();
        let passes: Vec<&str> = log.lines().filter(|l| l.contains("compacted")).collect();
        println!(
            "soak: {name}: {} retention passes removed something; last: {}",
            passes.len(),
            passes.last().copied().unwrap_or("none")
        );
    }
    let approval_exit = cluster.approval.stop().await;
    let runner_exit = cluster.runner.stop().await;

    assert!(samples.len() >= 4, "too short to judge: {samples:?}");
    assert!(
        problems.is_empty(),
        "client/subscriber problems: {problems:?}"
    );
    assert_eq!(
        (approval_exit, runner_exit),
        (Some(0), Some(0)),
        "clean stops"
    );
    for w in samples.windows(2) {
        assert!(w[1].finished > w[0].finished, "work stalled: {w:?}");
    }
    let mid = samples[samples.len() / 2];
    let end = samples[samples.len() - 1];
    let growth = |name: &str, a: u64, b: u64| {
        let ratio = b as f64 / a.max(1) as f64;
        println!("soak: {name} grew x{ratio:.2} over the second half");
        (name.to_string(), ratio)
    };
    let growths = [
        growth("runner RSS", mid.runner_rss_kib, end.runner_rss_kib),
        growth("approval RSS", mid.approval_rss_kib, end.approval_rss_kib),
        growth("runner sled dir", mid.runner_dir, end.runner_dir),
        growth("approval sled dir", mid.approval_dir, end.approval_dir),
    ];
    println!(
        "soak: {} runs in {:.0}s ({:.1} runs/s); work x{:.2} over the second half",
        end.finished,
        end.at.as_secs_f64(),
        end.finished as f64 / end.at.as_secs_f64(),
        end.finished as f64 / mid.finished.max(1) as f64
    );
    let unlevelled: Vec<_> = growths.iter().filter(|(_, r)| *r > LEVEL_OFF).collect();
    assert!(unlevelled.is_empty(), "still growing: {unlevelled:?}");
}
