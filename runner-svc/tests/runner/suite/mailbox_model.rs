//! Property test: the mailbox, on each backend, behaves like a small in-memory model of the
//! DESIGN §5 status machine under random operation sequences, including expired leases and
//! stale tokens.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::Backend;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use arbor_runner_svc::mailbox::{
    EnqueueRequest, Mailbox, MailboxConfig, MailboxError, MailboxStore, ManualClock,
};
use arbor_shared::domain::JobStatus;
use proptest::{prelude::*, test_runner::FileFailurePersistence};

const LEASE_MS: u64 = 1_000;
const START_MS: u64 = 1_700_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        mailbox: u8,
        priority: i8,
        dedupe: Option<u8>,
        dedupe_while_claimed: bool,
        delay_ms: u16,
    },
    Claim,
    Ack(u8),
    AckStale(u8),
    Nack(u8, bool),
    Extend(u8),
    Cancel(u8),
    Interrupt(u8),
    Requeue(u8),
    Advance(u16),
    Reap,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, -2i8..3, proptest::option::of(0u8..3), any::<bool>(), prop_oneof![Just(0u16), 0u16..3000])
            .prop_map(|(mailbox, priority, dedupe, dedupe_while_claimed, delay_ms)| Op::Enqueue {
                mailbox, priority, dedupe, dedupe_while_claimed, delay_ms
            }),
        4 => Just(Op::Claim),
        2 => any::<u8>().prop_map(Op::Ack),
        1 => any::<u8>().prop_map(Op::AckStale),
        2 => (any::<u8>(), any::<bool>()).prop_map(|(i, p)| Op::Nack(i, p)),
        1 => any::<u8>().prop_map(Op::Extend),
        1 => any::<u8>().prop_map(Op::Cancel),
        1 => (0u8..3).prop_map(Op::Interrupt),
        1 => any::<u8>().prop_map(Op::Requeue),
        2 => (0u16..2500).prop_map(Op::Advance),
        1 => Just(Op::Reap),
    ]
}

#[derive(Debug, Clone)]
struct MJob {
    mailbox: String,
    priority: i32,
    order: u64,
    status: JobStatus,
    generation: u64,
    attempts: u32,
    available_at: u64,
    dedupe: String,
    dedupe_while_claimed: bool,
    token: String,
    lease_deadline: u64,
}

#[derive(Default)]
struct Model {
    jobs: BTreeMap<String, MJob>,
    generations: BTreeMap<String, u64>,
    dedupe: BTreeMap<String, String>,
    wall: u64,
    mono: u64,
    next_order: u64,
}

const MAX_ATTEMPTS: u32 = 3;

fn cfg() -> MailboxConfig {
    MailboxConfig {
        lease: Duration::from_millis(LEASE_MS),
        base_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(1_000),
        default_max_attempts: MAX_ATTEMPTS,
    }
}

impl Model {
    fn active(&self, mailbox: &str) -> bool {
        self.jobs
            .values()
            .any(|j| j.mailbox == mailbox && j.status == JobStatus::Claimed)
    }

    fn release_dedupe(&mut self, id: &str) {
        let key = self.jobs[id].dedupe.clone();
        if !key.is_empty() && self.dedupe.get(&key).map(String::as_str) == Some(id) {
            self.dedupe.remove(&key);
        }
    }

    fn enqueue(
        &mut self,
        id: &str,
        mailbox: &str,
        priority: i32,
        dedupe: &str,
        dwc: bool,
        avail: u64,
    ) -> (String, bool) {
        if !dedupe.is_empty()
            && let Some(holder) = self.dedupe.get(dedupe)
        {
            return (holder.clone(), true);
        }
        self.next_order += 1;
        let job = MJob {
            mailbox: mailbox.into(),
            priority,
            order: self.next_order,
            status: JobStatus::Queued,
            generation: *self.generations.get(mailbox).unwrap_or(&0),
            attempts: 0,
            available_at: avail.max(self.wall),
            dedupe: dedupe.into(),
            dedupe_while_claimed: dwc,
            token: String::new(),
            lease_deadline: 0,
        };
        self.jobs.insert(id.into(), job);
        if !dedupe.is_empty() {
            self.dedupe.insert(dedupe.into(), id.into());
        }
        (id.into(), false)
    }

