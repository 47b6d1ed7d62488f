//! `runner-svc`: serve, or talk to a running runner as a person would.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = arbor_runner_svc::cli::Cli::parse();
    arbor_runner_svc::cli::main(cli).await
}
