//! [`BlockSet`]: the database's blocks on disk, `<data>/blocks/<id>/`, opened for queries.
//!
//! Opening cleans up what a crash can leave: `<id>.tmp` (a block write that did not finish)
//! and `<id>.deleted` (a deletion that did not finish) are removed, and a block that another
//! complete block lists among its `sources` (a compaction whose clean-up did not finish) is
//! deleted. Maintenance removes such leftovers too, before each run.
//!
//! A block that cannot be read (at open, or by reads that keep failing after retries) is
//! damaged: named in the log and in every query whose range it overlaps, kept out of
//! queries and compaction, and checked again every [`RECHECK_AFTER`] (a disk that failed
//! for a while gives the block back). Its directory stays for inspection, and its time
//! range still counts, so the head never takes samples that would overlap it and
//! compaction never merges across it.

use parking_lot::{Mutex, RwLock};
use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_block::cache::ChunkCache;
use strata_block::{BlockError, BlockMeta, BlockReader};
use strata_model::MetricType;

pub const BLOCKS_DIR: &str = "blocks";
const TMP_SUFFIX: &str = ".tmp";
const DELETED_SUFFIX: &str = ".deleted";
/// A damaged block is read again (or opened again) at most this often.
pub const RECHECK_AFTER: Duration = Duration::from_secs(600);
/// Tries to open a block before it is called damaged.
const OPEN_ATTEMPTS: u32 = 3;

/// A block that could not be used: its directory name and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedBlock {
    pub id: String,
    pub reason: String,
    /// The range its meta gives, when the meta could be read.
    pub range: Option<(i64, i64)>,
}

/// A block that failed to open, and when it was last tried.
struct Unopened {
    block: DamagedBlock,
    tried: Instant,
}

pub struct BlockSet {
    dir: PathBuf,
    /// Series read by queries, shared by every block, bounded in bytes.
    cache: Arc<ChunkCache>,
    /// Sorted by `min_time`.
    blocks: RwLock<Vec<Arc<BlockReader>>>,
    unopened: Mutex<Vec<Unopened>>,
}

