//! PostgreSQL plumbing both services share when they run on `--store postgres://…`: a pool of
//! connections that live on a runtime of their own, the schema as embedded migrations applied
//! under an advisory lock, LISTEN/NOTIFY wake-ups with reconnects, a health probe, and the
//! classification of errors into "try again", "the database is unreachable" and "failed".
//!
//! The connections' I/O runs on the pool's own small runtime, so a query can also be waited for
//! from synchronous code on any thread ([`Database::block`]): the stores' read paths are
//! synchronous, as the embedded store's are.
//!
//! Errors and their classes are in `error.rs`; a thread's own connection, the deferred `BEGIN`
//! and prepared statements in `conn.rs`.

mod conn;
mod error;

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

pub use deadpool_postgres::{ClientWrapper, Object};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
pub use tokio_postgres;
use tokio_postgres::NoTls;

pub use self::{
    conn::{Dedicated, LazyBegin, Prepared},
    error::{DbError, Patience},
};

/// Connections kept per service process.
pub const POOL_SIZE: usize = 24;
/// How long a caller waits for a pooled connection, or for a new one to be made.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a [`ServerClock`] measures its offset from the server's clock again.
pub const CLOCK_PERIOD: Duration = Duration::from_secs(5);

/// The database server's clock, read on this host: the local clock plus its measured offset
/// from the server's. Replicas on several hosts that stamp and compare times (deadlines, when a
/// job may run, leases) by it agree on them, whatever their own clocks say.
#[derive(Debug, Clone)]
pub struct ServerClock {
    offset_ms: Arc<AtomicI64>,
}

impl ServerClock {
    /// Now on the server's clock, in epoch milliseconds.
    pub fn now_ms(&self) -> u64 {
        let now = crate::time::now_ms() as i64 + self.offset_ms.load(Ordering::Relaxed);
        now.max(0) as u64
    }
}

/// One component's schema: migration `i` (from 0) brings the schema to version `i + 1`. A
/// migration is never edited once released; changes are new migrations.
#[derive(Debug, Clone, Copy)]
pub struct Schema {
    /// Names the component in `arbor_schema` (`runner`, `approval`).
    pub component: &'static str,
    pub migrations: &'static [&'static str],
}

/// The pool's runtime, shut down without waiting when the database handle goes (dropping a
/// runtime inside another one would panic).
struct Runtime(Option<tokio::runtime::Runtime>);

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A PostgreSQL database: a pool of connections on a runtime of their own. Cheap to clone.
#[derive(Clone)]
pub struct Database {
    pool: Pool,
    config: tokio_postgres::Config,
    rt: Arc<Runtime>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database").finish_non_exhaustive()
    }
}

