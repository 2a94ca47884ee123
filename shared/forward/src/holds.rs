//! The WAL segments every upstream still needs, held against deletion.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use strata_tsdb::db::Tsdb;
use strata_tsdb::wal::WalCursor;

/// Each upstream's cursor; the database holds the WAL from the oldest of them on. An
/// upstream that has not said where it stands yet holds everything (`None` is not "done").
pub struct WalHolds {
    db: Arc<Tsdb>,
    cursors: Mutex<HashMap<String, WalCursor>>,
}

impl WalHolds {
    pub fn new(db: Arc<Tsdb>) -> Arc<WalHolds> {
        Arc::new(WalHolds { db, cursors: Mutex::new(HashMap::new()) })
    }

    /// `upstream` needs the WAL from `at` on.
    pub fn set(&self, upstream: &str, at: WalCursor) {
        let mut c = self.cursors.lock();
        c.insert(upstream.to_string(), at);
        self.db.hold_wal(c.values().min().copied());
    }

    /// `upstream` needs nothing any more (it was removed from the configuration).
    pub fn release(&self, upstream: &str) {
        let mut c = self.cursors.lock();
        c.remove(upstream);
        self.db.hold_wal(c.values().min().copied());
    }
}
