//! One window's aggregate: what a series' raw samples in `(end − width, end]` leave for the
//! range functions, so that any run of whole windows answers them as the samples would.

use strata_chunk::to_decimal;
use strata_model::arith::KahanSum;
use strata_model::{is_stale, Sample};

/// The aggregate of one window. Every quantity is over the window's samples that are not
/// staleness markers (range vectors drop those), in time order; `count` may be 0 when the
/// window holds only markers, and then only `stale` means anything.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// The window is `(end − width, end]`.
    pub end: i64,
    pub count: u32,
    pub first: Sample,
    pub last: Sample,
    /// The sample before `last` (`irate`, `idelta`).
    pub penult: Option<Sample>,
    /// The time of a staleness marker when one is the window's newest sample (a plain
    /// selector then finds nothing there).
    pub stale: Option<i64>,
    /// Kahan-compensated sum of the values.
    pub sum: f64,
    /// Prometheus' fold: NaN only when every value is NaN.
    pub min: f64,
    pub max: f64,
    /// When the extremes were taken, as `ts_of_min_over_time` and `ts_of_max_over_time`
    /// pick them: the last of equal extremes, a NaN passed over (all NaN: the last sample).
    /// The window's end when it holds no value.
    pub min_t: i64,
    pub max_t: i64,
    /// Some value is NaN.
    pub nan: bool,
    /// `count × M2` (M2: the sum of squared deviations from the mean), computed exactly
    /// when the values are decimals of up to three places: then it is a decimal itself,
    /// which the column codec stores in a few bits instead of a float's 64.
    pub m2n: f64,
    /// Consecutive pairs whose values differ (`changes`) and drop (`resets`).
    pub changes: u32,
    pub resets: u32,
    /// The sum of the values just before each drop, in order: a counter's reset correction.
    pub correction: f64,
    /// Least-squares sums with `x` in seconds from `end` (exact for decimal values).
    pub sx: f64,
    pub sxx: f64,
    pub sxy: f64,
}

/// The largest decimal scale whose squares the column codec still stores as decimals.
const MAX_EXACT_SCALE: u32 = 3;

impl Window {
    /// The aggregate of `raw`, the series' samples in `(end − width, end]` in time order
    /// (staleness markers included); `None` when there are none.
    pub fn of(end: i64, raw: &[Sample]) -> Option<Window> {
        let newest = raw.last()?;
        let stale = is_stale(newest.v).then_some(newest.t);
        let vals: Vec<Sample> = raw.iter().copied().filter(|s| !is_stale(s.v)).collect();
        let nothing = Sample { t: end, v: f64::NAN };
        let (first, last) = (vals.first().copied().unwrap_or(nothing), vals.last().copied().unwrap_or(nothing));
        let mut w = Window {
            end,
            count: vals.len() as u32,
            first,
            last,
            penult: vals.len().checked_sub(2).map(|i| vals[i]),
            stale,
            sum: 0.0,
            min: f64::NAN,
            max: f64::NAN,
            min_t: end,
            max_t: end,
            nan: false,
            m2n: 0.0,
            changes: 0,
            resets: 0,
            correction: 0.0,
            sx: 0.0,
            sxx: 0.0,
            sxy: 0.0,
        };
        let mut sum = KahanSum::default();
        for s in &vals {
            sum.add(s.v);
            // The time folds first: they compare with the extreme held before this sample.
            if w.min.is_nan() || s.v <= w.min {
                w.min_t = s.t;
            }
            if w.max.is_nan() || s.v >= w.max {
                w.max_t = s.t;
            }
            if w.min.is_nan() || s.v < w.min {
                w.min = s.v;
            }
            if w.max.is_nan() || s.v > w.max {
                w.max = s.v;
            }
            w.nan |= s.v.is_nan();
        }
        w.sum = sum.value();
        for p in vals.windows(2) {
            if p[0].v != p[1].v && !(p[0].v.is_nan() && p[1].v.is_nan()) {
                w.changes += 1;
            }
            if p[1].v < p[0].v {
                w.resets += 1;
                w.correction += p[0].v;
            }
        }
        match Decimals::of(&vals) {
            Some(d) => d.fill(&vals, end, &mut w),
            None => floats(&vals, end, &mut w),
        }
        Some(w)
    }

