//! Races on the storage seam's own operations: what the ledger's exactly-once rests on; what
//! a read of several keys at once answers; and what a body of a batched commit reads.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::{self, Backend};

use std::sync::{Arc, Barrier};

use arbor_runner_svc::store::{Abort, T, TxError};

/// Sixteen callers write one new key at once with different values: exactly one writes, every
/// other one is handed the winner's value, and the winner's value is what stays.
pub fn of_racing_writers_of_a_new_key_one_wins_and_the_others_get_its_value(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    for round in 0..20 {
        let key = format!("receipt-{round}");
        let start = Arc::new(Barrier::new(16));
        let racers: Vec<_> = (0..16)
            .map(|i| {
                let (store, start, key) = (store.clone(), start.clone(), key.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let mine = format!("value-{i}");
                    let held = store.tree(T::Ledger).insert_new(&key, &mine).unwrap();
                    (mine, held)
                })
            })
            .collect();
        let outcomes: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
        let winners: Vec<_> = outcomes.iter().filter(|(_, held)| held.is_none()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        let won = winners[0].0.as_bytes().to_vec();
        for (mine, held) in &outcomes {
            if let Some(held) = held {
                assert_eq!(held, &won, "round {round}: {mine} was handed another value");
            }
        }
        assert_eq!(store.tree(T::Ledger).get(&key).unwrap(), Some(won));
    }
}

