//! [`StoreService`]: any [`Store`] as the gRPC `Store` service, with the tier's external
//! labels.
//!
//! Every call runs in a [`QueryScope`] made from the request (`partial_response_disabled`),
//! so a store that fans out in turn (a global) settles its stores' failures as the querier
//! above asked, and the warnings it collects travel back: after the last series of a
//! `Series` stream, in the last frame of `Steps`, in the answers of the label and metadata
//! calls. A call holds its connection's [`CallGuard`] while its answer streams, so the
//! connection counts as busy, not idle; streams are bounded for clients that stop reading
//! (`stream`).

use crate::convert::*;
use crate::frames::FrameBuilder;
use crate::listener::{ConnectionLimits, Connections};
use crate::stream::{FrameSender, FrameStream, StreamBounds};
use crate::{pb, GrpcError, H2_FRAME_BYTES, MAX_MESSAGE_BYTES, WINDOW_BYTES};
use pb::store_server::{Store as StoreRpc, StoreServer};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use strata_model::{Label, Labels, MatchOp, Matcher};
use strata_store::{
    selection_order, AggregateSeries, BoxBatches, QueryScope, SelectLimits, SelectRequest, SeriesChunks, Store,
};
use tokio_stream::Stream;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

/// What `Info` reports, read at each call.
#[derive(Debug, Clone)]
pub struct StoreInfo {
    pub min_time: i64,
    pub max_time: i64,
    pub kind: pb::ComponentKind,
    /// The label sets of the data behind this store; empty: the service's own external
    /// labels (an edge). A global lists those of the stores it fans out to.
    pub label_sets: Vec<Labels>,
    /// Aggregates held: (window width, first and last sample time covered), ms.
    pub resolutions: Vec<(i64, i64, i64)>,
    /// A store fed by senders: the time up to which every sender heard from lately has
    /// sent everything, and the one furthest behind (`InfoResponse.complete_until`).
    pub complete_until: Option<(i64, String)>,
}

pub struct StoreService {
    store: Arc<dyn Store>,
    external: Labels,
    info: Arc<dyn Fn() -> StoreInfo + Send + Sync>,
    /// The most a request may ask; a request's own limits apply below these.
    limits: SelectLimits,
    /// The open connections' calls (set by [`serve`]).
    connections: Arc<Connections>,
    /// How long a streamed answer may wait for its client (set by [`serve`]).
    bounds: StreamBounds,
}

impl StoreService {
    pub fn new(
        store: Arc<dyn Store>,
        external: Labels,
        limits: SelectLimits,
        info: Arc<dyn Fn() -> StoreInfo + Send + Sync>,
    ) -> Self {
        StoreService {
            store,
            external,
            info,
            limits,
            connections: Arc::default(),
            bounds: StreamBounds { max_request: Duration::from_secs(120) },
        }
    }

    /// The open connections' calls: another service served beside this one
    /// ([`serve_with`]) takes a [`CallGuard`](crate::CallGuard) per call from it, so its
    /// connections do not count as idle.
    pub fn connections(&self) -> Arc<Connections> {
        self.connections.clone()
    }

