//! A run of consecutive windows combined into what one range `(E − R, E]` of raw samples
//! would give, and the range functions computed from it.

use crate::window::Window;
use strata_model::arith::{extrapolate, KahanSum, RegressionSums};
use strata_model::Sample;

/// The range functions aggregates answer, and what each needs beyond the common columns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RangeFn {
    Rate,
    Increase,
    Delta,
    Irate,
    Idelta,
    Deriv,
    /// `predict_linear`, with its horizon in seconds.
    PredictLinear(f64),
    Changes,
    Resets,
    AvgOverTime,
    MinOverTime,
    MaxOverTime,
    SumOverTime,
    CountOverTime,
    FirstOverTime,
    LastOverTime,
    /// `ts_of_first_over_time`, `ts_of_last_over_time`: the sample's time in seconds.
    TsOfFirstOverTime,
    TsOfLastOverTime,
    /// `ts_of_min_over_time`, `ts_of_max_over_time`: when the extreme was taken, in seconds.
    TsOfMinOverTime,
    TsOfMaxOverTime,
    PresentOverTime,
    StddevOverTime,
    StdvarOverTime,
}

/// Which optional columns a function reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    Common,
    /// The reset correction (kept for counters).
    Correction,
    /// count × M2 (kept for gauges).
    Moments,
    /// The least-squares sums (kept when configured).
    LeastSquares,
    /// The extremes' times (absent from aggregates written before they were kept).
    ExtremeTimes,
}

impl RangeFn {
    /// The function of that name (`param`: `predict_linear`'s horizon); `None` for the
    /// range functions aggregates cannot answer (`quantile_over_time`, `mad_over_time`,
    /// `double_exponential_smoothing`, ...).
    pub fn parse(name: &str, param: Option<f64>) -> Option<RangeFn> {
        Some(match name {
            "rate" => RangeFn::Rate,
            "increase" => RangeFn::Increase,
            "delta" => RangeFn::Delta,
            "irate" => RangeFn::Irate,
            "idelta" => RangeFn::Idelta,
            "deriv" => RangeFn::Deriv,
            "predict_linear" => RangeFn::PredictLinear(param?),
            "changes" => RangeFn::Changes,
            "resets" => RangeFn::Resets,
            "avg_over_time" => RangeFn::AvgOverTime,
            "min_over_time" => RangeFn::MinOverTime,
            "max_over_time" => RangeFn::MaxOverTime,
            "sum_over_time" => RangeFn::SumOverTime,
            "count_over_time" => RangeFn::CountOverTime,
            "first_over_time" => RangeFn::FirstOverTime,
            "last_over_time" => RangeFn::LastOverTime,
            "ts_of_first_over_time" => RangeFn::TsOfFirstOverTime,
            "ts_of_last_over_time" => RangeFn::TsOfLastOverTime,
            "ts_of_min_over_time" => RangeFn::TsOfMinOverTime,
            "ts_of_max_over_time" => RangeFn::TsOfMaxOverTime,
            "present_over_time" => RangeFn::PresentOverTime,
            "stddev_over_time" => RangeFn::StddevOverTime,
            "stdvar_over_time" => RangeFn::StdvarOverTime,
            _ => return None,
        })
    }

    /// Whether the answer keeps the metric name: a sample moved in time, as Prometheus
    /// treats `last_over_time` and `first_over_time`.
    pub fn keeps_name(self) -> bool {
        matches!(self, RangeFn::LastOverTime | RangeFn::FirstOverTime)
    }

    pub fn needs(self) -> Needs {
        match self {
            RangeFn::Rate | RangeFn::Increase => Needs::Correction,
            RangeFn::Deriv | RangeFn::PredictLinear(_) => Needs::LeastSquares,
            RangeFn::StddevOverTime | RangeFn::StdvarOverTime => Needs::Moments,
            RangeFn::TsOfMinOverTime | RangeFn::TsOfMaxOverTime => Needs::ExtremeTimes,
            _ => Needs::Common,
        }
    }
}

