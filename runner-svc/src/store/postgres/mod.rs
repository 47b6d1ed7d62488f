//! The PostgreSQL backend: the runner's tables as rows `(t, k, v)` of one table, shared by
//! every replica that opens the same database.
//!
//! - A body's reads are statements (one statement for all the rows it names at once with
//!   `prefetch`), each row read once per transaction; its writes are kept until it returns and
//!   then written together with the COMMIT, in one round trip. The rows the bodies of a batch
//!   named when they were queued (`Store::commit_reading`) are all read by the batch's first
//!   statement. A serialisation failure,
//!   deadlock or unique violation is a conflict: the bodies run again in a new transaction, as
//!   in the embedded store.
//! - Transactions come in three kinds:
//!   - **Durable batches** (`commit`): the bodies queued meanwhile, in one transaction on a
//!     thread and connection of their own, answering once PostgreSQL has the WAL on disk
//!     (`synchronous_commit` as the server sets it, `on` by default). Each takes the writer
//!     lock before its snapshot, so the durable batches of all replicas take turns and each
//!     sees every one before it; that is what keeps the event log gap-free and in commit order
//!     (the counter row `meta/next_seq` is read and written by every appending batch). A batch
//!     takes its bodies once it has the lock, so all those queued during another replica's
//!     turn go in together. Among themselves they are serial, so they run at `REPEATABLE
//!     READ`: against the transactions beside them (claims, and the single ones below), every
//!     conflict the runner relies on is two writes of one row, which `REPEATABLE READ` refuses
//!     as `SERIALIZABLE` does (the fencing of a claimed job, a wake-up folded into a queued job
//!     a claim takes). Predicate locks would add nothing there but false conflicts, which
//!     failed 4 in 10 such batches. The one exception is a thread's interrupt
//!     ([`Commit::Serializable`]), which reads what a claim writes and writes what it reads
//!     with no row written by both: a batch that holds one is raised to `SERIALIZABLE` before
//!     its first read, so that the predicate locks refuse the pair.
//!   - **Claim batches** (`apply`): the same, on a second thread and connection, without the
//!     writer lock and without waiting for the flush (`synchronous_commit = off`: a claim lost
//!     in a crash leaves its job queued). `SERIALIZABLE`. Claimers take their queue entries
//!     with `FOR UPDATE SKIP LOCKED` (`lock_first`), so the claim batches of several replicas
//!     take different jobs at once.
//!   - **Single transactions** (`transact`: nacks, lease extensions and ends) at
//!     `SERIALIZABLE`, and single statements (`insert_new`).
//! - Counters move without being read (`add`): a durable batch adds to a counter's own row,
//!   any other transaction to one of [`STRIPES`] rows of it, picked at random, so that two
//!   transactions rarely move one row at once; `counter` sums them.
//! - What a transaction's bodies declared they wake (`Txn::wake`: appended events, queued
//!   jobs, task changes) is notified to every other replica right after its COMMIT, in the
//!   same round trip, and only if it committed ([`wake`]).
//! - Statements are prepared once per connection. The batch threads drive their own
//!   connections while they wait, so their round trips skip the hand-over to the pool's
//!   runtime and back.
//! - Leases, timers and every time the runner writes use the database's clock
//!   ([`ServerClock`]): the offset of the local clock from the server's is measured at open
//!   and every few seconds.
//!
//! The parts: [`schema`] (the table, its migrations, how transactions begin, the statements),
//! [`batch`] (the batch threads and how a transaction is run again), [`tx`] (one SQL
//! transaction: reads, buffered writes, COMMIT), [`read`] (reads and paged scans outside
//! transactions), [`wake`] (notifications between replicas).

mod batch;
mod read;
mod schema;
mod tx;
mod wake;

use std::{
    collections::VecDeque,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc,
    },
    time::Duration,
};

use arbor_shared::postgres::{Database, DbError, Patience, Prepared, ServerClock, wait};

