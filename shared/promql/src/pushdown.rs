//! Pushdown, both ends (see `strata_store::steps`): which leaves of a query a store may
//! evaluate ([`leaves`]), and how a store evaluates one ([`evaluate`]) with this same
//! engine, so a pushed leaf gives what evaluating it above would.
//!
//! A leaf is a node whose value at each step comes from one series' samples: an instant
//! selector, or a range function with a range selector as its only argument. Leaves under
//! a subquery (another grid), with `@` (a fixed time) or under `timestamp()` (which reads
//! sample times, not values) stay with the engine above.

use crate::eval::{Evaluator, Val};
use crate::fetch::{self, FetchedSeries};
use crate::QueryError;
use promql_parser::label::Matchers;
use promql_parser::parser::{
    AggregateExpr, Call, Expr, FunctionArgs, LabelModifier, MatrixSelector, Offset, VectorSelector,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_model::Labels;
use strata_model::{Matcher, Metadata};
use strata_store::{
    AggregateSpec, SelectBudget, SelectLimits, SelectRequest, SeriesChunks, SeriesSummary, Steps, StepsRequest,
    StepsSeries, Store, StoreError,
};

/// Range functions whose value at a step is one series' window: the ones a store may
/// evaluate.
pub const RANGE_FUNCTIONS: &[&str] = &[
    "rate",
    "increase",
    "delta",
    "irate",
    "idelta",
    "deriv",
    "changes",
    "resets",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "last_over_time",
    "present_over_time",
    "stddev_over_time",
    "stdvar_over_time",
];

/// The key of a node in an expression tree (its address: the tree is not moved while a
/// query runs).
pub fn node_key(e: &Expr) -> usize {
    e as *const Expr as usize
}

/// Aggregations a store may evaluate over a leaf, when it holds every series of a group.
pub const AGGREGATIONS: &[&str] = &["sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "quantile"];

/// Comparisons a pushed aggregation may filter its leaf with.
const COMPARISONS: &[&str] = &["==", "!=", ">", "<", ">=", "<="];

/// A part of a query a store may evaluate: a leaf, or an aggregation over one (with the
/// leaf to fall back to when no store can take the aggregation).
pub struct Pushable {
    pub node: usize,
    pub req: StepsRequest,
    pub leaf: Option<(usize, StepsRequest)>,
}

/// The parts of `e` stores may evaluate on the query's grid, each keyed by its node.
pub fn leaves(
    e: &Expr,
    (start, end, step): (i64, i64, i64),
    lookback: i64,
    limits: SelectLimits,
) -> Result<Vec<Pushable>, QueryError> {
    let mut out = Vec::new();
    walk(e, &mut |found| {
        let req = |vs: &VectorSelector, function: Option<(String, i64)>| -> Result<StepsRequest, QueryError> {
            Ok(StepsRequest {
                matchers: fetch::matchers(vs)?,
                start,
                end,
                step,
                offset: fetch::offset_ms(&vs.offset),
                lookback,
                function,
                limits,
                values: true,
                only: None,
                aggregate: None,
            })
        };
        let leaf = (found.leaf.node, req(found.leaf.vs, found.leaf.function.clone())?);
        out.push(match found.aggregate {
            Some((node, spec)) => {
                Pushable { node, req: StepsRequest { aggregate: Some(spec), ..leaf.1.clone() }, leaf: Some(leaf) }
            }
            None => Pushable { node: leaf.0, req: leaf.1, leaf: None },
        });
        Ok(())
    })?;
    Ok(out)
}

struct Leaf<'a> {
    node: usize,
    vs: &'a VectorSelector,
    function: Option<(String, i64)>,
}

struct Found<'a> {
    leaf: Leaf<'a>,
    aggregate: Option<(usize, AggregateSpec)>,
}

fn unparen(mut e: &Expr) -> &Expr {
    while let Expr::Paren(p) = e {
        e = &p.expr;
    }
    e
}

/// `e` as a leaf, if it is one.
fn leaf(e: &Expr) -> Option<Leaf<'_>> {
    match e {
        Expr::VectorSelector(vs) if vs.at.is_none() => Some(Leaf { node: node_key(e), vs, function: None }),
        Expr::Call(c) => pushable_call(c).map(|(ms, name)| Leaf {
            node: node_key(e),
            vs: &ms.vs,
            function: Some((name.to_string(), ms.range.as_millis() as i64)),
        }),
        _ => None,
    }
}

fn number(e: &Expr) -> Option<f64> {
    match unparen(e) {
        Expr::NumberLiteral(n) if n.val.is_finite() => Some(n.val),
        _ => None,
    }
}

