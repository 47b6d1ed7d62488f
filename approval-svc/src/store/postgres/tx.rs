//! One state change as one SQL transaction: the approval's row is read `FOR UPDATE`, so two
//! transactions on the same approval (on any replica) take turns and the second sees what the
//! first committed; the record, its indexed columns and its audit entry are written by the
//! same transaction, in one statement when the audit entries follow the record's write (as the
//! rules write them); `arbor_approvals` is notified right after the commit.
//!
//! A write answers nothing the rules need, so it waits for the transaction's next statement
//! (a read) or its `COMMIT`, and goes out ahead of it in the same round trip: a transaction
//! that changes n approvals costs the round trips of its reads and one more, not one per
//! write. A write that fails aborts the transaction; the statements behind it then fail too
//! (a `COMMIT` only rolls back), and the write's own error is the one answered.

use std::{
    borrow::Cow,
    cell::RefCell,
    collections::{HashMap, VecDeque},
    future::Future,
    pin::Pin,
    task::Poll,
};

use arbor_shared::postgres::{
    DbError, LazyBegin, Object, Prepared,
    tokio_postgres::{self, types::ToSql},
    wait,
};

use super::{
    CANCELLABLE_OF_RUN, CHANNEL, clamp, decode, encode,
    statements::{Audits, Param, Save, action_of, after_id},
};
use crate::{
    error::Error,
    governance::seat::Delegation,
    model::{Approval, AuditEntry},
    store::{backend::Records, webhooks::Queued},
    webhooks::Routes,
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
    /// A record write not sent yet: the audit entry that follows it goes in the same
    /// statement. Any other statement keeps it in `deferred` first.
    unsent: RefCell<Option<Save>>,
    /// Writes not sent yet, in order: they go out ahead of the next statement or the `COMMIT`,
    /// in its round trip.
    deferred: RefCell<Vec<Deferred>>,
    /// The notification payloads of the approvals changed, sent at commit.
    changed: RefCell<Vec<String>>,
    /// Requests' `traceparent`s not written yet: they go with the next statement.
    traces: RefCell<Vec<(String, String)>>,
    instance: &'c str,
    /// Approvals locked and read ahead by [`lock_ahead`](Self::lock_ahead) (`None`: absent);
    /// `find` takes each from here once, and a write drops it.
    ahead: RefCell<HashMap<String, Option<Approval>>>,
    /// Arrival numbers taken ahead from the sequence, handed out in order.
    arrivals: RefCell<VecDeque<u64>>,
    begin: LazyBegin,
    /// Which webhook endpoints want which events.
    routes: &'c Routes,
}

impl<'c> PgTx<'c> {
    /// A transaction whose times are `now` (the database's clock, as the store reads it).
    pub fn begin(client: &'c Object, instance: &'c str, now: u64, routes: &'c Routes) -> Self {
        Self {
            client,
            now,
            changed: RefCell::default(),
            unsent: RefCell::default(),
            deferred: RefCell::default(),
            traces: RefCell::default(),
            instance,
            ahead: RefCell::default(),
            arrivals: RefCell::default(),
            begin: LazyBegin::new("BEGIN"),
            routes,
        }
    }

