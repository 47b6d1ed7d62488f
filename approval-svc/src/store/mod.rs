//! The ApprovalStore: the one durable owner of approvals and their audit trail. Every state
//! change is one transaction together with its audit entry, and a write answers only once it is
//! on disk, so whatever a caller was told OK survives a crash.
//!
//! The service above uses only the `ApprovalStore` trait and `open`. Below it is the seam a
//! backend implements (`backend`: transactions over `Records`, and the reads here); every write
//! is written once above the seam (`rules` for what it does to a record, `ops` for the
//! transaction it runs in and what a batch does). Each backend lives in a module of its own
//! and must pass the conformance suite in `tests/conformance`.
//!
//! `Err` is either a storage failure (`Error::Storage`) or a business outcome that changed
//! nothing (`Error::NotFound`, `Error::InvalidTransition`, `Error::AlreadyDecided`, …).

mod backend;
mod ops;
mod postgres;
mod rules;
mod sled;
pub mod webhooks;

use std::{collections::HashSet, future::Future};

use arbor_shared::domain::ApprovalRequest;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

/// Statements of the PostgreSQL store whose plans the tests check.
#[doc(hidden)]
pub use self::postgres::{ANY_CANCELLABLE_OF_RUN, CANCELLABLE_OF_RUN, OUTBOX_PAGE, RUNS_TO_CANCEL};
/// The backends `approval-svc serve` runs on: `open` opens the embedded one in the data
/// directory, `PgStore::open` the one shared by replicas (`--store postgres://…`).
pub use self::postgres::{OPEN_PATIENCE as PG_OPEN_PATIENCE, PgStore};
pub use self::sled::{SledStore, open};

pub use self::backend::{Backend, Records};
pub use self::webhooks::WebhookOutbox;
pub use rules::Plan;

use crate::{
    error::Result,
    governance::seat::Delegation,
    model::{Approval, AuditEntry, AuditQuery, Filter, NewDecision, Page},
};

/// Who the audit trail names for the service's own bookkeeping.
pub const ACTOR_SERVICE: &str = "approval-svc";
pub const ACTOR_RUNNER: &str = "runner";
pub const ACTOR_TIMEOUT: &str = "timeout";

/// The answer to `put_request`.
#[derive(Debug, Clone)]
pub struct Put {
    pub approval: Approval,
    /// False when the request id was already known (the stored record is returned unchanged).
    pub created: bool,
    /// The request was decided as it was stored (`put_and_decide_requests`): `approval` holds
    /// the decision.
    pub decided: bool,
}

/// The answer to `resolve_request`.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub approval: Approval,
    /// The same decision had already been taken; nothing changed.
    pub duplicate: bool,
    /// The W3C `traceparent` stored with the request, as `resolve_requests` answers it (see
    /// [`trace`](ApprovalStore::trace)); `resolve_request` leaves it out.
    pub traceparent: Option<String>,
}

/// How a delivery attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    Accepted,
    Failed(String),
}

/// A consumption to record (see [`ApprovalStore::ack_and_prune_all`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumed {
    pub request_id: String,
    pub decision_id: String,
    /// The runner has the decision (it accepted it, or consumed it): its delivery, if not
    /// recorded yet, is recorded with the consumption.
    pub delivered: bool,
}

impl Consumed {
    pub fn new(request_id: impl Into<String>, decision_id: impl Into<String>) -> Self {
        Self {
            request_id: request_id.into(),
            decision_id: decision_id.into(),
            delivered: false,
        }
    }
}

/// What one compaction pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compacted {
    pub approvals: u64,
    pub audit_entries: u64,
}

impl std::ops::AddAssign for Compacted {
    fn add_assign(&mut self, other: Self) {
        self.approvals += other.approvals;
        self.audit_entries += other.audit_entries;
    }
}

/// The right to run what must run in one process at a time: following the runner's event log,
/// delivering decisions, the deadline timer and retention. Dropping it gives it up.
#[derive(Debug)]
pub struct Leadership {
    lost: CancellationToken,
    _release: Option<DropGuard>,
}

impl Leadership {
    /// Never lost: the store of a single process.
    pub fn sole() -> Self {
        Self {
            lost: CancellationToken::new(),
            _release: None,
        }
    }

    /// Lost when `lost` is cancelled; `release` is cancelled when this is dropped.
    pub fn new(lost: CancellationToken, release: CancellationToken) -> Self {
        Self {
            lost,
            _release: Some(release.drop_guard()),
        }
    }

