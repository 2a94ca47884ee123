//! `--web.config.file`: Prometheus' web configuration format (the exporter toolkit's),
//! so that a file `promtool check web-config` accepts turns on TLS, client-certificate
//! checks and basic auth for every Strata server:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt
//!   key_file: server.key
//!   client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
//!   client_ca_file: ca.crt
//!   min_version: TLS12
//! basic_auth_users:
//!   alice: $2y$10$...   # bcrypt
//! ```
//!
//! Relative paths are read from the web config file's directory, as Prometheus does.
//! Keys Strata does not implement (cipher suites, curve preferences, HTTP/2 settings) are
//! named in [`WebConfig::ignored`] and logged. Basic-auth checks cost a bcrypt hash, so a
//! verified pair is remembered (by a keyed hash, never the password) and at most two
//! checks run at once: wrong passwords cannot eat the CPU.

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;

#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{path}: TLS: {source}")]
    Tls {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

#[derive(Debug, Deserialize, Default)]
struct RawWebConfig {
    tls_server_config: Option<RawTls>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
    #[serde(flatten)]
    unknown: BTreeMap<String, IgnoredAny>,
}

#[derive(Debug, Deserialize, Default)]
struct RawTls {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    client_auth_type: Option<String>,
    client_ca_file: Option<PathBuf>,
    min_version: Option<String>,
    max_version: Option<String>,
    #[serde(flatten)]
    unknown: BTreeMap<String, IgnoredAny>,
}

/// A loaded web configuration: the TLS acceptor (if any) and the basic-auth users.
#[derive(Clone, Default)]
pub struct WebConfig {
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub auth: Option<Arc<BasicAuth>>,
    /// Keys of the file Strata does not implement.
    pub ignored: Vec<String>,
    /// The files it read besides itself (certificates, keys, CAs), so a change is noticed.
    pub files: Vec<PathBuf>,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("basic_auth", &self.auth.is_some())
            .field("ignored", &self.ignored)
            .finish()
    }
}

impl WebConfig {
    pub fn load(path: &Path) -> Result<WebConfig, WebConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| WebConfigError::Read { path: path.to_path_buf(), source })?;
        Self::parse(&text, path)
    }

    /// The configuration in `text`, read from `path` (relative files resolve beside it).
    pub fn parse(text: &str, path: &Path) -> Result<WebConfig, WebConfigError> {
        let raw: RawWebConfig = if text.trim().is_empty() {
            RawWebConfig::default()
        } else {
            serde_saphyr::from_str(text)
                .map_err(|e| WebConfigError::Parse { path: path.to_path_buf(), message: e.to_string() })?
        };
        let base = path.parent().unwrap_or(Path::new("."));
        let invalid = |message: String| WebConfigError::Invalid { path: path.to_path_buf(), message };
        let mut ignored: Vec<String> = raw.unknown.keys().cloned().collect();
        let mut files = Vec::new();
        let tls = match raw.tls_server_config {
            None => None,
            Some(t) => {
                // Keys that would narrow who may connect are never ignored: the file is
                // refused rather than served more openly than it says.
                if t.unknown.contains_key("client_allowed_sans") {
                    return Err(invalid(
                        "tls_server_config.client_allowed_sans is not supported by Strata: \
                                        refusing the file rather than accepting every certificate the CA signed"
                            .into(),
                    ));
                }
                ignored.extend(t.unknown.keys().map(|k| format!("tls_server_config.{k}")));
                files.extend(
                    [&t.cert_file, &t.key_file, &t.client_ca_file].into_iter().flatten().map(|f| resolve(base, f)),
                );
                Some(tls_acceptor(&t, base, path)?)
            }
        };
        let mut users = BTreeMap::new();
        for (user, hash) in raw.basic_auth_users {
            if user.contains(':') {
                return Err(invalid(format!("basic_auth_users: user name {user:?} contains ':'")));
            }
            if bcrypt::verify("", &hash).is_err() {
                return Err(invalid(format!("basic_auth_users: the hash of {user:?} is not a bcrypt hash")));
            }
            users.insert(user, hash);
        }
        let auth = (!users.is_empty()).then(|| Arc::new(BasicAuth::new(users)));
        Ok(WebConfig { tls, auth, ignored, files })
    }
}

fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

