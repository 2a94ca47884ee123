//! Prometheus' `remote_write` keys this crate reads (the edge's configuration file parses
//! the section; TLS and authorization are the edge's, as for scrapes), with Prometheus'
//! defaults except where the README says Strata differs (`retry_on_http_429`).

use serde::Deserialize;
use std::time::Duration;
use strata_model::duration::PromDuration;

/// `queue_config`. Strata's queue is the WAL itself, so `capacity` does not bound a buffer
/// that could overflow: it bounds what each shard takes from the WAL per round.
#[derive(Debug, Clone, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    pub capacity: Option<usize>,
    pub max_shards: Option<usize>,
    pub min_shards: Option<usize>,
    pub max_samples_per_send: Option<usize>,
    pub batch_send_deadline: Option<PromDuration>,
    pub min_backoff: Option<PromDuration>,
    pub max_backoff: Option<PromDuration>,
    pub retry_on_http_429: Option<bool>,
    pub sample_age_limit: Option<PromDuration>,
}

/// `queue_config` with the defaults applied and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Queue {
    pub capacity: usize,
    pub max_shards: usize,
    pub max_samples_per_send: usize,
    pub batch_send_deadline: Duration,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// Prometheus drops a batch answered 429 unless told; Strata retries it by default,
    /// since a 429 means "later", not "never".
    pub retry_on_http_429: bool,
    /// Samples older than this when sent are dropped and counted (`None`: never).
    pub sample_age_limit: Option<Duration>,
}

impl QueueConfig {
    pub fn resolve(&self) -> Result<Queue, String> {
        let d = |v: &Option<PromDuration>, default: Duration| v.as_ref().map_or(default, |p| p.0);
        let q = Queue {
            capacity: self.capacity.unwrap_or(10_000),
            max_shards: self.max_shards.unwrap_or(50),
            max_samples_per_send: self.max_samples_per_send.unwrap_or(2_000),
            batch_send_deadline: d(&self.batch_send_deadline, Duration::from_secs(5)),
            min_backoff: d(&self.min_backoff, Duration::from_millis(30)),
            max_backoff: d(&self.max_backoff, Duration::from_secs(5)),
            retry_on_http_429: self.retry_on_http_429.unwrap_or(true),
            sample_age_limit: self.sample_age_limit.as_ref().map(|p| p.0).filter(|d| !d.is_zero()),
        };
        if q.max_shards == 0 || q.max_shards > MAX_SHARDS {
            return Err(format!("queue_config.max_shards must be 1 to {MAX_SHARDS}"));
        }
        if self.min_shards.is_some_and(|m| m == 0 || m > q.max_shards) {
            return Err("queue_config.min_shards must be 1 to max_shards".into());
        }
        if q.max_samples_per_send == 0 || q.max_samples_per_send > strata_forward::MAX_BATCH_SAMPLES {
            return Err(format!(
                "queue_config.max_samples_per_send must be 1 to {}",
                strata_forward::MAX_BATCH_SAMPLES
            ));
        }
        if q.capacity < q.max_samples_per_send {
            return Err("queue_config.capacity must be at least max_samples_per_send".into());
        }
        if q.min_backoff.is_zero() || q.max_backoff < q.min_backoff {
            return Err("queue_config: min_backoff must be positive and at most max_backoff".into());
        }
        if q.batch_send_deadline.is_zero() {
            return Err("queue_config.batch_send_deadline must be positive".into());
        }
        Ok(q)
    }

    /// Samples read from the WAL per round: every shard's capacity, within the forward
    /// mechanism's batch bound.
    pub fn round_samples(q: &Queue) -> usize {
        q.capacity.saturating_mul(q.max_shards).clamp(1, strata_forward::MAX_BATCH_SAMPLES)
    }
}

/// The most shards (requests in flight) one remote write may ask for.
pub const MAX_SHARDS: usize = 1_000;

/// `metadata_config`.
#[derive(Debug, Clone, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetadataConfig {
    pub send: Option<bool>,
    pub send_interval: Option<PromDuration>,
    pub max_samples_per_send: Option<usize>,
}

