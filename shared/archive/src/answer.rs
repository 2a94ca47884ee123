//! `Steps` from the archive's aggregate blocks: a query's leaf answered from 5 m or 1 h
//! windows when the global's planner asks for a resolution, with the downsampling crate's
//! arithmetic ([`strata_downsample::answer`]), so the archive answers exactly as a
//! regional's aggregates do. A block that cannot be read fails the request rather than
//! leaving windows out: the planner then reads raw data, which says what it lacks.

use crate::block_cache::BlockWindows;
use crate::layout::shard_of;
use crate::store::{ArchiveStore, OPEN_AT_ONCE};
use crate::ArchiveError;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;
use strata_downsample::answer::{prepare, AnswerError};
use strata_downsample::columns::Part;
use strata_downsample::{Kept, Window, WindowColumns};
use strata_model::{Labels, MetricType};
use strata_store::{Steps, StepsRequest, StepsSeries, StoreError};

/// Step values past which an answer is evaluated on several threads, and how many.
const PARALLEL_WORK: usize = 20_000;
const MAX_THREADS: usize = 4;

fn store_error(e: AnswerError) -> StoreError {
    match e {
        AnswerError::TooMany(n) => StoreError::LimitExceeded { what: "step values", limit: n },
        // The caller asked for what the aggregates cannot give exactly: it reads raw data.
        e => StoreError::InvalidRequest(format!("from aggregates: {e}")),
    }
}

/// A series' windows gathered from block after block: runs of cached or read windows,
/// each already cut to the windows the grid reads, oldest block first.
struct Gathered {
    metric_type: MetricType,
    kept: Kept,
    parts: Vec<(Arc<WindowColumns>, Range<usize>)>,
}

/// A series' windows to evaluate: one block's columns as they are, or the windows of
/// several merged.
enum Run<'a> {
    One(Part<'a, WindowColumns>),
    Merged(Vec<Window>),
}

/// A series' windows from one block: the cache's columns, or windows just read (made
/// columns only if most of them are kept).
enum Held {
    Columns(Arc<WindowColumns>),
    Windows(Vec<Window>),
}

impl Held {
    /// The indexes of the windows ending in `(from, last]`.
    fn between(&self, from: i64, last: i64) -> (usize, usize) {
        match self {
            Held::Columns(c) => (past(c.ends(), from), past(c.ends(), last)),
            Held::Windows(w) => (w.partition_point(|x| x.end <= from), w.partition_point(|x| x.end <= last)),
        }
    }

    fn end(&self, i: usize) -> i64 {
        match self {
            Held::Columns(c) => c.ends()[i],
            Held::Windows(w) => w[i].end,
        }
    }

    fn window(&self, i: usize) -> Window {
        match self {
            Held::Columns(c) => c.window(i),
            Held::Windows(w) => w[i],
        }
    }

    fn into_columns(self) -> Arc<WindowColumns> {
        match self {
            Held::Columns(c) => c,
            Held::Windows(w) => Arc::new(WindowColumns::new(&w)),
        }
    }
}

/// How many of `ends` (ascending) are at most `t`. A query usually covers a cached block
/// whole, and a series' windows are usually evenly spaced: both are checked first, so a
/// query over thousands of series touches a cache line or two of each instead of a binary
/// search's dozen (the columns are out of the processor's caches by then).
fn past(ends: &[i64], t: i64) -> usize {
    let (Some(&first), Some(&newest)) = (ends.first(), ends.last()) else { return 0 };
    if t < first {
        return 0;
    }
    if t >= newest {
        return ends.len();
    }
    // first <= t < newest: at least two ends. Where t would fall were they evenly spaced.
    let span = (newest as i128 - first as i128) as u128;
    let guess = ((t as i128 - first as i128) as u128 * (ends.len() as u128 - 1) / span) as usize;
    let guess = guess.min(ends.len() - 2);
    if ends[guess] <= t && t < ends[guess + 1] {
        return guess + 1;
    }
    ends.partition_point(|&e| e <= t)
}

