//! [`WithAggregates`]: a store that also answers leaves from aggregates when a request asks
//! for a resolution (`StepsRequest::resolution`), and passes everything else to the store
//! it wraps. Raw selections never see aggregate chunks.

use crate::answer::{answer_after, AnswerError};
use crate::blocks::AggregateError;
use crate::downsampler::Downsampler;
use crate::encoding::{encode, Wanted};
use crate::window::window_end;
use async_trait::async_trait;
use std::sync::Arc;
use strata_model::{Labels, Matcher, Metadata};
use strata_store::{
    require_matchers, AggregateChunk, AggregateSeries, QueryScope, SelectBudget, SelectRequest, SeriesChunks, Steps,
    StepsRequest, Store, StoreError, MAX_AGGREGATE_CHUNK_BYTES,
};

/// Windows per chunk a `Series` answer carries at most: a day of 5 m windows (a run that
/// encodes past [`MAX_AGGREGATE_CHUNK_BYTES`] is split further).
const CHUNK_WINDOWS: usize = 288;

/// `windows` as chunks of at most [`CHUNK_WINDOWS`] windows and
/// [`MAX_AGGREGATE_CHUNK_BYTES`] bytes.
fn chunks_of(windows: &[crate::Window], width: i64, kept: crate::Kept, out: &mut Vec<AggregateChunk>) {
    for run in windows.chunks(CHUNK_WINDOWS) {
        let data = encode(run, width, kept);
        if data.len() > MAX_AGGREGATE_CHUNK_BYTES && run.len() > 1 {
            let (a, b) = run.split_at(run.len() / 2);
            chunks_of(a, width, kept, out);
            chunks_of(b, width, kept, out);
            continue;
        }
        out.push(AggregateChunk {
            first_end: run[0].end,
            last_end: run[run.len() - 1].end,
            windows: run.len() as u32,
            data,
        });
    }
}

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
        // Not kept as configured: finer data answers, without decoding windows to learn so.
        let function = req.function.as_ref().and_then(|(name, _)| crate::RangeFn::parse(name, None));
        if function.is_some_and(|f| f.needs() == crate::range::Needs::ExtremeTimes) && !self.down.asked().extreme_times
        {
            return Err(StoreError::InvalidRequest(
                "from aggregates: the extremes' times are not kept here (downsample.extreme_times)".into(),
            ));
        }
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

    /// The windows as computed, re-encoded per series over the range (a series' windows
    /// may span blocks). Only what is complete and current: the rest of the range is
    /// left out and said so, never served half computed.
    async fn select_aggregates(
        &self,
        req: &SelectRequest,
        resolution: i64,
    ) -> Result<Vec<AggregateSeries>, StoreError> {
        require_matchers(&req.matchers)?;
        let Some(blocks) = self.down.blocks(resolution) else {
            return Err(StoreError::InvalidRequest(format!("no aggregates of {resolution} ms windows here")));
        };
        let scope = QueryScope::current();
        let Some((w, first, last)) = self.down.coverage().into_iter().find(|c| c.0 == resolution) else {
            scope.warn(format!("no {resolution} ms aggregates are computed yet: none are in this answer"));
            return Ok(Vec::new());
        };
        // The windows whose samples all lie in `[first, last]`.
        let (first_end, last_end) = (window_end(first.saturating_add(w - 1), w), last.div_euclid(w).saturating_mul(w));
        let (lo, hi) = (req.start.max(first_end), req.end.min(last_end));
        if lo != req.start || hi != req.end {
            if !scope.partial_response {
                return Err(StoreError::InvalidRequest(format!(
                    "{resolution} ms aggregates are complete only for windows ending in [{first_end}, {last_end}], \
                     not all of [{}, {}] (partial response is disabled)",
                    req.start, req.end
                )));
            }
            scope.warn(format!(
                "{resolution} ms aggregates are complete for windows ending in [{first_end}, {last_end}]; \
                 the rest of [{}, {}] is not in this answer",
                req.start, req.end
            ));
        }
        if lo > hi {
            return Ok(Vec::new());
        }
        let matchers = req.matchers.clone();
        let limits = req.limits;
        let answered = tokio::task::spawn_blocking(move || -> Result<Vec<AggregateSeries>, StoreError> {
            let found = blocks.find(&matchers, (lo - 1, hi), |_| true).map_err(store_error)?;
            if found.len() > limits.max_series {
                let limit = u64::try_from(limits.max_series).unwrap_or(u64::MAX);
                return Err(StoreError::LimitExceeded { what: "series", limit });
            }
            if found.windows_at_most() > limits.max_samples {
                return Err(StoreError::LimitExceeded { what: "samples", limit: limits.max_samples });
            }
            let series = found.map(Wanted::ALL, |s| -> Result<Option<AggregateSeries>, AggregateError> {
                if s.windows.is_empty() {
                    return Ok(None);
                }
                let mut chunks = Vec::new();
                chunks_of(&s.windows, w, s.kept, &mut chunks);
                Ok(Some(AggregateSeries { labels: s.labels, metric_type: s.metric_type, resolution: w, chunks }))
            });
            Ok(series.map_err(store_error)?.into_iter().flatten().collect())
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("reading aggregates: {e}")))?;
        answered
    }
}

fn store_error(e: AggregateError) -> StoreError {
    match e {
        AggregateError::Corrupt { series, block, reason } => {
            StoreError::Corrupt { series, reason: format!("aggregates in block {block}: {reason}") }
        }
        e => StoreError::Unavailable(e.to_string()),
    }
}
