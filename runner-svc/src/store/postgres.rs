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
//! - A durable batch that appends events or queues jobs notifies `arbor_runner_events` /
//!   `arbor_runner_work` right after its COMMIT, in the same round trip; every replica listens
//!   and wakes its streams and idle workers. The notifications go out only if the batch
//!   committed: one that rolled back tells nobody its seqs are durable. Jobs this process has
//!   idle workers for are not announced: its own workers take them, and every other
//!   replica's would only race them.
//!   The notification is a hint: the runner also looks every second.
//! - Statements are prepared once per connection. The batch threads drive their own
//!   connections while they wait, so their round trips skip the hand-over to the pool's
//!   runtime and back.
//! - Leases, timers and every time the runner writes use the database's clock
//!   ([`ServerClock`]): the offset of the local clock from the server's is measured at open
//!   and every few seconds.

use std::{
    cell::RefCell,
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc,
    },
    time::Duration,
};

use arbor_shared::postgres::{
    ClientWrapper, Database, DbError, Dedicated, LazyBegin, Patience, Prepared, Schema,
    ServerClock, tokio_postgres::types::ToSql, wait,
};

use super::{
    Abort, Backend, Body, Change, Commit, Entries, Failed, Fault, InOrder, ManyAndPrefix, Pending,
    Reads, Stats, Store, StoreError, T, TABLES, Txn, Value, Wake,
};

/// The runner's schema, oldest migration first. Never edit a released migration.
const SCHEMA: Schema = Schema {
    component: "runner",
    migrations: &[
        "CREATE TABLE runner_kv (
             t smallint NOT NULL,
             k bytea NOT NULL,
             v bytea NOT NULL,
             PRIMARY KEY (t, k)
         );
         CREATE SEQUENCE runner_ids INCREMENT BY 64;",
        // Locked by every batched commit before it reads anything (see `WRITER_BEGIN`).
        "CREATE TABLE runner_writer ();",
        // Room on each page for a row's next version: a run's record, checkpoint and job are
        // rewritten a few times soon after they are written, and a new version that fits on
        // its row's page is heap-only (no new index entry; pruned in place).
        "ALTER TABLE runner_kv SET (fillfactor = 80);",
    ],
};

/// How a durable batch begins: the lock on `runner_writer` is taken before the transaction's
/// snapshot (a `LOCK` statement takes none), so the durable batches of all replicas take turns
/// and each sees every one before it (see the module's documentation for why `REPEATABLE READ`).
const WRITER_BEGIN: &str =
    "BEGIN ISOLATION LEVEL REPEATABLE READ; LOCK TABLE runner_writer IN EXCLUSIVE MODE";
/// How a durable batch that holds a [`Commit::Serializable`] body begins again after a
/// conflict; its first try, begun as `WRITER_BEGIN`, is raised to `SERIALIZABLE` by
/// `TO_SERIALIZABLE` before its first read (the `LOCK` took no snapshot, so it may).
const WRITER_BEGIN_SERIALIZABLE: &str =
    "BEGIN ISOLATION LEVEL SERIALIZABLE; LOCK TABLE runner_writer IN EXCLUSIVE MODE";
/// Raises a durable batch's transaction, begun and holding the writer lock, to `SERIALIZABLE`
/// before its first read: for a batch that holds a [`Commit::Serializable`] body (an interrupt
/// of a thread). That body reads a row a concurrent claim writes (the thread's claimed job)
/// and writes a row the claim reads (the thread's generation), and no row is written by both,
/// so at `REPEATABLE READ` both would commit, each blind to the other. Only predicate locks,
/// which PostgreSQL takes at `SERIALIZABLE` alone, refuse the pair. One more round trip, for
/// the batches that need it.
const TO_SERIALIZABLE: &str = "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE";
/// How any other transaction begins.
const BEGIN: &str = "BEGIN ISOLATION LEVEL SERIALIZABLE";
/// How a commit that need not be durable begins (a claim: one lost in a crash leaves its job
/// queued, as if never claimed): it answers without waiting for the WAL flush.
const ASYNC_BEGIN: &str = "BEGIN ISOLATION LEVEL SERIALIZABLE; SET LOCAL synchronous_commit TO off";
/// Rows a counter may be spread over beyond its own: a transaction outside the batched
/// commit adds to one of them, picked at random, so that it rarely moves the row a batch (or
/// another such transaction) moves at the same time, which under `SERIALIZABLE` would fail
/// one of the two. `Backend::counter` sums them.
const STRIPES: u8 = 16;

/// Every statement here is written for a generic plan: its index conditions are on its
/// parameters alone (a bounded and an unbounded range are two statements, never one with
/// `$n IS NULL OR`, whose generic plan would walk the rest of the table). A statement is
/// planned once per connection, not on every call as PostgreSQL would do with the batched
/// lookup (it plans a custom plan whenever the generic plan's guessed row counts look
/// costlier, and an `unnest` of a parameter guesses 100 rows).
///
/// Bitmap scans are off. A connection keeps the generic plan it made at a statement's first
/// use, and for a table that was small then (a fresh database: every replica's first minutes,
/// every benchmark) PostgreSQL planned a delete or a claim of a few keys (`k = ANY($2)`) as a
/// bitmap scan of the whole table `t`, filtered by key. That plan stayed while the table grew,
/// until an analyze happened to invalidate it: a delete of three queue entries read every
/// queued job. Every statement here reads rows by their key or a key range, which an index
/// scan does in key order; without bitmap scans, that is the plan at any size.
pub const SESSION: &[(&str, &str)] = &[
    ("plan_cache_mode", "force_generic_plan"),
    ("enable_bitmapscan", "off"),
];
const EVENTS_CHANNEL: &str = "arbor_runner_events";
const WORK_CHANNEL: &str = "arbor_runner_work";
/// Rows the first round trip of a scan fetches: most scans stop early (a claim looks at the
/// first few queued jobs), so pages start small and grow to `SCAN_PAGE`.
const FIRST_PAGE: i64 = 16;
/// Rows fetched per round trip of a long scan.
const SCAN_PAGE: i64 = 512;
/// Bodies one batched transaction takes at most.
const MAX_BATCH: usize = 128;
/// Tries of a transaction that keeps conflicting before it fails.
const MAX_TRIES: u32 = 200;
/// Ids a replica takes from the sequence at once (the sequence's increment).
const ID_BLOCK: u64 = 64;
/// How long start-up waits for an unreachable database.
pub const OPEN_PATIENCE: Duration = Duration::from_secs(30);

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

