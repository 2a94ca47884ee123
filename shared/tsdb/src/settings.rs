//! The storage keys a tier's configuration file sets under `strata:`, applied to
//! [`TsdbOptions`] the same way for the edge and the regional (each with its own defaults).

use crate::db::TsdbOptions;
use crate::wal::SyncPolicy;
use std::time::Duration;

/// Storage settings as a configuration file gives them; `None` keeps the tier's default.
#[derive(Debug, Clone, Default)]
pub struct StorageSettings {
    pub retention: Option<Duration>,
    pub retention_size: Option<u64>,
    pub block_range: Option<Duration>,
    pub block_cache_bytes: Option<u64>,
    pub future_grace_period: Option<Duration>,
    pub max_series: Option<usize>,
    /// `always` or an interval (`1s`).
    pub wal_fsync: Option<String>,
}

/// The shortest block range accepted (tests use short ones; below this a cut would run
/// all the time).
pub const MIN_BLOCK_RANGE: Duration = Duration::from_secs(10);

impl StorageSettings {
    /// `defaults` with every setting given here applied; an invalid `wal_fsync` is an error.
    pub fn apply(&self, mut o: TsdbOptions) -> Result<TsdbOptions, String> {
        if let Some(r) = self.retention {
            o.retention = r;
        }
        if let Some(size) = self.retention_size {
            o.retention_size = Some(size);
        }
        if let Some(size) = self.block_cache_bytes {
            o.block_cache_bytes = usize::try_from(size).unwrap_or(usize::MAX);
        }
        if let Some(r) = self.block_range {
            o.block_range = r.max(MIN_BLOCK_RANGE);
        }
        if let Some(g) = self.future_grace_period {
            o.future_grace_period = g;
        }
        if let Some(n) = self.max_series {
            o.max_series = n;
        }
        if let Some(p) = &self.wal_fsync {
            o.wal_sync = SyncPolicy::parse(p).map_err(|m| format!("wal_fsync: {m}"))?;
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_override_the_defaults_they_name() {
        let s = StorageSettings {
            retention: Some(Duration::from_secs(60)),
            block_range: Some(Duration::from_secs(1)),
            wal_fsync: Some("always".into()),
            ..Default::default()
        };
        let o = s.apply(TsdbOptions::default()).unwrap();
        assert_eq!(
            (o.retention, o.block_range, o.wal_sync),
            (Duration::from_secs(60), MIN_BLOCK_RANGE, SyncPolicy::Always)
        );
        assert_eq!(o.max_series, TsdbOptions::default().max_series);
        let bad = StorageSettings { wal_fsync: Some("often".into()), ..Default::default() };
        assert!(bad.apply(TsdbOptions::default()).is_err());
    }
}
