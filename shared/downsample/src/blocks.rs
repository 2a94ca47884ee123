//! Aggregate blocks: one resolution's windows on disk, in the same block format as raw
//! data (`strata_block`), one chunk per series holding a slice of windows in this crate's
//! encoding. A slice `(a, b]` of sample time is written once its windows are due and
//! again when late data changed it: the new block names the old one in its sources, so a
//! crash between the two leaves the old one to be deleted at the next open, never both
//! read.

use crate::encoding::{decode, encode};
use crate::window::Window;
use crate::Kept;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use strata_block::{BlockError, BlockReader, BlockWriter};
use strata_chunk::Chunk;
use strata_model::{Labels, Matcher, Metadata, MetricType};
use strata_tsdb::blocks::BlockSet;

/// One series' windows from a resolution's blocks.
#[derive(Debug, Clone)]
pub struct SeriesWindows {
    pub labels: Labels,
    pub metric_type: MetricType,
    pub kept: Kept,
    pub windows: Vec<Window>,
}

/// The blocks of one resolution.
pub struct AggregateBlocks {
    width: i64,
    set: BlockSet,
}

#[derive(Debug, thiserror::Error)]
pub enum AggregateError {
    #[error(transparent)]
    Block(#[from] BlockError),
    #[error("aggregates of {series} in block {block}: {reason}")]
    Corrupt { series: String, block: String, reason: String },
    #[error("no {width} ms aggregates for ({from}, {to}]: {reason}")]
    NotCovered { width: i64, from: i64, to: i64, reason: String },
}

impl AggregateBlocks {
    /// The blocks of windows `width` ms wide under `dir`.
    pub fn open(dir: &Path, width: i64, cache_bytes: usize) -> Result<AggregateBlocks, AggregateError> {
        Ok(AggregateBlocks { width, set: BlockSet::open(dir, cache_bytes)? })
    }

    pub fn width(&self) -> i64 {
        self.width
    }

    /// Replaces whatever holds the slice `(a, b]` with these series' windows (sorted by
    /// labels; each window's end in the slice).
    pub fn write_slice(
        &self,
        (a, b): (i64, i64),
        series: &[SeriesWindows],
        metadata: Vec<(String, Metadata)>,
    ) -> Result<(), AggregateError> {
        let old: Vec<String> = self.slice_blocks(a, b).iter().map(|r| r.id().to_string()).collect();
        // Written even when empty: a block says its slice was computed.
        let mut w = BlockWriter::create(self.set.dir(), a + 1, b + 1, 1, old.clone())?;
        for s in series.iter().filter(|s| !s.windows.is_empty()) {
            let data = encode(&s.windows, self.width, s.kept);
            let (first, last) = (s.windows[0].end, s.windows[s.windows.len() - 1].end);
            let chunk = Chunk {
                data: Arc::from(data),
                n: u16::try_from(s.windows.len()).unwrap_or(u16::MAX),
                min_t: first - self.width + 1,
                max_t: last,
            };
            if let Err(e) = w.add_series(&s.labels, &[chunk]) {
                w.abort();
                return Err(e.into());
            }
        }
        w.set_metadata(metadata);
        let id = w.id().to_string();
        w.finish()?;
        if let Err(e) = self.set.add(&id) {
            self.set.discard(&id);
            return Err(e.into());
        }
        self.set.delete(&old)?;
        Ok(())
    }

    /// The blocks covering exactly the slice `(a, b]`.
    fn slice_blocks(&self, a: i64, b: i64) -> Vec<Arc<BlockReader>> {
        self.set.healthy().into_iter().filter(|r| r.meta().min_time == a + 1 && r.meta().max_time == b + 1).collect()
    }

