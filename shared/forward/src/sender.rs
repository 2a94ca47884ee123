//! The edge's side: one [`Forwarder`] per upstream reads the WAL from its cursor and sends
//! it in batches, persisting the cursor after each acknowledgement.

use crate::{pb, Cursor, CursorFile, ForwardError, WalHolds, MAX_BATCH_SAMPLES, MAX_BATCH_SERIES};
use pb::forward_client::ForwardClient;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use strata_grpc::{labels_to_pb, metadata_to_pb, ClientTlsConfig, MAX_MESSAGE_BYTES};
use strata_model::{Labels, Sample};
use strata_tsdb::db::Tsdb;
use strata_tsdb::index::SeriesRef;
use strata_tsdb::wal::{self, WalCursor, WalReader, WalRecord};
use tokio::sync::watch;
use tonic::codec::CompressionEncoding;
use tonic::transport::{Channel, Endpoint};

#[derive(Debug, Clone)]
pub struct ForwarderOptions {
    /// The upstream's name in logs, metrics and the cursor's file name (its address).
    pub upstream: String,
    /// `http://host:port`, or `https://` with `tls`.
    pub endpoint: String,
    pub tls: Option<ClientTlsConfig>,
    /// Samples per batch (the upstream may ask for fewer).
    pub batch_samples: usize,
    /// Added to every series that does not carry the label itself, as Prometheus' remote
    /// write adds external labels.
    pub external_labels: Labels,
    /// How long to wait at the end of the WAL before reading again.
    pub poll: Duration,
    pub timeout: Duration,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
}

impl ForwarderOptions {
    pub fn new(upstream: &str) -> ForwarderOptions {
        let endpoint = if upstream.contains("://") { upstream.to_string() } else { format!("http://{upstream}") };
        ForwarderOptions {
            upstream: upstream.to_string(),
            endpoint,
            tls: None,
            batch_samples: 20_000,
            external_labels: Labels::default(),
            poll: Duration::from_millis(200),
            timeout: Duration::from_secs(30),
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
        }
    }
}

/// Every upstream's progress, for `/metrics` (families keyed by `upstream`).
#[derive(Debug, Default, Clone)]
pub struct ForwardMetrics {
    batches_sent: Family<UpstreamLabel, Counter>,
    batches_acked: Family<UpstreamLabel, Counter>,
    samples_acked: Family<UpstreamLabel, Counter>,
    retries: Family<UpstreamLabel, Counter>,
    restarts_from_oldest: Family<UpstreamLabel, Counter>,
    unsendable_samples: Family<UpstreamLabel, Counter>,
    pending_bytes: Family<UpstreamLabel, Gauge>,
    lag_seconds: Family<UpstreamLabel, Gauge<f64, AtomicU64>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabel {
    pub upstream: String,
}

impl ForwardMetrics {
    /// Registers the families (`<prefix>_forward_*`).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("forward");
        r.register("batches_sent", "Batches sent to the upstream", self.batches_sent.clone());
        r.register("batches_acked", "Batches the upstream acknowledged as durable", self.batches_acked.clone());
        r.register("samples_acked", "Samples the upstream acknowledged as durable", self.samples_acked.clone());
        r.register("retries", "Failed sessions and batches, each retried after a backoff", self.retries.clone());
        r.register(
            "restarts_from_oldest",
            "Times the upstream came back with new storage and was sent everything again",
            self.restarts_from_oldest.clone(),
        );
        r.register(
            "unsendable_samples",
            "Samples of series neither the WAL nor the head names any more: not sent (logged)",
            self.unsendable_samples.clone(),
        );
        r.register("pending_bytes", "WAL bytes after the upstream's cursor", self.pending_bytes.clone());
        r.register(
            "lag_seconds",
            "How far the newest acknowledged sample is behind the wall clock while data is pending (0: caught up)",
            self.lag_seconds.clone(),
        );
    }

    /// The handles of one upstream.
    pub fn upstream(&self, name: &str) -> ForwarderStats {
        let l = UpstreamLabel { upstream: name.to_string() };
        ForwarderStats {
            batches_sent: self.batches_sent.get_or_create(&l).clone(),
            batches_acked: self.batches_acked.get_or_create(&l).clone(),
            samples_acked: self.samples_acked.get_or_create(&l).clone(),
            retries: self.retries.get_or_create(&l).clone(),
            restarts_from_oldest: self.restarts_from_oldest.get_or_create(&l).clone(),
            unsendable_samples: self.unsendable_samples.get_or_create(&l).clone(),
            pending_bytes: self.pending_bytes.get_or_create(&l).clone(),
            lag_seconds: self.lag_seconds.get_or_create(&l).clone(),
        }
    }
}

