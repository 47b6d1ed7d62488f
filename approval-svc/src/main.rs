//! The `approval-svc` binary: `serve` runs the service; the other subcommands are the client
//! people use to list and decide approvals.

mod cli;

/// With the `mimalloc` feature, the published mimalloc allocator instead of the system's.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command, ServeArgs};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = match cli.command {
        Command::Serve(args) => runtime.block_on(serve(args)),
        client => runtime.block_on(cli::client::execute(client)),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let cfg = args.config()?;
    let export = arbor_shared::otel::Export {
        endpoint: args.otlp_endpoint.clone(),
        service: "approval-svc",
        version: env!("CARGO_PKG_VERSION"),
    };
    let mut telemetry = arbor_shared::otel::init_tracing(args.log_json, Some(&export))
        .map_err(anyhow::Error::msg)?;
    let served = serve_traced(args, cfg).await;
    // The spans of the shutdown itself go out with the rest.
    telemetry.shutdown().await;
    served
}

async fn serve_traced(args: ServeArgs, cfg: arbor_approval_svc::ServeConfig) -> anyhow::Result<()> {
    arbor_shared::server::check_bind(args.listen, cfg.auth.is_enabled(), args.insecure)
        .map_err(anyhow::Error::msg)?;
    if let Some(web) = cfg.web.listen {
        // Without tokens the inbox would let anyone who reaches it decide as `anonymous`.
        arbor_shared::server::check_bind(web, cfg.auth.is_enabled(), args.insecure)
            .map_err(|e| anyhow::anyhow!("--web-listen: {e}"))?;
    }
    if !cfg.auth.is_enabled() {
        tracing::warn!("authentication is OFF (no --tokens): every caller is 'anonymous'");
    }
    // Caught from before the port binds: a SIGTERM during recovery shuts down cleanly too.
    let shutdown = arbor_shared::server::shutdown_signal();
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    arbor_approval_svc::run(cfg, listener, shutdown).await?;
    Ok(())
}