/// Windows combined in time order (windows with no value skipped).
#[derive(Debug, Clone)]
pub(crate) struct Combined {
    count: u64,
    first: Sample,
    last: Sample,
    penult: Option<Sample>,
    sum: KahanSum,
    min: f64,
    max: f64,
    /// The extremes' times: `ts_of_min_over_time`'s fold over the windows' extremes (the
    /// last of equal ones, a NaN passed over) picks the sample it picks over theirs.
    min_t: i64,
    max_t: i64,
    nan: bool,
    /// Every value equal to the first (while no NaN was seen).
    constant: bool,
    mean: f64,
    m2: f64,
    changes: u64,
    resets: u64,
    /// The reset corrections (the value before each drop), in time order.
    corrections: KahanSum,
    /// Least-squares sums about `reference`.
    regression: RegressionSums,
    reference: i64,
    /// What is combined: only what the function reads (a query combines a dozen windows
    /// per step and series, so the rest would be most of its time).
    parts: Parts,
}

/// The quantities a function reads beyond count, first and last.
#[derive(Debug, Clone, Copy)]
struct Parts {
    sum: bool,
    extremes: bool,
    changes: bool,
    corrections: bool,
    moments: bool,
    least_squares: bool,
}

impl Parts {
    fn of(f: RangeFn) -> Parts {
        use RangeFn::*;
        let least_squares = matches!(f, Deriv | PredictLinear(_));
        Parts {
            sum: matches!(f, AvgOverTime | SumOverTime) || least_squares,
            // `deriv` reads whether every value is the first (from the extremes).
            extremes: matches!(f, MinOverTime | MaxOverTime | TsOfMinOverTime | TsOfMaxOverTime) || least_squares,
            changes: matches!(f, Changes | Resets),
            corrections: matches!(f, Rate | Increase),
            moments: matches!(f, StddevOverTime | StdvarOverTime),
            least_squares,
        }
    }
}

impl Combined {
    /// `windows` in time order; least-squares sums about `reference` (ms). `None` when no
    /// window holds a value.
    pub(crate) fn of(windows: &[Window], reference: i64, f: RangeFn) -> Option<Combined> {
        let mut it = windows.iter().filter(|w| w.count > 0);
        let w = it.next()?;
        let n = f64::from(w.count);
        let mut c = Combined {
            count: u64::from(w.count),
            first: w.first,
            last: w.last,
            penult: w.penult,
            sum: KahanSum { sum: w.sum, c: 0.0 },
            min: w.min,
            max: w.max,
            min_t: w.min_t,
            max_t: w.max_t,
            nan: w.nan,
            constant: !w.nan && w.min == w.max,
            mean: w.sum / n,
            m2: w.m2n / n,
            changes: u64::from(w.changes),
            resets: u64::from(w.resets),
            corrections: KahanSum::default(),
            regression: RegressionSums::default(),
            reference,
            parts: Parts::of(f),
        };
        c.corrections.add(w.correction);
        c.add_regression(w);
        for w in it {
            c.push(w);
        }
        Some(c)
    }

    fn push(&mut self, w: &Window) {
        let (prev, parts) = (self.last, self.parts);
        if parts.changes {
            if prev.v != w.first.v && !(prev.v.is_nan() && w.first.v.is_nan()) {
                self.changes += 1;
            }
            self.changes += u64::from(w.changes);
        }
        if parts.changes || parts.corrections {
            if w.first.v < prev.v {
                self.resets += 1;
                self.corrections.add(prev.v);
            }
            self.corrections.add(w.correction);
            self.resets += u64::from(w.resets);
        }
        self.penult = if w.count >= 2 { w.penult } else { Some(prev) };
        self.last = w.last;
        if parts.sum || parts.moments {
            self.sum.add(w.sum);
        }
        if parts.extremes {
            if self.min.is_nan() || w.min <= self.min {
                self.min_t = w.min_t;
            }
            if self.max.is_nan() || w.max >= self.max {
                self.max_t = w.max_t;
            }
            if self.min.is_nan() || w.min < self.min {
                self.min = w.min;
            }
            if self.max.is_nan() || w.max > self.max {
                self.max = w.max;
            }
            self.nan |= w.nan;
            self.constant &= !w.nan && w.min == w.max && w.min == self.first.v;
        }
        if parts.moments {
            // Chan's merge of two (count, mean, M2).
            let (na, nb) = (self.count as f64, f64::from(w.count));
            let n = na + nb;
            let mean_b = w.sum / nb;
            let delta = mean_b - self.mean;
            self.mean += delta * nb / n;
            self.m2 += w.m2n / nb + delta * delta * na * nb / n;
        }
        self.count += u64::from(w.count);
        self.add_regression(w);
    }

