//! What every upstream still needs, held against deletion: WAL segments from its cursor,
//! and while it has a backlog to read from storage, blocks past retention within a budget.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use strata_tsdb::db::Tsdb;
use strata_tsdb::wal::WalCursor;

/// Each upstream's cursor and backlog; the database holds the WAL from the oldest cursor
/// on, and blocks from the oldest backlog on. An upstream that has not said where it
/// stands yet holds everything (`None` is not "done").
pub struct WalHolds {
    db: Arc<Tsdb>,
    cursors: Mutex<HashMap<String, WalCursor>>,
    /// Upstream → (the oldest time its backlog needs, the bytes past retention it may keep).
    backlogs: Mutex<HashMap<String, (i64, u64)>>,
}

impl WalHolds {
    pub fn new(db: Arc<Tsdb>) -> Arc<WalHolds> {
        Arc::new(WalHolds { db, cursors: Mutex::new(HashMap::new()), backlogs: Mutex::new(HashMap::new()) })
    }

    /// `upstream` needs the WAL from `at` on.
    pub fn set(&self, upstream: &str, at: WalCursor) {
        let mut c = self.cursors.lock();
        c.insert(upstream.to_string(), at);
        self.db.hold_wal(c.values().min().copied());
    }

    /// `upstream` reads a backlog from storage from `oldest` (ms) on, and may keep up to
    /// `max_bytes` of blocks past retention for it; `None`: it has none.
    pub fn set_backlog(&self, upstream: &str, backlog: Option<(i64, u64)>) {
        let mut b = self.backlogs.lock();
        match backlog {
            Some(v) => b.insert(upstream.to_string(), v),
            None => b.remove(upstream),
        };
        let oldest = b.values().map(|v| v.0).min();
        let budget = b.values().map(|v| v.1).max();
        self.db.hold_blocks(oldest.zip(budget));
    }

    /// `upstream`'s backlog no longer needs storage before `from` (ms): its hold moves on.
    pub fn advance_backlog(&self, upstream: &str, from: i64) {
        let current = self.backlogs.lock().get(upstream).copied();
        if let Some((_, budget)) = current.filter(|(oldest, _)| from > *oldest) {
            self.set_backlog(upstream, Some((from, budget)));
        }
    }

    /// `upstream` needs nothing any more (it was removed from the configuration).
    pub fn release(&self, upstream: &str) {
        let mut c = self.cursors.lock();
        c.remove(upstream);
        self.db.hold_wal(c.values().min().copied());
        drop(c);
        self.set_backlog(upstream, None);
    }
}
