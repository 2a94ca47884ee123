//! [`WindowCache`]: a chunk of aggregate windows decoded once and kept for the queries to
//! come. Decoding was most of what answering a leaf from aggregates cost (the columns
//! read back, windows checked and built), and dashboards ask for the same ranges again and
//! again. An entry is a chunk's columns that the leaves asked for so far (`avg_over_time`
//! reads 20 of a window's 160 bytes), keyed by the block reader's number, unique in the
//! process and never reused, so a slice computed again or a day compacted is never
//! answered from what was kept of the blocks they replace; a deleted block's entries go
//! with it. A series over several blocks (a day and the slices since) is joined field by
//! field, or window by window where blocks overlap.

use crate::cache::{BlockCache, Weighed};
use crate::columns::{Part, WindowColumns};
use crate::encoding::{decode_columns, Wanted};
use crate::window::Window;
use crate::Kept;
use std::ops::Range;
use std::sync::Arc;
use strata_block::BlockReader;
use strata_chunk::Chunk;
use strata_model::{Labels, MetricType};

/// A chunk's windows decoded as columns: those the `wanted` columns fill, and what its
/// series kept.
#[derive(Debug, Clone)]
pub struct CachedWindows {
    pub wanted: Wanted,
    pub kept: Kept,
    pub columns: Arc<WindowColumns>,
}

impl Weighed for CachedWindows {
    fn cost(&self) -> usize {
        self.columns.bytes() + 64
    }
}

/// Decoded windows by (block reader's number, series id): shared by a regional's
/// resolutions, since reader numbers are unique in the process.
pub type WindowCache = BlockCache<u64, CachedWindows>;

/// Default budget of a [`WindowCache`]: a fleet day's 5 m windows of the fields a
/// dashboard's dozen queries read (about 50 MB for 3,000 series) several times over.
pub const DEFAULT_WINDOW_CACHE_BYTES: usize = 256 << 20;

/// What a leaf evaluates: a series' windows in the range, as columns.
pub struct SeriesColumns<'a> {
    pub labels: Labels,
    pub metric_type: MetricType,
    pub kept: Kept,
    pub windows: Part<'a, WindowColumns>,
}

/// A chunk's windows with the `wanted` columns: the cache's, or decoded (with what the
/// cache held of it too, so that queries reading different fields do not evict each
/// other's) and kept.
pub(crate) fn columns_of(
    width: i64,
    block: &BlockReader,
    id: u64,
    c: &Chunk,
    wanted: Wanted,
    cache: Option<&WindowCache>,
) -> Result<CachedWindows, String> {
    let key = (block.number(), i64::try_from(id).unwrap_or(i64::MAX));
    let held = cache.and_then(|cache| cache.get(&key.0, key.1));
    if let Some(h) = held.as_ref().filter(|h| h.wanted.covers(wanted)) {
        return Ok(h.clone());
    }
    let wanted = held.map_or(wanted, |h| h.wanted.and(wanted));
    let (columns, got, kept) = decode_columns(&c.data, wanted).map_err(|e| e.to_string())?;
    if got != width {
        return Err(format!("windows of {got} ms among {width} ms ones"));
    }
    let decoded = CachedWindows { wanted, kept, columns: Arc::new(columns) };
    if let Some(cache) = cache {
        cache.insert(&key.0, key.1, decoded.clone());
    }
    Ok(decoded)
}

/// A series' windows from several blocks (newest first) as one run: copied field by
/// field when the blocks follow each other in time (the usual case: a day's block, then
/// the slices since), else window by window, the newer block's window kept where two
/// hold one end.
pub(crate) fn merge_parts(mut parts: Vec<(Arc<WindowColumns>, Range<usize>)>, wanted: Wanted) -> WindowColumns {
    parts.retain(|(_, r)| !r.is_empty());
    let mut ordered = parts.clone();
    ordered.sort_by_key(|(c, r)| c.ends()[r.start]);
    let follows = ordered.windows(2).all(|p| p[0].0.ends()[p[0].1.end - 1] < p[1].0.ends()[p[1].1.start]);
    if follows {
        let lent: Vec<(&WindowColumns, Range<usize>)> = ordered.iter().map(|(c, r)| (&**c, r.clone())).collect();
        return WindowColumns::concat(&lent);
    }
    let mut windows: Vec<Window> = parts.iter().flat_map(|(c, r)| r.clone().map(|i| c.window(i))).collect();
    // Stable: of two windows with one end, the newer block's (first) stays.
    windows.sort_by_key(|w| w.end);
    windows.dedup_by_key(|w| w.end);
    WindowColumns::with_fields(&windows, wanted.fields())
}
