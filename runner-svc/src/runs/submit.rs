//! Registering trees, submitting runs and interrupting threads.

use arbor_shared::domain::{EventDetail, JobKind, JobOrigin, RestorePolicy, RunMode, RunStatus};
use serde_json::{Map, Value as Json};
use sha1::{Digest, Sha1};

use super::{
    Runner,
    records::{self, RunRecord, TreeRecord},
};
use crate::{
    engine::{Checkpoint, TreeFormat, parse_tree},
    error::RunnerError,
    events::{self, NewEvent},
    mailbox::{EnqueueRequest, MailboxInterrupt, tx as mtx},
    store::{Commit, Reads, T, Tx, TxResult, abort, codec, lift, tables},
};

/// Ids are path- and key-safe: they end up in store keys with NUL separators.
pub(crate) fn check_id(field: &str, value: &str) -> Result<(), RunnerError> {
    let ok = !value.is_empty()
        && value.len() <= 128
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if ok {
        Ok(())
    } else {
        Err(RunnerError::invalid(
            field,
            "must be 1-128 characters of [A-Za-z0-9-_.:]",
        ))
    }
}

/// What to submit.
#[derive(Debug, Clone, Default)]
pub struct SubmitInput {
    pub tree_id: String,
    pub tree_version: u32,
    pub thread_id: String,
    pub input: Map<String, Json>,
    pub priority: i32,
    pub dedupe_key: String,
    pub origin: JobOrigin,
    pub mode: RunMode,
    pub run_id: String,
    pub restore_policy: RestorePolicy,
    pub max_attempts: u32,
    pub submitted_by: String,
    /// The caller's trace context; `None` starts a new trace for the run.
    pub trace: Option<arbor_shared::trace::TraceContext>,
}

#[derive(Debug, Clone)]
pub struct Submitted {
    pub run: RunRecord,
    pub job_id: String,
    pub deduplicated: bool,
    /// The trace id of the run's trace context (`""` when it has none), for the caller's log.
    pub trace_id: String,
}

/// A priority that outranks every user priority, for cancel jobs.
pub(crate) const CANCEL_PRIORITY: i32 = i32::MAX;

impl Runner {
    /// Registers a tree version. The same document again is OK (`already_registered`); a
    /// different document under the same id and version is ALREADY_EXISTS.
    pub async fn register_tree(
        &self,
        document: &str,
        format: TreeFormat,
    ) -> Result<(TreeRecord, bool), RunnerError> {
        let spec = parse_tree(document, format).map_err(|violations| RunnerError::Invalid {
            summary: "invalid tree".into(),
            violations,
        })?;
        let unknown = spec.unknown_tools(&self.tools.names());
        if !unknown.is_empty() {
            return Err(RunnerError::Invalid {
                summary: "invalid tree: unknown tools".into(),
                violations: unknown,
            });
        }
        let canonical = spec.canonical_json();
        let record = TreeRecord {
            id: spec.id().to_string(),
            version: spec.version(),
            digest: hex::encode(Sha1::digest(canonical.as_bytes())),
            document: canonical,
            node_count: spec.node_count() as u32,
            registered_at_ms: self.now_ms(),
        };
        let key = tables::trees::key(&record.id, record.version);
        let (stored, existed) = self
            .commit(move |tx| {
                if let Some(bytes) = tx.tree(T::Trees).get(&key)? {
                    let existing: TreeRecord = match codec::decode("tree", &bytes) {
                        Ok(t) => t,
                        Err(e) => return abort(e),
                    };
                    if existing.digest == record.digest {
                        return Ok(((existing, true), Vec::new()));
                    }
                    return abort(RunnerError::TreeVersionTaken {
                        id: record.id.clone(),
                        version: record.version,
                    });
                }
                tx.tree(T::Trees)
                    .insert(key.clone(), codec::encode(&record))?;
                Ok(((record.clone(), false), Vec::new()))
            })
            .await?;
        Ok((stored, existed))
    }

