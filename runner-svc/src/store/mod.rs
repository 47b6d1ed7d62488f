//! The runner's sled database: one `Store` owns the named trees, runs multi-tree transactions
//! (checkpoint + events + inbox + mailbox in one atomic step) and the group commit that makes a
//! committed step durable before any RPC answers OK: sled's flush, then an `fsync` of its log.

pub mod codec;
pub mod counts;

use std::{path::Path, sync::Arc};

use arbor_shared::{
    sled_backend::commit::{BatchCommit, BatchResult, FlushError, GroupCommit, TxSet},
    sled_backend::integrity::{self, Integrity, IntegrityError},
};
use sled::{
    Transactional,
    transaction::{ConflictableTransactionError, TransactionError, TransactionalTree},
};

/// The trees of the runner database, in the fixed order transactions see them.
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
    /// idempotency key → receipt of the `ledger.append` tool (`crate::LEDGER_TREE`).
    Ledger,
}

const TREE_NAMES: [&str; 15] = [
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
    crate::LEDGER_TREE,
];

/// A view of every runner tree inside one sled transaction.
pub struct Tx<'a> {
    trees: &'a [TransactionalTree],
}

impl<'a> Tx<'a> {
    pub fn tree(&self, t: T) -> &'a TransactionalTree {
        &self.trees[t as usize]
    }

    /// `tree(t).get(key)`.
    pub fn get(
        &self,
        t: T,
        key: &[u8],
    ) -> Result<Option<sled::IVec>, sled::transaction::UnabortableTransactionError> {
        self.tree(t).get(key)
    }
}

/// Result of a transaction body: abort with a domain error, or let sled retry on conflict.
pub type TxResult<R, E> = Result<R, ConflictableTransactionError<E>>;

/// A failed transaction: the body aborted with a domain error, or storage failed.
#[derive(Debug, thiserror::Error)]
pub enum TxError<E> {
    #[error(transparent)]
    Abort(E),
    #[error("storage error: {0}")]
    Storage(#[from] sled::Error),
}

impl<E> From<TransactionError<E>> for TxError<E> {
    fn from(e: TransactionError<E>) -> Self {
        match e {
            TransactionError::Abort(e) => TxError::Abort(e),
            TransactionError::Storage(e) => TxError::Storage(e),
        }
    }
}

/// Key of a finished-index entry.
pub fn finished_key(kind: u8, at_ms: u64, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + id.len());
    k.push(kind);
    k.extend_from_slice(&at_ms.to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

/// Opening the database failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot open the runner database at {path}: {source}")]
    Open { path: String, source: sled::Error },
    #[error(transparent)]
    Damaged(#[from] IntegrityError),
}

/// Handle to the runner database. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    trees: Vec<sled::Tree>,
    all: AllTrees,
    gc: GroupCommit,
    batches: BatchCommit<AllTrees>,
    integrity: Arc<Integrity>,
}

/// Every runner tree, in the order of [`T`].
#[derive(Clone)]
pub struct AllTrees {
    trees: Vec<sled::Tree>,
}

impl AllTrees {
    /// Runs `body` as one transaction over every tree.
    fn run<R, E>(
        &self,
        body: impl Fn(&Tx<'_>) -> TxResult<R, E>,
    ) -> Result<R, TransactionError<E>> {
        self.trees[..].transaction(|trees: &Vec<TransactionalTree>| body(&Tx { trees }))
    }
}

impl TxSet for AllTrees {
    type Tx<'a> = Tx<'a>;

