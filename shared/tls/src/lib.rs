//! Prometheus' client `tls_config` (`ca_file`, `cert_file`, `key_file`, `server_name`,
//! `insecure_skip_verify`, `min_version`) turned into a rustls `ClientConfig` with the ring
//! provider: one reading of the files and one set of errors for every tier that connects
//! out over HTTPS (an edge's scrapes, a regional's Alertmanagers). Paths are relative to
//! the configuration file's directory; with no `ca_file` the system's CAs are trusted.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where Debian keeps the system's trusted CAs, used when no `ca_file` is named.
const SYSTEM_CAS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// `p` relative to `base` unless absolute.
pub fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub server_name: Option<String>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
    pub min_version: Option<String>,
}

/// The client configuration `t` describes; `Err` names the key and file at fault.
pub fn client_config(base: &Path, t: &TlsConfig) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&'static rustls::SupportedProtocolVersion] = match t.min_version.as_deref() {
        None | Some("TLS12") => &[&rustls::version::TLS12, &rustls::version::TLS13],
        Some("TLS13") => &[&rustls::version::TLS13],
        Some(v) => return Err(format!("tls_config.min_version {v}: Strata supports TLS12 and TLS13")),
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| format!("tls_config: {e}"))?;
    let builder = if t.insecure_skip_verify {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(SkipVerify(provider)))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        let (ca, required) = match &t.ca_file {
            Some(f) => (resolve(base, f), true),
            None => (PathBuf::from(SYSTEM_CAS), false),
        };
        match CertificateDer::pem_file_iter(&ca) {
            Ok(certs) => {
                for c in certs {
                    let c = c.map_err(|e| format!("tls_config.ca_file {}: {e}", ca.display()))?;
                    roots.add(c).map_err(|e| format!("tls_config.ca_file {}: {e}", ca.display()))?;
                }
            }
            Err(e) if required => return Err(format!("tls_config.ca_file {}: {e}", ca.display())),
            Err(_) => {}
        }
        builder.with_root_certificates(roots)
    };
    match (&t.cert_file, &t.key_file) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(c), Some(k)) => {
            let (c, k) = (resolve(base, c), resolve(base, k));
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&c)
                .and_then(|it| it.collect::<Result<_, _>>())
                .map_err(|e| format!("tls_config.cert_file {}: {e}", c.display()))?;
            let key =
                PrivateKeyDer::from_pem_file(&k).map_err(|e| format!("tls_config.key_file {}: {e}", k.display()))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| format!("tls_config client certificate: {e}"))
        }
        _ => Err("tls_config: cert_file and key_file go together".into()),
    }
}

/// `insecure_skip_verify: true`: any certificate is accepted (signatures are still checked
/// so the handshake is well-formed), exactly as the user asked.
#[derive(Debug)]
struct SkipVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