impl Database {
    /// Connects to `url` and brings `schema` up to date under an advisory lock (replicas
    /// starting together migrate once). Every connection starts with the server `settings`
    /// (`name`, `value`), after any the URL's `options` give. Fails when the database is
    /// unreachable (after `patience`), refuses the login or the database, or has a schema
    /// newer than this binary's (unless `patience` is [`Patience::Always`]).
    pub async fn open(
        url: &str,
        app: &str,
        schema: Schema,
        settings: &[(&str, &str)],
        patience: Patience,
    ) -> Result<Database, DbError> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| DbError::Failed(format!("not a PostgreSQL URL: {e}")))?;
        config.application_name(app);
        if !settings.is_empty() {
            let mut options = config.get_options().unwrap_or_default().to_string();
            for (name, value) in settings {
                options.push_str(&format!(" -c {name}={value}"));
            }
            config.options(options.trim_start());
        }
        config.connect_timeout(CONNECT_TIMEOUT);
        config.keepalives_idle(Duration::from_secs(10));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("arbor-pg")
            .enable_all()
            .build()
            .map_err(|e| DbError::Failed(format!("cannot start the database runtime: {e}")))?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            // The connection returned last is lent next, so a process keeps as few server
            // backends busy as its load needs, each with warm caches; lent in turn (the
            // default), every read woke the next of all the pool's backends.
            .queue_mode(deadpool_postgres::QueueMode::Lifo)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| DbError::Failed(e.to_string()))?;
        let db = Database {
            pool,
            config,
            rt: Arc::new(Runtime(Some(rt))),
        };
        let deadline = match patience {
            Patience::Reachable(patience) => Some(tokio::time::Instant::now() + patience),
            Patience::Always => None,
        };
        let mut backoff = Duration::from_millis(100);
        loop {
            let migrated = {
                let pool = db.pool.clone();
                db.run(async move { migrate(&pool, schema).await }).await
            };
            let waits = match (&migrated, deadline) {
                (Ok(()), _) => false,
                (Err(DbError::Unavailable(_)), Some(deadline)) => {
                    tokio::time::Instant::now() < deadline
                }
                // A refused login, a missing database or a newer schema stays so until a person
                // changes it; with `Patience::Always`, that person is on the way.
                (Err(_), None) => true,
                (Err(_), Some(_)) => false,
            };
            match migrated {
                Err(e) if waits => {
                    tracing::warn!(error = %e, "waiting for the database");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                other => return other.map(|()| db),
            }
        }
    }

    fn handle(&self) -> Result<&tokio::runtime::Runtime, DbError> {
        self.rt
            .0
            .as_ref()
            .ok_or_else(|| DbError::Failed("the database runtime is gone".into()))
    }

    /// Runs `fut` on the pool's runtime and waits for it asynchronously.
    pub async fn run<R: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<R, DbError>> + Send + 'static,
    ) -> Result<R, DbError> {
        self.handle()?
            .spawn(fut)
            .await
            .map_err(|e| DbError::Failed(format!("database task failed: {e}")))?
    }

    /// Runs `fut` on the pool's runtime and blocks the calling thread until it is done. For the
    /// synchronous read paths; never call it on the pool's own runtime.
    pub fn block<R: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<R, DbError>> + Send + 'static,
    ) -> Result<R, DbError> {
        // The answer comes back over a std channel: a tokio JoinHandle polled from a thread
        // that is inside another runtime's task spends that task's cooperative budget, and
        // once it is spent the handle answers "not yet" for ever.
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        self.handle()?.spawn(async move {
            let _ = answer.send(fut.await);
        });
        in_place(|| answered.recv()).map_err(|_| DbError::Failed("database task stopped".into()))?
    }

    /// A pooled connection. Its queries may be awaited on any runtime, or blocked on with
    /// [`wait`].
    pub async fn client(&self) -> Result<Object, DbError> {
        let pool = self.pool.clone();
        self.run(async move { Ok(pool.get().await?) }).await
    }

    /// [`client`](Self::client), blocking (see [`wait`]). A connection the pool has to make is
    /// made on the pool's runtime (entered here).
    pub fn client_blocking(&self) -> Result<Object, DbError> {
        let pool_runtime = self.handle()?;
        // Whether the caller's thread may block is asked before the pool's runtime is entered.
        in_place(|| {
            let _on_pool_runtime = pool_runtime.enter();
            Ok(block_on(self.pool.get())?)
        })
    }

    /// A connection of the calling thread's own (see [`Dedicated`]).
    pub fn dedicated(&self) -> Result<Dedicated, DbError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| DbError::Failed(format!("cannot start a connection's runtime: {e}")))?;
        Ok(Dedicated {
            config: self.config.clone(),
            rt,
            client: None,
        })
    }

    /// Whether the database answers a trivial query within `within`.
    async fn ping(&self, within: Duration) -> bool {
        let pool = self.pool.clone();
        let probe = self.run(async move {
            let answered = tokio::time::timeout(within, async {
                let client = pool.get().await?;
                client.simple_query("SELECT 1").await?;
                Ok::<_, DbError>(())
            })
            .await;
            answered.map_err(|_| DbError::Unavailable("ping timed out".into()))?
        });
        probe.await.is_ok()
    }

    /// The server's clock as this process reads it (see [`ServerClock`]): measured before this
    /// returns, and again every [`CLOCK_PERIOD`] for as long as a copy of the clock is left.
    pub async fn server_clock(&self) -> ServerClock {
        let offset_ms = Arc::new(AtomicI64::new(0));
        if let Err(e) = self.measure_clock(&offset_ms).await {
            tracing::warn!("the database's clock not read yet: {e}");
        }
        let (db, clock) = (self.clone(), Arc::downgrade(&offset_ms));
        if let Ok(pool_runtime) = self.handle() {
            pool_runtime.spawn(async move {
                loop {
                    tokio::time::sleep(CLOCK_PERIOD).await;
                    let Some(offset_ms) = clock.upgrade() else {
                        return;
                    };
                    if let Err(e) = db.measure_clock(&offset_ms).await {
                        tracing::debug!("the database's clock not read: {e}");
                    }
                }
            });
        }
        ServerClock { offset_ms }
    }

    /// Measures the offset of the server's clock (see [`clock_offset`](Self::clock_offset))
    /// into `offset_ms`; on failure it keeps the last one measured.
    async fn measure_clock(&self, offset_ms: &AtomicI64) -> Result<(), DbError> {
        offset_ms.store(self.clock_offset().await?, Ordering::Relaxed);
        Ok(())
    }

    /// How far the server's clock is ahead of this host's, in ms: the server's time against
    /// the middle of the round trip that read it. A server time inside that round trip (give
    /// or take the millisecond each side rounds to) is no offset at all: the clocks agree as
    /// far as one read can tell, and a host that is the server's own reads exactly its time.
    async fn clock_offset(&self) -> Result<i64, DbError> {
        let pool = self.pool.clone();
        self.run(async move {
            let client = pool.get().await?;
            let before = crate::time::now_ms() as i64;
            let row = client
                .query_one(
                    "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                    &[],
                )
                .await?;
            let after = crate::time::now_ms() as i64;
            let server: i64 = row.get(0);
            Ok(if (before - 1..=after + 1).contains(&server) {
                0
            } else {
                server - (before + after) / 2
            })
        })
        .await
    }

    /// Whether the database can be reached, probed every `period` for as long as a receiver
    /// is left. Starts as reachable (it was, to open).
    pub fn reachability(&self, period: Duration) -> tokio::sync::watch::Receiver<bool> {
        let (up, reachable) = tokio::sync::watch::channel(true);
        let db = self.clone();
        tokio::spawn(async move {
            while !up.is_closed() {
                let now_up = db.ping(period.max(Duration::from_millis(500))).await;
                if up.send_if_modified(|was| std::mem::replace(was, now_up) != now_up) {
                    if now_up {
                        tracing::info!("the database is reachable");
                    } else {
                        tracing::warn!("the database is unreachable");
                    }
                }
                tokio::time::sleep(period).await;
            }
        });
        reachable
    }

    /// Listens on `channels` on a connection of its own and calls `on_notify(channel,
    /// payload)` for every notification. When the connection drops it reconnects with backoff
    /// and calls `on_notify("", "")` once back, since notifications may have been missed in
    /// between: callers treat a notification as a hint to look, never as the data.
    pub fn listen(
        &self,
        channels: &'static [&'static str],
        on_notify: impl Fn(&str, &str) + Send + Sync + 'static,
    ) -> Result<(), DbError> {
        let config = self.config.clone();
        self.handle()?.spawn(async move {
            let mut backoff = Duration::from_millis(100);
            let mut first = true;
            loop {
                match listen_once(&config, channels, &on_notify, &mut first).await {
                    Ok(()) => backoff = Duration::from_millis(100),
                    Err(e) => {
                        tracing::debug!(error = %e, "listener connection lost");
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
                on_notify("", "");
                tokio::time::sleep(backoff).await;
            }
        });
        Ok(())
    }
}

/// Blocks the calling thread on a future that needs no runtime of its own (a query of a
/// pooled connection: its I/O runs on the pool's runtime).
///
/// On a worker thread of a multi-threaded runtime (a gRPC handler, a stream) the wait is
/// announced to tokio first (`block_in_place`): the thread's other tasks go to another thread,
/// so a query that waits for the database stops nothing else — health checks, streams and
/// other RPCs are served however many reads wait. Elsewhere (a blocking-pool thread, a thread
/// of its own, a single-threaded runtime) it simply blocks.
pub fn wait<F: Future>(fut: F) -> F::Output {
    in_place(|| block_on(fut))
}

/// The future, outside tokio's cooperative budget, on the calling thread. Called from a task,
/// it would otherwise spend that task's budget, and once the budget is spent a tokio resource
/// it polls (the semaphore of the pool's statement cache, on a statement's first use on a
/// connection) answers "not yet" and defers its wake-up until the task yields, which a task
/// blocked here never does: the thread would wait for ever.
fn block_on<F: Future>(fut: F) -> F::Output {
    futures_executor::block_on(tokio::task::unconstrained(fut))
}

/// Runs `blocking`, which blocks the calling thread, announced to tokio when the thread is a
/// worker of a multi-threaded runtime (see [`wait`]). A single-threaded runtime has no other
/// thread to hand its tasks to (and `block_in_place` refuses it): there it just runs.
fn in_place<T>(blocking: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(blocking),
        _ => blocking(),
    }
}

