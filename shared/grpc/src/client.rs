//! [`RemoteStore`]: a [`Store`] over the gRPC client.

use crate::convert::*;
use crate::{pb, GrpcError, H2_FRAME_BYTES, MAX_MESSAGE_BYTES, WINDOW_BYTES};
use async_trait::async_trait;
use pb::store_client::StoreClient;
use std::time::Duration;
use strata_model::{Labels, Matcher, Metadata};
use strata_store::{SelectBudget, SelectLimits, SelectRequest, SeriesChunks, Store, StoreError};
use tonic::codec::CompressionEncoding;
use tonic::transport::{Channel, Endpoint};

#[derive(Debug, Clone, Copy)]
pub struct RemoteStoreOptions {
    /// Deadline of each call, sent to the server as `grpc-timeout`.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Ask for gzipped responses. Off by default: chunks are already compressed (gzip
    /// saved little on the fleet-day set and cost more CPU than the query), so it pays only
    /// on slow links.
    pub gzip: bool,
}

impl Default for RemoteStoreOptions {
    fn default() -> Self {
        RemoteStoreOptions { timeout: Duration::from_secs(60), connect_timeout: Duration::from_secs(5), gzip: false }
    }
}

#[derive(Clone)]
pub struct RemoteStore {
    /// The address, as errors and warnings name the store.
    name: String,
    client: StoreClient<Channel>,
}

impl RemoteStore {
    /// A store at `addr` (`host:port`, or a URL with `http://`). Connects lazily: a store
    /// that is down fails its calls, not its construction.
    pub fn new(addr: &str, opts: RemoteStoreOptions) -> Result<RemoteStore, GrpcError> {
        let url = if addr.contains("://") { addr.to_string() } else { format!("http://{addr}") };
        let bad = |reason: String| GrpcError::Address { store: addr.to_string(), reason };
        let endpoint = Endpoint::from_shared(url)
            .map_err(|e| bad(e.to_string()))?
            .timeout(opts.timeout)
            .connect_timeout(opts.connect_timeout)
            .tcp_nodelay(true)
            // HTTP/2's default 64 KiB windows make a large answer wait on a round trip per
            // window; selections are megabytes.
            .initial_stream_window_size(Some(WINDOW_BYTES))
            .initial_connection_window_size(Some(2 * WINDOW_BYTES))
            .max_frame_size(H2_FRAME_BYTES);
        // Requests are small and go out plain, so any server can read them; responses may
        // come gzipped.
        let mut client = StoreClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        if opts.gzip {
            client = client.accept_compressed(CompressionEncoding::Gzip);
        }
        Ok(RemoteStore { name: addr.to_string(), client })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub async fn info(&self) -> Result<pb::InfoResponse, StoreError> {
        let mut c = self.client.clone();
        c.info(pb::InfoRequest {}).await.map(|r| r.into_inner()).map_err(|s| self.error(&s))
    }

    fn error(&self, s: &tonic::Status) -> StoreError {
        store_error_from_status(&self.name, s, SelectLimits::default())
    }

    fn corrupt(&self, reason: String) -> StoreError {
        StoreError::Corrupt { series: String::new(), reason: format!("store {}: {reason}", self.name) }
    }

    /// Streams a `Series` call, converting and checking each series and handing it to
    /// `keep` (which charges the budget) frame by frame.
    async fn stream_series(
        &self,
        req: pb::SeriesRequest,
        limits: SelectLimits,
        mut keep: impl FnMut(Labels, pb::Series) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut c = self.client.clone();
        let err = |s: &tonic::Status| store_error_from_status(&self.name, s, limits);
        let mut stream = c.series(req).await.map_err(|s| err(&s))?.into_inner();
        let mut last: Option<Labels> = None;
        let mut pool = StringPool::default();
        while let Some(frame) = stream.message().await.map_err(|s| err(&s))? {
            for w in frame.warnings {
                tracing::warn!(store = %self.name, about = %w.store, "{}", w.message);
            }
            let symbols = FrameSymbols::new(frame.symbols, &mut pool);
            for mut s in frame.series {
                let labels = if s.label_refs.is_empty() {
                    labels_from_pb(std::mem::take(&mut s.labels), &mut pool)
                } else {
                    symbols.labels(&s.label_refs)
                }
                .map_err(|r| self.corrupt(r))?;
                if last.as_ref().is_some_and(|l| l >= &labels) {
                    return Err(self.corrupt(format!("series {labels} out of order or repeated")));
                }
                last = Some(labels.clone());
                keep(labels, s)?;
            }
        }
        Ok(())
    }
}

fn series_request(matchers: &[Matcher], start: i64, end: i64, limits: SelectLimits, skip: bool) -> pb::SeriesRequest {
    pb::SeriesRequest {
        min_time: start,
        max_time: end,
        matchers: matchers.iter().map(matcher_to_pb).collect(),
        skip_chunks: skip,
        max_series: limits.max_series as u64,
        max_samples: limits.max_samples,
        ..Default::default()
    }
}

#[async_trait]
impl Store for RemoteStore {
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        let mut out = Vec::new();
        let pbreq = series_request(&req.matchers, req.start, req.end, req.limits, false);
        self.stream_series(pbreq, req.limits, |labels, s| {
            let chunks = s
                .chunks
                .into_iter()
                .map(chunk_from_pb)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|r| self.corrupt(format!("series {labels}: {r}")))?;
            if chunks.windows(2).any(|w| w[1].min_t <= w[0].max_t) {
                return Err(self.corrupt(format!("series {labels}: chunks overlap or are out of order")));
            }
            budget.charge_series(&chunks)?;
            out.push(SeriesChunks { labels, metric_type: metric_type_from_pb(s.r#type), chunks });
            Ok(())
        })
        .await?;
        Ok(out)
    }

    async fn series_within(
        &self,
        matchers: &[Matcher],
        start: i64,
        end: i64,
        budget: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        let mut out = Vec::new();
        let limits = SelectLimits::default();
        self.stream_series(series_request(matchers, start, end, limits, true), limits, |labels, _| {
            budget.charge_labels()?;
            out.push(labels);
            Ok(())
        })
        .await?;
        Ok(out)
    }

    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        let mut c = self.client.clone();
        let req = pb::LabelNamesRequest {
            min_time: start,
            max_time: end,
            matchers: matchers.iter().map(matcher_to_pb).collect(),
        };
        let r = c.label_names(req).await.map_err(|s| self.error(&s))?.into_inner();
        Ok(r.names)
    }

    async fn label_values(
        &self,
        name: &str,
        matchers: &[Matcher],
        start: i64,
        end: i64,
    ) -> Result<Vec<String>, StoreError> {
        let mut c = self.client.clone();
        let req = pb::LabelValuesRequest {
            name: name.to_string(),
            min_time: start,
            max_time: end,
            matchers: matchers.iter().map(matcher_to_pb).collect(),
        };
        let r = c.label_values(req).await.map_err(|s| self.error(&s))?.into_inner();
        Ok(r.values)
    }

    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        let mut c = self.client.clone();
        let req = pb::MetadataRequest { metric: metric.unwrap_or_default().to_string() };
        let r = c.metadata(req).await.map_err(|s| self.error(&s))?.into_inner();
        Ok(r.families.into_iter().map(metadata_from_pb).collect())
    }
}
