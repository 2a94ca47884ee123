//! Keeping what the archive does not hold yet: with `strata.archive` configured, the
//! regional reads the archive's progress record (where every range before is archived)
//! and holds its blocks from there against retention, within `max_disk`, as an edge holds
//! what a forward upstream still needs. Until the record is read it holds everything; a
//! record that cannot be read keeps the last hold. What retention deletes past the budget
//! is counted (`strata_held_samples_dropped_total`) and logged with its time range.

use crate::config::{RawArchiveHold, DEFAULT_ARCHIVE_MAX_DISK};
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use std::time::Duration;
use strata_archive::{archive_store, ArchiveError, ObjectStore};
use strata_tsdb::db::Tsdb;
use tokio::sync::watch;

/// How often the progress record is read.
const INTERVAL: Duration = Duration::from_secs(60);

pub struct ArchiveHold {
    objects: Arc<dyn ObjectStore>,
    url: String,
    max_disk: u64,
    /// `strata_archive_held_from_seconds`: where the hold starts (0: everything held).
    held_from: Gauge,
}

impl ArchiveHold {
    pub fn open(cfg: &RawArchiveHold) -> Result<ArchiveHold, ArchiveError> {
        Ok(ArchiveHold {
            objects: archive_store(&cfg.url, false)?,
            url: cfg.url.clone(),
            max_disk: cfg.max_disk.map_or(DEFAULT_ARCHIVE_MAX_DISK, |b| b.0),
            held_from: Gauge::default(),
        })
    }

    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "archive_held_from_seconds",
            "Blocks with data after this are kept past retention until the archive holds them (0: all)",
            self.held_from.clone(),
        );
    }

    /// Holds everything, within the budget: before the record is read, nothing is known
    /// to be archived.
    pub fn hold_all(&self, db: &Tsdb) {
        db.hold_blocks(Some((i64::MIN, self.max_disk)));
        self.held_from.set(0);
    }

    /// Reads the record and moves the hold to it; returns where it starts.
    pub async fn apply(&self, db: &Tsdb) -> Result<i64, ArchiveError> {
        let from = strata_archive::archiver::read_progress(self.objects.as_ref()).await?.unwrap_or(i64::MIN);
        db.hold_blocks(Some((from, self.max_disk)));
        self.held_from.set(from.max(0) / 1000);
        Ok(from)
    }

    /// Reads the record every minute until `stop`.
    pub async fn run(self: Arc<Self>, db: Arc<Tsdb>, mut stop: watch::Receiver<bool>) {
        loop {
            if let Err(e) = self.apply(&db).await {
                tracing::warn!(archive = %self.url, error = %e, "reading the archive's progress: keeping the last hold");
            }
            tokio::select! {
                _ = tokio::time::sleep(INTERVAL) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_archive::ObjectStoreExt;

    #[tokio::test]
    async fn the_hold_follows_the_archives_progress_record() {
        let bucket = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        let db = Tsdb::open(data.path(), Default::default()).unwrap();
        let cfg = RawArchiveHold { url: bucket.path().display().to_string(), max_disk: None };
        let hold = ArchiveHold::open(&cfg).unwrap();
        hold.hold_all(&db);
        assert_eq!(db.blocks_held(), Some((i64::MIN, DEFAULT_ARCHIVE_MAX_DISK)));
        // No record yet: everything stays held.
        assert_eq!(hold.apply(&db).await.unwrap(), i64::MIN);
        assert_eq!(db.blocks_held(), Some((i64::MIN, DEFAULT_ARCHIVE_MAX_DISK)));
        let record = serde_json::json!({"until": 1_764_554_400_000i64, "owner": "g", "updated": 0}).to_string();
        let path = strata_archive::archiver::PROGRESS.into();
        hold.objects.put(&path, record.into()).await.unwrap();
        assert_eq!(hold.apply(&db).await.unwrap(), 1_764_554_400_000);
        assert_eq!(db.blocks_held(), Some((1_764_554_400_000, DEFAULT_ARCHIVE_MAX_DISK)));
        // A damaged record: an error, and the hold stays where it was.
        hold.objects.put(&path, "{not json".into()).await.unwrap();
        let err = hold.apply(&db).await.unwrap_err();
        assert!(err.to_string().contains("progress/raw.json"), "{err}");
        assert_eq!(db.blocks_held(), Some((1_764_554_400_000, DEFAULT_ARCHIVE_MAX_DISK)));
        db.shutdown().unwrap();
    }
}
