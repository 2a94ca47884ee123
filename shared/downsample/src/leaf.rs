//! A query's leaf on a grid of steps, answered from one series' windows, and the rules
//! that say when that answer is exactly the raw one.

use crate::columns::{Part, WindowRun};
use crate::counter_index::CounterIndex;
use crate::range::{Combined, Needs, RangeFn};
use crate::window::Window;
use crate::Kept;
use strata_model::arith::{extrapolate, KahanSum};

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

impl Leaf {
    /// How far back from a step it reads: the range, or the selector's lookback.
    pub fn reach(&self) -> i64 {
        match *self {
            Leaf::Selector { lookback } => lookback,
            Leaf::Range { range, .. } => range,
        }
    }
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
    let reach = leaf.reach();
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
            Needs::ExtremeTimes if !kept.extreme_times => Some("the extremes' times (written before they were kept)"),
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
pub fn evaluate<W: WindowRun + ?Sized>(
    windows: &W,
    kept: Kept,
    width: i64,
    leaf: &Leaf,
    grid: &Grid,
) -> Result<Vec<Option<f64>>, NotExact> {
    let mut out = Vec::with_capacity(grid.steps().unwrap_or(0));
    evaluate_each(windows, kept, width, leaf, grid, |v| out.push(v))?;
    Ok(out)
}

/// [`evaluate`], each step's value given to `emit` in order.
pub fn evaluate_each<W: WindowRun + ?Sized>(
    windows: &W,
    kept: Kept,
    width: i64,
    leaf: &Leaf,
    grid: &Grid,
    mut emit: impl FnMut(Option<f64>),
) -> Result<(), NotExact> {
    check(leaf, grid, width, kept)?;
    let steps = grid.steps().ok_or(NotExact::Grid)?;
    // The steps move forward, so the window bounds do too: two cursors, no searches.
    let (mut lo_i, mut hi_i) = (0usize, 0usize);
    let n = windows.len();
    // Built at the first step that combines windows of a counter.
    let mut counter: Option<CounterIndex> = None;
    for i in 0..steps {
        let t = grid.start + i as i64 * grid.step;
        let e = t - grid.offset;
        while hi_i < n && windows.end(hi_i) <= e {
            hi_i += 1;
        }
        emit(match *leaf {
            Leaf::Selector { lookback } => hi_i.checked_sub(1).and_then(|w| {
                let (newest, stale) = windows.newest(w);
                (!stale && newest > e.saturating_sub(lookback)).then(|| windows.last(w).v)
            }),
            Leaf::Range { function, range } => {
                let lo = e.saturating_sub(range);
                while lo_i < hi_i && windows.end(lo_i) <= lo {
                    lo_i += 1;
                }
                let inside = lo_i.min(hi_i)..hi_i;
                match inside.len() {
                    0 => None,
                    // One window: the over-time functions read it as it is.
                    1 if windows.count(inside.start) > 0 => {
                        let w = inside.start;
                        let count = windows.count(w);
                        match function {
                            RangeFn::AvgOverTime => Some(windows.sum(w) / f64::from(count)),
                            RangeFn::SumOverTime => Some(windows.sum(w)),
                            RangeFn::MaxOverTime => Some(windows.max(w)),
                            RangeFn::MinOverTime => Some(windows.min(w)),
                            RangeFn::CountOverTime => Some(f64::from(count)),
                            RangeFn::LastOverTime => Some(windows.last(w).v),
                            RangeFn::FirstOverTime => Some(windows.first(w).v),
                            RangeFn::TsOfFirstOverTime => Some(windows.first(w).t as f64 / 1000.0),
                            RangeFn::TsOfLastOverTime => Some(windows.last(w).t as f64 / 1000.0),
                            RangeFn::PresentOverTime => Some(1.0),
                            RangeFn::Changes => Some(f64::from(windows.changes(w))),
                            RangeFn::Resets => Some(f64::from(windows.resets(w))),
                            // A counter's increase within one window: its own reset correction.
                            RangeFn::Rate | RangeFn::Increase if count >= 2 => {
                                let (first, last) = (windows.first(w), windows.last(w));
                                let increase = last.v - first.v + windows.correction(w);
                                let rate = function == RangeFn::Rate;
                                Some(extrapolate(first, last, u64::from(count), increase, (lo, e), true, rate))
                            }
                            RangeFn::Delta if count >= 2 => {
                                let (first, last) = (windows.first(w), windows.last(w));
                                let delta = last.v - first.v;
                                Some(extrapolate(first, last, u64::from(count), delta, (lo, e), false, false))
                            }
                            _ => one_of(&windows.whole(inside), t, e, lo, function),
                        }
                    }
                    _ if matches!(function, RangeFn::Rate | RangeFn::Increase) => counter
                        .get_or_insert_with(|| CounterIndex::new(windows))
                        .increase(windows, inside, function, (lo, e)),
                    _ => match over_time(&Part { of: windows, range: inside.clone() }, function) {
                        Some(v) => v,
                        None => one_of(&windows.whole(inside), t, e, lo, function),
                    },
                }
            }
        });
    }
    Ok(())
}

/// The simple over-time functions over several windows in one pass, with `Combined`'s
/// arithmetic (the same Kahan sum from the first window's, the same folds): a `[1h]` range
/// at a 5 m step combines a dozen windows per step. `None`: not one of them.
fn over_time<W: WindowRun + ?Sized>(inside: &W, function: RangeFn) -> Option<Option<f64>> {
    let mut it = (0..inside.len()).filter(|&w| inside.count(w) > 0);
    let Some(first) = it.next() else { return Some(None) };
    Some(Some(match function {
        RangeFn::SumOverTime | RangeFn::AvgOverTime => {
            let (mut sum, mut count) = (KahanSum { sum: inside.sum(first), c: 0.0 }, u64::from(inside.count(first)));
            for w in it {
                sum.add(inside.sum(w));
                count += u64::from(inside.count(w));
            }
            match function {
                RangeFn::SumOverTime => sum.value(),
                _ => sum.value() / count as f64,
            }
        }
        RangeFn::MinOverTime => it.fold(inside.min(first), |m, w| {
            let x = inside.min(w);
            if m.is_nan() || x < m {
                x
            } else {
                m
            }
        }),
        RangeFn::MaxOverTime => it.fold(inside.max(first), |m, w| {
            let x = inside.max(w);
            if m.is_nan() || x > m {
                x
            } else {
                m
            }
        }),
        RangeFn::CountOverTime => it.fold(u64::from(inside.count(first)), |n, w| n + u64::from(inside.count(w))) as f64,
        RangeFn::LastOverTime => inside.last(it.next_back().unwrap_or(first)).v,
        RangeFn::TsOfLastOverTime => inside.last(it.next_back().unwrap_or(first)).t as f64 / 1000.0,
        RangeFn::FirstOverTime => inside.first(first).v,
        RangeFn::TsOfFirstOverTime => inside.first(first).t as f64 / 1000.0,
        RangeFn::PresentOverTime => 1.0,
        _ => return None,
    }))
}

/// A range function over the windows of `(lo, e]`, evaluated at step time `t`.
fn one_of(inside: &[Window], t: i64, e: i64, lo: i64, function: RangeFn) -> Option<f64> {
    let reference = if matches!(function, RangeFn::PredictLinear(_)) { t } else { e };
    Combined::of(inside, reference, function)?.apply(function, (lo, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::windows_of;
    use strata_model::Sample;

    /// The one-pass paths give `Combined`'s answers bit for bit, over runs of windows with
    /// resets at and inside their edges, NaNs, staleness markers and empty windows.
    #[test]
    fn one_pass_paths_equal_combined_bit_for_bit() {
        let (mut counter, mut gauge, mut c) = (Vec::new(), Vec::new(), 0.0);
        for k in 1..2000i64 {
            let t = k * 15_000 + (k * 7919) % 40;
            if k % 97 < 30 {
                continue; // a gap: empty windows
            }
            c = if k % 53 == 0 { (k % 5) as f64 } else { c + (k % 17) as f64 * 0.25 };
            counter.push(Sample::new(t, c));
            let v = match k % 41 {
                0 => f64::NAN,
                1 => strata_model::stale_nan(),
                _ => 0.1 * (k % 23) as f64 - 1.0,
            };
            gauge.push(Sample::new(t, v));
        }
        let functions = [
            RangeFn::SumOverTime,
            RangeFn::AvgOverTime,
            RangeFn::MinOverTime,
            RangeFn::MaxOverTime,
            RangeFn::CountOverTime,
            RangeFn::LastOverTime,
            RangeFn::FirstOverTime,
            RangeFn::TsOfFirstOverTime,
            RangeFn::TsOfLastOverTime,
            RangeFn::PresentOverTime,
            RangeFn::Rate,
            RangeFn::Increase,
        ];
        let bits = |v: Option<f64>| v.map(f64::to_bits);
        let mut compared = 0;
        for raw in [&counter, &gauge] {
            let windows = windows_of(raw, 300_000);
            // Indexed once over the whole series, as `evaluate_each` does.
            let index = CounterIndex::new(&windows[..]);
            for n in 2..14 {
                for start in 0..windows.len().saturating_sub(n) {
                    let inside = &windows[start..start + n];
                    let e = inside[n - 1].end;
                    let lo = e - n as i64 * 300_000;
                    for f in functions {
                        let fast = match f {
                            RangeFn::Rate | RangeFn::Increase => {
                                Some(index.increase(&windows[..], start..start + n, f, (lo, e)))
                            }
                            _ => over_time(inside, f),
                        };
                        let fast = fast.expect("a one-pass function");
                        assert_eq!(bits(fast), bits(one_of(inside, e, e, lo, f)), "{f:?} over {n} windows at {e}");
                        compared += 1;
                    }
                }
            }
        }
        assert!(compared > 10_000, "{compared}");
    }
}
