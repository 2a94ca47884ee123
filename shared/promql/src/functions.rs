//! PromQL functions over instant vectors, range windows and scalars.

use super::aggregate::{kahan_sum, mean, quantile, variance};
use super::eval::{Evaluator, StepSeries, Val};
use super::windows::{IntegerPrefix, Resets};
use super::QueryError;
use promql_parser::parser::{Call, Expr};
use strata_model::arith;
use strata_model::matcher::compile_anchored;
use strata_model::{Labels, Sample, METRIC_NAME};

fn unparen(mut e: &Expr) -> &Expr {
    while let Expr::Paren(p) = e {
        e = &p.expr;
    }
    e
}

/// A range-vector argument: a range selector or a subquery.
fn range_arg(c: &Call, i: usize) -> Result<&Expr, QueryError> {
    match c.args.args.get(i).map(|b| unparen(b)) {
        Some(e @ (Expr::MatrixSelector(_) | Expr::Subquery(_))) => Ok(e),
        _ => Err(QueryError::BadData(format!("expected a range vector argument for {}", c.func.name))),
    }
}

/// Evaluates argument `i` and takes the kind `pick` accepts, or names what was expected.
fn arg<T>(
    ev: &Evaluator,
    c: &Call,
    i: usize,
    kind: &str,
    pick: impl FnOnce(Val) -> Option<T>,
) -> Result<T, QueryError> {
    let e = c.args.args.get(i).ok_or_else(|| QueryError::BadData(format!("missing argument for {}", c.func.name)))?;
    pick(ev.eval(e)?).ok_or_else(|| QueryError::BadData(format!("expected {kind} argument for {}", c.func.name)))
}

fn scalar_arg(ev: &Evaluator, c: &Call, i: usize) -> Result<Vec<f64>, QueryError> {
    arg(ev, c, i, "a scalar", |v| if let Val::Scalar(x) = v { Some(x) } else { None })
}

fn string_arg(ev: &Evaluator, c: &Call, i: usize) -> Result<String, QueryError> {
    arg(ev, c, i, "a string", |v| if let Val::Str(x) = v { Some(x) } else { None })
}

fn vector_arg(ev: &Evaluator, c: &Call, i: usize) -> Result<Vec<StepSeries>, QueryError> {
    arg(ev, c, i, "an instant vector", |v| if let Val::Vector(x) = v { Some(x) } else { None })
}

/// Prometheus' extrapolated rate/increase/delta over a window `(start, end]`. For a
/// counter, `resets` are the values just before each drop inside the window, in order.
fn extrapolated(
    s: &[Sample],
    start: i64,
    end: i64,
    counter: bool,
    rate: bool,
    resets: impl Iterator<Item = f64>,
) -> Option<f64> {
    if s.len() < 2 {
        return None;
    }
    let (first, last) = (s[0], s[s.len() - 1]);
    let mut result = last.v - first.v;
    if counter {
        for prev in resets {
            result += prev;
        }
    }
    Some(arith::extrapolate(first, last, s.len() as u64, result, (start, end), counter, rate))
}

fn instant_delta(s: &[Sample], rate: bool) -> Option<f64> {
    if s.len() < 2 {
        return None;
    }
    let (prev, last) = (s[s.len() - 2], s[s.len() - 1]);
    let d = if rate && last.v < prev.v { last.v } else { last.v - prev.v };
    if !rate {
        return Some(d);
    }
    let dt = (last.t - prev.t) as f64 / 1000.0;
    if dt == 0.0 {
        None
    } else {
        Some(d / dt)
    }
}

/// Least-squares slope and intercept at `at` (seconds), as Prometheus' linearRegression.
fn linear_regression(s: &[Sample], at: i64) -> Option<(f64, f64)> {
    if s.len() < 2 {
        return None;
    }
    let mut sums = arith::RegressionSums::default();
    for x in s {
        let t = (x.t - at) as f64 / 1000.0;
        sums.n += 1.0;
        sums.sx += t;
        sums.sy += x.v;
        sums.sxy += t * x.v;
        sums.sxx += t * t;
    }
    let const_y = s.iter().all(|x| x.v == s[0].v).then_some(s[0].v);
    Some(sums.line(const_y))
}

