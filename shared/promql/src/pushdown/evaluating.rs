//! [`Evaluating`]: a store wrapper that answers [`Store::steps`] in process.

use crate::QueryError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use strata_model::{Labels, Matcher, Metadata};
use strata_store::{SelectBudget, SelectRequest, SeriesChunks, Steps, StepsRequest, Store, StoreError};

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

    async fn select_aggregates(
        &self,
        req: &SelectRequest,
        resolution: i64,
    ) -> Result<Vec<strata_store::AggregateSeries>, StoreError> {
        self.inner.select_aggregates(req, resolution).await
    }

    async fn steps(&self, req: &StepsRequest) -> Result<Option<Steps>, StoreError> {
        if req.values {
            self.evaluated.fetch_add(1, Ordering::Relaxed);
            if req.aggregate.is_some() {
                self.aggregated.fetch_add(1, Ordering::Relaxed);
            }
        }
        match super::evaluate(&self.inner, req, &|l| l.clone(), Duration::from_secs(120)).await {
            Ok(steps) => Ok(Some(steps)),
            Err(QueryError::Store(e)) => Err(e),
            Err(QueryError::Unsupported(_)) => Ok(None),
            Err(QueryError::TooManySamples(n)) => Err(StoreError::LimitExceeded { what: "samples", limit: n }),
            Err(e) => Err(StoreError::InvalidRequest(e.to_string())),
        }
    }
}
