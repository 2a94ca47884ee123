//! The edge's configuration file: a Prometheus configuration file whose `global` and
//! `scrape_configs` sections work unchanged, plus Strata's own keys under `strata:`.
//! `remote_write` is Prometheus' section, sent from the WAL (crate `strata-remote-write`).
//! Sections Prometheus has and the edge does not use (`rule_files`, `alerting`...) are
//! accepted and ignored, so an existing file loads as it is.

use crate::http_client::ClientSecurity;
use crate::security::{AuthorizationConfig, BasicAuthConfig, TlsConfig};
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use strata_ingest::relabel::{compile_all, RelabelConfig, RelabelRule};
use strata_model::duration::PromDuration;
use strata_model::is_valid_label_name;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: job {job:?}: {message}")]
    Job { path: PathBuf, job: String, message: String },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// The decoded page size a scrape accepts when its job sets no `body_size_limit` (or 0,
/// which in Prometheus means no limit: a target must not be able to exhaust the edge).
pub const DEFAULT_BODY_SIZE_LIMIT: u64 = 64 << 20;

pub use strata_model::size::{parse_bytes, ByteSize, ByteSizeError};

#[derive(Debug, Clone, Deserialize, Default)]
pub struct RawGlobal {
    pub scrape_interval: Option<PromDuration>,
    pub scrape_timeout: Option<PromDuration>,
    #[serde(default)]
    pub external_labels: BTreeMap<String, String>,
    /// Keys Strata does not implement, named in a warning at load.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, IgnoredAny>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StaticConfig {
    #[serde(default)]
    pub targets: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct FileSdConfig {
    #[serde(default)]
    pub files: Vec<String>,
    pub refresh_interval: Option<PromDuration>,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct RawScrapeConfig {
    pub job_name: String,
    pub scrape_interval: Option<PromDuration>,
    pub scrape_timeout: Option<PromDuration>,
    pub metrics_path: Option<String>,
    pub scheme: Option<String>,
    #[serde(default)]
    pub params: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub honor_labels: bool,
    pub honor_timestamps: Option<bool>,
    #[serde(default)]
    pub track_timestamps_staleness: bool,
    #[serde(default)]
    pub sample_limit: u64,
    #[serde(default)]
    pub label_limit: u64,
    #[serde(default)]
    pub body_size_limit: ByteSize,
    #[serde(default)]
    pub static_configs: Vec<StaticConfig>,
    #[serde(default)]
    pub file_sd_configs: Vec<FileSdConfig>,
    #[serde(default)]
    pub relabel_configs: Vec<RelabelConfig>,
    #[serde(default)]
    pub metric_relabel_configs: Vec<RelabelConfig>,
    pub tls_config: Option<TlsConfig>,
    pub basic_auth: Option<BasicAuthConfig>,
    pub authorization: Option<AuthorizationConfig>,
    /// Keys Strata does not implement, named in a warning at load.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, IgnoredAny>,
}

/// A forward upstream's address as a URL: `host:port` gets `https://` with TLS and
/// `http://` without; a URL's scheme must agree with whether TLS is configured (tonic
/// speaks TLS only to `https://`: an `http://` address with `tls_config` would send in
/// the clear).
fn forward_endpoint(address: &str, tls: bool) -> Result<String, String> {
    let address = address.trim();
    if address.is_empty() {
        return Err("an upstream without an address".into());
    }
    let url = match address.split_once("://") {
        None => format!("{}://{address}", if tls { "https" } else { "http" }),
        Some(("https", _)) if !tls => return Err("https:// needs tls_config (at least ca_file)".into()),
        Some(("http", _)) if tls => return Err("tls_config with an http:// address would send in the clear".into()),
        Some(("http" | "https", _)) => address.to_string(),
        Some((scheme, _)) => return Err(format!("scheme {scheme:?}: use host:port, http:// or https://")),
    };
    let uri: axum::http::Uri = url.parse().map_err(|e| format!("not an address: {e}"))?;
    if uri.host().is_none_or(str::is_empty) || uri.port_u16().is_none() {
        return Err("needs a host and a port".into());
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err("a gRPC address has no path".into());
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// Strata's own keys, under `strata:`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawStrata {
    pub data_dir: Option<PathBuf>,
    pub retention: Option<PromDuration>,
    /// Oldest blocks are deleted while blocks and WAL exceed this (`512MB`, `20GB`), as
    /// Prometheus' `--storage.tsdb.retention.size`.
    pub retention_size: Option<ByteSize>,
    /// The range of the blocks the head is cut into (default 2h, at least 10s).
    pub block_range: Option<PromDuration>,
    /// Memory for block chunks that queries read (default `256MB`).
    pub block_cache_size: Option<ByteSize>,
    /// How far ahead of the wall clock a sample may be stamped (default 10m).
    pub future_grace_period: Option<PromDuration>,
    pub max_series: Option<usize>,
    /// `always` or a duration such as `1s` (the default).
    pub wal_fsync: Option<String>,
    pub remote_write_max_bytes: Option<ByteSize>,
    pub remote_write_max_samples: Option<usize>,
    /// Upstream regionals that receive everything this edge stores, each from its own
    /// cursor (read at start: changing the list takes a restart).
    #[serde(default)]
    pub forward: Vec<RawForward>,
    /// The most blocks past `retention` kept for each upstream that is still behind
    /// (default [`DEFAULT_FORWARD_MAX_DISK`]); what retention deletes past it is dropped
    /// for that upstream, oldest first, counted and logged with its time range. (Within
    /// retention an outage costs no extra disk: the backlog is read from blocks.)
    pub forward_max_disk: Option<ByteSize>,
}

/// `strata.forward_max_disk` when the file does not say.
pub const DEFAULT_FORWARD_MAX_DISK: u64 = 10 << 30;

/// One upstream of `strata.forward`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawForward {
    /// The regional's gRPC address, `host:port` (or an `http://`/`https://` URL).
    pub address: String,
    /// `address` as a URL: `https://` with `tls_config`, else `http://` (set at load).
    #[serde(skip)]
    pub endpoint: String,
    /// Samples per batch (default 200,000, and at most about 8 MiB; the regional may ask for fewer).
    pub batch_samples: Option<usize>,
    /// TLS to the regional (`https`), with a client certificate when it asks for one.
    pub tls_config: Option<RawForwardTls>,
    /// How batches are compressed: `zstd` (the default; gzip to a regional that does not
    /// take zstd), `gzip` or `none` (saves CPU on a fast link).
    pub compression: Option<strata_forward::BatchCompression>,
    /// The older key: `false` is `compression: none`.
    pub gzip: Option<bool>,
}

impl RawForward {
    /// `compression`, or the older `gzip: false` (none); zstd when neither is set.
    pub fn batch_compression(&self) -> strata_forward::BatchCompression {
        match (self.compression, self.gzip) {
            (Some(c), _) => c,
            (None, Some(false)) => strata_forward::BatchCompression::None,
            (None, _) => strata_forward::BatchCompression::default(),
        }
    }
}

/// One `remote_write` entry, with Prometheus' keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRemoteWrite {
    pub url: String,
    pub name: Option<String>,
    pub remote_timeout: Option<PromDuration>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub write_relabel_configs: Vec<RelabelConfig>,
    pub basic_auth: Option<BasicAuthConfig>,
    pub authorization: Option<AuthorizationConfig>,
    pub sigv4: Option<strata_remote_write::SigV4Config>,
    pub tls_config: Option<TlsConfig>,
    #[serde(default)]
    pub queue_config: strata_remote_write::QueueConfig,
    #[serde(default)]
    pub metadata_config: strata_remote_write::MetadataConfig,
    /// Accepted: the edge stores no exemplars or native histograms to send.
    pub send_exemplars: Option<bool>,
    pub send_native_histograms: Option<bool>,
    /// Accepted: requests use HTTP/1.1 and do not follow redirects (a 3xx is retried and
    /// logged, the data kept).
    pub follow_redirects: Option<bool>,
    pub enable_http2: Option<bool>,
    /// Prometheus 3's choice of message: only `prometheus.WriteRequest` (remote write 1.0).
    pub protobuf_message: Option<String>,
    /// Not supported: refused by name, so a configuration that needs them fails loudly.
    pub proxy_url: Option<IgnoredAny>,
    pub oauth2: Option<IgnoredAny>,
    pub azuread: Option<IgnoredAny>,
    pub google_iam: Option<IgnoredAny>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawForwardTls {
    pub ca_file: PathBuf,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub server_name: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct RawConfig {
    #[serde(default)]
    pub global: RawGlobal,
    #[serde(default)]
    pub scrape_configs: Vec<RawScrapeConfig>,
    #[serde(default)]
    pub strata: RawStrata,
    #[serde(default)]
    pub remote_write: Vec<RawRemoteWrite>,
    /// Sections the edge does not use (`rule_files`, `alerting`...).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, IgnoredAny>,
}

/// A validated scrape job with Prometheus' defaults applied.
#[derive(Debug, Clone)]
pub struct ScrapeJob {
    pub job_name: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub metrics_path: String,
    pub scheme: String,
    pub params: BTreeMap<String, Vec<String>>,
    pub honor_labels: bool,
    pub honor_timestamps: bool,
    /// Staleness markers for series whose samples carry their own timestamps (Prometheus
    /// 2.48's `track_timestamps_staleness`; off by default, as there).
    pub track_timestamps_staleness: bool,
    pub sample_limit: u64,
    pub label_limit: u64,
    pub body_size_limit: u64,
    pub static_configs: Vec<StaticConfig>,
    pub file_sd: Vec<(Vec<PathBuf>, Duration)>,
    pub relabel: Vec<RelabelRule>,
    pub metric_relabel: Vec<RelabelRule>,
    /// TLS and the `Authorization` header of the job's scrapes.
    pub security: ClientSecurity,
}

#[derive(Debug, Clone)]
pub struct EdgeConfig {
    pub path: PathBuf,
    pub external_labels: BTreeMap<String, String>,
    pub jobs: Vec<ScrapeJob>,
    pub strata: RawStrata,
    /// `remote_write`, resolved (files read, defaults applied).
    pub remote_write: Vec<strata_remote_write::RemoteWriteOptions>,
    /// Keys of the file that Strata does not implement: each is logged when the file loads.
    pub ignored: Vec<String>,
}

pub const DEFAULT_SCRAPE_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

impl EdgeConfig {
    /// The storage keys of `strata:`, for the database's options.
    pub fn storage_settings(&self) -> strata_tsdb::settings::StorageSettings {
        let s = &self.strata;
        strata_tsdb::settings::StorageSettings {
            retention: s.retention.map(|d| d.0),
            retention_size: s.retention_size.map(|b| b.0),
            block_range: s.block_range.map(|d| d.0),
            block_cache_bytes: s.block_cache_size.map(|b| b.0),
            future_grace_period: s.future_grace_period.map(|d| d.0),
            max_series: s.max_series,
            wal_fsync: s.wal_fsync.clone(),
        }
    }

    pub fn load(path: &Path) -> Result<EdgeConfig, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        let cfg = Self::parse(&text, path)?;
        for key in &cfg.ignored {
            tracing::warn!(path = %path.display(), key = %key, "configuration key not implemented by Strata: ignored");
        }
        Ok(cfg)
    }

    pub fn parse(text: &str, path: &Path) -> Result<EdgeConfig, ConfigError> {
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_saphyr::from_str(text)
                .map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string() })?
        };
        let g_interval = raw.global.scrape_interval.map(|d| d.0).unwrap_or(DEFAULT_SCRAPE_INTERVAL);
        let g_timeout = raw.global.scrape_timeout.map(|d| d.0).unwrap_or(DEFAULT_SCRAPE_TIMEOUT);
        if raw.global.scrape_timeout.is_some() && g_timeout > g_interval {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                message: "global scrape_timeout greater than scrape_interval".into(),
            });
        }
        for name in raw.global.external_labels.keys() {
            if !is_valid_label_name(name) {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    message: format!("{name:?} is not a valid external label name"),
                });
            }
        }
        let mut jobs = Vec::new();
        let mut names = std::collections::HashSet::new();
        let base = path.parent().unwrap_or(Path::new("."));
        let mut ignored: Vec<String> = raw.unknown.keys().cloned().collect();
        ignored.extend(raw.global.unknown.keys().map(|k| format!("global.{k}")));
        for j in &raw.scrape_configs {
            ignored.extend(j.unknown.keys().map(|k| format!("scrape_configs[{}].{k}", j.job_name)));
        }
        for j in raw.scrape_configs {
            let err = |message: String| ConfigError::Job { path: path.to_path_buf(), job: j.job_name.clone(), message };
            if j.job_name.is_empty() {
                return Err(ConfigError::Invalid { path: path.to_path_buf(), message: "job_name is empty".into() });
            }
            if !names.insert(j.job_name.clone()) {
                return Err(err("found multiple scrape configs with this job name".into()));
            }
            let interval = j.scrape_interval.map(|d| d.0).unwrap_or(g_interval);
            if interval.is_zero() {
                return Err(err("scrape_interval must be greater than zero".into()));
            }
            let timeout = match j.scrape_timeout {
                Some(t) if t.0 > interval => return Err(err("scrape_timeout greater than scrape_interval".into())),
                Some(t) => t.0,
                None => g_timeout.min(interval),
            };
            let scheme = j.scheme.clone().unwrap_or_else(|| "http".into());
            if scheme != "http" && scheme != "https" {
                return Err(err(format!("scheme {scheme:?} is not http or https")));
            }
            let security = crate::security::build(
                base,
                scheme == "https",
                j.tls_config.as_ref(),
                j.basic_auth.as_ref(),
                j.authorization.as_ref(),
            )
            .map_err(err)?;
            let relabel = compile_all(&j.relabel_configs).map_err(|e| err(e.to_string()))?;
            let metric_relabel = compile_all(&j.metric_relabel_configs).map_err(|e| err(e.to_string()))?;
            let file_sd = j
                .file_sd_configs
                .iter()
                .map(|f| {
                    (
                        f.files.iter().map(|p| base.join(p)).collect(),
                        f.refresh_interval.map(|d| d.0).unwrap_or(Duration::from_secs(5 * 60)),
                    )
                })
                .collect();
            jobs.push(ScrapeJob {
                job_name: j.job_name.clone(),
                interval,
                timeout,
                metrics_path: j.metrics_path.clone().unwrap_or_else(|| "/metrics".into()),
                scheme,
                params: j.params.clone(),
                honor_labels: j.honor_labels,
                honor_timestamps: j.honor_timestamps.unwrap_or(true),
                track_timestamps_staleness: j.track_timestamps_staleness,
                sample_limit: j.sample_limit,
                label_limit: j.label_limit,
                body_size_limit: match j.body_size_limit.0 {
                    0 => DEFAULT_BODY_SIZE_LIMIT,
                    n => n,
                },
                static_configs: j.static_configs.clone(),
                file_sd,
                relabel,
                metric_relabel,
                security,
            });
        }
        if let Some(p) = &raw.strata.wal_fsync {
            strata_tsdb::wal::SyncPolicy::parse(p).map_err(|m| ConfigError::Invalid {
                path: path.to_path_buf(),
                message: format!("strata.wal_fsync: {m}"),
            })?;
        }
        let mut upstreams = std::collections::HashSet::new();
        let mut strata = raw.strata;
        for f in &mut strata.forward {
            let bad =
                |m: String| ConfigError::Invalid { path: path.to_path_buf(), message: format!("strata.forward: {m}") };
            f.endpoint =
                forward_endpoint(&f.address, f.tls_config.is_some()).map_err(|m| bad(format!("{}: {m}", f.address)))?;
            if !upstreams.insert(f.endpoint.clone()) {
                return Err(bad(format!("{} is listed twice", f.address)));
            }
            if f.batch_samples.is_some_and(|n| n == 0 || n > strata_forward::MAX_BATCH_SAMPLES) {
                return Err(bad(format!("batch_samples must be 1 to {}", strata_forward::MAX_BATCH_SAMPLES)));
            }
            if let Some(t) = &mut f.tls_config {
                t.ca_file = base.join(&t.ca_file);
                t.cert_file = t.cert_file.as_ref().map(|p| base.join(p));
                t.key_file = t.key_file.as_ref().map(|p| base.join(p));
            }
        }
        let remote_write = remote_writes(&raw.remote_write, base)
            .map_err(|message| ConfigError::Invalid { path: path.to_path_buf(), message })?;
        Ok(EdgeConfig {
            path: path.to_path_buf(),
            external_labels: raw.global.external_labels,
            ignored,
            jobs,
            strata,
            remote_write,
        })
    }
}