/// The range functions that reduce a window's values to one number, named once per query
/// rather than per window.
#[derive(Clone, Copy, PartialEq)]
enum OverTime {
    Avg,
    Sum,
    Min,
    Max,
    Count,
    First,
    Last,
    /// `ts_of_*_over_time`: the time (seconds) of the first, last, (last) minimum and
    /// (last) maximum sample.
    TsOfFirst,
    TsOfLast,
    TsOfMin,
    TsOfMax,
    Present,
    Stddev,
    Stdvar,
    Quantile,
    Changes,
    Resets,
}

impl OverTime {
    fn parse(name: &str) -> Option<OverTime> {
        Some(match name {
            "avg_over_time" => OverTime::Avg,
            "sum_over_time" => OverTime::Sum,
            "min_over_time" => OverTime::Min,
            "max_over_time" => OverTime::Max,
            "count_over_time" => OverTime::Count,
            "first_over_time" => OverTime::First,
            "last_over_time" => OverTime::Last,
            "ts_of_first_over_time" => OverTime::TsOfFirst,
            "ts_of_last_over_time" => OverTime::TsOfLast,
            "ts_of_min_over_time" => OverTime::TsOfMin,
            "ts_of_max_over_time" => OverTime::TsOfMax,
            "present_over_time" => OverTime::Present,
            "stddev_over_time" => OverTime::Stddev,
            "stdvar_over_time" => OverTime::Stdvar,
            "quantile_over_time" => OverTime::Quantile,
            "changes" => OverTime::Changes,
            "resets" => OverTime::Resets,
            _ => return None,
        })
    }

    /// The window's value; `s` is never empty. `q` is quantile_over_time's φ.
    fn apply(self, s: &[Sample], q: f64) -> f64 {
        let vals = || s.iter().map(|x| x.v);
        match self {
            OverTime::Avg => mean(vals()),
            OverTime::Sum => kahan_sum(vals()),
            OverTime::Min => vals().fold(f64::NAN, |m, x| if m.is_nan() || x < m { x } else { m }),
            OverTime::Max => vals().fold(f64::NAN, |m, x| if m.is_nan() || x > m { x } else { m }),
            OverTime::Count => s.len() as f64,
            OverTime::First => s[0].v,
            OverTime::Last => s[s.len() - 1].v,
            OverTime::TsOfFirst => s[0].t as f64 / 1000.0,
            OverTime::TsOfLast => s[s.len() - 1].t as f64 / 1000.0,
            // Prometheus' compareOverTime: `<=` and `>=`, so the last of equal extremes; a
            // NaN held is replaced by whatever comes next (all NaN: the last sample).
            OverTime::TsOfMin => extremum_time(s, |x, m| x <= m),
            OverTime::TsOfMax => extremum_time(s, |x, m| x >= m),
            OverTime::Present => 1.0,
            OverTime::Stddev => variance(vals()).sqrt(),
            OverTime::Stdvar => variance(vals()),
            OverTime::Quantile => quantile(q, &mut vals().collect::<Vec<_>>()),
            OverTime::Changes => {
                s.windows(2).filter(|w| w[0].v != w[1].v && !(w[0].v.is_nan() && w[1].v.is_nan())).count() as f64
            }
            OverTime::Resets => s.windows(2).filter(|w| w[1].v < w[0].v).count() as f64,
        }
    }
}

/// The time (seconds) of the sample `better` picks over the one held so far, or over a
/// NaN held.
fn extremum_time(s: &[Sample], better: impl Fn(f64, f64) -> bool) -> f64 {
    let (mut m, mut t) = (s[0].v, s[0].t);
    for x in s {
        if better(x.v, m) || m.is_nan() {
            (m, t) = (x.v, x.t);
        }
    }
    t as f64 / 1000.0
}