/// A body and where its outcome goes, queued for the committer thread.
struct Queued {
    /// Rows the body reads, fetched with the batch's first read.
    reads: Reads,
    /// Whether the body needs its batch to run at `SERIALIZABLE` ([`Commit::Serializable`]).
    serializable: bool,
    body: Box<Body<'static>>,
    in_order: Option<InOrder>,
    done: tokio::sync::oneshot::Sender<Result<(), Failed>>,
}

/// This process, as its transactions' notifications name it.
struct Origin {
    /// Hex digits only: it goes into SQL text.
    name: String,
    /// The event log it appends to: the oid of its `runner_kv` table.
    log: u32,
    /// Its idle workers (see [`Backend::idle_workers`]); unset: none.
    idle: OnceLock<Arc<AtomicUsize>>,
}

impl Origin {
    /// Whether this process has a worker idle for each of `jobs` jobs it queued, which it
    /// wakes itself: then the other replicas are not told (each of theirs would look, and
    /// all but one would find the job taken).
    fn takes(&self, jobs: usize) -> bool {
        self.idle
            .get()
            .is_some_and(|idle| idle.load(Ordering::Relaxed) >= jobs)
    }
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

fn conflict_pause(attempt: u32) {
    let micros = 50u64 << attempt.min(10);
    std::thread::sleep(Duration::from_micros(fastrand::u64(0..=micros.min(20_000))));
}

/// The committer: takes whatever is queued, runs it as one transaction, answers each body.
/// One batched commit: a thread with a connection of its own, and how its transactions begin.
#[derive(Clone, Copy)]
struct Lane {
    thread: &'static str,
    begin: &'static str,
    /// Whether it takes the writer lock and appends to the event log (and so reads the hot
    /// keys with its first read, and moves counters' own rows).
    writer: bool,
}

impl Lane {
    /// Durable writes: each batch waits for its WAL flush, one replica's batch at a time.
    const DURABLE: Lane = Lane {
        thread: "arbor-pg-commit",
        begin: WRITER_BEGIN,
        writer: true,
    };
    /// Claims: each batch answers once committed, without the writer lock; the claim
    /// batches of several replicas run at once and pass over each other's queue entries.
    /// (`ASYNC_BEGIN` is `SERIALIZABLE`: a claim and an interrupt of its thread read what the
    /// other writes, and only predicate locks refuse the pair.)
    const UNFLUSHED: Lane = Lane {
        thread: "arbor-pg-claim",
        begin: ASYNC_BEGIN,
        writer: false,
    };
}

fn committer_loop(
    db: &Database,
    queue: &mpsc::Receiver<Queued>,
    counts: &Counts,
    hot: &OnceLock<Keys>,
    lane: Lane,
    origin: &Origin,
) {
    // The commit thread's connection is its own: its round trips are most of the runner's.
    let mut own = match db.dedicated() {
        Ok(own) => own,
        Err(e) => {
            tracing::error!("cannot start the commit thread's connection: {e}");
            return;
        }
    };
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        // A durable batch takes its turn of the log before it gathers the bodies queued
        // meanwhile: while another replica's batch holds the writer lock, this one's are
        // queueing, and they all go in when the turn comes, not into a batch after it.
        let locked = match lane.writer {
            true => take_writer_lock(&mut own).or_else(|e| match e {
                // The connection was closed while the thread had nothing to do (the server
                // restarted): the `BEGIN` and `LOCK` changed nothing, and go again, once, on a
                // new one. The batch fails only if the database cannot be reached now.
                StoreError::Unavailable(_) => take_writer_lock(&mut own),
                other => Err(other),
            }),
            false => Ok(()),
        };
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(q) => batch.push(q),
                Err(_) => break,
            }
        }
        let queued: Vec<&Body<'_>> = batch.iter().map(|q| &*q.body).collect();
        let serializable = lane.writer && batch.iter().any(|q| q.serializable);
        let locked = match (locked, serializable) {
            (Ok(()), true) => execute_own(&mut own, TO_SERIALIZABLE),
            (locked, _) => locked,
        };
        let outcomes = match locked {
            Ok(()) => {
                let hot = match lane.writer {
                    true => hot.get().map_or(&[][..], Vec::as_slice),
                    false => &[],
                };
                let ahead = reads_ahead(hot, batch.iter().map(|q| &q.reads));
                let setup = Setup {
                    begin: match serializable {
                        true => WRITER_BEGIN_SERIALIZABLE,
                        false => lane.begin,
                    },
                    ahead: &ahead,
                    stripe: lane.writer.then_some(0),
                    origin,
                    conflicts: &counts.conflicts,
                    begun: lane.writer,
                };
                run_bodies(&mut Conn::Own(&mut own), &queued, setup)
            }
            Err(e) => all_failed(queued.len(), &e),
        };
        drop(queued);
        if lane.writer {
            counts.flushes.fetch_add(1, Ordering::Relaxed);
        }
        counts.batches.fetch_add(1, Ordering::Relaxed);
        counts
            .bodies
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        for (q, outcome) in batch.into_iter().zip(outcomes) {
            if let (Ok(()), Some(in_order)) = (&outcome, q.in_order) {
                in_order();
            }
            let _ = q.done.send(outcome);
        }
    }
}