/// `remote_write` checked as Prometheus checks it, with its files read.
fn remote_writes(raw: &[RawRemoteWrite], base: &Path) -> Result<Vec<strata_remote_write::RemoteWriteOptions>, String> {
    let mut out: Vec<strata_remote_write::RemoteWriteOptions> = Vec::new();
    for r in raw {
        let name = r.name.clone().unwrap_or_else(|| strata_remote_write::default_name(&r.url));
        let bad = |m: String| format!("remote_write {name:?} ({}): {m}", r.url);
        let https = strata_remote_write::check_url(&r.url).map_err(&bad)?;
        if out.iter().any(|o| o.name == name) {
            return Err(bad("found multiple remote write configs with this name".into()));
        }
        for (key, set) in [
            ("proxy_url", r.proxy_url.is_some()),
            ("oauth2", r.oauth2.is_some()),
            ("azuread", r.azuread.is_some()),
            ("google_iam", r.google_iam.is_some()),
        ] {
            if set {
                return Err(bad(format!("{key} is not supported by Strata")));
            }
        }
        if r.protobuf_message.as_deref().is_some_and(|m| m != "prometheus.WriteRequest") {
            return Err(bad("only protobuf_message: prometheus.WriteRequest (remote write 1.0) is supported".into()));
        }
        let auths = [r.basic_auth.is_some(), r.authorization.is_some(), r.sigv4.is_some()];
        if auths.iter().filter(|&&a| a).count() > 1 {
            return Err(bad("at most one of basic_auth, authorization and sigv4 may be configured".into()));
        }
        let mut headers = Vec::new();
        for (k, v) in &r.headers {
            let lower = k.to_ascii_lowercase();
            if strata_remote_write::RESERVED_HEADERS.contains(&lower.as_str()) {
                return Err(bad(format!("{k} is a reserved header: it cannot be set in headers")));
            }
            let token =
                !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token || v.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
                return Err(bad(format!("header {k:?} is not a valid HTTP header")));
            }
            headers.push((lower, v.clone()));
        }
        if r.tls_config.as_ref().is_some_and(|t| t.server_name.is_some()) {
            return Err(bad("tls_config.server_name is not supported for remote_write: use the name in url".into()));
        }
        let security =
            crate::security::build(base, https, r.tls_config.as_ref(), r.basic_auth.as_ref(), r.authorization.as_ref())
                .map_err(&bad)?;
        if let Some(a) = security.authorization {
            headers.push(("authorization".into(), a));
        }
        if let Some(s) = &r.sigv4 {
            s.check().map_err(&bad)?;
        }
        let timeout = r.remote_timeout.map_or(Duration::from_secs(30), |d| d.0);
        if timeout.is_zero() {
            return Err(bad("remote_timeout must be positive".into()));
        }
        out.push(strata_remote_write::RemoteWriteOptions {
            name: name.clone(),
            url: r.url.clone(),
            timeout,
            headers,
            tls: security.tls,
            sigv4: r.sigv4.clone(),
            queue: r.queue_config.resolve().map_err(&bad)?,
            metadata: r.metadata_config.resolve().map_err(&bad)?,
            relabel: compile_all(&r.write_relabel_configs).map_err(|e| bad(format!("write_relabel_configs: {e}")))?,
            // Set where the database is opened (the edge's head).
            metadata_source: None,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROM: &str = r#"
global:
  scrape_interval: 15s
  external_labels:
    cluster: c1
    replica: a
rule_files: ["rules.yml"]
alerting:
  alertmanagers: []
scrape_configs:
  - job_name: dcgm
    scrape_interval: 5s
    metrics_path: /node/0/metrics
    params:
      format: [prometheus]
    static_configs:
      - targets: ["127.0.0.1:9400"]
        labels: {rack: r1}
    relabel_configs:
      - source_labels: [__address__]
        target_label: host
        regex: "(.*):.*"
    metric_relabel_configs:
      - action: drop
        source_labels: [__name__]
        regex: DCGM_FI_DEV_VGPU_.*
    sample_limit: 10000
    body_size_limit: 10MB
  - job_name: other
strata:
  retention: 12h
  wal_fsync: always
"#;

    #[test]
    fn a_prometheus_file_loads_with_prometheus_defaults() {
        let c = EdgeConfig::parse(PROM, Path::new("/etc/strata/edge.yml")).unwrap();
        assert_eq!(c.external_labels.get("replica").map(String::as_str), Some("a"));
        let d = &c.jobs[0];
        assert_eq!(d.interval, Duration::from_secs(5));
        assert_eq!(d.timeout, Duration::from_secs(5), "global timeout 10s is capped to the job's interval");
        assert_eq!(d.body_size_limit, 10 << 20);
        assert!(d.honor_timestamps);
        let o = &c.jobs[1];
        assert_eq!(o.interval, Duration::from_secs(15));
        assert_eq!(o.timeout, Duration::from_secs(10));
        assert_eq!(o.metrics_path, "/metrics");
        assert_eq!(o.body_size_limit, DEFAULT_BODY_SIZE_LIMIT, "no limit set means the default, not unlimited");
        assert_eq!(c.strata.retention.map(|d| d.0), Some(Duration::from_secs(12 * 3600)));
    }

    #[test]
    fn bad_configs_name_the_problem() {
        let cases = [
            ("scrape_configs:\n  - job_name: a\n  - job_name: a\n", "multiple"),
            ("scrape_configs:\n  - job_name: a\n    scrape_interval: 5s\n    scrape_timeout: 10s\n", "greater"),
            ("scrape_configs:\n  - job_name: a\n    relabel_configs:\n      - action: hashmod\n", "target_label"),
            (
                "scrape_configs:\n  - job_name: a\n    relabel_configs:\n      - regex: '('\n        target_label: x\n",
                "regex",
            ),
            ("global:\n  scrape_interval: 5 parsecs\n", "duration"),
            ("scrape_configs: [1, 2", "parsing"),
            ("strata:\n  unknown_key: 1\n", "parsing"),
        ];
        for (text, want) in cases {
            let e = EdgeConfig::parse(text, Path::new("x.yml")).expect_err(text).to_string();
            assert!(e.contains(want), "{text:?} gave {e}");
        }
    }

    #[test]
    fn keys_strata_does_not_implement_are_named() {
        let text = "global:\n  evaluation_interval: 1m\nrule_files: [a.yml]\nscrape_configs:\n  - job_name: x\n    basic_auth: {username: u, password: p}\n    oauth2: {client_id: c}\n    proxy_url: http://proxy:3128\n";
        let c = EdgeConfig::parse(text, Path::new("x.yml")).unwrap();
        assert_eq!(
            c.ignored,
            ["rule_files", "global.evaluation_interval", "scrape_configs[x].oauth2", "scrape_configs[x].proxy_url"]
        );
        assert!(EdgeConfig::parse(PROM, Path::new("x.yml"))
            .unwrap()
            .ignored
            .iter()
            .all(|k| !k.contains("scrape_configs")));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("512KB").unwrap(), 512 * 1024);
        assert_eq!(parse_bytes("0").unwrap(), 0);
        assert!(parse_bytes("10XB").is_err());
    }

    /// The example configuration with bytes flipped, dropped or repeated: loading gives a
    /// configuration or an error, never a panic.
    #[test]
    fn mutated_configs_load_or_fail_never_panic() {
        const ALPHABET: &[u8] = b" :-[]{}'\"\n#0a9*&|>!%@";
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut ok, mut err) = (0, 0);
        for _ in 0..2000 {
            let mut b = PROM.as_bytes().to_vec();
            for _ in 0..(1 + next() % 3) {
                let i = (next() as usize) % b.len();
                match next() % 3 {
                    0 => b[i] = ALPHABET[(next() % ALPHABET.len() as u64) as usize],
                    1 => {
                        b.remove(i);
                    }
                    _ => {
                        let end = (i + (next() % 30) as usize).min(b.len());
                        let piece = b[i..end].to_vec();
                        b.splice(i..i, piece);
                    }
                }
            }
            match EdgeConfig::parse(&String::from_utf8_lossy(&b), Path::new("x.yml")) {
                Ok(_) => ok += 1,
                Err(_) => err += 1,
            }
        }
        assert!(ok > 50 && err > 50, "the mutations must exercise both outcomes: {ok} loaded, {err} refused");
    }
}

