//! gRPC clients that present a bearer token and survive their server being killed: channels are
//! lazy (they reconnect on the next call after the process comes back) and every call has a
//! deadline, so a test waiting on a dead or partitioned service fails instead of hanging.

use std::time::Duration;

use arbor_shared::{
    auth::BearerToken,
    proto::{
        approval::v1::approval_service_client::ApprovalServiceClient,
        runner::v1::{
            runner_service_client::RunnerServiceClient, worker_service_client::WorkerServiceClient,
        },
    },
};
use tonic::{service::interceptor::InterceptedService, transport::Channel};

pub type RunnerClient = RunnerServiceClient<InterceptedService<Channel, BearerToken>>;
pub type ApprovalClient = ApprovalServiceClient<InterceptedService<Channel, BearerToken>>;
pub type WorkerClient = WorkerServiceClient<InterceptedService<Channel, BearerToken>>;

/// Per-call deadline of test clients.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// A channel that connects on first use and reconnects after failures.
pub fn lazy_channel(url: &str) -> Channel {
    Channel::from_shared(url.to_string())
        .expect("valid url")
        .connect_timeout(Duration::from_secs(2))
        .timeout(CALL_TIMEOUT)
        .tcp_nodelay(true)
        .connect_lazy()
}

fn bearer(token: Option<&str>) -> BearerToken {
    BearerToken::new(token).expect("ASCII token")
}

/// A RunnerService client acting as the holder of `token` (`None`: no credentials at all).
pub fn runner_as(url: &str, token: Option<&str>) -> RunnerClient {
    RunnerServiceClient::with_interceptor(lazy_channel(url), bearer(token))
        .max_decoding_message_size(64 << 20)
}

/// A WorkerService client (the runner's port) acting as the holder of `token`.
pub fn workers_as(url: &str, token: Option<&str>) -> WorkerClient {
    WorkerServiceClient::with_interceptor(lazy_channel(url), bearer(token))
        .max_decoding_message_size(64 << 20)
}

/// An ApprovalService client acting as the holder of `token`.
pub fn approvals_as(url: &str, token: Option<&str>) -> ApprovalClient {
    ApprovalServiceClient::with_interceptor(lazy_channel(url), bearer(token))
        .max_decoding_message_size(64 << 20)
}

/// Whether a failed call may succeed when retried: the server was down, restarting, cut off,
/// too slow, or shedding load. Everything else is an answer.
pub fn is_transient(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::Unavailable
            | Code::Unknown
            | Code::Cancelled
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
    ) || (status.code() == Code::Internal && status.message().contains("h2 protocol error"))
}
