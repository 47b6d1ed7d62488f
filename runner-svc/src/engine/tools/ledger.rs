//! `ledger.append`: writes one idempotency-keyed record to the runner's ledger table, so tests (and operators)
//! can prove a side effect happened exactly once.

use serde_json::{Value as Json, json};

use super::{Tool, ToolCall, ToolError};
use crate::store::{Sequence, Store, StoreError, T};

/// `meta` row of the ledger's sequence. The previous release kept the `seq` of the last record
/// in it and every append rewrote it; now the sequence is the store's ([`Sequence::Ledger`]):
/// on the embedded store this row is still its counter, on PostgreSQL a migration seeded the
/// sequence from it and it is no longer moved. Either way, a ledger that has it has had its
/// sequence raised past every receipt.
pub const LEDGER_SEQ: &[u8] = Sequence::Ledger.meta_key();

/// Appends `args.entry` (or the whole args when there is no `entry`) under the call's idempotency
/// key. A second append with the same key returns the first receipt and writes nothing.
#[derive(Clone)]
pub struct LedgerTool {
    store: Store,
}

impl std::fmt::Debug for LedgerTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerTool").finish_non_exhaustive()
    }
}

impl LedgerTool {
    /// The ledger in `store`'s ledger table. Each record is a write of its own, committed before
    /// the append returns, so it is durable no later than the checkpoint that holds its
    /// receipt, whose commit waits for everything committed before it.
    ///
    /// A ledger without the `meta` row `ledger_seq` (a new one, or one written when each process
    /// counted its records) gets its sequence raised to the highest `seq` its receipts hold,
    /// so that no later record goes below one of them, and then the row, so that later opens
    /// skip the scan. Replicas starting together may both do it: a raise never lowers.
    pub fn new(store: Store) -> Result<Self, StoreError> {
        if store.tree(T::Meta).get(LEDGER_SEQ)?.is_none() {
            let mut highest = 0;
            for value in store.tree(T::Ledger).all().values() {
                let receipt: Json = serde_json::from_slice(&value?).unwrap_or(Json::Null);
                highest = highest.max(receipt["seq"].as_u64().unwrap_or(0));
            }
            store.raise(Sequence::Ledger, highest)?;
            // On the embedded store the raise wrote the row already: this finds it.
            store
                .tree(T::Meta)
                .insert_new(LEDGER_SEQ, highest.to_be_bytes())?;
        }
        Ok(Self { store })
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
}

impl Tool for LedgerTool {
    fn name(&self) -> &str {
        "ledger.append"
    }

    /// Answers the first receipt when the key holds one (a replayed call, the usual repeat).
    /// Otherwise takes a `seq` from the store's sequence, then writes the record unless the key
    /// holds one by then ([`insert_new`](crate::store::Table::insert_new): one atomic write, no
    /// transaction that could conflict and run again). Appends share no row, so of two at once
    /// only two of one key meet, and one of them is handed the other's record. The number is
    /// taken before the write, so a `seq` is higher than that of every append that returned
    /// before this one began, on any replica; the number of the append that lost such a race,
    /// or whose write failed, is never used (a gap).
    fn call(&self, call: &ToolCall) -> Result<Json, ToolError> {
        let storage = |e: StoreError| ToolError::Storage(e.to_string());
        let stored = |first: Vec<u8>| {
            // A stored receipt is answered as it is; one that does not decode is an error.
            serde_json::from_slice(&first).map_err(|e| ToolError::Storage(e.to_string()))
        };
        let key = call.idempotency_key.as_bytes();
        let ledger = self.store.tree(T::Ledger);
        if let Some(first) = ledger.get(key).map_err(storage)? {
            return stored(first);
        }
        let entry = call
            .args
            .get("entry")
            .cloned()
            .unwrap_or_else(|| call.args.clone());
        let seq = self.store.next_in(Sequence::Ledger).map_err(storage)?;
        let receipt = json!({
            "key": call.idempotency_key,
            "seq": seq,
            "entry": entry,
        });
        let bytes = serde_json::to_vec(&receipt).map_err(|e| ToolError::Storage(e.to_string()))?;
        match ledger.insert_new(key, bytes).map_err(storage)? {
            None => Ok(receipt),
            Some(first) => stored(first),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(ledger: &LedgerTool, key: &str) -> Json {
        let call = ToolCall {
            tool: "ledger.append".into(),
            args: json!({"entry": key}),
            run_id: "run".into(),
            tool_call_id: key.into(),
            idempotency_key: format!("run:{key}"),
        };
        ledger.call(&call).unwrap()
    }

    /// On the embedded store too, the sequence is kept in the store: it goes on past a reopen
    /// and past the receipts a ledger without the sequence's row holds (one written when each
    /// process counted its records).
    #[test]
    fn seq_goes_on_across_a_reopen_and_past_receipts_written_before_it_had_a_row() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path(), 1 << 20).unwrap();
            let old = json!({"key": "run:old", "seq": 41, "entry": "old"});
            store
                .tree(T::Ledger)
                .insert_new("run:old", serde_json::to_vec(&old).unwrap())
                .unwrap();
            let ledger = LedgerTool::new(store).unwrap();
            assert_eq!(append(&ledger, "a")["seq"], 42);
            assert_eq!(append(&ledger, "b")["seq"], 43);
            let first = append(&ledger, "a");
            assert_eq!((first["seq"].clone(), ledger.count()), (json!(42), 3));
        }
        // The store closed above may still be letting go of its files.
        let reopened = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(Store::open_waiting(
                dir.path(),
                1 << 20,
                std::time::Duration::from_secs(10),
            ))
            .unwrap();
        let ledger = LedgerTool::new(reopened).unwrap();
        assert_eq!(append(&ledger, "c")["seq"], 44);
    }
}
