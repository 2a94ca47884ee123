//! [`RemoteStore`]: a [`Store`] over the gRPC client.

use crate::convert::*;
use crate::{pb, GrpcError, H2_FRAME_BYTES, MAX_MESSAGE_BYTES, WINDOW_BYTES};
use async_trait::async_trait;
use pb::store_client::StoreClient;
use std::cmp::Ordering;
use std::time::Duration;
use strata_model::{Labels, Matcher, Metadata};
use strata_store::{
    collect_within, require_matchers, selection_order, AggregateSeries, BoxBatches, QueryScope, SelectBudget,
    SelectLimits, SelectRequest, SeriesBatches, SeriesChunks, Steps, StepsRequest, Store, StoreError,
};
use tonic::codec::CompressionEncoding;
use tonic::transport::{Channel, Endpoint};

/// The most annotations of each kind kept from one `Steps` answer, and warnings from one
/// answer of any call.
const MAX_ANNOTATIONS: usize = 100;

/// Whether the request's scope disables partial response (sent along, so a store that fans
/// out in turn honours it).
fn partial_response_disabled() -> bool {
    !QueryScope::current().partial_response
}

/// Puts a peer's warnings (a stacked global's failed stores) into the request's scope,
/// naming the peer; at most [`MAX_ANNOTATIONS`] of them.
fn pass_on_warnings(store: &str, warnings: &[pb::Warning]) {
    if warnings.is_empty() {
        return;
    }
    let scope = QueryScope::current();
    for w in warnings.iter().take(MAX_ANNOTATIONS) {
        let about = if w.store.is_empty() { String::new() } else { format!("store {}: ", w.store) };
        scope.warn(format!("store {store}: {about}{}", w.message));
    }
}

#[derive(Debug, Clone)]
pub struct RemoteStoreOptions {
    /// Deadline of each call, sent to the server as `grpc-timeout`.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Ask for gzipped responses. Off by default: chunks are already compressed (gzip
    /// saved little on the fleet-day set and cost more CPU than the query), so it pays only
    /// on slow links.
    pub gzip: bool,
    /// Connect over TLS (see [`ClientTlsFiles`](crate::ClientTlsFiles)).
    pub tls: Option<tonic::transport::ClientTlsConfig>,
}

impl Default for RemoteStoreOptions {
    fn default() -> Self {
        RemoteStoreOptions {
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            gzip: false,
            tls: None,
        }
    }
}

#[derive(Clone)]
pub struct RemoteStore {
    /// The address, as errors and warnings name the store.
    name: String,
    client: StoreClient<Channel>,
    /// The connection, for other services the same server offers (a regional's rules).
    channel: Channel,
}

impl RemoteStore {
    /// A store at `addr` (`host:port`, or a URL with `http://` or `https://`). Connects
    /// lazily: a store that is down fails its calls, not its construction.
    pub fn new(addr: &str, opts: RemoteStoreOptions) -> Result<RemoteStore, GrpcError> {
        let scheme = if opts.tls.is_some() { "https" } else { "http" };
        let url = if addr.contains("://") { addr.to_string() } else { format!("{scheme}://{addr}") };
        let bad = |reason: String| GrpcError::Address { store: addr.to_string(), reason };
        let mut endpoint = Endpoint::from_shared(url).map_err(|e| bad(e.to_string()))?;
        if let Some(tls) = opts.tls {
            endpoint = endpoint.tls_config(tls).map_err(|e| bad(format!("TLS: {e}")))?;
        }
        let endpoint = endpoint
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
        let channel = endpoint.connect_lazy();
        let mut client = StoreClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        if opts.gzip {
            client = client.accept_compressed(CompressionEncoding::Gzip);
        }
        Ok(RemoteStore { name: addr.to_string(), client, channel })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The store's connection, shared with other services its server offers.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    pub async fn info(&self) -> Result<pb::InfoResponse, StoreError> {
        let mut c = self.client.clone();
        c.info(pb::InfoRequest {}).await.map(|r| r.into_inner()).map_err(|s| self.error(&s))
    }

    fn error(&self, s: &tonic::Status) -> StoreError {
        store_error_from_status(&self.name, s, SelectLimits::default())
    }

    /// Opens a `Series` call: the frames as they come, each series converted and checked.
    async fn open(&self, req: pb::SeriesRequest, limits: SelectLimits) -> Result<Frames, StoreError> {
        let mut c = self.client.clone();
        let order_without = req.order_without.clone();
        let stream = c.series(req).await.map_err(|s| store_error_from_status(&self.name, &s, limits))?.into_inner();
        Ok(Frames { name: self.name.clone(), limits, stream, pool: StringPool::default(), last: None, order_without })
    }
}

/// A `Series` call's frames, checked as they arrive: labels valid and in the asked order,
/// chunk headers plausible.
struct Frames {
    name: String,
    limits: SelectLimits,
    stream: tonic::Streaming<pb::SeriesResponse>,
    pool: StringPool,
    last: Option<Labels>,
    order_without: Vec<String>,
}

impl Frames {
    fn corrupt(&self, reason: String) -> StoreError {
        corrupt(&self.name, reason)
    }

