//! Pushdown: the per-series leaves of a query evaluated where the data is.
//!
//! A leaf is an instant selector or a range function over a range selector (`rate(x[5m])`,
//! `avg_over_time(x[1h])`): its value at each step depends on one series' samples only. A
//! store that can evaluate one ([`Store::steps`](crate::Store::steps)) sends a value per step
//! instead of a day of samples, and the engine above aggregates those. Stores that cannot
//! answer `None` and the engine selects samples as before, so pushdown is only ever a
//! shortcut to the same answer.
//!
//! Over HA replicas the answer is only the same when the dedup would pass one replica of a
//! series through whole; [`SeriesSummary`] carries what that decision needs (counts, span,
//! gaps) so the dedup can make it without the samples, and falls back to samples otherwise.

use crate::SelectLimits;
use crate::SelectRequest;
use std::collections::HashSet;
use std::sync::Arc;
use strata_chunk::{Chunk, ChunkError};
use strata_model::{is_stale, Label, Labels, Matcher, MetricType, Sample};

/// One leaf of a query, on the query's grid.
#[derive(Debug, Clone)]
pub struct StepsRequest {
    pub matchers: Vec<Matcher>,
    /// The grid: `start`, `start + step`, … up to `end` (ms, inclusive).
    pub start: i64,
    pub end: i64,
    pub step: i64,
    /// The selector's `offset` (ms).
    pub offset: i64,
    /// An instant selector's lookback (ms).
    pub lookback: i64,
    /// A range function's name and range (ms); `None`: the instant selector itself.
    pub function: Option<(String, i64)>,
    pub limits: SelectLimits,
    /// `false`: summaries only, no evaluation (the dedup's first look).
    pub values: bool,
    /// Only the series whose [`labels_hash`] is here (the labels as the caller sees them).
    pub only: Option<Arc<HashSet<u64>>>,
    /// An aggregation over the leaf, evaluated by the store too: the answer's
    /// [`groups`](Steps::groups) (valid only when the store holds every series of each).
    pub aggregate: Option<AggregateSpec>,
    /// The window width of the aggregates to answer from (ms); 0: raw samples. A store
    /// without aggregates of that width answers `None`.
    pub resolution: i64,
}

/// An aggregation of a leaf, as a query spells it: `op [param,] (leaf [filter])` grouped
/// `by` or `without` labels. `filter` is a comparison with a number (`> 0`), which keeps a
/// step's value where it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct AggregateSpec {
    pub op: String,
    pub param: Option<f64>,
    pub without: bool,
    pub labels: Vec<String>,
    pub filter: Option<(String, f64)>,
}

impl StepsRequest {
    /// The instant selector of `matchers` on the grid `(start, end, step)`, with default
    /// limits, values asked for; set the other fields for a function, an offset or more.
    pub fn new(matchers: Vec<Matcher>, (start, end, step): (i64, i64, i64), lookback: i64) -> Self {
        StepsRequest {
            matchers,
            start,
            end,
            step,
            offset: 0,
            lookback,
            function: None,
            limits: SelectLimits::default(),
            values: true,
            only: None,
            aggregate: None,
            resolution: 0,
        }
    }

    /// How many steps the grid has; `None` for a grid too large to index.
    pub fn steps(&self) -> Option<usize> {
        if self.step <= 0 || self.end < self.start {
            return None;
        }
        usize::try_from(self.end.checked_sub(self.start)? / self.step).ok()?.checked_add(1)
    }

    /// The selection the leaf reads: what the engine would select for it.
    pub fn selection(&self) -> SelectRequest {
        let reach = match &self.function {
            Some((_, range)) => *range,
            None => self.lookback,
        };
        let start = self.start.saturating_sub(self.offset).saturating_sub(reach).saturating_add(1);
        let mut req = SelectRequest::new(self.matchers.clone(), start, self.end.saturating_sub(self.offset));
        req.limits = self.limits;
        req
    }

    /// Whether a series (labels as the caller sees them) is asked for.
    pub fn wants(&self, labels: &Labels) -> bool {
        self.only.as_ref().is_none_or(|only| only.contains(&labels_hash(labels)))
    }
}

