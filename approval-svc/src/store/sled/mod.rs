//! The sled backend (`Backend`, and the reads of `ApprovalStore`): one multi-tree transaction
//! per state change (record, its indexes and its audit entry), then a flush before answering.
//! State changes go through the batched commit, so concurrent ones share one sled transaction
//! and one flush.
//!
//! Everything that knows about sled lives here: the record and key layout (`codec`), the
//! index reads (`query`), retention's deletes (`retention`), the integrity marker and the
//! mapping of sled's errors to `Error::Storage`.

mod codec;
mod query;
mod retention;
mod webhooks;

use std::{collections::HashMap, path::Path, sync::Arc, time::Duration};

use arbor_shared::{
    sled_backend::commit::{BatchCommit, BatchResult, CommitError, FlushError, GroupCommit, TxSet},
    sled_backend::integrity::{self, Integrity},
    time::now_ms,
};
use sled::{
    Transactional,
    transaction::{ConflictableTransactionError, TransactionError, TransactionalTree},
};

use self::retention::CURSOR_AT_KEY;
use super::{
    ApprovalStore, Compacted,
    backend::{Backend, Records},
    rules,
    webhooks::{Queued, RouteCell, routes_in},
};
use crate::{
    error::{Error, Result},
    governance::seat::Delegation,
    lifecycle::ApprovalState,
    model::{Approval, AuditEntry, AuditQuery, Filter, Page},
    webhooks::Routes,
};

impl From<sled::Error> for Error {
    fn from(e: sled::Error) -> Self {
        Self::Storage(e.to_string())
    }
}

impl From<FlushError> for Error {
    fn from(e: FlushError) -> Self {
        Self::Storage(e.to_string())
    }
}

