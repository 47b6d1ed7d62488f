//! The storage seam's own contract (`store::Backend` behind `store::Store`), on each backend:
//! what the mailbox, the run log and the ledger rest on, checked without them. Claimers'
//! `lock_first` pass over what another holds, counters sum every `add`, durable commits are
//! answered in the order they committed, read-modify-writes racing on one key lose no update,
//! scans page by key within prefix bounds, and `insert_new` never overwrites. Races on the
//! ledger's `insert_new` and reads of several keys at once are in `store_races`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::BTreeSet,
    sync::{Arc, Barrier, Mutex},
};

use arbor_runner_svc::store::{Abort, Commit, Store, T, TxError};

use crate::common::Backend;

/// The number a value holds (absent: 0).
fn number(value: Option<Vec<u8>>) -> u64 {
    value.map_or(0, |v| u64::from_be_bytes(v.try_into().unwrap()))
}

/// One read-modify-write of `key`: reads the number it holds, writes it plus one, and answers
/// the number read.
fn increment(store: &Store, key: &'static [u8]) -> u64 {
    store
        .transact(|t| {
            let n = number(t.tree(T::Meta).get(key)?);
            t.tree(T::Meta).insert(key, (n + 1).to_be_bytes())?;
            Ok::<_, Abort<()>>(n)
        })
        .unwrap()
}

/// Within one transaction: `lock_first` answers the first `limit` keys present, in key order,
/// passing over keys that are absent and keys the transaction deleted, with the values as the
/// transaction sees them.
pub fn lock_first_takes_the_first_present_keys_as_the_transaction_sees_them(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    store
        .transact(|t| {
            for key in [b"k1", b"k2", b"k3", b"k4", b"k5"] {
                t.tree(T::Queue).insert(key, b"queued")?;
            }
            Ok::<_, Abort<()>>(())
        })
        .unwrap();
    let keys: Vec<Vec<u8>> = ["k0", "k1", "k2", "k3", "k4", "k5"]
        .iter()
        .map(|k| k.as_bytes().to_vec())
        .collect();
    let taken = store
        .transact(|t| {
            t.tree(T::Queue).remove(b"k1")?;
            t.tree(T::Queue).insert(b"k3", b"changed")?;
            Ok::<_, Abort<()>>((
                t.tree(T::Queue).lock_first(&keys, 2)?,
                t.tree(T::Queue).lock_first(&keys, 0)?,
            ))
        })
        .unwrap();
    let entry = |k: &str, v: &str| (k.as_bytes().to_vec(), v.as_bytes().to_vec());
    assert_eq!(taken.0, vec![entry("k2", "queued"), entry("k3", "changed")]);
    assert_eq!(taken.1, Vec::new(), "a limit of 0 takes nothing");
}

/// Claimers racing for the same candidates (found by a scan outside their transactions, as the
/// mailbox finds them) each take the first one nobody else holds and delete it: every candidate
/// is taken exactly once, and no claimer fails.
pub fn racing_claimers_take_every_candidate_once(b: Backend) {
    const CANDIDATES: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    store
        .transact(|t| {
            for i in 0..CANDIDATES {
                t.tree(T::Queue).insert(format!("c{i:04}"), b"")?;
            }
            Ok::<_, Abort<()>>(())
        })
        .unwrap();
    let start = Arc::new(Barrier::new(8));
    let claimers: Vec<_> = (0..8)
        .map(|_| {
            let (store, start) = (store.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut mine = Vec::new();
                loop {
                    let candidates: Vec<Vec<u8>> = store
                        .tree(T::Queue)
                        .iter()
                        .keys()
                        .take(16)
                        .collect::<Result<_, _>>()
                        .unwrap();
                    if candidates.is_empty() {
                        return mine;
                    }
                    let taken = store
                        .transact(|t| {
                            let taken = t.tree(T::Queue).lock_first(&candidates, 1)?;
                            for (key, _) in &taken {
                                t.tree(T::Queue).remove(key)?;
                            }
                            Ok::<_, Abort<()>>(taken)
                        })
                        .unwrap();
                    mine.extend(taken.into_iter().map(|(key, _)| key));
                }
            })
        })
        .collect();
    let taken: Vec<Vec<u8>> = claimers
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    let once: BTreeSet<_> = taken.iter().cloned().collect();
    assert_eq!(
        taken.len(),
        CANDIDATES,
        "a candidate was taken twice or lost"
    );
    assert_eq!(once.len(), CANDIDATES);
    assert_eq!(store.tree(T::Queue).iter().count(), 0);
}

