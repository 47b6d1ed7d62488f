//! Delivering decisions into a run's inbox (`RunnerService.Resolve`), idempotently by
//! `decision_id`.

use arbor_shared::domain::{
    DecisionSource, EventDetail, JobKind, JobOrigin, SuspensionCategory, SuspensionState, Verdict,
};
use serde_json::Value as Json;

use super::{RunRecord, RunView, Runner, handoff::Claimer, records, submit::check_id};
use crate::{
    engine::{Decision, TaskKind, validate_decision},
    error::RunnerError,
    events::{self, NewEvent},
    mailbox::{EnqueueRequest, Job, tx as mtx},
    store::{T, Tx, TxResult, abort, lift, tables},
    tasks,
};

/// A decision as the RPC received it.
#[derive(Debug, Clone)]
pub struct ResolveInput {
    pub run_id: String,
    pub request_id: String,
    pub decision_id: String,
    /// Approvals: the decision's kind (a plain resume or cancel from older callers is read as
    /// approve or reject); user input and external results: resume or cancel.
    pub action: Verdict,
    pub result: Json,
    pub reason: String,
    pub decided_by: String,
    pub source: DecisionSource,
    /// Only the `service` role may resolve approval-category suspensions.
    pub may_resolve_approvals: bool,
    /// The caller's trace context: the run's next steps belong to it. `None` keeps the run's.
    pub trace: Option<arbor_shared::trace::TraceContext>,
}

/// What Resolve did.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The same decision id had already been accepted (or consumed).
    pub duplicate: bool,
    /// The run as this decision's step left it, read inside that step: durable, and its events
    /// streamable, once Resolve returns.
    pub run: RunView,
}

impl Runner {
    /// Makes a decision durable in the run's inbox and wakes the run. A repeat with the same
    /// decision id is OK and changes nothing; another decision for an already decided request,
    /// or one for a withdrawn request, is FAILED_PRECONDITION.
    pub async fn resolve(&self, input: ResolveInput) -> Result<Resolved, RunnerError> {
        check_id("run_id", &input.run_id)?;
        if input.request_id.is_empty() || input.request_id.len() > 128 {
            return Err(RunnerError::invalid("request_id", "must be 1-128 bytes"));
        }
        if input.decision_id.is_empty() || input.decision_id.len() > 128 {
            return Err(RunnerError::invalid("decision_id", "must be 1-128 bytes"));
        }
        let now = self.now_ms();
        let order = self.store.next_id()?;
        let default_max = self.mailbox.config().default_max_attempts;
        let decision = Decision {
            request_id: input.request_id.clone(),
            decision_id: input.decision_id.clone(),
            action: input.action,
            result: input.result.clone(),
            reason: input.reason.clone(),
            decided_by: input.decided_by.clone(),
            source: input.source,
        };
        let hand_off = self.hand_off();
        let claimer = hand_off.as_ref().map(|h| h.claimer());
        // Everything the step reads that its keys alone name, read with the batch's first read;
        // and what `deliver` reads of the run's thread, when that is the run's own (as it is
        // unless the run was submitted on a thread).
        let run_key = input.run_id.clone().into_bytes();
        let mut reads = vec![
            (T::Runs, run_key.clone()),
            (T::Checkpoints, run_key.clone()),
            (
                T::Inbox,
                tables::runs::inbox_key(&input.run_id, &input.request_id),
            ),
            (T::Tasks, input.request_id.clone().into_bytes()),
            (T::Dedupe, wake_key(&input.run_id).into_bytes()),
            (T::Mailboxes, run_key.clone()),
        ];
        if claimer.is_some() {
            reads.push((T::Active, run_key));
        }
        let resolved = self
            .commit_queuing(hand_off, reads, move |tx| {
                let run = records::must_get_run(tx, &input.run_id)?;
                let Some(ck) = records::get_checkpoint(tx, &input.run_id)? else {
                    return abort(not_found(&input));
                };
                let Some(record) = ck.suspension(&input.request_id) else {
                    return abort(not_found(&input));
                };
                if record.category == SuspensionCategory::RequireApproval
                    && !input.may_resolve_approvals
                {
                    return abort(RunnerError::ApprovalNeedsService);
                }
                let duplicate = |existing: &str| -> TxResult<((Resolved, _), _), RunnerError> {
                    if existing == input.decision_id {
                        let resolved = Resolved {
                            duplicate: true,
                            run: RunView::of(run.clone(), &ck),
                        };
                        Ok(((resolved, None), Vec::new()))
                    } else {
                        abort(RunnerError::AlreadyDecided {
                            request_id: input.request_id.clone(),
                            decision_id: existing.to_string(),
                        })
                    }
                };
                match record.state {
                    SuspensionState::Cleared => {
                        let existing = record.consumed_decision_id.clone().unwrap_or_default();
                        return duplicate(&existing);
                    }
                    SuspensionState::Inactive => {
                        return abort(RunnerError::Withdrawn(input.request_id.clone()));
                    }
                    SuspensionState::Active => {}
                }
                if let Some(pending) = ck.pending_decision(&input.request_id) {
                    return duplicate(&pending.decision_id);
                }
                if let Some(pending) = records::inbox_get(tx, &input.run_id, &input.request_id)? {
                    return duplicate(&pending.decision_id);
                }
                if run.status.is_terminal() {
                    return abort(RunnerError::RunFinished {
                        run_id: run.run_id.clone(),
                        status: run.status,
                    });
                }
                let normalised = match validate_decision(record, decision.clone()) {
                    Ok(d) => d,
                    Err(e) if e.not_allowed => {
                        return abort(RunnerError::DecisionNotOffered {
                            request_id: input.request_id.clone(),
                            reason: e.description,
                        });
                    }
                    Err(e) => {
                        return abort(RunnerError::Invalid {
                            summary: format!(
                                "decision rejected for request '{}'",
                                input.request_id
                            ),
                            violations: vec![arbor_shared::status::FieldViolation::new(
                                e.field.clone(),
                                e.description.clone(),
                            )],
                        });
                    }
                };
                // An `external` node's task no longer waits for a worker.
                match tasks::tx::get(tx, &input.request_id)? {
                    Some(task) if task.kind == TaskKind::Tool => {
                        return abort(RunnerError::ServedByWorkers(input.request_id.clone()));
                    }
                    Some(task) => tasks::tx::resolve_external(tx, task, now)?,
                    None => {}
                }
                let claimed = deliver(
                    tx,
                    &run,
                    &normalised,
                    (order, now, default_max),
                    claimer.as_ref(),
                )?;
                if let Some(trace) = &input.trace {
                    events::set_run_trace(tx, &run.run_id, trace)?;
                }
                let appended = events::append(
                    tx,
                    &[NewEvent {
                        run_id: run.run_id.clone(),
                        thread_id: run.thread_id.clone(),
                        detail: EventDetail::ApprovalResolved {
                            request_id: input.request_id.clone(),
                            decision_id: input.decision_id.clone(),
                            action: normalised.action,
                            reason: input.reason.clone(),
                            decided_by: input.decided_by.clone(),
                            category: record.category,
                            source: input.source,
                        },
                    }],
                    now,
                    "",
                )?;
                let resolved = Resolved {
                    duplicate: false,
                    run: RunView::of(run.clone(), &ck),
                };
                Ok(((resolved, claimed), appended))
            })
            .await?;
        Ok(resolved)
    }
}

