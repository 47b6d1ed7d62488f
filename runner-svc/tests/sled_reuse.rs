//! The runner's sled writes its log to the page cache only, and may reuse a log segment only once
//! sled's periodic flusher has `fsync`ed the pages moved out of it (vendored sled change 5). This
//! checks the other half of that bargain: segments do get reused, so a store that keeps
//! overwriting the same records keeps a bounded file, and everything reads back after a reopen.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use arbor_runner_svc::store::{Store, T};

/// Records overwritten again and again: 2 MiB live.
const KEYS: usize = 64;
const VALUE_BYTES: usize = 32 << 10;
/// Passes over every key: 192 MiB written in all, 24 times sled's 8 MiB segment.
const PASSES: usize = 96;

fn value(key: usize, pass: usize) -> Vec<u8> {
    let mut v = vec![(key * 31 + pass) as u8; VALUE_BYTES];
    v[..16].copy_from_slice(&[key as u64, pass as u64].map(u64::to_be_bytes).concat());
    v
}

fn db_file_bytes(dir: &std::path::Path) -> u64 {
    std::fs::metadata(dir.join("db")).unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwritten_records_keep_the_sled_file_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), 16 << 20).unwrap();
    let mut largest = 0;
    for pass in 0..PASSES {
        for key in 0..KEYS {
            let v = value(key, pass);
            store
                .transact(|t| {
                    t.tree(T::Ledger)
                        .insert(format!("reuse-{key:03}").as_bytes(), v.as_slice())?;
                    Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
                })
                .unwrap();
        }
        store.durable().await.unwrap();
        // Give sled's flusher (every 500 ms) passes to relocate live pages and sync.
        if pass % 4 == 3 {
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        largest = largest.max(db_file_bytes(dir.path()));
    }
    let written = (PASSES * KEYS * VALUE_BYTES) as u64;
    // Without reuse the file holds everything ever written (192 MiB and more); with it, the live
    // 2 MiB plus the segments not yet cleaned.
    assert!(
        largest < written / 2,
        "sled's file reached {} MiB for {} MiB written: segments are not being reused",
        largest >> 20,
        written >> 20
    );
    drop(store);
    // The store's threads let go of sled's file lock a moment after the last handle is dropped.
    let store = Store::open_waiting(dir.path(), 16 << 20, Duration::from_secs(10))
        .await
        .unwrap();
    for key in 0..KEYS {
        let got = store
            .tree(T::Ledger)
            .get(format!("reuse-{key:03}").as_bytes())
            .unwrap()
            .unwrap();
        assert!(
            got.as_ref() == value(key, PASSES - 1).as_slice(),
            "key {key}"
        );
    }
}