    fn transaction(
        &self,
        body: &dyn Fn(&Tx<'_>) -> BatchResult,
    ) -> Result<(), TransactionError<usize>> {
        self.run(body)
    }
}

/// What the integrity marker measures the runner database's progress by: the last event seq
/// ever assigned, which only grows (retention removes events, never the counter).
const PROGRESS: &str = "event seq";

/// How often sled's background thread wakes to write out buffered log data and clean
/// segments (sled's own default). It spends at most half of each interval rewriting pages.
const GC_INTERVAL_MS: u64 = 500;

impl Store {
    /// Opens (or creates) the database in `dir`. `cache_bytes` bounds sled's page cache, which
    /// is what keeps parked runs cheap in memory.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Self, OpenError> {
        let err = |source| OpenError::Open {
            path: dir.display().to_string(),
            source,
        };
        Integrity::precheck(dir)?;
        let db = arbor_shared::sled_backend::sled_config(dir, cache_bytes)
            // Durability comes from the group commit; this background flusher is also the
            // thread that relocates live pages out of mostly-dead log segments so they can be
            // reused. Without it the `db` file grows with every write, deleted or not.
            .flush_every_ms(Some(GC_INTERVAL_MS))
            .open()
            .map_err(err)?;
        let trees = TREE_NAMES
            .iter()
            .map(|name| db.open_tree(name))
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        // Before anything writes: sled opens a damaged log as an older or empty database.
        let progress = crate::events::last_seq_in(&trees[T::Meta as usize]).map_err(err)?;
        let integrity = Arc::new(Integrity::check(dir, &db, PROGRESS, progress)?);
        integrity::guarded(dir, |place| check_references(&trees, place))?;
        if let Some(tally) = counts::ensure(&trees).map_err(err)? {
            arbor_shared::sled_backend::flush_and_sync(&db, dir, std::time::SystemTime::UNIX_EPOCH)
                .map_err(err)?;
            if tally.unreadable > 0 {
                tracing::warn!(
                    unreadable = tally.unreadable,
                    "records that do not decode were left out of the state counts"
                );
            }
        }
        let all = AllTrees {
            trees: trees.clone(),
        };
        let gc = GroupCommit::start(db.clone(), dir.to_path_buf());
        let batches = BatchCommit::start(all.clone(), gc.clone());
        Ok(Self {
            db,
            trees,
            all,
            gc,
            batches,
            integrity,
        })
    }

    /// Makes everything committed so far durable, then records the progress it reached in the
    /// integrity marker, so losing it later is detected at start-up.
    pub async fn record_progress(&self) -> Result<(), String> {
        let progress = crate::events::last_seq_in(self.tree(T::Meta))
            .map_err(|e| format!("cannot read progress: {e}"))?;
        self.durable().await.map_err(|e| e.to_string())?;
        self.integrity
            .clone()
            .record_blocking(progress)
            .await
            .map_err(|e| e.to_string())
    }

