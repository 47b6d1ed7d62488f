//! `run`: serves health (NOT_SERVING) on the bound listener at once, opens the store, starts the
//! loops with the runner, the deadline timer, retention and `/metrics`, serves the ApprovalService and
//! reflection, and shuts down in order: health NOT_SERVING → drain grace → streams end with
//! UNAVAILABLE → bounded drain → store flushed.

use std::{future::Future, sync::Arc, time::Duration};

use arbor_shared::{
    auth::AuthInterceptor,
    proto::approval::v1::approval_service_server::ApprovalServiceServer,
    server::{Front, MAX_MESSAGE_BYTES},
};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic_health::ServingStatus;

use crate::{
    approvals::Approvals,
    config::ServeConfig,
    deadline::DeadlineTimer,
    error::Error,
    grpc::ApprovalApi,
    retention::Compactor,
    runner::{
        connect_lazy,
        delivery::Delivery,
        subscriber::{SUBSCRIPTION_HEALTH, Subscriber},
    },
    store::{self, ApprovalStore, PgStore},
};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot open the approval store: {0}")]
    Store(Error),
    #[error("bad runner settings: {0}")]
    Runner(Error),
    #[error(transparent)]
    Front(#[from] arbor_shared::server::FrontError),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("cannot listen for metrics on {0}: {1}")]
    Metrics(String, std::io::Error),
    #[error("cannot listen for the web inbox on {0}: {1}")]
    Web(String, std::io::Error),
}

/// Serves until `shutdown` resolves, then drains and returns. Tests call this on port 0.
///
/// Health answers from the moment the listener is served: NOT_SERVING while the store is
/// opened, SERVING once the loops run. On shutdown health turns NOT_SERVING first and everything
/// keeps working for `drain_grace` (load balancers stop routing here), then new decisions are
/// refused, streams end with UNAVAILABLE, in-flight calls drain and the store is flushed.
pub async fn run(
    cfg: ServeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let web = match cfg.web.listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|e| ServeError::Web(addr.to_string(), e))?,
        ),
        None => None,
    };
    run_with_web(cfg, listener, web, shutdown).await
}

/// [`run`], serving the web inbox on `web` (already bound; tests bind port 0) instead of
/// binding `cfg.web.listen`.
pub async fn run_with_web(
    cfg: ServeConfig,
    listener: TcpListener,
    web: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    match cfg.store_url.clone() {
        Some(url) => {
            let patience = match cfg.store_wait_always {
                true => arbor_shared::postgres::Patience::Always,
                false => arbor_shared::postgres::Patience::Reachable(store::PG_OPEN_PATIENCE),
            };
            serve(cfg, listener, web, shutdown, async move {
                PgStore::open_with(&url, patience).await
            })
            .await
        }
        None => {
            let data_dir = cfg.data_dir.clone();
            serve(cfg, listener, web, shutdown, store::open(&data_dir)).await
        }
    }
}

