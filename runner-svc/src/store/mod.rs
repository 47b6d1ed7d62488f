//! The runner's storage seam: everything above this module reads and writes the runner's state
//! through [`Store`], over a [`Backend`] that implements a handful of operations on byte tables.
//!
//! The unit of change is one transaction ([`Txn`]) over any of the tables: one step of a run
//! (checkpoint, events, inbox and mailbox changes, with the fencing check of the job's claim
//! token) is one transaction, atomic in every backend. A transaction reads and writes single keys
//! only; scans run outside transactions and are re-checked inside one (a claim reads its
//! candidates' records again, retention re-reads what it deletes), which is how a SQL backend
//! does it too: each transaction is one SQL transaction with row locks on what it reads.
//!
//! Numbers every process of the store must agree on without conflicting (the ledger's `seq`)
//! come from a [`Sequence`], taken outside transactions ([`Backend::next_in`]).
//!
//! Durability: [`Store::commit`] answers once its transaction is on the device; [`Store::apply`]
//! and [`Store::transact`] once it is committed, and [`Store::durable`] waits for everything
//! committed before it.
//!
//! [`open`] chooses the backend from configuration: the embedded one (`sled/`, a database
//! directory of this process's own) or PostgreSQL (`postgres/`, shared by replicas). Above
//! the seam nothing names an engine: records are encoded in [`codec`], transaction bodies use
//! the helpers of `body.rs`, and [`Store`] (`handle.rs`) runs them; [`verify`](Store::verify)
//! checks the tables' cross-references through the seam on every backend (`verify.rs`).

mod body;
pub mod codec;
mod handle;
pub mod postgres;
#[cfg(test)]
mod sequence_tests;
mod sled;
pub mod tables;
mod verify;

use std::{future::Future, path::PathBuf, pin::Pin, sync::Arc, time::Duration};

pub use body::{FIRST_SEQ, NEXT_SEQ, TxTable, abort, lift, read_counter};
pub use handle::{Store, Table};

/// The runner's tables, in the fixed order transactions see them. Keys and values are bytes;
/// what each holds is written next to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum T {
    /// `{tree_id}\0{version BE}` → tree record.
    Trees,
    /// run_id → run record.
    Runs,
    /// `{thread_id}\0{run_id}` → () (runs of a thread).
    ThreadRuns,
    /// run_id → encoded checkpoint.
    Checkpoints,
    /// `{run_id}\0{request_id}` → delivered decision not yet taken into the checkpoint.
    Inbox,
    /// seq BE → event.
    Events,
    /// counters and durable subscriber cursors.
    Meta,
    /// job_id → job.
    Jobs,
    /// `{!priority}{order BE}{job_id}` → () for queued jobs, in claim order.
    Queue,
    /// mailbox_id → job_id of the one claimed job of that thread.
    Active,
    /// dedupe_key → job_id while the job is live.
    Dedupe,
    /// mailbox_id → generation BE.
    Mailboxes,
    /// `{mailbox_id}\0{order BE}` → job_id (jobs of a thread).
    MailboxJobs,
    /// `{kind}{finished_at BE}{id}` → () for finished runs (`r`) and jobs (`j`), oldest first,
    /// so retention walks only what it may delete.
    Finished,
    /// idempotency key → receipt of the `ledger.append` tool.
    Ledger,
    /// task_id → task (a remote tool call or an `external` node's task).
    Tasks,
    /// `{available_at BE}{order BE}{task_id}` → task type, for queued tasks in dispatch order.
    TaskQueue,
    /// `{lease_until BE}{task_id}` → () for leased tasks, soonest expiry first.
    TaskLeases,
}

/// Every table, in the order of [`T`].
pub const TABLES: [T; 18] = [
    T::Trees,
    T::Runs,
    T::ThreadRuns,
    T::Checkpoints,
    T::Inbox,
    T::Events,
    T::Meta,
    T::Jobs,
    T::Queue,
    T::Active,
    T::Dedupe,
    T::Mailboxes,
    T::MailboxJobs,
    T::Finished,
    T::Ledger,
    T::Tasks,
    T::TaskQueue,
    T::TaskLeases,
];

