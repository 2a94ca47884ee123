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

/// What a leaf gave for one series.
#[derive(Debug, Clone)]
pub struct StepsSeries {
    /// The series' labels (metric name included, even when the function drops it).
    pub labels: Labels,
    pub metric_type: MetricType,
    pub summary: SeriesSummary,
    /// One per step when values were asked for and the leaf gives the series any; else
    /// empty.
    pub values: Vec<Option<f64>>,
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

/// Whether one replica's samples run without a gap, and the gap limit that says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coverage {
    /// 1.5 scrape intervals: a longer step is a gap.
    pub gap: i64,
    /// No step over `gap` and no staleness marker.
    pub gap_free: bool,
    /// The first and last sample's times.
    pub first: i64,
    pub last: i64,
}

impl Coverage {
    /// From decoded samples: the gap limit is 1.5 times the median step.
    pub fn of_samples(samples: &[Sample]) -> Option<Coverage> {
        let (a, z) = (samples.first()?, samples.last()?);
        let gap = sample_gap(&[samples]);
        let gap_free = samples.windows(2).all(|w| w[1].t - w[0].t <= gap) && !samples.iter().any(|s| is_stale(s.v));
        Some(Coverage { gap, gap_free, first: a.t, last: z.t })
    }

    /// From block chunk headers alone (each chunk's grid step and largest possible step):
    /// `None` unless every chunk is in the block encoding. The limit is 1.5 of the smallest
    /// grid step, so "gap free" here implies gap free by [`of_samples`](Self::of_samples).
    /// Block chunks hold no staleness markers.
    pub fn of_headers(chunks: &[Chunk]) -> Option<Coverage> {
        let bounds = chunks.iter().map(Chunk::step_bounds).collect::<Option<Vec<_>>>()?;
        let step = bounds.iter().map(|b| b.0).min()?;
        let gap = step.saturating_add(step / 2);
        let gap_free = bounds.iter().all(|b| b.1 <= gap)
            && chunks.windows(2).all(|w| w[1].min_t > w[0].max_t && w[1].min_t - w[0].max_t <= gap);
        Some(Coverage { gap, gap_free, first: chunks.first()?.min_t, last: chunks.last()?.max_t })
    }

    /// Whether these samples reach from `first` to `last` (the span of all replicas)
    /// without a gap.
    pub fn covers(&self, first: i64, last: i64) -> bool {
        self.gap_free && self.first <= first.saturating_add(self.gap) && self.last >= last.saturating_sub(self.gap)
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

/// One replica of a series, as the dedup weighs it: its sample count, span, and whether it
/// runs without a gap, known from chunk headers or from the samples (or not known).
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
    /// show the series gap free.
    pub fn of(chunks: &[Chunk], decode: bool) -> Result<SeriesSummary, ChunkError> {
        let by_headers = Coverage::of_headers(chunks);
        let by_samples = if decode && !by_headers.is_some_and(|c| c.gap_free) {
            let mut v = Vec::new();
            Chunk::decode_range(chunks, i64::MIN, i64::MAX, &mut v)?;
            Coverage::of_samples(&v)
        } else {
            None
        };
        Ok(SeriesSummary {
            samples: chunks.iter().map(|c| c.n as u64).sum(),
            span: chunks.first().zip(chunks.last()).map(|(a, z)| (a.min_t, z.max_t)),
            by_headers,
            by_samples,
        })
    }

    /// Whether it is known to cover `[first, last]` without a gap (`false`: not known).
    pub fn surely_covers(&self, first: i64, last: i64) -> bool {
        self.by_headers.is_some_and(|c| c.covers(first, last)) || self.by_samples.is_some_and(|c| c.covers(first, last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(h.gap_free);
        assert_eq!((h.first, h.last), (full[0].t, full[199].t));
        // A gap: whichever encoding its chunk gets, the headers do not vouch for it.
        assert!(!Coverage::of_headers(&compacted(&holed)).is_some_and(|c| c.gap_free));
        assert!(!Coverage::of_samples(&holed).is_some_and(|c| c.gap_free));
        let s = SeriesSummary::of(&compacted(&holed), true).expect("decodes");
        assert!(!s.surely_covers(0, 199 * 15_000));
        let s = SeriesSummary::of(&compacted(&full), false).expect("decodes");
        assert!(s.surely_covers(0, 199 * 15_000));
        assert!(!s.surely_covers(-60_000, 199 * 15_000), "another replica starts a minute earlier");
    }
}
