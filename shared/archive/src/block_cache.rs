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
use strata_downsample::{Kept, WindowColumns};

/// A block: its folder and its data file's checksum.
pub(crate) type BlockKey = (Path, u32);

/// What an entry costs in memory, roughly.
pub(crate) trait Weighed {
    fn cost(&self) -> usize;
}

impl Weighed for Arc<[Chunk]> {
    fn cost(&self) -> usize {
        self.iter().map(|c| c.data.len() + 48).sum::<usize>() + 96
    }
}

/// A series' windows in one aggregate block, field by field (a query reads only the
/// fields it needs), with what its rows kept.
#[derive(Debug, Clone)]
pub(crate) struct BlockWindows {
    pub kept: Kept,
    pub columns: Arc<WindowColumns>,
}

impl Weighed for BlockWindows {
    fn cost(&self) -> usize {
        self.columns.bytes() + 96
    }
}

pub(crate) type ChunkCache = BlockCache<Arc<[Chunk]>>;
pub(crate) type WindowCache = BlockCache<BlockWindows>;

pub(crate) struct BlockCache<V> {
    budget: usize,
    inner: Mutex<Inner<V>>,
}

/// Entries by block, then series id: a query looks a block up once for all its series.
struct Inner<V> {
    // (Series ids are ours, not a client's: a fast hash.)
    entries: HashMap<BlockKey, HashMap<i64, V, foldhash::fast::RandomState>>,
    order: VecDeque<(BlockKey, i64)>,
    bytes: usize,
}

impl<V: Weighed + Clone> BlockCache<V> {
    pub(crate) fn new(budget: usize) -> Self {
        BlockCache { budget, inner: Mutex::new(Inner { entries: HashMap::new(), order: VecDeque::new(), bytes: 0 }) }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// The entries held of `ids` in `block`.
    pub(crate) fn get_many(&self, block: &BlockKey, ids: impl IntoIterator<Item = i64>) -> Vec<(i64, V)> {
        let Ok(inner) = self.inner.lock() else { return Vec::new() };
        let Some(held) = inner.entries.get(block) else { return Vec::new() };
        ids.into_iter().filter_map(|id| held.get(&id).map(|v| (id, v.clone()))).collect()
    }

    /// Keeps `value` unless it alone would take more than an eighth of the budget.
    pub(crate) fn insert(&self, block: &BlockKey, id: i64, value: V) {
        let size = value.cost();
        if size > self.budget / 8 {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else { return };
        let inner = &mut *inner;
        match inner.entries.entry(block.clone()).or_default().insert(id, value) {
            Some(old) => inner.bytes = inner.bytes.saturating_sub(old.cost()),
            None => inner.order.push_back((block.clone(), id)),
        }
        inner.bytes = inner.bytes.saturating_add(size);
        while inner.bytes > self.budget {
            let Some((b, first)) = inner.order.pop_front() else { break };
            let Some(held) = inner.entries.get_mut(&b) else { continue };
            if let Some(gone) = held.remove(&first) {
                inner.bytes = inner.bytes.saturating_sub(gone.cost());
            }
            if held.is_empty() {
                inner.entries.remove(&b);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize) {
        let inner = self.inner.lock().unwrap();
        (inner.entries.values().map(|h| h.len()).sum(), inner.bytes)
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
        let block = (Path::from("raw/a"), 7);
        for id in 0..20 {
            cache.insert(&block, id, chunks.clone());
        }
        let (n, bytes) = cache.held();
        assert_eq!(n, 8);
        assert!(bytes <= one * 8 + one / 2);
        assert_eq!(cache.get_many(&block, [19]).len(), 1);
        assert!(cache.get_many(&block, [0]).is_empty(), "the first in went first");
        assert!(cache.get_many(&(Path::from("raw/a"), 8), [19]).is_empty(), "another data file: another block");
        // An entry over an eighth of the budget is not kept.
        let small = ChunkCache::new(one * 4);
        small.insert(&block, 0, chunks);
        assert_eq!(small.held().0, 0);
    }
}
