//! The runner's sled database: one `Store` owns the named trees, runs multi-tree transactions
//! (checkpoint + events + inbox + mailbox in one atomic step) and the group commit that makes a
//! committed step durable before any RPC answers OK.
//!
//! Every transaction records what it writes and appends that record to the store's journal
//! (`arbor_shared::journal`, in `journal/` next to sled's files); a commit is durable once its
//! record is synced, and sled itself is flushed only in the background and at checkpoints. At
//! open, records the database does not hold yet are replayed into it.

pub mod codec;
pub mod counts;
pub mod mirror;

use std::{path::Path, sync::Arc};

use arbor_shared::{
    durability::{BatchCommit, BatchResult, FlushError, TxSet},
    integrity::{self, Integrity, IntegrityError},
    journal::{self, Journal, JournalError, Recorder, TxTree},
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

/// A view of every runner tree inside one sled transaction, recording what it writes for the
/// journal.
pub struct Tx<'a> {
    trees: &'a [TransactionalTree],
    rec: &'a Recorder,
    mirror: &'a mirror::Mirror,
}

impl<'a> Tx<'a> {
    pub fn tree(&self, t: T) -> TxTree<'a> {
        TxTree::new(&self.trees[t as usize], t as u8, self.rec)
    }

    /// `tree(t).get(key)`, answered for a mirrored tree (queue, active, mailboxes) from this
    /// transaction's own writes and then the mirror, without a sled lookup. The answer is the
    /// same: every transaction holds the journal's order lock from before it starts until the
    /// mirror has its writes, so the mirror holds exactly the committed state it builds on.
    pub fn get(
        &self,
        t: T,
        key: &[u8],
    ) -> Result<Option<sled::IVec>, sled::transaction::UnabortableTransactionError> {
        let tree = self.tree(t);
        if let Some(written) = tree.written(key) {
            return Ok(written);
        }
        let mirrored = self
            .mirror
            .read()
            .get(t, key)
            .map(|v| v.map(sled::IVec::from));
        match mirrored {
            Some(value) => Ok(value),
            None => tree.get(key),
        }
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
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// Handle to the runner database. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    trees: Vec<sled::Tree>,
    all: AllTrees,
    batches: BatchCommit<AllTrees>,
    integrity: Arc<Integrity>,
}

/// Every runner tree with the journal their transactions append to.
#[derive(Clone)]
pub struct AllTrees {
    trees: Vec<sled::Tree>,
    journal: Journal,
    mirror: Arc<mirror::Mirror>,
}

/// Meta key of the LSN of the last journaled transaction the database holds, written by each
/// transaction itself.
const JOURNAL_LSN: &[u8] = b"journal:lsn";