/// Begins a durable batch's transaction and waits for the writer lock (see `WRITER_BEGIN`).
fn take_writer_lock(own: &mut Dedicated) -> Result<(), StoreError> {
    execute_own(own, WRITER_BEGIN)
}

/// Runs `sql` on the commit thread's own connection. A failure fails the batch, as a failed
/// first statement would; the connection is dropped, and the next batch makes a new one.
fn execute_own(own: &mut Dedicated, sql: &str) -> Result<(), StoreError> {
    let ran = match own.connection() {
        Ok((client, rt)) => rt
            .block_on(client.batch_execute(sql))
            .map_err(DbError::from),
        Err(e) => Err(e),
    };
    ran.map_err(|e| {
        own.reset();
        StoreError::from(e)
    })
}

/// The outcomes of `bodies` bodies that a storage failure failed together.
fn all_failed(bodies: usize, e: &StoreError) -> Vec<Result<(), Failed>> {
    vec![Err(Failed::Storage(e.clone())); bodies]
}

/// What a batch fetches with its first read: the hot keys, then the rows its bodies said they
/// read, each once. One statement for the batch instead of one round trip per body, most of
/// them while the batch holds the writer lock.
fn reads_ahead<'r>(hot: &'r [(T, Value)], bodies: impl Iterator<Item = &'r Reads>) -> Keys {
    let mut seen = std::collections::HashSet::new();
    let mut ahead = Keys::new();
    for (t, k) in hot.iter().chain(bodies.flatten()) {
        if seen.insert((*t as usize, k.as_slice())) {
            ahead.push((*t, k.clone()));
        }
    }
    ahead
}

/// Where a transaction's connection comes from.
enum Conn<'a> {
    /// A pooled one, waited on from the calling thread.
    Pool(&'a Database),
    /// The calling thread's own.
    Own(&'a mut Dedicated),
}

/// How a transaction begins, and what it does on the side.
#[derive(Clone, Copy)]
struct Setup<'a> {
    begin: &'static str,
    /// Rows fetched with its first read.
    ahead: &'a [(T, Value)],
    /// Which row of each counter it moves (`None`: one picked at random, each attempt).
    stripe: Option<u8>,
    /// This process, named in its notifications so that it can skip them.
    origin: &'a Origin,
    /// Where a conflict that runs the transaction again is counted.
    conflicts: &'a AtomicU64,
    /// Whether the transaction was begun already, on the connection it runs on (its first
    /// try's only: a retry begins anew).
    begun: bool,
}

/// Runs `bodies` in one transaction (again on a conflict); a body that aborts leaves nothing
/// behind and does not stop the others. A storage failure fails them all. A transaction left
/// on any early return is rolled back when its `PgTx` drops.
fn run_bodies(
    conn: &mut Conn<'_>,
    bodies: &[&Body<'_>],
    setup: Setup<'_>,
) -> Vec<Result<(), Failed>> {
    let mut attempt = 0;
    // Whether the transaction ran again on a new connection after its connection was found
    // closed before its COMMIT went out (see `Unsent`).
    let mut reconnected = false;
    loop {
        attempt += 1;
        let ran = (|| -> Result<Vec<Result<(), Failed>>, Unsent> {
            let pooled;
            let (client, rt) = match conn {
                Conn::Pool(db) => {
                    pooled = db.client_blocking()?;
                    (&*pooled, None)
                }
                Conn::Own(own) => {
                    let (client, rt) = own.connection()?;
                    (client, Some(rt))
                }
            };
            let stripe = setup.stripe.unwrap_or_else(|| fastrand::u8(1..=STRIPES));
            let setup = Setup {
                begun: setup.begun && attempt == 1,
                ..setup
            };
            let tx = PgTx::begin(client, rt, setup, stripe);
            let mut outcomes = Vec::with_capacity(bodies.len());
            for body in bodies {
                let mark = tx.mark();
                let outcome = body(&tx);
                if let Some(e) = tx.fault() {
                    return Err(e.into());
                }
                match outcome {
                    Ok(()) => outcomes.push(Ok(())),
                    Err(Abort::Domain(())) => {
                        tx.undo_to(mark);
                        outcomes.push(Err(Failed::Aborted));
                    }
                    Err(Abort::Conflict) => return Err(DbError::Conflict("body".into()).into()),
                    Err(Abort::Storage(e)) => return Ok(all_failed(bodies.len(), &e)),
                }
            }
            if client.is_closed() {
                return Err(DbError::Unavailable("the connection is closed".into()).into());
            }
            tx.commit().map_err(Unsent::sent)?;
            Ok(outcomes)
        })();
        match ran {
            Ok(outcomes) => return outcomes,
            Err(Unsent {
                error: DbError::Conflict(_),
                ..
            }) if attempt < MAX_TRIES => {
                setup.conflicts.fetch_add(1, Ordering::Relaxed);
                conflict_pause(attempt);
            }
            // A connection the server closed (it restarted while the connection was idle)
            // fails the first statement sent on it; nothing was committed, since no COMMIT
            // went out: the transaction runs again, once, on a new connection. Only when that
            // fails too is the database unreachable.
            Err(Unsent {
                error: DbError::Unavailable(why),
                unsent: true,
            }) if !reconnected => {
                reconnected = true;
                tracing::debug!(error = %why, "connection lost before commit; trying a new one");
                if let Conn::Own(own) = conn {
                    own.reset();
                }
            }
            Err(Unsent { error: e, .. }) => {
                // The connection may be unusable (the database restarted): the next batch
                // makes a new one.
                if let Conn::Own(own) = conn {
                    own.reset();
                }
                return all_failed(bodies.len(), &StoreError::from(e));
            }
        }
    }
}

/// Why a transaction's try failed, and whether that was before its COMMIT went out (then the
/// server cannot have applied any of it).
struct Unsent {
    error: DbError,
    unsent: bool,
}

impl Unsent {
    /// A failure of the round trip that carried the COMMIT.
    fn sent(error: DbError) -> Self {
        Self {
            error,
            unsent: false,
        }
    }
}

impl From<DbError> for Unsent {
    fn from(error: DbError) -> Self {
        Self {
            error,
            unsent: true,
        }
    }
}

/// A write of one key inside a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Write {
    /// A new value (`None`: deleted).
    Set(Option<Value>),
    /// An amount added to the counter the key holds, whatever it holds when this commits.
    Add(i64),
}