/// Writers of different new keys at once never hold each other up or lose a write.
pub fn racing_writers_of_different_keys_all_write(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    let start = Arc::new(Barrier::new(8));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (store, start) = (store.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for i in 0..50 {
                    let key = format!("key-{w}-{i}");
                    assert_eq!(store.tree(T::Ledger).insert_new(&key, &key).unwrap(), None);
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let stored = store.tree(T::Ledger).iter().count();
    assert_eq!(stored, 400);
}

/// A read of several keys answers each key's value, in the order asked, across tables, with
/// `None` for a key that is absent or deleted, as reading them one by one would.
pub fn a_read_of_several_keys_answers_each_in_the_order_asked(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    store
        .transact(|t| {
            t.tree(T::Runs).insert(b"run-1", b"record")?;
            t.tree(T::Checkpoints).insert(b"run-1", b"checkpoint")?;
            t.tree(T::Ledger).insert(b"gone", b"soon")?;
            Ok::<_, arbor_runner_svc::store::Abort<()>>(())
        })
        .unwrap();
    store
        .transact(|t| {
            t.tree(T::Ledger).remove(b"gone")?;
            Ok::<_, arbor_runner_svc::store::Abort<()>>(())
        })
        .unwrap();
    let keys: [(T, &[u8]); 5] = [
        (T::Checkpoints, b"run-1"),
        (T::Runs, b"run-2"),
        (T::Runs, b"run-1"),
        (T::Ledger, b"gone"),
        (T::Checkpoints, b"run-1"),
    ];
    let read = store.get_many(&keys).unwrap();
    let one_by_one: Vec<_> = keys
        .iter()
        .map(|(t, k)| store.tree(*t).get(k).unwrap())
        .collect();
    let value = |v: &[u8]| Some(v.to_vec());
    assert_eq!(
        read,
        vec![
            value(b"checkpoint"),
            None,
            value(b"record"),
            None,
            value(b"checkpoint")
        ]
    );
    assert_eq!(read, one_by_one);
    assert_eq!(store.get_many(&[]).unwrap(), Vec::<Option<Vec<u8>>>::new());
}

/// A scan told how many entries its caller wants answers the same entries, in the same order,
/// whatever the number: fewer or more than there are, or than a page holds.
pub fn a_scan_told_how_many_are_wanted_answers_the_same_entries(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    store
        .transact(|t| {
            for i in (0..700u32).rev() {
                t.tree(T::Ledger).insert(i.to_be_bytes(), i.to_le_bytes())?;
            }
            Ok::<_, arbor_runner_svc::store::Abort<()>>(())
        })
        .unwrap();
    let ledger = store.tree(T::Ledger);
    let collect = |entries: arbor_runner_svc::store::Entries<'static>| -> Vec<_> {
        entries.collect::<Result<_, _>>().unwrap()
    };
    let every = collect(ledger.iter());
    assert_eq!(every.len(), 700);
    assert_eq!(collect(ledger.all()), every);
    let from = 5u32.to_be_bytes();
    for wanted in [0, 1, 16, 17, 695, 696, 10_000] {
        assert_eq!(
            collect(ledger.range_from_wanting(from, wanted)),
            every[5..],
            "wanted {wanted}"
        );
        let taken: Vec<_> = ledger
            .range_from_wanting(from, wanted)
            .take(wanted)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(taken, every[5..(5 + wanted).min(700)], "wanted {wanted}");
    }
}

/// Reading keys together with the entries under a prefix answers what reading them apart
/// would: each key's value in the order asked, and every entry under the prefix (not those of
/// a key that merely starts alike, not a deleted one), in key order.
pub fn keys_read_with_a_prefix_answer_as_read_apart(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    store
        .transact(|t| {
            t.tree(T::Runs).insert(b"run-1", b"record")?;
            // Written out of key order; "run-10" starts like "run-1" but is another run.
            for key in [
                &b"run-1\0r3"[..],
                b"run-1\0r1",
                b"run-10\0r1",
                b"run-1\0r2",
                b"run-0\0r9",
            ] {
                t.tree(T::Inbox).insert(key, [b"decision ", key].concat())?;
            }
            Ok::<_, arbor_runner_svc::store::Abort<()>>(())
        })
        .unwrap();
    store
        .transact(|t| {
            t.tree(T::Inbox).remove(b"run-1\0r2")?;
            Ok::<_, arbor_runner_svc::store::Abort<()>>(())
        })
        .unwrap();
    let keys: [(T, &[u8]); 3] = [
        (T::Checkpoints, b"run-1"),
        (T::Runs, b"run-1"),
        (T::Runs, b"run-2"),
    ];
    let (values, entries) = store
        .get_many_and_prefix(&keys, T::Inbox, b"run-1\0")
        .unwrap();
    assert_eq!(values, vec![None, Some(b"record".to_vec()), None]);
    let entry = |k: &[u8]| (k.to_vec(), [b"decision ", k].concat());
    assert_eq!(entries, vec![entry(b"run-1\0r1"), entry(b"run-1\0r3")]);
    assert_eq!(values, store.get_many(&keys).unwrap());
    let apart: Vec<_> = store
        .tree(T::Inbox)
        .scan_prefix(b"run-1\0")
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(entries, apart);
    // Nothing under the prefix, no keys.
    assert_eq!(
        store
            .get_many_and_prefix(&[], T::Inbox, b"run-3\0")
            .unwrap(),
        (Vec::new(), Vec::new())
    );
}

/// Commits queued together share one transaction, and a store whose reads are round trips reads
/// the rows they name (`commit_reading`) together, before any of them runs: yet each body reads
/// what the bodies before it in the transaction wrote, deleted, or (one that aborted) left alone.
pub async fn a_body_reads_what_the_bodies_before_it_in_its_batch_left(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    store
        .transact(|t| {
            for key in [b"changed", b"deleted", b"aborted"] {
                t.tree(T::Runs).insert(key, b"before")?;
            }
            Ok::<_, Abort<()>>(())
        })
        .unwrap();
    let reads = |key: &[u8]| vec![(T::Runs, key.to_vec())];
    let write = |key: &'static [u8], value: Option<&'static [u8]>, aborts: bool| {
        store.commit_reading(reads(key), move |t| {
            match value {
                Some(v) => t.tree(T::Runs).insert(key, v)?,
                None => t.tree(T::Runs).remove(key)?,
            }
            match aborts {
                true => Err(Abort::Domain("changed my mind")),
                false => Ok(()),
            }
        })
    };
    let read = |key: &'static [u8]| {
        store.commit_reading(reads(key), move |t| {
            Ok::<_, Abort<&str>>(t.tree(T::Runs).get(key)?)
        })
    };
    let batches = store.stats().batches;
    let seen = common::with_lane_held(&store, async {
        tokio::join!(
            write(b"changed", Some(b"after"), false),
            write(b"deleted", None, false),
            write(b"aborted", Some(b"after"), true),
            read(b"changed"),
            read(b"deleted"),
            read(b"aborted"),
        )
    })
    .await;
    // The held commit, then the six in one transaction; sled runs that transaction again
    // without the body that aborted, PostgreSQL undoes that body's writes within it.
    let transactions = if b == Backend::Postgres { 2 } else { 3 };
    assert_eq!(
        store.stats().batches - batches,
        transactions,
        "the six commits queued behind the held lane did not share a transaction"
    );
    let (changed, deleted, aborted, read_changed, read_deleted, read_aborted) = seen;
    changed.unwrap();
    deleted.unwrap();
    assert!(matches!(aborted, Err(TxError::Abort("changed my mind"))));
    assert_eq!(read_changed.unwrap(), Some(b"after".to_vec()));
    assert_eq!(read_deleted.unwrap(), None);
    assert_eq!(read_aborted.unwrap(), Some(b"before".to_vec()));
}