    /// The tonic service: gzip both ways, messages capped at [`MAX_MESSAGE_BYTES`].
    pub fn into_server(self) -> StoreServer<StoreService> {
        StoreServer::new(self)
            .accept_compressed(CompressionEncoding::Gzip)
            .send_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Applies matchers on external labels here: `None` when one cannot match (the store
    /// holds nothing the request wants); otherwise the matchers left for the store. When
    /// none is left that selects, every series is meant (`{cluster="c0"}`).
    fn split_external(&self, matchers: Vec<Matcher>) -> Result<Option<Vec<Matcher>>, Status> {
        let mut rest = Vec::with_capacity(matchers.len());
        for m in matchers {
            match self.external.get(&m.name) {
                Some(v) if !m.matches(v) => return Ok(None),
                Some(_) => {}
                None => rest.push(m),
            }
        }
        if rest.iter().all(|m| m.matches("")) {
            rest.push(Matcher::new(MatchOp::Regex, "__name__", ".+").map_err(|e| Status::internal(e.to_string()))?);
        }
        Ok(Some(rest))
    }

    fn with_external(&self, labels: &Labels) -> Labels {
        attach_external(labels, &self.external)
    }

    fn limits_of(&self, req: &pb::SeriesRequest) -> SelectLimits {
        let cap = |asked: u64, max: u64| if asked == 0 { max } else { asked.min(max) };
        SelectLimits {
            max_series: cap(req.max_series, self.limits.max_series as u64) as usize,
            max_samples: cap(req.max_samples, self.limits.max_samples),
        }
    }
}

/// A series' labels with the external labels set (they win over the series' own, as a
/// Thanos sidecar's do). Whatever sends a tier's series elsewhere (the forwarder) labels
/// them with this too, so each series has one label set whichever tier serves it.
pub fn attach_external(labels: &Labels, external: &Labels) -> Labels {
    if external.is_empty() {
        return labels.clone();
    }
    let mut v: Vec<Label> = labels.iter().filter(|l| external.get(&l.name).is_none()).cloned().collect();
    v.extend(external.iter().cloned());
    v.sort_by(|a, b| a.name.cmp(&b.name));
    Labels::from_sorted_unchecked(v)
}

/// How long a store evaluates one leaf (pushdown) at most.
const STEPS_TIMEOUT: Duration = Duration::from_secs(120);

/// A leaf's evaluation error as a status: `UNIMPLEMENTED` for what this engine does not
/// do (the caller then selects samples instead), limits as the `Series` call reports them.
fn status_from_query_error(e: strata_promql::QueryError) -> Status {
    use strata_promql::QueryError as Q;
    match e {
        Q::Store(e) => status_from_store_error(e),
        Q::TooManySamples(n) => Status::resource_exhausted(format!("samples limit of {n} exceeded")),
        Q::Timeout(_) => Status::deadline_exceeded(e.to_string()),
        Q::Canceled => Status::cancelled(e.to_string()),
        Q::Unsupported(_) => Status::unimplemented(e.to_string()),
        Q::BadData(_) => Status::invalid_argument(e.to_string()),
        Q::Execution(_) | Q::Internal(_) => Status::internal(e.to_string()),
    }
}

/// The most `order_without` names a request may give.
const MAX_ORDER_WITHOUT: usize = 16;

/// What a `Series` call sends: a selection gathered and sorted here, or a store's batches
/// passed through.
enum Source {
    Whole(Vec<(Labels, Option<SeriesChunks>)>),
    Batches(BoxBatches),
    /// Windows of one resolution, labelled as the stream carries them.
    Aggregates(Vec<(Labels, AggregateSeries)>),
}

/// Sends a finished frame, if there is one; `false` when the stream is over.
async fn send(tx: &FrameSender<pb::SeriesResponse>, frame: Option<pb::SeriesResponse>) -> bool {
    match frame {
        Some(f) => tx.send(f).await,
        None => true,
    }
}

/// The scope a request asks for: a failing store below is its failure when it disables
/// partial response, else a warning.
fn scope_of(partial_response_disabled: bool) -> QueryScope {
    QueryScope::new(!partial_response_disabled, true)
}

/// The scope's warnings as the wire carries them.
fn warnings_of(scope: &QueryScope) -> Vec<pb::Warning> {
    scope.warnings().into_iter().map(|message| pb::Warning { store: String::new(), message }).collect()
}

type SeriesFrames = Pin<Box<dyn Stream<Item = Result<pb::SeriesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl StoreRpc for StoreService {
    async fn info(&self, req: Request<pb::InfoRequest>) -> Result<Response<pb::InfoResponse>, Status> {
        let _call = self.connections.call(req.remote_addr());
        let i = (self.info)();
        let label_sets = if i.label_sets.is_empty() {
            vec![pb::LabelSet { labels: labels_to_pb(&self.external) }]
        } else {
            i.label_sets.iter().map(|l| pb::LabelSet { labels: labels_to_pb(l) }).collect()
        };
        Ok(Response::new(pb::InfoResponse {
            label_sets,
            min_time: i.min_time,
            max_time: i.max_time,
            kind: i.kind as i32,
            resolutions_ms: std::iter::once(0).chain(i.resolutions.iter().map(|r| r.0)).collect(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            resolution_ranges: i
                .resolutions
                .iter()
                .map(|&(resolution_ms, min_time, max_time)| pb::ResolutionRange { resolution_ms, min_time, max_time })
                .collect(),
            complete_until: i.complete_until.as_ref().map(|c| c.0),
            behind: i.complete_until.map(|c| c.1).unwrap_or_default(),
        }))
    }

    type SeriesStream = SeriesFrames;

    async fn series(&self, req: Request<pb::SeriesRequest>) -> Result<Response<SeriesFrames>, Status> {
        let call = self.connections.call(req.remote_addr());
        let req = req.into_inner();
        let scope = scope_of(req.partial_response_disabled);
        scope.clone().run(self.series_in_scope(req, scope, call)).await
    }

    async fn label_names(
        &self,
        req: Request<pb::LabelNamesRequest>,
    ) -> Result<Response<pb::LabelNamesResponse>, Status> {
        let _call = self.connections.call(req.remote_addr());
        let req = req.into_inner();
        let scope = scope_of(req.partial_response_disabled);
        let mut answer = scope.clone().run(self.label_names_in_scope(req)).await?;
        answer.warnings = warnings_of(&scope);
        Ok(Response::new(answer))
    }

    async fn label_values(
        &self,
        req: Request<pb::LabelValuesRequest>,
    ) -> Result<Response<pb::LabelValuesResponse>, Status> {
        let _call = self.connections.call(req.remote_addr());
        let req = req.into_inner();
        let scope = scope_of(req.partial_response_disabled);
        let mut answer = scope.clone().run(self.label_values_in_scope(req)).await?;
        answer.warnings = warnings_of(&scope);
        Ok(Response::new(answer))
    }

    type StepsStream = Pin<Box<dyn Stream<Item = Result<pb::StepsResponse, Status>> + Send>>;

    async fn steps(&self, req: Request<pb::StepsRequest>) -> Result<Response<Self::StepsStream>, Status> {
        let call = self.connections.call(req.remote_addr());
        let req = req.into_inner();
        let scope = scope_of(req.partial_response_disabled);
        scope.clone().run(self.steps_in_scope(req, scope, call)).await
    }

    async fn metadata(&self, req: Request<pb::MetadataRequest>) -> Result<Response<pb::MetadataResponse>, Status> {
        let _call = self.connections.call(req.remote_addr());
        let req = req.into_inner();
        let scope = scope_of(req.partial_response_disabled);
        let metric = req.metric;
        let found = scope
            .clone()
            .run(self.store.metadata((!metric.is_empty()).then_some(metric.as_str())))
            .await
            .map_err(status_from_store_error)?;
        let families = found.iter().map(|(f, m)| metadata_to_pb(f, m)).collect();
        Ok(Response::new(pb::MetadataResponse { families, warnings: warnings_of(&scope) }))
    }
}

impl StoreService {
    async fn series_in_scope(
        &self,
        req: pb::SeriesRequest,
        scope: QueryScope,
        call: Option<crate::listener::CallGuard>,
    ) -> Result<Response<SeriesFrames>, Status> {
        if req.max_resolution_ms < 0 {
            return Err(Status::invalid_argument(format!("max_resolution_ms {} is negative", req.max_resolution_ms)));
        }
        let whole = [pb::Aggregate::Raw as i32, pb::Aggregate::Windows as i32];
        if let Some(a) = req.aggregates.iter().find(|a| !whole.contains(a)) {
            return Err(Status::invalid_argument(format!(
                "aggregate {a}: Strata's stores serve windows whole; ask for AGGREGATE_WINDOWS"
            )));
        }
        // The coarsest resolution held at or below the one asked, to a client that takes
        // windows; raw data is always acceptable (and all a store without aggregates has).
        let takes_windows = req.aggregates.contains(&(pb::Aggregate::Windows as i32));
        let resolution = match (req.skip_chunks || !takes_windows, req.max_resolution_ms) {
            (true, _) | (_, 0) => 0,
            (false, max) => (self.info)().resolutions.iter().map(|r| r.0).filter(|&w| w <= max).max().unwrap_or(0),
        };
        let Some(matchers) = self.split_external(matchers_from_pb(&req.matchers)?)? else {
            return Ok(Response::new(Box::pin(tokio_stream::iter(Vec::new()))));
        };
        let limits = self.limits_of(&req);
        if req.order_without.len() > MAX_ORDER_WITHOUT {
            return Err(Status::invalid_argument(format!("more than {MAX_ORDER_WITHOUT} order_without labels")));
        }
        let order_without = req.order_without.clone();
        let units: Vec<(String, String)> = if req.skip_chunks {
            Vec::new()
        } else {
            let meta = self.store.metadata(None).await.unwrap_or_default();
            meta.into_iter().filter(|(_, m)| !m.unit.is_empty()).map(|(f, m)| (f, m.unit)).collect()
        };
        let source = if req.skip_chunks {
            let found =
                self.store.series(&matchers, req.min_time, req.max_time).await.map_err(status_from_store_error)?;
            if found.len() > limits.max_series {
                return Err(Status::resource_exhausted(format!("series limit of {} exceeded", limits.max_series)));
            }
            let mut found: Vec<_> = found.iter().map(|l| (self.with_external(l), None)).collect();
            found.sort_by(|a, b| selection_order(&a.0, &b.0, &order_without));
            Source::Whole(found)
        } else if resolution > 0 {
            let mut sel = SelectRequest::new(matchers, req.min_time, req.max_time);
            sel.limits = limits;
            let found = self.store.select_aggregates(&sel, resolution).await.map_err(status_from_store_error)?;
            let mut found: Vec<_> = found.into_iter().map(|s| (self.with_external(&s.labels), s)).collect();
            found.sort_by(|a, b| selection_order(&a.0, &b.0, &order_without));
            Source::Aggregates(found)
        } else {
            let mut sel = SelectRequest::new(matchers, req.min_time, req.max_time);
            sel.limits = limits;
            sel.order_without = order_without.clone();
            if self.external.is_empty() {
                // Series go out as they are: the store's batches stream straight through.
                Source::Batches(self.store.select_batches(&sel).await.map_err(status_from_store_error)?)
            } else {
                // External labels can reorder series: the selection is sorted by what the
                // stream carries before anything is encoded.
                let found = self.store.select(&sel).await.map_err(status_from_store_error)?;
                let mut found: Vec<_> = found.into_iter().map(|s| (self.with_external(&s.labels), Some(s))).collect();
                found.sort_by(|a, b| selection_order(&a.0, &b.0, &order_without));
                Source::Whole(found)
            }
        };
        // Frames are encoded as the client takes them: at most two wait in the channel, so
        // the service holds the selection (or the store's current batch) and two frames,
        // never the whole answer encoded; a client that stops reading ends the stream.
        let (tx, rx) = crate::stream::channel::<pb::SeriesResponse>(self.bounds);
        tokio::spawn(scope.clone().run(async move {
            let _call = call;
            let mut frames = FrameBuilder::default();
            let unit_of = |labels: &Labels| {
                let family = labels.metric_name().unwrap_or("");
                units.iter().find(|(f, _)| f == family).map(|(_, u)| u.clone()).unwrap_or_default()
            };
            let unit = |d: &SeriesChunks| unit_of(&d.labels);
            match source {
                Source::Whole(found) => {
                    for (labels, data) in found {
                        let unit = data.as_ref().map(unit).unwrap_or_default();
                        if !send(&tx, frames.push(&labels, data.as_ref(), unit)).await {
                            return;
                        }
                    }
                }
                Source::Aggregates(found) => {
                    for (labels, a) in found {
                        if !send(&tx, frames.push_aggregates(&labels, &a, unit_of(&a.labels))).await {
                            return;
                        }
                    }
                }
                Source::Batches(mut batches) => loop {
                    match batches.next_batch().await {
                        Ok(Some(batch)) => {
                            for s in batch {
                                if !send(&tx, frames.push(&s.labels, Some(&s), unit(&s))).await {
                                    return;
                                }
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tx.fail(status_from_store_error(e)).await;
                            return;
                        }
                    }
                },
            }
            if !send(&tx, frames.finish()).await {
                return;
            }
            // What the stores below said (a global's failed stores), after the last series.
            let warnings = warnings_of(&scope);
            if !warnings.is_empty() && !tx.send(pb::SeriesResponse { warnings, ..Default::default() }).await {
                return;
            }
            tx.finish();
        }));
        Ok(Response::new(Box::pin(rx)))
    }

    async fn label_names_in_scope(&self, req: pb::LabelNamesRequest) -> Result<pb::LabelNamesResponse, Status> {
        let Some(matchers) = self.split_external(matchers_from_pb(&req.matchers)?)? else {
            return Ok(pb::LabelNamesResponse::default());
        };
        let matchers = if req.matchers.is_empty() { Vec::new() } else { matchers };
        let mut names =
            self.store.label_names(&matchers, req.min_time, req.max_time).await.map_err(status_from_store_error)?;
        names.extend(self.external.iter().map(|l| l.name.to_string()));
        names.sort();
        names.dedup();
        Ok(pb::LabelNamesResponse { names, warnings: vec![] })
    }

    async fn label_values_in_scope(&self, req: pb::LabelValuesRequest) -> Result<pb::LabelValuesResponse, Status> {
        let Some(matchers) = self.split_external(matchers_from_pb(&req.matchers)?)? else {
            return Ok(pb::LabelValuesResponse::default());
        };
        if let Some(v) = self.external.get(&req.name) {
            return Ok(pb::LabelValuesResponse { values: vec![v.to_string()], warnings: vec![] });
        }
        let matchers = if req.matchers.is_empty() { Vec::new() } else { matchers };
        let values = self
            .store
            .label_values(&req.name, &matchers, req.min_time, req.max_time)
            .await
            .map_err(status_from_store_error)?;
        Ok(pb::LabelValuesResponse { values, warnings: vec![] })
    }

    async fn steps_in_scope(
        &self,
        req: pb::StepsRequest,
        scope: QueryScope,
        call: Option<crate::listener::CallGuard>,
    ) -> Result<Response<Pin<Box<dyn Stream<Item = Result<pb::StepsResponse, Status>> + Send>>>, Status> {
        let mut req = crate::steps::request_from_pb(req, self.limits)?;
        let Some(matchers) = self.split_external(std::mem::take(&mut req.matchers))? else {
            let empty = pb::StepsResponse::default();
            return Ok(Response::new(Box::pin(tokio_stream::iter(vec![Ok(empty)]))));
        };
        req.matchers = matchers;
        let external = self.external.clone();
        let view = move |l: &Labels| attach_external(l, &external);
        let answer = if req.resolution > 0 {
            // From aggregates: the store answers the leaf itself, or has none of that
            // resolution; an aggregation over the leaf is this engine's, over its series.
            let leaf = strata_store::StepsRequest { aggregate: None, ..req.clone() };
            match self.store.steps(&leaf).await.map_err(status_from_store_error)? {
                Some(mut a) => {
                    for s in a.series.iter_mut() {
                        s.labels = view(&s.labels);
                    }
                    a.series.sort_by(|x, y| x.labels.cmp(&y.labels));
                    if req.aggregate.is_some() {
                        let r = req.clone();
                        let evaluated =
                            tokio::task::spawn_blocking(move || strata_promql::pushdown::aggregate_evaluated(&r, a))
                                .await
                                .map_err(|e| Status::internal(format!("evaluating the aggregation: {e}")))?;
                        evaluated.map_err(status_from_query_error)?
                    } else {
                        a
                    }
                }
                None => {
                    return Err(Status::failed_precondition(format!(
                        "no aggregates of {} ms windows here",
                        req.resolution
                    )))
                }
            }
        } else {
            strata_promql::pushdown::evaluate(&*self.store, &req, &view, STEPS_TIMEOUT)
                .await
                .map_err(status_from_query_error)?
        };
        let warnings = warnings_of(&scope);
        let (tx, rx): (FrameSender<pb::StepsResponse>, FrameStream<pb::StepsResponse>) =
            crate::stream::channel(self.bounds);
        tokio::spawn(async move {
            let _call = call;
            let mut frames = crate::steps::frames(answer).peekable();
            while let Some(mut f) = frames.next() {
                if frames.peek().is_none() {
                    f.warnings = warnings.clone();
                }
                if !tx.send(f).await {
                    return;
                }
            }
            tx.finish();
        });
        Ok(Response::new(Box::pin(rx)))
    }
}

/// The bytes a selection takes in `Series` frames (protobuf, before gzip), with `external`
/// labels attached: what the wire carries, for benchmarks.
pub fn selection_wire_bytes(series: &[SeriesChunks], external: &Labels) -> usize {
    let mut frames = FrameBuilder::default();
    let mut total = 0;
    for s in series {
        if let Some(f) = frames.push(&attach_external(&s.labels, external), Some(s), String::new()) {
            total += prost::Message::encoded_len(&f) + 5;
        }
    }
    total + frames.finish().map_or(0, |f| prost::Message::encoded_len(&f) + 5)
}

/// How a StoreAPI server runs.
#[derive(Clone)]
pub struct ServeOptions {
    /// Requests carry their own deadline (`grpc-timeout`); none runs longer than this, its
    /// streamed answer included.
    pub max_request: Duration,
    pub tls: Option<tonic::transport::ServerTlsConfig>,
    pub connections: ConnectionLimits,
}

impl ServeOptions {
    pub fn new(max_request: Duration) -> Self {
        ServeOptions { max_request, tls: None, connections: ConnectionLimits::default() }
    }

    pub fn with_tls(mut self, tls: Option<tonic::transport::ServerTlsConfig>) -> Self {
        self.tls = tls;
        self
    }
}

/// Calls at once on one connection (a global asks one per selection).
const MAX_STREAMS_PER_CONNECTION: u32 = 128;

/// A connection is asked to go after this long.
const MAX_CONNECTION_AGE: Duration = Duration::from_secs(30 * 60);

/// Serves `service` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: StoreService,
    opts: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), GrpcError> {
    serve_with(listener, service, tonic::service::Routes::default(), opts, shutdown).await
}

/// [`serve`] with more services on the same port and under the same limits (a regional's
/// `Forward` receiver beside its StoreAPI).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    service: StoreService,
    others: tonic::service::Routes,
    opts: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), GrpcError> {
    let addr = listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let mut service = service;
    let connections = service.connections.clone();
    service.bounds = StreamBounds { max_request: opts.max_request };
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = opts.tls {
        builder = builder.tls_config(tls).map_err(|e| GrpcError::TlsConfig(e.to_string()))?;
    }
    builder
        .timeout(opts.max_request)
        .initial_stream_window_size(WINDOW_BYTES)
        .initial_connection_window_size(2 * WINDOW_BYTES)
        .max_frame_size(H2_FRAME_BYTES)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        // A peer that stops answering pings is dropped, and its slot freed.
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        // No connection keeps its slot for ever: it is asked to go (GOAWAY) after a while,
        // and closed if it has not a minute later (a client reconnects for its next call).
        .max_connection_age(MAX_CONNECTION_AGE)
        .max_connection_age_grace(Duration::from_secs(60))
        .add_routes(others.add_service(service.into_server()))
        // The listener sets TCP_NODELAY: without it a stream's last small frame waits out
        // the peer's delayed ACK (40 ms on Linux), longer than a whole query.
        .serve_with_incoming_shutdown(crate::listener::accept(listener, opts.connections, connections), shutdown)
        .await
        .map_err(|source| GrpcError::Serve { addr, source })
}
