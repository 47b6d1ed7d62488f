//! `ledger.append`: writes one idempotency-keyed record to a sled tree, so tests (and operators)
//! can prove a side effect happened exactly once.

use serde_json::{Value as Json, json};

use super::{Tool, ToolCall, ToolError};

/// Appends `args.entry` (or the whole args when there is no `entry`) under the call's idempotency
/// key. A second append with the same key returns the first receipt and writes nothing. The write
/// is a plain insert: the runner flushes before it answers anyone.
#[derive(Debug, Clone)]
pub struct LedgerTool {
    tree: sled::Tree,
    /// Records written so far. `sled::Tree::len` walks the whole tree, so the count is taken
    /// once here and kept in step with every append.
    appended: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl LedgerTool {
    pub fn new(tree: sled::Tree) -> Self {
        let appended = tree.len() as u64;
        Self {
            tree,
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
        // compare_and_swap keeps the first receipt if two processes race on one key.
        match self
            .tree
            .compare_and_swap(key, None as Option<&[u8]>, Some(bytes))
            .map_err(storage)?
        {
            Ok(()) => Ok(receipt),
            Err(cas) => cas
                .current
                .map(|first| serde_json::from_slice(&first).unwrap_or(Json::Null))
                .ok_or_else(|| ToolError::Storage("ledger record vanished".into())),
        }
    }
}
