//! A scrape job's TLS and authorization, as Prometheus configures them (`scheme: https`,
//! `tls_config`, `basic_auth`, `authorization`), turned into the [`ClientSecurity`] its
//! scrape connections use. Files (CA, client certificate and key, password and credentials
//! files) are read when the configuration loads, relative to the configuration file's
//! directory; a reload reads them again.

use crate::http_client::ClientSecurity;
use base64::Engine as _;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
pub use strata_tls::TlsConfig;
use strata_tls::{client_config, resolve};

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct BasicAuthConfig {
    pub username: String,
    pub password: Option<String>,
    pub password_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AuthorizationConfig {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub credentials: Option<String>,
    pub credentials_file: Option<PathBuf>,
}

fn read_secret(base: &Path, p: &Path, what: &str) -> Result<String, String> {
    let p = resolve(base, p);
    std::fs::read_to_string(&p).map(|s| s.trim().to_string()).map_err(|e| format!("{what} {}: {e}", p.display()))
}

/// The job's client security; `Err` carries the reason for the configuration error. TLS is
/// set up for jobs that use `https` or configure `tls_config` (reading the system's CAs
/// for every plain-http job would cost every reload for nothing).
pub fn build(
    base: &Path,
    https: bool,
    tls: Option<&TlsConfig>,
    basic: Option<&BasicAuthConfig>,
    authz: Option<&AuthorizationConfig>,
) -> Result<ClientSecurity, String> {
    let authorization = match (basic, authz) {
        (Some(_), Some(_)) => return Err("basic_auth and authorization are mutually exclusive".into()),
        (Some(b), None) => {
            let password = match (&b.password, &b.password_file) {
                (Some(_), Some(_)) => {
                    return Err("basic_auth: password and password_file are mutually exclusive".into())
                }
                (Some(p), None) => p.clone(),
                (None, Some(f)) => read_secret(base, f, "basic_auth.password_file")?,
                (None, None) => String::new(),
            };
            let pair = format!("{}:{password}", b.username);
            Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair)))
        }
        (None, Some(a)) => {
            let kind = a.kind.clone().unwrap_or_else(|| "Bearer".into());
            if kind.eq_ignore_ascii_case("basic") {
                return Err("authorization type Basic is not allowed: use basic_auth".into());
            }
            let credentials = match (&a.credentials, &a.credentials_file) {
                (Some(_), Some(_)) => {
                    return Err("authorization: credentials and credentials_file are mutually exclusive".into())
                }
                (Some(c), None) => c.clone(),
                (None, Some(f)) => read_secret(base, f, "authorization.credentials_file")?,
                (None, None) => String::new(),
            };
            Some(format!("{kind} {credentials}"))
        }
        (None, None) => None,
    };
    let tls_cfg = tls.cloned().unwrap_or_default();
    let client = if https || tls.is_some() { Some(Arc::new(client_config(base, &tls_cfg)?)) } else { None };
    let mut digest = strata_model::Fnv64::new();
    digest.write(authorization.as_deref().unwrap_or("").as_bytes());
    for f in [&tls_cfg.ca_file, &tls_cfg.cert_file, &tls_cfg.key_file].into_iter().flatten() {
        // Read already by `client_config`; a file that vanished since reads as empty.
        digest.write(&std::fs::read(resolve(base, f)).unwrap_or_default());
        digest.write(&[0xff]);
    }
    Ok(ClientSecurity { tls: client, server_name: tls_cfg.server_name.clone(), authorization, digest: digest.finish() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http_client::{Buffers, HttpError, ScrapeClient};
    use axum::http::HeaderMap;
    use axum::routing::get;
    use std::time::Duration;
    use strata_server::test_certs;

    /// An https server: `/metrics` behind the web config's basic auth, `/bearer` checking a
    /// bearer token itself.
    async fn https_server(dir: &Path, web_text: &str) -> std::net::SocketAddr {
        let web = dir.join("web.yml");
        std::fs::write(&web, web_text).unwrap();
        let web = strata_server::WebConfig::load(&web).unwrap();
        let app = axum::Router::new().route("/metrics", get(|| async { "m 1\n" })).route(
            "/bearer",
            get(|h: HeaderMap| async move {
                let ok = h.get("authorization").and_then(|v| v.to_str().ok()) == Some("Bearer t0ken");
                if ok {
                    (axum::http::StatusCode::OK, "m 2\n")
                } else {
                    (axum::http::StatusCode::UNAUTHORIZED, "")
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(strata_server::serve(
            listener,
            app,
            Default::default(),
            strata_server::LiveWebConfig::fixed(web),
            std::future::pending(),
        ));
        addr
    }

    async fn scrape(url: &str, security: ClientSecurity) -> Result<String, HttpError> {
        let mut c = ScrapeClient::with_security(url, "text/plain", Duration::from_secs(5), security);
        let mut b = Buffers::default();
        let r = c.get(&mut b, Duration::from_secs(5), 0).await?;
        Ok(String::from_utf8_lossy(r.body).into_owned())
    }

    #[tokio::test]
    async fn https_targets_with_basic_auth_a_bearer_token_or_a_client_certificate() {
        let d = tempfile::tempdir().unwrap();
        let certs = test_certs::write(d.path()).unwrap();
        let hash = bcrypt::hash("pw", 4).unwrap();
        let addr = https_server(
            d.path(),
            &format!("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nbasic_auth_users:\n  scraper: {hash}\n"),
        )
        .await;
        let tls = TlsConfig { ca_file: Some("ca.crt".into()), ..Default::default() };
        let basic = BasicAuthConfig { username: "scraper".into(), password: Some("pw".into()), password_file: None };
        let with_auth = build(d.path(), true, Some(&tls), Some(&basic), None).unwrap();
        assert_eq!(scrape(&format!("https://{addr}/metrics"), with_auth).await.unwrap(), "m 1\n");
        let no_auth = build(d.path(), true, Some(&tls), None, None).unwrap();
        assert_eq!(scrape(&format!("https://{addr}/metrics"), no_auth).await, Err(HttpError::Status(401)));
        // The server's certificate is not trusted without the CA, unless verification is off.
        let untrusted = build(d.path(), true, None, Some(&basic), None).unwrap();
        assert!(matches!(scrape(&format!("https://{addr}/metrics"), untrusted).await, Err(HttpError::Connect { .. })));
        let skip = TlsConfig { insecure_skip_verify: true, ..Default::default() };
        let insecure = build(d.path(), true, Some(&skip), Some(&basic), None).unwrap();
        assert_eq!(scrape(&format!("https://{addr}/metrics"), insecure).await.unwrap(), "m 1\n");
        // A server name other than the address's.
        let named =
            TlsConfig { ca_file: Some("ca.crt".into()), server_name: Some("localhost".into()), ..Default::default() };
        let ok = build(d.path(), true, Some(&named), Some(&basic), None).unwrap();
        assert_eq!(scrape(&format!("https://{addr}/metrics"), ok).await.unwrap(), "m 1\n");
        let wrong =
            TlsConfig { ca_file: Some("ca.crt".into()), server_name: Some("elsewhere".into()), ..Default::default() };
        let bad = build(d.path(), true, Some(&wrong), Some(&basic), None).unwrap();
        assert!(scrape(&format!("https://{addr}/metrics"), bad).await.is_err());

        // Bearer tokens, inline or from a file.
        std::fs::write(d.path().join("token"), "t0ken\n").unwrap();
        let addr2 =
            https_server(d.path(), "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n").await;
        for authz in [
            AuthorizationConfig { credentials: Some("t0ken".into()), ..Default::default() },
            AuthorizationConfig { credentials_file: Some("token".into()), ..Default::default() },
        ] {
            let s = build(d.path(), true, Some(&tls), None, Some(&authz)).unwrap();
            assert_eq!(scrape(&format!("https://{addr2}/bearer"), s).await.unwrap(), "m 2\n");
        }

        // A server that requires a client certificate.
        let addr3 = https_server(
            d.path(),
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n",
        )
        .await;
        let mtls = TlsConfig {
            ca_file: Some("ca.crt".into()),
            cert_file: Some("client.crt".into()),
            key_file: Some("client.key".into()),
            ..Default::default()
        };
        assert_eq!(
            scrape(&format!("https://{addr3}/metrics"), build(d.path(), true, Some(&mtls), None, None).unwrap())
                .await
                .unwrap(),
            "m 1\n"
        );
        assert!(scrape(&format!("https://{addr3}/metrics"), build(d.path(), true, Some(&tls), None, None).unwrap())
            .await
            .is_err());
        let _ = certs;
    }

    #[test]
    fn conflicting_or_missing_secrets_are_configuration_errors() {
        let d = tempfile::tempdir().unwrap();
        let basic =
            BasicAuthConfig { username: "u".into(), password: Some("p".into()), password_file: Some("f".into()) };
        assert!(build(d.path(), true, None, Some(&basic), None).unwrap_err().contains("mutually exclusive"));
        let authz = AuthorizationConfig { credentials_file: Some("missing".into()), ..Default::default() };
        assert!(build(d.path(), true, None, None, Some(&authz)).unwrap_err().contains("missing"));
        let tls = TlsConfig { ca_file: Some("nope.crt".into()), ..Default::default() };
        assert!(build(d.path(), true, Some(&tls), None, None).unwrap_err().contains("nope.crt"));
    }
}