    /// Enqueues a run; OK means the run, its checkpoint, its start job and RUN_QUEUED are
    /// durable.
    pub async fn submit(&self, input: SubmitInput) -> Result<Submitted, RunnerError> {
        let (record, spec) = self.check_submit(&input)?;
        let now = self.now_ms();
        let run_id = if input.run_id.is_empty() {
            uuid::Uuid::now_v7().to_string()
        } else {
            input.run_id.clone()
        };
        let thread_id = if input.thread_id.is_empty() {
            run_id.clone()
        } else {
            input.thread_id.clone()
        };
        let job_id = uuid::Uuid::now_v7().to_string();
        let order = self.store.next_id()?;
        let fresh = Checkpoint::new(&spec, &thread_id, input.input.clone());
        let default_max = self.mailbox.config().default_max_attempts;
        // Chosen outside the transaction body, which the store may run more than once.
        let trace = input
            .trace
            .unwrap_or_else(arbor_shared::trace::TraceContext::new_root);
        let hand_off = self.hand_off();
        let claimer = hand_off.as_ref().map(|h| h.claimer());
        // Everything the submission reads that its ids name, read with the batch's first read.
        let mut reads = vec![
            (T::Runs, run_id.clone().into_bytes()),
            (T::Checkpoints, run_id.clone().into_bytes()),
            (T::Mailboxes, thread_id.clone().into_bytes()),
        ];
        if !input.dedupe_key.is_empty() {
            reads.push((T::Dedupe, input.dedupe_key.clone().into_bytes()));
        }
        if claimer.is_some() {
            reads.push((T::Active, thread_id.clone().into_bytes()));
        }
        let submitted = self
            .commit_queuing(hand_off, reads, move |tx| {
                let existing = records::get_run(tx, &run_id)?;
                if let Some(conflict) =
                    restore_conflict(input.restore_policy, &run_id, existing.as_ref())
                {
                    return abort(conflict);
                }
                let enq = lift(mtx::enqueue(
                    tx,
                    &EnqueueRequest {
                        job_id: job_id.clone(),
                        mailbox_id: thread_id.clone(),
                        run_id: run_id.clone(),
                        origin: input.origin,
                        kind: Some(if existing.is_some() {
                            JobKind::Resume
                        } else {
                            JobKind::Start
                        }),
                        priority: input.priority,
                        dedupe_key: input.dedupe_key.clone(),
                        dedupe_while_claimed: true,
                        available_at_ms: now,
                        max_attempts: input.max_attempts,
                    },
                    order,
                    now,
                    default_max,
                ))?;
                if enq.deduplicated {
                    let run = records::must_get_run(tx, &enq.job.run_id)?;
                    let trace_id = events::run_trace(tx, &run.run_id)?
                        .map(|c| c.trace_id())
                        .unwrap_or_default();
                    let submitted = Submitted {
                        run,
                        job_id: enq.job.job_id,
                        deduplicated: true,
                        trace_id,
                    };
                    return Ok(((submitted, None), Vec::new()));
                }
                let run = match existing {
                    Some(run) => run,
                    None => {
                        let run = RunRecord {
                            run_id: run_id.clone(),
                            thread_id: thread_id.clone(),
                            tree_id: record.id.clone(),
                            tree_version: record.version,
                            status: RunStatus::Queued,
                            error: String::new(),
                            created_at_ms: now,
                            updated_at_ms: now,
                            submitted_by: input.submitted_by.clone(),
                            priority: input.priority,
                            mode: input.mode,
                            generation: enq.job.generation,
                            step: 0,
                            max_attempts: enq.job.max_attempts,
                            started: false,
                            cancel_reason: String::new(),
                        };
                        records::put_run(tx, &run)?;
                        records::index_run(tx, &run)?;
                        records::put_checkpoint(tx, &run, &fresh, [0; 3])?;
                        run
                    }
                };
                events::set_run_trace(tx, &run.run_id, &trace)?;
                let appended = events::append(
                    tx,
                    &[NewEvent {
                        run_id: run.run_id.clone(),
                        thread_id: run.thread_id.clone(),
                        detail: EventDetail::RunQueued {
                            job_id: enq.job.job_id.clone(),
                            tree_id: run.tree_id.clone(),
                            tree_version: run.tree_version,
                            priority: run.priority,
                            job_kind: enq.job.kind,
                        },
                    }],
                    now,
                    "",
                )?;
                let claimed = match &claimer {
                    Some(claimer) => claimer.claim(tx, &enq.job)?,
                    None => None,
                };
                let submitted = Submitted {
                    run,
                    job_id: enq.job.job_id,
                    deduplicated: false,
                    trace_id: trace.trace_id(),
                };
                Ok(((submitted, claimed), appended))
            })
            .await?;
        Ok(submitted)
    }