/// `metadata_config` with Prometheus' defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct MetadataSend {
    pub send: bool,
    /// Every family's metadata is sent again this often (receivers such as Mimir forget
    /// metadata they have not been sent for a while).
    pub send_interval: Duration,
    pub max_per_send: usize,
}

impl MetadataConfig {
    pub fn resolve(&self) -> Result<MetadataSend, String> {
        let m = MetadataSend {
            send: self.send.unwrap_or(true),
            send_interval: self.send_interval.as_ref().map_or(Duration::from_secs(60), |p| p.0),
            max_per_send: self.max_samples_per_send.unwrap_or(2_000),
        };
        if m.max_per_send == 0 || m.max_per_send > strata_forward::MAX_BATCH_METADATA {
            return Err(format!(
                "metadata_config.max_samples_per_send must be 1 to {}",
                strata_forward::MAX_BATCH_METADATA
            ));
        }
        if m.send_interval.is_zero() {
            return Err("metadata_config.send_interval must be positive".into());
        }
        Ok(m)
    }
}

/// `sigv4`: requests signed for Amazon Managed Service for Prometheus (service `aps`).
/// Without keys, credentials come from the AWS SDK's default chain (environment, shared
/// profile, EKS web identity, ECS, instance metadata); `role_arn` is assumed over them.
#[derive(Clone, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SigV4Config {
    pub region: Option<String>,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
    pub profile: Option<String>,
    pub role_arn: Option<String>,
}

impl std::fmt::Debug for SigV4Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigV4Config")
            .field("region", &self.region)
            .field("access_key", &self.access_key)
            .field("secret_key", &self.secret_key.as_ref().map(|_| "<secret>"))
            .field("profile", &self.profile)
            .field("role_arn", &self.role_arn)
            .finish()
    }
}

impl SigV4Config {
    pub fn check(&self) -> Result<(), String> {
        match (&self.access_key, &self.secret_key) {
            (Some(_), None) | (None, Some(_)) => {
                return Err("sigv4: access_key and secret_key go together".into());
            }
            (Some(_), Some(_)) if self.profile.is_some() => {
                return Err("sigv4: access_key/secret_key and profile are mutually exclusive".into());
            }
            _ => {}
        }
        if self
            .region
            .as_deref()
            .is_some_and(|r| r.is_empty() || !r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        {
            return Err(format!("sigv4: invalid region {:?}", self.region.as_deref().unwrap_or_default()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_prometheus_but_for_429() {
        let q = QueueConfig::default().resolve().unwrap();
        assert_eq!((q.capacity, q.max_shards, q.max_samples_per_send), (10_000, 50, 2_000));
        assert_eq!((q.min_backoff, q.max_backoff), (Duration::from_millis(30), Duration::from_secs(5)));
        assert!(q.retry_on_http_429);
        assert_eq!(QueueConfig::round_samples(&q), strata_forward::MAX_BATCH_SAMPLES);
        let m = MetadataConfig::default().resolve().unwrap();
        assert!(m.send);
        assert_eq!(m.send_interval, Duration::from_secs(60));
    }

    #[test]
    fn bad_values_are_refused_with_the_key() {
        let bad = [
            QueueConfig { max_shards: Some(0), ..Default::default() },
            QueueConfig { max_samples_per_send: Some(10_000_000), ..Default::default() },
            QueueConfig { capacity: Some(10), ..Default::default() },
            QueueConfig {
                min_backoff: Some(PromDuration(Duration::from_secs(10))),
                max_backoff: Some(PromDuration(Duration::from_secs(1))),
                ..Default::default()
            },
        ];
        for q in bad {
            let e = q.resolve().unwrap_err();
            assert!(e.starts_with("queue_config"), "{e}");
        }
        let s = SigV4Config { access_key: Some("AKID".into()), ..Default::default() };
        assert!(s.check().unwrap_err().contains("secret_key"));
        let s = SigV4Config { region: Some("us-east-1\r\nx".into()), ..Default::default() };
        assert!(s.check().is_err());
        assert!(!format!("{:?}", SigV4Config { secret_key: Some("hunter2".into()), ..Default::default() })
            .contains("hunter2"));
    }
}
