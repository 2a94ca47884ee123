//! Aggregation operators, per step and per group.

use super::eval::{Evaluator, StepSeries, Val, VectorBuilder};
use super::QueryError;
use crate::HashMap;
use promql_parser::parser::{AggregateExpr, LabelModifier};
use rayon::prelude::*;
use strata_model::arith::KahanSum;
use strata_model::value::format_value;
use strata_model::{Labels, LabelsBuilder, METRIC_NAME};

fn group_labels(l: &Labels, m: &Option<LabelModifier>) -> Labels {
    let mut b: LabelsBuilder = l.to_builder();
    match m {
        Some(LabelModifier::Include(by)) => b.retain(|x| by.labels.iter().any(|n| n.as_str() == x.name.as_ref())),
        Some(LabelModifier::Exclude(without)) => b.retain(|x| {
            x.name.as_ref() != METRIC_NAME && !without.labels.iter().any(|n| n.as_str() == x.name.as_ref())
        }),
        None => b.retain(|_| false),
    }
    b.build()
}

/// Prometheus' quantile over sorted values (linear interpolation, φ outside [0,1] → ±Inf).
pub(crate) fn quantile(q: f64, values: &mut [f64]) -> f64 {
    if values.is_empty() || q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    let n = values.len() as f64;
    let rank = q * (n - 1.0);
    let lower = (rank.floor().max(0.0) as usize).min(values.len() - 1);
    let w = rank - rank.floor();
    // The values at ranks `lower` and `lower + 1` of the sorted values, without sorting
    // them all: a total order puts the same values there either way.
    let (_, at_lower, above) = values.select_nth_unstable_by(lower, nan_first);
    let at_lower = *at_lower;
    let at_upper = above.iter().copied().min_by(nan_first).unwrap_or(at_lower);
    at_lower * (1.0 - w) + at_upper * w
}

/// Prometheus' order for a quantile: every NaN before every number (Go's float sort),
/// the numbers in their order.
pub(crate) fn nan_first(a: &f64, b: &f64) -> std::cmp::Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Less,
        (false, true) => std::cmp::Ordering::Greater,
        _ => a.total_cmp(b),
    }
}

/// Prometheus' mean: a Kahan-compensated sum divided by the count while the sum stays
/// finite; once it would overflow, an incremental mean from there on (infinities kept).
pub(crate) fn mean(vals: impl IntoIterator<Item = f64>) -> f64 {
    let mut m = Mean::default();
    vals.into_iter().for_each(|x| m.push(x));
    m.value()
}

/// [`mean`] one value at a time.
#[derive(Clone, Copy, Default)]
struct Mean {
    count: usize,
    sum: KahanSum,
    incremental: Option<KahanSum>,
}

impl Mean {
    fn push(&mut self, x: f64) {
        if self.count == 0 {
            // The first value starts the sum as it is, as a new group does in Prometheus.
            (self.count, self.sum) = (1, KahanSum { sum: x, c: 0.0 });
            return;
        }
        self.count += 1;
        let n = self.count as f64;
        let m = match self.incremental.as_mut() {
            Some(m) => m,
            None => {
                let mut next = self.sum;
                next.add(x);
                if !next.sum.is_infinite() {
                    self.sum = next;
                    return;
                }
                let sum = self.sum;
                self.incremental.insert(KahanSum { sum: sum.sum / (n - 1.0), c: sum.c / (n - 1.0) })
            }
        };
        if m.sum.is_infinite() && ((x.is_infinite() && (m.sum > 0.0) == (x > 0.0)) || (!x.is_infinite() && !x.is_nan()))
        {
            return;
        }
        let current = m.sum + m.c;
        m.add(x / n - current / n);
    }

    fn value(&self) -> f64 {
        match (self.count, self.incremental) {
            (0, _) => f64::NAN,
            (_, Some(m)) => m.sum + m.c,
            (n, None) => self.sum.value() / n as f64,
        }
    }
}

/// The running state of an aggregation that needs its values one at a time, in series
/// order, and never all at once: what lets a group's steps fold series by series.
#[derive(Clone, Copy)]
enum Fold {
    Sum(KahanSum),
    Avg(Mean),
    Min(f64),
    Max(f64),
    Count(f64),
}

impl Fold {
    fn new(kind: Simple) -> Option<Fold> {
        Some(match kind {
            Simple::Sum => Fold::Sum(KahanSum::default()),
            Simple::Avg => Fold::Avg(Mean::default()),
            Simple::Min => Fold::Min(f64::NAN),
            Simple::Max => Fold::Max(f64::NAN),
            Simple::Count | Simple::Group => Fold::Count(0.0),
            Simple::Stddev | Simple::Stdvar | Simple::Quantile => return None,
        })
    }

