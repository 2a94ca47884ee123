//! [`WithAggregates`]: a store that also answers leaves from aggregates when a request asks
//! for a resolution (`StepsRequest::resolution`), and passes everything else to the store
//! it wraps. Raw selections never see aggregate chunks.

use crate::answer::{answer, AnswerError};
use crate::downsampler::Downsampler;
use async_trait::async_trait;
use std::sync::Arc;
use strata_model::{Labels, Matcher, Metadata};
use strata_store::{SelectBudget, SelectRequest, SeriesChunks, Steps, StepsRequest, Store, StoreError};

pub struct WithAggregates {
    inner: Arc<dyn Store>,
    down: Arc<Downsampler>,
}

impl WithAggregates {
    pub fn new(inner: Arc<dyn Store>, down: Arc<Downsampler>) -> Self {
        WithAggregates { inner, down }
    }
}

#[async_trait]
impl Store for WithAggregates {
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

    async fn steps(&self, req: &StepsRequest) -> Result<Option<Steps>, StoreError> {
        if req.resolution == 0 {
            return self.inner.steps(req).await;
        }
        let Some(blocks) = self.down.blocks(req.resolution) else {
            return Err(StoreError::InvalidRequest(format!("no aggregates of {} ms windows here", req.resolution)));
        };
        // Only what is complete and current: no slice waiting to be computed again, none a
        // sender still sends data for.
        let covered = self.down.coverage().into_iter().find(|c| c.0 == req.resolution);
        let reach = req.function.as_ref().map_or(req.lookback, |f| f.1);
        let from = req.start.saturating_sub(req.offset).saturating_sub(reach);
        let to = req.end.saturating_sub(req.offset);
        if !covered.is_some_and(|(w, lo, hi)| from.div_euclid(w).saturating_mul(w) >= lo - 1 && to <= hi) {
            return Err(StoreError::InvalidRequest(format!(
                "from aggregates: ({from}, {to}] is not all computed at {} ms (covered: {covered:?})",
                req.resolution
            )));
        }
        let req = req.clone();
        let answered = tokio::task::spawn_blocking(move || answer(&blocks, &req))
            .await
            .map_err(|e| StoreError::Unavailable(format!("answering from aggregates: {e}")))?;
        match answered {
            Ok(steps) => Ok(Some(steps)),
            Err(AnswerError::TooMany(n)) => Err(StoreError::LimitExceeded { what: "step values", limit: n }),
            // The caller asked for what the aggregates cannot give exactly: it reads raw
            // data instead, and says so when it cannot.
            Err(e) => Err(StoreError::InvalidRequest(format!("from aggregates: {e}"))),
        }
    }
}