    /// Waits for `statement`, with `BEGIN` ahead of it in the same round trip when it is the
    /// transaction's first, and the writes kept until then (the traces first, then `deferred`
    /// and `unsent`) sent in that round trip too, ahead of it. The first error in that order
    /// is answered.
    fn run<R>(
        &self,
        statement: impl Future<Output = Result<R, tokio_postgres::Error>>,
    ) -> Result<R, tokio_postgres::Error> {
        self.defer_unsent();
        let traces = std::mem::take(&mut *self.traces.borrow_mut());
        if !traces.is_empty() {
            // One write for all of them, ahead of the others.
            let (ids, traceparents): (Vec<String>, Vec<String>) = traces.into_iter().unzip();
            let write = Deferred {
                sql: TRACES_UPSERT.into(),
                params: vec![Box::new(ids), Box::new(traceparents)],
            };
            self.deferred.borrow_mut().insert(0, write);
        }
        let deferred = std::mem::take(&mut *self.deferred.borrow_mut());
        wait(async {
            // Prepared first: a statement that still has to be parsed would go out after the
            // ones queued behind it.
            let mut prepared = Vec::with_capacity(deferred.len());
            for write in &deferred {
                prepared.push(self.client.prepare_cached(&write.sql).await?);
            }
            let writes = in_order(deferred.iter().zip(&prepared).map(|(write, statement)| {
                self.client.execute_raw(
                    statement,
                    write.params.iter().map(|p| &**p as &(dyn ToSql + Sync)),
                )
            }));
            let (begun, written, answer) =
                futures_util::join!(self.begin.before(self.client), writes, statement);
            begun?;
            written?;
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
        self.defer_unsent();
        let writes = !self.deferred.borrow().is_empty() || !self.traces.borrow().is_empty();
        if !writes && !self.begin.open() {
            return Ok(());
        }
        let payloads = std::mem::take(&mut *self.changed.borrow_mut());
        let client = self.client;
        // The notification is prepared before anything is sent, so that it goes out behind the
        // COMMIT (see `run`).
        let notify = match payloads.is_empty() {
            true => None,
            false => Some(wait(client.prepare_cached(
                "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
            ))?),
        };
        let sent = std::cell::Cell::new(false);
        // Answers the notification's outcome once the COMMIT is done.
        let committed = self.run(async {
            sent.set(true);
            let commit = client.batch_execute("COMMIT");
            let notify = async {
                if let Some(notify) = &notify {
                    client.execute(notify, &[&CHANNEL, &payloads]).await?;
                }
                Ok::<_, tokio_postgres::Error>(())
            };
            let (committed, notified) = futures_util::join!(commit, notify);
            committed.map(|()| notified)
        });
        // Once the COMMIT is sent, nothing is left to roll back (a transaction that a write
        // aborted is rolled back by it). Before, `rollback` sends a ROLLBACK.
        if sent.get() {
            self.begin.end();
        }
        if let Err(e) = committed? {
            tracing::debug!("approval change not notified: {e}");
        }
        Ok(())
    }

    pub fn rollback(&self) {
        self.deferred.borrow_mut().clear();
        self.unsent.borrow_mut().take();
        if self.begin.end() {
            let _ = wait(self.client.batch_execute("ROLLBACK"));
        }
    }

    /// Reads ahead the approvals `ids`, locked, for `lock_ahead` and `lock_ahead_traced`.
    fn read_ahead(
        &self,
        ids: &[&str],
        arrivals: bool,
        traced: bool,
    ) -> Result<HashMap<String, String>, Fail> {
        let (client, n) = (self.client, ids.len() as i64);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&ids];
        let (rows, numbers) = self.run(async {
            let rows = client.prepared_query(
                match traced {
                    true => LOCK_AHEAD_TRACED,
                    false => LOCK_AHEAD,
                },
                &params,
            );
            let numbers = async {
                match arrivals {
                    true => client.prepared_query(ARRIVALS_AHEAD, &[&n]).await,
                    false => Ok(Vec::new()),
                }
            };
            futures_util::try_join!(rows, numbers)
        })?;
        let mut ahead = self.ahead.borrow_mut();
        for id in ids {
            ahead.insert(id.to_string(), None);
        }
        let mut traces = HashMap::new();
        for row in rows {
            let id: String = row.get(0);
            if traced && let Some(traceparent) = row.get::<_, Option<String>>(2) {
                traces.insert(id.clone(), traceparent);
            }
            ahead.insert(id, Some(decode(row.get(1))?));
        }
        self.arrivals
            .borrow_mut()
            .extend(numbers.iter().map(|r| r.get::<_, i64>(0) as u64));
        Ok(traces)
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

/// The approvals of the ids `$1` (those stored), locked in byte order of their ids.
const LOCK_AHEAD: &str = "SELECT request_id, record::text FROM approval_records \
     WHERE request_id = ANY($1) ORDER BY request_id COLLATE \"C\" FOR UPDATE";
/// [`LOCK_AHEAD`] with each request's `traceparent` (NULL: none stored).
const LOCK_AHEAD_TRACED: &str = "SELECT r.request_id, r.record::text, t.traceparent \
     FROM approval_records r LEFT JOIN approval_traces t ON t.request_id = r.request_id \
     WHERE r.request_id = ANY($1) ORDER BY r.request_id COLLATE \"C\" FOR UPDATE OF r";
/// `$1` arrival numbers, in order.
const ARRIVALS_AHEAD: &str =
    "SELECT nextval('approval_arrivals') FROM generate_series(1, $1::bigint) ORDER BY 1";

/// Writes (or writes again) the `traceparent`s `$2` of the requests `$1` (each id once).
pub const TRACES_UPSERT: &str = "INSERT INTO approval_traces (request_id, traceparent) \
     SELECT * FROM unnest($1::text[], $2::text[]) \
     ON CONFLICT (request_id) DO UPDATE SET traceparent = EXCLUDED.traceparent";

impl PgTx<'_> {
    /// Keeps the record write that waited for an audit entry as a write of its own.
    fn defer_unsent(&self) {
        let save = self.unsent.borrow_mut().take();
        if let Some(save) = save {
            let sql = save.alone();
            self.defer(sql.into(), save.params());
        }
    }

    fn defer(&self, sql: Cow<'static, str>, params: Vec<Param>) {
        self.deferred.borrow_mut().push(Deferred { sql, params });
    }

    /// The statement that writes the audit entries `audit`, with the record write kept for
    /// them if there is one, and its parameters.
    fn audit_statement(
        &self,
        audits: Audits,
        audit: Vec<Param>,
    ) -> (Cow<'static, str>, Vec<Param>) {
        match self.unsent.borrow_mut().take() {
            None => {
                let (numbering, insert) = audits.sql();
                (format!("WITH {numbering} {insert}").into(), audit)
            }
            Some(save) => {
                let sql = save.with(audits);
                (sql.into(), audit.into_iter().chain(save.params()).collect())
            }
        }
    }

    /// The parameters of the audit entry `entry`, stamped with the transaction's time.
    fn audit_params(&self, entry: &mut AuditEntry) -> Result<Vec<Param>, Fail> {
        // Numbered by the statement (see `AUDIT_ID_FIELD`).
        (entry.id, entry.time_ms) = (0, self.now);
        Ok(vec![
            Box::new(entry.request_id.clone()),
            Box::new(entry.run_id.clone()),
            Box::new(clamp(entry.time_ms)),
            Box::new(action_of(entry)),
            Box::new(after_id(encode(entry)?)?),
        ])
    }
}

/// A write kept to go out with the next statement (see `run`).
struct Deferred {
    sql: Cow<'static, str>,
    params: Vec<Param>,
}

/// Waits for every one of `futures`, polled in the order given (each sends its request on its
/// first poll, so they go out in that order), and answers the first error in that order.
async fn in_order<F>(futures: impl Iterator<Item = F>) -> Result<(), tokio_postgres::Error>
where
    F: Future<Output = Result<u64, tokio_postgres::Error>>,
{
    let mut futures: Vec<Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut done: Vec<Option<Result<u64, tokio_postgres::Error>>> =
        futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, done) in futures.iter_mut().zip(done.iter_mut()) {
            if done.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(r) => *done = Some(r),
                    Poll::Pending => pending = true,
                }
            }
        }
        match pending {
            true => Poll::Pending,
            false => Poll::Ready(()),
        }
    })
    .await;
    done.into_iter().flatten().try_for_each(|r| r.map(drop))
}

