//! Group commit for sled: writers commit their transaction, then wait here until a flush that
//! started after their commit has finished. One flusher thread serves every waiter that queued up
//! while the previous flush ran, so N concurrent writers share one fsync instead of paying N.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
    mpsc,
};

use tokio::sync::oneshot;

/// The flush failed; the write it was meant to cover may not be durable.
#[derive(Debug, Clone, thiserror::Error)]
#[error("flush to disk failed: {0}")]
pub struct FlushError(pub String);

type Waiter = oneshot::Sender<Result<(), FlushError>>;

/// Shared handle to the flusher thread of one sled database.
#[derive(Clone)]
pub struct GroupCommit {
    tx: mpsc::Sender<Waiter>,
    stats: Arc<Stats>,
}

#[derive(Default)]
struct Stats {
    flushes: AtomicU64,
    waiters: AtomicU64,
}

impl GroupCommit {
    /// Starts the flusher thread. It ends when every handle is dropped.
    pub fn start(db: sled::Db) -> Self {
        let (tx, rx) = mpsc::channel::<Waiter>();
        let stats = Arc::new(Stats::default());
        let thread_stats = stats.clone();
        let spawned = std::thread::Builder::new()
            .name("arbor-group-commit".into())
            .spawn(move || flusher(db, rx, thread_stats));
        if let Err(e) = spawned {
            // Without the thread every flush() fails loudly instead of pretending durability.
            tracing::error!(error = %e, "could not start the group-commit thread");
        }
        Self { tx, stats }
    }

    /// Resolves once everything committed before this call is on disk.
    pub async fn flush(&self) -> Result<(), FlushError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(tx)
            .map_err(|_| FlushError("group-commit thread is gone".into()))?;
        rx.await
            .map_err(|_| FlushError("group-commit thread is gone".into()))?
    }

    /// Number of fsyncs issued so far.
    pub fn flush_count(&self) -> u64 {
        self.stats.flushes.load(Ordering::Relaxed)
    }

    /// Number of flush requests served so far.
    pub fn request_count(&self) -> u64 {
        self.stats.waiters.load(Ordering::Relaxed)
    }
}

fn flusher(db: sled::Db, rx: mpsc::Receiver<Waiter>, stats: Arc<Stats>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        let result = db
            .flush()
            .map(|_| ())
            .map_err(|e| FlushError(e.to_string()));
        stats.flushes.fetch_add(1, Ordering::Relaxed);
        stats
            .waiters
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        for waiter in batch {
            let _ = waiter.send(result.clone());
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
        let gc = GroupCommit::start(db.clone());
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
}