/// A hash of a label set that every tier computes alike (names and values, in order).
pub fn labels_hash(labels: &Labels) -> u64 {
    hash_labels(labels.iter())
}

/// [`labels_hash`] of some of a set's labels (those an iterator keeps), without a copy.
pub fn hash_labels<'a>(labels: impl Iterator<Item = &'a Label>) -> u64 {
    let mut h = xxhash_rust::xxh64::Xxh64::new(0);
    for l in labels {
        h.update(l.name.as_bytes());
        h.update(&[0xff]);
        h.update(l.value.as_bytes());
        h.update(&[0xff]);
    }
    h.digest()
}

/// A leaf's values for one series on the grid, dense as the wire carries them: a bit per
/// step saying whether it has a value, and the values present in order (8 bytes a value,
/// not 16 a step). Empty (no steps) when the series has none or none were asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepValues {
    steps: usize,
    present: Vec<u64>,
    values: Vec<f64>,
}

/// [`StepValues`] a step at a time, in order, without a step list first.
pub struct StepValuesBuilder {
    at: usize,
    present: Vec<u64>,
    values: Vec<f64>,
}

impl StepValuesBuilder {
    pub fn push(&mut self, v: Option<f64>) {
        let word = self.at / 64;
        if word >= self.present.len() {
            self.present.resize(word + 1, 0);
        }
        if let Some(x) = v {
            self.present[word] |= 1 << (self.at % 64);
            self.values.push(x);
        }
        self.at += 1;
    }

    /// The values pushed; empty (as [`StepValues::default`]) when none has a value.
    pub fn finish(mut self) -> StepValues {
        if self.values.is_empty() {
            return StepValues::default();
        }
        self.present.resize(self.at.div_ceil(64), 0);
        // Sized for every step: a series with values at few of them keeps what it has.
        if self.values.len() < self.values.capacity() / 2 {
            self.values.shrink_to_fit();
        }
        StepValues { steps: self.at, present: self.present, values: self.values }
    }
}

impl StepValues {
    pub fn from_options(v: &[Option<f64>]) -> Self {
        let mut present = vec![0u64; v.len().div_ceil(64)];
        let mut values = Vec::with_capacity(v.iter().filter(|x| x.is_some()).count());
        for (i, x) in v.iter().enumerate() {
            if let Some(x) = x {
                present[i / 64] |= 1 << (i % 64);
                values.push(*x);
            }
        }
        StepValues { steps: v.len(), present, values }
    }

    /// A builder for about `steps` steps.
    pub fn builder(steps: usize) -> StepValuesBuilder {
        StepValuesBuilder { at: 0, present: vec![0u64; steps.div_ceil(64)], values: Vec::with_capacity(steps) }
    }

    /// From the wire: `present` holds a bit per step (least significant first, 8 a byte),
    /// `values` one per bit set. Checked: the bitmap fits the grid, the values the bitmap.
    pub fn from_wire(steps: usize, present: &[u8], values: Vec<f64>) -> Result<Self, String> {
        if present.len() != steps.div_ceil(8) {
            return Err(format!("{} presence bytes for {steps} steps", present.len()));
        }
        let mut words = vec![0u64; steps.div_ceil(64)];
        let mut set = 0usize;
        for (i, b) in present.iter().enumerate() {
            // Bits past the last step mean nothing; they are not counted.
            let keep = if (i + 1) * 8 > steps { ((1u16 << (steps - i * 8)) - 1) as u8 } else { 0xff };
            let b = b & keep;
            set += b.count_ones() as usize;
            words[i / 8] |= u64::from(b) << ((i % 8) * 8);
        }
        if set != values.len() {
            let which = if values.len() < set { "fewer" } else { "more" };
            return Err(format!("{which} values than steps present ({} for {set})", values.len()));
        }
        if set == 0 {
            // A series without a value travels without a bitmap; one of nothing would be
            // free to send and cost the receiver a bit per step.
            return Err("a presence bitmap with no step present".into());
        }
        Ok(StepValues { steps, present: words, values })
    }

    /// The bitmap as the wire carries it.
    pub fn present_bytes(&self) -> Vec<u8> {
        (0..self.steps.div_ceil(8)).map(|i| (self.present[i / 8] >> ((i % 8) * 8)) as u8).collect()
    }