/// `run` on whatever store `open` opens; nothing below names a backend.
async fn serve<S: ApprovalStore>(
    cfg: ServeConfig,
    listener: TcpListener,
    web_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send,
    open: impl Future<Output = Result<S, Error>> + Send,
) -> Result<(), ServeError> {
    let replica = match (&cfg.replica_name, listener.local_addr()) {
        (Some(name), _) => name.clone(),
        (None, Ok(addr)) => crate::leader::default_name(addr.port()),
        (None, Err(_)) => crate::leader::default_name(0),
    };
    let metrics_listener = arbor_shared::metrics::bind(cfg.metrics_listen)
        .await
        .map_err(|e| ServeError::Metrics(cfg.metrics_listen.to_string(), e))?;
    let mut front: Front<ApiService<S>> = Front::start(
        listener,
        tonic_health::server::health_reporter(),
        cfg.max_in_flight,
        cfg.tls.clone(),
    )
    .await?;
    let health = front
        .health_of(SUBSCRIPTION_HEALTH, ServingStatus::NotServing)
        .await
        .clone();
    let stop = CancellationToken::new();

    let mut shutdown = std::pin::pin!(shutdown);
    let opened = tokio::select! {
        r = open => Some(r),
        _ = &mut shutdown => None,
    };
    let store = match opened {
        Some(Ok(store)) => store,
        other => {
            front.close(cfg.tuning.drain_timeout).await;
            return match other {
                Some(Err(e)) => Err(ServeError::Store(e)),
                _ => Ok(()),
            };
        }
    };
    let client = match connect_lazy(
        &cfg.runner_url,
        cfg.runner_token.as_deref(),
        cfg.runner_tls.clone(),
    ) {
        Ok(c) => c,
        Err(e) => {
            front.close(cfg.tuning.drain_timeout).await;
            return Err(ServeError::Runner(e));
        }
    };
    // Never the URL: it may hold a password.
    let store_kind = match &cfg.store_url {
        Some(_) => "postgres".to_string(),
        None => cfg.data_dir.display().to_string(),
    };
    tracing::info!(
        store = %store_kind,
        runner = %cfg.runner_url,
        policy_rules = cfg.policy.rule_count(),
        auth = cfg.auth.is_enabled(),
        replica = %replica,
        "approval-svc starting"
    );
    store.route_webhooks(cfg.webhooks.routes());
    let approvals = Approvals::new(Arc::new(store), cfg.policy.clone())
        .named(replica)
        .with_directory(cfg.auth.directory());
    let mut tasks: Vec<JoinHandle<()>> = vec![
        tokio::spawn(record_progress(approvals.clone(), stop.clone())),
        tokio::spawn(lead(
            Leader {
                approvals: approvals.clone(),
                client,
                cfg: cfg.clone(),
                health: health.clone(),
            },
            stop.clone(),
        )),
        tokio::spawn(approvals.clone().follow_foreign(stop.clone())),
    ];
    if let Some(l) = metrics_listener {
        let scraped = approvals.clone();
        let registry = Arc::new(crate::metrics::registry(
            approvals.shared_metrics(),
            move || crate::metrics::Scraped {
                replica: scraped.replica().name().to_string(),
                leading: scraped.replica().is_leading(),
                pending: scraped.store().pending_count().ok(),
                fsyncs: scraped.store().fsyncs(),
            },
        ));
        tasks.push(tokio::spawn(arbor_shared::metrics::serve(
            l,
            registry,
            stop.clone().cancelled_owned(),
        )));
    }

    front.api.set(InterceptedService::new(
        ApprovalServiceServer::new(ApprovalApi::new(
            approvals.clone(),
            cfg.auth.is_enabled(),
            stop.clone(),
        ))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(arbor_shared::server::MAX_RESPONSE_BYTES),
        AuthInterceptor(cfg.auth.clone()),
    ));
    if let Some(l) = web_listener {
        let runner = crate::runner::channel_lazy(&cfg.runner_url, cfg.runner_tls.clone())
            .map_err(ServeError::Runner)?;
        let web = crate::web::Web::new(
            ApprovalApi::new(approvals.clone(), cfg.auth.is_enabled(), stop.clone()),
            approvals.clone(),
            cfg.auth.clone(),
            cfg.web.clone(),
            runner,
            cfg.runner_token.clone(),
        );
        tasks.push(tokio::spawn(crate::web::serve(l, web, stop.clone())));
    }
    front.set_health(ServingStatus::Serving).await;
    tracing::info!(addr = ?front.addr, "approval-svc serving");
    let reachability = approvals
        .store()
        .reachable()
        .map(|up| front.follow_reachability(up));

    let outcome = tokio::select! {
        _ = &mut shutdown => None,
        r = front.stopped() => Some(r),
    };
    if let Some(task) = reachability {
        // From here on health says NOT_SERVING, whatever the database does.
        task.abort();
    }
    front
        .grace(cfg.drain_grace, outcome.is_none(), "approval-svc")
        .await;
    stop.cancel();
    let served = match outcome {
        Some(r) => r,
        None => Ok(front
            .close(cfg.tuning.drain_timeout)
            .await
            .unwrap_or(Ok(()))),
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
    if let Err(e) = approvals.store().record_progress().await {
        tracing::error!(error = %e, "cannot record the final progress in the integrity marker");
    }
    tracing::info!("approval-svc stopped");
    match served {
        Ok(r) => r.map_err(ServeError::Transport),
        // The server task panicked or was aborted; the store is flushed regardless.
        Err(_) => Ok(()),
    }
}

type ApiService<S> = InterceptedService<ApprovalServiceServer<ApprovalApi<S>>, AuthInterceptor>;

/// How often the integrity marker records the durable progress: a loss of data made durable
/// in the last interval before a crash cannot be told from the crash itself.
const PROGRESS_RECORD_INTERVAL: Duration = Duration::from_secs(1);

async fn record_progress<S: ApprovalStore>(approvals: Approvals<S>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(PROGRESS_RECORD_INTERVAL) => {}
        }
        if let Err(e) = approvals.store().record_progress().await {
            tracing::error!(error = %e, "cannot record durable progress in the integrity marker");
        }
    }
}

