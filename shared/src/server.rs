//! Serving plumbing both binaries share: tracing set-up, the shutdown signal, reflection, the
//! rule that an unauthenticated service only listens on loopback, the deferred service that
//! lets health answer NOT_SERVING while the real service is still recovering, and [`Front`],
//! the one server skeleton both services run (health, reflection, load shedding, drain).

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use tokio::sync::watch;

use tonic::{
    body::Body,
    codegen::{BoxFuture, Context, Poll, Service, http},
    server::NamedService,
};

use tokio_stream::wrappers::TcpListenerStream;

/// Largest gRPC request either service accepts (4 MiB, tonic's default decode limit); larger
/// requests get OUT_OF_RANGE.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Largest gRPC response either service sends, and what approval-svc and the CLIs accept from a
/// service. A run's blackboard grows as it works (tool results, `set`), and its view, its events
/// and its approvals carry that data, so responses may outgrow the request limit; a client that
/// fetches big runs raises its receive limit to this.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Initialises the global tracing subscriber without exporting anything (see
/// [`crate::otel::init_tracing`] for the serving commands).
pub fn init_tracing(json: bool) {
    let _ = crate::otel::init_tracing(json, None);
}

/// A future that resolves on SIGTERM or SIGINT. The handlers are installed when this is
/// called, not when the future is first polled: a signal that arrives while start-up has not
/// yet polled the future (opening the store may finish in one poll) is kept for it instead of
/// killing the process with the default action. Call it inside the runtime, before serving.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{Signal, SignalKind, signal};
        /// Resolves when `handler`'s signal arrives; never, for a signal without a handler.
        async fn arrival(handler: Option<Signal>) {
            match handler {
                Some(mut handler) => {
                    handler.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            tokio::select! {
                _ = arrival(term) => {}
                _ = arrival(int) => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Refuses to serve without authentication anywhere but loopback, unless `insecure` is set.
pub fn check_bind(addr: SocketAddr, auth_enabled: bool, insecure: bool) -> Result<(), String> {
    if auth_enabled || addr.ip().is_loopback() {
        return Ok(());
    }
    if insecure {
        tracing::warn!(%addr, "serving WITHOUT authentication on a non-loopback address (--insecure)");
        return Ok(());
    }
    Err(format!(
        "refusing to listen on {addr} without authentication: give --tokens FILE, bind a loopback \
         address, or pass --insecure"
    ))
}

/// The accepted-connection stream of a bound listener, with TCP_NODELAY set: gRPC writes small
/// frames, and Nagle's algorithm meeting delayed ACKs would add ~40 ms to every exchange.
pub fn incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    TcpListenerStream::new(listener).map(|conn| {
        let conn = conn?;
        conn.set_nodelay(true)?;
        Ok(conn)
    })
}

/// gRPC server reflection (v1 and v1alpha) over every Arbor proto.
pub fn reflection_services() -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    tonic_reflection::server::Error,
> {
    let v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    Ok((v1, v1alpha))
}

/// A gRPC service that is routed from the moment the server binds but only exists once start-up
/// has recovered its state, so the health service can answer (NOT_SERVING) on the same port
/// meanwhile. A call that arrives before [`Deferred::set`] waits for it, within the caller's
/// deadline, as it would have waited in the accept backlog before health-first start-up.
pub struct Deferred<S> {
    slot: Arc<watch::Sender<Option<S>>>,
}

impl<S> Clone for Deferred<S> {
    fn clone(&self) -> Self {
        Self {
            slot: self.slot.clone(),
        }
    }
}

impl<S> Default for Deferred<S> {
    fn default() -> Self {
        Self {
            slot: Arc::new(watch::channel(None).0),
        }
    }
}

impl<S> Deferred<S> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Installs the real service; waiting and later calls are routed to it.
    pub fn set(&self, service: S) {
        self.slot.send_replace(Some(service));
    }
}

impl<S: NamedService> NamedService for Deferred<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<Body>> for Deferred<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let mut slot = self.slot.subscribe();
        Box::pin(async move {
            // Ends only with the server (start-up failed): then the call is UNAVAILABLE.
            let inner = slot
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|s| s.clone());
            match inner {
                Some(mut inner) => {
                    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                    Ok(inner.call(req).await?.map(Body::new))
                }
                None => Ok(tonic::Status::unavailable("service failed to start").into_http()),
            }
        })
    }
}

/// The gRPC server of a service whose API is `S`: health and reflection answer from the moment
/// it binds, the API once [`Deferred::set`], and load shedding guards all of them. Health is
/// reported for the whole server and for the API's name together.
///
/// The shutdown order both services follow: [`set_health`](Self::set_health) NOT_SERVING, keep
/// serving for the drain grace (so load balancers stop routing here; [`grace`](Self::grace)),
/// end the service's own streams and loops, then [`close`](Self::close): stop accepting and
/// wait, within the drain timeout, for the calls in flight.
pub struct Front<S, W = S> {
    pub addr: Option<SocketAddr>,
    pub api: Deferred<S>,
    /// A second API on the same port (runner-svc's WorkerService), when started with one.
    pub extra: Option<Deferred<W>>,
    health: tonic_health::server::HealthReporter,
    /// Every name health reports under; their watches end at [`Front::close`].
    health_names: Vec<&'static str>,
    closing: tokio_util::sync::CancellationToken,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

/// Starting the server failed.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    #[error("cannot build reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

impl<S, B> Front<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    /// Serves `listener` with the health service of `health` (NOT_SERVING until told
    /// otherwise), reflection, and the API once it is set.
    pub async fn start(
        listener: tokio::net::TcpListener,
        health: (
            tonic_health::server::HealthReporter,
            tonic_health::pb::health_server::HealthServer<
                impl tonic_health::pb::health_server::Health,
            >,
        ),
        max_in_flight: usize,
        tls: Option<tonic::transport::ServerTlsConfig>,
    ) -> Result<Self, FrontError> {
        Front::<S, S>::start_with(listener, health, max_in_flight, tls, false).await
    }
}

