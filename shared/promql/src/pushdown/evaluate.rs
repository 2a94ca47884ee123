//! The store's end: a leaf (or an aggregation over one) from a request, evaluated with
//! this engine over the store's own series, under the labels the caller sees.

use super::{AGGREGATIONS, COMPARISONS, RANGE_FUNCTIONS};
use crate::eval::{Evaluator, Val};
use crate::fetch::{self, FetchedSeries};
use crate::QueryError;
use promql_parser::label::Matchers;
use promql_parser::parser::{Call, Expr, FunctionArgs, MatrixSelector, Offset, VectorSelector};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_model::Labels;
use strata_store::{AggregateSpec, SeriesSummary, StepValues, Steps, StepsRequest, StepsSeries, Store};

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
        _ => return Err(QueryError::Unsupported(format!("{name:?} as a range function a store evaluates"))),
    };
    let ms = MatrixSelector { vs, range: Duration::from_millis(checked_range(*range)?) };
    Ok(Expr::Call(Call { func, args: FunctionArgs { args: vec![Box::new(Expr::MatrixSelector(ms))] } }))
}

fn checked_function(name: &str) -> Result<&str, QueryError> {
    RANGE_FUNCTIONS
        .iter()
        .find(|f| **f == name)
        .copied()
        .ok_or_else(|| QueryError::Unsupported(format!("{name:?} as a range function a store evaluates")))
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
    // `Unsupported` answers "not here": the caller evaluates this part itself.
    let bad = |what: String| QueryError::Unsupported(format!("{what} in a store"));
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

/// Sets its flag when dropped.
struct CancelOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
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
            .map(|(labels, s)| Ok(summary_only(labels, s.metric_type, summary(&s, &sel)?)))
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
    // A caller that goes away (its call cancelled, this future dropped) stops the evaluation
    // at its next check instead of leaving it to run to the deadline.
    let canceled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _cancel_on_drop = CancelOnDrop(canceled.clone());
    tokio::task::spawn_blocking(move || {
        let vs = leaf_selector(&expr).ok_or_else(|| QueryError::Internal("a leaf without a selector".into()))?;
        let mut data = fetch::Fetched::default();
        let mut caller_labels = Vec::with_capacity(found.len());
        let mut inputs = Vec::with_capacity(found.len());
        for (labels, s) in found {
            let summary = summary(&s, &sel)?;
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
            .with_cancel(canceled)
            .with_delayed_name_removal(!aggregated);
        let Val::Vector(out) = ev.eval(&expr)? else {
            return Err(QueryError::Internal("a leaf that is not an instant vector".into()));
        };
        if aggregated {
            let groups = groups_of(out);
            let series = caller_labels.into_iter().map(|(l, t, s)| summary_only(l, t, s)).collect();
            let (warnings, infos) = ev.annotations.take();
            return Ok(Steps { series, groups, samples: ev.samples_touched(), warnings, infos });
        }
        let mut by_labels: crate::HashMap<Labels, (Vec<Option<f64>>, bool)> =
            out.into_iter().map(|s| (s.labels, (s.vals, s.drop_name))).collect();
        // Every selected series comes back, those without a value with none: the dedup
        // weighs each replica, whether or not the leaf gives it a value.
        let series = caller_labels
            .into_iter()
            .map(|(labels, metric_type, summary)| {
                let (values, name_dropped) = by_labels.remove(&labels).unwrap_or_default();
                StepsSeries { labels, metric_type, summary, values: StepValues::from_options(&values), name_dropped }
            })
            .collect();
        let (warnings, infos) = ev.annotations.take();
        Ok(Steps { series, samples: ev.samples_touched(), warnings, infos, ..Steps::default() })
    })
    .await
    .map_err(|e| QueryError::Internal(e.to_string()))?
}

/// A series' summary over the selection's range, as the dedup's merge weighs it (decoding
/// it only when its chunk headers cannot show it gap free).
fn summary(s: &strata_store::SeriesChunks, sel: &strata_store::SelectRequest) -> Result<SeriesSummary, QueryError> {
    SeriesSummary::of_range(&s.chunks, sel.start, sel.end, true)
        .map(|(summary, _)| summary)
        .map_err(|e| QueryError::Execution(format!("decoding {}: {e}", s.labels)))
}

/// A series that carries its summary and no values.
fn summary_only(labels: Labels, metric_type: strata_model::MetricType, summary: SeriesSummary) -> StepsSeries {
    StepsSeries { labels, metric_type, summary, values: StepValues::default(), name_dropped: false }
}

/// An aggregation over a leaf a store has already evaluated another way (from
/// aggregates): `req.aggregate` over `leaf`'s series (labels as the caller sees them), as
/// [`evaluate`] would give it from samples. The answer holds the groups only.
pub fn aggregate_evaluated(req: &StepsRequest, leaf: Steps) -> Result<Steps, QueryError> {
    let spec = req.aggregate.as_ref().ok_or_else(|| QueryError::Internal("no aggregation to evaluate".into()))?;
    let steps = req.steps().ok_or_else(|| QueryError::BadData("the grid has no steps or too many".into()))?;
    let points = (leaf.series.len() as u64).saturating_mul(steps as u64);
    if points > req.limits.max_samples {
        return Err(QueryError::TooManySamples(req.limits.max_samples));
    }
    let expr = aggregate_expr(req, spec)?;
    let Expr::Aggregate(a) = &expr else { return Err(QueryError::Internal("an aggregation that is not one".into())) };
    // The leaf, under the filter that may compare it with a number.
    let node = match a.expr.as_ref() {
        Expr::Binary(b) => b.lhs.as_ref(),
        e => e,
    };
    let mut data = fetch::Fetched::default();
    data.pushed.insert(super::node_key(node), leaf);
    let ev = Evaluator::new(&data, req.start, req.end, req.step, req.lookback, req.limits.max_samples);
    let Val::Vector(out) = ev.eval(&expr)? else {
        return Err(QueryError::Internal("an aggregation that is not an instant vector".into()));
    };
    let groups = groups_of(out);
    let (warnings, infos) = ev.annotations.take();
    Ok(Steps { series: Vec::new(), groups, samples: ev.samples_touched(), warnings, infos })
}

/// An aggregation's output series as the answer's groups, sorted by labels.
fn groups_of(out: Vec<crate::eval::StepSeries>) -> Vec<StepsSeries> {
    let mut groups: Vec<StepsSeries> = out
        .into_iter()
        .map(|g| StepsSeries {
            labels: g.labels,
            metric_type: Default::default(),
            summary: SeriesSummary::default(),
            values: StepValues::from_options(&g.vals),
            name_dropped: false,
        })
        .collect();
    groups.sort_by(|a, b| a.labels.cmp(&b.labels));
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_model::{MatchOp, Matcher};

    #[test]
    fn an_aggregation_over_an_evaluated_leaf_groups_its_series() {
        let m = Matcher::new(MatchOp::Equal, "__name__", "x").unwrap();
        let mut req = StepsRequest::new(vec![m], (300_000, 900_000, 300_000), 300_000);
        req.function = Some(("avg_over_time".into(), 300_000));
        req.aggregate = Some(AggregateSpec {
            op: "avg".into(),
            param: None,
            without: false,
            labels: vec!["cluster".into()],
            filter: None,
        });
        let series = |cluster: &str, gpu: &str, v: [Option<f64>; 3]| StepsSeries {
            labels: Labels::from_pairs([("__name__", "x"), ("cluster", cluster), ("gpu", gpu)]),
            metric_type: Default::default(),
            summary: SeriesSummary::default(),
            values: StepValues::from_options(&v),
            name_dropped: true,
        };
        let leaf = Steps {
            series: vec![
                series("a", "0", [Some(1.0), Some(2.0), None]),
                series("a", "1", [Some(3.0), Some(4.0), Some(5.0)]),
                series("b", "0", [None, Some(10.0), None]),
            ],
            ..Steps::default()
        };
        let out = aggregate_evaluated(&req, leaf).unwrap();
        let got: Vec<(String, Vec<Option<f64>>)> =
            out.groups.iter().map(|g| (g.labels.to_string(), g.values.to_options())).collect();
        assert_eq!(
            got,
            vec![
                ("{cluster=\"a\"}".to_string(), vec![Some(2.0), Some(3.0), Some(5.0)]),
                ("{cluster=\"b\"}".to_string(), vec![None, Some(10.0), None]),
            ]
        );
    }
}
