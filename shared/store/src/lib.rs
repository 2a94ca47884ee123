//! The one storage trait where the tiers meet.
//!
//! The PromQL engine, the HTTP API and HA dedup read only through [`Store`], so they are
//! written and tested once: the edge's head implements it now; the remote store (gRPC), the
//! fan-out and the archive reader will implement it next, and every implementation must pass
//! the conformance suite (`conformance`, behind the feature of that name). Series come back sorted by labels, each with its metric type (from the
//! scrape metadata, so dedup never guesses from a function name) and its samples as encoded
//! chunks, which travel between tiers unchanged.

pub mod batches;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod limits;
pub mod memory;
pub mod scope;
pub mod scoped;
pub mod steps;

pub use batches::{collect_batches, collect_within, selection_order, BoxBatches, OneBatch, SeriesBatches};
pub use limits::{require_matchers, SelectBudget};
pub use scope::{QueryScope, ResolutionUsed};
pub use scoped::Scoped;
pub use steps::{
    labels_hash, whole_replica, AggregateSpec, Coverage, SeriesSummary, StepValues, Steps, StepsRequest, StepsSeries,
};

use async_trait::async_trait;
use strata_chunk::{Chunk, ChunkError};
use strata_model::{Labels, Matcher, Metadata, MetricType, Sample};

/// Limits every select obeys; exceeding one is an error, never a silent truncation.
#[derive(Debug, Clone, Copy)]
pub struct SelectLimits {
    pub max_series: usize,
    pub max_samples: u64,
}

impl Default for SelectLimits {
    fn default() -> Self {
        SelectLimits { max_series: 1_000_000, max_samples: 50_000_000 }
    }
}

#[derive(Debug, Clone)]
pub struct SelectRequest {
    pub matchers: Vec<Matcher>,
    /// Inclusive millisecond bounds.
    pub start: i64,
    pub end: i64,
    pub limits: SelectLimits,
    /// Order the series by their labels without these names (ties by all labels); empty:
    /// by labels. The labels themselves come whole. See [`batches`].
    pub order_without: Vec<String>,
}

/// One series' windows of one resolution, encoded as the downsampling crate stores them
/// (every quantity the series' type keeps; the bytes say which): what a store holding
/// aggregates answers a `Series` call for a resolution with.
#[derive(Debug, Clone, PartialEq)]
pub struct AggregateSeries {
    pub labels: Labels,
    pub metric_type: MetricType,
    /// The window width, ms.
    pub resolution: i64,
    /// In time order, none overlapping.
    pub chunks: Vec<AggregateChunk>,
}

/// The most bytes a chunk of windows may hold on the wire: a server splits a run before
/// it gets there, a client refuses more.
pub const MAX_AGGREGATE_CHUNK_BYTES: usize = 256 << 10;

/// A run of a series' windows.
#[derive(Debug, Clone, PartialEq)]
pub struct AggregateChunk {
    /// The first and last window's ends, and how many windows the bytes hold.
    pub first_end: i64,
    pub last_end: i64,
    pub windows: u32,
    pub data: Vec<u8>,
}

impl SelectRequest {
    pub fn new(matchers: Vec<Matcher>, start: i64, end: i64) -> Self {
        SelectRequest { matchers, start, end, limits: SelectLimits::default(), order_without: Vec::new() }
    }
}

/// One series: labels, type, and the chunks overlapping the requested range (which may
/// hold samples outside it: use [`samples`](Self::samples) to cut).
#[derive(Debug, Clone)]
pub struct SeriesChunks {
    pub labels: Labels,
    pub metric_type: MetricType,
    pub chunks: Vec<Chunk>,
}

