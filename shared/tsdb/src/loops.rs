//! The database's background loops, for any tier that holds a [`Tsdb`]: the WAL fsync
//! loop (with the `Interval` sync policy) and the maintenance loop (block cut, compaction,
//! retention: see [`Tsdb::maintain`]). Both run the blocking
//! work off the async workers and report failures in the log and in [`TsdbMetrics`](crate::metrics::TsdbMetrics).

use crate::db::{Tsdb, TsdbError};
use crate::wal::SyncPolicy;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// How often maintenance runs: a thirtieth of the block range, between 1 s and 60 s.
pub fn maintenance_interval(block_range: Duration) -> Duration {
    (block_range / 30).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Starts the loops the database's options call for; abort the handles to stop them.
pub fn spawn(db: &Arc<Tsdb>) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    if let SyncPolicy::Interval(every) = db.options().wal_sync {
        tasks.push(spawn_fsync(db.clone(), every));
    }
    tasks.push(spawn_maintenance(db.clone(), maintenance_interval(db.options().block_range)));
    tasks
}

/// `fsync`s the WAL every `every`, recording how long each call took.
pub fn spawn_fsync(db: Arc<Tsdb>, every: Duration) -> JoinHandle<()> {
    spawn_every(db, every, "WAL fsync", |db| {
        let took = db.sync_wal()?;
        db.metrics().wal_fsync_seconds.observe(took.as_secs_f64());
        Ok(())
    })
}

/// Cuts blocks, compacts and applies retention every `every`.
pub fn spawn_maintenance(db: Arc<Tsdb>, every: Duration) -> JoinHandle<()> {
    spawn_every(db, every, "storage maintenance", |db| db.maintain().map(|_| ()))
}

/// Runs `work` on a blocking thread every `every`; a failure is logged with the database's
/// directory and the loop goes on.
fn spawn_every(
    db: Arc<Tsdb>,
    every: Duration,
    what: &'static str,
    work: fn(&Tsdb) -> Result<(), TsdbError>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let db2 = db.clone();
            match tokio::task::spawn_blocking(move || work(&db2)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, dir = %db.dir().display(), "{what} failed"),
                Err(e) => tracing::error!(error = %e, "{what} task failed"),
            }
        }
    })
}
