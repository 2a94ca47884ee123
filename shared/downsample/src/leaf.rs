//! A query's leaf on a grid of steps, answered from one series' windows, and the rules
//! that say when that answer is exactly the raw one.

use crate::range::{Combined, Needs, RangeFn};
use crate::window::Window;
use crate::Kept;
use strata_model::arith::extrapolate;

/// The steps `start, start + step, … ≤ end` (ms) of a query, read at `T − offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub start: i64,
    pub end: i64,
    pub step: i64,
    pub offset: i64,
}

impl Grid {
    /// How many steps; `None` for a grid without any or too large to index.
    pub fn steps(&self) -> Option<usize> {
        if self.step <= 0 || self.end < self.start {
            return None;
        }
        usize::try_from(self.end.checked_sub(self.start)? / self.step).ok()?.checked_add(1)
    }
}

/// The part of a query evaluated per series: a plain selector, or a range function over
/// a range selector.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Leaf {
    Selector { lookback: i64 },
    Range { function: RangeFn, range: i64 },
}

/// Why aggregates cannot give a leaf's raw answer (the caller reads finer data, or says
/// it answered approximately and why).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotExact {
    #[error("the steps, less the offset, do not fall on {width} ms window ends")]
    Unaligned { width: i64 },
    #[error("the range of {range} ms is not a whole number of {width} ms windows")]
    PartialWindows { range: i64, width: i64 },
    #[error("the aggregates keep no {0}, which this function needs")]
    Missing(&'static str),
    #[error("a grid without steps, or too many")]
    Grid,
}

/// Whether `leaf` on `grid` is answered exactly from windows of `width` ms holding what
/// `kept` says.
pub fn check(leaf: &Leaf, grid: &Grid, width: i64, kept: Kept) -> Result<(), NotExact> {
    let steps = grid.steps().ok_or(NotExact::Grid)?;
    let first = grid.start.checked_sub(grid.offset).ok_or(NotExact::Grid)?;
    // Every time a step reads is representable: no arithmetic below overflows.
    let reach = match leaf {
        Leaf::Selector { lookback } => *lookback,
        Leaf::Range { range, .. } => *range,
    };
    grid.end.checked_sub(grid.offset).and_then(|_| first.checked_sub(reach.max(0))).ok_or(NotExact::Grid)?;
    if first.rem_euclid(width) != 0 || (steps > 1 && grid.step % width != 0) {
        return Err(NotExact::Unaligned { width });
    }
    if let Leaf::Range { function, range } = leaf {
        if *range <= 0 || range % width != 0 {
            return Err(NotExact::PartialWindows { range: *range, width });
        }
        let missing = match function.needs() {
            Needs::Correction if !kept.correction => Some("reset correction (a gauge's)"),
            Needs::Moments if !kept.moments => Some("moments (a counter's)"),
            Needs::LeastSquares if !kept.least_squares => Some("least-squares sums"),
            _ => None,
        };
        if let Some(what) = missing {
            return Err(NotExact::Missing(what));
        }
    }
    Ok(())
}

/// `leaf`'s value at every step of `grid` from one series' windows (time-ordered, every
/// window that holds a sample in the ranges read), as [`check`] allows.
pub fn evaluate(
    windows: &[Window],
    kept: Kept,
    width: i64,
    leaf: &Leaf,
    grid: &Grid,
) -> Result<Vec<Option<f64>>, NotExact> {
    check(leaf, grid, width, kept)?;
    let steps = grid.steps().ok_or(NotExact::Grid)?;
    // The steps move forward, so the window bounds do too: two cursors, no searches.
    let (mut lo_i, mut hi_i) = (0usize, 0usize);
    let mut out = Vec::with_capacity(steps);
    for i in 0..steps {
        let t = grid.start + i as i64 * grid.step;
        let e = t - grid.offset;
        while hi_i < windows.len() && windows[hi_i].end <= e {
            hi_i += 1;
        }
        out.push(match *leaf {
            Leaf::Selector { lookback } => windows[..hi_i].last().and_then(|w| {
                let (newest, stale) = w.newest();
                (!stale && newest > e.saturating_sub(lookback)).then_some(w.last.v)
            }),
            Leaf::Range { function, range } => {
                let lo = e.saturating_sub(range);
                while lo_i < hi_i && windows[lo_i].end <= lo {
                    lo_i += 1;
                }
                let inside = &windows[lo_i.min(hi_i)..hi_i];
                match inside {
                    [] => None,
                    // One window: the over-time functions read it as it is.
                    [w] if w.count > 0 => match function {
                        RangeFn::AvgOverTime => Some(w.sum / f64::from(w.count)),
                        RangeFn::SumOverTime => Some(w.sum),
                        RangeFn::MaxOverTime => Some(w.max),
                        RangeFn::MinOverTime => Some(w.min),
                        RangeFn::CountOverTime => Some(f64::from(w.count)),
                        RangeFn::LastOverTime => Some(w.last.v),
                        RangeFn::PresentOverTime => Some(1.0),
                        RangeFn::Changes => Some(f64::from(w.changes)),
                        RangeFn::Resets => Some(f64::from(w.resets)),
                        // A counter's increase within one window: its own reset correction.
                        RangeFn::Rate | RangeFn::Increase if w.count >= 2 => {
                            let increase = w.last.v - w.first.v + w.correction;
                            let rate = function == RangeFn::Rate;
                            Some(extrapolate(w.first, w.last, u64::from(w.count), increase, (lo, e), true, rate))
                        }
                        RangeFn::Delta if w.count >= 2 => {
                            let delta = w.last.v - w.first.v;
                            Some(extrapolate(w.first, w.last, u64::from(w.count), delta, (lo, e), false, false))
                        }
                        _ => one_of(inside, t, e, lo, function),
                    },
                    _ => one_of(inside, t, e, lo, function),
                }
            }
        });
    }
    Ok(out)
}

/// A range function over the windows of `(lo, e]`, evaluated at step time `t`.
fn one_of(inside: &[Window], t: i64, e: i64, lo: i64, function: RangeFn) -> Option<f64> {
    let reference = if matches!(function, RangeFn::PredictLinear(_)) { t } else { e };
    Combined::of(inside, reference, function)?.apply(function, (lo, e))
}