    /// The values present, in step order.
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// Steps on the grid (0: no values).
    pub fn steps(&self) -> usize {
        self.steps
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// How many steps have a value.
    pub fn present(&self) -> usize {
        self.values.len()
    }

    /// One per step.
    pub fn iter(&self) -> impl Iterator<Item = Option<f64>> + '_ {
        let mut next = 0;
        (0..self.steps).map(move |i| {
            (self.present[i / 64] >> (i % 64) & 1 == 1).then(|| {
                next += 1;
                self.values[next - 1]
            })
        })
    }

    pub fn to_options(&self) -> Vec<Option<f64>> {
        self.iter().collect()
    }

    /// Bytes it holds on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.present.len() * 8 + self.values.len() * 8
    }
}

/// What a leaf gave for one series.
#[derive(Debug, Clone)]
pub struct StepsSeries {
    /// The series' labels (metric name included, even when the function drops it).
    pub labels: Labels,
    pub metric_type: MetricType,
    pub summary: SeriesSummary,
    /// One per step when values were asked for and the leaf gives the series any; else
    /// empty.
    pub values: StepValues,
    /// The function drops the metric name from its result (the engine applies that itself,
    /// delayed or not, as its options say).
    pub name_dropped: bool,
}

/// A leaf's answer from one store.
#[derive(Debug, Clone, Default)]
pub struct Steps {
    /// Sorted by labels.
    pub series: Vec<StepsSeries>,
    /// With [`StepsRequest::aggregate`]: the aggregation's output series, sorted by labels
    /// (`series` then carry summaries only).
    pub groups: Vec<StepsSeries>,
    /// Samples the evaluation touched (Prometheus' `totalQueryableSamples`).
    pub samples: u64,
    /// Prometheus' annotations the evaluation raised.
    pub warnings: Vec<String>,
    pub infos: Vec<String>,
}

/// How one replica's samples run: its scrape step, its longest step, whether it holds a
/// staleness marker, and its first and last sample. Known from the samples, or from block
/// chunk headers alone (bounds, not exact steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coverage {
    /// The scrape interval: the median step between samples, or the smallest grid step of
    /// the block chunks; `i64::MAX` with fewer than two samples.
    pub step: i64,
    /// The longest step between two consecutive samples (from headers: an upper bound).
    pub max_step: i64,
    /// A staleness marker among the samples (block chunks hold none).
    pub stale: bool,
    /// The first and last sample's times.
    pub first: i64,
    pub last: i64,
}

impl Coverage {
    pub fn of_samples(samples: &[Sample]) -> Option<Coverage> {
        let (a, z) = (samples.first()?, samples.last()?);
        let mut steps: Vec<i64> = samples.windows(2).map(|w| w[1].t - w[0].t).filter(|&d| d > 0).collect();
        let max_step = steps.iter().copied().max().unwrap_or(0);
        steps.sort_unstable();
        let step = steps.get(steps.len() / 2).copied().unwrap_or(i64::MAX);
        let stale = samples.iter().any(|s| is_stale(s.v));
        Some(Coverage { step, max_step, stale, first: a.t, last: z.t })
    }

    /// From block chunk headers alone (each chunk's grid step and largest possible step,
    /// and the steps between chunks): `None` unless every chunk is in the block encoding.
    pub fn of_headers(chunks: &[Chunk]) -> Option<Coverage> {
        let bounds = chunks.iter().map(Chunk::step_bounds).collect::<Option<Vec<_>>>()?;
        let step = bounds.iter().map(|b| b.0).min()?;
        let between =
            chunks.windows(2).map(|w| if w[1].min_t > w[0].max_t { w[1].min_t - w[0].max_t } else { i64::MAX });
        let max_step = bounds.iter().map(|b| b.1).chain(between).max().unwrap_or(0);
        Some(Coverage { step, max_step, stale: false, first: chunks.first()?.min_t, last: chunks.last()?.max_t })
    }

    /// This coverage followed by `next`'s (which starts after it ends, or the step between
    /// them is unknown).
    fn then(self, next: Coverage) -> Coverage {
        let between = if next.first > self.last { next.first - self.last } else { i64::MAX };
        Coverage {
            step: self.step.min(next.step),
            max_step: self.max_step.max(next.max_step).max(between),
            stale: self.stale || next.stale,
            first: self.first,
            last: next.last,
        }
    }

