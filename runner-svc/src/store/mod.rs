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
//! Durability: [`Store::commit`] answers once its transaction is on the device; [`Store::apply`]
//! and [`Store::transact`] once it is committed, and [`Store::durable`] waits for everything
//! committed before it. The embedded backend is sled ([`open`](Store::open)).

pub mod codec;
mod postgres;
mod sled_backend;
pub mod tables;

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
};

pub use postgres::{
    COUNTER_ROWS, DELETE_KEYS, LAST_IN_RANGE, LOCK_FIRST, OPEN_PATIENCE as POSTGRES_OPEN_PATIENCE,
    SCAN_RANGE, SESSION as POSTGRES_SESSION,
};
pub use sled_backend::OpenError;

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
}

/// What a transaction body is given.
pub type Tx<'a> = dyn Txn + 'a;

impl<'a> dyn Txn + 'a {
    /// One table of the transaction.
    pub fn tree(&self, t: T) -> TxTable<'_, 'a> {
        TxTable { tx: self, t }
    }
}

/// One table inside a transaction.
pub struct TxTable<'t, 'a> {
    tx: &'t (dyn Txn + 'a),
    t: T,
}

impl TxTable<'_, '_> {
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Value>, Fault> {
        self.tx.get(self.t, key.as_ref())
    }

    pub fn insert(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), Fault> {
        self.tx.put(self.t, key.as_ref(), value.as_ref())
    }

    pub fn remove(&self, key: impl AsRef<[u8]>) -> Result<(), Fault> {
        self.tx.delete(self.t, key.as_ref())
    }

    /// See [`Txn::add`].
    pub fn add(&self, key: impl AsRef<[u8]>, delta: i64) -> Result<(), Fault> {
        self.tx.add(self.t, key.as_ref(), delta)
    }

    /// See [`Txn::lock_first`].
    pub fn lock_first(&self, keys: &[Value], limit: usize) -> Result<Vec<(Value, Value)>, Fault> {
        self.tx.lock_first(self.t, keys, limit)
    }
}

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

/// What runs once a batched body has committed, before its caller is answered (see
/// [`Backend::commit`]).
pub use arbor_shared::sled_backend::commit::InOrder;

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

/// Handle to the runner's storage. Cheap to clone.
#[derive(Clone)]
pub struct Store(Arc<dyn Backend>);

/// One table, read outside any transaction.
pub struct Table<'s> {
    backend: &'s dyn Backend,
    t: T,
}

impl Table<'_> {
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Value>, StoreError> {
        self.backend.get(self.t, key.as_ref())
    }

    /// See [`Backend::counter`].
    pub fn counter(&self, key: impl AsRef<[u8]>) -> Result<i64, StoreError> {
        self.backend.counter(self.t, key.as_ref())
    }

    pub fn contains_key(&self, key: impl AsRef<[u8]>) -> Result<bool, StoreError> {
        Ok(self.get(key)?.is_some())
    }

    pub fn iter(&self) -> Entries<'static> {
        self.backend.scan(self.t, &[], &[])
    }

    /// Every entry, for a caller that takes them all (see [`Backend::scan_wanting`]).
    pub fn all(&self) -> Entries<'static> {
        self.backend.scan_wanting(self.t, &[], &[], usize::MAX)
    }

    pub fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> Entries<'static> {
        self.backend.scan(self.t, prefix.as_ref(), &[])
    }

    /// Entries from `from` on.
    pub fn range_from(&self, from: impl AsRef<[u8]>) -> Entries<'static> {
        self.backend.scan(self.t, &[], from.as_ref())
    }

    /// Entries from `from` on, for a caller that will take about `wanted` of them (see
    /// [`Backend::scan_wanting`]).
    pub fn range_from_wanting(&self, from: impl AsRef<[u8]>, wanted: usize) -> Entries<'static> {
        self.backend
            .scan_wanting(self.t, &[], from.as_ref(), wanted)
    }

    /// Entries with keys above `key` (every entry when `key` is empty).
    pub fn after(&self, key: impl AsRef<[u8]>) -> Entries<'static> {
        let key = key.as_ref();
        match key.is_empty() {
            true => self.iter(),
            // The least key above `key` is `key` followed by a zero byte.
            false => self.range_from([key, &[0]].concat()),
        }
    }

    /// See [`Backend::insert_new`].
    pub fn insert_new(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<Option<Value>, StoreError> {
        self.backend
            .insert_new(self.t, key.as_ref(), value.as_ref())
    }

    pub fn last(&self) -> Result<Option<(Value, Value)>, StoreError> {
        self.backend.last(self.t, &[])
    }

    /// The entry with the highest key that starts with `prefix`.
    pub fn last_with_prefix(
        &self,
        prefix: impl AsRef<[u8]>,
    ) -> Result<Option<(Value, Value)>, StoreError> {
        self.backend.last(self.t, prefix.as_ref())
    }
}

