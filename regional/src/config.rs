//! The regional's configuration file: Strata's keys under `strata:`, and Prometheus'
//! `global` (`evaluation_interval`, `external_labels`), `rule_files` and `alerting`; any
//! other section is accepted and logged as ignored, so one file can grow with the tier.

use serde::de::IgnoredAny;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use strata_model::duration::PromDuration;
use strata_model::size::ByteSize;
use strata_rules::tier::{GlobalSection, RulesConfig};
use strata_tsdb::settings::StorageSettings;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// Strata's keys: where and how long the regional keeps what it receives.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawRegionalStrata {
    pub data_dir: Option<PathBuf>,
    /// How long received data is kept (default [`DEFAULT_RETENTION`], longer than an
    /// edge's day).
    pub retention: Option<PromDuration>,
    pub retention_size: Option<ByteSize>,
    pub block_range: Option<PromDuration>,
    pub block_cache_size: Option<ByteSize>,
    pub future_grace_period: Option<PromDuration>,
    pub max_series: Option<usize>,
    /// `always` or an interval such as `1s`. Forwarded batches are `fsync`ed before they
    /// are acknowledged whatever this says.
    pub wal_fsync: Option<String>,
    #[serde(default)]
    pub downsample: RawDownsample,
    /// `strata.archive`: the bucket a global archives this regional's data to; blocks it
    /// has not archived yet are kept past retention, within `max_disk`.
    pub archive: Option<RawArchiveHold>,
}

/// `strata.archive`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawArchiveHold {
    /// The archive's URL, as the global's `--archive` names it.
    pub url: String,
    /// Disk the blocks kept for the archive past retention may take (default 50GiB);
    /// past it the oldest go, counted (`strata_held_samples_dropped_total`) and logged.
    pub max_disk: Option<ByteSize>,
}

/// [`RawArchiveHold::max_disk`]'s default.
pub const DEFAULT_ARCHIVE_MAX_DISK: u64 = 50 << 30;

/// `strata.downsample`: the 5 m and 1 h aggregates of the deduplicated data.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawDownsample {
    /// On unless `false`.
    pub enabled: Option<bool>,
    /// The labels that tell HA replicas apart (default `[replica]`), dropped from the
    /// aggregated series as the global's dedup drops them.
    pub replica_labels: Option<Vec<String>>,
    /// How long a window waits for a silent sender (default 15m).
    pub max_delay: Option<PromDuration>,
    /// Keep `deriv`'s and `predict_linear`'s sums for gauges (default false: they cost
    /// more than every other aggregate together).
    pub least_squares: Option<bool>,
    /// Keep when each window's extremes were taken, for `ts_of_min_over_time` and
    /// `ts_of_max_over_time` (default false: a third more bytes for a noisy gauge).
    pub extreme_times: Option<bool>,
    /// How long aggregates are kept (defaults 90d and 2y, against raw data's 15d).
    pub retention_5m: Option<PromDuration>,
    pub retention_1h: Option<PromDuration>,
    /// Decoded windows kept for the queries to come (default 256MiB; `0` keeps none).
    pub window_cache_size: Option<ByteSize>,
}

#[derive(Debug, Clone, Deserialize, Default)]
struct RawConfig {
    #[serde(default)]
    strata: RawRegionalStrata,
    #[serde(default)]
    global: GlobalSection,
    #[serde(default)]
    rule_files: Vec<String>,
    #[serde(default)]
    alerting: strata_rules::notifier::AlertingConfig,
    #[serde(flatten)]
    unknown: BTreeMap<String, IgnoredAny>,
}

/// The regional keeps what it receives this long unless told otherwise (Prometheus'
/// default retention; an edge keeps a day).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(15 * 24 * 3600);

#[derive(Debug, Clone)]
pub struct RegionalConfig {
    pub path: PathBuf,
    pub strata: RawRegionalStrata,
    pub global: GlobalSection,
    /// Globs of rule files, relative to the config file's directory.
    pub rule_files: Vec<String>,
    pub alerting: strata_rules::notifier::AlertingConfig,
    /// Top-level keys Strata does not implement (logged at load).
    pub ignored: Vec<String>,
}

