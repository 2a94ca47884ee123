//! Phase two: step-by-step evaluation over the fetched samples.

use super::fetch::{self, Fetched};
use super::{aggregate, binary, functions, QueryError, QueryValue, SeriesPoints};
use crate::limits::PointBudget;
use crate::HashMap;
use promql_parser::parser::{Expr, SubqueryExpr, VectorSelector};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use strata_model::{is_stale, Labels, LabelsBuilder, Sample, METRIC_NAME};
use strata_store::Steps;

/// One series of an instant vector evaluated at every step.
#[derive(Debug, Clone)]
pub struct StepSeries {
    pub labels: Labels,
    pub vals: Vec<Option<f64>>,
    /// Delayed name removal: an operation dropped the metric name, but it stays in `labels`
    /// (for `label_replace`, `label_join` and grouping) until the query's result is returned.
    pub drop_name: bool,
}

impl StepSeries {
    pub fn new(labels: Labels, vals: Vec<Option<f64>>) -> Self {
        StepSeries { labels, vals, drop_name: false }
    }
}

#[derive(Debug, Clone)]
pub enum Val {
    /// One value per step.
    Scalar(Vec<f64>),
    Str(String),
    Vector(Vec<StepSeries>),
    /// Only as the result of an instant query of a range selector.
    Matrix(Vec<SeriesPoints>),
}

/// Prometheus' annotations of one query: warnings (the answer may be wrong) and infos
/// (the answer may surprise), each message once, in order of first appearance. Those about
/// one argument of a call or an aggregation name its node, so the answer can say where it
/// stands in the query text (see [`crate::positions`]).
#[derive(Debug, Default)]
pub struct Annotations {
    items: std::sync::Mutex<Vec<Annotation>>,
}

#[derive(Debug)]
struct Annotation {
    info: bool,
    message: String,
    /// The argument's [`node_key`](crate::positions::node_key).
    at: Option<usize>,
}

impl Annotations {
    /// Prometheus' warning for a quantile outside [0, 1], once per query; `arg` is the
    /// quantile's node.
    pub fn check_quantile(&self, q: f64, arg: &Expr) {
        if q.is_nan() || !(0.0..=1.0).contains(&q) {
            self.warn_at(format!("PromQL warning: quantile value should be between 0 and 1, got {}", go_float(q)), arg);
        }
    }

    pub fn warn(&self, message: String) {
        self.add(false, message, None);
    }

    pub fn info(&self, message: String) {
        self.add(true, message, None);
    }

    /// A warning about the argument `arg`.
    pub fn warn_at(&self, message: String, arg: &Expr) {
        self.add(false, message, Some(crate::positions::node_key(arg)));
    }

    /// An info about the argument `arg`.
    pub fn info_at(&self, message: String, arg: &Expr) {
        self.add(true, message, Some(crate::positions::node_key(arg)));
    }

    /// Kept once per message, as Prometheus keys annotations by their text before it adds
    /// positions: the position is the last one added (its map assignment overwrites).
    fn add(&self, info: bool, message: String, at: Option<usize>) {
        if let Ok(mut v) = self.items.lock() {
            match v.iter_mut().find(|a| a.info == info && a.message == message) {
                Some(a) => a.at = at.or(a.at),
                None => v.push(Annotation { info, message, at }),
            }
        }
    }

    /// (warnings, infos), without positions.
    pub fn take(&self) -> (Vec<String>, Vec<String>) {
        self.take_with(|_| None)
    }

    /// (warnings, infos), each about an argument ending with what `suffix` says of it
    /// (Prometheus' ` (line:column)`); messages that come out equal are kept once.
    pub fn take_with(&self, suffix: impl Fn(usize) -> Option<String>) -> (Vec<String>, Vec<String>) {
        let items = self.items.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default();
        let (mut warnings, mut infos) = (Vec::new(), Vec::new());
        for a in items {
            let text = match a.at.and_then(&suffix) {
                Some(s) => a.message + &s,
                None => a.message,
            };
            let list = if a.info { &mut infos } else { &mut warnings };
            if !list.contains(&text) {
                list.push(text);
            }
        }
        (warnings, infos)
    }
}

/// A float as Go's `%g` prints the values annotations carry (`NaN`, `-0.1`, `1.01`, `+Inf`).
fn go_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// Collects output series by label set, one value per step.
pub struct VectorBuilder {
    steps: usize,
    points: Arc<PointBudget>,
    index: HashMap<Labels, usize>,
    pub series: Vec<StepSeries>,
}

