//! `ledger.append`: writes one idempotency-keyed record to a sled tree, so tests (and operators)
//! can prove a side effect happened exactly once.

use serde_json::{Value as Json, json};

use super::{Tool, ToolCall, ToolError};

/// Writes `value` under `key` unless the key holds a value already, which it returns instead.
pub type InsertNew =
    std::sync::Arc<dyn Fn(&[u8], Vec<u8>) -> Result<Option<sled::IVec>, String> + Send + Sync>;

/// Appends `args.entry` (or the whole args when there is no `entry`) under the call's idempotency
/// key. A second append with the same key returns the first receipt and writes nothing.
#[derive(Clone)]
pub struct LedgerTool {
    tree: sled::Tree,
    insert_new: InsertNew,
    /// Records written so far. `sled::Tree::len` walks the whole tree, so the count is taken
    /// once here and kept in step with every append.
    appended: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for LedgerTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerTool").finish_non_exhaustive()
    }
}

impl LedgerTool {
    /// A ledger written straight into `tree` (`compare_and_swap` keeps the first receipt if two
    /// callers race on one key), durable whenever the database is.
    pub fn new(tree: sled::Tree) -> Self {
        let cas = tree.clone();
        Self::with_writer(
            tree,
            std::sync::Arc::new(move |key: &[u8], value: Vec<u8>| {
                match cas
                    .compare_and_swap(key, None as Option<&[u8]>, Some(value))
                    .map_err(|e| e.to_string())?
                {
                    Ok(()) => Ok(None),
                    Err(current) => Ok(current.current),
                }
            }),
        )
    }

    /// A ledger whose records `insert_new` writes (the runner's: through its journal, so a
    /// record is durable no later than the checkpoint that holds its receipt); `tree` is read.
    pub fn with_writer(tree: sled::Tree, insert_new: InsertNew) -> Self {
        let appended = tree.len() as u64;
        Self {
            tree,
            insert_new,
            appended: std::sync::Arc::new(appended.into()),
        }
    }

    /// (idempotency key, stored receipt) in key order.
    pub fn entries(&self) -> Vec<(String, Json)> {
        self.tree
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
        self.tree.len()
    }
}

impl Tool for LedgerTool {
    fn name(&self) -> &str {
        "ledger.append"
    }

    fn call(&self, call: &ToolCall) -> Result<Json, ToolError> {
        let key = call.idempotency_key.as_bytes();
        let storage = |e: sled::Error| ToolError::Storage(e.to_string());
        if let Some(existing) = self.tree.get(key).map_err(storage)? {
            return serde_json::from_slice(&existing)
                .map_err(|e| ToolError::Storage(e.to_string()));
        }
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
        // The first receipt wins if two callers race on one key.
        match (self.insert_new)(key, bytes).map_err(ToolError::Storage)? {
            None => Ok(receipt),
            Some(first) => Ok(serde_json::from_slice(&first).unwrap_or(Json::Null)),
        }
    }
}