impl Gathered {
    fn add(&mut self, kept: Kept, windows: Arc<WindowColumns>, range: Range<usize>) {
        self.kept = self.kept.and(kept);
        self.parts.push((windows, range));
    }

    /// The windows in order, each once. Blocks overlap only for a moment after a
    /// compaction, and then a window is kept once; two blocks that disagree about a window
    /// (ranges cut on different grids, written from different data) are an error, and raw
    /// data answers. One block's windows are lent as they are.
    fn windows(&self) -> Result<Run<'_>, String> {
        if let [(w, r)] = self.parts.as_slice() {
            return Ok(Run::One(Part { of: &**w, range: r.clone() }));
        }
        let mut all: Vec<Window> = self.parts.iter().flat_map(|(w, r)| r.clone().map(|i| w.window(i))).collect();
        if all.windows(2).all(|p| p[0].end < p[1].end) {
            return Ok(Run::Merged(all));
        }
        all.sort_by_key(|w| w.end);
        let mut kept: Vec<Window> = Vec::with_capacity(all.len());
        for w in all {
            match kept.last() {
                // Blocks written before the extremes' times were kept hold none: those alone
                // may differ (the run then keeps only what both keep).
                Some(l) if l.end == w.end && !l.same_bits(&Window { min_t: l.min_t, max_t: l.max_t, ..w }) => {
                    return Err(format!("two blocks hold different windows ending at {} ms", w.end))
                }
                Some(l) if l.end == w.end => {}
                _ => kept.push(w),
            }
        }
        Ok(Run::Merged(kept))
    }
}

/// Whether the grid reads fewer than half of the windows ending in `(lo, hi]` that it
/// reaches (a block's), counted up to a million windows (a block is a day or less).
fn sparse_within(p: &strata_downsample::answer::Prepared, lo: i64, hi: i64) -> bool {
    if p.reads_every_window() {
        return false;
    }
    let width = p.width();
    let (first, last) = (lo.max(p.from).div_euclid(width).saturating_add(1), hi.min(p.last).div_euclid(width));
    if last < first || last.saturating_sub(first) > 1_000_000 {
        return false;
    }
    let reached = (last - first + 1) as usize;
    let read = (first..=last).filter(|k| p.reads(k.saturating_mul(width))).count();
    read.saturating_mul(2) < reached
}

impl ArchiveStore {
    /// Whether no block of `shard`, of any resolution, may hold a sample in `(from, to]`;
    /// a block whose meta cannot be read counts by its folder's range, or as holding anything.
    fn nothing_held_in(listed: &[crate::store::Listed], shard: &Option<String>, from: i64, to: i64) -> bool {
        for b in listed.iter().filter(|b| shard_of(&b.dir) == *shard) {
            // The sample times a block may hold, inclusive.
            let (oldest, newest) = match &b.meta {
                Ok(m) if m.resolution_ms == 0 => (m.first_sample.unwrap_or(m.min_time), m.max_time.saturating_sub(1)),
                Ok(m) => (m.min_time.saturating_add(1), m.max_time),
                Err(_) => match crate::layout::parse_block_dir(&b.dir) {
                    Some((res, lo, hi)) if res == "raw" => (lo, hi.saturating_sub(1)),
                    Some((_, lo, hi)) => (lo.saturating_add(1), hi),
                    None => return false,
                },
            };
            if oldest <= to && newest > from {
                return false;
            }
        }
        true
    }

