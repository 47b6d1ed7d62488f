//! The approval operations, written once for every backend over [`Backend`]: each is one
//! transaction running the rules (`rules`) on the backend's [`Records`].
//!
//! One batch semantics for every backend: a batch (`put_and_decide_requests`,
//! `resolve_requests`, `record_deliveries`, `ack_and_prune_all`) is one transaction, its
//! approvals locked and read ahead together and taken in byte order of their ids (so two
//! batches never wait for each other in a circle). An item the rules refuse (unknown, already
//! decided, not allowed, …) answers its error alone, having written nothing, since the rules
//! check before they write; any other failure fails the whole batch and changes nothing. The
//! batch answers once its one commit is durable (the embedded store shares that commit and its
//! flush with whatever else is queued), except the runner's requests and consumptions, which
//! the event subscription makes durable before it moves its cursor (see each).

use std::collections::HashMap;

use arbor_shared::domain::ApprovalRequest;

use super::{
    Consumed, DeliveryOutcome, Put, Resolved,
    backend::{Backend, Records},
    rules,
};
use crate::{
    error::{Error, Result},
    governance::seat::Delegation,
    model::{Approval, AuditEntry, NewDecision},
};

/// An id for each of `n` decisions, generated once per call so that a transaction run again
/// reuses them.
fn decision_ids(n: usize) -> Vec<String> {
    (0..n).map(|_| uuid::Uuid::now_v7().to_string()).collect()
}

/// `each` of `items` taken in the order of their request ids (`id`), its outcomes answered in
/// the order given; the first failure ends it. A transaction that changes several approvals
/// locks their rows in this order, as every other does, so no two wait for each other in a
/// circle (PostgreSQL would break the circle only after `deadlock_timeout`, a second).
pub(super) fn in_id_order<I, O, E>(
    items: &[I],
    id: impl Fn(&I) -> &String,
    mut each: impl FnMut(&I) -> Result<O, E>,
) -> Result<Vec<O>, E> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| id(&items[a]).cmp(id(&items[b])));
    let mut outcomes: Vec<Option<O>> = (0..items.len()).map(|_| None).collect();
    for i in order {
        outcomes[i] = Some(each(&items[i])?);
    }
    Ok(outcomes.into_iter().flatten().collect())
}

/// A batch item's outcome: a refusal answered alone, any other failure failing the batch.
fn alone<B: Backend, T>(outcome: Result<T, B::Fail>) -> Result<Result<T>, B::Fail> {
    match outcome {
        Ok(v) => Ok(Ok(v)),
        Err(fail) => B::refusal(fail).map(Err),
    }
}

fn ids_of<'a>(ids: impl Iterator<Item = &'a String>) -> Vec<&'a str> {
    ids.map(String::as_str).collect()
}

/// Every request (with its trace) in one transaction, the policy's decisions too: a request
/// `decide` decides costs one record write. The first error fails them all. Answers before the
/// write is durable: the caller flushes before a decision leaves this service.
pub(super) async fn put_and_decide<B: Backend>(
    b: &B,
    requests: Vec<(ApprovalRequest, Option<i32>, String)>,
    decide: impl Fn(&Approval) -> rules::Plan + Send + Sync + 'static,
) -> Result<Vec<Put>> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let decision_ids = decision_ids(requests.len());
    b.transact(false, move |tx| {
        // The traces go with the first statement, all in one.
        for (request, _, traceparent) in &requests {
            if !traceparent.is_empty() {
                tx.put_trace(&request.request_id, traceparent)?;
            }
        }
        tx.lock_ahead(&ids_of(requests.iter().map(|r| &r.0.request_id)), true)?;
        let mut puts = Vec::with_capacity(requests.len());
        for ((request, unknown_kind, _), id) in requests.iter().zip(&decision_ids) {
            let decide: rules::Decide<'_> = &decide;
            puts.push(rules::put_deciding(
                tx,
                request,
                *unknown_kind,
                Some((decide, id)),
            )?);
        }
        Ok(puts)
    })
    .await
}

/// The decisions in one transaction, their approvals and traces read ahead together.
pub(super) async fn resolve_all<B: Backend>(
    b: &B,
    decisions: Vec<(String, NewDecision)>,
) -> Result<Vec<Result<Resolved>>> {
    if decisions.is_empty() {
        return Ok(Vec::new());
    }
    let decision_ids = decision_ids(decisions.len());
    b.transact(true, move |tx| {
        let traces: HashMap<String, String> =
            tx.lock_ahead_traced(&ids_of(decisions.iter().map(|(id, _)| id)))?;
        let items: Vec<_> = decisions.iter().zip(&decision_ids).collect();
        in_id_order(
            &items,
            |((request_id, _), _)| request_id,
            |((request_id, decision), decision_id)| {
                alone::<B, _>(rules::resolve(tx, request_id, decision, decision_id)).map(|r| {
                    r.map(|resolved| Resolved {
                        traceparent: traces.get(request_id.as_str()).cloned(),
                        ..resolved
                    })
                })
            },
        )
    })
    .await
}