    pub fn tree(&self, t: T) -> &sled::Tree {
        &self.trees[t as usize]
    }

    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    /// Runs `body` as one serialisable transaction over every runner tree, on the calling
    /// thread and outside the batched commit. It returns once committed, before it is on
    /// disk: await [`durable`](Self::durable) for that. The body may run more than
    /// once (sled retries on conflict), so it must be free of side effects.
    pub fn transact<R, E>(
        &self,
        body: impl Fn(&Tx<'_>) -> TxResult<R, E>,
    ) -> Result<R, TxError<E>> {
        self.all.run(body).map_err(TxError::from)
    }

    /// [`open`](Self::open), waiting up to `wait` for whoever holds the database's lock (a
    /// previous process still flushing, or this process's own store whose threads are still
    /// letting go of it) to release it.
    pub async fn open_waiting(
        dir: &Path,
        cache_bytes: u64,
        wait: std::time::Duration,
    ) -> Result<Self, OpenError> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut told = false;
        loop {
            match Self::open(dir, cache_bytes) {
                Err(OpenError::Open { source, .. })
                    if source.to_string().contains("could not acquire lock")
                        && tokio::time::Instant::now() < deadline =>
                {
                    if !told {
                        tracing::warn!(data_dir = %dir.display(), "database is locked by another process; waiting for it");
                        told = true;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    /// The state counts as stored (what `/metrics` reports).
    pub fn counts(&self) -> Result<counts::Tally, sled::Error> {
        counts::Tally::stored(self.tree(T::Meta))
    }

    /// The state counts by one pass over every record: what [`counts`](Self::counts) must equal.
    pub fn count_by_scan(&self) -> Result<counts::Tally, sled::Error> {
        counts::Tally::scan(&self.trees)
    }

    /// The batched commit: `commit(body)` runs `body` in one transaction with whatever other
    /// commits are queued and resolves once that transaction is durable, the way every write
    /// that answers an RPC commits; `apply(body)` resolves as soon as it has committed. A body
    /// may run more than once, so it must be free of side effects outside the transaction.
    pub fn batches(&self) -> &BatchCommit<AllTrees> {
        &self.batches
    }

    /// Waits until everything committed so far is on disk (one flush shared with every other
    /// waiter).
    pub async fn durable(&self) -> Result<(), FlushError> {
        self.gc.flush().await
    }

    /// Flushes issued so far to make commits durable (sled's background flushes not counted).
    pub fn flush_count(&self) -> u64 {
        self.gc.flush_count()
    }

    /// A fresh unique, increasing id (survives restarts).
    pub fn next_id(&self) -> Result<u64, sled::Error> {
        self.db.generate_id()
    }

    /// The `ledger.append` tool writing through this store: each record is a transaction of its
    /// own, so it is durable no later than the checkpoint that holds its receipt (sled's log is
    /// recovered as a prefix, and that checkpoint's flush covers every record before it).
    pub fn ledger(&self) -> crate::engine::LedgerTool {
        let store = self.clone();
        crate::engine::LedgerTool::with_writer(
            self.tree(T::Ledger).clone(),
            Arc::new(move |key: &[u8], value: Vec<u8>| {
                store
                    .transact(|t| {
                        let ledger = t.tree(T::Ledger);
                        match ledger.get(key)? {
                            Some(first) => Ok(Some(first)),
                            None => {
                                ledger.insert(key, value.clone())?;
                                Ok(None)
                            }
                        }
                    })
                    .map_err(|e: TxError<std::convert::Infallible>| e.to_string())
            }),
        )
    }

    /// Bytes the database occupies on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

/// Every index entry must name a record that exists. Index entries are small and stay in the
/// log while big records (checkpoints) may live in blob files, and sled drops a record whose blob
/// file is gone without an error: an index entry without its record is how such a loss shows.
fn check_references(trees: &[sled::Tree], place: &std::sync::Mutex<String>) -> Result<(), String> {
    let tree = |t: T| &trees[t as usize];
    let at = |name: &str| {
        if let Ok(mut p) = place.lock() {
            *p = name.to_string();
        }
    };
    let read = |e: sled::Error| e.to_string();
    at("runs");
    for key in tree(T::Runs).iter().keys() {
        let run_id = key.map_err(read)?;
        if !tree(T::Checkpoints).contains_key(&run_id).map_err(read)? {
            return Err(format!(
                "run '{}' has lost its checkpoint",
                String::from_utf8_lossy(&run_id)
            ));
        }
    }
    at("thread_runs");
    for key in tree(T::ThreadRuns).iter().keys() {
        let key = key.map_err(read)?;
        let run_id = key.split(|b| *b == 0).nth(1).unwrap_or_default();
        if !tree(T::Runs).contains_key(run_id).map_err(read)? {
            return Err(format!(
                "thread index names run '{}', which is gone",
                String::from_utf8_lossy(run_id)
            ));
        }
    }
    // The event log is gap-free between its first retained seq and the last one assigned
    // (appends and retention each move the bounds in the same transaction as the events), so a
    // missing or extra seq means pages of the log were lost.
    at("events");
    let meta = tree(T::Meta);
    let first = crate::events::first_seq_in(meta).map_err(read)?;
    let last = crate::events::last_seq_in(meta).map_err(read)?;
    let mut expected = first;
    for key in tree(T::Events).iter().keys() {
        let seq = codec::read_u64(&key.map_err(read)?);
        if seq != expected {
            return Err(format!(
                "the event log has lost events: seq {expected} is missing (next found: {seq})"
            ));
        }
        expected += 1;
    }
    if last >= first && expected != last + 1 {
        return Err(format!(
            "the event log has lost events: it ends at seq {}, but seq {last} was assigned",
            expected - 1
        ));
    }
    at("queue");
    for key in tree(T::Queue).iter().keys() {
        let key = key.map_err(read)?;
        let job_id = key.get(12..).unwrap_or_default();
        if !tree(T::Jobs).contains_key(job_id).map_err(read)? {
            return Err(format!(
                "queue names job '{}', which is gone",
                String::from_utf8_lossy(job_id)
            ));
        }
    }
    Ok(())
}

/// Converts a transaction body's abort error into another error type.
pub fn lift<R, E1, E2: From<E1>>(r: TxResult<R, E1>) -> TxResult<R, E2> {
    r.map_err(|e| match e {
        ConflictableTransactionError::Abort(e) => ConflictableTransactionError::Abort(e.into()),
        ConflictableTransactionError::Conflict => ConflictableTransactionError::Conflict,
        ConflictableTransactionError::Storage(e) => ConflictableTransactionError::Storage(e),
    })
}

/// Aborts the transaction with `e`.
pub fn abort<R, E>(e: impl Into<E>) -> TxResult<R, E> {
    Err(ConflictableTransactionError::Abort(e.into()))
}