    fn push(&mut self, x: f64) {
        match self {
            Fold::Sum(k) => k.add(x),
            Fold::Avg(m) => m.push(x),
            Fold::Min(m) => {
                if m.is_nan() || x < *m {
                    *m = x
                }
            }
            Fold::Max(m) => {
                if m.is_nan() || x > *m {
                    *m = x
                }
            }
            Fold::Count(n) => *n += 1.0,
        }
    }

    fn value(&self, kind: Simple) -> f64 {
        match (self, kind) {
            (_, Simple::Group) => 1.0,
            (Fold::Sum(k), _) => k.value(),
            (Fold::Avg(m), _) => m.value(),
            (Fold::Min(x) | Fold::Max(x) | Fold::Count(x), _) => *x,
        }
    }
}

/// Group × step states past which an aggregation gathers step by step instead of folding.
const MAX_FOLD_STATES: usize = 1 << 20;

/// Welford's running variance, as Prometheus.
pub(crate) fn variance(vals: impl IntoIterator<Item = f64>) -> f64 {
    let (mut count, mut mean, mut m2) = (0.0, 0.0, 0.0);
    for x in vals {
        count += 1.0;
        let delta = x - mean;
        mean += delta / count;
        m2 += delta * (x - mean);
    }
    m2 / count
}

pub(crate) fn kahan_sum(vals: impl IntoIterator<Item = f64>) -> f64 {
    let mut k = KahanSum::default();
    vals.into_iter().for_each(|x| k.add(x));
    k.value()
}