/// What the leader runs, and what it needs to run it.
struct Leader<S> {
    approvals: Approvals<S>,
    client: crate::runner::RunnerClient,
    cfg: ServeConfig,
    health: tonic_health::server::HealthReporter,
}

/// How often a replica that does not lead tries to.
const LEAD_RETRY: Duration = Duration::from_secs(1);

/// Runs the loops that must run in one process at a time (the event subscription, delivery,
/// the deadline timer, retention) while this process leads, and tries to lead every
/// `LEAD_RETRY` while it does not. Losing the leadership stops them before anything else
/// happens; the leadership is given up only once they have stopped. Gaining and losing it are
/// logged with this replica's name and shown by the `arbor_approval_leader` gauge.
async fn lead<S: ApprovalStore>(leader: Leader<S>, stop: CancellationToken) {
    let store = leader.approvals.store();
    let replica = leader.approvals.replica();
    loop {
        let tried = tokio::select! {
            _ = stop.cancelled() => return,
            r = store.lead_as(replica.name()) => r,
        };
        match tried {
            Ok(Some(leadership)) => {
                replica.set_leading(true);
                tracing::info!(
                    replica = replica.name(),
                    "leading: following the runner, delivering, expiring, compacting"
                );
                let round = stop.child_token();
                let loops = leader.start(round.clone());
                let lost = tokio::select! {
                    _ = stop.cancelled() => false,
                    _ = leadership.lost() => true,
                };
                // Stops saying it leads before its loops stop, so no two replicas say so at once.
                replica.set_leading(false);
                if lost {
                    tracing::warn!(
                        replica = replica.name(),
                        "leadership lost; the leader's loops stop"
                    );
                }
                round.cancel();
                for task in loops {
                    if tokio::time::timeout(leader.cfg.tuning.drain_timeout, task)
                        .await
                        .is_err()
                    {
                        tracing::warn!("a leader's loop did not stop in time");
                    }
                }
                drop(leadership);
                if stop.is_cancelled() {
                    tracing::info!(
                        replica = replica.name(),
                        "leadership given up: shutting down"
                    );
                    return;
                }
            }
            Ok(None) => tracing::debug!("another replica leads"),
            Err(e) => tracing::debug!(error = %e, "cannot try to lead"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(LEAD_RETRY) => {}
        }
    }
}

impl<S: ApprovalStore> Leader<S> {
    fn start(&self, round: CancellationToken) -> Vec<JoinHandle<()>> {
        let approvals = self.approvals.clone();
        let webhooks = crate::webhooks::deliver::start(
            self.approvals.shared_store(),
            self.approvals.shared_metrics(),
            &self.cfg.webhooks,
            move || approvals.subscribe(),
            round.clone(),
        );
        let mut loops = vec![
            tokio::spawn(
                Subscriber {
                    approvals: self.approvals.clone(),
                    client: self.client.clone(),
                    tuning: self.cfg.tuning.clone(),
                    health: self.health.clone(),
                    shutdown: round.clone(),
                }
                .run(),
            ),
            tokio::spawn(
                Delivery {
                    approvals: self.approvals.clone(),
                    client: self.client.clone(),
                    tuning: self.cfg.tuning.clone(),
                    shutdown: round.clone(),
                }
                .run(),
            ),
            tokio::spawn(
                DeadlineTimer {
                    approvals: self.approvals.clone(),
                    shutdown: round.clone(),
                }
                .run(),
            ),
            tokio::spawn(
                Compactor {
                    store: self.approvals.shared_store(),
                    metrics: self.approvals.shared_metrics(),
                    cfg: self.cfg.retention.clone(),
                    shutdown: round,
                }
                .run(),
            ),
        ];
        loops.extend(webhooks);
        loops
    }
}
