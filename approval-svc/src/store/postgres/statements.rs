//! The text of the statements that write a record and its audit entries, and how their
//! parameters line up: a record write and the one to three audit entries that follow it go out
//! as one statement (see `tx`).

use arbor_shared::postgres::tokio_postgres::types::ToSql;

use super::tx::Fail;
use crate::{error::Error, model::AuditEntry};

/// Numbers an audit entry of the run `$2` (the queries of a `WITH`), holding the run's audit lock
/// while it does: a transaction that numbers an entry of a run keeps that lock until it ends, so
/// the entries of one run commit in the order of their ids, and a reader paging a run's trail
/// by id (or a request's, which is part of one run) can never step past an entry that commits
/// later. The lock is a transaction-level advisory lock on the key pair (1635083380, "audt" in
/// ASCII; the hash of the run's id): two runs whose ids share a hash take turns, which costs
/// only waiting. Two-key advisory locks never conflict with the one-key ones of leadership and
/// migrations.
pub(super) const AUDIT_ID: &str = "l AS (SELECT pg_advisory_xact_lock(1635083380, hashtext($2))), \
     n AS (SELECT nextval('approval_audit_ids') AS id FROM l)";
/// Writes the audit entry `$1`..`$5` numbered by `n`, answering its id: `$5` is the entry's
/// JSON after its `id` (see `AUDIT_ID_FIELD`), which the statement puts back with the number.
pub(super) const AUDIT_INSERT: &str = "INSERT INTO approval_audit (id, request_id, run_id, time_ms, action, \
     entry) SELECT n.id, $1, $2, $3, $4, '{\"id\":' || n.id || $5::text FROM n RETURNING id";
/// How an audit entry's JSON begins before the store numbers it: `id` is its first field. The
/// statements that write one are given the rest and write the number in front of it.
pub(super) const AUDIT_ID_FIELD: &str = "{\"id\":0";
/// [`AUDIT_ID`] for `n` entries of the request `$1` of the run `$2`: `n` holds their ids with
/// their rank `i`, ascending (the order the ids were taken in is not the order of the rows
/// that took them, so they are ranked by value). Its shape is fixed for each count, with no
/// array, so that PostgreSQL settles on a generic plan instead of planning it at every call.
fn audits_id(n: usize) -> String {
    format!(
        "l AS (SELECT pg_advisory_xact_lock(1635083380, hashtext($2))), \
         ids AS (SELECT nextval('approval_audit_ids') AS id FROM l, generate_series(1, {n})), \
         n AS (SELECT id, row_number() OVER (ORDER BY id) AS i FROM ids)"
    )
}

/// Writes `n` audit entries (time `$3`; actions `$4`, `$6`, … and entries `$5`, `$7`, …, in
/// order) numbered by `n`, the first with the lowest id.
fn audits_insert(n: usize) -> String {
    let values: Vec<String> = (1..=n)
        .map(|i| format!("({i}, ${}::text, ${}::text)", 2 + 2 * i, 3 + 2 * i))
        .collect();
    format!(
        "INSERT INTO approval_audit (id, request_id, run_id, time_ms, action, entry) \
         SELECT n.id, $1, $2, $3, e.action, '{{\"id\":' || n.id || e.entry \
         FROM n JOIN (VALUES {}) AS e(i, action, entry) ON e.i = n.i",
        values.join(", ")
    )
}

/// The audit entry `$1`..`$5` alone, or two or three of one request (`$1`..`$7`, `$1`..`$9`).
#[derive(Clone, Copy)]
pub(super) enum Audits {
    One = 1,
    Two = 2,
    Three = 3,
}

impl Audits {
    pub(super) fn of(count: usize) -> Option<Self> {
        match count {
            1 => Some(Self::One),
            2 => Some(Self::Two),
            3 => Some(Self::Three),
            _ => None,
        }
    }

    pub(super) fn sql(self) -> (&'static str, &'static str) {
        static MANY: [std::sync::OnceLock<(String, String)>; 2] =
            [const { std::sync::OnceLock::new() }; 2];
        let n = self as usize;
        match self {
            Self::One => (AUDIT_ID, AUDIT_INSERT),
            Self::Two | Self::Three => {
                let (id, insert) = MANY[n - 2].get_or_init(|| (audits_id(n), audits_insert(n)));
                (id, insert)
            }
        }
    }

