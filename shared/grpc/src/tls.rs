//! TLS for the StoreAPI, from PEM files read once at start: a server's certificate and
//! key, with the CA its clients' certificates must chain to for mutual TLS; a client's CA
//! for the servers, with its own certificate when the servers ask for one. The flags and
//! keys follow Thanos' (`--grpc-server-tls-cert`, `--grpc-client-tls-ca`, ...).
//!
//! A file that is missing, too large or holds no PEM block is an error naming it, at
//! start, not at the first connection.

use crate::GrpcError;
use std::path::{Path, PathBuf};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// The longest a TLS handshake may take.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A PEM file larger than this is refused (a chain of a few certificates is a few KB).
const MAX_PEM_BYTES: u64 = 1 << 20;

/// A server's TLS: its certificate and key; with `client_ca`, clients must present a
/// certificate that chains to it.
#[derive(Debug, Clone)]
pub struct ServerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// A client's TLS: the CA the servers' certificates chain to, the client's own
/// certificate and key for servers that verify clients, and the name to verify the
/// servers' certificates against (default: the host of each store's address).
#[derive(Debug, Clone, Default)]
pub struct ClientTlsFiles {
    pub ca: PathBuf,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub server_name: Option<String>,
}

fn read_pem(path: &Path) -> Result<Vec<u8>, GrpcError> {
    let bad = |reason: String| GrpcError::Tls { file: path.to_path_buf(), reason };
    let len = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?.len();
    if len > MAX_PEM_BYTES {
        return Err(bad(format!("{len} bytes (at most {MAX_PEM_BYTES})")));
    }
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(bad("no PEM block".into()));
    }
    Ok(pem)
}

impl ServerTlsFiles {
    pub fn load(&self) -> Result<ServerTlsConfig, GrpcError> {
        let identity = Identity::from_pem(read_pem(&self.cert)?, read_pem(&self.key)?);
        // A client that starts a handshake and stalls is dropped.
        let mut cfg = ServerTlsConfig::new().identity(identity).timeout(HANDSHAKE_TIMEOUT);
        if let Some(ca) = &self.client_ca {
            cfg = cfg.client_ca_root(Certificate::from_pem(read_pem(ca)?));
        }
        Ok(cfg)
    }
}

impl ClientTlsFiles {
    pub fn load(&self) -> Result<ClientTlsConfig, GrpcError> {
        let mut cfg = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read_pem(&self.ca)?));
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => cfg = cfg.identity(Identity::from_pem(read_pem(cert)?, read_pem(key)?)),
            (None, None) => {}
            (Some(path), None) | (None, Some(path)) => {
                return Err(GrpcError::Tls { file: path.clone(), reason: "a client certificate needs its key".into() })
            }
        }
        if let Some(name) = &self.server_name {
            cfg = cfg.domain_name(name.clone());
        }
        Ok(cfg)
    }
}
