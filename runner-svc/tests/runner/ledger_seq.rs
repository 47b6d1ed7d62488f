//! The ledger's `seq` on both backends beyond the replicas' race (`postgres_races::ledger`):
//! on the embedded store, appends at once and across a reopen get distinct `seq`s, each above
//! those of the appends that returned before it began; and a ledger the previous release wrote
//! (its sequence in the `meta` row `ledger_seq`), or one from before that row existed (only
//! receipts), goes on above every record it holds.

#![allow(clippy::unwrap_used)]

use std::{
    sync::{Arc, atomic::AtomicUsize},
    time::Duration,
};

use arbor_runner_svc::{
    engine::{LedgerTool, Tool},
    store::{Store, T},
};
use serde_json::json;

use crate::{
    common,
    postgres_races::ledger::{call, check, round},
};

/// The embedded store in `dir`, from any thread (the previous handle may still be letting go).
fn open_sled(dir: &std::path::Path) -> Store {
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(Store::open_waiting(&dir, 16 << 20, Duration::from_secs(10)))
            .unwrap()
    })
    .join()
    .unwrap()
}

#[test]
fn appends_at_once_on_the_embedded_store_get_distinct_seqs_in_the_order_they_began_across_a_reopen()
{
    let dir = tempfile::tempdir().unwrap();
    let returned = Arc::new(AtomicUsize::new(0));
    let ledger = LedgerTool::new(open_sled(dir.path())).unwrap();
    let mut seen = round(&[ledger.clone(), ledger.clone()], 0, &returned);
    drop(ledger);
    let ledger = LedgerTool::new(open_sled(dir.path())).unwrap();
    seen.extend(round(&[ledger.clone(), ledger.clone()], 1, &returned));
    check(&seen);
    assert_eq!(ledger.count(), seen.len());
}

/// A receipt as the previous releases wrote it.
fn old_receipt(seq: u64) -> Vec<u8> {
    serde_json::to_vec(&json!({"key": format!("old:{seq}"), "seq": seq, "entry": "old"})).unwrap()
}

/// The `seq` of a new append on `ledger`.
fn next_seq(ledger: &LedgerTool, key: &str) -> u64 {
    ledger.call(&call(key)).unwrap()["seq"].as_u64().unwrap()
}

#[test]
fn an_embedded_ledger_of_the_previous_release_goes_on_above_its_row_and_receipts() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open_sled(dir.path());
        let ledger = store.tree(T::Ledger);
        ledger.insert_new("old:40", old_receipt(40)).unwrap();
        ledger.insert_new("old:41", old_receipt(41)).unwrap();
        // The row: the last seq the previous release wrote (the receipts may lag behind it).
        store
            .tree(T::Meta)
            .insert_new("ledger_seq", 45u64.to_be_bytes())
            .unwrap();
    }
    let ledger = LedgerTool::new(open_sled(dir.path())).unwrap();
    assert_eq!(next_seq(&ledger, "new-0"), 46);
    assert_eq!(next_seq(&ledger, "new-1"), 47);
    assert_eq!(ledger.count(), 4);
}

/// A database of the runner's schema as the previous release left it: no ledger sequence,
/// schema version 3, and `sql` run on it (its ledger).
fn previous_release_database(name: &str, sql: &str) -> String {
    let cluster = arbor_testkit::PgCluster::shared();
    let url = cluster.fresh_database(name);
    drop(common::open_postgres(&url));
    let undo = "DROP SEQUENCE runner_ledger_seq;
        UPDATE arbor_schema SET version = 3 WHERE component = 'runner';";
    cluster.psql(&url, &format!("{undo}{sql}")).unwrap();
    url
}

/// `INSERT` of the receipts `seqs` (as the previous releases wrote them) into the ledger table.
fn insert_receipts(seqs: &[u64]) -> String {
    seqs.iter()
        .map(|seq| {
            let receipt = String::from_utf8(old_receipt(*seq)).unwrap();
            format!(
                "INSERT INTO runner_kv (t, k, v) VALUES ({}, 'old:{seq}'::bytea, convert_to('{receipt}', 'UTF8'));",
                T::Ledger as i16
            )
        })
        .collect()
}

#[test]
fn a_postgres_ledger_of_the_previous_release_goes_on_above_its_row_on_every_replica() {
    let row = format!(
        "INSERT INTO runner_kv (t, k, v) VALUES ({}, 'ledger_seq'::bytea, '\\x{}'::bytea);",
        T::Meta as i16,
        hex(45)
    );
    let url = previous_release_database(
        "ledger_previous",
        &format!("{row}{}", insert_receipts(&[40, 41])),
    );
    let (one, two) = (
        LedgerTool::new(common::open_postgres(&url)).unwrap(),
        LedgerTool::new(common::open_postgres(&url)).unwrap(),
    );
    assert_eq!(next_seq(&one, "new-0"), 46);
    assert_eq!(next_seq(&two, "new-1"), 47);
    assert_eq!(one.count(), 4);
}

#[test]
fn a_postgres_ledger_from_before_the_row_goes_on_above_its_receipts() {
    let url = previous_release_database("ledger_before_row", &insert_receipts(&[7, 52, 30]));
    let ledger = LedgerTool::new(common::open_postgres(&url)).unwrap();
    assert_eq!(next_seq(&ledger, "new-0"), 53);
    // Opened again: the sequence goes on; the receipts are not what it goes by any more.
    let again = LedgerTool::new(common::open_postgres(&url)).unwrap();
    assert_eq!(next_seq(&again, "new-1"), 54);
}

/// `n` as 16 hex digits: the 8 big-endian bytes a counter row holds.
fn hex(n: u64) -> String {
    format!("{n:016x}")
}