/// The tables' names, in the order of [`T`].
pub const TABLE_NAMES: [&str; 18] = [
    "trees",
    "runs",
    "thread_runs",
    "checkpoints",
    "inbox",
    "events",
    "meta",
    "jobs",
    "queue",
    "active",
    "dedupe",
    "mailboxes",
    "mailbox_jobs",
    "finished",
    "ledger",
    "tasks",
    "task_queue",
    "task_leases",
];

/// A stored value, or a key.
pub type Value = Vec<u8>;

/// A sequence of numbers shared by every process of the store (see [`Backend::next_in`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sequence {
    /// The `seq` of the records `ledger.append` writes.
    Ledger,
}

impl Sequence {
    /// The `meta` row that holds the sequence on the embedded store: the row the previous
    /// release kept the ledger's last `seq` in, so that a ledger it wrote goes on from there.
    pub const fn meta_key(self) -> &'static [u8] {
        match self {
            Sequence::Ledger => b"ledger_seq",
        }
    }
}

/// A storage failure. Its text is for the log; callers are told only that storage failed, or
/// that it is unreachable for now (a database server that is down or restarting).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Failed(String),
    #[error("storage unavailable: {0}")]
    Unavailable(String),
}

/// Why an operation inside a transaction failed.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Another transaction got in the way: the backend runs the body again.
    Conflict,
    Storage(StoreError),
}

/// Why a transaction body stopped: its own domain error (nothing it wrote is kept), or a fault.
#[derive(Debug, Clone)]
pub enum Abort<E> {
    Domain(E),
    Conflict,
    Storage(StoreError),
}

impl<E> From<Fault> for Abort<E> {
    fn from(f: Fault) -> Self {
        match f {
            Fault::Conflict => Abort::Conflict,
            Fault::Storage(e) => Abort::Storage(e),
        }
    }
}

/// Result of a transaction body.
pub type TxResult<R, E> = Result<R, Abort<E>>;

/// Keys of rows (each with its table) that a transaction body will read, known before it runs.
pub type Reads = Vec<(T, Value)>;

/// [`Backend::get_many_and_prefix`] as a read of the keys and a scan of the prefix.
fn read_apart(
    backend: &(impl Backend + ?Sized),
    keys: &[(T, &[u8])],
    t: T,
    prefix: &[u8],
) -> Result<ManyAndPrefix, StoreError> {
    let entries = backend.scan(t, prefix, &[]).collect::<Result<_, _>>()?;
    Ok((backend.get_many(keys)?, entries))
}

/// What [`Backend::get_many_and_prefix`] reads: the keys' values (`None`: absent), in the order
/// given, and the prefix's entries (key, value), in key order.
pub type ManyAndPrefix = (Vec<Option<Value>>, Vec<(Value, Value)>);

/// Reads and writes inside one transaction. A read sees the transaction's own writes.
pub trait Txn {
    fn get(&self, t: T, key: &[u8]) -> Result<Option<Value>, Fault>;
    fn put(&self, t: T, key: &[u8], value: &[u8]) -> Result<(), Fault>;
    fn delete(&self, t: T, key: &[u8]) -> Result<(), Fault>;
    /// Adds `delta` to the counter under `key` (absent: 0). A backend may add it without
    /// reading the counter, and may keep it as several rows that [`Backend::counter`] sums, so
    /// that transactions moving one counter do not conflict on it. Read a counter with
    /// [`Backend::counter`], never with `get`.
    fn add(&self, t: T, key: &[u8], delta: i64) -> Result<(), Fault>;
    /// Of `keys` (in key order), the first `limit` that `t` holds and that no other
    /// transaction holds; each one returned is held by this transaction until it ends, and
    /// other transactions' `lock_first` pass over it. This is how claimers racing for the same
    /// candidates (found by a scan outside the transaction) take different ones instead of
    /// failing each other's transactions. Keys this transaction deleted are passed over;
    /// values are as this transaction sees them.
    fn lock_first(&self, t: T, keys: &[Value], limit: usize) -> Result<Vec<(Value, Value)>, Fault>;
    /// Says which keys the body is about to read, so that a backend whose reads are round
    /// trips fetches them together.
    fn prefetch(&self, _keys: &[(T, &[u8])]) -> Result<(), Fault> {
        Ok(())
    }
    /// Declares what this body's writes wake once the transaction commits: the body says it
    /// where it makes the change (appends events, queues work, changes tasks), and the backend
    /// carries it out; no backend guesses it from what was written. An aborted body's
    /// declarations go with its writes.
    fn wake(&self, wake: Wake);
}