impl RegionalConfig {
    pub fn load(path: &Path) -> Result<RegionalConfig, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        let cfg = Self::parse(&text, path)?;
        for key in &cfg.ignored {
            tracing::warn!(path = %path.display(), key = %key, "configuration key not implemented by the regional: ignored");
        }
        Ok(cfg)
    }

    pub fn parse(text: &str, path: &Path) -> Result<RegionalConfig, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid { path: path.to_path_buf(), message };
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?
        };
        let mut ignored: Vec<String> = raw.unknown.into_keys().collect();
        ignored.extend(raw.global.ignored_keys());
        raw.global.validate().map_err(invalid)?;
        let cfg = RegionalConfig {
            path: path.to_path_buf(),
            strata: raw.strata,
            global: raw.global,
            rule_files: raw.rule_files,
            alerting: raw.alerting,
            ignored,
        };
        cfg.storage_settings()
            .apply(strata_tsdb::db::TsdbOptions::default())
            .map_err(|m| invalid(format!("strata.{m}")))?;
        Ok(cfg)
    }

    /// What the rules read.
    pub fn rules_config(&self) -> RulesConfig {
        RulesConfig {
            path: self.path.clone(),
            global: self.global.clone(),
            rule_files: self.rule_files.clone(),
            alerting: self.alerting.clone(),
        }
    }

    /// Whether downsampling runs, the replica labels, and its options.
    pub fn downsample(&self) -> Option<(Vec<String>, strata_downsample::DownsampleOptions)> {
        let d = &self.strata.downsample;
        if d.enabled == Some(false) {
            return None;
        }
        let mut o = strata_downsample::DownsampleOptions::default();
        if let Some(x) = d.max_delay {
            o.max_delay = x.0;
        }
        o.asked = strata_downsample::Asked {
            least_squares: d.least_squares.unwrap_or(false),
            extreme_times: d.extreme_times.unwrap_or(false),
        };
        if let Some(x) = d.retention_5m {
            o.retention_5m = x.0;
        }
        if let Some(x) = d.retention_1h {
            o.retention_1h = x.0;
        }
        if let Some(x) = d.window_cache_size {
            o.window_cache_bytes = usize::try_from(x.0).unwrap_or(usize::MAX);
        }
        Some((d.replica_labels.clone().unwrap_or_else(|| vec!["replica".into()]), o))
    }

    /// The storage keys, with the regional's default retention.
    pub fn storage_settings(&self) -> StorageSettings {
        let s = &self.strata;
        StorageSettings {
            retention: Some(s.retention.map_or(DEFAULT_RETENTION, |d| d.0)),
            retention_size: s.retention_size.map(|b| b.0),
            block_range: s.block_range.map(|d| d.0),
            block_cache_bytes: s.block_cache_size.map(|b| b.0),
            future_grace_period: s.future_grace_period.map(|d| d.0),
            max_series: s.max_series,
            wal_fsync: s.wal_fsync.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_defaults_and_errors() {
        let p = Path::new("regional.yml");
        let cfg =
            RegionalConfig::parse("strata:\n  retention: 2d\n  block_range: 10m\nrule_files: [a.yml]\n", p).unwrap();
        let o = cfg.storage_settings().apply(Default::default()).unwrap();
        assert_eq!((o.retention, o.block_range), (Duration::from_secs(2 * 86400), Duration::from_secs(600)));
        assert_eq!(cfg.rule_files, vec!["a.yml".to_string()]);
        assert!(cfg.ignored.is_empty());
        let cfg = RegionalConfig::parse(
            "global:\n  evaluation_interval: 30s\n  scrape_interval: 5s\n  external_labels: {region: eu}\nalerting:\n  alertmanagers:\n  - static_configs: [{targets: ['127.0.0.1:9093']}]\nremote_read: []\n",
            p,
        )
        .unwrap();
        assert_eq!(cfg.ignored, vec!["remote_read".to_string(), "global.scrape_interval".to_string()]);
        assert_eq!(cfg.global.evaluation_interval.unwrap().0, Duration::from_secs(30));
        assert_eq!(cfg.alerting.alertmanagers.len(), 1);
        assert!(RegionalConfig::parse("global:\n  external_labels: {\"a-b\": c}\n", p).is_err());
        assert!(RegionalConfig::parse("alerting:\n  alert_relabel_configs: []\n", p).is_err());
        let empty = RegionalConfig::parse("", p).unwrap();
        assert_eq!(empty.storage_settings().apply(Default::default()).unwrap().retention, DEFAULT_RETENTION);
        assert!(RegionalConfig::parse("strata:\n  unknown: 1\n", p).is_err());
        assert!(RegionalConfig::parse("strata:\n  wal_fsync: sometimes\n", p).is_err());
        let (replicas, d) = empty.downsample().expect("on by default");
        assert_eq!((replicas, d.max_delay), (vec!["replica".to_string()], Duration::from_secs(900)));
        let cfg =
            RegionalConfig::parse("strata:\n  downsample:\n    replica_labels: [r]\n    max_delay: 2m\n", p).unwrap();
        assert_eq!(cfg.downsample().unwrap().1.max_delay, Duration::from_secs(120));
        let cfg = RegionalConfig::parse("strata:\n  downsample:\n    window_cache_size: 1MiB\n", p).unwrap();
        assert_eq!(cfg.downsample().unwrap().1.window_cache_bytes, 1 << 20);
        assert!(RegionalConfig::parse("strata:\n  downsample:\n    enabled: false\n", p)
            .unwrap()
            .downsample()
            .is_none());
        assert!(RegionalConfig::parse("strata:\n  downsample:\n    every: 1m\n", p).is_err());
    }
}
