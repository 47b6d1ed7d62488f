//! The event subscription: follows the runner's durable event log as subscriber `approval-svc`,
//! applies each event to the store idempotently, and acknowledges the cursor only after the
//! store writes of every event up to it are durable. Reconnects with backoff and resumes from
//! the runner-side cursor, so a crash anywhere replays events rather than losing them.

use std::time::Duration;

use arbor_shared::domain::ApprovalRequest;
use arbor_shared::proto::runner::v1::{
    self as runner_pb, AckRequest, EventKind, StreamEventsRequest, event::Detail,
};
use futures_util::FutureExt;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};
use tonic_health::{ServingStatus, server::HealthReporter};
use tracing::Instrument;

use super::{RunnerClient, SUBSCRIBER_ID, backoff::Backoff};
use crate::{
    approvals::Approvals,
    config::Tuning,
    convert::request_from_event,
    error::Error,
    metrics::Metrics,
    ratelog::RateLimitedLog,
    store::{ApprovalStore, Put},
};

/// Health-check name that reports whether the event subscription is live. It is NOT_SERVING
/// while disconnected and after the runner compacted the log past our cursor.
pub const SUBSCRIPTION_HEALTH: &str = "arbor.approval.v1.RunnerSubscription";

/// Events applied together at most (more wait for the next batch).
const MAX_BATCH: usize = 512;

/// Who the audit trail names for cancellations the runner caused.
const ACTOR: &str = "runner";

/// The kinds of event this service applies (see `apply_batch` and `handle`); the runner streams
/// only these, so most of a run's events never cross the wire. The runner skips the others for
/// this subscriber, and the cursor acked after an event covers the skipped ones before it (a
/// replay after a crash skips them again).
const USED_KINDS: [EventKind; 7] = [
    EventKind::ApprovalRequested,
    EventKind::ApprovalConsumed,
    EventKind::SuspensionWithdrawn,
    EventKind::RunSucceeded,
    EventKind::RunFailed,
    EventKind::RunCancelled,
    EventKind::RunSuperseded,
];

enum SessionEnd {
    /// The runner ended the stream or was unreachable.
    Runner(Status),
    /// Our own store failed; the event was not applied and will be replayed.
    Store(Error),
    Shutdown,
}

pub struct Subscriber<S> {
    pub approvals: Approvals<S>,
    pub client: RunnerClient,
    pub tuning: Tuning,
    pub health: HealthReporter,
    pub shutdown: CancellationToken,
}

/// The processed-but-unacknowledged tail of the stream.
struct Cursor {
    processed: Option<u64>,
    acked: Option<u64>,
    since_ack: u32,
    /// When the oldest unacknowledged event was processed.
    dirty_since: Option<Instant>,
}