    /// Resolves once the leadership is lost (another process may hold it by then).
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }
}

/// Durable approvals. Writes resolve once durable; reads see every answered write. The writes
/// are written once, here, over the [`Backend`] seam (see `ops` for what a batch does); a
/// backend implements the reads, notifications and leadership.
pub trait ApprovalStore: Backend + WebhookOutbox {
    /// Stores a runner request as PENDING. Idempotent by request id: a known id, including a
    /// pruned tombstone or a cancelled one, returns the stored record unchanged.
    fn put_request(
        &self,
        request: ApprovalRequest,
        unknown_kind: Option<i32>,
    ) -> impl Future<Output = Result<Put>> + Send {
        self.transact(true, move |tx| rules::put(tx, &request, unknown_kind))
    }

    /// Like `put_request`, but answers once the write is committed, before it is durable. For
    /// callers that make it durable right after (a policy decision's flush, or `flush`).
    fn put_request_lazy(
        &self,
        request: ApprovalRequest,
        unknown_kind: Option<i32>,
    ) -> impl Future<Output = Result<Put>> + Send {
        self.transact(false, move |tx| rules::put(tx, &request, unknown_kind))
    }

    /// `put_trace` (unless `traceparent` is empty) and `put_request_lazy`, as a runner's
    /// APPROVAL_REQUESTED event asks for both, in one transaction.
    fn put_traced_request(
        &self,
        request: ApprovalRequest,
        unknown_kind: Option<i32>,
        traceparent: &str,
    ) -> impl Future<Output = Result<Put>> + Send {
        let requests = vec![(request, unknown_kind, traceparent.to_string())];
        async move { ops::single(self.put_traced_requests(requests).await?) }
    }

    /// `put_traced_request` for each of `requests` (request, unknown kind, `traceparent`), in
    /// one transaction; the first error fails them all and stores none.
    fn put_traced_requests(
        &self,
        requests: Vec<(ApprovalRequest, Option<i32>, String)>,
    ) -> impl Future<Output = Result<Vec<Put>>> + Send {
        ops::put_and_decide(self, requests, |_| Plan::Leave)
    }

    /// `put_traced_requests`, letting `decide` (the policy) decide each request it creates in
    /// the same write: such a request is stored already RESOLVED, with its REQUESTED and
    /// DECIDED audit entries, and its `Put` says `decided`. A decision the request does not
    /// allow is not taken. The caller applies the policy to every PENDING one not `decided`.
    fn put_and_decide_requests<P: Into<Plan>>(
        &self,
        requests: Vec<(ApprovalRequest, Option<i32>, String)>,
        decide: impl Fn(&Approval) -> P + Send + Sync + 'static,
    ) -> impl Future<Output = Result<Vec<Put>>> + Send {
        ops::put_and_decide(self, requests, move |a: &Approval| decide(a).into())
    }

    /// `ack_and_prune` for each of `consumed`, as one batch (see `ops`); one that says
    /// `delivered` has the runner's acceptance of its decision recorded first, in the same
    /// write, unless it already is.
    fn ack_and_prune_all(
        &self,
        consumed: Vec<Consumed>,
    ) -> impl Future<Output = Result<Vec<Result<(Approval, Approval)>>>> + Send {
        ops::ack_and_prune_all(self, consumed)
    }

    /// PENDING → RESOLVED, single winner. The same decision again is a duplicate (OK, nothing
    /// changes); a different one is `AlreadyDecided` and the first decision stands.
    fn resolve_request(
        &self,
        request_id: &str,
        decision: NewDecision,
    ) -> impl Future<Output = Result<Resolved>> + Send {
        // Generated outside the body, so a transaction run again reuses it.
        let (id, decision_id) = (request_id.to_string(), uuid::Uuid::now_v7().to_string());
        self.transact(true, move |tx| {
            rules::resolve(tx, &id, &decision, &decision_id)
        })
    }

    /// `resolve_request` for each of `decisions` (request id, decision), as one batch (see
    /// `ops`); two on one approval take turns as two calls would. Each answers the request's
    /// `traceparent` too.
    fn resolve_requests(
        &self,
        decisions: Vec<(String, NewDecision)>,
    ) -> impl Future<Output = Result<Vec<Result<Resolved>>>> + Send {
        ops::resolve_all(self, decisions)
    }

