//! The stored tree record, and the transaction helpers that read and write trees, runs (their
//! record is [`RunRecord`], kept with its table's keys), checkpoints and the inbox.

use serde::{Deserialize, Serialize};

pub use crate::store::tables::runs::RunRecord;
use crate::{
    counts::{self, Counted},
    engine::{Checkpoint, Decision},
    error::RunnerError,
    store::{
        T, Tx, TxResult, abort, codec,
        tables::{finished, runs},
    },
};

/// A registered tree version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeRecord {
    pub id: String,
    pub version: u32,
    /// Canonical JSON of the document.
    pub document: String,
    /// Hex SHA-1 of `document`.
    pub digest: String,
    pub node_count: u32,
    pub registered_at_ms: u64,
}

pub fn get_run(tx: &Tx<'_>, run_id: &str) -> TxResult<Option<RunRecord>, RunnerError> {
    match tx.tree(T::Runs).get(run_id.as_bytes())? {
        None => Ok(None),
        Some(b) => match codec::decode("run", &b) {
            Ok(r) => Ok(Some(r)),
            Err(e) => abort(e),
        },
    }
}

pub fn must_get_run(tx: &Tx<'_>, run_id: &str) -> TxResult<RunRecord, RunnerError> {
    get_run(tx, run_id)?.map_or_else(|| abort(RunnerError::RunNotFound(run_id.into())), Ok)
}

/// Writes a run record and moves the state counts with it: the run's status, and the active
/// suspensions of its checkpoint when the run starts or stops being unfinished.
pub fn put_run(tx: &Tx<'_>, run: &RunRecord) -> TxResult<(), RunnerError> {
    let old = get_run(tx, &run.run_id)?.map(|r| r.status);
    counts::moved(tx, old.map(Counted::Run), Some(Counted::Run(run.status)))?;
    let was_open = old.is_some_and(|s| !s.is_terminal());
    let is_open = !run.status.is_terminal();
    if was_open != is_open {
        let sign = if was_open { -1 } else { 1 };
        let active = stored_active(tx, &run.run_id)?;
        counts::suspensions_moved(tx, active.map(|n| sign * n))?;
    }
    tx.tree(T::Runs)
        .insert(run.run_id.as_bytes(), codec::encode(run))?;
    if run.status.is_terminal() {
        tx.tree(T::Finished).insert(
            finished::key(finished::RUN, run.updated_at_ms, &run.run_id),
            [],
        )?;
    }
    Ok(())
}

pub fn index_run(tx: &Tx<'_>, run: &RunRecord) -> TxResult<(), RunnerError> {
    tx.tree(T::ThreadRuns)
        .insert(runs::thread_run_key(&run.thread_id, &run.run_id), [])?;
    Ok(())
}

pub fn get_checkpoint(tx: &Tx<'_>, run_id: &str) -> TxResult<Option<Checkpoint>, RunnerError> {
    match tx.tree(T::Checkpoints).get(run_id.as_bytes())? {
        None => Ok(None),
        Some(b) => match Checkpoint::decode(&b) {
            Ok(ck) => Ok(Some(ck)),
            Err(e) => abort(codec::Corrupt {
                what: "checkpoint",
                message: e.to_string(),
            }),
        },
    }
}

/// Active suspensions of the run's stored checkpoint, by category. One that does not decode
/// counts none (as in `Tally::scan`), so a damaged checkpoint never blocks a status write.
fn stored_active(tx: &Tx<'_>, run_id: &str) -> TxResult<[i64; 3], RunnerError> {
    Ok(tx
        .tree(T::Checkpoints)
        .get(run_id.as_bytes())?
        .and_then(|b| Checkpoint::decode(&b).ok())
        .map(|ck| counts::active(&ck))
        .unwrap_or_default())
}

/// Writes `run`'s checkpoint; returns its size in bytes. While the run is unfinished, the active
/// suspension counts move from `replaced` (`counts::active` of the checkpoint this one replaces,
/// which the caller loaded under the claim this transaction's fence keeps current; zeros for a
/// new run) to this one.
pub fn put_checkpoint(
    tx: &Tx<'_>,
    run: &RunRecord,
    ck: &Checkpoint,
    replaced: [i64; 3],
) -> TxResult<u64, RunnerError> {
    if !run.status.is_terminal() {
        let after = counts::active(ck);
        counts::suspensions_moved(tx, std::array::from_fn(|i| after[i] - replaced[i]))?;
    }
    let bytes = ck.encode();
    let len = bytes.len() as u64;
    tx.tree(T::Checkpoints)
        .insert(run.run_id.as_bytes(), bytes)?;
    Ok(len)
}

pub fn inbox_get(
    tx: &Tx<'_>,
    run_id: &str,
    request_id: &str,
) -> TxResult<Option<Decision>, RunnerError> {
    match tx.tree(T::Inbox).get(runs::inbox_key(run_id, request_id))? {
        None => Ok(None),
        Some(b) => match codec::decode("decision", &b) {
            Ok(d) => Ok(Some(d)),
            Err(e) => abort(e),
        },
    }
}

pub fn inbox_put(tx: &Tx<'_>, run_id: &str, d: &Decision) -> TxResult<(), RunnerError> {
    tx.tree(T::Inbox)
        .insert(runs::inbox_key(run_id, &d.request_id), codec::encode(d))?;
    Ok(())
}

pub fn inbox_remove(tx: &Tx<'_>, run_id: &str, request_id: &str) -> TxResult<(), RunnerError> {
    tx.tree(T::Inbox)
        .remove(runs::inbox_key(run_id, request_id))?;
    Ok(())
}
