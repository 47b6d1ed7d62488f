//! Delivery: sends every stored decision the runner has not accepted yet to
//! `RunnerService.Resolve`, with the decision id fixed at decision time so retries are
//! idempotent, until the runner says OK (durable in the run's inbox) or says the request is dead.
//! Sleeps until woken by a new decision or the next retry is due; never polls.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Mutex, PoisonError},
};

use arbor_shared::trace::TraceContext;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tracing::Instrument;

use super::{RunnerClient, backoff::Backoff};
use crate::{
    approvals::Approvals,
    config::Tuning,
    convert::runner_resolve,
    error::Error,
    metrics::Metrics,
    model::Approval,
    store::{ApprovalStore, DeliveryOutcome},
};

/// Who the audit trail names when the runner refuses a delivery.
const ACTOR: &str = "runner";

/// Resolve calls to the runner in flight at once.
const DELIVERIES_IN_FLIGHT: usize = 64;

/// Approvals named to delivery and not taken yet beyond which it is told to look at everything
/// instead: nobody takes them while another replica leads.
const MAX_NAMED: usize = 1024;

/// How delivery learns what to deliver: the approvals whose decision a change may have left
/// waiting, handed over as just written (a decision taken in this process, with the
/// `traceparent` it carries on) or by id, or "everything" (changes may have been missed).
/// Handed approvals are sent without being read back; named ones are read by id, in one
/// statement on PostgreSQL; the whole outbox is read only at start, when a retry is due and
/// when told to look at everything.
#[derive(Default)]
pub struct DeliveryWake {
    notify: tokio::sync::Notify,
    due: Mutex<Due>,
}

/// What delivery has been told to look at since it last looked.
#[derive(Debug, Default, PartialEq)]
pub struct Due {
    /// Each id once, in the order named.
    pub ids: Vec<String>,
    /// Approvals whose decision awaits delivery, as written, each with its `traceparent`;
    /// each once, in the order handed.
    pub handed: Vec<(Approval, Option<String>)>,
    pub everything: bool,
}

impl DeliveryWake {
    /// The decisions of `ids` may be waiting to be delivered.
    pub fn named<I: Into<String>>(&self, ids: impl IntoIterator<Item = I>) {
        {
            let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
            if !due.everything {
                for id in ids {
                    let id = id.into();
                    if !due.ids.contains(&id) {
                        due.ids.push(id);
                    }
                }
                due.overflow();
            }
        }
        self.notify.notify_one();
    }

    /// `approval`'s decision, just written here, awaits delivery (the caller has checked that
    /// it does), which sends it as it is, continuing the trace `traceparent` (`None`: the
    /// request has none).
    pub fn handed(&self, approval: Approval, traceparent: Option<String>) {
        {
            let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
            if !due.everything && !due.handed.iter().any(|(a, _)| a.id() == approval.id()) {
                due.handed.push((approval, traceparent));
                due.overflow();
            }
        }
        self.notify.notify_one();
    }

    /// Any decision may be waiting: delivery reads the whole outbox.
    pub fn everything(&self) {
        *self.due.lock().unwrap_or_else(PoisonError::into_inner) = Due::everything();
        self.notify.notify_one();
    }

