//! The PostgreSQL implementation of `ApprovalStore`, shared by every replica that opens the
//! same database (`approval-svc serve --store postgres://…`).
//!
//! - Every state change is one SQL transaction (READ COMMITTED) that reads the approval's row
//!   `FOR UPDATE`, runs the same rules as every backend (`store::rules`), writes the record with
//!   its indexed columns and its audit entry, notifies `arbor_approvals` and commits; it answers
//!   after the commit, which PostgreSQL makes durable before it returns (`synchronous_commit`
//!   on, the default). The row lock is the single winner: of two decisions on one approval, on
//!   any replicas, the second waits for the first and then finds it decided. Two requests with
//!   the same new id race on the primary key; the loser's transaction runs again and finds the
//!   winner's record.
//! - Reads are single statements on a pooled connection, blocking the calling thread as the
//!   embedded store's reads do.
//! - The pending count is `count(*)` over a partial index that holds only PENDING rows: its cost
//!   grows with what is pending, not with history, and no counter row serialises the writers.
//! - Audit ids come from a sequence, taken under a per-run advisory lock held to the commit:
//!   within one run (and so within one request), ids increase in commit order, so paging a trail
//!   by id never steps past an entry that commits later (`tx::AUDIT_ID`).
//! - Other replicas' changes arrive as notifications (`foreign_changes`); the leader's lock is a
//!   session-level advisory lock (`lead`).

mod lead;
mod query;
mod schema;
mod tx;

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use arbor_shared::{
    domain::ApprovalRequest,
    postgres::{Database, DbError, Patience, Prepared, ServerClock, wait},
};
use serde::{Serialize, de::DeserializeOwned};
use tokio::sync::{mpsc, watch};

use self::tx::{Fail, PgTx};
use super::{
    ApprovalStore, Compacted, Consumed, DeliveryOutcome, Leadership, Put, Resolved,
    rules::{self, Records},
};
use crate::{
    error::{Error, Result},
    model::{Approval, AuditEntry, AuditQuery, Filter, NewDecision, Page},
};

/// The most rows one page of the outbox holds: a literal, so that [`OUTBOX_PAGE`] spells it out
/// and every plan of it knows the limit.
macro_rules! outbox_page_rows {
    () => {
        64
    };
}
/// One page of the decisions awaiting delivery, each with its trace: those that arrived after
/// `$1`, oldest first, [`OUTBOX_PAGE_ROWS`] at most. Paged so that it is planned as a walk of
/// the outbox index, which marks the entries of delivered decisions dead as it passes them, and
/// not as a bitmap scan, which reads the table page of every entry the index still holds,
/// delivered ones included, on every scan until a vacuum (and a decision's delivery starts with
/// a scan).
pub const OUTBOX_PAGE: &str = concat!(
    "SELECT r.record::text, r.arrival, t.traceparent FROM approval_records r \
     LEFT JOIN approval_traces t ON t.request_id = r.request_id \
     WHERE r.awaiting_delivery AND r.arrival > $1 ORDER BY r.arrival LIMIT ",
    outbox_page_rows!()
);
const OUTBOX_PAGE_ROWS: usize = outbox_page_rows!();

/// The rows of the approvals of the runs `$runs` (a condition on `run_id`) that may still be
/// cancelled: written once for the lookups below, as the predicate of the index that serves
/// them (`approval_records_open_by_run`), so that every plan of each can use it.
macro_rules! cancellable_of {
    ($runs:literal) => {
        concat!(
            "FROM approval_records WHERE ",
            $runs,
            " AND state IN ('PENDING', 'RESOLVED', 'EXPIRED')"
        )
    };
}
/// The ids of the run `$1`'s approvals that may still be cancelled, locked, in id order: byte
/// order, whatever the database's collation, as every transaction that changes several
/// approvals locks them (see `in_id_order`).
pub const CANCELLABLE_OF_RUN: &str = concat!(
    "SELECT request_id ",
    cancellable_of!("run_id = $1"),
    " ORDER BY request_id COLLATE \"C\" FOR UPDATE"
);
/// Whether the run `$1` has an approval that may still be cancelled: a row when it has. A look
/// outside any transaction.
pub const ANY_CANCELLABLE_OF_RUN: &str =
    concat!("SELECT 1 ", cancellable_of!("run_id = $1"), " LIMIT 1");