/// Where a body's typed result waits while the backend runs the erased body.
type Slot<R, E> = Arc<Mutex<Option<Result<R, E>>>>;

/// What runs on a committed body's result, in commit order (see [`Store::commit_in_order`]).
type Then<R> = Box<dyn FnOnce(&mut R) + Send>;

fn erase<R, E>(
    body: impl Fn(&Tx<'_>) -> TxResult<R, E>,
    slot: Slot<R, E>,
) -> impl Fn(&Tx<'_>) -> TxResult<(), ()> {
    move |tx| {
        let (kept, verdict) = match body(tx) {
            Ok(r) => (Some(Ok(r)), Ok(())),
            Err(Abort::Domain(e)) => (Some(Err(e)), Err(Abort::Domain(()))),
            Err(Abort::Conflict) => (None, Err(Abort::Conflict)),
            Err(Abort::Storage(s)) => (None, Err(Abort::Storage(s))),
        };
        if let Ok(mut slot) = slot.lock() {
            *slot = kept;
        }
        verdict
    }
}

fn take<R, E>(ran: Result<(), Failed>, slot: &Slot<R, E>) -> Result<R, TxError<E>> {
    let last = slot.lock().ok().and_then(|mut s| s.take());
    match (ran, last) {
        (Ok(()), Some(Ok(r))) => Ok(r),
        (Err(Failed::Aborted), Some(Err(e))) => Err(TxError::Abort(e)),
        (Err(Failed::Storage(e)), _) => Err(TxError::Storage(e)),
        _ => Err(TxError::Storage(StoreError::Failed(
            "a transaction ended without its body's result".into(),
        ))),
    }
}

impl Store {
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self(backend)
    }

    /// See [`Backend::get_many`].
    pub fn get_many(&self, keys: &[(T, &[u8])]) -> Result<Vec<Option<Value>>, StoreError> {
        self.0.get_many(keys)
    }

    /// See [`Backend::get_many_and_prefix`].
    pub fn get_many_and_prefix(
        &self,
        keys: &[(T, &[u8])],
        t: T,
        prefix: &[u8],
    ) -> Result<ManyAndPrefix, StoreError> {
        self.0.get_many_and_prefix(keys, t, prefix)
    }

    /// One table, for reads outside a transaction.
    pub fn tree(&self, t: T) -> Table<'_> {
        Table {
            backend: &*self.0,
            t,
        }
    }

    /// Runs `body` as one serialisable transaction over every table, on the calling thread and
    /// outside the batched commit. It returns once committed, before it is on disk: await
    /// [`durable`](Self::durable) for that. The body may run more than once, so it must be free
    /// of side effects.
    pub fn transact<R, E>(
        &self,
        body: impl Fn(&Tx<'_>) -> TxResult<R, E> + Send,
    ) -> Result<R, TxError<E>>
    where
        R: Send,
        E: Send,
    {
        let slot: Slot<R, E> = Arc::default();
        let ran = self.0.transact(&erase(body, slot.clone()));
        take(ran, &slot)
    }

    /// Runs `body` in one transaction with whatever other commits are queued and resolves once
    /// that transaction is durable: the way every write that answers an RPC commits. The body
    /// may run more than once, so it must be free of side effects outside the transaction.
    pub async fn commit<R, E, F>(&self, body: F) -> Result<R, TxError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&Tx<'_>) -> TxResult<R, E> + Send + 'static,
    {
        self.commit_reading(Vec::new(), body).await
    }

    /// [`commit`](Self::commit) of a body that reads `reads`: on a store whose reads are round
    /// trips, the rows every body of the batch names this way are fetched together, with the
    /// batch's first read, instead of one round trip per body. The body still sees the writes
    /// of the bodies before it in its batch, as with any read.
    pub async fn commit_reading<R, E, F>(&self, reads: Reads, body: F) -> Result<R, TxError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&Tx<'_>) -> TxResult<R, E> + Send + 'static,
    {
        self.commit_as(reads, Commit::Durable, body).await
    }

    /// [`commit`](Self::commit) that resolves as soon as the transaction has committed, without
    /// waiting for it to be durable: for writes a crash may lose (a claim, which start-up undoes
    /// anyway).
    pub async fn apply<R, E, F>(&self, body: F) -> Result<R, TxError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&Tx<'_>) -> TxResult<R, E> + Send + 'static,
    {
        self.commit_as(Vec::new(), Commit::Unflushed, body).await
    }

    /// [`commit_reading`](Self::commit_reading) run as `how` says.
    pub async fn commit_as<R, E, F>(
        &self,
        reads: Reads,
        how: Commit,
        body: F,
    ) -> Result<R, TxError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&Tx<'_>) -> TxResult<R, E> + Send + 'static,
    {
        self.commit_then(reads, how, body, None).await
    }

    /// [`commit_as`](Self::commit_as) that also runs `in_order` on the body's result (which
    /// it may take parts of) once it has committed, before the caller is answered: the
    /// `in_order` of successive durable commits run in the order their writes were committed,
    /// not in the order their callers happen to wake (see [`Backend::commit`]). It runs on the
    /// store's commit thread: it must be quick and must not wait for the store.
    pub async fn commit_in_order<R, E, F>(
        &self,
        reads: Reads,
        how: Commit,
        body: F,
        in_order: impl FnOnce(&mut R) + Send + 'static,
    ) -> Result<R, TxError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&Tx<'_>) -> TxResult<R, E> + Send + 'static,
    {
        self.commit_then(reads, how, body, Some(Box::new(in_order)))
            .await
    }

    async fn commit_then<R, E, F>(
        &self,
        reads: Reads,
        how: Commit,
        body: F,
        in_order: Option<Then<R>>,
    ) -> Result<R, TxError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&Tx<'_>) -> TxResult<R, E> + Send + 'static,
    {
        let slot: Slot<R, E> = Arc::default();
        let in_order = in_order.map(|then| {
            let committed = slot.clone();
            Box::new(move || {
                if let Ok(mut slot) = committed.lock()
                    && let Some(Ok(r)) = slot.as_mut()
                {
                    then(r);
                }
            }) as InOrder
        });
        let body = Box::new(erase(body, slot.clone()));
        let ran = self.0.commit(reads, body, how, in_order).await;
        take(ran, &slot)
    }

    /// Waits until everything committed so far is durable (one flush shared with every other
    /// waiter).
    pub async fn durable(&self) -> Result<(), StoreError> {
        self.0.durable().await
    }

    /// Records the progress the database reached (the last event seq ever assigned) once
    /// everything before it is durable, so losing it later is detected at start-up.
    pub async fn record_progress(&self, progress: u64) -> Result<(), StoreError> {
        self.0.record_progress(progress).await
    }

    /// A fresh unique, increasing id (survives restarts).
    pub fn next_id(&self) -> Result<u64, StoreError> {
        self.0.next_id()
    }

    /// Bytes the database occupies on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.0.size_on_disk()
    }

    /// See [`Backend::verify`]. Blocking: call it off the async runtime's threads.
    pub fn verify(&self) -> Result<(), StoreError> {
        self.0.verify()
    }

    /// Counters of the commit path.
    pub fn stats(&self) -> Stats {
        self.0.stats()
    }

    /// Flushes issued so far to make commits durable.
    pub fn flush_count(&self) -> u64 {
        self.stats().flushes
    }

    /// See [`Backend::shared`].
    pub fn shared(&self) -> bool {
        self.0.shared()
    }

    /// See [`Backend::now_ms`].
    pub fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }

    /// See [`Backend::reachable`].
    pub fn reachable(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.0.reachable()
    }

    /// See [`Backend::hot_keys`].
    pub fn hot_keys(&self, keys: Vec<(T, Value)>) {
        self.0.hot_keys(keys)
    }

    /// See [`Backend::subscribe`].
    pub fn subscribe(&self, wake: impl Fn(Change) + Send + Sync + 'static) {
        self.0.subscribe(Arc::new(wake))
    }

    /// See [`Backend::idle_workers`].
    pub fn idle_workers(&self, idle: Arc<std::sync::atomic::AtomicUsize>) {
        self.0.idle_workers(idle)
    }

    /// See [`Backend::announce_work`].
    pub fn announce_work(&self) {
        self.0.announce_work()
    }
}

/// A counter's stored value: a big-endian `i64` (anything else reads as 0).
pub fn read_counter(v: &[u8]) -> i64 {
    <[u8; 8]>::try_from(v).map_or(0, i64::from_be_bytes)
}

/// Key of a finished-index entry.
pub fn finished_key(kind: u8, at_ms: u64, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + id.len());
    k.push(kind);
    k.extend_from_slice(&at_ms.to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

/// `meta` key of the next event seq to assign (the event log's counter).
pub const NEXT_SEQ: &[u8] = b"next_seq";
/// `meta` key of the oldest event seq still retained (absent: 1).
pub const FIRST_SEQ: &[u8] = b"first_seq";

/// Converts a transaction body's abort error into another error type.
pub fn lift<R, E1, E2: From<E1>>(r: TxResult<R, E1>) -> TxResult<R, E2> {
    r.map_err(|e| match e {
        Abort::Domain(e) => Abort::Domain(e.into()),
        Abort::Conflict => Abort::Conflict,
        Abort::Storage(e) => Abort::Storage(e),
    })
}

/// Aborts the transaction with `e`.
pub fn abort<R, E>(e: impl Into<E>) -> TxResult<R, E> {
    Err(Abort::Domain(e.into()))
}