/// A counter is the sum of every committed `add` (several in one transaction included), an
/// aborted transaction's adds are not in it, and an absent counter reads 0; adders racing on
/// one counter lose nothing.
pub fn a_counter_sums_every_committed_add(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    assert_eq!(store.tree(T::Meta).counter(b"hits").unwrap(), 0);
    let start = Arc::new(Barrier::new(4));
    let adders: Vec<_> = (0..4)
        .map(|w| {
            let (store, start) = (store.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for i in 0..50 {
                    store
                        .transact(|t| {
                            t.tree(T::Meta).add(b"hits", 3)?;
                            t.tree(T::Meta).add(b"hits", -1)?;
                            Ok::<_, Abort<()>>(())
                        })
                        .unwrap();
                    let aborted = store.transact(|t| {
                        t.tree(T::Meta).add(b"hits", 1000)?;
                        Err::<(), _>(Abort::Domain(format!("{w}-{i}")))
                    });
                    assert!(matches!(aborted, Err(TxError::Abort(_))));
                }
            })
        })
        .collect();
    for a in adders {
        a.join().unwrap();
    }
    assert_eq!(store.tree(T::Meta).counter(b"hits").unwrap(), 4 * 50 * 2);
    assert_eq!(store.tree(T::Meta).counter(b"other").unwrap(), 0);
}

