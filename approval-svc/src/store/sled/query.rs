//! Reads over the sled indexes: filtered, paginated approval listings in creation order, counts
//! by state, and the audit trail of a request or a run.

use std::ops::Bound;

use super::{SledStore, codec};
use crate::{
    error::Result,
    lifecycle::ApprovalState,
    model::{Approval, AuditEntry, AuditQuery, Filter, Page},
    store::{APPROVALS, AUDIT, ApprovalStore, page_key, page_of},
};

/// The later of two lower bounds over the same key space.
fn later_start(a: Bound<Vec<u8>>, b: Option<Vec<u8>>) -> Bound<Vec<u8>> {
    match (a, b) {
        (a, None) => a,
        (Bound::Included(lo), Some(after)) if lo > after => Bound::Included(lo),
        (_, Some(after)) => Bound::Excluded(after),
    }
}

impl SledStore {
    pub(super) fn list_approvals(
        &self,
        filter: &Filter,
        page_size: usize,
        page_token: Option<&str>,
        now_ms: u64,
    ) -> Result<Page<Approval>> {
        let after = page_token.map(|t| page_key(APPROVALS, t)).transpose()?;
        // The index is ordered by creation time, so the age bounds become a key range.
        let oldest = now_ms.saturating_sub(filter.max_age_ms);
        let oldest = if filter.max_age_ms > 0 { oldest } else { 0 };
        let start = later_start(Bound::Included(codec::created_bound(oldest)), after);
        let end = match filter.min_age_ms {
            0 => Bound::Unbounded,
            age => Bound::Excluded(codec::created_bound(
                now_ms.saturating_sub(age).saturating_add(1),
            )),
        };
        let found = self.trees.by_created.range((start, end)).map(|entry| {
            let (key, _) = entry?;
            let Some(id) = codec::created_key_id(&key) else {
                return Ok(None);
            };
            let approval = self.get(&id)?.filter(|a| filter.matches(a, now_ms));
            Ok(approval.map(|a| (key.to_vec(), a)))
        });
        page_of(found.filter_map(Result::transpose), page_size, APPROVALS)
    }

    /// `count`: by state alone from the pending count kept with every write, the deadline index
    /// (overdue) and the number of records (all, or all decided); anything else by listing.
    pub(super) fn count_approvals(
        &self,
        filter: &Filter,
        limit: usize,
        now_ms: u64,
    ) -> Result<usize> {
        use ApprovalState as St;
        const DECIDED: [St; 5] = [
            St::Resolved,
            St::Expired,
            St::Acked,
            St::Pruned,
            St::Cancelled,
        ];
        let states = &filter.states;
        let pending = || -> Result<usize> { Ok(self.pending_count()? as usize) };
        let n = match filter.by_state_alone() {
            false => None,
            true if filter.overdue => match states.is_empty() || states.contains(&St::Pending) {
                // Only PENDING approvals with a deadline are in the deadline index.
                true => Some(
                    self.trees
                        .deadlines
                        .range(..codec::deadline_key(now_ms.saturating_add(1), ""))
                        .take(limit)
                        .count(),
                ),
                false => Some(0),
            },
            true if states.is_empty() => Some(self.trees.approvals.len()),
            true if states.as_slice() == [St::Pending] => Some(pending()?),
            true if !states.contains(&St::Pending)
                && DECIDED.iter().all(|s| states.contains(s)) =>
            {
                Some(self.trees.approvals.len().saturating_sub(pending()?))
            }
            true => None,
        };
        match n {
            Some(n) => Ok(n.min(limit)),
            None => Ok(self
                .list_approvals(filter, limit, None, now_ms)?
                .items
                .len()),
        }
    }

    pub(super) fn list_audit(
        &self,
        query: &AuditQuery,
        page_size: usize,
        page_token: Option<&str>,
    ) -> Result<Page<AuditEntry>> {
        let (index, owner) = match query {
            AuditQuery::Request(id) => (&self.trees.audit_by_request, id),
            AuditQuery::Run(id) => (&self.trees.audit_by_run, id),
        };
        let prefix = codec::owner_prefix(owner);
        let start = match page_token {
            Some(t) => Bound::Excluded(codec::owned_key(owner, &page_key(AUDIT, t)?)),
            None => Bound::Included(prefix.clone()),
        };
        let found = (index.range((start, Bound::Unbounded)))
            .take_while(|e| e.as_ref().map_or(true, |(k, _)| k.starts_with(&prefix)))
            .map(|entry| {
                let id = entry?.0[prefix.len()..].to_vec();
                let entry = self.trees.audit.get(&id)?.map(|b| codec::decode(&b));
                entry.transpose().map(|e| e.map(|e| (id, e)))
            });
        page_of(found.filter_map(Result::transpose), page_size, AUDIT)
    }
}