/// What a committed transaction wakes in the processes that wait on the store (see
/// [`Txn::wake`]). In this process the callers wake their own waiters; a backend shared with
/// other processes tells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Events were appended, the last of them with this seq.
    Events(u64),
    /// A job was queued (or queued again).
    Work,
    /// A task was queued or a task's lease ended or moved: a task stream may have work.
    Tasks,
}

/// What a transaction body is given.
pub type Tx<'a> = dyn Txn + 'a;

/// A failed transaction: the body aborted with a domain error, or storage failed.
#[derive(Debug, thiserror::Error)]
pub enum TxError<E> {
    #[error(transparent)]
    Abort(E),
    #[error("storage error: {0}")]
    Storage(#[from] StoreError),
}

/// How a type-erased transaction ended in the backend.
#[derive(Debug, Clone)]
pub enum Failed {
    /// The body aborted; nothing it wrote was kept.
    Aborted,
    Storage(StoreError),
}

/// A transaction body with its result erased (the result goes to a slot the caller holds).
pub type Body<'a> = dyn Fn(&Tx<'_>) -> TxResult<(), ()> + Send + 'a;

/// How a batched commit runs (see [`Backend::commit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Answers once durable.
    Durable,
    /// Answers once durable, and is serialisable against every transaction that runs beside
    /// its batch (claims, single transactions), not only against the batches before and after
    /// it: for a body that reads a row a concurrent claim writes and writes a row that claim
    /// reads, where no row written by both makes one of the two fail (an interrupt of a thread).
    Serializable,
    /// Answers as soon as committed, before it is durable (a claim).
    Unflushed,
}

/// A boxed future of a backend.
pub type Pending<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Entries of one table in key order, each `(key, value)`.
pub struct Entries<'a>(Box<dyn Iterator<Item = Result<(Value, Value), StoreError>> + Send + 'a>);

impl<'a> Entries<'a> {
    pub fn new(
        inner: impl Iterator<Item = Result<(Value, Value), StoreError>> + Send + 'a,
    ) -> Self {
        Self(Box::new(inner))
    }

    pub fn keys(self) -> impl Iterator<Item = Result<Value, StoreError>> + Send + 'a {
        self.0.map(|r| r.map(|(k, _)| k))
    }

    pub fn values(self) -> impl Iterator<Item = Result<Value, StoreError>> + Send + 'a {
        self.0.map(|r| r.map(|(_, v)| v))
    }
}

impl Iterator for Entries<'_> {
    type Item = Result<(Value, Value), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next()
    }
}

