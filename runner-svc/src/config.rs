//! Serve configuration: `ServeConfig` (its defaults come from [`crate::defaults`]), the errors
//! serving can end with, and `open_runner`, which wires a store, the tools and the mailbox into a
//! `Runner`.

use std::{path::PathBuf, sync::Arc, time::Duration};

use arbor_shared::{auth::Authenticator, metrics::MetricsListen};

use crate::{
    defaults, engine,
    engine::{GuardConfig, ToolRegistry},
    error,
    mailbox::{MailboxConfig, StoreClock},
    retention,
    runs::{Runner, RunnerOptions},
    store,
};

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    /// A PostgreSQL URL: the runner's state lives there, shared with other replicas, instead
    /// of in `data_dir`.
    pub store_url: Option<String>,
    /// On PostgreSQL: whether start-up waits for the database whatever the error, for as long
    /// as it takes (`--store-wait-always`), instead of exiting on a refused login, a missing
    /// database or a newer schema, and after 30 s of an unreachable server.
    pub store_wait_always: bool,
    /// Jobs the in-process pool works on at once (`--workers`).
    pub workers: usize,
    pub lease: Duration,
    pub max_attempts: u32,
    /// Upper bound of the embedded store's page cache.
    pub cache_bytes: u64,
    pub auth: Authenticator,
    pub guards: GuardConfig,
    /// Tools task workers serve (`--task-type`), usable by every tree; a tree may declare
    /// more in its own `task_types`.
    pub task_types: Vec<String>,
    /// How long shutdown waits for in-flight work before giving up.
    pub drain: Duration,
    /// How long health says NOT_SERVING before shutdown starts closing anything.
    pub drain_grace: Duration,
    /// Where `/metrics` is served (`None`: off).
    pub metrics_listen: MetricsListen,
    pub retention: retention::RetentionConfig,
    /// Requests handled at once before new ones are shed with RESOURCE_EXHAUSTED.
    pub max_in_flight: usize,
    /// A stream subscriber that reads nothing for this long while its buffer is full is dropped
    /// with RESOURCE_EXHAUSTED (it resumes from its cursor).
    pub stream_lag_timeout: Duration,
    /// Serve TLS with this identity (deployments without a mesh); plaintext when `None`.
    pub tls: Option<tonic::transport::ServerTlsConfig>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from(defaults::DATA_DIR),
            store_url: None,
            store_wait_always: false,
            workers: defaults::POOL_SIZE,
            lease: defaults::LEASE,
            max_attempts: defaults::MAX_ATTEMPTS,
            cache_bytes: defaults::CACHE_MB << 20,
            auth: Authenticator::disabled(),
            guards: GuardConfig::default(),
            task_types: Vec::new(),
            drain: defaults::DRAIN,
            drain_grace: defaults::DRAIN_GRACE,
            metrics_listen: MetricsListen(None),
            retention: retention::RetentionConfig::default(),
            max_in_flight: defaults::MAX_IN_FLIGHT,
            stream_lag_timeout: defaults::STREAM_LAG_TIMEOUT,
            tls: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Open(#[from] store::OpenError),
    #[error("cannot open the runner's PostgreSQL store: {0}")]
    Database(#[from] arbor_shared::postgres::DbError),
    #[error("cannot start the runner: {0}")]
    Start(#[from] error::RunnerError),
    #[error(transparent)]
    Front(#[from] arbor_shared::server::FrontError),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("cannot listen for metrics on {0}: {1}")]
    Metrics(String, std::io::Error),
    /// The background check of the store found damage.
    #[error("{0}")]
    Damaged(String),
}

/// Opens the runner's database and core without serving (also used by tests and tools that
/// inspect a stopped runner's data).
pub async fn open_runner(cfg: &ServeConfig) -> Result<Arc<Runner>, ServeError> {
    let store = store::open(&store::OpenConfig {
        url: cfg.store_url.clone(),
        data_dir: cfg.data_dir.clone(),
        cache_bytes: cfg.cache_bytes,
        lock_wait: LOCK_WAIT,
        wait_always: cfg.store_wait_always,
    })
    .await?;
    let ledger = engine::LedgerTool::new(store.clone()).map_err(error::RunnerError::from)?;
    let mut tools = ToolRegistry::with_builtins(ledger, cfg.guards.clone());
    for name in &cfg.task_types {
        tools.declare_remote(name.clone());
    }
    let tools = Arc::new(tools);
    let opts = RunnerOptions {
        mailbox: MailboxConfig {
            lease: cfg.lease,
            default_max_attempts: cfg.max_attempts,
            ..MailboxConfig::default()
        },
        ..RunnerOptions::default()
    };
    let clock = Arc::new(StoreClock::new(store.clone()));
    Ok(Runner::open(store, clock, tools, opts).await?)
}

/// The store the runner keeps its state in, for the log: the data dir of the embedded store, or
/// `postgres` (never the URL: it may hold a password; no data dir is used then).
pub(crate) fn store_name(cfg: &ServeConfig) -> String {
    match &cfg.store_url {
        Some(_) => "postgres".to_string(),
        None => format!("sled:{}", cfg.data_dir.display()),
    }
}

/// How long start-up waits for another process (a previous instance still flushing) to release
/// the database lock before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(10);
