//! The PostgreSQL backend (`Backend`, and the reads of `ApprovalStore`), shared by every
//! replica that opens the same database (`approval-svc serve --store postgres://…`).
//!
//! - Every state change is one SQL transaction (READ COMMITTED, see `tx`) that answers after
//!   its commit, which PostgreSQL makes durable before it returns (`synchronous_commit` on, the
//!   default). The row lock is the single winner: of two decisions on one approval, on any
//!   replicas, the second waits for the first and then finds it decided. Two requests with the
//!   same new id race on the primary key; the loser's transaction runs again and finds the
//!   winner's record.
//! - The pending count is `count(*)` over a partial index that holds only PENDING rows: its cost
//!   grows with what is pending, not with history, and no counter row serialises the writers.
//! - Audit ids come from a sequence, taken under a per-run advisory lock held to the commit
//!   (`statements::AUDIT_ID`).
//! - Other replicas' changes arrive as notifications (`foreign_changes`); the leader's lock is a
//!   session-level advisory lock (`lead`).

mod lead;
mod query;
mod schema;
mod statements;
mod tx;
mod webhooks;

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use arbor_shared::postgres::{
    Database, DbError, Patience, Prepared, ServerClock,
    tokio_postgres::{Row, types::ToSql},
    wait,
};
use serde::{Serialize, de::DeserializeOwned};
use tokio::sync::{mpsc, watch};

use self::tx::{Fail, PgTx};
use super::{
    ApprovalStore, Backend, Compacted, Leadership,
    webhooks::{RouteCell, routes_in},
};
use crate::{
    error::{Error, Result},
    model::{Approval, AuditEntry, AuditQuery, Filter, Page},
    webhooks::Routes,
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
    /// Which webhook endpoints want which events.
    routes: RouteCell,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").finish_non_exhaustive()
    }
}

impl PgStore {
    /// Opens the approval tables at `url`, creating or migrating them (once, under an advisory
    /// lock); waits up to 30 s for an unreachable database, refuses a wrong login, a missing
    /// database and a newer schema at once.
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
            routes: RouteCell::default(),
        })
    }

    /// One prepared statement on a pooled connection, blocking the calling thread: a pooled
    /// connection held across an await on the service's runtime could wait for a thread that
    /// waits for a connection.
    fn rows(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        let client = self.db.client_blocking()?;
        wait(client.prepared_query(sql, params)).map_err(db_error)
    }

    fn meta(&self, key: &str) -> Result<Option<u64>> {
        let rows = self.rows("SELECT value FROM approval_meta WHERE key = $1", &[&key])?;
        Ok(rows.first().map(|r| r.get::<_, i64>(0).max(0) as u64))
    }
}

fn transact_blocking<T>(
    db: &Database,
    instance: &str,
    clock: &ServerClock,
    routes: &Routes,
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
            let tx = PgTx::begin(&client, instance, clock.now_ms(), routes);
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

impl Backend for PgStore {
    type Fail = Fail;
    type Tx<'t> = PgTx<'t>;

    /// On a blocking thread; the server makes every commit durable, whatever `durable` says.
    async fn transact<T: Send + 'static>(
        &self,
        _durable: bool,
        body: impl Fn(&PgTx<'_>) -> Result<T, Fail> + Send + 'static,
    ) -> Result<T> {
        let (db, instance, commits, clock, routes) = (
            self.db.clone(),
            self.instance.clone(),
            self.commits.clone(),
            self.clock.clone(),
            self.routes.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let outcome = transact_blocking(&db, &instance, &clock, routes_in(&routes), &body);
            if outcome.is_ok() {
                commits.fetch_add(1, Ordering::Relaxed);
            }
            outcome
        })
        .await
        .map_err(|e| Error::Storage(format!("store task failed: {e}")))?
    }

    fn refusal(fail: Fail) -> Result<Error, Fail> {
        match fail {
            Fail::Rule(e) => Ok(e),
            other => Err(other),
        }
    }

    /// It sees what a transaction's first statement would (one cancelled or decided meanwhile
    /// is locked and read again); the transaction locks the run's approvals itself.
    fn cancellable_ids(&self, run_id: &str) -> Result<Option<Vec<String>>> {
        let rows = self.rows(ANY_CANCELLABLE_OF_RUN, &[&run_id])?;
        Ok((!rows.is_empty()).then(Vec::new))
    }
}

