//! SigV4 request signing for Amazon Managed Service for Prometheus (service `aps`), with
//! the AWS SDK's own signer (`aws-sigv4`) and credential chain (`aws-config`), so static
//! keys, profiles, assumed roles and EKS web identity behave as in every AWS tool.

use crate::config::SigV4Config;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use std::time::{Duration, SystemTime};

/// The signing service name Amazon Managed Service for Prometheus expects.
const SERVICE: &str = "aps";

/// The longest a credential fetch (STS, instance metadata, a credential process) may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Credentials are refreshed this long before they expire.
const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(300);

pub struct Signer {
    region: String,
    provider: SharedCredentialsProvider,
    cached: tokio::sync::Mutex<Option<Credentials>>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("region", &self.region).finish_non_exhaustive()
    }
}

impl Signer {
    /// The signer `cfg` describes. Resolving the region may read the environment and the
    /// shared configuration files; credentials are fetched on first use.
    pub async fn new(cfg: &SigV4Config) -> Result<Signer, String> {
        cfg.check()?;
        if let (Some(access), Some(secret)) = (&cfg.access_key, &cfg.secret_key) {
            if cfg.role_arn.is_none() {
                let region = cfg.region.clone().ok_or("sigv4: region is required with access_key")?;
                let creds = Credentials::new(access, secret, None, None, "strata-config");
                return Ok(Signer::with_provider(region, SharedCredentialsProvider::new(creds)));
            }
        }
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http);
        if let Some(p) = &cfg.profile {
            loader = loader.profile_name(p);
        }
        if let Some(r) = &cfg.region {
            loader = loader.region(aws_config::Region::new(r.clone()));
        }
        if let (Some(access), Some(secret)) = (&cfg.access_key, &cfg.secret_key) {
            loader = loader.credentials_provider(Credentials::new(access, secret, None, None, "strata-config"));
        }
        let sdk = loader.load().await;
        let region = sdk
            .region()
            .map(|r| r.to_string())
            .ok_or("sigv4: no region: set sigv4.region, AWS_REGION or the profile's region")?;
        let base = sdk.credentials_provider().ok_or("sigv4: the AWS SDK found no credential provider")?;
        let provider = match &cfg.role_arn {
            Some(arn) => SharedCredentialsProvider::new(
                aws_config::sts::AssumeRoleProvider::builder(arn)
                    .session_name("strata-remote-write")
                    .configure(&sdk)
                    .build_from_provider(base)
                    .await,
            ),
            None => base,
        };
        Ok(Signer::with_provider(region, provider))
    }

    pub fn with_provider(region: String, provider: SharedCredentialsProvider) -> Signer {
        Signer { region, provider, cached: tokio::sync::Mutex::new(None) }
    }

    async fn credentials(&self) -> Result<Credentials, String> {
        let mut cached = self.cached.lock().await;
        if let Some(c) = cached.as_ref() {
            let fresh = c.expiry().is_none_or(|e| e > SystemTime::now() + REFRESH_BEFORE_EXPIRY);
            if fresh {
                return Ok(c.clone());
            }
        }
        let fetched = tokio::time::timeout(FETCH_TIMEOUT, self.provider.provide_credentials())
            .await
            .unwrap_or_else(|_| Err(CredentialsError::provider_timed_out(FETCH_TIMEOUT)));
        match fetched {
            Ok(c) => {
                *cached = Some(c.clone());
                Ok(c)
            }
            // A failed (or hung) refresh keeps using credentials that have not expired yet.
            Err(e) => match cached.as_ref().filter(|c| c.expiry().is_none_or(|x| x > SystemTime::now())) {
                Some(c) => {
                    tracing::warn!(error = %e, "sigv4: refreshing credentials failed: using the current ones until they expire");
                    Ok(c.clone())
                }
                None => Err(format!("sigv4: credentials: {e}")),
            },
        }
    }

    /// The headers to add to a `POST` of `body` to `url` that already carries `headers`
    /// (all of which are signed).
    pub async fn sign(
        &self,
        url: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Vec<(String, String)>, String> {
        let creds = self.credentials().await?;
        let identity = creds.into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(SERVICE)
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| format!("sigv4: {e}"))?
            .into();
        let signable = SignableRequest::new(
            "POST",
            url,
            headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            SignableBody::Bytes(body),
        )
        .map_err(|e| format!("sigv4: {e}"))?;
        let (instructions, _) = sign(signable, &params).map_err(|e| format!("sigv4: {e}"))?.into_parts();
        Ok(instructions.headers().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn static_keys_sign_with_the_aps_scope() {
        let cfg = SigV4Config {
            region: Some("eu-west-1".into()),
            access_key: Some("AKIDEXAMPLE".into()),
            secret_key: Some("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into()),
            ..Default::default()
        };
        let s = Signer::new(&cfg).await.unwrap();
        let h = vec![("content-type".to_string(), "application/x-protobuf".to_string())];
        let out = s
            .sign("https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write", &h, b"x")
            .await
            .unwrap();
        let auth = out.iter().find(|(k, _)| k.eq_ignore_ascii_case("authorization")).map(|(_, v)| v.as_str()).unwrap();
        assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"), "{auth}");
        assert!(auth.contains("/eu-west-1/aps/aws4_request"), "{auth}");
        assert!(auth.contains("content-type"), "the caller's headers are signed: {auth}");
        assert!(out.iter().any(|(k, _)| k.eq_ignore_ascii_case("x-amz-date")));
    }
}
