//! Prometheus' float arithmetic that two crates must do alike, so that a range function
//! computed from raw samples (the engine) and from window aggregates (downsampling) take
//! the same steps: Kahan's compensated sum, the extrapolation of `rate`, `increase` and
//! `delta`, and the least-squares line of `deriv` and `predict_linear`.

use crate::Sample;

/// Kahan-compensated running sum, as Prometheus 3 sums.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct KahanSum {
    pub sum: f64,
    pub c: f64,
}

impl KahanSum {
    pub fn add(&mut self, x: f64) {
        let t = self.sum + x;
        if t.is_infinite() {
            self.c = 0.0;
        } else if self.sum.abs() >= x.abs() {
            self.c += (self.sum - t) + x;
        } else {
            self.c += (x - t) + self.sum;
        }
        self.sum = t;
    }

    pub fn value(&self) -> f64 {
        self.sum + self.c
    }
}

/// Prometheus' extrapolated `rate`/`increase`/`delta` over a window `(start, end]` (ms)
/// whose `count` (at least 2) samples run from `first` to `last` and change by `delta`
/// (for a counter, already corrected for resets).
#[allow(clippy::too_many_arguments)]
pub fn extrapolate(
    first: Sample,
    last: Sample,
    count: u64,
    delta: f64,
    (start, end): (i64, i64),
    counter: bool,
    rate: bool,
) -> f64 {
    let mut to_start = (first.t - start) as f64 / 1000.0;
    let mut to_end = (end - last.t) as f64 / 1000.0;
    let sampled = (last.t - first.t) as f64 / 1000.0;
    let avg = sampled / (count - 1) as f64;
    let threshold = avg * 1.1;
    if to_start >= threshold {
        to_start = avg / 2.0;
    }
    if counter && delta > 0.0 && first.v >= 0.0 {
        let to_zero = sampled * (first.v / delta);
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    if to_end >= threshold {
        to_end = avg / 2.0;
    }
    let mut factor = (sampled + to_start + to_end) / sampled;
    if rate {
        factor /= (end - start) as f64 / 1000.0;
    }
    delta * factor
}

/// The sums a least-squares line is fitted from: `x` in seconds from a reference time.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct RegressionSums {
    pub n: f64,
    pub sx: f64,
    pub sy: f64,
    pub sxy: f64,
    pub sxx: f64,
}

impl RegressionSums {
    /// Slope and intercept (at the reference time), as Prometheus' linearRegression;
    /// `const_y`: every value was the same, `y0`, which makes the line flat there.
    pub fn line(&self, const_y: Option<f64>) -> (f64, f64) {
        if let Some(y0) = const_y {
            return (0.0, y0);
        }
        let cov = self.sxy - self.sx * self.sy / self.n;
        let var = self.sxx - self.sx * self.sx / self.n;
        let slope = cov / var;
        (slope, self.sy / self.n - slope * self.sx / self.n)
    }
}

/// Prometheus' info annotation for `rate` or `increase` over a series whose name is not a
/// counter's, raised alike from samples and from aggregates.
pub fn might_not_be_a_counter(name: &str) -> Option<String> {
    (!["_total", "_sum", "_count", "_bucket"].iter().any(|x| name.ends_with(x))).then(|| {
        format!("PromQL info: metric might not be a counter, name does not end in _total/_sum/_count/_bucket: {name:?}")
    })
}
