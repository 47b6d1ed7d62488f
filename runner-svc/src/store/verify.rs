//! The tables' cross-references, checked through the seam on every backend: every index entry
//! names a record that exists, every run has its checkpoint, and the event log is gap-free
//! between its first retained seq and the last one assigned.
//!
//! The check runs while the runner serves. Events past the last seq read at the start are
//! newer than the check and are left alone; an entry whose referrer is gone by the time its
//! reference is found missing was deleted meanwhile (retention, maybe another replica's), not
//! lost.

use super::{Backend, FIRST_SEQ, NEXT_SEQ, StoreError, T, Value, codec};

/// Keys looked up per read (one round trip on a backend whose reads are round trips).
const CHUNK: usize = 256;

/// Checks every cross-reference; `at` is told the name of each table as the check reaches it
/// (a backend that can fail inside a read reports where). `Err` says what is damaged; a read
/// that fails is `Ok(Err(_))`'s outer error.
pub(super) fn references(
    backend: &dyn Backend,
    at: &dyn Fn(&str),
) -> Result<Result<(), String>, StoreError> {
    at("runs");
    let found = missing(backend, T::Runs, T::Checkpoints, |run_id| {
        Some(run_id.to_vec())
    })?;
    if let Some((run_id, _)) = found {
        return Ok(Err(format!(
            "run '{}' has lost its checkpoint",
            String::from_utf8_lossy(&run_id)
        )));
    }
    at("thread_runs");
    let found = missing(backend, T::ThreadRuns, T::Runs, |key| {
        codec::split_pair(key).map(|(_, run_id)| run_id.to_vec())
    })?;
    if let Some((_, run_id)) = found {
        return Ok(Err(format!(
            "thread index names run '{}', which is gone",
            String::from_utf8_lossy(&run_id)
        )));
    }
    at("events");
    if let Err(damage) = events(backend)? {
        return Ok(Err(damage));
    }
    at("queue");
    let found = missing(backend, T::Queue, T::Jobs, |key| {
        crate::store::tables::jobs::job_id_of_queue_key(key).map(|id| id.as_bytes().to_vec())
    })?;
    if let Some((_, job_id)) = found {
        return Ok(Err(format!(
            "queue names job '{}', which is gone",
            String::from_utf8_lossy(&job_id)
        )));
    }
    Ok(Ok(()))
}

/// The first entry of `from` (its key, and the key it names in `to`) whose record in `to` is
/// missing while the entry itself still exists. `names` reads the key an entry names.
fn missing(
    backend: &dyn Backend,
    from: T,
    to: T,
    names: impl Fn(&[u8]) -> Option<Value>,
) -> Result<Option<(Value, Value)>, StoreError> {
    let mut entries = backend.scan_wanting(from, &[], &[], usize::MAX).keys();
    loop {
        let mut chunk = Vec::with_capacity(CHUNK);
        for key in entries.by_ref().take(CHUNK) {
            let key = key?;
            let named = names(&key).unwrap_or_default();
            chunk.push((key, named));
        }
        if chunk.is_empty() {
            return Ok(None);
        }
        let keys: Vec<(T, &[u8])> = chunk.iter().map(|(_, n)| (to, n.as_slice())).collect();
        let records = backend.get_many(&keys)?;
        for ((key, named), record) in chunk.into_iter().zip(records) {
            if record.is_none() && backend.get(from, &key)?.is_some() {
                return Ok(Some((key, named)));
            }
        }
    }
}

/// The event log is gap-free between its first retained seq and the last one assigned
/// (appends and retention each move the bounds in the same transaction as the events), so a
/// missing or extra seq means part of the log was lost.
fn events(backend: &dyn Backend) -> Result<Result<(), String>, StoreError> {
    let first_seq = || -> Result<u64, StoreError> {
        Ok(backend
            .get(T::Meta, FIRST_SEQ)?
            .map_or(1, |b| codec::read_u64(&b)))
    };
    let first = first_seq()?;
    let last = backend
        .get(T::Meta, NEXT_SEQ)?
        .map_or(0, |b| codec::read_u64(&b).saturating_sub(1));
    let mut expected = first;
    let log = backend.scan_wanting(T::Events, &[], &[], usize::MAX);
    for key in log.keys() {
        let seq = codec::read_u64(&key?);
        if seq > last {
            break;
        }
        // Retention removed what this check had not reached yet: the log starts later now.
        if seq != expected && first_seq()? > expected {
            expected = seq;
        }
        if seq != expected {
            return Ok(Err(format!(
                "the event log has lost events: seq {expected} is missing (next found: {seq})"
            )));
        }
        expected += 1;
    }
    if last >= first && expected != last + 1 && first_seq()? <= expected {
        return Ok(Err(format!(
            "the event log has lost events: it ends at seq {}, but seq {last} was assigned",
            expected - 1
        )));
    }
    Ok(Ok(()))
}
