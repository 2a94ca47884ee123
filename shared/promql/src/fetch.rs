//! Phase one: every selector of the expression is read once, for all the steps it will be
//! evaluated at, and decoded. Selectors are keyed by their address in the AST.

use super::QueryError;
use promql_parser::parser::{AtModifier, Expr, Offset, SubqueryExpr, VectorSelector};
use std::cell::RefCell;
use std::collections::HashMap;
use std::collections::HashSet;
use std::time::UNIX_EPOCH;
use strata_chunk::Chunk;
use strata_model::matcher::Matcher;
use strata_model::{Labels, MetricType, Sample};
use strata_store::{SelectLimits, SelectRequest, Steps, Store};

/// One selected series, still encoded: evaluation decodes it when it gets to it, into a
/// buffer its thread reuses, so a query holds compressed chunks plus the few series being
/// worked on, never a day of decoded samples.
pub struct FetchedSeries {
    pub labels: Labels,
    pub metric_type: MetricType,
    chunks: Vec<Chunk>,
    /// The bounds (inclusive) the selector needs.
    mint: i64,
    maxt: i64,
}

thread_local! {
    static DECODE_BUFFER: RefCell<Vec<Sample>> = const { RefCell::new(Vec::new()) };
}

impl FetchedSeries {
    pub fn new(labels: Labels, metric_type: MetricType, chunks: Vec<Chunk>, mint: i64, maxt: i64) -> Self {
        FetchedSeries { labels, metric_type, chunks, mint, maxt }
    }

    /// Calls `f` with the series' samples in the selector's range, in time order,
    /// staleness markers included. `f` may edit the buffer.
    pub fn with_samples<R>(&self, f: impl FnOnce(&mut Vec<Sample>) -> R) -> Result<R, QueryError> {
        let decode = |buf: &mut Vec<Sample>| -> Result<R, QueryError> {
            buf.clear();
            Chunk::decode_range(&self.chunks, self.mint, self.maxt, buf)
                .map_err(|e| QueryError::Execution(format!("decoding {}: {e}", self.labels)))?;
            Ok(f(buf))
        };
        DECODE_BUFFER.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => decode(&mut buf),
            // Only if evaluation ever nests on one thread: a buffer of its own.
            Err(_) => decode(&mut Vec::new()),
        })
    }

    /// About how many samples the series holds in the selector's range.
    pub fn samples_in_range(&self) -> u64 {
        self.chunks.iter().map(|c| c.samples_within(self.mint, self.maxt)).sum()
    }
}

/// What phase one got: the series of each selector, and the leaves a store evaluated
/// itself (pushdown), each keyed by its node's address.
#[derive(Default)]
pub struct Fetched {
    pub series: HashMap<usize, Vec<FetchedSeries>>,
    pub pushed: HashMap<usize, Steps>,
}

pub fn key(vs: &VectorSelector) -> usize {
    vs as *const VectorSelector as usize
}

pub fn offset_ms(o: &Option<Offset>) -> i64 {
    match o {
        Some(Offset::Pos(d)) => d.as_millis() as i64,
        Some(Offset::Neg(d)) => -(d.as_millis() as i64),
        None => 0,
    }
}

/// The fixed evaluation time an `@` modifier sets, if any.
pub fn at_ms(at: &Option<AtModifier>, start: i64, end: i64) -> Option<i64> {
    match at {
        None => None,
        Some(AtModifier::Start) => Some(start),
        Some(AtModifier::End) => Some(end),
        Some(AtModifier::At(t)) => Some(match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_millis() as i64,
            Err(e) => -(e.duration().as_millis() as i64),
        }),
    }
}

pub fn matchers(vs: &VectorSelector) -> Result<Vec<Matcher>, QueryError> {
    crate::selector::matchers_of(vs).map_err(|e| match e {
        crate::selector::SelectorError::OrMatchers => QueryError::Unsupported("'or' inside a selector".into()),
        other => QueryError::BadData(other.to_string()),
    })
}

struct Need<'a> {
    vs: &'a VectorSelector,
    mint: i64,
    maxt: i64,
}

/// Collects what each selector needs: `range` is the enclosing range (0 for an instant
/// selector, which looks back `lookback` instead).
/// Default step of a subquery without one: Prometheus' default evaluation interval.
pub const DEFAULT_SUBQUERY_STEP: i64 = 60_000;

/// The inner grid `(start, end, step)` a subquery is evaluated on, as Prometheus aligns it.
pub fn subquery_grid(sq: &SubqueryExpr, start: i64, end: i64, qs: i64, qe: i64) -> (i64, i64, i64) {
    let step = sq.step.map(|d| d.as_millis() as i64).filter(|s| *s > 0).unwrap_or(DEFAULT_SUBQUERY_STEP);
    let (start, end) = match at_ms(&sq.at, qs, qe) {
        Some(t) => (t, t),
        None => (start, end),
    };
    let o = offset_ms(&sq.offset);
    let range = sq.range.as_millis() as i64;
    // Saturating: client_golang's boundary times leave under two thousand years of room.
    let lo = start.saturating_sub(o).saturating_sub(range);
    let mut s = step * (lo / step);
    if s <= lo {
        s = s.saturating_add(step);
    }
    (s, end.saturating_sub(o), step)
}

