//! [`WithAggregates`]: a store that also answers leaves from aggregates when a request asks
//! for a resolution (`StepsRequest::resolution`), and passes everything else to the store
//! it wraps. Raw selections never see aggregate chunks.

use crate::answer::{answer_after, AnswerError};
use crate::downsampler::Downsampler;
use async_trait::async_trait;
use std::sync::Arc;
use strata_model::{Labels, Matcher, Metadata};
use strata_store::{SelectBudget, SelectRequest, SeriesChunks, Steps, StepsRequest, Store, StoreError};

pub struct WithAggregates {
    inner: Arc<dyn Store>,
    down: Arc<Downsampler>,
    oldest_raw: Option<OldestRaw>,
}

/// The time of the oldest raw sample the wrapped store holds now, damaged blocks
/// included (`i64::MAX`: none; `i64::MIN`: unknown).
pub type OldestRaw = Arc<dyn Fn() -> i64 + Send + Sync>;

impl WithAggregates {
    pub fn new(inner: Arc<dyn Store>, down: Arc<Downsampler>) -> Self {
        WithAggregates { inner, down, oldest_raw: None }
    }

    /// Lets a grid reach back before the first window computed when the store holds no
    /// raw data there either: those windows are empty (the global asks so only when no
    /// store holds data there; a `[1h]` range at the start of a day's data).
    pub fn with_oldest_raw(mut self, oldest: OldestRaw) -> Self {
        self.oldest_raw = Some(oldest);
        self
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
        // Before the first window computed, nothing is held when no raw sample is older
        // (a backlog older than that marks its slices to be computed again, which ends
        // the coverage before them until they are) and no block of either resolution,
        // damaged ones included, starts earlier.
        let nothing_before = |lo: i64| {
            self.oldest_raw.as_ref().is_some_and(|oldest| oldest() >= lo)
                && self.down.oldest_held().is_some_and(|oldest| oldest >= lo)
        };
        let empty_until = match covered {
            Some((w, lo, hi)) if to <= hi && from.div_euclid(w).saturating_mul(w) >= lo - 1 => i64::MIN,
            Some((_, lo, hi)) if to <= hi && to >= lo && nothing_before(lo) => lo - 1,
            _ => {
                return Err(StoreError::InvalidRequest(format!(
                    "from aggregates: ({from}, {to}] is not all computed at {} ms (covered: {covered:?})",
                    req.resolution
                )))
            }
        };
        let req = req.clone();
        let answered = tokio::task::spawn_blocking(move || answer_after(&blocks, &req, empty_until))
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
