//! One state change as one SQL transaction: the approval's row is read `FOR UPDATE`, so two
//! transactions on the same approval (on any replica) take turns and the second sees what the
//! first committed; the record, its indexed columns and its audit entry are written by the
//! same transaction; `arbor_approvals` is notified right after the commit.

use std::{cell::RefCell, future::Future};

use arbor_shared::postgres::{DbError, LazyBegin, Object, Prepared, tokio_postgres, wait};

use super::{CHANNEL, clamp, decode, encode};
use crate::{
    error::Error,
    model::{Approval, AuditEntry},
    store::rules::Records,
};

/// How a transaction body fails: a business outcome, or the database.
#[derive(Debug)]
pub enum Fail {
    Rule(Error),
    Db(DbError),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Self::Rule(e)
    }
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Db(e.into())
    }
}

/// Payloads longer than this are sent empty ("look at everything"): PostgreSQL refuses
/// notifications of 8000 bytes or more.
const MAX_PAYLOAD: usize = 4000;

pub struct PgTx<'c> {
    client: &'c Object,
    now: u64,
    /// The notification payloads of the approvals changed, sent at commit.
    changed: RefCell<Vec<String>>,
    instance: &'c str,
    begin: LazyBegin,
}

impl<'c> PgTx<'c> {
    pub fn begin(client: &'c Object, instance: &'c str) -> Self {
        Self {
            client,
            now: arbor_shared::time::now_ms(),
            changed: RefCell::default(),
            instance,
            begin: LazyBegin::new("BEGIN"),
        }
    }

    /// Waits for `statement`, with `BEGIN` ahead of it in the same round trip when it is the
    /// transaction's first.
    fn run<R>(
        &self,
        statement: impl Future<Output = Result<R, tokio_postgres::Error>>,
    ) -> Result<R, tokio_postgres::Error> {
        wait(async {
            let (begun, answer) = futures_util::join!(self.begin.before(self.client), statement);
            begun?;
            answer
        })
    }

    /// Commits, then notifies the other replicas of every approval changed; answers once the
    /// commit is durable (`synchronous_commit`, on by default). The notification goes out
    /// right behind the COMMIT, in the same round trip, as a transaction of its own: a
    /// transaction that notifies holds PostgreSQL's one notification lock from its commit to
    /// its WAL flush, which would queue every notifying commit behind the one flushing. The
    /// server runs the notification after the commit unless it stops in between, and then every
    /// listener's connection drops and its replica looks at everything again.
    pub fn commit(&self) -> Result<(), DbError> {
        if !self.begin.end() {
            return Ok(());
        }
        let payloads = std::mem::take(&mut *self.changed.borrow_mut());
        let client = self.client;
        let (committed, notified) = wait(async {
            let commit = client.batch_execute("COMMIT");
            let notify = async {
                if !payloads.is_empty() {
                    client
                        .prepared_execute(
                            "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
                            &[&CHANNEL, &payloads],
                        )
                        .await?;
                }
                Ok::<_, tokio_postgres::Error>(())
            };
            futures_util::join!(commit, notify)
        });
        committed?;
        if let Err(e) = notified {
            tracing::debug!("approval change not notified: {e}");
        }
        Ok(())
    }

    pub fn rollback(&self) {
        if self.begin.end() {
            let _ = wait(self.client.batch_execute("ROLLBACK"));
        }
    }

    /// Locks the rows of `run_id`'s approvals that may still be cancelled, in id order (so two
    /// transactions never wait for each other in a circle), and returns their ids.
    pub fn cancellable_of_run(&self, run_id: &str) -> Result<Vec<String>, Fail> {
        let rows = self.run(self.client.prepared_query(
            "SELECT request_id FROM approval_records
             WHERE run_id = $1 AND state IN ('PENDING', 'RESOLVED', 'EXPIRED')
             ORDER BY request_id FOR UPDATE",
            &[&run_id],
        ))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    fn changed(&self, request_id: &str) {
        let payload = if request_id.len() > MAX_PAYLOAD {
            format!("{} ", self.instance)
        } else {
            format!("{} {request_id}", self.instance)
        };
        let mut changed = self.changed.borrow_mut();
        if !changed.contains(&payload) {
            changed.push(payload);
        }
    }
}

impl Records for PgTx<'_> {
    type Fail = Fail;

    fn now(&self) -> u64 {
        self.now
    }

    fn find(&self, request_id: &str) -> Result<Option<Approval>, Fail> {
        let row = self.run(self.client.prepared_query_opt(
            "SELECT record::text FROM approval_records WHERE request_id = $1 FOR UPDATE",
            &[&request_id],
        ))?;
        match row {
            Some(r) => Ok(Some(decode(r.get(0))?)),
            None => Ok(None),
        }
    }

    fn next_arrival(&self) -> Result<u64, Fail> {
        let row = self.run(
            self.client
                .prepared_query_one("SELECT nextval('approval_arrivals')", &[]),
        )?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    fn save(&self, old: Option<&Approval>, new: &Approval) -> Result<(), Fail> {
        let record = encode(new)?;
        let (state, updated, outbox) = (
            new.state.as_str(),
            clamp(new.updated_at_ms),
            new.needs_delivery(),
        );
        if old.is_none() {
            self.run(self.client.prepared_execute(
                "INSERT INTO approval_records (request_id, run_id, state, created_at_ms, \
                 arrival, updated_at_ms, deadline_ms, awaiting_delivery, record) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::jsonb)",
                &[
                    &new.id(),
                    &new.request.run_id,
                    &state,
                    &clamp(new.created_at_ms),
                    &clamp(new.arrival),
                    &updated,
                    &clamp(new.request.deadline_ms),
                    &outbox,
                    &record,
                ],
            ))?;
        } else {
            self.run(self.client.prepared_execute(
                "UPDATE approval_records SET state = $2, updated_at_ms = $3, \
                 awaiting_delivery = $4, record = $5::text::jsonb WHERE request_id = $1",
                &[&new.id(), &state, &updated, &outbox, &record],
            ))?;
        }
        self.changed(new.id());
        Ok(())
    }

    fn audit(&self, mut entry: AuditEntry) -> Result<AuditEntry, Fail> {
        entry.time_ms = self.now;
        let json = encode(&entry)?;
        let action = format!("{:?}", entry.action).to_uppercase();
        // One round trip: the id comes from the sequence and is written into the entry too.
        let row = self.run(self.client.prepared_query_one(
            "WITH n AS (SELECT nextval('approval_audit_ids') AS id)
             INSERT INTO approval_audit (id, request_id, run_id, time_ms, action, entry)
             SELECT n.id, $1, $2, $3, $4, jsonb_set($5::text::jsonb, '{id}', to_jsonb(n.id))
             FROM n RETURNING id",
            &[
                &entry.request_id,
                &entry.run_id,
                &clamp(entry.time_ms),
                &action,
                &json,
            ],
        ))?;
        entry.id = row.get::<_, i64>(0) as u64;
        Ok(entry)
    }
}
