//! The durable event log: events are appended inside the same transaction as the checkpoint that
//! produced them, numbered with a gap-free `seq`, and published to streams only once a flush has
//! made them durable. Durable subscribers keep an acked cursor here, and each run's W3C trace
//! context, which stamps a `traceparent` on every event of the run.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use arbor_shared::{
    domain::{Event, EventDetail, EventKind},
    trace::TraceContext,
};
use tokio::sync::watch;

use crate::store::{
    FIRST_SEQ, NEXT_SEQ, Store, StoreError, T, Tx, TxResult, Wake, abort, codec, tables,
};

/// The last seq ever assigned (0: none yet).
pub(crate) fn last_seq_in(store: &Store) -> Result<u64, StoreError> {
    Ok(store
        .tree(T::Meta)
        .get(NEXT_SEQ)?
        .map(|b| codec::read_u64(&b).saturating_sub(1))
        .unwrap_or(0))
}

/// The oldest seq still retained (1 until retention removes events).
pub(crate) fn first_seq_in(store: &Store) -> Result<u64, StoreError> {
    Ok(store
        .tree(T::Meta)
        .get(FIRST_SEQ)?
        .map(|b| codec::read_u64(&b))
        .unwrap_or(1))
}

/// Records the trace context the run's next steps belong to (SubmitRun, or a Resolve that
/// arrived with a `traceparent`), inside the transaction that acts on it.
pub fn set_run_trace<E>(tx: &Tx<'_>, run_id: &str, ctx: &TraceContext) -> TxResult<(), E> {
    tx.tree(T::Meta)
        .insert(tables::meta::trace_key(run_id), ctx.to_string().as_bytes())?;
    Ok(())
}

/// Forgets the run's trace context (retention deletes the run).
pub fn clear_run_trace<E>(tx: &Tx<'_>, run_id: &str) -> TxResult<(), E> {
    tx.tree(T::Meta).remove(tables::meta::trace_key(run_id))?;
    Ok(())
}

/// The run's trace context, if it has one (runs submitted before tracing existed do not).
pub fn run_trace<E>(tx: &Tx<'_>, run_id: &str) -> TxResult<Option<TraceContext>, E> {
    Ok(tx
        .tree(T::Meta)
        .get(tables::meta::trace_key(run_id))?
        .and_then(|b| std::str::from_utf8(&b).ok().and_then(TraceContext::parse)))
}

/// An event before it has a seq.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub run_id: String,
    pub thread_id: String,
    pub detail: EventDetail,
}

/// Which events a stream wants; empty fields match everything.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub run_id: String,
    pub thread_id: String,
    pub kinds: Vec<EventKind>,
}

