//! [`GroupingAggregates`]: a store wrapper that answers an aggregation over a leaf asked
//! at a resolution, for stores whose aggregates answer leaves only (the archive reader).
//!
//! The planner asks the holder of aggregates for the groups of `sum by (x) (leaf)` when
//! the query has one: refused, it would try its other plans and the engine would then ask
//! for the leaf again, reading raw data for the parts it had planned raw in between. A
//! StoreAPI server aggregates its leaf answers itself; this is the same step for a store
//! served in process.

use std::sync::Arc;
use strata_model::{Labels, Matcher, Metadata};
use strata_store::{SelectBudget, SelectRequest, SeriesChunks, Steps, StepsRequest, Store, StoreError};

pub struct GroupingAggregates {
    inner: Arc<dyn Store>,
}

impl GroupingAggregates {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        GroupingAggregates { inner }
    }
}

#[async_trait::async_trait]
impl Store for GroupingAggregates {
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        self.inner.select_within(req, budget).await
    }

    async fn select_batches(&self, req: &SelectRequest) -> Result<strata_store::BoxBatches, StoreError> {
        self.inner.select_batches(req).await
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
        if req.resolution == 0 || req.aggregate.is_none() {
            return self.inner.steps(req).await;
        }
        let leaf = StepsRequest { aggregate: None, ..req.clone() };
        let Some(answer) = self.inner.steps(&leaf).await? else { return Ok(None) };
        aggregate_here(req, answer).await.map(Some)
    }
}

/// `req.aggregate` over `answer`, the leaf's steps a store evaluated (its series' labels as
/// the caller sees them), computed here as the engine would from the samples.
pub async fn aggregate_here(req: &StepsRequest, mut answer: Steps) -> Result<Steps, StoreError> {
    // The engine reads the leaf's series in label order.
    if !answer.series.is_sorted_by(|a, b| a.labels <= b.labels) {
        answer.series.sort_by(|a, b| a.labels.cmp(&b.labels));
    }
    let req = req.clone();
    // The engine's aggregation is CPU work over every series of the leaf.
    let grouped = tokio::task::spawn_blocking(move || super::aggregate_evaluated(&req, answer))
        .await
        .map_err(|e| StoreError::Unavailable(format!("aggregating a leaf's steps: {e}")))?;
    match grouped {
        Ok(steps) => Ok(steps),
        Err(crate::QueryError::TooManySamples(n)) => Err(StoreError::LimitExceeded { what: "samples", limit: n }),
        Err(crate::QueryError::Store(e)) => Err(e),
        Err(e) => Err(StoreError::InvalidRequest(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pushdown::Evaluating;
    use strata_model::{MatchOp, MetricType, Sample};
    use strata_store::memory::MemoryStore;
    use strata_store::AggregateSpec;

    /// Answers leaves only, at any resolution (as the archive's aggregates do).
    struct LeavesOnly(Evaluating<MemoryStore>);

    #[async_trait::async_trait]
    impl Store for LeavesOnly {
        async fn select_within(
            &self,
            req: &SelectRequest,
            budget: &mut SelectBudget,
        ) -> Result<Vec<SeriesChunks>, StoreError> {
            self.0.select_within(req, budget).await
        }
        async fn series_within(
            &self,
            m: &[Matcher],
            start: i64,
            end: i64,
            budget: &mut SelectBudget,
        ) -> Result<Vec<Labels>, StoreError> {
            self.0.series_within(m, start, end, budget).await
        }
        async fn label_names(&self, m: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
            self.0.label_names(m, start, end).await
        }
        async fn label_values(&self, n: &str, m: &[Matcher], s: i64, e: i64) -> Result<Vec<String>, StoreError> {
            self.0.label_values(n, m, s, e).await
        }
        async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
            self.0.metadata(metric).await
        }
        async fn steps(&self, req: &StepsRequest) -> Result<Option<Steps>, StoreError> {
            if req.aggregate.is_some() {
                return Err(StoreError::InvalidRequest("an aggregation over a leaf".into()));
            }
            self.0.steps(&StepsRequest { resolution: 0, ..req.clone() }).await
        }
    }

    fn fleet() -> MemoryStore {
        let mut m = MemoryStore::default();
        for (cluster, gpu) in [("a", "0"), ("a", "1"), ("b", "0")] {
            let labels = Labels::from_pairs([("__name__", "temp"), ("cluster", cluster), ("gpu", gpu)]);
            let base = if cluster == "a" { 40.0 } else { 60.0 };
            m.add(labels, MetricType::Gauge, (0..240).map(|k| Sample::new(k * 15_000, base + (k % 7) as f64)));
        }
        m
    }

    /// An aggregation over a leaf asked at a resolution: the groups the engine gives over
    /// the leaf's series, which the inner store alone refuses.
    #[tokio::test]
    async fn an_aggregation_over_a_leaf_is_grouped_here() {
        let matchers = vec![Matcher::new(MatchOp::Equal, "__name__", "temp").unwrap()];
        let mut req = StepsRequest::new(matchers, (600_000, 3_600_000, 300_000), 300_000);
        req.function = Some(("avg_over_time".into(), 300_000));
        req.aggregate = Some(AggregateSpec {
            op: "sum".into(),
            param: None,
            without: false,
            labels: vec!["cluster".into()],
            filter: None,
        });
        let want = Evaluating::new(fleet()).steps(&req).await.unwrap().unwrap();
        assert_eq!(want.groups.len(), 2);
        let at_5m = StepsRequest { resolution: 300_000, ..req.clone() };
        let inner: Arc<dyn Store> = Arc::new(LeavesOnly(Evaluating::new(fleet())));
        assert!(inner.steps(&at_5m).await.is_err());
        let got = GroupingAggregates::new(inner).steps(&at_5m).await.unwrap().unwrap();
        assert!(got.series.is_empty());
        let values = |s: &Steps| s.groups.iter().map(|g| (g.labels.clone(), g.values.clone())).collect::<Vec<_>>();
        assert_eq!(values(&got), values(&want));
    }
}