/// One upstream's progress (handles into [`ForwardMetrics`]).
#[derive(Debug, Clone, Default)]
pub struct ForwarderStats {
    pub batches_sent: Counter,
    pub batches_acked: Counter,
    pub samples_acked: Counter,
    /// Failed sessions and refused batches, each followed by a backoff.
    pub retries: Counter,
    /// Times the upstream came back with another storage identity.
    pub restarts_from_oldest: Counter,
    /// Samples whose series the WAL and the head no longer name: not sendable (logged).
    pub unsendable_samples: Counter,
    /// WAL bytes after the cursor.
    pub pending_bytes: Gauge,
    pub lag_seconds: Gauge<f64, AtomicU64>,
}

/// Forwards the edge's WAL to one upstream until stopped.
pub struct Forwarder {
    db: Arc<Tsdb>,
    opts: ForwarderOptions,
    cursor_file: CursorFile,
    holds: Arc<WalHolds>,
    stats: ForwarderStats,
}

impl Forwarder {
    /// A forwarder counting into `stats` (from [`ForwardMetrics::upstream`], or a default
    /// of its own).
    pub fn new(db: Arc<Tsdb>, holds: Arc<WalHolds>, opts: ForwarderOptions, stats: ForwarderStats) -> Forwarder {
        let cursor_file = CursorFile::new(db.dir(), &opts.upstream);
        // Until the upstream says where it stands, everything it may need is kept.
        let held = cursor_file.load().map_or_else(|| oldest(&db), |c| c.wal);
        holds.set(&opts.upstream, held);
        Forwarder { db, opts, cursor_file, holds, stats }
    }

    pub fn stats(&self) -> ForwarderStats {
        self.stats.clone()
    }