    /// PENDING → EXPIRED with the request's `on_timeout` decision (source TIMEOUT).
    fn expire(&self, request_id: &str) -> impl Future<Output = Result<Approval>> + Send {
        let (id, decision_id) = (request_id.to_string(), uuid::Uuid::now_v7().to_string());
        self.transact(true, move |tx| rules::expire(tx, &id, &decision_id))
    }

    /// Counts a delivery attempt of `decision_id`; an accepted one is recorded (with an audit
    /// entry) so it is not sent again. `None` when the approval no longer awaits that decision.
    /// Bookkeeping only, not durable before the next flush: if a crash loses it, the decision
    /// is delivered again, which the runner answers as a duplicate.
    fn record_delivery(
        &self,
        request_id: &str,
        decision_id: &str,
        outcome: DeliveryOutcome,
    ) -> impl Future<Output = Result<Option<Approval>>> + Send {
        let (id, decision_id) = (request_id.to_string(), decision_id.to_string());
        self.transact(false, move |tx| {
            rules::record_delivery(tx, &id, &decision_id, &outcome)
        })
    }

    /// `record_delivery` for each of `attempts` (request id, decision id, outcome), in one
    /// transaction: any failure, a refusal too, fails the call and changes nothing.
    fn record_deliveries(
        &self,
        attempts: Vec<(String, String, DeliveryOutcome)>,
    ) -> impl Future<Output = Result<Vec<Result<Option<Approval>>>>> + Send {
        ops::record_deliveries(self, attempts)
    }

    /// RESOLVED/EXPIRED → ACKED, only for the decision the approval holds.
    fn ack_result(
        &self,
        request_id: &str,
        decision_id: &str,
    ) -> impl Future<Output = Result<Approval>> + Send {
        let (id, decision_id) = (request_id.to_string(), decision_id.to_string());
        self.transact(true, move |tx| rules::ack(tx, &id, &decision_id))
    }

    /// `ack_result` then `prune_result` as one step (the run consumed the decision), durable
    /// with the next flush: `ack_and_prune_all` of it alone.
    fn ack_and_prune(
        &self,
        consumed: Consumed,
    ) -> impl Future<Output = Result<(Approval, Approval)>> + Send {
        async move { ops::single(self.ack_and_prune_all(vec![consumed]).await?)? }
    }

    /// ACKED → PRUNED: drops the request payload and the decision's args/result; the record
    /// stays as a tombstone and the audit trail stays whole.
    fn prune_result(&self, request_id: &str) -> impl Future<Output = Result<Approval>> + Send {
        let id = request_id.to_string();
        self.transact(true, move |tx| rules::prune(tx, &id))
    }

    /// PENDING/RESOLVED/EXPIRED → CANCELLED.
    fn cancel(
        &self,
        request_id: &str,
        actor: &str,
        reason: &str,
    ) -> impl Future<Output = Result<Approval>> + Send {
        let (id, actor, reason) = (
            request_id.to_string(),
            actor.to_string(),
            reason.to_string(),
        );
        self.transact(true, move |tx| {
            rules::cancel(tx, &rules::load(tx, &id)?, &actor, &reason)
        })
    }

    /// Of `run_ids`, those that may still hold an approval `cancel_run` would change (never
    /// fewer), looked at together; a store that cannot tell in one read answers them all.
    fn runs_to_cancel(&self, run_ids: &[String]) -> Result<HashSet<String>> {
        Ok(run_ids.iter().cloned().collect())
    }

    /// Cancels every approval of a run that can still be cancelled; returns the changed ones.
    fn cancel_run(
        &self,
        run_id: &str,
        actor: &str,
        reason: &str,
    ) -> impl Future<Output = Result<Vec<Approval>>> + Send {
        ops::cancel_run(self, run_id, actor, reason)
    }

    /// Appends a free-standing audit entry (its id and time are assigned here).
    fn append_audit(&self, entry: AuditEntry) -> impl Future<Output = Result<AuditEntry>> + Send {
        self.transact(true, move |tx| tx.audit(entry.clone()))
    }

    /// Takes or gives back a PENDING approval (see `voting::claim`).
    fn claim(
        &self,
        request_id: &str,
        who: &str,
        ttl_ms: u64,
        release: bool,
    ) -> impl Future<Output = Result<Approval>> + Send {
        let who = who.to_string();
        ops::change(self, request_id, move |a, now| {
            crate::voting::claim(a, &who, ttl_ms, release, now)
        })
    }