/// What a storage backend of the runner implements. Reads outside a transaction see every
/// committed transaction.
pub trait Backend: Send + Sync + 'static {
    fn get(&self, t: T, key: &[u8]) -> Result<Option<Value>, StoreError>;
    /// Several keys' values, in the order given, each read as [`get`](Self::get) reads it: a
    /// backend whose reads are round trips reads them in one.
    fn get_many(&self, keys: &[(T, &[u8])]) -> Result<Vec<Option<Value>>, StoreError> {
        keys.iter().map(|(t, k)| self.get(*t, k)).collect()
    }
    /// [`get_many`](Self::get_many) of `keys`, and the entries of `t` whose key starts with
    /// `prefix`, in key order: a backend whose reads are round trips reads both in one.
    fn get_many_and_prefix(
        &self,
        keys: &[(T, &[u8])],
        t: T,
        prefix: &[u8],
    ) -> Result<ManyAndPrefix, StoreError> {
        read_apart(self, keys, t, prefix)
    }
    /// Entries whose key starts with `prefix` and is not below `from`, in key order.
    fn scan(&self, t: T, prefix: &[u8], from: &[u8]) -> Entries<'static>;
    /// [`scan`](Self::scan), for a caller that will take about `wanted` entries: a backend that
    /// reads in pages reads that many with its first (instead of a few, then more).
    fn scan_wanting(&self, t: T, prefix: &[u8], from: &[u8], wanted: usize) -> Entries<'static> {
        let _ = wanted;
        self.scan(t, prefix, from)
    }
    /// The entry with the highest key that starts with `prefix`.
    fn last(&self, t: T, prefix: &[u8]) -> Result<Option<(Value, Value)>, StoreError>;
    /// The counter under `key` as [`Txn::add`] moved it (0 when never moved).
    fn counter(&self, t: T, key: &[u8]) -> Result<i64, StoreError> {
        Ok(self.get(t, key)?.map_or(0, |v| read_counter(&v)))
    }
    /// Writes `value` under `key` unless the key holds a value, which it returns instead; once
    /// committed, before it is durable. Atomic: of two callers with one key, one writes and the
    /// other gets what it wrote.
    fn insert_new(&self, t: T, key: &[u8], value: &[u8]) -> Result<Option<Value>, StoreError>;
    /// Runs `body` as one transaction on the calling thread (again on a conflict); returns once
    /// committed, before it is durable.
    fn transact(&self, body: &Body<'_>) -> Result<(), Failed>;
    /// Runs `body` in a transaction that may be shared with other queued bodies (each body
    /// aborts alone). Resolves once that transaction is durable, or, for
    /// [`Commit::Unflushed`], as soon as it committed. `reads` are keys the body reads: a
    /// backend whose reads are round trips fetches those of every body of the transaction with
    /// its first read. `in_order`, when given, runs once the body has committed (and is
    /// durable, unless [`Commit::Unflushed`]), before its caller is answered, on the thread that
    /// answers: the `in_order` of this process's durable bodies (and, apart, of its unflushed
    /// ones) run one after the other, in the order their writes were committed, whichever
    /// caller wakes first. A body that aborts, or a transaction that fails, runs nothing.
    fn commit(
        &self,
        reads: Reads,
        body: Box<Body<'static>>,
        how: Commit,
        in_order: Option<InOrder>,
    ) -> Pending<Result<(), Failed>>;
    /// Resolves once everything committed before the call is durable.
    fn durable(&self) -> Pending<Result<(), StoreError>>;
    /// A fresh id, unique and increasing across restarts.
    fn next_id(&self) -> Result<u64, StoreError>;
    /// Takes the next value of `sequence`: never answered twice by any process of the store,
    /// across restarts, and higher than every value taken before the call began. No
    /// transaction reads or writes a row for it, so takers never conflict with each other or
    /// with transactions. A value taken but not used is a gap; there is no giving it back.
    fn next_in(&self, sequence: Sequence) -> Result<u64, StoreError>;
    /// Raises `sequence` so that every value taken from now on is above `at_least`; it never
    /// lowers it, and takers running meanwhile never get a value twice.
    fn raise(&self, sequence: Sequence, at_least: u64) -> Result<(), StoreError>;
    /// Records `progress` (the last event seq ever assigned, which only grows) as reached, once
    /// everything before it is durable; a backend that can lose data checks it at open.
    fn record_progress(&self, progress: u64) -> Pending<Result<(), StoreError>>;
    /// Bytes the database occupies on disk.
    fn size_on_disk(&self) -> u64;
    /// Looks for damage that opening did not look for, by reading the whole store once: time
    /// grows with the data, so the runner runs it in the background once it serves. `Err`
    /// says what is damaged.
    fn verify(&self) -> Result<(), StoreError>;
    /// (durability flushes, transactions of batched commits, bodies they ran) so far.
    fn stats(&self) -> Stats;
    /// Whether other processes (replicas) share this store: then claims of jobs are not this
    /// process's alone to undo at start-up, and changes can come from elsewhere.
    fn shared(&self) -> bool {
        false
    }
    /// The clock leases and timers are measured by (epoch ms): the database's for a shared
    /// store, so that replicas agree whatever their own clocks say.
    fn now_ms(&self) -> u64 {
        arbor_shared::time::now_ms()
    }
    /// Whether the store can be reached, as it changes (a database server may be down for a
    /// while); `None` for an embedded store, which always can.
    fn reachable(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        None
    }
    /// Keys nearly every batched commit reads (the event log's counter, the state counts): a
    /// backend whose reads are round trips fetches them with the first read of each batched
    /// transaction rather than one at a time.
    fn hot_keys(&self, keys: Vec<(T, Value)>) {
        drop(keys);
    }
    /// Calls `wake` when another process committed something this one may be waiting for.
    fn subscribe(&self, wake: Arc<dyn Fn(Change) + Send + Sync>) {
        drop(wake);
    }
    /// How many of this process's workers wait for work right now (its worker pool keeps the
    /// count). A backend shared with other processes need not tell them about jobs this one
    /// has idle workers for: they are woken in-process, and the others' would only race them.
    fn idle_workers(&self, idle: Arc<std::sync::atomic::AtomicUsize>) {
        drop(idle);
    }
    /// Tells the other processes sharing the store to look at the queue (what a commit that
    /// queues work for them does); nothing for a store no other process shares.
    fn announce_work(&self) {}
}