impl Write {
    /// This write followed by `next`.
    fn then(self, next: Write) -> Write {
        match (self, next) {
            (Write::Add(a), Write::Add(b)) => Write::Add(a + b),
            (Write::Set(v), Write::Add(d)) => Write::Set(Some(counter_plus(v.as_deref(), d))),
            (_, set) => set,
        }
    }
}

/// A counter's value (big-endian `i64`, absent: 0) plus `delta`.
fn counter_plus(value: Option<&[u8]>, delta: i64) -> Value {
    let now = value
        .and_then(|v| <[u8; 8]>::try_from(v).ok())
        .map_or(0, i64::from_be_bytes);
    (now + delta).to_be_bytes().to_vec()
}

/// One SQL transaction: reads go to the server (seeing the transaction's own writes first,
/// then what it read before), writes wait in `writes` until commit.
struct PgTx<'c> {
    client: &'c ClientWrapper,
    /// The runtime a dedicated connection's I/O runs on while the transaction waits (`None`:
    /// a pooled connection, whose I/O runs on the pool's).
    rt: Option<&'c tokio::runtime::Runtime>,
    /// Every write so far, in order.
    log: RefCell<Vec<(T, Value, Write)>>,
    /// What the bodies so far declared they wake (see [`Txn::wake`]), in order.
    wakes: RefCell<Vec<Wake>>,
    /// What the writes so far leave of each key.
    writes: RefCell<BTreeMap<(usize, Value), Write>>,
    /// Every row read so far (`None`: absent). Every transaction here reads one snapshot
    /// (`REPEATABLE READ` or `SERIALIZABLE`), so a row read once reads the same again until
    /// the transaction writes it.
    read: RefCell<HashMap<(usize, Value), Option<Value>>>,
    /// Rows to fetch with the first read, in the same round trip.
    ahead: RefCell<Vec<(T, Value)>>,
    /// Which row of each counter `add` moves (0: the counter's own key).
    stripe: u8,
    /// The payload of the notifications it sends (see `Setup::origin`).
    origin: &'c Origin,
    /// Whether its commit answers once durable (not a claim's).
    durable: bool,
    /// A failure a read or write hit (the SQL transaction is then aborted).
    failed: RefCell<Option<DbError>>,
    begin: LazyBegin,
}

/// The first error of pipelined statements.
fn first_error(results: [Result<(), DbError>; 5]) -> Result<(), DbError> {
    results.into_iter().collect()
}

impl<'c> PgTx<'c> {
    fn begin(
        client: &'c ClientWrapper,
        rt: Option<&'c tokio::runtime::Runtime>,
        setup: Setup<'c>,
        stripe: u8,
    ) -> Self {
        Self {
            client,
            rt,
            log: RefCell::default(),
            wakes: RefCell::default(),
            writes: RefCell::default(),
            read: RefCell::default(),
            ahead: RefCell::new(setup.ahead.to_vec()),
            stripe,
            origin: setup.origin,
            durable: setup.begin != ASYNC_BEGIN,
            failed: RefCell::default(),
            begin: match setup.begun {
                true => LazyBegin::begun(setup.begin),
                false => LazyBegin::new(setup.begin),
            },
        }
    }

    /// Reads `keys` (with `BEGIN` if not sent yet) in one round trip into `read`.
    fn fetch(&self, keys: Vec<(T, Value)>) -> Result<(), DbError> {
        let rows = self.wait(async {
            let reads = read_many(self.client, keys.iter().map(|(t, k)| (*t, k.as_slice())));
            let (begun, rows) = futures_util::join!(self.begin_once(), reads);
            begun?;
            rows
        })?;
        let mut read = self.read.borrow_mut();
        for ((t, k), v) in keys.into_iter().zip(rows) {
            read.insert((t as usize, k), v);
        }
        Ok(())
    }

    /// Waits for `fut`, a request on the transaction's connection.
    fn wait<F: std::future::Future>(&self, fut: F) -> F::Output {
        match self.rt {
            Some(rt) => rt.block_on(fut),
            None => wait(fut),
        }
    }

    /// `BEGIN`, unless already sent (as a future, to pipeline with the next statement).
    async fn begin_once(&self) -> Result<(), DbError> {
        Ok(self.begin.before(self.client).await?)
    }

    /// How many writes and wakes the bodies so far declared.
    fn mark(&self) -> (usize, usize) {
        (self.log.borrow().len(), self.wakes.borrow().len())
    }

