//! Helpers for transaction bodies: a table of a transaction ([`TxTable`]), counters, the
//! event log's bounds, and turning domain errors into aborts.

use super::{Abort, Fault, T, TxResult, Txn, Value};

impl<'a> dyn Txn + 'a {
    /// One table of the transaction.
    pub fn tree(&self, t: T) -> TxTable<'_, 'a> {
        TxTable { tx: self, t }
    }
}

/// One table inside a transaction.
pub struct TxTable<'t, 'a> {
    tx: &'t (dyn Txn + 'a),
    t: T,
}

impl TxTable<'_, '_> {
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Value>, Fault> {
        self.tx.get(self.t, key.as_ref())
    }

    pub fn insert(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), Fault> {
        self.tx.put(self.t, key.as_ref(), value.as_ref())
    }

    pub fn remove(&self, key: impl AsRef<[u8]>) -> Result<(), Fault> {
        self.tx.delete(self.t, key.as_ref())
    }

    /// See [`Txn::add`].
    pub fn add(&self, key: impl AsRef<[u8]>, delta: i64) -> Result<(), Fault> {
        self.tx.add(self.t, key.as_ref(), delta)
    }

    /// See [`Txn::lock_first`].
    pub fn lock_first(&self, keys: &[Value], limit: usize) -> Result<Vec<(Value, Value)>, Fault> {
        self.tx.lock_first(self.t, keys, limit)
    }
}

/// A counter's stored value: a big-endian `i64` (anything else reads as 0).
pub fn read_counter(v: &[u8]) -> i64 {
    <[u8; 8]>::try_from(v).map_or(0, i64::from_be_bytes)
}

/// `meta` key of the next event seq to assign (the event log's counter).
pub const NEXT_SEQ: &[u8] = b"next_seq";
/// `meta` key of the oldest event seq still retained (absent: 1).
pub const FIRST_SEQ: &[u8] = b"first_seq";

/// Converts a transaction body's abort error into another error type.
pub fn lift<R, E1, E2: From<E1>>(r: TxResult<R, E1>) -> TxResult<R, E2> {
    r.map_err(|e| match e {
        Abort::Domain(e) => Abort::Domain(e.into()),
        Abort::Conflict => Abort::Conflict,
        Abort::Storage(e) => Abort::Storage(e),
    })
}

/// Aborts the transaction with `e`.
pub fn abort<R, E>(e: impl Into<E>) -> TxResult<R, E> {
    Err(Abort::Domain(e.into()))
}
