//! The PromQL engine, written once for every tier: it reads only through
//! [`Store`](crate::store::Store), so the same code answers over the edge's head, a remote
//! store, the global fan-out and the archive.
//!
//! Evaluation has two phases. First every selector of the expression is fetched once, for
//! the whole query range (steps, offsets, `@`, ranges and lookback included), through the
//! store: a range query never re-selects per step. Then the expression is evaluated step by
//! step over those samples, with Prometheus 3 semantics: left-open range windows `(t-r, t]`,
//! a 5-minute lookback for instant selectors, staleness markers ending a series.
//!
//! Subqueries are evaluated once on their own aligned grid for the whole query, then sliced
//! per step like a range selector. Native histograms and the functions that are
//! experimental in Prometheus 3.0 are not supported: asking for one is an error naming it,
//! never a wrong answer.

mod aggregate;
mod binary;
mod eval;
mod fetch;
mod functions;
mod windows;
pub mod testfile;

use crate::model::Labels;
use crate::store::{SelectLimits, Store, StoreError};
use promql_parser::parser::Expr;
use std::time::Duration;

pub use aggregate::format_value;
pub use eval::Evaluator;

/// Parses a Prometheus duration (`5m`, `1h30m`) to milliseconds.
pub fn parse_duration(s: &str) -> Option<i64> {
    testfile::parse_duration_ms(s)
}

/// Prometheus' defaults.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub lookback: Duration,
    pub max_samples: u64,
    pub timeout: Duration,
    pub max_series: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions { lookback: Duration::from_secs(300), max_samples: 50_000_000, timeout: Duration::from_secs(120), max_series: 1_000_000 }
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

/// Runs CPU-bound evaluation so that it does not hold up the runtime's other tasks (an
/// edge's scrape loops share it): on a multi-threaded runtime the worker hands its queue
/// over first. Elsewhere (tests, the conformance runner) it simply runs.
pub(crate) fn evaluate<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The engine: options plus the store to read.
pub struct Engine {
    pub options: EngineOptions,
}

impl Engine {
    pub fn new(options: EngineOptions) -> Self {
        Engine { options }
    }

    fn limits(&self) -> SelectLimits {
        SelectLimits { max_series: self.options.max_series, max_samples: self.options.max_samples }
    }

    /// Evaluates `expr` at `time` (ms).
    pub async fn instant(&self, store: &dyn Store, expr: &Expr, time: i64) -> Result<QueryValue, QueryError> {
        let deadline = std::time::Instant::now() + self.options.timeout;
        let fut = async {
            let data = fetch::fetch(store, expr, time, time, self.options.lookback.as_millis() as i64, self.limits()).await?;
            let ev = Evaluator::new(&data, time, time, 1, self.options.lookback.as_millis() as i64, self.options.max_samples)
                .with_deadline(deadline, self.options.timeout);
            evaluate(|| ev.instant_result(expr, time))
        };
        tokio::time::timeout(self.options.timeout, fut).await.map_err(|_| QueryError::Timeout(self.options.timeout))?
    }

    /// Evaluates `expr` at every step from `start` to `end` (ms, inclusive).
    pub async fn range(&self, store: &dyn Store, expr: &Expr, start: i64, end: i64, step: i64) -> Result<QueryValue, QueryError> {
        if step <= 0 {
            return Err(QueryError::BadData("zero or negative query resolution step widths are not accepted".into()));
        }
        let deadline = std::time::Instant::now() + self.options.timeout;
        let fut = async {
            let lookback = self.options.lookback.as_millis() as i64;
            let data = fetch::fetch(store, expr, start, end, lookback, self.limits()).await?;
            let steps = ((end - start) / step + 1) as usize;
            let ev = Evaluator::new(&data, start, end, step, lookback, self.options.max_samples).with_deadline(deadline, self.options.timeout);
            evaluate(|| ev.range_result(expr, steps))
        };
        tokio::time::timeout(self.options.timeout, fut).await.map_err(|_| QueryError::Timeout(self.options.timeout))?
    }
}