/// `*_over_time`, `changes` and `resets`.
fn over_time_call(ev: &Evaluator, c: &Call, kind: OverTime) -> Result<Val, QueryError> {
    match kind {
        OverTime::Quantile => {
            let q = scalar_arg(ev, c, 0)?;
            q.iter().for_each(|&x| ev.annotations.check_quantile(x, &c.args.args[0]));
            ev.range_windows(range_arg(c, 1)?, false, |i, s, _, _| Some(kind.apply(s, q[i])))
        }
        // The only ones that keep the metric name: a sample of the series, moved in time.
        OverTime::Last | OverTime::First => {
            ev.range_windows(range_arg(c, 0)?, true, |_, s, _, _| Some(kind.apply(s, 0.0)))
        }
        OverTime::Avg | OverTime::Sum => {
            ev.range_windows_with(range_arg(c, 0)?, false, IntegerPrefix::new, |prefix, w| match prefix {
                Some(p) if kind == OverTime::Avg => Some(p.sum(w.a, w.b) / (w.b - w.a) as f64),
                Some(p) => Some(p.sum(w.a, w.b)),
                None => Some(kind.apply(w.samples(), 0.0)),
            })
        }
        _ => ev.range_windows(range_arg(c, 0)?, false, |_, s, _, _| Some(kind.apply(s, 0.0))),
    }
}

fn math(name: &str, x: f64) -> Option<f64> {
    Some(match name {
        "abs" => x.abs(),
        "ceil" => x.ceil(),
        "floor" => x.floor(),
        "exp" => x.exp(),
        "ln" => x.ln(),
        "log2" => x.log2(),
        "log10" => x.log10(),
        "sqrt" => x.sqrt(),
        "sgn" => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        "sin" => x.sin(),
        "cos" => x.cos(),
        "tan" => x.tan(),
        "asin" => x.asin(),
        "acos" => x.acos(),
        "atan" => x.atan(),
        "sinh" => x.sinh(),
        "cosh" => x.cosh(),
        "tanh" => x.tanh(),
        "asinh" => x.asinh(),
        "acosh" => x.acosh(),
        "atanh" => x.atanh(),
        "deg" => x.to_degrees(),
        "rad" => x.to_radians(),
        _ => return None,
    })
}

/// (year, month 1-12, day 1-31) of days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn date_part(name: &str, secs: f64) -> Option<f64> {
    if !secs.is_finite() {
        return Some(f64::NAN);
    }
    let s = secs.floor() as i64;
    let days = s.div_euclid(86_400);
    let sod = s.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let month_days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    Some(match name {
        "year" => y as f64,
        "month" => m as f64,
        "day_of_month" => d as f64,
        "day_of_week" => (days + 4).rem_euclid(7) as f64,
        "day_of_year" => (month_days[..(m - 1) as usize].iter().sum::<u32>() + d) as f64,
        "days_in_month" => month_days[(m - 1) as usize] as f64,
        "hour" => (sod / 3600) as f64,
        "minute" => ((sod % 3600) / 60) as f64,
        _ => return None,
    })
}

/// `absent`'s answer: 1 with `labels` at the steps where no series of `v` has a value.
fn absent_where_empty(ev: &Evaluator, v: &[StepSeries], labels: Labels) -> Val {
    let vals: Vec<Option<f64>> =
        (0..ev.steps).map(|i| if v.iter().any(|s| s.vals[i].is_some()) { None } else { Some(1.0) }).collect();
    if vals.iter().all(Option::is_none) {
        return Val::Vector(vec![]);
    }
    Val::Vector(vec![StepSeries::new(labels, vals)])
}

/// Applies `f(step, value)` to every value; the metric name is dropped.
fn map_vector(ev: &Evaluator, v: Vec<StepSeries>, mut f: impl FnMut(usize, f64) -> Option<f64>) -> Val {
    Val::Vector(
        v.into_iter()
            .map(|s| {
                let (labels, drop_name) = ev.name_dropped(&s.labels);
                let vals = s.vals.iter().enumerate().map(|(i, x)| x.and_then(|x| f(i, x))).collect();
                StepSeries { labels, vals, drop_name }
            })
            .filter(|s| s.vals.iter().any(Option::is_some))
            .collect(),
    )
}

