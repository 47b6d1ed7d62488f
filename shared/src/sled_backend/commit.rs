//! Group commit for sled, at two levels.
//!
//! [`GroupCommit`]: writers commit their transaction, then wait until a flush that started after
//! their commit has finished. One flusher thread serves every waiter that queued up while the
//! previous flush ran, so N concurrent writers share one fsync instead of paying N.
//!
//! [`BatchCommit`]: writers hand their transaction body to one committer thread, which runs every
//! body that queued up as *one* sled transaction and then waits for one shared flush. This matters
//! more than the shared fsync: sled 0.34 writes and `sync_file_range`s two log buffers for every
//! multi-key transaction (it seals a buffer around the batch manifest), so N small transactions
//! cost 2N disk writes where one batch of N costs two. A body that aborts is taken out and the
//! rest of the batch runs again without it, so one writer's domain error never fails another's.
//!
//! A batched commit answers once a flush of the database has put it on the device: sled's own
//! `flush` (which writes out its log buffers with `sync_file_range`), then an `fsync` of its log
//! file, which also covers the file's size and the device's write cache
//! ([`crate::sled_backend::flush_and_sync`]).

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
    mpsc,
};

use sled::transaction::{ConflictableTransactionError, TransactionError};
use tokio::sync::oneshot;

/// The flush failed; the write it was meant to cover may not be durable.
#[derive(Debug, Clone, thiserror::Error)]
#[error("flush to disk failed: {0}")]
pub struct FlushError(pub String);

/// Called once the flush that covers it has finished.
type Waiter = Box<dyn FnOnce(Result<(), FlushError>) + Send>;

/// Shared handle to the flusher thread of one sled database.
#[derive(Clone)]
pub struct GroupCommit {
    tx: mpsc::Sender<Waiter>,
    stats: Arc<Stats>,
}

/// What a worker thread has done: rounds (the flusher's flushes, the committer's transactions)
/// and the items they served (flush waiters, transaction bodies).
#[derive(Default)]
struct Stats {
    rounds: AtomicU64,
    items: AtomicU64,
}

impl GroupCommit {
    /// Starts the flusher thread of the database in `dir`. It ends when every handle is dropped.
    pub fn start(db: sled::Db, dir: std::path::PathBuf) -> Self {
        let (tx, rx) = mpsc::channel::<Waiter>();
        let stats = Arc::new(Stats::default());
        let thread_stats = stats.clone();
        let spawned = std::thread::Builder::new()
            .name("arbor-group-commit".into())
            .spawn(move || flusher(db, dir, rx, thread_stats));
        if let Err(e) = spawned {
            // Without the thread every flush() fails loudly instead of pretending durability.
            tracing::error!(error = %e, "could not start the group-commit thread");
        }
        Self { tx, stats }
    }

    /// Blocks the calling (non-async) thread until everything committed before this call is on
    /// disk. The flush itself runs on the flusher thread, never on the caller's: sled 0.34 keeps
    /// every 8 MiB log segment buffer allocated for good when the thread that runs the
    /// transactions also runs their `flush()` (measured in the soak: the runner's RSS grew by
    /// the size of the log it wrote, ~1 MiB/s, and levelled off once the flush moved here).
    fn flush_blocking(&self) -> Result<(), FlushError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.after_flush(Box::new(move |result| {
            let _ = tx.send(result);
        }));
        rx.recv().unwrap_or_else(|_| Err(flusher_gone()))
    }

    /// Resolves once everything committed before this call is on disk.
    pub async fn flush(&self) -> Result<(), FlushError> {
        let (tx, rx) = oneshot::channel();
        self.after_flush(Box::new(move |result| {
            let _ = tx.send(result);
        }));
        rx.await.map_err(|_| flusher_gone())?
    }

    /// Calls `then` once everything committed before this call is on disk, or with the error if
    /// the flush failed or the flusher thread is gone.
    fn after_flush(&self, then: Waiter) {
        if let Err(mpsc::SendError(then)) = self.tx.send(then) {
            then(Err(flusher_gone()));
        }
    }

    /// Number of fsyncs issued so far.
    pub fn flush_count(&self) -> u64 {
        self.stats.rounds.load(Ordering::Relaxed)
    }

    /// Number of flush requests served so far.
    pub fn request_count(&self) -> u64 {
        self.stats.items.load(Ordering::Relaxed)
    }
}

fn flusher_gone() -> FlushError {
    FlushError("group-commit thread is gone".into())
}

