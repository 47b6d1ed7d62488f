//! Reads outside transactions: single rows, several rows in one statement, and scans read
//! one page at a time.

use std::collections::VecDeque;

use arbor_shared::postgres::{
    ClientWrapper, Database, DbError, tokio_postgres::types::ToSql, wait,
};

use super::schema::{SCAN_FROM, SCAN_PAGE, SCAN_RANGE, keys_looked_up};
use crate::store::{StoreError, T, Value};

/// Reads one row, with the connection's prepared statement.
pub(super) fn read_one(client: &ClientWrapper, t: T, key: &[u8]) -> Result<Option<Value>, DbError> {
    wait(read_async(client, t, key))
}

pub(super) async fn read_async(
    client: &ClientWrapper,
    t: T,
    key: &[u8],
) -> Result<Option<Value>, DbError> {
    let statement = client
        .prepare_cached("SELECT v FROM runner_kv WHERE t = $1 AND k = $2")
        .await?;
    let row = client.query_opt(&statement, &[&(t as i16), &key]).await?;
    Ok(row.map(|r| r.get(0)))
}

/// Reads several rows in one round trip and one statement: each key's value (`None`: absent),
/// in the order given. The keys go as two arrays, and each is looked up by the primary key:
/// the `LIMIT 1` keeps the lookup a subquery of the key it is given, so the plan is a nested
/// loop of index reads whatever the number of keys (a join the planner were free to choose
/// would become a hash join over the whole table for many keys), and makes each read an index
/// scan even while the table has no statistics. One statement rather than one per key: each
/// statement costs the server an executor start and end and the client a round of encoding
/// and decoding (a read of four keys takes the server about 50 µs of CPU this way, 70–80 µs
/// as four pipelined statements).
pub(super) async fn read_many<'k>(
    client: &ClientWrapper,
    keys: impl IntoIterator<Item = (T, &'k [u8])>,
) -> Result<Vec<Option<Value>>, DbError> {
    let keys: Vec<(T, &[u8])> = keys.into_iter().collect();
    match keys.as_slice() {
        [] => return Ok(Vec::new()),
        [(t, key)] => return Ok(vec![read_async(client, *t, key).await?]),
        _ => {}
    }
    let (tables, keys): (Vec<i16>, Vec<&[u8]>) =
        keys.into_iter().map(|(t, k)| (t as i16, k)).unzip();
    let statement = client
        .prepare_cached(concat!("SELECT u.i, r.v ", keys_looked_up!()))
        .await?;
    let mut values = vec![None; keys.len()];
    for row in client.query(&statement, &[&tables, &keys]).await? {
        place(&mut values, row.get(0), row.get(1));
    }
    Ok(values)
}

/// Puts the value of the key numbered `i` (from 1) in its place among `values`.
pub(super) fn place(values: &mut [Option<Value>], i: i64, v: Value) {
    if let Some(slot) = usize::try_from(i - 1).ok().and_then(|i| values.get_mut(i)) {
        *slot = Some(v);
    }
}

/// Keys grouped by table, tables in the order they first appear.
pub(super) fn by_table<'k>(
    keys: impl Iterator<Item = (i16, &'k [u8])>,
) -> Vec<(i16, Vec<&'k [u8]>)> {
    let mut groups: Vec<(i16, Vec<&[u8]>)> = Vec::new();
    for (t, k) in keys {
        match groups.iter_mut().find(|(g, _)| *g == t) {
            Some((_, ks)) => ks.push(k),
            None => groups.push((t, vec![k])),
        }
    }
    groups
}

/// The least key above every key that starts with `prefix` (`None`: no bound).
pub(super) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// A scan read one page at a time.
pub(super) struct Scan {
    pub(super) db: Database,
    pub(super) t: i16,
    /// The next key to read from (inclusive).
    pub(super) from: Vec<u8>,
    pub(super) end: Option<Vec<u8>>,
    pub(super) page: VecDeque<(Value, Value)>,
    /// Rows the next round trip fetches.
    pub(super) size: i64,
    pub(super) done: bool,
}

impl Scan {
    fn fetch(&mut self) -> Result<(), StoreError> {
        let client = self.db.client_blocking()?;
        let (sql, params): (_, Vec<&(dyn ToSql + Sync)>) = match &self.end {
            Some(end) => (SCAN_RANGE, vec![&self.t, &self.from, end, &self.size]),
            None => (SCAN_FROM, vec![&self.t, &self.from, &self.size]),
        };
        let rows = wait(async {
            client
                .query(&client.prepare_cached(sql).await?, &params)
                .await
        })
        .map_err(DbError::from)?;
        self.done = (rows.len() as i64) < self.size;
        self.size = (self.size * 4).min(SCAN_PAGE);
        for row in rows {
            self.page.push_back((row.get(0), row.get(1)));
        }
        if let Some((k, _)) = self.page.back() {
            self.from = [k.as_slice(), &[0]].concat();
        }
        Ok(())
    }
}

impl Iterator for Scan {
    type Item = Result<(Value, Value), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.page.is_empty()
            && !self.done
            && let Err(e) = self.fetch()
        {
            self.done = true;
            return Some(Err(e));
        }
        self.page.pop_front().map(Ok)
    }
}
