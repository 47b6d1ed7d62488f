//! `runner-svc serve`: flags (defaults from `arbor_runner_svc::defaults`) → tracing → bind →
//! [`arbor_runner_svc::run`].

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use arbor_runner_svc::{ServeConfig, defaults, engine::GuardConfig, retention::RetentionConfig};
use arbor_shared::{auth::Authenticator, metrics::MetricsListen};
use clap::Args;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[arg(long, env = "ARBOR_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    #[arg(long, env = "ARBOR_DATA_DIR", default_value = defaults::DATA_DIR)]
    pub data_dir: PathBuf,
    /// PostgreSQL URL (`postgres://user:password@host/db`): keep the runner's state there, shared
    /// by every replica, instead of the embedded store in `--data-dir`.
    #[arg(long, env = "ARBOR_STORE", hide_env_values = true)]
    pub store: Option<String>,
    /// With `--store`: at start-up, wait for the database whatever the error, for as long as
    /// it takes, instead of exiting on a refused login, a missing database or role, or a newer
    /// schema (and after 30 s of a server that cannot be reached).
    #[arg(long, env = "ARBOR_STORE_WAIT_ALWAYS")]
    pub store_wait_always: bool,
    #[arg(long, env = "ARBOR_WORKERS", default_value_t = defaults::POOL_SIZE)]
    pub workers: usize,
    #[arg(long, env = "ARBOR_LEASE_MS", default_value_t = defaults::ms(defaults::LEASE))]
    pub lease_ms: u64,
    #[arg(long, env = "ARBOR_MAX_ATTEMPTS", default_value_t = defaults::MAX_ATTEMPTS)]
    pub max_attempts: u32,
    /// Page-cache bound of the embedded store, in MiB.
    #[arg(long, env = "ARBOR_CACHE_MB", default_value_t = defaults::CACHE_MB)]
    pub cache_mb: u64,
    /// Tokens file (TOML) enabling authentication.
    #[arg(long, env = "ARBOR_TOKENS")]
    pub tokens: Option<PathBuf>,
    /// Tool guard rules (TOML).
    #[arg(long, env = "ARBOR_GUARDS")]
    pub guards: Option<PathBuf>,
    /// A tool that task workers serve (repeatable; env: comma-separated). Trees may use it
    /// like a built-in; a tree can also declare its own in `task_types`.
    #[arg(long = "task-type", env = "ARBOR_TASK_TYPES", value_delimiter = ',')]
    pub task_types: Vec<String>,
    /// Allow serving without tokens on a non-loopback address.
    #[arg(long, env = "ARBOR_INSECURE")]
    pub insecure: bool,
    /// Log as JSON lines (one object per line, span fields such as trace ids included).
    #[arg(long, env = "ARBOR_LOG_JSON")]
    pub log_json: bool,
    /// Export spans over OTLP/gRPC to this collector (e.g. `http://localhost:4317`); the other
    /// standard `OTEL_*` variables are honoured too. Unset: nothing is exported.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Where Prometheus scrapes `/metrics` (HTTP), or `off`.
    #[arg(long, env = "ARBOR_METRICS_LISTEN", default_value = "127.0.0.1:9464")]
    pub metrics_listen: MetricsListen,
    /// On SIGTERM, report NOT_SERVING and keep serving this long before closing anything, so
    /// load balancers and meshes stop routing here first (Kubernetes: about 5000).
    #[arg(long, env = "ARBOR_DRAIN_GRACE_MS", default_value_t = defaults::ms(defaults::DRAIN_GRACE))]
    pub drain_grace_ms: u64,
    /// Keep events every durable subscriber has acked this long (ms).
    #[arg(
        long,
        env = "ARBOR_EVENT_RETENTION_ACKED_MS",
        default_value_t = defaults::ms(defaults::EVENTS_ACKED_RETENTION)
    )]
    pub event_retention_acked_ms: u64,
    /// Drop events older than this even if a subscriber has not acked them (ms).
    #[arg(long, env = "ARBOR_EVENT_RETENTION_MAX_MS", default_value_t = defaults::ms(defaults::EVENTS_MAX_RETENTION))]
    pub event_retention_max_ms: u64,
    /// Keep finished runs and final jobs this long (ms).
    #[arg(long, env = "ARBOR_FINISHED_RETENTION_MS", default_value_t = defaults::ms(defaults::FINISHED_RETENTION))]
    pub finished_retention_ms: u64,
    /// PEM certificate (chain) to serve TLS with (deployments without a mesh).
    #[arg(long, env = "ARBOR_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "ARBOR_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Requests handled at once; more are shed with RESOURCE_EXHAUSTED.
    #[arg(long, env = "ARBOR_MAX_IN_FLIGHT", default_value_t = defaults::MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// Drop a stream subscriber whose buffer stays full this long (ms).
    #[arg(long, env = "ARBOR_STREAM_LAG_TIMEOUT_MS", default_value_t = defaults::ms(defaults::STREAM_LAG_TIMEOUT))]
    pub stream_lag_timeout_ms: u64,
    /// How often retention runs (ms).
    #[arg(long, env = "ARBOR_COMPACT_INTERVAL_MS", default_value_t = defaults::ms(defaults::COMPACT_INTERVAL))]
    pub compact_interval_ms: u64,
}

