//! A query's leaf answered from aggregate blocks, as a store answers `Steps` when asked
//! for a resolution: one value per step per series, exactly the raw answer, or an error
//! saying why not (the caller then reads raw data).

use crate::blocks::{AggregateBlocks, AggregateError};
use crate::encoding::Wanted;
use crate::leaf::{Grid, Leaf, NotExact};
use crate::range::RangeFn;
use strata_model::arith::might_not_be_a_counter;
use strata_store::{SeriesSummary, StepValues, Steps, StepsRequest, StepsSeries};

#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("{0}")]
    NotExact(#[from] NotExact),
    #[error("{0} is not answered from aggregates")]
    Unsupported(String),
    #[error(transparent)]
    Aggregates(#[from] AggregateError),
    #[error("{0} values, more than the limit")]
    TooMany(u64),
}

/// What a request asks of aggregates `width` wide: checked before anything is read.
pub struct Prepared {
    pub leaf: Leaf,
    pub grid: Grid,
    /// Windows ending in `(from, last]` are read.
    pub from: i64,
    pub last: i64,
    pub steps: usize,
    width: i64,
    /// How far before a step its range (or lookback) reaches.
    reach: i64,
}

/// Checks that `req` (a leaf, no aggregation over it) is answered exactly from windows
/// `width` wide, and says which windows it reads.
pub fn prepare(req: &StepsRequest, width: i64) -> Result<Prepared, AnswerError> {
    if req.aggregate.is_some() {
        return Err(AnswerError::Unsupported("an aggregation over a leaf".into()));
    }
    let leaf = match &req.function {
        None => Leaf::Selector { lookback: req.lookback },
        Some((name, range)) => match RangeFn::parse(name, None) {
            Some(function) => Leaf::Range { function, range: *range },
            None => return Err(AnswerError::Unsupported(format!("{name}()"))),
        },
    };
    let grid = Grid { start: req.start, end: req.end, step: req.step, offset: req.offset };
    // Alignment and ranges are checked before anything is read.
    crate::leaf::check(&leaf, &grid, width, crate::Kept::ALL)?;
    let steps = grid.steps().ok_or(NotExact::Grid)?;
    // The windows the grid's ranges read: those ending after the first range starts.
    let reach = leaf.reach();
    let last = req.end.saturating_sub(req.offset);
    let first = req.start.saturating_sub(req.offset).saturating_sub(reach);
    let from = first.div_euclid(width).saturating_mul(width);
    Ok(Prepared { leaf, grid, from, last, steps, width, reach })
}

impl Prepared {
    /// The width of the windows it reads (ms).
    pub fn width(&self) -> i64 {
        self.width
    }

    /// Whether some step reads the window ending at `end`: a step `t` reads those ending
    /// in `(t − reach, t]` (the start rounded down to a window edge). A grid whose step is
    /// longer than its range reads a few windows of each step's, and a caller that gathers
    /// windows over a long span keeps only those.
    pub fn reads(&self, end: i64) -> bool {
        if end <= self.from || end > self.last {
            return false;
        }
        let first = self.grid.start.saturating_sub(self.grid.offset);
        // The first step at or after `end`: the one whose range reaches back furthest
        // past it.
        let k = match self.grid.step {
            step if step > 0 => end.saturating_sub(first).max(0).saturating_add(step - 1) / step,
            _ => 0,
        };
        let t = first.saturating_add(k.saturating_mul(self.grid.step.max(0)));
        let reached = t.saturating_sub(self.reach).div_euclid(self.width).saturating_mul(self.width);
        (k as u64) < self.steps as u64 && t >= end && reached < end
    }

    /// Whether every window from `from` to the last step is read (those after it never
    /// are): a step no longer than the reach
    /// leaves no window between two steps' ranges (the next step's reach starts at or
    /// before the previous step). Saves asking [`reads`](Self::reads) window by window.
    pub fn reads_every_window(&self) -> bool {
        self.steps <= 1 || (self.grid.step > 0 && self.grid.step <= self.reach)
    }

    /// Fails when `series` series over the windows read, or their steps, would be more
    /// than the request's limits.
    pub fn check_limits(&self, req: &StepsRequest, series: usize) -> Result<(), AnswerError> {
        if series > req.limits.max_series {
            return Err(AnswerError::TooMany(series as u64));
        }
        let windows = (self.last.saturating_sub(self.from) / self.width).max(1) as u64;
        let n = series as u64;
        if n.saturating_mul(windows).saturating_add(n.saturating_mul(self.steps as u64)) > req.limits.max_samples {
            return Err(AnswerError::TooMany(req.limits.max_samples));
        }
        Ok(())
    }

    /// One series' steps from its windows.
    pub fn evaluate_windows<W: crate::columns::WindowRun + ?Sized>(
        &self,
        req: &StepsRequest,
        (labels, metric_type, kept): (strata_model::Labels, strata_model::MetricType, crate::Kept),
        windows: &W,
    ) -> Result<StepsSeries, AnswerError> {
        let values = match req.values {
            true => {
                let mut values = StepValues::builder(self.steps);
                crate::leaf::evaluate_each(windows, kept, self.width, &self.leaf, &self.grid, |v| values.push(v))?;
                values.finish()
            }
            false => StepValues::default(),
        };
        let count: u64 = (0..windows.len()).map(|w| u64::from(windows.count(w))).sum();
        let name_dropped = matches!(self.leaf, Leaf::Range { function, .. } if !function.keeps_name());
        Ok(StepsSeries {
            labels,
            metric_type,
            summary: SeriesSummary { samples: count, ..SeriesSummary::default() },
            values,
            name_dropped,
        })
    }

    /// The answer of the evaluated series, with the info a counter function gives over a
    /// metric not named as a counter.
    pub fn finish(&self, evaluated: Vec<StepsSeries>) -> Steps {
        let counter_fn = matches!(self.leaf, Leaf::Range { function: RangeFn::Rate | RangeFn::Increase, .. });
        let mut out = Steps::default();
        for s in evaluated {
            if counter_fn {
                if let Some(info) = might_not_be_a_counter(s.labels.metric_name().unwrap_or("")) {
                    if !out.infos.contains(&info) {
                        out.infos.push(info);
                    }
                }
            }
            out.samples += s.summary.samples;
            out.series.push(s);
        }
        out
    }
}

/// `req` (a leaf, no aggregation over it) from `blocks`.
pub fn answer(blocks: &AggregateBlocks, req: &StepsRequest) -> Result<Steps, AnswerError> {
    answer_after(blocks, req, i64::MIN)
}

/// [`answer`], the windows ending at or before `empty_until` known to be empty (the
/// store held no data there): blocks are looked for after it only.
pub fn answer_after(blocks: &AggregateBlocks, req: &StepsRequest, empty_until: i64) -> Result<Steps, AnswerError> {
    let p = prepare(req, blocks.width())?;
    let started = std::time::Instant::now();
    let read = (p.from.max(empty_until).min(p.last), p.last);
    let series = blocks.count_series(&req.matchers, read)?;
    p.check_limits(req, series)?;
    // Found before anything is decoded, and checked again: a slice written since the
    // count may have added series.
    let found = blocks.find(&req.matchers, read, |l| req.wants(l))?;
    p.check_limits(req, found.len())?;
    let points = (found.len() as u64).saturating_mul(p.steps as u64);
    if points > req.limits.max_samples {
        return Err(AnswerError::TooMany(points));
    }
    let evaluated = found.map_columns(Wanted::for_leaf(&p.leaf), blocks.window_cache(), |s| {
        p.evaluate_windows(req, (s.labels, s.metric_type, s.kept), &s.windows)
    })?;
    let out = p.finish(evaluated);
    tracing::debug!(
        series = out.series.len(),
        total_ms = started.elapsed().as_secs_f64() * 1e3,
        "answered from aggregates"
    );
    Ok(out)
}
