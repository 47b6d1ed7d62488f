//! Crash suite on PostgreSQL: two runner-svc and two approval-svc replicas (release binaries,
//! authentication on) on one private PostgreSQL cluster, the seeded workload of the sled crash
//! suite spread over every replica (its approvers and answerers race each other with the same
//! decisions through different replicas), SIGKILLs of random replicas of both services at
//! random moments (each one restarted after a random while), and once, halfway, an immediate
//! (crash) restart of PostgreSQL itself. The checks are the sled suite's: every run ends as
//! planned, every decision is consumed exactly once, every ledger side effect exists exactly
//! once, and a durable subscriber (moving between the runner replicas) saw the whole event log
//! without a gap; both runner replicas must also read the same log.
//!
//! CI runs the short variant; `ARBOR_CHAOS_LONG=1 cargo test -p arbor-tests --release --test
//! chaos_postgres -- --nocapture` runs the long one. `ARBOR_CHAOS_SEED=<seed>` replays a seed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use arbor_testkit::PgCluster;
use arbor_tests::{
    Profile,
    auth::Tokens,
    chaos::{self, DriveConfig, Plan, Workload},
    process::Replicas,
};

struct Scale {
    runs: usize,
    kills: u32,
    concurrency: usize,
    budget: Duration,
}

/// Short leases: a killed runner replica's claims go to the other one soon.
const LEASE_MS: &str = "2000";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkills_of_replicas_and_a_database_crash_lose_nothing_and_repeat_nothing() {
    let scale = if chaos::long() {
        Scale {
            runs: 3000,
            kills: 300,
            concurrency: 32,
            budget: Duration::from_secs(45 * 60),
        }
    } else {
        Scale {
            runs: 120,
            kills: 24,
            concurrency: 16,
            budget: Duration::from_secs(4 * 60),
        }
    };
    let seed = chaos::seed();
    println!(
        "chaos on PostgreSQL: seed {seed} (replay: ARBOR_CHAOS_SEED={seed}), {} runs, at least {} \
         kills, 2 runner + 2 approval replicas",
        scale.runs, scale.kills
    );
    let pg = PgCluster::start();
    let tokens_dir = tempfile::tempdir().unwrap();
    let tokens = Tokens::write(tokens_dir.path());
    let mut runner_args = tokens.runner_args();
    runner_args.extend(["--lease-ms".to_string(), LEASE_MS.to_string()]);
    let mut replicas = Replicas::prepare(
        Profile::Debug,
        &pg.url(),
        (2, 2),
        runner_args,
        tokens.approval_args(),
    );
    replicas.start_all().await;
    let workload = Workload::start_spread(
        &replicas.runner_urls(),
        &replicas.approval_urls(),
        &tokens,
        Plan::generate(seed, scale.runs, "pgchaos"),
        DriveConfig {
            concurrency: scale.concurrency,
            pace: scale.kills,
            poll: Duration::from_millis(50),
        },
    )
    .await;

    let mut rng = fastrand::Rng::with_seed(seed.rotate_left(17));
    let (mut runner_kills, mut approval_kills, mut leader_kills) = (0u32, 0u32, 0u32);
    let mut database_restarts = 0u32;
    let deadline = Instant::now() + scale.budget;
    while !workload.shared.all_finished() || runner_kills + approval_kills < scale.kills {
        if Instant::now() > deadline {
            println!("chaos: out of time; checking what there is");
            break;
        }
        // Chaos timing: the next kill lands at a random moment of the workload.
        tokio::time::sleep(Duration::from_millis(rng.u64(150..900))).await;
        let kills = runner_kills + approval_kills;
        if database_restarts == 0 && kills >= scale.kills / 2 {
            tokio::task::block_in_place(|| pg.restart_immediate());
            database_restarts += 1;
            workload.disrupted();
            println!(
                "chaos: PostgreSQL restarted (immediate) {}",
                workload.progress()
            );
            continue;
        }
        // One replica, sometimes one of each service at once.
        let target = rng.u8(0..10);
        let runner = (target < 5 || target == 9).then(|| rng.usize(0..2));
        let approval = (target >= 5).then(|| rng.usize(0..2));
        let leader = replicas.leader();
        if let Some(i) = runner {
            replicas.runners[i].kill().await;
            runner_kills += 1;
        }
        if let Some(i) = approval {
            if leader == Some(i) {
                leader_kills += 1;
            }
            replicas.approvals[i].kill().await;
            approval_kills += 1;
        }
        workload.disrupted();
        // Down for a random while, then back on the same database.
        tokio::time::sleep(Duration::from_millis(rng.u64(0..300))).await;
        if let Some(i) = runner {
            replicas.runners[i].start().await;
        }
        if let Some(i) = approval {
            replicas.approvals[i].start().await;
        }
        println!(
            "chaos: kill #{} ({}) {}",
            runner_kills + approval_kills,
            match (runner, approval) {
                (Some(r), Some(a)) => format!("runner-{r} + approval-{a}"),
                (Some(r), None) => format!("runner-{r}"),
                (None, Some(a)) if leader == Some(a) => format!("approval-{a}, the leader"),
                (None, Some(a)) => format!("approval-{a}"),
                (None, None) => unreachable!("every draw kills something"),
            },
            workload.progress()
        );
    }
    workload.settle(Duration::from_secs(90)).await;
    let mut report = workload.finish_replicas(&mut replicas).await;
    report.fact(format!(
        "seed {seed}: SIGKILLs {} (runner-svc {runner_kills}, approval-svc {approval_kills} of \
         which {leader_kills} of the leader), PostgreSQL crash restarts {database_restarts}",
        runner_kills + approval_kills
    ));
    report.print("chaos on PostgreSQL");
    assert!(
        runner_kills + approval_kills >= scale.kills,
        "only {} kills",
        runner_kills + approval_kills
    );
    assert_eq!(database_restarts, 1, "PostgreSQL was restarted once");
    report.assert_ok();
}
