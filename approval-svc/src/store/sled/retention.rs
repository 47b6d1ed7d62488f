//! Retention in the store: deletes final approvals (PRUNED, CANCELLED) that have not changed
//! since a cutoff, together with their audit entries, their index entries and their trace, so
//! the database holds the recent past and whatever is still in flight, not its whole history.
//!
//! Candidates are found by a scan outside the transaction (sled transactions cannot scan);
//! nothing can change a final approval or add to its audit trail any more, and the transaction
//! checks again that each one is still there, final and old before it deletes anything.

use sled::transaction::ConflictableTransactionError;

use super::{SledStore, codec, trace_key};
use crate::{
    error::Result,
    model::{Approval, AuditEntry},
    store::{ApprovalStore, Compacted},
};

/// Approvals deleted per transaction, so one pass never holds sled's write lock for long.
const BATCH: usize = 256;

/// Key in `meta` of the highest audit id retention has deleted: the integrity marker measures
/// progress by the last audit id, which must not go backwards when the newest entries go.
pub(super) const AUDIT_FLOOR_KEY: &[u8] = b"audit_floor";

/// Key in `meta` of the wall-clock time (ms) of the last successful cursor ack.
pub(super) const CURSOR_AT_KEY: &[u8] = b"subscriber_cursor_at";

/// An approval to delete, with the audit keys found for it.
struct Doomed {
    id: String,
    audit_keys: Vec<Vec<u8>>,
}

fn deletable(a: &Approval, cutoff_ms: u64) -> bool {
    a.state.is_final() && a.updated_at_ms <= cutoff_ms
}

impl SledStore {
    /// Deletes every final approval last changed at or before `cutoff_ms`, with its audit
    /// trail. Idempotent: a second pass with the same cutoff finds nothing.
    pub(super) async fn compact_before(&self, cutoff_ms: u64) -> Result<Compacted> {
        let mut total = Compacted::default();
        // Approvals are listed by creation time, and one changed before the cutoff was created
        // before it too; `after` skips the ones a previous batch kept.
        let end = codec::created_bound(cutoff_ms.saturating_add(1));
        let mut after: Option<Vec<u8>> = None;
        loop {
            let start = match after.take() {
                Some(k) => std::ops::Bound::Excluded(k),
                None => std::ops::Bound::Unbounded,
            };
            let mut batch = Vec::new();
            let mut last = None;
            for entry in self
                .trees
                .by_created
                .range((start, std::ops::Bound::Excluded(end.clone())))
            {
                let (key, _) = entry?;
                last = Some(key.to_vec());
                let Some(id) = codec::created_key_id(&key) else {
                    continue;
                };
                match self.get(&id)? {
                    Some(a) if deletable(&a, cutoff_ms) => batch.push(self.doomed(id)?),
                    _ => {}
                }
                if batch.len() == BATCH {
                    break;
                }
            }
            let full = batch.len() == BATCH;
            if !batch.is_empty() {
                total += self.delete(&batch, cutoff_ms)?;
                self.gc.flush().await?;
            }
            match (full, last) {
                (true, Some(k)) => after = Some(k),
                _ => return Ok(total),
            }
        }
    }

    fn doomed(&self, id: String) -> Result<Doomed> {
        let prefix = codec::owner_prefix(&id);
        let mut audit_keys = Vec::new();
        for entry in self.trees.audit_by_request.scan_prefix(&prefix) {
            let (key, _) = entry?;
            audit_keys.push(key[prefix.len()..].to_vec());
        }
        Ok(Doomed { id, audit_keys })
    }

    /// One transaction: each approval that is still final and old goes with its audit entries,
    /// its index entries and its trace; the audit floor keeps the highest id removed.
    fn delete(&self, batch: &[Doomed], cutoff_ms: u64) -> Result<Compacted> {
        self.commit_lazy(|tx| {
            let mut done = Compacted::default();
            let mut floor = match tx.meta.get(AUDIT_FLOOR_KEY)? {
                Some(v) => codec::read_id(&v),
                None => 0,
            };
            for d in batch {
                let Some(bytes) = tx.approvals.get(d.id.as_bytes())? else {
                    continue;
                };
                let a: Approval =
                    codec::decode(&bytes).map_err(ConflictableTransactionError::Abort)?;
                if !deletable(&a, cutoff_ms) {
                    continue;
                }
                let id = d.id.as_bytes();
                tx.approvals.remove(id)?;
                tx.by_created
                    .remove(codec::created_key(a.created_at_ms, a.arrival, &d.id))?;
                tx.by_run.remove(codec::owned_key(&a.request.run_id, id))?;
                tx.deadlines
                    .remove(codec::deadline_key(a.request.deadline_ms, &d.id))?;
                tx.outbox.remove(id)?;
                tx.meta.remove(trace_key(&d.id))?;
                for key in &d.audit_keys {
                    tx.audit_by_request.remove(codec::owned_key(&d.id, key))?;
                    let Some(bytes) = tx.audit.remove(key.as_slice())? else {
                        continue;
                    };
                    let entry: AuditEntry =
                        codec::decode(&bytes).map_err(ConflictableTransactionError::Abort)?;
                    tx.audit_by_run
                        .remove(codec::owned_key(&entry.run_id, key))?;
                    floor = floor.max(entry.id);
                    done.audit_entries += 1;
                }
                done.approvals += 1;
            }
            tx.meta.insert(AUDIT_FLOOR_KEY, &codec::id_key(floor))?;
            Ok(done)
        })
    }

    /// The highest audit id retention has deleted (0: none).
    pub(super) fn audit_floor(&self) -> Result<u64> {
        Ok(self
            .trees
            .meta
            .get(AUDIT_FLOOR_KEY)?
            .map(|v| codec::read_id(&v))
            .unwrap_or(0))
    }
}
