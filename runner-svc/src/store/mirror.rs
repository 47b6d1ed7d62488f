//! In-memory copies of the three small trees a claim looks at before its transaction: the queue,
//! the claimed job of each thread (`active`) and each thread's generation (`mailboxes`).
//!
//! Every worker looks for claim candidates before each claim. Reading them from sled took one
//! sled read per queue entry and two per candidate, each under sled's global concurrency lock,
//! which the committer holds exclusively while a batch's writes go in: the mailbox bench measured
//! 60–140 µs per look, mostly spent waiting for that lock on one of the runtime's threads. The
//! mirror is read under a lock of its own that the committer holds only for the few map updates
//! of each transaction.
//!
//! **How it stays exact.** Every write to these trees is made by a journaled transaction
//! ([`super::AllTrees::run`]), which records it. Once the sled transaction has committed, and
//! while the journal's order lock is still held, the record's writes to these trees are applied
//! here, so the mirror sees transactions whole and in commit order. At open, after journal
//! replay, it is loaded from sled.
//!
//! **What it may be used for.** Choosing candidates and telling an idle worker when to look
//! again. For a moment after each commit sled is ahead of the mirror, so the claim transaction
//! checks everything again against sled; a candidate that is out of date only costs a lost try.
//!
//! **Memory.** One entry per queued job (its queue key and value, ~60 bytes plus the map's
//! overhead), per thread with a claimed job and per interrupted thread.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{RwLock, RwLockReadGuard},
};

use arbor_shared::journal::Recorded;

use super::{T, codec};

const QUEUE: u8 = T::Queue as u8;
const ACTIVE: u8 = T::Active as u8;
const MAILBOXES: u8 = T::Mailboxes as u8;

/// The mirrored trees, as plain maps.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Maps {
    /// `queue`: claim-ordered key → what the claim scan needs of the job.
    pub queue: BTreeMap<Vec<u8>, Vec<u8>>,
    /// `active`: thread → its claimed job.
    pub active: HashMap<Vec<u8>, Vec<u8>>,
    /// `mailboxes`: thread → its generation.
    pub mailboxes: HashMap<Vec<u8>, Vec<u8>>,
}

impl Maps {
    fn map(&mut self, tree: u8) -> Option<&mut dyn MapLike> {
        match tree {
            QUEUE => Some(&mut self.queue),
            ACTIVE => Some(&mut self.active),
            MAILBOXES => Some(&mut self.mailboxes),
            _ => None,
        }
    }

    /// The value of `key` in mirrored tree `tree`; `None` if that tree is not mirrored.
    pub fn get(&self, tree: T, key: &[u8]) -> Option<Option<&[u8]>> {
        let value = match tree {
            T::Queue => self.queue.get(key),
            T::Active => self.active.get(key),
            T::Mailboxes => self.mailboxes.get(key),
            _ => return None,
        };
        Some(value.map(Vec::as_slice))
    }

    /// A thread's generation (0 until its first interrupt).
    pub fn generation(&self, mailbox_id: &[u8]) -> u64 {
        self.mailboxes
            .get(mailbox_id)
            .map_or(0, |v| codec::read_u64(v))
    }
}

trait MapLike {
    fn put(&mut self, key: &[u8], value: Option<&[u8]>);
}

impl MapLike for BTreeMap<Vec<u8>, Vec<u8>> {
    fn put(&mut self, key: &[u8], value: Option<&[u8]>) {
        match value {
            Some(v) => self.insert(key.to_vec(), v.to_vec()),
            None => self.remove(key),
        };
    }
}

impl MapLike for HashMap<Vec<u8>, Vec<u8>> {
    fn put(&mut self, key: &[u8], value: Option<&[u8]>) {
        match value {
            Some(v) => self.insert(key.to_vec(), v.to_vec()),
            None => self.remove(key),
        };
    }
}

/// The mirror of one store.
#[derive(Debug, Default)]
pub struct Mirror(RwLock<Maps>);

impl Mirror {
    /// Loads the mirrored trees from sled. `fill` gives the value of a queue entry written by a
    /// store from before entries had values (from its job record), or `None` to keep it empty.
    pub fn load(
        trees: &[sled::Tree],
        fill: impl Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<Self, sled::Error> {
        let mut maps = Maps::default();
        for entry in trees[T::Queue as usize].iter() {
            let (k, v) = entry?;
            let v = match v.is_empty() {
                true => fill(&k).unwrap_or_default(),
                false => v.to_vec(),
            };
            maps.queue.insert(k.to_vec(), v);
        }
        for entry in trees[T::Active as usize].iter() {
            let (k, v) = entry?;
            maps.active.insert(k.to_vec(), v.to_vec());
        }
        for entry in trees[T::Mailboxes as usize].iter() {
            let (k, v) = entry?;
            maps.mailboxes.insert(k.to_vec(), v.to_vec());
        }
        Ok(Self(RwLock::new(maps)))
    }

    /// Applies a committed transaction's writes to the mirrored trees.
    pub fn apply(&self, record: &Recorded) {
        let mut maps = None;
        for w in record.writes().flatten() {
            if !matches!(w.tree, QUEUE | ACTIVE | MAILBOXES) {
                continue;
            }
            let maps = maps.get_or_insert_with(|| {
                self.0
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            });
            if let Some(map) = maps.map(w.tree) {
                map.put(w.key, w.value);
            }
        }
    }

    /// The mirrored trees as they stand; hold the guard briefly (the committer waits for it).
    pub fn read(&self) -> RwLockReadGuard<'_, Maps> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