    /// How many parameters the audit part takes, ahead of the record write's: the request,
    /// the run and the time, then each entry's action and entry.
    pub(super) fn params(self) -> usize {
        3 + 2 * self as usize
    }
}

/// A record write: the row, with the columns the service looks it up by.
pub(super) struct Save {
    pub(super) insert: bool,
    pub(super) request_id: String,
    pub(super) run_id: String,
    pub(super) state: String,
    pub(super) created: i64,
    pub(super) arrival: i64,
    pub(super) updated: i64,
    pub(super) deadline: i64,
    pub(super) outbox: bool,
    pub(super) record: String,
}

impl Save {
    pub(super) const INSERT: &'static str = "INSERT INTO approval_records (request_id, run_id, state, \
         created_at_ms, arrival, updated_at_ms, deadline_ms, awaiting_delivery, record) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text)";
    /// The deadline too: a governed approval's moves with its stages while it stays PENDING.
    pub(super) const UPDATE: &'static str = "UPDATE approval_records SET state = $2, updated_at_ms = $3, \
         awaiting_delivery = $4, record = $5::text, deadline_ms = $6 WHERE request_id = $1";

    /// Its statement alone.
    pub(super) fn alone(&self) -> &'static str {
        match self.insert {
            true => Self::INSERT,
            false => Self::UPDATE,
        }
    }

    /// Its parameters, in the order of its statement.
    pub(super) fn params(self) -> Vec<Param> {
        match self.insert {
            true => vec![
                Box::new(self.request_id),
                Box::new(self.run_id),
                Box::new(self.state),
                Box::new(self.created),
                Box::new(self.arrival),
                Box::new(self.updated),
                Box::new(self.deadline),
                Box::new(self.outbox),
                Box::new(self.record),
            ],
            false => vec![
                Box::new(self.request_id),
                Box::new(self.state),
                Box::new(self.updated),
                Box::new(self.outbox),
                Box::new(self.record),
                Box::new(self.deadline),
            ],
        }
    }

    /// Its statement with the audit entries `audits` in one: the audit's parameters come
    /// first, its own follow.
    pub(super) fn with(&self, audits: Audits) -> &'static str {
        static SQL: [std::sync::OnceLock<String>; 6] = [const { std::sync::OnceLock::new() }; 6];
        let cell = usize::from(!self.insert) + 2 * (audits as usize - 1);
        SQL[cell].get_or_init(|| {
            let (numbering, insert) = audits.sql();
            format!(
                "WITH s AS ({}), {numbering} {insert}",
                shift(self.alone(), audits.params())
            )
        })
    }
}

/// `sql` with its parameters `$1`..`$9` (one digit each) renumbered `$1+by`..`$9+by`.
fn shift(sql: &str, by: usize) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '$'
            && let Some(d) = chars.peek().and_then(|d| d.to_digit(10))
        {
            chars.next();
            out.push_str(&(d as usize + by).to_string());
        }
    }
    out
}

/// An unnumbered audit entry's JSON after its `id` field (see [`AUDIT_ID_FIELD`]).
pub(super) fn after_id(json: String) -> Result<String, Fail> {
    match json.strip_prefix(AUDIT_ID_FIELD) {
        Some(rest) => Ok(rest.to_string()),
        None => Err(Error::Storage(format!("an audit entry begins otherwise: {json}")).into()),
    }
}

/// A statement's parameter, owned by the statement until it is sent.
pub(super) type Param = Box<dyn ToSql + Sync + Send>;

/// How an audit entry names its action in its row.
pub(super) fn action_of(entry: &AuditEntry) -> String {
    format!("{:?}", entry.action).to_uppercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_renumbered_past_the_audit_entrys() {
        assert_eq!(
            shift("UPDATE t SET a = $2, b = $5::text WHERE id = $1", 5),
            "UPDATE t SET a = $7, b = $10::text WHERE id = $6"
        );
        assert_eq!(shift("costs $ 5 and $$", 5), "costs $ 5 and $$");
    }
}