/// Serves until SIGTERM/SIGINT.
pub async fn serve(args: ServeArgs) -> Result<(), String> {
    let export = arbor_shared::otel::Export {
        endpoint: args.otlp_endpoint.clone(),
        service: "runner-svc",
        version: env!("CARGO_PKG_VERSION"),
    };
    let mut telemetry = arbor_shared::otel::init_tracing(args.log_json, Some(&export))?;
    let served = serve_traced(args).await;
    // The spans of the shutdown itself go out with the rest.
    telemetry.shutdown().await;
    served
}

async fn serve_traced(args: ServeArgs) -> Result<(), String> {
    let auth = match &args.tokens {
        Some(path) => Authenticator::from_file(path).map_err(|e| e.to_string())?,
        None => Authenticator::disabled(),
    };
    arbor_shared::server::check_bind(args.listen, auth.is_enabled(), args.insecure)?;
    if !auth.is_enabled() {
        tracing::warn!("authentication is OFF (no --tokens): every caller has every role");
    }
    let guards = match &args.guards {
        Some(path) => load_guards(path)?,
        None => GuardConfig::default(),
    };
    if args.store.is_none() {
        std::fs::create_dir_all(&args.data_dir)
            .map_err(|e| format!("cannot create {}: {e}", args.data_dir.display()))?;
    }
    let listen = args.listen;
    let cfg = serve_config(args, auth, guards)?;
    // Caught from before the port binds: a SIGTERM during recovery shuts down cleanly too.
    let shutdown = arbor_shared::server::shutdown_signal();
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    arbor_runner_svc::run(cfg, listener, shutdown)
        .await
        .map_err(|e| e.to_string())
}

/// Reads and checks the tool guard rules.
fn load_guards(path: &std::path::Path) -> Result<GuardConfig, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let guards = toml::from_str::<GuardConfig>(&text)
        .map_err(|e| format!("invalid guards file {}: {e}", path.display()))?;
    guards.validate().map_err(|violations| {
        let listed: Vec<String> = violations.iter().map(ToString::to_string).collect();
        format!(
            "invalid guards file {}: {}",
            path.display(),
            listed.join("; ")
        )
    })?;
    Ok(guards)
}

/// The flags as a `ServeConfig`, with values out of range clamped as documented.
fn serve_config(
    args: ServeArgs,
    auth: Authenticator,
    guards: GuardConfig,
) -> Result<ServeConfig, String> {
    Ok(ServeConfig {
        data_dir: args.data_dir,
        store_url: args.store,
        store_wait_always: args.store_wait_always,
        workers: args.workers,
        lease: Duration::from_millis(args.lease_ms.max(100)),
        max_attempts: args.max_attempts.max(1),
        cache_bytes: args.cache_mb.max(8) << 20,
        auth,
        guards,
        task_types: args.task_types,
        drain_grace: Duration::from_millis(args.drain_grace_ms),
        metrics_listen: args.metrics_listen,
        retention: RetentionConfig {
            events_acked: Duration::from_millis(args.event_retention_acked_ms),
            events_max: Duration::from_millis(args.event_retention_max_ms),
            finished: Duration::from_millis(args.finished_retention_ms),
            interval: Duration::from_millis(args.compact_interval_ms.max(100)),
        },
        max_in_flight: args.max_in_flight.max(1),
        tls: arbor_shared::tls::server_from_flags(
            args.tls_cert.as_deref(),
            args.tls_key.as_deref(),
        )?,
        stream_lag_timeout: Duration::from_millis(args.stream_lag_timeout_ms.max(1)),
        ..ServeConfig::default()
    })
}