    /// The checks a submission must pass before anything is written: ids, limits, and the tree
    /// version it pins.
    fn check_submit(
        &self,
        input: &SubmitInput,
    ) -> Result<(TreeRecord, std::sync::Arc<crate::engine::TreeSpec>), RunnerError> {
        check_id("tree_id", &input.tree_id)?;
        if !input.thread_id.is_empty() {
            check_id("thread_id", &input.thread_id)?;
        }
        if !input.run_id.is_empty() {
            check_id("run_id", &input.run_id)?;
        }
        if input.dedupe_key.len() > 256 {
            return Err(RunnerError::invalid("dedupe_key", "at most 256 bytes"));
        }
        if input.priority == CANCEL_PRIORITY {
            return Err(RunnerError::invalid(
                "priority",
                "i32::MAX is reserved for cancellation",
            ));
        }
        let record = self.tree_record(&input.tree_id, input.tree_version)?;
        let spec = self.tree_spec(&record.id, record.version)?;
        Ok((record, spec))
    }

    /// Bumps the thread's generation: its queued jobs are superseded (never-started runs become
    /// SUPERSEDED), every started, unfinished run of the thread is cancelled cooperatively by a
    /// cancel job that outranks everything else in the thread, and `next` (if given) is enqueued
    /// at the new generation in the same step.
    pub async fn interrupt(
        &self,
        thread_id: &str,
        reason: &str,
        next: Option<SubmitInput>,
    ) -> Result<(MailboxInterrupt, Option<Submitted>), RunnerError> {
        check_id("thread_id", thread_id)?;
        // The replacement is submitted after the interrupt commits; a replacement that cannot be
        // submitted (unknown tree, bad id) must be refused before the thread is interrupted,
        // or bad input would cancel the thread's runs.
        if let Some(next) = &next {
            self.check_submit(next)?;
            if !next.run_id.is_empty() {
                let existing = match self.store.tree(T::Runs).get(next.run_id.as_bytes())? {
                    Some(bytes) => Some(codec::decode::<RunRecord>("run", &bytes)?),
                    None => None,
                };
                if let Some(conflict) =
                    restore_conflict(next.restore_policy, &next.run_id, existing.as_ref())
                {
                    return Err(conflict);
                }
            }
        }
        let reason = if reason.is_empty() {
            "thread interrupted"
        } else {
            reason
        };
        let seen = self.look(thread_id, None)?;
        let mut intr = self
            .interrupt_seen(thread_id, reason, seen.clone(), None)
            .await?;
        // A run submitted after the look above and committed before the interrupt is of an
        // older generation, and the interrupt did not see it: its queued job would only be
        // superseded when claimed, leaving the run queued with no job, and a claimed one would
        // not be cancelled. Everything the interrupt came after is visible now: look again and
        // end those runs as the interrupt ends the others. A crash before this leaves them to
        // the client's retry of the interrupt, which sees them.
        let again = self.look(thread_id, Some(&seen))?;
        if !again.runs.is_empty() {
            let late = self
                .interrupt_seen(thread_id, reason, again, Some(intr.new_generation))
                .await?;
            intr.superseded_count += late.superseded_count;
            intr.superseded.extend(late.superseded);
        }
        let next_run = match next {
            Some(mut next) => {
                next.thread_id = thread_id.to_string();
                Some(self.submit(next).await?)
            }
            None => None,
        };
        self.wake_pool();
        Ok((intr, next_run))
    }

    /// The thread's queued jobs and its runs, as committed now (the jobs first: a run
    /// submitted between the two reads is seen without its job, and cancelled). With
    /// `besides`, those not in it; the jobs are read only when there are such runs.
    fn look(&self, thread_id: &str, besides: Option<&Look>) -> Result<Look, RunnerError> {
        let Some(seen) = besides else {
            return Ok(Look {
                candidates: self.mailbox.queued_of(thread_id)?,
                runs: self.thread_runs(thread_id)?,
            });
        };
        let unseen = |ids: &mut Vec<String>, seen: &[String]| {
            let seen: std::collections::HashSet<&String> = seen.iter().collect();
            ids.retain(|id| !seen.contains(id));
        };
        let mut runs = self.thread_runs(thread_id)?;
        unseen(&mut runs, &seen.runs);
        let mut candidates = Vec::new();
        if !runs.is_empty() {
            candidates = self.mailbox.queued_of(thread_id)?;
            unseen(&mut candidates, &seen.candidates);
        }
        Ok(Look { candidates, runs })
    }