    pub(crate) async fn steps_from_aggregates(&self, req: &StepsRequest) -> Result<Steps, StoreError> {
        let width = req.resolution;
        let p = prepare(req, width).map_err(store_error)?;
        // What the archive lacks over the windows read is said here too.
        self.warn_incomplete(p.from, p.last).await?;
        let candidates = self.candidates(width, p.from, p.last).await?;
        // Each shard's blocks (archivers that split the series by external labels write one
        // each) must cover every window the grid reads, without a break: a block missing in
        // the middle (a range archived before aggregates were, one being written again, a
        // shard whose archiver is behind) would leave its windows out in silence. Then raw
        // data answers.
        // One look at the block list for the whole request.
        let listed = self.listed().await?;
        let mut shards: BTreeSet<Option<String>> = listed.iter().map(|b| shard_of(&b.dir)).collect();
        if shards.is_empty() {
            shards.insert(None);
        }
        for shard in &shards {
            let mine: Vec<&crate::store::Listed> = candidates.iter().filter(|b| shard_of(&b.dir) == *shard).collect();
            let mut covered = p.from;
            // Before the shard's oldest data every window is empty: a grid reaching back
            // past it (a `[1h]` range at the archive's first hour) is answered as raw data
            // would answer it. (The planner asks so only when no other store holds older data.)
            let first = mine.iter().find_map(|b| b.meta.as_ref().ok()).map_or(i64::MAX, |m| m.min_time);
            if first > p.from && Self::nothing_held_in(&listed, shard, i64::MIN, first.min(p.last)) {
                covered = first.min(p.last);
            }
            for b in &mine {
                let Ok(m) = &b.meta else { continue };
                if m.min_time > covered {
                    break;
                }
                covered = covered.max(m.max_time);
            }
            if covered < p.last {
                let of = shard.as_ref().map(|s| format!(" of shard {s}")).unwrap_or_default();
                return Err(StoreError::InvalidRequest(format!(
                    "from aggregates: no {width} ms aggregate block{of} holds the windows ending after {covered} ms"
                )));
            }
        }
        let mut found: BTreeMap<Labels, Gathered> = BTreeMap::new();
        let mut read = 0u64;
        for some in candidates.chunks(OPEN_AT_ONCE) {
            for listed in some {
                let unreadable = |e: &dyn std::fmt::Display| {
                    StoreError::Unavailable(format!("archive: aggregate block {}: {e}", listed.dir))
                };
                let meta = listed.meta.as_ref().map_err(|e| unreadable(e))?;
                if !meta.gaps.is_empty() {
                    // Windows computed from incomplete data would be answered as exact.
                    return Err(StoreError::InvalidRequest(format!(
                        "from aggregates: block {} may be incomplete: {}",
                        listed.dir,
                        meta.gaps.join("; ")
                    )));
                }
                let b = self.open(&listed.dir, meta).await.map_err(|e| unreadable(&e))?;
                let mut ids: BTreeSet<i64> = b
                    .matching_ids(&req.matchers)
                    .filter(|&i| {
                        let s = &b.series()[i];
                        s.samples > 0 && s.max_time > p.from && s.min_time <= p.last && req.wants(&s.labels)
                    })
                    .map(|i| i as i64)
                    .collect();
                let new = ids.iter().filter(|&&i| !found.contains_key(&b.series()[i as usize].labels)).count();
                p.check_limits(req, found.len().saturating_add(new)).map_err(store_error)?;
                let left = req.limits.max_samples.saturating_sub(read);
                // Series whose windows the cache holds; the rest are read, the whole
                // block's windows of them (and kept) when the query covers most of it.
                let data_crc = b.meta.files.iter().find(|f| f.path == crate::layout::DATA).map_or(0, |f| f.crc32);
                let block = (b.dir.clone(), data_crc);
                let mut held: Vec<(i64, Kept, Held)> = Vec::new();
                if self.windows.enabled() {
                    for (id, w) in self.windows.get_many(&block, ids.iter().copied()) {
                        ids.remove(&id);
                        held.push((id, w.kept, Held::Columns(w.columns)));
                    }
                }
                // An aggregate block over [lo, hi) holds the windows ending in (lo, hi].
                let (lo, hi) = (b.meta.min_time, b.meta.max_time);
                let covered = p.last.min(hi).saturating_sub(p.from.max(lo));
                let wanted: u64 = ids.iter().map(|&i| b.series()[i as usize].samples).sum();
                // A grid that reads few of the block's windows (a step longer than its range)
                // decodes them a block at a time and keeps those: caching the whole block's
                // would hold every window of a month to answer one in twelve.
                let whole = self.windows.enabled()
                    && !ids.is_empty()
                    && !sparse_within(&p, lo, hi)
                    && covered.saturating_mul(2) >= hi.saturating_sub(lo)
                    && wanted <= left;
                let range = if whole { (lo, hi) } else { (p.from, p.last) };
                let got = match b.windows(&ids, range, left).await {
                    Ok(got) => got,
                    Err(ArchiveError::Limit { limit }) => {
                        return Err(StoreError::LimitExceeded { what: "samples", limit: limit.saturating_add(read) })
                    }
                    Err(e) => return Err(unreadable(&e)),
                };
                for (id, w) in got {
                    // A whole block's windows are kept for later queries: they must be all
                    // the series table lists (row groups skipped by crafted statistics
                    // would otherwise leave windows out for as long as the cache holds it).
                    let listed = b.series()[id as usize].samples;
                    if whole && w.windows.len() as u64 != listed {
                        let e =
                            format!("series {id}: {} windows read, the series table lists {listed}", w.windows.len());
                        return Err(unreadable(&e));
                    }
                    let held_now = match whole {
                        true => {
                            let columns = Arc::new(WindowColumns::new(&w.windows));
                            self.windows.insert(&block, id, BlockWindows { kept: w.kept, columns: columns.clone() });
                            Held::Columns(columns)
                        }
                        false => Held::Windows(w.windows),
                    };
                    held.push((id, w.kept, held_now));
                }
                held.sort_by_key(|(id, ..)| *id);
                for (id, kept, w) in held {
                    let (first, past) = w.between(p.from, p.last);
                    if first >= past {
                        continue;
                    }
                    // Only the windows some step reads are held when they are few (a step
                    // longer than the range): a month at step 1 h over 5 m windows would
                    // otherwise hold every block's windows, twelve times what it reads.
                    // (Counting them touches every window: a dense grid, the usual case,
                    // skips it.)
                    let needed = match p.reads_every_window() {
                        true => past - first,
                        false => (first..past).filter(|&i| p.reads(w.end(i))).count(),
                    };
                    if needed == 0 {
                        continue;
                    }
                    let (windows, range) = match needed.saturating_mul(2) < past - first {
                        true => {
                            let some: Vec<Window> =
                                (first..past).filter(|&i| p.reads(w.end(i))).map(|i| w.window(i)).collect();
                            (Arc::new(WindowColumns::new(&some)), 0..needed)
                        }
                        false => (w.into_columns(), first..past),
                    };
                    read = read.saturating_add(range.len() as u64);
                    if read > req.limits.max_samples {
                        return Err(StoreError::LimitExceeded { what: "samples", limit: req.limits.max_samples });
                    }
                    let s = &b.series()[id as usize];
                    found
                        .entry(s.labels.clone())
                        .or_insert_with(|| Gathered { metric_type: s.metric_type, kept: Kept::ALL, parts: Vec::new() })
                        .add(kept, windows, range);
                }
            }
        }
        p.check_limits(req, found.len()).map_err(store_error)?;
        let points = (found.len() as u64).saturating_mul(p.steps as u64);
        if points > req.limits.max_samples {
            return Err(StoreError::LimitExceeded { what: "step values", limit: req.limits.max_samples });
        }
        let req = req.clone();
        let evaluated = tokio::task::spawn_blocking(move || {
            let found: Vec<(Labels, Gathered)> = found.into_iter().collect();
            let one = |part: &[(Labels, Gathered)]| -> Result<Vec<StepsSeries>, StoreError> {
                let mut series = Vec::with_capacity(part.len());
                for (labels, g) in part {
                    let windows = g
                        .windows()
                        .map_err(|e| StoreError::InvalidRequest(format!("from aggregates: series {labels}: {e}")))?;
                    let s = (labels.clone(), g.metric_type, g.kept);
                    let evaluated = match &windows {
                        Run::One(part) => p.evaluate_windows(&req, s, part),
                        Run::Merged(all) => p.evaluate_windows(&req, s, &all[..]),
                    };
                    series.push(evaluated.map_err(store_error)?);
                }
                Ok(series)
            };
            // A large answer on the machine's cores, its series in order.
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS);
            let work = found.len().saturating_mul(p.steps);
            let parts = if work >= PARALLEL_WORK { threads } else { 1 };
            let size = found.len().div_ceil(parts).max(1);
            if parts == 1 {
                return Ok::<_, StoreError>(p.finish(one(&found)?));
            }
            let answered: Vec<Result<Vec<StepsSeries>, StoreError>> = std::thread::scope(|scope| {
                let handles: Vec<_> = found.chunks(size).map(|part| scope.spawn(move || one(part))).collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(StoreError::Unavailable("answering from aggregates: a worker failed".into()))
                        })
                    })
                    .collect()
            });
            let mut series = Vec::with_capacity(found.len());
            for part in answered {
                series.extend(part?);
            }
            Ok::<_, StoreError>(p.finish(series))
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("answering from aggregates: {e}")))?;
        evaluated
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_downsample::windows_of;
    use strata_model::Sample;

    #[test]
    fn past_counts_ends_as_a_binary_search_does() {
        let evenly: Vec<i64> = (1..=50).map(|k| k * 300).collect();
        let gapped: Vec<i64> = evenly.iter().copied().filter(|e| e % 7 != 0 && !(3000..6000).contains(e)).collect();
        let extremes = vec![i64::MIN, -5, 0, i64::MAX - 1, i64::MAX];
        for ends in [vec![], vec![600], evenly, gapped, extremes] {
            let probes = ends.iter().flat_map(|&e| [e.saturating_sub(1), e, e.saturating_add(1)]);
            for t in probes.chain([i64::MIN, 0, 17, i64::MAX]) {
                assert_eq!(past(&ends, t), ends.partition_point(|&e| e <= t), "{t} in {ends:?}");
            }
        }
    }

    #[test]
    fn overlapping_blocks_agree_or_the_answer_is_refused() {
        let raw: Vec<Sample> = (1..=240).map(|k| Sample::new(k * 15_000, (k % 9) as f64)).collect();
        let windows: Arc<[Window]> = windows_of(&raw, 300_000).into();
        let columns = Arc::new(WindowColumns::new(&windows));
        let n = windows.len();
        let all = |g: &Gathered| match g.windows().unwrap() {
            Run::One(part) => part.range.map(|i| part.of.window(i)).collect(),
            Run::Merged(all) => all,
        };
        let mut g = Gathered { metric_type: MetricType::Gauge, kept: Kept::ALL, parts: Vec::new() };
        g.add(Kept::ALL, columns.clone(), 0..8);
        assert_eq!(all(&g), windows[..8].to_vec());
        // A compacted block beside the blocks it replaces: the same windows, kept once.
        g.add(Kept::ALL, columns.clone(), 4..n);
        let got = all(&g);
        assert_eq!(got.len(), n);
        assert!(got.iter().zip(windows.iter()).all(|(a, b)| a.same_bits(b)));
        // A block from other data over the same windows.
        let mut other = windows[5];
        other.sum += 1.0;
        g.add(Kept::ALL, Arc::new(WindowColumns::new(&[other])), 0..1);
        let Err(err) = g.windows() else { panic!("two blocks disagree and the answer stands") };
        assert!(err.contains("different windows"), "{err}");
    }
}
