//! `runner-svc`: serve, or talk to a running runner as a person would.

mod cli;

/// With the `mimalloc` feature, the published mimalloc allocator instead of the system's.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    cli::main(cli).await
}