impl<S, W, B, B2> Front<S, W>
where
    S: Service<http::Request<Body>, Response = http::Response<B>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
    W: Service<http::Request<Body>, Response = http::Response<B2>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    W::Future: Send + 'static,
    B2: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    B2::Error: Into<tonic::codegen::StdError>,
{
    /// [`start`](Front::start), with a second API (`extra`) served on the same port when
    /// `with_extra`; health reports it under its name as well.
    pub async fn start_with(
        listener: tokio::net::TcpListener,
        health: (
            tonic_health::server::HealthReporter,
            tonic_health::pb::health_server::HealthServer<
                impl tonic_health::pb::health_server::Health,
            >,
        ),
        max_in_flight: usize,
        tls: Option<tonic::transport::ServerTlsConfig>,
        with_extra: bool,
    ) -> Result<Self, FrontError> {
        let (reporter, health_service) = health;
        // Before the server answers anything: tonic-health starts the whole server as SERVING.
        for name in ["", S::NAME, W::NAME] {
            reporter
                .set_service_status(name, tonic_health::ServingStatus::NotServing)
                .await;
        }
        let api: Deferred<S> = Deferred::new();
        let extra: Option<Deferred<W>> = with_extra.then(Deferred::new);
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls)?;
        }
        let (reflection_v1, reflection_v1alpha) = reflection_services()?;
        let addr = listener.local_addr().ok();
        let closing = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(
            builder
                .layer(crate::limits::LoadShedLayer::new(max_in_flight))
                .layer(crate::otel::RpcSpanLayer)
                .add_service(health_service)
                .add_service(reflection_v1)
                .add_service(reflection_v1alpha)
                .add_service(api.clone())
                .add_optional_service(extra.clone())
                .serve_with_incoming_shutdown(
                    incoming(listener),
                    closing.clone().cancelled_owned(),
                ),
        );
        Ok(Self {
            addr,
            api,
            extra,
            health: reporter,
            health_names: vec!["", S::NAME, W::NAME],
            closing,
            server,
        })
    }

    /// The server's and the API's health.
    pub async fn set_health(&self, status: tonic_health::ServingStatus) {
        for name in ["", S::NAME, W::NAME] {
            self.health.set_service_status(name, status).await;
        }
    }

    /// Health (of the server and the API) follows `up` from now on: NOT_SERVING while it says
    /// the store cannot be reached, SERVING again once it can. Abort the task before shutdown
    /// says NOT_SERVING for good.
    pub fn follow_reachability(
        &self,
        mut up: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let health = self.health.clone();
        tokio::spawn(async move {
            while up.changed().await.is_ok() {
                let status = match *up.borrow_and_update() {
                    true => tonic_health::ServingStatus::Serving,
                    false => tonic_health::ServingStatus::NotServing,
                };
                for name in ["", S::NAME, W::NAME] {
                    health.set_service_status(name, status).await;
                }
            }
        })
    }

    /// The reporter, for health of other names the service keeps: `name`, which starts as
    /// `status` (its watches end at [`Front::close`] with the others').
    pub async fn health_of(
        &mut self,
        name: &'static str,
        status: tonic_health::ServingStatus,
    ) -> &tonic_health::server::HealthReporter {
        if !self.health_names.contains(&name) {
            self.health_names.push(name);
        }
        self.health.set_service_status(name, status).await;
        &self.health
    }

    /// Resolves when the server stops on its own (it failed); `Err` if its task panicked.
    pub async fn stopped(
        &mut self,
    ) -> Result<Result<(), tonic::transport::Error>, tokio::task::JoinError> {
        (&mut self.server).await
    }

    /// Health NOT_SERVING, then, when shutting down was asked for (not when the server died),
    /// everything keeps serving for `grace`.
    pub async fn grace(&self, grace: std::time::Duration, asked: bool, name: &str) {
        self.set_health(tonic_health::ServingStatus::NotServing)
            .await;
        if asked && !grace.is_zero() {
            tracing::info!(
                ?grace,
                "shutdown requested: NOT_SERVING, still serving during the drain grace"
            );
            tokio::time::sleep(grace).await;
        }
        tracing::info!("{name} draining");
    }

    /// Ends health watches, stops accepting and waits (at most `drain`) for in-flight calls;
    /// `None` on timeout, when the remaining calls are cut off.
    pub async fn close(
        &mut self,
        drain: std::time::Duration,
    ) -> Option<Result<(), tonic::transport::Error>> {
        // A health watch never ends on its own, and gRPC clients that check health on their
        // side keep one open on every server they use: the drain would wait for them until it
        // timed out. Their statuses go, which ends each watch (with OK, after the NOT_SERVING
        // they were sent); a client retries on another server.
        for name in &self.health_names {
            self.health.clear_service_status(name).await;
        }
        self.closing.cancel();
        match tokio::time::timeout(drain, &mut self.server).await {
            Ok(Ok(r)) => Some(r),
            // The server task panicked: nothing left to wait for.
            Ok(Err(_)) => Some(Ok(())),
            Err(_) => {
                tracing::warn!("in-flight calls did not finish within the drain timeout");
                self.server.abort();
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_fine_without_tokens_elsewhere_needs_insecure() {
        let lo: SocketAddr = "127.0.0.1:50051".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:50051".parse().unwrap();
        assert!(check_bind(lo, false, false).is_ok());
        assert!(check_bind(any, false, false).is_err());
        assert!(check_bind(any, false, true).is_ok());
        assert!(check_bind(any, true, false).is_ok());
    }
}