/// Those of the runs `$1` (an array) that have an approval that may still be cancelled:
/// [`ANY_CANCELLABLE_OF_RUN`] for each. A look outside any transaction.
pub const RUNS_TO_CANCEL: &str = concat!(
    "SELECT r.run_id FROM unnest($1::text[]) AS r(run_id) WHERE EXISTS (SELECT 1 ",
    cancellable_of!("run_id = r.run_id"),
    ")"
);

/// The notification channel every change is announced on; the payload is `"{instance}
/// {request_id}"` (an empty id: "look at everything").
const CHANNEL: &str = "arbor_approvals";
/// How long start-up waits for an unreachable database.
pub const OPEN_PATIENCE: Duration = Duration::from_secs(30);
/// How often the database's reachability is probed (health).
const HEALTH_PERIOD: Duration = Duration::from_secs(1);
/// Tries of a transaction that keeps conflicting before it fails.
const MAX_TRIES: u32 = 50;
/// Approvals deleted per retention statement.
const COMPACT_BATCH: i64 = 256;

/// One batch of retention, one statement: up to `$2` final approvals last changed at or before
/// `$1` (rows another transaction holds are left for the next pass), then their audit entries
/// and traces; answers how many of each went.
const COMPACT_ONE_BATCH: &str = "WITH doomed AS (
         SELECT request_id FROM approval_records
         WHERE state IN ('PRUNED', 'CANCELLED') AND updated_at_ms <= $1
         ORDER BY updated_at_ms LIMIT $2 FOR UPDATE SKIP LOCKED
     ), gone AS (
         DELETE FROM approval_records r USING doomed d
         WHERE r.request_id = d.request_id RETURNING r.request_id
     ), audit AS (
         DELETE FROM approval_audit a USING gone g
         WHERE a.request_id = g.request_id RETURNING 1
     ), traces AS (
         DELETE FROM approval_traces t USING gone g
         WHERE t.request_id = g.request_id RETURNING 1
     )
     SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM audit),
            (SELECT count(*) FROM traces)";

const CURSOR_KEY: &str = "subscriber_cursor";
const CURSOR_AT_KEY: &str = "subscriber_cursor_at";

impl From<DbError> for Error {
    fn from(e: DbError) -> Self {
        match e {
            // A login refused while serving (a password or role changed): as unreachable as a
            // server that is down, until someone puts it right.
            DbError::Unavailable(m) | DbError::Misconfigured(m) => Error::Unavailable(m),
            other => Error::Storage(other.to_string()),
        }
    }
}

fn db_error(e: impl Into<DbError>) -> Error {
    Error::from(e.into())
}

/// Column values are `bigint`; times and counters never come near its end, a cutoff of
/// "everything" may.
fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn encode<T: Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| Error::Storage(format!("cannot encode record: {e}")))
}

fn decode<T: DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| Error::Storage(format!("corrupt record: {e}")))
}

/// Approvals in a PostgreSQL database.
pub struct PgStore {
    db: Database,
    /// Tells this process's notifications from other replicas'.
    instance: Arc<str>,
    commits: Arc<AtomicU64>,
    reachable: watch::Receiver<bool>,
    clock: ServerClock,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").finish_non_exhaustive()
    }
}

impl PgStore {
    /// Opens the approval tables in the database at `url`, creating or migrating them (once,
    /// under an advisory lock, when replicas start together). Waits up to 30 s for an
    /// unreachable database; refuses a wrong login, a missing database and a schema newer than
    /// this binary's at once.
    pub async fn open(url: &str) -> Result<PgStore> {
        Self::open_with(url, Patience::Reachable(OPEN_PATIENCE)).await
    }

    /// [`open`](Self::open), waiting for the database as `patience` says.
    pub async fn open_with(url: &str, patience: Patience) -> Result<PgStore> {
        let db = Database::open(url, "arbor-approval", schema::SCHEMA, &[], patience)
            .await
            .map_err(|e| match e {
                DbError::Unavailable(m) => Error::Unavailable(m),
                other => Error::Storage(other.to_string()),
            })?;
        let reachable = db.reachability(HEALTH_PERIOD);
        let clock = db.server_clock().await;
        Ok(PgStore {
            db,
            clock,
            instance: uuid::Uuid::new_v4().simple().to_string().into(),
            commits: Arc::new(AtomicU64::new(0)),
            reachable,
        })
    }

