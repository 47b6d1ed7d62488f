//! Wake notifications: what a committed transaction tells the other replicas sharing the
//! database (`NOTIFY`), and how this process listens for theirs.
//!
//! A transaction body declares what it wakes ([`Wake`]); a transaction that committed
//! notifies `arbor_runner_events` for appended events and `arbor_runner_work` for queued jobs
//! and task changes, right after its COMMIT, in the same round trip. Every replica listens and
//! wakes its streams and idle workers. Jobs this process has idle workers for are not
//! announced: its own workers take them, and every other replica's would only race them. A
//! notification is a hint: the runner also looks every second.

use std::sync::{
    Arc, OnceLock,
    atomic::{AtomicUsize, Ordering},
};

use arbor_shared::postgres::{Database, DbError, wait};

use crate::store::{Change, Wake};

/// The channel of appended events.
pub(super) const EVENTS_CHANNEL: &str = "arbor_runner_events";
/// The channel of queued work (jobs, and tasks a task stream may take).
pub(super) const WORK_CHANNEL: &str = "arbor_runner_work";

/// This process, as its transactions' notifications name it.
pub(super) struct Origin {
    /// Hex digits only: it goes into SQL text.
    pub(super) name: String,
    /// The event log it appends to: the oid of its `runner_kv` table.
    pub(super) log: u32,
    /// Its idle workers (see `Backend::idle_workers`); unset: none.
    pub(super) idle: OnceLock<Arc<AtomicUsize>>,
}

impl Origin {
    /// Whether this process has a worker idle for each of `jobs` jobs it queued, which it
    /// wakes itself: then the other replicas are not told (each of theirs would look, and
    /// all but one would find the job taken).
    fn takes(&self, jobs: usize) -> bool {
        self.idle
            .get()
            .is_some_and(|idle| idle.load(Ordering::Relaxed) >= jobs)
    }
}

/// The statements (each after a `;`) that notify the other replicas of what a transaction's
/// bodies declared they wake, to go right after its COMMIT; empty when there is nothing to
/// tell.
///
/// Each notification goes out after the COMMIT, in a transaction of its own: a transaction
/// that notifies holds PostgreSQL's one notification-queue lock from its commit until its WAL
/// flush is done, which would put every notifying commit of every replica in one line, and
/// stop their flushes from being shared. The events' notification says up to which seq they go
/// when the commit is durable (see [`listen`]): sent for a batch that rolled back, it would
/// send the other replicas' streams to read up to seqs nobody committed, where they would find
/// nothing and wait for the log's head to move again; so the caller sends these only once the
/// COMMIT is sure to have kept the writes.
pub(super) fn after_commit(wakes: &[Wake], origin: &Origin, durable: bool) -> String {
    // The last event appended, jobs queued (or re-queued), and whether a task worker's stream
    // may have work.
    let (mut appended, mut queued, mut task_work) = (None, 0, false);
    for wake in wakes {
        match *wake {
            Wake::Events(seq) => appended = appended.max(Some(seq)),
            Wake::Work => queued += 1,
            Wake::Tasks => task_work = true,
        }
    }
    let mut notify = String::new();
    if let Some(appended) = appended {
        let (name, log) = (&origin.name, origin.log);
        match durable {
            true => notify.push_str(&format!(
                ";NOTIFY {EVENTS_CHANNEL}, '{name} {log} {appended}'"
            )),
            false => notify.push_str(&format!(";NOTIFY {EVENTS_CHANNEL}, '{name}'")),
        }
    }
    if task_work || (queued > 0 && !origin.takes(queued)) {
        notify.push_str(&format!(";NOTIFY {WORK_CHANNEL}, '{}'", origin.name));
    }
    notify
}

/// Tells the other replicas to look at the queue, in one round trip of its own.
pub(super) fn announce_work(db: &Database, origin: &Origin) {
    let announced = db.client_blocking().and_then(|client| {
        let notify = format!("NOTIFY {WORK_CHANNEL}, '{}'", origin.name);
        Ok(wait(client.batch_execute(&notify))?)
    });
    if let Err(e) = announced {
        tracing::debug!("work not announced to the other replicas: {e}");
    }
}

/// Calls `wake` for every other process's notification. This process's own are skipped:
/// whatever it commits, it wakes its own streams and workers for in-process. A durable batch's
/// notification of events names its event log and the last seq it appended: appenders to one
/// log take turns on the writer lock and each notifies after its commit is durable, so every
/// event of that log up to that seq is committed and durable by then. A notification of
/// another log (a runner in another schema of the database) only wakes: the stream looks at
/// its own log's head.
pub(super) fn listen(
    db: &Database,
    origin: &Origin,
    wake: Arc<dyn Fn(Change) + Send + Sync>,
) -> Result<(), DbError> {
    let (origin, log) = (origin.name.clone(), origin.log.to_string());
    db.listen(&[EVENTS_CHANNEL, WORK_CHANNEL], move |channel, payload| {
        let mut parts = payload.split(' ');
        if parts.next() == Some(origin.as_str()) {
            return;
        }
        wake(match channel {
            EVENTS_CHANNEL => match (parts.next(), parts.next().map(str::parse)) {
                (Some(of), Some(Ok(seq))) if of == log && seq > 0 => Change::Appended(seq),
                _ => Change::Events,
            },
            WORK_CHANNEL => Change::Work,
            _ => Change::All,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(idle: Option<usize>) -> Origin {
        let origin = Origin {
            name: "ab".into(),
            log: 7,
            idle: OnceLock::new(),
        };
        if let Some(idle) = idle {
            let _ = origin.idle.set(Arc::new(AtomicUsize::new(idle)));
        }
        origin
    }

    /// What is notified follows what the bodies declared, and nothing else.
    #[test]
    fn notifications_follow_the_declared_wakes() {
        let none = origin(None);
        assert_eq!(after_commit(&[], &none, true), "");
        assert_eq!(
            after_commit(&[Wake::Events(4), Wake::Events(9)], &none, true),
            ";NOTIFY arbor_runner_events, 'ab 7 9'"
        );
        assert_eq!(
            after_commit(&[Wake::Events(4)], &none, false),
            ";NOTIFY arbor_runner_events, 'ab'"
        );
        assert_eq!(
            after_commit(&[Wake::Work], &none, true),
            ";NOTIFY arbor_runner_work, 'ab'"
        );
        // Jobs this process has idle workers for are its own; task changes are told anyway.
        let idle = origin(Some(2));
        assert_eq!(after_commit(&[Wake::Work, Wake::Work], &idle, true), "");
        assert_eq!(
            after_commit(&[Wake::Work; 3], &idle, true),
            ";NOTIFY arbor_runner_work, 'ab'"
        );
        assert_eq!(
            after_commit(&[Wake::Tasks], &idle, true),
            ";NOTIFY arbor_runner_work, 'ab'"
        );
    }
}
