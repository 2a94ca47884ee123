//! Storage maintenance, run by the maintenance loop: cutting the head's aged data into
//! blocks, merging small blocks into larger ones, and retention by time and by size.
//!
//! * **Cut**: once the head spans one and a half block ranges past the start of its oldest
//!   range window, that window is written as a block. The floor (the oldest time the head
//!   takes) is raised first, under the WAL lock, so nothing enters the range being written;
//!   the head and the WAL drop the range only after the block is on disk. A crash between
//!   the two leaves the samples in both, and replay skips those before the floor.
//! * **Compaction**: blocks of a window of 3 and then 12 block ranges (6 h and 24 h by
//!   default) are merged once the head has moved past the window, series by series (see
//!   `strata_block::merge`). The merged block names its sources; they are deleted after it
//!   is in place, and if a crash comes between, the next open deletes them.
//! * **Retention**: blocks wholly older than `retention` are deleted, then the oldest while
//!   blocks and WAL exceed `retention_size`, each renamed before it is removed.

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

/// What one maintenance run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MaintenanceOutcome {
    pub blocks_cut: usize,
    pub blocks_compacted: usize,
    pub blocks_deleted: usize,
    pub head_series_removed: usize,
    pub wal_segments_deleted: usize,
}

impl Tsdb {
    /// Cuts, compacts, then applies retention. A failure is logged with the data directory,
    /// counted, and turns [`is_healthy`](Tsdb::is_healthy) false until a run succeeds.
    pub fn maintain(&self) -> Result<MaintenanceOutcome, TsdbError> {
        let run = || -> Result<MaintenanceOutcome, TsdbError> {
            let (blocks_cut, cut_segments) = self.cut_head_blocks()?;
            let blocks_compacted = self.compact()?;
            let (head_series_removed, wal_segments_deleted, blocks_deleted) = self.apply_retention()?;
            Ok(MaintenanceOutcome {
                blocks_cut,
                blocks_compacted,
                blocks_deleted,
                head_series_removed,
                wal_segments_deleted: wal_segments_deleted + cut_segments,
            })
        };
        let out = run();
        if out.as_ref().is_ok_and(|o| o.blocks_cut + o.blocks_compacted + o.blocks_deleted > 0) {
            release_free_memory();
        }
        self.maintenance_failed.store(out.is_err(), Ordering::Relaxed);
        if out.is_err() {
            self.metrics.maintenance_failures.inc();
        }
        out
    }

    /// Writes every head range window the head has moved 1.5 ranges past as a block.
    /// Returns the blocks written and the WAL segments deleted.
    pub fn cut_head_blocks(&self) -> Result<(usize, usize), TsdbError> {
        let range = self.block_range_ms();
        let (mut written, mut segments) = (0, 0);
        loop {
            let (lo, hi) = (self.head.min_time().max(self.head_floor.load(Ordering::Relaxed)), self.head.max_time());
            if hi == i64::MIN || lo == i64::MAX || lo > hi {
                return Ok((written, segments));
            }
            let start = lo.div_euclid(range).saturating_mul(range);
            let end = start.saturating_add(range);
            if hi < end.saturating_add(range / 2) {
                return Ok((written, segments));
            }
            let (any, deleted) = self.cut_range(start, end)?;
            written += usize::from(any);
            segments += deleted;
        }
    }

    /// Writes everything the head holds as blocks, up to the end of the window of its newest
    /// sample, then compacts: for a backfill (as `promtool tsdb create-blocks-from` does),
    /// whose WAL holds whole series rather than time slices and cannot be deleted until
    /// every window is cut. The head then takes nothing before that window's end, so this
    /// is not for a live tier. Returns the blocks written.
    pub fn flush_head(&self) -> Result<usize, TsdbError> {
        let range = self.block_range_ms();
        let mut written = 0;
        loop {
            let (lo, hi) = (self.head.min_time().max(self.head_floor.load(Ordering::Relaxed)), self.head.max_time());
            if hi == i64::MIN || lo == i64::MAX || lo > hi {
                break;
            }
            let start = lo.div_euclid(range).saturating_mul(range);
            written += usize::from(self.cut_range(start, start.saturating_add(range))?.0);
        }
        self.compact()?;
        Ok(written)
    }

    /// Persists the head's samples in `[start, end)` as a block and drops them from the head
    /// and the WAL. Returns whether there was anything to write, and the WAL segments deleted.
    fn cut_range(&self, start: i64, end: i64) -> Result<(bool, usize), TsdbError> {
        let previous_floor = {
            let _writer = self.wal.lock();
            self.head_floor.fetch_max(end, Ordering::Relaxed)
        };
        let out = self.write_cut(start, end);
        let in_place = || self.blocks.healthy().iter().any(|b| b.meta().min_time == start && b.meta().max_time == end);
        if out.is_err() && !in_place() {
            // The window is not in a block: the floor goes back, or the next run would start
            // past the window and a later cut's truncation would drop it from the head unwritten.
            let _writer = self.wal.lock();
            self.head_floor.store(previous_floor, Ordering::Relaxed);
        }
        out
    }