fn flusher(db: sled::Db, dir: std::path::PathBuf, rx: mpsc::Receiver<Waiter>, stats: Arc<Stats>) {
    let mut syncer = crate::sled_backend::Syncer::new(db, dir);
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        let result = syncer.sync().map_err(|e| FlushError(e.to_string()));
        stats.rounds.fetch_add(1, Ordering::Relaxed);
        stats.items.fetch_add(batch.len() as u64, Ordering::Relaxed);
        for waiter in batch {
            waiter(result.clone());
        }
    }
}

/// A set of sled trees that one transaction spans, as a service sees them.
pub trait TxSet: Send + 'static {
    /// The view a transaction body gets.
    type Tx<'a>;

    /// Runs `body` as one sled transaction over the set (sled retries it on conflict).
    fn transaction(
        &self,
        body: &dyn Fn(&Self::Tx<'_>) -> BatchResult,
    ) -> Result<(), TransactionError<usize>>;
}

/// What a batch body returns: abort naming the body that aborted, or conflict/storage as sled's.
pub type BatchResult = Result<(), ConflictableTransactionError<usize>>;

/// Why a batched commit failed.
#[derive(Debug, thiserror::Error)]
pub enum CommitError<E> {
    /// The body aborted with its own error; nothing it wrote was kept.
    #[error(transparent)]
    Abort(E),
    #[error("storage error: {0}")]
    Storage(sled::Error),
    /// The transaction committed but the flush that should have made it durable failed.
    #[error(transparent)]
    Flush(FlushError),
}

impl<E> CommitError<E> {
    /// The caller's own error type: the body's error as it is, storage and flush failures
    /// through the type's conversions.
    pub fn flatten<T: From<E> + From<sled::Error> + From<FlushError>>(self) -> T {
        match self {
            Self::Abort(e) => e.into(),
            Self::Storage(e) => e.into(),
            Self::Flush(e) => e.into(),
        }
    }
}

/// How the batch a body was part of ended.
enum Outcome {
    Committed(Result<(), FlushError>),
    Aborted,
    Storage(sled::Error),
}

/// One queued body with the slot its last run wrote its result to.
trait Pending<S: TxSet>: Send {
    fn durable(&self) -> bool;
    fn apply(&self, tx: &S::Tx<'_>) -> Result<(), ConflictableTransactionError<()>>;
    fn done(self: Box<Self>, outcome: Outcome);
}

type Reply<R, E> = oneshot::Sender<Result<R, CommitError<E>>>;

/// What runs on the committer thread once a body's transaction is committed (and flushed, for
/// a durable one), before its caller is answered; see [`BatchCommit::commit_with`].
pub type InOrder = Box<dyn FnOnce() + Send>;

struct Op<R, E, F> {
    body: F,
    /// Answer only once the batch is flushed (otherwise as soon as it committed).
    durable: bool,
    last: std::sync::Mutex<Option<Result<R, E>>>,
    in_order: Option<InOrder>,
    reply: Reply<R, E>,
}

impl<S, R, E, F> Pending<S> for Op<R, E, F>
where
    S: TxSet,
    R: Send,
    E: Send,
    F: Fn(&S::Tx<'_>) -> Result<R, ConflictableTransactionError<E>> + Send,
{
    fn durable(&self) -> bool {
        self.durable
    }

    fn apply(&self, tx: &S::Tx<'_>) -> Result<(), ConflictableTransactionError<()>> {
        let (kept, verdict) = match (self.body)(tx) {
            Ok(r) => (Some(Ok(r)), Ok(())),
            Err(ConflictableTransactionError::Abort(e)) => {
                (Some(Err(e)), Err(ConflictableTransactionError::Abort(())))
            }
            Err(ConflictableTransactionError::Conflict) => {
                (None, Err(ConflictableTransactionError::Conflict))
            }
            Err(ConflictableTransactionError::Storage(e)) => {
                (None, Err(ConflictableTransactionError::Storage(e)))
            }
        };
        if let Ok(mut last) = self.last.lock() {
            *last = kept;
        }
        verdict
    }

    fn done(self: Box<Self>, outcome: Outcome) {
        let Op {
            last,
            in_order,
            reply,
            ..
        } = *self;
        let last = last.into_inner().ok().flatten();
        let result = match (outcome, last) {
            (Outcome::Committed(Ok(())), Some(Ok(r))) => Ok(r),
            (Outcome::Committed(Err(e)), _) => Err(CommitError::Flush(e)),
            (Outcome::Aborted, Some(Err(e))) => Err(CommitError::Abort(e)),
            (Outcome::Storage(e), _) => Err(CommitError::Storage(e)),
            (_, _) => Err(CommitError::Storage(sled::Error::ReportableBug(
                "batched commit ended without a result".into(),
            ))),
        };
        if let (Ok(_), Some(in_order)) = (&result, in_order) {
            in_order();
        }
        let _ = reply.send(result);
    }
}

/// Most bodies one transaction takes; the rest wait for the next one. It bounds the size of one
/// sled transaction. Measured with 64 against 16: the full cycle at K=64 went from 1,331 to
/// 1,481 cycles/s, the mailbox bench with 32 workers from ~11,000 to 12,600–14,100 cycles/s (its
/// batches had filled up at 16), and 100,000 parked runs left the runner at 161 MiB instead of
/// 175 MiB. (With 256, before the flush moved off this thread, it was 374 MiB.)
const MAX_BATCH: usize = 64;

/// Handle to the committer thread of one tree set.
pub struct BatchCommit<S: TxSet> {
    tx: mpsc::Sender<Box<dyn Pending<S>>>,
    stats: Arc<Stats>,
}

impl<S: TxSet> Clone for BatchCommit<S> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            stats: self.stats.clone(),
        }
    }
}

