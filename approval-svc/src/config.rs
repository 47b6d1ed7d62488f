//! What `run` needs to serve: resolved settings, not command-line text, so tests build one
//! directly and the binary builds one from flags and environment.

use std::{path::PathBuf, time::Duration};

use arbor_shared::{auth::Authenticator, metrics::MetricsListen};

use crate::policy::Policy;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    /// PostgreSQL URL of a store shared by replicas; `None`: the embedded store in `data_dir`.
    pub store_url: Option<String>,
    /// On PostgreSQL: whether start-up waits for the database whatever the error, for as long
    /// as it takes (`--store-wait-always`), instead of exiting on a refused login, a missing
    /// database or a newer schema, and after 30 s of an unreachable server.
    pub store_wait_always: bool,
    /// The runner's gRPC address (`http://host:port`).
    pub runner_url: String,
    /// Bearer token this service presents to the runner (role `service`).
    pub runner_token: Option<String>,
    pub policy: Policy,
    /// Who may call this service; disabled means everyone is `anonymous` with every role.
    pub auth: Authenticator,
    pub tuning: Tuning,
    /// How long final approvals are kept.
    pub retention: RetentionConfig,
    /// How long health says NOT_SERVING on shutdown before anything is closed.
    pub drain_grace: Duration,
    /// Where `/metrics` is served (`None`: off).
    pub metrics_listen: MetricsListen,
    /// Requests handled at once before new ones are shed with RESOURCE_EXHAUSTED.
    pub max_in_flight: usize,
    /// Serve TLS with this identity (deployments without a mesh); plaintext when `None`.
    pub tls: Option<tonic::transport::ServerTlsConfig>,
    /// TLS towards an `https://` runner, trusting this CA.
    pub runner_tls: Option<tonic::transport::ClientTlsConfig>,
    /// The name this replica goes by in `GetLeader`, the `arbor_approval_leader` gauge and the
    /// log; `None`: its host name and the port it serves (see [`crate::leader::default_name`]).
    pub replica_name: Option<String>,
    /// Signed webhooks: the endpoints and the events each wants (none by default).
    pub webhooks: crate::webhooks::WebhookConfig,
    /// The web inbox: where it listens (`None`: off) and how people sign in.
    pub web: crate::web::WebConfig,
}

impl ServeConfig {
    /// Defaults for everything but where the data lives and where the runner is.
    pub fn new(data_dir: impl Into<PathBuf>, runner_url: impl Into<String>) -> Self {
        Self {
            data_dir: data_dir.into(),
            store_url: None,
            store_wait_always: false,
            runner_url: runner_url.into(),
            runner_token: None,
            policy: Policy::default(),
            auth: Authenticator::disabled(),
            tuning: Tuning::default(),
            retention: RetentionConfig::default(),
            drain_grace: Duration::ZERO,
            metrics_listen: MetricsListen(None),
            max_in_flight: arbor_shared::limits::DEFAULT_MAX_IN_FLIGHT,
            tls: None,
            runner_tls: None,
            replica_name: None,
            webhooks: Default::default(),
            web: Default::default(),
        }
    }
}

/// Timings of the loops with the runner. The defaults suit production; tests shorten them.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Ack the event cursor after this many processed events…
    pub ack_every: u32,
    /// …or this long after the first unacknowledged one.
    pub ack_interval: Duration,
    /// Reconnect backoff of the event subscription (exponential with jitter).
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// Retry backoff of a decision the runner did not accept yet.
    pub delivery_min: Duration,
    pub delivery_max: Duration,
    /// Deadline of one call to the runner.
    pub rpc_timeout: Duration,
    /// How long in-flight calls may run after a shutdown signal.
    pub drain_timeout: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            ack_every: 64,
            ack_interval: Duration::from_millis(100),
            reconnect_min: Duration::from_millis(250),
            reconnect_max: Duration::from_secs(30),
            delivery_min: Duration::from_millis(250),
            delivery_max: Duration::from_secs(30),
            rpc_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(10),
        }
    }
}

/// How long final approvals are kept, and how often the compactor looks.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// Final approvals (and their audit entries) unchanged for this long are deleted.
    pub keep: Duration,
    /// How often the compactor runs.
    pub interval: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            keep: Duration::from_secs(7 * 24 * 3600),
            interval: Duration::from_secs(60),
        }
    }
}

impl RetentionConfig {
    /// The newest `updated_at` that may go at wall-clock `now_ms`. Never later than the last
    /// cursor ack: an approval changed by an event the runner could still replay (a lost ack)
    /// stays, so a replayed APPROVAL_REQUESTED finds its tombstone instead of a fresh PENDING.
    pub fn cutoff(&self, now_ms: u64, cursor_acked_at: Option<u64>) -> u64 {
        let by_age = now_ms.saturating_sub(self.keep.as_millis() as u64);
        by_age.min(cursor_acked_at.unwrap_or(0))
    }
}