    /// Resolves once something was named since the last [`take`](Self::take) (or is named
    /// after this call).
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// What was named since the last call, and forgets it.
    pub fn take(&self) -> Due {
        std::mem::take(&mut *self.due.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Due {
    fn everything() -> Self {
        Self {
            everything: true,
            ..Self::default()
        }
    }

    /// Beyond [`MAX_NAMED`] approvals named or handed, "everything" instead.
    fn overflow(&mut self) {
        if self.ids.len() + self.handed.len() > MAX_NAMED {
            *self = Self::everything();
        }
    }
}

pub struct Delivery<S> {
    pub approvals: Approvals<S>,
    pub client: RunnerClient,
    pub tuning: Tuning,
    pub shutdown: CancellationToken,
}

struct Retry {
    backoff: Backoff,
    at: Instant,
}

enum Attempt {
    Accepted {
        duplicate: bool,
    },
    /// NOT_FOUND / FAILED_PRECONDITION: the request is gone on the runner side.
    Refused(String),
    Failed(String),
}

impl<S: ApprovalStore> Delivery<S> {
    /// Delivers continuously: a new decision starts its delivery as soon as it is stored, while
    /// earlier ones are still in flight (up to [`DELIVERIES_IN_FLIGHT`]), so one slow round trip
    /// never holds up the decisions behind it. The decisions it is told of are read by id; the
    /// whole outbox is read at start, when a retry is due or when told to look at everything,
    /// and only once the backlog of the last such read has been started: with a large backlog
    /// (a drain of thousands of decisions) each decision costs one read of it, not one read of
    /// the outbox.
    pub async fn run(self) {
        // The deliveries the runner accepted are recorded while decisions are delivered, and
        // those left are recorded once delivery stops.
        tokio::join!(
            self.deliver_all(),
            self.approvals.record_marks(self.shutdown.clone())
        );
    }

    async fn deliver_all(&self) {
        use futures_util::StreamExt;
        let wake = self.approvals.delivery_wake();
        let mut retries: HashMap<String, Retry> = HashMap::new();
        // The approvals in the backlog or in flight: each is taken once until it is settled.
        let mut taken: HashSet<String> = HashSet::new();
        let mut backlog: VecDeque<(Approval, Option<String>)> = VecDeque::new();
        let mut running = futures_util::stream::FuturesUnordered::new();
        let mut next: Option<Instant> = None;
        let mut scan = true;
        loop {
            // Registered before taking what was named, so a decision named meanwhile still
            // wakes us.
            let woken = wake.notified();
            let due = wake.take();
            scan |= due.everything;
            // One already taken is on its way: its attempt settles it. One handed is not read.
            let handed: Vec<(Approval, Option<String>)> = due
                .handed
                .into_iter()
                .filter(|(a, _)| !taken.contains(a.id()))
                .collect();
            let named: Vec<String> = due
                .ids
                .into_iter()
                .filter(|id| !taken.contains(id) && !handed.iter().any(|(a, _)| a.id() == id))
                .collect();
            let store = self.approvals.store();
            if scan && backlog.is_empty() {
                scan = false;
                next = match store.undelivered_traced() {
                    Ok(found) => {
                        let found = self.not_accepted(found);
                        retries.retain(|id, _| {
                            taken.contains(id) || found.iter().any(|(a, _)| a.id() == id)
                        });
                        queue(found, &mut taken, &retries, &mut backlog)
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read undelivered decisions");
                        Some(Instant::now() + self.tuning.delivery_max)
                    }
                };
            } else {
                // Handed over as written: not read back (an outbox read above covers them).
                let handed = self.not_accepted(handed);
                next = earliest(next, queue(handed, &mut taken, &retries, &mut backlog));
                if !named.is_empty() {
                    match store.undelivered_of(&named) {
                        Ok(found) => {
                            let found = self.not_accepted(found);
                            let waits = queue(found, &mut taken, &retries, &mut backlog);
                            next = earliest(next, waits);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot read the decisions named to delivery");
                            scan = true;
                        }
                    }
                }
            }
            while running.len() < DELIVERIES_IN_FLIGHT {
                let Some((approval, trace)) = backlog.pop_front() else {
                    break;
                };
                running.push(async move {
                    // Read with the outbox, or handed over with the decision: the span's trace
                    // id and the context the Resolve carries on.
                    let span = crate::approvals::span_of(approval.id(), trace.as_deref());
                    let outcome = self
                        .deliver(&approval, trace.as_deref())
                        .instrument(span)
                        .await;
                    (approval.id().to_string(), outcome)
                });
            }
            if self.shutdown.is_cancelled() {
                return;
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = woken => {}
                _ = sleep_until(next) => {
                    scan = true;
                    next = None;
                }
                Some((id, outcome)) = running.next(), if !running.is_empty() => {
                    taken.remove(&id);
                    let retry_at = self.settle_attempt(id, outcome, &mut retries);
                    next = earliest(next, retry_at);
                }
            }
        }
    }

    /// Those of `found` whose decision the runner has not accepted yet: an accepted one whose
    /// record waits (see [`Approvals::accepted`]) is still in the outbox.
    fn not_accepted(
        &self,
        found: Vec<(Approval, Option<String>)>,
    ) -> Vec<(Approval, Option<String>)> {
        let accepted = |a: &Approval| {
            a.decision
                .as_ref()
                .is_some_and(|d| self.approvals.is_accepted(a.id(), &d.decision_id))
        };
        found.into_iter().filter(|(a, _)| !accepted(a)).collect()
    }

    /// Books one finished delivery; returns when it should be tried again, if it should.
    fn settle_attempt(
        &self,
        id: String,
        outcome: Result<bool, Error>,
        retries: &mut HashMap<String, Retry>,
    ) -> Option<Instant> {
        match outcome {
            Ok(true) => {
                retries.remove(&id);
                None
            }
            Ok(false) => {
                let tuning = &self.tuning;
                let r = retries.entry(id).or_insert_with(|| Retry {
                    backoff: Backoff::new(tuning.delivery_min, tuning.delivery_max),
                    at: Instant::now(),
                });
                r.at = Instant::now() + r.backoff.next_delay();
                Some(r.at)
            }
            Err(e) => {
                tracing::error!(request_id = %id, error = %e, "delivery bookkeeping failed");
                Some(Instant::now() + self.tuning.delivery_max)
            }
        }
    }

    async fn deliver(&self, approval: &Approval, trace: Option<&str>) -> Result<bool, Error> {
        let Some(decision) = &approval.decision else {
            return Ok(true);
        };
        let (request_id, decision_id) = (approval.id(), decision.decision_id.as_str());
        let metrics = self.approvals.metrics();
        match self.attempt(approval, trace).await {
            Attempt::Accepted { duplicate } => {
                Metrics::inc(&metrics.deliveries_accepted);
                tracing::info!(request_id, decision_id, duplicate, "decision delivered");
                self.approvals.accepted(approval, decision_id);
                Ok(true)
            }
            Attempt::Refused(why) => {
                Metrics::inc(&metrics.deliveries_refused);
                tracing::warn!(request_id, decision_id, why = %why,
                    "runner refused the decision; the request is dead there");
                self.approvals
                    .record_delivery(
                        request_id,
                        decision_id,
                        DeliveryOutcome::Failed(why.clone()),
                    )
                    .await?;
                let reason = format!("runner refused the decision: {why}");
                self.approvals.withdraw(request_id, ACTOR, &reason).await?;
                Ok(true)
            }
            Attempt::Failed(why) => {
                let n = Metrics::inc(&metrics.delivery_failures);
                tracing::warn!(request_id, decision_id, why = %why, failures_total = n,
                    "delivery failed; will retry");
                self.approvals
                    .record_delivery(request_id, decision_id, DeliveryOutcome::Failed(why))
                    .await?;
                Ok(false)
            }
        }
    }

    async fn attempt(&self, approval: &Approval, trace: Option<&str>) -> Attempt {
        let Some(decision) = &approval.decision else {
            return Attempt::Refused("no decision".into());
        };
        let mut request = tonic::Request::new(runner_resolve(approval, decision));
        request.set_timeout(self.tuning.rpc_timeout);
        // The runner continues the run's trace with the steps this decision causes.
        if let Some(ctx) = trace.and_then(TraceContext::parse) {
            ctx.child().inject(&mut request);
        }
        let mut client = self.client.clone();
        let call = tokio::select! {
            _ = self.shutdown.cancelled() => return Attempt::Failed("shutting down".into()),
            r = client.resolve(request) => r,
        };
        match call {
            Ok(resp) => Attempt::Accepted {
                duplicate: resp.into_inner().duplicate,
            },
            Err(s) if matches!(s.code(), Code::NotFound | Code::FailedPrecondition) => {
                Attempt::Refused(format!("{:?}: {}", s.code(), s.message()))
            }
            Err(s) => Attempt::Failed(format!("{:?}: {}", s.code(), s.message())),
        }
    }
}

/// Queues those of `found` that are not taken and whose retry is not waiting; answers when the
/// earliest waiting retry among them is due.
fn queue(
    found: Vec<(Approval, Option<String>)>,
    taken: &mut HashSet<String>,
    retries: &HashMap<String, Retry>,
    backlog: &mut VecDeque<(Approval, Option<String>)>,
) -> Option<Instant> {
    let now = Instant::now();
    let mut next: Option<Instant> = None;
    for (approval, trace) in found {
        if taken.contains(approval.id()) {
            continue;
        }
        match retries.get(approval.id()) {
            Some(r) if r.at > now => next = earliest(next, Some(r.at)),
            _ => {
                taken.insert(approval.id().to_string());
                backlog.push_back((approval, trace));
            }
        }
    }
    next
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending::<()>().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_named_approval_is_told_once_until_taken() {
        let wake = DeliveryWake::default();
        wake.named(["a", "b"]);
        wake.named(["b", "c"]);
        let due = wake.take();
        assert_eq!(due.ids, ["a", "b", "c"]);
        assert!(!due.everything);
        assert_eq!(wake.take(), Due::default(), "taking forgets");
    }

    #[test]
    fn too_many_names_become_everything_and_hold_no_memory() {
        let wake = DeliveryWake::default();
        wake.named((0..=MAX_NAMED).map(|i| i.to_string()));
        wake.named(["late"]);
        assert_eq!(wake.take(), Due::everything());
        wake.named(["x"]);
        wake.everything();
        wake.named(["y"]);
        assert!(
            wake.take().everything,
            "everything covers what is named after it"
        );
    }

    fn approval(id: &str) -> Approval {
        let (request, _) = crate::convert::request_from_event(
            &arbor_shared::proto::runner::v1::ApprovalRequested {
                request_id: id.into(),
                run_id: "run".into(),
                ..Default::default()
            },
        )
        .unwrap();
        Approval {
            request,
            unknown_kind: None,
            state: crate::lifecycle::ApprovalState::Resolved,
            decision: None,
            created_at_ms: 0,
            arrival: 0,
            updated_at_ms: 0,
            version: 0,
            delivery_attempts: 0,
            last_delivery_error: String::new(),
            delivered_at_ms: 0,
            cancel_reason: String::new(),
        }
    }

    #[test]
    fn each_handed_approval_is_kept_once_with_its_trace_and_counts_toward_everything() {
        let wake = DeliveryWake::default();
        wake.handed(approval("a"), Some("00-trace-a".into()));
        wake.handed(approval("a"), None);
        wake.handed(approval("b"), None);
        wake.named(["c"]);
        let due = wake.take();
        assert_eq!(
            due.handed,
            [
                (approval("a"), Some("00-trace-a".to_string())),
                (approval("b"), None)
            ]
        );
        assert_eq!(due.ids, ["c"]);
        assert_eq!(wake.take(), Due::default(), "taking forgets");

        wake.named((0..MAX_NAMED).map(|i| i.to_string()));
        wake.handed(approval("last straw"), None);
        assert_eq!(
            wake.take(),
            Due::everything(),
            "more than {MAX_NAMED} in all"
        );
        wake.everything();
        wake.handed(approval("after"), None);
        assert_eq!(
            wake.take(),
            Due::everything(),
            "everything covers what is handed after it"
        );
    }
}
