//! A session: forward batches turned into remote-write requests, sharded by series, sent
//! in parallel and retried until acknowledged.

use crate::metrics::QueueStats;
use crate::{RemoteWriteOptions, Signer};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_forward::{pb, PushAck, PushError, UpstreamSession};
use strata_model::{Labels, MetricType};
use strata_proto::prometheus as prompb;
use tokio::sync::watch;

pub(crate) struct Shared {
    pub(crate) opts: RemoteWriteOptions,
    pub(crate) client: HttpClient,
    pub(crate) signer: Option<Signer>,
    pub(crate) stats: QueueStats,
    pub(crate) stop: watch::Receiver<bool>,
    /// The newest timestamp acknowledged, shared by the shards (ms).
    pub(crate) highest_sent: std::sync::atomic::AtomicI64,
}

/// The HTTP/1.1 client: kept-alive connections, up to one per shard; TLS for `https://`
/// URLs with the entry's settings, on its own connector (reqwest's rustls support is
/// unified into every reqwest client of the workspace; a sender of this volume keeps its
/// connection handling in its own hands).
pub(crate) type HttpClient =
    hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, http_body_util::Full<bytes::Bytes>>;

pub(crate) fn http_client(opts: &RemoteWriteOptions) -> Result<HttpClient, String> {
    let tls = match &opts.tls {
        Some(t) => (**t).clone(),
        // Plain http: a TLS setup that trusts nothing, never used.
        None => rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
    };
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(opts.timeout.min(Duration::from_secs(10))));
    http.set_nodelay(true);
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(opts.queue.max_shards)
        .build(connector))
}

/// A series as the session sends it: its labels after `write_relabel_configs`, encoded
/// (`None`: dropped by them).
type SessionSeries = Option<Arc<[u8]>>;

pub struct RemoteWriteSession {
    shared: Arc<Shared>,
    /// By the batch's series number (a session names each series once).
    series: HashMap<u64, SessionSeries>,
    /// Every family's metadata seen in the session, sent again every `send_interval`.
    metadata: BTreeMap<String, prompb::MetricMetadata>,
    metadata_sent: Option<Instant>,
}

/// One request's content, before encoding.
#[derive(Default)]
struct Part {
    /// `WriteRequest.timeseries`, encoded.
    timeseries: Vec<u8>,
    /// Where each series' bytes end in `timeseries`, its samples and their range: a request
    /// refused as a whole is split along them.
    series: Vec<SeriesSpan>,
    metadata: Vec<prompb::MetricMetadata>,
    samples: u64,
    oldest: i64,
    newest: i64,
}

#[derive(Clone, Copy)]
struct SeriesSpan {
    end: usize,
    samples: u64,
    oldest: i64,
    newest: i64,
}

impl Part {
    fn new() -> Part {
        Part { oldest: i64::MAX, newest: i64::MIN, ..Default::default() }
    }

    /// The series from `from` to `to` (indexes into `series`) as a request of their own.
    fn span(&self, from: usize, to: usize) -> Part {
        let start = if from == 0 { 0 } else { self.series[from - 1].end };
        let spans = &self.series[from..to];
        let end = spans.last().map_or(start, |s| s.end);
        let mut part = Part::new();
        part.timeseries = self.timeseries[start..end].to_vec();
        for s in spans {
            part.series.push(SeriesSpan { end: s.end - start, ..*s });
            part.samples += s.samples;
            part.oldest = part.oldest.min(s.oldest);
            part.newest = part.newest.max(s.newest);
        }
        part
    }

    /// Two halves, for a request the receiver refused as a whole because of some of its
    /// samples: by series, and a single series by its samples (the refused ones are its
    /// oldest); `None` for one sample or metadata.
    fn halves(&self) -> Option<(Part, Part)> {
        let n = self.series.len();
        if !self.metadata.is_empty() || self.samples < 2 {
            return None;
        }
        if n >= 2 {
            return Some((self.span(0, n / 2), self.span(n / 2, n)));
        }
        // One series: decoded again (rare: a refusal), its samples halved.
        let req = prompb::WriteRequest::decode(&self.timeseries[..]).ok()?;
        let ts = req.timeseries.into_iter().next()?;
        let mid = ts.samples.len() / 2;
        let (older, newer) = ts.samples.split_at(mid);
        let half = |samples: &[prompb::Sample]| {
            let mut part = Part::new();
            let one = prompb::TimeSeries { labels: ts.labels.clone(), samples: samples.to_vec(), ..Default::default() };
            part.timeseries = prompb::WriteRequest { timeseries: vec![one], metadata: Vec::new() }.encode_to_vec();
            let (oldest, newest) = (samples.first()?.timestamp, samples.last()?.timestamp);
            let samples = samples.len() as u64;
            part.series.push(SeriesSpan { end: part.timeseries.len(), samples, oldest, newest });
            (part.samples, part.oldest, part.newest) = (samples, oldest, newest);
            Some(part)
        };
        Some((half(older)?, half(newer)?))
    }
}