/// Holt's linear smoothing of a window (Prometheus 3's `double_exponential_smoothing`,
/// formerly `holt_winters`): the last smoothed value, or nothing with fewer than 2 samples.
fn double_exponential_smoothing(s: &[Sample], sf: f64, tf: f64) -> Option<f64> {
    if s.len() < 2 {
        return None;
    }
    let (mut s0, mut s1, mut b) = (0.0, s[0].v, s[1].v - s[0].v);
    for (i, x) in s.iter().enumerate().skip(1) {
        if i > 1 {
            b = tf * (s1 - s0) + (1.0 - tf) * b;
        }
        let next = sf * x.v + (1.0 - sf) * (s1 + b);
        s0 = s1;
        s1 = next;
    }
    Some(s1)
}

/// Functions behind Prometheus 3's experimental flag that Strata evaluates.
const EXPERIMENTAL_IMPLEMENTED: [&str; 9] = [
    "sort_by_label",
    "sort_by_label_desc",
    "mad_over_time",
    "double_exponential_smoothing",
    "first_over_time",
    "ts_of_first_over_time",
    "ts_of_last_over_time",
    "ts_of_min_over_time",
    "ts_of_max_over_time",
];

/// Orders label sets by the values of `names` in natural order (`2` before `10`), then by
/// the whole label set, as `sort_by_label` does.
pub fn compare_by_labels(a: &Labels, b: &Labels, names: &[String]) -> std::cmp::Ordering {
    names
        .iter()
        .map(|n| natural_cmp(a.get(n).unwrap_or(""), b.get(n).unwrap_or("")))
        .find(|o| o.is_ne())
        .unwrap_or_else(|| a.cmp(b))
}

/// Natural order: runs of digits compare as numbers, everything else byte by byte.
fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i].is_ascii_digit() && b[j].is_ascii_digit() {
            let (si, sj) = (i, j);
            while i < a.len() && a[i].is_ascii_digit() {
                i += 1;
            }
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            // Compare the digit runs as numbers without parsing: by length once leading
            // zeros are gone, then digit by digit.
            let x = trim_zeros(&a[si..i]);
            let y = trim_zeros(&b[sj..j]);
            let o = x.len().cmp(&y.len()).then_with(|| x.cmp(y));
            if o != Ordering::Equal {
                return o;
            }
        } else {
            if a[i] != b[j] {
                return a[i].cmp(&b[j]);
            }
            i += 1;
            j += 1;
        }
    }
    (a.len() - i).cmp(&(b.len() - j))
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let k = d.iter().position(|&c| c != b'0').unwrap_or(d.len());
    &d[k..]
}

pub fn call(ev: &Evaluator, c: &Call) -> Result<Val, QueryError> {
    let name = c.func.name;
    if c.func.experimental && !EXPERIMENTAL_IMPLEMENTED.contains(&name) {
        return Err(QueryError::Unsupported(format!("experimental function {name}()")));
    }
    let out = call_inner(ev, c, name)?;
    super::eval::check_unique(&out)?;
    Ok(out)
}

