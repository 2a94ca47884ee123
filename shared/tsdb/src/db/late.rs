//! Late samples: older than the head admits (its floor, the end of the newest block cut
//! from it) but within retention. A regional receives them when one edge's backlog
//! arrives after the others moved its head on; refusing them would lose data the edge held
//! for exactly this. They are written as blocks instead, one per block-range window they
//! fall in, whole and `fsync`ed before the call returns. Queries merge overlapping blocks
//! sample by sample (each timestamp once; where values differ the older block's are used,
//! and the answer says so), and compaction folds them into their window's block, a full
//! one included. A resent late batch is written again (the blocks are not searched for it
//! first); reads and compaction keep each sample once.

use super::{duration_ms, now_ms, Tsdb, TsdbError};
use std::collections::BTreeMap;
use strata_block::BlockWriter;
use strata_chunk::Chunk;
use strata_model::{Labels, Sample};

/// What [`Tsdb::commit_late`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LateOutcome {
    /// Samples written into blocks.
    pub written: usize,
    /// Samples older than retention keeps (refused, as the head refuses them).
    pub too_old: usize,
    /// Samples the head admits after all (its floor moved back, or they were never late):
    /// left for [`Tsdb::commit`].
    pub not_late: usize,
    pub blocks: usize,
}

impl Tsdb {
    /// Writes samples older than the head admits, each series' in time order, as blocks
    /// (see the module). Runs under the maintenance lock, so no cut, compaction or
    /// retention runs meanwhile.
    pub fn commit_late(&self, series: &[(Labels, Vec<Sample>)]) -> Result<LateOutcome, TsdbError> {
        let _run = self.maintenance.lock();
        let mut out = LateOutcome::default();
        let floor = self.floor.admit();
        let cutoff = self.retention_cutoff(now_ms());
        let range = duration_ms(self.opts.block_range).max(1);
        // Window start → labels → samples, so each block is written in label order.
        let mut windows: BTreeMap<i64, BTreeMap<&Labels, Vec<Sample>>> = BTreeMap::new();
        for (labels, samples) in series {
            for s in samples {
                // Past retention first: the head refuses those whatever its floor.
                if s.t < cutoff {
                    out.too_old += 1;
                } else if s.t >= floor {
                    out.not_late += 1;
                } else {
                    let w = s.t.div_euclid(range).saturating_mul(range);
                    windows.entry(w).or_default().entry(labels).or_default().push(*s);
                }
            }
        }
        for (start, by_series) in windows {
            let end = start.saturating_add(range);
            let mut w = BlockWriter::create(self.blocks.dir(), start, end, 1, Vec::new())?;
            let mut n = 0;
            for (labels, mut samples) in by_series {
                samples.sort_by_key(|s| s.t);
                samples.dedup_by_key(|s| s.t);
                n += samples.len();
                w.add_series(labels, &Chunk::encode_samples(samples))?;
            }
            w.set_metadata(self.head.all_metadata());
            let meta = w.finish()?;
            {
                let _layout = self.layout.write();
                if let Err(e) = self.blocks.add(&meta.id) {
                    self.blocks.discard(&meta.id);
                    return Err(e.into());
                }
            }
            tracing::info!(block = %meta.id, start, end, samples = n, "late samples written as a block");
            self.metrics.late_samples.inc_by(n as u64);
            out.written += n;
            out.blocks += 1;
        }
        Ok(out)
    }
}