    /// Drops every write and wake after `mark` (an aborted body's).
    fn undo_to(&self, (writes, wakes): (usize, usize)) {
        self.wakes.borrow_mut().truncate(wakes);
        let mut log = self.log.borrow_mut();
        log.truncate(writes);
        let mut writes = self.writes.borrow_mut();
        writes.clear();
        for (t, k, w) in log.iter() {
            apply(&mut writes, *t, k, w.clone());
        }
    }

    fn write(&self, t: T, key: &[u8], w: Write) {
        self.log.borrow_mut().push((t, key.to_vec(), w.clone()));
        apply(&mut self.writes.borrow_mut(), t, key, w);
    }

    fn fault(&self) -> Option<DbError> {
        self.failed.borrow().clone()
    }

    fn note<R>(&self, r: Result<R, DbError>) -> Result<R, Fault> {
        r.map_err(|e| {
            // The first failure is the cause; later ones only say the transaction is aborted.
            self.failed.borrow_mut().get_or_insert_with(|| e.clone());
            Fault::from(e)
        })
    }

    /// Ends the SQL transaction without keeping anything (nothing to do when none was begun).
    fn rollback(&self) {
        if self.begin.end() {
            let _ = self.wait(self.client.batch_execute("ROLLBACK"));
        }
    }

    /// Writes what the bodies kept, notifies listeners, commits.
    fn commit(&self) -> Result<(), DbError> {
        let writes = std::mem::take(&mut *self.writes.borrow_mut());
        let (mut put_t, mut put_k, mut put_v) = (Vec::new(), Vec::new(), Vec::new());
        let (mut add_t, mut add_k, mut add_d) = (Vec::new(), Vec::new(), Vec::new());
        let mut deleted: Vec<(i16, Value)> = Vec::new();
        for ((t, k), w) in writes {
            let v = match w {
                Write::Set(v) => v,
                Write::Add(d) => {
                    add_t.push(t as i16);
                    add_k.push(k);
                    add_d.push(d);
                    continue;
                }
            };
            match v {
                Some(v) => {
                    put_t.push(t as i16);
                    put_k.push(k);
                    put_v.push(v);
                }
                None => deleted.push((t as i16, k)),
            }
        }
        // What the bodies declared they wake: the last event appended, jobs queued
        // (or re-queued), and whether a task worker's stream may have work.
        let (mut appended, mut queued, mut task_work) = (None, 0, false);
        for wake in std::mem::take(&mut *self.wakes.borrow_mut()) {
            match wake {
                Wake::Events(seq) => appended = appended.max(Some(seq)),
                Wake::Work => queued += 1,
                Wake::Tasks => task_work = true,
            }
        }
        let work = task_work || (queued > 0 && !self.origin.takes(queued));
        let writes = !put_t.is_empty() || !deleted.is_empty() || !add_t.is_empty();
        let deleted = by_table(deleted.iter().map(|(t, k)| (*t, k.as_slice())));
        if !writes && !self.begin.open() {
            return Ok(());
        }
        // The notifications go out after the COMMIT, each in a transaction of its own: a
        // transaction that notifies holds PostgreSQL's one notification-queue lock from its
        // commit until its WAL flush is done, which would put every notifying commit of every
        // replica in one line, and stop their flushes from being shared.
        // They go out only if the batch committed: a statement after a failed COMMIT does not
        // run, but the COMMIT of a transaction that a write aborted answers OK (it rolls back).
        // So a `SELECT` goes first, which the server refuses inside an aborted transaction,
        // skipping the rest: the COMMIT too, and `rollback` ends the transaction. The events'
        // notification says up to which seq they go when the commit is durable (see
        // `subscribe`): sent for a batch that rolled back, it would send the other replicas'
        // streams to read up to seqs nobody committed, where they would find nothing and wait
        // for the log's head to move again.
        let mut notify = String::new();
        if let Some(appended) = appended {
            let (name, log) = (&self.origin.name, self.origin.log);
            match self.durable {
                true => notify.push_str(&format!(
                    ";NOTIFY {EVENTS_CHANNEL}, '{name} {log} {appended}'"
                )),
                false => notify.push_str(&format!(";NOTIFY {EVENTS_CHANNEL}, '{name}'")),
            }
        }
        if work {
            notify.push_str(&format!(";NOTIFY {WORK_CHANNEL}, '{}'", self.origin.name));
        }
        let finish = match notify.is_empty() {
            true => String::from("COMMIT"),
            false => format!("SELECT 1;COMMIT{notify}"),
        };
        // One round trip: BEGIN (if no read sent it), the deletes, the upserts and COMMIT go
        // out together. When a statement fails the transaction is aborted, and the COMMIT
        // behind it only rolls back.
        let client = self.client;
        let results = self.wait(async {
            // Prepared first: a statement that still has to be parsed would go out after the
            // COMMIT queued behind it, and run outside the transaction.
            let prepared = futures_util::try_join!(
                client.prepare_cached(DELETE_KEYS),
                client.prepare_cached(
                    "INSERT INTO runner_kv (t, k, v) \
                     SELECT * FROM unnest($1::smallint[], $2::bytea[], $3::bytea[]) \
                     ON CONFLICT (t, k) DO UPDATE SET v = EXCLUDED.v",
                ),
                // Counters are big-endian i64s, as `counter_plus` reads and writes them.
                client.prepare_cached(
                    "INSERT INTO runner_kv AS r (t, k, v) \
                     SELECT u.t, u.k, int8send(u.d) \
                     FROM unnest($1::smallint[], $2::bytea[], $3::bigint[]) AS u(t, k, d) \
                     ON CONFLICT (t, k) DO UPDATE SET v = int8send( \
                         ('x' || encode(r.v, 'hex'))::bit(64)::bigint \
                         + ('x' || encode(EXCLUDED.v, 'hex'))::bit(64)::bigint)",
                ),
            );
            let (delete, upsert, increment) = match prepared {
                Ok(statements) => statements,
                Err(e) => return [Err(DbError::from(e)), Ok(()), Ok(()), Ok(()), Ok(())],
            };
            let deletes = async {
                let each = deleted
                    .iter()
                    .map(|(t, ks)| async { client.execute(&delete, &[t, ks]).await });
                for done in futures_util::future::join_all(each).await {
                    done?;
                }
                Ok(())
            };
            let upserts = async {
                if !put_t.is_empty() {
                    client.execute(&upsert, &[&put_t, &put_k, &put_v]).await?;
                }
                Ok(())
            };
            let increments = async {
                if !add_t.is_empty() {
                    client
                        .execute(&increment, &[&add_t, &add_k, &add_d])
                        .await?;
                }
                Ok(())
            };
            let commit = async { Ok(client.batch_execute(&finish).await?) };
            let (b, d, u, i, c) =
                futures_util::join!(self.begin_once(), deletes, upserts, increments, commit);
            [b, d, u, i, c]
        });
        // The COMMIT ran (an aborted transaction's COMMIT rolls it back and answers OK):
        // nothing is left open on the connection. Otherwise it may be (an aborted transaction
        // that was to notify refused the `SELECT` before its COMMIT), and is rolled back.
        let ended = results[4].is_ok();
        let result = first_error(results);
        match ended {
            true => {
                self.begin.end();
            }
            false => self.rollback(),
        }
        result
    }
}

