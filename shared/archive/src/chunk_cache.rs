//! [`ChunkCache`]: a series' chunks of one block, as the reader built them from the block's
//! rows, kept for the next query. Decoding Parquet rows and encoding them as chunks is most
//! of what a query of the archive costs; dashboards ask for the same metrics again and
//! again, as the store-gateway's chunk cache in Thanos serves. Bounded by the bytes of the
//! chunks it holds: past the budget the entries put in first go first. An entry is keyed by
//! the block's folder and its data file's checksum, so a block written again is never
//! answered from what the cache held of the old one.

use object_store::path::Path;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use strata_chunk::Chunk;

/// A block (its folder and its data file's checksum) and a series id in it.
pub(crate) type Key = (Path, u32, i64);

pub(crate) struct ChunkCache {
    budget: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Arc<[Chunk]>>,
    order: VecDeque<Key>,
    bytes: usize,
}

/// What an entry costs: its chunks' bytes and their bookkeeping.
fn cost(chunks: &[Chunk]) -> usize {
    chunks.iter().map(|c| c.data.len() + 48).sum::<usize>() + 96
}

impl ChunkCache {
    pub(crate) fn new(budget: usize) -> Self {
        ChunkCache { budget, inner: Mutex::default() }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.budget > 0
    }

    pub(crate) fn get(&self, key: &Key) -> Option<Arc<[Chunk]>> {
        self.inner.lock().ok()?.entries.get(key).cloned()
    }

    /// Keeps `chunks` unless they alone would take more than an eighth of the budget.
    pub(crate) fn insert(&self, key: Key, chunks: Arc<[Chunk]>) {
        let size = cost(&chunks);
        if size > self.budget / 8 {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else { return };
        if let Some(old) = inner.entries.insert(key.clone(), chunks) {
            inner.bytes = inner.bytes.saturating_sub(cost(&old));
        } else {
            inner.order.push_back(key);
        }
        inner.bytes = inner.bytes.saturating_add(size);
        while inner.bytes > self.budget {
            let Some(first) = inner.order.pop_front() else { break };
            if let Some(gone) = inner.entries.remove(&first) {
                inner.bytes = inner.bytes.saturating_sub(cost(&gone));
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
        let one = cost(&chunks);
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