impl VectorBuilder {
    pub fn new(ev: &Evaluator) -> Self {
        VectorBuilder { steps: ev.steps, points: ev.points.clone(), index: HashMap::default(), series: Vec::new() }
    }

    /// Sets a value; a second value for the same labels at the same step is Prometheus'
    /// "vector cannot contain metrics with the same labelset".
    pub fn set(&mut self, labels: Labels, step: usize, v: f64) -> Result<(), QueryError> {
        self.set_marked(labels, false, step, v)
    }

    /// [`set`](Self::set) for a series whose name is to be dropped at the end (delayed
    /// name removal); the mark of a series' first value holds.
    pub fn set_marked(&mut self, labels: Labels, drop_name: bool, step: usize, v: f64) -> Result<(), QueryError> {
        let i = match self.index.get(&labels) {
            Some(&i) => i,
            None => {
                let vals = self.points.vec(self.steps, None)?;
                self.series.push(StepSeries { labels: labels.clone(), vals, drop_name });
                self.index.insert(labels, self.series.len() - 1);
                self.series.len() - 1
            }
        };
        let slot = &mut self.series[i].vals[step];
        if slot.is_some() {
            return Err(QueryError::Execution("vector cannot contain metrics with the same labelset".into()));
        }
        *slot = Some(v);
        Ok(())
    }

    pub fn finish(self) -> Val {
        Val::Vector(self.series)
    }
}

/// Prometheus' "vector cannot contain metrics with the same labelset": after the metric
/// name is dropped, two series may coincide at a step.
pub fn check_unique(v: &Val) -> Result<(), QueryError> {
    let Val::Vector(series) = v else { return Ok(()) };
    let mut by_labels: HashMap<&Labels, usize> = HashMap::default();
    for (i, s) in series.iter().enumerate() {
        if let Some(&j) = by_labels.get(&s.labels) {
            if s.vals.iter().zip(&series[j].vals).any(|(a, b)| a.is_some() && b.is_some()) {
                return Err(QueryError::Execution("vector cannot contain metrics with the same labelset".into()));
            }
        } else {
            by_labels.insert(&s.labels, i);
        }
    }
    Ok(())
}

/// Delayed name removal, at the end of a query: drops the names still marked, then refuses
/// two series left with the same labels, as Prometheus does (even at different steps).
fn remove_marked_names(v: Val) -> Result<Val, QueryError> {
    let Val::Vector(mut series) = v else { return Ok(v) };
    for s in series.iter_mut().filter(|s| s.drop_name) {
        s.labels = drop_name(&s.labels);
        s.drop_name = false;
    }
    let mut seen = crate::HashSet::with_capacity_and_hasher(series.len(), Default::default());
    if !series.iter().all(|s| seen.insert(&s.labels)) {
        return Err(QueryError::Execution("vector cannot contain metrics with the same labelset".into()));
    }
    Ok(Val::Vector(series))
}

pub fn drop_name(l: &Labels) -> Labels {
    if l.get(METRIC_NAME).is_none() {
        return l.clone();
    }
    let mut b: LabelsBuilder = l.to_builder();
    b.del(METRIC_NAME);
    b.build()
}

/// A series computed on a subquery's grid: labels, its delayed-name-removal mark, samples.
type OwnedSeries = (Labels, bool, Vec<Sample>);

/// One range window at one step: the samples `all[a..b]` of a series, in `(start, end]`.
pub struct Window<'s> {
    pub all: &'s [Sample],
    pub a: usize,
    pub b: usize,
    pub start: i64,
    pub end: i64,
    pub step: usize,
}

impl<'s> Window<'s> {
    pub fn samples(&self) -> &'s [Sample] {
        &self.all[self.a..self.b]
    }
}

/// Samples a series' evaluation touches before it charges them to the query's budget.
const CHARGE_BATCH: u64 = 1 << 16;

/// The number of samples at or before `t` in a time-ordered slice, for times that mostly
/// move forward: it walks on from the previous answer, and searches when `t` goes back
/// (an `@` modifier or a subquery's offset can do that).
#[derive(Default)]
struct Cursor {
    at: usize,
    last: Option<i64>,
}

impl Cursor {
    #[inline]
    fn upto(&mut self, samples: &[Sample], t: i64) -> usize {
        if self.last.is_some_and(|l| t < l) {
            self.at = samples.partition_point(|x| x.t <= t);
        } else {
            while self.at < samples.len() && samples[self.at].t <= t {
                self.at += 1;
            }
        }
        self.last = Some(t);
        self.at
    }
}

