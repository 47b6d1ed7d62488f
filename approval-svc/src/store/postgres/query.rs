//! Reads over the indexed columns: filtered, paginated approval listings in creation order and
//! the audit trail of a request or a run. The simple parts of a filter (states, run, age) are
//! pushed into SQL; the rest (thread, tree, tool glob) are checked on the rows that come back,
//! by the same `Filter::matches` the other backend uses.

use arbor_shared::postgres::tokio_postgres::types::ToSql;

use super::{PgStore, clamp, decode};
use crate::{
    error::{Error, Result},
    model::{Approval, AuditEntry, AuditQuery, Filter, Page},
    store::{APPROVALS, AUDIT, page_key, page_of},
};

/// Rows fetched per round trip when the filter's Rust-side part drops some.
const MIN_CHUNK: usize = 64;

/// The big-endian numbers a page key of `list` is made of.
fn token_numbers<const N: usize>(list: &str, token: &str) -> Result<[i64; N]> {
    let key = page_key(list, token)?;
    let (chunks, []) = key.as_chunks::<8>() else {
        return Err(Error::BadPageToken);
    };
    let numbers: Vec<i64> = chunks.iter().map(|c| i64::from_be_bytes(*c)).collect();
    numbers.try_into().map_err(|_| Error::BadPageToken)
}

impl PgStore {
    /// `count`: a filter by state alone is counted in SQL over the state and deadline indexes
    /// (no record is decoded); anything else by listing.
    pub(super) fn count_approvals(
        &self,
        filter: &Filter,
        limit: usize,
        now_ms: u64,
    ) -> Result<usize> {
        if !filter.by_state_alone() {
            return Ok(self
                .list_approvals(filter, limit, None, now_ms)?
                .items
                .len());
        }
        let states: Vec<&str> = filter.states.iter().map(|s| s.as_str()).collect();
        let params: [&(dyn ToSql + Sync); 4] = [
            &states,
            &filter.overdue,
            &clamp(now_ms),
            &i64::try_from(limit).unwrap_or(i64::MAX),
        ];
        let rows = self.rows(
            "SELECT count(*) FROM (SELECT 1 FROM approval_records
               WHERE (cardinality($1::text[]) = 0 OR state = ANY($1::text[]))
                 AND (NOT $2 OR (state = 'PENDING' AND deadline_ms > 0 AND deadline_ms <= $3))
               LIMIT $4) AS matched",
            &params,
        )?;
        Ok(rows
            .first()
            .map_or(0, |r| r.get::<_, i64>(0).max(0) as usize))
    }

    pub(super) fn list_approvals(
        &self,
        filter: &Filter,
        page_size: usize,
        page_token: Option<&str>,
        now_ms: u64,
    ) -> Result<Page<Approval>> {
        let [mut after_created, mut after_arrival] = match page_token {
            Some(t) => token_numbers(APPROVALS, t)?,
            None => [-1, -1],
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
        // Chunk by chunk, as far as the page is read.
        let (mut rows, mut exhausted) = (Vec::new().into_iter(), false);
        let found = std::iter::from_fn(|| {
            loop {
                if let Some(row) = rows.next() {
                    return Some(Ok(row));
                }
                if exhausted {
                    return None;
                }
                let params: [&(dyn ToSql + Sync); 7] = [
                    &after_created,
                    &after_arrival,
                    &oldest,
                    &newest,
                    &states,
                    &filter.run_id,
                    &chunk,
                ];
                // Sent as text: each page gets a plan for its own filter (a prepared
                // statement's generic plan could not use the run index for one run and not
                // for another).
                let chunk_rows = match arbor_shared::postgres::wait(client.query(
                    "SELECT record::text, created_at_ms, arrival FROM approval_records
                     WHERE (created_at_ms, arrival) > ($1, $2)
                       AND created_at_ms >= $3 AND created_at_ms <= $4
                       AND (cardinality($5::text[]) = 0 OR state = ANY($5::text[]))
                       AND ($6 = '' OR run_id = $6)
                     ORDER BY created_at_ms, arrival LIMIT $7",
                    &params,
                )) {
                    Ok(r) => r,
                    Err(e) => return Some(Err(super::db_error(e))),
                };
                exhausted = (chunk_rows.len() as i64) < chunk;
                if let Some(last) = chunk_rows.last() {
                    (after_created, after_arrival) = (last.get(1), last.get(2));
                }
                rows = chunk_rows.into_iter();
            }
        });
        let found = found.map(|row| {
            let row = row?;
            let approval: Approval = decode(row.get(0))?;
            let (created, arrival): (i64, i64) = (row.get(1), row.get(2));
            let key = [created.to_be_bytes(), arrival.to_be_bytes()].concat();
            Ok(filter.matches(&approval, now_ms).then_some((key, approval)))
        });
        page_of(found.filter_map(Result::transpose), page_size, APPROVALS)
    }

    pub(super) fn list_audit(
        &self,
        query: &AuditQuery,
        page_size: usize,
        page_token: Option<&str>,
    ) -> Result<Page<AuditEntry>> {
        let [after] = match page_token {
            Some(t) => token_numbers(AUDIT, t)?,
            None => [0],
        };
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
        let rows = self.rows(sql, &[owner, &after, &limit])?;
        let found = rows.iter().map(|r| {
            let entry: AuditEntry = decode(r.get(0))?;
            Ok(((entry.id as i64).to_be_bytes(), entry))
        });
        page_of(found, page_size, AUDIT)
    }
}