    /// Runs `body` as one SQL transaction on a blocking thread, again when it conflicts with
    /// another (a unique violation or a deadlock); answers after the commit.
    async fn transact<T: Send + 'static>(
        &self,
        body: impl Fn(&PgTx<'_>) -> Result<T, Fail> + Send + 'static,
    ) -> Result<T> {
        let (db, instance, commits, clock) = (
            self.db.clone(),
            self.instance.clone(),
            self.commits.clone(),
            self.clock.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let outcome = transact_blocking(&db, &instance, &clock, &body);
            if outcome.is_ok() {
                commits.fetch_add(1, Ordering::Relaxed);
            }
            outcome
        })
        .await
        .map_err(|e| Error::Storage(format!("store task failed: {e}")))?
    }

    /// Whether the run has an approval that may still be cancelled, as committed now.
    fn any_cancellable(&self, run_id: &str) -> Result<bool> {
        let client = self.db.client_blocking()?;
        let row = wait(client.prepared_query_opt(ANY_CANCELLABLE_OF_RUN, &[&run_id]))
            .map_err(db_error)?;
        Ok(row.is_some())
    }

    fn meta(&self, key: &str) -> Result<Option<u64>> {
        let client = self.db.client_blocking()?;
        let row = wait(
            client.prepared_query_opt("SELECT value FROM approval_meta WHERE key = $1", &[&key]),
        )
        .map_err(db_error)?;
        Ok(row.map(|r| r.get::<_, i64>(0).max(0) as u64))
    }
}

/// An id for each of `n` decisions, generated once per call so that a transaction run again
/// reuses them.
fn decision_ids(n: usize) -> Vec<String> {
    (0..n).map(|_| uuid::Uuid::now_v7().to_string()).collect()
}

/// `each` of `items` taken in the order of their request ids (`id`), its outcomes answered in
/// the order given; the first failure ends it. A transaction that changes several approvals
/// locks their rows in this order, as every other does, so no two wait for each other in a
/// circle (PostgreSQL would break the circle only after `deadlock_timeout`, a second).
fn in_id_order<I, O>(
    items: &[I],
    id: impl Fn(&I) -> &String,
    mut each: impl FnMut(&I) -> Result<O, Fail>,
) -> Result<Vec<O>, Fail> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| id(&items[a]).cmp(id(&items[b])));
    let mut outcomes: Vec<Option<O>> = (0..items.len()).map(|_| None).collect();
    for i in order {
        outcomes[i] = Some(each(&items[i])?);
    }
    Ok(outcomes.into_iter().flatten().collect())
}