    fn write_cut(&self, start: i64, end: i64) -> Result<(bool, usize), TsdbError> {
        // One series' chunk list at a time: at 500 k series, holding every list at once
        // would cost more than the block's whole index.
        let mut w = BlockWriter::create(self.blocks.dir(), start, end, 1, Vec::new())?;
        let mut any = false;
        for s in self.head.all_series_sorted() {
            let chunks = s.chunks_within(start, end);
            any |= !chunks.is_empty();
            if let Err(e) = w.add_series(&s.labels, &chunks) {
                w.abort();
                return Err(e.into());
            }
        }
        if !any {
            w.abort();
        } else {
            w.set_metadata(self.head.all_metadata());
            let meta = w.finish()?;
            fault::point("head-cut-before-truncate");
            let _layout = self.layout.write();
            self.blocks.add(&meta.id)?;
            self.head.truncate_before(end);
            tracing::info!(block = %meta.id, start, end, series = meta.stats.series, samples = meta.stats.samples, "head range written as a block");
            self.metrics.blocks_written.inc();
        }
        let mut writer = self.wal.lock();
        self.head.truncate_before(end);
        let deleted = self.truncate_wal(&mut writer.wal, end)?;
        Ok((any, deleted))
    }

    /// Merges blocks of each level's windows that the head has moved past. Returns the
    /// blocks written.
    pub fn compact(&self) -> Result<usize, TsdbError> {
        let range = self.block_range_ms();
        let floor = self.head_floor.load(Ordering::Relaxed);
        let mut written = 0;
        for mult in LEVELS {
            let r = range.saturating_mul(mult);
            loop {
                let mut windows: BTreeMap<i64, Vec<Arc<BlockReader>>> = BTreeMap::new();
                for b in self.blocks.healthy() {
                    let (lo, hi) = (b.meta().min_time, b.meta().max_time);
                    let w0 = lo.div_euclid(r).saturating_mul(r);
                    if hi - lo < r && hi <= w0.saturating_add(r) && w0.saturating_add(r) <= floor {
                        windows.entry(w0).or_default().push(b);
                    }
                }
                let Some((w0, group)) = windows.into_iter().find(|(_, g)| g.len() >= 2) else { break };
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
        if let Err(e) = merge_blocks(&inputs, &mut w) {
            w.abort();
            return Err(e.into());
        }
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
            self.blocks.add(&meta.id)?;
            self.blocks.delete(&sources)?;
        }
        tracing::info!(block = %meta.id, start, end, sources = sources.len(), series = meta.stats.series, "blocks compacted");
        self.metrics.blocks_compacted.inc();
        Ok(())
    }

    /// Drops data older than the retention window (counted back from the newest sample),
    /// then the oldest blocks while blocks and WAL exceed `retention_size`. Returns the head
    /// series, WAL segments and blocks removed.
    pub fn apply_retention(&self) -> Result<(usize, usize, usize), TsdbError> {
        let cutoff = self.retention_cutoff(now_ms());
        let mut doomed: Vec<String> = self
            .blocks
            .healthy()
            .iter()
            .filter(|b| cutoff > i64::MIN && b.meta().max_time <= cutoff)
            .map(|b| b.id().to_string())
            .collect();
        if let Some(limit) = self.opts.retention_size {
            let mut total = self.blocks.disk_bytes().saturating_add(self.wal_disk_bytes());
            for b in self.blocks.healthy() {
                if total <= limit {
                    break;
                }
                total = total.saturating_sub(b.meta().bytes());
                if !doomed.iter().any(|d| d == b.id()) {
                    doomed.push(b.id().to_string());
                }
            }
        }
        if !doomed.is_empty() {
            self.blocks.delete(&doomed)?;
            tracing::info!(blocks = doomed.len(), "retention deleted blocks");
        }
        // The WAL before the head's floor is in blocks (a hold may have kept it until now).
        let wal_cutoff = cutoff.max(self.head_floor.load(Ordering::Relaxed));
        if wal_cutoff == i64::MIN {
            return Ok((0, 0, doomed.len()));
        }
        // Under the WAL lock: a commit sees a series either before its removal or marked
        // removed (and then appends to its live replacement), never half removed.
        let mut writer = self.wal.lock();
        let series = if cutoff > i64::MIN { self.head.truncate_before(cutoff) } else { 0 };
        let segments = self.truncate_wal(&mut writer.wal, wal_cutoff)?;
        drop(writer);
        if series > 0 || segments > 0 {
            tracing::info!(series, segments, cutoff, "retention removed old data");
        }
        Ok((series, segments, doomed.len()))
    }
}