impl<S: TxSet> BatchCommit<S> {
    /// Starts the committer thread; committed batches wait for `gc`'s flushes. The thread ends
    /// when every handle is dropped.
    pub fn start(set: S, gc: GroupCommit) -> Self {
        let (tx, rx) = mpsc::channel::<Box<dyn Pending<S>>>();
        let stats = Arc::new(Stats::default());
        let thread_stats = stats.clone();
        let spawned = std::thread::Builder::new()
            .name("arbor-committer".into())
            .spawn(move || committer(set, rx, gc, thread_stats));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start the committer thread");
        }
        Self { tx, stats }
    }

    /// Runs `body` in a transaction shared with whatever else is queued and resolves once that
    /// transaction is durable. The body may run more than once (a conflict, or another body of
    /// the batch aborting), so it must be free of side effects outside the transaction.
    pub async fn commit<R, E, F>(&self, body: F) -> Result<R, CommitError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&S::Tx<'_>) -> Result<R, ConflictableTransactionError<E>> + Send + 'static,
    {
        self.commit_with(body, true, None).await
    }

    /// [`commit`](Self::commit) (`durable`) or [`apply`](Self::apply); `in_order`, when given,
    /// runs once the body has committed (and is flushed, when `durable`), on the committer
    /// thread, before its caller is answered: the `in_order` of successive durable bodies (or
    /// of successive bodies that are not) run one after the other, in the order their writes
    /// were committed, whichever caller wakes first. A body that aborts, or a batch that fails,
    /// runs nothing.
    pub async fn commit_with<R, E, F>(
        &self,
        body: F,
        durable: bool,
        in_order: Option<InOrder>,
    ) -> Result<R, CommitError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&S::Tx<'_>) -> Result<R, ConflictableTransactionError<E>> + Send + 'static,
    {
        let gone = || {
            CommitError::Storage(sled::Error::ReportableBug(
                "the committer thread is gone".into(),
            ))
        };
        let (reply, rx) = oneshot::channel();
        let op: Box<dyn Pending<S>> = Box::new(Op {
            body,
            durable,
            last: std::sync::Mutex::new(None),
            in_order,
            reply,
        });
        self.tx.send(op).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Like [`commit`](Self::commit) but resolves as soon as the transaction has committed,
    /// without waiting for the flush: for writes a crash may lose (a claim, which start-up
    /// undoes anyway).
    pub async fn apply<R, E, F>(&self, body: F) -> Result<R, CommitError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&S::Tx<'_>) -> Result<R, ConflictableTransactionError<E>> + Send + 'static,
    {
        self.commit_with(body, false, None).await
    }

    /// Transactions run so far.
    pub fn batch_count(&self) -> u64 {
        self.stats.rounds.load(Ordering::Relaxed)
    }

    /// Bodies committed or aborted so far.
    pub fn body_count(&self) -> u64 {
        self.stats.items.load(Ordering::Relaxed)
    }
}