    /// Whether these samples reach from `first` to `last` with no step over `gap` and no
    /// staleness marker.
    pub fn covers(&self, first: i64, last: i64, gap: i64) -> bool {
        !self.stale
            && self.max_step <= gap
            && self.first <= first.saturating_add(gap)
            && self.last >= last.saturating_sub(gap)
    }

    /// 1.5 of its own step: what a gap is for this replica alone.
    pub fn own_gap(&self) -> i64 {
        self.step.saturating_add(self.step / 2)
    }
}

/// 1.5 times the scrape interval of the replicas: the smallest one's median step between
/// samples (`i64::MAX` when none has two samples).
pub fn sample_gap(replicas: &[&[Sample]]) -> i64 {
    let median_step = |r: &[Sample]| {
        let mut d: Vec<i64> = r.windows(2).map(|w| w[1].t - w[0].t).filter(|&d| d > 0).collect();
        d.sort_unstable();
        d.get(d.len() / 2).copied()
    };
    replicas.iter().filter_map(|r| median_step(r)).min().map(|i| i.saturating_add(i / 2)).unwrap_or(i64::MAX)
}

/// One replica of a series, as the dedup weighs it: its sample count, span, and how it runs,
/// known from chunk headers or from the samples (or not known).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeriesSummary {
    pub samples: u64,
    /// The first chunk's start and the last chunk's end.
    pub span: Option<(i64, i64)>,
    pub by_headers: Option<Coverage>,
    pub by_samples: Option<Coverage>,
}

impl SeriesSummary {
    /// A series' summary from its chunks; `decode`: decode them when the headers cannot
    /// show the series runs without a gap of its own.
    pub fn of(chunks: &[Chunk], decode: bool) -> Result<SeriesSummary, ChunkError> {
        Ok(Self::of_range(chunks, i64::MIN, i64::MAX, decode)?.0)
    }

    /// The summary of what a series holds in `[start, end]`, with those samples when it
    /// decoded them (`decode`: when the headers cannot show the series runs without a gap
    /// of its own). Only the range counts, so that where a store happened to cut its chunks
    /// changes no decision: a regional's copy of an edge's series, cut elsewhere, must
    /// choose the same replica as the edge's own. A chunk inside the range is known by its
    /// header; one reaching out of it is decoded and cut.
    pub fn of_range(
        chunks: &[Chunk],
        start: i64,
        end: i64,
        decode: bool,
    ) -> Result<(SeriesSummary, Option<Vec<Sample>>), ChunkError> {
        let mut samples = 0u64;
        let mut span: Option<(i64, i64)> = None;
        // The parts' coverages joined in order; `None` once a part has no step bounds.
        let mut joined: Option<Option<Coverage>> = Some(None);
        for c in chunks.iter().filter(|c| c.overlaps(start, end)) {
            let part = if c.min_t >= start && c.max_t <= end {
                samples += c.n as u64;
                span = Some(span.map_or((c.min_t, c.max_t), |(a, _)| (a, c.max_t)));
                c.step_bounds().map(|(step, max_step)| Coverage {
                    step,
                    max_step,
                    stale: false,
                    first: c.min_t,
                    last: c.max_t,
                })
            } else {
                let mut cut = Vec::new();
                c.decode_into(start, end, &mut cut)?;
                let Some(part) = Coverage::of_samples(&cut) else { continue };
                samples += cut.len() as u64;
                span = Some(span.map_or((part.first, part.last), |(a, _)| (a, part.last)));
                Some(part)
            };
            joined = match (joined, part) {
                (Some(None), Some(p)) => Some(Some(p)),
                (Some(Some(a)), Some(b)) => Some(Some(a.then(b))),
                _ => None,
            };
        }
        let by_headers = joined.flatten();
        let proven = by_headers.is_some_and(|c| !c.stale && c.max_step <= c.own_gap());
        let decoded = if decode && !proven {
            let mut v = Vec::new();
            Chunk::decode_range(chunks, start, end, &mut v)?;
            Some(v)
        } else {
            None
        };
        if let Some(v) = &decoded {
            samples = v.len() as u64;
            span = v.first().zip(v.last()).map(|(a, z)| (a.t, z.t));
        }
        let by_samples = decoded.as_deref().and_then(Coverage::of_samples);
        Ok((SeriesSummary { samples, span, by_headers, by_samples }, decoded))
    }

