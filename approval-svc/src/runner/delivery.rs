//! Delivery: sends every stored decision the runner has not accepted yet to
//! `RunnerService.Resolve`, with the decision id fixed at decision time so retries are
//! idempotent, until the runner says OK (durable in the run's inbox) or says the request is dead.
//! Sleeps until woken by a new decision or the next retry is due; never polls.
//!
//! A failure that concerns one decision (the runner answered, but not OK) is retried on that
//! decision's own backoff. A failure that says nothing about the decision (the runner is
//! unreachable, does not answer in time, sheds load or refuses this service) pauses the whole
//! backlog: one decision at a time probes the runner on a backoff capped at `delivery_max`, or at
//! once when the event subscription reaches the runner again, and the first attempt the runner
//! answers resumes the full drain. A runner that is away for hours then costs one attempt per
//! `delivery_max`, not one per decision, and the same failure is logged once a minute with a
//! count.

use std::{collections::HashSet, time::Duration};

use arbor_shared::trace::TraceContext;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tracing::Instrument;

use super::{
    RunnerClient,
    backoff::Backoff,
    book::{Away, Book, Item},
};
pub use crate::outbox::{DeliveryWake, Due};
use crate::{
    approvals::Approvals,
    config::Tuning,
    convert::runner_resolve,
    error::Error,
    metrics::Metrics,
    model::Approval,
    ratelog::RateLimitedLog,
    store::{ApprovalStore, DeliveryOutcome},
};

/// Who the audit trail names when the runner refuses a delivery.
const ACTOR: &str = "runner";

/// Resolve calls to the runner in flight at once.
const DELIVERIES_IN_FLIGHT: usize = 64;

/// How often the same delivery failure is logged at most; the others are counted in the next
/// line.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

pub struct Delivery<S> {
    pub approvals: Approvals<S>,
    pub client: RunnerClient,
    pub tuning: Tuning,
    pub shutdown: CancellationToken,
}

enum Attempt {
    Accepted {
        duplicate: bool,
    },
    /// NOT_FOUND / FAILED_PRECONDITION: the request is gone on the runner side.
    Refused(String),
    /// The runner answered, but did not take this decision.
    Failed(String),
    /// Nothing was learnt about this decision: the runner is unreachable or refuses every one.
    Unreachable(String),
}

/// What one delivery came to.
enum Outcome {
    /// Accepted, or refused for good: nothing more to send.
    Settled,
    /// To be tried again on the decision's own backoff.
    Retry,
    /// Back to the backlog, which waits for a probe to get through.
    Unreachable,
}

