//! The façade's part of delivery: the runner's consumption of a decision, its acceptance of one
//! (marks waiting to be recorded, see `outbox`) and the delivery attempts the delivery task
//! reports, recorded in batches.

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Approvals, MARK_WAIT};
use crate::{
    error::{Error, Result},
    model::Approval,
    outbox::{Attempt, Mark},
    store::{ApprovalStore, Consumed, DeliveryOutcome},
};

impl<S: ApprovalStore> Approvals<S> {
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
    pub(super) async fn record_marks_of(&self, which: impl Fn(&str, &Mark) -> bool) -> Result<()> {
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