fn call_inner(ev: &Evaluator, c: &Call, name: &str) -> Result<Val, QueryError> {
    if let Some(kind) = OverTime::parse(name) {
        return over_time_call(ev, c, kind);
    }
    match name {
        "rate" | "increase" | "delta" => {
            let ms = range_arg(c, 0)?;
            let counter = name != "delta";
            if counter {
                if let Expr::MatrixSelector(m) = unparen(ms) {
                    for s in ev.selected(&m.vs) {
                        if let Some(info) = arith::might_not_be_a_counter(s.labels.metric_name().unwrap_or("")) {
                            ev.annotations.info_at(info, &c.args.args[0]);
                        }
                    }
                }
            }
            let prepare = |s: &[Sample]| counter.then(|| Resets::new(s));
            ev.range_windows_with(ms, false, prepare, |resets, w| {
                let drops = resets.as_ref().map(|r| r.within(w.a, w.b)).unwrap_or_default();
                extrapolated(
                    w.samples(),
                    w.start,
                    w.end,
                    counter,
                    name == "rate",
                    drops.iter().map(|&i| w.all[i - 1].v),
                )
            })
        }
        "irate" | "idelta" => ev.range_windows(range_arg(c, 0)?, false, |_, s, _, _| instant_delta(s, name == "irate")),
        "deriv" => ev.range_windows(range_arg(c, 0)?, false, |_, s, _, _| linear_regression(s, s[0].t).map(|x| x.0)),
        "predict_linear" => {
            let ms = range_arg(c, 0)?;
            let d = scalar_arg(ev, c, 1)?;
            // Anchored at the step's time, not the window's (which `@` may move).
            ev.range_windows(ms, false, |i, s, _, _| {
                linear_regression(s, ev.time(i)).map(|(slope, icpt)| icpt + slope * d[i])
            })
        }
        "time" => Ok(Val::Scalar((0..ev.steps).map(|i| ev.time(i) as f64 / 1000.0).collect())),
        "pi" => Ok(Val::Scalar(ev.points.vec(ev.steps, std::f64::consts::PI)?)),
        "vector" => {
            let v = scalar_arg(ev, c, 0)?;
            Ok(Val::Vector(vec![StepSeries::new(Labels::default(), v.into_iter().map(Some).collect())]))
        }
        "scalar" => {
            let v = vector_arg(ev, c, 0)?;
            Ok(Val::Scalar(
                (0..ev.steps)
                    .map(|i| {
                        let present: Vec<f64> = v.iter().filter_map(|s| s.vals[i]).collect();
                        if present.len() == 1 {
                            present[0]
                        } else {
                            f64::NAN
                        }
                    })
                    .collect(),
            ))
        }
        "timestamp" => match c.args.args.first().map(|b| unparen(b)) {
            // The timestamp of the sample each step's selector picked.
            Some(Expr::VectorSelector(vs)) => ev.selector_timestamps(vs),
            _ => {
                let v = vector_arg(ev, c, 0)?;
                Ok(map_vector(ev, v, |i, _| Some(ev.time(i) as f64 / 1000.0)))
            }
        },
        "absent_over_time" => {
            let arg = range_arg(c, 0)?;
            let present = ev.range_windows(arg, false, |_, _, _, _| Some(1.0))?;
            let Val::Vector(v) = present else { return Ok(Val::Vector(vec![])) };
            let labels = match arg {
                Expr::MatrixSelector(ms) => absent_labels_of(Some(&ms.vs)),
                _ => absent_labels_of(None),
            };
            Ok(absent_where_empty(ev, &v, labels))
        }
        "absent" => {
            let v = vector_arg(ev, c, 0)?;
            Ok(absent_where_empty(ev, &v, absent_labels(c)))
        }
        "round" => {
            let v = vector_arg(ev, c, 0)?;
            let to = if c.args.args.len() > 1 { scalar_arg(ev, c, 1)? } else { ev.points.vec(ev.steps, 1.0)? };
            Ok(map_vector(ev, v, |i, x| {
                let inv = 1.0 / to[i];
                Some((x * inv + 0.5).floor() / inv)
            }))
        }
        "clamp" => {
            let v = vector_arg(ev, c, 0)?;
            let (lo, hi) = (scalar_arg(ev, c, 1)?, scalar_arg(ev, c, 2)?);
            Ok(map_vector(ev, v, |i, x| if lo[i] > hi[i] { None } else { Some(go_max(lo[i], go_min(hi[i], x))) }))
        }
        "clamp_min" | "clamp_max" => {
            let v = vector_arg(ev, c, 0)?;
            let b = scalar_arg(ev, c, 1)?;
            Ok(map_vector(ev, v, |i, x| Some(if name == "clamp_min" { go_max(b[i], x) } else { go_min(b[i], x) })))
        }
        "sort" | "sort_desc" => vector_arg(ev, c, 0).map(Val::Vector),
        "mad_over_time" => ev.range_windows(range_arg(c, 0)?, false, |_, s, _, _| {
            // The median absolute deviation: the median of the distances to the median.
            let mut vals: Vec<f64> = s.iter().map(|x| x.v).collect();
            let median = quantile(0.5, &mut vals);
            let mut dev: Vec<f64> = s.iter().map(|x| (x.v - median).abs()).collect();
            Some(quantile(0.5, &mut dev))
        }),
        "double_exponential_smoothing" => {
            let sf = scalar_arg(ev, c, 1)?;
            let tf = scalar_arg(ev, c, 2)?;
            if let Some(bad) = sf.iter().find(|x| !(**x > 0.0 && **x < 1.0)) {
                return Err(QueryError::Execution(format!(
                    "invalid smoothing factor. Expected: 0 < sf < 1, got: {bad}"
                )));
            }
            if let Some(bad) = tf.iter().find(|x| !(**x > 0.0 && **x < 1.0)) {
                return Err(QueryError::Execution(format!("invalid trend factor. Expected: 0 < tf < 1, got: {bad}")));
            }
            ev.range_windows(range_arg(c, 0)?, false, |step, s, _, _| {
                double_exponential_smoothing(s, sf[step], tf[step])
            })
        }
        "sort_by_label" | "sort_by_label_desc" => {
            // The order is applied to the result (see `eval::sort_for`); here the labels
            // are checked and the vector passes through.
            for i in 1..c.args.args.len() {
                let l = string_arg(ev, c, i)?;
                if !strata_model::is_valid_label_name(&l) {
                    return Err(QueryError::Execution(format!("invalid label name {l:?}")));
                }
            }
            Ok(Val::Vector(vector_arg(ev, c, 0)?))
        }
        "histogram_quantile" => {
            let q = scalar_arg(ev, c, 0)?;
            let input = vector_arg(ev, c, 1)?;
            crate::histogram::histogram_quantile(ev, c, &q, input)
        }
        "label_replace" => {
            let v = vector_arg(ev, c, 0)?;
            let (dst, repl, src, re) =
                (string_arg(ev, c, 1)?, string_arg(ev, c, 2)?, string_arg(ev, c, 3)?, string_arg(ev, c, 4)?);
            let re = compile_anchored(&re).map_err(|e| {
                QueryError::BadData(format!("invalid regular expression in label_replace(): {re}: {e}"))
            })?;
            if !strata_model::is_valid_label_name(&dst) {
                return Err(QueryError::Execution(format!("invalid destination label name in label_replace(): {dst}")));
            }
            let out = v
                .into_iter()
                .map(|s| {
                    let val = s.labels.get(&src).unwrap_or("").to_string();
                    let labels = match re.captures(&val) {
                        Some(caps) => {
                            let mut res = String::new();
                            caps.expand(&repl, &mut res);
                            let mut b = s.labels.to_builder();
                            b.set(&dst, &res);
                            b.build()
                        }
                        None => s.labels,
                    };
                    // Writing the name keeps it: the series is named again.
                    StepSeries { labels, vals: s.vals, drop_name: s.drop_name && dst != METRIC_NAME }
                })
                .collect();
            Ok(Val::Vector(out))
        }
        "label_join" => {
            let v = vector_arg(ev, c, 0)?;
            let dst = string_arg(ev, c, 1)?;
            let sep = string_arg(ev, c, 2)?;
            let mut srcs = Vec::new();
            for i in 3..c.args.args.len() {
                srcs.push(string_arg(ev, c, i)?);
            }
            if !strata_model::is_valid_label_name(&dst) {
                return Err(QueryError::Execution(format!("invalid destination label name in label_join(): {dst}")));
            }
            if let Some(bad) = srcs.iter().find(|s| !strata_model::is_valid_label_name(s)) {
                return Err(QueryError::Execution(format!("invalid source label name in label_join(): {bad}")));
            }
            let out = v
                .into_iter()
                .map(|s| {
                    let joined = srcs.iter().map(|n| s.labels.get(n).unwrap_or("")).collect::<Vec<_>>().join(&sep);
                    let mut b = s.labels.to_builder();
                    b.set(&dst, &joined);
                    StepSeries { labels: b.build(), vals: s.vals, drop_name: s.drop_name && dst != METRIC_NAME }
                })
                .collect();
            Ok(Val::Vector(out))
        }
        n if date_part(n, 0.0).is_some() => {
            if c.args.args.is_empty() {
                let t: Vec<f64> = (0..ev.steps).map(|i| ev.time(i) as f64 / 1000.0).collect();
                let vals = t.iter().map(|x| date_part(n, *x)).collect();
                return Ok(Val::Vector(vec![StepSeries::new(Labels::default(), vals)]));
            }
            let v = vector_arg(ev, c, 0)?;
            Ok(map_vector(ev, v, |_, x| date_part(n, x)))
        }
        n if math(n, 0.0).is_some() => {
            let v = vector_arg(ev, c, 0)?;
            Ok(map_vector(ev, v, |_, x| math(n, x)))
        }
        other => Err(QueryError::Unsupported(format!("function {other}()"))),
    }
}

