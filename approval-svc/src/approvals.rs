//! The one door every change to an approval goes through, whoever causes it (the runner's
//! events, a person, the policy, the deadline timer, the delivery task). After the store has
//! made a change durable this publishes it to watchers and wakes the task that acts next, so a
//! policy decision travels exactly the same path as a person's.

use std::{
    panic::AssertUnwindSafe,
    sync::{Arc, PoisonError},
    time::Duration,
};

use arbor_shared::{auth::Principal, domain::ApprovalRequest};
use futures_util::FutureExt;
use tokio::{
    sync::{Notify, broadcast, oneshot, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    error::{Error, Result},
    leader::Replica,
    lifecycle::ApprovalState,
    metrics::Metrics,
    model::{Approval, NewDecision},
    outbox::{DeliveryWake, Mark, Marks},
    policy::{Policy, Subject},
    store::{ApprovalStore, Consumed, DeliveryOutcome, Put, Resolved},
};

/// How many changes a watcher may fall behind before it is ended with RESOURCE_EXHAUSTED.
pub const CHANGE_BUFFER: usize = 1024;

/// How long the runner's acceptance of a decision waits to be recorded with the decision's
/// consumption before it is recorded on its own (see [`Approvals::accepted`]).
pub const MARK_WAIT: Duration = Duration::from_secs(1);

/// Cheap to clone; every clone drives the same store.
pub struct Approvals<S> {
    store: Arc<S>,
    policy: Arc<Policy>,
    changes: broadcast::Sender<Approval>,
    delivery: Arc<DeliveryWake>,
    deadlines: Arc<Notify>,
    /// Bumped when changes made elsewhere may have been missed (watchers must start over).
    missed: Arc<watch::Sender<u64>>,
    metrics: Arc<Metrics>,
    /// Delivery attempts waiting to be recorded (see [`record_delivery`](Self::record_delivery)).
    attempts: Arc<Queue<Attempt, Option<Approval>>>,
    /// Decisions waiting to be taken (see [`decide`](Self::decide)).
    decisions: Arc<Queue<Decision, Resolved>>,
    /// Deliveries the runner accepted, not recorded yet (see [`accepted`](Self::accepted)).
    marks: Arc<Marks>,
    /// This replica's name and whether it leads.
    replica: Arc<Replica>,
}

impl<S> Clone for Approvals<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            policy: self.policy.clone(),
            changes: self.changes.clone(),
            delivery: self.delivery.clone(),
            deadlines: self.deadlines.clone(),
            missed: self.missed.clone(),
            metrics: self.metrics.clone(),
            attempts: self.attempts.clone(),
            decisions: self.decisions.clone(),
            marks: self.marks.clone(),
            replica: self.replica.clone(),
        }
    }
}

impl<S: ApprovalStore> Approvals<S> {
    pub fn new(store: Arc<S>, policy: Policy) -> Self {
        Self {
            store,
            policy: Arc::new(policy),
            changes: broadcast::channel(CHANGE_BUFFER).0,
            delivery: Arc::default(),
            deadlines: Arc::new(Notify::new()),
            missed: Arc::new(watch::channel(0).0),
            metrics: Arc::new(Metrics::default()),
            attempts: Arc::default(),
            decisions: Arc::default(),
            marks: Arc::default(),
            replica: Arc::default(),
        }
    }