impl<S: ApprovalStore> Subscriber<S> {
    pub async fn run(mut self) {
        let mut backoff = Backoff::new(self.tuning.reconnect_min, self.tuning.reconnect_max);
        let mut cursor = Cursor {
            processed: None,
            acked: None,
            since_ack: 0,
            dirty_since: None,
        };
        // A runner that is down for an hour fails every reconnect alike: a line a minute.
        let failures = RateLimitedLog::new(Duration::from_secs(60));
        loop {
            let end = self.session(&mut cursor, &mut backoff).await;
            self.ack(&mut cursor).await;
            self.set_health(ServingStatus::NotServing).await;
            match end {
                SessionEnd::Shutdown => return,
                SessionEnd::Runner(status) if status.code() == Code::OutOfRange => {
                    let lost = Metrics::inc(&self.approvals.metrics().cursor_lost);
                    // Events between our cursor and the runner's oldest one are gone; approvals
                    // they carried exist only on the runner now. Never skip past that silently.
                    // After a restart only the locally remembered cursor is known.
                    let known = cursor
                        .acked
                        .or_else(|| self.approvals.store().cursor().ok().flatten());
                    tracing::error!(
                        cursor = ?known,
                        runner_message = status.message(),
                        cursor_lost_total = lost,
                        "EVENT CURSOR LOST: the runner compacted its event log past this \
                         subscriber's cursor; approvals may be missing. Retrying; an operator \
                         must reconcile (runner-svc ListRuns / suspensions)"
                    );
                }
                SessionEnd::Runner(status) => {
                    let kind = format!("{:?}: {}", status.code(), status.message());
                    if let Some(passed_over) = failures.admit(&kind) {
                        tracing::warn!(code = ?status.code(), message = status.message(),
                            same_failures_not_logged = passed_over,
                            "event stream from the runner ended; reconnecting");
                    }
                }
                SessionEnd::Store(e) => {
                    tracing::error!(error = %e, "could not apply an event; it will be replayed");
                }
            }
            Metrics::inc(&self.approvals.metrics().stream_reconnects);
            let delay = backoff.next_delay();
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    async fn set_health(&self, status: ServingStatus) {
        self.health
            .set_service_status(SUBSCRIPTION_HEALTH, status)
            .await;
    }

    async fn session(&mut self, cursor: &mut Cursor, backoff: &mut Backoff) -> SessionEnd {
        let request = StreamEventsRequest {
            subscriber_id: SUBSCRIBER_ID.into(),
            after_seq: None,
            filter: Some(runner_pb::EventFilter {
                kinds: USED_KINDS.iter().map(|k| *k as i32).collect(),
                ..Default::default()
            }),
            follow: true,
        };
        let opened = tokio::select! {
            _ = self.shutdown.cancelled() => return SessionEnd::Shutdown,
            r = self.client.stream_events(request) => r,
        };
        let mut stream = match opened {
            Ok(r) => r.into_inner(),
            Err(status) => return SessionEnd::Runner(status),
        };
        self.set_health(ServingStatus::Serving).await;
        tracing::info!(acked = ?cursor.acked, "following the runner's event log");
        // The runner is back: a delivery paused while it was away need not wait for its probe.
        self.approvals.delivery_wake().runner_back();
        loop {
            let ack_due = cursor.dirty_since.map(|t| t + self.tuning.ack_interval);
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return SessionEnd::Shutdown,
                _ = sleep_until(ack_due), if ack_due.is_some() => self.ack(cursor).await,
                message = stream.message() => match message {
                    Ok(Some(resp)) => {
                        // Take whatever else has already arrived, so one batch of events is
                        // applied together and their store writes share fsyncs. Polled once,
                        // never waited for: a zero `tokio::time::timeout` only elapses at the
                        // timer's next millisecond tick, which cost every batch ~1 ms.
                        let mut batch: Vec<runner_pb::Event> = resp.event.into_iter().collect();
                        let mut end = None;
                        while batch.len() < MAX_BATCH {
                            match stream.message().now_or_never() {
                                Some(Ok(Some(more))) => batch.extend(more.event),
                                Some(Ok(None)) => {
                                    end = Some(SessionEnd::Runner(Status::unavailable("stream closed")));
                                    break;
                                }
                                Some(Err(status)) => {
                                    end = Some(SessionEnd::Runner(status));
                                    break;
                                }
                                None => break,
                            }
                        }
                        if let Err(e) = self.apply_batch(cursor, batch).await {
                            return SessionEnd::Store(e);
                        }
                        backoff.reset();
                        if cursor.since_ack >= self.tuning.ack_every {
                            self.ack(cursor).await;
                        }
                        if let Some(end) = end {
                            return end;
                        }
                    }
                    Ok(None) => return SessionEnd::Runner(Status::unavailable("stream closed")),
                    Err(status) => return SessionEnd::Runner(status),
                },
            }
        }
    }

    /// Applies a batch of events; afterwards everything they changed is durable. Events of one
    /// run are applied in order (a request comes before its consumption or its run's cancel);
    /// different runs are applied concurrently, so their store writes share group commits.
    async fn apply_batch(
        &self,
        cursor: &mut Cursor,
        batch: Vec<runner_pb::Event>,
    ) -> Result<(), Error> {
        let mut last = cursor.processed;
        let mut by_run: Vec<(String, Vec<runner_pb::Event>)> = Vec::new();
        let mut index: std::collections::HashMap<String, usize> = Default::default();
        for event in batch {
            // Seqs skip the kinds this service does not ask for (`USED_KINDS`); the runner
            // keeps its log gap-free and says so when our cursor fell behind its compaction.
            if last.is_some_and(|done| event.seq <= done) {
                continue; // replayed after a reconnect; already applied
            }
            last = Some(event.seq);
            let slot = *index.entry(event.run_id.clone()).or_insert_with(|| {
                by_run.push((event.run_id.clone(), Vec::new()));
                by_run.len() - 1
            });
            by_run[slot].1.push(event);
        }
        let applied: usize = by_run.iter().map(|(_, events)| events.len()).sum();
        // New requests are stored first, in stream order (so arrival order is event order);
        // then each run's events are applied in order, runs concurrently. The stored requests
        // become durable with the first flush after them: a policy decision's, a person's, or at
        // the latest the one `ack` makes before it moves the cursor.
        let mut requested: Vec<&runner_pb::Event> = by_run
            .iter()
            .flat_map(|(_, events)| events.iter())
            .filter(|e| matches!(e.detail, Some(Detail::ApprovalRequested(_))))
            .collect();
        requested.sort_by_key(|e| e.seq);
        let (seqs, mut requests): (Vec<u64>, Vec<_>) = requested
            .iter()
            .filter_map(|e| Some((e.seq, self.request_of(e)?)))
            .unzip();
        let spans: Vec<tracing::Span> = requests
            .iter_mut()
            .map(|(request, _, traceparent)| store_span(&request.request_id, traceparent))
            .collect();
        let puts = self.approvals.put_requests(requests).await?;
        let stored: std::collections::HashMap<u64, (Put, tracing::Span)> =
            seqs.into_iter().zip(puts.into_iter().zip(spans)).collect();
        let stored = &stored;
        // Then the consumptions, together: each is its approval's last event, so taking it
        // ahead of its run's later events changes nothing they see.
        let consuming: Vec<(u64, (String, String))> = by_run
            .iter()
            .flat_map(|(_, events)| events.iter())
            .filter_map(|e| match &e.detail {
                Some(Detail::ApprovalConsumed(c)) => {
                    Some((e.seq, (c.request_id.clone(), c.decision_id.clone())))
                }
                _ => None,
            })
            .collect();
        let (seqs, consumed): (Vec<u64>, Vec<_>) = consuming.into_iter().unzip();
        let done = self.approvals.consumed_all(&consumed).await?;
        let consumed: std::collections::HashSet<u64> = seqs
            .into_iter()
            .zip(done)
            .filter_map(|(seq, done)| done.then_some(seq))
            .collect();
        let consumed = &consumed;
        // The runs that end in this batch, looked at together: most hold nothing their end
        // could cancel any more (their approvals were consumed), and those are passed over. Only
        // this stream stores requests, and it stored this batch's already, so a run left out
        // here cannot gain an approval to cancel before its end is applied below.
        let ending: Vec<String> = by_run
            .iter()
            .filter(|(_, events)| {
                events
                    .iter()
                    .any(|e| matches!(e.detail, Some(Detail::RunFinished(_))))
            })
            .map(|(run, _)| run.clone())
            .collect();
        let to_cancel = &self.approvals.store().runs_to_cancel(&ending)?;
        let results = futures_util::future::join_all(by_run.iter().map(|(_, events)| async move {
            for event in events {
                match stored.get(&event.seq) {
                    Some((put, span)) => {
                        self.settle(put.clone(), &event.traceparent)
                            .instrument(span.clone())
                            .await?
                    }
                    None if matches!(event.detail, Some(Detail::ApprovalRequested(_))) => {}
                    None if consumed.contains(&event.seq) => {}
                    None if matches!(event.detail, Some(Detail::RunFinished(_)))
                        && !to_cancel.contains(&event.run_id) => {}
                    None => self.handle(event).await?,
                }
            }
            Ok::<(), Error>(())
        }))
        .await;
        results.into_iter().collect::<Result<(), Error>>()?;
        if applied > 0 {
            Metrics::add(&self.approvals.metrics().events_processed, applied as u64);
            cursor.processed = last;
            cursor.since_ack += applied as u32;
            cursor.dirty_since.get_or_insert_with(Instant::now);
        }
        Ok(())
    }

    /// The request an APPROVAL_REQUESTED event carries, to store (not yet durably) with its
    /// trace; `None` for a malformed one, which is logged and passed over.
    fn request_of(
        &self,
        event: &runner_pb::Event,
    ) -> Option<(ApprovalRequest, Option<i32>, String)> {
        let Some(Detail::ApprovalRequested(r)) = &event.detail else {
            return None;
        };
        match request_from_event(r) {
            Ok((request, unknown_kind)) if valid_id(&request.request_id) => {
                Some((request, unknown_kind, event.traceparent.clone()))
            }
            Ok(_) => {
                self.malformed(event, "request_id holds a NUL byte");
                None
            }
            Err(e) => {
                self.malformed(event, &e.to_string());
                None
            }
        }
    }

    /// Applies the policy to a stored request, inside the approval's trace span.
    async fn settle(&self, put: Put, traceparent: &str) -> Result<(), Error> {
        let a = &self.approvals;
        let span = a.span_in(put.approval.id(), traceparent);
        async {
            let stored = a.settle(put).await?;
            tracing::info!(state = %stored.state, "approval requested");
            Ok::<_, Error>(())
        }
        .instrument(span)
        .await
    }

    async fn handle(&self, event: &runner_pb::Event) -> Result<(), Error> {
        let a = &self.approvals;
        match &event.detail {
            Some(Detail::ApprovalConsumed(c)) => {
                a.consumed(&c.request_id, &c.decision_id)
                    .instrument(a.span_in(&c.request_id, &event.traceparent))
                    .await?
            }
            Some(Detail::SuspensionWithdrawn(w)) => {
                let reason = if w.reason.is_empty() {
                    "suspension withdrawn by the runner".to_string()
                } else {
                    format!("suspension withdrawn: {}", w.reason)
                };
                a.withdraw(&w.request_id, ACTOR, &reason)
                    .instrument(a.span_in(&w.request_id, &event.traceparent))
                    .await?;
            }
            // The runner withdraws a finished run's open suspensions itself (SUSPENSION_WITHDRAWN
            // in the step that ends it); this also covers a run whose checkpoint could not be
            // read, and runners from before that.
            Some(Detail::RunFinished(f)) => {
                let reason = match EventKind::try_from(event.kind) {
                    Ok(EventKind::RunSucceeded) => "run succeeded".to_string(),
                    Ok(EventKind::RunCancelled) => "run cancelled".to_string(),
                    Ok(EventKind::RunSuperseded) => "run superseded".to_string(),
                    _ if f.error.is_empty() => "run failed".to_string(),
                    _ => format!("run failed: {}", arbor_shared::status::clip(&f.error)),
                };
                a.withdraw_run(&event.run_id, ACTOR, &reason).await?;
            }
            _ => {}
        }
        Ok(())
    }

    /// An event that cannot be stored is logged and counted, then passed over: replaying it
    /// forever would stop every approval behind it.
    fn malformed(&self, event: &runner_pb::Event, why: &str) {
        let n = Metrics::inc(&self.approvals.metrics().malformed_events);
        tracing::error!(seq = event.seq, run_id = %event.run_id, why, malformed_total = n,
            "malformed APPROVAL_REQUESTED event skipped");
    }

    /// Acknowledges everything processed so far. A failed ack is retried on the next tick; the
    /// runner would only replay events we apply idempotently.
    async fn ack(&self, cursor: &mut Cursor) {
        let Some(seq) = cursor.processed else { return };
        if cursor.acked >= Some(seq) {
            cursor.dirty_since = None;
            return;
        }
        // Never move the runner's cursor past an event whose store write is not yet durable.
        if let Err(e) = self.approvals.store().flush().await {
            tracing::warn!(error = %e, "flush before ack failed; will retry");
            cursor.dirty_since = Some(Instant::now());
            return;
        }
        let mut client = self.client.clone();
        let mut request = tonic::Request::new(AckRequest {
            subscriber_id: SUBSCRIBER_ID.into(),
            seq,
        });
        request.set_timeout(self.tuning.rpc_timeout);
        match client.ack(request).await {
            Ok(_) => {
                Metrics::inc(&self.approvals.metrics().acks_sent);
                cursor.acked = Some(seq);
                cursor.since_ack = 0;
                cursor.dirty_since = None;
                if let Err(e) = self.approvals.store().set_cursor(seq) {
                    tracing::warn!(error = %e, "could not remember the acked cursor locally");
                }
            }
            Err(status) => {
                tracing::warn!(seq, code = ?status.code(), message = status.message(),
                    "ack failed; will retry");
                cursor.dirty_since = Some(Instant::now());
            }
        }
    }
}

fn valid_id(id: &str) -> bool {
    !id.contains('\0')
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending::<()>().await,
    }
}

/// While spans are exported, the `approval.store` span of a request from the runner: a child of
/// the runner's suspension (`traceparent`, the event's), open until the request is stored and
/// settled. The request is then stored with this span's context instead, so that its decision,
/// however much later and after however many restarts, continues from it. None otherwise.
fn store_span(request_id: &str, traceparent: &mut String) -> tracing::Span {
    if !arbor_shared::trace::exporting() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!("approval.store", request_id);
    let parent = arbor_shared::trace::TraceContext::parse(traceparent);
    arbor_shared::trace::adopt(&span, parent.as_ref());
    if let Some(ctx) = arbor_shared::trace::TraceContext::of_span(&span) {
        *traceparent = ctx.to_string();
    }
    span
}