impl Records for PgTx<'_> {
    type Fail = Fail;

    fn now(&self) -> u64 {
        self.now
    }

    fn find(&self, request_id: &str) -> Result<Option<Approval>, Fail> {
        if let Some(read) = self.ahead.borrow_mut().remove(request_id) {
            return Ok(read);
        }
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
        if let Some(n) = self.arrivals.borrow_mut().pop_front() {
            return Ok(n);
        }
        let row = self.run(
            self.client
                .prepared_query_one("SELECT nextval('approval_arrivals')", &[]),
        )?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// Kept until the next statement (see `unsent`).
    fn save(&self, old: Option<&Approval>, new: &Approval) -> Result<(), Fail> {
        self.ahead.borrow_mut().remove(new.id());
        self.defer_unsent();
        *self.unsent.borrow_mut() = Some(Save {
            insert: old.is_none(),
            request_id: new.id().to_string(),
            run_id: new.request.run_id.clone(),
            state: new.state.as_str().to_string(),
            created: clamp(new.created_at_ms),
            arrival: clamp(new.arrival),
            updated: clamp(new.updated_at_ms),
            deadline: clamp(new.deadline_ms()),
            outbox: new.needs_delivery(),
            record: encode(new)?,
        });
        self.changed(new.id());
        Ok(())
    }

    /// With the record write before it, if one is waiting, in one statement.
    fn audit(&self, mut entry: AuditEntry) -> Result<AuditEntry, Fail> {
        let audit = self.audit_params(&mut entry)?;
        // One round trip: the id comes from the sequence and is written into the entry too.
        let (sql, params) = self.audit_statement(Audits::One, audit);
        let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| &**p as _).collect();
        let row = self.run(self.client.prepared_query_one(&sql, &params))?;
        entry.id = row.get::<_, i64>(0) as u64;
        Ok(entry)
    }

    /// All of them, with the record write before them if one is waiting, in one statement
    /// when they are of one request and at most three.
    fn audit_all(&self, entries: Vec<AuditEntry>) -> Result<(), Fail> {
        let one_request = entries
            .windows(2)
            .all(|w| (&w[0].request_id, &w[0].run_id) == (&w[1].request_id, &w[1].run_id));
        let (Some(audits), true) = (Audits::of(entries.len()), one_request) else {
            return entries
                .into_iter()
                .try_for_each(|e| self.audit_all(vec![e]));
        };
        // The first entry's parameters, then each other's action and entry (see `Audits`).
        let mut entries = entries.into_iter();
        let mut audit = match entries.next() {
            Some(mut first) => self.audit_params(&mut first)?,
            None => return Ok(()),
        };
        for mut entry in entries {
            (entry.id, entry.time_ms) = (0, self.now);
            audit.push(Box::new(action_of(&entry)));
            audit.push(Box::new(after_id(encode(&entry)?)?));
        }
        let (sql, params) = self.audit_statement(audits, audit);
        self.defer(sql, params);
        Ok(())
    }

    fn webhook_routes(&self) -> &Routes {
        self.routes
    }

    /// Kept until the next statement, like an audit entry.
    fn put_webhook(&self, endpoint: &str, message: &Queued) -> Result<(), Fail> {
        let (sql, params) = super::webhooks::insert(endpoint, message)?;
        self.defer(sql.into(), params);
        Ok(())
    }

    /// In the round trip of the next statement, with every other kept until then (the last
    /// one of a request wins).
    fn put_trace(&self, request_id: &str, traceparent: &str) -> Result<(), Fail> {
        let mut traces = self.traces.borrow_mut();
        traces.retain(|(id, _)| id != request_id);
        traces.push((request_id.to_string(), traceparent.to_string()));
        Ok(())
    }

    fn delegations(&self) -> Result<Vec<Delegation>, Fail> {
        self.defer_unsent();
        let rows = self.run(
            self.client
                .prepared_query("SELECT record FROM approval_delegations ORDER BY id", &[]),
        )?;
        rows.iter().map(|r| Ok(decode(r.get(0))?)).collect()
    }

    fn put_delegation(&self, d: &Delegation) -> Result<(), Fail> {
        self.defer_unsent();
        let record = encode(d)?;
        self.run(self.client.prepared_execute(
            "INSERT INTO approval_delegations (id, record) VALUES ($1, $2) \
             ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record",
            &[&d.id, &record],
        ))?;
        Ok(())
    }

    fn delete_delegation(&self, id: &str) -> Result<Option<Delegation>, Fail> {
        self.defer_unsent();
        let row = self.run(self.client.prepared_query_opt(
            "DELETE FROM approval_delegations WHERE id = $1 RETURNING record",
            &[&id],
        ))?;
        match row {
            Some(r) => Ok(Some(decode(r.get(0))?)),
            None => Ok(None),
        }
    }

    /// Locks the approvals `ids` in byte order of their ids, as every transaction that changes
    /// several does, and reads them, in one statement: the lookups of a batch that follow are
    /// answered from what it read. With `arrivals`, as many arrival numbers are taken in the same
    /// round trip, for the new requests among them (one taken for an id already stored is
    /// skipped, as numbers of a transaction run again are).
    fn lock_ahead(&self, ids: &[&str], arrivals: bool) -> Result<(), Fail> {
        self.read_ahead(ids, arrivals, false).map(drop)
    }

    /// In the same statement as the lock, the `traceparent`s are read.
    fn lock_ahead_traced(&self, ids: &[&str]) -> Result<HashMap<String, String>, Fail> {
        self.read_ahead(ids, false, true)
    }

    /// Locks the rows of `run_id`'s approvals that may still be cancelled, in id order (so two
    /// transactions never wait for each other in a circle), and returns their ids. The index
    /// `approval_records_open_by_run` serves it: its predicate is this condition on `state`.
    fn cancellable_of_run(&self, run_id: &str, _looked: &[String]) -> Result<Vec<String>, Fail> {
        let rows = self.run(self.client.prepared_query(CANCELLABLE_OF_RUN, &[&run_id]))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}