    /// The same, for the replica named `name` (see [`Replica`]); before any clone is made.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.replica = Arc::new(Replica::new(name));
        self
    }

    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// The store, for a task that needs no more of the façade (retention).
    pub fn shared_store(&self) -> Arc<S> {
        self.store.clone()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The counters, for the registry that exports them.
    pub fn shared_metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Every durable change, in the order this process made them durable.
    pub fn subscribe(&self) -> broadcast::Receiver<Approval> {
        self.changes.subscribe()
    }

    /// Told which decisions may be waiting to be delivered.
    pub fn delivery_wake(&self) -> Arc<DeliveryWake> {
        self.delivery.clone()
    }

    /// Notified when a new deadline may be earlier than the one the timer sleeps on.
    pub fn deadline_wake(&self) -> Arc<Notify> {
        self.deadlines.clone()
    }

    /// Changes when this process may have missed changes that other processes made to a
    /// shared store: a watcher of it can no longer tell its client every change.
    pub fn missed(&self) -> watch::Receiver<u64> {
        self.missed.subscribe()
    }

    /// Publishes what other processes sharing the store change, as if changed here: watchers
    /// see it, and a decision taken elsewhere wakes this process's delivery (when it leads).
    /// A notification only names the approval; its current record is read from the store.
    pub async fn follow_foreign(self, stop: CancellationToken) {
        let Some(mut changes) = self.store.foreign_changes() else {
            return;
        };
        loop {
            let first = tokio::select! {
                _ = stop.cancelled() => return,
                c = changes.recv() => c,
            };
            let Some(first) = first else { return };
            // Whatever else has arrived meanwhile goes in the same pass, each id once.
            let mut ids = vec![first];
            while let Ok(more) = changes.try_recv() {
                if !ids.contains(&more) {
                    ids.push(more);
                }
            }
            self.apply_foreign(ids).await;
        }
    }

    async fn apply_foreign(&self, ids: Vec<String>) {
        // Nobody watches here: no record needs reading. The loops that may act on the change
        // (delivery, deadlines) read the store when woken.
        if self.changes.receiver_count() == 0 {
            match ids.iter().any(String::is_empty) {
                true => self.delivery.everything(),
                false => self.delivery.named(ids),
            }
            self.deadlines.notify_one();
            return;
        }
        let mut missed = ids.iter().any(String::is_empty);
        let ids: Vec<String> = ids.into_iter().filter(|id| !id.is_empty()).collect();
        // All read at once: one statement on PostgreSQL.
        let store = self.store.clone();
        let read = match ids.is_empty() {
            true => Ok(Ok(Vec::new())),
            false => tokio::task::spawn_blocking(move || store.get_many(&ids)).await,
        };
        match read {
            Ok(Ok(changed)) => {
                for a in changed {
                    if a.state == ApprovalState::Pending && a.request.deadline_ms > 0 {
                        self.deadlines.notify_one();
                    }
                    self.publish(&a);
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the approvals changed elsewhere");
                missed = true;
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the approvals changed elsewhere failed");
                missed = true;
            }
        }
        if missed {
            tracing::info!("changes made elsewhere may have been missed; watchers start over");
            self.missed.send_modify(|n| *n += 1);
            self.delivery.everything();
            self.deadlines.notify_one();
        }
    }

    /// Tells watchers of the change to `a` (without waking delivery).
    fn tell_watchers(&self, a: &Approval) {
        // No receiver is fine: nobody is watching.
        let _ = self.changes.send(a.clone());
    }

    fn publish(&self, a: &Approval) {
        self.tell_watchers(a);
        if a.needs_delivery() {
            self.delivery.named([a.id()]);
        }
    }

    /// [`publish`](Self::publish) of a decision written here, read with the `traceparent`
    /// stored for its request (`None`: there is none): delivery is handed the decision as it
    /// is, instead of reading it back.
    fn publish_traced(&self, a: &Approval, traceparent: Option<String>) {
        self.tell_watchers(a);
        if a.needs_delivery() {
            self.delivery.handed(a.clone(), traceparent);
        }
    }

    /// APPROVAL_REQUESTED: store it (idempotent), then let the policy decide if it can.
    /// Re-running this for a request that is still PENDING re-applies the policy, so a crash
    /// between storing and deciding is healed by the replayed event.
    /// Stores a runner request (durably) and applies the policy to it.
    pub async fn request(
        &self,
        request: ApprovalRequest,
        unknown_kind: Option<i32>,
    ) -> Result<Approval> {
        let put = self.store.put_request_lazy(request, unknown_kind).await?;
        self.store.flush().await?;
        self.settle(put).await
    }

    /// Stores a batch of the runner's requests (request, unknown kind, `traceparent`) and
    /// lets the policy decide the new ones in the same write where the store can; each must
    /// then be [`settle`](Self::settle)d, in order. The write runs as a task of its own, which
    /// wakes delivery for the decisions it stored even when the caller goes away meanwhile (as
    /// [`decide`](Self::decide) does).
    pub async fn put_requests(
        &self,
        requests: Vec<(ApprovalRequest, Option<i32>, String)>,
    ) -> Result<Vec<Put>> {
        let (store, policy, delivery) = (
            self.store.clone(),
            self.policy.clone(),
            self.delivery.clone(),
        );
        to_the_end("storing the requests", async move {
            let decide = move |a: &Approval| policy.evaluate(&Subject::from(a)).decision();
            // A request decided as it is stored is a new one: its trace is the one stored with
            // it. The puts answer in the order of the requests.
            let traces: Vec<String> = requests.iter().map(|(_, _, t)| t.clone()).collect();
            let puts = store.put_and_decide_requests(requests, decide).await?;
            for (put, traceparent) in puts.iter().zip(traces) {
                if put.decided && put.approval.needs_delivery() {
                    let traceparent = (!traceparent.is_empty()).then_some(traceparent);
                    delivery.handed(put.approval.clone(), traceparent);
                }
            }
            Ok(puts)
        })
        .await
    }

    /// Publishes a stored request and applies the policy: an allow/deny rule decides it
    /// through the same path as a person; otherwise it waits, with its deadline armed. One the
    /// policy decided as it was stored is published once, decided.
    pub async fn settle(&self, put: Put) -> Result<Approval> {
        let approval = put.approval;
        if put.decided {
            if let Some(d) = &approval.decision {
                tracing::info!(request_id = approval.id(), rule = %d.rule,
                    decision = d.kind.as_str(), "decided by policy");
            }
            self.observe_decision(&approval);
            // `put_requests` handed it to delivery already.
            self.tell_watchers(&approval);
            return Ok(approval);
        }
        if put.created {
            self.publish(&approval);
        }
        if approval.state != ApprovalState::Pending {
            return Ok(approval);
        }
        let verdict = self.policy.evaluate(&Subject::from(&approval));
        if let Some(decision) = verdict.decision() {
            tracing::info!(request_id = approval.id(), rule = %verdict.rule,
                decision = decision.kind.as_str(), "decided by policy");
            return match self.decide(approval.id(), decision).await {
                Ok(r) => Ok(r.approval),
                // Someone else decided first; their decision stands.
                Err(e) if e.code() == tonic::Code::FailedPrecondition => {
                    Ok(self.store.get(approval.id())?.unwrap_or(approval))
                }
                Err(e) => Err(e),
            };
        }
        if approval.request.deadline_ms > 0 {
            self.deadlines.notify_one();
        }
        Ok(approval)
    }

    /// Decides `request_id`, then publishes the decision to watchers and to delivery. The
    /// decisions asked for while others are being taken are taken together when those are done
    /// (in one transaction where the store has them), each answering its own outcome. The
    /// taking and publishing run as a task of their own, so they finish even when the caller
    /// goes away meanwhile (a client whose RPC is cut or runs out of time drops it): a decision
    /// committed and never published would wait for the next unrelated wake-up to be
    /// delivered. What is logged about a decision is logged in its caller's span (the
    /// approval's trace id).
    pub async fn decide(&self, request_id: &str, decision: NewDecision) -> Result<Resolved> {
        let this = self.clone();
        let item = (request_id.to_string(), decision, tracing::Span::current());
        self.decisions
            .push(item, move |batch| {
                let this = this.clone();
                async move { this.take_decisions(batch).await }
            })
            .await
    }

    /// Takes a batch of decisions and publishes those taken.
    async fn take_decisions(&self, batch: Vec<Decision>) -> Vec<Result<Resolved>> {
        let decisions = batch
            .iter()
            .map(|(id, decision, _)| (id.clone(), decision.clone()))
            .collect();
        let outcomes = match self.store.resolve_requests(decisions).await {
            Ok(outcomes) => outcomes,
            // Each alone, so that one which cannot be taken holds up no other.
            Err(e) => {
                tracing::debug!("decisions left to one at a time: {e}");
                let mut outcomes = Vec::with_capacity(batch.len());
                for (request_id, decision, span) in &batch {
                    let alone = vec![(request_id.clone(), decision.clone())];
                    let taken = self.store.resolve_requests(alone).instrument(span.clone());
                    outcomes.push(taken.await.and_then(|mut one| {
                        one.pop().unwrap_or_else(|| {
                            Err(Error::Storage("a decision was left unanswered".into()))
                        })
                    }));
                }
                outcomes
            }
        };
        for ((_, _, span), outcome) in batch.iter().zip(&outcomes) {
            if let Ok(resolved) = outcome
                && !resolved.duplicate
            {
                // A span of `span_to_trace` learns its trace id here, read with the decision.
                if let Some(traceparent) = &resolved.traceparent {
                    let trace_id = arbor_shared::trace::trace_id_of(traceparent);
                    span.record("trace_id", tracing::field::display(trace_id));
                }
                let _entered = span.enter();
                self.observe_decision(&resolved.approval);
                self.publish_traced(&resolved.approval, resolved.traceparent.clone());
            }
        }
        outcomes
    }

    /// The log span of one approval: its id and the trace id of the run that asked for it, so
    /// every line about it can be found next to the runner's events of the same trace.
    pub fn span(&self, request_id: &str) -> tracing::Span {
        let traceparent = self.store.trace(request_id).ok().flatten();
        span_of(request_id, traceparent.as_deref())
    }

    /// [`span`](Self::span) when the caller has the run's `traceparent` at hand (every runner
    /// event carries it), so the store is not read for it; empty: read it.
    pub fn span_in(&self, request_id: &str, traceparent: &str) -> tracing::Span {
        match traceparent.is_empty() {
            true => self.span(request_id),
            false => span_of(request_id, Some(traceparent)),
        }
    }

    fn observe_decision(&self, a: &Approval) {
        if let Some(d) = &a.decision {
            let waited_ms = d.decided_at_ms.saturating_sub(a.created_at_ms);
            self.metrics.observe_decision(d.source, d.kind, waited_ms);
            tracing::info!(
                request_id = a.id(),
                decision = d.kind.as_str(),
                source = crate::metrics::source_label(d.source),
                waited_ms,
                "approval decided"
            );
        }
    }

    /// A person's decision: nobody may decide on a run they submitted, unless authentication
    /// is off (then everyone is `anonymous` and there is nobody to tell apart). The store
    /// checks that in the decision's transaction.
    pub async fn decide_as(
        &self,
        principal: &Principal,
        auth_enabled: bool,
        request_id: &str,
        decision: NewDecision,
    ) -> Result<Resolved> {
        let decision = NewDecision {
            decided_by: principal.name.clone(),
            not_by_submitter: auth_enabled,
            ..decision
        };
        self.decide(request_id, decision).await
    }

    /// The deadline passed. `None` when it was decided or withdrawn in the meantime.
    pub async fn expire(&self, request_id: &str) -> Result<Option<Approval>> {
        match self.store.expire(request_id).await {
            Ok(a) => {
                tracing::info!(request_id, "approval expired; resolved by its on_timeout");
                self.observe_decision(&a);
                self.publish(&a);
                Ok(Some(a))
            }
            Err(Error::InvalidTransition { .. } | Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// SUSPENSION_WITHDRAWN, or a runner that refused a delivery as stale.
    pub async fn withdraw(&self, request_id: &str, actor: &str, reason: &str) -> Result<()> {
        self.record_marks_of(|id, _| id == request_id).await?;
        match self.store.cancel(request_id, actor, reason).await {
            Ok(a) => {
                tracing::info!(request_id, reason, "approval cancelled");
                self.publish(&a);
                Ok(())
            }
            // Unknown, or already consumed, pruned or cancelled: nothing left to withdraw.
            Err(Error::InvalidTransition { .. } | Error::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// RUN_CANCELLED / RUN_SUPERSEDED: the run will never consume anything again.
    pub async fn withdraw_run(&self, run_id: &str, actor: &str, reason: &str) -> Result<()> {
        self.record_marks_of(|_, m| m.run_id == run_id).await?;
        for a in self.store.cancel_run(run_id, actor, reason).await? {
            tracing::info!(
                request_id = a.id(),
                run_id,
                reason,
                "approval cancelled with its run"
            );
            self.publish(&a);
        }
        Ok(())
    }

    /// APPROVAL_CONSUMED: ack the result, then prune it. Safe to repeat: a replayed event finds
    /// the approval already ACKED or PRUNED and finishes whatever is left.
    pub async fn consumed(&self, request_id: &str, decision_id: &str) -> Result<()> {
        let Some(a) = self.store.get(request_id)? else {
            tracing::debug!(
                request_id,
                "consumption of an approval this service never saw"
            );
            return Ok(());
        };
        let holds = a
            .decision
            .as_ref()
            .is_some_and(|d| d.decision_id == decision_id);
        if !holds {
            // Someone with the runner's `service` role decided it there directly: the request
            // is closed, so whatever this service holds for it can never be delivered.
            tracing::warn!(request_id, decision_id, state = %a.state,
                "runner consumed a decision this service did not take; approval cancelled");
            let reason = format!(
                "the runner consumed decision '{}', which was not taken here",
                arbor_shared::status::clip(decision_id)
            );
            return self.withdraw(request_id, "runner", &reason).await;
        }
        if a.state.awaits_delivery() {
            // The run consumed the decision, so the runner has it: its delivery is recorded
            // with the consumption, as in `consumed_all`.
            let consumption = Consumed {
                delivered: true,
                ..Consumed::new(request_id, decision_id)
            };
            let (acked, pruned) = self.store.ack_and_prune(consumption).await?;
            self.marks.forget(request_id, decision_id);
            self.publish(&acked);
            self.publish(&pruned);
            return Ok(());
        }
        match self.store.prune_result(request_id).await {
            Ok(pruned) => self.publish(&pruned),
            Err(Error::InvalidTransition { .. }) => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// APPROVAL_CONSUMED for each of `consumed` (request id, decision id), together (in one
    /// transaction where the store has them); answers which were done. The store does the plain
    /// ones (the approval holds that decision and awaits its consumption: the common case),
    /// each with its delivery if that is not recorded yet (the run consumed the decision, so
    /// the runner has it; see [`accepted`](Self::accepted)); the others, and all of them should
    /// the batch fail, are left for [`consumed`](Self::consumed), which handles every case.
    pub async fn consumed_all(&self, consumed: &[(String, String)]) -> Result<Vec<bool>> {
        let mut done = vec![false; consumed.len()];
        let batch = consumed
            .iter()
            .map(|(request_id, decision_id)| Consumed {
                delivered: true,
                ..Consumed::new(request_id, decision_id)
            })
            .collect();
        match self.store.ack_and_prune_all(batch).await {
            Ok(outcomes) => {
                for ((done, outcome), (request_id, decision_id)) in
                    done.iter_mut().zip(outcomes).zip(consumed)
                {
                    if let Ok((acked, pruned)) = outcome {
                        self.marks.forget(request_id, decision_id);
                        self.publish(&acked);
                        self.publish(&pruned);
                        *done = true;
                    }
                }
            }
            Err(e) => tracing::debug!("consumptions left to one at a time: {e}"),
        }
        Ok(done)
    }

    /// The runner accepted `approval`'s decision `decision_id` (it is durable in the run's
    /// inbox). That is recorded (its `delivered_at_ms` and DELIVERED audit entry) with the
    /// decision's consumption, in the same write, or on its own by
    /// [`record_marks`](Self::record_marks) once it has waited [`MARK_WAIT`], or before the
    /// approval is cancelled. Delivery does not send it again meanwhile (see
    /// [`is_accepted`](Self::is_accepted)); should this process stop before it is recorded,
    /// the decision is sent again and the runner answers it as a duplicate.
    pub fn accepted(&self, approval: &Approval, decision_id: &str) {
        let mark = Mark {
            decision_id: decision_id.to_string(),
            run_id: approval.request.run_id.clone(),
            at: Instant::now(),
        };
        self.marks.lock().insert(approval.id().to_string(), mark);
        self.marks.added.notify_one();
    }

    /// Whether the runner accepted `decision_id` of `request_id` and that waits to be recorded.
    pub fn is_accepted(&self, request_id: &str, decision_id: &str) -> bool {
        self.marks.holds(request_id, decision_id)
    }

    /// Records each acceptance that has waited [`MARK_WAIT`] without its consumption, until
    /// `stop`; then records every one left.
    pub async fn record_marks(&self, stop: CancellationToken) {
        loop {
            let added = self.marks.added.notified();
            let oldest = self.marks.lock().values().map(|m| m.at).min();
            let due = tokio::select! {
                _ = stop.cancelled() => break,
                _ = added, if oldest.is_none() => continue,
                _ = tokio::time::sleep_until(oldest.unwrap_or_else(Instant::now) + MARK_WAIT),
                    if oldest.is_some() => Instant::now(),
            };
            if let Err(e) = self.record_marks_of(|_, m| m.at + MARK_WAIT <= due).await {
                tracing::warn!(error = %e, "cannot record deliveries; will retry");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(MARK_WAIT) => {}
                }
            }
        }
        if let Err(e) = self.record_marks_of(|_, _| true).await {
            tracing::warn!(error = %e, "deliveries left unrecorded; they will be sent again");
        }
    }

    /// Records now the waiting acceptances `which` picks (by request id and mark).
    async fn record_marks_of(&self, which: impl Fn(&str, &Mark) -> bool) -> Result<()> {
        let due: Vec<(String, String)> = self
            .marks
            .lock()
            .iter()
            .filter(|(id, m)| which(id, m))
            .map(|(id, m)| (id.clone(), m.decision_id.clone()))
            .collect();
        let recorded = futures_util::future::join_all(due.iter().map(|(id, d)| async move {
            self.record_delivery(id, d, DeliveryOutcome::Accepted)
                .await
                .map(|()| self.marks.forget(id, d))
        }))
        .await;
        recorded.into_iter().collect()
    }

    /// Counts a delivery attempt; an accepted one stops further attempts. The attempts that
    /// finish while others are being recorded are recorded together when those are done (in one
    /// transaction where the store has them); the writing runs as a task of its own, so it
    /// finishes even when its caller goes away.
    pub async fn record_delivery(
        &self,
        request_id: &str,
        decision_id: &str,
        outcome: DeliveryOutcome,
    ) -> Result<()> {
        let store = self.store.clone();
        let item = (request_id.to_string(), decision_id.to_string(), outcome);
        let recorded = self
            .attempts
            .push(item, move |batch| {
                let store = store.clone();
                async move { record_attempts(&*store, batch).await }
            })
            .await?;
        if let Some(a) = recorded {
            // Without re-waking delivery: a failed attempt is retried on its own backoff.
            self.tell_watchers(&a);
        }
        Ok(())
    }
}

/// Records a batch of delivery attempts.
async fn record_attempts<S: ApprovalStore>(
    store: &S,
    attempts: Vec<Attempt>,
) -> Vec<Result<Option<Approval>>> {
    match store.record_deliveries(attempts.clone()).await {
        Ok(recorded) => recorded,
        // Each alone, so that one which cannot be recorded holds up no other.
        Err(e) => {
            tracing::debug!("delivery attempts left to one at a time: {e}");
            let mut recorded = Vec::with_capacity(attempts.len());
            for (request_id, decision_id, outcome) in attempts {
                recorded.push(
                    store
                        .record_delivery(&request_id, &decision_id, outcome)
                        .await,
                );
            }
            recorded
        }
    }
}

/// Runs `work` as a task of its own, in the caller's span, so that it finishes even when the
/// caller goes away meanwhile; `what` names it should the task fail.
async fn to_the_end<T: Send + 'static>(
    what: &str,
    work: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    tokio::spawn(work.in_current_span())
        .await
        .map_err(|e| match e.is_cancelled() {
            true => Error::ShuttingDown,
            false => Error::Storage(format!("{what} stopped: {e}")),
        })?
}

/// A delivery attempt to record: request id, decision id, outcome.
type Attempt = (String, String, DeliveryOutcome);

/// A decision to take: request id, decision, and the span of the caller who asked for it.
type Decision = (String, NewDecision, tracing::Span);

/// Work that callers wait on and that one task writes, batch after batch: what is queued while
/// a batch is being written goes in the next one (a group commit), each item answered alone.
struct Queue<I, O> {
    waiting: std::sync::Mutex<Waiting<I, O>>,
}

type Answer<O> = oneshot::Sender<Result<O>>;

struct Waiting<I, O> {
    items: Vec<(I, Answer<O>)>,
    /// A task is writing: it takes whatever is queued before it stops.
    writing: bool,
}

impl<I, O> Default for Queue<I, O> {
    fn default() -> Self {
        Self {
            waiting: std::sync::Mutex::new(Waiting {
                items: Vec::new(),
                writing: false,
            }),
        }
    }
}

impl<I: Send + 'static, O: Send + 'static> Queue<I, O> {
    /// Queues `item` and waits for its outcome. When no task is writing, one is started that
    /// hands batch after batch to `write`, which answers each item's outcome in order; it runs
    /// on its own (in no caller's span: it writes for them all), so an item is written even
    /// when its caller goes away. Should `write` panic, its batch is answered with an error
    /// and the task goes on; only a runtime shutting down ends it before it answers.
    async fn push<W, F>(self: &Arc<Self>, item: I, write: W) -> Result<O>
    where
        W: Fn(Vec<I>) -> F + Send + 'static,
        F: std::future::Future<Output = Vec<Result<O>>> + Send + 'static,
    {
        let (done, answer) = oneshot::channel();
        let first = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            waiting.items.push((item, done));
            !std::mem::replace(&mut waiting.writing, true)
        };
        if first {
            let queue = self.clone();
            tokio::spawn(async move { queue.write_all(write).await });
        }
        answer.await.map_err(|_| Error::ShuttingDown)?
    }

    async fn write_all<W, F>(&self, write: W)
    where
        W: Fn(Vec<I>) -> F,
        F: std::future::Future<Output = Vec<Result<O>>>,
    {
        loop {
            let batch = {
                let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
                if waiting.items.is_empty() {
                    waiting.writing = false;
                    return;
                }
                std::mem::take(&mut waiting.items)
            };
            let (items, answers): (Vec<I>, Vec<Answer<O>>) = batch.into_iter().unzip();
            let written = AssertUnwindSafe(write(items)).catch_unwind().await;
            match written {
                Ok(outcomes) => {
                    for (answer, outcome) in answers.into_iter().zip(outcomes) {
                        let _ = answer.send(outcome);
                    }
                }
                Err(_) => {
                    for answer in answers {
                        let _ = answer.send(Err(Error::Storage("the write panicked".into())));
                    }
                }
            }
        }
    }
}

/// The log span of one approval about to be decided: [`decide`](Approvals::decide) fills in
/// the trace id, from the trace it reads with the decision, before it logs anything in it.
pub fn span_to_trace(request_id: &str) -> tracing::Span {
    tracing::info_span!("approval", request_id, trace_id = tracing::field::Empty)
}

/// The log span of one approval in the trace `traceparent` names (none: no trace id), for a
/// caller that has read the trace already.
pub fn span_of(request_id: &str, traceparent: Option<&str>) -> tracing::Span {
    let trace_id = traceparent
        .map(arbor_shared::trace::trace_id_of)
        .unwrap_or_default();
    tracing::info_span!("approval", request_id, trace_id = %trace_id)
}