/// Requests one refused request may be sent again as, in halves: enough to isolate the
/// refused series of a request and the refused samples of some, not so many that a
/// receiver refusing everything makes a request into thousands.
const MAX_SPLIT_REQUESTS: usize = 256;

/// Whether a refusal is Prometheus' answer to some samples it will not append (already
/// newer data, or past its head's window): it rolls back the whole request for them, so
/// the others are sent again apart.
fn refused_for_some_samples(status: u16, answer: &str) -> bool {
    let a = answer.to_ascii_lowercase();
    status == 400
        && ["out of order", "out of bounds", "too old sample", "duplicate sample"].iter().any(|m| a.contains(m))
}

impl RemoteWriteSession {
    pub(crate) fn new(shared: Arc<Shared>) -> RemoteWriteSession {
        RemoteWriteSession { shared, series: HashMap::new(), metadata: BTreeMap::new(), metadata_sent: None }
    }

    /// The labels of a series named in this batch, relabelled.
    fn learn(&mut self, s: &pb::ForwardSeries) {
        if s.labels.is_empty() {
            return;
        }
        let labels = Labels::from_pairs(s.labels.iter().map(|l| (l.name.as_str(), l.value.as_str())));
        let relabelled = strata_ingest::relabel::process(&self.shared.opts.relabel, labels.to_builder());
        // A series relabelled to nothing is dropped, as Prometheus drops it.
        let kept = relabelled
            .filter(|l| !l.is_empty())
            .map(|l| Arc::from(crate::wire::encode_labels(l.iter().map(|x| (x.name.as_ref(), x.value.as_ref())))));
        self.series.insert(s.r#ref, kept);
    }

    /// The metadata to send with this batch: the new families', or every family's once
    /// `send_interval` has passed.
    fn metadata_for(&mut self, batch: &[strata_proto::store::FamilyMetadata]) -> Vec<prompb::MetricMetadata> {
        let m = &self.shared.opts.metadata;
        if !m.send {
            return Vec::new();
        }
        let mut fresh = Vec::new();
        for f in batch {
            let (family, meta) = strata_grpc::metadata_from_pb(f.clone());
            let entry = metadata_entry(family.clone(), meta);
            if self.metadata.get(&family) != Some(&entry) {
                fresh.push(entry.clone());
                self.metadata.insert(family, entry);
            }
        }
        let due = self.metadata_sent.is_none_or(|t| t.elapsed() >= m.send_interval);
        if !due {
            return fresh;
        }
        self.metadata_sent = Some(Instant::now());
        if let Some(source) = &self.shared.opts.metadata_source {
            // Every family the edge knows, also those named before this session began.
            for (family, meta) in source() {
                let entry = metadata_entry(family.clone(), meta);
                self.metadata.insert(family, entry);
            }
        }
        self.metadata.values().cloned().collect()
    }

    /// The batch split into shards, each a list of requests in order.
    fn shard(&mut self, batch: pb::PushRequest) -> (Vec<Vec<Part>>, u64) {
        let q = &self.shared.opts.queue;
        let per_send = q.max_samples_per_send;
        let total: usize = batch.series.iter().map(|s| s.timestamps.len()).sum();
        let n = total.div_ceil(per_send).clamp(1, q.max_shards);
        let mut shards: Vec<Vec<Part>> = (0..n).map(|_| Vec::new()).collect();
        let floor = q
            .sample_age_limit
            .map(|age| strata_model::time::now_ms().saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX)));
        let mut dropped = 0u64;
        for s in &batch.series {
            self.learn(s);
        }
        for mut s in batch.series {
            if !s.chunks.is_empty() {
                // Not asked for (remote write says it takes no chunks), but never dropped
                // unseen: as samples.
                let declared = s.timestamps.len() as u64 + s.chunks.iter().map(|c| u64::from(c.samples)).sum::<u64>();
                match strata_forward::samples_of(&mut s) {
                    Ok(all) => (s.timestamps, s.values) = all.iter().map(|x| (x.t, x.v.to_bits())).unzip(),
                    Err(e) => {
                        dropped += declared;
                        tracing::error!(remote_name = %self.shared.opts.name, error = %e, samples = declared, "remote write: a series' chunks do not decode: dropped");
                        continue;
                    }
                }
            }
            let labels = match self.series.get(&s.r#ref) {
                Some(Some(l)) => l.clone(),
                Some(None) => {
                    dropped += s.timestamps.len() as u64;
                    continue;
                }
                None => {
                    tracing::warn!(
                        remote_name = %self.shared.opts.name,
                        samples = s.timestamps.len(),
                        "remote write: samples of a series the session never named: dropped"
                    );
                    dropped += s.timestamps.len() as u64;
                    continue;
                }
            };
            let shard = &mut shards[usize::try_from(s.r#ref % n as u64).unwrap_or(0)];
            let mut samples = Vec::with_capacity(s.timestamps.len());
            for (&t, &v) in s.timestamps.iter().zip(&s.values) {
                if floor.is_some_and(|f| t < f) {
                    dropped += 1;
                    continue;
                }
                samples.push((t, v));
            }
            // A series longer than a request's room goes on in the next request.
            let mut rest = &samples[..];
            while !rest.is_empty() {
                if shard.last().is_none_or(|p| p.samples as usize >= per_send) {
                    shard.push(Part::new());
                }
                let Some(part) = shard.last_mut() else { break };
                let room = per_send - part.samples as usize;
                let (now, later) = rest.split_at(room.min(rest.len()));
                // Each series' samples are in time order.
                if let (Some(first), Some(last)) = (now.first(), now.last()) {
                    part.oldest = part.oldest.min(first.0);
                    part.newest = part.newest.max(last.0);
                }
                part.samples += now.len() as u64;
                crate::wire::append_series(&mut part.timeseries, &labels, now);
                if let (Some(first), Some(last)) = (now.first(), now.last()) {
                    part.series.push(SeriesSpan {
                        end: part.timeseries.len(),
                        samples: now.len() as u64,
                        oldest: first.0,
                        newest: last.0,
                    });
                }
                rest = later;
            }
        }
        let metadata = self.metadata_for(&batch.metadata);
        if !metadata.is_empty() {
            // Metadata goes in requests of its own, as Prometheus sends it.
            for chunk in metadata.chunks(self.shared.opts.metadata.max_per_send) {
                let mut p = Part::new();
                p.metadata = chunk.to_vec();
                shards[0].insert(0, p);
            }
        }
        (shards, dropped)
    }
}

fn metadata_entry(family: String, meta: strata_model::Metadata) -> prompb::MetricMetadata {
    prompb::MetricMetadata {
        r#type: metric_type(meta.metric_type) as i32,
        metric_family_name: family,
        help: meta.help,
        unit: meta.unit,
    }
}

fn metric_type(t: MetricType) -> prompb::metric_metadata::MetricType {
    use prompb::metric_metadata::MetricType as P;
    match t {
        MetricType::Counter => P::Counter,
        MetricType::Gauge => P::Gauge,
        MetricType::Histogram => P::Histogram,
        MetricType::GaugeHistogram => P::Gaugehistogram,
        MetricType::Summary => P::Summary,
        MetricType::Info => P::Info,
        MetricType::StateSet => P::Stateset,
        MetricType::Unknown => P::Unknown,
    }
}

impl UpstreamSession for RemoteWriteSession {
    fn push(&mut self, batch: pb::PushRequest) -> impl Future<Output = Result<PushAck, PushError>> + Send + 'static {
        // Sharding numbers the session's series: done here, in order, before the future.
        let (shards, dropped) = self.shard(batch);
        send_shards(self.shared.clone(), shards, dropped)
    }
}