    /// The interrupt's commit, of what a look saw: without `bumped`, the generation moves on;
    /// with it (the generation the interrupt moved to), only runs of an older generation are
    /// ended. Queued jobs of an older generation are superseded, and never-started runs whose
    /// job that was become SUPERSEDED; every other unfinished run gets a cancel job.
    async fn interrupt_seen(
        &self,
        thread_id: &str,
        reason: &str,
        seen: Look,
        bumped: Option<u64>,
    ) -> Result<MailboxInterrupt, RunnerError> {
        let Look { candidates, runs } = seen;
        let now = self.now_ms();
        let mut orders = Vec::new();
        for _ in 0..runs.len() {
            orders.push(self.store.next_id()?);
        }
        let default_max = self.mailbox.config().default_max_attempts;
        // Every row the commit reads, fetched with its batch's first read rather than one
        // round trip each while the batch holds the event log's writer lock.
        let thread_key = thread_id.as_bytes().to_vec();
        let reads: Reads = [(T::Mailboxes, thread_key.clone()), (T::Active, thread_key)]
            .into_iter()
            .chain(
                candidates
                    .iter()
                    .map(|id| (T::Jobs, id.clone().into_bytes())),
            )
            .chain(runs.iter().flat_map(|id| {
                [
                    (T::Runs, id.clone().into_bytes()),
                    (T::Checkpoints, id.clone().into_bytes()),
                    (T::Meta, tables::meta::trace_key(id)),
                    (T::Dedupe, cancel_key(id).into_bytes()),
                ]
            }))
            .collect();
        let (thread, reason) = (thread_id.to_string(), reason.to_string());
        let how = match bumped {
            None => mtx::INTERRUPT_COMMIT,
            Some(_) => Commit::Durable,
        };
        self.commit_as(reads, how, move |tx| {
            let intr = match bumped {
                None => lift(mtx::interrupt(tx, &thread, &candidates, now))?,
                Some(generation) => {
                    let superseded = lift(mtx::supersede_older(tx, &candidates, generation, now))?;
                    MailboxInterrupt {
                        new_generation: generation,
                        active_job: None,
                        superseded_count: superseded.len() as u32,
                        superseded,
                    }
                }
            };
            let mut new_events = Vec::new();
            let superseded_runs: Vec<&str> = intr
                .superseded
                .iter()
                .filter(|j| j.kind == JobKind::Start)
                .map(|j| j.run_id.as_str())
                .collect();
            for (run_id, order) in runs.iter().zip(&orders) {
                let Some(mut run) = records::get_run(tx, run_id)? else {
                    continue;
                };
                if run.status.is_terminal() || run.generation >= intr.new_generation {
                    continue;
                }
                if superseded_runs.contains(&run_id.as_str()) && !run.started {
                    run.status =
                        super::state::apply(run.status, super::state::RunEvent::Supersede)?;
                    run.error = reason.to_string();
                    run.updated_at_ms = now;
                    records::put_run(tx, &run)?;
                    new_events.push(NewEvent {
                        run_id: run.run_id.clone(),
                        thread_id: run.thread_id.clone(),
                        detail: EventDetail::RunFinished {
                            status: RunStatus::Superseded,
                            error: reason.to_string(),
                            blackboard: Default::default(),
                        },
                    });
                    continue;
                }
                enqueue_cancel(tx, &run, &reason, *order, now, default_max)?;
            }
            let appended = events::append(tx, &new_events, now, "")?;
            Ok((intr, appended))
        })
        .await
    }

    /// Run ids of a thread.
    pub(crate) fn thread_runs(&self, thread_id: &str) -> Result<Vec<String>, RunnerError> {
        let mut out = Vec::new();
        for entry in self
            .store
            .tree(T::ThreadRuns)
            .scan_prefix(tables::runs::thread_runs(thread_id))
        {
            let (k, _) = entry?;
            if let Some(pos) = k.iter().position(|b| *b == 0) {
                out.push(String::from_utf8_lossy(&k[pos + 1..]).into_owned());
            }
        }
        Ok(out)
    }
}

/// What an interrupt saw of its thread before its commit: the ids of its queued jobs and of
/// its runs.
#[derive(Debug, Clone)]
struct Look {
    candidates: Vec<String>,
    runs: Vec<String>,
}

