//! Storage maintenance, run by the maintenance loop, one run at a time (the maintenance
//! lock): cutting the head's aged data into blocks, merging small blocks into larger ones,
//! retention by time and by size, and the head checkpoint that lets the WAL go.
//!
//! * **Cut** (`cut_range`, the whole protocol in one place): once the head spans one and a
//!   half block ranges past the start of its oldest range window, that window is written as
//!   a block. The window is closed to commits first (`HeadFloor::close_before`, under the
//!   WAL lock); the block is written without locks; then, holding the layout and WAL locks,
//!   it is opened into the block set, the floor is marked durable and the window is dropped
//!   from the head, so no commit and no query sees the series half moved. If the block is
//!   not written, the window is reopened and stays in the head; a block that was renamed
//!   into place but cannot be opened is removed, so it never lies beside a second cut of the
//!   same window. A stop (`Tsdb::shutdown`) makes a cut give up between series.
//! * **Compaction**: blocks of a window of 3 and then 12 block ranges (6 h and 24 h by
//!   default) are merged once the head has moved past the window, series by series (see
//!   `strata_block::merge`, which also merges blocks that overlap). A window that holds a
//!   damaged block is left alone: merging its neighbours across it would leave two blocks
//!   over its range once it reads again. The merged block names its sources; they are
//!   deleted after it is in place, and if a crash comes between, the next open deletes them.
//! * **Retention**: blocks wholly older than `retention` are deleted, then the oldest while
//!   everything in the data directory exceeds `retention_size` (never for bytes deleting
//!   blocks cannot free), each renamed before it is removed; the head drops what is older
//!   than `retention`. Retention runs even when the cut failed, since a full disk is when
//!   it matters.
//! * **Checkpoint**: once a block was cut since the last head checkpoint and the WAL written
//!   since is larger than the head's chunks (see `checkpoint_due` for the other cases), a
//!   new checkpoint is written and the segments before it deleted.

use super::checkpoint::CheckpointStats;
use super::{Tsdb, TsdbError};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use strata_block::merge::merge_blocks;
use strata_block::{fault, BlockReader, BlockWriter};
use strata_model::time::now_ms;

/// Hands memory freed by a cut or compaction back to the system. glibc keeps what a
/// thread freed in that thread's arena, so the maintenance thread's transient memory (the
/// block's postings, the merge's series) and the head chunks a cut dropped would otherwise
/// stay resident: at 100 k series a cut then left 43 MB behind instead of 11 MB.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Compaction levels, in block ranges.
const LEVELS: [i64; 2] = [3, 12];

/// A checkpoint is not written for less WAL than this, however small the head.
const CHECKPOINT_MIN_WAL_BYTES: u64 = 4 << 10;
/// Without a block cut since the last checkpoint, one is due once the WAL since is this
/// many times the head's chunks, and at least [`UNCUT_MIN_WAL_BYTES`] (see `checkpoint_due`).
const UNCUT_WAL_PER_HEAD: u64 = 8;
const UNCUT_MIN_WAL_BYTES: u64 = 64 << 20;

/// How many series a cut writes between looks at whether the database is stopping.
const STOP_CHECK_SERIES: usize = 256;

/// What one maintenance run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MaintenanceOutcome {
    pub blocks_cut: usize,
    pub blocks_compacted: usize,
    pub blocks_deleted: usize,
    pub head_series_removed: usize,
    pub wal_segments_deleted: usize,
    /// A head checkpoint was written.
    pub checkpointed: bool,
}