/// What another process changed (a hint: whoever is woken reads the store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Events were appended.
    Events,
    /// Events were appended, and every event up to this seq is committed and durable.
    Appended(u64),
    /// Jobs were queued.
    Work,
    /// Unknown (the notification channel was lost for a while): look at everything.
    All,
}

/// Counters of a backend's commit path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub flushes: u64,
    pub batches: u64,
    pub bodies: u64,
    /// Transactions run again because they conflicted with another (on PostgreSQL a
    /// serialisation failure, deadlock or unique violation, a batch counting once; sled runs
    /// its transactions one at a time).
    pub conflicts: u64,
}

/// What runs once a batched body has committed, before its caller is answered (see
/// [`Backend::commit`]).
pub type InOrder = Box<dyn FnOnce() + Send>;

/// Opening the store failed; the text says what and where (a damaged or locked data dir, a
/// database that refused or could not be reached in time).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OpenError(String);

impl OpenError {
    pub(crate) fn new(message: impl std::fmt::Display) -> Self {
        Self(message.to_string())
    }
}

/// Where the runner keeps its state, as configured.
#[derive(Debug, Clone)]
pub struct OpenConfig {
    /// A PostgreSQL URL: the store replicas share. `None`: the embedded store in `data_dir`.
    pub url: Option<String>,
    /// The embedded store's database directory.
    pub data_dir: PathBuf,
    /// Bounds the embedded store's page cache, which keeps parked runs cheap in memory.
    pub cache_bytes: u64,
    /// How long to wait for a data dir whose lock another process (a previous one still
    /// flushing) holds.
    pub lock_wait: Duration,
    /// Whether to wait for an unreachable database server for as long as it takes, instead
    /// of [`postgres::OPEN_PATIENCE`]; a wrong login, a missing database and a newer schema are
    /// refused at once either way.
    pub wait_always: bool,
}

/// Opens (or creates) the store `config` names: the one opener of the runner's state.
pub async fn open(config: &OpenConfig) -> Result<Store, OpenError> {
    match &config.url {
        Some(url) => Store::open_postgres_waiting(url, config.wait_always).await,
        None => Store::open_waiting(&config.data_dir, config.cache_bytes, config.lock_wait).await,
    }
}