async fn listen_once(
    config: &tokio_postgres::Config,
    channels: &[&str],
    on_notify: &(impl Fn(&str, &str) + Send + Sync),
    first: &mut bool,
) -> Result<(), DbError> {
    use futures_util::StreamExt;
    let (client, mut connection) = config.connect(NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                    if tx
                        .send((n.channel().to_owned(), n.payload().to_owned()))
                        .is_err()
                    {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(DbError::from(e)),
            }
        }
        Ok(())
    });
    let listen: String = channels.iter().map(|c| format!("LISTEN {c};")).collect();
    client.batch_execute(&listen).await?;
    if !*first {
        // Back after a loss: whatever was notified meanwhile is looked at now.
        on_notify("", "");
    }
    *first = false;
    while let Some((channel, payload)) = rx.recv().await {
        on_notify(&channel, &payload);
    }
    drop(client);
    driver
        .await
        .map_err(|e| DbError::Failed(format!("listener task failed: {e}")))?
}

/// Applies the migrations `schema` lacks, one transaction each, holding an advisory lock so
/// that replicas starting together do it once.
async fn migrate(pool: &Pool, schema: Schema) -> Result<(), DbError> {
    let mut client = pool.get().await?;
    client
        .batch_execute(
            "SELECT pg_advisory_lock(7231);
             CREATE TABLE IF NOT EXISTS arbor_schema (
                 component text PRIMARY KEY,
                 version integer NOT NULL
             );",
        )
        .await?;
    let result = apply_missing(&mut client, schema).await;
    let unlocked = client
        .batch_execute("SELECT pg_advisory_unlock(7231)")
        .await;
    result?;
    unlocked?;
    Ok(())
}

async fn apply_missing(client: &mut Object, schema: Schema) -> Result<(), DbError> {
    let known = i32::try_from(schema.migrations.len()).unwrap_or(i32::MAX);
    let found: i32 = client
        .query_opt(
            "SELECT version FROM arbor_schema WHERE component = $1",
            &[&schema.component],
        )
        .await?
        .map(|row| row.get(0))
        .unwrap_or(0);
    if found > known {
        return Err(DbError::SchemaTooNew {
            component: schema.component,
            found,
            known,
        });
    }
    for (i, sql) in schema.migrations.iter().enumerate().skip(found as usize) {
        let version = i as i32 + 1;
        let tx = client.transaction().await?;
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO arbor_schema (component, version) VALUES ($1, $2)
             ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version",
            &[&schema.component, &version],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(component = schema.component, version, "schema migrated");
    }
    Ok(())
}