impl Tsdb {
    /// Cuts, compacts, applies retention, then checkpoints the head when the WAL calls for
    /// it. A failure is logged with the data directory, counted, and turns
    /// [`is_healthy`](Tsdb::is_healthy) false until a run succeeds. Does nothing once the
    /// database is stopping.
    pub fn maintain(&self) -> Result<MaintenanceOutcome, TsdbError> {
        let _run = self.maintenance.lock();
        if self.is_stopping() {
            return Ok(MaintenanceOutcome::default());
        }
        let run = || -> Result<MaintenanceOutcome, TsdbError> {
            self.blocks.remove_leftovers()?;
            self.blocks.recheck_damaged();
            // A step that fails (a full disk) does not stop the later ones: size retention
            // may be what frees the space. The first failure is the run's.
            let cut = self.cut_head_blocks_locked();
            if matches!(cut, Err(TsdbError::Stopping)) {
                return Err(TsdbError::Stopping);
            }
            let compacted = if cut.is_ok() { self.compact_locked() } else { Ok(0) };
            let by_time = self.retain_by_time();
            // Segments the last checkpoint covers that a hold kept until now, then a new
            // checkpoint if the WAL calls for it: what the WAL frees, size retention sees.
            let covered = self.checkpoint_at.lock().map(|c| c.segment);
            let released = match covered {
                Some(segment) => self.wal.lock().wal.delete_before(segment).map_err(TsdbError::from),
                None => Ok(0),
            };
            let checkpoint = if self.checkpoint_due() { Some(self.write_checkpoint_locked()) } else { None };
            let by_size = self.retain_by_size();
            let (blocks_cut, blocks_compacted, (head_series_removed, by_time), released, by_size) =
                (cut?, compacted?, by_time?, released?, by_size?);
            let checkpoint = checkpoint.transpose()?;
            Ok(MaintenanceOutcome {
                blocks_cut,
                blocks_compacted,
                blocks_deleted: by_time + by_size,
                head_series_removed,
                wal_segments_deleted: released + checkpoint.map_or(0, |c| c.segments_deleted),
                checkpointed: checkpoint.is_some(),
            })
        };
        let out = match run() {
            // A stop interrupted a cut: its window stays in the head and the WAL.
            Err(TsdbError::Stopping) => return Ok(MaintenanceOutcome::default()),
            out => out,
        };
        if out.as_ref().is_ok_and(|o| o.blocks_cut + o.blocks_compacted + o.blocks_deleted > 0) {
            release_free_memory();
        }
        self.maintenance_failed.store(out.is_err(), Ordering::Relaxed);
        if out.is_err() {
            self.metrics.maintenance_failures.inc();
        }
        out
    }

    /// Writes a head checkpoint now and deletes the WAL segments it covers.
    pub fn checkpoint(&self) -> Result<CheckpointStats, TsdbError> {
        let _run = self.maintenance.lock();
        self.write_checkpoint_locked()
    }

    /// Whether a checkpoint is worth its cost now. One costs a pass over the whole head
    /// (chunks re-encoded, deflated, read back), and the WAL it frees grows about four times
    /// as fast as the head's chunks (a scraped sample takes 5-6 bytes there, 1-1.5 in a
    /// chunk): a checkpoint each time the WAL since the last one passed the head's chunks
    /// wrote every sample about four times over, a fifth of the scrape path's CPU. So, as
    /// Prometheus checkpoints at each head truncation, one is due once a block was cut since
    /// the last (most of the WAL then covers samples that are in a block) and the WAL since
    /// then outgrew the head's chunks: about one pass per block range, and the WAL holds
    /// up to about two block ranges of samples (some three times the head's chunks, where it
    /// was once). Without a cut, only a WAL past [`UNCUT_WAL_PER_HEAD`] times the head's
    /// chunks and [`UNCUT_MIN_WAL_BYTES`] is due: a head whose WAL is mostly labels (series
    /// churn), or one that is never cut. With `retention_size` set, or after a failed run,
    /// the old rule holds: due once the WAL outgrows the head.
    fn checkpoint_due(&self) -> bool {
        let since = self.checkpoint_at.lock().map(|c| c.segment);
        let wal = self.wal.lock().wal.bytes_from(since.unwrap_or(0));
        let head = self.head.stats().chunk_bytes as u64;
        // When disk is what matters (a size bound, or the last run failed, perhaps on a
        // full disk), the WAL is freed as soon as it outgrows the head, whatever it costs.
        let eager = self.opts.retention_size.is_some() || self.maintenance_failed.load(Ordering::Relaxed);
        if eager || self.floor.durable() > self.checkpoint_floor.load(Ordering::Relaxed) {
            wal > head.max(CHECKPOINT_MIN_WAL_BYTES)
        } else {
            wal > head.saturating_mul(UNCUT_WAL_PER_HEAD).max(UNCUT_MIN_WAL_BYTES)
        }
    }

