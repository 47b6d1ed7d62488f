//! `run`: opens the store, starts the loops with the runner and the deadline timer, serves the
//! ApprovalService, health and reflection on a bound listener, and shuts down in order:
//! health NOT_SERVING → streams end with UNAVAILABLE → bounded drain → store flushed.

use std::{future::Future, sync::Arc, time::Duration};

use arbor_shared::{
    auth::AuthInterceptor,
    proto::approval::v1::approval_service_server::{ApprovalServiceServer, SERVICE_NAME},
    server::{MAX_MESSAGE_BYTES, incoming, reflection_services},
};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{
    approvals::Approvals,
    config::ServeConfig,
    deadline::DeadlineTimer,
    error::Error,
    grpc::ApprovalApi,
    runner::{
        connect_lazy,
        delivery::Delivery,
        subscriber::{SUBSCRIPTION_HEALTH, Subscriber},
    },
    store::{ApprovalStore, SledStore},
};

/// How long a restart waits for a previous instance in this process to release the database.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot open the approval store: {0}")]
    Store(Error),
    #[error("bad runner settings: {0}")]
    Runner(Error),
    #[error("reflection: {0}")]
    Reflection(String),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

async fn set_all(health: &HealthReporter, status: ServingStatus) {
    health.set_service_status("", status).await;
    health.set_service_status(SERVICE_NAME, status).await;
}

/// Serves until `shutdown` resolves, then drains and returns. Tests call this on port 0.
pub async fn run(
    cfg: ServeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    set_all(&health, ServingStatus::NotServing).await;
    health
        .set_service_status(SUBSCRIPTION_HEALTH, ServingStatus::NotServing)
        .await;

    let store = open_store(&cfg).await.map_err(ServeError::Store)?;
    let client =
        connect_lazy(&cfg.runner_url, cfg.runner_token.as_deref()).map_err(ServeError::Runner)?;
    tracing::info!(
        data_dir = %cfg.data_dir.display(),
        runner = %cfg.runner_url,
        policy_rules = cfg.policy.rule_count(),
        auth = cfg.auth.is_enabled(),
        "approval-svc starting"
    );
    let approvals = Approvals::new(Arc::new(store), cfg.policy.clone());
    let stop = CancellationToken::new();
    let tasks: Vec<JoinHandle<()>> = vec![
        tokio::spawn(
            Subscriber {
                approvals: approvals.clone(),
                client: client.clone(),
                tuning: cfg.tuning.clone(),
                health: health.clone(),
                shutdown: stop.clone(),
            }
            .run(),
        ),
        tokio::spawn(
            Delivery {
                approvals: approvals.clone(),
                client,
                tuning: cfg.tuning.clone(),
                shutdown: stop.clone(),
            }
            .run(),
        ),
        tokio::spawn(
            DeadlineTimer {
                approvals: approvals.clone(),
                shutdown: stop.clone(),
            }
            .run(),
        ),
    ];

    let api = ApprovalServiceServer::new(ApprovalApi::new(
        approvals.clone(),
        cfg.auth.is_enabled(),
        stop.clone(),
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let (reflection_v1, reflection_v1alpha) =
        reflection_services().map_err(|e| ServeError::Reflection(e.to_string()))?;
    let local = listener.local_addr().ok();
    let drained = stop.clone();
    let server = tonic::transport::Server::builder()
        .layer(arbor_shared::limits::LoadShedLayer::new(cfg.max_in_flight))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(InterceptedService::new(
            api,
            AuthInterceptor(cfg.auth.clone()),
        ))
        .serve_with_incoming_shutdown(incoming(listener), async move { drained.cancelled().await });
    let mut server = tokio::spawn(server);
    set_all(&health, ServingStatus::Serving).await;
    tracing::info!(addr = ?local, "approval-svc serving");

    let outcome = tokio::select! {
        _ = shutdown => None,
        r = &mut server => Some(r),
    };
    tracing::info!("approval-svc draining");
    set_all(&health, ServingStatus::NotServing).await;
    stop.cancel();
    let served = match outcome {
        Some(r) => r,
        None => match tokio::time::timeout(cfg.tuning.drain_timeout, &mut server).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!("drain timed out; closing the remaining calls");
                server.abort();
                Ok(Ok(()))
            }
        },
    };
    for task in tasks {
        if tokio::time::timeout(cfg.tuning.drain_timeout, task)
            .await
            .is_err()
        {
            tracing::warn!("a background task did not stop in time");
        }
    }
    if let Err(e) = approvals.store().flush().await {
        tracing::error!(error = %e, "final flush of the approval store failed");
    }
    tracing::info!("approval-svc stopped");
    match served {
        Ok(r) => r.map_err(ServeError::Transport),
        // The server task panicked or was aborted; the store is flushed regardless.
        Err(_) => Ok(()),
    }
}

async fn open_store(cfg: &ServeConfig) -> Result<SledStore, Error> {
    let deadline = tokio::time::Instant::now() + OPEN_TIMEOUT;
    loop {
        match SledStore::open(&cfg.data_dir) {
            // Another `run` in this process may still be letting go of the database.
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
