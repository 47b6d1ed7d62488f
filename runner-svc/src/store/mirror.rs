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
    collections::BTreeMap,
    sync::{RwLock, RwLockReadGuard},
};

use arbor_shared::journal::Recorded;

use super::{T, codec};

/// The trees mirrored.
const MIRRORED: [T; 3] = [T::Queue, T::Active, T::Mailboxes];

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

/// The mirrored trees, as plain maps.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Maps {
    /// `queue`: claim-ordered key → what the claim scan needs of the job.
    pub queue: Map,
    /// `active`: thread → its claimed job.
    pub active: Map,
    /// `mailboxes`: thread → its generation.
    pub mailboxes: Map,
}

impl Maps {
    fn map(&self, tree: u8) -> Option<&Map> {
        match tree {
            t if t == T::Queue as u8 => Some(&self.queue),
            t if t == T::Active as u8 => Some(&self.active),
            t if t == T::Mailboxes as u8 => Some(&self.mailboxes),
            _ => None,
        }
    }

    fn map_mut(&mut self, tree: u8) -> Option<&mut Map> {
        match tree {
            t if t == T::Queue as u8 => Some(&mut self.queue),
            t if t == T::Active as u8 => Some(&mut self.active),
            t if t == T::Mailboxes as u8 => Some(&mut self.mailboxes),
            _ => None,
        }
    }

    /// The value of `key` in mirrored tree `tree`; `None` if that tree is not mirrored.
    pub fn get(&self, tree: T, key: &[u8]) -> Option<Option<&[u8]>> {
        self.map(tree as u8).map(|m| m.get(key).map(Vec::as_slice))
    }

    /// A thread's generation (0 until its first interrupt).
    pub fn generation(&self, mailbox_id: &[u8]) -> u64 {
        self.mailboxes
            .get(mailbox_id)
            .map_or(0, |v| codec::read_u64(v))
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
        for tree in MIRRORED {
            let Some(map) = maps.map_mut(tree as u8) else {
                continue;
            };
            for entry in trees[tree as usize].iter() {
                let (k, v) = entry?;
                let v = match tree == T::Queue && v.is_empty() {
                    true => fill(&k).unwrap_or_default(),
                    false => v.to_vec(),
                };
                map.insert(k.to_vec(), v);
            }
        }
        Ok(Self(RwLock::new(maps)))
    }

    /// Applies a committed transaction's writes to the mirrored trees.
    pub fn apply(&self, record: &Recorded) {
        let mut maps = None;
        for w in record.writes().flatten() {
            if !MIRRORED.iter().any(|t| *t as u8 == w.tree) {
                continue;
            }
            let maps = maps.get_or_insert_with(|| {
                self.0
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            });
            if let Some(map) = maps.map_mut(w.tree) {
                match w.value {
                    Some(v) => map.insert(w.key.to_vec(), v.to_vec()),
                    None => map.remove(w.key),
                };
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