    /// Moves an approval's claim to `to` (see `voting::reassign`).
    fn reassign(
        &self,
        request_id: &str,
        actor: &str,
        to: &str,
        overrides: bool,
    ) -> impl Future<Output = Result<Approval>> + Send {
        let (actor, to) = (actor.to_string(), to.to_string());
        ops::change(self, request_id, move |a, now| {
            crate::voting::reassign(a, &actor, &to, overrides, now)
        })
    }

    /// Appends a comment, bound to the approval's digest now.
    fn comment(
        &self,
        request_id: &str,
        author: &str,
        text: &str,
    ) -> impl Future<Output = Result<Approval>> + Send {
        let (author, text) = (author.to_string(), text.to_string());
        ops::change(self, request_id, move |a, now| {
            crate::voting::comment(a, &author, &text, now)
        })
    }

    /// Writes a delegation (durable when it answers).
    fn delegate(&self, d: Delegation) -> impl Future<Output = Result<Delegation>> + Send {
        ops::put_delegation(self, d)
    }

    /// Removes delegation `id` when `may` allows the caller to.
    fn revoke_delegation(
        &self,
        id: &str,
        may: impl Fn(&Delegation) -> Result<()> + Send + Sync + 'static,
    ) -> impl Future<Output = Result<Delegation>> + Send {
        ops::delete_delegation(self, id, may)
    }

    /// Every delegation.
    fn delegations(&self) -> impl Future<Output = Result<Vec<Delegation>>> + Send {
        ops::delegations(self)
    }

    fn get(&self, request_id: &str) -> Result<Option<Approval>>;

    /// The stored approvals of `request_ids`, in the order given; an unknown id is left out.
    fn get_many(&self, request_ids: &[String]) -> Result<Vec<Approval>> {
        let mut found = Vec::new();
        for id in request_ids {
            found.extend(self.get(id)?);
        }
        Ok(found)
    }

    /// Approvals matching `filter`, oldest first.
    fn list(
        &self,
        filter: &Filter,
        page_size: usize,
        page_token: Option<&str>,
        now_ms: u64,
    ) -> Result<Page<Approval>>;

    /// How many approvals match `filter`, counted no further than `limit` (so `limit` means
    /// that many or more). A filter by state alone is answered from the indexes the backend
    /// keeps, without reading records; any other is counted by listing.
    fn count(&self, filter: &Filter, limit: usize, now_ms: u64) -> Result<usize> {
        Ok(self.list(filter, limit, None, now_ms)?.items.len())
    }

    /// Audit entries of a request or a run, oldest first.
    fn audit(
        &self,
        query: &AuditQuery,
        page_size: usize,
        page_token: Option<&str>,
    ) -> Result<Page<AuditEntry>>;

    /// The earliest deadline among PENDING approvals.
    fn next_deadline(&self) -> Result<Option<(u64, String)>>;

    /// Now, on the clock the store's times are on (epoch ms): this host's for an embedded
    /// store, the database server's for a shared one, so that replicas on several hosts stamp
    /// times and fire deadlines by one clock.
    fn now_ms(&self) -> u64 {
        arbor_shared::time::now_ms()
    }

    /// How many approvals are PENDING: a count kept with the writes, not a scan.
    fn pending_count(&self) -> Result<u64>;

    /// RESOLVED/EXPIRED approvals whose decision the runner has not accepted yet.
    fn undelivered(&self) -> Result<Vec<Approval>>;

    /// `undelivered`, each with its `traceparent`: what the delivery loop reads, since a
    /// delivery carries the run's trace on.
    fn undelivered_traced(&self) -> Result<Vec<(Approval, Option<String>)>> {
        with_traces(self, self.undelivered()?)
    }

    /// `undelivered_traced` among `request_ids` alone (each named once), oldest first.
    fn undelivered_of(&self, request_ids: &[String]) -> Result<Vec<(Approval, Option<String>)>> {
        let mut due = self.get_many(request_ids)?;
        due.retain(Approval::needs_delivery);
        due.sort_by_key(|a| a.arrival);
        with_traces(self, due)
    }

    /// The last event-log cursor this service acknowledged (for logs after a restart).
    fn cursor(&self) -> Result<Option<u64>>;

    /// Remembers `seq` as acknowledged by the runner, and when (wall clock).
    fn set_cursor(&self, seq: u64) -> Result<()>;

    /// When the runner last acknowledged our cursor (wall-clock ms), if ever. Every approval
    /// changed by an event before then was changed by an event the runner will not replay.
    fn cursor_acked_at(&self) -> Result<Option<u64>>;