#[allow(clippy::too_many_arguments)]
fn collect<'a>(
    e: &'a Expr,
    start: i64,
    end: i64,
    qs: i64,
    qe: i64,
    lookback: i64,
    pushed: &HashSet<usize>,
    out: &mut Vec<Need<'a>>,
) -> Result<(), QueryError> {
    if pushed.contains(&crate::pushdown::node_key(e)) {
        return Ok(());
    }
    let mut add = |vs: &'a VectorSelector, range: i64| {
        let o = offset_ms(&vs.offset);
        let (lo, hi) = match at_ms(&vs.at, qs, qe) {
            Some(t) => (t, t),
            None => (start, end),
        };
        out.push(Need {
            vs,
            mint: lo.saturating_sub(o).saturating_sub(range).saturating_add(1),
            maxt: hi.saturating_sub(o),
        });
    };
    match e {
        Expr::VectorSelector(vs) => add(vs, lookback),
        Expr::MatrixSelector(ms) => add(&ms.vs, ms.range.as_millis() as i64),
        Expr::Aggregate(a) => {
            collect(&a.expr, start, end, qs, qe, lookback, pushed, out)?;
            if let Some(p) = &a.param {
                collect(p, start, end, qs, qe, lookback, pushed, out)?;
            }
        }
        Expr::Unary(u) => collect(&u.expr, start, end, qs, qe, lookback, pushed, out)?,
        Expr::Binary(b) => {
            collect(&b.lhs, start, end, qs, qe, lookback, pushed, out)?;
            collect(&b.rhs, start, end, qs, qe, lookback, pushed, out)?;
        }
        Expr::Paren(p) => collect(&p.expr, start, end, qs, qe, lookback, pushed, out)?,
        Expr::Call(c) => {
            for a in &c.args.args {
                collect(a, start, end, qs, qe, lookback, pushed, out)?;
            }
        }
        Expr::Subquery(sq) => {
            let (s, e, _) = subquery_grid(sq, start, end, qs, qe);
            collect(&sq.expr, s, e, qs, qe, lookback, pushed, out)?;
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => {}
        Expr::Extension(_) => return Err(QueryError::Unsupported("extension expressions".into())),
    }
    Ok(())
}

pub async fn fetch(
    store: &dyn Store,
    e: &Expr,
    (start, end, step): (i64, i64, i64),
    lookback: i64,
    limits: SelectLimits,
    pushdown: bool,
) -> Result<Fetched, QueryError> {
    let mut out = Fetched::default();
    let mut total = 0u64;
    let pushable =
        if pushdown { crate::pushdown::leaves(e, (start, end, step), lookback, limits)? } else { Vec::new() };
    for p in pushable {
        // An aggregation first; if no store takes it, its leaf.
        let mut got = store.steps(&p.req).await?.map(|s| (p.node, s));
        if let (None, Some((node, leaf))) = (&got, &p.leaf) {
            got = store.steps(leaf).await?.map(|s| (*node, s));
        }
        let Some((node, steps)) = got else { continue };
        let kept = steps.series.len().saturating_add(steps.groups.len()) as u64;
        let points = kept.saturating_mul(p.req.steps().unwrap_or(usize::MAX) as u64);
        // What the query holds of it is its points; the samples the store read for them
        // count as touched (in the evaluator's statistics), as they would here.
        total = total.saturating_add(points);
        if total > limits.max_samples {
            return Err(QueryError::TooManySamples(limits.max_samples));
        }
        out.pushed.insert(node, steps);
    }
    let pushed: HashSet<usize> = out.pushed.keys().copied().collect();
    let mut needs = Vec::new();
    collect(e, start, end, start, end, lookback, &pushed, &mut needs)?;
    // A selector fetched for several contexts (a subquery and its outer query) gets the union.
    let mut merged: Vec<Need> = Vec::new();
    for n in needs {
        match merged.iter_mut().find(|m| std::ptr::eq(m.vs, n.vs)) {
            Some(m) => {
                m.mint = m.mint.min(n.mint);
                m.maxt = m.maxt.max(n.maxt);
            }
            None => merged.push(n),
        }
    }
    let needs = merged;
    for n in needs {
        let ms = matchers(n.vs)?;
        let mut req = SelectRequest::new(ms, n.mint, n.maxt);
        req.limits = limits;
        let series = store.select(&req).await?;
        total += series.iter().flat_map(|s| &s.chunks).map(|c| c.samples_within(n.mint, n.maxt)).sum::<u64>();
        if total > limits.max_samples {
            return Err(QueryError::TooManySamples(limits.max_samples));
        }
        let got =
            series.into_iter().map(|s| FetchedSeries::new(s.labels, s.metric_type, s.chunks, n.mint, n.maxt)).collect();
        out.series.insert(key(n.vs), got);
    }
    Ok(out)
}
