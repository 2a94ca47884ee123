//! [`BlockCache`]: what a reader derived from one block's series (its windows decoded into
//! columns, its chunks read from Parquet rows), kept for the next query. Decoding is most
//! of what answering from aggregates costs, and dashboards ask for the same metrics again
//! and again, as Thanos' store-gateway caches serve. Bounded by the bytes its entries
//! hold: past the budget the entries put in first go first. The block key is whatever
//! names a block's contents for good (a reader's process-unique number, an archive
//! block's folder and checksum), so a block written again is never answered from what the
//! cache held of the old one.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use strata_chunk::Chunk;

/// What an entry costs in memory, roughly.
pub trait Weighed {
    fn cost(&self) -> usize;
}

impl Weighed for Arc<[Chunk]> {
    fn cost(&self) -> usize {
        self.iter().map(|c| c.data.len() + 48).sum::<usize>() + 96
    }
}

pub struct BlockCache<K, V> {
    budget: usize,
    inner: Mutex<Inner<K, V>>,
}

/// Entries by block, then series id: a query looks a block up once for all its series.
struct Inner<K, V> {
    // (Series ids are ours, not a client's: a fast hash.)
    entries: HashMap<K, HashMap<i64, V, foldhash::fast::RandomState>>,
    order: VecDeque<(K, i64)>,
    bytes: usize,
}

impl<K: Hash + Eq + Clone, V: Weighed + Clone> BlockCache<K, V> {
    pub fn new(budget: usize) -> Self {
        BlockCache { budget, inner: Mutex::new(Inner { entries: HashMap::new(), order: VecDeque::new(), bytes: 0 }) }
    }

    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// The entries held of `ids` in `block`.
    pub fn get_many(&self, block: &K, ids: impl IntoIterator<Item = i64>) -> Vec<(i64, V)> {
        let Ok(inner) = self.inner.lock() else { return Vec::new() };
        let Some(held) = inner.entries.get(block) else { return Vec::new() };
        ids.into_iter().filter_map(|id| held.get(&id).map(|v| (id, v.clone()))).collect()
    }

    /// The entry held of `id` in `block`.
    pub fn get(&self, block: &K, id: i64) -> Option<V> {
        let inner = self.inner.lock().ok()?;
        inner.entries.get(block)?.get(&id).cloned()
    }

    /// Keeps `value` unless it alone would take more than an eighth of the budget.
    pub fn insert(&self, block: &K, id: i64, value: V) {
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

    /// Drops what is held of `blocks` (deleted: nothing will ask for them again), in one
    /// pass over the eviction order.
    pub fn forget(&self, blocks: &[K]) {
        let Ok(mut inner) = self.inner.lock() else { return };
        let inner = &mut *inner;
        let mut any = false;
        for block in blocks {
            let Some(held) = inner.entries.remove(block) else { continue };
            let freed: usize = held.values().map(Weighed::cost).sum();
            inner.bytes = inner.bytes.saturating_sub(freed);
            any = true;
        }
        if any {
            let entries = &inner.entries;
            inner.order.retain(|(b, id)| entries.get(b).is_some_and(|h| h.contains_key(id)));
        }
    }

    /// (entries, bytes) held.
    pub fn held(&self) -> (usize, usize) {
        match self.inner.lock() {
            Ok(inner) => (inner.entries.values().map(|h| h.len()).sum(), inner.bytes),
            Err(_) => (0, 0),
        }
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
        let cache: BlockCache<(String, u32), Arc<[Chunk]>> = BlockCache::new(one * 8 + one / 2);
        let block = ("raw/a".to_string(), 7);
        for id in 0..20 {
            cache.insert(&block, id, chunks.clone());
        }
        let (n, bytes) = cache.held();
        assert_eq!(n, 8);
        assert!(bytes <= one * 8 + one / 2);
        assert_eq!(cache.get_many(&block, [19]).len(), 1);
        assert!(cache.get(&block, 0).is_none(), "the first in went first");
        assert!(cache.get(&("raw/a".to_string(), 8), 19).is_none(), "another data file: another block");
        // A block deleted is forgotten, and its room given back.
        cache.forget(std::slice::from_ref(&block));
        assert_eq!(cache.held(), (0, 0));
        cache.insert(&block, 1, chunks.clone());
        assert_eq!(cache.held().0, 1, "a block inserted again after being forgotten");
        // The eviction order forgot the old entries too: the oldest left goes first.
        let other = ("raw/b".to_string(), 7);
        for id in 0..8 {
            cache.insert(&other, id, chunks.clone());
        }
        assert!(cache.get(&block, 1).is_none(), "the oldest entry went first");
        assert_eq!(cache.held().0, 8);
        // An entry over an eighth of the budget is not kept.
        let small: BlockCache<u64, Arc<[Chunk]>> = BlockCache::new(one * 4);
        small.insert(&1, 0, chunks);
        assert_eq!(small.held().0, 0);
    }
}
