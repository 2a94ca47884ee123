//! [`ChunkCache`]: recently read series' chunks, shared by every block of a database and
//! bounded in bytes. Reads of a block go to the page cache through positioned reads; this
//! saves the system call, the copy and the CRC check for the series queries keep asking
//! for (dashboards repeat themselves). Eviction is CLOCK: a series read since its last pass
//! gets a second chance.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use strata_chunk::Chunk;

/// Default budget: enough for the chunks of a few hundred thousand series' day.
pub const DEFAULT_CACHE_BYTES: usize = 256 << 20;

/// (block number, series id).
type Key = (u64, u64);

struct Entry {
    chunks: Arc<[Chunk]>,
    bytes: usize,
    referenced: bool,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Key, Entry>,
    clock: VecDeque<Key>,
    bytes: usize,
}

pub struct ChunkCache {
    max_bytes: usize,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// A number for each block opened in this process: the cache's key, since a block id is a
/// string and a compaction's output may reuse none of its sources' ids.
pub fn next_block_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn cost(chunks: &[Chunk]) -> usize {
    chunks.iter().map(|c| c.data.len() + std::mem::size_of::<Chunk>() + 32).sum::<usize>() + 64
}

impl ChunkCache {
    pub fn new(max_bytes: usize) -> ChunkCache {
        ChunkCache {
            max_bytes,
            inner: Mutex::new(Inner::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub fn get(&self, block: u64, series: u64) -> Option<Arc<[Chunk]>> {
        let mut g = self.inner.lock().ok()?;
        match g.map.get_mut(&(block, series)) {
            Some(e) => {
                e.referenced = true;
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(e.chunks.clone())
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    pub fn insert(&self, block: u64, series: u64, chunks: Arc<[Chunk]>) {
        let bytes = cost(&chunks);
        if bytes > self.max_bytes / 8 {
            return;
        }
        let Ok(mut g) = self.inner.lock() else { return };
        let key = (block, series);
        if let Some(old) = g.map.insert(key, Entry { chunks, bytes, referenced: false }) {
            g.bytes -= old.bytes;
        } else {
            g.clock.push_back(key);
        }
        g.bytes += bytes;
        while g.bytes > self.max_bytes {
            let Some(k) = g.clock.pop_front() else { break };
            match g.map.get_mut(&k) {
                Some(e) if e.referenced => {
                    e.referenced = false;
                    g.clock.push_back(k);
                }
                Some(_) => {
                    if let Some(e) = g.map.remove(&k) {
                        g.bytes -= e.bytes;
                    }
                }
                None => {}
            }
        }
    }

    /// Forgets a block's series (it was deleted).
    pub fn forget_block(&self, block: u64) {
        let Ok(mut g) = self.inner.lock() else { return };
        let Inner { map, clock, bytes } = &mut *g;
        map.retain(|k, e| {
            let keep = k.0 != block;
            if !keep {
                *bytes -= e.bytes;
            }
            keep
        });
        clock.retain(|k| k.0 != block);
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.inner.lock().map(|g| g.bytes).unwrap_or(0)
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// (hits, misses) since start.
    pub fn stats(&self) -> (u64, u64) {
        (self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_chunk::ChunkAppender;

    fn chunks(n: usize) -> Arc<[Chunk]> {
        let mut a = ChunkAppender::new();
        for i in 0..n {
            a.append(i as i64 * 1000, i as f64);
        }
        Arc::from(vec![a.seal()])
    }

    #[test]
    fn the_cache_stays_within_its_budget_and_keeps_what_is_read() {
        let one = cost(&chunks(100));
        let cache = ChunkCache::new(one * 10);
        cache.insert(1, 0, chunks(100));
        for s in 1..100 {
            assert!(cache.get(1, 0).is_some(), "a series read again and again stays");
            cache.insert(1, s, chunks(100));
            assert!(cache.bytes() <= cache.max_bytes());
        }
        assert!(cache.get(1, 1).is_none(), "an old series read once was evicted");
        cache.forget_block(1);
        assert_eq!(cache.bytes(), 0);
        assert!(cache.get(1, 0).is_none());
    }
}