fn tls_acceptor(t: &RawTls, base: &Path, path: &Path) -> Result<tokio_rustls::TlsAcceptor, WebConfigError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let invalid = |message: String| WebConfigError::Invalid { path: path.to_path_buf(), message };
    let (Some(cert), Some(key)) = (&t.cert_file, &t.key_file) else {
        return Err(invalid("tls_server_config needs cert_file and key_file".into()));
    };
    let (cert, key) = (resolve(base, cert), resolve(base, key));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| invalid(format!("cert_file {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(invalid(format!("cert_file {}: no certificate", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(&key).map_err(|e| invalid(format!("key_file {}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: Vec<&'static rustls::SupportedProtocolVersion> =
        match (t.min_version.as_deref().unwrap_or("TLS12"), t.max_version.as_deref().unwrap_or("TLS13")) {
            ("TLS12", "TLS13") => vec![&rustls::version::TLS12, &rustls::version::TLS13],
            ("TLS12", "TLS12") => vec![&rustls::version::TLS12],
            ("TLS13", "TLS13") => vec![&rustls::version::TLS13],
            (lo, hi) => return Err(invalid(format!("TLS versions {lo}..{hi}: Strata supports TLS12 and TLS13"))),
        };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|source| WebConfigError::Tls { path: path.to_path_buf(), source })?;
    let auth_type = t.client_auth_type.as_deref().unwrap_or("NoClientCert");
    if auth_type == "NoClientCert" && t.client_ca_file.is_some() {
        // As the exporter toolkit: a CA without a policy would check nothing.
        return Err(invalid(
            "client_ca_file is set but client_auth_type is not: no client certificate would be checked \
                            (set client_auth_type: RequireAndVerifyClientCert)"
                .into(),
        ));
    }
    let builder = match auth_type {
        "NoClientCert" => builder.with_no_client_auth(),
        "RequireAndVerifyClientCert" | "VerifyClientCertIfGiven" => {
            let Some(ca) = &t.client_ca_file else {
                return Err(invalid(format!("client_auth_type {auth_type} needs client_ca_file")));
            };
            let ca = resolve(base, ca);
            let mut roots = rustls::RootCertStore::empty();
            let cas = CertificateDer::pem_file_iter(&ca)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| invalid(format!("client_ca_file {}: {e}", ca.display())))?;
            for c in cas {
                roots.add(c).map_err(|source| WebConfigError::Tls { path: path.to_path_buf(), source })?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier =
                if auth_type == "VerifyClientCertIfGiven" { verifier.allow_unauthenticated() } else { verifier };
            let verifier = verifier.build().map_err(|e| invalid(format!("client_ca_file {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        other => return Err(invalid(format!("client_auth_type {other} is not supported by Strata"))),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|source| WebConfigError::Tls { path: path.to_path_buf(), source })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Basic-auth users with bcrypt hashes, and the pairs already verified.
pub struct BasicAuth {
    users: BTreeMap<String, String>,
    /// A hash checked for users that do not exist.
    dummy: String,
    /// bcrypt checks run, for the tests.
    checks_run: std::sync::atomic::AtomicU64,
    verified: Mutex<HashSet<u64>>,
    key: RandomState,
    checks: Semaphore,
}

/// Verified pairs remembered at most; past it the memory starts over.
const VERIFIED_CACHE: usize = 1024;

impl BasicAuth {
    fn new(users: BTreeMap<String, String>) -> Self {
        // The cost of the users' hashes (`$2y$10$...`), for the stand-in unknown users meet.
        let cost =
            users.values().filter_map(|h| h.get(4..6)?.parse::<u32>().ok()).max().unwrap_or(bcrypt::DEFAULT_COST);
        let dummy = bcrypt::hash("strata: no such user", cost.clamp(4, 16)).unwrap_or_default();
        BasicAuth {
            users,
            dummy,
            checks_run: Default::default(),
            verified: Mutex::new(HashSet::new()),
            key: RandomState::new(),
            checks: Semaphore::new(2),
        }
    }

    /// Whether an `Authorization` header value names a user with the right password.
    pub async fn check(self: &Arc<Self>, header: Option<&str>) -> bool {
        // The scheme is case-insensitive, as Go's `Request.BasicAuth` reads it.
        let Some(encoded) = header.and_then(|h| {
            let (scheme, rest) = h.split_at_checked(6)?;
            scheme.eq_ignore_ascii_case("Basic ").then_some(rest)
        }) else {
            return false;
        };
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else { return false };
        let Ok(pair) = String::from_utf8(decoded) else { return false };
        let Some((user, password)) = pair.split_once(':') else { return false };
        // An unknown user costs the same bcrypt check as a known one (against a hash of the
        // users' own cost), so the time of a refusal does not tell which users exist.
        let (known, hash) = match self.users.get(user) {
            Some(h) => (true, h),
            None => (false, &self.dummy),
        };
        let fingerprint = self.key.hash_one((user, password, hash));
        if self.verified.lock().map(|v| v.contains(&fingerprint)).unwrap_or(false) {
            return true;
        }
        let Ok(_turn) = self.checks.acquire().await else { return false };
        self.checks_run.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (password, hash) = (password.to_string(), hash.clone());
        let ok = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
            .await
            .unwrap_or(false)
            && known;
        if ok {
            if let Ok(mut v) = self.verified.lock() {
                if v.len() >= VERIFIED_CACHE {
                    v.clear();
                }
                v.insert(fingerprint);
            }
        }
        ok
    }
}

/// Middleware: 401 with a `WWW-Authenticate` challenge unless the request authenticates.
pub async fn require_basic_auth(auth: Arc<BasicAuth>, req: Request, next: Next) -> Response {
    let header = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if auth.check(header).await {
        return next.run(req).await;
    }
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Basic realm=\"strata\"")], "Unauthorized\n").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::{serve, ServerLimits};
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    fn connector(certs: &crate::test_certs::TestCerts, with_client_cert: bool) -> tokio_rustls::TlsConnector {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(&certs.ca).unwrap()).unwrap();
        let b = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = if with_client_cert {
            let chain = vec![CertificateDer::from_pem_file(&certs.client_cert).unwrap()];
            b.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(&certs.client_key).unwrap()).unwrap()
        } else {
            b.with_no_client_auth()
        };
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }

    /// One request over TLS; `None` when the handshake or the exchange fails.
    async fn https_get(
        addr: std::net::SocketAddr,
        tls: &tokio_rustls::TlsConnector,
        auth: Option<&str>,
    ) -> Option<String> {
        let tcp = TcpStream::connect(addr).await.ok()?;
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").ok()?;
        let mut s = tls.connect(name, tcp).await.ok()?;
        let auth =
            auth.map(|a| format!("Authorization: Basic {}\r\n", base64::engine::general_purpose::STANDARD.encode(a)));
        let req = format!("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{}\r\n", auth.unwrap_or_default());
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out)
    }

    async fn start(web: WebConfig) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", get(|| async { "ok" }));
        tokio::spawn(serve(
            listener,
            app,
            ServerLimits::default(),
            crate::LiveWebConfig::fixed(web),
            std::future::pending(),
        ));
        addr
    }

    #[tokio::test]
    async fn tls_and_basic_auth_from_a_prometheus_web_config() {
        let d = tempfile::tempdir().unwrap();
        let certs = crate::test_certs::write(d.path()).unwrap();
        let hash = bcrypt::hash("secret", 4).unwrap();
        let file = d.path().join("web.yml");
        std::fs::write(
            &file,
            format!(
                "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\nbasic_auth_users:\n  alice: {hash}\n"
            ),
        )
        .unwrap();
        let web = WebConfig::load(&file).unwrap();
        assert_eq!(web.ignored, ["tls_server_config.cipher_suites"]);
        let addr = start(web).await;
        let tls = connector(&certs, false);
        let denied = https_get(addr, &tls, None).await.unwrap();
        assert!(
            denied.starts_with("HTTP/1.1 401") && denied.to_lowercase().contains("www-authenticate: basic"),
            "{denied}"
        );
        let wrong = https_get(addr, &tls, Some("alice:guess")).await.unwrap();
        assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
        for _ in 0..2 {
            let ok = https_get(addr, &tls, Some("alice:secret")).await.unwrap();
            assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("ok"), "{ok}");
        }
        // Plain HTTP to the TLS port gets no answer.
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), plain.read_to_end(&mut buf)).await;
        assert!(!String::from_utf8_lossy(&buf).contains("200 OK"));
    }

    #[tokio::test]
    async fn client_certificates_are_required_when_configured() {
        let d = tempfile::tempdir().unwrap();
        let certs = crate::test_certs::write(d.path()).unwrap();
        let file = d.path().join("web.yml");
        std::fs::write(&file, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n").unwrap();
        let addr = start(WebConfig::load(&file).unwrap()).await;
        assert!(https_get(addr, &connector(&certs, false), None).await.is_none_or(|r| !r.contains("200 OK")));
        let ok = https_get(addr, &connector(&certs, true), None).await.unwrap();
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    }

    #[test]
    fn bad_web_configs_are_refused_with_the_reason() {
        let d = tempfile::tempdir().unwrap();
        for (text, want) in [
            ("basic_auth_users:\n  alice: plaintext\n", "not a bcrypt hash"),
            ("tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n", "missing.crt"),
            ("tls_server_config:\n  key_file: k\n", "needs cert_file"),
            ("basic_auth_users: [1, 2", "parsing"),
        ] {
            let f = d.path().join("web.yml");
            std::fs::write(&f, text).unwrap();
            let e = WebConfig::load(&f).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    /// Edge review (issue 20, item 14): settings that would let any certificate the CA
    /// signed in, or none at all, are refused, never served open.
    #[test]
    fn mtls_settings_that_would_fail_open_are_refused() {
        let d = tempfile::tempdir().unwrap();
        crate::test_certs::write(d.path()).unwrap();
        for (text, want) in [
            ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: ca.crt\n", "client_auth_type"),
            ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n  client_allowed_sans: [client.example]\n", "client_allowed_sans"),
        ] {
            let f = d.path().join("web.yml");
            std::fs::write(&f, text).unwrap();
            let e = WebConfig::load(&f).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    /// Item 15: an unknown user costs a bcrypt check too (no timing tells which users
    /// exist), and the scheme is matched case-insensitively, as Go does.
    #[tokio::test]
    async fn unknown_users_cost_a_check_and_the_scheme_ignores_case() {
        let hash = bcrypt::hash("secret", 4).unwrap();
        let auth = Arc::new(BasicAuth::new(BTreeMap::from([("alice".to_string(), hash)])));
        let header =
            |pair: &str, scheme: &str| format!("{scheme} {}", base64::engine::general_purpose::STANDARD.encode(pair));
        assert!(auth.dummy.starts_with("$2b$04$") || auth.dummy.starts_with("$2y$04$"), "{}", auth.dummy);
        let before = auth.checks_run.load(std::sync::atomic::Ordering::Relaxed);
        assert!(!auth.check(Some(&header("mallory:secret", "Basic"))).await);
        assert_eq!(
            auth.checks_run.load(std::sync::atomic::Ordering::Relaxed),
            before + 1,
            "no bcrypt check for an unknown user"
        );
        assert!(auth.check(Some(&header("alice:secret", "basic"))).await);
        assert!(auth.check(Some(&header("alice:secret", "BASIC"))).await);
    }

    /// Item 16: the running server follows its web config file: a removed user is refused
    /// at its next request, a file that does not load leaves the last good one in force.
    #[tokio::test]
    async fn a_changed_web_config_is_followed_and_a_bad_one_refused() {
        let d = tempfile::tempdir().unwrap();
        let certs = crate::test_certs::write(d.path()).unwrap();
        let file = d.path().join("web.yml");
        let users = |u: &str| {
            let hash = bcrypt::hash("pw", 4).unwrap();
            format!("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nbasic_auth_users:\n  {u}: {hash}\n")
        };
        std::fs::write(&file, users("alice")).unwrap();
        let live = crate::LiveWebConfig::load(file.clone()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", get(|| async { "ok" }));
        tokio::spawn(serve(listener, app, ServerLimits::default(), live.clone(), std::future::pending()));
        let tls = connector(&certs, false);
        assert!(https_get(addr, &tls, Some("alice:pw")).await.unwrap().starts_with("HTTP/1.1 200"));
        assert!(!live.reload().unwrap(), "nothing changed");

        std::fs::write(&file, users("bob")).unwrap();
        assert!(live.reload().unwrap());
        assert!(
            https_get(addr, &tls, Some("alice:pw")).await.unwrap().starts_with("HTTP/1.1 401"),
            "a removed user kept access"
        );
        assert!(https_get(addr, &tls, Some("bob:pw")).await.unwrap().starts_with("HTTP/1.1 200"));

        std::fs::write(&file, "basic_auth_users:\n  bob: not-a-hash\n").unwrap();
        assert!(live.reload().is_err());
        // An editor's truncated file loads as "no TLS, no users": refused, never served open.
        std::fs::write(&file, "").unwrap();
        assert!(live.reload().is_err_and(|e| e.to_string().contains("turns TLS off")));
        assert!(
            https_get(addr, &tls, Some("bob:pw")).await.unwrap().starts_with("HTTP/1.1 200"),
            "the last good config stays"
        );
    }
}
