//! The one door every change to an approval goes through, whoever causes it (the runner's
//! events, a person, the policy, the deadline timer, the delivery task). After the store has
//! made a change durable this publishes it to watchers and wakes the task that acts next, so a
//! policy decision travels exactly the same path as a person's.

use std::{sync::Arc, time::Duration};

use arbor_shared::{
    auth::{Directory, Principal},
    domain::ApprovalRequest,
    trace::TraceContext,
};
use tokio::sync::{Notify, broadcast, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

mod delivery;
mod govern;
mod queue;

use self::queue::Queue;
use crate::{
    error::{Error, Result},
    leader::Replica,
    lifecycle::ApprovalState,
    metrics::Metrics,
    model::{Approval, NewDecision},
    outbox::{Attempt, DeliveryWake, Marks},
    policy::{Policy, Subject},
    store::{ApprovalStore, Plan, Put, Resolved},
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
    /// The principals and groups approval rules name (the tokens file).
    directory: Directory,
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
            directory: self.directory.clone(),
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
            directory: Directory::default(),
        }
    }

    /// The same, resolving approval rules' `user:`, `group:` and `role:` against `directory`.
    pub fn with_directory(mut self, directory: Directory) -> Self {
        self.directory = directory;
        self
    }

    /// The same, for the replica named `name` (see [`Replica`]); before any clone is made.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.replica = Arc::new(Replica::new(name));
        self
    }

    pub fn directory(&self) -> &Directory {
        &self.directory
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
        let mut puts = self
            .put_requests(vec![(request, unknown_kind, String::new())])
            .await?;
        self.store.flush().await?;
        let put = puts.pop().ok_or_else(|| {
            Error::Storage("the store answered no outcome for one request".into())
        })?;
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
        let (store, policy, delivery, directory) = (
            self.store.clone(),
            self.policy.clone(),
            self.delivery.clone(),
            self.directory.clone(),
        );
        to_the_end("storing the requests", async move {
            let decide = move |a: &Approval| plan(&policy, &directory, a);
            // A request decided as it is stored is a new one: its trace is the one stored with
            // it. The puts answer in the order of the requests.
            let traces: Vec<String> = requests.iter().map(|(_, _, t)| t.clone()).collect();
            let puts = store.put_and_decide_requests(requests, decide).await?;
            // The write is lazy (a request left to a person becomes durable with the next
            // flush, at the latest the one before the event cursor moves), but a decision is
            // never sent before it is durable: a crash would lose it after the run applied it.
            // One group flush covers every decision of the batch.
            if puts.iter().any(|p| p.decided) {
                store.flush().await?;
            }
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
        if approval.deadline_ms() > 0 {
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
        let decide_spans: Vec<tracing::Span> = batch.iter().map(decide_span).collect();
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
        for (((_, _, span), decide), outcome) in batch.iter().zip(decide_spans).zip(&outcomes) {
            if let Ok(resolved) = outcome
                && !resolved.duplicate
            {
                // A span of `span_to_trace` learns its trace id here, read with the decision.
                let stored = resolved
                    .traceparent
                    .as_deref()
                    .and_then(TraceContext::parse);
                if let Some(stored) = &stored {
                    span.record("trace_id", tracing::field::display(stored.trace_id()));
                }
                // The decision continues the approval's trace (from the span that stored it).
                arbor_shared::trace::adopt(&decide, stored.as_ref());
                let traceparent = TraceContext::of_span(&decide)
                    .map(|c| c.to_string())
                    .or_else(|| resolved.traceparent.clone());
                let _entered = span.enter();
                let _deciding = decide.enter();
                self.observe_decision(&resolved.approval);
                self.publish_traced(&resolved.approval, traceparent);
                if resolved.approval.state == ApprovalState::Pending {
                    // A vote that opened a stage has a new deadline to wait for.
                    self.deadlines.notify_one();
                }
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
            Ok(a) if a.state == ApprovalState::Pending => {
                tracing::info!(
                    request_id,
                    "a stage's deadline passed; the stage escalated or reminded"
                );
                self.publish(&a);
                self.deadlines.notify_one();
                Ok(Some(a))
            }
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
}

/// What the policy does with a new request: decides it (allow, deny), hands it to the stages
/// of the approval rule that matches it, or leaves it to any approver.
pub fn plan(policy: &Policy, directory: &Directory, a: &Approval) -> Plan {
    if let Some(d) = policy.evaluate(&Subject::from(a)).decision() {
        return Plan::Decide(d);
    }
    match policy.approval_rule(a) {
        Some(rule) => Plan::Govern(Box::new(crate::governance::quorum::start(
            rule,
            a.args_digest(),
            directory,
            &a.request.submitted_by,
            a.created_at_ms,
        ))),
        None => Plan::Leave,
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

/// A decision to take: request id, decision, and the span of the caller who asked for it.
type Decision = (String, NewDecision, tracing::Span);

/// While spans are exported, the `approval.decide` span of a decision about to be taken: made
/// before the write so that it covers it, and given its parent (the approval's stored trace) once
/// the write has read it; the caller's span (a Decide call's) is linked. None otherwise.
fn decide_span((request_id, _, caller): &Decision) -> tracing::Span {
    if !arbor_shared::trace::exporting() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(parent: caller, "approval.decide", request_id = %request_id);
    arbor_shared::trace::link(&span, TraceContext::of_span(caller).as_ref());
    span
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
