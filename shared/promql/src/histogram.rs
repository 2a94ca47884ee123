//! `histogram_quantile` over classic histograms: series with an `le` label are the
//! cumulative bucket counts of one histogram per label set without `le`. Prometheus 3's
//! `BucketQuantile`: buckets sorted by bound, equal bounds merged, a `+Inf` bucket required,
//! counts made monotonic (numerically insignificant differences silently, real decreases
//! with an info annotation), then linear interpolation within the bucket the rank falls in.

use crate::eval::{Evaluator, StepSeries, Val, VectorBuilder};
use crate::HashMap;
use crate::QueryError;
use promql_parser::parser::Call;
use strata_model::{Labels, METRIC_NAME};

const BUCKET_LABEL: &str = "le";
/// Relative differences below this between adjacent buckets are floating-point noise.
const SMALL_DELTA_TOLERANCE: f64 = 1e-12;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    upper: f64,
    count: f64,
}

/// Go's `almost.Equal`.
fn almost_equal(a: f64, b: f64, epsilon: f64) -> bool {
    const MIN_NORMAL: f64 = f64::MIN_POSITIVE;
    if a.is_nan() && b.is_nan() || a == b {
        return true;
    }
    let abs_sum = a.abs() + b.abs();
    let diff = (a - b).abs();
    if a == 0.0 || b == 0.0 || abs_sum < MIN_NORMAL {
        return diff < epsilon * MIN_NORMAL;
    }
    diff / abs_sum.min(f64::MAX) < epsilon
}

/// The `q`-quantile of the buckets, and whether monotonicity had to be forced.
fn bucket_quantile(q: f64, buckets: &mut Vec<Bucket>) -> (f64, bool) {
    if q.is_nan() {
        return (f64::NAN, false);
    }
    if q < 0.0 {
        return (f64::NEG_INFINITY, false);
    }
    if q > 1.0 {
        return (f64::INFINITY, false);
    }
    buckets.sort_by(|a, b| a.upper.partial_cmp(&b.upper).unwrap_or(std::cmp::Ordering::Equal));
    if buckets.last().is_none_or(|b| b.upper != f64::INFINITY) {
        return (f64::NAN, false);
    }
    // Coalesce buckets with the same bound.
    buckets.dedup_by(|later, kept| {
        if later.upper == kept.upper {
            kept.count += later.count;
            true
        } else {
            false
        }
    });
    let mut forced = false;
    let mut prev = buckets[0].count;
    for b in buckets.iter_mut().skip(1) {
        let curr = b.count;
        if curr == prev {
            continue;
        }
        if almost_equal(prev, curr, SMALL_DELTA_TOLERANCE) {
            b.count = prev;
            continue;
        }
        if curr < prev {
            b.count = prev;
            forced = true;
            continue;
        }
        prev = curr;
    }
    if buckets.len() < 2 {
        return (f64::NAN, forced);
    }
    let observations = buckets[buckets.len() - 1].count;
    if observations == 0.0 {
        return (f64::NAN, forced);
    }
    let mut rank = q * observations;
    let last = buckets.len() - 1;
    let b = buckets[..last].partition_point(|x| x.count < rank);
    if b == last {
        return (buckets[last - 1].upper, forced);
    }
    if b == 0 && buckets[0].upper <= 0.0 {
        return (buckets[0].upper, forced);
    }
    let (mut start, end, mut count) = (0.0, buckets[b].upper, buckets[b].count);
    if b > 0 {
        start = buckets[b - 1].upper;
        count -= buckets[b - 1].count;
        rank -= buckets[b - 1].count;
    }
    (start + (end - start) * (rank / count), forced)
}

