//! [`Store`], the handle everything above the seam holds: typed transaction bodies run on the
//! backend's erased ones, and tables read outside transactions ([`Table`]).

use std::sync::{Arc, Mutex};

use super::{
    Abort, Backend, Change, Commit, Entries, Failed, InOrder, ManyAndPrefix, Reads, Stats,
    StoreError, T, Tx, TxError, TxResult, Value,
};

/// Handle to the runner's storage. Cheap to clone.
#[derive(Clone)]
pub struct Store(Arc<dyn Backend>);

/// One table, read outside any transaction.
pub struct Table<'s> {
    backend: &'s dyn Backend,
    t: T,
}

impl Table<'_> {
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Value>, StoreError> {
        self.backend.get(self.t, key.as_ref())
    }

    /// See [`Backend::counter`].
    pub fn counter(&self, key: impl AsRef<[u8]>) -> Result<i64, StoreError> {
        self.backend.counter(self.t, key.as_ref())
    }

    pub fn contains_key(&self, key: impl AsRef<[u8]>) -> Result<bool, StoreError> {
        Ok(self.get(key)?.is_some())
    }

    pub fn iter(&self) -> Entries<'static> {
        self.backend.scan(self.t, &[], &[])
    }

    /// Every entry, for a caller that takes them all (see [`Backend::scan_wanting`]).
    pub fn all(&self) -> Entries<'static> {
        self.backend.scan_wanting(self.t, &[], &[], usize::MAX)
    }

    pub fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> Entries<'static> {
        self.backend.scan(self.t, prefix.as_ref(), &[])
    }

    /// Entries from `from` on.
    pub fn range_from(&self, from: impl AsRef<[u8]>) -> Entries<'static> {
        self.backend.scan(self.t, &[], from.as_ref())
    }

    /// Entries from `from` on, for a caller that will take about `wanted` of them (see
    /// [`Backend::scan_wanting`]).
    pub fn range_from_wanting(&self, from: impl AsRef<[u8]>, wanted: usize) -> Entries<'static> {
        self.backend
            .scan_wanting(self.t, &[], from.as_ref(), wanted)
    }

    /// Entries with keys above `key` (every entry when `key` is empty).
    pub fn after(&self, key: impl AsRef<[u8]>) -> Entries<'static> {
        let key = key.as_ref();
        match key.is_empty() {
            true => self.iter(),
            // The least key above `key` is `key` followed by a zero byte.
            false => self.range_from([key, &[0]].concat()),
        }
    }

    /// See [`Backend::insert_new`].
    pub fn insert_new(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<Option<Value>, StoreError> {
        self.backend
            .insert_new(self.t, key.as_ref(), value.as_ref())
    }

    pub fn last(&self) -> Result<Option<(Value, Value)>, StoreError> {
        self.backend.last(self.t, &[])
    }

    /// The entry with the highest key that starts with `prefix`.
    pub fn last_with_prefix(
        &self,
        prefix: impl AsRef<[u8]>,
    ) -> Result<Option<(Value, Value)>, StoreError> {
        self.backend.last(self.t, prefix.as_ref())
    }
}

/// Where a body's typed result waits while the backend runs the erased body.
type Slot<R, E> = Arc<Mutex<Option<Result<R, E>>>>;

/// What runs on a committed body's result, in commit order (see [`Store::commit_in_order`]).
type Then<R> = Box<dyn FnOnce(&mut R) + Send>;