    /// Returns the claimed job id; the token is filled in from the real store's answer.
    fn claim(&mut self) -> Option<String> {
        let mut queued: Vec<(String, MJob)> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.status == JobStatus::Queued)
            .map(|(id, j)| (id.clone(), j.clone()))
            .collect();
        queued.sort_by_key(|(_, j)| (-(j.priority as i64), j.order));
        for (id, j) in queued {
            if j.available_at > self.wall {
                continue;
            }
            if j.generation < *self.generations.get(&j.mailbox).unwrap_or(&0) {
                self.release_dedupe(&id);
                self.jobs.get_mut(&id).unwrap().status = JobStatus::Superseded;
                continue;
            }
            if self.active(&j.mailbox) {
                continue;
            }
            if !j.dedupe_while_claimed {
                self.release_dedupe(&id);
            }
            let job = self.jobs.get_mut(&id).unwrap();
            job.status = JobStatus::Claimed;
            job.attempts += 1;
            job.lease_deadline = self.mono + LEASE_MS;
            return Some(id);
        }
        None
    }

    fn fail_attempt(&mut self, id: &str, permanent: bool, backoff: u64) {
        let wall = self.wall;
        let job = self.jobs.get_mut(id).unwrap();
        job.token.clear();
        if permanent || job.attempts >= MAX_ATTEMPTS {
            job.status = JobStatus::DeadLetter;
            self.release_dedupe(id);
        } else {
            job.status = JobStatus::Queued;
            job.available_at = wall + backoff;
            let key = job.dedupe.clone();
            if !key.is_empty() && !self.dedupe.contains_key(&key) {
                self.dedupe.insert(key, id.into());
            }
        }
    }
}

/// What an operation returned, comparable between model and store.
#[derive(Debug, PartialEq)]
enum Out {
    Job(String, JobStatus),
    Enq(String, bool),
    None,
    Stale,
    NotFound,
    Illegal,
    Interrupt(u64, Option<String>, u32),
    Reaped(Vec<(String, JobStatus)>),
}

fn err_out(e: MailboxError) -> Out {
    match e {
        MailboxError::StaleClaim { .. } => Out::Stale,
        MailboxError::NotFound(_) => Out::NotFound,
        MailboxError::InvalidTransition(_) => Out::Illegal,
        other => panic!("unexpected error {other}"),
    }
}

fn pick(model: &Model, i: u8) -> Option<String> {
    let ids: Vec<&String> = model.jobs.keys().collect();
    if ids.is_empty() {
        None
    } else {
        Some(ids[i as usize % ids.len()].clone())
    }
}

/// The model check over random sequences: as many cases as the backend asks for (the full
/// count on sled, a sample on PostgreSQL, where every case creates a schema). The seeds in
/// `mailbox_model.proptest-regressions`, beside this file, run first on every backend.
pub fn mailbox_matches_the_model(b: Backend) {
    let config = ProptestConfig {
        // Beside the source file, named after it: proptest's default would look in a
        // directory parallel to the crate's test root instead.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::with_cases(b.model_cases())
    };
    proptest!(
        config,
        |(ops in proptest::collection::vec(op(), 1..80))| {
            check(b, ops)?;
        }
    );
}