/// Sends a batch's shards at once, each shard's parts in order.
async fn send_shards(shared: Arc<Shared>, shards: Vec<Vec<Part>>, dropped: u64) -> Result<PushAck, PushError> {
    let stats = shared.stats.clone();
    if dropped > 0 {
        stats.samples_dropped.inc_by(dropped);
    }
    let pending: u64 = shards.iter().flatten().map(|p| p.samples).sum();
    stats.samples_pending.set(i64::try_from(pending).unwrap_or(i64::MAX));
    stats.shards.set(shards.len() as i64);
    stats.shards_desired.set(shards.len() as f64);
    let mut tasks = tokio::task::JoinSet::new();
    for shard in shards.into_iter().filter(|s| !s.is_empty()) {
        let shared = shared.clone();
        tasks.spawn(async move {
            for part in shard {
                send(&shared, part).await?;
            }
            Ok::<(), String>(())
        });
    }
    let mut failure = None;
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(format!("a shard's task failed: {e}")),
        }
    }
    stats.samples_pending.set(0);
    match failure {
        // The whole batch goes again (what was acknowledged is resent: receivers
        // ignore an identical sample).
        Some(e) => Err(PushError::Failed(e)),
        None => Ok(PushAck::default()),
    }
}

/// What one attempt came to.
enum Attempt {
    Sent,
    /// Retry after at least this long (a 429's `Retry-After`), or the backoff.
    Retry {
        reason: String,
        after: Option<Duration>,
    },
    /// Never take it: the status and the start of the answer.
    Refused {
        status: u16,
        body: String,
    },
}

