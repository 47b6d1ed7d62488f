//! The `runner-svc` command line: `serve` (config → tracing → bind → [`arbor_runner_svc::run`]) and the
//! client subcommands people use (`submit`, `runs`, `get`, `events`, `resolve`, `cancel`,
//! `interrupt`, `jobs`, `requeue`, `hash-token`).

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use arbor_shared::{
    auth::{Authenticator, BearerToken},
    domain::{EventDetail, RunStatus},
    json::{from_proto_struct, to_proto_struct, to_proto_value},
    metrics::MetricsListen,
    proto::runner::v1::{
        self as pb, runner_service_client::RunnerServiceClient,
        worker_service_client::WorkerServiceClient,
    },
};
use clap::{Args, Parser, Subcommand};
use tonic::{service::interceptor::InterceptedService, transport::Channel};

use arbor_runner_svc::{ServeConfig, engine::GuardConfig};

#[derive(Debug, Parser)]
#[command(
    name = "runner-svc",
    version,
    about = "Arbor runner: durable behaviour-tree runs with human-in-the-loop suspensions"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the RunnerService (plus health and reflection).
    Serve(ServeArgs),
    /// Register a tree file (JSON or YAML) and submit a run of it.
    Submit {
        file: PathBuf,
        /// Initial blackboard as a JSON object.
        #[arg(long)]
        input: Option<String>,
        #[arg(long)]
        thread: Option<String>,
        #[arg(long, default_value_t = 0)]
        priority: i32,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List runs.
    Runs {
        /// Only runs with this status (e.g. SUSPENDED).
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        thread: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show one run as JSON.
    Get {
        run_id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print the event log; with --follow keep printing live events.
    Events {
        #[arg(long)]
        follow: bool,
        /// Start after this seq (default: the beginning, or the subscriber's cursor).
        #[arg(long)]
        after: Option<u64>,
        #[arg(long)]
        run: Option<String>,
        /// Durable subscriber name; events are acked as they are printed.
        #[arg(long)]
        subscriber: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Answer a user-input or external suspension (approvals go through approval-svc).
    Resolve {
        run_id: String,
        request_id: String,
        /// User input as text.
        #[arg(long, conflicts_with_all = ["value", "result"])]
        text: Option<String>,
        /// User input as a JSON value.
        #[arg(long, conflicts_with = "result")]
        value: Option<String>,
        /// Raw result JSON (external results: {"status": "succeeded", "result": ...}).
        #[arg(long)]
        result: Option<String>,
        /// Refuse instead of resume.
        #[arg(long)]
        cancel: bool,
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Cancel a run.
    Cancel {
        run_id: String,
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Interrupt a thread: supersede its queued work and cancel its running run.
    Interrupt {
        thread_id: String,
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List mailbox jobs (operators).
    Jobs {
        #[arg(long)]
        thread: Option<String>,
        /// Only jobs with this status (e.g. DEAD_LETTER).
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List tasks of task workers: queued, leased (by whom, until when), finished; failed ones
    /// are the dead letters of remote tools.
    Tasks {
        /// Only tasks in this state (QUEUED, LEASED, COMPLETED, FAILED, ERRORED, CANCELLED,
        /// RESOLVED); may be repeated.
        #[arg(long)]
        state: Vec<String>,
        /// Only task types matching this glob.
        #[arg(long = "type")]
        task_type: Option<String>,
        /// Only tasks leased (last) by this worker.
        #[arg(long)]
        worker: Option<String>,
        #[arg(long)]
        run: Option<String>,
        /// Counts by state and type instead of one line per task.
        #[arg(long)]
        summary: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Requeue a dead-lettered job (operators).
    Requeue {
        job_id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print the SHA-256 of a token, as the tokens file wants it.
    HashToken { token: String },
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[arg(long, env = "ARBOR_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    #[arg(long, env = "ARBOR_DATA_DIR", default_value = "data/runner")]
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
    #[arg(long, env = "ARBOR_WORKERS", default_value_t = arbor_runner_svc::worker::DEFAULT_WORKERS)]
    pub workers: usize,
    #[arg(long, env = "ARBOR_LEASE_MS", default_value_t = 30_000)]
    pub lease_ms: u64,
    #[arg(long, env = "ARBOR_MAX_ATTEMPTS", default_value_t = 5)]
    pub max_attempts: u32,
    /// Page-cache bound of the embedded store, in MiB.
    #[arg(long, env = "ARBOR_CACHE_MB", default_value_t = 64)]
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
    /// Where Prometheus scrapes `/metrics` (HTTP), or `off`.
    #[arg(long, env = "ARBOR_METRICS_LISTEN", default_value = "127.0.0.1:9464")]
    pub metrics_listen: MetricsListen,
    /// On SIGTERM, report NOT_SERVING and keep serving this long before closing anything, so
    /// load balancers and meshes stop routing here first (Kubernetes: about 5000).
    #[arg(long, env = "ARBOR_DRAIN_GRACE_MS", default_value_t = 0)]
    pub drain_grace_ms: u64,
    /// Keep events every durable subscriber has acked this long (ms).
    #[arg(
        long,
        env = "ARBOR_EVENT_RETENTION_ACKED_MS",
        default_value_t = 3_600_000
    )]
    pub event_retention_acked_ms: u64,
    /// Drop events older than this even if a subscriber has not acked them (ms).
    #[arg(long, env = "ARBOR_EVENT_RETENTION_MAX_MS", default_value_t = 7 * 86_400_000)]
    pub event_retention_max_ms: u64,
    /// Keep finished runs and final jobs this long (ms).
    #[arg(long, env = "ARBOR_FINISHED_RETENTION_MS", default_value_t = 7 * 86_400_000)]
    pub finished_retention_ms: u64,
    /// PEM certificate (chain) to serve TLS with (deployments without a mesh).
    #[arg(long, env = "ARBOR_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "ARBOR_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Requests handled at once; more are shed with RESOURCE_EXHAUSTED.
    #[arg(long, env = "ARBOR_MAX_IN_FLIGHT", default_value_t = arbor_shared::limits::DEFAULT_MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// Drop a stream subscriber whose buffer stays full this long (ms).
    #[arg(long, env = "ARBOR_STREAM_LAG_TIMEOUT_MS", default_value_t = 30_000)]
    pub stream_lag_timeout_ms: u64,
    /// How often retention runs (ms).
    #[arg(long, env = "ARBOR_COMPACT_INTERVAL_MS", default_value_t = 60_000)]
    pub compact_interval_ms: u64,
}

#[derive(Debug, Args)]
pub struct ClientArgs {
    #[arg(
        long,
        env = "ARBOR_RUNNER_ADDR",
        default_value = "http://127.0.0.1:50051"
    )]
    pub addr: String,
    #[arg(long, env = "ARBOR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// CA certificate (PEM) to trust for an `https://` address.
    #[arg(long, env = "ARBOR_CA")]
    pub ca: Option<PathBuf>,
}

type Client = RunnerServiceClient<InterceptedService<Channel, BearerToken>>;

async fn connect(args: &ClientArgs) -> Result<Client, String> {
    let (channel, token) = connect_channel(args).await?;
    Ok(RunnerServiceClient::with_interceptor(channel, token)
        .max_decoding_message_size(arbor_shared::server::MAX_RESPONSE_BYTES))
}

async fn connect_channel(args: &ClientArgs) -> Result<(Channel, BearerToken), String> {
    let mut endpoint = Channel::from_shared(args.addr.clone())
        .map_err(|e| format!("bad address {}: {e}", args.addr))?;
    if let Some(ca) = &args.ca {
        endpoint = endpoint
            .tls_config(arbor_shared::tls::client_config(ca)?)
            .map_err(|e| format!("TLS: {e}"))?;
    }
    let channel = endpoint
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("cannot reach runner-svc at {}: {e}", args.addr))?;
    let token = BearerToken::new(args.token.as_deref()).map_err(|s| s.message().to_string())?;
    Ok((channel, token))
}

async fn list_tasks(
    state: Vec<String>,
    task_type: Option<String>,
    worker: Option<String>,
    run: Option<String>,
    summary: bool,
    client: &ClientArgs,
) -> Result<(), String> {
    let states = state
        .iter()
        .map(|s| {
            pb::TaskState::from_str_name(&format!("TASK_STATE_{}", s.to_uppercase()))
                .map(|s| s as i32)
                .ok_or_else(|| format!("unknown task state {s}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (channel, token) = connect_channel(client).await?;
    let mut workers = WorkerServiceClient::with_interceptor(channel, token)
        .max_decoding_message_size(arbor_shared::server::MAX_RESPONSE_BYTES);
    let mut tasks = Vec::new();
    let mut page_token = String::new();
    loop {
        let resp = workers
            .list_tasks(pb::ListTasksRequest {
                states: states.clone(),
                task_type: task_type.clone().unwrap_or_default(),
                worker_id: worker.clone().unwrap_or_default(),
                run_id: run.clone().unwrap_or_default(),
                page_size: 1000,
                page_token,
            })
            .await
            .map_err(status_err)?
            .into_inner();
        tasks.extend(resp.tasks);
        if resp.next_page_token.is_empty() {
            break;
        }
        page_token = resp.next_page_token;
    }
    let state_name = |s: i32| {
        pb::TaskState::try_from(s)
            .map(|s| {
                s.as_str_name()
                    .trim_start_matches("TASK_STATE_")
                    .to_string()
            })
            .unwrap_or_default()
    };
    if summary {
        let mut counts: std::collections::BTreeMap<(String, String), usize> = Default::default();
        for t in &tasks {
            *counts
                .entry((t.task_type.clone(), state_name(t.state)))
                .or_default() += 1;
        }
        println!("{:<32} {:<10} {:>8}", "TYPE", "STATE", "TASKS");
        for ((ty, st), n) in counts {
            println!("{ty:<32} {st:<10} {n:>8}");
        }
        return Ok(());
    }
    println!(
        "{:<42} {:<20} {:<10} {:>7}  {:<16} {:<24} RUN",
        "TASK", "TYPE", "STATE", "ATTEMPT", "WORKER", "LEASE ENDS"
    );
    for t in tasks {
        let until = t
            .lease_until
            .as_ref()
            .filter(|_| t.state == pb::TaskState::Leased as i32)
            .map(|ts| {
                let left = arbor_shared::time::from_timestamp(ts) as i64
                    - arbor_shared::time::now_ms() as i64;
                format!("in {:.1} s", left as f64 / 1000.0)
            })
            .unwrap_or_else(|| "-".into());
        let state = match (state_name(t.state), t.cancel_requested) {
            (s, true) if s == "LEASED" => "CANCELLING".to_string(),
            (s, _) => s,
        };
        println!(
            "{:<42} {:<20} {:<10} {:>7}  {:<16} {:<24} {}",
            t.task_id,
            t.task_type,
            state,
            format!("{}/{}", t.attempt, t.max_attempts),
            if t.worker_id.is_empty() {
                "-"
            } else {
                &t.worker_id
            },
            until,
            t.run_id
        );
        if !t.last_error.is_empty() {
            println!("    last error: {}", t.last_error);
        }
    }
    Ok(())
}

fn status_err(s: tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

fn parse_json(what: &str, text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| format!("{what} is not valid JSON: {e}"))
}

/// Runs the parsed command line.
pub async fn main(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve(args) => serve(args).await,
        other => {
            arbor_shared::server::init_tracing(false);
            client(other).await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    arbor_shared::server::init_tracing(args.log_json);
    let auth = match &args.tokens {
        Some(path) => Authenticator::from_file(path).map_err(|e| e.to_string())?,
        None => Authenticator::disabled(),
    };
    arbor_shared::server::check_bind(args.listen, auth.is_enabled(), args.insecure)?;
    if !auth.is_enabled() {
        tracing::warn!("authentication is OFF (no --tokens): every caller has every role");
    }
    let guards = match &args.guards {
        Some(path) => {
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
            guards
        }
        None => GuardConfig::default(),
    };
    if args.store.is_none() {
        std::fs::create_dir_all(&args.data_dir)
            .map_err(|e| format!("cannot create {}: {e}", args.data_dir.display()))?;
    }
    let cfg = ServeConfig {
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
        retention: arbor_runner_svc::retention::RetentionConfig {
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
    };
    // Caught from before the port binds: a SIGTERM during recovery shuts down cleanly too.
    let shutdown = arbor_shared::server::shutdown_signal();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    arbor_runner_svc::run(cfg, listener, shutdown)
        .await
        .map_err(|e| e.to_string())
}

async fn client(command: Command) -> Result<(), String> {
    match command {
        Command::Serve(_) => Ok(()),
        Command::HashToken { token } => {
            println!("{}", arbor_shared::auth::hash_token(&token));
            Ok(())
        }
        Command::Submit {
            file,
            input,
            thread,
            priority,
            client,
        } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            let yaml = file.extension().is_some_and(|e| e == "yaml" || e == "yml");
            let mut c = connect(&client).await?;
            let tree = c
                .register_tree(pb::RegisterTreeRequest {
                    document: text,
                    format: if yaml {
                        pb::TreeFormat::Yaml
                    } else {
                        pb::TreeFormat::Json
                    } as i32,
                })
                .await
                .map_err(status_err)?
                .into_inner()
                .tree
                .unwrap_or_default();
            let input = match input {
                Some(text) => match parse_json("--input", &text)? {
                    serde_json::Value::Object(map) => Some(to_proto_struct(&map)),
                    _ => return Err("--input must be a JSON object".into()),
                },
                None => None,
            };
            let resp = c
                .submit_run(pb::SubmitRunRequest {
                    tree_id: tree.id.clone(),
                    tree_version: tree.version,
                    thread_id: thread.unwrap_or_default(),
                    input,
                    priority,
                    ..Default::default()
                })
                .await
                .map_err(status_err)?
                .into_inner();
            let run = resp.run.unwrap_or_default();
            println!("tree {} v{} registered", tree.id, tree.version);
            println!("run {} submitted (thread {})", run.run_id, run.thread_id);
            Ok(())
        }
        Command::Runs {
            status,
            thread,
            client,
        } => {
            let statuses = match status {
                Some(s) => vec![parse_run_status(&s)? as i32],
                None => Vec::new(),
            };
            let mut c = connect(&client).await?;
            let mut token = String::new();
            println!(
                "{:<38} {:<11} {:<24} {:>5}  WAITING ON",
                "RUN", "STATUS", "TREE", "STEP"
            );
            loop {
                let page = c
                    .list_runs(pb::ListRunsRequest {
                        thread_id: thread.clone().unwrap_or_default(),
                        statuses: statuses.clone(),
                        page_size: 500,
                        page_token: token.clone(),
                        ..Default::default()
                    })
                    .await
                    .map_err(status_err)?
                    .into_inner();
                for r in &page.runs {
                    let status = pb::RunStatus::try_from(r.status)
                        .map(|s| {
                            s.as_str_name()
                                .trim_start_matches("RUN_STATUS_")
                                .to_string()
                        })
                        .unwrap_or_default();
                    let waiting: Vec<String> = r
                        .suspensions
                        .iter()
                        .map(|s| format!("{} ({})", s.request_id, s.node_locator))
                        .collect();
                    println!(
                        "{:<38} {:<11} {:<24} {:>5}  {}",
                        r.run_id,
                        status,
                        format!("{}@{}", r.tree_id, r.tree_version),
                        r.step,
                        waiting.join(", ")
                    );
                }
                if page.next_page_token.is_empty() {
                    return Ok(());
                }
                token = page.next_page_token;
            }
        }
        Command::Get { run_id, client } => {
            let run = connect(&client)
                .await?
                .get_run(pb::GetRunRequest { run_id })
                .await
                .map_err(status_err)?
                .into_inner()
                .run
                .unwrap_or_default();
            println!(
                "{}",
                serde_json::to_string_pretty(&run_json(&run)).unwrap_or_default()
            );
            Ok(())
        }
        Command::Events {
            follow,
            after,
            run,
            subscriber,
            client,
        } => {
            let mut c = connect(&client).await?;
            let mut stream = c
                .stream_events(pb::StreamEventsRequest {
                    subscriber_id: subscriber.clone().unwrap_or_default(),
                    after_seq: after,
                    filter: Some(pb::EventFilter {
                        run_id: run.unwrap_or_default(),
                        ..Default::default()
                    }),
                    follow,
                })
                .await
                .map_err(status_err)?
                .into_inner();
            while let Some(item) = stream.message().await.map_err(status_err)? {
                let Some(event) = item.event else { continue };
                println!("{}", event_line(&event));
                if let Some(sub) = &subscriber {
                    c.ack(pb::AckRequest {
                        subscriber_id: sub.clone(),
                        seq: event.seq,
                    })
                    .await
                    .map_err(status_err)?;
                }
            }
            Ok(())
        }
        Command::Resolve {
            run_id,
            request_id,
            text,
            value,
            result,
            cancel,
            reason,
            client,
        } => {
            let result = if let Some(t) = text {
                serde_json::json!({"text": t})
            } else if let Some(v) = value {
                serde_json::json!({"value": parse_json("--value", &v)?})
            } else if let Some(r) = result {
                parse_json("--result", &r)?
            } else {
                serde_json::Value::Null
            };
            let resp = connect(&client)
                .await?
                .resolve(pb::ResolveRequest {
                    run_id,
                    request_id,
                    decision_id: uuid::Uuid::now_v7().to_string(),
                    action: if cancel {
                        pb::ResolveAction::Cancel
                    } else {
                        pb::ResolveAction::Resume
                    } as i32,
                    result: Some(to_proto_value(&result)),
                    reason,
                    ..Default::default()
                })
                .await
                .map_err(status_err)?
                .into_inner();
            println!(
                "decision accepted{}",
                if resp.duplicate { " (duplicate)" } else { "" }
            );
            Ok(())
        }
        Command::Cancel {
            run_id,
            reason,
            client,
        } => {
            let run = connect(&client)
                .await?
                .cancel_run(pb::CancelRunRequest { run_id, reason })
                .await
                .map_err(status_err)?
                .into_inner()
                .run
                .unwrap_or_default();
            println!("run {} is {}", run.run_id, status_name(run.status));
            Ok(())
        }
        Command::Interrupt {
            thread_id,
            reason,
            client,
        } => {
            let resp = connect(&client)
                .await?
                .interrupt_thread(pb::InterruptThreadRequest {
                    thread_id,
                    reason,
                    next: None,
                })
                .await
                .map_err(status_err)?
                .into_inner();
            let i = resp.interrupt.unwrap_or_default();
            println!(
                "generation {}; superseded {} queued job(s); running job: {}",
                i.new_generation,
                i.superseded_count,
                i.active_job
                    .map(|j| j.job_id)
                    .unwrap_or_else(|| "none".into())
            );
            Ok(())
        }
        Command::Tasks {
            state,
            task_type,
            worker,
            run,
            summary,
            client,
        } => list_tasks(state, task_type, worker, run, summary, &client).await,
        Command::Jobs {
            thread,
            status,
            client,
        } => {
            let statuses = match status {
                Some(s) => vec![
                    pb::JobStatus::from_str_name(&format!("JOB_STATUS_{}", s.to_uppercase()))
                        .ok_or_else(|| format!("unknown job status {s}"))?
                        as i32,
                ],
                None => Vec::new(),
            };
            let resp = connect(&client)
                .await?
                .list_jobs(pb::ListJobsRequest {
                    thread_id: thread.unwrap_or_default(),
                    statuses,
                    page_size: 1000,
                    ..Default::default()
                })
                .await
                .map_err(status_err)?
                .into_inner();
            println!(
                "{:<44} {:<12} {:<8} {:>8}  RUN",
                "JOB", "STATUS", "KIND", "ATTEMPTS"
            );
            for j in resp.jobs {
                println!(
                    "{:<44} {:<12} {:<8} {:>8}  {}",
                    j.job_id,
                    pb::JobStatus::try_from(j.status)
                        .map(|s| s
                            .as_str_name()
                            .trim_start_matches("JOB_STATUS_")
                            .to_string())
                        .unwrap_or_default(),
                    pb::JobKind::try_from(j.kind)
                        .map(|s| s.as_str_name().trim_start_matches("JOB_KIND_").to_string())
                        .unwrap_or_default(),
                    format!("{}/{}", j.attempt_count, j.max_attempts),
                    j.run_id
                );
            }
            Ok(())
        }
        Command::Requeue { job_id, client } => {
            let job = connect(&client)
                .await?
                .requeue_job(pb::RequeueJobRequest { job_id })
                .await
                .map_err(status_err)?
                .into_inner()
                .job
                .unwrap_or_default();
            println!("job {} requeued", job.job_id);
            Ok(())
        }
    }
}

fn parse_run_status(s: &str) -> Result<pb::RunStatus, String> {
    pb::RunStatus::from_str_name(&format!("RUN_STATUS_{}", s.to_uppercase()))
        .ok_or_else(|| format!("unknown run status {s}"))
}

fn status_name(status: i32) -> &'static str {
    match RunStatus::from_wire(status, "status") {
        Ok(s) => s.as_str(),
        Err(_) => "UNKNOWN",
    }
}

fn run_json(r: &pb::Run) -> serde_json::Value {
    serde_json::json!({
        "run_id": r.run_id,
        "thread_id": r.thread_id,
        "tree": format!("{}@{}", r.tree_id, r.tree_version),
        "status": status_name(r.status),
        "error": r.error,
        "step": r.step,
        "submitted_by": r.submitted_by,
        "blackboard": r.blackboard.as_ref().map(from_proto_struct).unwrap_or_default(),
        "waiting_on": r.suspensions.iter().map(|s| serde_json::json!({
            "request_id": s.request_id,
            "node": s.node_locator,
            "category": pb::SuspensionCategory::try_from(s.category).map(|c| c.as_str_name()).unwrap_or(""),
            "message": s.message,
            "payload": arbor_shared::json::from_optional_value(s.payload.as_ref()),
        })).collect::<Vec<_>>(),
    })
}

fn event_line(e: &pb::Event) -> String {
    let kind = pb::EventKind::try_from(e.kind)
        .map(|k| {
            k.as_str_name()
                .trim_start_matches("EVENT_KIND_")
                .to_string()
        })
        .unwrap_or_default();
    let detail = match arbor_shared::domain::Event::try_from(e) {
        Ok(ev) => match ev.detail {
            EventDetail::ApprovalRequested(r) => {
                format!("request={} title={:?}", r.request_id, r.title)
            }
            EventDetail::ExecutionSuspended {
                request_id,
                category,
                ..
            } => format!("request={request_id} category={category:?}"),
            EventDetail::ApprovalResolved {
                request_id,
                action,
                decided_by,
                ..
            } => format!("request={request_id} action={action:?} by={decided_by}"),
            EventDetail::ApprovalConsumed { request_id, .. } => format!("request={request_id}"),
            EventDetail::RunFinished { error, .. } if !error.is_empty() => {
                format!("error={error:?}")
            }
            EventDetail::SuspensionWithdrawn { request_id, reason } => {
                format!("request={request_id} reason={reason:?}")
            }
            EventDetail::TaskDispatched { task, .. }
            | EventDetail::TaskCompleted { task }
            | EventDetail::TaskReleased { task, .. } => {
                format!(
                    "task={} type={} attempt={} worker={}",
                    task.task_id, task.task_type, task.attempt, task.worker_id
                )
            }
            EventDetail::TaskFailed {
                task,
                error,
                cause,
                will_retry,
                ..
            } => format!(
                "task={} type={} attempt={} worker={} cause={} retry={will_retry} error={error:?}",
                task.task_id,
                task.task_type,
                task.attempt,
                task.worker_id,
                cause.as_str()
            ),
            _ => String::new(),
        },
        Err(_) => String::new(),
    };
    format!("{:>6} {:<22} run={} {}", e.seq, kind, e.run_id, detail)
}