pub use schema::{
    COUNTER_ROWS, DELETE_KEYS, LAST_IN_RANGE, LOCK_FIRST, OPEN_PATIENCE, SCAN_RANGE, SESSION,
};

use self::{
    batch::{Conn, Lane, Queued, Setup, committer_loop, run_bodies},
    read::{Scan, place, prefix_end, read_many, read_one},
    schema::{
        BEGIN, FIRST_PAGE, ID_BLOCK, LAST_FROM, READ_MANY_AND_RANGE, SCAN_PAGE, SCHEMA,
        raise_sequence, sequence_name,
    },
    tx::stripe_key,
    wake::Origin,
};
use super::{
    Backend, Body, Change, Commit, Entries, Failed, Fault, InOrder, ManyAndPrefix, OpenError,
    Pending, Reads, Sequence, Stats, Store, StoreError, T, Value,
};

impl From<DbError> for StoreError {
    fn from(e: DbError) -> Self {
        match e {
            // A login refused while serving (a password or role changed): as unreachable as a
            // server that is down, until someone puts it right.
            DbError::Unavailable(m) | DbError::Misconfigured(m) => StoreError::Unavailable(m),
            other => StoreError::Failed(other.to_string()),
        }
    }
}

impl From<DbError> for Fault {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Conflict(_) => Fault::Conflict,
            other => Fault::Storage(other.into()),
        }
    }
}

impl Store {
    /// Opens the runner's tables in the PostgreSQL database at `url`, creating or migrating
    /// them (under an advisory lock, so replicas starting together migrate once). Waits up to
    /// 30 s for an unreachable database; refuses a wrong login, a missing database and a
    /// schema newer than this binary's at once.
    pub async fn open_postgres(url: &str) -> Result<Self, DbError> {
        Self::open_postgres_with(url, Patience::Reachable(OPEN_PATIENCE)).await
    }

    /// [`open_postgres`](Self::open_postgres) as [`store::open`](super::open) does: waiting for
    /// an unreachable database for as long as it takes when `wait_always` says so.
    pub(super) async fn open_postgres_waiting(
        url: &str,
        wait_always: bool,
    ) -> Result<Self, OpenError> {
        let patience = match wait_always {
            true => Patience::Always,
            false => Patience::Reachable(OPEN_PATIENCE),
        };
        Self::open_postgres_with(url, patience)
            .await
            .map_err(|e| OpenError::new(format!("cannot open the runner's PostgreSQL store: {e}")))
    }

    /// [`open_postgres`](Self::open_postgres), waiting for the database as `patience` says.
    pub async fn open_postgres_with(url: &str, patience: Patience) -> Result<Self, DbError> {
        let db = Database::open(url, "arbor-runner", SCHEMA, SESSION, patience).await?;
        // The log's table, as this connection's `search_path` finds it: the event log that a
        // notification of events names (several runners' schemas may share one database, and
        // notifications go to the whole database).
        let log: u32 = db
            .client()
            .await?
            .query_one("SELECT 'runner_kv'::regclass::oid", &[])
            .await
            .map_err(DbError::from)?
            .get(0);
        let reachable = db.reachability(Duration::from_millis(500));
        let clock = db.server_clock().await;
        let backend = Arc::new(PgBackend::new(db, reachable, log, clock));
        Ok(Store::new(backend))
    }
}

/// Keys of rows, each with its table.
type Keys = Vec<(T, Value)>;

/// What the batch threads have done so far (see [`Backend::stats`]).
#[derive(Default)]
struct Counts {
    flushes: AtomicU64,
    batches: AtomicU64,
    bodies: AtomicU64,
    conflicts: AtomicU64,
}

