//! Crash suite for task workers: a seeded workload of runs whose tools are all served by Python
//! task worker processes (effects that take a while, upper-casing, a tool that fails retryably
//! once, business errors caught by a selector and uncaught), while the workers are SIGKILLed
//! (and restarted) every few hundred milliseconds and runner-svc every few seconds. At the end
//! every run must have its planned outcome and blackboard, every task's result must have been
//! taken exactly once (one completion, one consumption, from its last attempt), every side
//! effect must be in the shared effects file exactly once, no task may be left queued or leased,
//! and the event log must be gap-free, as a durable subscriber saw it across the restarts.
//!
//! `ARBOR_CHAOS_SEED=<seed>` replays a seed; `ARBOR_CHAOS_LONG=1` runs the long variant.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use arbor_shared::proto::runner::v1::{
    self as rpb, TaskState, worker_service_client::WorkerServiceClient,
};
use arbor_tests::{
    Cluster, Profile,
    chaos::{
        self, Recorder, Report, verify,
        workers::{self, Evidence, Feed, WorkPlan, WorkerPool},
    },
    clients::{RunnerClient, lazy_channel, runner_as},
    tools::python_client,
};
use tonic::transport::Channel;

struct Scale {
    runs: usize,
    kills: u32,
    runner_kills: u32,
    budget: Duration,
}

const WORKERS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkills_of_workers_and_runner_take_each_result_once_and_apply_each_effect_once() {
    let scale = if chaos::long() {
        Scale {
            runs: 400,
            kills: 200,
            runner_kills: 20,
            budget: Duration::from_secs(20 * 60),
        }
    } else {
        Scale {
            runs: 48,
            kills: 24,
            runner_kills: 3,
            budget: Duration::from_secs(100),
        }
    };
    let seed = chaos::seed();
    println!(
        "chaos-workers: seed {seed} (replay: ARBOR_CHAOS_SEED={seed}), {} runs, {WORKERS} \
         workers, at least {} kills ({} of runner-svc)",
        scale.runs, scale.kills, scale.runner_kills
    );
    let python = python_client();
    let mut cluster = Cluster::start(Profile::Debug).await;
    let url = cluster.runner.url();
    let mut runner = runner_as(&url, None);
    workers::register_tree(&mut runner).await;
    let recorder = Recorder::start(runner_as(&url, None), "chaos-workers-auditor");
    let mut pool = WorkerPool::start(
        &python,
        &cluster.runner.addr.to_string(),
        cluster.dir.path(),
        WORKERS,
    );
    let plans = WorkPlan::generate(seed, scale.runs, "cw");
    let (feed, actors) = Feed::start(plans.clone(), scale.kills, runner.clone());

    // Chaos, drawn from the seed (so a replay kills the same things in the same order): a kill
    // every 300-800 ms, of runner-svc after every 3-6 worker kills (every few seconds).
    let mut rng = fastrand::Rng::with_seed(seed.rotate_left(17));
    let started = Instant::now();
    let deadline = started + scale.budget;
    let (mut worker_kills, mut runner_kills) = (0u32, 0u32);
    let mut workers_before_runner = rng.u32(3..7);
    while !feed.all_finished()
        || worker_kills + runner_kills < scale.kills
        || runner_kills < scale.runner_kills
    {
        if Instant::now() > deadline {
            println!("chaos-workers: out of time; checking what there is");
            break;
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(300..800))).await;
        let what = if workers_before_runner == 0 {
            cluster.runner.kill().await;
            runner_kills += 1;
            feed.disrupted();
            // Down for a random while, then back on the same data.
            tokio::time::sleep(Duration::from_millis(rng.u64(0..400))).await;
            cluster.runner.start().await;
            workers_before_runner = rng.u32(3..7);
            "runner-svc".to_string()
        } else {
            let killed = pool.kill_and_restart(rng.usize(0..pool.len())).await;
            worker_kills += 1;
            workers_before_runner -= 1;
            feed.disrupted();
            format!("worker {killed}")
        };
        println!(
            "chaos-workers: kill #{} ({what}) {:>5.1}s submitted {}/{} finished {}",
            worker_kills + runner_kills,
            started.elapsed().as_secs_f64(),
            feed.submitted(),
            plans.len(),
            feed.finished()
        );
    }

    let mut tasks_client = WorkerServiceClient::new(lazy_channel(&url));
    settle(&feed, &mut tasks_client, &mut runner, &recorder).await;
    feed.stop();
    for actor in actors {
        let _ = actor.await;
    }
    let mut report = Report::default();
    report.fact(format!(
        "seed {seed}: SIGKILLs {} (workers {worker_kills}, runner-svc {runner_kills}); worker \
         processes started {}; workload time {:.1}s; submit retries {}",
        worker_kills + runner_kills,
        pool.started.len(),
        started.elapsed().as_secs_f64(),
        feed.submit_retries()
    ));
    for p in feed.problems() {
        report.problem(format!("client: {p}"));
    }
    for p in pool.stop().await {
        report.problem(format!("clean shutdown: {p}"));
    }
    let said = pool.transcript().await;
    let runs = workers::final_runs(&mut runner, &plans).await;
    let log = verify::full_log(&mut runner)
        .await
        .expect("read the event log");
    let tasks = workers::all_tasks(&mut tasks_client)
        .await
        .expect("ListTasks");
    let (recorded, recorder_problems) = recorder.finish().await;
    let approval_exit = cluster.approval.stop().await;
    let runner_exit = cluster.runner.stop().await;
    if approval_exit != Some(0) || runner_exit != Some(0) {
        report.problem(format!(
            "clean shutdown: approval-svc exited {approval_exit:?}, runner-svc {runner_exit:?}"
        ));
    }
    let effects = std::fs::read_to_string(&pool.effects).unwrap_or_default();

    workers::check(
        &Evidence {
            plans: &plans,
            runs: &runs,
            log: &log,
            tasks: &tasks,
            effects: &effects,
            said: &said,
        },
        &mut report,
    );
    workers::check_subscriber(&log, &recorded, &recorder_problems, &mut report);
    report.print("chaos-workers");
    if !report.problems.is_empty() {
        println!(
            "{}\n--- runner-svc\n{}",
            pool.logs_tail(),
            cluster.runner.log_tail()
        );
    }
    assert!(
        worker_kills + runner_kills >= scale.kills && runner_kills >= scale.runner_kills,
        "only {worker_kills} worker and {runner_kills} runner-svc kills"
    );
    report.assert_ok();
}

/// Waits (at most a minute) until every run has finished, no task is queued or leased and the
/// durable subscriber has the whole log. Gives up quietly: the checks then say what is missing.
async fn settle(
    feed: &Feed,
    tasks: &mut WorkerServiceClient<Channel>,
    runner: &mut RunnerClient,
    recorder: &Recorder,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let live = tasks
            .list_tasks(rpb::ListTasksRequest {
                states: vec![TaskState::Queued as i32, TaskState::Leased as i32],
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().tasks.len());
        let last = verify::full_log(runner)
            .await
            .map(|log| log.last().map_or(0, |e| e.seq));
        if let (Ok(0), Ok(last)) = (live, last)
            && recorder.contiguous() >= last
            && feed.all_finished()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
