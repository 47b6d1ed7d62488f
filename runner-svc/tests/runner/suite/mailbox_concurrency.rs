//! Many workers racing on one mailbox: every job is claimed and acked exactly once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::Backend;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use arbor_runner_svc::mailbox::{
    Claim, EnqueueRequest, Mailbox, MailboxConfig, MailboxStore, SystemClock,
};
use arbor_shared::domain::JobStatus;

/// A mailbox holding `jobs` queued jobs spread over 64 threads (whose jobs must never be claimed
/// at the same time) and three priorities.
fn mailbox_with_jobs(b: Backend, jobs: usize) -> (tempfile::TempDir, Arc<Mailbox>) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    let cfg = MailboxConfig {
        lease: Duration::from_secs(60),
        ..MailboxConfig::default()
    };
    let (mailbox, _) = Mailbox::open(store, Arc::new(SystemClock::default()), cfg).unwrap();
    for i in 0..jobs {
        mailbox
            .enqueue(EnqueueRequest {
                job_id: format!("job-{i:05}"),
                mailbox_id: format!("thread-{}", i % 64),
                run_id: format!("run-{i}"),
                priority: (i % 3) as i32,
                ..Default::default()
            })
            .unwrap();
    }
    (dir, Arc::new(mailbox))
}

/// What the claimers saw: how often each job was claimed, and the claimed job of each thread.
#[derive(Default)]
struct Seen {
    claims: Mutex<HashMap<String, usize>>,
    in_flight: Mutex<HashMap<String, String>>,
}

impl Seen {
    /// Records a claim while it is held; panics if its thread already had a claimed job.
    fn claimed(&self, claim: &Claim) {
        let thread = claim.job.mailbox_id.clone();
        let clash = self
            .in_flight
            .lock()
            .unwrap()
            .insert(thread.clone(), claim.job.job_id.clone());
        assert!(clash.is_none(), "two claimed jobs on {thread}");
        *self
            .claims
            .lock()
            .unwrap()
            .entry(claim.job.job_id.clone())
            .or_default() += 1;
    }

    /// The claim is about to be acked: its thread is free again.
    fn released(&self, claim: &Claim) {
        self.in_flight.lock().unwrap().remove(&claim.job.mailbox_id);
    }

    fn claimed_jobs(&self) -> usize {
        self.claims.lock().unwrap().len()
    }

    /// Every one of `jobs` jobs was claimed exactly once and is Accepted after one attempt.
    fn check_every_job_once(&self, mailbox: &Mailbox, jobs: usize) {
        let claims = self.claims.lock().unwrap();
        assert_eq!(claims.len(), jobs, "every job claimed");
        assert!(claims.values().all(|n| *n == 1), "no job claimed twice");
        for i in (0..jobs).step_by(499) {
            let job = mailbox.get(&format!("job-{i:05}")).unwrap().unwrap();
            assert_eq!((job.status, job.attempt_count), (JobStatus::Accepted, 1));
        }
    }
}

/// How many jobs the sixteen claimers race for: 10,000 on sled; 2,000 on PostgreSQL, where
/// every enqueue, claim and ack is a round trip and 10,000 were most of the suite's time there
/// (the claims race through the same seam either way).
fn racing_jobs(b: Backend) -> usize {
    match b {
        Backend::Sled => 10_000,
        Backend::Postgres => 2_000,
    }
}

/// Sixteen threads claim and ack until every job is taken: each job is claimed exactly once,
/// and never while another job of its thread is claimed.
pub fn sixteen_claimers_take_every_job_exactly_once(b: Backend) {
    let jobs = racing_jobs(b);
    let (_dir, mailbox) = mailbox_with_jobs(b, jobs);
    let seen = Arc::new(Seen::default());
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let (mailbox, seen) = (mailbox.clone(), seen.clone());
            std::thread::spawn(move || {
                let worker = format!("worker-{w}");
                loop {
                    let Some(claim) = mailbox.claim(&worker).unwrap() else {
                        // Another worker may still hold the last jobs of a thread.
                        if seen.claimed_jobs() == jobs {
                            return;
                        }
                        std::thread::yield_now();
                        continue;
                    };
                    seen.claimed(&claim);
                    seen.released(&claim);
                    let acked = mailbox.ack(&claim.job.job_id, &claim.token).unwrap();
                    assert_eq!(acked.status, JobStatus::Accepted);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    seen.check_every_job_once(&mailbox, jobs);
    assert!(mailbox.claim("late").unwrap().is_none());
}

pub fn a_second_ack_with_the_same_token_is_refused(b: Backend) {
    let (_dir, mailbox) = mailbox_with_jobs(b, 0);
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

/// The worker pool's claims (`claim_next`) share batched transactions with each other (and, on
/// sled, with the acks): with 32 of them in flight at once, racing for the same candidates,
/// every job is still claimed exactly once and a thread never has two claimed jobs.
pub async fn pool_claims_sharing_batches_take_every_job_once(b: Backend) {
    const JOBS: usize = 5_000;
    let (_dir, mailbox) = mailbox_with_jobs(b, JOBS);
    let seen = Arc::new(Seen::default());
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..32 {
        let (mailbox, seen) = (mailbox.clone(), seen.clone());
        workers.spawn(async move {
            let worker = format!("worker-{w}");
            loop {
                let Some(claim) = mailbox.claim_next(&worker).await.unwrap().0 else {
                    if seen.claimed_jobs() == JOBS {
                        return;
                    }
                    tokio::task::yield_now().await;
                    continue;
                };
                seen.claimed(&claim);
                seen.released(&claim);
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
    seen.check_every_job_once(&mailbox, JOBS);
    assert!(mailbox.claim_next("late").await.unwrap().0.is_none());
}

/// A lone pool claimer takes jobs highest priority first, then oldest.
pub async fn a_lone_pool_claimer_takes_jobs_in_claim_order(b: Backend) {
    let (_dir, mailbox) = mailbox_with_jobs(b, 0);
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
