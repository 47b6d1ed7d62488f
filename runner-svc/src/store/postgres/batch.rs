//! The batch threads: each batched commit (durable writes, claims) is a thread with a
//! connection of its own that takes whatever bodies are queued, runs them as one transaction
//! (again on a conflict, or once on a new connection after a lost one) and answers each body.

use std::{
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    time::Duration,
};

use arbor_shared::postgres::{Database, DbError, Dedicated};

use super::{
    Counts, Keys,
    schema::{ASYNC_BEGIN, STRIPES, TO_SERIALIZABLE, WRITER_BEGIN, WRITER_BEGIN_SERIALIZABLE},
    tx::PgTx,
    wake::Origin,
};
use crate::store::{Abort, Body, Failed, InOrder, Reads, StoreError, T, Value};

/// Bodies one batched transaction takes at most.
pub(super) const MAX_BATCH: usize = 128;

/// Tries of a transaction that keeps conflicting before it fails.
pub(super) const MAX_TRIES: u32 = 200;

/// A body and where its outcome goes, queued for the committer thread.
pub(super) struct Queued {
    /// Rows the body reads, fetched with the batch's first read.
    pub(super) reads: Reads,
    /// Whether the body needs its batch to run at `SERIALIZABLE` ([`Commit::Serializable`]).
    pub(super) serializable: bool,
    pub(super) body: Box<Body<'static>>,
    pub(super) in_order: Option<InOrder>,
    pub(super) done: tokio::sync::oneshot::Sender<Result<(), Failed>>,
}

pub(super) fn conflict_pause(attempt: u32) {
    let micros = 50u64 << attempt.min(10);
    std::thread::sleep(Duration::from_micros(fastrand::u64(0..=micros.min(20_000))));
}

/// The committer: takes whatever is queued, runs it as one transaction, answers each body.
/// One batched commit: a thread with a connection of its own, and how its transactions begin.
#[derive(Clone, Copy)]
pub(super) struct Lane {
    pub(super) thread: &'static str,
    begin: &'static str,
    /// Whether it takes the writer lock and appends to the event log (and so reads the hot
    /// keys with its first read, and moves counters' own rows).
    writer: bool,
}

impl Lane {
    /// Durable writes: each batch waits for its WAL flush, one replica's batch at a time.
    pub(super) const DURABLE: Lane = Lane {
        thread: "arbor-pg-commit",
        begin: WRITER_BEGIN,
        writer: true,
    };
    /// Claims: each batch answers once committed, without the writer lock; the claim
    /// batches of several replicas run at once and pass over each other's queue entries.
    /// (`ASYNC_BEGIN` is `SERIALIZABLE`: a claim and an interrupt of its thread read what the
    /// other writes, and only predicate locks refuse the pair.)
    pub(super) const UNFLUSHED: Lane = Lane {
        thread: "arbor-pg-claim",
        begin: ASYNC_BEGIN,
        writer: false,
    };
}

pub(super) fn committer_loop(
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
pub(super) fn take_writer_lock(own: &mut Dedicated) -> Result<(), StoreError> {
    execute_own(own, WRITER_BEGIN)
}

/// Runs `sql` on the commit thread's own connection. A failure fails the batch, as a failed
/// first statement would; the connection is dropped, and the next batch makes a new one.
pub(super) fn execute_own(own: &mut Dedicated, sql: &str) -> Result<(), StoreError> {
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
pub(super) fn all_failed(bodies: usize, e: &StoreError) -> Vec<Result<(), Failed>> {
    vec![Err(Failed::Storage(e.clone())); bodies]
}

/// What a batch fetches with its first read: the hot keys, then the rows its bodies said they
/// read, each once. One statement for the batch instead of one round trip per body, most of
/// them while the batch holds the writer lock.
pub(super) fn reads_ahead<'r>(
    hot: &'r [(T, Value)],
    bodies: impl Iterator<Item = &'r Reads>,
) -> Keys {
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
pub(super) enum Conn<'a> {
    /// A pooled one, waited on from the calling thread.
    Pool(&'a Database),
    /// The calling thread's own.
    Own(&'a mut Dedicated),
}

/// How a transaction begins, and what it does on the side.
#[derive(Clone, Copy)]
pub(super) struct Setup<'a> {
    pub(super) begin: &'static str,
    /// Rows fetched with its first read.
    pub(super) ahead: &'a [(T, Value)],
    /// Which row of each counter it moves (`None`: one picked at random, each attempt).
    pub(super) stripe: Option<u8>,
    /// This process, named in its notifications so that it can skip them.
    pub(super) origin: &'a Origin,
    /// Where a conflict that runs the transaction again is counted.
    pub(super) conflicts: &'a AtomicU64,
    /// Whether the transaction was begun already, on the connection it runs on (its first
    /// try's only: a retry begins anew).
    pub(super) begun: bool,
}

/// Runs `bodies` in one transaction (again on a conflict); a body that aborts leaves nothing
/// behind and does not stop the others. A storage failure fails them all. A transaction left
/// on any early return is rolled back when its `PgTx` drops.
pub(super) fn run_bodies(
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
pub(super) struct Unsent {
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
