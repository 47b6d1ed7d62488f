//! The store's shared sequences ([`Backend::next_in`], [`Backend::raise`]) on both backends:
//! values never repeat (threads taking at once, two stores on one database, a reopen), go up
//! in the order they are taken, and a raise moves them past a floor without ever lowering them.

#![allow(clippy::unwrap_used)]

use std::{collections::BTreeSet, time::Duration};

use super::{Sequence, Store};

/// Runs `f` to completion on a runtime of its own, on a thread of its own (opening a store may
/// wait on the network).
fn blocking<R: Send + 'static>(f: impl std::future::Future<Output = R> + Send + 'static) -> R {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    })
    .join()
    .unwrap()
}

fn open_sled(dir: &std::path::Path) -> Store {
    let dir = dir.to_path_buf();
    blocking(async move { Store::open_waiting(&dir, 1 << 20, Duration::from_secs(10)).await })
        .unwrap()
}

fn open_postgres(url: &str) -> Store {
    let url = url.to_string();
    blocking(async move { Store::open_postgres(&url).await }).unwrap()
}

/// Threads on each of `stores` take values at once: answers every value taken.
fn take_at_once(stores: &[Store], threads: usize, each: usize) -> Vec<u64> {
    let handles: Vec<_> = stores
        .iter()
        .flat_map(|s| (0..threads).map(move |_| s.clone()))
        .map(|store| {
            std::thread::spawn(move || {
                (0..each)
                    .map(|_| store.next_in(Sequence::Ledger).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let taken: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let distinct: BTreeSet<u64> = taken.iter().copied().collect();
    assert_eq!(distinct.len(), taken.len(), "a value was taken twice");
    taken
}

/// What both backends promise, on `stores` (all on one store) and `reopen` (the same store
/// opened again once `stores` are dropped).
fn promises(stores: Vec<Store>, reopen: impl FnOnce() -> Store) {
    let one = &stores[0];
    assert_eq!(one.next_in(Sequence::Ledger).unwrap(), 1);
    assert_eq!(one.next_in(Sequence::Ledger).unwrap(), 2);
    // Taken one after the other, on any of the stores: each above the one before.
    let mut last = 2;
    for store in stores.iter().cycle().take(6) {
        let next = store.next_in(Sequence::Ledger).unwrap();
        assert!(next > last, "{next} taken after {last}");
        last = next;
    }
    one.raise(Sequence::Ledger, 40).unwrap();
    assert_eq!(
        stores[stores.len() - 1].next_in(Sequence::Ledger).unwrap(),
        41
    );
    // A raise to below where it stands changes nothing.
    one.raise(Sequence::Ledger, 10).unwrap();
    assert_eq!(one.next_in(Sequence::Ledger).unwrap(), 42);
    let taken = take_at_once(&stores, 3, 20);
    assert!(taken.iter().all(|&v| v > 42));
    let highest = taken.into_iter().max().unwrap();
    drop(stores);
    let store = reopen();
    assert!(store.next_in(Sequence::Ledger).unwrap() > highest);
}

#[test]
fn the_embedded_stores_sequence_is_shared_raised_and_kept_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_sled(dir.path());
    promises(vec![store.clone(), store], || open_sled(dir.path()));
}

#[test]
fn a_postgres_sequence_is_shared_by_two_stores_raised_and_kept_across_a_reopen() {
    let cluster = arbor_testkit::PgCluster::shared();
    let url = cluster.fresh_database("store_sequence");
    promises(vec![open_postgres(&url), open_postgres(&url)], || {
        open_postgres(&url)
    });
}

/// A raise while other stores take values: none is taken twice, and every value taken after
/// the raise returned is above its floor.
#[test]
fn a_postgres_raise_beside_takers_gives_no_value_twice() {
    let cluster = arbor_testkit::PgCluster::shared();
    let url = cluster.fresh_database("store_sequence_raise");
    let stores = vec![open_postgres(&url), open_postgres(&url)];
    let takers = {
        let stores = stores.clone();
        std::thread::spawn(move || take_at_once(&stores, 2, 50))
    };
    for floor in [100, 200, 300] {
        stores[1].raise(Sequence::Ledger, floor).unwrap();
        assert!(stores[0].next_in(Sequence::Ledger).unwrap() > floor);
    }
    let mut taken = takers.join().unwrap();
    taken.extend(take_at_once(&stores, 1, 5));
    let distinct: BTreeSet<u64> = taken.iter().copied().collect();
    assert_eq!(distinct.len(), taken.len(), "a value was taken twice");
}
