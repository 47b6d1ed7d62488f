//! Partition suite: a TCP proxy between approval-svc and runner-svc (approval-svc's `--runner`
//! points at it) cuts every connection, stalls them without closing, refuses new ones and
//! restores, at random moments while a seeded workload runs. approval-svc's event stream must
//! resume from its durable cursor and nothing may be lost or applied twice: the checks are the
//! chaos suite's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::{
    Cluster, Profile, WAIT,
    auth::Tokens,
    chaos::{self, DriveConfig, Plan, Workload},
    clients::{approvals_as, runner_as},
    eventually, gate_tree,
    proxy::Proxy,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cuts_and_stalls_between_the_services_lose_nothing_and_repeat_nothing() {
    let long = chaos::long();
    let (runs, disruptions) = if long { (600, 120) } else { (60, 16) };
    let seed = chaos::seed();
    println!("partition: seed {seed} (replay: ARBOR_CHAOS_SEED={seed}), {runs} runs");

    let mut cluster = Cluster::prepare(Profile::Debug, Vec::new(), Vec::new());
    let tokens = Tokens::write(cluster.dir.path());
    cluster.runner.extra_args.extend(tokens.runner_args());
    cluster.approval.extra_args.extend(tokens.approval_args());
    let proxy = Proxy::start(cluster.runner.addr).await;
    cluster.start_routed(&proxy.url()).await;

    let workload = Workload::start(
        &cluster,
        &tokens,
        Plan::generate(seed, runs, "partition"),
        DriveConfig {
            concurrency: 12,
            pace: disruptions,
            poll: Duration::from_millis(50),
        },
    )
    .await;
    let mut rng = fastrand::Rng::with_seed(seed.rotate_left(29));
    let mut done = 0u32;
    let mut tally = [0u32; 4];
    let deadline = Instant::now() + Duration::from_secs(if long { 1800 } else { 180 });
    while !workload.shared.all_finished() || done < disruptions {
        if Instant::now() > deadline {
            println!("partition: out of time; checking what there is");
            break;
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(100..600))).await;
        let outage = Duration::from_millis(rng.u64(100..1500));
        let what = rng.u8(0..4);
        tally[what as usize] += 1;
        let name = match what {
            0 => {
                proxy.cut();
                "cut"
            }
            1 => {
                proxy.stall();
                tokio::time::sleep(outage).await;
                proxy.restore();
                "stall, then restore"
            }
            2 => {
                proxy.down();
                tokio::time::sleep(outage).await;
                proxy.restore();
                "down, then restore"
            }
            _ => {
                proxy.stall();
                tokio::time::sleep(outage).await;
                proxy.cut();
                proxy.restore();
                "stall, then cut"
            }
        };
        done += 1;
        workload.disrupted();
        println!(
            "partition: #{done} {name} ({}ms) {}",
            outage.as_millis(),
            workload.progress()
        );
    }
    proxy.restore();
    workload.settle(Duration::from_secs(60)).await;

    // approval-svc's durable cursor on the runner caught up with the log: its stream resumed
    // after every break. (A stream for its subscriber id without after_seq starts right after
    // that cursor, so an empty backlog means it has acked the last event.)
    let runner = runner_as(&cluster.runner.url(), Some(&tokens.operator));
    eventually("approval-svc to ack the last event", WAIT, || {
        let mut runner = runner.clone();
        async move {
            let mut stream = runner
                .stream_events(rpb::StreamEventsRequest {
                    subscriber_id: "approval-svc".into(),
                    follow: false,
                    ..Default::default()
                })
                .await
                .ok()?
                .into_inner();
            stream.message().await.ok()?.is_none().then_some(())
        }
    })
    .await;
    let connections = proxy.accepted();

    let mut report = workload.finish(&mut cluster).await;
    report.fact(format!(
        "seed {seed}: {done} disruptions (cut {}, stall+restore {}, down+restore {}, stall+cut {}); \
         approval-svc opened {connections} connections through the proxy",
        tally[0], tally[1], tally[2], tally[3]
    ));
    report.print("partition");
    assert!(connections > 1, "approval-svc never had to reconnect");
    report.assert_ok();
}

/// How long approval-svc may take to notice a silently dead connection to the runner.
const NOTICE: Duration = Duration::from_secs(60);

/// A runner host that vanishes without a FIN or an RST (power loss, a dropped NAT entry) leaves
/// approval-svc's connection silent rather than closed. approval-svc must notice by itself and
/// reconnect: an approval requested afterwards is listed, decided, delivered and pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_connection_to_the_runner_is_noticed_and_replaced() {
    let mut cluster = Cluster::prepare(Profile::Debug, Vec::new(), Vec::new());
    let tokens = Tokens::write(cluster.dir.path());
    cluster.runner.extra_args.extend(tokens.runner_args());
    cluster.approval.extra_args.extend(tokens.approval_args());
    let proxy = Proxy::start(cluster.runner.addr).await;
    cluster.start_routed(&proxy.url()).await;
    let mut submitter = runner_as(&cluster.runner.url(), Some(&tokens.submitter));
    let approvals = approvals_as(&cluster.approval.url(), Some(&tokens.approver));
    submitter
        .register_tree(rpb::RegisterTreeRequest {
            document: gate_tree("blackhole", "failure"),
            format: 0,
        })
        .await
        .unwrap();
    let submit = |run_id: &'static str| {
        let mut submitter = submitter.clone();
        async move {
            submitter
                .submit_run(rpb::SubmitRunRequest {
                    tree_id: "blackhole".into(),
                    run_id: run_id.into(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
    };
    let pending = |run_id: &'static str, within: Duration| {
        let approvals = approvals.clone();
        async move {
            eventually(
                &format!("{run_id}'s approval to be pending"),
                within,
                || {
                    let mut approvals = approvals.clone();
                    async move {
                        let page = approvals
                            .list_approvals(apb::ListApprovalsRequest {
                                filter: Some(apb::ApprovalFilter {
                                    run_id: run_id.into(),
                                    states: vec![apb::ApprovalState::Pending as i32],
                                    ..Default::default()
                                }),
                                ..Default::default()
                            })
                            .await
                            .ok()?
                            .into_inner();
                        page.approvals.into_iter().next()
                    }
                },
            )
            .await
        }
    };
    submit("before-blackhole").await;
    pending("before-blackhole", WAIT).await;

    proxy.blackhole();
    submit("after-blackhole").await;
    let started = Instant::now();
    let approval = pending("after-blackhole", NOTICE).await;
    println!(
        "partition: approval-svc noticed the dead connection; approval listed after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let mut approver = approvals.clone();
    approver
        .resolve(apb::ResolveRequest {
            request_id: approval.request_id.clone(),
            decision: rpb::DecisionKind::Approve as i32,
            ..Default::default()
        })
        .await
        .unwrap();
    let runner = runner_as(&cluster.runner.url(), Some(&tokens.operator));
    eventually("the run to succeed", NOTICE, || {
        let mut runner = runner.clone();
        async move {
            let run = runner
                .get_run(rpb::GetRunRequest {
                    run_id: "after-blackhole".into(),
                })
                .await
                .ok()?
                .into_inner()
                .run?;
            (run.status == rpb::RunStatus::Succeeded as i32).then_some(())
        }
    })
    .await;
    assert!(proxy.accepted() > 1, "approval-svc opened a new connection");
}