impl ApprovalStore for PgStore {
    /// One look for all of them (see `cancel_run`).
    fn runs_to_cancel(&self, run_ids: &[String]) -> Result<HashSet<String>> {
        if run_ids.is_empty() {
            return Ok(HashSet::new());
        }
        let rows = self.rows(RUNS_TO_CANCEL, &[&run_ids])?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    fn get(&self, request_id: &str) -> Result<Option<Approval>> {
        let sql = "SELECT record::text FROM approval_records WHERE request_id = $1";
        let row = self.rows(sql, &[&request_id])?.into_iter().next();
        row.map(|r| decode(r.get(0))).transpose()
    }

    fn get_many(&self, request_ids: &[String]) -> Result<Vec<Approval>> {
        let rows = self.rows(
            "SELECT record::text FROM approval_records r \
             JOIN unnest($1::text[]) WITH ORDINALITY AS u(id, i) ON r.request_id = u.id \
             ORDER BY u.i",
            &[&request_ids],
        )?;
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

    fn count(&self, filter: &Filter, limit: usize, now_ms: u64) -> Result<usize> {
        self.count_approvals(filter, limit, now_ms)
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
        let rows = self.rows(
            "SELECT deadline_ms, request_id FROM approval_records
             WHERE state = 'PENDING' AND deadline_ms > 0
             ORDER BY deadline_ms, request_id LIMIT 1",
            &[],
        )?;
        Ok(rows.first().map(|r| (r.get::<_, i64>(0) as u64, r.get(1))))
    }

    fn pending_count(&self) -> Result<u64> {
        let sql = "SELECT count(*) FROM approval_records WHERE state = 'PENDING'";
        Ok(self
            .rows(sql, &[])?
            .first()
            .map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
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
        let rows = self.rows(
            "SELECT r.record::text, t.traceparent FROM approval_records r \
             LEFT JOIN approval_traces t ON t.request_id = r.request_id \
             WHERE r.request_id = ANY($1) AND r.awaiting_delivery ORDER BY r.arrival",
            &[&request_ids],
        )?;
        rows.iter()
            .map(|row| Ok((decode(row.get(0))?, row.get(1))))
            .collect()
    }

    fn cursor(&self) -> Result<Option<u64>> {
        self.meta(CURSOR_KEY)
    }

    fn set_cursor(&self, seq: u64) -> Result<()> {
        let now = clamp(self.now_ms());
        self.rows(
            "INSERT INTO approval_meta (key, value) VALUES ($1, $2), ($3, $4)
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            &[&CURSOR_KEY, &clamp(seq), &CURSOR_AT_KEY, &now],
        )
        .map(drop)
    }

    fn cursor_acked_at(&self) -> Result<Option<u64>> {
        self.meta(CURSOR_AT_KEY)
    }

    /// Deletes batch by batch, each batch one statement (so one transaction). Final approvals
    /// never change again, so nothing races the delete.
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
            let (approvals, audit): (i64, i64) = (row.get(0), row.get(1));
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
        let (ids, traceparents) = ([request_id], [traceparent]);
        self.rows(tx::TRACES_UPSERT, &[&&ids[..], &&traceparents[..]])
            .map(drop)
    }

    fn trace(&self, request_id: &str) -> Result<Option<String>> {
        let sql = "SELECT traceparent FROM approval_traces WHERE request_id = $1";
        Ok(self.rows(sql, &[&request_id])?.first().map(|r| r.get(0)))
    }

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