/// Durable commits racing on one key (each reads a number and writes it plus one) are answered
/// in the order they committed: the `in_order` step of each sees the numbers in sequence. Once
/// a commit is answered, any read sees its write.
pub async fn durable_commits_are_answered_in_commit_order_and_then_read(b: Backend) {
    const COMMITS: u64 = 64;
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    let answered = Arc::new(Mutex::new(Vec::new()));
    let commits: Vec<_> = (0..COMMITS)
        .map(|_| {
            let (store, answered) = (store.clone(), answered.clone());
            tokio::spawn(async move {
                let in_order = move |n: &mut u64| answered.lock().unwrap().push(*n);
                store
                    .commit_in_order(
                        Vec::new(),
                        Commit::Durable,
                        |t| {
                            let n = number(t.tree(T::Meta).get(b"seq")?);
                            t.tree(T::Meta).insert(b"seq", (n + 1).to_be_bytes())?;
                            Ok::<_, Abort<()>>(n)
                        },
                        in_order,
                    )
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut read: Vec<u64> = Vec::new();
    for c in commits {
        read.push(c.await.unwrap());
    }
    read.sort_unstable();
    assert_eq!(read, (0..COMMITS).collect::<Vec<_>>(), "an update was lost");
    assert_eq!(
        *answered.lock().unwrap(),
        (0..COMMITS).collect::<Vec<_>>(),
        "commits were answered out of their commit order"
    );
    for i in 0..20u64 {
        store
            .commit(move |t| {
                t.tree(T::Runs).insert(b"latest", i.to_be_bytes())?;
                Ok::<_, Abort<()>>(())
            })
            .await
            .unwrap();
        assert_eq!(number(store.tree(T::Runs).get(b"latest").unwrap()), i);
    }
}

/// Read-modify-writes of one key racing from threads (single transactions) and from tasks
/// (serialisable batched commits): whatever conflicts they meet, each is retried and none is
/// lost, and each read a number nobody else read.
pub async fn racing_read_modify_writes_lose_no_update(b: Backend) {
    const EACH: u64 = 100;
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || {
                (0..EACH)
                    .map(|_| increment(&store, b"n"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut read = Vec::new();
                for _ in 0..EACH {
                    let n = store
                        .commit_as(Vec::new(), Commit::Serializable, |t| {
                            let n = number(t.tree(T::Meta).get(b"n")?);
                            t.tree(T::Meta).insert(b"n", (n + 1).to_be_bytes())?;
                            Ok::<_, Abort<()>>(n)
                        })
                        .await
                        .unwrap();
                    read.push(n);
                }
                read
            })
        })
        .collect();
    let mut read: Vec<u64> = Vec::new();
    for t in tasks {
        read.extend(t.await.unwrap());
    }
    for t in threads {
        read.extend(t.join().unwrap());
    }
    assert_eq!(number(store.tree(T::Meta).get(b"n").unwrap()), 4 * EACH);
    read.sort_unstable();
    assert_eq!(read, (0..4 * EACH).collect::<Vec<_>>());
}

/// Scans: a prefix's entries and nothing beyond it (keys ending in 0xff bytes included), in key
/// order; pages taken from a key on, each after the last key of the one before, add up to the
/// whole table; the last entry of a prefix.
pub fn scans_page_by_key_within_prefix_bounds(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    // In key order.
    let keys: Vec<Vec<u8>> = vec![
        b"a".to_vec(),
        b"a\x00".to_vec(),
        b"a\x001".to_vec(),
        b"a\x002".to_vec(),
        b"ab".to_vec(),
        b"a\xff".to_vec(),
        b"a\xff\xff".to_vec(),
        b"b".to_vec(),
        b"b\x00".to_vec(),
    ];
    store
        .transact(|t| {
            // Written out of order: the order of a scan is the keys'.
            for key in keys.iter().rev() {
                t.tree(T::Runs)
                    .insert(key, [b"v-", key.as_slice()].concat())?;
            }
            Ok::<_, Abort<()>>(())
        })
        .unwrap();
    let scan_keys = |entries: arbor_runner_svc::store::Entries<'static>| -> Vec<Vec<u8>> {
        entries.keys().collect::<Result<_, _>>().unwrap()
    };
    let with = |prefix: &[u8]| -> Vec<Vec<u8>> {
        keys.iter()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    };
    for prefix in [&b"a"[..], b"a\x00", b"a\xff", b"a\xff\xff", b"b", b"c", b""] {
        let got = scan_keys(store.tree(T::Runs).scan_prefix(prefix));
        assert_eq!(got, with(prefix), "prefix {prefix:?}");
        let last = store.tree(T::Runs).last_with_prefix(prefix).unwrap();
        let want = with(prefix)
            .last()
            .map(|k| (k.clone(), [b"v-", k.as_slice()].concat()));
        assert_eq!(last, want, "last of prefix {prefix:?}");
    }
    assert_eq!(
        scan_keys(store.tree(T::Runs).range_from(b"a\x002")),
        keys[3..].to_vec()
    );
    assert_eq!(
        scan_keys(store.tree(T::Runs).after(b"a\x002")),
        keys[4..].to_vec()
    );
    for page_size in [1, 2, 4, 100] {
        let (mut pages, mut last) = (Vec::new(), Vec::new());
        loop {
            let page = scan_keys(match last.is_empty() {
                true => store.tree(T::Runs).range_from_wanting(b"", page_size),
                false => store
                    .tree(T::Runs)
                    .range_from_wanting([last.as_slice(), &[0]].concat(), page_size),
            });
            let page: Vec<_> = page.into_iter().take(page_size).collect();
            let Some(end) = page.last() else { break };
            last = end.clone();
            pages.extend(page);
        }
        assert_eq!(pages, keys, "pages of {page_size}");
    }
}

/// `insert_new` writes a key only if it is absent; otherwise it answers the value already held
/// (whoever wrote it) and writes nothing.
pub fn insert_new_writes_only_an_absent_key(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    let ledger = store.tree(T::Ledger);
    assert_eq!(ledger.insert_new(b"r1", b"first").unwrap(), None);
    assert_eq!(
        ledger.insert_new(b"r1", b"second").unwrap(),
        Some(b"first".to_vec())
    );
    assert_eq!(ledger.get(b"r1").unwrap(), Some(b"first".to_vec()));
    store
        .transact(|t| {
            t.tree(T::Ledger).insert(b"r2", b"written")?;
            Ok::<_, Abort<()>>(())
        })
        .unwrap();
    assert_eq!(
        ledger.insert_new(b"r2", b"new").unwrap(),
        Some(b"written".to_vec())
    );
    assert_eq!(ledger.get(b"r2").unwrap(), Some(b"written".to_vec()));
    assert_eq!(ledger.iter().count(), 2);
}

/// Ids handed out by `next_id` to racing callers are all different.
pub fn next_id_never_hands_out_an_id_twice(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = b.open_store(dir.path());
    let takers: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || {
                (0..100)
                    .map(|_| store.next_id().unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let ids: Vec<u64> = takers.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let once: BTreeSet<_> = ids.iter().collect();
    assert_eq!(once.len(), ids.len(), "an id was handed out twice");
}
