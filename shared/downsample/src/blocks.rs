//! Aggregate blocks: one resolution's windows on disk, in the same block format as raw
//! data (`strata_block`), one chunk per series holding a slice of windows in this crate's
//! encoding. A slice `(a, b]` of sample time is written once its windows are due and
//! again when late data changed it: the new block names the old one in its sources, so a
//! crash between the two leaves the old one to be deleted at the next open, never both
//! read.

use crate::columns::{Part, WindowColumns};
use crate::encoding::{decode_wanted, encode, Wanted};
use crate::window::Window;
use crate::window_cache::{columns_of, merge_parts, SeriesColumns, WindowCache};
use crate::Kept;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use strata_block::{BlockError, BlockReader, BlockWriter};
use strata_chunk::Chunk;
use strata_model::parallel::map_in_parts;
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

/// A series' chunks of windows from the blocks read (by their index, newest first, and
/// the series' id in that block), not yet decoded.
struct Found {
    labels: Labels,
    metric_type: MetricType,
    chunks: Vec<(usize, u64, Chunk)>,
}

/// Series found in aggregate blocks and not yet decoded (see [`AggregateBlocks::find`]).
pub struct FoundSeries {
    width: i64,
    range: (i64, i64),
    blocks: Vec<Arc<BlockReader>>,
    found: Vec<Found>,
}

impl FoundSeries {
    pub fn len(&self) -> usize {
        self.found.len()
    }

    pub fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    /// The windows the series' chunks hold, at most (a chunk's header says; nothing is
    /// decoded): what a caller bounds before decoding them.
    pub fn windows_at_most(&self) -> u64 {
        self.found.iter().flat_map(|s| &s.chunks).map(|(_, _, c)| u64::from(c.n)).sum()
    }

    /// Each series' windows in the range, with the `wanted` columns decoded, handed to `f`
    /// as soon as they are, over the cores, in label order: a query holds one series'
    /// windows per thread at a time, not the fleet's (tens of megabytes a query, which the
    /// allocator would hand back and fault in again).
    pub fn map<R: Send, E: From<AggregateError> + Send>(
        self,
        wanted: Wanted,
        f: impl Fn(SeriesWindows) -> Result<R, E> + Sync,
    ) -> Result<Vec<R>, E> {
        let weight = |s: &Found| s.chunks.iter().map(|(_, _, c)| usize::from(c.n)).sum::<usize>();
        let (blocks, (from, to)) = (&self.blocks, self.range);
        let decoded = map_in_parts(self.found, weight, |s| -> Result<R, E> {
            let corrupt = |b: usize, reason: String| {
                E::from(AggregateError::Corrupt {
                    series: s.labels.to_string(),
                    block: blocks[b].id().to_string(),
                    reason,
                })
            };
            let mut kept = Kept::ALL;
            let mut windows: Vec<Window> = Vec::new();
            // Windows from more than one block may interleave or repeat an end.
            let several = s.chunks.first().is_some_and(|(b0, ..)| s.chunks.iter().any(|(b, ..)| b != b0));
            for (b, _, c) in &s.chunks {
                let (ws, width, k) = decode_wanted(&c.data, wanted).map_err(|e| corrupt(*b, e.to_string()))?;
                if width != self.width {
                    return Err(corrupt(*b, format!("windows of {width} ms among {} ms ones", self.width)));
                }
                // A series whose type changed keeps, over the range, what both kept.
                kept = kept.and(k);
                if windows.is_empty()
                    && ws.first().is_some_and(|w| w.end > from)
                    && ws.last().is_some_and(|w| w.end <= to)
                {
                    windows = ws;
                } else {
                    windows.extend(ws.into_iter().filter(|w| w.end > from && w.end <= to));
                }
            }
            if several {
                // Stable: of two windows with one end, the newer block's (read first) stays.
                windows.sort_by_key(|w| w.end);
                windows.dedup_by_key(|w| w.end);
            }
            f(SeriesWindows { labels: s.labels, metric_type: s.metric_type, kept, windows })
        });
        decoded.into_iter().collect()
    }

