//! What delivery holds between attempts: the backlog to send, the decisions in flight, the
//! per-decision retries and their backoffs, and whether the runner is away.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use tokio::time::Instant;

use super::backoff::Backoff;
use crate::model::Approval;

/// An approval whose decision is to be sent, with the `traceparent` it carries on.
pub type Item = (Approval, Option<String>);

/// The runner is away: the backlog waits, and one decision at a time probes it.
#[derive(Debug)]
pub struct Away {
    pub backoff: Backoff,
    /// When the next probe goes out (once none is in flight).
    pub probe_at: Instant,
    /// The approval whose delivery is the probe in flight.
    pub probe: Option<String>,
}

impl Away {
    pub fn new(mut backoff: Backoff) -> Self {
        let probe_at = Instant::now() + backoff.next_delay();
        Self {
            backoff,
            probe_at,
            probe: None,
        }
    }

    /// The probe in flight did not get through: the next one goes after the next backoff step.
    pub fn probe_failed(&mut self) {
        self.probe = None;
        self.probe_at = Instant::now() + self.backoff.next_delay();
    }

    /// Probes again at once (the runner was seen to be back), then at the shortest step.
    pub fn probe_now(&mut self) {
        self.backoff.reset();
        self.probe_at = Instant::now();
    }
}

#[derive(Debug, Default)]
pub struct Book {
    /// The approvals in the backlog or in flight: each is taken once until it is settled.
    pub taken: HashSet<String>,
    pub backlog: VecDeque<Item>,
    /// The backoff of each decision that failed on its own, until it is settled.
    pub backoffs: HashMap<String, Backoff>,
    /// The decisions waiting for their retry (not taken), by when it is due…
    waiting: HashMap<String, Instant>,
    /// …and the same in the order they come due.
    due_order: BTreeSet<(Instant, String)>,
    pub away: Option<Away>,
}

impl Book {
    /// Queues those of `found` that are neither taken nor waiting for their retry.
    pub fn queue(&mut self, found: Vec<Item>) {
        for (approval, trace) in found {
            let id = approval.id();
            if self.taken.contains(id) || self.waiting.contains_key(id) {
                continue;
            }
            self.taken.insert(id.to_string());
            self.backlog.push_back((approval, trace));
        }
    }

    /// `id`, taken until now, is retried at `at`.
    pub fn wait(&mut self, id: String, at: Instant) {
        self.taken.remove(&id);
        if let Some(before) = self.waiting.insert(id.clone(), at) {
            self.due_order.remove(&(before, id.clone()));
        }
        self.due_order.insert((at, id));
    }

    /// The ids whose retry is due by `now`, no longer waiting.
    pub fn due_retries(&mut self, now: Instant) -> Vec<String> {
        let mut due = Vec::new();
        while self.due_order.first().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, id)) = self.due_order.pop_first() {
                self.waiting.remove(&id);
                due.push(id);
            }
        }
        due
    }

    /// When the earliest retry is due.
    pub fn next_retry(&self) -> Option<Instant> {
        self.due_order.first().map(|(at, _)| *at)
    }

    /// After a read of the whole outbox: forgets the retries and backoffs of the decisions it
    /// no longer holds (delivered, consumed or cancelled meanwhile).
    pub fn keep_only(&mut self, outbox: &[Item]) {
        let held: HashSet<&str> = outbox.iter().map(|(a, _)| a.id()).collect();
        let taken = &self.taken;
        self.backoffs
            .retain(|id, _| taken.contains(id) || held.contains(id.as_str()));
        let gone: Vec<(Instant, String)> = self
            .waiting
            .iter()
            .filter(|(id, _)| !held.contains(id.as_str()))
            .map(|(id, at)| (*at, id.clone()))
            .collect();
        for (at, id) in gone {
            self.waiting.remove(&id);
            self.due_order.remove(&(at, id));
        }
    }

    /// Decisions held to send: queued, in flight or waiting for their retry.
    pub fn held(&self) -> usize {
        self.taken.len() + self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn item(id: &str) -> Item {
        (crate::outbox::tests::approval(id), None)
    }

    #[test]
    fn each_is_queued_once_and_not_while_it_waits_for_its_retry() {
        let mut book = Book::default();
        book.queue(vec![item("a"), item("b"), item("a")]);
        assert_eq!(book.backlog.len(), 2);
        let (a, _) = book.backlog.pop_front().unwrap();
        let later = Instant::now() + Duration::from_secs(60);
        book.wait(a.id().to_string(), later);
        assert_eq!(book.held(), 2, "one queued, one waiting");
        book.queue(vec![item("a")]);
        assert_eq!(book.backlog.len(), 1, "a waits for its retry");
        assert!(book.due_retries(Instant::now()).is_empty());
        assert_eq!(book.next_retry(), Some(later));
        assert_eq!(book.due_retries(later), ["a"]);
        assert_eq!(book.next_retry(), None);
        book.queue(vec![item("a")]);
        assert_eq!(book.backlog.len(), 2, "a is due again");
    }

    #[test]
    fn a_new_retry_time_replaces_the_old_one() {
        let mut book = Book::default();
        let now = Instant::now();
        book.wait("a".into(), now + Duration::from_secs(1));
        book.wait("a".into(), now + Duration::from_secs(5));
        assert_eq!(book.held(), 1);
        assert!(book.due_retries(now + Duration::from_secs(2)).is_empty());
        assert_eq!(book.due_retries(now + Duration::from_secs(5)), ["a"]);
    }

    #[test]
    fn a_read_of_the_outbox_forgets_what_left_it() {
        let mut book = Book::default();
        let later = Instant::now() + Duration::from_secs(60);
        for id in ["gone", "kept"] {
            book.backoffs.insert(
                id.into(),
                Backoff::new(Duration::from_millis(1), Duration::from_millis(2)),
            );
            book.wait(id.into(), later);
        }
        book.keep_only(&[item("kept")]);
        assert_eq!(book.held(), 1);
        assert!(book.backoffs.contains_key("kept") && !book.backoffs.contains_key("gone"));
        assert_eq!(book.due_retries(later), ["kept"]);
    }

    #[test]
    fn probes_back_off_and_go_at_once_when_the_runner_is_seen_back() {
        let mut away = Away::new(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(400),
        ));
        for _ in 0..5 {
            away.probe = Some("a".into());
            away.probe_failed();
            assert!(away.probe.is_none());
        }
        let wait = away.probe_at - Instant::now();
        assert!(wait >= Duration::from_millis(190) && wait <= Duration::from_millis(400));
        away.probe_now();
        assert!(away.probe_at <= Instant::now());
    }
}
