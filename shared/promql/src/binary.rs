//! Binary operators: arithmetic, comparisons (filtering, or 0/1 with `bool`), and the set
//! operators, with one-to-one and many-to-one/one-to-many vector matching.

use super::eval::{Evaluator, StepSeries, Val, VectorBuilder};
use super::QueryError;
use crate::HashMap;
use promql_parser::parser::{BinaryExpr, LabelModifier, VectorMatchCardinality};
use strata_model::{Labels, LabelsBuilder, METRIC_NAME};

fn arith(op: &str, a: f64, b: f64) -> Option<f64> {
    Some(match op {
        "+" => a + b,
        "-" => a - b,
        "*" => a * b,
        "/" => a / b,
        "%" => a % b,
        "^" => a.powf(b),
        "atan2" => a.atan2(b),
        _ => return None,
    })
}

fn compare(op: &str, a: f64, b: f64) -> Option<bool> {
    Some(match op {
        "==" => a == b,
        "!=" => a != b,
        ">" => a > b,
        "<" => a < b,
        ">=" => a >= b,
        "<=" => a <= b,
        _ => return None,
    })
}

/// The result of `a op b` for one pair: `None` drops the sample (a false comparison).
fn apply(op: &str, a: f64, b: f64, return_bool: bool, keep: f64) -> Result<Option<f64>, QueryError> {
    if let Some(r) = arith(op, a, b) {
        return Ok(Some(r));
    }
    match compare(op, a, b) {
        Some(c) if return_bool => Ok(Some(if c { 1.0 } else { 0.0 })),
        Some(true) => Ok(Some(keep)),
        Some(false) => Ok(None),
        None => Err(QueryError::Unsupported(format!("binary operator {op}"))),
    }
}

fn is_comparison(op: &str) -> bool {
    matches!(op, "==" | "!=" | ">" | "<" | ">=" | "<=")
}

pub fn eval(ev: &Evaluator, b: &BinaryExpr) -> Result<Val, QueryError> {
    let op = b.op.to_string();
    let op = op.as_str();
    let return_bool = b.modifier.as_ref().is_some_and(|m| m.return_bool);
    let lhs = ev.eval(&b.lhs)?;
    let rhs = ev.eval(&b.rhs)?;
    // A comparison without `bool` filters and keeps the metric name; everything else drops it.
    let drop = !is_comparison(op) || return_bool;
    match (lhs, rhs) {
        (Val::Scalar(a), Val::Scalar(c)) => {
            let mut out = Vec::with_capacity(a.len());
            for (x, y) in a.into_iter().zip(c) {
                out.push(apply(op, x, y, true, x)?.unwrap_or(0.0));
            }
            Ok(Val::Scalar(out))
        }
        (Val::Vector(v), Val::Scalar(s)) => unique(scalar_side(ev, v, &s, op, return_bool, drop, false)?),
        (Val::Scalar(s), Val::Vector(v)) => unique(scalar_side(ev, v, &s, op, return_bool, drop, true)?),
        (Val::Vector(l), Val::Vector(r)) => {
            if matches!(op, "and" | "or" | "unless") {
                return set_op(ev, op, l, r, b);
            }
            vector_vector(ev, op, l, r, b, return_bool, drop)
        }
        _ => Err(QueryError::BadData(format!("invalid operand types for {op}"))),
    }
}

fn unique(v: Val) -> Result<Val, QueryError> {
    super::eval::check_unique(&v)?;
    Ok(v)
}

fn scalar_side(
    ev: &Evaluator,
    v: Vec<StepSeries>,
    s: &[f64],
    op: &str,
    return_bool: bool,
    drop: bool,
    scalar_left: bool,
) -> Result<Val, QueryError> {
    let mut out = Vec::with_capacity(v.len());
    for series in v {
        let mut vals = vec![None; series.vals.len()];
        for (i, x) in series.vals.iter().enumerate() {
            let Some(x) = *x else { continue };
            let (a, c) = if scalar_left { (s[i], x) } else { (x, s[i]) };
            vals[i] = apply(op, a, c, return_bool, x)?;
        }
        if vals.iter().any(Option::is_some) {
            let (labels, drop_name) = if drop { ev.name_dropped(&series.labels) } else { (series.labels, false) };
            out.push(StepSeries { labels, vals, drop_name: drop_name || series.drop_name });
        }
    }
    Ok(Val::Vector(out))
}

/// The labels that decide which samples match.
fn signature(l: &Labels, matching: &Option<LabelModifier>) -> Labels {
    let mut b: LabelsBuilder = l.to_builder();
    match matching {
        Some(LabelModifier::Include(on)) => b.retain(|x| on.labels.iter().any(|n| n.as_str() == x.name.as_ref())),
        Some(LabelModifier::Exclude(ign)) => {
            b.retain(|x| x.name.as_ref() != METRIC_NAME && !ign.labels.iter().any(|n| n.as_str() == x.name.as_ref()))
        }
        None => b.del(METRIC_NAME),
    }
    b.build()
}