/// How long `open` waits for a previous instance in this process to release the database.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens the store in `data_dir`, waiting (up to `OPEN_TIMEOUT`) for another store on it in this
/// process (a restarted `run`) to let go of sled's lock.
pub async fn open(data_dir: &Path) -> Result<SledStore> {
    let deadline = tokio::time::Instant::now() + OPEN_TIMEOUT;
    loop {
        match SledStore::open(data_dir) {
            Err(Error::Storage(msg))
                if msg.contains("could not acquire lock")
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

type TxResult<T> = std::result::Result<T, ConflictableTransactionError<Error>>;

const CURSOR_KEY: &[u8] = b"subscriber_cursor";
/// How many approvals are PENDING, moved in the same transaction as every approval write.
const PENDING_KEY: &[u8] = b"count/pending";

fn read_count(bytes: &[u8]) -> i64 {
    bytes.try_into().map(i64::from_be_bytes).unwrap_or_default()
}

fn trace_key(request_id: &str) -> Vec<u8> {
    let mut k = b"trace:".to_vec();
    k.extend_from_slice(request_id.as_bytes());
    k
}

/// Every tree of the store, as a field and by its name on disk: [`Trees`] holds them, a
/// transaction's [`Tx`] their transactional views, written once for both.
macro_rules! trees {
    ($($field:ident: $name:literal),* $(,)?) => {
        #[derive(Clone)]
        struct Trees {
            $($field: sled::Tree,)*
            /// Which webhook endpoints want which events.
            routes: RouteCell,
        }

        /// The transactional view of every tree a state change touches.
        pub struct Tx<'a> {
            $($field: &'a TransactionalTree,)*
            now: u64,
            routes: &'a Routes,
        }

        impl Trees {
            fn open(db: &sled::Db) -> Result<Self> {
                Ok(Self { $($field: db.open_tree($name)?,)* routes: RouteCell::default() })
            }

            /// Runs `f` as one sled transaction over every tree.
            fn run<T, E>(
                &self,
                f: impl Fn(&Tx<'_>) -> std::result::Result<T, ConflictableTransactionError<E>>,
            ) -> std::result::Result<T, TransactionError<E>> {
                let now = now_ms();
                let routes = routes_in(&self.routes);
                ($(&self.$field,)*).transaction(|($($field,)*)| f(&Tx { $($field,)* now, routes }))
            }
        }
    };
}

trees! {
    approvals: "approvals",
    by_created: "approvals_by_created",
    by_run: "approvals_by_run",
    deadlines: "pending_deadlines",
    outbox: "delivery_outbox",
    audit: "audit",
    audit_by_request: "audit_by_request",
    audit_by_run: "audit_by_run",
    meta: "meta",
}

/// Approvals in a sled database.
#[derive(Clone)]
pub struct SledStore {
    db: sled::Db,
    trees: Trees,
    gc: GroupCommit,
    batches: BatchCommit<Trees>,
    integrity: Option<Arc<Integrity>>,
}

/// Upper bound of sled's page cache (sled's default, 1 GiB, lets the resident set grow towards
/// it); the approvals people work on are the recent ones.
const CACHE_BYTES: u64 = 64 << 20;

/// What the integrity marker measures the store's progress by: the last audit entry's id. Every
/// state change writes an audit entry and ids only grow; retention removes old entries but
/// keeps the highest id it removed (the audit floor), so progress never goes backwards.
const PROGRESS: &str = "last audit id";

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore").finish_non_exhaustive()
    }
}

/// `meta` key of every delegation.
const DELEGATIONS_KEY: &[u8] = b"delegations";

fn lift<T>(r: Result<T>) -> TxResult<T> {
    r.map_err(ConflictableTransactionError::Abort)
}

/// A business outcome ends the sled transaction with nothing written.
impl From<Error> for ConflictableTransactionError<Error> {
    fn from(e: Error) -> Self {
        ConflictableTransactionError::Abort(e)
    }
}

impl Records for Tx<'_> {
    type Fail = ConflictableTransactionError<Error>;

    fn now(&self) -> u64 {
        self.now
    }

    fn find(&self, request_id: &str) -> TxResult<Option<Approval>> {
        match self.approvals.get(request_id.as_bytes())? {
            Some(bytes) => lift(codec::decode(&bytes)).map(Some),
            None => Ok(None),
        }
    }

    fn next_arrival(&self) -> TxResult<u64> {
        Ok(self.approvals.generate_id()?)
    }

    /// Writes the record and keeps every index in step with its state.
    fn save(&self, old: Option<&Approval>, new: &Approval) -> TxResult<()> {
        let pending = |a: &Approval| i64::from(a.state == ApprovalState::Pending);
        let moved = pending(new) - old.map_or(0, pending);
        if moved != 0 {
            let now = self.meta.get(PENDING_KEY)?.map_or(0, |b| read_count(&b));
            self.meta
                .insert(PENDING_KEY, &(now + moved).to_be_bytes())?;
        }
        let id = new.id();
        self.approvals
            .insert(id.as_bytes(), lift(codec::encode(new))?)?;
        if old.is_none() {
            self.by_created.insert(
                codec::created_key(new.created_at_ms, new.arrival, id),
                &[][..],
            )?;
            self.by_run.insert(
                codec::owned_key(&new.request.run_id, id.as_bytes()),
                &[][..],
            )?;
        }
        let deadline = |a: &Approval| {
            (a.state == ApprovalState::Pending && a.deadline_ms() > 0)
                .then(|| codec::deadline_key(a.deadline_ms(), a.id()))
        };
        if let Some(k) = old.and_then(deadline) {
            self.deadlines.remove(k)?;
        }
        if let Some(k) = deadline(new) {
            self.deadlines.insert(k, &[][..])?;
        }
        if new.needs_delivery() {
            self.outbox.insert(id.as_bytes(), &[][..])?;
        } else {
            self.outbox.remove(id.as_bytes())?;
        }
        Ok(())
    }

    fn audit(&self, mut entry: AuditEntry) -> TxResult<AuditEntry> {
        entry.id = self.audit.generate_id()?;
        entry.time_ms = self.now;
        let key = codec::id_key(entry.id);
        self.audit.insert(&key, lift(codec::encode(&entry))?)?;
        self.audit_by_request
            .insert(codec::owned_key(&entry.request_id, &key), &[][..])?;
        self.audit_by_run
            .insert(codec::owned_key(&entry.run_id, &key), &[][..])?;
        Ok(entry)
    }

    fn webhook_routes(&self) -> &Routes {
        self.routes
    }

    fn put_webhook(&self, endpoint: &str, message: &Queued) -> TxResult<()> {
        webhooks::put(self, endpoint, message)
    }

    fn put_trace(&self, request_id: &str, traceparent: &str) -> TxResult<()> {
        self.meta
            .insert(trace_key(request_id), traceparent.as_bytes())?;
        Ok(())
    }

    /// Every delegation, under one key of `meta`: there are few, and a sled transaction
    /// cannot scan.
    fn delegations(&self) -> TxResult<Vec<Delegation>> {
        match self.meta.get(DELEGATIONS_KEY)? {
            Some(bytes) => lift(codec::decode(&bytes)),
            None => Ok(Vec::new()),
        }
    }

    fn put_delegation(&self, d: &Delegation) -> TxResult<()> {
        let mut all = self.delegations()?;
        all.retain(|o| o.id != d.id);
        all.push(d.clone());
        all.sort_by(|a, b| a.id.cmp(&b.id));
        self.meta
            .insert(DELEGATIONS_KEY, lift(codec::encode(&all))?)?;
        Ok(())
    }

    fn delete_delegation(&self, id: &str) -> TxResult<Option<Delegation>> {
        let mut all = self.delegations()?;
        let found = all.iter().position(|d| d.id == id).map(|i| all.remove(i));
        if found.is_some() {
            self.meta
                .insert(DELEGATIONS_KEY, lift(codec::encode(&all))?)?;
        }
        Ok(found)
    }

    fn lock_ahead_traced(&self, ids: &[&str]) -> TxResult<HashMap<String, String>> {
        let mut traces = HashMap::new();
        for id in ids {
            let stored = self.meta.get(trace_key(id))?;
            if let Some(t) = stored.and_then(|v| String::from_utf8(v.to_vec()).ok()) {
                traces.insert(id.to_string(), t);
            }
        }
        Ok(traces)
    }
}

impl SledStore {
    /// Opens the store in `path`, refusing a database that lost durable data or cannot be read.
    pub fn open(path: &Path) -> Result<Self> {
        Integrity::precheck(path).map_err(|e| Error::Storage(e.to_string()))?;
        let db = arbor_shared::sled_backend::sled_config(path, CACHE_BYTES).open()?;
        let mut store = Self::from_db(db, path)?;
        let progress = store.progress()?;
        let integrity = Integrity::check(path, &store.db, PROGRESS, progress)
            .and_then(|i| {
                integrity::guarded(path, |place| store.check_references(place))?;
                Ok(i)
            })
            .map_err(|e| Error::Storage(e.to_string()))?;
        store.integrity = Some(Arc::new(integrity));
        Ok(store)
    }

    /// Every index entry must name a record that exists. Index entries are small and stay in
    /// the log while big records (an approval with large arguments or context) may live in blob
    /// files, and sled drops a record whose blob file is gone without an error: an index entry
    /// without its record is how such a loss shows.
    fn check_references(
        &self,
        place: &std::sync::Mutex<String>,
    ) -> std::result::Result<(), String> {
        let read = |e: sled::Error| e.to_string();
        let t = &self.trees;
        for (name, index, records) in [
            ("approvals_by_created", &t.by_created, &t.approvals),
            ("approvals_by_run", &t.by_run, &t.approvals),
            ("audit_by_request", &t.audit_by_request, &t.audit),
        ] {
            if let Ok(mut p) = place.lock() {
                *p = name.to_string();
            }
            for key in index.iter().keys() {
                let key = key.map_err(read)?;
                // by_created: `created ++ arrival ++ id`; the others: `owner ++ 0x00 ++ id`.
                let id: &[u8] = if name == "approvals_by_created" {
                    key.get(16..).unwrap_or_default()
                } else {
                    key.iter()
                        .position(|b| *b == 0)
                        .and_then(|p| key.get(p + 1..))
                        .unwrap_or_default()
                };
                if !records.contains_key(id).map_err(read)? {
                    return Err(format!(
                        "index {name} names '{}', which is gone",
                        String::from_utf8_lossy(id)
                    ));
                }
            }
        }
        Ok(())
    }

    fn progress(&self) -> Result<u64> {
        let last = self
            .trees
            .audit
            .last()?
            .map(|(k, _)| codec::read_id(&k))
            .unwrap_or(0);
        Ok(last.max(self.audit_floor()?))
    }

    fn from_db(db: sled::Db, path: &Path) -> Result<Self> {
        let trees = Trees::open(&db)?;
        count_pending_once(&trees)?;
        let gc = GroupCommit::start(db.clone(), path.to_path_buf());
        let batches = BatchCommit::start(trees.clone(), gc.clone());
        Ok(Self {
            db,
            trees,
            gc,
            batches,
            integrity: None,
        })
    }

    /// Runs `f` as a transaction of its own on the calling thread; durable at the next flush.
    fn commit_lazy<T>(&self, f: impl Fn(&Tx<'_>) -> TxResult<T>) -> Result<T> {
        match self.trees.run(f) {
            Ok(v) => Ok(v),
            Err(TransactionError::Abort(e)) => Err(e),
            Err(TransactionError::Storage(e)) => Err(e.into()),
        }
    }
}

impl TxSet for Trees {
    type Tx<'a> = Tx<'a>;

    fn transaction(
        &self,
        body: &dyn Fn(&Tx<'_>) -> BatchResult,
    ) -> std::result::Result<(), TransactionError<usize>> {
        self.run(body)
    }
}

/// Gives a database written before the pending count existed its count, by one pass over the
/// approvals (an approval that does not decode is not counted). Runs before anything writes.
fn count_pending_once(trees: &Trees) -> Result<()> {
    if trees.meta.contains_key(PENDING_KEY)? {
        return Ok(());
    }
    let mut n: i64 = 0;
    for item in trees.approvals.iter() {
        let (_, bytes) = item?;
        if codec::decode::<Approval>(&bytes).is_ok_and(|a| a.state == ApprovalState::Pending) {
            n += 1;
        }
    }
    trees.meta.insert(PENDING_KEY, &n.to_be_bytes())?;
    trees.meta.flush()?;
    Ok(())
}

impl Backend for SledStore {
    type Fail = ConflictableTransactionError<Error>;
    type Tx<'t> = Tx<'t>;

    /// In the batched commit: shares one sled transaction and one flush with whatever other
    /// changes are queued; a lazy one answers before the flush.
    async fn transact<T: Send + 'static>(
        &self,
        durable: bool,
        body: impl Fn(&Tx<'_>) -> TxResult<T> + Send + 'static,
    ) -> Result<T> {
        match durable {
            true => self.batches.commit(body).await,
            false => self.batches.apply(body).await,
        }
        .map_err(CommitError::flatten)
    }

    fn refusal(fail: Self::Fail) -> std::result::Result<Error, Self::Fail> {
        match fail {
            ConflictableTransactionError::Abort(e) => Ok(e),
            other => Err(other),
        }
    }

    /// Every run's end comes here; most of its approvals are long final, and a commit for
    /// nothing would cost a flush.
    fn cancellable_ids(&self, run_id: &str) -> Result<Option<Vec<String>>> {
        let mut ids = Vec::new();
        for item in self.trees.by_run.scan_prefix(codec::owner_prefix(run_id)) {
            let (key, _) = item?;
            let id = String::from_utf8_lossy(&key[run_id.len() + 1..]).into_owned();
            if self.get(&id)?.is_some_and(|a| rules::cancellable(&a)) {
                ids.push(id);
            }
        }
        Ok((!ids.is_empty()).then_some(ids))
    }
}

impl ApprovalStore for SledStore {
    fn get(&self, request_id: &str) -> Result<Option<Approval>> {
        self.trees
            .approvals
            .get(request_id.as_bytes())?
            .map(|b| codec::decode(&b))
            .transpose()
    }

    fn list(
        &self,
        filter: &Filter,
        page_size: usize,
        page_token: Option<&str>,
        now_ms: u64,
    ) -> Result<Page<Approval>> {
        self.list_approvals(filter, page_size, page_token, now_ms)
    }

    fn count(&self, filter: &Filter, limit: usize, now_ms: u64) -> Result<usize> {
        self.count_approvals(filter, limit, now_ms)
    }

    fn audit(
        &self,
        query: &AuditQuery,
        page_size: usize,
        page_token: Option<&str>,
    ) -> Result<Page<AuditEntry>> {
        self.list_audit(query, page_size, page_token)
    }

    fn next_deadline(&self) -> Result<Option<(u64, String)>> {
        Ok(self
            .trees
            .deadlines
            .first()?
            .and_then(|(k, _)| codec::split_deadline_key(&k)))
    }

    fn pending_count(&self) -> Result<u64> {
        Ok(self
            .trees
            .meta
            .get(PENDING_KEY)?
            .map_or(0, |b| read_count(&b).max(0) as u64))
    }

    fn undelivered(&self) -> Result<Vec<Approval>> {
        let mut out = Vec::new();
        for item in self.trees.outbox.iter() {
            let (key, _) = item?;
            if let Some(a) = self.get(&String::from_utf8_lossy(&key))? {
                out.push(a);
            }
        }
        Ok(out)
    }

    fn cursor(&self) -> Result<Option<u64>> {
        Ok(self
            .trees
            .meta
            .get(CURSOR_KEY)?
            .and_then(|v| Some(u64::from_be_bytes(v.as_ref().try_into().ok()?))))
    }

    fn set_cursor(&self, seq: u64) -> Result<()> {
        self.trees.meta.insert(CURSOR_KEY, &seq.to_be_bytes())?;
        self.trees
            .meta
            .insert(CURSOR_AT_KEY, &codec::id_key(now_ms()))?;
        Ok(())
    }

    fn cursor_acked_at(&self) -> Result<Option<u64>> {
        Ok(self
            .trees
            .meta
            .get(CURSOR_AT_KEY)?
            .map(|v| codec::read_id(&v)))
    }

    async fn compact(&self, cutoff_ms: u64) -> Result<Compacted> {
        self.compact_before(cutoff_ms).await
    }

    fn put_trace(&self, request_id: &str, traceparent: &str) -> Result<()> {
        self.trees
            .meta
            .insert(trace_key(request_id), traceparent.as_bytes())?;
        Ok(())
    }

    fn trace(&self, request_id: &str) -> Result<Option<String>> {
        Ok(self
            .trees
            .meta
            .get(trace_key(request_id))?
            .and_then(|v| String::from_utf8(v.to_vec()).ok()))
    }

    async fn record_progress(&self) -> Result<()> {
        let Some(integrity) = &self.integrity else {
            return Ok(());
        };
        let progress = self.progress()?;
        self.gc.flush().await?;
        integrity
            .clone()
            .record_blocking(progress)
            .await
            .map_err(|e| Error::Storage(e.to_string()))
    }

    fn fsyncs(&self) -> u64 {
        self.gc.flush_count()
    }

    async fn flush(&self) -> Result<()> {
        self.gc.flush().await?;
        self.db.flush_async().await?;
        Ok(())
    }
}