/// `histogram_quantile(q, buckets)` at every step.
/// Annotations about the quantile point at `c`'s first argument, those about the buckets
/// at its second, as Prometheus places them.
pub fn histogram_quantile(ev: &Evaluator, c: &Call, q: &[f64], input: Vec<StepSeries>) -> Result<Val, QueryError> {
    let (q_arg, buckets_arg) = (&c.args.args[0], &c.args.args[1]);
    // Each series' histogram (its labels without `le`), the output labels (without the
    // metric name too) and its bound; series without a numeric `le` are ignored.
    let mut keys: HashMap<Labels, usize> = HashMap::default();
    let mut outputs: Vec<Labels> = Vec::new();
    let mut members: Vec<(usize, f64, &StepSeries)> = Vec::new();
    for s in &input {
        let Some(upper) = s.labels.get(BUCKET_LABEL).and_then(parse_bound) else {
            let name = s.labels.metric_name().unwrap_or("");
            let le = s.labels.get(BUCKET_LABEL).unwrap_or("");
            ev.annotations.warn_at(format!("PromQL warning: bucket label \"le\" is missing or has a malformed value of {le:?} for metric name {name:?}"), buckets_arg);
            continue;
        };
        let mut key = s.labels.to_builder();
        key.del(BUCKET_LABEL);
        let key = key.build();
        let next = outputs.len();
        let h = *keys.entry(key.clone()).or_insert(next);
        if h == next {
            let mut out = key.to_builder();
            out.del(METRIC_NAME);
            outputs.push(out.build());
        }
        members.push((h, upper, s));
    }
    q.iter().for_each(|&x| ev.annotations.check_quantile(x, q_arg));
    let mut builder = VectorBuilder::new(ev);
    let mut per_hist: Vec<Vec<Bucket>> = vec![Vec::new(); outputs.len()];
    for (i, &q) in q.iter().enumerate().take(ev.steps) {
        ev.check_stop()?;
        per_hist.iter_mut().for_each(Vec::clear);
        for (h, upper, s) in &members {
            if let Some(count) = s.vals[i] {
                per_hist[*h].push(Bucket { upper: *upper, count });
            }
        }
        for (h, buckets) in per_hist.iter_mut().enumerate() {
            if buckets.is_empty() {
                continue;
            }
            let (v, forced) = bucket_quantile(q, buckets);
            if forced {
                let name = members.iter().find(|m| m.0 == h).and_then(|m| m.2.labels.metric_name()).unwrap_or("");
                ev.annotations.info_at(format!("PromQL info: input to histogram_quantile needed to be fixed for monotonicity (see https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile) for metric name {name:?}"), buckets_arg);
            }
            builder.set(outputs[h].clone(), i, v)?;
        }
    }
    Ok(builder.finish())
}

/// An `le` value in any float spelling Go's `strconv.ParseFloat` accepts.
fn parse_bound(s: &str) -> Option<f64> {
    let t = s.trim();
    match t.to_ascii_lowercase().as_str() {
        "+inf" | "inf" | "+infinity" | "infinity" => Some(f64::INFINITY),
        "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
        "nan" => Some(f64::NAN),
        _ => t.parse::<f64>().ok().or_else(|| parse_hex_float(t)),
    }
}

/// Go accepts hexadecimal floats (`0x1p-2`); they are rare in `le` but legal.
fn parse_hex_float(s: &str) -> Option<f64> {
    let (neg, rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let rest = rest.strip_prefix("0x").or_else(|| rest.strip_prefix("0X"))?;
    let (mant, exp) = match rest.split_once(['p', 'P']) {
        Some((m, e)) => (m, e.parse::<i32>().ok()?),
        None => (rest, 0),
    };
    let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
    let mut v = 0f64;
    for c in int.chars().chain(frac.chars()) {
        v = v * 16.0 + f64::from(c.to_digit(16)?);
    }
    let frac_digits = i32::try_from(frac.len()).ok()?;
    let v = v * 2f64.powi(exp - 4 * frac_digits);
    Some(if neg { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(qv: f64, b: &[(f64, f64)]) -> f64 {
        let mut v: Vec<Bucket> = b.iter().map(|&(upper, count)| Bucket { upper, count }).collect();
        bucket_quantile(qv, &mut v).0
    }

    #[test]
    fn interpolates_like_prometheus() {
        let b = [(0.1, 10.0), (0.5, 60.0), (1.0, 90.0), (f64::INFINITY, 100.0)];
        assert!((q(0.5, &b) - 0.42).abs() < 1e-12);
        assert_eq!(q(0.99, &b), 1.0, "in the +Inf bucket: the second-highest bound");
        assert_eq!(q(-0.1, &b), f64::NEG_INFINITY);
        assert_eq!(q(1.1, &b), f64::INFINITY);
        assert!(q(f64::NAN, &b).is_nan());
        assert!(q(0.5, &[(0.1, 1.0), (0.5, 2.0)]).is_nan(), "no +Inf bucket");
        assert!(q(0.5, &[(f64::INFINITY, 0.0), (1.0, 0.0)]).is_nan(), "no observations");
        // unsorted input and a decrease forced monotonic
        let mut v: Vec<Bucket> = [(f64::INFINITY, 100.0), (1.0, 80.0), (0.5, 90.0)]
            .iter()
            .map(|&(upper, count)| Bucket { upper, count })
            .collect();
        assert!(bucket_quantile(0.5, &mut v).1);
    }

    #[test]
    fn bounds_in_any_float_spelling() {
        assert_eq!(parse_bound("+Inf"), Some(f64::INFINITY));
        assert_eq!(parse_bound("1e-3"), Some(0.001));
        assert_eq!(parse_bound("0x1p-2"), Some(0.25));
        assert_eq!(parse_bound("1_000"), None, "as Go: underscores only with a base prefix");
        assert_eq!(parse_bound("x"), None);
    }
}