/// An aggregation a store may evaluate: one of [`AGGREGATIONS`] with a number or no
/// parameter, grouped without the metric name, over a leaf or a leaf compared with a
/// number (no `bool`).
fn pushable_aggregate(a: &AggregateExpr) -> Option<(Leaf<'_>, AggregateSpec)> {
    let op = a.op.to_string();
    if !AGGREGATIONS.contains(&op.as_str()) {
        return None;
    }
    let param = match &a.param {
        None => None,
        Some(p) => Some(number(p)?),
    };
    let (without, labels) = match &a.modifier {
        None => (false, Vec::new()),
        Some(LabelModifier::Include(l)) => (false, l.labels.clone()),
        Some(LabelModifier::Exclude(l)) => (true, l.labels.clone()),
    };
    if labels.iter().any(|l| l == strata_model::METRIC_NAME) {
        return None;
    }
    let inner = unparen(&a.expr);
    let (leaf, filter) = match inner {
        Expr::Binary(b) if b.modifier.as_ref().is_none_or(|m| !m.return_bool && m.matching.is_none()) => {
            let cmp = b.op.to_string();
            if !COMPARISONS.contains(&cmp.as_str()) {
                return None;
            }
            (leaf(unparen(&b.lhs))?, Some((cmp, number(&b.rhs)?)))
        }
        other => (leaf(other)?, None),
    };
    Some((leaf, AggregateSpec { op, param, without, labels, filter }))
}

/// Calls `f` for each pushable part.
fn walk<'a>(e: &'a Expr, f: &mut impl FnMut(Found<'a>) -> Result<(), QueryError>) -> Result<(), QueryError> {
    if let Some(l) = leaf(e) {
        return f(Found { leaf: l, aggregate: None });
    }
    match e {
        Expr::Aggregate(a) => match pushable_aggregate(a) {
            Some((l, spec)) => f(Found { leaf: l, aggregate: Some((node_key(e), spec)) })?,
            None => {
                walk(&a.expr, f)?;
                if let Some(p) = &a.param {
                    walk(p, f)?;
                }
            }
        },
        // `timestamp(x)` reads sample times: its selector stays here.
        Expr::Call(c) if c.func.name == "timestamp" => {}
        Expr::Call(c) => {
            for a in &c.args.args {
                walk(a, f)?;
            }
        }
        Expr::Unary(u) => walk(&u.expr, f)?,
        Expr::Binary(b) => {
            walk(&b.lhs, f)?;
            walk(&b.rhs, f)?;
        }
        Expr::Paren(p) => walk(&p.expr, f)?,
        // Another grid, or nothing a store holds.
        _ => {}
    }
    Ok(())
}

fn pushable_call(c: &Call) -> Option<(&MatrixSelector, &'static str)> {
    let name = RANGE_FUNCTIONS.iter().find(|n| **n == c.func.name)?;
    match c.args.args.as_slice() {
        [arg] => match arg.as_ref() {
            Expr::MatrixSelector(ms) if ms.vs.at.is_none() => Some((ms, name)),
            _ => None,
        },
        _ => None,
    }
}

/// The leaf a request describes, as an expression this engine evaluates.
fn leaf_expr(req: &StepsRequest) -> Result<Expr, QueryError> {
    if let Some(spec) = &req.aggregate {
        return aggregate_expr(req, spec);
    }
    let offset = match req.offset {
        0 => None,
        o if o > 0 => Some(Offset::Pos(Duration::from_millis(o.unsigned_abs()))),
        o => Some(Offset::Neg(Duration::from_millis(o.unsigned_abs()))),
    };
    let vs = VectorSelector { name: None, matchers: Matchers::empty(), offset, at: None };
    let Some((name, range)) = &req.function else { return Ok(Expr::VectorSelector(vs)) };
    let func = match crate::parse(&format!("{}(x[1m])", checked_function(name)?)) {
        // The parser's function table is its own: a call of the function, parsed, carries it.
        Ok(Expr::Call(c)) => c.func,
        _ => return Err(QueryError::BadData(format!("{name:?} is not a range function a store evaluates"))),
    };
    let ms = MatrixSelector { vs, range: Duration::from_millis(checked_range(*range)?) };
    Ok(Expr::Call(Call { func, args: FunctionArgs { args: vec![Box::new(Expr::MatrixSelector(ms))] } }))
}

fn checked_function(name: &str) -> Result<&str, QueryError> {
    RANGE_FUNCTIONS
        .iter()
        .find(|f| **f == name)
        .copied()
        .ok_or_else(|| QueryError::BadData(format!("{name:?} is not a range function a store evaluates")))
}

fn checked_range(range: i64) -> Result<u64, QueryError> {
    u64::try_from(range)
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(|| QueryError::BadData(format!("range {range} ms is not positive")))
}

