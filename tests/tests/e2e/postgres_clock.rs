//! On PostgreSQL the runner keeps time by the database server's clock, not its host's: two
//! runner-svc replicas on one database, one whose clock is ten minutes behind and one ten
//! minutes ahead (libfaketime), run the same timer tree. A run's `wait` fires neither early
//! (a deadline written on the slow clock would be ten minutes past on the database's) nor late
//! (a job made available on the fast clock would stay queued ten minutes), and the times the
//! runs carry are the database's. The same holds for approval-svc replicas: an approval's
//! deadline fires by the database's clock, and the times it records are the database's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::PathBuf,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_testkit::PgCluster;
use arbor_tests::{
    Profile,
    clients::{approvals_as, runner_as},
    process::Replicas,
    secured::{register, submit, wait_run},
};

/// The command that installs libfaketime, named when it is missing.
const INSTALL: &str = "apt-get install -y libfaketime";

/// How far off each replica's clock is.
const SKEWS: [&str; 2] = ["-10m", "+10m"];

/// The timer every run waits on.
const WAIT_MS: u64 = 4_000;

/// libfaketime's library for multi-threaded programs, from Debian's `libfaketime` package.
fn faketime_library() -> PathBuf {
    let find = || {
        std::fs::read_dir("/usr/lib")
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|d| d.path().join("faketime/libfaketimeMT.so.1"))
            .find(|p| p.is_file())
    };
    let found = find().or_else(|| {
        arbor_testkit::apt_install(&["libfaketime"]);
        find()
    });
    found.unwrap_or_else(|| {
        panic!("libfaketime (faketime/libfaketimeMT.so.1 under /usr/lib) is missing: `{INSTALL}`")
    })
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The environment that sets a process's clock `skew` off (libfaketime).
fn skewed(library: &std::path::Path, skew: &str) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".into(), library.display().to_string()),
        ("FAKETIME".into(), skew.into()),
        // Timers and timeouts inside the process run on the monotonic clock: leave it.
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ]
}

fn ms(t: &Option<prost_types::Timestamp>) -> i64 {
    let t = t.as_ref().expect("a time");
    t.seconds * 1000 + i64::from(t.nanos) / 1_000_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_wrong_clocks_keep_the_database_s_time() {
    let library = faketime_library();
    let url = PgCluster::shared().fresh_database("clock_skew");
    let mut r = Replicas::prepare(Profile::Debug, &url, (2, 0), Vec::new(), Vec::new());
    for (runner, skew) in r.runners.iter_mut().zip(SKEWS) {
        runner.env = skewed(&library, skew);
    }
    r.start_all().await;
    let clients: Vec<_> = r.runner_urls().iter().map(|u| runner_as(u, None)).collect();
    register(
        &mut clients[0].clone(),
        serde_json::json!({"id": "timer", "version": 1, "root": {"type": "sequence",
            "name": "main", "children": [
                {"type": "wait", "name": "pause", "ms": WAIT_MS},
                {"type": "set", "name": "done", "key": "done", "value": true}]}})
        .to_string(),
    )
    .await;

    // A run submitted to each replica, each one's timer set and fired by whichever replica
    // ticks it.
    for round in 0..2 {
        for (i, client) in clients.iter().enumerate() {
            let run_id = format!("timer-{round}-{i}");
            let (submitted, submitted_ms) = (Instant::now(), now_ms());
            submit(&mut client.clone(), "timer", &run_id).await;
            let run = wait_run(client, &run_id, rpb::RunStatus::Succeeded).await;
            let took = submitted.elapsed();
            assert!(
                took >= Duration::from_millis(WAIT_MS),
                "{run_id}, submitted to the replica {} off, succeeded after {took:?}: its \
                 {WAIT_MS} ms timer fired early",
                SKEWS[i]
            );
            assert!(
                took < Duration::from_millis(WAIT_MS + 10_000),
                "{run_id}, submitted to the replica {} off, took {took:?}",
                SKEWS[i]
            );
            // Ticked when submitted and when its timer was due: a timer that looked due on
            // the database's clock but not on the ticking replica's would be ticked again and
            // again until it was.
            assert!(
                run.step <= 2,
                "{run_id}, submitted to the replica {} off, took {} steps",
                SKEWS[i],
                run.step
            );
            // The run's times are the database's (this host's, here), not a skewed replica's.
            for (what, at) in [("created", &run.created_at), ("updated", &run.updated_at)] {
                let off = ms(at) - submitted_ms;
                assert!(
                    (-2_000..WAIT_MS as i64 + 12_000).contains(&off),
                    "{run_id} {what} at {off} ms from its submission"
                );
            }
        }
    }
    assert!(r.stop_all().await.is_empty());
}

/// Two runner and two approval replicas, every clock ten minutes off (the approval leader's
/// ahead): a gate's 4 s deadline expires its approval after 4 s, neither at once nor ten
/// minutes late, and the approval's times are the database's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_deadlines_fire_by_the_database_s_clock() {
    const DEADLINE_MS: u64 = 4_000;
    let library = faketime_library();
    let url = PgCluster::shared().fresh_database("clock_deadlines");
    let mut r = Replicas::prepare(Profile::Debug, &url, (2, 2), Vec::new(), Vec::new());
    for (runner, skew) in r.runners.iter_mut().zip(SKEWS) {
        runner.env = skewed(&library, skew);
    }
    for (approval, skew) in r.approvals.iter_mut().zip(SKEWS.iter().rev()) {
        approval.env = skewed(&library, skew);
    }
    r.start_all().await;
    let runners: Vec<_> = r.runner_urls().iter().map(|u| runner_as(u, None)).collect();
    let approvals: Vec<_> = r
        .approval_urls()
        .iter()
        .map(|u| approvals_as(u, None))
        .collect();
    register(
        &mut runners[0].clone(),
        serde_json::json!({"id": "deadline", "version": 1, "root": {"type": "approval",
            "name": "gate", "title": "Ship?", "deadline_ms": DEADLINE_MS,
            "child": {"type": "set", "name": "done", "key": "done", "value": true}}})
        .to_string(),
    )
    .await;

    for (i, runner) in runners.iter().enumerate() {
        let run_id = format!("deadline-{i}");
        let (submitted, submitted_ms) = (Instant::now(), now_ms());
        submit(&mut runner.clone(), "deadline", &run_id).await;
        // Rejected when the deadline passed (fail closed): the run fails.
        wait_run(runner, &run_id, rpb::RunStatus::Failed).await;
        let took = submitted.elapsed();
        assert!(
            took >= Duration::from_millis(DEADLINE_MS),
            "{run_id}: its {DEADLINE_MS} ms deadline fired after {took:?}"
        );
        assert!(
            took < Duration::from_millis(DEADLINE_MS + 10_000),
            "{run_id}: took {took:?}"
        );
        let approval = approvals[1]
            .clone()
            .list_approvals(apb::ListApprovalsRequest {
                filter: Some(apb::ApprovalFilter {
                    run_id: run_id.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .approvals
            .pop()
            .expect("the run's approval");
        let decision = approval.decision.as_ref().expect("a decision");
        assert_eq!(decision.source, rpb::DecisionSource::Timeout as i32);
        for (what, at) in [
            ("created", &approval.created_at),
            ("decided", &decision.decided_at),
        ] {
            let off = ms(at) - submitted_ms;
            assert!(
                (-2_000..DEADLINE_MS as i64 + 12_000).contains(&off),
                "{run_id}'s approval {what} at {off} ms from its submission"
            );
        }
    }
    assert!(r.stop_all().await.is_empty());
}