    /// Retention: deletes every final approval (PRUNED, CANCELLED) last changed at or before
    /// `cutoff_ms`, with its audit entries, index entries and trace, durably. PENDING,
    /// RESOLVED, EXPIRED and ACKED approvals are never touched. Idempotent.
    fn compact(&self, cutoff_ms: u64) -> impl Future<Output = Result<Compacted>> + Send;

    /// Remembers the W3C `traceparent` the runner sent with a request, so the approval's log
    /// lines and the delivery of its decision stay in the run's trace; durable with the next
    /// flush (a replayed event writes it again).
    fn put_trace(&self, request_id: &str, traceparent: &str) -> Result<()>;

    /// The `traceparent` stored for a request, if any.
    fn trace(&self, request_id: &str) -> Result<Option<String>>;

    /// Everything written so far is on disk (shutdown).
    fn flush(&self) -> impl Future<Output = Result<()>> + Send;

    /// Makes everything committed so far durable, then records how far the store got where
    /// the next `open` checks it, so that losing durable data later is detected at start-up
    /// instead of served. A database that guarantees what it acknowledged has nothing to record.
    fn record_progress(&self) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// fsyncs (group-commit flushes) issued so far.
    fn fsyncs(&self) -> u64 {
        0
    }

    /// Tries once to become the one process, of all that share this store, that runs the
    /// leader's loops; `None` while another holds it. A store that no other process opens
    /// makes its process the leader at once, for good.
    fn lead(&self) -> impl Future<Output = Result<Option<Leadership>>> + Send {
        async { Ok(Some(Leadership::sole())) }
    }

    /// `lead`, telling the processes that share this store that `replica` leads while it does.
    fn lead_as(&self, replica: &str) -> impl Future<Output = Result<Option<Leadership>>> + Send {
        let _ = replica;
        self.lead()
    }

    /// The replica that leads now, as named to `lead_as`; `None` when none does, or none other
    /// could.
    fn leader(&self) -> impl Future<Output = Result<Option<String>>> + Send {
        async { Ok(None) }
    }

    /// The ids of approvals that other processes sharing this store changed, from now on;
    /// an empty id means some changes may have been missed. `None`: nobody else writes here.
    fn foreign_changes(&self) -> Option<mpsc::UnboundedReceiver<String>> {
        None
    }

    /// Whether the store's database can be reached right now, kept up to date; `None` for a
    /// store that is always there while the process runs.
    fn reachable(&self) -> Option<watch::Receiver<bool>> {
        None
    }
}

fn with_traces<S: ApprovalStore>(
    store: &S,
    approvals: Vec<Approval>,
) -> Result<Vec<(Approval, Option<String>)>> {
    approvals
        .into_iter()
        .map(|approval| {
            let trace = store.trace(approval.id())?;
            Ok((approval, trace))
        })
        .collect()
}

/// The lists' names in their page tokens, so one list's token is refused by the other.
const APPROVALS: &str = "approvals";
const AUDIT: &str = "audit";

/// The key after which a page token of `list` continues.
fn page_key(list: &str, token: &str) -> Result<Vec<u8>> {
    arbor_shared::page::key(list, token).ok_or(crate::error::Error::BadPageToken)
}

/// The first `page_size` of `found` (each with the key a next page starts after), and the token
/// of the next page of `list` when one more exists: read no further than that.
fn page_of<T, K: AsRef<[u8]>>(
    found: impl Iterator<Item = Result<(K, T)>>,
    page_size: usize,
    list: &str,
) -> Result<Page<T>> {
    let (mut items, mut last) = (Vec::new(), None);
    for item in found {
        let (key, item) = item?;
        if items.len() == page_size {
            let next = last.map(|k: K| arbor_shared::page::token(list, k.as_ref()));
            return Ok(Page { items, next });
        }
        last = Some(key);
        items.push(item);
    }
    Ok(Page { items, next: None })
}

#[cfg(test)]
mod tests {
    #[test]
    fn bad_page_tokens_are_invalid_arguments() {
        let code = |r: crate::error::Result<Vec<u8>>| r.unwrap_err().code();
        assert_eq!(
            code(super::page_key("approvals", "xyz")),
            tonic::Code::InvalidArgument
        );
        let token = arbor_shared::page::token("approvals", b"k1");
        assert_eq!(super::page_key("approvals", &token).unwrap(), b"k1");
        assert!(super::page_key("audit", &token).is_err());
        assert!(super::page_key("approvals", &hex::encode(b"k1")).is_err());
    }
}