/// A transaction dropped on any other path (a conflict found by a body, a failed read) is
/// rolled back here, so that its connection goes back to the pool outside any transaction: a
/// connection returned inside an aborted one would fail the next transaction's every statement.
impl Drop for PgTx<'_> {
    fn drop(&mut self) {
        self.rollback();
    }
}

impl Txn for PgTx<'_> {
    fn get(&self, t: T, key: &[u8]) -> Result<Option<Value>, Fault> {
        let at = (t as usize, key.to_vec());
        let added = match self.writes.borrow().get(&at) {
            Some(Write::Set(v)) => return Ok(v.clone()),
            Some(Write::Add(d)) => Some(*d),
            None => None,
        };
        let cached = self.read.borrow().get(&at).cloned();
        let stored = match cached {
            Some(v) => v,
            None => {
                let mut keys = std::mem::take(&mut *self.ahead.borrow_mut());
                keys.retain(|(at_t, at_k)| (*at_t, at_k.as_slice()) != (t, key));
                keys.push((t, key.to_vec()));
                let fetched = self.fetch(keys);
                self.note(fetched)?;
                self.read.borrow().get(&at).cloned().flatten()
            }
        };
        Ok(match added {
            Some(d) => Some(counter_plus(stored.as_deref(), d)),
            None => stored,
        })
    }

    fn put(&self, t: T, key: &[u8], value: &[u8]) -> Result<(), Fault> {
        self.write(t, key, Write::Set(Some(value.to_vec())));
        Ok(())
    }

    fn delete(&self, t: T, key: &[u8]) -> Result<(), Fault> {
        self.write(t, key, Write::Set(None));
        Ok(())
    }

    /// Nothing is read: the amount is added by the commit's own statement, to whatever the row
    /// holds then (the transaction's stripe of the counter).
    fn add(&self, t: T, key: &[u8], delta: i64) -> Result<(), Fault> {
        self.write(t, &stripe_key(key, self.stripe), Write::Add(delta));
        Ok(())
    }

    /// `FOR UPDATE SKIP LOCKED`: rows another transaction locked are passed over, the rows
    /// returned are locked until this transaction ends.
    fn lock_first(&self, t: T, keys: &[Value], limit: usize) -> Result<Vec<(Value, Value)>, Fault> {
        let at = |k: &Value| (t as usize, k.clone());
        let wanted: Vec<&[u8]> = {
            let writes = self.writes.borrow();
            keys.iter()
                .filter(|k| writes.get(&at(k)) != Some(&Write::Set(None)))
                .map(Vec::as_slice)
                .collect()
        };
        if wanted.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let rows = self.wait(async {
            let (begun, rows) = futures_util::join!(self.begin_once(), async {
                let statement = self.client.prepare_cached(LOCK_FIRST).await?;
                let limit = limit as i64;
                Ok::<_, DbError>(
                    self.client
                        .query(&statement, &[&(t as i16), &wanted, &limit])
                        .await?,
                )
            });
            begun?;
            rows
        });
        let mut out = Vec::new();
        for row in self.note(rows)? {
            let (k, v): (Value, Value) = (row.get(0), row.get(1));
            let mine = self.writes.borrow().get(&at(&k)).cloned();
            match mine {
                Some(Write::Set(Some(v))) => out.push((k, v)),
                _ => {
                    self.read.borrow_mut().insert(at(&k), Some(v.clone()));
                    out.push((k, v));
                }
            }
        }
        Ok(out)
    }

    fn wake(&self, wake: Wake) {
        self.wakes.borrow_mut().push(wake);
    }

    fn prefetch(&self, keys: &[(T, &[u8])]) -> Result<(), Fault> {
        let missing: Vec<(T, Value)> = {
            let (writes, read) = (self.writes.borrow(), self.read.borrow());
            keys.iter()
                .map(|(t, k)| (*t as usize, k.to_vec()))
                .filter(|at| !writes.contains_key(at) && !read.contains_key(at))
                .map(|(t, k)| (table(t), k))
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        let mut all = std::mem::take(&mut *self.ahead.borrow_mut());
        all.retain(|at| !missing.contains(at));
        all.extend(missing);
        let fetched = self.fetch(all);
        self.note(fetched)
    }
}