#[cfg(test)]
mod forward_tests {
    use super::*;

    fn load(forward: &str) -> Result<EdgeConfig, ConfigError> {
        EdgeConfig::parse(&format!("strata:\n  forward:\n{forward}"), Path::new("/etc/strata/edge.yml"))
    }

    /// Forward upstreams: addresses become URLs whose scheme agrees with TLS; duplicates
    /// (however written), schemes that would send in the clear and addresses without a
    /// port are refused at load, not found out at the first send.
    #[test]
    fn forward_addresses_are_checked_and_normalised_at_load() {
        let c = load("    - address: r:9492\n    - address: https://s:9492\n      tls_config: {ca_file: ca.pem}\n")
            .unwrap();
        let eps: Vec<&str> = c.strata.forward.iter().map(|f| f.endpoint.as_str()).collect();
        assert_eq!(eps, ["http://r:9492", "https://s:9492"]);
        assert_eq!(c.strata.forward[1].tls_config.as_ref().unwrap().ca_file, Path::new("/etc/strata/ca.pem"));
        let plain_tls = load("    - address: s:9492\n      tls_config: {ca_file: ca.pem}\n").unwrap();
        assert_eq!(plain_tls.strata.forward[0].endpoint, "https://s:9492");
        for bad in [
            "    - address: r:9492\n    - address: http://r:9492\n",
            "    - address: http://r:9492\n      tls_config: {ca_file: ca.pem}\n",
            "    - address: https://r:9492\n",
            "    - address: r\n",
            "    - address: ftp://r:1\n",
            "    - address: ''\n",
            "    - address: r:9492\n      batch_samples: 0\n",
            "    - address: r:9492\n      compression: brotli\n",
        ] {
            assert!(load(bad).is_err(), "accepted: {bad}");
        }
    }