    /// [`map`](Self::map) through `cache`: each chunk's `wanted` columns are decoded once
    /// and kept for the queries to come (dashboards repeat themselves), and a series'
    /// windows are handed to `f` as columns, lent from the cache when one block holds
    /// them. Without a cache, decoded for this call only.
    pub fn map_columns<R: Send, E: From<AggregateError> + Send>(
        self,
        wanted: Wanted,
        cache: Option<&WindowCache>,
        f: impl Fn(SeriesColumns<'_>) -> Result<R, E> + Sync,
    ) -> Result<Vec<R>, E> {
        let weight = |s: &Found| s.chunks.iter().map(|(_, _, c)| usize::from(c.n)).sum::<usize>();
        let (blocks, (from, to)) = (&self.blocks, self.range);
        let decoded = map_in_parts(self.found, weight, |s| -> Result<R, E> {
            let mut kept = Kept::ALL;
            // (columns, the windows in the range), newest block first.
            let mut parts: Vec<(Arc<WindowColumns>, Range<usize>)> = Vec::with_capacity(s.chunks.len());
            // The key names a series in a block: one chunk of it in each block (as blocks
            // of windows are written), else none is kept.
            let one_each = s.chunks.windows(2).all(|p| p[0].0 != p[1].0);
            let cache = cache.filter(|_| one_each);
            for (b, id, c) in &s.chunks {
                let held = columns_of(self.width, &blocks[*b], *id, c, wanted, cache).map_err(|reason| {
                    E::from(AggregateError::Corrupt {
                        series: s.labels.to_string(),
                        block: blocks[*b].id().to_string(),
                        reason,
                    })
                })?;
                kept = kept.and(held.kept);
                let ends = held.columns.ends();
                let range = ends.partition_point(|&e| e <= from)..ends.partition_point(|&e| e <= to);
                parts.push((held.columns, range));
            }
            let merged;
            let windows = match parts.as_slice() {
                [(one, range)] => Part { of: &**one, range: range.clone() },
                _ => {
                    merged = merge_parts(parts, wanted);
                    Part { of: &merged, range: 0..merged.ends().len() }
                }
            };
            f(SeriesColumns { labels: s.labels, metric_type: s.metric_type, kept, windows })
        });
        decoded.into_iter().collect()
    }
}

/// The blocks of one resolution.
pub struct AggregateBlocks {
    width: i64,
    set: BlockSet,
    cache: Option<Arc<WindowCache>>,
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
        Ok(AggregateBlocks { width, set: BlockSet::open(dir, cache_bytes)?, cache: None })
    }

    /// Deletes the blocks `ids` and what the window cache holds of them.
    fn delete(&self, ids: &[String]) -> Result<(), AggregateError> {
        let numbers: Vec<u64> =
            self.set.healthy().iter().filter(|r| ids.iter().any(|i| i == r.id())).map(|r| r.number()).collect();
        // Forgotten even when a folder could not be removed: the readers are out of
        // queries by then.
        let deleted = self.set.delete(ids);
        if let Some(cache) = &self.cache {
            cache.forget(&numbers);
        }
        Ok(deleted?)
    }

    /// Keeps decoded windows in `cache` for the queries to come.
    pub fn with_window_cache(mut self, cache: Arc<WindowCache>) -> Self {
        self.cache = Some(cache).filter(|c| c.enabled());
        self
    }

    pub fn window_cache(&self) -> Option<&WindowCache> {
        self.cache.as_deref()
    }

    pub fn width(&self) -> i64 {
        self.width
    }

    /// Replaces the block of the slice `(a, b]` (if it was computed before and not merged
    /// into a day since) with these series' chunks of windows (sorted by labels; each
    /// window's end in the slice). A day block it overlaps stays, and this newer block wins over it.
    pub fn write_slice(
        &self,
        (a, b): (i64, i64),
        chunks: Vec<(Labels, Chunk)>,
        metadata: Vec<(String, Metadata)>,
    ) -> Result<(), AggregateError> {
        let old: Vec<String> = self.slice_blocks(a, b).iter().map(|r| r.id().to_string()).collect();
        // Written even when empty: a block says its slice was computed.
        self.replace((a, b), 1, old, chunks, metadata)
    }