/// Sends one request until it is acknowledged or refused for good; `Err` only when the
/// edge stops meanwhile. A request refused as a whole for some of its samples goes again
/// in halves, down to single series, so only those are dropped.
async fn send(shared: &Shared, part: Part) -> Result<(), String> {
    let mut todo = vec![part];
    let mut sent = 0usize;
    while let Some(part) = todo.pop() {
        sent += 1;
        let may_split = sent + todo.len() + 2 <= MAX_SPLIT_REQUESTS;
        if let Some(halves) = send_one(shared, part, may_split).await? {
            todo.push(halves.1);
            todo.push(halves.0);
        }
    }
    Ok(())
}

/// One request until it is acknowledged or refused; the halves to send instead when it
/// was refused for some of its samples.
async fn send_one(shared: &Shared, part: Part, may_split: bool) -> Result<Option<(Part, Part)>, String> {
    let stats = &shared.stats;
    let (samples, metadata, oldest, newest) = (part.samples, part.metadata.len() as u64, part.oldest, part.newest);
    let with_metadata;
    let raw = if part.metadata.is_empty() {
        &part.timeseries
    } else {
        let mut raw = part.timeseries.clone();
        let m = prompb::WriteRequest { timeseries: Vec::new(), metadata: part.metadata.clone() };
        m.encode(&mut raw).map_err(|e| format!("encoding metadata: {e}"))?;
        with_metadata = raw;
        &with_metadata
    };
    let body = match snap::raw::Encoder::new().compress_vec(raw) {
        Ok(b) => b,
        Err(e) => {
            // Snappy only fails on input past 4 GiB, which a bounded batch never is.
            stats.samples_failed.inc_by(samples);
            tracing::error!(remote_name = %shared.opts.name, samples, error = %e, "remote write: a request could not be compressed: dropped");
            return Ok(None);
        }
    };
    let mut backoff = shared.opts.queue.min_backoff;
    let mut stop = shared.stop.clone();
    loop {
        let started = Instant::now();
        let attempt = attempt(shared, &body).await;
        stats.batch_duration.observe(started.elapsed().as_secs_f64());
        let (reason, after) = match attempt {
            Attempt::Sent => {
                stats.samples.inc_by(samples);
                stats.metadata.inc_by(metadata);
                let bytes = body.len() as u64;
                if samples > 0 {
                    stats.bytes.inc_by(bytes)
                } else {
                    stats.metadata_bytes.inc_by(bytes)
                };
                if newest > i64::MIN {
                    let max = shared.highest_sent.fetch_max(newest, std::sync::atomic::Ordering::Relaxed).max(newest);
                    stats.highest_sent.set(max as f64 / 1000.0);
                }
                return Ok(None);
            }
            Attempt::Refused { status, body } if may_split && refused_for_some_samples(status, &body) => {
                if let Some(halves) = part.halves() {
                    tracing::warn!(
                        remote_name = %shared.opts.name,
                        status,
                        series = part.series.len(),
                        samples,
                        answer = %body,
                        "remote write: a request refused for some of its samples: sending it again in halves"
                    );
                    return Ok(Some(halves));
                }
                refused(shared, samples, metadata, oldest, newest, status, &body);
                return Ok(None);
            }
            Attempt::Refused { status, body } => {
                refused(shared, samples, metadata, oldest, newest, status, &body);
                return Ok(None);
            }
            Attempt::Retry { reason, after } => (reason, after),
        };
        stats.samples_retried.inc_by(samples);
        stats.metadata_retried.inc_by(metadata);
        let wait = after.map_or(backoff, |a| a.max(backoff)).min(shared.opts.queue.max_backoff.max(backoff));
        tracing::warn!(remote_name = %shared.opts.name, url = %shared.opts.url, error = %reason, retry_in = ?wait, "remote write: retrying a request");
        if *stop.borrow() {
            return Err(format!("stopping ({reason})"));
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return Err(format!("stopping ({reason})")),
        }
        backoff = (backoff * 2).min(shared.opts.queue.max_backoff);
    }
}