pub fn eval(ev: &Evaluator, a: &AggregateExpr) -> Result<Val, QueryError> {
    let op = a.op.to_string();
    let Val::Vector(input) = ev.eval(&a.expr)? else {
        return Err(QueryError::BadData(format!("expected instant vector in aggregation {op}")));
    };
    let param = match &a.param {
        Some(p) => Some(ev.eval(p)?),
        None => None,
    };
    let scalar_param = |i: usize| -> Result<f64, QueryError> {
        match &param {
            Some(Val::Scalar(v)) => Ok(v[i]),
            _ => Err(QueryError::BadData(format!("expected scalar parameter for {op}"))),
        }
    };
    let groups: Vec<Labels> = input.iter().map(|s| group_labels(&s.labels, &a.modifier)).collect();
    // Delayed name removal: a group keyed by a name still to be dropped drops it in the end.
    let marked: Vec<bool> =
        input.iter().zip(&groups).map(|(s, g)| s.drop_name && g.get(METRIC_NAME).is_some()).collect();
    let mut out = VectorBuilder::new(ev);
    match op.as_str() {
        "topk" | "bottomk" | "limitk" => {
            let mut keep: Vec<Vec<Option<f64>>> = input.iter().map(|s| vec![None; s.vals.len()]).collect();
            // A series' group never changes: numbered once, not hashed at every step.
            let mut ids: HashMap<&Labels, usize> = HashMap::default();
            let member: Vec<usize> = groups
                .iter()
                .map(|g| {
                    let n = ids.len();
                    *ids.entry(g).or_insert(n)
                })
                .collect();
            let mut heaps: Vec<Option<KHeap>> = Vec::new();
            heaps.resize_with(ids.len(), || None);
            // `i` is a step: it indexes a column of `keep` (`keep[series][step]`), not its rows.
            #[allow(clippy::needless_range_loop)]
            for i in 0..ev.steps {
                ev.check_stop()?;
                let k = scalar_param(i)?;
                if k.is_nan() {
                    return Err(QueryError::Execution(format!("Parameter value is NaN for {op}")));
                }
                let k = if k >= 1.0 { k.min(1e9) as usize } else { 0 };
                // Prometheus keeps the k best in a heap per group, visiting series in order;
                // replaying its heap exactly decides ties at the k-th place as it does.
                for (j, s) in input.iter().enumerate() {
                    let Some(x) = s.vals[i] else { continue };
                    let heap = heaps[member[j]].get_or_insert_with(|| KHeap::new(op.as_str() == "bottomk"));
                    match op.as_str() {
                        "limitk" => {
                            if heap.items.len() < k {
                                heap.items.push((x, j));
                            }
                        }
                        _ => heap.offer(k, (x, j)),
                    }
                }
                for heap in heaps.iter_mut().filter_map(Option::take) {
                    for (x, j) in heap.items {
                        keep[j][i] = Some(x);
                    }
                }
            }
            let series = input
                .into_iter()
                .zip(keep)
                .filter(|(_, v)| v.iter().any(Option::is_some))
                .map(|(s, vals)| StepSeries { vals, ..s })
                .collect();
            return Ok(Val::Vector(series));
        }
        "limit_ratio" => {
            // Keeps the series whose stable label hash falls under the ratio (negative ratios
            // keep the complement), as Prometheus: the same series are kept at every step.
            // Prometheus 3.0 reads the ratio once, at the first step, and applies it to all
            // (its conformance file relies on that: `limit_ratio(time() % 17/17, ...)`).
            let first = scalar_param(0)?;
            if !first.is_nan() && !(-1.0..=1.0).contains(&first) {
                let capped = first.clamp(-1.0, 1.0);
                let message =
                    format!("PromQL warning: ratio value should be between -1 and 1, got {first}, capping to {capped}");
                match a.param.as_deref() {
                    Some(p) => ev.annotations.warn_at(message, p),
                    None => ev.annotations.warn(message),
                }
            }
            let mut keep: Vec<Vec<Option<f64>>> = input.iter().map(|s| vec![None; s.vals.len()]).collect();
            // `i` is a step: it indexes a column of `keep` (`keep[series][step]`), not its rows.
            #[allow(clippy::needless_range_loop)]
            for i in 0..ev.steps {
                ev.check_stop()?;
                let r = first;
                if r.is_nan() {
                    return Err(QueryError::Execution("Ratio value is NaN".into()));
                }
                let r = r.clamp(-1.0, 1.0);
                for (j, s) in input.iter().enumerate() {
                    let Some(x) = s.vals[i] else { continue };
                    let h = ratio_hash(&s.labels);
                    if (r >= 0.0 && h < r) || (r < 0.0 && h >= 1.0 + r) {
                        keep[j][i] = Some(x);
                    }
                }
            }
            let series = input
                .into_iter()
                .zip(keep)
                .filter(|(_, v)| v.iter().any(Option::is_some))
                .map(|(s, vals)| StepSeries { vals, ..s })
                .collect();
            return Ok(Val::Vector(series));
        }
        "count_values" => {
            let Some(Val::Str(label)) = &param else {
                return Err(QueryError::BadData("count_values needs a string parameter".into()));
            };
            if !strata_model::is_valid_label_name(label) {
                return Err(QueryError::Execution(format!("invalid label name {label:?}")));
            }
            for i in 0..ev.steps {
                ev.check_stop()?;
                let mut counts: HashMap<Labels, (f64, bool)> = HashMap::default();
                for (j, s) in input.iter().enumerate() {
                    if let Some(x) = s.vals[i] {
                        let mut b = groups[j].to_builder();
                        b.set(label, &format_value(x));
                        let c = counts.entry(b.build()).or_insert((0.0, marked[j]));
                        c.0 += 1.0;
                    }
                }
                for (l, (c, m)) in counts {
                    out.set_marked(l, m, i, c)?;
                }
            }
            return Ok(out.finish());
        }
        _ => {}
    }
    // A series' group never changes: number the groups once, then gather per step.
    let mut group_ids: HashMap<&Labels, usize> = HashMap::default();
    let mut group_labels_list: Vec<&Labels> = Vec::new();
    let mut group_marked: Vec<bool> = Vec::new();
    let member: Vec<usize> = groups
        .iter()
        .zip(&marked)
        .map(|(g, &m)| {
            *group_ids.entry(g).or_insert_with(|| {
                group_marked.push(m);
                group_labels_list.push(g);
                group_labels_list.len() - 1
            })
        })
        .collect();
    let kind = match op.as_str() {
        "sum" => Simple::Sum,
        "avg" => Simple::Avg,
        "min" => Simple::Min,
        "max" => Simple::Max,
        "count" => Simple::Count,
        "group" => Simple::Group,
        "stddev" => Simple::Stddev,
        "stdvar" => Simple::Stdvar,
        "quantile" => Simple::Quantile,
        other => return Err(QueryError::Unsupported(format!("aggregation {other}"))),
    };
    let phi: Vec<f64> = match kind {
        Simple::Quantile => {
            let q: Vec<f64> = (0..ev.steps).map(scalar_param).collect::<Result<_, _>>()?;
            if let Some(p) = a.param.as_deref() {
                q.iter().for_each(|&x| ev.annotations.check_quantile(x, p));
            }
            q
        }
        _ => Vec::new(),
    };
    let groups_n = group_labels_list.len();
    // Sum, avg, min, max, count, group: each group's steps fold the series in order, read
    // series by series (each series' values lie together), with the same arithmetic.
    let states = groups_n.saturating_mul(ev.steps);
    if let Some(start) = Fold::new(kind).filter(|_| states <= MAX_FOLD_STATES) {
        let mut folds: Vec<(bool, Fold)> = vec![(false, start); states];
        for (j, s) in input.iter().enumerate() {
            let row = &mut folds[member[j] * ev.steps..(member[j] + 1) * ev.steps];
            for (f, v) in row.iter_mut().zip(&s.vals) {
                if let Some(x) = v {
                    f.0 = true;
                    f.1.push(*x);
                }
            }
        }
        let series = folds
            .chunks(ev.steps.max(1))
            .enumerate()
            .filter(|(_, row)| row.iter().any(|f| f.0))
            .map(|(gi, row)| StepSeries {
                labels: group_labels_list[gi].clone(),
                vals: row.iter().map(|f| f.0.then(|| f.1.value(kind))).collect(),
                drop_name: group_marked[gi],
            })
            .collect();
        return Ok(Val::Vector(series));
    }
    // Steps are independent: each gathers its groups' values in series order and reduces
    // them; the steps run in parallel and are transposed into series at the end.
    let per_step: Vec<Vec<Option<f64>>> = (0..ev.steps)
        .into_par_iter()
        .map_init(
            || vec![Vec::new(); groups_n],
            |by_group: &mut Vec<Vec<f64>>, i| {
                by_group.iter_mut().for_each(Vec::clear);
                for (j, s) in input.iter().enumerate() {
                    if let Some(x) = s.vals[i] {
                        by_group[member[j]].push(x);
                    }
                }
                by_group
                    .iter_mut()
                    .map(|vals| (!vals.is_empty()).then(|| kind.reduce(vals, phi.get(i).copied().unwrap_or(0.0))))
                    .collect()
            },
        )
        .collect();
    let series = (0..groups_n)
        .filter_map(|gi| {
            let vals: Vec<Option<f64>> = per_step.iter().map(|v| v[gi]).collect();
            vals.iter().any(Option::is_some).then(|| StepSeries {
                labels: group_labels_list[gi].clone(),
                vals,
                drop_name: group_marked[gi],
            })
        })
        .collect();
    Ok(Val::Vector(series))
}

