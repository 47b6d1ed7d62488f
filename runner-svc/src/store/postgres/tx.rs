//! One SQL transaction ([`PgTx`]): reads go to the server (one statement for every row named
//! at once), writes wait until the bodies return and go out with the COMMIT, and the
//! notifications of what the bodies declared they wake right after it, in one round trip.

use std::{
    cell::RefCell,
    collections::{BTreeMap, HashMap},
};

use arbor_shared::postgres::{ClientWrapper, DbError, LazyBegin, wait};

use super::{
    batch::Setup,
    read::{by_table, read_many},
    schema::{ASYNC_BEGIN, DELETE_KEYS, LOCK_FIRST},
    wake::{self, Origin},
};
use crate::store::{Fault, T, TABLES, Txn, Value, Wake};

/// A write of one key inside a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Write {
    /// A new value (`None`: deleted).
    Set(Option<Value>),
    /// An amount added to the counter the key holds, whatever it holds when this commits.
    Add(i64),
}

impl Write {
    /// This write followed by `next`.
    fn then(self, next: Write) -> Write {
        match (self, next) {
            (Write::Add(a), Write::Add(b)) => Write::Add(a + b),
            (Write::Set(v), Write::Add(d)) => Write::Set(Some(counter_plus(v.as_deref(), d))),
            (_, set) => set,
        }
    }
}

/// A counter's value (big-endian `i64`, absent: 0) plus `delta`.
pub(super) fn counter_plus(value: Option<&[u8]>, delta: i64) -> Value {
    let now = value
        .and_then(|v| <[u8; 8]>::try_from(v).ok())
        .map_or(0, i64::from_be_bytes);
    (now + delta).to_be_bytes().to_vec()
}

/// One SQL transaction: reads go to the server (seeing the transaction's own writes first,
/// then what it read before), writes wait in `writes` until commit.
pub(super) struct PgTx<'c> {
    client: &'c ClientWrapper,
    /// The runtime a dedicated connection's I/O runs on while the transaction waits (`None`:
    /// a pooled connection, whose I/O runs on the pool's).
    rt: Option<&'c tokio::runtime::Runtime>,
    /// Every write so far, in order.
    log: RefCell<Vec<(T, Value, Write)>>,
    /// What the bodies so far declared they wake (see [`Txn::wake`]), in order.
    wakes: RefCell<Vec<Wake>>,
    /// What the writes so far leave of each key.
    writes: RefCell<BTreeMap<(usize, Value), Write>>,
    /// Every row read so far (`None`: absent). Every transaction here reads one snapshot
    /// (`REPEATABLE READ` or `SERIALIZABLE`), so a row read once reads the same again until
    /// the transaction writes it.
    read: RefCell<HashMap<(usize, Value), Option<Value>>>,
    /// Rows to fetch with the first read, in the same round trip.
    ahead: RefCell<Vec<(T, Value)>>,
    /// Which row of each counter `add` moves (0: the counter's own key).
    stripe: u8,
    /// The payload of the notifications it sends (see `Setup::origin`).
    origin: &'c Origin,
    /// Whether its commit answers once durable (not a claim's).
    durable: bool,
    /// A failure a read or write hit (the SQL transaction is then aborted).
    failed: RefCell<Option<DbError>>,
    begin: LazyBegin,
}

/// The first error of pipelined statements.
pub(super) fn first_error(results: [Result<(), DbError>; 5]) -> Result<(), DbError> {
    results.into_iter().collect()
}

impl<'c> PgTx<'c> {
    pub(super) fn begin(
        client: &'c ClientWrapper,
        rt: Option<&'c tokio::runtime::Runtime>,
        setup: Setup<'c>,
        stripe: u8,
    ) -> Self {
        Self {
            client,
            rt,
            log: RefCell::default(),
            wakes: RefCell::default(),
            writes: RefCell::default(),
            read: RefCell::default(),
            ahead: RefCell::new(setup.ahead.to_vec()),
            stripe,
            origin: setup.origin,
            durable: setup.begin != ASYNC_BEGIN,
            failed: RefCell::default(),
            begin: match setup.begun {
                true => LazyBegin::begun(setup.begin),
                false => LazyBegin::new(setup.begin),
            },
        }
    }