pub struct Evaluator<'a> {
    data: &'a Fetched,
    /// The outermost query's range, which `@ start()` and `@ end()` refer to.
    query_start: i64,
    query_end: i64,
    pub start: i64,
    pub end: i64,
    pub step: i64,
    pub steps: usize,
    lookback: i64,
    max_samples: u64,
    samples: AtomicU64,
    /// Values held in per-step buffers, charged before each is allocated.
    pub points: Arc<PointBudget>,
    /// Evaluation stops with a timeout past this instant: checked as samples are charged,
    /// so a long evaluation is cancelled for real and everything it held is freed.
    deadline: Option<(std::time::Instant, std::time::Duration)>,
    checks: AtomicU32,
    /// Samples charged since the clock was last read.
    unchecked: AtomicU64,
    /// Set when the query's caller went away: checked with the deadline.
    canceled: Option<Arc<AtomicBool>>,
    /// Prometheus' annotations (warnings and infos), shared with subqueries' evaluators.
    pub annotations: Arc<Annotations>,
    /// Samples touched at each step, when the caller asked for per-step statistics
    /// (`stats=all`); subqueries' inner grids do not count here.
    per_step: Option<Vec<AtomicU64>>,
    /// Prometheus 3's experimental delayed name removal: operations that drop the metric
    /// name mark the series instead, and names go when the result is returned.
    delayed_name_removal: bool,
}

impl<'a> Evaluator<'a> {
    pub fn new(data: &'a Fetched, start: i64, end: i64, step: i64, lookback: i64, max_samples: u64) -> Self {
        let steps = if step <= 0 { 1 } else { usize::try_from(end.saturating_sub(start) / step + 1).unwrap_or(0) };
        Evaluator {
            data,
            query_start: start,
            query_end: end,
            start,
            end,
            step,
            steps,
            lookback,
            max_samples,
            samples: AtomicU64::new(0),
            points: Arc::new(PointBudget::new(max_samples)),
            deadline: None,
            checks: AtomicU32::new(0),
            unchecked: AtomicU64::new(0),
            canceled: None,
            annotations: Arc::default(),
            per_step: None,
            delayed_name_removal: false,
        }
    }

    /// Prometheus' `--enable-feature=promql-delayed-name-removal`.
    pub fn with_delayed_name_removal(mut self, on: bool) -> Self {
        self.delayed_name_removal = on;
        self
    }

    pub fn delayed_name_removal(&self) -> bool {
        self.delayed_name_removal
    }

    /// The labels and mark of a series an operation drops the name of: dropped now, or
    /// marked for the end of the query with delayed name removal.
    pub fn name_dropped(&self, labels: &Labels) -> (Labels, bool) {
        if self.delayed_name_removal {
            (labels.clone(), true)
        } else {
            (drop_name(labels), false)
        }
    }

    /// Counts the samples each step touches, for `stats=all`.
    pub fn with_step_stats(mut self) -> Result<Self, QueryError> {
        self.points.charge(self.steps as u64)?;
        self.per_step = Some((0..self.steps).map(|_| AtomicU64::new(0)).collect());
        Ok(self)
    }

    /// Samples touched so far (Prometheus' `totalQueryableSamples`).
    pub fn samples_touched(&self) -> u64 {
        self.samples.load(Relaxed)
    }

    /// Samples touched per step, if counted: (time, samples).
    pub fn step_stats(&self) -> Option<Vec<(i64, u64)>> {
        self.per_step.as_ref().map(|v| v.iter().enumerate().map(|(i, n)| (self.time(i), n.load(Relaxed))).collect())
    }

    #[inline]
    fn count_step(&self, step: usize, n: u64) {
        if let Some(v) = &self.per_step {
            v[step].fetch_add(n, Relaxed);
        }
    }

    /// Sets the flag that, once true, stops evaluation with [`QueryError::Canceled`].
    pub fn with_cancel(mut self, flag: Arc<AtomicBool>) -> Self {
        self.canceled = Some(flag);
        self
    }

    /// Sets the instant past which evaluation fails with [`QueryError::Timeout`].
    pub fn with_deadline(mut self, at: std::time::Instant, timeout: std::time::Duration) -> Self {
        self.deadline = Some((at, timeout));
        self
    }