impl AllTrees {
    /// Runs `body` as one transaction over every tree and appends what it wrote to the journal.
    /// The journal's order lock is held across both, so records are in commit order.
    fn run<R, E>(
        &self,
        body: impl Fn(&Tx<'_>) -> TxResult<R, E>,
    ) -> Result<R, TransactionError<E>> {
        let append = self.journal.begin();
        let lsn = append.lsn().to_be_bytes();
        let rec = Recorder::default();
        let r = self.trees[..].transaction(|trees: &Vec<TransactionalTree>| {
            rec.take();
            let r = body(&Tx {
                trees,
                rec: &rec,
                mirror: &self.mirror,
            })?;
            if !rec.is_empty() {
                trees[T::Meta as usize].insert(JOURNAL_LSN, &lsn[..])?;
            }
            Ok(r)
        })?;
        let record = rec.take();
        if !record.is_empty() {
            // Still in commit order: the journal's order lock is held until `commit`.
            self.mirror.apply(&record);
            append.commit(record);
        }
        Ok(r)
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

/// Loads the mirror of the claim trees. A queue entry of a store from before entries had values
/// gets the value its job record gives.
fn load_mirror(trees: &[sled::Tree]) -> Result<mirror::Mirror, sled::Error> {
    mirror::Mirror::load(trees, |queue_key| {
        let job_id = crate::mailbox::tx::job_id_of_queue_key(queue_key)?;
        let job = trees[T::Jobs as usize].get(job_id).ok().flatten()?;
        let job = codec::decode("job", &job).ok()?;
        Some(crate::mailbox::tx::queue_value(&job))
    })
}

/// Where the journal lives in the database directory.
fn journal_dir(dir: &Path) -> std::path::PathBuf {
    dir.join("journal")
}

/// Replays journal records the database does not hold yet, then starts the journal (which
/// flushes sled first, so the replayed records may go).
fn open_journal(dir: &Path, db: &sled::Db, trees: &[sled::Tree]) -> Result<Journal, JournalError> {
    let meta = &trees[T::Meta as usize];
    let storage = |e: sled::Error| JournalError::Replay {
        lsn: 0,
        reason: e.to_string(),
    };
    let applied = meta
        .get(JOURNAL_LSN)
        .map_err(storage)?
        .map_or(0, |v| codec::read_u64(&v));
    let recovered = journal::recover(&journal_dir(dir), applied, |lsn, payload| {
        replay(trees, lsn, payload)
    })?;
    if recovered.replayed > 0 {
        tracing::info!(
            records = recovered.replayed,
            last = recovered.last_lsn,
            "replayed journal records the database did not hold (it stopped before writing them out, or its files lost them)"
        );
    }
    let (db, dir_owned) = (db.clone(), dir.to_path_buf());
    let since = std::sync::Mutex::new(std::time::SystemTime::UNIX_EPOCH);
    Journal::start(&journal_dir(dir), recovered, move || {
        checkpoint(&db, &dir_owned, &since)
    })
}

/// Makes everything sled holds so far durable in its own files, so the journal before it may
/// go. sled writes its log to the page cache only (`sync_log_writes(false)`: the journal is what
/// makes commits durable), so after sled's `flush` the files are synced here: the log, and
/// the blob files (values too big for the log) written since the last checkpoint.
fn checkpoint(
    db: &sled::Db,
    dir: &Path,
    since: &std::sync::Mutex<std::time::SystemTime>,
) -> Result<(), String> {
    let started = std::time::SystemTime::now();
    let text = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    arbor_shared::storage::flush_and_sync(db, dir).map_err(|e| text("sync of the sled log", &e))?;
    let blobs = dir.join("blobs");
    // Two seconds of slack for coarse file timestamps.
    let after = since
        .lock()
        .ok()
        .and_then(|t| t.checked_sub(std::time::Duration::from_secs(2)))
        .unwrap_or(std::time::SystemTime::UNIX_EPOCH);
    if let Ok(entries) = std::fs::read_dir(&blobs) {
        for entry in entries.flatten() {
            let recent = entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|m| m >= after);
            if recent {
                match std::fs::File::open(entry.path()).and_then(|f| f.sync_all()) {
                    Ok(()) => {}
                    // sled removed it meanwhile (its value was replaced or deleted).
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(text("sync of a blob file", &e)),
                }
            }
        }
        std::fs::File::open(&blobs)
            .and_then(|f| f.sync_all())
            .map_err(|e| text("sync of the blob directory", &e))?;
    }
    if let Ok(mut t) = since.lock() {
        *t = started;
    }
    Ok(())
}

/// Applies one journal record and its LSN in one transaction.
fn replay(trees: &[sled::Tree], lsn: u64, payload: &[u8]) -> Result<(), String> {
    let writes = journal::writes(payload).collect::<Result<Vec<_>, _>>()?;
    if let Some(w) = writes.iter().find(|w| w.tree as usize >= trees.len()) {
        return Err(format!("record writes to unknown tree {}", w.tree));
    }
    trees
        .transaction(|trees: &Vec<TransactionalTree>| {
            for w in &writes {
                let tree = &trees[w.tree as usize];
                match w.value {
                    Some(v) => tree.insert(w.key, v)?,
                    None => tree.remove(w.key)?,
                };
            }
            trees[T::Meta as usize].insert(JOURNAL_LSN, &lsn.to_be_bytes()[..])?;
            Ok::<_, ConflictableTransactionError<()>>(())
        })
        .map_err(|e| format!("{e:?}"))
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
        let db = arbor_shared::storage::sled_config(dir, cache_bytes)
            // The journal makes commits durable; sled's log is synced at checkpoints.
            .sync_log_writes(false)
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
        let journal = open_journal(dir, &db, &trees)?;
        // Before anything writes: sled opens a damaged log as an older or empty database.
        let progress = crate::events::last_seq_in(&trees[T::Meta as usize]).map_err(err)?;
        let integrity = Arc::new(Integrity::check(dir, &db, PROGRESS, progress)?);
        integrity::guarded(dir, |place| check_references(&trees, place))?;
        if let Some(tally) = counts::ensure(&trees).map_err(err)? {
            // Written outside the journal: synced before anything journaled builds on them.
            arbor_shared::storage::flush_and_sync(&db, dir).map_err(err)?;
            if tally.unreadable > 0 {
                tracing::warn!(
                    unreadable = tally.unreadable,
                    "records that do not decode were left out of the state counts"
                );
            }
        }
        let mirror = load_mirror(&trees).map_err(err)?;
        let all = AllTrees {
            trees: trees.clone(),
            journal,
            mirror: Arc::new(mirror),
        };
        let batches = BatchCommit::start_journaled(all.clone(), all.journal.clone());
        Ok(Self {
            db,
            trees,
            all,
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

    /// The in-memory copy of the queue, active and mailboxes trees (see [`mirror`]).
    pub fn mirror(&self) -> &mirror::Mirror {
        &self.all.mirror
    }

    /// Whether the mirror holds exactly what loading it from sled now gives: what a test of the
    /// mirror checks.
    pub fn mirror_matches(&self) -> Result<bool, sled::Error> {
        Ok(*load_mirror(&self.trees)?.read() == *self.mirror().read())
    }

    pub fn tree(&self, t: T) -> &sled::Tree {
        &self.trees[t as usize]
    }

    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    /// Runs `body` as one serialisable transaction over every runner tree, on the calling
    /// thread and outside the batched commit. It returns once committed, before its journal
    /// record is synced: await [`durable`](Self::durable) for that. The body may run more than
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

    /// Waits until everything committed so far is on disk (one journal sync shared with every
    /// other waiter).
    pub async fn durable(&self) -> Result<(), FlushError> {
        self.all.journal.durable().await
    }

    /// Syncs issued so far to make commits durable (journal syncs; sled's background and
    /// checkpoint flushes are not counted).
    pub fn flush_count(&self) -> u64 {
        self.all.journal.sync_count()
    }

    /// A fresh unique, increasing id (survives restarts).
    pub fn next_id(&self) -> Result<u64, sled::Error> {
        self.db.generate_id()
    }

    /// The `ledger.append` tool writing through this store: each record is a journaled
    /// transaction of its own, so it is durable no later than the checkpoint that holds its
    /// receipt (whose sync covers every record before it), and replayed with it.
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
