//! `runner-svc`: serve, or talk to a running runner as a person would.

mod cli;

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    cli::main(cli).await
}