    /// An evaluator for a subquery's inner grid, sharing data, bounds and the budgets.
    fn inner(&self, start: i64, end: i64, step: i64) -> Evaluator<'a> {
        // `check` bounded every time involved, so the difference cannot overflow; a grid
        // too large to index is refused by the point budget at its first buffer.
        let steps = if end < start {
            0
        } else {
            usize::try_from(end.saturating_sub(start) / step.max(1) + 1).unwrap_or(usize::MAX)
        };
        Evaluator {
            data: self.data,
            query_start: self.query_start,
            query_end: self.query_end,
            start,
            end,
            step,
            steps,
            lookback: self.lookback,
            max_samples: self.max_samples,
            samples: AtomicU64::new(self.samples.load(Relaxed)),
            points: self.points.clone(),
            deadline: self.deadline,
            checks: AtomicU32::new(0),
            unchecked: AtomicU64::new(0),
            canceled: self.canceled.clone(),
            annotations: self.annotations.clone(),
            per_step: None,
            delayed_name_removal: self.delayed_name_removal,
        }
    }

    /// A subquery's result as series of samples on its inner grid, with the evaluation
    /// time of each outer step.
    fn subquery_series(&self, sq: &SubqueryExpr) -> Result<(Vec<OwnedSeries>, Vec<i64>), QueryError> {
        let (s, e, st) = fetch::subquery_grid(sq, self.start, self.end, self.query_start, self.query_end);
        let inner = self.inner(s, e, st);
        let series = match inner.eval(&sq.expr)? {
            Val::Vector(v) => v
                .into_iter()
                .map(|x| {
                    let samples = x
                        .vals
                        .iter()
                        .enumerate()
                        .filter_map(|(k, v)| v.map(|v| Sample::new(inner.time(k), v)))
                        .collect();
                    (x.labels, x.drop_name, samples)
                })
                .collect(),
            Val::Scalar(v) => {
                vec![(
                    Labels::default(),
                    false,
                    v.iter().enumerate().map(|(k, v)| Sample::new(inner.time(k), *v)).collect(),
                )]
            }
            _ => return Err(QueryError::BadData("subquery is only allowed on instant vector".into())),
        };
        self.charge(inner.samples.load(Relaxed).saturating_sub(self.samples.load(Relaxed)))?;
        let at = fetch::at_ms(&sq.at, self.query_start, self.query_end);
        let o = fetch::offset_ms(&sq.offset);
        self.points.charge(self.steps as u64)?;
        let times = (0..self.steps).map(|i| at.unwrap_or_else(|| self.time(i)).saturating_sub(o)).collect();
        Ok((series, times))
    }

    pub fn time(&self, i: usize) -> i64 {
        (i as i64).saturating_mul(self.step.max(0)).saturating_add(self.start)
    }

    /// Counts samples a step touches (`totalQueryableSamples`), checking the deadline as
    /// they go. Touched samples are not held: the limit, as Prometheus' `--query.max-samples`,
    /// is on what a query holds at once (the samples fetched, the points of its steps and
    /// range vectors), which `fetch` and [`PointBudget`] count; the work of reading the
    /// same samples in many overlapping windows is bounded by the timeout, as there.
    pub fn charge(&self, n: u64) -> Result<(), QueryError> {
        self.samples.fetch_add(n, Relaxed);
        // Reading the clock on every call would cost more than the work it guards, so it is
        // read every 256 calls or every ~1M samples touched, whichever comes first (a call
        // over a long window touches many).
        let c = self.checks.fetch_add(1, Relaxed).wrapping_add(1);
        let since = self.unchecked.fetch_add(n, Relaxed).saturating_add(n);
        if c.is_multiple_of(256) || since >= 1 << 20 {
            self.unchecked.store(0, Relaxed);
            self.check_stop()?;
        }
        Ok(())
    }

    /// Fails when the deadline has passed or the caller went away.
    pub fn check_stop(&self) -> Result<(), QueryError> {
        if let Some((at, timeout)) = self.deadline {
            if std::time::Instant::now() > at {
                return Err(QueryError::Timeout(timeout));
            }
        }
        if self.canceled.as_ref().is_some_and(|c| c.load(Relaxed)) {
            return Err(QueryError::Canceled);
        }
        Ok(())
    }

    /// The series a selector selected (before evaluation).
    pub fn selected(&self, vs: &VectorSelector) -> &'a [fetch::FetchedSeries] {
        self.series_of(vs)
    }

    fn series_of(&self, vs: &VectorSelector) -> &'a [fetch::FetchedSeries] {
        self.data.series.get(&fetch::key(vs)).map(|v| v.as_slice()).unwrap_or(&[])
    }

    /// The evaluation time of a selector at step `i`: `@` fixes it, `offset` shifts it.
    pub fn selector_time(&self, vs: &VectorSelector, i: usize) -> i64 {
        fetch::at_ms(&vs.at, self.query_start, self.query_end)
            .unwrap_or_else(|| self.time(i))
            .saturating_sub(fetch::offset_ms(&vs.offset))
    }

    fn vector_selector(&self, vs: &VectorSelector) -> Result<Val, QueryError> {
        self.points.charge(self.steps as u64)?;
        let times: Vec<i64> = (0..self.steps).map(|i| self.selector_time(vs, i)).collect();
        let out: Vec<Option<StepSeries>> = self
            .series_of(vs)
            .par_iter()
            .map(|s| {
                let mut vals = self.points.vec(self.steps, None)?;
                let mut n = 0u64;
                s.with_samples(|samples| {
                    let mut cursor = Cursor::default();
                    for (i, (v, &t)) in vals.iter_mut().zip(&times).enumerate() {
                        // The latest sample at or before t, within the lookback window (t - lookback, t].
                        let idx = cursor.upto(samples, t);
                        let Some(x) = idx.checked_sub(1).map(|i| samples[i]) else { continue };
                        if x.t <= t.saturating_sub(self.lookback) || is_stale(x.v) {
                            continue;
                        }
                        *v = Some(x.v);
                        n += 1;
                        self.count_step(i, 1);
                    }
                })?;
                if n == 0 {
                    return Ok(None);
                }
                self.charge(n)?;
                Ok(Some(StepSeries::new(s.labels.clone(), vals)))
            })
            .collect::<Result<_, QueryError>>()?;
        Ok(Val::Vector(out.into_iter().flatten().collect()))
    }

    /// A leaf a store evaluated (pushdown), as evaluating it here would give it: its
    /// samples and points charged, its annotations kept, the metric name dropped (or marked
    /// for delayed removal) where the function drops it.
    fn pushed(&self, steps: &Steps) -> Result<Val, QueryError> {
        self.charge(steps.samples)?;
        let kept = steps.series.len().saturating_add(steps.groups.len()) as u64;
        self.points.charge(kept.saturating_mul(self.steps as u64))?;
        steps.warnings.iter().for_each(|w| self.annotations.warn(w.clone()));
        steps.infos.iter().for_each(|i| self.annotations.info(i.clone()));
        let mut out = Vec::with_capacity(steps.series.len());
        // An aggregation's groups, or a leaf's series; a series without a value is no
        // series of the vector (as evaluating here drops it).
        let series = if steps.groups.is_empty() { &steps.series } else { &steps.groups };
        for s in series.iter().filter(|s| !s.values.is_empty()) {
            if s.values.steps() != self.steps {
                return Err(QueryError::Execution(format!(
                    "a store evaluated {} steps of {} for {}",
                    s.values.steps(),
                    self.steps,
                    s.labels
                )));
            }
            let (labels, drop_name) =
                if s.name_dropped { self.name_dropped(&s.labels) } else { (s.labels.clone(), false) };
            out.push(StepSeries { labels, vals: s.values.to_options(), drop_name });
        }
        let v = Val::Vector(out);
        check_unique(&v)?;
        Ok(v)
    }

    /// `timestamp(selector)`: the time of the sample the selector picks at each step.
    pub fn selector_timestamps(&self, vs: &VectorSelector) -> Result<Val, QueryError> {
        let mut out = Vec::new();
        for s in self.series_of(vs) {
            let mut vals = self.points.vec(self.steps, None)?;
            s.with_samples(|samples| {
                for (i, v) in vals.iter_mut().enumerate() {
                    let t = self.selector_time(vs, i);
                    let idx = samples.partition_point(|x| x.t <= t);
                    if idx > 0 {
                        let x = samples[idx - 1];
                        if x.t > t.saturating_sub(self.lookback) && !is_stale(x.v) {
                            *v = Some(x.t as f64 / 1000.0);
                        }
                    }
                }
            })?;
            if vals.iter().any(Option::is_some) {
                let (labels, drop_name) = self.name_dropped(&s.labels);
                out.push(StepSeries { labels, vals, drop_name });
            }
        }
        let v = Val::Vector(out);
        check_unique(&v)?;
        Ok(v)
    }

    /// Calls `f(step, window, t - range, t)` with each series' non-empty window `(t - range, t]`
    /// at every step (staleness markers removed) and collects its results. `arg` is a range
    /// selector or a subquery.
    pub fn range_windows(
        &self,
        arg: &Expr,
        keep_name: bool,
        f: impl Fn(usize, &[Sample], i64, i64) -> Option<f64> + Sync,
    ) -> Result<Val, QueryError> {
        self.range_windows_with(arg, keep_name, |_| (), |_, w| f(w.step, w.samples(), w.start, w.end))
    }

    /// [`range_windows`](Self::range_windows) for functions that prepare something per
    /// series first (`prepare`), which `f` then uses at every step.
    pub fn range_windows_with<P>(
        &self,
        arg: &Expr,
        keep_name: bool,
        prepare: impl Fn(&[Sample]) -> P + Sync,
        f: impl Fn(&P, &Window) -> Option<f64> + Sync,
    ) -> Result<Val, QueryError> {
        // Each series' windows, for a series whose samples are at hand.
        let windows = |labels: &Labels,
                       marked: bool,
                       samples: &[Sample],
                       times: &[i64],
                       range: i64|
         -> Result<Option<StepSeries>, QueryError> {
            let prepared = prepare(samples);
            let mut vals = self.points.vec(self.steps, None)?;
            let mut any = false;
            let (mut lo, mut hi) = (Cursor::default(), Cursor::default());
            // Charged in batches: a shared counter touched per window would cost more
            // than the windows, and the deadline is still checked every few thousand.
            let mut pending = 0u64;
            for (i, v) in vals.iter_mut().enumerate() {
                let t = times[i];
                let (a, b) = (lo.upto(samples, t.saturating_sub(range)), hi.upto(samples, t));
                if a >= b {
                    continue;
                }
                pending += (b - a) as u64;
                self.count_step(i, (b - a) as u64);
                if pending >= CHARGE_BATCH {
                    self.charge(std::mem::take(&mut pending))?;
                }
                if let Some(r) =
                    f(&prepared, &Window { all: samples, a, b, start: t.saturating_sub(range), end: t, step: i })
                {
                    *v = Some(r);
                    any = true;
                }
            }
            self.charge(pending)?;
            Ok(any.then(|| {
                let (labels, drop_name) = if keep_name { (labels.clone(), false) } else { self.name_dropped(labels) };
                StepSeries { labels, vals, drop_name: drop_name || marked }
            }))
        };
        let out: Vec<Option<StepSeries>> = match arg {
            Expr::MatrixSelector(ms) => {
                self.points.charge(self.steps as u64)?;
                let times: Vec<i64> = (0..self.steps).map(|i| self.selector_time(&ms.vs, i)).collect();
                let range = ms.range.as_millis() as i64;
                self.series_of(&ms.vs)
                    .par_iter()
                    .map(|s| {
                        s.with_samples(|samples| {
                            // Range windows never hold staleness markers.
                            samples.retain(|x| !is_stale(x.v));
                            windows(&s.labels, false, samples, &times, range)
                        })?
                    })
                    .collect::<Result<_, QueryError>>()?
            }
            Expr::Subquery(sq) => {
                let (series, times) = self.subquery_series(sq)?;
                let range = sq.range.as_millis() as i64;
                series
                    .par_iter()
                    .map(|(labels, marked, samples)| windows(labels, *marked, samples, &times, range))
                    .collect::<Result<_, QueryError>>()?
            }
            _ => return Err(QueryError::BadData("expected a range vector".into())),
        };
        Ok(Val::Vector(out.into_iter().flatten().collect()))
    }

    pub fn eval(&self, e: &Expr) -> Result<Val, QueryError> {
        match e {
            Expr::NumberLiteral(n) => Ok(Val::Scalar(self.points.vec(self.steps, n.val)?)),
            Expr::StringLiteral(s) => Ok(Val::Str(s.val.clone())),
            Expr::Paren(p) => self.eval(&p.expr),
            Expr::Unary(u) => match self.eval(&u.expr)? {
                Val::Scalar(v) => Ok(Val::Scalar(v.into_iter().map(|x| -x).collect())),
                Val::Vector(v) => {
                    let out = Val::Vector(
                        v.into_iter()
                            .map(|s| {
                                let (labels, drop_name) = self.name_dropped(&s.labels);
                                let vals = s.vals.into_iter().map(|x| x.map(|x| -x)).collect();
                                StepSeries { labels, vals, drop_name: drop_name || s.drop_name }
                            })
                            .collect(),
                    );
                    check_unique(&out)?;
                    Ok(out)
                }
                _ => Err(QueryError::BadData("unary minus needs a scalar or an instant vector".into())),
            },
            Expr::VectorSelector(vs) => match self.data.pushed.get(&crate::pushdown::node_key(e)) {
                Some(steps) => self.pushed(steps),
                None => self.vector_selector(vs),
            },
            Expr::MatrixSelector(ms) => {
                if self.steps != 1 {
                    return Err(QueryError::BadData(
                        "invalid expression type \"range vector\" for range query, must be Scalar or instant Vector"
                            .into(),
                    ));
                }
                let t = self.selector_time(&ms.vs, 0);
                let range = ms.range.as_millis() as i64;
                let mut out = Vec::new();
                for s in self.series_of(&ms.vs) {
                    let points: Vec<(i64, f64)> = s.with_samples(|samples| {
                        samples
                            .iter()
                            .filter(|x| x.t > t - range && x.t <= t && !is_stale(x.v))
                            .map(|x| (x.t, x.v))
                            .collect()
                    })?;
                    self.charge(points.len() as u64)?;
                    self.points.charge(points.len() as u64)?;
                    self.count_step(0, points.len() as u64);
                    if !points.is_empty() {
                        out.push(SeriesPoints { labels: s.labels.clone(), points });
                    }
                }
                Ok(Val::Matrix(out))
            }
            Expr::Call(c) => match self.data.pushed.get(&crate::pushdown::node_key(e)) {
                Some(steps) => self.pushed(steps),
                None => functions::call(self, c),
            },
            Expr::Aggregate(a) => match self.data.pushed.get(&crate::pushdown::node_key(e)) {
                Some(steps) => self.pushed(steps),
                None => aggregate::eval(self, a),
            },
            Expr::Binary(b) => binary::eval(self, b),
            Expr::Subquery(sq) => {
                if self.steps != 1 {
                    return Err(QueryError::BadData(
                        "invalid expression type \"range vector\" for range query, must be Scalar or instant Vector"
                            .into(),
                    ));
                }
                let (series, times) = self.subquery_series(sq)?;
                let (t, range) = (times[0], sq.range.as_millis() as i64);
                Ok(Val::Matrix(
                    series
                        .into_iter()
                        .filter_map(|(labels, marked, s)| {
                            // A range vector is only ever a query's result: its marks apply now.
                            let labels = if marked { drop_name(&labels) } else { labels };
                            let points: Vec<(i64, f64)> =
                                s.iter().filter(|x| x.t > t - range && x.t <= t).map(|x| (x.t, x.v)).collect();
                            (!points.is_empty()).then_some(SeriesPoints { labels, points })
                        })
                        .collect(),
                ))
            }
            Expr::Extension(_) => Err(QueryError::Unsupported("extension expressions".into())),
        }
    }

    /// Evaluates a query's whole expression: [`eval`](Self::eval), then delayed name removal.
    fn eval_result(&self, e: &Expr) -> Result<Val, QueryError> {
        let v = self.eval(e)?;
        if self.delayed_name_removal {
            remove_marked_names(v)
        } else {
            Ok(v)
        }
    }

    pub fn instant_result(&self, e: &Expr, time: i64) -> Result<QueryValue, QueryError> {
        Ok(match self.eval_result(e)? {
            Val::Scalar(v) => QueryValue::Scalar(time, v[0]),
            Val::Str(s) => QueryValue::String(time, s),
            Val::Vector(v) => {
                let mut out: Vec<(Labels, i64, f64)> =
                    v.into_iter().filter_map(|s| s.vals[0].map(|x| (s.labels, time, x))).collect();
                sort_for(e, &mut out);
                QueryValue::Vector(out)
            }
            Val::Matrix(m) => QueryValue::Matrix(m),
        })
    }

    pub fn range_result(&self, e: &Expr, steps: usize) -> Result<QueryValue, QueryError> {
        let mut out = match self.eval_result(e)? {
            Val::Scalar(v) => vec![SeriesPoints {
                labels: Labels::default(),
                points: v.into_iter().enumerate().map(|(i, x)| (self.time(i), x)).collect(),
            }],
            Val::Str(_) => {
                return Err(QueryError::BadData(
                    "invalid expression type \"string\" for range query, must be Scalar or instant Vector".into(),
                ))
            }
            Val::Vector(v) => v
                .into_iter()
                .filter_map(|s| {
                    let points: Vec<(i64, f64)> = s
                        .vals
                        .iter()
                        .enumerate()
                        .take(steps)
                        .filter_map(|(i, x)| x.map(|x| (self.time(i), x)))
                        .collect();
                    (!points.is_empty()).then_some(SeriesPoints { labels: s.labels, points })
                })
                .collect(),
            Val::Matrix(_) => {
                return Err(QueryError::BadData(
                    "invalid expression type \"range vector\" for range query, must be Scalar or instant Vector".into(),
                ))
            }
        };
        out.sort_by(|a, b| a.labels.cmp(&b.labels));
        Ok(QueryValue::Matrix(merge_same_labels(out)?))
    }
}

