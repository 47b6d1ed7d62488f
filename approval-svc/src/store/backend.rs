//! The seam every backend implements: what a backend really differs in. A transaction's view
//! of the records ([`Records`], which `rules` works on), how a transaction is run and
//! committed ([`Backend::transact`]) and how a refusal is told from a storage failure. The
//! approval operations are written once above it (`ops`); reads, notifications and leadership
//! are the rest of [`ApprovalStore`](super::ApprovalStore) each backend implements.

use std::{collections::HashMap, future::Future};

use super::webhooks::Queued;
use crate::{
    error::{Error, Result},
    governance::seat::Delegation,
    model::{Approval, AuditEntry},
    webhooks::Routes,
};

/// How one transaction of a backend is run.
pub trait Backend: Sized + Send + Sync + 'static {
    /// How a transaction body fails: a business outcome or the backend's own failure.
    type Fail: From<Error> + Send;
    /// A transaction's view of the records.
    type Tx<'t>: Records<Fail = Self::Fail>;

    /// Runs `body` as one transaction (again, if it conflicts with another; it must have no
    /// side effects outside it) and answers once it is committed: with `durable`, once it is
    /// durable too; otherwise a backend may answer before, and make it durable with its next
    /// flush (a caller that needs it durable flushes).
    fn transact<T: Send + 'static>(
        &self,
        durable: bool,
        body: impl Fn(&Self::Tx<'_>) -> Result<T, Self::Fail> + Send + 'static,
    ) -> impl Future<Output = Result<T>> + Send;

    /// `fail` as the business outcome it is (`Ok`), or itself when it is the backend's own
    /// failure, which must end the transaction.
    fn refusal(fail: Self::Fail) -> Result<Error, Self::Fail>;

    /// Looks, outside any transaction, for approvals of `run_id` that may still be cancelled:
    /// `None` when there is none (most runs end so), else what was found (see
    /// [`Records::cancellable_of_run`]).
    fn cancellable_ids(&self, run_id: &str) -> Result<Option<Vec<String>>>;
}

/// One transaction's view of the approvals, in a backend. `Fail` is how the backend's
/// transaction fails: a business outcome ([`Error`], which ends the transaction with nothing
/// changed) or a storage failure of its own (which may mean "run it again").
pub trait Records {
    type Fail: From<Error> + Send;

    /// The transaction's wall-clock time (ms); every change it makes is stamped with it.
    fn now(&self) -> u64;

    /// The stored approval, locked against other transactions until this one ends.
    fn find(&self, request_id: &str) -> Result<Option<Approval>, Self::Fail>;

    /// The next number in the order requests arrive.
    fn next_arrival(&self) -> Result<u64, Self::Fail>;

    /// Writes `new` (which replaces `old`, `None` for a new record) with its indexes.
    fn save(&self, old: Option<&Approval>, new: &Approval) -> Result<(), Self::Fail>;

    /// Appends an audit entry, assigning its id and time.
    fn audit(&self, entry: AuditEntry) -> Result<AuditEntry, Self::Fail>;

    /// [`audit`](Self::audit) for a caller that does not need the entry back (a backend may
    /// send it with the transaction's next statement).
    fn append(&self, entry: AuditEntry) -> Result<(), Self::Fail> {
        self.audit_all(vec![entry])
    }

    /// Appends audit entries of one approval, in order, as [`audit`](Self::audit) each would
    /// (their ids ascending in that order).
    fn audit_all(&self, entries: Vec<AuditEntry>) -> Result<(), Self::Fail> {
        for entry in entries {
            self.audit(entry)?;
        }
        Ok(())
    }

    /// Every delegation, in force or not (the caller checks time and scope; there are few).
    fn delegations(&self) -> Result<Vec<Delegation>, Self::Fail>;

    /// Writes a delegation (new, or replacing the one with its id).
    fn put_delegation(&self, d: &Delegation) -> Result<(), Self::Fail>;

    /// Removes a delegation; whether there was one.
    fn delete_delegation(&self, id: &str) -> Result<Option<Delegation>, Self::Fail>;

    /// Which webhook endpoint wants which events (see `webhooks::enqueue`).
    fn webhook_routes(&self) -> &Routes;

    /// Queues `message` for the webhook endpoint `endpoint` with the transaction.
    fn put_webhook(&self, endpoint: &str, message: &Queued) -> Result<(), Self::Fail>;

    /// Writes a request's W3C `traceparent` with the transaction.
    fn put_trace(&self, request_id: &str, traceparent: &str) -> Result<(), Self::Fail>;

    /// Locks and reads ahead the approvals `ids` of a batch, so that the lookups that follow
    /// are answered from what it read (with `arrivals`, as many arrival numbers too): for a
    /// backend whose reads cost a round trip each.
    fn lock_ahead(&self, ids: &[&str], arrivals: bool) -> Result<(), Self::Fail> {
        let _ = (ids, arrivals);
        Ok(())
    }

    /// [`lock_ahead`](Self::lock_ahead) without arrival numbers, answering the `traceparent`
    /// stored with each request (by id; an id without one is left out).
    fn lock_ahead_traced(&self, ids: &[&str]) -> Result<HashMap<String, String>, Self::Fail>;

    /// The approvals of `run_id` that may still be cancelled, locked: `looked` are those
    /// [`Backend::cancellable_ids`] found before the transaction (a backend that can lock them
    /// with one statement looks for itself).
    fn cancellable_of_run(
        &self,
        run_id: &str,
        looked: &[String],
    ) -> Result<Vec<String>, Self::Fail> {
        let _ = run_id;
        Ok(looked.to_vec())
    }
}