    /// Writes every head range window the head has moved 1.5 ranges past as a block.
    /// Returns the blocks written.
    pub fn cut_head_blocks(&self) -> Result<usize, TsdbError> {
        let _run = self.maintenance.lock();
        self.cut_head_blocks_locked()
    }

    fn cut_head_blocks_locked(&self) -> Result<usize, TsdbError> {
        let range = self.block_range_ms();
        let mut written = 0;
        loop {
            let (lo, hi) = (self.head.min_time().max(self.floor.admit()), self.head.max_time());
            if hi == i64::MIN || lo == i64::MAX || lo > hi {
                return Ok(written);
            }
            let start = lo.div_euclid(range).saturating_mul(range);
            let end = start.saturating_add(range);
            if hi < end.saturating_add(range / 2) {
                return Ok(written);
            }
            written += usize::from(self.cut_range(start, end)?);
        }
    }

    /// Writes everything the head holds as blocks, up to the end of the window of its newest
    /// sample, then compacts: for a backfill (as `promtool tsdb create-blocks-from` does),
    /// so that everything is in blocks when it ends. The head then takes nothing before that
    /// window's end, so this is not for a live tier. Returns the blocks written.
    pub fn flush_head(&self) -> Result<usize, TsdbError> {
        let _run = self.maintenance.lock();
        let range = self.block_range_ms();
        let mut written = 0;
        loop {
            let (lo, hi) = (self.head.min_time().max(self.floor.admit()), self.head.max_time());
            if hi == i64::MIN || lo == i64::MAX || lo > hi {
                break;
            }
            let start = lo.div_euclid(range).saturating_mul(range);
            written += usize::from(self.cut_range(start, start.saturating_add(range))?);
        }
        self.compact_locked()?;
        if self.checkpoint_due() {
            self.write_checkpoint_locked()?;
        }
        Ok(written)
    }

    /// Moves the head's samples in `[start, end)` into a block (see the module doc for the
    /// protocol). Returns whether there was anything to write.
    fn cut_range(&self, start: i64, end: i64) -> Result<bool, TsdbError> {
        let reopen_at = {
            let _writer = self.wal.lock();
            self.floor.close_before(end)
        };
        fault::point("head-cut-writing");
        let written = self.write_cut(start, end);
        let moved = written.and_then(|meta| {
            self.at("cut-block-written");
            let _layout = self.layout.write();
            let _writer = self.wal.lock();
            if let Some(meta) = &meta {
                if let Err(e) = self.blocks.add(&meta.id) {
                    // Renamed into place but not readable now: gone, so that the window's next
                    // cut is its only block.
                    self.blocks.discard(&meta.id);
                    return Err(e.into());
                }
            }
            self.floor.mark_durable(end);
            self.head.truncate_before(end);
            Ok(meta)
        });
        match moved {
            Ok(meta) => {
                self.at("cut-truncated");
                if let Some(meta) = &meta {
                    tracing::info!(block = %meta.id, start, end, series = meta.stats.series, samples = meta.stats.samples, "head range written as a block");
                    self.metrics.blocks_written.inc();
                }
                Ok(meta.is_some())
            }
            Err(e) => {
                let _writer = self.wal.lock();
                self.floor.reopen(reopen_at);
                Err(e)
            }
        }
    }

