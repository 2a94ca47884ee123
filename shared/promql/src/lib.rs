//! The PromQL engine, written once for every tier: it reads only through
//! [`Store`](strata_store::Store), so the same code answers over the edge's head, a remote
//! store, the global fan-out and the archive.
//!
//! Evaluation has two phases. First every selector of the expression is fetched once, for
//! the whole query range (steps, offsets, `@`, ranges and lookback included), through the
//! store: a range query never re-selects per step. Then the expression is evaluated step by
//! step over those samples, with Prometheus 3 semantics: left-open range windows `(t-r, t]`,
//! a 5-minute lookback for instant selectors, staleness markers ending a series.
//!
//! Subqueries are evaluated once on their own aligned grid for the whole query, then sliced
//! per step like a range selector. Native histograms are not supported: asking for a
//! function only they have is an error naming it, never a wrong answer.

mod aggregate;
mod binary;
#[cfg(test)]
mod delayed_name_tests;
mod eval;
mod fetch;
mod functions;
mod histogram;
#[cfg(test)]
mod hostile_tests;
pub mod limits;
mod nesting;
#[cfg(feature = "notation")]
pub mod notation;
mod positions;
pub mod pushdown;
#[cfg(test)]
mod pushdown_tests;
pub mod selector;
#[cfg(feature = "testfile")]
pub mod testfile;
mod windows;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_model::Labels;
use strata_store::{SelectLimits, Store, StoreError};

pub use eval::Evaluator;

/// The engine's hash maps, keyed mostly by label sets: foldhash, several times faster
/// than the standard SipHash on their strings, seeded per map.
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub(crate) type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
/// A parsed PromQL expression; callers get one from [`parse`] and never name the parser crate.
pub use promql_parser::parser::Expr;
/// A query that does not parse, with the parser's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

/// Parses a PromQL expression (Prometheus 3 grammar).
///
/// The parser panics on some numbers it cannot turn into a duration (`offset Inf`,
/// `[1e20]`); a query is user input, so such a panic becomes a parse error here instead of
/// ending the request's task.
///
/// Queries longer than [`limits::MAX_QUERY_BYTES`], or whose tree could be deeper than
/// [`limits::MAX_DEPTH`], are refused before the parser (which recurses per level) sees them.
pub fn parse(query: &str) -> Result<Expr, ParseError> {
    if query.len() > limits::MAX_QUERY_BYTES {
        return Err(ParseError(format!(
            "query is {} bytes long, more than the limit of {}",
            query.len(),
            limits::MAX_QUERY_BYTES
        )));
    }
    if let Some(shape) = nesting::bound(query) {
        if shape.depth > limits::MAX_DEPTH {
            return Err(ParseError(format!(
                "query nests up to {} levels deep (operators and brackets), more than the limit of {}",
                shape.depth,
                limits::MAX_DEPTH
            )));
        }
        // The parser's type checks walk scalar subtrees: at most nodes × depth steps.
        if shape.tokens.saturating_mul(shape.depth) > limits::MAX_PARSE_WORK {
            return Err(ParseError(format!(
                "query of {} tokens nesting up to {} levels deep is too large to parse (limit {} tokens × levels)",
                shape.tokens,
                shape.depth,
                limits::MAX_PARSE_WORK
            )));
        }
    }
    match std::panic::catch_unwind(|| promql_parser::parser::parse(query)) {
        Ok(parsed) => parsed.map_err(ParseError),
        Err(_) => Err(ParseError("invalid duration or time in the query: out of range".into())),
    }
}

