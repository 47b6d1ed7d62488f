//! Arbor's runner: ticks behaviour trees, checkpoints every run to sled, keeps the durable
//! mailbox of run requests and serves the durable, resumable event log over gRPC.
//!
//! `main.rs` parses flags and calls [`run`]; tests call the same `run` on port 0.

pub mod cli;
pub mod engine;
pub mod error;
pub mod events;
pub mod grpc;
pub mod mailbox;
pub mod retention;
pub mod runs;
pub mod store;
pub mod worker;

use std::{future::Future, path::PathBuf, sync::Arc, time::Duration};

use arbor_shared::{
    auth::{AuthInterceptor, Authenticator},
    proto::runner::v1::runner_service_server::RunnerServiceServer,
    server::{MAX_MESSAGE_BYTES, incoming, reflection_services},
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic_health::ServingStatus;

use crate::{
    engine::{GuardConfig, LedgerTool, ToolRegistry},
    mailbox::{MailboxConfig, SystemClock},
    runs::{Runner, RunnerOptions},
    store::Store,
};

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    pub workers: usize,
    pub lease: Duration,
    pub max_attempts: u32,
    /// Upper bound of sled's page cache.
    pub cache_bytes: u64,
    pub auth: Authenticator,
    pub guards: GuardConfig,
    /// How long shutdown waits for in-flight work before giving up.
    pub drain: Duration,
    pub retention: retention::RetentionConfig,
    /// Requests handled at once before new ones are shed with RESOURCE_EXHAUSTED.
    pub max_in_flight: usize,
    /// A stream subscriber that reads nothing for this long while its buffer is full is dropped
    /// with RESOURCE_EXHAUSTED (it resumes from its cursor).
    pub stream_lag_timeout: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("data/runner"),
            workers: 16,
            lease: Duration::from_secs(30),
            max_attempts: 5,
            cache_bytes: 64 << 20,
            auth: Authenticator::disabled(),
            guards: GuardConfig::default(),
            drain: Duration::from_secs(10),
            retention: retention::RetentionConfig::default(),
            max_in_flight: arbor_shared::limits::DEFAULT_MAX_IN_FLIGHT,
            stream_lag_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Open(#[from] store::OpenError),
    #[error("cannot start the runner: {0}")]
    Start(#[from] error::RunnerError),
    #[error("cannot build reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The tree name under which the ledger tool keeps its records.
pub const LEDGER_TREE: &str = "ledger";

/// Opens the runner's database and core without serving (also used by tests and tools that
/// inspect a stopped runner's data).
pub async fn open_runner(cfg: &ServeConfig) -> Result<Arc<Runner>, ServeError> {
    let store = Store::open(&cfg.data_dir, cfg.cache_bytes)?;
    let ledger =
        LedgerTool::new(
            store
                .db()
                .open_tree(LEDGER_TREE)
                .map_err(|e| store::OpenError::Open {
                    path: cfg.data_dir.display().to_string(),
                    source: e,
                })?,
        );
    let tools = Arc::new(ToolRegistry::with_builtins(ledger, cfg.guards.clone()));
    let opts = RunnerOptions {
        mailbox: MailboxConfig {
            lease: cfg.lease,
            default_max_attempts: cfg.max_attempts,
            ..MailboxConfig::default()
        },
        ..RunnerOptions::default()
    };
    Ok(Runner::open(store, Arc::new(SystemClock::default()), tools, opts).await?)
}

/// Serves runner-svc on `listener` until `shutdown` resolves, then drains: health goes
/// NOT_SERVING, streams end with UNAVAILABLE, workers stop, sled is flushed.
pub async fn run(
    cfg: ServeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    let runner = open_runner(&cfg).await?;
    serve_runner(cfg, runner, listener, shutdown, health, health_service).await
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
    let stop = CancellationToken::new();
    let mut workers = worker::spawn(runner.clone(), cfg.workers, stop.clone());
    workers.spawn(retention::compactor(
        runner.clone(),
        cfg.retention.clone(),
        stop.clone(),
    ));
    let service = RunnerServiceServer::new(grpc::RunnerGrpc::new(
        runner.clone(),
        stop.clone(),
        cfg.stream_lag_timeout,
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let service = InterceptedService::new(service, AuthInterceptor(cfg.auth.clone()));
    let (reflection_v1, reflection_v1alpha) = reflection_services()?;

    let addr = listener.local_addr().ok();
    health.set_service_status("", ServingStatus::Serving).await;
    health
        .set_serving::<RunnerServiceServer<grpc::RunnerGrpc>>()
        .await;
    tracing::info!(?addr, data_dir = %cfg.data_dir.display(), workers = cfg.workers, auth = cfg.auth.is_enabled(), "runner-svc serving");

    let drain_health = health.clone();
    let drain_stop = stop.clone();
    let signal = async move {
        shutdown.await;
        tracing::info!("shutdown requested: draining");
        drain_health
            .set_service_status("", ServingStatus::NotServing)
            .await;
        drain_health
            .set_not_serving::<RunnerServiceServer<grpc::RunnerGrpc>>()
            .await;
        drain_stop.cancel();
    };
    let server = tonic::transport::Server::builder()
        .layer(arbor_shared::limits::LoadShedLayer::new(cfg.max_in_flight))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming(listener), signal);
    // Graceful shutdown waits for open connections; the drain bound keeps a client that never
    // hangs up from holding the process forever.
    let bounded_drain = async {
        stop.cancelled().await;
        tokio::time::sleep(cfg.drain).await;
    };
    let served = tokio::select! {
        served = server => served,
        _ = bounded_drain => {
            tracing::warn!(drain = ?cfg.drain, "connections still open after the drain timeout; closing");
            Ok(())
        }
    };
    stop.cancel();
    let drained = tokio::time::timeout(cfg.drain, workers.join_all()).await;
    if drained.is_err() {
        tracing::warn!("workers did not stop within the drain timeout");
    }
    runner.flush().await?;
    tracing::info!("runner-svc stopped");
    served?;
    Ok(())
}