/// The row of stripe `stripe` of the counter `key` (stripe 0 is the key itself).
fn stripe_key(key: &[u8], stripe: u8) -> Vec<u8> {
    match stripe {
        0 => key.to_vec(),
        s => [key, &[0, s]].concat(),
    }
}

/// The table of a table number of `T`.
fn table(t: usize) -> T {
    TABLES[t]
}

/// Records `w` as the latest write of `key`.
fn apply(writes: &mut BTreeMap<(usize, Value), Write>, t: T, key: &[u8], w: Write) {
    let at = (t as usize, key.to_vec());
    let next = match writes.remove(&at) {
        Some(before) => before.then(w),
        None => w,
    };
    writes.insert(at, next);
}

/// Reads one row, with the connection's prepared statement.
fn read_one(client: &ClientWrapper, t: T, key: &[u8]) -> Result<Option<Value>, DbError> {
    wait(read_async(client, t, key))
}

async fn read_async(client: &ClientWrapper, t: T, key: &[u8]) -> Result<Option<Value>, DbError> {
    let statement = client
        .prepare_cached("SELECT v FROM runner_kv WHERE t = $1 AND k = $2")
        .await?;
    let row = client.query_opt(&statement, &[&(t as i16), &key]).await?;
    Ok(row.map(|r| r.get(0)))
}

/// Reads several rows in one round trip and one statement: each key's value (`None`: absent),
/// in the order given. The keys go as two arrays, and each is looked up by the primary key:
/// the `LIMIT 1` keeps the lookup a subquery of the key it is given, so the plan is a nested
/// loop of index reads whatever the number of keys (a join the planner were free to choose
/// would become a hash join over the whole table for many keys), and makes each read an index
/// scan even while the table has no statistics. One statement rather than one per key: each
/// statement costs the server an executor start and end and the client a round of encoding
/// and decoding (a read of four keys takes the server about 50 µs of CPU this way, 70–80 µs
/// as four pipelined statements).
async fn read_many<'k>(
    client: &ClientWrapper,
    keys: impl IntoIterator<Item = (T, &'k [u8])>,
) -> Result<Vec<Option<Value>>, DbError> {
    let keys: Vec<(T, &[u8])> = keys.into_iter().collect();
    match keys.as_slice() {
        [] => return Ok(Vec::new()),
        [(t, key)] => return Ok(vec![read_async(client, *t, key).await?]),
        _ => {}
    }
    let (tables, keys): (Vec<i16>, Vec<&[u8]>) =
        keys.into_iter().map(|(t, k)| (t as i16, k)).unzip();
    let statement = client
        .prepare_cached(concat!("SELECT u.i, r.v ", keys_looked_up!()))
        .await?;
    let mut values = vec![None; keys.len()];
    for row in client.query(&statement, &[&tables, &keys]).await? {
        place(&mut values, row.get(0), row.get(1));
    }
    Ok(values)
}

/// The lookups of [`read_many`]: the keys `$2` of the tables `$1`, each numbered `u.i` from 1,
/// with its value `r.v` (a key that is absent has no row).
macro_rules! keys_looked_up {
    () => {
        "FROM unnest($1::smallint[], $2::bytea[]) WITH ORDINALITY AS u(t, k, i) \
         CROSS JOIN LATERAL \
         (SELECT v FROM runner_kv WHERE runner_kv.t = u.t AND runner_kv.k = u.k LIMIT 1) r"
    };
}
use keys_looked_up;

/// Puts the value of the key numbered `i` (from 1) in its place among `values`.
fn place(values: &mut [Option<Value>], i: i64, v: Value) {
    if let Some(slot) = usize::try_from(i - 1).ok().and_then(|i| values.get_mut(i)) {
        *slot = Some(v);
    }
}

/// Keys grouped by table, tables in the order they first appear.
fn by_table<'k>(keys: impl Iterator<Item = (i16, &'k [u8])>) -> Vec<(i16, Vec<&'k [u8]>)> {
    let mut groups: Vec<(i16, Vec<&[u8]>)> = Vec::new();
    for (t, k) in keys {
        match groups.iter_mut().find(|(g, _)| *g == t) {
            Some((_, ks)) => ks.push(k),
            None => groups.push((t, vec![k])),
        }
    }
    groups
}

/// The least key above every key that starts with `prefix` (`None`: no bound).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The keys `$2` of the tables `$1` read as [`read_many`] reads them (numbered from 1, with no
/// key), and every entry of table `$3` from `$4` up to `$5` (excluded), numbered 0, in one
/// statement and one snapshot.
const READ_MANY_AND_RANGE: &str = concat!(
    "SELECT u.i, NULL::bytea, r.v ",
    keys_looked_up!(),
    " UNION ALL SELECT 0, k, v FROM runner_kv WHERE t = $3 AND k >= $4 AND k < $5"
);

/// The rows of a counter: the key `$2` of table `$1` and its stripes, from `$3` up to `$4`
/// (excluded). Two index scans: one scan cannot take `k = $2 OR (k >= $3 AND k < $4)` as its
/// condition, and without bitmap scans (see [`SESSION`]) the `OR` would walk the whole table.
pub const COUNTER_ROWS: &str = "SELECT v FROM runner_kv WHERE t = $1 AND k = $2 \
     UNION ALL SELECT v FROM runner_kv WHERE t = $1 AND k >= $3 AND k < $4";