/// The aggregations that reduce a group's values at a step to one number.
#[derive(Clone, Copy)]
enum Simple {
    Sum,
    Avg,
    Min,
    Max,
    Count,
    Group,
    Stddev,
    Stdvar,
    Quantile,
}

impl Simple {
    fn reduce(self, vals: &mut [f64], phi: f64) -> f64 {
        match self {
            Simple::Sum => kahan_sum(vals.iter().copied()),
            Simple::Avg => mean(vals.iter().copied()),
            Simple::Min => vals.iter().copied().fold(f64::NAN, |m, x| if m.is_nan() || x < m { x } else { m }),
            Simple::Max => vals.iter().copied().fold(f64::NAN, |m, x| if m.is_nan() || x > m { x } else { m }),
            Simple::Count => vals.len() as f64,
            Simple::Group => 1.0,
            Simple::Stddev => variance(vals.iter().copied()).sqrt(),
            Simple::Stdvar => variance(vals.iter().copied()),
            Simple::Quantile => quantile(phi, vals),
        }
    }
}

/// The heap `topk` and `bottomk` keep per group: Go's `container/heap` with Prometheus'
/// ordering (NaN below everything), so that equal values at the k-th place are decided
/// exactly as Prometheus decides them, which depends on the heap's shape.
struct KHeap {
    items: Vec<(f64, usize)>,
    /// `bottomk`: the largest value at the top.
    reverse: bool,
}

impl KHeap {
    fn new(reverse: bool) -> KHeap {
        KHeap { items: Vec::new(), reverse }
    }

    fn less(&self, i: usize, j: usize) -> bool {
        let (a, b) = (self.items[i].0, self.items[j].0);
        if a.is_nan() {
            return true;
        }
        if self.reverse {
            a > b
        } else {
            a < b
        }
    }

    /// Prometheus' step: push while under k, else replace the top when `x` beats it.
    fn offer(&mut self, k: usize, x: (f64, usize)) {
        if k == 0 {
            return;
        }
        if self.items.len() < k {
            self.items.push(x);
            self.up(self.items.len() - 1);
            return;
        }
        let top = self.items[0].0;
        let beats = if self.reverse { top > x.0 } else { top < x.0 };
        if beats || (top.is_nan() && !x.0.is_nan()) {
            self.items[0] = x;
            if k > 1 && !self.down(0) {
                self.up(0);
            }
        }
    }

