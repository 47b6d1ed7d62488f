//! Serving plumbing both binaries share: tracing set-up, the shutdown signal, reflection, and the
//! rule that an unauthenticated service only listens on loopback.

use std::net::SocketAddr;

use tokio_stream::wrappers::TcpListenerStream;

/// Largest gRPC message either service accepts or sends (4 MiB, tonic's default decode limit).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Initialises the global tracing subscriber (`RUST_LOG` filter, `info` by default).
pub fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Refuses to serve without authentication anywhere but loopback, unless `insecure` is set.
pub fn check_bind(addr: SocketAddr, auth_enabled: bool, insecure: bool) -> Result<(), String> {
    if auth_enabled || addr.ip().is_loopback() {
        return Ok(());
    }
    if insecure {
        tracing::warn!(%addr, "serving WITHOUT authentication on a non-loopback address (--insecure)");
        return Ok(());
    }
    Err(format!(
        "refusing to listen on {addr} without authentication: give --tokens FILE, bind a loopback \
         address, or pass --insecure"
    ))
}

/// The accepted-connection stream of a bound listener, with TCP_NODELAY set: gRPC writes small
/// frames, and Nagle's algorithm meeting delayed ACKs would add ~40 ms to every exchange.
pub fn incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    TcpListenerStream::new(listener).map(|conn| {
        let conn = conn?;
        conn.set_nodelay(true)?;
        Ok(conn)
    })
}

/// gRPC server reflection (v1 and v1alpha) over every Arbor proto.
pub fn reflection_services() -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    tonic_reflection::server::Error,
> {
    let v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    Ok((v1, v1alpha))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_fine_without_tokens_elsewhere_needs_insecure() {
        let lo: SocketAddr = "127.0.0.1:50051".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:50051".parse().unwrap();
        assert!(check_bind(lo, false, false).is_ok());
        assert!(check_bind(any, false, false).is_err());
        assert!(check_bind(any, false, true).is_ok());
        assert!(check_bind(any, true, false).is_ok());
    }
}
