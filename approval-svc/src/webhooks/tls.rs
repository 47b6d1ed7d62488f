//! TLS towards `https://` endpoints: rustls, trusting the system's CA certificates (read once).

use std::sync::{Arc, OnceLock};

use tokio::net::TcpStream;
use tokio_rustls::{
    TlsConnector,
    client::TlsStream,
    rustls::{ClientConfig, RootCertStore, pki_types::ServerName},
};

fn config() -> Arc<ClientConfig> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!(error = %e, "webhooks: cannot read a system CA certificate");
            }
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!("webhooks: no system CA certificate found; https endpoints fail");
            }
            let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
            let config = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map(|b| b.with_root_certificates(roots).with_no_client_auth())
                .unwrap_or_else(|_| {
                    ClientConfig::builder()
                        .with_root_certificates(RootCertStore::empty())
                        .with_no_client_auth()
                });
            Arc::new(config)
        })
        .clone()
}

/// `tcp` wrapped in TLS to `host`, its certificate checked against the system's CAs.
pub async fn connect(host: &str, tcp: TcpStream) -> Result<TlsStream<TcpStream>, String> {
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host:?} cannot name a TLS server: {e}"))?;
    TlsConnector::from(config())
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake failed: {e}"))
}