    /// Writes the head's chunks in `[start, end)` as a block; `None` when there are none.
    fn write_cut(&self, start: i64, end: i64) -> Result<Option<strata_block::BlockMeta>, TsdbError> {
        // One series' chunk list at a time: at 500 k series, holding every list at once
        // would cost more than the block's whole index. A writer dropped on an error
        // removes what it wrote.
        let mut w = BlockWriter::create(self.blocks.dir(), start, end, 1, Vec::new())?;
        let mut any = false;
        for (i, s) in self.head.all_series_sorted().iter().enumerate() {
            self.at("cut-series");
            if i % STOP_CHECK_SERIES == 0 && self.is_stopping() {
                tracing::info!(
                    start,
                    end,
                    "stopping: the block cut gives up; its window stays in the head and the WAL"
                );
                return Err(TsdbError::Stopping);
            }
            let chunks = s.chunks_within(start, end);
            any |= !chunks.is_empty();
            w.add_series(&s.labels, &chunks)?;
        }
        if !any {
            return Ok(None);
        }
        w.set_metadata(self.head.all_metadata());
        let meta = w.finish()?;
        fault::point("head-cut-before-truncate");
        Ok(Some(meta))
    }

    /// Merges blocks of each level's windows that the head has moved past. Returns the
    /// blocks written.
    pub fn compact(&self) -> Result<usize, TsdbError> {
        let _run = self.maintenance.lock();
        self.compact_locked()
    }

    fn compact_locked(&self) -> Result<usize, TsdbError> {
        let range = self.block_range_ms();
        let floor = self.floor.durable();
        let damaged: Vec<(i64, i64)> = self.blocks.damaged().iter().filter_map(|d| d.range).collect();
        let mut written = 0;
        for mult in LEVELS {
            let r = range.saturating_mul(mult);
            loop {
                let mut windows: BTreeMap<i64, Vec<Arc<BlockReader>>> = BTreeMap::new();
                for b in self.blocks.healthy() {
                    let (lo, hi) = (b.meta().min_time, b.meta().max_time);
                    let w0 = lo.div_euclid(r).saturating_mul(r);
                    // A block that fills the window joins too, so late blocks written for an
                    // already compacted window are folded into it.
                    if hi - lo <= r && hi <= w0.saturating_add(r) && w0.saturating_add(r) <= floor {
                        windows.entry(w0).or_default().push(b);
                    }
                }
                let over_damage = |w0: i64| damaged.iter().any(|&(lo, hi)| lo < w0.saturating_add(r) && hi > w0);
                let Some((w0, group)) = windows.into_iter().find(|(w0, g)| g.len() >= 2 && !over_damage(*w0)) else {
                    break;
                };
                self.merge_group(w0, w0.saturating_add(r), &group)?;
                written += 1;
            }
        }
        Ok(written)
    }

    fn merge_group(&self, start: i64, end: i64, group: &[Arc<BlockReader>]) -> Result<(), TsdbError> {
        let sources: Vec<String> = group.iter().map(|b| b.id().to_string()).collect();
        let level = group.iter().map(|b| b.meta().level).max().unwrap_or(1).saturating_add(1);
        let mut w = BlockWriter::create(self.blocks.dir(), start, end, level, sources.clone())?;
        let inputs: Vec<&BlockReader> = group.iter().map(|b| b.as_ref()).collect();
        let stats = merge_blocks(&inputs, &mut w)?;
        // Every family any source knows; the newest source's word wins (they are in time order).
        let mut metadata = BTreeMap::new();
        for b in group {
            metadata.extend(b.metadata().iter().cloned());
        }
        w.set_metadata(metadata.into_iter().collect());
        let meta = w.finish()?;
        fault::point("compaction-before-delete");
        {
            let _layout = self.layout.write();
            if let Err(e) = self.blocks.add(&meta.id) {
                self.blocks.discard(&meta.id);
                return Err(e.into());
            }
            self.blocks.delete(&sources)?;
        }
        tracing::info!(block = %meta.id, start, end, sources = sources.len(), series = meta.stats.series, conflicts = stats.conflicts, "blocks compacted");
        self.metrics.blocks_compacted.inc();
        Ok(())
    }

    /// Drops data older than the retention window (counted back from the newest sample),
    /// then the oldest blocks while everything on disk exceeds `retention_size`. Returns
    /// the head series and the blocks removed.
    pub fn apply_retention(&self) -> Result<(usize, usize), TsdbError> {
        let _run = self.maintenance.lock();
        let (series, by_time) = self.retain_by_time()?;
        Ok((series, by_time + self.retain_by_size()?))
    }

