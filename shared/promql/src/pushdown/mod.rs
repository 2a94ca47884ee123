//! Pushdown, both ends (see `strata_store::steps`): which parts of a query a store may
//! evaluate ([`leaves`]), and how a store evaluates one ([`evaluate`]) with this same
//! engine, so a pushed part gives what evaluating it above would.
//!
//! A leaf is a node whose value at each step comes from one series' samples: an instant
//! selector, or a range function with a range selector as its only argument. An
//! aggregation over a leaf (or over `leaf > number`) may go too, grouped without the metric
//! name; the store's answer is then its groups, valid only when it holds every series of
//! each (the caller checks). Leaves under a subquery (another grid), with `@` (a fixed
//! time) or under `timestamp()` (which reads sample times, not values) stay with the
//! engine above.

use crate::fetch;
use crate::QueryError;
use promql_parser::parser::{AggregateExpr, Call, Expr, LabelModifier, MatrixSelector, VectorSelector};
use strata_store::{AggregateSpec, SelectLimits, StepsRequest};

mod evaluate;
mod evaluating;
mod grouping;

pub use evaluate::{aggregate_evaluated, evaluate};
pub use evaluating::Evaluating;
pub use grouping::{aggregate_here, GroupingAggregates};

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
    "first_over_time",
    "last_over_time",
    "ts_of_first_over_time",
    "ts_of_last_over_time",
    "ts_of_min_over_time",
    "ts_of_max_over_time",
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
            let mut r = StepsRequest::new(fetch::matchers(vs)?, (start, end, step), lookback);
            (r.offset, r.function, r.limits) = (fetch::offset_ms(&vs.offset), function, limits);
            Ok(r)
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
