//! The binary's command line (not part of the library): `serve` and the client subcommands.

pub mod client;
mod govern;
mod render;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context;
use arbor_approval_svc::{ServeConfig, policy::Policy, retention::RetentionConfig};
use arbor_shared::{auth::Authenticator, metrics::MetricsListen};
use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "approval-svc",
    version,
    about = "Arbor approval service and its client"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start-up: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service.
    Serve(ServeArgs),
    /// List pending approvals as a table.
    Pending {
        #[command(flatten)]
        conn: Conn,
        /// Only approvals of this run.
        #[arg(long)]
        run: Option<String>,
        /// Only tool approvals whose tool matches this glob.
        #[arg(long)]
        tool: Option<String>,
        /// Only approvals the caller may vote on now (eligible or a delegate, not yet voted).
        #[arg(long)]
        mine: bool,
    },
    /// Print one approval as JSON.
    Show {
        #[command(flatten)]
        conn: Conn,
        id: String,
    },
    /// Approve (on a governed approval: vote to approve; the quorum is shown).
    Approve {
        #[command(flatten)]
        conn: Conn,
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
        /// The args digest you approve (`show` prints it): refused if it is no longer current.
        #[arg(long, default_value = "")]
        digest: String,
    },
    /// Reject (the run's node fails or is skipped, the tool never runs).
    Reject {
        #[command(flatten)]
        conn: Conn,
        id: String,
        #[arg(long)]
        reason: String,
    },
    /// Vote on a governed approval: `approve` or `reject`; prints the quorum after the vote.
    Vote {
        #[command(flatten)]
        conn: Conn,
        id: String,
        #[arg(value_parser = ["approve", "reject"])]
        vote: String,
        #[arg(long, default_value = "")]
        reason: String,
        /// The args digest you vote on: refused if it is no longer current.
        #[arg(long, default_value = "")]
        digest: String,
    },
    /// Let someone vote in your seat for a while, list delegations, or revoke one.
    Delegate {
        #[command(flatten)]
        conn: Conn,
        /// The delegate.
        #[arg(long, required_unless_present_any = ["list", "revoke"])]
        to: Option<String>,
        /// How long it lasts (`7d`, `36h`).
        #[arg(long = "for", required_unless_present_any = ["list", "revoke"])]
        duration: Option<String>,
        /// Whose seat (operators only; default: yours).
        #[arg(long, default_value = "")]
        from: String,
        /// Glob over tool and node names (default: everything).
        #[arg(long, default_value = "")]
        scope: String,
        /// List the delegations from or to you instead.
        #[arg(long)]
        list: bool,
        /// Revoke the delegation with this id instead.
        #[arg(long)]
        revoke: Option<String>,
    },
    /// Take a pending approval (others then may not decide it alone), or give it back.
    Claim {
        #[command(flatten)]
        conn: Conn,
        id: String,
        /// How long the claim holds (`30m`); default: until released.
        #[arg(long)]
        ttl: Option<String>,
        #[arg(long)]
        release: bool,
    },
    /// Move a claim to someone else.
    Reassign {
        #[command(flatten)]
        conn: Conn,
        id: String,
        #[arg(long)]
        to: String,
    },
    /// Add a comment to an approval (bound to the digest current now).
    Comment {
        #[command(flatten)]
        conn: Conn,
        id: String,
        text: String,
    },
    /// Approve with new tool arguments.
    Edit {
        #[command(flatten)]
        conn: Conn,
        id: String,
        /// The new arguments, as JSON.
        #[arg(long)]
        args: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Answer with a result that stands in for the tool's own.
    Respond {
        #[command(flatten)]
        conn: Conn,
        id: String,
        /// The result, as JSON.
        #[arg(long)]
        result: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Print every change to approvals as it happens.
    Watch {
        #[command(flatten)]
        conn: Conn,
        /// Only pending approvals (changes that take one out of PENDING are still shown).
        #[arg(long)]
        pending: bool,
    },
    /// Name the replica that leads (follows the runner and delivers decisions).
    Leader {
        #[command(flatten)]
        conn: Conn,
    },
}

/// Where the client connects and as whom.
#[derive(Debug, Clone, Args)]
pub struct Conn {
    #[arg(long, env = "ARBOR_ADDR", default_value = "http://127.0.0.1:50052")]
    pub addr: String,
    #[arg(long, env = "ARBOR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// CA certificate (PEM) to trust for an `https://` address.
    #[arg(long, env = "ARBOR_CA")]
    pub ca: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[arg(long, env = "ARBOR_LISTEN", default_value = "127.0.0.1:50052")]
    pub listen: SocketAddr,
    #[arg(long, env = "ARBOR_DATA_DIR", default_value = "./data/approval")]
    pub data_dir: PathBuf,
    /// PostgreSQL URL (`postgres://user:password@host/db`): keep approvals there, shared by
    /// every replica, instead of the embedded store in `--data-dir`.
    #[arg(long, env = "ARBOR_STORE", hide_env_values = true)]
    pub store: Option<String>,
    /// With `--store`: at start-up, wait for the database whatever the error, for as long as
    /// it takes, instead of exiting on a refused login, a missing database or role, or a newer
    /// schema (and after 30 s of a server that cannot be reached).
    #[arg(long, env = "ARBOR_STORE_WAIT_ALWAYS")]
    pub store_wait_always: bool,
    /// The runner's gRPC address.
    #[arg(
        long,
        env = "ARBOR_RUNNER_URL",
        default_value = "http://127.0.0.1:50051"
    )]
    pub runner: String,
    /// Approval policy (TOML); without it every approval waits for a person.
    #[arg(long, env = "ARBOR_POLICY")]
    pub policy: Option<PathBuf>,
    /// Signed webhooks (TOML): endpoints, their secrets and the events each wants.
    #[arg(long, env = "ARBOR_WEBHOOKS")]
    pub webhooks: Option<PathBuf>,
    /// Bearer tokens of the callers (TOML); without it only loopback is served.
    #[arg(long, env = "ARBOR_TOKENS")]
    pub tokens: Option<PathBuf>,
    /// File holding the token this service presents to the runner.
    #[arg(long, env = "ARBOR_RUNNER_TOKEN_FILE")]
    pub runner_token_file: Option<PathBuf>,
    /// Allow serving a non-loopback address without authentication.
    #[arg(long, env = "ARBOR_INSECURE")]
    pub insecure: bool,
    /// Log as JSON lines (one object per line; an approval's lines carry its `trace_id`).
    #[arg(long, env = "ARBOR_LOG_JSON")]
    pub log_json: bool,
    /// Export spans over OTLP/gRPC to this collector (e.g. `http://localhost:4317`); the other
    /// standard `OTEL_*` variables are honoured too. Unset: nothing is exported.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Where Prometheus scrapes `/metrics` (HTTP), or `off`.
    #[arg(long, env = "ARBOR_METRICS_LISTEN", default_value = "127.0.0.1:9465")]
    pub metrics_listen: MetricsListen,
    /// On SIGTERM, report NOT_SERVING and keep serving this long before closing anything, so
    /// load balancers and meshes stop routing here first (Kubernetes: about 5000).
    #[arg(long, env = "ARBOR_DRAIN_GRACE_MS", default_value_t = 0)]
    pub drain_grace_ms: u64,
    /// Final approvals (PRUNED, CANCELLED) unchanged for this long are deleted with their
    /// audit trail (ms); afterwards GetApproval and GetAuditLog answer NOT_FOUND / nothing.
    #[arg(long, env = "ARBOR_APPROVAL_RETENTION_MS", default_value_t = 7 * 86_400_000)]
    pub approval_retention_ms: u64,
    /// How often retention runs (ms).
    #[arg(long, env = "ARBOR_COMPACT_INTERVAL_MS", default_value_t = 60_000)]
    pub compact_interval_ms: u64,
    /// PEM certificate (chain) to serve TLS with (deployments without a mesh).
    #[arg(long, env = "ARBOR_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "ARBOR_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA certificate (PEM) to trust when `--runner` is `https://…`.
    #[arg(long, env = "ARBOR_RUNNER_CA")]
    pub runner_ca: Option<PathBuf>,
    /// The name this replica goes by in `approval-svc leader`, the `arbor_approval_leader`
    /// metric and the log (ASCII, at most 41 bytes); default: host name and `--listen` port.
    #[arg(long, env = "ARBOR_REPLICA_NAME")]
    pub replica_name: Option<String>,
    /// Serve the web inbox (HTTP) on this address; off unless given.
    #[arg(long, env = "ARBOR_WEB_LISTEN")]
    pub web_listen: Option<SocketAddr>,
    /// Take the signed-in person's name from this request header, set by a trusted proxy in
    /// front of the inbox (the proxy must remove it from what clients send).
    #[arg(long, env = "ARBOR_WEB_IDENTITY_HEADER")]
    pub web_identity_header: Option<String>,
    /// Mark the inbox's session cookie `Secure` (set it when people reach the inbox over HTTPS
    /// through a proxy that terminates TLS).
    #[arg(long, env = "ARBOR_WEB_SECURE_COOKIE")]
    pub web_secure_cookie: bool,
}