    /// zstd by default; `compression` says otherwise, and the older `gzip: false` still
    /// means none.
    #[test]
    fn batch_compression_defaults_to_zstd_and_the_older_key_still_works() {
        use strata_forward::BatchCompression;
        let of = |extra: &str| {
            load(&format!("    - address: r:9492\n{extra}")).unwrap().strata.forward[0].batch_compression()
        };
        assert_eq!(of(""), BatchCompression::Zstd);
        assert_eq!(of("      compression: gzip\n"), BatchCompression::Gzip);
        assert_eq!(of("      compression: none\n"), BatchCompression::None);
        assert_eq!(of("      gzip: false\n"), BatchCompression::None);
        assert_eq!(of("      gzip: true\n"), BatchCompression::Zstd);
        assert_eq!(of("      gzip: false\n      compression: zstd\n"), BatchCompression::Zstd);
    }
}

#[cfg(test)]
mod remote_write_tests {
    use super::*;

    fn load(section: &str) -> Result<EdgeConfig, ConfigError> {
        EdgeConfig::parse(&format!("remote_write:\n{section}"), Path::new("/etc/strata/edge.yml"))
    }

    /// Prometheus' own section loads with its keys and defaults.
    #[test]
    fn prometheus_remote_write_sections_load() {
        let c = load(
            "  - url: https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write\n    \
             name: amp\n    remote_timeout: 10s\n    sigv4:\n      region: us-east-1\n    \
             queue_config:\n      max_samples_per_send: 1000\n      max_shards: 8\n      capacity: 2500\n      \
             batch_send_deadline: 2s\n      min_backoff: 50ms\n      max_backoff: 10s\n      retry_on_http_429: false\n    \
             metadata_config:\n      send_interval: 30s\n    write_relabel_configs:\n      - source_labels: [__name__]\n        \
             regex: DCGM_.*\n        action: keep\n    send_exemplars: false\n  \
             - url: http://mimir:9009/api/v1/push\n    headers:\n      X-Scope-OrgID: fleet\n    \
             basic_auth:\n      username: u\n      password: p\n",
        )
        .unwrap();
        let (amp, mimir) = (&c.remote_write[0], &c.remote_write[1]);
        assert_eq!((amp.name.as_str(), amp.timeout), ("amp", Duration::from_secs(10)));
        assert_eq!((amp.queue.max_samples_per_send, amp.queue.max_shards, amp.queue.capacity), (1000, 8, 2500));
        assert!(!amp.queue.retry_on_http_429);
        assert_eq!(amp.metadata.send_interval, Duration::from_secs(30));
        assert_eq!(amp.relabel.len(), 1);
        assert_eq!(amp.sigv4.as_ref().unwrap().region.as_deref(), Some("us-east-1"));
        assert!(amp.tls.is_some(), "an https URL gets TLS with the system's CAs");
        assert_eq!(mimir.name, strata_remote_write::default_name("http://mimir:9009/api/v1/push"));
        assert!(mimir.queue.retry_on_http_429, "Strata retries 429 unless told not to");
        assert!(mimir.headers.contains(&("x-scope-orgid".into(), "fleet".into())));
        assert!(mimir.headers.iter().any(|(k, v)| k == "authorization" && v.starts_with("Basic ")));
        assert!(c.ignored.is_empty(), "remote_write is no longer an ignored section: {:?}", c.ignored);
    }