fn transact_blocking<T>(
    db: &Database,
    instance: &str,
    clock: &ServerClock,
    body: &impl Fn(&PgTx<'_>) -> Result<T, Fail>,
) -> Result<T> {
    let mut attempt = 0;
    // Whether the transaction ran again on a new connection after its connection was found
    // closed before its COMMIT went out.
    let mut reconnected = false;
    loop {
        attempt += 1;
        // A failure, and whether it came before the COMMIT went out.
        let ran = (|| -> Result<Result<T, Error>, (DbError, bool)> {
            let client = db.client_blocking().map_err(|e| (e, true))?;
            let tx = PgTx::begin(&client, instance, clock.now_ms());
            let outcome = body(&tx);
            let result = match outcome {
                Ok(v) => tx.commit().map(|()| Ok(v)).map_err(|e| (e, false)),
                Err(Fail::Rule(e)) => Ok(Err(e)),
                Err(Fail::Db(e)) => Err((e, true)),
            };
            if !matches!(result, Ok(Ok(_))) {
                tx.rollback();
            }
            result
        })();
        match ran {
            Ok(outcome) => return outcome,
            Err((DbError::Conflict(_), _)) if attempt < MAX_TRIES => {
                let micros = 100u64 << attempt.min(8);
                std::thread::sleep(Duration::from_micros(fastrand::u64(0..=micros)));
            }
            // A connection the server closed (it restarted) fails the first statement sent on
            // it, and the pool does not lend it again; nothing was committed, since no COMMIT
            // went out: the transaction runs again, once, on another connection.
            Err((DbError::Unavailable(why), true)) if !reconnected => {
                reconnected = true;
                tracing::debug!(error = %why, "connection lost before commit; trying another");
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

impl ApprovalStore for PgStore {
    async fn put_request(
        &self,
        request: ApprovalRequest,
        unknown_kind: Option<i32>,
    ) -> Result<Put> {
        self.transact(move |tx| rules::put(tx, &request, unknown_kind))
            .await
    }

    /// In one transaction: the trace rides in the round trip of the record's lookup.
    async fn put_traced_request(
        &self,
        request: ApprovalRequest,
        unknown_kind: Option<i32>,
        traceparent: &str,
    ) -> Result<Put> {
        let mut puts = self
            .put_traced_requests(vec![(request, unknown_kind, traceparent.to_string())])
            .await?;
        puts.pop()
            .ok_or_else(|| Error::Storage("a batch of one stored nothing".into()))
    }

    /// All in one transaction: one commit (and one WAL flush) for a whole batch of the
    /// runner's events.
    async fn put_traced_requests(
        &self,
        requests: Vec<(ApprovalRequest, Option<i32>, String)>,
    ) -> Result<Vec<Put>> {
        self.put_and_decide_requests(requests, |_| None).await
    }

    /// All in one transaction, the decisions too: a request the policy decides costs one
    /// record write and no transaction of its own.
    async fn put_and_decide_requests(
        &self,
        requests: Vec<(ApprovalRequest, Option<i32>, String)>,
        decide: impl Fn(&Approval) -> Option<NewDecision> + Send + Sync + 'static,
    ) -> Result<Vec<Put>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let decision_ids = decision_ids(requests.len());
        let ids: Vec<String> = requests
            .iter()
            .map(|(request, _, _)| request.request_id.clone())
            .collect();
        self.transact(move |tx| {
            // The traces go with the first statement, all in one.
            for (request, _, traceparent) in &requests {
                if !traceparent.is_empty() {
                    tx.put_trace(&request.request_id, traceparent);
                }
            }
            tx.lock_ahead(&ids.iter().map(String::as_str).collect::<Vec<_>>(), true)?;
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

    async fn resolve_request(&self, request_id: &str, decision: NewDecision) -> Result<Resolved> {
        // Generated once per call, so a transaction run again reuses it.
        let decision_id = uuid::Uuid::now_v7().to_string();
        let request_id = request_id.to_string();
        self.transact(move |tx| rules::resolve(tx, &request_id, &decision, &decision_id))
            .await
    }

    /// All in one transaction: one commit (and one WAL flush) for the decisions taken
    /// together, their approvals and traces locked and read with one statement.
    async fn resolve_requests(
        &self,
        decisions: Vec<(String, NewDecision)>,
    ) -> Result<Vec<Result<Resolved>>> {
        if decisions.is_empty() {
            return Ok(Vec::new());
        }
        let decision_ids = decision_ids(decisions.len());
        self.transact(move |tx| {
            let ids: Vec<&str> = decisions.iter().map(|(id, _)| id.as_str()).collect();
            let traces = tx.lock_ahead_traced(&ids)?;
            let items: Vec<_> = decisions.iter().zip(&decision_ids).collect();
            in_id_order(
                &items,
                |((request_id, _), _)| request_id,
                |((request_id, decision), decision_id)| match rules::resolve(
                    tx,
                    request_id,
                    decision,
                    decision_id,
                ) {
                    Ok(resolved) => Ok(Ok(Resolved {
                        traceparent: traces.get(request_id.as_str()).cloned(),
                        ..resolved
                    })),
                    Err(Fail::Rule(e)) => Ok(Err(e)),
                    Err(e) => Err(e),
                },
            )
        })
        .await
    }

    async fn expire(&self, request_id: &str) -> Result<Approval> {
        let decision_id = uuid::Uuid::now_v7().to_string();
        let request_id = request_id.to_string();
        self.transact(move |tx| rules::expire(tx, &request_id, &decision_id))
            .await
    }

    async fn record_delivery(
        &self,
        request_id: &str,
        decision_id: &str,
        outcome: DeliveryOutcome,
    ) -> Result<Option<Approval>> {
        let (request_id, decision_id) = (request_id.to_string(), decision_id.to_string());
        self.transact(move |tx| rules::record_delivery(tx, &request_id, &decision_id, &outcome))
            .await
    }

    /// All in one transaction: one commit (and one WAL flush) for the deliveries that finished
    /// together; any failure fails the call and changes nothing.
    async fn record_deliveries(
        &self,
        attempts: Vec<(String, String, DeliveryOutcome)>,
    ) -> Result<Vec<Result<Option<Approval>>>> {
        if attempts.is_empty() {
            return Ok(Vec::new());
        }
        let recorded = self
            .transact(move |tx| {
                let ids: Vec<&str> = attempts.iter().map(|(id, _, _)| id.as_str()).collect();
                tx.lock_ahead(&ids, false)?;
                in_id_order(
                    &attempts,
                    |(request_id, _, _)| request_id,
                    |(request_id, decision_id, outcome)| {
                        rules::record_delivery(tx, request_id, decision_id, outcome)
                    },
                )
            })
            .await?;
        Ok(recorded.into_iter().map(Ok).collect())
    }

    async fn ack_result(&self, request_id: &str, decision_id: &str) -> Result<Approval> {
        let (request_id, decision_id) = (request_id.to_string(), decision_id.to_string());
        self.transact(move |tx| rules::ack(tx, &request_id, &decision_id))
            .await
    }

    /// All in one transaction: one commit (and one WAL flush) for the consumptions of a whole
    /// batch of the runner's events. One that is missing or that the rules refuse answers its
    /// error alone, having written nothing; any other failure fails the call and changes
    /// nothing.
    async fn ack_and_prune_all(
        &self,
        consumed: Vec<Consumed>,
    ) -> Result<Vec<Result<(Approval, Approval)>>> {
        if consumed.is_empty() {
            return Ok(Vec::new());
        }
        self.transact(move |tx| {
            let ids: Vec<&str> = consumed.iter().map(|c| c.request_id.as_str()).collect();
            tx.lock_ahead(&ids, false)?;
            in_id_order(
                &consumed,
                |c| &c.request_id,
                |c| {
                    let refused = |e: Fail| match e {
                        Fail::Rule(e) => Ok(Err(e)),
                        other => Err(other),
                    };
                    let a = match rules::load(tx, &c.request_id) {
                        Ok(a) => a,
                        Err(e) => return refused(e),
                    };
                    match rules::consumption(tx, &a, &c.decision_id, c.delivered) {
                        Ok(n) => rules::consume(tx, &a, n).map(Ok),
                        Err(e) => refused(e),
                    }
                },
            )
        })
        .await
    }

    async fn prune_result(&self, request_id: &str) -> Result<Approval> {
        let request_id = request_id.to_string();
        self.transact(move |tx| rules::prune(tx, &request_id)).await
    }

    async fn cancel(&self, request_id: &str, actor: &str, reason: &str) -> Result<Approval> {
        let (request_id, actor, reason) = (
            request_id.to_string(),
            actor.to_string(),
            reason.to_string(),
        );
        self.transact(move |tx| {
            let a = rules::load(tx, &request_id)?;
            rules::cancel(tx, &a, &actor, &reason)
        })
        .await
    }

    /// One look for all of them (see `cancel_run`).
    fn runs_to_cancel(&self, run_ids: &[String]) -> Result<HashSet<String>> {
        if run_ids.is_empty() {
            return Ok(HashSet::new());
        }
        let client = self.db.client_blocking()?;
        let rows = wait(client.prepared_query(RUNS_TO_CANCEL, &[&run_ids])).map_err(db_error)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Most runs end with nothing left to cancel (the runner withdraws a run's open suspensions
    /// in the step that ends it), so a look outside any transaction answers those without one.
    /// It sees what a transaction's first statement would: an approval committed since is not
    /// among either's, and one cancelled or decided meanwhile is locked and read again below.
    /// The look blocks the calling thread, as every read does: a pooled connection held across
    /// an await on the service's runtime could wait for a thread that waits for a connection.
    async fn cancel_run(&self, run_id: &str, actor: &str, reason: &str) -> Result<Vec<Approval>> {
        if !self.any_cancellable(run_id)? {
            return Ok(Vec::new());
        }
        let (run_id, actor, reason) = (run_id.to_string(), actor.to_string(), reason.to_string());
        self.transact(move |tx| {
            let mut changed = Vec::new();
            for id in tx.cancellable_of_run(&run_id)? {
                let a = rules::load(tx, &id)?;
                if rules::cancellable(&a) {
                    changed.push(rules::cancel(tx, &a, &actor, &reason)?);
                }
            }
            Ok(changed)
        })
        .await
    }

    async fn append_audit(&self, entry: AuditEntry) -> Result<AuditEntry> {
        self.transact(move |tx| Records::audit(tx, entry.clone()))
            .await
    }

    fn get(&self, request_id: &str) -> Result<Option<Approval>> {
        let client = self.db.client_blocking()?;
        let row = wait(client.prepared_query_opt(
            "SELECT record::text FROM approval_records WHERE request_id = $1",
            &[&request_id],
        ))
        .map_err(db_error)?;
        row.map(|r| decode(r.get(0))).transpose()
    }

    fn get_many(&self, request_ids: &[String]) -> Result<Vec<Approval>> {
        let client = self.db.client_blocking()?;
        let rows = wait(client.prepared_query(
            "SELECT record::text FROM approval_records r \
             JOIN unnest($1::text[]) WITH ORDINALITY AS u(id, i) ON r.request_id = u.id \
             ORDER BY u.i",
            &[&request_ids],
        ))
        .map_err(db_error)?;
        rows.iter().map(|r| decode(r.get(0))).collect()
    }

    fn list(
        &self,
        filter: &Filter,
        page_size: usize,
        page_token: Option<&str>,
        now_ms: u64,
    ) -> Result<Page<Approval>> {
        self.list_approvals(filter, page_size, page_token, now_ms)
    }

    fn audit(
        &self,
        query: &AuditQuery,
        page_size: usize,
        page_token: Option<&str>,
    ) -> Result<Page<AuditEntry>> {
        self.list_audit(query, page_size, page_token)
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn next_deadline(&self) -> Result<Option<(u64, String)>> {
        let client = self.db.client_blocking()?;
        let row = wait(client.prepared_query_opt(
            "SELECT deadline_ms, request_id FROM approval_records
             WHERE state = 'PENDING' AND deadline_ms > 0
             ORDER BY deadline_ms, request_id LIMIT 1",
            &[],
        ))
        .map_err(db_error)?;
        Ok(row.map(|r| (r.get::<_, i64>(0) as u64, r.get(1))))
    }

    fn pending_count(&self) -> Result<u64> {
        let client = self.db.client_blocking()?;
        let row = wait(client.prepared_query_one(
            "SELECT count(*) FROM approval_records WHERE state = 'PENDING'",
            &[],
        ))
        .map_err(db_error)?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }

    fn undelivered(&self) -> Result<Vec<Approval>> {
        let due = self.undelivered_traced()?;
        Ok(due.into_iter().map(|(approval, _)| approval).collect())
    }

    /// One query a page, the traces joined in.
    fn undelivered_traced(&self) -> Result<Vec<(Approval, Option<String>)>> {
        let client = self.db.client_blocking()?;
        let (mut out, mut after) = (Vec::new(), i64::MIN);
        loop {
            let rows = wait(client.prepared_query(OUTBOX_PAGE, &[&after])).map_err(db_error)?;
            for row in &rows {
                out.push((decode(row.get(0))?, row.get(2)));
                after = row.get(1);
            }
            if rows.len() < OUTBOX_PAGE_ROWS {
                return Ok(out);
            }
        }
    }

    /// One query, the traces joined in.
    fn undelivered_of(&self, request_ids: &[String]) -> Result<Vec<(Approval, Option<String>)>> {
        let client = self.db.client_blocking()?;
        let rows = wait(client.prepared_query(
            "SELECT r.record::text, t.traceparent FROM approval_records r \
             LEFT JOIN approval_traces t ON t.request_id = r.request_id \
             WHERE r.request_id = ANY($1) AND r.awaiting_delivery ORDER BY r.arrival",
            &[&request_ids],
        ))
        .map_err(db_error)?;
        rows.iter()
            .map(|row| Ok((decode(row.get(0))?, row.get(1))))
            .collect()
    }

    fn cursor(&self) -> Result<Option<u64>> {
        self.meta(CURSOR_KEY)
    }

    fn set_cursor(&self, seq: u64) -> Result<()> {
        let client = self.db.client_blocking()?;
        wait(client.prepared_execute(
            "INSERT INTO approval_meta (key, value) VALUES ($1, $2), ($3, $4)
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            &[
                &CURSOR_KEY,
                &clamp(seq),
                &CURSOR_AT_KEY,
                &clamp(self.now_ms()),
            ],
        ))
        .map_err(db_error)?;
        Ok(())
    }

    fn cursor_acked_at(&self) -> Result<Option<u64>> {
        self.meta(CURSOR_AT_KEY)
    }

    /// Deletes batch by batch, each batch one statement (so one transaction): the approvals,
    /// then their audit entries and traces. Final approvals never change again, so nothing
    /// races the delete.
    async fn compact(&self, cutoff_ms: u64) -> Result<Compacted> {
        let cutoff = clamp(cutoff_ms);
        let mut total = Compacted::default();
        loop {
            // On the pool's runtime: a pooled connection held across an await on the service's
            // runtime could wait for a thread of it that blocks waiting for a connection.
            let db = self.db.clone();
            let row = self
                .db
                .run(async move {
                    let client = db.client().await?;
                    client
                        .query_one(COMPACT_ONE_BATCH, &[&cutoff, &COMPACT_BATCH])
                        .await
                        .map_err(DbError::from)
                })
                .await?;
            let approvals: i64 = row.get(0);
            let audit: i64 = row.get(1);
            total += Compacted {
                approvals: approvals.max(0) as u64,
                audit_entries: audit.max(0) as u64,
            };
            if approvals < COMPACT_BATCH {
                return Ok(total);
            }
        }
    }

    fn put_trace(&self, request_id: &str, traceparent: &str) -> Result<()> {
        let client = self.db.client_blocking()?;
        let (ids, traceparents) = ([request_id], [traceparent]);
        wait(client.prepared_execute(tx::TRACES_UPSERT, &[&&ids[..], &&traceparents[..]]))
            .map_err(db_error)?;
        Ok(())
    }

    fn trace(&self, request_id: &str) -> Result<Option<String>> {
        let client = self.db.client_blocking()?;
        let row = wait(client.prepared_query_opt(
            "SELECT traceparent FROM approval_traces WHERE request_id = $1",
            &[&request_id],
        ))
        .map_err(db_error)?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Every write answered after its commit, which the server made durable.
    async fn flush(&self) -> Result<()> {
        Ok(())
    }

    /// Commits so far: each one waited for the server's WAL flush.
    fn fsyncs(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    async fn lead(&self) -> Result<Option<Leadership>> {
        lead::try_lead(&self.db, None).await
    }

    async fn lead_as(&self, replica: &str) -> Result<Option<Leadership>> {
        lead::try_lead(&self.db, Some(replica)).await
    }

    async fn leader(&self) -> Result<Option<String>> {
        lead::leader(&self.db).await
    }

    fn foreign_changes(&self) -> Option<mpsc::UnboundedReceiver<String>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let instance = self.instance.clone();
        let listened = self.db.listen(&[CHANNEL], move |_, payload| {
            let id = match payload.split_once(' ') {
                Some((from, _)) if from == &*instance => return,
                Some((_, id)) => id,
                // A reconnect ("", ""): whatever was notified meanwhile is unknown.
                None => "",
            };
            let _ = tx.send(id.to_string());
        });
        match listened {
            Ok(()) => Some(rx),
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for other replicas' changes");
                None
            }
        }
    }

    fn reachable(&self) -> Option<watch::Receiver<bool>> {
        Some(self.reachable.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_approvals_are_taken_in_byte_order_and_answered_in_the_order_given() {
        let items: Vec<String> = ["b", "B", "a", "é", "a0"].map(String::from).to_vec();
        let mut taken = Vec::new();
        let outcomes = in_id_order(
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