fn check(b: Backend, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    let counted = store.clone();
    let clock = Arc::new(ManualClock::new(START_MS));
    let (mb, _) = Mailbox::open(store, clock.clone(), cfg()).unwrap();
    let mut m = Model {
        wall: START_MS,
        ..Model::default()
    };
    let mut next_id = 0;

    for op in ops {
        let op_dbg = format!("{op:?}");
        let (real, model) = match op {
            Op::Enqueue {
                mailbox,
                priority,
                dedupe,
                dedupe_while_claimed,
                delay_ms,
            } => {
                next_id += 1;
                let id = format!("j{next_id:03}");
                let mailbox = format!("m{mailbox}");
                let dedupe = dedupe.map(|d| format!("d{d}")).unwrap_or_default();
                let avail = m.wall + u64::from(delay_ms);
                let real = mb
                    .enqueue(EnqueueRequest {
                        job_id: id.clone(),
                        mailbox_id: mailbox.clone(),
                        priority: priority.into(),
                        dedupe_key: dedupe.clone(),
                        dedupe_while_claimed,
                        available_at_ms: avail,
                        ..Default::default()
                    })
                    .map(|e| Out::Enq(e.job.job_id, e.deduplicated))
                    .unwrap_or_else(err_out);
                let (mid, dup) = m.enqueue(
                    &id,
                    &mailbox,
                    priority.into(),
                    &dedupe,
                    dedupe_while_claimed,
                    avail,
                );
                (real, Out::Enq(mid, dup))
            }
            Op::Claim => {
                let real = mb.claim("w").unwrap();
                let model = m.claim();
                if let (Some(c), Some(id)) = (&real, &model)
                    && &c.job.job_id == id
                {
                    m.jobs.get_mut(id).unwrap().token = c.token.clone();
                }
                (
                    real.map(|c| Out::Job(c.job.job_id, c.job.status))
                        .unwrap_or(Out::None),
                    model
                        .map(|id| Out::Job(id, JobStatus::Claimed))
                        .unwrap_or(Out::None),
                )
            }
            Op::Ack(i) | Op::AckStale(i) => {
                let Some(id) = pick(&m, i) else { continue };
                let token = match op {
                    Op::AckStale(_) => "not-the-token".to_string(),
                    _ => m.jobs[&id].token.clone(),
                };
                let real = mb
                    .ack(&id, &token)
                    .map(|j| Out::Job(j.job_id, j.status))
                    .unwrap_or_else(err_out);
                let j = &m.jobs[&id];
                let model =
                    if j.status == JobStatus::Claimed && !token.is_empty() && j.token == token {
                        m.release_dedupe(&id);
                        let j = m.jobs.get_mut(&id).unwrap();
                        j.status = JobStatus::Accepted;
                        j.token.clear();
                        Out::Job(id.clone(), JobStatus::Accepted)
                    } else {
                        Out::Stale
                    };
                (real, model)
            }
            Op::Nack(i, permanent) => {
                let Some(id) = pick(&m, i) else { continue };
                let token = m.jobs[&id].token.clone();
                let real = mb
                    .nack(&id, &token, "boom", permanent)
                    .map(|j| Out::Job(j.job_id, j.status))
                    .unwrap_or_else(err_out);
                let j = &m.jobs[&id];
                let model =
                    if j.status == JobStatus::Claimed && !token.is_empty() && j.token == token {
                        let backoff = cfg().backoff(j.attempts).as_millis() as u64;
                        m.fail_attempt(&id, permanent, backoff);
                        Out::Job(id.clone(), m.jobs[&id].status)
                    } else {
                        Out::Stale
                    };
                (real, model)
            }
            Op::Extend(i) => {
                let Some(id) = pick(&m, i) else { continue };
                let token = m.jobs[&id].token.clone();
                let real = mb
                    .extend_lease(&id, &token)
                    .map(|j| Out::Job(j.job_id, j.status))
                    .unwrap_or_else(err_out);
                let mono = m.mono;
                let j = m.jobs.get_mut(&id).unwrap();
                let model = if j.status == JobStatus::Claimed
                    && !token.is_empty()
                    && j.token == token
                    && j.lease_deadline > mono
                {
                    j.lease_deadline = mono + LEASE_MS;
                    Out::Job(id.clone(), JobStatus::Claimed)
                } else {
                    Out::Stale
                };
                (real, model)
            }
            Op::Cancel(i) => {
                let Some(id) = pick(&m, i) else { continue };
                let real = mb
                    .cancel(&id)
                    .map(|j| Out::Job(j.job_id, j.status))
                    .unwrap_or_else(err_out);
                let model = if matches!(m.jobs[&id].status, JobStatus::Queued | JobStatus::Claimed)
                {
                    m.release_dedupe(&id);
                    let j = m.jobs.get_mut(&id).unwrap();
                    j.status = JobStatus::Cancelled;
                    j.token.clear();
                    Out::Job(id.clone(), JobStatus::Cancelled)
                } else {
                    Out::Illegal
                };
                (real, model)
            }
            Op::Interrupt(mbx) => {
                let mailbox = format!("m{mbx}");
                let real = mb
                    .interrupt(&mailbox)
                    .map(|r| {
                        Out::Interrupt(
                            r.new_generation,
                            r.active_job.map(|j| j.job_id),
                            r.superseded_count,
                        )
                    })
                    .unwrap_or_else(err_out);
                let generation = m.generations.get(&mailbox).copied().unwrap_or(0) + 1;
                m.generations.insert(mailbox.clone(), generation);
                let victims: Vec<String> = m
                    .jobs
                    .iter()
                    .filter(|(_, j)| {
                        j.mailbox == mailbox
                            && j.status == JobStatus::Queued
                            && j.generation < generation
                    })
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in &victims {
                    m.release_dedupe(id);
                    m.jobs.get_mut(id).unwrap().status = JobStatus::Superseded;
                }
                let active = m
                    .jobs
                    .iter()
                    .find(|(_, j)| j.mailbox == mailbox && j.status == JobStatus::Claimed)
                    .map(|(id, _)| id.clone());
                (
                    real,
                    Out::Interrupt(generation, active, victims.len() as u32),
                )
            }
            Op::Requeue(i) => {
                let Some(id) = pick(&m, i) else { continue };
                let real = mb
                    .requeue(&id)
                    .map(|j| Out::Job(j.job_id, j.status))
                    .unwrap_or_else(err_out);
                let wall = m.wall;
                let mailbox = m.jobs[&id].mailbox.clone();
                let current = *m.generations.get(&mailbox).unwrap_or(&0);
                let j = m.jobs.get_mut(&id).unwrap();
                let model = if j.status == JobStatus::DeadLetter {
                    j.status = JobStatus::Queued;
                    j.attempts = 0;
                    j.available_at = wall;
                    // Back at the thread's current generation.
                    j.generation = current;
                    Out::Job(id.clone(), JobStatus::Queued)
                } else {
                    Out::Illegal
                };
                (real, model)
            }
            Op::Advance(ms) => {
                clock.advance(Duration::from_millis(ms.into()));
                m.wall += u64::from(ms);
                m.mono += u64::from(ms);
                continue;
            }
            Op::Reap => {
                let mut real: Vec<(String, JobStatus)> = mb
                    .reap_expired()
                    .unwrap()
                    .into_iter()
                    .map(|r| (r.job.job_id, r.job.status))
                    .collect();
                real.sort_by(|a, b| a.0.cmp(&b.0));
                let expired: Vec<String> = m
                    .jobs
                    .iter()
                    .filter(|(_, j)| j.status == JobStatus::Claimed && j.lease_deadline <= m.mono)
                    .map(|(id, _)| id.clone())
                    .collect();
                let mut model = Vec::new();
                for id in expired {
                    m.fail_attempt(&id, false, 0);
                    model.push((id.clone(), m.jobs[&id].status));
                }
                model.sort_by(|a, b| a.0.cmp(&b.0));
                (Out::Reaped(real), Out::Reaped(model))
            }
        };
        if std::env::var("MODEL_TRACE").is_ok() {
            eprintln!(
                "{op_dbg}\n  real={real:?}\n  model={model:?}\n  dedupe={:?}",
                m.dedupe
            );
        }
        prop_assert_eq!(real, model);
    }

    for (id, want) in &m.jobs {
        let got = mb.get(id).unwrap().unwrap();
        prop_assert_eq!(
            (got.status, got.attempt_count),
            (want.status, want.attempts),
            "job {}",
            id
        );
    }
    // The job counts `/metrics` reports moved with every transition: they equal the model's.
    let stored = arbor_runner_svc::counts::Tally::stored(&counted).unwrap();
    for (i, status) in arbor_runner_svc::counts::JOB_STATUSES.iter().enumerate() {
        let want = m.jobs.values().filter(|j| j.status == *status).count() as u64;
        prop_assert_eq!(stored.jobs[i], want, "jobs {:?}", status);
    }
    prop_assert_eq!(
        stored,
        arbor_runner_svc::counts::Tally::scan(&counted).unwrap()
    );
    Ok(())
}