    /// Blocks wholly older than the retention window, and the head's series with nothing
    /// newer, are removed. Returns the head series and the blocks removed.
    fn retain_by_time(&self) -> Result<(usize, usize), TsdbError> {
        let cutoff = self.retention_cutoff(now_ms());
        if cutoff == i64::MIN {
            return Ok((0, 0));
        }
        let mut past: Vec<_> = self.blocks.healthy().into_iter().filter(|b| b.meta().max_time <= cutoff).collect();
        // Blocks a forward upstream still needs stay, newest first, within their budget.
        if let Some((from, max_bytes)) = *self.block_hold.lock() {
            past.sort_by_key(|b| std::cmp::Reverse(b.meta().max_time));
            let (mut kept, mut full) = (0u64, false);
            past.retain(|b| {
                let m = b.meta();
                // Dropped oldest first: once one does not fit, no older one is kept.
                full = full || m.max_time <= from || kept.saturating_add(m.bytes()) > max_bytes;
                if !full {
                    kept = kept.saturating_add(m.bytes());
                }
                full
            });
            if kept > 0 {
                tracing::info!(
                    bytes = kept,
                    from,
                    "retention keeps blocks past the retention window for a forward upstream that is behind"
                );
            }
            let needed: Vec<_> = past.iter().filter(|b| b.meta().max_time > from).collect();
            if !needed.is_empty() {
                let samples: u64 = needed.iter().map(|b| b.meta().stats.samples).sum();
                let lo = needed.iter().map(|b| b.meta().min_time).min().unwrap_or(from);
                let hi = needed.iter().map(|b| b.meta().max_time).max().unwrap_or(from);
                self.metrics.held_samples_dropped.inc_by(samples);
                tracing::warn!(
                    max_bytes,
                    samples,
                    min_time = lo,
                    max_time = hi,
                    held_from = from,
                    "retention deletes blocks a hold still needs (past its disk budget: forward_max_disk, or the archive's max_disk); a forward upstream's forwarder also counts what it misses"
                );
            }
        }
        let doomed: Vec<String> = past.iter().map(|b| b.id().to_string()).collect();
        if !doomed.is_empty() {
            let _layout = self.layout.write();
            self.blocks.delete(&doomed)?;
            tracing::info!(blocks = doomed.len(), cutoff, "retention deleted blocks older than the retention window");
        }
        // Under the WAL lock: a commit sees a series either before its removal or marked
        // removed (and then appends to its live replacement), never half removed.
        let series = {
            let _writer = self.wal.lock();
            self.head.truncate_before(cutoff)
        };
        if series > 0 {
            tracing::info!(series, cutoff, "retention removed old series from the head");
        }
        Ok((series, doomed.len()))
    }

    /// The oldest healthy blocks, while the data directory exceeds `retention_size`. What
    /// deleting blocks cannot free (the WAL, the head checkpoint, damaged blocks kept for
    /// inspection) is not deleted for: when that alone exceeds the size, a warning says so.
    fn retain_by_size(&self) -> Result<usize, TsdbError> {
        let Some(limit) = self.opts.retention_size else { return Ok(0) };
        let healthy = self.blocks.healthy();
        let deletable: u64 = healthy.iter().map(|b| b.meta().bytes()).sum();
        let total = self.disk_bytes();
        let fixed = total.saturating_sub(deletable);
        if fixed > limit {
            tracing::warn!(
                limit,
                fixed,
                damaged = self.blocks.damaged_bytes(),
                "retention_size cannot be met: the WAL, the head checkpoint and damaged blocks alone exceed it; no block is deleted for them"
            );
            return Ok(0);
        }
        let mut over = total.saturating_sub(limit);
        let mut doomed = Vec::new();
        for b in &healthy {
            if over == 0 {
                break;
            }
            over = over.saturating_sub(b.meta().bytes());
            doomed.push(b.id().to_string());
        }
        if !doomed.is_empty() {
            let _layout = self.layout.write();
            self.blocks.delete(&doomed)?;
            tracing::info!(blocks = doomed.len(), limit, "retention deleted the oldest blocks for retention_size");
        }
        Ok(doomed.len())
    }
}