    /// A window's least-squares sums moved from its end to the reference time:
    /// `x' = x + d` gives `Σx' = Σx + n·d`, `Σx'² = Σx² + 2d·Σx + n·d²`, `Σx'y = Σxy + d·Σy`.
    fn add_regression(&mut self, w: &Window) {
        if !self.parts.least_squares {
            return;
        }
        let n = f64::from(w.count);
        let d = (w.end - self.reference) as f64 / 1000.0;
        let r = &mut self.regression;
        r.n += n;
        r.sx += w.sx + n * d;
        r.sxx += w.sxx + 2.0 * d * w.sx + n * d * d;
        r.sy += w.sum;
        r.sxy += w.sxy + d * w.sum;
    }

    /// The function's value over the range `(start, end]` these windows fill, as
    /// Prometheus computes it from the samples; `None` where it gives no value.
    pub(crate) fn apply(&self, f: RangeFn, (start, end): (i64, i64)) -> Option<f64> {
        let two = self.count >= 2;
        Some(match f {
            RangeFn::Rate | RangeFn::Increase if two => {
                let increase = self.last.v - self.first.v + self.corrections.value();
                extrapolate(self.first, self.last, self.count, increase, (start, end), true, f == RangeFn::Rate)
            }
            RangeFn::Delta if two => {
                extrapolate(self.first, self.last, self.count, self.last.v - self.first.v, (start, end), false, false)
            }
            RangeFn::Irate | RangeFn::Idelta if two => {
                let (prev, last) = (self.penult?, self.last);
                if f == RangeFn::Idelta {
                    last.v - prev.v
                } else {
                    let d = if last.v < prev.v { last.v } else { last.v - prev.v };
                    let dt = (last.t - prev.t) as f64 / 1000.0;
                    if dt == 0.0 {
                        return None;
                    }
                    d / dt
                }
            }
            RangeFn::Deriv if two => self.regression.line(self.constant.then_some(self.first.v)).0,
            RangeFn::PredictLinear(horizon) if two => {
                let (slope, intercept) = self.regression.line(self.constant.then_some(self.first.v));
                intercept + slope * horizon
            }
            RangeFn::Changes => self.changes as f64,
            RangeFn::Resets => self.resets as f64,
            RangeFn::AvgOverTime => self.sum.value() / self.count as f64,
            RangeFn::MinOverTime => self.min,
            RangeFn::MaxOverTime => self.max,
            RangeFn::SumOverTime => self.sum.value(),
            RangeFn::CountOverTime => self.count as f64,
            RangeFn::FirstOverTime => self.first.v,
            RangeFn::LastOverTime => self.last.v,
            RangeFn::TsOfFirstOverTime => self.first.t as f64 / 1000.0,
            RangeFn::TsOfLastOverTime => self.last.t as f64 / 1000.0,
            RangeFn::TsOfMinOverTime => self.min_t as f64 / 1000.0,
            RangeFn::TsOfMaxOverTime => self.max_t as f64 / 1000.0,
            RangeFn::PresentOverTime => 1.0,
            RangeFn::StddevOverTime => (self.m2 / self.count as f64).sqrt(),
            RangeFn::StdvarOverTime => self.m2 / self.count as f64,
            _ => return None,
        })
    }
}