struct PgBackend {
    db: Database,
    /// Whether the database answers (probed twice a second).
    reachable: tokio::sync::watch::Receiver<bool>,
    /// The database server's clock, which every replica's times are on.
    clock: ServerClock,
    /// The batched commit of durable writes.
    committer: mpsc::Sender<Queued>,
    origin: Arc<Origin>,
    /// The batched commit of writes that need not be durable (claims).
    claimer: mpsc::Sender<Queued>,
    /// Ids handed out next, up to (not including) the end of the block taken from the
    /// sequence: one round trip per 64 ids.
    ids: std::sync::Mutex<(u64, u64)>,
    counts: Arc<Counts>,
    /// Keys nearly every batched commit reads (see [`Backend::hot_keys`]).
    hot: Arc<OnceLock<Keys>>,
}

impl PgBackend {
    fn new(
        db: Database,
        reachable: tokio::sync::watch::Receiver<bool>,
        log: u32,
        clock: ServerClock,
    ) -> Self {
        let counts = Arc::new(Counts::default());
        let hot: Arc<OnceLock<Keys>> = Arc::default();
        let origin = Arc::new(Origin {
            name: format!("{:016x}", fastrand::u64(..)),
            log,
            idle: OnceLock::new(),
        });
        let lane = |lane: Lane| {
            let (queue, queued) = mpsc::channel::<Queued>();
            let (db, counts, hot) = (db.clone(), counts.clone(), hot.clone());
            let origin = origin.clone();
            // The thread ends when the backend (the only sender) is dropped.
            let spawned = std::thread::Builder::new()
                .name(lane.thread.into())
                .spawn(move || committer_loop(&db, &queued, &counts, &hot, lane, &origin));
            if let Err(e) = spawned {
                tracing::error!("cannot start a commit thread: {e}");
            }
            queue
        };
        let committer = lane(Lane::DURABLE);
        let claimer = lane(Lane::UNFLUSHED);
        Self {
            db,
            reachable,
            clock,
            committer,
            origin,
            claimer,
            ids: std::sync::Mutex::new((0, 0)),
            counts,
            hot,
        }
    }
}

impl Backend for PgBackend {
    fn get(&self, t: T, key: &[u8]) -> Result<Option<Value>, StoreError> {
        let client = self.db.client_blocking()?;
        Ok(read_one(&client, t, key)?)
    }

    fn get_many(&self, keys: &[(T, &[u8])]) -> Result<Vec<Option<Value>>, StoreError> {
        let client = self.db.client_blocking()?;
        Ok(wait(read_many(&client, keys.iter().copied()))?)
    }

    fn get_many_and_prefix(
        &self,
        keys: &[(T, &[u8])],
        t: T,
        prefix: &[u8],
    ) -> Result<ManyAndPrefix, StoreError> {
        let Some(end) = prefix_end(prefix) else {
            return super::read_apart(self, keys, t, prefix);
        };
        let client = self.db.client_blocking()?;
        let (tables, keys): (Vec<i16>, Vec<&[u8]>) =
            keys.iter().map(|(t, k)| (*t as i16, *k)).unzip();
        let rows = wait(client.prepared_query(
            READ_MANY_AND_RANGE,
            &[&tables, &keys, &(t as i16), &prefix, &end],
        ))
        .map_err(DbError::from)?;
        let mut values = vec![None; keys.len()];
        let mut entries = Vec::new();
        for row in rows {
            let (i, v): (i64, Value) = (row.get(0), row.get(2));
            if i == 0 {
                entries.push((row.get::<_, Value>(1), v));
            } else {
                place(&mut values, i, v);
            }
        }
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok((values, entries))
    }

