//! What bounds a query before and while it runs, so that no expression can take the
//! process down.
//!
//! Before parsing, a query longer than [`MAX_QUERY_BYTES`] or whose tree could nest deeper
//! than [`MAX_DEPTH`] is refused (see `nesting`); evaluation runs on a thread whose stack
//! holds that depth ([`on_query_thread`]). Before evaluation, [`check`] walks the expression
//! once: it refuses the depth again (for trees built without the parser), and every range, offset,
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

/// Deepest syntax tree parsed and evaluated: a generated chain of two thousand `or`
/// terms fits. Each level costs stack in the parser, every walk over the tree and the
/// evaluator; evaluation runs on a thread whose stack is sized for it ([`QUERY_STACK`]).
pub const MAX_DEPTH: usize = 2048;

/// Tokens × depth a query may have: the parser's type checks take up to that many steps
/// (a few tens of milliseconds at the limit); a 2,000-term `or` chain of plain selectors
/// is a fifth of it.
pub const MAX_PARSE_WORK: usize = 50_000_000;

/// Longest query text accepted (Prometheus has no limit of its own; its HTTP server reads
/// at most 1 MB of URL and 10 MB of form).
pub const MAX_QUERY_BYTES: usize = 1 << 20;

/// The stack a thread needs to parse, check, clone, plan and drop a query of [`MAX_DEPTH`]
/// levels (a debug build's frames included, with a margin): the binary's runtime threads,
/// where requests are handled, have it.
pub const CALLER_STACK: usize = 16 << 20;

/// The stack of a thread that evaluates a query: room for [`MAX_DEPTH`] levels of the
/// deepest-framed construct, measured by the tests, with a margin. It is reserved address
/// space; only what a query touches is memory.
pub const QUERY_STACK: usize = 64 << 20;

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

/// Runs `f` on a thread of its own whose stack is [`QUERY_STACK`], and waits for it without
/// blocking the runtime. A panic in `f` is the query's internal error; a thread that cannot
/// be started (the process is at its limit) is the query's execution error.
pub async fn on_query_thread<T, F>(f: F) -> Result<T, QueryError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, QueryError> + Send + 'static,
{
    // A query whose caller gave up runs on until its next check; bounded in number so
    // abandoned queries cannot pile up threads.
    let Some(live) = LiveQuery::enter() else {
        return Err(QueryError::Execution(format!(
            "{MAX_QUERY_THREADS} queries are still running, some for callers that gave up: retry later"
        )));
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("strata-query".into())
        .stack_size(QUERY_STACK)
        .spawn(move || {
            let _live = live;
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
                let what =
                    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
                Err(QueryError::Internal(what.unwrap_or_else(|| "a panic".into())))
            });
            let _ = tx.send(out);
        })
        .map_err(|e| QueryError::Execution(format!("cannot start a thread for the query: {e}")))?;
    rx.await.map_err(|_| QueryError::Internal("the query's thread ended without an answer".into()))?
}

/// Query threads alive at once, the abandoned ones included.
pub const MAX_QUERY_THREADS: usize = 256;

static LIVE_QUERIES: AtomicU64 = AtomicU64::new(0);

/// One live query thread, counted while it exists.
struct LiveQuery;

impl LiveQuery {
    fn enter() -> Option<LiveQuery> {
        let before = LIVE_QUERIES.fetch_add(1, Ordering::AcqRel);
        if before >= MAX_QUERY_THREADS as u64 {
            LIVE_QUERIES.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(LiveQuery)
    }
}

impl Drop for LiveQuery {
    fn drop(&mut self) {
        LIVE_QUERIES.fetch_sub(1, Ordering::AcqRel);
    }
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
        let deep = format!("{}1{}", "(".repeat(MAX_DEPTH / 2 + 5), ")".repeat(MAX_DEPTH / 2 + 5));
        assert!(matches!(crate::parse(&deep), Err(crate::ParseError(m)) if m.contains("levels deep")));
        // The deepest accepted, on a thread with the stack callers give the engine.
        let ok = format!("{}1{}", "(".repeat(MAX_DEPTH / 2 - 5), ")".repeat(MAX_DEPTH / 2 - 5));
        let checked_ok =
            std::thread::Builder::new().stack_size(CALLER_STACK).spawn(move || checked(&ok).is_ok()).unwrap().join();
        assert!(checked_ok.unwrap());
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