    /// A summary of decoded samples (no chunk headers).
    pub fn of_samples(samples: &[Sample]) -> SeriesSummary {
        SeriesSummary {
            samples: samples.len() as u64,
            span: samples.first().zip(samples.last()).map(|(a, z)| (a.t, z.t)),
            by_headers: None,
            by_samples: Coverage::of_samples(samples),
        }
    }

    /// Whether it is known to cover `[first, last]` with no step over `gap` (`false`:
    /// not known).
    pub fn covers(&self, first: i64, last: i64, gap: i64) -> bool {
        self.by_headers.is_some_and(|c| c.covers(first, last, gap))
            || self.by_samples.is_some_and(|c| c.covers(first, last, gap))
    }

    /// The smallest scrape step it is known to have.
    pub fn step(&self) -> Option<i64> {
        [self.by_headers, self.by_samples].iter().flatten().map(|c| c.step).filter(|&s| s > 0 && s != i64::MAX).min()
    }
}

/// The replica of a group of replicas that HA dedup passes through whole, or `None` when
/// none is known to be whole and the samples must be merged: the one decision both the
/// merge over samples and pushdown (which evaluates on the chosen replica) make, so their
/// answers are the same.
///
/// A replica is whole when it reaches over the group's span (every replica's first to last
/// sample) without a staleness marker or a step longer than 1.5 of the group's smallest
/// scrape interval. Of the whole replicas, the fullest is chosen (the last of equals). A
/// group of one is its own answer.
pub fn whole_replica(group: &[&SeriesSummary]) -> Option<usize> {
    if group.len() == 1 {
        return Some(0);
    }
    let first = group.iter().filter_map(|g| g.span).map(|s| s.0).min()?;
    let last = group.iter().filter_map(|g| g.span).map(|s| s.1).max()?;
    let gap = group.iter().filter_map(|g| g.step()).min().map_or(i64::MAX, |s| s.saturating_add(s / 2));
    (0..group.len()).filter(|&k| group[k].covers(first, last, gap)).max_by_key(|&k| group[k].samples)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_builder_gives_what_the_step_list_does() {
        for steps in [0usize, 1, 63, 64, 65, 300] {
            for every in [1usize, 2, 7, 1000] {
                let v: Vec<Option<f64>> = (0..steps).map(|i| (i % every == 0).then_some(i as f64)).collect();
                // Sized for fewer steps than come: it grows.
                let mut b = super::StepValues::builder(steps / 2);
                v.iter().for_each(|x| b.push(*x));
                let want = if v.iter().any(Option::is_some) {
                    super::StepValues::from_options(&v)
                } else {
                    super::StepValues::default()
                };
                assert_eq!(b.finish(), want, "{steps} steps, every {every}");
            }
        }
    }

    use super::*;

    #[test]
    fn step_values_round_trip_through_the_wire_form_and_refuse_what_does_not_fit() {
        let v: Vec<Option<f64>> = (0..70).map(|i| (i % 3 == 0).then_some(i as f64 * 0.5)).collect();
        let dense = StepValues::from_options(&v);
        assert_eq!(dense.to_options(), v);
        let back = StepValues::from_wire(70, &dense.present_bytes(), dense.values().to_vec()).unwrap();
        assert_eq!(back, dense);
        assert!(StepValues::from_wire(71, &dense.present_bytes(), dense.values().to_vec()).is_ok(), "9 bytes fit 71");
        assert!(StepValues::from_wire(80, &dense.present_bytes(), vec![]).is_err());
        assert!(StepValues::from_wire(16, &[0, 0], vec![]).is_err(), "a bitmap of nothing");
        assert!(StepValues::from_wire(70, &dense.present_bytes(), vec![1.0]).is_err());
        // Bits past the grid are ignored, not counted.
        assert_eq!(StepValues::from_wire(3, &[0xff], vec![1.0, 2.0, 3.0]).unwrap().present(), 3);
    }

    #[test]
    fn a_grid_counts_its_steps_and_refuses_what_cannot_be_indexed() {
        let mut r = StepsRequest::new(Vec::new(), (0, 600_000, 60_000), 300_000);
        assert_eq!(r.steps(), Some(11));
        assert_eq!((r.selection().start, r.selection().end), (-299_999, 600_000));
        r.function = Some(("rate".into(), 60_000));
        r.offset = 60_000;
        assert_eq!((r.selection().start, r.selection().end), (-119_999, 540_000));
        r.step = 0;
        assert_eq!(r.steps(), None);
        (r.step, r.start, r.end) = (1, i64::MIN, i64::MAX);
        assert_eq!(r.steps(), None);
    }

    fn compacted(samples: &[Sample]) -> Vec<Chunk> {
        Chunk::encode_samples(samples.to_vec()).into_iter().map(Chunk::compact).collect()
    }

    #[test]
    fn coverage_from_headers_never_claims_more_than_the_samples_show() {
        // Three-decimal readings, which take the block form.
        let full: Vec<Sample> = (0..200)
            .map(|i| Sample::new(i * 15_000 + (i * 7) % 23, (300_000 + i * 104_729 % 9_973) as f64 / 1000.0))
            .collect();
        let mut holed = full.clone();
        holed.drain(100..103);
        let chunks = compacted(&full);
        assert!(chunks.iter().all(Chunk::is_block), "the test needs block-encoded chunks");
        let h = Coverage::of_headers(&chunks).expect("block chunks have step bounds");
        let gap = 22_500;
        assert!(h.covers(h.first, h.last, gap));
        assert_eq!((h.first, h.last), (full[0].t, full[199].t));
        // A gap: whichever encoding its chunk gets, the headers do not vouch for it.
        assert!(!Coverage::of_headers(&compacted(&holed)).is_some_and(|c| c.covers(c.first, c.last, gap)));
        assert!(!Coverage::of_samples(&holed).is_some_and(|c| c.covers(c.first, c.last, gap)));
        let s = SeriesSummary::of(&compacted(&holed), true).expect("decodes");
        assert!(!s.covers(0, 199 * 15_000, gap));
        let s = SeriesSummary::of(&compacted(&full), false).expect("decodes");
        assert!(s.covers(0, 199 * 15_000, gap));
        assert!(!s.covers(-60_000, 199 * 15_000, gap), "another replica starts a minute earlier");
    }

    #[test]
    fn a_summary_over_a_range_weighs_only_the_samples_inside_it() {
        let at = |i: i64| i * 15_000 + (i * 7) % 23;
        let full: Vec<Sample> =
            (0..3000).map(|i| Sample::new(at(i), (300_000 + i * 104_729 % 9_973) as f64 / 1000.0)).collect();
        let chunks = compacted(&full);
        assert!(chunks.len() >= 3 && chunks.iter().all(Chunk::is_block), "the test needs several block chunks");
        // From inside the first chunk to inside the last: both reach out and are cut.
        let (start, end) = (full[500].t, full[2500].t);
        let gap = 22_500;
        let (s, decoded) = SeriesSummary::of_range(&chunks, start, end, true).unwrap();
        assert_eq!((s.samples, s.span), (2001, Some((start, end))));
        assert!(decoded.is_none(), "the chunks inside are known by their headers, not decoded");
        assert!(s.covers(start, end, gap));
        // A hole outside the range changes nothing; one inside is seen.
        let mut outside = full.clone();
        outside.drain(100..110);
        let (o, _) = SeriesSummary::of_range(&compacted(&outside), start, end, true).unwrap();
        assert_eq!((o.samples, o.span), (s.samples, s.span));
        assert!(o.covers(start, end, gap), "a hole before the range");
        let mut inside = full.clone();
        inside.drain(1000..1010);
        let (i, decoded) = SeriesSummary::of_range(&compacted(&inside), start, end, true).unwrap();
        assert_eq!(i.samples, 1991);
        assert_eq!(decoded.map(|d| d.len()), Some(1991), "a hole the headers cannot rule out is decoded");
        assert!(!i.covers(start, end, gap));
    }
}