/// A sequence proptest once found: dedupe ownership across interrupts and requeues.
pub fn regression_dedupe_holder_after_interrupts_and_requeues(b: Backend) {
    check(
        b,
        vec![
            Op::Ack(57),
            Op::Enqueue {
                mailbox: 2,
                priority: -2,
                dedupe: Some(0),
                dedupe_while_claimed: false,
                delay_ms: 0,
            },
            Op::Extend(3),
            Op::Enqueue {
                mailbox: 2,
                priority: -2,
                dedupe: Some(2),
                dedupe_while_claimed: true,
                delay_ms: 2933,
            },
            Op::Claim,
            Op::Enqueue {
                mailbox: 0,
                priority: -1,
                dedupe: Some(0),
                dedupe_while_claimed: false,
                delay_ms: 0,
            },
            Op::Reap,
            Op::Claim,
            Op::Advance(2212),
            Op::Advance(1735),
            Op::Advance(2097),
            Op::Enqueue {
                mailbox: 0,
                priority: 0,
                dedupe: Some(1),
                dedupe_while_claimed: false,
                delay_ms: 0,
            },
            Op::Advance(80),
            Op::Claim,
            Op::Advance(989),
            Op::Claim,
            Op::Reap,
            Op::Enqueue {
                mailbox: 2,
                priority: -2,
                dedupe: Some(2),
                dedupe_while_claimed: false,
                delay_ms: 0,
            },
            Op::Advance(235),
            Op::Advance(1863),
            Op::Reap,
            Op::Advance(2369),
            Op::Enqueue {
                mailbox: 1,
                priority: -1,
                dedupe: None,
                dedupe_while_claimed: false,
                delay_ms: 0,
            },
            Op::Claim,
            Op::Enqueue {
                mailbox: 1,
                priority: 1,
                dedupe: Some(0),
                dedupe_while_claimed: true,
                delay_ms: 2861,
            },
            Op::Extend(17),
            Op::Cancel(180),
            Op::Advance(304),
            Op::Enqueue {
                mailbox: 0,
                priority: -1,
                dedupe: Some(2),
                dedupe_while_claimed: true,
                delay_ms: 0,
            },
            Op::Enqueue {
                mailbox: 0,
                priority: 1,
                dedupe: Some(0),
                dedupe_while_claimed: true,
                delay_ms: 484,
            },
            Op::Enqueue {
                mailbox: 1,
                priority: 1,
                dedupe: None,
                dedupe_while_claimed: true,
                delay_ms: 0,
            },
            Op::Enqueue {
                mailbox: 1,
                priority: -2,
                dedupe: None,
                dedupe_while_claimed: true,
                delay_ms: 0,
            },
            Op::Enqueue {
                mailbox: 2,
                priority: -2,
                dedupe: None,
                dedupe_while_claimed: true,
                delay_ms: 2995,
            },
            Op::AckStale(6),
            Op::Reap,
            Op::Ack(21),
            Op::Enqueue {
                mailbox: 2,
                priority: 0,
                dedupe: None,
                dedupe_while_claimed: true,
                delay_ms: 1887,
            },
            Op::Enqueue {
                mailbox: 0,
                priority: 2,
                dedupe: None,
                dedupe_while_claimed: true,
                delay_ms: 0,
            },
            Op::Claim,
            Op::Claim,
            Op::Interrupt(0),
            Op::Ack(115),
            Op::Requeue(129),
            Op::Claim,
            Op::Claim,
            Op::Enqueue {
                mailbox: 0,
                priority: 1,
                dedupe: None,
                dedupe_while_claimed: true,
                delay_ms: 2857,
            },
            Op::Claim,
            Op::Enqueue {
                mailbox: 0,
                priority: -2,
                dedupe: None,
                dedupe_while_claimed: true,
                delay_ms: 471,
            },
            Op::Enqueue {
                mailbox: 0,
                priority: -2,
                dedupe: Some(0),
                dedupe_while_claimed: true,
                delay_ms: 2887,
            },
            Op::Extend(235),
            Op::Interrupt(2),
            Op::Interrupt(1),
            Op::Nack(19, true),
            Op::Requeue(232),
            Op::Claim,
            Op::Nack(103, true),
            Op::Enqueue {
                mailbox: 0,
                priority: 1,
                dedupe: None,
                dedupe_while_claimed: true,
                delay_ms: 0,
            },
            Op::Advance(1941),
            Op::Ack(78),
            Op::Enqueue {
                mailbox: 0,
                priority: 2,
                dedupe: Some(0),
                dedupe_while_claimed: false,
                delay_ms: 0,
            },
            Op::Enqueue {
                mailbox: 1,
                priority: -2,
                dedupe: Some(0),
                dedupe_while_claimed: true,
                delay_ms: 0,
            },
            Op::Claim,
            Op::Claim,
            Op::Requeue(26),
            Op::Claim,
            Op::Extend(69),
            Op::Reap,
            Op::Advance(421),
            Op::Advance(1788),
            Op::Claim,
            Op::Advance(1721),
            Op::Advance(1411),
        ],
    )
    .unwrap();
}
