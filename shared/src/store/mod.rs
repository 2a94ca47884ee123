//! The one storage trait where the tiers meet.
//!
//! The PromQL engine, the HTTP API and HA dedup read only through [`Store`], so they are
//! written and tested once: the edge's head implements it now; the remote store (gRPC), the
//! fan-out and the archive reader will implement it next, and every implementation must pass
//! [`conformance`]. Series come back sorted by labels, each with its metric type (from the
//! scrape metadata, so dedup never guesses from a function name) and its samples as encoded
//! chunks, which travel between tiers unchanged.

pub mod conformance;
pub mod memory;

use crate::chunk::{Chunk, ChunkError};
use crate::db::Tsdb;
use crate::matcher::{matches_all, Matcher};
use crate::model::{Labels, Metadata, MetricType, Sample};
use async_trait::async_trait;
use std::sync::Arc;

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
}

impl SelectRequest {
    pub fn new(matchers: Vec<Matcher>, start: i64, end: i64) -> Self {
        SelectRequest { matchers, start, end, limits: SelectLimits::default() }
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
            StoreError::Corrupt { series, reason } => StoreError::Corrupt { series: series.clone(), reason: reason.clone() },
        }
    }
}

#[async_trait]
pub trait Store: Send + Sync {
    /// Series matching all matchers with samples in `[start, end]`, sorted by labels.
    async fn select(&self, req: &SelectRequest) -> Result<Vec<SeriesChunks>, StoreError>;

    /// Label sets of matching series with samples in range, sorted (no sample data).
    async fn series(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<Labels>, StoreError>;

    /// Sorted label names; with matchers, only those of matching series in range.
    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError>;

    /// Sorted values of a label; with matchers, only those of matching series in range.
    async fn label_values(&self, name: &str, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError>;

    /// Metric family metadata, optionally for one metric, sorted by family.
    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError>;
}

fn require_matchers(matchers: &[Matcher]) -> Result<(), StoreError> {
    // As Prometheus: at least one matcher must not match the empty string.
    if matchers.iter().all(|m| m.matches("")) {
        return Err(StoreError::InvalidRequest("match[] must contain at least one matcher that does not match the empty string".into()));
    }
    Ok(())
}

/// [`Store`] over the edge's own database.
#[derive(Clone)]
pub struct TsdbStore(pub Arc<Tsdb>);

#[async_trait]
impl Store for TsdbStore {
    async fn select(&self, req: &SelectRequest) -> Result<Vec<SeriesChunks>, StoreError> {
        require_matchers(&req.matchers)?;
        let head = self.0.head();
        let found = head.select(&req.matchers, req.start, req.end);
        if found.len() > req.limits.max_series {
            return Err(StoreError::LimitExceeded { what: "series", limit: req.limits.max_series as u64 });
        }
        let mut samples = 0u64;
        let mut out = Vec::with_capacity(found.len());
        for (s, chunks) in found {
            samples += chunks.iter().map(|c| c.samples_within(req.start, req.end)).sum::<u64>();
            if samples > req.limits.max_samples {
                return Err(StoreError::LimitExceeded { what: "samples", limit: req.limits.max_samples });
            }
            let metric_type = s.labels.metric_name().map(|n| head.metric_type(n)).unwrap_or_default();
            out.push(SeriesChunks { labels: s.labels.clone(), metric_type, chunks });
        }
        Ok(out)
    }

    async fn series(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<Labels>, StoreError> {
        require_matchers(matchers)?;
        Ok(self.0.head().select_labels(matchers, start, end))
    }

    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        let head = self.0.head();
        if matchers.is_empty() {
            return Ok(head.label_names());
        }
        let mut names: Vec<String> = self
            .series(matchers, start, end)
            .await?
            .iter()
            .flat_map(|l| l.iter().map(|x| x.name.to_string()).collect::<Vec<_>>())
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    async fn label_values(&self, name: &str, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        let head = self.0.head();
        if matchers.is_empty() {
            return Ok(head.label_values(name));
        }
        let mut vals: Vec<String> = self
            .series(matchers, start, end)
            .await?
            .iter()
            .filter(|l| matches_all(matchers, l))
            .filter_map(|l| l.get(name).map(str::to_string))
            .collect();
        vals.sort();
        vals.dedup();
        Ok(vals)
    }

    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        let all = self.0.head().all_metadata();
        Ok(match metric {
            Some(m) => all.into_iter().filter(|(f, _)| f == m).collect(),
            None => all,
        })
    }
}
