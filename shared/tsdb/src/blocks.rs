//! [`BlockSet`]: the database's blocks on disk, `<data>/blocks/<id>/`, opened for queries.
//!
//! Opening cleans up what a crash can leave: `<id>.tmp` (a block write that did not finish)
//! and `<id>.deleted` (a deletion that did not finish) are removed, and a block that another
//! complete block lists among its `sources` (a compaction whose clean-up did not finish) is
//! deleted. A block that fails to open is reported by name, counted, and kept out of
//! queries and compaction; its directory stays for inspection, and its time range still
//! counts, so the head never takes samples that would overlap it.

use parking_lot::{Mutex, RwLock};
use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use strata_block::cache::ChunkCache;
use strata_block::{BlockError, BlockMeta, BlockReader};
use strata_model::MetricType;

pub const BLOCKS_DIR: &str = "blocks";
const TMP_SUFFIX: &str = ".tmp";
const DELETED_SUFFIX: &str = ".deleted";

/// A block that could not be used: its directory name and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedBlock {
    pub id: String,
    pub reason: String,
    /// The range its meta gives, when the meta could be read.
    pub range: Option<(i64, i64)>,
}

pub struct BlockSet {
    dir: PathBuf,
    /// Series read by queries, shared by every block, bounded in bytes.
    cache: Arc<ChunkCache>,
    /// Sorted by `min_time`.
    blocks: RwLock<Vec<Arc<BlockReader>>>,
    damaged: Mutex<Vec<DamagedBlock>>,
}