impl EventFilter {
    pub fn matches(&self, e: &Event) -> bool {
        (self.run_id.is_empty() || e.run_id == self.run_id)
            && (self.thread_id.is_empty() || e.thread_id == self.thread_id)
            && (self.kinds.is_empty() || self.kinds.contains(&e.kind()))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EventLogError {
    #[error(transparent)]
    Corrupt(#[from] codec::Corrupt),
    #[error("storage error: {0}")]
    Storage(#[from] StoreError),
}

/// Appends events inside a runner transaction; returns them with their seqs. Each event carries
/// `traceparent` when given, else its run's trace with one new span id per call: one call is one
/// step (one transaction) of the run.
pub fn append<E: From<codec::Corrupt>>(
    tx: &Tx<'_>,
    events: &[NewEvent],
    time_ms: u64,
    traceparent: &str,
) -> TxResult<Vec<Event>, E> {
    append_traced(tx, events, time_ms, |_| traceparent)
}

/// [`append`] with a `traceparent` per event (by its index; empty: the run's trace, as there):
/// a step whose spans are exported stamps each event with the span that made it.
pub fn append_traced<'t, E: From<codec::Corrupt>>(
    tx: &Tx<'_>,
    events: &[NewEvent],
    time_ms: u64,
    trace_of: impl Fn(usize) -> &'t str,
) -> TxResult<Vec<Event>, E> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let meta = tx.tree(T::Meta);
    let mut next = meta
        .get(NEXT_SEQ)?
        .map(|b| codec::read_u64(&b))
        .unwrap_or(1);
    let mut out = Vec::with_capacity(events.len());
    let mut steps: Vec<(&str, String)> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let traceparent = trace_of(i);
        let traceparent = if !traceparent.is_empty() {
            traceparent.to_string()
        } else if let Some((_, tp)) = steps.iter().find(|(run, _)| *run == e.run_id) {
            tp.clone()
        } else {
            let tp = run_trace(tx, &e.run_id)?
                .map(|ctx| ctx.child().to_string())
                .unwrap_or_default();
            steps.push((&e.run_id, tp.clone()));
            tp
        };
        let event = Event {
            seq: next,
            run_id: e.run_id.clone(),
            thread_id: e.thread_id.clone(),
            time_ms,
            detail: e.detail.clone(),
            traceparent,
        };
        tx.tree(T::Events)
            .insert(tables::meta::event_key(next), codec::encode(&event))?;
        out.push(event);
        next += 1;
    }
    meta.insert(NEXT_SEQ, tables::meta::u64_value(next))?;
    tx.wake(Wake::Events(next - 1));
    Ok(out)
}

/// Stores a subscriber's cursor inside a transaction; it never moves backwards. Returns the
/// stored cursor.
pub fn ack_cursor<E: From<codec::Corrupt>>(
    tx: &Tx<'_>,
    subscriber: &str,
    seq: u64,
    last_seq: u64,
) -> TxResult<u64, E> {
    if seq > last_seq {
        return abort(codec::Corrupt {
            what: "cursor",
            message: format!("seq {seq} is beyond the last event {last_seq}"),
        });
    }
    let key = tables::meta::cursor_key(subscriber);
    let current = tx
        .tree(T::Meta)
        .get(&key)?
        .map(|b| codec::read_u64(&b))
        .unwrap_or(0);
    let stored = current.max(seq);
    tx.tree(T::Meta)
        .insert(key, tables::meta::u64_value(stored))?;
    Ok(stored)
}

/// Records that events before `seq` were compacted away (inside a runner transaction).
pub fn set_first_seq<E>(tx: &Tx<'_>, seq: u64) -> TxResult<(), E> {
    tx.tree(T::Meta)
        .insert(FIRST_SEQ, tables::meta::u64_value(seq))?;
    Ok(())
}

/// How far back, in seqs from the newest, [`EventLog::remember`] keeps events.
const RECENT_SEQS: u64 = 1024;
/// How far behind the log's head, in seqs, streams share what they read from the store (see
/// [`EventLog::read_after`]).
const SHARED_READ_MAX: u64 = RECENT_SEQS / 4;

/// Read side of the log plus the durable-seq watermark streams wait on.
#[derive(Clone)]
pub struct EventLog {
    store: Store,
    durable: watch::Sender<u64>,
    /// The events this process committed lately, and other replicas' that its streams read
    /// lately, by seq, as they were stored: streams that follow the log's head read them from
    /// here instead of the store.
    recent: Arc<Mutex<BTreeMap<u64, Event>>>,
    /// Events [`read_after`](Self::read_after) answered from `recent` and from the store.
    served: Arc<Served>,
    /// Held by a stream near the log's head while it reads the store (see
    /// [`read_after`](Self::read_after)).
    reading: Arc<tokio::sync::Mutex<()>>,
}

/// Events read for streams, by where they were read from.
#[derive(Debug, Default)]
struct Served {
    memory: AtomicU64,
    store: AtomicU64,
}

impl EventLog {
    /// Everything the store holds at open is durable, so the watermark starts at the last seq.
    pub fn open(store: Store) -> Result<Self, EventLogError> {
        // From the counter, not the last event: reading a record at open would read its blob
        // before the background check has looked at it.
        let last = last_seq_in(&store)?;
        let (durable, _) = watch::channel(last);
        Ok(Self {
            store,
            durable,
            recent: Arc::default(),
            served: Arc::default(),
            reading: Arc::default(),
        })
    }