impl<S: ApprovalStore> Delivery<S> {
    /// Delivers continuously: a new decision starts its delivery as soon as it is stored, while
    /// earlier ones are still in flight (up to [`DELIVERIES_IN_FLIGHT`]), so one slow round trip
    /// never holds up the decisions behind it. The decisions it is told of, and those whose
    /// retry is due, are read by id; the whole outbox is read at start and when told to look at
    /// everything, and only once the backlog of the last such read has been started: with a
    /// large backlog (a drain of thousands of decisions) each decision costs one read of it,
    /// not one read of the outbox.
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
        let log = RateLimitedLog::new(FAILURE_LOG_EVERY);
        let mut book = Book::default();
        let mut running = futures_util::stream::FuturesUnordered::new();
        let mut scan = true;
        // When the outbox is read again after a read or a bookkeeping write failed.
        let mut rescan_at: Option<Instant> = None;
        loop {
            // Registered before taking what was named, so a decision named meanwhile still
            // wakes us.
            let woken = wake.notified();
            let due = wake.take();
            scan |= due.everything;
            if wake.take_runner_back()
                && let Some(away) = &mut book.away
            {
                away.probe_now();
            }
            let store = self.approvals.store();
            if scan && book.backlog.is_empty() {
                scan = false;
                match store.undelivered_traced() {
                    Ok(found) => {
                        let found = self.not_accepted(found);
                        book.keep_only(&found);
                        book.queue(found);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read undelivered decisions");
                        rescan_at = Some(Instant::now() + self.tuning.delivery_max);
                    }
                }
            } else {
                // One already taken is on its way: its attempt settles it. One handed is not
                // read back (an outbox read above covers them).
                let handed: Vec<Item> = due
                    .handed
                    .into_iter()
                    .filter(|(a, _)| !book.taken.contains(a.id()))
                    .collect();
                let named: Vec<String> = due
                    .ids
                    .into_iter()
                    .filter(|id| {
                        !book.taken.contains(id) && !handed.iter().any(|(a, _)| a.id() == id)
                    })
                    .collect();
                book.queue(self.not_accepted(handed));
                if !named.is_empty() {
                    match store.undelivered_of(&named) {
                        Ok(found) => book.queue(self.not_accepted(found)),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot read the decisions named to delivery");
                            scan = true;
                        }
                    }
                }
            }
            // Retries wait while the runner is away: a probe getting through lets them go.
            if book.away.is_none() {
                let retries = book.due_retries(Instant::now());
                if !retries.is_empty() {
                    match store.undelivered_of(&retries) {
                        Ok(found) => {
                            let found = self.not_accepted(found);
                            let still: HashSet<&str> = found.iter().map(|(a, _)| a.id()).collect();
                            for id in retries.iter().filter(|id| !still.contains(id.as_str())) {
                                book.backoffs.remove(id);
                            }
                            book.queue(found);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot read the decisions due for a retry");
                            scan = true;
                        }
                    }
                }
            }
            let mut starting = Vec::new();
            match &mut book.away {
                None => {
                    while running.len() + starting.len() < DELIVERIES_IN_FLIGHT {
                        let Some(item) = book.backlog.pop_front() else {
                            break;
                        };
                        starting.push(item);
                    }
                }
                Some(away) if away.probe.is_none() && away.probe_at <= Instant::now() => {
                    if let Some(item) = book.backlog.pop_front() {
                        away.probe = Some(item.0.id().to_string());
                        starting.push(item);
                    }
                }
                Some(_) => {}
            }
            for item in starting {
                running.push(self.send(item, &log));
            }
            self.report(&book);
            if self.shutdown.is_cancelled() {
                break;
            }
            let timer = match &book.away {
                None => book.next_retry(),
                Some(away) if away.probe.is_none() && !book.backlog.is_empty() => {
                    Some(away.probe_at)
                }
                Some(_) => None,
            };
            tokio::select! {
                _ = self.shutdown.cancelled() => break,
                _ = woken => {}
                _ = sleep_until(earliest(timer, rescan_at)) => {
                    if rescan_at.is_some_and(|at| at <= Instant::now()) {
                        rescan_at = None;
                        scan = true;
                    }
                }
                Some((item, outcome)) = running.next(), if !running.is_empty() => {
                    if let Some(at) = self.settle_attempt(&mut book, item, outcome) {
                        rescan_at = earliest(rescan_at, Some(at));
                    }
                }
            }
        }
        // Another replica (or the next start) delivers from here.
        let metrics = self.approvals.metrics();
        Metrics::set(&metrics.delivery_backlog, 0);
        Metrics::set(&metrics.delivery_paused, 0);
    }

    /// One delivery, in the approval's trace span (read with the outbox, or handed over with
    /// the decision): the span's trace id and the context the Resolve carries on.
    async fn send(&self, item: Item, log: &RateLimitedLog) -> (Item, Result<Outcome, Error>) {
        let (approval, trace) = &item;
        let span = crate::approvals::span_of(approval.id(), trace.as_deref());
        let outcome = self
            .deliver(approval, trace.as_deref(), log)
            .instrument(span)
            .await;
        (item, outcome)
    }

    fn report(&self, book: &Book) {
        let metrics = self.approvals.metrics();
        Metrics::set(&metrics.delivery_backlog, book.held() as u64);
        Metrics::set(&metrics.delivery_paused, u64::from(book.away.is_some()));
    }

    /// Those of `found` whose decision the runner has not accepted yet: an accepted one whose
    /// record waits (see [`Approvals::accepted`]) is still in the outbox.
    fn not_accepted(&self, found: Vec<Item>) -> Vec<Item> {
        let accepted = |a: &Approval| {
            a.decision
                .as_ref()
                .is_some_and(|d| self.approvals.is_accepted(a.id(), &d.decision_id))
        };
        found.into_iter().filter(|(a, _)| !accepted(a)).collect()
    }

    /// Books one finished delivery; answers when the outbox is to be read again, if it is.
    fn settle_attempt(
        &self,
        book: &mut Book,
        item: Item,
        outcome: Result<Outcome, Error>,
    ) -> Option<Instant> {
        let id = item.0.id().to_string();
        let tuning = &self.tuning;
        let probe = book
            .away
            .as_ref()
            .is_some_and(|a| a.probe.as_deref() == Some(id.as_str()));
        match outcome {
            Ok(Outcome::Unreachable) => {
                match &mut book.away {
                    // The probe goes to the back, so the next one is another decision: one the
                    // runner cannot take holds up no other.
                    Some(away) if probe => {
                        away.probe_failed();
                        book.backlog.push_back(item);
                    }
                    Some(_) => book.backlog.push_front(item),
                    None => {
                        let away =
                            Away::new(Backoff::new(tuning.delivery_min, tuning.delivery_max));
                        book.away = Some(away);
                        book.backlog.push_front(item);
                        tracing::warn!(
                            held = book.held(),
                            probe_at_most_every = ?tuning.delivery_max,
                            "the runner cannot be reached or refuses this service: delivery \
                             pauses and probes it with one decision at a time"
                        );
                    }
                }
                return None;
            }
            Ok(Outcome::Settled) => {
                book.taken.remove(&id);
                book.backoffs.remove(&id);
            }
            Ok(Outcome::Retry) => {
                let backoff = book
                    .backoffs
                    .entry(id.clone())
                    .or_insert_with(|| Backoff::new(tuning.delivery_min, tuning.delivery_max));
                let at = Instant::now() + backoff.next_delay();
                book.wait(id, at);
            }
            Err(e) => {
                tracing::error!(request_id = %id, error = %e, "delivery bookkeeping failed");
                book.taken.remove(&id);
                if let Some(away) = book.away.as_mut().filter(|_| probe) {
                    away.probe_failed();
                }
                return Some(Instant::now() + tuning.delivery_max);
            }
        }
        // The runner answered: the whole backlog goes again.
        if book.away.take().is_some() {
            tracing::info!(
                held = book.held(),
                "the runner answers again: delivery resumes"
            );
        }
        None
    }

    async fn deliver(
        &self,
        approval: &Approval,
        trace: Option<&str>,
        log: &RateLimitedLog,
    ) -> Result<Outcome, Error> {
        let Some(decision) = &approval.decision else {
            return Ok(Outcome::Settled);
        };
        let (request_id, decision_id) = (approval.id(), decision.decision_id.as_str());
        let metrics = self.approvals.metrics();
        let (why, outcome) = match self.attempt(approval, trace).await {
            Attempt::Accepted { duplicate } => {
                Metrics::inc(&metrics.deliveries_accepted);
                tracing::info!(request_id, decision_id, duplicate, "decision delivered");
                self.approvals.accepted(approval, decision_id);
                return Ok(Outcome::Settled);
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
                return Ok(Outcome::Settled);
            }
            Attempt::Failed(why) => (why, Outcome::Retry),
            Attempt::Unreachable(why) => (why, Outcome::Unreachable),
        };
        let n = Metrics::inc(&metrics.delivery_failures);
        if let Some(passed_over) = log.admit(&why) {
            match outcome {
                Outcome::Unreachable => tracing::warn!(request_id, decision_id, why = %why,
                    failures_total = n, same_failures_not_logged = passed_over,
                    "delivery failed: the runner cannot be reached or refuses this service; \
                     will retry"),
                _ => tracing::warn!(request_id, decision_id, why = %why, failures_total = n,
                    same_failures_not_logged = passed_over, "delivery failed; will retry"),
            }
        }
        self.approvals
            .record_delivery(request_id, decision_id, DeliveryOutcome::Failed(why))
            .await?;
        Ok(outcome)
    }

    async fn attempt(&self, approval: &Approval, trace: Option<&str>) -> Attempt {
        let Some(decision) = &approval.decision else {
            return Attempt::Refused("no decision".into());
        };
        let mut request = tonic::Request::new(runner_resolve(approval, decision));
        request.set_timeout(self.tuning.rpc_timeout);
        // The runner continues the run's trace with the steps this decision causes; while
        // spans are exported, from this attempt's `approval.deliver` span.
        let parent = trace.and_then(TraceContext::parse);
        let span = match arbor_shared::trace::exporting() {
            true => tracing::info_span!("approval.deliver", request_id = %approval.id(),
                decision_id = %decision.decision_id),
            false => tracing::Span::none(),
        };
        arbor_shared::trace::adopt(&span, parent.as_ref());
        if let Some(ctx) = TraceContext::of_span(&span).or_else(|| parent.map(|p| p.child())) {
            ctx.inject(&mut request);
        }
        let mut client = self.client.clone();
        let call = tokio::select! {
            _ = self.shutdown.cancelled() => return Attempt::Failed("shutting down".into()),
            r = client.resolve(request).instrument(span) => r,
        };
        match call {
            Ok(resp) => Attempt::Accepted {
                duplicate: resp.into_inner().duplicate,
            },
            Err(s) => {
                let why = format!("{:?}: {}", s.code(), s.message());
                match s.code() {
                    Code::NotFound | Code::FailedPrecondition => Attempt::Refused(why),
                    code if says_nothing_of_the_decision(code) => Attempt::Unreachable(why),
                    _ => Attempt::Failed(why),
                }
            }
        }
    }
}

/// A failure every decision would meet alike: the runner is unreachable or does not answer in
/// time (UNAVAILABLE, DEADLINE_EXCEEDED, a broken connection), sheds load, or refuses this
/// service's token.
fn says_nothing_of_the_decision(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Unauthenticated
            | Code::PermissionDenied
            | Code::Unimplemented
            | Code::Cancelled
            | Code::Unknown
    )
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
    fn only_failures_every_decision_would_meet_pause_the_backlog() {
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Unauthenticated,
        ] {
            assert!(says_nothing_of_the_decision(code), "{code:?}");
        }
        for code in [Code::Internal, Code::InvalidArgument, Code::Aborted] {
            assert!(!says_nothing_of_the_decision(code), "{code:?}");
        }
    }
}