fn open_with_retries(path: &Path, cache: &Arc<ChunkCache>) -> Result<BlockReader, BlockError> {
    let mut attempt = 1;
    loop {
        match BlockReader::open_with_cache(path, Some(cache.clone())) {
            Ok(r) => return Ok(r),
            Err(e) if attempt < OPEN_ATTEMPTS => {
                tracing::warn!(block = %path.display(), error = %e, attempt, "block failed to open: retrying");
                std::thread::sleep(Duration::from_millis(5 * u64::from(attempt)));
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Bytes of every file under `p`.
fn tree_bytes(p: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(p) else { return 0 };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => tree_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

impl BlockSet {
    pub fn open(data_dir: &Path, cache_bytes: usize) -> Result<BlockSet, BlockError> {
        let dir = data_dir.join(BLOCKS_DIR);
        let cache = Arc::new(ChunkCache::new(cache_bytes));
        fs::create_dir_all(&dir).map_err(|e| BlockError::io(&dir, e))?;
        let set = BlockSet { dir, cache, blocks: RwLock::new(Vec::new()), unopened: Mutex::new(Vec::new()) };
        set.remove_leftovers()?;
        let mut opened = Vec::new();
        let entries = fs::read_dir(&set.dir).map_err(|e| BlockError::io(&set.dir, e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            match open_with_retries(&path, &set.cache) {
                Ok(r) => opened.push(Arc::new(r)),
                Err(e) => {
                    tracing::error!(block = %path.display(), error = %e, "block cannot be read: kept out of queries and compaction");
                    set.note_unopened(&path, e.to_string());
                }
            }
        }
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

    fn note_unopened(&self, path: &Path, reason: String) {
        let id = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let range = BlockMeta::read(path).ok().map(|m| (m.min_time, m.max_time));
        let mut u = self.unopened.lock();
        u.retain(|x| x.block.id != id);
        u.push(Unopened { block: DamagedBlock { id, reason, range }, tried: Instant::now() });
    }

    /// Removes what an interrupted block write or deletion left (`<id>.tmp`,
    /// `<id>.deleted`). Called when nothing is writing blocks: at open and before each
    /// maintenance run.
    pub fn remove_leftovers(&self) -> Result<(), BlockError> {
        let entries = fs::read_dir(&self.dir).map_err(|e| BlockError::io(&self.dir, e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if path.is_dir() && (name.ends_with(TMP_SUFFIX) || name.ends_with(DELETED_SUFFIX)) {
                tracing::info!(block = %path.display(), "removing what an interrupted block write or deletion left");
                fs::remove_dir_all(&path).map_err(|e| BlockError::io(&path, e))?;
            }
        }
        Ok(())
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
        let mut v: Vec<DamagedBlock> = self.unopened.lock().iter().map(|u| u.block.clone()).collect();
        for r in self.blocks.read().iter() {
            if let Some((reason, _)) = r.damage() {
                v.push(DamagedBlock {
                    id: r.id().to_string(),
                    reason,
                    range: Some((r.meta().min_time, r.meta().max_time)),
                });
            }
        }
        v
    }

    /// Damaged blocks whose range overlaps `[mint, maxt]`, or is unknown: what a query over
    /// that range misses.
    pub fn damaged_overlapping(&self, mint: i64, maxt: i64) -> Vec<DamagedBlock> {
        let mut v = self.damaged();
        v.retain(|d| d.range.is_none_or(|(lo, hi)| lo <= maxt && mint < hi));
        v
    }

    /// Reads damaged blocks again (at most every [`RECHECK_AFTER`] each): one that now
    /// reads whole, or opens, is back in queries and compaction.
    pub fn recheck_damaged(&self) {
        for r in self.blocks.read().iter() {
            if r.damage().is_some_and(|(_, age)| age >= RECHECK_AFTER) {
                // Whole again, or still damaged (logged, and the wait starts over).
                r.verify();
            }
        }
        let due: Vec<DamagedBlock> = {
            let u = self.unopened.lock();
            u.iter().filter(|u| u.tried.elapsed() >= RECHECK_AFTER).map(|u| u.block.clone()).collect()
        };
        for d in due {
            let path = self.dir.join(&d.id);
            if !path.is_dir() {
                self.unopened.lock().retain(|u| u.block.id != d.id);
                continue;
            }
            match open_with_retries(&path, &self.cache) {
                Ok(r) if r.verify() => {
                    tracing::info!(block = %path.display(), "a block that failed to open reads whole now: back in queries");
                    self.unopened.lock().retain(|u| u.block.id != d.id);
                    let mut b = self.blocks.write();
                    b.push(Arc::new(r));
                    b.sort_by_key(|r| (r.meta().min_time, r.meta().max_time));
                }
                Ok(_) => self.note_unopened(&path, d.reason.clone()),
                Err(e) => self.note_unopened(&path, e.to_string()),
            }
        }
    }

    /// The end of the newest range any block covers, damaged ones included; `i64::MIN`
    /// without blocks. The head takes no sample before it.
    pub fn max_time(&self) -> i64 {
        let ok = self.blocks.read().iter().map(|r| r.meta().max_time).max().unwrap_or(i64::MIN);
        let bad = self.unopened.lock().iter().filter_map(|u| u.block.range.map(|r| r.1)).max().unwrap_or(i64::MIN);
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

    /// Bytes of everything in the blocks directory: the blocks, damaged ones, and whatever
    /// else takes space there (a write that could not clean up), as `retention_size` must
    /// count it.
    pub fn disk_bytes(&self) -> u64 {
        tree_bytes(&self.dir)
    }

    /// Bytes of the damaged blocks' directories (kept for inspection, never deleted by
    /// retention).
    pub fn damaged_bytes(&self) -> u64 {
        self.damaged().iter().map(|d| tree_bytes(&self.dir.join(&d.id))).sum()
    }

    /// [`min_time`](Self::min_time), or `None` when a damaged block's range is unknown
    /// (it may hold anything): what a caller claiming "nothing older is held" reads.
    pub fn oldest_held(&self) -> Option<i64> {
        if self.damaged().iter().any(|d| d.range.is_none()) {
            return None;
        }
        Some(self.min_time())
    }

    /// The oldest time any block covers, those that could not be opened included (their
    /// meta's range, when it was readable); `i64::MAX` without blocks.
    pub fn min_time(&self) -> i64 {
        let ok = self.blocks.read().iter().map(|r| r.meta().min_time).min().unwrap_or(i64::MAX);
        let bad = self.unopened.lock().iter().filter_map(|u| u.block.range.map(|r| r.0)).min().unwrap_or(i64::MAX);
        ok.min(bad)
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
        let r = open_with_retries(&self.dir.join(id), &self.cache)?;
        let mut b = self.blocks.write();
        b.push(Arc::new(r));
        b.sort_by_key(|r| (r.meta().min_time, r.meta().max_time));
        Ok(())
    }

    /// Removes a block written but never added (it could not be opened): its data is still
    /// where it came from. A failure is logged; the block is then found at the next open,
    /// where overlapping blocks merge on read.
    pub fn discard(&self, id: &str) {
        if let Err(e) = self.remove_dir(id) {
            tracing::error!(block = id, error = %e, "could not remove a block that failed to open after it was written");
        }
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
        self.unopened.lock().retain(|u| !ids.contains(&u.block.id));
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