    /// Writes a block of `(a, b]` from `chunks` (in label order), adds it, then deletes
    /// the `old` blocks it replaces (named in its sources, so a crash in between leaves
    /// them to be deleted at the next open).
    fn replace(
        &self,
        (a, b): (i64, i64),
        level: u32,
        old: Vec<String>,
        chunks: impl IntoIterator<Item = (Labels, Chunk)>,
        metadata: Vec<(String, Metadata)>,
    ) -> Result<(), AggregateError> {
        let mut w = BlockWriter::create(self.set.dir(), a + 1, b + 1, level, old.clone())?;
        for (labels, c) in chunks {
            if let Err(e) = w.add_series(&labels, std::slice::from_ref(&c)) {
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
        self.delete(&old)?;
        Ok(())
    }

    /// The blocks covering exactly the slice `(a, b]`.
    fn slice_blocks(&self, a: i64, b: i64) -> Vec<Arc<BlockReader>> {
        self.set.healthy().into_iter().filter(|r| r.meta().min_time == a + 1 && r.meta().max_time == b + 1).collect()
    }

    /// The blocks overlapping `(from, to]`, newest first (a slice computed again after a
    /// day was compacted overlaps the day's block, and wins); an error unless they cover
    /// it without a hole and none is damaged (a window missing would make every range
    /// over it wrong, silently).
    fn covering(&self, from: i64, to: i64) -> Result<Vec<Arc<BlockReader>>, AggregateError> {
        let not = |reason: String| AggregateError::NotCovered { width: self.width, from, to, reason };
        if let Some(d) = self.set.damaged_overlapping(from + 1, to).first() {
            return Err(not(format!("block {} is damaged: {}", d.id, d.reason)));
        }
        let mut blocks = self.set.overlapping(from + 1, to);
        let mut ranges: Vec<(i64, i64)> = blocks.iter().map(|r| (r.meta().min_time, r.meta().max_time)).collect();
        ranges.sort_unstable();
        let mut reached = from + 1;
        for (lo, hi) in ranges {
            if lo > reached {
                return Err(not(format!("nothing computed for ({}, {}]", reached - 1, lo - 1)));
            }
            reached = reached.max(hi);
        }
        if reached <= to {
            return Err(not(format!("computed up to {} only", reached - 1)));
        }
        blocks.sort_by(|a, b| b.id().cmp(a.id()));
        Ok(blocks)
    }

    /// How many series match in `(from, to]`, at most (a series in several blocks counts
    /// once per block): from the index, before any chunk is read.
    pub fn count_series(&self, matchers: &[Matcher], (from, to): (i64, i64)) -> Result<usize, AggregateError> {
        let mut n = 0usize;
        for r in self.set.overlapping(from + 1, to) {
            n = n.saturating_add(r.series_labels(matchers, from + 1, to)?.len());
        }
        Ok(n)
    }

    /// Every matching series' windows ending in `(from, to]`, sorted by labels, with the
    /// `wanted` columns decoded; an error unless every window of the range was computed
    /// and can be read.
    pub fn windows(
        &self,
        matchers: &[Matcher],
        range: (i64, i64),
        wanted: Wanted,
    ) -> Result<Vec<SeriesWindows>, AggregateError> {
        self.find(matchers, range, |_| true)?.map(wanted, Ok)
    }

    /// The matching series with windows in `(from, to]` that `keep` keeps, found in the
    /// index with their chunks (whose bytes the block cache shares) and nothing decoded
    /// yet: a caller checks how many before [`FoundSeries::map`] decodes them. An error
    /// unless every window of the range was computed.
    pub fn find(
        &self,
        matchers: &[Matcher],
        range: (i64, i64),
        keep: impl Fn(&Labels) -> bool,
    ) -> Result<FoundSeries, AggregateError> {
        let blocks = self.covering(range.0, range.1)?;
        self.find_in(blocks, matchers, range, keep)
    }

    /// What `blocks` (newest first: its window wins where two hold one) hold of the
    /// matching series in `(from, to]`, in label order.
    fn find_in(
        &self,
        blocks: Vec<Arc<BlockReader>>,
        matchers: &[Matcher],
        (from, to): (i64, i64),
        keep: impl Fn(&Labels) -> bool,
    ) -> Result<FoundSeries, AggregateError> {
        let mut found: Vec<Found> = Vec::new();
        let mut by: BTreeMap<Labels, usize> = BTreeMap::new();
        for (b, r) in blocks.iter().enumerate() {
            let types = |name: &str| {
                r.metadata().iter().find(|(f, _)| f == name).map(|(_, m)| m.metric_type).unwrap_or_default()
            };
            for s in r.select::<AggregateError>(matchers, from + 1, to, |_| Ok(()))? {
                if !keep(&s.labels) {
                    continue;
                }
                let id = s.id;
                let chunks = s.chunks.into_iter().map(|c| (b, id, c));
                // One block's series come sorted and once each: no lookups needed.
                let i = match blocks.len() {
                    1 => None,
                    _ => by.get(&s.labels).copied(),
                };
                match i {
                    Some(i) => found[i].chunks.extend(chunks),
                    None => {
                        if blocks.len() > 1 {
                            by.insert(s.labels.clone(), found.len());
                        }
                        let metric_type = types(s.labels.metric_name().unwrap_or_default());
                        found.push(Found { labels: s.labels, metric_type, chunks: chunks.collect() });
                    }
                }
            }
        }
        if blocks.len() > 1 {
            found.sort_by(|x, y| x.labels.cmp(&y.labels));
        }
        Ok(FoundSeries { width: self.width, range: (from, to), blocks, found })
    }

    /// Merges the blocks wholly inside `(a, b]` into one, a metric family at a time (what
    /// is held at once is bounded by the largest family's windows). Returns whether it
    /// merged (two blocks or more were there, without a hole between them).
    ///
    /// The merged block spans what its parts spanned, not `(a, b]`: a block's range says
    /// its windows were computed, and a day whose first slices were never computed (the
    /// source began mid-day) must not start answering for them with nothing.
    pub fn compact(&self, (a, b): (i64, i64)) -> Result<bool, AggregateError> {
        let mut inside: Vec<Arc<BlockReader>> =
            self.set.healthy().into_iter().filter(|r| r.meta().min_time > a && r.meta().max_time <= b + 1).collect();
        if inside.len() < 2 || !self.set.damaged_overlapping(a + 1, b).is_empty() {
            return Ok(false);
        }
        let mut spans: Vec<(i64, i64)> = inside.iter().map(|r| (r.meta().min_time, r.meta().max_time)).collect();
        spans.sort_unstable();
        let (lo, mut hi) = spans[0];
        for &(l, h) in &spans[1..] {
            if l > hi {
                // A slice between them is missing: merged, the hole would read as computed.
                return Ok(false);
            }
            hi = hi.max(h);
        }
        let (a, b) = (lo - 1, hi - 1);
        inside.sort_by(|x, y| y.id().cmp(x.id()));
        let ids: Vec<String> = inside.iter().map(|r| r.id().to_string()).collect();
        let mut names: Vec<String> = inside.iter().flat_map(|r| r.label_values("__name__")).collect();
        names.sort();
        names.dedup();
        let mut metadata: Vec<(String, Metadata)> = Vec::new();
        for r in &inside {
            for (f, m) in r.metadata() {
                if !metadata.iter().any(|(g, _)| g == f) {
                    metadata.push((f.clone(), m.clone()));
                }
            }
        }
        metadata.sort_by(|x, y| x.0.cmp(&y.0));
        // A family at a time, kept encoded: the day's windows are never all decoded at
        // once. The writer wants series in label order, which `__name__` does not give
        // (it sorts among the other names), so the chunks are sorted before writing.
        let mut chunks: Vec<(Labels, Chunk)> = Vec::new();
        for name in names {
            let m = Matcher::new(strata_model::MatchOp::Equal, "__name__", &name)
                .map_err(|e| AggregateError::Block(BlockError::Invalid(e.to_string())))?;
            for s in self.find_in(inside.clone(), &[m], (a, b), |_| true)?.map(Wanted::ALL, Ok::<_, AggregateError>)? {
                if !s.windows.is_empty() {
                    let c = self.chunk(&s);
                    chunks.push((s.labels, c));
                }
            }
        }
        chunks.sort_by(|x, y| x.0.cmp(&y.0));
        self.replace((a, b), 2, ids, chunks, metadata)?;
        Ok(true)
    }

    /// One series' windows (at least one) as one chunk.
    pub(crate) fn chunk(&self, s: &SeriesWindows) -> Chunk {
        let (first, last) = (s.windows[0].end, s.windows[s.windows.len() - 1].end);
        Chunk {
            data: Arc::from(encode(&s.windows, self.width, s.kept)),
            n: u16::try_from(s.windows.len()).unwrap_or(u16::MAX),
            min_t: first - self.width + 1,
            max_t: last,
        }
    }

    /// Deletes blocks wholly older than `before` (retention); returns how many.
    pub fn delete_before(&self, before: i64) -> Result<usize, AggregateError> {
        let old: Vec<String> =
            self.set.healthy().iter().filter(|r| r.meta().max_time <= before).map(|r| r.id().to_string()).collect();
        self.delete(&old)?;
        Ok(old.len())
    }

    pub fn disk_bytes(&self) -> u64 {
        self.set.disk_bytes()
    }

    /// The oldest time any block covers, damaged ones included (`i64::MAX` when empty);
    /// `None` when a damaged block's range is unknown.
    pub fn oldest_held(&self) -> Option<i64> {
        self.set.oldest_held()
    }

    /// The oldest sample time covered (`i64::MAX` when empty).
    pub fn min_time(&self) -> i64 {
        self.set.healthy().iter().map(|r| r.meta().min_time).min().unwrap_or(i64::MAX)
    }
}
