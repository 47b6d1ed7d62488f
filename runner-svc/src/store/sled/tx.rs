//! A sled transaction over every runner tree, as the seam's [`Txn`].

use ::sled::{
    Transactional,
    transaction::{
        ConflictableTransactionError, TransactionError, TransactionalTree,
        UnabortableTransactionError,
    },
};
use arbor_shared::sled_backend::commit::{BatchResult, TxSet};

use super::storage;
use crate::store::{Abort, Fault, T, Txn, Value, Wake, read_counter};

/// The runner's trees inside one sled transaction.
pub(super) struct SledTx<'a> {
    pub(super) trees: &'a [TransactionalTree],
}

fn fault(e: UnabortableTransactionError) -> Fault {
    match e {
        UnabortableTransactionError::Conflict => Fault::Conflict,
        UnabortableTransactionError::Storage(e) => Fault::Storage(storage(e)),
    }
}

impl Txn for SledTx<'_> {
    fn get(&self, t: T, key: &[u8]) -> Result<Option<Value>, Fault> {
        self.trees[t as usize]
            .get(key)
            .map(|v| v.map(|v| v.to_vec()))
            .map_err(fault)
    }

    fn put(&self, t: T, key: &[u8], value: &[u8]) -> Result<(), Fault> {
        self.trees[t as usize]
            .insert(key, value)
            .map(drop)
            .map_err(fault)
    }

    fn delete(&self, t: T, key: &[u8]) -> Result<(), Fault> {
        self.trees[t as usize].remove(key).map(drop).map_err(fault)
    }

    fn add(&self, t: T, key: &[u8], delta: i64) -> Result<(), Fault> {
        let now = self.get(t, key)?.map_or(0, |v| read_counter(&v));
        self.put(t, key, &(now + delta).to_be_bytes())
    }

    /// sled transactions conflict instead of locking (and run one at a time): the first keys
    /// the transaction sees.
    fn lock_first(&self, t: T, keys: &[Value], limit: usize) -> Result<Vec<(Value, Value)>, Fault> {
        let mut out = Vec::new();
        for key in keys {
            if out.len() >= limit {
                break;
            }
            if let Some(value) = self.get(t, key)? {
                out.push((key.clone(), value));
            }
        }
        Ok(out)
    }

    /// Nobody else opens an embedded store: this process's callers wake its own waiters.
    fn wake(&self, _wake: Wake) {}
}

/// An erased body's outcome as sled's transaction wants it.
pub(super) fn to_sled<E>(r: Result<(), Abort<E>>) -> Result<(), ConflictableTransactionError<E>> {
    r.map_err(|e| match e {
        Abort::Domain(e) => ConflictableTransactionError::Abort(e),
        Abort::Conflict => ConflictableTransactionError::Conflict,
        Abort::Storage(e) => ConflictableTransactionError::Storage(::sled::Error::Io(
            std::io::Error::other(e.to_string()),
        )),
    })
}

/// Every runner tree, in the order of [`T`].
#[derive(Clone)]
pub(super) struct AllTrees {
    pub(super) trees: Vec<::sled::Tree>,
}

impl TxSet for AllTrees {
    type Tx<'a> = SledTx<'a>;

    fn transaction(
        &self,
        body: &dyn Fn(&SledTx<'_>) -> BatchResult,
    ) -> Result<(), TransactionError<usize>> {
        self.trees[..].transaction(|trees: &Vec<TransactionalTree>| body(&SledTx { trees }))
    }
}
