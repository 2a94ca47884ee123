//! A query's leaf answered from aggregate blocks, as a store answers `Steps` when asked
//! for a resolution: one value per step per series, exactly the raw answer, or an error
//! saying why not (the caller then reads raw data).

use crate::blocks::{AggregateBlocks, AggregateError};
use crate::encoding::Wanted;
use crate::leaf::{evaluate, Grid, Leaf, NotExact};
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

/// `req` (a leaf, no aggregation over it) from `blocks`.
pub fn answer(blocks: &AggregateBlocks, req: &StepsRequest) -> Result<Steps, AnswerError> {
    if req.aggregate.is_some() {
        return Err(AnswerError::Unsupported("an aggregation over a leaf".into()));
    }
    let width = blocks.width();
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
    let reach = match leaf {
        Leaf::Selector { lookback } => lookback,
        Leaf::Range { range, .. } => range,
    };
    let last = req.end.saturating_sub(req.offset);
    let first = req.start.saturating_sub(req.offset).saturating_sub(reach);
    let from = first.div_euclid(width).saturating_mul(width);
    let started = std::time::Instant::now();
    let series = blocks.count_series(&req.matchers, (from, last))?;
    if series > req.limits.max_series {
        return Err(AnswerError::TooMany(series as u64));
    }
    let windows = (last.saturating_sub(from) / width).max(1) as u64;
    if (series as u64).saturating_mul(windows).saturating_add((series as u64).saturating_mul(steps as u64))
        > req.limits.max_samples
    {
        return Err(AnswerError::TooMany(req.limits.max_samples));
    }
    let name_dropped = matches!(leaf, Leaf::Range { function, .. } if function != RangeFn::LastOverTime);
    let counter_fn = matches!(leaf, Leaf::Range { function: RangeFn::Rate | RangeFn::Increase, .. });
    // Found before anything is decoded, and checked again: a slice written since the
    // count may have added series.
    let found = blocks.find(&req.matchers, (from, last), |l| req.wants(l))?;
    if found.len() > req.limits.max_series {
        return Err(AnswerError::TooMany(found.len() as u64));
    }
    let points = (found.len() as u64).saturating_mul(steps as u64);
    if points > req.limits.max_samples {
        return Err(AnswerError::TooMany(points));
    }
    let evaluated = found.map(Wanted::for_leaf(&leaf), |s| -> Result<_, AnswerError> {
        let values = if req.values { evaluate(&s.windows, s.kept, width, &leaf, &grid)? } else { Vec::new() };
        let count: u64 = s.windows.iter().map(|w| u64::from(w.count)).sum();
        let values =
            if values.iter().any(Option::is_some) { StepValues::from_options(&values) } else { StepValues::default() };
        Ok(StepsSeries {
            labels: s.labels,
            metric_type: s.metric_type,
            summary: SeriesSummary { samples: count, ..SeriesSummary::default() },
            values,
            name_dropped,
        })
    })?;
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
    tracing::debug!(
        series = out.series.len(),
        total_ms = started.elapsed().as_secs_f64() * 1e3,
        "answered from aggregates"
    );
    Ok(out)
}
