//! Delivery: sends every stored decision the runner has not accepted yet to
//! `RunnerService.Resolve`, with the decision id fixed at decision time so retries are
//! idempotent, until the runner says OK (durable in the run's inbox) or says the request is dead.
//! Sleeps until woken by a new decision or the next retry is due; never polls.

use std::collections::{HashMap, HashSet, VecDeque};

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
    /// never holds up the decisions behind it. The store is scanned when woken or when a retry
    /// is due, and only once the backlog of the last scan has been started: with a large backlog
    /// (a drain of thousands of decisions) each decision costs one scan entry, not one scan.
    pub async fn run(self) {
        use futures_util::StreamExt;
        let this = &self;
        let wake = self.approvals.delivery_wake();
        let mut retries: HashMap<String, Retry> = HashMap::new();
        let mut in_flight: HashSet<String> = HashSet::new();
        let mut backlog: VecDeque<(Approval, Option<String>)> = VecDeque::new();
        let mut running = futures_util::stream::FuturesUnordered::new();
        let mut next: Option<Instant> = None;
        let mut scan = true;
        loop {
            // Registered before reading the store, so a decision stored meanwhile still wakes us.
            let woken = wake.notified();
            if scan && backlog.is_empty() {
                scan = false;
                next = match self.approvals.store().undelivered_traced() {
                    Ok(due) => {
                        retries.retain(|id, _| {
                            in_flight.contains(id) || due.iter().any(|(a, _)| a.id() == id)
                        });
                        let now = Instant::now();
                        let mut next: Option<Instant> = None;
                        for (approval, trace) in due {
                            match retries.get(approval.id()) {
                                _ if in_flight.contains(approval.id()) => {}
                                Some(r) if r.at > now => {
                                    next = Some(next.map_or(r.at, |n| n.min(r.at)));
                                }
                                _ => backlog.push_back((approval, trace)),
                            }
                        }
                        next
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read undelivered decisions");
                        Some(Instant::now() + self.tuning.delivery_max)
                    }
                };
            }
            while in_flight.len() < DELIVERIES_IN_FLIGHT {
                let Some((approval, trace)) = backlog.pop_front() else {
                    break;
                };
                if !in_flight.insert(approval.id().to_string()) {
                    continue;
                }
                running.push(async move {
                    // Read with the outbox: the span's trace id and the context the Resolve
                    // carries on.
                    let span = crate::approvals::span_of(approval.id(), trace.as_deref());
                    let outcome = this
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
                _ = woken => scan = true,
                _ = sleep_until(next) => {
                    scan = true;
                    next = None;
                }
                Some((id, outcome)) = running.next(), if !running.is_empty() => {
                    in_flight.remove(&id);
                    let retry_at = self.settle_attempt(id, outcome, &mut retries);
                    next = match (next, retry_at) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
            }
        }
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
                self.approvals
                    .record_delivery(request_id, decision_id, DeliveryOutcome::Accepted)
                    .await?;
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

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending::<()>().await,
    }
}
