//! [`BlockCache`]: what the reader built from one block's rows for one series, kept for
//! the next query: a series' chunks ([`ChunkCache`]) or its windows ([`WindowCache`]).
//! Decoding Parquet rows is most of what a query of the archive costs; dashboards ask for
//! the same metrics again and again, as the store-gateway's caches in Thanos serve. Bounded
//! by the bytes its entries hold: past the budget the entries put in first go first. An
//! entry is keyed by the block's folder and its data file's checksum, so a block written
//! again is never answered from what the cache held of the old one.

use object_store::path::Path;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use strata_chunk::Chunk;
use strata_downsample::{Kept, Window};

/// A block (its folder and its data file's checksum) and a series id in it.
pub(crate) type Key = (Path, u32, i64);

/// What an entry costs in memory, roughly.
pub(crate) trait Weighed {
    fn cost(&self) -> usize;
}

impl Weighed for Arc<[Chunk]> {
    fn cost(&self) -> usize {
        self.iter().map(|c| c.data.len() + 48).sum::<usize>() + 96
    }
}

/// A series' windows in one aggregate block, with what its rows kept.
#[derive(Debug, Clone)]
pub(crate) struct BlockWindows {
    pub kept: Kept,
    pub windows: Arc<[Window]>,
}

impl Weighed for BlockWindows {
    fn cost(&self) -> usize {
        self.windows.len() * std::mem::size_of::<Window>() + 96
    }
}

pub(crate) type ChunkCache = BlockCache<Arc<[Chunk]>>;
pub(crate) type WindowCache = BlockCache<BlockWindows>;

pub(crate) struct BlockCache<V> {
    budget: usize,
    inner: Mutex<Inner<V>>,
}

struct Inner<V> {
    entries: HashMap<Key, V>,
    order: VecDeque<Key>,
    bytes: usize,
}

impl<V: Weighed + Clone> BlockCache<V> {
    pub(crate) fn new(budget: usize) -> Self {
        BlockCache { budget, inner: Mutex::new(Inner { entries: HashMap::new(), order: VecDeque::new(), bytes: 0 }) }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.budget > 0
    }

    pub(crate) fn get(&self, key: &Key) -> Option<V> {
        self.inner.lock().ok()?.entries.get(key).cloned()
    }

    /// Keeps `value` unless it alone would take more than an eighth of the budget.
    pub(crate) fn insert(&self, key: Key, value: V) {
        let size = value.cost();
        if size > self.budget / 8 {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else { return };
        if let Some(old) = inner.entries.insert(key.clone(), value) {
            inner.bytes = inner.bytes.saturating_sub(old.cost());
        } else {
            inner.order.push_back(key);
        }
        inner.bytes = inner.bytes.saturating_add(size);
        while inner.bytes > self.budget {
            let Some(first) = inner.order.pop_front() else { break };
            if let Some(gone) = inner.entries.remove(&first) {
                inner.bytes = inner.bytes.saturating_sub(gone.cost());
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize) {
        let inner = self.inner.lock().unwrap();
        (inner.entries.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_model::Sample;

    #[test]
    fn the_cache_keeps_to_its_budget_first_in_first_out() {
        let chunks: Arc<[Chunk]> =
            Chunk::encode_sealed(&(0..100).map(|i| Sample::new(i * 15_000, 1.0)).collect::<Vec<_>>()).into();
        let one = chunks.cost();
        let cache = ChunkCache::new(one * 8 + one / 2);
        for id in 0..20 {
            cache.insert((Path::from("raw/a"), 7, id), chunks.clone());
        }
        let (n, bytes) = cache.held();
        assert_eq!(n, 8);
        assert!(bytes <= one * 8 + one / 2);
        assert!(cache.get(&(Path::from("raw/a"), 7, 19)).is_some());
        assert!(cache.get(&(Path::from("raw/a"), 7, 0)).is_none(), "the first in went first");
        assert!(cache.get(&(Path::from("raw/a"), 8, 19)).is_none(), "another data file: another block");
        // An entry over an eighth of the budget is not kept.
        let small = ChunkCache::new(one * 4);
        small.insert((Path::from("raw/a"), 7, 0), chunks);
        assert_eq!(small.held().0, 0);
    }
}