    /// Sends until `stop` turns true; a failed session is retried with backoff.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut backoff = self.opts.min_backoff;
        while !*stop.borrow() {
            match self.session(&mut stop, &mut backoff).await {
                Ok(()) => return,
                Err(e) => {
                    self.stats.retries.inc();
                    tracing::warn!(upstream = %self.opts.upstream, error = %e, retry_in = ?backoff, "forward: retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.changed() => {}
                    }
                    backoff = (backoff * 2).min(self.opts.max_backoff);
                }
            }
        }
    }

    fn fail(&self, reason: impl std::fmt::Display) -> ForwardError {
        ForwardError::Upstream { upstream: self.opts.upstream.clone(), reason: reason.to_string() }
    }

    async fn connect(&self) -> Result<ForwardClient<Channel>, ForwardError> {
        let mut ep = Endpoint::from_shared(self.opts.endpoint.clone())
            .map_err(|e| self.fail(format!("invalid address: {e}")))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(self.opts.timeout)
            .tcp_nodelay(true);
        if let Some(tls) = &self.opts.tls {
            ep = ep.tls_config(tls.clone()).map_err(|e| self.fail(format!("TLS: {e}")))?;
        }
        let ch = ep.connect().await.map_err(|e| self.fail(format!("connecting: {e}")))?;
        Ok(ForwardClient::new(ch)
            .send_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// One connection: `Hello`, then batches until stopped (`Ok`) or a failure (`Err`).
    async fn session(&self, stop: &mut watch::Receiver<bool>, backoff: &mut Duration) -> Result<(), ForwardError> {
        let mut client = self.connect().await?;
        let labels = labels_to_pb(&self.opts.external_labels);
        let hello = client
            .hello(pb::HelloRequest { external_labels: labels })
            .await
            .map_err(|s| self.fail(format!("hello: {}", s.message())))?
            .into_inner();
        let storage_id = hello.storage_id;
        let mut cursor = match self.cursor_file.load() {
            Some(c) if c.storage_id == storage_id => c,
            previous => {
                let from = oldest(&self.db);
                if previous.is_some() {
                    self.stats.restarts_from_oldest.inc();
                    tracing::warn!(
                        upstream = %self.opts.upstream,
                        storage_id = %storage_id,
                        "forward: the upstream has new storage (its data directory was replaced): sending everything from the oldest data held"
                    );
                }
                Cursor { storage_id: storage_id.clone(), wal: from, skip: 0 }
            }
        };
        self.holds.set(&self.opts.upstream, cursor.wal);
        let limit = self
            .opts
            .batch_samples
            .min(usize::try_from(hello.max_batch_samples).unwrap_or(usize::MAX))
            .clamp(1, MAX_BATCH_SAMPLES);
        let mut source = Some(WalSource::new(&self.db, &cursor));
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            let (db, external) = (self.db.clone(), self.opts.external_labels.clone());
            let Some(mut src) = source.take() else { return Err(self.fail("lost the WAL reader")) };
            let (src, read) = tokio::task::spawn_blocking(move || {
                let read = src.next_batch(&db, limit, &external);
                (src, read)
            })
            .await
            .map_err(|e| self.fail(format!("reading the WAL: {e}")))?;
            source = Some(src);
            let batch = read.map_err(|source| ForwardError::Wal { upstream: self.opts.upstream.clone(), source })?;
            if batch.unknown > 0 {
                self.stats.unsendable_samples.inc_by(batch.unknown);
                tracing::warn!(upstream = %self.opts.upstream, samples = batch.unknown, "forward: samples of series the WAL does not name: not sent");
            }
            self.stats.pending_bytes.set(i64::try_from(pending_bytes(&self.db, batch.next.0)).unwrap_or(i64::MAX));
            if batch.request.series.is_empty() && batch.request.metadata.is_empty() {
                if batch.next != (cursor.wal, cursor.skip) {
                    // Only records that carry nothing to send (labels): move past them.
                    cursor = self.advance(cursor, batch.next).await?;
                }
                self.stats.lag_seconds.set(0.0);
                tokio::select! {
                    _ = tokio::time::sleep(self.opts.poll) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            let mut request = batch.request;
            request.storage_id = storage_id.clone();
            self.stats.batches_sent.inc();
            let ack =
                client.push(request).await.map_err(|s| self.fail(format!("push: {:?}: {}", s.code(), s.message())))?;
            let ack = ack.into_inner();
            if ack.conflicts + ack.out_of_order + ack.out_of_bounds > 0 {
                tracing::warn!(
                    upstream = %self.opts.upstream,
                    conflicts = ack.conflicts,
                    out_of_order = ack.out_of_order,
                    out_of_bounds = ack.out_of_bounds,
                    "forward: the upstream kept other values or refused samples of a batch"
                );
            }
            cursor = self.advance(cursor, batch.next).await?;
            self.stats.batches_acked.inc();
            self.stats.samples_acked.inc_by(batch.samples);
            if batch.newest > i64::MIN {
                let behind = strata_model::time::now_ms().saturating_sub(batch.newest).max(0);
                self.stats.lag_seconds.set(behind as f64 / 1000.0);
            }
            *backoff = self.opts.min_backoff;
        }
    }

    /// Persists the cursor after an acknowledged batch and lets the WAL before it go.
    async fn advance(&self, mut cursor: Cursor, next: (WalCursor, u64)) -> Result<Cursor, ForwardError> {
        (cursor.wal, cursor.skip) = next;
        let file = CursorFile::new(self.db.dir(), &self.opts.upstream);
        let c = cursor.clone();
        tokio::task::spawn_blocking(move || file.store(&c))
            .await
            .map_err(|e| self.fail(format!("storing the cursor: {e}")))??;
        self.holds.set(&self.opts.upstream, cursor.wal);
        Ok(cursor)
    }
}

/// The oldest position the WAL holds.
fn oldest(db: &Tsdb) -> WalCursor {
    let first = wal::list_segments(&db.wal_dir()).ok().and_then(|s| s.first().copied());
    WalCursor { segment: first.unwrap_or(0), offset: 0 }
}

/// WAL bytes from `from` to the end.
fn pending_bytes(db: &Tsdb, from: WalCursor) -> u64 {
    let dir = db.wal_dir();
    let Ok(segments) = wal::list_segments(&dir) else { return 0 };
    segments
        .into_iter()
        .filter(|&n| n >= from.segment)
        .filter_map(|n| std::fs::metadata(wal::segment_path(&dir, n)).ok().map(|m| (n, m.len())))
        .map(|(n, len)| if n == from.segment { len.saturating_sub(from.offset) } else { len })
        .sum()
}

/// A batch read from the WAL and the cursor after it.
struct Batch {
    request: pb::PushRequest,
    next: (WalCursor, u64),
    samples: u64,
    newest: i64,
    unknown: u64,
}

/// A samples record partly sent: it starts at `start`, ends at `end`.
struct Partial {
    start: WalCursor,
    end: WalCursor,
    samples: Vec<(SeriesRef, Sample)>,
    taken: usize,
}

/// Reads batches from the WAL, remembering series labels its records named.
struct WalSource {
    reader: WalReader,
    labels: HashMap<SeriesRef, Labels>,
    partial: Option<Partial>,
    /// Samples of the first record read to skip (sent before a restart).
    skip: u64,
    at: (WalCursor, u64),
}

/// Series labels remembered at most; past it the head is asked again.
const MAX_REMEMBERED_SERIES: usize = 1 << 20;

impl WalSource {
    fn new(db: &Tsdb, c: &Cursor) -> WalSource {
        WalSource {
            reader: WalReader::new(&db.wal_dir(), c.wal),
            labels: HashMap::new(),
            partial: None,
            skip: c.skip,
            at: (c.wal, c.skip),
        }
    }

    fn labels_of(&mut self, db: &Tsdb, r: SeriesRef) -> Option<Labels> {
        if let Some(l) = self.labels.get(&r) {
            return Some(l.clone());
        }
        let l = db.head().series(r)?.labels.clone();
        if self.labels.len() >= MAX_REMEMBERED_SERIES {
            self.labels.clear();
        }
        self.labels.insert(r, l.clone());
        Some(l)
    }

    fn next_batch(&mut self, db: &Tsdb, limit: usize, external: &Labels) -> Result<Batch, wal::WalError> {
        let mut req = pb::PushRequest::default();
        let mut index: HashMap<SeriesRef, usize> = HashMap::new();
        let (mut n, mut newest, mut unknown) = (0usize, i64::MIN, 0u64);
        loop {
            if let Some(mut p) = self.partial.take() {
                while p.taken < p.samples.len() && n < limit {
                    let (r, s) = p.samples[p.taken];
                    let i = match index.get(&r) {
                        Some(&i) => i,
                        None if index.len() >= MAX_BATCH_SERIES => break,
                        None => {
                            let Some(labels) = self.labels_of(db, r) else {
                                unknown += 1;
                                p.taken += 1;
                                continue;
                            };
                            req.series.push(pb::ForwardSeries {
                                labels: labels_to_pb(&with_external(labels, external)),
                                ..Default::default()
                            });
                            index.insert(r, req.series.len() - 1);
                            req.series.len() - 1
                        }
                    };
                    p.taken += 1;
                    let fs = &mut req.series[i];
                    // The WAL holds each series' samples in time order; a repeat (a segment
                    // rewritten after a crash) is not sent twice in one batch.
                    if fs.timestamps.last().is_some_and(|&t| t >= s.t) {
                        continue;
                    }
                    fs.timestamps.push(s.t);
                    fs.values.push(s.v.to_bits());
                    n += 1;
                    newest = newest.max(s.t);
                }
                if p.taken < p.samples.len() {
                    self.at = (p.start, p.taken as u64);
                    self.partial = Some(p);
                    break;
                }
                self.at = (p.end, 0);
                continue;
            }
            if n >= limit {
                break;
            }
            let before = self.reader.cursor();
            let Some((rec, after)) = self.reader.next_record()? else { break };
            match rec {
                WalRecord::Series { series_ref, labels } => {
                    if self.labels.len() >= MAX_REMEMBERED_SERIES {
                        self.labels.clear();
                    }
                    self.labels.insert(series_ref, labels);
                    self.at = (after, 0);
                }
                WalRecord::Metadata { family, meta } => {
                    req.metadata.push(metadata_to_pb(&family, &meta));
                    self.at = (after, 0);
                }
                WalRecord::Samples(samples) => {
                    let start = if before.segment == after.segment {
                        before
                    } else {
                        WalCursor { segment: after.segment, offset: 0 }
                    };
                    let taken =
                        usize::try_from(std::mem::take(&mut self.skip)).unwrap_or(usize::MAX).min(samples.len());
                    self.partial = Some(Partial { start, end: after, samples, taken });
                }
            }
        }
        Ok(Batch { request: req, next: self.at, samples: n as u64, newest, unknown })
    }
}

/// `labels` with each external label it does not carry itself.
fn with_external(labels: Labels, external: &Labels) -> Labels {
    if external.is_empty() {
        return labels;
    }
    let mut b = labels.to_builder();
    for l in external.iter() {
        if labels.get(&l.name).is_none() {
            b.set(&l.name, &l.value);
        }
    }
    b.build()
}