    #[test]
    fn what_prometheus_refuses_or_strata_cannot_do_fails_the_load_by_name() {
        for (section, says) in [
            ("  - url: ftp://x/\n", "http:// or https://"),
            ("  - url: http://u:p@x/\n", "basic_auth"),
            ("  - url: 'http://x:99999/'\n", "invalid url"),
            ("  - url: http://x/\n    headers:\n      Authorization: Bearer x\n", "reserved header"),
            ("  - url: http://x/\n    headers:\n      'X-A': \"a\\r\\nb\"\n", "not a valid HTTP header"),
            ("  - url: http://x/\n    sigv4: {region: r}\n    basic_auth: {username: u, password: p}\n", "at most one"),
            ("  - url: http://x/\n    oauth2: {client_id: a}\n", "oauth2 is not supported"),
            ("  - url: http://x/\n    proxy_url: http://p/\n", "proxy_url is not supported"),
            ("  - url: http://x/\n    protobuf_message: io.prometheus.write.v2.Request\n", "remote write 1.0"),
            ("  - url: http://x/\n    queue_config: {max_shards: 0}\n", "max_shards"),
            ("  - url: http://x/\n    name: a\n  - url: http://y/\n    name: a\n", "multiple remote write"),
            ("  - url: http://x/\n    sigv4: {access_key: a}\n", "secret_key"),
            ("  - url: http://x/\n    queue_config: {no_such_key: 1}\n", "no_such_key"),
        ] {
            let e = load(section).map(|_| ()).expect_err(section).to_string();
            assert!(e.contains(says), "{section:?}: {e}");
        }
    }
}