impl SeriesChunks {
    /// Decoded samples within `[start, end]`, in time order.
    pub fn samples(&self, start: i64, end: i64) -> Result<Vec<Sample>, ChunkError> {
        let mut out = Vec::new();
        Chunk::decode_range(&self.chunks, start, end, &mut out)?;
        Ok(out)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{what} limit of {limit} exceeded")]
    LimitExceeded { what: &'static str, limit: u64 },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("corrupt data in series {series}: {reason}")]
    Corrupt { series: String, reason: String },
}

impl StoreError {
    /// A copy, for error paths that only hold a reference.
    pub fn from_ref(e: &StoreError) -> StoreError {
        match e {
            StoreError::LimitExceeded { what, limit } => StoreError::LimitExceeded { what, limit: *limit },
            StoreError::InvalidRequest(m) => StoreError::InvalidRequest(m.clone()),
            StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
            StoreError::Corrupt { series, reason } => {
                StoreError::Corrupt { series: series.clone(), reason: reason.clone() }
            }
        }
    }
}

/// Storage that answers selections. Callers use [`select`](Self::select) and
/// [`series`](Self::series), which validate the request and apply its limits in one place;
/// an implementation provides the `*_within` methods, which receive a validated request and
/// charge each series to the budget as they collect it, so a select that would exceed a
/// limit stops there instead of after gathering everything.
#[async_trait]
pub trait Store: Send + Sync {
    /// Series matching all matchers with samples in `[start, end]`, sorted by labels.
    async fn select(&self, req: &SelectRequest) -> Result<Vec<SeriesChunks>, StoreError> {
        require_matchers(&req.matchers)?;
        let mut budget = SelectBudget::new(req.limits, req.start, req.end);
        self.select_within(req, &mut budget).await
    }

    /// [`select`](Self::select) a batch at a time, in the request's order
    /// ([`SelectRequest::order_without`]). Stores that pass series on from others stream
    /// them; the default gathers the selection and hands it over as one batch.
    async fn select_batches(&self, req: &SelectRequest) -> Result<BoxBatches, StoreError> {
        let found = self.select(req).await?;
        Ok(Box::new(OneBatch::new(found, req)))
    }

    /// Label sets of matching series with samples in range, sorted (no sample data).
    async fn series(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<Labels>, StoreError> {
        require_matchers(matchers)?;
        let mut budget = SelectBudget::new(SelectLimits::default(), start, end);
        self.series_within(matchers, start, end, &mut budget).await
    }

    /// [`select`](Self::select) after validation: charge every series to `budget` with
    /// [`SelectBudget::charge_series`] before keeping it.
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError>;

    /// [`series`](Self::series) after validation: charge every series with
    /// [`SelectBudget::charge_labels`] before keeping it.
    async fn series_within(
        &self,
        matchers: &[Matcher],
        start: i64,
        end: i64,
        budget: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError>;

    /// Sorted label names; with matchers, only those of matching series in range.
    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError>;

    /// Sorted values of a label; with matchers, only those of matching series in range.
    async fn label_values(
        &self,
        name: &str,
        matchers: &[Matcher],
        start: i64,
        end: i64,
    ) -> Result<Vec<String>, StoreError>;

    /// Metric family metadata, optionally for one metric, sorted by family.
    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError>;

    /// Evaluates a query's leaf where the data is ([`steps`] explains when that pays and
    /// why it gives the same answer). `None`: this store does not (the default), and the
    /// engine selects samples instead.
    async fn steps(&self, _req: &StepsRequest) -> Result<Option<Steps>, StoreError> {
        Ok(None)
    }

    /// The matching series' windows of `resolution` ms ending in `[req.start, req.end]`,
    /// sorted by labels, within the request's limits (windows count as samples). Where the
    /// store's aggregates do not cover the whole range, what they cover and a warning in
    /// the query's scope saying what is missing. The default: a store of raw data only.
    async fn select_aggregates(
        &self,
        _req: &SelectRequest,
        resolution: i64,
    ) -> Result<Vec<AggregateSeries>, StoreError> {
        Err(StoreError::InvalidRequest(format!("no aggregates of {resolution} ms windows here: raw data only")))
    }
}