    /// Reads `keys` (with `BEGIN` if not sent yet) in one round trip into `read`.
    pub(super) fn fetch(&self, keys: Vec<(T, Value)>) -> Result<(), DbError> {
        let rows = self.wait(async {
            let reads = read_many(self.client, keys.iter().map(|(t, k)| (*t, k.as_slice())));
            let (begun, rows) = futures_util::join!(self.begin_once(), reads);
            begun?;
            rows
        })?;
        let mut read = self.read.borrow_mut();
        for ((t, k), v) in keys.into_iter().zip(rows) {
            read.insert((t as usize, k), v);
        }
        Ok(())
    }

    /// Waits for `fut`, a request on the transaction's connection.
    pub(super) fn wait<F: std::future::Future>(&self, fut: F) -> F::Output {
        match self.rt {
            Some(rt) => rt.block_on(fut),
            None => wait(fut),
        }
    }

    /// `BEGIN`, unless already sent (as a future, to pipeline with the next statement).
    pub(super) async fn begin_once(&self) -> Result<(), DbError> {
        Ok(self.begin.before(self.client).await?)
    }

    /// How many writes and wakes the bodies so far declared.
    pub(super) fn mark(&self) -> (usize, usize) {
        (self.log.borrow().len(), self.wakes.borrow().len())
    }

    /// Drops every write and wake after `mark` (an aborted body's).
    pub(super) fn undo_to(&self, (writes, wakes): (usize, usize)) {
        self.wakes.borrow_mut().truncate(wakes);
        let mut log = self.log.borrow_mut();
        log.truncate(writes);
        let mut writes = self.writes.borrow_mut();
        writes.clear();
        for (t, k, w) in log.iter() {
            apply(&mut writes, *t, k, w.clone());
        }
    }

    pub(super) fn write(&self, t: T, key: &[u8], w: Write) {
        self.log.borrow_mut().push((t, key.to_vec(), w.clone()));
        apply(&mut self.writes.borrow_mut(), t, key, w);
    }

    pub(super) fn fault(&self) -> Option<DbError> {
        self.failed.borrow().clone()
    }

    pub(super) fn note<R>(&self, r: Result<R, DbError>) -> Result<R, Fault> {
        r.map_err(|e| {
            // The first failure is the cause; later ones only say the transaction is aborted.
            self.failed.borrow_mut().get_or_insert_with(|| e.clone());
            Fault::from(e)
        })
    }

    /// Ends the SQL transaction without keeping anything (nothing to do when none was begun).
    pub(super) fn rollback(&self) {
        if self.begin.end() {
            let _ = self.wait(self.client.batch_execute("ROLLBACK"));
        }
    }

