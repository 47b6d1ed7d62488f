//! Reads over the sled indexes: filtered, paginated approval listings in creation order and the
//! audit trail of a request or a run.

use std::ops::Bound;

use super::{SledStore, codec};
use crate::{
    error::Result,
    model::{Approval, AuditEntry, AuditQuery, Filter, Page},
    store::ApprovalStore,
};

/// The later of two lower bounds over the same key space.
fn later_start(a: Bound<Vec<u8>>, b: Option<Vec<u8>>) -> Bound<Vec<u8>> {
    match (a, b) {
        (a, None) => a,
        (Bound::Included(lo), Some(after)) if lo > after => Bound::Included(lo),
        (_, Some(after)) => Bound::Excluded(after),
    }
}

/// The lists' names in their page tokens, so one list's token is refused by the other.
const APPROVALS: &str = "approvals";
const AUDIT: &str = "audit";

impl SledStore {
    pub(super) fn list_approvals(
        &self,
        filter: &Filter,
        page_size: usize,
        page_token: Option<&str>,
        now_ms: u64,
    ) -> Result<Page<Approval>> {
        let after = page_token
            .map(|t| codec::parse_page_token(APPROVALS, t))
            .transpose()?;
        // The index is ordered by creation time, so the age bounds become a key range.
        let oldest = if filter.max_age_ms > 0 {
            now_ms.saturating_sub(filter.max_age_ms)
        } else {
            0
        };
        let start = later_start(Bound::Included(codec::created_bound(oldest)), after);
        let end = if filter.min_age_ms > 0 {
            let newest = now_ms.saturating_sub(filter.min_age_ms);
            Bound::Excluded(codec::created_bound(newest.saturating_add(1)))
        } else {
            Bound::Unbounded
        };
        let mut items = Vec::new();
        let mut last_key = Vec::new();
        for entry in self.trees.by_created.range((start, end)) {
            let (key, _) = entry?;
            let Some(id) = codec::created_key_id(&key) else {
                continue;
            };
            let Some(approval) = self.get(&id)? else {
                continue;
            };
            if !filter.matches(&approval, now_ms) {
                continue;
            }
            if items.len() == page_size {
                // One more match exists, so a next page does.
                return Ok(Page {
                    items,
                    next: Some(codec::page_token(APPROVALS, &last_key)),
                });
            }
            last_key = key.to_vec();
            items.push(approval);
        }
        Ok(Page { items, next: None })
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
            Some(t) => {
                Bound::Excluded(codec::owned_key(owner, &codec::parse_page_token(AUDIT, t)?))
            }
            None => Bound::Included(prefix.clone()),
        };
        let mut items = Vec::new();
        let mut last_id = Vec::new();
        for entry in index.range((start, Bound::Unbounded)) {
            let (key, _) = entry?;
            if !key.starts_with(&prefix) {
                break;
            }
            let id = &key[prefix.len()..];
            let Some(bytes) = self.trees.audit.get(id)? else {
                continue;
            };
            if items.len() == page_size {
                return Ok(Page {
                    items,
                    next: Some(codec::page_token(AUDIT, &last_id)),
                });
            }
            last_id = id.to_vec();
            items.push(codec::decode(&bytes)?);
        }
        Ok(Page { items, next: None })
    }
}
