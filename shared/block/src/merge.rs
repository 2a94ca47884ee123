//! Compaction's mechanism: several blocks merged into one, series by series, so memory
//! holds one series of each input at a time.
//!
//! A series' chunks are joined in time order. Blocks normally cover disjoint ranges; when
//! they overlap (a window cut twice, a block restored beside the one compacted over it),
//! the overlapping chunks are merged sample by sample, each timestamp once
//! (`strata_chunk::merge`), so a merged block never holds chunks out of order. Neighbouring
//! chunks that together fit
//! in one ([`CHUNK_MAX_SAMPLES`]) are re-encoded as one, since a block cut from the head
//! ends every series' chunk at the block boundary: without this, a day compacted from 2-hour
//! blocks would keep twelve part-filled chunks per series where eight full ones serve.

use crate::{BlockError, BlockReader, BlockSeries, BlockWriter};
use strata_chunk::merge::{in_order, merge_sources};
use strata_chunk::{Chunk, ChunkAppender, CHUNK_MAX_SAMPLES};
use strata_model::Labels;

/// What a merge wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MergeStats {
    pub series: u64,
    /// Timestamps where overlapping inputs held different values (the earlier input's
    /// value was kept).
    pub conflicts: u64,
}

/// Merges `inputs` (sorted by time; on a conflict the earlier wins) into `out`.
pub fn merge_blocks(inputs: &[&BlockReader], out: &mut BlockWriter) -> Result<MergeStats, BlockError> {
    let mut next: Vec<usize> = vec![0; inputs.len()];
    let mut current: Vec<Option<BlockSeries>> = Vec::with_capacity(inputs.len());
    for r in inputs {
        current.push(if r.num_series() > 0 { Some(r.series_at(0)?) } else { None });
    }
    let mut stats = MergeStats::default();
    while let Some(labels) = current.iter().flatten().map(|s| &s.labels).min().cloned() {
        let mut sources: Vec<Vec<Chunk>> = Vec::new();
        for (i, slot) in current.iter_mut().enumerate() {
            if slot.as_ref().is_some_and(|s| s.labels == labels) {
                if let Some(s) = slot.take() {
                    sources.push(s.chunks);
                }
                next[i] += 1;
                if next[i] < inputs[i].num_series() {
                    *slot = Some(inputs[i].series_at(next[i])?);
                }
            }
        }
        let mut chunks: Vec<Chunk> = sources.concat();
        if !in_order(&chunks) {
            let merged = merge_sources(sources).map_err(|e| BlockError::Corrupt {
                block: "(merge input)".into(),
                reason: format!("series {labels}: {e}"),
            })?;
            if merged.conflicts > 0 {
                tracing::warn!(series = %labels, conflicts = merged.conflicts, "overlapping blocks hold different values at some timestamps: the older block's are kept");
            }
            stats.conflicts += merged.conflicts;
            chunks = merged.chunks;
        }
        let chunks = rechunk(&labels, chunks)?;
        out.add_series(&labels, &chunks)?;
        stats.series += 1;
    }
    Ok(stats)
}

/// Re-flows a series' chunks into full ones when that takes fewer chunks: a block cut from
/// the head ends each series' chunk at the block boundary, so the sources' chunks are often
/// part-filled (`[960, 480]` per 2 h at 5 s). Chunks already as few as they can be are kept
/// as they are, never decoded.
pub fn rechunk(labels: &Labels, chunks: Vec<Chunk>) -> Result<Vec<Chunk>, BlockError> {
    let total: usize = chunks.iter().map(|c| c.n as usize).sum();
    let fewest = total.div_ceil(CHUNK_MAX_SAMPLES as usize);
    if chunks.len() <= fewest {
        return Ok(chunks);
    }
    let mut out: Vec<Chunk> = Vec::with_capacity(fewest);
    let mut a = ChunkAppender::new();
    for c in &chunks {
        let samples = c.decode().map_err(|e| BlockError::Corrupt {
            block: "(merge input)".into(),
            reason: format!("series {labels}: {e}"),
        })?;
        for s in samples {
            a.append(s.t, s.v);
            if a.is_full() {
                out.push(a.seal().compact());
                a = ChunkAppender::new();
            }
        }
    }
    if !a.is_empty() {
        out.push(a.seal().compact());
    }
    Ok(out)
}