    /// Writes what the bodies kept, notifies listeners, commits.
    pub(super) fn commit(&self) -> Result<(), DbError> {
        let writes = std::mem::take(&mut *self.writes.borrow_mut());
        let (mut put_t, mut put_k, mut put_v) = (Vec::new(), Vec::new(), Vec::new());
        let (mut add_t, mut add_k, mut add_d) = (Vec::new(), Vec::new(), Vec::new());
        let mut deleted: Vec<(i16, Value)> = Vec::new();
        for ((t, k), w) in writes {
            let v = match w {
                Write::Set(v) => v,
                Write::Add(d) => {
                    add_t.push(t as i16);
                    add_k.push(k);
                    add_d.push(d);
                    continue;
                }
            };
            match v {
                Some(v) => {
                    put_t.push(t as i16);
                    put_k.push(k);
                    put_v.push(v);
                }
                None => deleted.push((t as i16, k)),
            }
        }
        let writes = !put_t.is_empty() || !deleted.is_empty() || !add_t.is_empty();
        let deleted = by_table(deleted.iter().map(|(t, k)| (*t, k.as_slice())));
        if !writes && !self.begin.open() {
            return Ok(());
        }
        // The notifications of what the bodies declared they wake go out only if the batch
        // committed: a statement after a failed COMMIT does not run, but the COMMIT of a
        // transaction that a write aborted answers OK (it rolls back). So a `SELECT` goes
        // first, which the server refuses inside an aborted transaction, skipping the rest:
        // the COMMIT too, and `rollback` ends the transaction (see `wake::after_commit`).
        let wakes = std::mem::take(&mut *self.wakes.borrow_mut());
        let notify = wake::after_commit(&wakes, self.origin, self.durable);
        let finish = match notify.is_empty() {
            true => String::from("COMMIT"),
            false => format!("SELECT 1;COMMIT{notify}"),
        };
        // One round trip: BEGIN (if no read sent it), the deletes, the upserts and COMMIT go
        // out together. When a statement fails the transaction is aborted, and the COMMIT
        // behind it only rolls back.
        let client = self.client;
        let results = self.wait(async {
            // Prepared first: a statement that still has to be parsed would go out after the
            // COMMIT queued behind it, and run outside the transaction.
            let prepared = futures_util::try_join!(
                client.prepare_cached(DELETE_KEYS),
                client.prepare_cached(
                    "INSERT INTO runner_kv (t, k, v) \
                     SELECT * FROM unnest($1::smallint[], $2::bytea[], $3::bytea[]) \
                     ON CONFLICT (t, k) DO UPDATE SET v = EXCLUDED.v",
                ),
                // Counters are big-endian i64s, as `counter_plus` reads and writes them.
                client.prepare_cached(
                    "INSERT INTO runner_kv AS r (t, k, v) \
                     SELECT u.t, u.k, int8send(u.d) \
                     FROM unnest($1::smallint[], $2::bytea[], $3::bigint[]) AS u(t, k, d) \
                     ON CONFLICT (t, k) DO UPDATE SET v = int8send( \
                         ('x' || encode(r.v, 'hex'))::bit(64)::bigint \
                         + ('x' || encode(EXCLUDED.v, 'hex'))::bit(64)::bigint)",
                ),
            );
            let (delete, upsert, increment) = match prepared {
                Ok(statements) => statements,
                Err(e) => return [Err(DbError::from(e)), Ok(()), Ok(()), Ok(()), Ok(())],
            };
            let deletes = async {
                let each = deleted
                    .iter()
                    .map(|(t, ks)| async { client.execute(&delete, &[t, ks]).await });
                for done in futures_util::future::join_all(each).await {
                    done?;
                }
                Ok(())
            };
            let upserts = async {
                if !put_t.is_empty() {
                    client.execute(&upsert, &[&put_t, &put_k, &put_v]).await?;
                }
                Ok(())
            };
            let increments = async {
                if !add_t.is_empty() {
                    client
                        .execute(&increment, &[&add_t, &add_k, &add_d])
                        .await?;
                }
                Ok(())
            };
            let commit = async { Ok(client.batch_execute(&finish).await?) };
            let (b, d, u, i, c) =
                futures_util::join!(self.begin_once(), deletes, upserts, increments, commit);
            [b, d, u, i, c]
        });
        // The COMMIT ran (an aborted transaction's COMMIT rolls it back and answers OK):
        // nothing is left open on the connection. Otherwise it may be (an aborted transaction
        // that was to notify refused the `SELECT` before its COMMIT), and is rolled back.
        let ended = results[4].is_ok();
        let result = first_error(results);
        match ended {
            true => {
                self.begin.end();
            }
            false => self.rollback(),
        }
        result
    }
}

/// A transaction dropped on any other path (a conflict found by a body, a failed read) is
/// rolled back here, so that its connection goes back to the pool outside any transaction: a
/// connection returned inside an aborted one would fail the next transaction's every statement.
impl Drop for PgTx<'_> {
    fn drop(&mut self) {
        self.rollback();
    }
}

