//! Arbor's runner: ticks behaviour trees, checkpoints every run to its store, keeps the durable
//! mailbox of run requests and serves the durable, resumable event log over gRPC.
//!
//! `main.rs` parses flags and calls [`run`]; tests call the same `run` on port 0.

pub mod config;
pub mod counts;
pub mod defaults;
pub mod engine;
pub mod error;
pub mod events;
pub mod grpc;
pub mod mailbox;
pub mod metrics;
pub mod pool;
pub mod retention;
pub mod runs;
pub mod store;
pub mod tasks;

use std::{future::Future, sync::Arc, time::Duration};

use arbor_shared::{
    auth::AuthInterceptor,
    proto::runner::v1::{
        runner_service_server::RunnerServiceServer, worker_service_server::WorkerServiceServer,
    },
    server::MAX_MESSAGE_BYTES,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic_health::ServingStatus;

pub use config::{ServeConfig, ServeError, open_runner};

use crate::{config::store_name, runs::Runner};

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
                    let mut pool = pool::spawn(runner.clone(), cfg.workers, stop.clone());
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