/// A request refused for good: counted and logged with its range.
fn refused(shared: &Shared, samples: u64, metadata: u64, oldest: i64, newest: i64, status: u16, body: &str) {
    shared.stats.samples_failed.inc_by(samples);
    shared.stats.metadata_failed.inc_by(metadata);
    tracing::error!(
        remote_name = %shared.opts.name,
        url = %shared.opts.url,
        status,
        samples,
        metadata,
        from_ms = oldest,
        to_ms = newest,
        answer = %body,
        "remote write: the receiver refused a request for good: its samples are dropped"
    );
}

/// The most of a refusal's answer kept for the log.
const ANSWER_BYTES: usize = 512;

async fn attempt(shared: &Shared, body: &[u8]) -> Attempt {
    let mut headers: Vec<(String, String)> = vec![
        ("content-encoding".into(), "snappy".into()),
        ("content-type".into(), "application/x-protobuf".into()),
        ("x-prometheus-remote-write-version".into(), "0.1.0".into()),
    ];
    headers.extend(shared.opts.headers.iter().cloned());
    if let Some(signer) = &shared.signer {
        // Fetching credentials may call out (STS, a credential process): bounded too.
        match tokio::time::timeout(shared.opts.timeout, signer.sign(&shared.opts.url, &headers, body)).await {
            Ok(Ok(h)) => headers.extend(h),
            Ok(Err(e)) => return Attempt::Retry { reason: e, after: None },
            Err(_) => {
                return Attempt::Retry { reason: "sigv4: no credentials within remote_timeout".into(), after: None }
            }
        }
    }
    let mut req = hyper::Request::post(shared.opts.url.as_str())
        .header("user-agent", concat!("Strata/", env!("CARGO_PKG_VERSION")));
    for (k, v) in &headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = match req.body(http_body_util::Full::new(bytes::Bytes::copy_from_slice(body))) {
        Ok(r) => r,
        // The URL and headers were checked at load (`check_url`, header syntax).
        Err(e) => return Attempt::Retry { reason: format!("building the request: {e}"), after: None },
    };
    let timeout = shared.opts.timeout;
    let resp = match tokio::time::timeout(timeout, shared.client.request(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Attempt::Retry { reason: error_chain(&e), after: None },
        Err(_) => {
            return Attempt::Retry { reason: format!("no answer within remote_timeout {timeout:?}"), after: None }
        }
    };
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    // Only the start of an answer is read (within the timeout): a hostile receiver cannot
    // make it large or slow.
    let mut answer = Vec::new();
    let mut body = resp.into_body();
    let read = async {
        use http_body_util::BodyExt;
        while answer.len() < ANSWER_BYTES {
            match body.frame().await {
                Some(Ok(f)) => {
                    if let Some(c) = f.data_ref() {
                        answer.extend_from_slice(&c[..c.len().min(ANSWER_BYTES - answer.len())]);
                    }
                }
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(timeout, read).await;
    let answer = String::from_utf8_lossy(&answer).trim().to_string();
    match status {
        200..=299 => Attempt::Sent,
        429 if shared.opts.queue.retry_on_http_429 => {
            Attempt::Retry { reason: format!("HTTP 429: {answer}"), after: retry_after }
        }
        500..=599 => Attempt::Retry { reason: format!("HTTP {status}: {answer}"), after: retry_after },
        // Redirects are not followed (a signed request would need signing again for the
        // new place): the data is kept, and the log says to fix the URL.
        300..=399 => Attempt::Retry {
            reason: format!("HTTP {status}: redirects are not followed: set url to where it redirects"),
            after: None,
        },
        _ => Attempt::Refused { status, body: answer },
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}