/// The attempts that finished together in one transaction (see `record_delivery`); unlike the
/// other batches, any failure fails the whole batch, a refusal too (the caller then records
/// each alone).
pub(super) async fn record_deliveries<B: Backend>(
    b: &B,
    attempts: Vec<(String, String, DeliveryOutcome)>,
) -> Result<Vec<Result<Option<Approval>>>> {
    if attempts.is_empty() {
        return Ok(Vec::new());
    }
    b.transact(false, move |tx| {
        tx.lock_ahead(&ids_of(attempts.iter().map(|a| &a.0)), false)?;
        in_id_order(
            &attempts,
            |(request_id, _, _)| request_id,
            |(request_id, decision_id, outcome)| {
                rules::record_delivery(tx, request_id, decision_id, outcome).map(Ok)
            },
        )
    })
    .await
}

/// The consumptions of a batch of the runner's events in one transaction, durable with the next
/// flush rather than a flush of their own: only the event subscription consumes, and it flushes
/// before it moves its cursor past the events, so a crash before then replays them
/// (`APPROVAL_CONSUMED` is idempotent: a replay finds the approval as it left it, or finishes it).
pub(super) async fn ack_and_prune_all<B: Backend>(
    b: &B,
    consumed: Vec<Consumed>,
) -> Result<Vec<Result<(Approval, Approval)>>> {
    if consumed.is_empty() {
        return Ok(Vec::new());
    }
    b.transact(false, move |tx| {
        tx.lock_ahead(&ids_of(consumed.iter().map(|c| &c.request_id)), false)?;
        in_id_order(
            &consumed,
            |c| &c.request_id,
            |c| {
                // Every check before anything is written: a refusal leaves the rest as it was.
                let checked = rules::load(tx, &c.request_id).and_then(|a| {
                    let n = rules::consumption(tx, &a, &c.decision_id, c.delivered)?;
                    Ok((a, n))
                });
                match alone::<B, _>(checked)? {
                    Ok((a, n)) => rules::consume(tx, &a, n).map(Ok),
                    Err(refused) => Ok(Err(refused)),
                }
            },
        )
    })
    .await
}

/// Most runs end with nothing left to cancel (the runner withdraws a run's open suspensions in
/// the step that ends it), so a look outside any transaction answers those without one, which
/// would cost a commit. The transaction locks and reads each again.
pub(super) async fn cancel_run<B: Backend>(
    b: &B,
    run_id: &str,
    actor: &str,
    reason: &str,
) -> Result<Vec<Approval>> {
    let Some(looked) = b.cancellable_ids(run_id)? else {
        return Ok(Vec::new());
    };
    let (run_id, actor, reason) = (run_id.to_string(), actor.to_string(), reason.to_string());
    b.transact(true, move |tx| {
        let mut changed = Vec::new();
        for id in tx.cancellable_of_run(&run_id, &looked)? {
            let a = rules::load(tx, &id)?;
            if rules::cancellable(&a) {
                changed.push(rules::cancel(tx, &a, &actor, &reason)?);
            }
        }
        Ok(changed)
    })
    .await
}

/// One change to one approval, durable: `change` (given the record and the transaction's time)
/// answers the new record and its audit entries, or refuses and nothing is written.
pub(super) async fn change<B: Backend>(
    b: &B,
    request_id: &str,
    change: impl Fn(&Approval, u64) -> Result<(Approval, Vec<AuditEntry>)> + Send + Sync + 'static,
) -> Result<Approval> {
    let request_id = request_id.to_string();
    b.transact(true, move |tx| rules::change(tx, &request_id, &change))
        .await
}

/// Writes a delegation.
pub(super) async fn put_delegation<B: Backend>(b: &B, d: Delegation) -> Result<Delegation> {
    b.transact(true, move |tx| {
        tx.put_delegation(&d)?;
        Ok(d.clone())
    })
    .await
}

/// Removes the delegation `id`, if `may` lets the caller remove it.
pub(super) async fn delete_delegation<B: Backend>(
    b: &B,
    id: &str,
    may: impl Fn(&Delegation) -> Result<()> + Send + Sync + 'static,
) -> Result<Delegation> {
    let id = id.to_string();
    b.transact(true, move |tx| {
        let found = tx.delegations()?.into_iter().find(|d| d.id == id);
        let d = found.ok_or_else(|| Error::DelegationNotFound(id.clone()))?;
        may(&d)?;
        tx.delete_delegation(&id)?;
        Ok(d)
    })
    .await
}

/// Every delegation.
pub(super) async fn delegations<B: Backend>(b: &B) -> Result<Vec<Delegation>> {
    b.transact(false, |tx| tx.delegations()).await
}

/// The answer of a batch of one.
pub(super) fn single<T>(outcomes: Vec<T>) -> Result<T> {
    outcomes
        .into_iter()
        .next()
        .ok_or_else(|| Error::Storage("the store answered no outcome for one item".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_approvals_are_taken_in_byte_order_and_answered_in_the_order_given() {
        let items: Vec<String> = ["b", "B", "a", "é", "a0"].map(String::from).to_vec();
        let mut taken = Vec::new();
        let outcomes = in_id_order::<_, _, ()>(
            &items,
            |i| i,
            |i| {
                taken.push(i.clone());
                Ok(format!("{i}!"))
            },
        )
        .unwrap();
        assert_eq!(taken, ["B", "a", "a0", "b", "é"]);
        assert_eq!(outcomes, ["b!", "B!", "a!", "é!", "a0!"]);
    }
}
