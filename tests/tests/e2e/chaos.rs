//! Crash suite: both release binaries with authentication on, a seeded workload of runs that
//! mix approval gates (approve and reject), tool approvals approved with edited arguments, user
//! input and external results, and SIGKILLs of runner-svc and approval-svc at random moments.
//! At the end every run must have its planned outcome, every decision must have been consumed
//! exactly once, every ledger side effect must exist exactly once, and a durable subscriber must
//! have seen the whole event log without a gap.
//!
//! CI runs the short variant; `ARBOR_CHAOS_LONG=1 cargo test -p arbor-tests --release --test
//! chaos -- --nocapture` runs the long one. `ARBOR_CHAOS_SEED=<seed>` replays a seed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use arbor_tests::{
    Cluster, Profile,
    chaos::{self, DriveConfig, Plan, Workload},
};

struct Scale {
    runs: usize,
    kills: u32,
    concurrency: usize,
    budget: Duration,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkills_of_both_services_lose_nothing_and_repeat_nothing() {
    let scale = if chaos::long() {
        Scale {
            runs: 5000,
            kills: 500,
            concurrency: 32,
            budget: Duration::from_secs(45 * 60),
        }
    } else {
        Scale {
            runs: 200,
            kills: 24,
            concurrency: 16,
            budget: Duration::from_secs(4 * 60),
        }
    };
    let seed = chaos::seed();
    println!(
        "chaos: seed {seed} (replay: ARBOR_CHAOS_SEED={seed}), {} runs, at least {} kills",
        scale.runs, scale.kills
    );
    let (mut cluster, tokens) = Cluster::start_secure(Profile::Debug).await;
    let workload = Workload::start(
        &cluster,
        &tokens,
        Plan::generate(seed, scale.runs, "chaos"),
        DriveConfig {
            concurrency: scale.concurrency,
            pace: scale.kills,
            poll: Duration::from_millis(50),
        },
    )
    .await;

    let mut rng = fastrand::Rng::with_seed(seed.rotate_left(17));
    let (mut runner_kills, mut approval_kills) = (0u32, 0u32);
    let deadline = Instant::now() + scale.budget;
    while !workload.shared.all_finished() || runner_kills + approval_kills < scale.kills {
        if Instant::now() > deadline {
            println!("chaos: out of time; checking what there is");
            break;
        }
        // Chaos timing: the next kill lands at a random moment of the workload.
        tokio::time::sleep(Duration::from_millis(rng.u64(150..900))).await;
        let target = rng.u8(0..10);
        let (runner, approval) = (target < 5 || target == 9, target >= 5);
        if runner {
            cluster.runner.kill().await;
            runner_kills += 1;
        }
        if approval {
            cluster.approval.kill().await;
            approval_kills += 1;
        }
        workload.disrupted();
        // Down for a random while, then back on the same data.
        tokio::time::sleep(Duration::from_millis(rng.u64(0..300))).await;
        if runner {
            cluster.runner.start().await;
        }
        if approval {
            cluster.approval.start().await;
        }
        println!(
            "chaos: kill #{} ({}) {}",
            runner_kills + approval_kills,
            match (runner, approval) {
                (true, true) => "both",
                (true, false) => "runner-svc",
                _ => "approval-svc",
            },
            workload.progress()
        );
    }
    workload.settle(Duration::from_secs(90)).await;
    let mut report = workload.finish(&mut cluster).await;
    report.fact(format!(
        "seed {seed}: SIGKILLs {} (runner-svc {runner_kills}, approval-svc {approval_kills})",
        runner_kills + approval_kills
    ));
    report.print("chaos");
    assert!(
        runner_kills + approval_kills >= scale.kills,
        "only {} kills",
        runner_kills + approval_kills
    );
    report.assert_ok();
}