/// Go's `math.Max`/`math.Min`: NaN wins.
fn go_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn go_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// The labels `absent` gives its result, as Prometheus: each equality matcher of a plain
/// selector sets its label the first time; any other matcher on it, or a second one, removes it.
fn absent_labels(c: &Call) -> Labels {
    match c.args.args.first().map(|b| unparen(b)) {
        Some(Expr::VectorSelector(vs)) => absent_labels_of(Some(vs)),
        _ => absent_labels_of(None),
    }
}

fn absent_labels_of(vs: Option<&promql_parser::parser::VectorSelector>) -> Labels {
    let mut b = strata_model::LabelsBuilder::default();
    let mut seen = crate::HashSet::default();
    if let Some(vs) = vs {
        for m in &vs.matchers.matchers {
            if m.name == METRIC_NAME {
                continue;
            }
            if matches!(m.op, promql_parser::label::MatchOp::Equal) && !seen.contains(&m.name) {
                b.set(&m.name, &m.value);
            } else {
                b.del(&m.name);
            }
            seen.insert(m.name.clone());
        }
    }
    b.build()
}

#[cfg(all(test, feature = "testfile"))]
mod tests {
    use crate::testfile::{run_file, Report};

    /// Prometheus 3's `first_over_time` and `ts_of_*_over_time`: the first keeps the
    /// metric name (a sample moved in time, as `last_over_time`), the others give seconds;
    /// of equal extremes the last counts, a NaN is passed over, all NaN gives the last
    /// sample; staleness markers are not samples of a range.
    #[test]
    fn first_over_time_and_the_times_of_samples_as_prometheus() {
        let text = r#"
load 10s
  data{type="numbers"} 2 0 3
  data{type="ties"} 1 1 1
  data{type="some_nan"} 2 0 NaN
  data{type="some_nan2"} 2 NaN 1
  data{type="some_nan3"} NaN 0 1
  data{type="only_nan"} NaN NaN NaN
  data{type="stale"} 4 5 stale

eval instant at 1m first_over_time(data[2m])
  data{type="numbers"} 2
  data{type="ties"} 1
  data{type="some_nan"} 2
  data{type="some_nan2"} 2
  data{type="some_nan3"} NaN
  data{type="only_nan"} NaN
  data{type="stale"} 4

eval instant at 1m ts_of_first_over_time(data[2m])
  {type="numbers"} 0
  {type="ties"} 0
  {type="some_nan"} 0
  {type="some_nan2"} 0
  {type="some_nan3"} 0
  {type="only_nan"} 0
  {type="stale"} 0

eval instant at 1m ts_of_last_over_time(data[2m])
  {type="numbers"} 20
  {type="ties"} 20
  {type="some_nan"} 20
  {type="some_nan2"} 20
  {type="some_nan3"} 20
  {type="only_nan"} 20
  {type="stale"} 10

eval instant at 1m ts_of_min_over_time(data[2m])
  {type="numbers"} 10
  {type="ties"} 20
  {type="some_nan"} 10
  {type="some_nan2"} 20
  {type="some_nan3"} 10
  {type="only_nan"} 20
  {type="stale"} 0

eval instant at 1m ts_of_max_over_time(data[2m])
  {type="numbers"} 20
  {type="ties"} 20
  {type="some_nan"} 0
  {type="some_nan2"} 0
  {type="some_nan3"} 20
  {type="only_nan"} 20
  {type="stale"} 10

eval instant at 5m first_over_time(data[1m])
"#;
        let mut r = Report::default();
        run_file("inline", text, &mut r);
        assert!(r.failed.is_empty(), "{:#?}", r.failed);
        assert_eq!(r.passed, 6);
    }
}
