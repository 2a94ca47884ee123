//! The database's background loops, for any tier that holds a [`Tsdb`]: the WAL fsync
//! loop (with the `Interval` sync policy) and the retention loop. Both run the blocking
//! work off the async workers and report failures in the log and in [`TsdbMetrics`](crate::metrics::TsdbMetrics).

use crate::db::Tsdb;
use crate::wal::SyncPolicy;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// How often retention runs.
pub const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// Starts the loops the database's options call for; abort the handles to stop them.
pub fn spawn(db: &Arc<Tsdb>) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    if let SyncPolicy::Interval(every) = db.options().wal_sync {
        tasks.push(spawn_fsync(db.clone(), every));
    }
    tasks.push(spawn_retention(db.clone(), RETENTION_EVERY));
    tasks
}

/// `fsync`s the WAL every `every`, recording how long each call took.
pub fn spawn_fsync(db: Arc<Tsdb>, every: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let db2 = db.clone();
            match tokio::task::spawn_blocking(move || db2.sync_wal()).await {
                Ok(Ok(d)) => db.metrics().wal_fsync_seconds.observe(d.as_secs_f64()),
                Ok(Err(e)) => tracing::error!(error = %e, dir = %db.dir().display(), "WAL fsync failed"),
                Err(e) => tracing::error!(error = %e, "WAL fsync task failed"),
            }
        }
    })
}

/// Applies retention every `every`.
pub fn spawn_retention(db: Arc<Tsdb>, every: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let db2 = db.clone();
            match tokio::task::spawn_blocking(move || db2.apply_retention()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    db.metrics().retention_failures.inc();
                    tracing::error!(error = %e, dir = %db.dir().display(), "retention failed");
                }
                Err(e) => {
                    db.metrics().retention_failures.inc();
                    tracing::error!(error = %e, "retention task failed");
                }
            }
        }
    })
}
