//! `ledger.append`: writes one idempotency-keyed record to the runner's ledger table, so tests (and operators)
//! can prove a side effect happened exactly once.

use serde_json::{Value as Json, json};

use super::{Tool, ToolCall, ToolError};
use crate::store::{Store, StoreError, T, Value};

/// Appends `args.entry` (or the whole args when there is no `entry`) under the call's idempotency
/// key. A second append with the same key returns the first receipt and writes nothing.
#[derive(Clone)]
pub struct LedgerTool {
    store: Store,
    /// Records written so far, counted once at start and kept in step with every append.
    appended: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for LedgerTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerTool").finish_non_exhaustive()
    }
}

impl LedgerTool {
    /// The ledger in `store`'s ledger table. Each record is a transaction of its own, so it is
    /// durable no later than the checkpoint that holds its receipt, whose commit waits for
    /// everything committed before it.
    pub fn new(store: Store) -> Result<Self, StoreError> {
        let mut appended = 0;
        for entry in store.tree(T::Ledger).iter().keys() {
            entry?;
            appended += 1;
        }
        Ok(Self {
            store,
            appended: std::sync::Arc::new(appended.into()),
        })
    }

    /// (idempotency key, stored receipt) in key order.
    pub fn entries(&self) -> Vec<(String, Json)> {
        self.store
            .tree(T::Ledger)
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| {
                let key = String::from_utf8_lossy(&k).into_owned();
                let value = serde_json::from_slice(&v).unwrap_or(Json::Null);
                (key, value)
            })
            .collect()
    }

    pub fn count(&self) -> usize {
        self.entries().len()
    }

    /// Writes `value` under `key` unless the key holds a value already, which it returns.
    fn insert_new(&self, key: &[u8], value: Vec<u8>) -> Result<Option<Value>, String> {
        self.store
            .tree(T::Ledger)
            .insert_new(key, value)
            .map_err(|e| e.to_string())
    }
}

impl Tool for LedgerTool {
    fn name(&self) -> &str {
        "ledger.append"
    }

    fn call(&self, call: &ToolCall) -> Result<Json, ToolError> {
        let key = call.idempotency_key.as_bytes();
        // A stored receipt is answered as it is; one that does not decode is an error.
        let stored = |bytes: &[u8]| {
            serde_json::from_slice(bytes).map_err(|e| ToolError::Storage(e.to_string()))
        };
        let entry = call
            .args
            .get("entry")
            .cloned()
            .unwrap_or_else(|| call.args.clone());
        let seq = self
            .appended
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        let receipt = json!({
            "key": call.idempotency_key,
            "seq": seq,
            "entry": entry,
        });
        let bytes = serde_json::to_vec(&receipt).map_err(|e| ToolError::Storage(e.to_string()))?;
        // One write, no read ahead of it: a key that holds a receipt already (a step run
        // again, two callers racing) keeps it and answers it, and the sequence number taken
        // here is given back unless a later one was taken meanwhile (then it goes unused:
        // `seq` orders receipts, it does not count them).
        match self.insert_new(key, bytes).map_err(ToolError::Storage)? {
            None => Ok(receipt),
            Some(first) => {
                let _ = self.appended.compare_exchange(
                    seq,
                    seq - 1,
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                );
                stored(&first)
            }
        }
    }
}