impl ServeArgs {
    pub fn config(&self) -> anyhow::Result<ServeConfig> {
        let mut cfg = ServeConfig::new(&self.data_dir, &self.runner);
        cfg.store_url = self.store.clone();
        cfg.store_wait_always = self.store_wait_always;
        cfg.drain_grace = std::time::Duration::from_millis(self.drain_grace_ms);
        cfg.metrics_listen = self.metrics_listen;
        if let Some(name) = &self.replica_name {
            arbor_approval_svc::leader::check_name(name).map_err(anyhow::Error::msg)?;
            cfg.replica_name = Some(name.clone());
        }
        cfg.retention = RetentionConfig {
            keep: Duration::from_millis(self.approval_retention_ms),
            interval: Duration::from_millis(self.compact_interval_ms.max(100)),
        };
        cfg.tls =
            arbor_shared::tls::server_from_flags(self.tls_cert.as_deref(), self.tls_key.as_deref())
                .map_err(anyhow::Error::msg)?;
        if let Some(ca) = &self.runner_ca {
            cfg.runner_tls =
                Some(arbor_shared::tls::client_config(ca).map_err(anyhow::Error::msg)?);
        }
        cfg.web = arbor_approval_svc::web::WebConfig {
            listen: self.web_listen,
            identity_header: match &self.web_identity_header {
                Some(h) => Some(
                    http::HeaderName::from_bytes(h.trim().to_ascii_lowercase().as_bytes())
                        .map_err(|e| anyhow::anyhow!("--web-identity-header {h:?}: {e}"))?,
                ),
                None => None,
            },
            secure_cookie: self.web_secure_cookie,
        };
        if let Some(path) = &self.policy {
            cfg.policy = Policy::from_file(path)?;
        }
        if let Some(path) = &self.webhooks {
            cfg.webhooks = arbor_approval_svc::webhooks::WebhookConfig::from_file(path)?;
        }
        if let Some(path) = &self.tokens {
            cfg.auth = Authenticator::from_file(path)?;
        }
        if let Some(path) = &self.runner_token_file {
            let token = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read runner token file {}", path.display()))?;
            let token = token.trim();
            anyhow::ensure!(
                !token.is_empty(),
                "runner token file {} is empty",
                path.display()
            );
            cfg.runner_token = Some(token.to_string());
        }
        Ok(cfg)
    }
}
