//! The embedded backend: the runner's tables as sled trees in one database directory.
//!
//! A transaction is one sled transaction over every tree. The batched commit runs every body
//! queued meanwhile as one such transaction and answers once sled's flush and an `fsync` of its
//! files have put it on the device (`arbor_shared::sled_backend`). Damage that sled itself would
//! not report is refused in two steps: at open, a database that is not the store its marker
//! names or that lost progress it had recorded (constant time); then [`Backend::verify`], which
//! the runner runs in the background once it serves, reads every value and checks that every
//! index entry names a record that exists (time grows with the data).

use std::{path::Path, sync::Arc};

mod tx;

use ::sled::{
    Transactional,
    transaction::{TransactionError, TransactionalTree},
};
use arbor_shared::sled_backend::{
    commit::{BatchCommit, CommitError, GroupCommit},
    integrity::{self, Integrity, IntegrityError},
};

use self::tx::{AllTrees, SledTx, to_sled};
use super::{
    Backend, Body, Commit, Entries, Failed, InOrder, NEXT_SEQ, OpenError, Pending, Reads, Sequence,
    Stats, Store, StoreError, T, TABLE_NAMES, Value, codec, verify,
};

/// Opening the database failed: sled refused it, or it is damaged.
#[derive(Debug, thiserror::Error)]
enum SledOpenError {
    #[error("cannot open the runner database at {path}: {source}")]
    Open { path: String, source: ::sled::Error },
    #[error(transparent)]
    Damaged(#[from] IntegrityError),
}

fn storage(e: ::sled::Error) -> StoreError {
    StoreError::Failed(e.to_string())
}

/// The sled backend of one database directory.
struct SledBackend {
    dir: std::path::PathBuf,
    db: ::sled::Db,
    trees: Vec<::sled::Tree>,
    gc: GroupCommit,
    batches: BatchCommit<AllTrees>,
    integrity: Arc<Integrity>,
}

/// What the integrity marker measures the runner database's progress by: the last event seq
/// ever assigned, which only grows (retention removes events, never the counter).
const PROGRESS: &str = "event seq";

/// How often sled's background thread wakes to write out buffered log data and clean
/// segments (sled's own default). It spends at most half of each interval rewriting pages.
const GC_INTERVAL_MS: u64 = 500;

/// The last event seq ever assigned, from the `meta` tree.
fn last_seq(meta: &::sled::Tree) -> Result<u64, ::sled::Error> {
    Ok(meta
        .get(NEXT_SEQ)?
        .map_or(0, |b| codec::read_u64(&b).saturating_sub(1)))
}

impl Store {
    /// Opens (or creates) the sled database in `dir`. `cache_bytes` bounds sled's page cache,
    /// which is what keeps parked runs cheap in memory.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Self, OpenError> {
        Self::open_sled(dir, cache_bytes).map_err(OpenError::new)
    }

    fn open_sled(dir: &Path, cache_bytes: u64) -> Result<Self, SledOpenError> {
        let err = |source| SledOpenError::Open {
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
        let trees = TABLE_NAMES
            .iter()
            .map(|name| db.open_tree(name))
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        // Before anything writes: sled opens a damaged log as an older or empty database.
        let progress = last_seq(&trees[T::Meta as usize]).map_err(err)?;
        let integrity = Arc::new(Integrity::check_marker(dir, &db, PROGRESS, progress)?);
        let gc = GroupCommit::start(db.clone(), dir.to_path_buf());
        let batches = BatchCommit::start(
            AllTrees {
                trees: trees.clone(),
            },
            gc.clone(),
        );
        Ok(Self::new(Arc::new(SledBackend {
            dir: dir.to_path_buf(),
            db,
            trees,
            gc,
            batches,
            integrity,
        })))
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
            match Self::open_sled(dir, cache_bytes) {
                Err(SledOpenError::Open { source, .. })
                    if source.to_string().contains("could not acquire lock")
                        && tokio::time::Instant::now() < deadline =>
                {
                    if !told {
                        tracing::warn!(data_dir = %dir.display(), "database is locked by another process; waiting for it");
                        told = true;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                other => return other.map_err(OpenError::new),
            }
        }
    }
}

impl Backend for SledBackend {
    fn get(&self, t: T, key: &[u8]) -> Result<Option<Value>, StoreError> {
        self.trees[t as usize]
            .get(key)
            .map(|v| v.map(|v| v.to_vec()))
            .map_err(storage)
    }

    fn scan(&self, t: T, prefix: &[u8], from: &[u8]) -> Entries<'static> {
        let start = if from > prefix { from } else { prefix }.to_vec();
        let prefix = prefix.to_vec();
        Entries::new(
            self.trees[t as usize]
                .range(start..)
                .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(storage))
                .take_while(move |r| r.as_ref().map_or(true, |(k, _)| k.starts_with(&prefix))),
        )
    }

    fn last(&self, t: T, prefix: &[u8]) -> Result<Option<(Value, Value)>, StoreError> {
        self.trees[t as usize]
            .scan_prefix(prefix)
            .next_back()
            .transpose()
            .map(|e| e.map(|(k, v)| (k.to_vec(), v.to_vec())))
            .map_err(storage)
    }