    /// Equal bit for bit, NaNs included (`==` says a window holding a NaN differs from
    /// itself): how a reader tells a window written twice from two that disagree.
    pub fn same_bits(&self, o: &Window) -> bool {
        let sample = |a: Sample, b: Sample| a.t == b.t && a.v.to_bits() == b.v.to_bits();
        let floats = |w: &Window| [w.sum, w.min, w.max, w.m2n, w.correction, w.sx, w.sxx, w.sxy].map(f64::to_bits);
        self.end == o.end
            && self.count == o.count
            && sample(self.first, o.first)
            && sample(self.last, o.last)
            && match (self.penult, o.penult) {
                (Some(a), Some(b)) => sample(a, b),
                (a, b) => a.is_none() && b.is_none(),
            }
            && self.stale == o.stale
            && self.min_t == o.min_t
            && self.max_t == o.max_t
            && self.nan == o.nan
            && self.changes == o.changes
            && self.resets == o.resets
            && floats(self) == floats(o)
    }

    /// The newest sample of the window, staleness marker or not.
    pub fn newest(&self) -> (i64, bool) {
        match self.stale {
            Some(t) if self.count == 0 || t > self.last.t => (t, true),
            _ => (self.last.t, false),
        }
    }
}

/// A window's values as integers at one decimal scale, when they all are.
struct Decimals {
    scale: u32,
    scaled: Vec<i128>,
}

impl Decimals {
    fn of(vals: &[Sample]) -> Option<Decimals> {
        let parts: Vec<(u32, i64)> = vals.iter().map(|s| to_decimal(s.v)).collect::<Option<_>>()?;
        let scale = parts.iter().map(|p| p.0).max().unwrap_or(0);
        if scale > MAX_EXACT_SCALE {
            return None;
        }
        let scaled = parts.iter().map(|&(k, s)| i128::from(s) * 10i128.pow(scale - k)).collect();
        Some(Decimals { scale, scaled })
    }

    /// The moments and least-squares sums in integer arithmetic, rounded once at the end;
    /// on overflow (values near 2⁵³), the float path.
    fn fill(&self, vals: &[Sample], end: i64, w: &mut Window) {
        let exact = || -> Option<(i128, i128, i128, i128)> {
            let n = self.scaled.len() as i128;
            let (mut s1, mut s2, mut sx, mut sxx, mut sxy) = (0i128, 0i128, 0i128, 0i128, 0i128);
            for (s, y) in vals.iter().zip(&self.scaled) {
                let x = i128::from(s.t - end);
                s1 = s1.checked_add(*y)?;
                s2 = s2.checked_add(y.checked_mul(*y)?)?;
                sx += x;
                sxx = sxx.checked_add(x * x)?;
                sxy = sxy.checked_add(x.checked_mul(*y)?)?;
            }
            let q = n.checked_mul(s2)?.checked_sub(s1.checked_mul(s1)?)?;
            Some((q, sx, sxx, sxy))
        };
        let Some((q, sx, sxx, sxy)) = exact() else { return floats(vals, end, w) };
        w.m2n = decimal(q, 2 * self.scale);
        w.sx = decimal(sx, 3);
        w.sxx = decimal(sxx, 6);
        w.sxy = decimal(sxy, 3 + self.scale);
    }
}

/// `i / 10^k` rounded once (as the column codec's decimal path divides, so that a result
/// below 2⁵³ comes back from it bit for bit).
fn decimal(i: i128, k: u32) -> f64 {
    i as f64 / 10f64.powi(k as i32)
}

/// Welford's moments and plain float sums, for values that are not short decimals.
fn floats(vals: &[Sample], end: i64, w: &mut Window) {
    let (mut n, mut mean, mut m2) = (0.0, 0.0, 0.0);
    let (mut sx, mut sxx, mut sxy) = (0.0, 0.0, 0.0);
    for s in vals {
        n += 1.0;
        let delta = s.v - mean;
        mean += delta / n;
        m2 += delta * (s.v - mean);
        let x = (s.t - end) as f64 / 1000.0;
        sx += x;
        sxx += x * x;
        sxy += x * s.v;
    }
    w.m2n = m2 * n;
    (w.sx, w.sxx, w.sxy) = (sx, sxx, sxy);
}

/// Every window of a series' raw samples (time-ordered, markers included) for windows of
/// `width` ms: `(k·width, (k+1)·width]`, stamped at their ends, empty ones left out.
pub fn windows_of(raw: &[Sample], width: i64) -> Vec<Window> {
    let mut out = Vec::new();
    let mut from = 0;
    while from < raw.len() {
        let end = window_end(raw[from].t, width);
        let to = from + raw[from..].partition_point(|s| s.t <= end);
        out.extend(Window::of(end, &raw[from..to]));
        from = to;
    }
    out
}

/// The end of the window holding `t`: the smallest multiple of `width` at or after it.
pub fn window_end(t: i64, width: i64) -> i64 {
    let k = t.div_euclid(width);
    if t.rem_euclid(width) == 0 {
        t
    } else {
        (k + 1).saturating_mul(width)
    }
}