impl BlockSet {
    pub fn open(data_dir: &Path, cache_bytes: usize) -> Result<BlockSet, BlockError> {
        let dir = data_dir.join(BLOCKS_DIR);
        let cache = Arc::new(ChunkCache::new(cache_bytes));
        fs::create_dir_all(&dir).map_err(|e| BlockError::io(&dir, e))?;
        let mut opened = Vec::new();
        let mut damaged = Vec::new();
        let entries = fs::read_dir(&dir).map_err(|e| BlockError::io(&dir, e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if !path.is_dir() {
                continue;
            }
            if name.ends_with(TMP_SUFFIX) || name.ends_with(DELETED_SUFFIX) {
                tracing::info!(block = %path.display(), "removing what an interrupted block write or deletion left");
                fs::remove_dir_all(&path).map_err(|e| BlockError::io(&path, e))?;
                continue;
            }
            match BlockReader::open_with_cache(&path, Some(cache.clone())) {
                Ok(r) => opened.push(Arc::new(r)),
                Err(e) => {
                    tracing::error!(block = %path.display(), error = %e, "block cannot be read: kept out of queries and compaction");
                    let range = BlockMeta::read(&path).ok().map(|m| (m.min_time, m.max_time));
                    damaged.push(DamagedBlock { id: name, reason: e.to_string(), range });
                }
            }
        }
        let set = BlockSet { dir, cache, blocks: RwLock::new(Vec::new()), damaged: Mutex::new(damaged) };
        // A compaction wrote its block, then stopped before deleting the ones it replaces.
        let replaced: HashSet<String> = opened.iter().flat_map(|r| r.meta().sources.clone()).collect();
        let (stale, mut live): (Vec<_>, Vec<_>) = opened.into_iter().partition(|r| replaced.contains(r.id()));
        for r in stale {
            tracing::info!(block = r.id(), "deleting a block a finished compaction replaced");
            set.remove_dir(r.id())?;
        }
        live.sort_by_key(|r| (r.meta().min_time, r.meta().max_time));
        *set.blocks.write() = live;
        Ok(set)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Blocks that are read, in time order (not those found damaged since).
    pub fn healthy(&self) -> Vec<Arc<BlockReader>> {
        self.blocks.read().iter().filter(|r| !r.is_damaged()).cloned().collect()
    }

    pub fn overlapping(&self, mint: i64, maxt: i64) -> Vec<Arc<BlockReader>> {
        self.blocks.read().iter().filter(|r| !r.is_damaged() && r.meta().overlaps(mint, maxt)).cloned().collect()
    }

    /// Blocks found damaged, at open or since.
    pub fn damaged(&self) -> Vec<DamagedBlock> {
        let mut v = self.damaged.lock().clone();
        for r in self.blocks.read().iter().filter(|r| r.is_damaged()) {
            v.push(DamagedBlock {
                id: r.id().to_string(),
                reason: "a read found damage".into(),
                range: Some((r.meta().min_time, r.meta().max_time)),
            });
        }
        v
    }

    /// The end of the newest range any block covers, damaged ones included; `i64::MIN`
    /// without blocks. The head takes no sample before it.
    pub fn max_time(&self) -> i64 {
        let ok = self.blocks.read().iter().map(|r| r.meta().max_time).max().unwrap_or(i64::MIN);
        let bad = self.damaged.lock().iter().filter_map(|d| d.range.map(|r| r.1)).max().unwrap_or(i64::MIN);
        ok.max(bad)
    }

    /// The oldest sample any readable block holds; `i64::MAX` without blocks.
    pub fn min_sample_time(&self) -> i64 {
        self.blocks.read().iter().map(|r| r.meta().stats.min_sample_time).min().unwrap_or(i64::MAX)
    }

    /// The newest sample any readable block holds.
    pub fn max_sample_time(&self) -> i64 {
        self.blocks.read().iter().map(|r| r.meta().stats.max_sample_time).max().unwrap_or(i64::MIN)
    }

    pub fn disk_bytes(&self) -> u64 {
        self.blocks.read().iter().map(|r| r.meta().bytes()).sum()
    }

    pub fn memory_bytes(&self) -> usize {
        self.blocks.read().iter().map(|r| r.memory_bytes()).sum()
    }

    pub fn len(&self) -> usize {
        self.blocks.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.read().is_empty()
    }

    /// The metric type the newest block that knows the metric (or its family) recorded.
    pub fn metric_type(&self, metric: &str) -> Option<MetricType> {
        let blocks = self.blocks.read();
        blocks.iter().rev().find_map(|r| {
            // Written sorted by family (the head's `all_metadata`).
            let meta = r.metadata();
            let get = |family: &str| {
                meta.binary_search_by(|(f, _)| f.as_str().cmp(family)).ok().map(|i| meta[i].1.metric_type)
            };
            crate::head::lookup_type(get, metric)
        })
    }

    /// Opens a block just written under this set's directory and adds it.
    pub fn add(&self, id: &str) -> Result<(), BlockError> {
        let r = BlockReader::open_with_cache(&self.dir.join(id), Some(self.cache.clone()))?;
        let mut b = self.blocks.write();
        b.push(Arc::new(r));
        b.sort_by_key(|r| (r.meta().min_time, r.meta().max_time));
        Ok(())
    }

    pub fn cache(&self) -> &ChunkCache {
        &self.cache
    }

    /// Takes blocks out of queries and deletes them: each directory is first renamed to
    /// `<id>.deleted`, so a crash mid-way never leaves half a block that looks whole.
    pub fn delete(&self, ids: &[String]) -> Result<(), BlockError> {
        self.blocks.write().retain(|r| {
            let doomed = ids.iter().any(|i| i == r.id());
            if doomed {
                r.forget_cached();
            }
            !doomed
        });
        for id in ids {
            self.remove_dir(id)?;
        }
        Ok(())
    }

    fn remove_dir(&self, id: &str) -> Result<(), BlockError> {
        let path = self.dir.join(id);
        let gone = self.dir.join(format!("{id}{DELETED_SUFFIX}"));
        fs::rename(&path, &gone).map_err(|e| BlockError::io(&path, e))?;
        if let Ok(d) = fs::File::open(&self.dir) {
            let _ = d.sync_all();
        }
        strata_block::fault::point("block-delete-after-rename");
        fs::remove_dir_all(&gone).map_err(|e| BlockError::io(&gone, e))
    }
}