/// Puts a decision into the run's inbox and queues the job that wakes the run (one wake job per
/// run at a time: later decisions join the queued one). With a `claimer`, the wake job is
/// claimed for the worker it names when it can run now: the claimed job is returned.
pub(crate) fn deliver(
    tx: &Tx<'_>,
    run: &RunRecord,
    decision: &Decision,
    (order, now, default_max): (u64, u64, u32),
    claimer: Option<&Claimer>,
) -> TxResult<Option<Job>, RunnerError> {
    let thread = run.thread_id.as_bytes();
    match claimer {
        Some(_) => tx.prefetch(&[(T::Mailboxes, thread), (T::Active, thread)])?,
        None => tx.prefetch(&[(T::Mailboxes, thread)])?,
    }
    records::inbox_put(tx, &run.run_id, decision)?;
    let enq = lift(mtx::enqueue(
        tx,
        &EnqueueRequest {
            job_id: uuid::Uuid::now_v7().to_string(),
            mailbox_id: run.thread_id.clone(),
            run_id: run.run_id.clone(),
            origin: JobOrigin::Internal,
            kind: Some(JobKind::Resume),
            priority: run.priority,
            dedupe_key: wake_key(&run.run_id),
            dedupe_while_claimed: false,
            available_at_ms: now,
            max_attempts: run.max_attempts,
        },
        order,
        now,
        default_max,
    ))?;
    match claimer {
        Some(claimer) if !enq.deduplicated => claimer.claim(tx, &enq.job),
        _ => Ok(None),
    }
}

/// The dedupe key of the job that wakes a run for its decisions.
fn wake_key(run_id: &str) -> String {
    format!("wake:{run_id}")
}

fn not_found(input: &ResolveInput) -> RunnerError {
    RunnerError::RequestNotFound {
        run_id: input.run_id.clone(),
        request_id: input.request_id.clone(),
    }
}
