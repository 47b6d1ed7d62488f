//! Arbor's runner: ticks behaviour trees, checkpoints every run to its store, keeps the durable
//! mailbox of run requests and serves the durable, resumable event log over gRPC.
//!
//! `main.rs` parses flags and calls [`run`]; tests call the same `run` on port 0.

pub mod counts;
pub mod engine;
pub mod error;
pub mod events;
pub mod grpc;
pub mod mailbox;
pub mod metrics;
pub mod retention;
pub mod runs;
pub mod store;
pub mod tasks;
pub mod worker;

use std::{future::Future, path::PathBuf, sync::Arc, time::Duration};

use arbor_shared::{
    auth::{AuthInterceptor, Authenticator},
    metrics::MetricsListen,
    proto::runner::v1::{
        runner_service_server::RunnerServiceServer, worker_service_server::WorkerServiceServer,
    },
    server::MAX_MESSAGE_BYTES,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic_health::ServingStatus;

use crate::{
    engine::{GuardConfig, ToolRegistry},
    mailbox::{MailboxConfig, StoreClock},
    runs::{Runner, RunnerOptions},
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
            data_dir: PathBuf::from("data/runner"),
            store_url: None,
            store_wait_always: false,
            workers: 16,
            lease: Duration::from_secs(30),
            max_attempts: 5,
            cache_bytes: 64 << 20,
            auth: Authenticator::disabled(),
            guards: GuardConfig::default(),
            task_types: Vec::new(),
            drain: Duration::from_secs(10),
            drain_grace: Duration::ZERO,
            metrics_listen: MetricsListen(None),
            retention: retention::RetentionConfig::default(),
            max_in_flight: arbor_shared::limits::DEFAULT_MAX_IN_FLIGHT,
            stream_lag_timeout: Duration::from_secs(30),
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
fn store_name(cfg: &ServeConfig) -> String {
    match &cfg.store_url {
        Some(_) => "postgres".to_string(),
        None => format!("sled:{}", cfg.data_dir.display()),
    }
}

/// How long start-up waits for another process (a previous instance still flushing) to release
/// the database lock before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// Serves runner-svc on `listener` until `shutdown` resolves. The health service answers from
/// the start: NOT_SERVING while the database is opened and the previous process's claims are
/// recovered, SERVING once the runner is ready. On shutdown: NOT_SERVING first and everything
/// keeps serving for `drain_grace` (so load balancers stop routing here), then streams end with
/// UNAVAILABLE, workers stop, in-flight calls drain (bounded by `drain`) and the store is flushed.
pub async fn run(
    cfg: ServeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let metrics_listener = bind_metrics(&cfg).await?;
    let health = tonic_health::server::health_reporter();
    let mut front =
        Front::start_with(listener, health, cfg.max_in_flight, cfg.tls.clone(), true).await?;
    tracing::info!(addr = ?front.addr, store = %store_name(&cfg), "runner-svc recovering (health NOT_SERVING)");
    let mut shutdown = Box::pin(shutdown);
    let opened = tokio::select! {
        r = open_runner(&cfg) => Some(r),
        _ = &mut shutdown => None,
    };
    match opened {
        Some(Ok(runner)) => serve_opened(cfg, runner, front, shutdown, metrics_listener).await,
        Some(Err(e)) => {
            front.close(cfg.drain).await;
            Err(e)
        }
        None => {
            front.close(cfg.drain).await;
            Ok(())
        }
    }
}

/// Serves an already opened runner (tests use this to reach the runner's internals).
pub async fn serve_runner(
    cfg: ServeConfig,
    runner: Arc<Runner>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    health: tonic_health::server::HealthReporter,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
) -> Result<(), ServeError> {
    let metrics_listener = bind_metrics(&cfg).await?;
    let front = Front::start_with(
        listener,
        (health, health_service),
        cfg.max_in_flight,
        cfg.tls.clone(),
        true,
    )
    .await?;
    serve_opened(cfg, runner, front, Box::pin(shutdown), metrics_listener).await
}

async fn bind_metrics(cfg: &ServeConfig) -> Result<Option<TcpListener>, ServeError> {
    arbor_shared::metrics::bind(cfg.metrics_listen)
        .await
        .map_err(|e| ServeError::Metrics(cfg.metrics_listen.to_string(), e))
}

/// The runner's server: health and reflection from start-up on, the RunnerService and the
/// WorkerService once set.
type Front = arbor_shared::server::Front<ApiService, WorkerApi>;

async fn serve_opened(
    cfg: ServeConfig,
    runner: Arc<Runner>,
    mut front: Front,
    mut shutdown: std::pin::Pin<Box<impl Future<Output = ()> + Send + 'static>>,
    metrics_listener: Option<TcpListener>,
) -> Result<(), ServeError> {
    let stop = CancellationToken::new();
    let mut background = tokio::task::JoinSet::new();
    background.spawn(record_progress(runner.clone(), stop.clone()));
    front.api.set(InterceptedService::new(
        RunnerServiceServer::new(grpc::RunnerGrpc::new(
            runner.clone(),
            stop.clone(),
            cfg.stream_lag_timeout,
        ))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(arbor_shared::server::MAX_RESPONSE_BYTES),
        AuthInterceptor(cfg.auth.clone()),
    ));
    if let Some(extra) = &front.extra {
        extra.set(InterceptedService::new(
            WorkerServiceServer::new(grpc::worker::WorkerGrpc::new(runner.clone(), stop.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(arbor_shared::server::MAX_RESPONSE_BYTES),
            AuthInterceptor(cfg.auth.clone()),
        ));
    }
    if let Some(l) = metrics_listener {
        let registry = Arc::new(metrics::registry(runner.clone()));
        background.spawn(arbor_shared::metrics::serve(
            l,
            registry,
            stop.clone().cancelled_owned(),
        ));
    }
    front.set_health(ServingStatus::Serving).await;
    // On a database server, health says NOT_SERVING while it cannot be reached (RPCs answer
    // UNAVAILABLE meanwhile) and SERVING again once it can; the pool reconnects on its own.
    let reachability = runner
        .store()
        .reachable()
        .map(|up| front.follow_reachability(up));
    tracing::info!(
        addr = ?front.addr,
        workers = cfg.workers,
        auth = cfg.auth.is_enabled(),
        "runner-svc serving"
    );

    // The whole-store check runs now, in the background, so start-up does not grow with the
    // data. Workers and retention, which change runs on their own, start once it has passed;
    // damage it finds stops the service with an error, as damage found at open does.
    let store = runner.store().clone();
    let mut verify = tokio::task::spawn_blocking(move || store.verify());
    let mut workers = None;
    let server_ended = loop {
        tokio::select! {
            _ = &mut shutdown => break None,
            r = front.stopped() => break Some(r),
            checked = &mut verify, if workers.is_none() => match checked {
                Ok(Ok(())) => {
                    tracing::info!("store verified; workers starting");
                    let mut pool = worker::spawn(runner.clone(), cfg.workers, stop.clone());
                    pool.spawn(runs::tasks::reap_task_leases(runner.clone(), stop.clone()));
                    pool.spawn(retention::compactor(
                        runner.clone(),
                        cfg.retention.clone(),
                        stop.clone(),
                    ));
                    workers = Some(pool);
                }
                damaged => {
                    let message = match damaged {
                        Ok(Err(e)) => e.to_string(),
                        Err(e) => format!("the store check stopped: {e}"),
                        Ok(Ok(())) => String::new(),
                    };
                    if let Some(task) = &reachability {
                        task.abort();
                    }
                    front.set_health(ServingStatus::NotServing).await;
                    stop.cancel();
                    front.close(cfg.drain).await;
                    background.join_all().await;
                    return Err(ServeError::Damaged(message));
                }
            },
        }
    };
    if let Some(task) = reachability {
        // From here on health says NOT_SERVING, whatever the database does.
        task.abort();
    }
    front
        .grace(cfg.drain_grace, server_ended.is_none(), "runner-svc")
        .await;
    stop.cancel();
    let served = match server_ended {
        Some(Ok(r)) => Some(r),
        Some(Err(_)) => None,
        None => front.close(cfg.drain).await,
    };
    let joined = async {
        if let Some(pool) = workers {
            pool.join_all().await;
        }
        background.join_all().await;
    };
    if tokio::time::timeout(cfg.drain, joined).await.is_err() {
        tracing::warn!("workers did not stop within the drain timeout");
    }
    runner.flush().await?;
    if let Err(e) = runner.record_progress().await {
        tracing::error!(error = %e, "cannot record the final progress in the integrity marker");
    }
    tracing::info!("runner-svc stopped");
    match served {
        Some(r) => Ok(r?),
        // Aborted after the drain timeout, or the server task panicked: the store is flushed anyway.
        None => Ok(()),
    }
}

type ApiService = InterceptedService<RunnerServiceServer<grpc::RunnerGrpc>, AuthInterceptor>;
type WorkerApi = InterceptedService<WorkerServiceServer<grpc::worker::WorkerGrpc>, AuthInterceptor>;

/// How often the integrity marker records the durable progress: a loss of data made durable
/// in the last interval before a crash cannot be told from the crash itself.
const PROGRESS_RECORD_INTERVAL: Duration = Duration::from_secs(1);

async fn record_progress(runner: Arc<Runner>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(PROGRESS_RECORD_INTERVAL) => {}
        }
        if let Err(e) = runner.record_progress().await {
            tracing::error!(error = %e, "cannot record durable progress in the integrity marker");
        }
    }
}