fn committer<S: TxSet>(
    set: S,
    rx: mpsc::Receiver<Box<dyn Pending<S>>>,
    gc: GroupCommit,
    stats: Arc<Stats>,
) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter().take(MAX_BATCH - 1));
        stats.items.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let mut aborted = Vec::new();
        let mut failed = None;
        while !batch.is_empty() {
            stats.rounds.fetch_add(1, Ordering::Relaxed);
            let ran = set.transaction(&|tx| {
                for (i, op) in batch.iter().enumerate() {
                    op.apply(tx).map_err(|e| match e {
                        ConflictableTransactionError::Abort(()) => {
                            ConflictableTransactionError::Abort(i)
                        }
                        ConflictableTransactionError::Storage(s) => {
                            ConflictableTransactionError::Storage(s)
                        }
                        ConflictableTransactionError::Conflict => {
                            ConflictableTransactionError::Conflict
                        }
                    })?;
                }
                Ok(())
            });
            match ran {
                Ok(()) => break,
                Err(TransactionError::Abort(i)) if i < batch.len() => {
                    aborted.push(batch.remove(i));
                }
                Err(TransactionError::Abort(_)) => {
                    failed = Some(sled::Error::ReportableBug(
                        "abort of an unknown body".into(),
                    ));
                    break;
                }
                Err(TransactionError::Storage(e)) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // Aborted bodies wrote nothing: they answer at once, without waiting for a flush.
        for op in aborted {
            op.done(Outcome::Aborted);
        }
        if let Some(e) = failed {
            for op in batch {
                op.done(Outcome::Storage(e.clone()));
            }
            continue;
        }
        let (batch, quick): (Vec<_>, Vec<_>) = batch.into_iter().partition(|op| op.durable());
        for op in quick {
            op.done(Outcome::Committed(Ok(())));
        }
        if batch.is_empty() {
            continue;
        }
        // The batch waits for its flush before the next batch starts: whatever queues up
        // meanwhile becomes the next batch. (Overlapping the next transaction with this flush was
        // measured slower: smaller batches, so more transactions, each two disk writes, and a
        // sled flush excludes transactions while it waits for the disk.)
        let result = gc.flush_blocking();
        for op in batch {
            op.done(Outcome::Committed(result.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_waiter_is_served_by_some_flush() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let gc = GroupCommit::start(db.clone(), dir.path().to_path_buf());
        let mut tasks = Vec::new();
        for i in 0..64u32 {
            let db = db.clone();
            let gc = gc.clone();
            tasks.push(tokio::spawn(async move {
                db.insert(i.to_be_bytes(), &b"v"[..]).unwrap();
                gc.flush().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(gc.request_count(), 64);
        assert!(gc.flush_count() >= 1 && gc.flush_count() <= 64);
        assert_eq!(db.len(), 64);
    }

    /// Two trees, so every commit is a real multi-tree transaction.
    struct Pair(sled::Tree, sled::Tree);

    impl TxSet for Pair {
        type Tx<'a> = (
            sled::transaction::TransactionalTree,
            sled::transaction::TransactionalTree,
        );

        fn transaction(
            &self,
            body: &dyn Fn(&Self::Tx<'_>) -> BatchResult,
        ) -> Result<(), TransactionError<usize>> {
            use sled::Transactional;
            (&self.0, &self.1).transaction(|(a, b)| body(&(a.clone(), b.clone())))
        }
    }

    /// A fresh database with a batched commit over its two trees `a` and `b`.
    fn start_pair() -> (tempfile::TempDir, sled::Tree, sled::Tree, BatchCommit<Pair>) {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let (a, b) = (db.open_tree("a").unwrap(), db.open_tree("b").unwrap());
        let batches = BatchCommit::start(
            Pair(a.clone(), b.clone()),
            GroupCommit::start(db, dir.path().to_path_buf()),
        );
        (dir, a, b, batches)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_commits_share_transactions_and_each_gets_its_own_result() {
        let (_dir, a, b, batches) = start_pair();
        let mut tasks = Vec::new();
        for i in 0..200u32 {
            let batches = batches.clone();
            tasks.push(tokio::spawn(async move {
                batches
                    .commit(move |(a, b)| {
                        a.insert(&i.to_be_bytes(), &b"x"[..])?;
                        b.insert(&i.to_be_bytes(), &b"y"[..])?;
                        Ok::<_, ConflictableTransactionError<String>>(i * 2)
                    })
                    .await
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            assert_eq!(t.await.unwrap().unwrap(), i as u32 * 2);
        }
        assert_eq!((a.len(), b.len()), (200, 200));
        assert_eq!(batches.body_count(), 200);
        // Sharing is the point: at most one transaction per commit, retries included.
        assert!(batches.batch_count() <= 200, "{}", batches.batch_count());
    }

    /// Each body takes the next number of a counter; what runs in order after each commit sees
    /// the numbers in the order they were taken, before the body's caller is answered, and
    /// nothing of a body that aborted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_runs_in_order_runs_in_commit_order_before_the_answer() {
        let (_dir, a, _b, batches) = start_pair();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..200u32 {
            let (batches, seen) = (batches.clone(), seen.clone());
            let taken = Arc::new(std::sync::Mutex::new(None));
            let noted = taken.clone();
            let in_order: InOrder = Box::new({
                let seen = seen.clone();
                move || seen.lock().unwrap().push(noted.lock().unwrap().unwrap())
            });
            tasks.push(tokio::spawn(async move {
                let answer = batches
                    .commit_with(
                        move |(a, _)| {
                            if i % 7 == 3 {
                                return Err(ConflictableTransactionError::Abort(i));
                            }
                            let next = a
                                .get(b"counter")?
                                .map_or(0, |v| u32::from_be_bytes(v.as_ref().try_into().unwrap()));
                            a.insert(&b"counter"[..], &(next + 1).to_be_bytes()[..])?;
                            *taken.lock().unwrap() = Some(next);
                            Ok(next)
                        },
                        true,
                        Some(in_order),
                    )
                    .await;
                if let Ok(number) = answer {
                    assert!(
                        seen.lock().unwrap().contains(&number),
                        "body {i} was answered before what runs after its commit ran"
                    );
                }
                answer.is_ok()
            }));
        }
        let mut committed = 0;
        for t in tasks {
            committed += usize::from(t.await.unwrap());
        }
        let seen = seen.lock().unwrap().clone();
        let expected: Vec<u32> = (0..committed as u32).collect();
        assert_eq!(
            seen, expected,
            "not in commit order, or an aborted body's ran"
        );
        let counter = a.get(b"counter").unwrap().unwrap();
        assert_eq!(counter.as_ref(), &(committed as u32).to_be_bytes()[..]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_body_that_aborts_fails_alone_and_keeps_nothing() {
        let (_dir, a, b, batches) = start_pair();
        let mut tasks = Vec::new();
        for i in 0..100u32 {
            let batches = batches.clone();
            tasks.push(tokio::spawn(async move {
                batches
                    .commit(move |(a, b)| {
                        // Writes first, then every third body refuses: its writes must vanish.
                        a.insert(&i.to_be_bytes(), &b"x"[..])?;
                        if i.is_multiple_of(3) {
                            return Err(ConflictableTransactionError::Abort(format!("no {i}")));
                        }
                        b.insert(&i.to_be_bytes(), &b"y"[..])?;
                        Ok(i)
                    })
                    .await
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            let i = i as u32;
            match t.await.unwrap() {
                Ok(v) => assert!(!i.is_multiple_of(3) && v == i),
                Err(CommitError::Abort(e)) => {
                    assert!(i.is_multiple_of(3) && e == format!("no {i}"))
                }
                Err(e) => panic!("unexpected {e}"),
            }
            let kept = !i.is_multiple_of(3);
            assert_eq!(a.contains_key(i.to_be_bytes()).unwrap(), kept, "a {i}");
            assert_eq!(b.contains_key(i.to_be_bytes()).unwrap(), kept, "b {i}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn later_bodies_of_a_batch_see_earlier_ones() {
        let (_dir, a, _, batches) = start_pair();
        // Each body increments one counter; however the bodies are batched, none is lost.
        let mut tasks = Vec::new();
        for _ in 0..100 {
            let batches = batches.clone();
            tasks.push(tokio::spawn(async move {
                batches
                    .commit(|(a, _)| {
                        let n = a
                            .get(b"n")?
                            .map(|v| u64::from_be_bytes(v.as_ref().try_into().unwrap()))
                            .unwrap_or(0);
                        a.insert(&b"n"[..], &(n + 1).to_be_bytes()[..])?;
                        Ok::<_, ConflictableTransactionError<()>>(n + 1)
                    })
                    .await
                    .unwrap()
            }));
        }
        let mut seen = Vec::new();
        for t in tasks {
            seen.push(t.await.unwrap());
        }
        seen.sort();
        assert_eq!(seen, (1..=100).collect::<Vec<u64>>());
        let n = a.get(b"n").unwrap().unwrap();
        assert_eq!(u64::from_be_bytes(n.as_ref().try_into().unwrap()), 100);
    }
}