    /// Keeps `events`, which this process has just committed durably, for the streams that
    /// read them next (call it before publishing them); streams keep here too what they read
    /// of other replicas' events near the log's head. Only the last [`RECENT_SEQS`] seqs are
    /// kept.
    pub fn remember(&self, events: Vec<Event>) {
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        recent.extend(events.into_iter().map(|e| (e.seq, e)));
        let oldest_kept = recent
            .last_key_value()
            .map_or(0, |(seq, _)| seq.saturating_sub(RECENT_SEQS));
        while recent
            .first_key_value()
            .is_some_and(|(seq, _)| *seq < oldest_kept)
        {
            recent.pop_first();
        }
    }

    /// Of the `wanted` events from seq `from` on, those remembered before the first that is
    /// not.
    fn remembered(&self, from: u64, wanted: usize) -> Vec<Event> {
        let recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        recent
            .range(from..from.saturating_add(wanted as u64))
            .zip(from..)
            .take_while(|((seq, _), expected)| *seq == expected)
            .map(|((_, e), _)| e.clone())
            .collect()
    }

    /// Marks events up to `seq` durable (called after the flush that covered their commit).
    pub fn publish(&self, seq: u64) {
        self.durable.send_if_modified(|d| {
            if seq > *d {
                *d = seq;
                true
            } else {
                false
            }
        });
    }

    pub fn durable_seq(&self) -> u64 {
        *self.durable.borrow()
    }

    pub fn watch(&self) -> watch::Receiver<u64> {
        self.durable.subscribe()
    }

    /// The last seq ever assigned (durable or not).
    pub fn last_seq(&self) -> Result<u64, EventLogError> {
        Ok(last_seq_in(&self.store)?)
    }

    /// Oldest seq still retained (1 until retention removes events).
    pub fn first_seq(&self) -> Result<u64, EventLogError> {
        Ok(first_seq_in(&self.store)?)
    }

    /// Durable events with `after < seq <= durable_seq`, at most `limit`: those remembered
    /// from memory, the rest from the store. Near the log's head (at most [`SHARED_READ_MAX`]
    /// seqs behind it), streams that want events not remembered (another replica's) take
    /// turns to read them, and each remembers what it read for the others: every such event is
    /// read from the store once, however many streams follow the log.
    pub async fn read_after(&self, after: u64, limit: usize) -> Result<Vec<Event>, EventLogError> {
        let upto = self.durable_seq();
        if after >= upto {
            return Ok(Vec::new());
        }
        // Seqs have no gaps: the events wanted are the next `wanted` entries.
        let wanted = usize::try_from(upto - after).map_or(limit, |n| n.min(limit));
        let mut out = self.remembered(after + 1, wanted);
        let near_head = upto - after <= SHARED_READ_MAX;
        let _turn = match out.len() < wanted && near_head {
            true => {
                let turn = self.reading.lock().await;
                // Another stream may have read them while this one waited.
                out = self.remembered(after + 1, wanted);
                Some(turn)
            }
            false => None,
        };
        self.served
            .memory
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        if out.len() == wanted {
            return Ok(out);
        }
        let from = after + 1 + out.len() as u64;
        let rest = wanted - out.len();
        let mut read = Vec::with_capacity(rest);
        let entries = self
            .store
            .tree(T::Events)
            .range_from_wanting(tables::meta::event_key(from), rest);
        for entry in entries.take(rest) {
            let (key, bytes) = entry?;
            if codec::read_u64(&key) > upto {
                break;
            }
            read.push(codec::decode("event", &bytes)?);
        }
        self.served
            .store
            .fetch_add(read.len() as u64, Ordering::Relaxed);
        if near_head {
            self.remember(read.clone());
        }
        out.append(&mut read);
        Ok(out)
    }