/// Deletes the keys `$2` of table `$1`.
pub const DELETE_KEYS: &str = "DELETE FROM runner_kv WHERE t = $1 AND k = ANY($2)";
/// Of the keys `$2` of table `$1`, the first `$3` that no other transaction holds, locked.
pub const LOCK_FIRST: &str = "SELECT k, v FROM runner_kv WHERE t = $1 AND k = ANY($2) \
     ORDER BY k LIMIT $3 FOR UPDATE SKIP LOCKED";
/// One page of the keys of table `$1` from `$2` up to `$3` (excluded), `$4` rows at most.
pub const SCAN_RANGE: &str =
    "SELECT k, v FROM runner_kv WHERE t = $1 AND k >= $2 AND k < $3 ORDER BY k LIMIT $4";
/// [`SCAN_RANGE`] without an upper bound, `$3` rows at most.
const SCAN_FROM: &str = "SELECT k, v FROM runner_kv WHERE t = $1 AND k >= $2 ORDER BY k LIMIT $3";
/// The last key of table `$1` from `$2` up to `$3` (excluded).
pub const LAST_IN_RANGE: &str =
    "SELECT k, v FROM runner_kv WHERE t = $1 AND k >= $2 AND k < $3 ORDER BY k DESC LIMIT 1";
/// [`LAST_IN_RANGE`] without an upper bound.
const LAST_FROM: &str =
    "SELECT k, v FROM runner_kv WHERE t = $1 AND k >= $2 ORDER BY k DESC LIMIT 1";

/// A scan read one page at a time.
struct Scan {
    db: Database,
    t: i16,
    /// The next key to read from (inclusive).
    from: Vec<u8>,
    end: Option<Vec<u8>>,
    page: VecDeque<(Value, Value)>,
    /// Rows the next round trip fetches.
    size: i64,
    done: bool,
}

impl Scan {
    fn fetch(&mut self) -> Result<(), StoreError> {
        let client = self.db.client_blocking()?;
        let (sql, params): (_, Vec<&(dyn ToSql + Sync)>) = match &self.end {
            Some(end) => (SCAN_RANGE, vec![&self.t, &self.from, end, &self.size]),
            None => (SCAN_FROM, vec![&self.t, &self.from, &self.size]),
        };
        let rows = wait(async {
            client
                .query(&client.prepare_cached(sql).await?, &params)
                .await
        })
        .map_err(DbError::from)?;
        self.done = (rows.len() as i64) < self.size;
        self.size = (self.size * 4).min(SCAN_PAGE);
        for row in rows {
            self.page.push_back((row.get(0), row.get(1)));
        }
        if let Some((k, _)) = self.page.back() {
            self.from = [k.as_slice(), &[0]].concat();
        }
        Ok(())
    }
}

impl Iterator for Scan {
    type Item = Result<(Value, Value), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.page.is_empty()
            && !self.done
            && let Err(e) = self.fetch()
        {
            self.done = true;
            return Some(Err(e));
        }
        self.page.pop_front().map(Ok)
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

    /// PostgreSQL checks its own pages (and checksums, where the cluster enables them).
    fn verify(&self) -> Result<(), StoreError> {
        Ok(())
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
        let announced = self.db.client_blocking().and_then(|client| {
            let notify = format!("NOTIFY {WORK_CHANNEL}, '{}'", self.origin.name);
            Ok(wait(client.batch_execute(&notify))?)
        });
        if let Err(e) = announced {
            tracing::debug!("work not announced to the other replicas: {e}");
        }
    }

    /// This process's own notifications are skipped: whatever it commits, it wakes its own
    /// streams and workers for in-process. A durable batch's notification of events names its
    /// event log and the last seq it appended: appenders to one log take turns on the writer
    /// lock and each notifies after its commit is durable, so every event of that log up to
    /// that seq is committed and durable by then. A notification of another log (a runner in
    /// another schema of the database) only wakes: the stream looks at its own log's head.
    fn subscribe(&self, wake: Arc<dyn Fn(Change) + Send + Sync>) {
        let (origin, log) = (self.origin.name.clone(), self.origin.log.to_string());
        let listened = self
            .db
            .listen(&[EVENTS_CHANNEL, WORK_CHANNEL], move |channel, payload| {
                let mut parts = payload.split(' ');
                if parts.next() == Some(origin.as_str()) {
                    return;
                }
                wake(match channel {
                    EVENTS_CHANNEL => match (parts.next(), parts.next().map(str::parse)) {
                        (Some(of), Some(Ok(seq))) if of == log && seq > 0 => Change::Appended(seq),
                        _ => Change::Events,
                    },
                    WORK_CHANNEL => Change::Work,
                    _ => Change::All,
                })
            });
        if let Err(e) = listened {
            tracing::error!("cannot listen for other replicas' changes: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(n: i64) -> Option<Value> {
        Some(n.to_be_bytes().to_vec())
    }

    /// What a transaction's writes of one key leave, in the order they were made.
    #[test]
    fn writes_of_one_key_fold_in_order() {
        let set = |n| Write::Set(counter(n));
        assert_eq!(Write::Add(2).then(Write::Add(-5)), Write::Add(-3));
        assert_eq!(set(10).then(Write::Add(-4)), set(6));
        assert_eq!(Write::Set(None).then(Write::Add(3)), set(3));
        assert_eq!(Write::Add(7).then(set(1)), set(1));
        assert_eq!(Write::Add(7).then(Write::Set(None)), Write::Set(None));
        assert_eq!(counter_plus(None, -2), (-2i64).to_be_bytes().to_vec());
    }
}