    fn up(&mut self, mut j: usize) {
        while j > 0 {
            let i = (j - 1) / 2;
            if !self.less(j, i) {
                break;
            }
            self.items.swap(i, j);
            j = i;
        }
    }

    fn down(&mut self, i0: usize) -> bool {
        let n = self.items.len();
        let mut i = i0;
        loop {
            let j1 = 2 * i + 1;
            if j1 >= n {
                break;
            }
            let mut j = j1;
            if j1 + 1 < n && self.less(j1 + 1, j1) {
                j = j1 + 1;
            }
            if !self.less(j, i) {
                break;
            }
            self.items.swap(i, j);
            i = j;
        }
        i > i0
    }
}

/// A series' position in [0, 1] for `limit_ratio`: Prometheus' `labels.Hash()` (xxhash64 of
/// the labels packed as length-prefixed names and values, its default `stringlabels` form)
/// over `MaxUint64`, so the same series are kept as in Prometheus.
fn ratio_hash(l: &Labels) -> f64 {
    let mut buf = Vec::with_capacity(256);
    let mut put = |b: &[u8]| {
        let mut n = b.len();
        while n >= 0x80 {
            buf.push((n as u8) | 0x80);
            n >>= 7;
        }
        buf.push(n as u8);
        buf.extend_from_slice(b);
    };
    for x in l.iter() {
        put(x.name.as_bytes());
        put(x.value.as_bytes());
    }
    xxhash_rust::xxh64::xxh64(&buf, 0) as f64 / u64::MAX as f64
}

#[cfg(test)]
mod tests {
    use super::KHeap;

    /// The selection gives the sorted values' interpolation bit for bit, NaNs, signed
    /// zeros, infinities and ties included; NaNs sort first, as in Prometheus: the lowest
    /// quantile of values with a NaN is NaN, the highest the largest number.
    #[test]
    fn quantile_by_selection_equals_quantile_by_sorting() {
        let pool = [f64::NAN, -f64::NAN, 0.0, -0.0, 1.5, -2.25, f64::INFINITY, f64::NEG_INFINITY, 7.0, 7.0, 1e300];
        let mut seed = 7u64;
        for n in 1..40 {
            for _ in 0..50 {
                let values: Vec<f64> = (0..n)
                    .map(|_| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        pool[(seed >> 33) as usize % pool.len()]
                    })
                    .collect();
                for q in [0.0, 0.1, 0.5, 0.9, 0.99, 1.0] {
                    let mut sorted = values.clone();
                    sorted.sort_by(super::nan_first);
                    let rank = q * (n as f64 - 1.0);
                    let lower = rank.floor() as usize;
                    let upper = (lower + 1).min(n - 1);
                    let w = rank - rank.floor();
                    let want = sorted[lower] * (1.0 - w) + sorted[upper] * w;
                    let got = super::quantile(q, &mut values.clone());
                    // A NaN's sign and payload depend on how the arithmetic was compiled
                    // (release builds fold differently) and no answer shows them.
                    if want.is_nan() {
                        assert!(got.is_nan(), "{values:?} at {q}: {got}");
                        continue;
                    }
                    assert_eq!(got.to_bits(), want.to_bits(), "{values:?} at {q}");
                }
            }
        }
        assert!(super::quantile(0.0, &mut [2.0, f64::NAN, 1.0]).is_nan());
        assert_eq!(super::quantile(1.0, &mut [f64::NAN, 2.0, 1.0]), 2.0);
        assert_eq!(super::quantile(0.75, &mut [f64::NAN, 2.0, 1.0]), 1.5);
    }

    fn kept(values: &[f64], k: usize, reverse: bool) -> Vec<usize> {
        let mut h = KHeap::new(reverse);
        for (j, &x) in values.iter().enumerate() {
            h.offer(k, (x, j));
        }
        let mut v: Vec<usize> = h.items.into_iter().map(|(_, j)| j).collect();
        v.sort();
        v
    }

    #[test]
    fn ties_at_the_kth_place_are_decided_by_the_heap_as_in_prometheus() {
        // A stable sort would keep the first 5; Prometheus' heap has the second on top
        // when 7 arrives, so the first is the one replaced.
        assert_eq!(kept(&[5.0, 5.0, 7.0], 2, false), vec![1, 2]);
        assert_eq!(kept(&[5.0, 5.0, 3.0], 2, true), vec![1, 2]);
        assert_eq!(kept(&[1.0, f64::NAN, 2.0, 3.0], 2, false), vec![2, 3]);
        assert_eq!(kept(&[4.0, 9.0, 1.0], 0, false), Vec::<usize>::new());
    }
}
