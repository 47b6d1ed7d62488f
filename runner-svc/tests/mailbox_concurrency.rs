//! Many workers racing on one sled mailbox: every job is claimed and acked exactly once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use arbor_runner_svc::{
    mailbox::{EnqueueRequest, MailboxConfig, MailboxStore, SledMailbox, SystemClock},
    store::Store,
};
use arbor_shared::domain::JobStatus;

#[test]
fn sixteen_claimers_take_ten_thousand_jobs_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), 64 << 20).unwrap();
    let cfg = MailboxConfig {
        lease: Duration::from_secs(60),
        ..MailboxConfig::default()
    };
    let (mailbox, _) = SledMailbox::open(store, Arc::new(SystemClock::default()), cfg).unwrap();
    let mailbox = Arc::new(mailbox);
    const JOBS: usize = 10_000;
    for i in 0..JOBS {
        mailbox
            .enqueue(EnqueueRequest {
                job_id: format!("job-{i:05}"),
                // 64 threads: jobs of one thread must never be claimed at the same time.
                mailbox_id: format!("thread-{}", i % 64),
                run_id: format!("run-{i}"),
                priority: (i % 3) as i32,
                ..Default::default()
            })
            .unwrap();
    }

    let claims: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let in_flight: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let mailbox = mailbox.clone();
            let claims = claims.clone();
            let in_flight = in_flight.clone();
            std::thread::spawn(move || {
                let worker = format!("worker-{w}");
                loop {
                    let Some(claim) = mailbox.claim(&worker).unwrap() else {
                        // Another worker may still hold the last jobs of a thread.
                        if claims.lock().unwrap().len() == JOBS {
                            return;
                        }
                        std::thread::yield_now();
                        continue;
                    };
                    let thread = claim.job.mailbox_id.clone();
                    let clash = in_flight
                        .lock()
                        .unwrap()
                        .insert(thread.clone(), claim.job.job_id.clone());
                    assert!(clash.is_none(), "two claimed jobs on {thread}");
                    *claims
                        .lock()
                        .unwrap()
                        .entry(claim.job.job_id.clone())
                        .or_default() += 1;
                    in_flight.lock().unwrap().remove(&thread);
                    let acked = mailbox.ack(&claim.job.job_id, &claim.token).unwrap();
                    assert_eq!(acked.status, JobStatus::Accepted);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }

    let claims = claims.lock().unwrap();
    assert_eq!(claims.len(), JOBS, "every job claimed");
    assert!(claims.values().all(|n| *n == 1), "no job claimed twice");
    assert!(mailbox.claim("late").unwrap().is_none());
    for i in (0..JOBS).step_by(997) {
        let job = mailbox.get(&format!("job-{i:05}")).unwrap().unwrap();
        assert_eq!((job.status, job.attempt_count), (JobStatus::Accepted, 1));
    }
}

#[test]
fn a_second_ack_with_the_same_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), 8 << 20).unwrap();
    let (mailbox, _) = SledMailbox::open(
        store,
        Arc::new(SystemClock::default()),
        MailboxConfig::default(),
    )
    .unwrap();
    mailbox
        .enqueue(EnqueueRequest {
            job_id: "j".into(),
            mailbox_id: "t".into(),
            ..Default::default()
        })
        .unwrap();
    let claim = mailbox.claim("w").unwrap().unwrap();
    mailbox.ack("j", &claim.token).unwrap();
    let err = mailbox.ack("j", &claim.token).unwrap_err();
    assert!(matches!(
        err,
        arbor_runner_svc::mailbox::MailboxError::StaleClaim { .. }
    ));
}

/// The worker pool's claims (`claim_next`) share the committer's transactions with each other
/// and with the acks: with 32 of them in flight at once, each aiming at a different job first,
/// every job is still claimed exactly once and a thread never has two claimed jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_claims_sharing_batches_take_every_job_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), 64 << 20).unwrap();
    let cfg = MailboxConfig {
        lease: Duration::from_secs(60),
        ..MailboxConfig::default()
    };
    let (mailbox, _) = SledMailbox::open(store, Arc::new(SystemClock::default()), cfg).unwrap();
    let mailbox = Arc::new(mailbox);
    const JOBS: usize = 5_000;
    for i in 0..JOBS {
        mailbox
            .enqueue_durable(EnqueueRequest {
                job_id: format!("job-{i:05}"),
                mailbox_id: format!("thread-{}", i % 64),
                run_id: format!("run-{i}"),
                priority: (i % 3) as i32,
                ..Default::default()
            })
            .await
            .unwrap();
    }

    let claims: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let in_flight: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..32 {
        let (mailbox, claims, in_flight) = (mailbox.clone(), claims.clone(), in_flight.clone());
        workers.spawn(async move {
            let worker = format!("worker-{w}");
            loop {
                let Some(claim) = mailbox.claim_next(&worker).await.unwrap().0 else {
                    if claims.lock().unwrap().len() == JOBS {
                        return;
                    }
                    tokio::task::yield_now().await;
                    continue;
                };
                let thread = claim.job.mailbox_id.clone();
                let clash = in_flight
                    .lock()
                    .unwrap()
                    .insert(thread.clone(), claim.job.job_id.clone());
                assert!(clash.is_none(), "two claimed jobs on {thread}");
                *claims
                    .lock()
                    .unwrap()
                    .entry(claim.job.job_id.clone())
                    .or_default() += 1;
                in_flight.lock().unwrap().remove(&thread);
                let acked = mailbox
                    .ack_durable(&claim.job.job_id, &claim.token)
                    .await
                    .unwrap();
                assert_eq!(acked.status, JobStatus::Accepted);
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.unwrap();
    }

    let claims = std::mem::take(&mut *claims.lock().unwrap());
    assert_eq!(claims.len(), JOBS, "every job claimed");
    assert!(claims.values().all(|n| *n == 1), "no job claimed twice");
    assert!(mailbox.claim_next("late").await.unwrap().0.is_none());
    for i in (0..JOBS).step_by(499) {
        let job = mailbox.get(&format!("job-{i:05}")).unwrap().unwrap();
        assert_eq!((job.status, job.attempt_count), (JobStatus::Accepted, 1));
    }
}

/// A lone pool claimer takes jobs highest priority first, then oldest: aiming at different
/// jobs only reorders claims that are in flight together.
#[tokio::test]
async fn a_lone_pool_claimer_takes_jobs_in_claim_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), 8 << 20).unwrap();
    let (mailbox, _) = SledMailbox::open(
        store,
        Arc::new(SystemClock::default()),
        MailboxConfig::default(),
    )
    .unwrap();
    let jobs = [("a", 0), ("b", 5), ("c", 0), ("d", 5), ("e", -1), ("f", 9)];
    for (i, (id, priority)) in jobs.iter().enumerate() {
        mailbox
            .enqueue_durable(EnqueueRequest {
                job_id: (*id).into(),
                mailbox_id: format!("thread-{i}"),
                priority: *priority,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let mut order = Vec::new();
    while let Some(claim) = mailbox.claim_next("w").await.unwrap().0 {
        mailbox
            .ack_durable(&claim.job.job_id, &claim.token)
            .await
            .unwrap();
        order.push(claim.job.job_id);
    }
    assert_eq!(order, ["f", "b", "d", "a", "c", "e"]);
}