fn erase<R, E>(
    body: impl Fn(&Tx<'_>) -> TxResult<R, E>,
    slot: Slot<R, E>,
) -> impl Fn(&Tx<'_>) -> TxResult<(), ()> {
    move |tx| {
        let (kept, verdict) = match body(tx) {
            Ok(r) => (Some(Ok(r)), Ok(())),
            Err(Abort::Domain(e)) => (Some(Err(e)), Err(Abort::Domain(()))),
            Err(Abort::Conflict) => (None, Err(Abort::Conflict)),
            Err(Abort::Storage(s)) => (None, Err(Abort::Storage(s))),
        };
        if let Ok(mut slot) = slot.lock() {
            *slot = kept;
        }
        verdict
    }
}

fn take<R, E>(ran: Result<(), Failed>, slot: &Slot<R, E>) -> Result<R, TxError<E>> {
    let last = slot.lock().ok().and_then(|mut s| s.take());
    match (ran, last) {
        (Ok(()), Some(Ok(r))) => Ok(r),
        (Err(Failed::Aborted), Some(Err(e))) => Err(TxError::Abort(e)),
        (Err(Failed::Storage(e)), _) => Err(TxError::Storage(e)),
        _ => Err(TxError::Storage(StoreError::Failed(
            "a transaction ended without its body's result".into(),
        ))),
    }
}

impl Store {
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self(backend)
    }

    /// See [`Backend::get_many`].
    pub fn get_many(&self, keys: &[(T, &[u8])]) -> Result<Vec<Option<Value>>, StoreError> {
        self.0.get_many(keys)
    }

    /// See [`Backend::get_many_and_prefix`].
    pub fn get_many_and_prefix(
        &self,
        keys: &[(T, &[u8])],
        t: T,
        prefix: &[u8],
    ) -> Result<ManyAndPrefix, StoreError> {
        self.0.get_many_and_prefix(keys, t, prefix)
    }

    /// One table, for reads outside a transaction.
    pub fn tree(&self, t: T) -> Table<'_> {
        Table {
            backend: &*self.0,
            t,
        }
    }

    /// Runs `body` as one serialisable transaction over every table, on the calling thread and
    /// outside the batched commit. It returns once committed, before it is on disk: await
    /// [`durable`](Self::durable) for that. The body may run more than once, so it must be free
    /// of side effects.
    pub fn transact<R, E>(
        &self,
        body: impl Fn(&Tx<'_>) -> TxResult<R, E> + Send,
    ) -> Result<R, TxError<E>>
    where
        R: Send,
        E: Send,
    {
        let slot: Slot<R, E> = Arc::default();
        let ran = self.0.transact(&erase(body, slot.clone()));
        take(ran, &slot)
    }

    /// Runs `body` in one transaction with whatever other commits are queued and resolves once
    /// that transaction is durable: the way every write that answers an RPC commits. The body
    /// may run more than once, so it must be free of side effects outside the transaction.
    pub async fn commit<R, E, F>(&self, body: F) -> Result<R, TxError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&Tx<'_>) -> TxResult<R, E> + Send + 'static,
    {
        self.commit_reading(Vec::new(), body).await
    }

    /// [`commit`](Self::commit) of a body that reads `reads`: on a store whose reads are round
    /// trips, the rows every body of the batch names this way are fetched together, with the
    /// batch's first read, instead of one round trip per body. The body still sees the writes
    /// of the bodies before it in its batch, as with any read.
    pub async fn commit_reading<R, E, F>(&self, reads: Reads, body: F) -> Result<R, TxError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&Tx<'_>) -> TxResult<R, E> + Send + 'static,
    {
        self.commit_as(reads, Commit::Durable, body).await
    }

    /// [`commit`](Self::commit) that resolves as soon as the transaction has committed, without
    /// waiting for it to be durable: for writes a crash may lose (a claim, which start-up undoes
    /// anyway).
    pub async fn apply<R, E, F>(&self, body: F) -> Result<R, TxError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&Tx<'_>) -> TxResult<R, E> + Send + 'static,
    {
        self.commit_as(Vec::new(), Commit::Unflushed, body).await
    }

    /// [`commit_reading`](Self::commit_reading) run as `how` says.
    pub async fn commit_as<R, E, F>(
        &self,
        reads: Reads,
        how: Commit,
        body: F,
    ) -> Result<R, TxError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&Tx<'_>) -> TxResult<R, E> + Send + 'static,
    {
        self.commit_then(reads, how, body, None).await
    }

    /// [`commit_as`](Self::commit_as) that also runs `in_order` on the body's result (which
    /// it may take parts of) once it has committed, before the caller is answered: the
    /// `in_order` of successive durable commits run in the order their writes were committed,
    /// not in the order their callers happen to wake (see [`Backend::commit`]). It runs on the
    /// store's commit thread: it must be quick and must not wait for the store.
    pub async fn commit_in_order<R, E, F>(
        &self,
        reads: Reads,
        how: Commit,
        body: F,
        in_order: impl FnOnce(&mut R) + Send + 'static,
    ) -> Result<R, TxError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&Tx<'_>) -> TxResult<R, E> + Send + 'static,
    {
        self.commit_then(reads, how, body, Some(Box::new(in_order)))
            .await
    }

    async fn commit_then<R, E, F>(
        &self,
        reads: Reads,
        how: Commit,
        body: F,
        in_order: Option<Then<R>>,
    ) -> Result<R, TxError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(&Tx<'_>) -> TxResult<R, E> + Send + 'static,
    {
        let slot: Slot<R, E> = Arc::default();
        let in_order = in_order.map(|then| {
            let committed = slot.clone();
            Box::new(move || {
                if let Ok(mut slot) = committed.lock()
                    && let Some(Ok(r)) = slot.as_mut()
                {
                    then(r);
                }
            }) as InOrder
        });
        let body = Box::new(erase(body, slot.clone()));
        let ran = self.0.commit(reads, body, how, in_order).await;
        take(ran, &slot)
    }

    /// Waits until everything committed so far is durable (one flush shared with every other
    /// waiter).
    pub async fn durable(&self) -> Result<(), StoreError> {
        self.0.durable().await
    }

    /// Records the progress the database reached (the last event seq ever assigned) once
    /// everything before it is durable, so losing it later is detected at start-up.
    pub async fn record_progress(&self, progress: u64) -> Result<(), StoreError> {
        self.0.record_progress(progress).await
    }

    /// A fresh unique, increasing id (survives restarts).
    pub fn next_id(&self) -> Result<u64, StoreError> {
        self.0.next_id()
    }

    /// See [`Backend::next_in`].
    pub fn next_in(&self, sequence: super::Sequence) -> Result<u64, StoreError> {
        self.0.next_in(sequence)
    }

    /// See [`Backend::raise`].
    pub fn raise(&self, sequence: super::Sequence, at_least: u64) -> Result<(), StoreError> {
        self.0.raise(sequence, at_least)
    }

    /// Bytes the database occupies on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.0.size_on_disk()
    }

    /// See [`Backend::verify`]. Blocking: call it off the async runtime's threads.
    pub fn verify(&self) -> Result<(), StoreError> {
        self.0.verify()
    }

    /// Counters of the commit path.
    pub fn stats(&self) -> Stats {
        self.0.stats()
    }

    /// Flushes issued so far to make commits durable.
    pub fn flush_count(&self) -> u64 {
        self.stats().flushes
    }

    /// See [`Backend::shared`].
    pub fn shared(&self) -> bool {
        self.0.shared()
    }

    /// See [`Backend::now_ms`].
    pub fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }

    /// See [`Backend::reachable`].
    pub fn reachable(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.0.reachable()
    }

    /// See [`Backend::hot_keys`].
    pub fn hot_keys(&self, keys: Vec<(T, Value)>) {
        self.0.hot_keys(keys)
    }

    /// See [`Backend::subscribe`].
    pub fn subscribe(&self, wake: impl Fn(Change) + Send + Sync + 'static) {
        self.0.subscribe(Arc::new(wake))
    }

    /// See [`Backend::idle_workers`].
    pub fn idle_workers(&self, idle: Arc<std::sync::atomic::AtomicUsize>) {
        self.0.idle_workers(idle)
    }

    /// See [`Backend::announce_work`].
    pub fn announce_work(&self) {
        self.0.announce_work()
    }
}