/// Why a submission with `policy` may not (re)use `run_id` given the run stored under it, if it
/// may not.
fn restore_conflict(
    policy: RestorePolicy,
    run_id: &str,
    existing: Option<&RunRecord>,
) -> Option<RunnerError> {
    match (policy, existing) {
        (RestorePolicy::Never, Some(_)) => Some(RunnerError::RunExists(run_id.into())),
        (RestorePolicy::Required, None) => Some(RunnerError::NothingToRestore(run_id.into())),
        (_, Some(run)) if run.status.is_terminal() => Some(RunnerError::RunFinished {
            run_id: run_id.into(),
            status: run.status,
        }),
        _ => None,
    }
}

/// The dedupe key of a run's cancel job: one cancel job per run at a time.
fn cancel_key(run_id: &str) -> String {
    format!("cancel:{run_id}")
}

/// Enqueues the cooperative cancel of a run and records why on the run.
pub(crate) fn enqueue_cancel(
    tx: &Tx<'_>,
    run: &RunRecord,
    reason: &str,
    order: u64,
    now: u64,
    default_max: u32,
) -> TxResult<crate::mailbox::Job, RunnerError> {
    let enq = lift(mtx::enqueue(
        tx,
        &EnqueueRequest {
            job_id: uuid::Uuid::now_v7().to_string(),
            mailbox_id: run.thread_id.clone(),
            run_id: run.run_id.clone(),
            origin: JobOrigin::Internal,
            kind: Some(JobKind::Cancel),
            priority: CANCEL_PRIORITY,
            dedupe_key: cancel_key(&run.run_id),
            dedupe_while_claimed: false,
            available_at_ms: now,
            max_attempts: 0,
        },
        order,
        now,
        default_max,
    ))?;
    if run.cancel_reason.is_empty() {
        let mut run = run.clone();
        run.cancel_reason = reason.to_string();
        records::put_run(tx, &run)?;
    }
    Ok(enq.job)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const QUICK: &str = r#"{"id": "quick", "version": 1, "root": {"type": "set", "name": "s", "key": "x", "value": 1}}"#;

    /// `Runner::interrupt` commits what its look at the thread saw, then looks again. A run
    /// submitted after the first look and committed before the interrupt (here, in between, in
    /// that order) is missed by the first commit and ended by the second, as the runs seen
    /// first are; a run submitted after the interrupt, of the new generation, is left alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_submitted_while_its_thread_is_interrupted_is_ended_too() {
        let dir = tempfile::tempdir().unwrap();
        let runner = crate::open_runner(&crate::ServeConfig {
            data_dir: dir.path().to_path_buf(),
            ..crate::ServeConfig::default()
        })
        .await
        .unwrap();
        runner.register_tree(QUICK, TreeFormat::Json).await.unwrap();
        let submit = || async {
            let input = SubmitInput {
                tree_id: "quick".into(),
                thread_id: "chat".into(),
                submitted_by: "alice".into(),
                ..Default::default()
            };
            runner.submit(input).await.unwrap().run
        };
        let status = |run: &RunRecord| runner.get_run(&run.run_id).unwrap().run.status;

        let seen_run = submit().await;
        let seen = runner.look("chat", None).unwrap();
        let late_run = submit().await;
        let intr = runner
            .interrupt_seen("chat", "new message", seen.clone(), None)
            .await
            .unwrap();
        assert_eq!(intr.new_generation, 1);
        assert_eq!(status(&seen_run), RunStatus::Superseded);
        assert_eq!(
            status(&late_run),
            RunStatus::Queued,
            "the first commit missed it"
        );

        let after = submit().await;
        assert_eq!(after.generation, 1);
        let again = runner.look("chat", Some(&seen)).unwrap();
        assert_eq!(again.runs.len(), 2, "{again:?}");
        let late = runner
            .interrupt_seen("chat", "new message", again, Some(intr.new_generation))
            .await
            .unwrap();
        assert_eq!(
            late.superseded
                .iter()
                .map(|j| &j.run_id)
                .collect::<Vec<_>>(),
            [&late_run.run_id]
        );
        assert_eq!(status(&late_run), RunStatus::Superseded);
        assert_eq!(status(&after), RunStatus::Queued);
        let queued = runner.mailbox().queued_of("chat").unwrap();
        assert_eq!(queued.len(), 1, "the new generation's job is still queued");
    }
}
