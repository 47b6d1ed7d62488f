//! The web inbox: server-rendered pages on a listener of their own (`--web-listen`) where
//! people sign in with their token and see and decide what waits for them. Every read and
//! every decision goes through the same `ApprovalService` handlers as the gRPC API, called with
//! the signed-in principal, so roles, the self-approval rule, quorum and digests are checked in
//! one place. Every response carries a strict Content Security Policy.

// A refusal is the page that says so, answered as it is: boxing it would buy nothing.
#![allow(clippy::result_large_err)]

mod actions;
mod events;
mod forms;
mod item;
mod page;
mod question;
mod queue;
mod run;
mod session;
mod statics;

use std::{net::SocketAddr, sync::Arc};

use arbor_shared::auth::{Authenticator, Principal};
use axum::{
    Router,
    extract::Request,
    http::{HeaderValue, header},
    middleware::{self, Next},
    response::Response,
    routing::{get, post},
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::{approvals::Approvals, grpc::ApprovalApi, store::ApprovalStore};

pub use session::Sessions;

/// Where the inbox listens and how people sign in to it.
#[derive(Debug, Clone, Default)]
pub struct WebConfig {
    /// `None`: no inbox.
    pub listen: Option<SocketAddr>,
    /// A header a trusted proxy sets to the signed-in person's name (it must strip the header
    /// from what clients send); `None`: people paste their token.
    pub identity_header: Option<http::HeaderName>,
    /// Mark the session cookie `Secure` (the inbox is reached over HTTPS).
    pub secure_cookie: bool,
}

/// Everything a handler needs. Shared behind an `Arc`.
pub struct Web<S> {
    api: ApprovalApi<S>,
    approvals: Approvals<S>,
    auth: Authenticator,
    cfg: WebConfig,
    sessions: Sessions,
    /// The runner, without a token: each call carries the person's own.
    runner: Channel,
    /// This service's own token to the runner: read-only use for people signed in through a
    /// proxy (the inbox then holds no token of theirs).
    service_token: Option<String>,
    feed: events::Feed,
}

impl<S: ApprovalStore> Web<S> {
    pub fn new(
        api: ApprovalApi<S>,
        approvals: Approvals<S>,
        auth: Authenticator,
        cfg: WebConfig,
        runner: Channel,
        service_token: Option<String>,
    ) -> Self {
        Self {
            api,
            approvals,
            auth,
            cfg,
            sessions: Sessions::default(),
            runner,
            service_token,
            feed: events::Feed::default(),
        }
    }

    /// A gRPC request as the signed-in `who` makes it: the handlers read the principal from
    /// the extensions, as they do behind the interceptor.
    fn as_person<T>(who: &Principal, message: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(message);
        req.extensions_mut().insert(who.clone());
        req
    }
}

type Shared<S> = Arc<Web<S>>;

/// The security headers every response carries.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

async fn secure_headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !h.contains_key(header::CACHE_CONTROL) {
        // Pages show who is signed in and what they may do: never kept by a shared cache.
        h.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-store, private"),
        );
    }
    res
}

pub fn router<S: ApprovalStore>(web: Shared<S>) -> Router {
    Router::new()
        .route("/", get(queue::home))
        .route(
            "/sign-in",
            get(session::sign_in_page::<S>).post(session::sign_in::<S>),
        )
        .route("/sign-out", post(session::sign_out::<S>))
        .route("/queue", get(queue::page::<S>))
        .route("/fragments/queue", get(queue::fragment::<S>))
        .route("/fragments/counts", get(queue::counts_fragment::<S>))
        .route("/bulk", post(queue::bulk::<S>))
        .route("/items/{id}", get(item::page::<S>))
        .route("/items/{id}/edit", get(item::edit_page::<S>))
        .route("/items/{id}/live", get(item::live_fragment::<S>))
        .route("/items/{id}/timeline", get(run::timeline_fragment::<S>))
        .route("/items/{id}/decide", post(actions::decide::<S>))
        .route("/items/{id}/claim", post(actions::claim::<S>))
        .route("/items/{id}/comment", post(actions::comment::<S>))
        .route("/items/{id}/delegate", post(actions::delegate::<S>))
        .route(
            "/questions/{run_id}/{request_id}",
            get(question::page::<S>).post(question::answer::<S>),
        )
        .route("/events", get(events::stream::<S>))
        .route("/static/{name}", get(statics::serve))
        .fallback(page::not_found)
        .layer(middleware::from_fn(secure_headers))
        .with_state(web)
}

/// Serves the inbox on `listener` until `stop` is cancelled; open event streams end then too.
pub async fn serve<S: ApprovalStore>(listener: TcpListener, web: Web<S>, stop: CancellationToken) {
    let web = Arc::new(web);
    tokio::spawn(events::Feed::run(
        web.feed.clone(),
        web.approvals.clone(),
        stop.clone(),
    ));
    tracing::info!(addr = ?listener.local_addr().ok(), "web inbox serving");
    let app = router(web.clone());
    let stopped = stop.clone();
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stopped.cancelled().await })
        .await
    {
        tracing::error!(error = %e, "the web inbox stopped");
    }
}