    /// Events read for streams since the process started: from its memory (events it
    /// committed lately, and other replicas' a stream near the head already read), and from
    /// the store (older ones, and each other replica's event once).
    pub fn events_read(&self) -> (u64, u64) {
        let served = &self.served;
        (
            served.memory.load(Ordering::Relaxed),
            served.store.load(Ordering::Relaxed),
        )
    }

    /// The trace id of a run's current trace context (`""` when it has none).
    pub fn run_trace_id(&self, run_id: &str) -> String {
        self.run_trace(run_id)
            .map(|c| c.trace_id())
            .unwrap_or_default()
    }

    /// A run's current trace context: what its next step continues.
    pub fn run_trace(&self, run_id: &str) -> Option<TraceContext> {
        self.store
            .tree(T::Meta)
            .get(tables::meta::trace_key(run_id))
            .ok()
            .flatten()
            .and_then(|b| std::str::from_utf8(&b).ok().and_then(TraceContext::parse))
    }

    pub fn cursor(&self, subscriber: &str) -> Result<Option<u64>, EventLogError> {
        Ok(self
            .store
            .tree(T::Meta)
            .get(tables::meta::cursor_key(subscriber))?
            .map(|b| codec::read_u64(&b)))
    }

    /// Every durable subscriber with its cursor.
    pub fn cursors(&self) -> Result<Vec<(String, u64)>, EventLogError> {
        let mut out = Vec::new();
        for entry in self.store.tree(T::Meta).scan_prefix(tables::meta::CURSORS) {
            let (k, v) = entry?;
            let name = tables::meta::subscriber_of(&k);
            out.push((name, codec::read_u64(&v)));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::error::RunnerError;

    /// Commits `n` events of run `run` in one transaction and answers them as stored.
    async fn commit(store: &Store, run: &str, n: usize) -> Vec<Event> {
        let news: Vec<NewEvent> = (0..n)
            .map(|i| NewEvent {
                run_id: run.to_string(),
                thread_id: format!("thread-{i}"),
                detail: EventDetail::RunStarted {
                    tree_id: "tree".into(),
                    tree_version: 1,
                    attempt: i as u32,
                },
            })
            .collect();
        store
            .commit(move |tx| append::<RunnerError>(tx, &news, 7, ""))
            .await
            .unwrap()
    }

    /// Reads served from what this process remembers answer exactly what the store holds,
    /// from every cursor and with every limit: with events committed elsewhere (never
    /// remembered) between remembered ones, remembered out of commit order, and with more
    /// remembered than are kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn remembered_events_read_as_the_store_holds_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        let log = EventLog::open(store.clone()).unwrap();
        for batch in 0..12 {
            let events = commit(&store, &format!("run-{batch}"), 1 + batch % 4).await;
            // Every third batch is another replica's: published, never remembered.
            if batch % 3 != 1 {
                log.remember(events);
            }
        }
        let (first, second) = (
            commit(&store, "run-a", 3).await,
            commit(&store, "run-b", 2).await,
        );
        log.remember(second);
        log.remember(first);
        let many = commit(&store, "run-many", RECENT_SEQS as usize + 10).await;
        let last = many.last().unwrap().seq;
        log.remember(many);
        log.publish(last);

        let reference = EventLog::open(store.clone()).unwrap();
        assert_eq!(reference.durable_seq(), last);
        let held = log.recent.lock().unwrap().len() as u64;
        assert!(held <= RECENT_SEQS + 1, "{held} events kept");
        let cursors = (0..40).chain(last - RECENT_SEQS - 20..=last);
        for after in cursors {
            for limit in [1, 2, 3, 7, 512] {
                assert_eq!(
                    log.read_after(after, limit).await.unwrap(),
                    reference.read_after(after, limit).await.unwrap(),
                    "after {after}, limit {limit}"
                );
            }
        }
        // What is remembered is what is read: the newest events come from memory.
        assert_eq!(log.remembered(last - 10, 11).len(), 11);
        assert!(
            log.remembered(1, 1).is_empty(),
            "the oldest are only in the store"
        );
    }
}
