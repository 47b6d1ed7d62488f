//! The loops with the runner: the event subscription that feeds the store, and the delivery of
//! decisions back. Both share one lazily connected channel that carries this service's token.

pub mod backoff;
mod book;
pub mod delivery;
pub mod subscriber;

use arbor_shared::{
    auth::BearerToken, proto::runner::v1::runner_service_client::RunnerServiceClient,
    server::MAX_MESSAGE_BYTES,
};
use tonic::{service::interceptor::InterceptedService, transport::Channel};

use crate::error::{Error, Result};

/// The subscriber id this service's cursor is stored under on the runner.
pub const SUBSCRIBER_ID: &str = "approval-svc";

/// How often an HTTP/2 ping checks the connection to the runner, and how long its answer may
/// take before the connection is given up.
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub type RunnerClient = RunnerServiceClient<InterceptedService<Channel, BearerToken>>;

/// A client that connects on first use and reconnects by itself, so start-up does not depend
/// on the runner being up.
pub fn connect_lazy(
    url: &str,
    token: Option<&str>,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> Result<RunnerClient> {
    let token = BearerToken::new(token).map_err(|e| Error::BadRunnerSetting {
        setting: "runner_token",
        detail: e.message().to_string(),
    })?;
    Ok(
        RunnerServiceClient::with_interceptor(channel_lazy(url, tls)?, token)
            .max_decoding_message_size(arbor_shared::server::MAX_RESPONSE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
    )
}

/// The channel to the runner, connected on first use, without a token: for callers that
/// present each request's own (the web inbox passes the signed-in person's).
pub fn channel_lazy(url: &str, tls: Option<tonic::transport::ClientTlsConfig>) -> Result<Channel> {
    let mut endpoint = Channel::from_shared(url.to_string())
        .map_err(|e| Error::BadRunnerSetting {
            setting: "runner_url",
            detail: e.to_string(),
        })?
        .connect_timeout(std::time::Duration::from_secs(5))
        // A runner host that dies without a FIN or RST (power loss, a dropped NAT entry) leaves
        // the connection silent, and the event stream and every delivery on it would wait
        // forever. HTTP/2 pings notice within interval + timeout; the channel then reconnects.
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| Error::BadRunnerSetting {
                setting: "runner_ca",
                detail: e.to_string(),
            })?;
    }
    Ok(endpoint.connect_lazy())
}