    fn insert_new(&self, t: T, key: &[u8], value: &[u8]) -> Result<Option<Value>, StoreError> {
        let swapped = self.trees[t as usize]
            .compare_and_swap(key, None::<&[u8]>, Some(value))
            .map_err(storage)?;
        Ok(swapped
            .err()
            .and_then(|held| held.current.map(|v| v.to_vec())))
    }

    fn transact(&self, body: &Body<'_>) -> Result<(), Failed> {
        self.trees[..]
            .transaction(|trees: &Vec<TransactionalTree>| to_sled(body(&SledTx { trees })))
            .map_err(|e| match e {
                TransactionError::Abort(()) => Failed::Aborted,
                TransactionError::Storage(e) => Failed::Storage(storage(e)),
            })
    }

    /// Reads are the process's own memory and disk: `reads` need no fetching ahead.
    fn commit(
        &self,
        _reads: Reads,
        body: Box<Body<'static>>,
        how: Commit,
        in_order: Option<InOrder>,
    ) -> Pending<Result<(), Failed>> {
        let batches = self.batches.clone();
        Box::pin(async move {
            let body = move |tx: &SledTx<'_>| to_sled(body(tx));
            // Every transaction here is serialisable: sled's are.
            let durable = match how {
                Commit::Durable | Commit::Serializable => true,
                Commit::Unflushed => false,
            };
            let ran = batches.commit_with(body, durable, in_order).await;
            ran.map_err(|e| match e {
                CommitError::Abort(()) => Failed::Aborted,
                CommitError::Storage(e) => Failed::Storage(storage(e)),
                CommitError::Flush(e) => Failed::Storage(StoreError::Failed(e.to_string())),
            })
        })
    }

    fn durable(&self) -> Pending<Result<(), StoreError>> {
        let gc = self.gc.clone();
        Box::pin(async move {
            gc.flush()
                .await
                .map_err(|e| StoreError::Failed(e.to_string()))
        })
    }

    fn next_id(&self) -> Result<u64, StoreError> {
        self.db.generate_id().map_err(storage)
    }

    /// An atomic add to the sequence's `meta` row, outside any transaction (sled's
    /// read-modify-write of one key, no lock held across calls): the counter is in sled's log
    /// before the record that uses it, so whatever flush makes that record durable makes the
    /// counter durable too, and a counter lost in a crash lost every record that used it.
    fn next_in(&self, sequence: Sequence) -> Result<u64, StoreError> {
        let meta = &self.trees[T::Meta as usize];
        let next =
            |old: Option<&[u8]>| Some((old.map_or(0, codec::read_u64) + 1).to_be_bytes().to_vec());
        let now = meta
            .update_and_fetch(sequence.meta_key(), next)
            .map_err(storage)?;
        Ok(now.map_or(0, |v| codec::read_u64(&v)))
    }

    /// Writes the row even at 0, so that the sequence exists from then on.
    fn raise(&self, sequence: Sequence, at_least: u64) -> Result<(), StoreError> {
        let meta = &self.trees[T::Meta as usize];
        let raised = |old: Option<&[u8]>| {
            Some(
                old.map_or(0, codec::read_u64)
                    .max(at_least)
                    .to_be_bytes()
                    .to_vec(),
            )
        };
        meta.update_and_fetch(sequence.meta_key(), raised)
            .map_err(storage)?;
        Ok(())
    }

    fn record_progress(&self, progress: u64) -> Pending<Result<(), StoreError>> {
        let (gc, integrity) = (self.gc.clone(), self.integrity.clone());
        Box::pin(async move {
            gc.flush()
                .await
                .map_err(|e| StoreError::Failed(e.to_string()))?;
            integrity
                .record_blocking(progress)
                .await
                .map_err(|e| StoreError::Failed(e.to_string()))
        })
    }

    fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }

    /// Every value readable (sled reads blob files and cold pages lazily), then the tables'
    /// cross-references (see `verify`): index entries are small and stay in the log while big
    /// records (checkpoints) may live in blob files, and sled drops a record whose blob file is
    /// gone without an error: an index entry without its record is how such a loss shows. Both
    /// run guarded, since sled panics on some damage instead of failing the read.
    fn verify(&self) -> Result<(), StoreError> {
        integrity::verify_readable(&self.dir, &self.db)
            .and_then(|()| {
                integrity::guarded(&self.dir, |place| {
                    let at = |name: &str| {
                        if let Ok(mut p) = place.lock() {
                            *p = name.to_string();
                        }
                    };
                    verify::references(self, &at).unwrap_or_else(|e| Err(e.to_string()))
                })
            })
            .map_err(|e| StoreError::Failed(e.to_string()))
    }

    fn stats(&self) -> Stats {
        Stats {
            flushes: self.gc.flush_count(),
            batches: self.batches.batch_count(),
            bodies: self.batches.body_count(),
            // sled runs its transactions one at a time (each holds its global lock from its
            // first read to its commit), so none conflicts with another.
            conflicts: 0,
        }
    }
}