/// An aggregation over a leaf, spelled in PromQL from checked parts (names from the
/// lists above, label names valid, numbers finite) and parsed. The selector is a
/// placeholder: its series are handed to the evaluator.
fn aggregate_expr(req: &StepsRequest, spec: &AggregateSpec) -> Result<Expr, QueryError> {
    let bad = |what: String| QueryError::BadData(format!("a store does not evaluate {what}"));
    if !AGGREGATIONS.contains(&spec.op.as_str()) {
        return Err(bad(format!("the aggregation {:?}", spec.op)));
    }
    if let Some(l) =
        spec.labels.iter().find(|l| !strata_model::is_valid_label_name(l) || *l == strata_model::METRIC_NAME)
    {
        return Err(bad(format!("a grouping by {l:?}")));
    }
    let number = |x: f64| if x.is_finite() { Ok(format!("{x:?}")) } else { Err(bad(format!("the number {x}"))) };
    let offset = if req.offset != 0 { format!(" offset {}ms", req.offset) } else { String::new() };
    let mut text = match &req.function {
        Some((f, range)) => format!("{}(x[{}ms]{offset})", checked_function(f)?, checked_range(*range)?),
        None => format!("x{offset}"),
    };
    if let Some((cmp, x)) = &spec.filter {
        if !COMPARISONS.contains(&cmp.as_str()) {
            return Err(bad(format!("the comparison {cmp:?}")));
        }
        text = format!("{text} {cmp} {}", number(*x)?);
    }
    let param = match spec.param {
        Some(p) => format!("{}, ", number(p)?),
        None => String::new(),
    };
    let grouping = format!("{} ({})", if spec.without { "without" } else { "by" }, spec.labels.join(", "));
    crate::parse(&format!("{} {grouping} ({param}{text})", spec.op)).map_err(|e| bad(format!("this aggregation: {e}")))
}

/// The selector inside an expression built by [`leaf_expr`].
fn leaf_selector(e: &Expr) -> Option<&VectorSelector> {
    match e {
        Expr::VectorSelector(vs) => Some(vs),
        Expr::MatrixSelector(ms) => Some(&ms.vs),
        Expr::Call(c) => leaf_selector(c.args.args.first()?),
        Expr::Aggregate(a) => leaf_selector(&a.expr),
        Expr::Binary(b) => leaf_selector(&b.lhs),
        Expr::Paren(p) => leaf_selector(&p.expr),
        _ => None,
    }
}

