//! The runner's listener for the gateway: the pod network, mutual TLS.
//!
//! The Unix socket and the loopback port trust whoever reaches them (the
//! pod itself, or a port-forward the API server authorised). The pod
//! network is reachable by anything the NetworkPolicy lets through, so here
//! the client proves itself: its certificate must chain to the platform's
//! CA and be issued for client authentication. The operator issues runner
//! certificates for server authentication only, so a tenant who reads their
//! own runner's key from its Secret still cannot call another runner.

use std::path::Path;
use std::time::Duration;

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::error::Error;

/// A certificate, key or CA file larger than this is not one.
const MAX_PEM_BYTES: u64 = 256 * 1024;
/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The files the operator's Secret holds.
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";
pub const CA_FILE: &str = "ca.crt";

/// The server side of mutual TLS from the certificates in `dir`.
pub fn server_config(dir: &Path) -> Result<ServerTlsConfig, Error> {
    let cert = read_pem(&dir.join(CERT_FILE))?;
    let key = read_pem(&dir.join(KEY_FILE))?;
    let ca = read_pem(&dir.join(CA_FILE))?;
    Ok(ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .client_ca_root(Certificate::from_pem(ca))
        .client_auth_optional(false)
        .timeout(HANDSHAKE_TIMEOUT))
}

fn read_pem(path: &Path) -> Result<Vec<u8>, Error> {
    use std::io::Read;
    let file = std::fs::File::open(path)
        .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
    let mut buf = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
    if buf.len() as u64 > MAX_PEM_BYTES {
        return Err(Error::Usage(format!(
            "{} is larger than {MAX_PEM_BYTES} bytes; it is not a PEM certificate or key",
            path.display()
        )));
    }
    if !buf.windows(10).any(|w| w == b"-----BEGIN") {
        return Err(Error::Usage(format!(
            "{} is not PEM (no -----BEGIN line)",
            path.display()
        )));
    }
    Ok(buf)
}