fn set_op(ev: &Evaluator, op: &str, l: Vec<StepSeries>, r: Vec<StepSeries>, b: &BinaryExpr) -> Result<Val, QueryError> {
    let matching = b.modifier.as_ref().and_then(|m| m.matching.clone());
    let rsig: Vec<Labels> = r.iter().map(|s| signature(&s.labels, &matching)).collect();
    let lsig: Vec<Labels> = l.iter().map(|s| signature(&s.labels, &matching)).collect();
    let mut out: Vec<StepSeries> = Vec::new();
    match op {
        "and" | "unless" => {
            for (s, sig) in l.into_iter().zip(&lsig) {
                let mut vals = vec![None; s.vals.len()];
                for (i, x) in s.vals.iter().enumerate() {
                    let Some(x) = *x else { continue };
                    let present = r.iter().zip(&rsig).any(|(rs, rsg)| rsg == sig && rs.vals[i].is_some());
                    if present == (op == "and") {
                        vals[i] = Some(x);
                    }
                }
                if vals.iter().any(Option::is_some) {
                    out.push(StepSeries { vals, ..s });
                }
            }
        }
        _ => {
            let steps = ev.steps;
            let mut lhs_at: Vec<Vec<&Labels>> = ev.points.vec(steps, Vec::new())?;
            for (s, sig) in l.iter().zip(&lsig) {
                for (i, x) in s.vals.iter().enumerate() {
                    if x.is_some() {
                        lhs_at[i].push(sig);
                    }
                }
            }
            let mut rights = Vec::new();
            for (s, sig) in r.into_iter().zip(&rsig) {
                let mut vals = vec![None; steps];
                for (i, x) in s.vals.iter().enumerate() {
                    if x.is_some() && !lhs_at[i].contains(&sig) {
                        vals[i] = *x;
                    }
                }
                if vals.iter().any(Option::is_some) {
                    rights.push(StepSeries { vals, ..s });
                }
            }
            out.extend(l);
            out.extend(rights);
        }
    }
    Ok(Val::Vector(out))
}

fn vector_vector(
    ev: &Evaluator,
    op: &str,
    l: Vec<StepSeries>,
    r: Vec<StepSeries>,
    b: &BinaryExpr,
    return_bool: bool,
    drop: bool,
) -> Result<Val, QueryError> {
    let modifier = b.modifier.as_ref();
    let matching = modifier.and_then(|m| m.matching.clone());
    let card = modifier.map(|m| m.card.clone()).unwrap_or(VectorMatchCardinality::OneToOne);
    // For group_right the "many" side is the right one: swap and swap back per pair.
    let (many, one, swapped, include) = match &card {
        VectorMatchCardinality::OneToMany(inc) => (r, l, true, inc.labels.clone()),
        VectorMatchCardinality::ManyToOne(inc) => (l, r, false, inc.labels.clone()),
        _ => (l, r, false, Vec::new()),
    };
    let one_to_one = matches!(card, VectorMatchCardinality::OneToOne);
    let one_sig: Vec<Labels> = one.iter().map(|s| signature(&s.labels, &matching)).collect();
    let many_sig: Vec<Labels> = many.iter().map(|s| signature(&s.labels, &matching)).collect();
    let mut builder = VectorBuilder::new(ev);
    for i in 0..ev.steps {
        ev.check_stop()?;
        let mut one_at: HashMap<&Labels, (usize, f64)> = HashMap::default();
        for (j, (s, sig)) in one.iter().zip(&one_sig).enumerate() {
            if let Some(x) = s.vals[i] {
                if one_at.insert(sig, (j, x)).is_some() {
                    let side = if swapped { "left" } else { "right" };
                    return Err(QueryError::Execution(format!("found duplicate series for the match group {sig} on the {side} hand-side of the operation: many-to-many matching not allowed: matching labels must be unique on one side")));
                }
            }
        }
        let mut seen_many: HashMap<&Labels, ()> = HashMap::default();
        for (s, sig) in many.iter().zip(&many_sig) {
            let Some(x) = s.vals[i] else { continue };
            let Some(&(j, y)) = one_at.get(sig) else { continue };
            if one_to_one && seen_many.insert(sig, ()).is_some() {
                return Err(QueryError::Execution(format!("found duplicate series for the match group {sig} on the left hand-side of the operation: many-to-many matching not allowed: matching labels must be unique on one side")));
            }
            let (a, c) = if swapped { (y, x) } else { (x, y) };
            let keep = if swapped { y } else { x };
            let Some(v) = apply(op, a, c, return_bool, keep)? else { continue };
            // With delayed name removal the name stays, marked, until the query's end.
            let delay = drop && ev.delayed_name_removal();
            let labels = result_labels(&s.labels, &one[j].labels, &matching, one_to_one, &include, drop && !delay);
            let marked = (delay || s.drop_name) && labels.get(METRIC_NAME).is_some();
            builder.set_marked(labels, marked, i, v)?;
        }
    }
    Ok(builder.finish())
}

fn result_labels(
    many: &Labels,
    one: &Labels,
    matching: &Option<LabelModifier>,
    one_to_one: bool,
    include: &[String],
    drop: bool,
) -> Labels {
    let mut b = many.to_builder();
    if drop {
        b.del(METRIC_NAME);
    }
    if one_to_one {
        match matching {
            Some(LabelModifier::Include(on)) => b.retain(|x| on.labels.iter().any(|n| n.as_str() == x.name.as_ref())),
            Some(LabelModifier::Exclude(ign)) => {
                b.retain(|x| !ign.labels.iter().any(|n| n.as_str() == x.name.as_ref()))
            }
            None => {}
        }
    }
    for name in include {
        match one.get(name) {
            Some(v) => b.set(name, v),
            None => b.del(name),
        }
    }
    b.build()
}