    /// The next frame's series with their labels (`None` at the end); frames holding only
    /// warnings are logged and passed over.
    async fn next(&mut self) -> Result<Option<Vec<(Labels, pb::Series)>>, StoreError> {
        loop {
            let frame = match self.stream.message().await {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(None),
                Err(s) => return Err(store_error_from_status(&self.name, &s, self.limits)),
            };
            pass_on_warnings(&self.name, &frame.warnings);
            let symbols = FrameSymbols::new(frame.symbols, &mut self.pool);
            let mut out = Vec::with_capacity(frame.series.len());
            for mut s in frame.series {
                let labels = if s.label_refs.is_empty() {
                    labels_from_pb(std::mem::take(&mut s.labels), &mut self.pool)
                } else {
                    symbols.labels(&s.label_refs)
                }
                .map_err(|r| self.corrupt(r))?;
                if let Some(last) = &self.last {
                    if selection_order(last, &labels, &self.order_without) != Ordering::Less {
                        return Err(self.corrupt(format!("series {labels} out of order or repeated")));
                    }
                }
                self.last = Some(labels.clone());
                out.push((labels, s));
            }
            if !out.is_empty() {
                return Ok(Some(out));
            }
        }
    }
}

fn corrupt(store: &str, reason: String) -> StoreError {
    StoreError::Corrupt { series: String::new(), reason: format!("store {store}: {reason}") }
}

/// A remote selection, a frame at a time, charged to its own budget as it arrives.
struct RemoteBatches {
    frames: Frames,
    budget: SelectBudget,
}

#[async_trait]
impl SeriesBatches for RemoteBatches {
    async fn next_batch(&mut self) -> Result<Option<Vec<SeriesChunks>>, StoreError> {
        let Some(frame) = self.frames.next().await? else { return Ok(None) };
        let mut out = Vec::with_capacity(frame.len());
        for (labels, s) in frame {
            let chunks = s
                .chunks
                .into_iter()
                .map(chunk_from_pb)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|r| self.frames.corrupt(format!("series {labels}: {r}")))?;
            if chunks.windows(2).any(|w| w[1].min_t <= w[0].max_t) {
                return Err(self.frames.corrupt(format!("series {labels}: chunks overlap or are out of order")));
            }
            self.budget.charge_series(&chunks)?;
            out.push(SeriesChunks { labels, metric_type: metric_type_from_pb(s.r#type), chunks });
        }
        Ok(Some(out))
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
        partial_response_disabled: partial_response_disabled(),
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
        collect_within(self.select_batches(req).await?, budget).await
    }

    async fn select_batches(&self, req: &SelectRequest) -> Result<BoxBatches, StoreError> {
        require_matchers(&req.matchers)?;
        let mut pbreq = series_request(&req.matchers, req.start, req.end, req.limits, false);
        pbreq.order_without = req.order_without.clone();
        let frames = self.open(pbreq, req.limits).await?;
        Ok(Box::new(RemoteBatches { frames, budget: SelectBudget::new(req.limits, req.start, req.end) }))
    }

    async fn series_within(
        &self,
        matchers: &[Matcher],
        start: i64,
        end: i64,
        budget: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        let limits = SelectLimits::default();
        let mut frames = self.open(series_request(matchers, start, end, limits, true), limits).await?;
        let mut out = Vec::new();
        while let Some(frame) = frames.next().await? {
            for (labels, _) in frame {
                budget.charge_labels()?;
                out.push(labels);
            }
        }
        Ok(out)
    }

    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        let mut c = self.client.clone();
        let req = pb::LabelNamesRequest {
            min_time: start,
            max_time: end,
            matchers: matchers.iter().map(matcher_to_pb).collect(),
            partial_response_disabled: partial_response_disabled(),
        };
        let r = c.label_names(req).await.map_err(|s| self.error(&s))?.into_inner();
        pass_on_warnings(&self.name, &r.warnings);
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
            partial_response_disabled: partial_response_disabled(),
        };
        let r = c.label_values(req).await.map_err(|s| self.error(&s))?.into_inner();
        pass_on_warnings(&self.name, &r.warnings);
        Ok(r.values)
    }

