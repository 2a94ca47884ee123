//! The global's configuration file (YAML).
//!
//! ```yaml
//! stores:                       # StoreAPI addresses, host:port
//!   - 127.0.0.1:10901
//! file_sd_configs:              # files of Prometheus file-SD form: [{"targets": [...]}]
//!   - files: [stores.json]
//! dns_sd:                       # dns+host:port: every A/AAAA record of host, at port;
//!   - dns+edges.monitoring.svc:10901   # dnssrv+name: every SRV record's host and port
//!   - dnssrv+_grpc._tcp.edges.monitoring.svc
//! dns_resolver: 10.0.0.10:53    # for SRV; default: the first nameserver of /etc/resolv.conf
//! store_timeout: 30s            # per store and call
//! info_interval: 10s            # how often each store's Info is read, files and names resolved
//! replica_labels: [replica]     # HA replica labels (also --query.replica-label)
//! aggregates: coarsest          # or `raw_where_held`: where regionals' 5 m / 1 h aggregates answer
//! grpc_client_tls:              # connect to every store over TLS
//!   ca_file: ca.crt             #   the CA the stores' certificates chain to
//!   cert_file: client.crt       #   this global's certificate, for stores that verify clients
//!   key_file: client.key
//!   server_name: edges.example  #   the name to verify (default: each store's host)
//!
//! # Rules over everything the global sees (Thanos' ruler), as in a Prometheus file:
//! global:
//!   evaluation_interval: 1m
//!   external_labels: {ruler: global}   # on what the rules record and on alerts
//! rule_files: [rules/*.yml]
//! alerting:
//!   alertmanagers: [{static_configs: [{targets: ['127.0.0.1:9093']}]}]
//! rules_retention: 15d          # how long recorded series are kept under --data
//! ```

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use strata_model::duration::PromDuration;
use strata_rules::tier::{GlobalSection, RulesConfig};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    stores: Vec<String>,
    #[serde(default)]
    file_sd_configs: Vec<RawFileSd>,
    #[serde(default)]
    dns_sd: Vec<String>,
    store_timeout: Option<PromDuration>,
    info_interval: Option<PromDuration>,
    replica_labels: Option<Vec<String>>,
    aggregates: Option<String>,
    dns_resolver: Option<String>,
    grpc_client_tls: Option<RawClientTls>,
    #[serde(default)]
    global: GlobalSection,
    #[serde(default)]
    rule_files: Vec<String>,
    #[serde(default)]
    alerting: strata_rules::notifier::AlertingConfig,
    rules_retention: Option<PromDuration>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClientTls {
    ca_file: PathBuf,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    server_name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFileSd {
    files: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct GlobalConfig {
    pub stores: Vec<String>,
    /// File-SD files, relative paths resolved against the configuration file's folder.
    pub sd_files: Vec<PathBuf>,
    /// `dns+host:port` names.
    pub dns: Vec<(String, u16)>,
    /// `dnssrv+` names.
    pub dns_srv: Vec<String>,
    pub dns_resolver: Option<std::net::SocketAddr>,
    pub store_timeout: Duration,
    pub info_interval: Duration,
    pub replica_labels: Vec<String>,
    /// Where aggregates answer when raw data could too (docs/downsample.md).
    pub aggregates: strata_downsample::Prefer,
    /// TLS for the connections to the stores; paths resolved against the file's folder.
    pub client_tls: Option<strata_grpc::ClientTlsFiles>,
    /// The rules this global runs itself (none unless `rule_files` names some); `path` is
    /// set by [`GlobalConfig::load`].
    pub rules: RulesConfig,
    /// How long the series rules record are kept.
    pub rules_retention: Duration,
    /// Keys of the `global` section no rule reads (logged at load).
    pub ignored: Vec<String>,
}

/// Recorded series are kept this long unless `rules_retention` says otherwise
/// (Prometheus' default retention).
pub const DEFAULT_RULES_RETENTION: Duration = Duration::from_secs(15 * 24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// A configuration file larger than this is refused before it is parsed.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

impl GlobalConfig {
    pub fn load(path: &Path) -> Result<GlobalConfig, ConfigError> {
        let read = |source| ConfigError::Read { path: path.to_path_buf(), source };
        let len = std::fs::metadata(path).map_err(read)?.len();
        let invalid = |reason: String| ConfigError::Invalid { path: path.to_path_buf(), reason };
        if len > MAX_CONFIG_BYTES {
            return Err(invalid(format!("{len} bytes (at most {MAX_CONFIG_BYTES})")));
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        let mut cfg = GlobalConfig::parse(&text, path.parent().unwrap_or(Path::new("."))).map_err(invalid)?;
        cfg.rules.path = path.to_path_buf();
        for key in &cfg.ignored {
            tracing::warn!(path = %path.display(), key = %key, "configuration key not read by the global: ignored");
        }
        Ok(cfg)
    }

    pub fn parse(text: &str, base: &Path) -> Result<GlobalConfig, String> {
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| e.to_string())?
        };
        for s in &raw.stores {
            check_address(s)?;
        }
        let (mut dns, mut dns_srv) = (Vec::new(), Vec::new());
        for d in &raw.dns_sd {
            if let Some(name) = d.strip_prefix("dnssrv+") {
                crate::dns::srv_query(0, name)?;
                dns_srv.push(name.to_string());
            } else if let Some(rest) = d.strip_prefix("dns+") {
                let (host, port) = check_address(rest)?;
                dns.push((host.to_string(), port));
            } else {
                return Err(format!("dns_sd entry {d:?}: expected dns+host:port or dnssrv+name"));
            }
        }
        let dns_resolver = match raw.dns_resolver.as_deref() {
            Some(r) => Some(r.parse().map_err(|_| format!("dns_resolver {r:?} is not ip:port"))?),
            None => None,
        };
        let resolve = |f: &PathBuf| if f.is_absolute() { f.clone() } else { base.join(f) };
        let sd_files = raw.file_sd_configs.iter().flat_map(|f| f.files.iter()).map(resolve).collect();
        let client_tls = raw.grpc_client_tls.as_ref().map(|t| strata_grpc::ClientTlsFiles {
            ca: resolve(&t.ca_file),
            cert: t.cert_file.as_ref().map(resolve),
            key: t.key_file.as_ref().map(resolve),
            server_name: t.server_name.clone(),
        });
        let positive = |d: Option<PromDuration>, default: Duration, name: &str| -> Result<Duration, String> {
            match d.map(|d| d.0) {
                Some(d) if d.is_zero() => Err(format!("{name} must be positive")),
                Some(d) => Ok(d),
                None => Ok(default),
            }
        };
        raw.global.validate()?;
        let ignored = raw.global.ignored_keys();
        let rules = RulesConfig {
            path: PathBuf::new(),
            global: raw.global,
            rule_files: raw.rule_files,
            alerting: raw.alerting,
        };
        Ok(GlobalConfig {
            stores: raw.stores,
            sd_files,
            dns,
            dns_srv,
            dns_resolver,
            store_timeout: positive(raw.store_timeout, Duration::from_secs(30), "store_timeout")?,
            info_interval: positive(raw.info_interval, Duration::from_secs(10), "info_interval")?,
            replica_labels: raw.replica_labels.unwrap_or_else(|| vec!["replica".to_string()]),
            aggregates: match raw.aggregates.as_deref() {
                Some("raw_where_held") => strata_downsample::Prefer::RawWhereHeld,
                None | Some("coarsest") => strata_downsample::Prefer::Coarsest,
                Some(other) => return Err(format!("aggregates: {other:?} is neither raw_where_held nor coarsest")),
            },
            client_tls,
            rules_retention: positive(raw.rules_retention, DEFAULT_RULES_RETENTION, "rules_retention")?,
            rules,
            ignored,
        })
    }
}

/// `host:port` with a port; returns both.
pub fn check_address(s: &str) -> Result<(&str, u16), String> {
    let (host, port) = s.rsplit_once(':').ok_or_else(|| format!("store address {s:?} has no port"))?;
    let port: u16 = port.parse().map_err(|_| format!("store address {s:?}: bad port"))?;
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control() || c == '/') {
        return Err(format!("store address {s:?}: bad host"));
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_parses_with_defaults_and_bad_ones_are_refused() {
        let c = GlobalConfig::parse(
            "stores: ['127.0.0.1:10901']\nfile_sd_configs:\n  - files: [s.json]\ndns_sd: ['dns+edges.local:10901']\n",
            Path::new("/etc/strata"),
        )
        .unwrap();
        assert_eq!(c.stores, ["127.0.0.1:10901"]);
        assert_eq!(c.sd_files, [PathBuf::from("/etc/strata/s.json")]);
        assert_eq!(c.dns, [("edges.local".to_string(), 10901)]);
        assert_eq!(c.aggregates, strata_downsample::Prefer::Coarsest);
        let held = GlobalConfig::parse("aggregates: raw_where_held\n", Path::new("/")).unwrap();
        assert_eq!(held.aggregates, strata_downsample::Prefer::RawWhereHeld);
        assert_eq!((c.store_timeout, c.replica_labels.clone()), (Duration::from_secs(30), vec!["replica".into()]));
        assert!(c.client_tls.is_none());
        assert!(c.rules.rule_files.is_empty());
        assert_eq!(c.rules_retention, DEFAULT_RULES_RETENTION);
        let ruler = GlobalConfig::parse(
            "global:\n  evaluation_interval: 30s\n  scrape_interval: 5s\n  external_labels: {ruler: g}\nrule_files: [r/*.yml]\nrules_retention: 2d\nalerting:\n  alertmanagers:\n  - static_configs: [{targets: ['127.0.0.1:9093']}]\n",
            Path::new("/etc/strata"),
        )
        .unwrap();
        assert_eq!(ruler.rules.rule_files, ["r/*.yml"]);
        assert_eq!(ruler.rules.global.external_labels().get("ruler"), Some("g"));
        assert_eq!(ruler.rules.alerting.alertmanagers.len(), 1);
        assert_eq!(ruler.rules_retention, Duration::from_secs(2 * 86400));
        assert_eq!(ruler.ignored, ["global.scrape_interval"]);
        let tls =
            "grpc_client_tls:\n  ca_file: ca.crt\n  cert_file: /abs/c.crt\n  key_file: c.key\n  server_name: edges\n";
        let t = GlobalConfig::parse(tls, Path::new("/etc/strata")).unwrap().client_tls.unwrap();
        assert_eq!(t.ca, PathBuf::from("/etc/strata/ca.crt"));
        assert_eq!((t.cert, t.key), (Some("/abs/c.crt".into()), Some("/etc/strata/c.key".into())));
        assert_eq!(t.server_name.as_deref(), Some("edges"));
        for bad in [
            "grpc_client_tls:\n  cert_file: c.crt\n",
            "grpc_client_tls:\n  ca_file: ca.crt\n  insecure: true\n",
            "stores: ['nohost']",
            "stores: ['a b:1']",
            "aggregates: always",
            "dns_sd: ['srv+x']",
            "dns_resolver: nowhere",
            "store_timeout: 0s",
            "rules_retention: 0s",
            "global:\n  external_labels: {\"a-b\": c}\n",
            "alerting:\n  alert_relabel_configs: []\n",
            "unknown_key: 1",
            "stores: [[",
        ] {
            assert!(GlobalConfig::parse(bad, Path::new(".")).is_err(), "{bad}");
        }
    }
}
