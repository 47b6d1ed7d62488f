//! Optional TLS (rustls) for deployments without a mesh: a server identity from PEM files, and
//! for clients a CA to trust. With a mesh (Istio/Linkerd mTLS) leave it off.

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))
}

/// The server's identity from a PEM certificate (chain) and its PEM private key.
pub fn server_config(cert: &Path, key: &Path) -> Result<ServerTlsConfig, String> {
    let cert = read(cert, "TLS certificate")?;
    let key = read(key, "TLS key")?;
    Ok(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
}

/// A client configuration trusting the PEM CA in `ca` (the system roots are not used: a service
/// talks to its own deployment's CA).
pub fn client_config(ca: &Path) -> Result<ClientTlsConfig, String> {
    let ca = read(ca, "CA certificate")?;
    Ok(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))
}

/// `--tls-cert` and `--tls-key` go together.
pub fn server_from_flags(
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<ServerTlsConfig>, String> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(c), Some(k)) => server_config(c, k).map(Some),
        _ => Err("--tls-cert and --tls-key must be given together".into()),
    }
}
