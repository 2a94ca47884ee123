//! [`Scoped`]: a store seen through extra matchers, which every request carries besides its
//! own. An archiver that takes one shard of the work (the series of some external labels,
//! `--archive.shard`) reads its stores through it, so that the label values it lists, the
//! series it selects and the steps it asks for are its shard's alone, and a fan-out below
//! it prunes the stores whose label sets cannot match.

use crate::{BoxBatches, SelectBudget, SelectRequest, SeriesChunks, Steps, StepsRequest, Store, StoreError};
use async_trait::async_trait;
use std::sync::Arc;
use strata_model::{Labels, Matcher, Metadata};

pub struct Scoped {
    inner: Arc<dyn Store>,
    matchers: Vec<Matcher>,
}

impl Scoped {
    pub fn new(inner: Arc<dyn Store>, matchers: Vec<Matcher>) -> Self {
        Scoped { inner, matchers }
    }

    fn with(&self, matchers: &[Matcher]) -> Vec<Matcher> {
        matchers.iter().chain(&self.matchers).cloned().collect()
    }

    fn request(&self, req: &SelectRequest) -> SelectRequest {
        SelectRequest { matchers: self.with(&req.matchers), ..req.clone() }
    }
}

#[async_trait]
impl Store for Scoped {
    async fn select_batches(&self, req: &SelectRequest) -> Result<BoxBatches, StoreError> {
        self.inner.select_batches(&self.request(req)).await
    }

    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        self.inner.select_within(&self.request(req), budget).await
    }

    async fn series_within(
        &self,
        matchers: &[Matcher],
        start: i64,
        end: i64,
        budget: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        self.inner.series_within(&self.with(matchers), start, end, budget).await
    }

    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        self.inner.label_names(&self.with(matchers), start, end).await
    }

    async fn label_values(
        &self,
        name: &str,
        matchers: &[Matcher],
        start: i64,
        end: i64,
    ) -> Result<Vec<String>, StoreError> {
        self.inner.label_values(name, &self.with(matchers), start, end).await
    }

    /// Families are not labelled: the inner store's, whole.
    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        self.inner.metadata(metric).await
    }

    async fn select_aggregates(
        &self,
        req: &SelectRequest,
        resolution: i64,
    ) -> Result<Vec<crate::AggregateSeries>, StoreError> {
        self.inner.select_aggregates(&self.request(req), resolution).await
    }

    async fn steps(&self, req: &StepsRequest) -> Result<Option<Steps>, StoreError> {
        let req = StepsRequest { matchers: self.with(&req.matchers), ..req.clone() };
        self.inner.steps(&req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance;
    use crate::memory::MemoryStore;
    use strata_model::{MatchOp, MetricType, Sample};

    /// The fixture's series and others of another cluster: through the scope, the store
    /// answers as one holding the fixture alone.
    #[tokio::test]
    async fn a_scoped_store_passes_the_conformance_suite_over_its_scope_alone() {
        let mut m = MemoryStore::default();
        for f in conformance::fixture() {
            let name = f.labels.metric_name().unwrap_or_default().to_string();
            m.set_metadata(&name, Metadata { metric_type: f.metric_type, ..Default::default() });
            m.add(f.labels.clone(), f.metric_type, f.samples.clone());
            let mut other: Vec<(String, String)> =
                f.labels.iter().map(|l| (l.name.to_string(), l.value.to_string())).collect();
            other.push(("cluster".into(), "elsewhere".into()));
            m.add(Labels::from_pairs(other), f.metric_type, vec![Sample::new(1_700_000_000_500, 42.0)]);
        }
        m.add(
            Labels::from_pairs([("__name__", "only_elsewhere"), ("cluster", "elsewhere")]),
            MetricType::Gauge,
            vec![Sample::new(1_700_000_000_000, 1.0)],
        );
        let outside = Matcher::new(MatchOp::NotEqual, "cluster", "elsewhere").unwrap();
        let scoped = Scoped::new(Arc::new(m), vec![outside]);
        conformance::run_all(&scoped).await;
    }
}
