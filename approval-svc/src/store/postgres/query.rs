//! Reads over the indexed columns: filtered, paginated approval listings in creation order and
//! the audit trail of a request or a run. The simple parts of a filter (states, run, age) are
//! pushed into SQL; the rest (thread, tree, tool glob) are checked on the rows that come back,
//! by the same `Filter::matches` the other backend uses.

use arbor_shared::postgres::{Prepared, tokio_postgres::types::ToSql, wait};

use super::{PgStore, clamp, decode};
use crate::{
    error::{Error, Result},
    model::{Approval, AuditEntry, AuditQuery, Filter, Page},
};

/// The lists' names in their page tokens, so one list's token is refused by the other.
const APPROVALS: &str = "approvals";
const AUDIT: &str = "audit";

/// Rows fetched per round trip when the filter's Rust-side part drops some.
const MIN_CHUNK: usize = 64;

fn approvals_token(created: i64, arrival: i64) -> String {
    let mut key = created.to_be_bytes().to_vec();
    key.extend_from_slice(&arrival.to_be_bytes());
    arbor_shared::page::token(APPROVALS, &key)
}

fn parse_approvals_token(token: &str) -> Result<(i64, i64)> {
    let key = arbor_shared::page::key(APPROVALS, token).ok_or(Error::BadPageToken)?;
    let (created, arrival) = key.split_at_checked(8).ok_or(Error::BadPageToken)?;
    Ok((
        i64::from_be_bytes(created.try_into().map_err(|_| Error::BadPageToken)?),
        i64::from_be_bytes(arrival.try_into().map_err(|_| Error::BadPageToken)?),
    ))
}

fn parse_audit_token(token: &str) -> Result<i64> {
    let key = arbor_shared::page::key(AUDIT, token).ok_or(Error::BadPageToken)?;
    Ok(i64::from_be_bytes(
        key.as_slice().try_into().map_err(|_| Error::BadPageToken)?,
    ))
}

impl PgStore {
    pub(super) fn list_approvals(
        &self,
        filter: &Filter,
        page_size: usize,
        page_token: Option<&str>,
        now_ms: u64,
    ) -> Result<Page<Approval>> {
        let (mut after_created, mut after_arrival) = match page_token {
            Some(t) => parse_approvals_token(t)?,
            None => (-1, -1),
        };
        let oldest = match filter.max_age_ms {
            0 => 0,
            age => clamp(now_ms.saturating_sub(age)),
        };
        let newest = match filter.min_age_ms {
            0 => i64::MAX,
            age => clamp(now_ms.saturating_sub(age)),
        };
        let states: Vec<&str> = filter.states.iter().map(|s| s.as_str()).collect();
        let chunk = (page_size + 1).max(MIN_CHUNK) as i64;
        let client = self.db.client_blocking()?;
        let mut items = Vec::new();
        let mut last = None;
        loop {
            let params: [&(dyn ToSql + Sync); 7] = [
                &after_created,
                &after_arrival,
                &oldest,
                &newest,
                &states,
                &filter.run_id,
                &chunk,
            ];
            // Sent as text: each page gets a plan for its own filter (a prepared statement's
            // generic plan could not use the run index for one run and not for another).
            let rows = wait(client.query(
                "SELECT record::text, created_at_ms, arrival FROM approval_records
                 WHERE (created_at_ms, arrival) > ($1, $2)
                   AND created_at_ms >= $3 AND created_at_ms <= $4
                   AND (cardinality($5::text[]) = 0 OR state = ANY($5::text[]))
                   AND ($6 = '' OR run_id = $6)
                 ORDER BY created_at_ms, arrival LIMIT $7",
                &params,
            ))
            .map_err(super::db_error)?;
            let exhausted = (rows.len() as i64) < chunk;
            for row in &rows {
                (after_created, after_arrival) = (row.get(1), row.get(2));
                let approval: Approval = decode(row.get(0))?;
                if !filter.matches(&approval, now_ms) {
                    continue;
                }
                if items.len() == page_size {
                    // One more match exists, so a next page does.
                    let next = last.map(|(c, a)| approvals_token(c, a));
                    return Ok(Page { items, next });
                }
                last = Some((after_created, after_arrival));
                items.push(approval);
            }
            if exhausted {
                return Ok(Page { items, next: None });
            }
        }
    }

    pub(super) fn list_audit(
        &self,
        query: &AuditQuery,
        page_size: usize,
        page_token: Option<&str>,
    ) -> Result<Page<AuditEntry>> {
        let after = page_token.map(parse_audit_token).transpose()?.unwrap_or(0);
        let limit = page_size as i64 + 1;
        let sql = match query {
            AuditQuery::Request(_) => {
                "SELECT entry FROM approval_audit WHERE request_id = $1 AND id > $2
                 ORDER BY id LIMIT $3"
            }
            AuditQuery::Run(_) => {
                "SELECT entry FROM approval_audit WHERE run_id = $1 AND id > $2
                 ORDER BY id LIMIT $3"
            }
        };
        let (AuditQuery::Request(owner) | AuditQuery::Run(owner)) = query;
        let client = self.db.client_blocking()?;
        let rows =
            wait(client.prepared_query(sql, &[owner, &after, &limit])).map_err(super::db_error)?;
        let mut items: Vec<AuditEntry> = rows
            .iter()
            .map(|r| decode(r.get(0)))
            .collect::<Result<_>>()?;
        let next = if items.len() > page_size {
            items.truncate(page_size);
            items
                .last()
                .map(|e| arbor_shared::page::token(AUDIT, &(e.id as i64).to_be_bytes()))
        } else {
            None
        };
        Ok(Page { items, next })
    }
}