/// Evaluates a leaf over `store`, as a store answers [`Store::steps`]. `view` gives a
/// series' labels as the caller sees them (the tier's external labels attached); the
/// answer carries those, sorted. Summaries only when `req.values` is false.
pub async fn evaluate(
    store: &dyn Store,
    req: &StepsRequest,
    view: &(dyn Fn(&Labels) -> Labels + Sync),
    timeout: Duration,
) -> Result<Steps, QueryError> {
    let deadline = Instant::now() + timeout;
    let steps = req.steps().ok_or_else(|| QueryError::BadData("the grid has no steps or too many".into()))?;
    let expr = Arc::new(leaf_expr(req)?);
    let sel = req.selection();
    let mut found: Vec<(Labels, strata_store::SeriesChunks)> =
        store.select(&sel).await?.into_iter().map(|s| (view(&s.labels), s)).filter(|(l, _)| req.wants(l)).collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    if !req.values {
        let series = found
            .into_iter()
            .map(|(labels, s)| {
                let summary = SeriesSummary::of(&s.chunks, true)
                    .map_err(|e| QueryError::Execution(format!("decoding {}: {e}", s.labels)))?;
                Ok(StepsSeries { labels, metric_type: s.metric_type, summary, values: Vec::new(), name_dropped: false })
            })
            .collect::<Result<_, QueryError>>()?;
        return Ok(Steps { series, ..Steps::default() });
    }
    let points = (found.len() as u64).saturating_mul(steps as u64);
    if points > req.limits.max_samples {
        return Err(QueryError::TooManySamples(req.limits.max_samples));
    }
    let (start, end, step, lookback, max_samples) =
        (req.start, req.end, req.step, req.lookback, req.limits.max_samples);
    let aggregated = req.aggregate.is_some();
    tokio::task::spawn_blocking(move || {
        let vs = leaf_selector(&expr).ok_or_else(|| QueryError::Internal("a leaf without a selector".into()))?;
        let mut data = fetch::Fetched::default();
        let mut caller_labels = Vec::with_capacity(found.len());
        let mut inputs = Vec::with_capacity(found.len());
        for (labels, s) in found {
            let summary = SeriesSummary::of(&s.chunks, true)
                .map_err(|e| QueryError::Execution(format!("decoding {}: {e}", s.labels)))?;
            // Evaluated under the caller's labels: an aggregation groups by external labels too.
            inputs.push(FetchedSeries::new(labels.clone(), s.metric_type, s.chunks, sel.start, sel.end));
            caller_labels.push((labels, s.metric_type, summary));
        }
        data.series.insert(fetch::key(vs), inputs);
        // Delayed name removal keeps each result under its series' own labels, with the
        // mark saying whether the function drops the name; the caller applies it its way.
        // (An aggregation's groups never hold the name.)
        let ev = Evaluator::new(&data, start, end, step, lookback, max_samples)
            .with_deadline(deadline, timeout)
            .with_delayed_name_removal(!aggregated);
        let Val::Vector(out) = ev.eval(&expr)? else {
            return Err(QueryError::Internal("a leaf that is not an instant vector".into()));
        };
        if aggregated {
            let mut groups: Vec<StepsSeries> = out
                .into_iter()
                .map(|g| StepsSeries {
                    labels: g.labels,
                    metric_type: Default::default(),
                    summary: SeriesSummary::default(),
                    values: g.vals,
                    name_dropped: false,
                })
                .collect();
            groups.sort_by(|a, b| a.labels.cmp(&b.labels));
            let series = caller_labels
                .into_iter()
                .map(|(labels, metric_type, summary)| StepsSeries {
                    labels,
                    metric_type,
                    summary,
                    values: Vec::new(),
                    name_dropped: false,
                })
                .collect();
            let (warnings, infos) = ev.annotations.take();
            return Ok(Steps { series, groups, samples: ev.samples_touched(), warnings, infos });
        }
        let mut by_labels: std::collections::HashMap<Labels, (Vec<Option<f64>>, bool)> =
            out.into_iter().map(|s| (s.labels, (s.vals, s.drop_name))).collect();
        // Every selected series comes back, those without a value with none: the dedup
        // weighs each replica, whether or not the leaf gives it a value.
        let series = caller_labels
            .into_iter()
            .map(|(labels, metric_type, summary)| {
                let (values, name_dropped) = by_labels.remove(&labels).unwrap_or_default();
                StepsSeries { labels, metric_type, summary, values, name_dropped }
            })
            .collect();
        let (warnings, infos) = ev.annotations.take();
        Ok(Steps { series, samples: ev.samples_touched(), warnings, infos, ..Steps::default() })
    })
    .await
    .map_err(|e| QueryError::Internal(e.to_string()))?
}

/// A store that evaluates leaves itself, in process, with this engine: what a StoreAPI
/// server does for its callers, as a wrapper (tests, and stores that are not remote).
pub struct Evaluating<S> {
    inner: S,
    evaluated: AtomicUsize,
    aggregated: AtomicUsize,
}

impl<S: Store> Evaluating<S> {
    pub fn new(inner: S) -> Self {
        Evaluating { inner, evaluated: AtomicUsize::new(0), aggregated: AtomicUsize::new(0) }
    }

    /// How many of those were aggregations.
    pub fn aggregated(&self) -> usize {
        self.aggregated.load(Ordering::Relaxed)
    }

    /// How many leaves it evaluated with values (summaries not counted).
    pub fn evaluated(&self) -> usize {
        self.evaluated.load(Ordering::Relaxed)
    }
}

#[async_trait::async_trait]
impl<S: Store> Store for Evaluating<S> {
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        self.inner.select_within(req, budget).await
    }

    async fn series_within(
        &self,
        matchers: &[Matcher],
        start: i64,
        end: i64,
        budget: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        self.inner.series_within(matchers, start, end, budget).await
    }

    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        self.inner.label_names(matchers, start, end).await
    }

    async fn label_values(
        &self,
        name: &str,
        matchers: &[Matcher],
        start: i64,
        end: i64,
    ) -> Result<Vec<String>, StoreError> {
        self.inner.label_values(name, matchers, start, end).await
    }

    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        self.inner.metadata(metric).await
    }

    async fn steps(&self, req: &StepsRequest) -> Result<Option<Steps>, StoreError> {
        if req.values {
            self.evaluated.fetch_add(1, Ordering::Relaxed);
            if req.aggregate.is_some() {
                self.aggregated.fetch_add(1, Ordering::Relaxed);
            }
        }
        match evaluate(&self.inner, req, &|l| l.clone(), Duration::from_secs(120)).await {
            Ok(steps) => Ok(Some(steps)),
            Err(QueryError::Store(e)) => Err(e),
            Err(QueryError::Unsupported(_)) => Ok(None),
            Err(QueryError::TooManySamples(n)) => Err(StoreError::LimitExceeded { what: "samples", limit: n }),
            Err(e) => Err(StoreError::InvalidRequest(e.to_string())),
        }
    }
}
