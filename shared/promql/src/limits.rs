//! What bounds a query before and while it runs, so that no expression can take the
//! process down.
//!
//! Before evaluation, [`check`] walks the expression once: nesting deeper than
//! [`MAX_DEPTH`] is refused (evaluation recurses per level), and every range, offset,
//! subquery step and `@` time must lie within what Prometheus itself accepts (±292 years,
//! Go's `time.Duration`), so that time arithmetic over a bounded number of levels cannot
//! overflow. During evaluation, every buffer of one value per step is charged to a
//! [`PointBudget`] *before* it is allocated: a subquery such as `[100y:1ms]` asks for
//! trillions of steps and is refused with Prometheus' "too many samples" error, where
//! allocating first would abort the process.

use crate::QueryError;
use promql_parser::parser::{AtModifier, Expr, Offset};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};
use strata_model::duration::MAX_DURATION_MS;

/// Deepest expression nesting evaluated. Real queries stay far below it; each level costs
/// stack in the evaluator and in the parser's tree.
pub const MAX_DEPTH: usize = 128;

/// Refuses expressions too deep to evaluate safely or with times out of range.
pub fn check(expr: &Expr) -> Result<(), QueryError> {
    walk(expr, 1)
}

fn walk(e: &Expr, depth: usize) -> Result<(), QueryError> {
    if depth > MAX_DEPTH {
        return Err(QueryError::BadData(format!("query is nested more than {MAX_DEPTH} levels deep")));
    }
    let next = depth + 1;
    match e {
        Expr::Aggregate(a) => {
            if let Some(p) = &a.param {
                walk(p, next)?;
            }
            walk(&a.expr, next)
        }
        Expr::Unary(u) => walk(&u.expr, next),
        Expr::Binary(b) => {
            walk(&b.lhs, next)?;
            walk(&b.rhs, next)
        }
        Expr::Paren(p) => walk(&p.expr, next),
        Expr::Subquery(sq) => {
            duration("subquery range", sq.range)?;
            if let Some(st) = sq.step {
                duration("subquery step", st)?;
            }
            offset(&sq.offset)?;
            at(&sq.at)?;
            walk(&sq.expr, next)
        }
        Expr::VectorSelector(vs) => {
            offset(&vs.offset)?;
            at(&vs.at)
        }
        Expr::MatrixSelector(ms) => {
            duration("range", ms.range)?;
            offset(&ms.vs.offset)?;
            at(&ms.vs.at)
        }
        Expr::Call(c) => c.args.args.iter().try_for_each(|a| walk(a, next)),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => Ok(()),
    }
}

fn duration(what: &str, d: Duration) -> Result<(), QueryError> {
    if d.as_millis() > MAX_DURATION_MS.unsigned_abs() as u128 {
        return Err(QueryError::BadData(format!("{what} {d:?} is out of range (at most 292 years)")));
    }
    Ok(())
}

fn offset(o: &Option<Offset>) -> Result<(), QueryError> {
    match o {
        Some(Offset::Pos(d)) | Some(Offset::Neg(d)) => duration("offset", *d),
        None => Ok(()),
    }
}

fn at(a: &Option<AtModifier>) -> Result<(), QueryError> {
    let Some(AtModifier::At(t)) = a else { return Ok(()) };
    let d = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d,
        Err(e) => e.duration(),
    };
    // Prometheus' own bounds for a timestamp: ±292 years around 1970 is far inside them.
    duration("@ time", d)
}

/// Values held in per-step buffers, counted against the query's sample limit as they are
/// allocated. Shared by a query's evaluator and its subqueries' inner evaluators.
#[derive(Debug)]
pub struct PointBudget {
    used: AtomicU64,
    limit: u64,
}

impl PointBudget {
    pub fn new(limit: u64) -> Self {
        PointBudget { used: AtomicU64::new(0), limit }
    }

    /// Reserves `n` values, or refuses with Prometheus' "too many samples" error.
    pub fn charge(&self, n: u64) -> Result<(), QueryError> {
        let before = self.used.fetch_add(n, Ordering::Relaxed);
        if before.saturating_add(n) > self.limit {
            return Err(QueryError::TooManySamples(self.limit));
        }
        Ok(())
    }

    /// A buffer of `n` copies of `fill`, charged first.
    pub fn vec<T: Clone>(&self, n: usize, fill: T) -> Result<Vec<T>, QueryError> {
        self.charge(u64::try_from(n).unwrap_or(u64::MAX))?;
        Ok(vec![fill; n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(q: &str) -> Result<(), QueryError> {
        check(&crate::parse(q).expect("parses"))
    }

    #[test]
    fn deep_nesting_is_refused() {
        let deep = format!("{}1{}", "(".repeat(MAX_DEPTH + 5), ")".repeat(MAX_DEPTH + 5));
        assert!(matches!(checked(&deep), Err(QueryError::BadData(m)) if m.contains("nested")));
        let ok = format!("{}1{}", "(".repeat(MAX_DEPTH - 5), ")".repeat(MAX_DEPTH - 5));
        assert!(checked(&ok).is_ok());
    }

    #[test]
    fn durations_out_of_range_are_refused() {
        for q in ["up[300y]", "up offset 300y", "max_over_time(up[5m:300y])", "up @ 1e13"] {
            assert!(matches!(checked(q), Err(QueryError::BadData(_))), "{q}");
        }
        for q in ["up[100y]", "up offset -100y", "max_over_time(vector(1)[100y:1ms])", "up @ 1e9"] {
            assert!(checked(q).is_ok(), "{q}");
        }
    }

    #[test]
    fn the_budget_refuses_before_allocating() {
        let b = PointBudget::new(1000);
        assert_eq!(b.vec(600, 0u8).unwrap().len(), 600);
        assert!(matches!(b.vec(usize::MAX, 0u8), Err(QueryError::TooManySamples(1000))));
        assert!(b.vec(500, 0u8).is_err());
    }
}