/// A range query's series are keyed by their labels over all steps, as Prometheus keys them:
/// two series an expression gave the same labels at different steps (`a > 9 or a < 1`) are
/// one series. `series` is sorted by labels; a step with two values is Prometheus' error.
fn merge_same_labels(series: Vec<SeriesPoints>) -> Result<Vec<SeriesPoints>, QueryError> {
    let mut out: Vec<SeriesPoints> = Vec::with_capacity(series.len());
    for s in series {
        match out.last_mut() {
            Some(last) if last.labels == s.labels => {
                last.points.extend(s.points);
                last.points.sort_by_key(|p| p.0);
                if last.points.windows(2).any(|w| w[0].0 == w[1].0) {
                    return Err(QueryError::Execution("vector cannot contain metrics with the same labelset".into()));
                }
            }
            _ => out.push(s),
        }
    }
    Ok(out)
}

/// Instant results of `sort`, `sort_desc`, `topk` and `bottomk` come in their order (NaN last).
fn sort_for(e: &Expr, v: &mut [(Labels, i64, f64)]) {
    let mut e = e;
    while let Expr::Paren(p) = e {
        e = &p.expr;
    }
    if let Expr::Call(c) = e {
        if c.func.name == "sort_by_label" || c.func.name == "sort_by_label_desc" {
            let names: Vec<String> = c
                .args
                .args
                .iter()
                .skip(1)
                .filter_map(|a| match a.as_ref() {
                    Expr::StringLiteral(s) => Some(s.val.clone()),
                    _ => None,
                })
                .collect();
            let desc = c.func.name == "sort_by_label_desc";
            v.sort_by(|a, b| {
                let o = crate::functions::compare_by_labels(&a.0, &b.0, &names);
                if desc {
                    o.reverse()
                } else {
                    o
                }
            });
            return;
        }
    }
    let desc = match e {
        Expr::Call(c) if c.func.name == "sort" => false,
        Expr::Call(c) if c.func.name == "sort_desc" => true,
        Expr::Aggregate(a) if a.op.to_string() == "topk" => true,
        Expr::Aggregate(a) if a.op.to_string() == "bottomk" => false,
        _ => return,
    };
    v.sort_by(|a, b| match (a.2.is_nan(), b.2.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Greater,
        (false, true) => std::cmp::Ordering::Less,
        _ if desc => b.2.total_cmp(&a.2),
        _ => a.2.total_cmp(&b.2),
    });
}

#[cfg(test)]
mod tests {
    use crate::{Engine, EngineOptions, QueryValue};
    use strata_model::{Labels, MetricType, Sample};
    use strata_store::memory::MemoryStore;

    #[test]
    fn a_range_result_keys_series_by_labels_over_all_steps() {
        let mut store = MemoryStore::default();
        let labels = Labels::from_pairs([("__name__", "a".to_string())]);
        store.add(labels, MetricType::Gauge, (0..10).map(|i| Sample::new(i * 60_000, i as f64)));
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let engine = Engine::new(EngineOptions::default());
        // Both sides keep the name: one series, its points from whichever side had one.
        let expr = crate::parse("a > 6 or a < 3").unwrap();
        let QueryValue::Matrix(m) = rt.block_on(engine.range(&store, &expr, 0, 540_000, 60_000)).unwrap() else {
            panic!("a range query answers a matrix")
        };
        assert_eq!(m.len(), 1, "{m:?}");
        let values: Vec<f64> = m[0].points.iter().map(|p| p.1).collect();
        assert_eq!(values, [0.0, 1.0, 2.0, 7.0, 8.0, 9.0]);
        assert!(m[0].points.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
