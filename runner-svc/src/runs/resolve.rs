//! Delivering decisions into a run's inbox (`RunnerService.Resolve`), idempotently by
//! `decision_id`. A request whose node has moved on (its record pruned from the checkpoint) is
//! answered from the run's note of its last settled requests: the same decision is still a
//! duplicate, another one still refused.

use arbor_shared::{
    digest,
    domain::{
        DecisionKind, DecisionSource, EventDetail, JobKind, JobOrigin, SuspensionCategory,
        SuspensionState, Verdict,
    },
};
use serde_json::Value as Json;

use super::{RunRecord, RunView, Runner, handoff::Claimer, records, submit::check_id};
use crate::{
    engine::{Decision, SuspensionRecord, TaskKind, validate_decision},
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
    /// User input and external results: the caller, checked against who the request names
    /// (`crate::grpc::access::Answerer`); `None`: a caller every request accepts.
    pub answerer: Option<crate::grpc::access::Answerer>,
    /// The caller's trace context: the run's next steps belong to it. `None` keeps the run's.
    pub trace: Option<arbor_shared::trace::TraceContext>,
    /// Approvals: the digest the decider approved; a decision whose arguments have another is
    /// refused. Empty: not checked.
    pub args_digest: String,
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
        if !input.args_digest.is_empty() && !is_digest(&input.args_digest) {
            return Err(RunnerError::invalid(
                "args_digest",
                "must be `sha256:` and 64 lowercase hex digits",
            ));
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
                // A suspension whose node has moved on is remembered only by how it ended.
                let found = ck.suspension(&input.request_id);
                let (category, state, consumed) = match (found, ck.past_request(&input.request_id))
                {
                    (Some(r), _) => (r.category, r.state, r.consumed_decision_id.clone()),
                    (None, Some(past)) => match &past.decision_id {
                        Some(d) => (past.category, SuspensionState::Cleared, Some(d.clone())),
                        None => (past.category, SuspensionState::Inactive, None),
                    },
                    (None, None) => return abort(not_found(&input)),
                };
                if category == SuspensionCategory::RequireApproval && !input.may_resolve_approvals {
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
                let record = match (state, found) {
                    (SuspensionState::Cleared, _) => {
                        return duplicate(&consumed.unwrap_or_default());
                    }
                    (SuspensionState::Inactive, _) => {
                        return abort(RunnerError::Withdrawn(input.request_id.clone()));
                    }
                    (SuspensionState::Active, Some(record)) => record,
                    (SuspensionState::Active, None) => return abort(not_found(&input)),
                };
                // A refused answerer changes nothing: the step aborts before anything is written.
                if let Some(answerer) = &input.answerer
                    && record.category != SuspensionCategory::RequireApproval
                    && let Err(e) = answerer.check(&run, record)
                {
                    return abort(e);
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
                // What the run goes on with, and so what the decider must have approved.
                // A reject runs nothing, so it has nothing to bind.
                let ran_with = ran_with(record, &normalised);
                let binds = matches!(
                    normalised.action.kind(),
                    Some(DecisionKind::Approve | DecisionKind::Edit | DecisionKind::Respond)
                );
                if binds && !input.args_digest.is_empty() && ran_with != input.args_digest {
                    return abort(RunnerError::DecisionNotOffered {
                        request_id: input.request_id.clone(),
                        reason: format!(
                            "what this decision runs with has digest {ran_with}, not the approved {}",
                            input.args_digest
                        ),
                    });
                }
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
                            args_digest: ran_with,
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

/// The digest of what an approval decision lets the run go on with: APPROVE, the suspended tool
/// call's arguments (a gate: its context); EDIT, the new arguments; RESPOND, the stand-in result.
/// Empty for REJECT (nothing runs), user input and external results.
fn ran_with(record: &SuspensionRecord, decision: &Decision) -> String {
    if record.category != SuspensionCategory::RequireApproval {
        return String::new();
    }
    match decision.action.kind() {
        Some(DecisionKind::Approve) => record
            .approval
            .as_ref()
            .map(|a| a.args_digest())
            .unwrap_or_default(),
        Some(DecisionKind::Edit | DecisionKind::Respond) => digest::of(&decision.result),
        Some(DecisionKind::Reject) | None => String::new(),
    }
}

/// `sha256:` and 64 lowercase hex digits, as [`digest::of`] writes them.
fn is_digest(s: &str) -> bool {
    s.strip_prefix(digest::PREFIX).is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use arbor_shared::{domain::RunStatus, testing::eventually};
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::{engine::TreeFormat, runs::SubmitInput};

    const ASK_THRICE: &str = r#"{"id": "ask-thrice", "version": 1, "root":
      {"type": "repeat", "name": "loop", "count": 3, "child":
        {"type": "user_input", "name": "ask", "input_kind": "text", "prompt": "Next?"}}}"#;

    fn answer(run_id: &str, request_id: &str, decision_id: &str) -> ResolveInput {
        ResolveInput {
            run_id: run_id.into(),
            request_id: request_id.into(),
            decision_id: decision_id.into(),
            action: Verdict::Resume,
            result: json!({"text": "go on"}),
            reason: String::new(),
            decided_by: "alice".into(),
            source: DecisionSource::Person,
            may_resolve_approvals: false,
            answerer: None,
            trace: None,
            args_digest: String::new(),
        }
    }

    /// Waits until the run asks something other than `previous`; returns its request id.
    async fn next_request(runner: &Runner, run_id: &str, previous: &str) -> String {
        eventually(
            "the run's next request",
            Duration::from_secs(20),
            || async {
                let view = runner.get_run(run_id).unwrap();
                let rid = view.suspensions.first()?.request_id.clone();
                (rid != previous).then_some(rid)
            },
        )
        .await
    }

    /// The request a repeated `Resolve` names has left the checkpoint (its node asked anew), yet
    /// the same decision is still a duplicate and another one still refused, until the run ends
    /// and after.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_duplicate_resolve_after_pruning_still_answers_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        let runner = crate::open_runner(&crate::ServeConfig {
            data_dir: dir.path().to_path_buf(),
            ..crate::ServeConfig::default()
        })
        .await
        .unwrap();
        runner
            .register_tree(ASK_THRICE, TreeFormat::Json)
            .await
            .unwrap();
        let stop = CancellationToken::new();
        let _workers = crate::pool::spawn(runner.clone(), 1, stop.clone());
        let input = SubmitInput {
            tree_id: "ask-thrice".into(),
            submitted_by: "alice".into(),
            ..Default::default()
        };
        let run_id = runner.submit(input).await.unwrap().run.run_id;
        let first = next_request(&runner, &run_id, "").await;
        let r = runner
            .resolve(answer(&run_id, &first, "d-1"))
            .await
            .unwrap();
        assert!(!r.duplicate);
        let second = next_request(&runner, &run_id, &first).await;

        let ck = runner
            .store
            .tree(T::Checkpoints)
            .get(run_id.as_bytes())
            .unwrap()
            .unwrap();
        let ck = crate::engine::Checkpoint::decode(&ck).unwrap();
        assert!(
            ck.suspension(&first).is_none(),
            "the first request was pruned"
        );
        let again = runner
            .resolve(answer(&run_id, &first, "d-1"))
            .await
            .unwrap();
        assert!(again.duplicate);
        assert_eq!(again.run.suspensions[0].request_id, second);
        let other = runner.resolve(answer(&run_id, &first, "d-2")).await;
        assert!(
            matches!(&other, Err(RunnerError::AlreadyDecided { decision_id, .. }) if decision_id == "d-1"),
            "{other:?}"
        );

        runner
            .resolve(answer(&run_id, &second, "d-2"))
            .await
            .unwrap();
        let third = next_request(&runner, &run_id, &second).await;
        runner
            .resolve(answer(&run_id, &third, "d-3"))
            .await
            .unwrap();
        eventually("the run to succeed", Duration::from_secs(20), || async {
            let status = runner.get_run(&run_id).unwrap().run.status;
            (status == RunStatus::Succeeded).then_some(())
        })
        .await;
        let late = runner
            .resolve(answer(&run_id, &first, "d-1"))
            .await
            .unwrap();
        assert!(late.duplicate);
        stop.cancel();
    }
}
