//! The `runner-svc` command line: `serve` and the client subcommands people use (`submit`,
//! `runs`, `get`, `events`, `resolve`, `cancel`, `interrupt`, `jobs`, `tasks`, `requeue`,
//! `hash-token`). This module holds the clap types and the dispatch; `serve`, `runs` (a run's
//! life) and `ops` (operators' views of jobs and tasks) hold a function per subcommand.

mod ops;
mod runs;
mod serve;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use arbor_shared::{
    auth::BearerToken, proto::runner::v1::runner_service_client::RunnerServiceClient,
};
use clap::{Args, Parser, Subcommand};
use tonic::{service::interceptor::InterceptedService, transport::Channel};

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
    Serve(serve::ServeArgs),
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
    Resolve(runs::ResolveArgs),
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
    Tasks(ops::TasksArgs),
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

/// Runs the parsed command line.
pub async fn main(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve(args) => serve::serve(args).await,
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

/// Runs a client subcommand.
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
        } => runs::submit(file, input, thread, priority, &client).await,
        Command::Runs {
            status,
            thread,
            client,
        } => runs::list(status, thread, &client).await,
        Command::Get { run_id, client } => runs::get(run_id, &client).await,
        Command::Events {
            follow,
            after,
            run,
            subscriber,
            client,
        } => runs::events(follow, after, run, subscriber, &client).await,
        Command::Resolve(args) => runs::resolve(args).await,
        Command::Cancel {
            run_id,
            reason,
            client,
        } => runs::cancel(run_id, reason, &client).await,
        Command::Interrupt {
            thread_id,
            reason,
            client,
        } => runs::interrupt(thread_id, reason, &client).await,
        Command::Tasks(args) => ops::tasks(args).await,
        Command::Jobs {
            thread,
            status,
            client,
        } => ops::jobs(thread, status, &client).await,
        Command::Requeue { job_id, client } => ops::requeue(job_id, &client).await,
    }
}

fn status_err(s: tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

fn parse_json(what: &str, text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| format!("{what} is not valid JSON: {e}"))
}