    /// The windows the remote store serves at exactly `resolution` (one that serves
    /// another, or raw data, is an error naming it), checked and bounded as they arrive.
    async fn select_aggregates(
        &self,
        req: &SelectRequest,
        resolution: i64,
    ) -> Result<Vec<AggregateSeries>, StoreError> {
        require_matchers(&req.matchers)?;
        if resolution <= 0 {
            return Err(StoreError::InvalidRequest(format!("aggregates of {resolution} ms windows")));
        }
        let mut pbreq = series_request(&req.matchers, req.start, req.end, req.limits, false);
        pbreq.max_resolution_ms = resolution;
        pbreq.aggregates = vec![pb::Aggregate::Windows as i32];
        let mut frames = self.open(pbreq, req.limits).await?;
        let (mut out, mut windows) = (Vec::new(), 0u64);
        while let Some(frame) = frames.next().await? {
            for (labels, s) in frame {
                if out.len() >= req.limits.max_series {
                    let limit = u64::try_from(req.limits.max_series).unwrap_or(u64::MAX);
                    return Err(StoreError::LimitExceeded { what: "series", limit });
                }
                let chunks = s
                    .chunks
                    .into_iter()
                    .map(|c| aggregate_chunk_from_pb(c, resolution, (req.start, req.end)))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|r| frames.corrupt(format!("series {labels}: {r}")))?;
                if chunks.is_empty() || chunks.windows(2).any(|w| w[1].first_end <= w[0].last_end) {
                    return Err(frames.corrupt(format!("series {labels}: no windows, or runs out of order")));
                }
                windows = chunks.iter().fold(windows, |n, c| n.saturating_add(u64::from(c.windows)));
                if windows > req.limits.max_samples {
                    return Err(StoreError::LimitExceeded { what: "samples", limit: req.limits.max_samples });
                }
                out.push(AggregateSeries { labels, metric_type: metric_type_from_pb(s.r#type), resolution, chunks });
            }
        }
        Ok(out)
    }

    /// The leaf evaluated by the remote store; `None` when it does not evaluate leaves (an
    /// older server, or a leaf its engine does not do).
    async fn steps(&self, req: &StepsRequest) -> Result<Option<Steps>, StoreError> {
        require_matchers(&req.matchers)?;
        let steps = req
            .steps()
            .filter(|n| *n <= crate::steps::MAX_STEPS)
            .ok_or_else(|| StoreError::InvalidRequest("the grid has no steps or too many".into()))?;
        let mut c = self.client.clone();
        let mut stream = match c.steps(crate::steps::request_to_pb(req)).await {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == tonic::Code::Unimplemented => return Ok(None),
            Err(s) => return Err(store_error_from_status(&self.name, &s, req.limits)),
        };
        let (mut out, mut pool) = (Steps::default(), StringPool::default());
        // Every value received is charged to the query's sample budget as its frame arrives,
        // as a selection's samples are: a store cannot make the client hold more.
        let mut values = 0u64;
        loop {
            let mut frame = match stream.message().await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(s) => return Err(store_error_from_status(&self.name, &s, req.limits)),
            };
            pass_on_warnings(&self.name, &frame.warnings);
            if out.series.len().saturating_add(frame.series.len()) > req.limits.max_series {
                let limit = u64::try_from(req.limits.max_series).unwrap_or(u64::MAX);
                return Err(StoreError::LimitExceeded { what: "series", limit });
            }
            let symbols = FrameSymbols::new(std::mem::take(&mut frame.symbols), &mut pool);
            for s in frame.series {
                let s = crate::steps::series_from_pb(s, steps, req.values, &symbols, &mut pool)
                    .map_err(|r| corrupt(&self.name, r))?;
                if out.series.last().is_some_and(|l| l.labels >= s.labels) {
                    return Err(corrupt(&self.name, format!("series {} out of order or repeated", s.labels)));
                }
                values = values.saturating_add(s.values.present() as u64);
                if values > req.limits.max_samples {
                    return Err(StoreError::LimitExceeded { what: "samples", limit: req.limits.max_samples });
                }
                out.series.push(s);
            }
            if out.groups.len().saturating_add(frame.groups.len()) > req.limits.max_series {
                let limit = u64::try_from(req.limits.max_series).unwrap_or(u64::MAX);
                return Err(StoreError::LimitExceeded { what: "series", limit });
            }
            if !frame.groups.is_empty() && req.aggregate.is_none() {
                return Err(corrupt(&self.name, "groups for a leaf without an aggregation".into()));
            }
            for g in frame.groups {
                let g = crate::steps::series_from_pb(g, steps, true, &symbols, &mut pool)
                    .map_err(|r| corrupt(&self.name, r))?;
                if out.groups.last().is_some_and(|l| l.labels >= g.labels) {
                    return Err(corrupt(&self.name, format!("group {} out of order or repeated", g.labels)));
                }
                values = values.saturating_add(g.values.present() as u64);
                if values > req.limits.max_samples {
                    return Err(StoreError::LimitExceeded { what: "samples", limit: req.limits.max_samples });
                }
                out.groups.push(g);
            }
            out.samples = out.samples.saturating_add(frame.samples);
            // Annotations are a few distinct messages; a peer that sends more is cut off.
            out.warnings
                .extend(frame.promql_warnings.into_iter().take(MAX_ANNOTATIONS.saturating_sub(out.warnings.len())));
            out.infos.extend(frame.promql_infos.into_iter().take(MAX_ANNOTATIONS.saturating_sub(out.infos.len())));
        }
        Ok(Some(out))
    }

    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        let mut c = self.client.clone();
        let req = pb::MetadataRequest {
            metric: metric.unwrap_or_default().to_string(),
            partial_response_disabled: partial_response_disabled(),
        };
        let r = c.metadata(req).await.map_err(|s| self.error(&s))?.into_inner();
        pass_on_warnings(&self.name, &r.warnings);
        Ok(r.families.into_iter().map(metadata_from_pb).collect())
    }
}