    fn scan(&self, t: T, prefix: &[u8], from: &[u8]) -> Entries<'static> {
        self.scan_wanting(t, prefix, from, FIRST_PAGE as usize)
    }

    fn scan_wanting(&self, t: T, prefix: &[u8], from: &[u8], wanted: usize) -> Entries<'static> {
        let start = if from > prefix { from } else { prefix }.to_vec();
        Entries::new(Scan {
            db: self.db.clone(),
            t: t as i16,
            from: start,
            end: prefix_end(prefix),
            page: VecDeque::new(),
            size: i64::try_from(wanted)
                .unwrap_or(SCAN_PAGE)
                .clamp(1, SCAN_PAGE),
            done: false,
        })
    }

    fn last(&self, t: T, prefix: &[u8]) -> Result<Option<(Value, Value)>, StoreError> {
        let client = self.db.client_blocking()?;
        let t = t as i16;
        let row = match prefix_end(prefix) {
            Some(end) => wait(client.prepared_query_opt(LAST_IN_RANGE, &[&t, &prefix, &end])),
            None => wait(client.prepared_query_opt(LAST_FROM, &[&t, &prefix])),
        };
        Ok(row.map_err(DbError::from)?.map(|r| (r.get(0), r.get(1))))
    }

    /// Sums the counter's rows: its own and its stripes.
    fn counter(&self, t: T, key: &[u8]) -> Result<i64, StoreError> {
        let client = self.db.client_blocking()?;
        let (stripes, end) = (stripe_key(key, 1), [key, &[1]].concat());
        let rows = wait(client.prepared_query(COUNTER_ROWS, &[&(t as i16), &key, &stripes, &end]))
            .map_err(DbError::from)?;
        Ok(rows
            .iter()
            .map(|r| super::read_counter(r.get::<_, &[u8]>(0)))
            .sum())
    }

    /// One statement in a transaction of its own; the read that follows a lost race sees the
    /// winner's row (`READ COMMITTED`: every statement sees what committed before it began).
    fn insert_new(&self, t: T, key: &[u8], value: &[u8]) -> Result<Option<Value>, StoreError> {
        let client = self.db.client_blocking()?;
        loop {
            let inserted = wait(async {
                let statement = client
                    .prepare_cached(
                        "INSERT INTO runner_kv (t, k, v) VALUES ($1, $2, $3) \
                         ON CONFLICT (t, k) DO NOTHING",
                    )
                    .await?;
                client
                    .execute(&statement, &[&(t as i16), &key, &value])
                    .await
            })
            .map_err(DbError::from)?;
            if inserted == 1 {
                return Ok(None);
            }
            // Held by another write; gone again only if deleted meanwhile: then try again.
            if let Some(held) = read_one(&client, t, key)? {
                return Ok(Some(held));
            }
        }
    }

    fn transact(&self, body: &Body<'_>) -> Result<(), Failed> {
        let setup = Setup {
            begin: BEGIN,
            ahead: &[],
            stripe: None,
            origin: &self.origin,
            conflicts: &self.counts.conflicts,
            begun: false,
        };
        run_bodies(&mut Conn::Pool(&self.db), &[body], setup)
            .pop()
            .unwrap_or(Err(Failed::Aborted))
    }

    /// A durable commit joins the next batch of the durable lane; one that need not be durable
    /// (a claim) the next batch of the other lane, which answers without waiting for the WAL
    /// flush and runs alongside.
    fn commit(
        &self,
        reads: Reads,
        body: Box<Body<'static>>,
        how: Commit,
        in_order: Option<InOrder>,
    ) -> Pending<Result<(), Failed>> {
        let lane = match how {
            Commit::Durable | Commit::Serializable => &self.committer,
            Commit::Unflushed => &self.claimer,
        };
        let (done, answer) = tokio::sync::oneshot::channel();
        let queued = lane.send(Queued {
            reads,
            serializable: how == Commit::Serializable,
            body,
            in_order,
            done,
        });
        Box::pin(async move {
            if queued.is_err() {
                return Err(Failed::Storage(StoreError::Failed(
                    "the commit thread has stopped".into(),
                )));
            }
            answer.await.unwrap_or_else(|_| {
                Err(Failed::Storage(StoreError::Failed(
                    "the commit thread has stopped".into(),
                )))
            })
        })
    }

    /// Every commit already waited for the server's WAL flush.
    fn durable(&self) -> Pending<Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    /// Unique across replicas and restarts, increasing within this process (each takes blocks
    /// of 64 from one sequence): job order across replicas is the order of their blocks.
    fn next_id(&self) -> Result<u64, StoreError> {
        let mut ids = self
            .ids
            .lock()
            .map_err(|_| StoreError::Failed("id block lock poisoned".into()))?;
        if ids.0 >= ids.1 {
            let client = self.db.client_blocking()?;
            let row = wait(client.query_one("SELECT nextval('runner_ids')", &[]))
                .map_err(DbError::from)?;
            let start = row.get::<_, i64>(0).max(1) as u64;
            *ids = (start, start + ID_BLOCK);
        }
        let id = ids.0;
        ids.0 += 1;
        Ok(id)
    }

    /// `nextval` of the sequence's own PostgreSQL sequence, one value at a time (no cache), so
    /// that values go up in the order they are taken whichever replica takes them. `nextval`
    /// is never rolled back and takes no row lock: takers wait for no one and conflict with
    /// nothing.
    fn next_in(&self, sequence: Sequence) -> Result<u64, StoreError> {
        let client = self.db.client_blocking()?;
        let sql = format!("SELECT nextval('{}')", sequence_name(sequence));
        let row = wait(client.query_one(&sql, &[])).map_err(DbError::from)?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }

    /// Looks first without a lock: the sequence is almost always above already.
    fn raise(&self, sequence: Sequence, at_least: u64) -> Result<(), StoreError> {
        let name = sequence_name(sequence);
        let at_least = at_least.min(i64::MAX as u64 - 1);
        let client = self.db.client_blocking()?;
        let look = format!("SELECT last_value, is_called FROM {name}");
        let row = wait(client.query_one(&look, &[])).map_err(DbError::from)?;
        let (last, called) = (row.get::<_, i64>(0).max(0) as u64, row.get::<_, bool>(1));
        let next = if called { last + 1 } else { last };
        if next <= at_least {
            wait(client.batch_execute(&raise_sequence(name, at_least))).map_err(DbError::from)?;
        }
        Ok(())
    }

    /// PostgreSQL does not lose what it acknowledged: nothing to record.
    fn record_progress(&self, _progress: u64) -> Pending<Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    fn size_on_disk(&self) -> u64 {
        let size = || -> Result<i64, DbError> {
            let client = self.db.client_blocking()?;
            Ok(wait(client.query_one("SELECT pg_total_relation_size('runner_kv')", &[]))?.get(0))
        };
        size().map_or(0, |s| s.max(0) as u64)
    }

    /// PostgreSQL checks its own pages (and checksums, where the cluster enables them); what
    /// is left is the tables' cross-references (see `verify`).
    fn verify(&self) -> Result<(), StoreError> {
        super::verify::references(self, &|_| {})?.map_err(StoreError::Failed)
    }

    /// Flushes: durable batches (each waited for its WAL flush); batches and bodies: both
    /// lanes'.
    fn stats(&self) -> Stats {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        Stats {
            flushes: load(&self.counts.flushes),
            batches: load(&self.counts.batches),
            bodies: load(&self.counts.bodies),
            conflicts: load(&self.counts.conflicts),
        }
    }

    fn shared(&self) -> bool {
        true
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn reachable(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        Some(self.reachable.clone())
    }

    /// The first call sets them: the runner names them once, at open.
    fn hot_keys(&self, keys: Vec<(T, Value)>) {
        let _ = self.hot.set(keys);
    }

    /// The first call sets it: the runner names it once, at open.
    fn idle_workers(&self, idle: Arc<AtomicUsize>) {
        let _ = self.origin.idle.set(idle);
    }

    /// One round trip, only when a look found a job waiting for a thread that another replica's
    /// worker holds: that replica looks at once rather than at its next poll.
    fn announce_work(&self) {
        wake::announce_work(&self.db, &self.origin);
    }

    /// See [`wake::listen`].
    fn subscribe(&self, wake: Arc<dyn Fn(Change) + Send + Sync>) {
        if let Err(e) = wake::listen(&self.db, &self.origin, wake) {
            tracing::error!("cannot listen for other replicas' changes: {e}");
        }
    }
}