    /// The newest block of each slice overlapping `(from, to]`, oldest slice first; an
    /// error unless they cover it without a hole and none is damaged (a window missing
    /// would make every range over it wrong, silently).
    fn covering(&self, from: i64, to: i64) -> Result<Vec<Arc<BlockReader>>, AggregateError> {
        let not = |reason: String| AggregateError::NotCovered { width: self.width, from, to, reason };
        if let Some(d) = self.set.damaged_overlapping(from + 1, to).first() {
            return Err(not(format!("block {} is damaged: {}", d.id, d.reason)));
        }
        let mut newest: BTreeMap<(i64, i64), Arc<BlockReader>> = BTreeMap::new();
        for r in self.set.overlapping(from + 1, to) {
            let key = (r.meta().min_time, r.meta().max_time);
            if newest.get(&key).is_none_or(|o| o.id() < r.id()) {
                newest.insert(key, r);
            }
        }
        let mut reached = from + 1;
        for (lo, hi) in newest.keys() {
            if *lo > reached {
                return Err(not(format!("nothing computed for ({}, {lo}]", reached - 1, lo = lo - 1)));
            }
            reached = reached.max(*hi);
        }
        if reached <= to {
            return Err(not(format!("computed up to {} only", reached - 1)));
        }
        Ok(newest.into_values().collect())
    }

    /// Every matching series' windows ending in `(from, to]`, sorted by labels; an error
    /// unless every window of the range was computed and can be read.
    pub fn windows(&self, matchers: &[Matcher], from: i64, to: i64) -> Result<Vec<SeriesWindows>, AggregateError> {
        let mut by: BTreeMap<Labels, SeriesWindows> = BTreeMap::new();
        for r in self.covering(from, to)? {
            let types = |name: &str| {
                r.metadata().iter().find(|(f, _)| f == name).map(|(_, m)| m.metric_type).unwrap_or_default()
            };
            for s in r.select::<BlockError>(matchers, from + 1, to, |_| Ok(()))? {
                for c in &s.chunks {
                    let (ws, width, kept) = decode(&c.data).map_err(|e| AggregateError::Corrupt {
                        series: s.labels.to_string(),
                        block: r.id().to_string(),
                        reason: e.to_string(),
                    })?;
                    if width != self.width {
                        return Err(AggregateError::Corrupt {
                            series: s.labels.to_string(),
                            block: r.id().to_string(),
                            reason: format!("windows of {width} ms among {} ms ones", self.width),
                        });
                    }
                    let e = by.entry(s.labels.clone()).or_insert_with(|| SeriesWindows {
                        labels: s.labels.clone(),
                        metric_type: types(s.labels.metric_name().unwrap_or_default()),
                        kept,
                        windows: Vec::new(),
                    });
                    // A series whose type changed keeps, over the range, what both kept.
                    e.kept = Kept {
                        correction: e.kept.correction && kept.correction,
                        moments: e.kept.moments && kept.moments,
                        least_squares: e.kept.least_squares && kept.least_squares,
                    };
                    e.windows.extend(ws.into_iter().filter(|w| w.end > from && w.end <= to));
                }
            }
        }
        let mut out: Vec<SeriesWindows> = by.into_values().collect();
        for s in &mut out {
            s.windows.sort_by_key(|w| w.end);
            s.windows.dedup_by_key(|w| w.end);
        }
        Ok(out)
    }

    /// Deletes blocks wholly older than `before` (retention); returns how many.
    pub fn delete_before(&self, before: i64) -> Result<usize, AggregateError> {
        let old: Vec<String> =
            self.set.healthy().iter().filter(|r| r.meta().max_time <= before).map(|r| r.id().to_string()).collect();
        self.set.delete(&old)?;
        Ok(old.len())
    }

    pub fn disk_bytes(&self) -> u64 {
        self.set.disk_bytes()
    }

    /// The oldest sample time covered (`i64::MAX` when empty).
    pub fn min_time(&self) -> i64 {
        self.set.healthy().iter().map(|r| r.meta().min_time).min().unwrap_or(i64::MAX)
    }
}