/// Prometheus' defaults.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub lookback: Duration,
    pub max_samples: u64,
    pub timeout: Duration,
    pub max_series: usize,
    /// Prometheus 3's experimental delayed name removal (`promql-delayed-name-removal`): the
    /// metric name an operation drops stays visible to `label_replace`, `label_join` and
    /// `by (__name__)` and is removed from the result. Off by default, as in Prometheus.
    pub delayed_name_removal: bool,
    /// Let stores that can evaluate a query's leaves (and aggregations over them) do so,
    /// where the data is (`pushdown`). The answer is the same either way.
    pub pushdown: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            lookback: Duration::from_secs(300),
            max_samples: 50_000_000,
            timeout: Duration::from_secs(120),
            max_series: 1_000_000,
            delayed_name_removal: false,
            pushdown: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("{0}")]
    BadData(String),
    #[error("{0}")]
    Execution(String),
    #[error("query processing would load too many samples into memory in query execution (limit {0})")]
    TooManySamples(u64),
    #[error("query timed out in expression evaluation (timeout {0:?})")]
    Timeout(Duration),
    #[error("query was canceled: its caller went away")]
    Canceled,
    /// A bug: evaluation panicked. The request fails; the process and other queries go on.
    #[error("internal error in query evaluation: {0}")]
    Internal(String),
    #[error("{0} is not supported yet")]
    Unsupported(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One output series: labels and (timestamp ms, value) points.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesPoints {
    pub labels: Labels,
    pub points: Vec<(i64, f64)>,
}

/// A query result, as the HTTP API returns it.
#[derive(Debug, Clone, PartialEq)]
pub enum QueryValue {
    Scalar(i64, f64),
    String(i64, String),
    /// An instant vector at one time.
    Vector(Vec<(Labels, i64, f64)>),
    /// A range query's result, or a range vector of an instant query.
    Matrix(Vec<SeriesPoints>),
}

/// Sets its flag when dropped: the query's future holds it, so a caller that goes away (a
/// client that disconnects, a timeout) stops the evaluation running on a blocking thread
/// at its next check instead of letting it run to the end.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The engine: options plus the store to read.
pub struct Engine {
    pub options: EngineOptions,
    /// The text the evaluated expression was parsed from, when known: annotations about an
    /// argument then say where it stands in it, as Prometheus' do.
    source: Option<Arc<str>>,
}

impl Engine {
    pub fn new(options: EngineOptions) -> Self {
        Engine { options, source: None }
    }

    /// Annotations will be positioned in `query`, the text the evaluated expression was
    /// parsed from.
    pub fn with_source(mut self, query: &str) -> Self {
        self.source = Some(query.into());
        self
    }

    fn limits(&self) -> SelectLimits {
        SelectLimits { max_series: self.options.max_series, max_samples: self.options.max_samples }
    }

    /// Evaluates `expr` at `time` (ms).
    pub async fn instant(&self, store: &dyn Store, expr: &Expr, time: i64) -> Result<QueryValue, QueryError> {
        Ok(self.instant_with_stats(store, expr, time, false).await?.0)
    }

    /// Evaluates `expr` at every step from `start` to `end` (ms, inclusive).
    pub async fn range(
        &self,
        store: &dyn Store,
        expr: &Expr,
        start: i64,
        end: i64,
        step: i64,
    ) -> Result<QueryValue, QueryError> {
        Ok(self.range_with_stats(store, expr, start, end, step, false).await?.0)
    }

    /// [`instant`](Self::instant), with Prometheus' query statistics.
    pub async fn instant_with_stats(
        &self,
        store: &dyn Store,
        expr: &Expr,
        time: i64,
        per_step: bool,
    ) -> Result<(QueryValue, QueryStats), QueryError> {
        self.run(store, expr, time, time, None, per_step).await
    }

    /// [`range`](Self::range), with Prometheus' query statistics (`per_step`: `stats=all`).
    pub async fn range_with_stats(
        &self,
        store: &dyn Store,
        expr: &Expr,
        start: i64,
        end: i64,
        step: i64,
        per_step: bool,
    ) -> Result<(QueryValue, QueryStats), QueryError> {
        if step <= 0 {
            return Err(QueryError::BadData("zero or negative query resolution step widths are not accepted".into()));
        }
        self.run(store, expr, start, end, Some(step), per_step).await
    }

    /// An instant query has no `step`.
    async fn run(
        &self,
        store: &dyn Store,
        expr: &Expr,
        start: i64,
        end: i64,
        step: Option<i64>,
        per_step: bool,
    ) -> Result<(QueryValue, QueryStats), QueryError> {
        let began = Instant::now();
        let deadline = began + self.options.timeout;
        let (instant, step) = (step.is_none(), step.unwrap_or(1));
        limits::check(expr)?;
        // Selections are keyed by the address of their node, so the tree fetched from is the
        // one evaluated: one copy, moved to the blocking thread with its data.
        let expr = Arc::new(expr.clone());
        let (max_samples, timeout) = (self.options.max_samples, self.options.timeout);
        let delayed_name_removal = self.options.delayed_name_removal;
        let source = self.source.clone();
        let fut = async {
            let lookback = i64::try_from(self.options.lookback.as_millis()).unwrap_or(i64::MAX);
            let data =
                fetch::fetch(store, &expr, (start, end, step), lookback, self.limits(), self.options.pushdown).await?;
            let prepared = began.elapsed();
            let canceled = Arc::new(AtomicBool::new(false));
            let _cancel = CancelOnDrop(canceled.clone());
            // CPU-bound work runs on a thread of its own, so that the runtime's other tasks (an
            // edge's scrape loops share it) keep running, a dropped query can be stopped, and
            // the evaluator's recursion has the stack the depth limit was sized for.
            limits::on_query_thread(move || {
                let mut ev = Evaluator::new(&data, start, end, step, lookback, max_samples)
                    .with_deadline(deadline, timeout)
                    .with_cancel(canceled)
                    .with_delayed_name_removal(delayed_name_removal);
                if per_step {
                    ev = ev.with_step_stats()?;
                }
                let steps = ev.steps;
                let value = if instant { ev.instant_result(&expr, start) } else { ev.range_result(&expr, steps) }?;
                let positions = source.as_deref().map(|q| (q, positions::ArgPositions::of(q, &expr)));
                let (warnings, infos) =
                    ev.annotations.take_with(|arg| positions.as_ref().and_then(|(q, p)| p.suffix(q, arg)));
                let stats = QueryStats {
                    warnings,
                    infos,
                    total_queryable_samples: ev.samples_touched(),
                    peak_samples: data.series.values().flatten().map(|s| s.samples_in_range()).sum(),
                    per_step: ev.step_stats(),
                    preparation: prepared,
                    inner_eval: began.elapsed() - prepared,
                    total: began.elapsed(),
                };
                Ok((value, stats))
            })
            .await
        };
        tokio::time::timeout(self.options.timeout, fut).await.map_err(|_| QueryError::Timeout(self.options.timeout))?
    }
}

/// What a query cost, as Prometheus reports it with `stats`: samples touched by
/// selectors and range functions, the samples its selections hold (evaluation decodes
/// them a series at a time), and where the time went.
#[derive(Debug, Clone, Default)]
pub struct QueryStats {
    /// Prometheus' warning annotations (the answer may be incomplete or wrong).
    pub warnings: Vec<String>,
    /// Prometheus' info annotations (the answer may surprise).
    pub infos: Vec<String>,
    pub total_queryable_samples: u64,
    pub peak_samples: u64,
    /// Samples touched at each step, with `stats=all`.
    pub per_step: Option<Vec<(i64, u64)>>,
    /// Selecting and decoding.
    pub preparation: Duration,
    /// Evaluation over the decoded samples, sorting included.
    pub inner_eval: Duration,
    pub total: Duration,
}