impl Txn for PgTx<'_> {
    fn get(&self, t: T, key: &[u8]) -> Result<Option<Value>, Fault> {
        let at = (t as usize, key.to_vec());
        let added = match self.writes.borrow().get(&at) {
            Some(Write::Set(v)) => return Ok(v.clone()),
            Some(Write::Add(d)) => Some(*d),
            None => None,
        };
        let cached = self.read.borrow().get(&at).cloned();
        let stored = match cached {
            Some(v) => v,
            None => {
                let mut keys = std::mem::take(&mut *self.ahead.borrow_mut());
                keys.retain(|(at_t, at_k)| (*at_t, at_k.as_slice()) != (t, key));
                keys.push((t, key.to_vec()));
                let fetched = self.fetch(keys);
                self.note(fetched)?;
                self.read.borrow().get(&at).cloned().flatten()
            }
        };
        Ok(match added {
            Some(d) => Some(counter_plus(stored.as_deref(), d)),
            None => stored,
        })
    }

    fn put(&self, t: T, key: &[u8], value: &[u8]) -> Result<(), Fault> {
        self.write(t, key, Write::Set(Some(value.to_vec())));
        Ok(())
    }

    fn delete(&self, t: T, key: &[u8]) -> Result<(), Fault> {
        self.write(t, key, Write::Set(None));
        Ok(())
    }

    /// Nothing is read: the amount is added by the commit's own statement, to whatever the row
    /// holds then (the transaction's stripe of the counter).
    fn add(&self, t: T, key: &[u8], delta: i64) -> Result<(), Fault> {
        self.write(t, &stripe_key(key, self.stripe), Write::Add(delta));
        Ok(())
    }

    /// `FOR UPDATE SKIP LOCKED`: rows another transaction locked are passed over, the rows
    /// returned are locked until this transaction ends.
    fn lock_first(&self, t: T, keys: &[Value], limit: usize) -> Result<Vec<(Value, Value)>, Fault> {
        let at = |k: &Value| (t as usize, k.clone());
        let wanted: Vec<&[u8]> = {
            let writes = self.writes.borrow();
            keys.iter()
                .filter(|k| writes.get(&at(k)) != Some(&Write::Set(None)))
                .map(Vec::as_slice)
                .collect()
        };
        if wanted.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let rows = self.wait(async {
            let (begun, rows) = futures_util::join!(self.begin_once(), async {
                let statement = self.client.prepare_cached(LOCK_FIRST).await?;
                let limit = limit as i64;
                Ok::<_, DbError>(
                    self.client
                        .query(&statement, &[&(t as i16), &wanted, &limit])
                        .await?,
                )
            });
            begun?;
            rows
        });
        let mut out = Vec::new();
        for row in self.note(rows)? {
            let (k, v): (Value, Value) = (row.get(0), row.get(1));
            let mine = self.writes.borrow().get(&at(&k)).cloned();
            match mine {
                Some(Write::Set(Some(v))) => out.push((k, v)),
                _ => {
                    self.read.borrow_mut().insert(at(&k), Some(v.clone()));
                    out.push((k, v));
                }
            }
        }
        Ok(out)
    }

    fn wake(&self, wake: Wake) {
        self.wakes.borrow_mut().push(wake);
    }

    fn prefetch(&self, keys: &[(T, &[u8])]) -> Result<(), Fault> {
        let missing: Vec<(T, Value)> = {
            let (writes, read) = (self.writes.borrow(), self.read.borrow());
            keys.iter()
                .map(|(t, k)| (*t as usize, k.to_vec()))
                .filter(|at| !writes.contains_key(at) && !read.contains_key(at))
                .map(|(t, k)| (table(t), k))
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        let mut all = std::mem::take(&mut *self.ahead.borrow_mut());
        all.retain(|at| !missing.contains(at));
        all.extend(missing);
        let fetched = self.fetch(all);
        self.note(fetched)
    }
}

/// The row of stripe `stripe` of the counter `key` (stripe 0 is the key itself).
pub(super) fn stripe_key(key: &[u8], stripe: u8) -> Vec<u8> {
    match stripe {
        0 => key.to_vec(),
        s => [key, &[0, s]].concat(),
    }
}

/// The table of a table number of `T`.
pub(super) fn table(t: usize) -> T {
    TABLES[t]
}

/// Records `w` as the latest write of `key`.
pub(super) fn apply(writes: &mut BTreeMap<(usize, Value), Write>, t: T, key: &[u8], w: Write) {
    let at = (t as usize, key.to_vec());
    let next = match writes.remove(&at) {
        Some(before) => before.then(w),
        None => w,
    };
    writes.insert(at, next);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(n: i64) -> Option<Value> {
        Some(n.to_be_bytes().to_vec())
    }

    /// What a transaction's writes of one key leave, in the order they were made.
    #[test]
    fn writes_of_one_key_fold_in_order() {
        let set = |n| Write::Set(counter(n));
        assert_eq!(Write::Add(2).then(Write::Add(-5)), Write::Add(-3));
        assert_eq!(set(10).then(Write::Add(-4)), set(6));
        assert_eq!(Write::Set(None).then(Write::Add(3)), set(3));
        assert_eq!(Write::Add(7).then(set(1)), set(1));
        assert_eq!(Write::Add(7).then(Write::Set(None)), Write::Set(None));
        assert_eq!(counter_plus(None, -2), (-2i64).to_be_bytes().to_vec());
    }
}
