//! The edge's side: one [`Forwarder`] per upstream reads the WAL from its cursor and sends
//! it in batches, persisting the cursor after each acknowledgement.

use crate::backlog::{labels_before, Backlog, BacklogError, BacklogReader};
use crate::cursor::ReplayAt;
use crate::upstream::{GrpcUpstream, PushError, Upstream, UpstreamSession};
use crate::FastMap as HashMap;
use crate::{pb, Cursor, CursorFile, ForwardError, WalHolds, MAX_BATCH_METADATA, MAX_BATCH_SAMPLES, MAX_BATCH_SERIES};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use strata_chunk::Chunk;
use strata_grpc::{
    attach_external, chunk_to_pb, labels_to_pb, metadata_to_pb, ClientTlsConfig, MAX_LABELS, MAX_LABEL_BYTES,
};
use strata_model::{Labels, Sample};
use strata_tsdb::db::Tsdb;
use strata_tsdb::index::SeriesRef;
use strata_tsdb::wal::{self, WalCursor, WalReader, WalRecord};
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct ForwarderOptions {
    /// The upstream's name in logs, metrics and the cursor's file name (its address).
    pub upstream: String,
    /// For [`Forwarder::new`]'s gRPC upstream: `http://host:port`, or `https://` with `tls`.
    pub endpoint: String,
    pub tls: Option<ClientTlsConfig>,
    /// For the gRPC upstream: gzip batches (the receiver takes both).
    pub gzip: bool,
    /// Samples per batch (the upstream may ask for fewer).
    pub batch_samples: usize,
    /// Added to every series: replacing a label of the same name the series has (the
    /// StoreAPI's rule, so a series has one label set whichever tier serves it), or, with
    /// `series_labels_win`, only where the series lacks it (Prometheus' remote write rule).
    pub external_labels: Labels,
    pub series_labels_win: bool,
    /// How long to wait at the end of the WAL before reading again.
    pub poll: Duration,
    /// The most blocks past the edge's retention kept for this upstream while it has a
    /// backlog to read from them; what retention deletes past it is dropped for the
    /// upstream, oldest first, counted and logged with its time range. `None`: none kept.
    pub max_disk: Option<u64>,
    pub timeout: Duration,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// Times the upstream refuses the same batch as invalid before it is dropped (a peer
    /// mid-upgrade may refuse what it will take a minute later).
    pub refusals_before_drop: u32,
    /// An upstream met this many WAL bytes behind (after an outage) gets that backlog
    /// from storage, series by series, instead of replaying the WAL record by record:
    /// several times faster once it is more than a few seconds of data.
    pub storage_backlog_bytes: u64,
    /// An upstream met for the first time gets everything the edge holds (a regional);
    /// without, what the WAL holds from its start on (remote write, as Prometheus').
    pub history_on_first_contact: bool,
}

impl ForwarderOptions {
    pub fn new(upstream: &str) -> ForwarderOptions {
        let endpoint = if upstream.contains("://") { upstream.to_string() } else { format!("http://{upstream}") };
        ForwarderOptions {
            upstream: upstream.to_string(),
            endpoint,
            tls: None,
            gzip: true,
            batch_samples: 200_000,
            external_labels: Labels::default(),
            series_labels_win: false,
            poll: Duration::from_millis(200),
            max_disk: None,
            timeout: Duration::from_secs(30),
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            refusals_before_drop: 3,
            storage_backlog_bytes: 8 << 20,
            history_on_first_contact: true,
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
    dropped_samples: Family<UpstreamLabel, Counter>,
    budget_dropped_samples: Family<UpstreamLabel, Counter>,
    sent_bytes: Family<UpstreamLabel, Counter>,
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
        self.register_as(registry, "forward");
    }

    /// Registers the families as `<prefix>_<name>_*`.
    pub fn register_as(&self, registry: &mut Registry, name: &str) {
        let r = registry.sub_registry_with_prefix(name);
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
            "Samples of references their WAL segment does not name (damage): not sent (logged)",
            self.unsendable_samples.clone(),
        );
        r.register(
            "dropped_samples",
            "Samples of batches the upstream refused as invalid again and again: dropped for it (logged with their range)",
            self.dropped_samples.clone(),
        );
        r.register(
            "budget_dropped_samples",
            "Samples the upstream still needed that the edge no longer held when they were due (deleted past retention and forward_max_disk, or in a damaged block): dropped for it, oldest first, logged with their range",
            self.budget_dropped_samples.clone(),
        );
        r.register("sent_bytes", "Bytes of batches sent, as protobuf before gzip", self.sent_bytes.clone());
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
            dropped_samples: self.dropped_samples.get_or_create(&l).clone(),
            budget_dropped_samples: self.budget_dropped_samples.get_or_create(&l).clone(),
            sent_bytes: self.sent_bytes.get_or_create(&l).clone(),
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
    /// Samples of references their WAL segment does not name (damage): not sendable (logged).
    pub unsendable_samples: Counter,
    /// Samples of batches the upstream refused as invalid, dropped after retries (logged).
    pub dropped_samples: Counter,
    /// Samples of a backlog storage no longer held when due (logged with their range).
    pub budget_dropped_samples: Counter,
    /// Bytes of batches sent, as protobuf before gzip.
    pub sent_bytes: Counter,
    /// WAL bytes after the cursor.
    pub pending_bytes: Gauge,
    pub lag_seconds: Gauge<f64, AtomicU64>,
}

/// Forwards the edge's WAL to one upstream until stopped.
pub struct Forwarder<U: Upstream = GrpcUpstream> {
    upstream: U,
    db: Arc<Tsdb>,
    opts: ForwarderOptions,
    cursor_file: CursorFile,
    holds: Arc<WalHolds>,
    stats: ForwarderStats,
    /// The newest timestamp acknowledged (ms; `i64::MIN` before the first).
    newest_acked: std::sync::atomic::AtomicI64,
    /// Where the upstream last refused a batch as invalid, and how many times in a row
    /// (kept across sessions: each refusal ends one).
    refused: parking_lot::Mutex<Option<(At, u32)>>,
    /// The upstream refused a batch of chunks (a regional of an older version answered
    /// for one that takes them, in a rolling upgrade): samples from then on.
    chunks_refused: std::sync::atomic::AtomicBool,
    /// The backlog last stored, for the session that replays it next.
    stored: parking_lot::Mutex<Option<Stored>>,
}

impl Forwarder<GrpcUpstream> {
    /// A forwarder to the regional at `opts.endpoint`, counting into `stats` (from
    /// [`ForwardMetrics::upstream`], or a default of its own).
    pub fn new(db: Arc<Tsdb>, holds: Arc<WalHolds>, opts: ForwarderOptions, stats: ForwarderStats) -> Forwarder {
        let upstream = GrpcUpstream {
            endpoint: opts.endpoint.clone(),
            tls: opts.tls.clone(),
            gzip: opts.gzip,
            timeout: opts.timeout,
            external_labels: opts.external_labels.clone(),
        };
        Forwarder::with_upstream(db, holds, opts, stats, upstream)
    }
}

impl<U: Upstream> Forwarder<U> {
    /// A forwarder to any [`Upstream`]; `opts.upstream` names it in logs, metrics and its
    /// cursor file.
    pub fn with_upstream(
        db: Arc<Tsdb>,
        holds: Arc<WalHolds>,
        opts: ForwarderOptions,
        stats: ForwarderStats,
        upstream: U,
    ) -> Forwarder<U> {
        let cursor_file = CursorFile::new(db.dir(), &opts.upstream);
        // Until the upstream says where it stands, everything it may need is kept.
        let loaded = cursor_file.load();
        let held = loaded.as_ref().map_or_else(|| oldest(&db), |c| c.wal);
        holds.set(&opts.upstream, held);
        if loaded.as_ref().is_some_and(|c| c.replay.is_some()) {
            let oldest = loaded
                .as_ref()
                .and_then(|c| c.replay)
                .and_then(|r| Backlog::load(&cursor_file.backlog_path(r.generation)).ok())
                .map_or(i64::MIN, |b| b.summary().1);
            holds.set_backlog(&opts.upstream, Some((oldest, opts.max_disk.unwrap_or(0))));
        }
        // What is pending shows from the start: a 0 before the first session would read
        // as "caught up".
        stats.pending_bytes.set(i64::try_from(pending_bytes(&db, held)).unwrap_or(i64::MAX));
        Forwarder {
            upstream,
            db,
            opts,
            cursor_file,
            holds,
            stats,
            newest_acked: std::sync::atomic::AtomicI64::new(i64::MIN),
            refused: parking_lot::Mutex::new(None),
            chunks_refused: std::sync::atomic::AtomicBool::new(false),
            stored: parking_lot::Mutex::new(None),
        }
    }

    pub fn stats(&self) -> ForwarderStats {
        self.stats.clone()
    }

    /// Sends until `stop` turns true; a failed session is retried with backoff.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut backoff = self.opts.min_backoff;
        while !*stop.borrow() {
            match self.session(&mut stop, &mut backoff).await {
                Ok(SessionEnd::Stopped) => return,
                Ok(SessionEnd::Rotate) => continue,
                Err(e) => {
                    self.stats.retries.inc();
                    if let Err(e) = self.take_backlog_from_storage(Until::Checkpoint).await {
                        tracing::error!(upstream = %self.opts.upstream, error = %e, "forward: moving the backlog to storage failed (the WAL stays held)");
                    }
                    self.note_pending();
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

    /// Once the head checkpoint covers WAL segments this upstream still needs, what they
    /// hold for it becomes a backlog read from storage ([`Backlog`]), and the hold on
    /// them goes. Returns whether the persisted cursor moved (a running session then
    /// starts again from it).
    async fn take_backlog_from_storage(&self, until: Until) -> Result<bool, ForwardError> {
        let (db, file, upstream) =
            (self.db.clone(), CursorFile::new(self.db.dir(), &self.opts.upstream), self.opts.upstream.clone());
        let unsendable = self.stats.unsendable_samples.clone();
        let history = self.opts.history_on_first_contact;
        let moved = tokio::task::spawn_blocking(move || {
            backlog_from_storage(&db, &file, &upstream, &unsendable, until, history)
        })
        .await
        .map_err(|e| self.fail(format!("moving the backlog to storage: {e}")))??;
        let Some(stored) = moved else { return Ok(false) };
        self.holds.set_backlog(&self.opts.upstream, Some((stored.oldest, self.opts.max_disk.unwrap_or(0))));
        self.holds.set(&self.opts.upstream, stored.cursor.wal);
        *self.stored.lock() = Some(stored);
        Ok(true)
    }

    /// Pending bytes and lag while the upstream cannot be reached: from the persisted
    /// cursor and the newest sample acknowledged.
    fn note_pending(&self) {
        let at = self.cursor_file.load().map_or_else(|| oldest(&self.db), |c| c.wal);
        let pending = pending_bytes(&self.db, at);
        self.stats.pending_bytes.set(i64::try_from(pending).unwrap_or(i64::MAX));
        let newest = self.newest_acked.load(std::sync::atomic::Ordering::Relaxed);
        if pending > 0 && newest > i64::MIN {
            let behind = strata_model::time::now_ms().saturating_sub(newest).max(0);
            self.stats.lag_seconds.set(behind as f64 / 1000.0);
        }
    }

    /// Lag and pending while a batch waits for its acknowledgement: from the newest sample
    /// acknowledged, or (none yet) from just before the batch's oldest.
    fn note_in_flight(&self, acked: WalCursor, batch_oldest: i64) {
        let pending = pending_bytes(&self.db, acked);
        self.stats.pending_bytes.set(i64::try_from(pending).unwrap_or(i64::MAX));
        let newest = self.newest_acked.load(std::sync::atomic::Ordering::Relaxed);
        let since = if newest > i64::MIN { newest } else { batch_oldest };
        if since < i64::MAX {
            let behind = strata_model::time::now_ms().saturating_sub(since).max(0);
            self.stats.lag_seconds.set(behind as f64 / 1000.0);
        }
    }

    fn fail(&self, reason: impl std::fmt::Display) -> ForwardError {
        ForwardError::Upstream { upstream: self.opts.upstream.clone(), reason: reason.to_string() }
    }

    /// One connection: `Hello`, then batches until stopped (`Ok`) or a failure (`Err`).
    async fn session(
        &self,
        stop: &mut watch::Receiver<bool>,
        backoff: &mut Duration,
    ) -> Result<SessionEnd, ForwardError> {
        let (mut client, hello) = self.upstream.open().await.map_err(|e| self.fail(e))?;
        let storage_id = hello.storage_id;
        let mut cursor = match self.cursor_file.load() {
            Some(c) if c.storage_id == storage_id => {
                // Back after an outage: far behind, the backlog is read from storage.
                let behind = pending_bytes(&self.db, c.wal);
                let moved = if behind >= self.opts.storage_backlog_bytes {
                    // Failing that (a full disk, say), the WAL is read as it is.
                    self.take_backlog_from_storage(Until::Now).await.unwrap_or_else(|e| {
                        tracing::error!(upstream = %self.opts.upstream, error = %e, "forward: reading the backlog from storage failed: it is read from the WAL");
                        false
                    })
                } else {
                    false
                };
                match self.cursor_file.load() {
                    Some(moved_to) if moved => moved_to,
                    _ => c,
                }
            }
            // Placed by the disk budget before the upstream was ever reached.
            Some(c) if c.storage_id.is_empty() => Cursor { storage_id: storage_id.clone(), ..c },
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
                let fresh = Cursor { storage_id: storage_id.clone(), wal: from, skip: 0, replay: None };
                // Nothing from `from` on goes while storage is listed.
                self.holds.set(&self.opts.upstream, from);
                if storage_id.is_empty() || !self.opts.history_on_first_contact {
                    // No storage identity (a remote write endpoint): from the WAL's start.
                    fresh
                } else {
                    self.everything_from_storage(fresh).await?
                }
            }
        };
        self.holds.set(&self.opts.upstream, cursor.wal);
        let limit = self
            .opts
            .batch_samples
            .min(usize::try_from(hello.max_batch_samples).unwrap_or(usize::MAX))
            .clamp(1, MAX_BATCH_SAMPLES);
        if cursor.replay.is_none() {
            // Nothing to replay: a backlog kept for it (say, before a new identity) goes.
            self.stored.lock().take();
        }
        let backlog = cursor.replay.map(|r| {
            let kept =
                self.stored.lock().take().filter(|s| s.cursor.replay.map(|x| x.generation) == Some(r.generation));
            match kept {
                Some(s) => BacklogAt::Here(s.backlog),
                None => BacklogAt::File(self.cursor_file.backlog_path(r.generation)),
            }
        });
        let (db, c) = (self.db.clone(), cursor.clone());
        let opened = tokio::task::spawn_blocking(move || WalSource::new(db, &c, backlog))
            .await
            .map_err(|e| self.fail(format!("reading the WAL: {e}")))?;
        let mut source = Some(opened.map_err(|e| e.into_forward(&self.opts.upstream))?);
        if let Some(s) = source.as_mut() {
            s.chunks = hello.takes_chunks && !self.chunks_refused.load(std::sync::atomic::Ordering::Relaxed);
        }
        // Series numbers are the session's: a new session (this one) names every series
        // again with its labels.
        let session = session_id();
        let mut prefetched: Option<tokio::task::JoinHandle<(WalSource, Result<Batch, ReadError>)>> = None;
        loop {
            if *stop.borrow() {
                return Ok(SessionEnd::Stopped);
            }
            // Moving the backlog to storage moves the persisted cursor: a new session
            // starts from it.
            let checkpointed = self.db.wal_needed_from().is_some_and(|n| n > cursor.wal.segment);
            if checkpointed && self.take_backlog_from_storage(Until::Checkpoint).await? {
                return Ok(SessionEnd::Rotate);
            }
            // The batch read while the previous one was in flight, or one read now.
            let (mut src, read) = match prefetched.take() {
                Some(h) => h.await.map_err(|e| self.fail(format!("reading the WAL: {e}")))?,
                None => {
                    let Some(mut src) = source.take() else { return Err(self.fail("lost the WAL reader")) };
                    if src.outgrown() {
                        // Series that left long ago still hold numbers: a new session forgets them.
                        return Ok(SessionEnd::Rotate);
                    }
                    let external = (self.opts.external_labels.clone(), self.opts.series_labels_win);
                    tokio::task::spawn_blocking(move || {
                        let read = src.next_batch(limit, &external);
                        (src, read)
                    })
                    .await
                    .map_err(|e| self.fail(format!("reading the WAL: {e}")))?
                }
            };
            let mut batch = read.map_err(|e| e.into_forward(&self.opts.upstream))?;
            // The next batch is read while this one is in flight (the WAL reader and the
            // upstream work at once); a session that ends discards it unsent, and the next
            // one reads again from the persisted cursor.
            let more = !batch.request.series.is_empty() || !batch.request.metadata.is_empty();
            if more && !src.outgrown() {
                let external = (self.opts.external_labels.clone(), self.opts.series_labels_win);
                prefetched = Some(tokio::task::spawn_blocking(move || {
                    let read = src.next_batch(limit, &external);
                    (src, read)
                }));
            } else {
                source = Some(src);
            }
            if batch.unknown > 0 {
                self.stats.unsendable_samples.inc_by(batch.unknown);
                tracing::warn!(upstream = %self.opts.upstream, samples = batch.unknown, "forward: samples of series the WAL does not name: not sent");
            }
            // Pending is what the upstream has not acknowledged: from the cursor, not the read.
            self.stats.pending_bytes.set(i64::try_from(pending_bytes(&self.db, cursor.wal)).unwrap_or(i64::MAX));
            if batch.request.series.is_empty() && batch.request.metadata.is_empty() {
                if batch.next != At::of(&cursor) {
                    // Only records that carry nothing to send (labels), or backlog storage
                    // no longer holds: move past them.
                    cursor = self.advance(cursor, &batch).await?;
                }
                self.stats.lag_seconds.set(0.0);
                tokio::select! {
                    _ = tokio::time::sleep(self.opts.poll) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            let mut request = std::mem::take(&mut batch.request);
            request.storage_id = storage_id.clone();
            request.session = session.clone();
            self.stats.batches_sent.inc();
            self.stats.sent_bytes.inc_by(prost::Message::encoded_len(&request) as u64);
            // A push may take long (a remote write retries inside it through an outage):
            // meanwhile lag and pending go on growing in /metrics.
            let push = client.push(request);
            tokio::pin!(push);
            let pushed_at = std::time::Instant::now();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            let result = loop {
                tokio::select! {
                    r = &mut push => break r,
                    _ = tick.tick() => {
                        self.note_in_flight(cursor.wal, batch.oldest);
                        // An upstream may be out for long inside one push: the budget
                        // still holds, and a push stuck that long gives way to what it
                        // leaves (a push that is merely slow is left to finish).
                        if pushed_at.elapsed() >= STUCK_PUSH && self.take_backlog_from_storage(Until::Checkpoint).await? {
                            return Err(self.fail(
                                "the WAL this upstream still needs was checkpointed during a push; resuming from storage",
                            ));
                        }
                    }
                }
            };
            let ack = match result {
                Ok(a) => a,
                Err(PushError::Refused(reason))
                    if batch.chunks && !self.chunks_refused.swap(true, std::sync::atomic::Ordering::Relaxed) =>
                {
                    return Err(self.fail(format!("a batch of chunks refused ({reason}): sending samples from now on")));
                }
                Err(PushError::Refused(reason)) => {
                    // The upstream will never take this batch. Retried a few times (it may
                    // be a peer mid-upgrade), then dropped, counted and logged, so that one
                    // batch cannot hold all later data back (and the WAL with it) for ever.
                    let here = At::of(&cursor);
                    let tries = {
                        let mut r = self.refused.lock();
                        let tries = match *r {
                            Some((at, n)) if at == here => n + 1,
                            _ => 1,
                        };
                        *r = Some((here, tries));
                        tries
                    };
                    if tries < self.opts.refusals_before_drop {
                        return Err(self.fail(format!("push refused: {reason}")));
                    }
                    self.stats.dropped_samples.inc_by(batch.samples);
                    tracing::error!(
                        upstream = %self.opts.upstream,
                        samples = batch.samples,
                        from_ms = batch.oldest,
                        to_ms = batch.newest,
                        reason = %reason,
                        "forward: the upstream refuses a batch for good: its samples are dropped for this upstream"
                    );
                    cursor = self.advance(cursor, &batch).await?;
                    continue;
                }
                Err(PushError::Failed(reason)) => return Err(self.fail(reason)),
            };
            if ack.conflicts + ack.out_of_order + ack.out_of_bounds > 0 {
                tracing::warn!(
                    upstream = %self.opts.upstream,
                    conflicts = ack.conflicts,
                    out_of_order = ack.out_of_order,
                    out_of_bounds = ack.out_of_bounds,
                    "forward: the upstream kept other values or refused samples of a batch"
                );
            }
            cursor = self.advance(cursor, &batch).await?;
            self.stats.batches_acked.inc();
            self.stats.samples_acked.inc_by(batch.samples);
            if batch.newest > i64::MIN {
                let newest =
                    self.newest_acked.fetch_max(batch.newest, std::sync::atomic::Ordering::Relaxed).max(batch.newest);
                let behind = strata_model::time::now_ms().saturating_sub(newest).max(0);
                self.stats.lag_seconds.set(behind as f64 / 1000.0);
            }
            *backoff = self.opts.min_backoff;
        }
    }

    /// Persists the cursor after an acknowledged batch and lets the WAL before it go;
    /// counts and logs what of a backlog storage no longer held.
    async fn advance(&self, mut cursor: Cursor, batch: &Batch) -> Result<Cursor, ForwardError> {
        let finished_backlog = cursor.replay.is_some() && batch.next.replay.is_none();
        (cursor.wal, cursor.skip, cursor.replay) = (batch.next.wal, batch.next.skip, batch.next.replay);
        let file = CursorFile::new(self.db.dir(), &self.opts.upstream);
        let c = cursor.clone();
        tokio::task::spawn_blocking(move || {
            file.store(&c)?;
            if finished_backlog {
                remove_backlogs_but(&file, None);
            }
            Ok::<_, ForwardError>(())
        })
        .await
        .map_err(|e| self.fail(format!("storing the cursor: {e}")))??;
        if batch.lost > 0 {
            self.stats.budget_dropped_samples.inc_by(batch.lost);
            tracing::error!(
                upstream = %self.opts.upstream,
                samples = batch.lost,
                from_ms = batch.lost_range.0,
                to_ms = batch.lost_range.1,
                "forward: samples the upstream still needed were no longer held (deleted past retention and forward_max_disk, or in a damaged block): dropped for it"
            );
        }
        self.holds.set(&self.opts.upstream, cursor.wal);
        match cursor.replay {
            // Slices are read in time order, every entry's before the next: what is older
            // than the current slice is no longer needed from storage.
            Some(r) => self.holds.advance_backlog(&self.opts.upstream, r.slice),
            None if finished_backlog => self.holds.set_backlog(&self.opts.upstream, None),
            None => {}
        }
        Ok(cursor)
    }

    /// `fresh`, with a backlog of everything storage holds before the WAL: an upstream met
    /// for the first time, or back with new storage, gets all the edge still holds.
    async fn everything_from_storage(&self, fresh: Cursor) -> Result<Cursor, ForwardError> {
        let (db, file, upstream) =
            (self.db.clone(), CursorFile::new(self.db.dir(), &self.opts.upstream), self.opts.upstream.clone());
        let (c, unsendable) = (fresh.clone(), self.stats.unsendable_samples.clone());
        let stored = tokio::task::spawn_blocking(move || everything_backlog(&db, &file, &upstream, &unsendable, c))
            .await
            .map_err(|e| self.fail(format!("listing what storage holds: {e}")))??;
        let Some(stored) = stored else { return Err(self.fail("the backlog of everything was not stored")) };
        self.holds.set_backlog(&self.opts.upstream, Some((stored.oldest, self.opts.max_disk.unwrap_or(0))));
        let cursor = stored.cursor.clone();
        *self.stored.lock() = Some(stored);
        Ok(cursor)
    }
}

/// How a session ended without failing.
enum SessionEnd {
    Stopped,
    /// Start a new one at once (the session's series table outgrew the live series).
    Rotate,
}

/// A session's series table may hold this many more than the segments being read name.
const SESSION_SLACK: usize = 10_000;

/// A push in flight this long is retrying through an outage: the disk budget applies.
const STUCK_PUSH: Duration = Duration::from_secs(10);

/// Where the head checkpoint covers WAL segments the upstream behind `file` still needs:
/// notes what they hold after its cursor as a backlog read from storage (merged with the
/// rest of any backlog it had), and moves the persisted cursor past them. Returns the new
/// cursor and the oldest time its backlog needs; `None` when nothing needed moving.
/// How much of the WAL a conversion to a storage backlog takes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Until {
    /// The segments the head checkpoint covers, which are to go.
    Checkpoint,
    /// Everything written so far (an upstream far behind).
    Now,
}

fn backlog_from_storage(
    db: &Arc<Tsdb>,
    file: &CursorFile,
    upstream: &str,
    unsendable: &Counter,
    until: Until,
    history: bool,
) -> Result<Option<Stored>, ForwardError> {
    let Some(cursor) = file.load() else {
        // An upstream never reached has no cursor yet: it needs everything from the oldest
        // WAL segment on, or (with `history`) everything stored, blocks older than the WAL too.
        let start = Cursor { storage_id: String::new(), wal: oldest(db), skip: 0, replay: None };
        if !history {
            return backlog_from_wal(db, file, upstream, unsendable, until, start);
        }
        if until == Until::Checkpoint && db.wal_needed_from().is_none_or(|n| start.wal.segment >= n) {
            return Ok(None);
        }
        return everything_backlog(db, file, upstream, unsendable, start);
    };
    backlog_from_wal(db, file, upstream, unsendable, until, cursor)
}

/// Everything stored as the backlog of `start`'s upstream, then the WAL from where the
/// listing scanned it to.
fn everything_backlog(
    db: &Arc<Tsdb>,
    file: &CursorFile,
    upstream: &str,
    unsendable: &Counter,
    start: Cursor,
) -> Result<Option<Stored>, ForwardError> {
    let (backlog, scanned) = Backlog::everything(db, start.wal)
        .map_err(|reason| ForwardError::Backlog { upstream: upstream.to_string(), reason })?;
    note_unnamed(upstream, unsendable, scanned.unnamed);
    store_backlog(file, upstream, backlog, Cursor { wal: scanned.reached, ..start }, EVERYTHING)
}

fn note_unnamed(upstream: &str, unsendable: &Counter, unnamed: u64) {
    if unnamed > 0 {
        unsendable.inc_by(unnamed);
        tracing::warn!(upstream, samples = unnamed, "forward: samples of series the WAL does not name: not sent");
    }
}

/// The WAL from `cursor` on (to the checkpoint, or as far as it is written) as a backlog
/// read from storage, merged with the one the cursor is replaying.
fn backlog_from_wal(
    db: &Tsdb,
    file: &CursorFile,
    upstream: &str,
    unsendable: &Counter,
    until: Until,
    cursor: Cursor,
) -> Result<Option<Stored>, ForwardError> {
    let end = match until {
        Until::Checkpoint => {
            let Some(needed) = db.wal_needed_from() else { return Ok(None) };
            if cursor.wal.segment >= needed {
                return Ok(None);
            }
            WalCursor { segment: needed, offset: 0 }
        }
        // A record boundary: every record before it is in the head.
        Until::Now => db.wal_cursor(),
    };
    let (newer, scanned) = Backlog::scan_wal(db, cursor.wal, cursor.skip, end)
        .map_err(|source| ForwardError::Wal { upstream: upstream.to_string(), source })?;
    // Checkpointed segments are complete; the WAL being written is read as far as it is
    // on disk, and the cursor goes no further.
    let next_wal = if until == Until::Checkpoint { end } else { scanned.reached };
    note_unnamed(upstream, unsendable, scanned.unnamed);
    if newer.entries.is_empty() && cursor.replay.is_none() {
        // Nothing to send in those segments (labels only): the next batch moves past them.
        return Ok(None);
    }
    let backlog = match cursor.replay {
        None => newer,
        Some(at) => match Backlog::load(&file.backlog_path(at.generation)) {
            Ok(older) => older.rest_then(at, newer),
            Err(BacklogError::Io(e)) => {
                return Err(ForwardError::Backlog { upstream: upstream.to_string(), reason: e });
            }
            Err(BacklogError::Damaged(e)) => {
                tracing::error!(upstream, error = %e, "forward: the upstream's backlog file is damaged: what it listed is not sent");
                newer
            }
        },
    };
    let why = match until {
        Until::Checkpoint => {
            "forward: the WAL the upstream still needs was checkpointed: its backlog is sent from storage instead"
        }
        Until::Now => "forward: the upstream is far behind: its backlog is sent from storage, series by series",
    };
    store_backlog(file, upstream, backlog, Cursor { wal: next_wal, skip: 0, ..cursor }, why)
}

const EVERYTHING: &str = "forward: sending the upstream everything the edge holds, from storage, then the WAL";

/// Saves `backlog` and the cursor that replays it, then the WAL from `at.wal`.
fn store_backlog(
    file: &CursorFile,
    upstream: &str,
    backlog: Backlog,
    at: Cursor,
    why: &str,
) -> Result<Option<Stored>, ForwardError> {
    // A new file for the merged backlog: the cursor names the file its position is in,
    // so a crash before the cursor is stored leaves the old pair whole.
    let replay = ReplayAt::start(new_generation(at.replay));
    let path = file.backlog_path(replay.generation);
    backlog.save(&path).map_err(|source| ForwardError::Cursor { file: path.clone(), source })?;
    let next = Cursor { replay: Some(replay), ..at };
    file.store(&next)?;
    remove_backlogs_but(file, Some(replay.generation));
    let (samples, oldest, newest) = backlog.summary();
    tracing::info!(upstream, series = backlog.entries.len(), samples, from_ms = oldest, to_ms = newest, "{why}");
    Ok(Some(Stored { cursor: next, oldest, backlog }))
}

/// A backlog just stored, and the cursor that replays it: the session that reads it next
/// takes it as it is rather than reading the file back.
struct Stored {
    cursor: Cursor,
    oldest: i64,
    backlog: Backlog,
}

/// A backlog generation after `previous`'s (the clock, so one never meets an old file).
fn new_generation(previous: Option<ReplayAt>) -> u64 {
    let now = u64::try_from(strata_model::time::now_ms()).unwrap_or(0);
    now.max(previous.map_or(0, |p| p.generation.saturating_add(1)))
}

/// Removes the upstream's backlog files but the one of `keep`.
fn remove_backlogs_but(file: &CursorFile, keep: Option<u64>) {
    let Some(dir) = file.path().parent() else { return };
    let Some(stem) = file.path().file_name().and_then(|n| n.to_str()) else { return };
    let prefix = format!("{}.backlog.", stem.trim_end_matches(".cursor"));
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else { continue };
        if keep.is_some_and(|k| rest == k.to_string()) {
            continue;
        }
        if let Err(err) = std::fs::remove_file(e.path()) {
            tracing::warn!(file = %e.path().display(), error = %err, "forward: removing an old backlog file failed");
        }
    }
}

/// `labels` with each external label it lacks (Prometheus' remote write: the series' own
/// value wins).
fn add_missing(labels: &Labels, external: &Labels) -> Labels {
    if external.iter().all(|l| labels.get(&l.name).is_some()) {
        return labels.clone();
    }
    let mut b = labels.to_builder();
    for l in external.iter() {
        if labels.get(&l.name).is_none() {
            b.set(&l.name, &l.value);
        }
    }
    b.build()
}

/// A session's name: unique enough that two sessions of one edge never share one.
fn session_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{:016x}-{n}", h.finish())
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

/// A position a batch ends at: [`Cursor`] without the storage identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct At {
    wal: WalCursor,
    skip: u64,
    replay: Option<ReplayAt>,
}

impl At {
    fn of(c: &Cursor) -> At {
        At { wal: c.wal, skip: c.skip, replay: c.replay }
    }
}

/// A batch read from the WAL or a backlog, and the position after it.
struct Batch {
    request: pb::PushRequest,
    next: At,
    samples: u64,
    oldest: i64,
    newest: i64,
    unknown: u64,
    /// Samples of a backlog storage no longer held, and their entries' range.
    lost: u64,
    lost_range: (i64, i64),
    /// The samples went as chunks.
    chunks: bool,
}

/// Why a batch could not be read.
enum ReadError {
    Wal(wal::WalError),
    Storage(strata_store::StoreError),
}

impl From<wal::WalError> for ReadError {
    fn from(e: wal::WalError) -> Self {
        ReadError::Wal(e)
    }
}

impl ReadError {
    fn into_forward(self, upstream: &str) -> ForwardError {
        match self {
            ReadError::Wal(source) => ForwardError::Wal { upstream: upstream.to_string(), source },
            ReadError::Storage(e) => ForwardError::Backlog { upstream: upstream.to_string(), reason: e.to_string() },
        }
    }
}

/// A samples record partly sent: it starts at `start`, ends at `end`.
struct Partial {
    start: WalCursor,
    end: WalCursor,
    samples: Vec<(SeriesRef, Sample)>,
    taken: usize,
}

/// A batch's encoded size is kept under this (the gRPC limit is twice it), counting labels
/// and metadata as well as samples.
const MAX_BATCH_BYTES: usize = 8 << 20;

/// The backlog a session replays: just stored, or in its file.
enum BacklogAt {
    Here(Backlog),
    File(std::path::PathBuf),
}

/// Reads batches from a backlog in storage, if there is one, then from the WAL. Every segment names each reference its samples use before
/// them (see `Tsdb::commit`), so labels are resolved from the segment being read, never
/// from the head, which may have dropped the series or, after a restart, given its
/// reference to another.
struct WalSource {
    reader: WalReader,
    /// The labels the current segment named, and that segment.
    labels: HashMap<SeriesRef, Labels>,
    /// How many series the previous segment named (the current one is still being read).
    previous_segment_series: usize,
    /// The session number of each of the segment's references (`None`: the upstream
    /// would refuse the series), so a reference is resolved once per segment.
    resolved: HashMap<SeriesRef, Option<u64>>,
    /// The session's series: their numbers by labels (as sent), and whether each was sent
    /// with its labels yet (by number - 1).
    session: HashMap<Labels, u64>,
    named: Vec<(Labels, bool)>,
    segment: u32,
    partial: Option<Partial>,
    /// Samples of the record at `resume` sent before (a record larger than a batch).
    skip: u64,
    resume: WalCursor,
    at: At,
    /// The backlog sent before the WAL.
    replay: Option<BacklogReader>,
    /// The upstream takes chunks: the backlog goes as chunks.
    chunks: bool,
    /// The metric families' metadata, sent with the backlog's first batches: the WAL
    /// records that carried it are not read again.
    backlog_metadata: Vec<(String, strata_model::Metadata)>,
}

impl WalSource {
    fn new(db: Arc<Tsdb>, c: &Cursor, backlog: Option<BacklogAt>) -> Result<WalSource, ReadError> {
        // Resuming mid-segment: the labels named before the cursor.
        let labels = labels_before(&db, c.wal)?;
        let mut at = At::of(c);
        let loaded = backlog.map(|b| match b {
            BacklogAt::Here(b) => Ok(b),
            BacklogAt::File(path) => Backlog::load(&path),
        });
        let replay = match (c.replay, loaded) {
            (Some(r), Some(loaded)) => match loaded {
                Ok(b) => Some(BacklogReader::new(db.clone(), b, r)),
                Err(BacklogError::Io(e)) => return Err(ReadError::Storage(strata_store::StoreError::Unavailable(e))),
                Err(BacklogError::Damaged(e)) => {
                    tracing::error!(error = %e, "forward: a backlog file is damaged: what it listed is not sent");
                    at.replay = None;
                    None
                }
            },
            _ => {
                at.replay = None;
                None
            }
        };
        Ok(WalSource {
            reader: WalReader::new(&db.wal_dir(), c.wal),
            labels,
            previous_segment_series: 0,
            resolved: HashMap::default(),
            session: HashMap::default(),
            named: Vec::new(),
            segment: c.wal.segment,
            partial: None,
            skip: c.skip,
            resume: c.wal,
            backlog_metadata: if replay.is_some() { db.head().all_metadata() } else { Vec::new() },
            at,
            replay,
            chunks: false,
        })
    }

    /// The session number of the segment's reference `r` (assigned the first time its
    /// labels are met in the session); `None` when the segment does not name it, or the
    /// upstream would refuse its labels (logged).
    fn resolve(&mut self, r: SeriesRef, external: &(Labels, bool)) -> Option<u64> {
        let labels = self.labels.get(&r)?.clone();
        self.resolve_labels(&labels, external)
    }

    /// The session number of a series with these labels (as stored, before external labels).
    fn resolve_labels(&mut self, labels: &Labels, external: &(Labels, bool)) -> Option<u64> {
        let labels = if external.1 {
            add_missing(labels, &external.0)
        } else {
            // Labelled as the edge's StoreAPI serves the series, so the global merges the
            // edge's copy and the regional's as one.
            attach_external(labels, &external.0)
        };
        if let Some(&id) = self.session.get(&labels) {
            return Some(id);
        }
        let label_bytes: usize = labels.iter().map(|l| l.name.len() + l.value.len()).sum();
        if labels.len() > MAX_LABELS || label_bytes > MAX_LABEL_BYTES {
            tracing::warn!(
                series = %labels,
                "forward: a series with more labels or label bytes than the upstream takes: its samples are not sent"
            );
            return None;
        }
        let id = self.named.len() as u64 + 1;
        self.named.push((labels.clone(), false));
        self.session.insert(labels, id);
        Some(id)
    }

    /// Whether the session's series outnumber twice what the segment being read or the one
    /// before named (plus slack): series that churned away still hold their numbers and
    /// labels. (The segment being read may have named only a few so far.)
    fn outgrown(&self) -> bool {
        if self.replay.is_some() {
            // A backlog names the series it sends, none of which the WAL names yet.
            return false;
        }
        let live = self.labels.len().max(self.previous_segment_series);
        self.named.len() > live.saturating_mul(2).saturating_add(SESSION_SLACK)
    }

    /// Labels the first time the session sends series `id`, then its number alone; adds
    /// their size to `bytes`.
    fn series_entry(&mut self, id: u64, bytes: &mut usize) -> pb::ForwardSeries {
        let slot = usize::try_from(id - 1).unwrap_or(usize::MAX);
        let labels = match self.named.get_mut(slot) {
            Some((l, sent)) if !*sent => {
                *sent = true;
                *bytes += l.iter().map(|x| x.name.len() + x.value.len() + 8).sum::<usize>();
                labels_to_pb(l)
            }
            _ => Vec::new(),
        };
        *bytes += 12;
        pb::ForwardSeries { labels, r#ref: id, ..Default::default() }
    }

    /// A batch of the backlog; once it is read, the position moves on to the WAL.
    fn backlog_batch(&mut self, limit: usize, external: &(Labels, bool)) -> Result<Batch, ReadError> {
        let mut req = pb::PushRequest::default();
        let mut index: HashMap<u64, usize> = HashMap::default();
        // Each series' samples, encoded as chunks once the batch is complete.
        let mut samples: Vec<Vec<Sample>> = Vec::new();
        // Chunks take about 2 bytes a sample on scraped data, samples 17.
        let per_sample = if self.chunks { 4 } else { 17 };
        let (mut n, mut bytes, mut oldest, mut newest, mut unknown) = (0usize, 0usize, i64::MAX, i64::MIN, 0u64);
        let (mut lost, mut lost_range) = (0u64, (i64::MAX, i64::MIN));
        self.take_backlog_metadata(&mut req, &mut bytes);
        while n < limit && bytes < MAX_BATCH_BYTES && req.series.len() < MAX_BATCH_SERIES {
            let Some(reader) = self.replay.as_mut() else { break };
            let Some(piece) = reader.next_piece(limit - n).map_err(ReadError::Storage)? else { break };
            if piece.lost > 0 {
                lost += piece.lost;
                lost_range = (lost_range.0.min(piece.range.0), lost_range.1.max(piece.range.1));
            }
            if piece.samples.is_empty() {
                continue;
            }
            let Some(id) = self.resolve_labels(&piece.labels, external) else {
                unknown += piece.samples.len() as u64;
                continue;
            };
            // A series once per batch (a receiver resolves its number once): its pieces of
            // later slices join the earlier ones, in time order.
            let i = match index.get(&id) {
                Some(&i) => i,
                None => {
                    let fs = self.series_entry(id, &mut bytes);
                    req.series.push(fs);
                    samples.push(Vec::new());
                    index.insert(id, req.series.len() - 1);
                    req.series.len() - 1
                }
            };
            n += piece.samples.len();
            bytes += per_sample * piece.samples.len();
            oldest = oldest.min(piece.samples[0].t);
            newest = newest.max(piece.samples[piece.samples.len() - 1].t);
            if samples[i].is_empty() {
                samples[i] = piece.samples;
            } else {
                samples[i].extend(piece.samples);
            }
        }
        for (fs, s) in req.series.iter_mut().zip(samples) {
            if self.chunks {
                fs.chunks = Chunk::encode_sealed(&s).iter().map(chunk_to_pb).collect();
            } else {
                fs.timestamps = s.iter().map(|x| x.t).collect();
                fs.values = s.iter().map(|x| x.v.to_bits()).collect();
            }
        }
        match &self.replay {
            Some(r) if !r.is_done() => self.at.replay = Some(r.at()),
            _ => {
                self.replay = None;
                self.at.replay = None;
            }
        }
        let chunks = self.chunks && n > 0;
        Ok(Batch { request: req, next: self.at, samples: n as u64, oldest, newest, unknown, lost, lost_range, chunks })
    }

    /// The backlog's metadata not sent yet, as much as a batch takes.
    fn take_backlog_metadata(&mut self, req: &mut pb::PushRequest, bytes: &mut usize) {
        let mut take = 0;
        for (family, meta) in &self.backlog_metadata {
            if take >= MAX_BATCH_METADATA || *bytes >= MAX_BATCH_BYTES / 2 {
                break;
            }
            *bytes += family.len() + meta.help.len() + meta.unit.len() + 8;
            req.metadata.push(metadata_to_pb(family, meta));
            take += 1;
        }
        self.backlog_metadata.drain(..take);
    }

    fn next_batch(&mut self, limit: usize, external: &(Labels, bool)) -> Result<Batch, ReadError> {
        if self.replay.is_some() {
            return self.backlog_batch(limit, external);
        }
        let mut req = pb::PushRequest::default();
        // A session number's series in the batch: references with the same labels (a
        // series restored under another reference after a restart) share one.
        let mut index: HashMap<u64, usize> = HashMap::default();
        let (mut n, mut bytes, mut oldest, mut newest, mut unknown) = (0usize, 0usize, i64::MAX, i64::MIN, 0u64);
        self.take_backlog_metadata(&mut req, &mut bytes);
        loop {
            if let Some(mut p) = self.partial.take() {
                while p.taken < p.samples.len() && n < limit && bytes < MAX_BATCH_BYTES {
                    let (r, s) = p.samples[p.taken];
                    let id = match self.resolved.get(&r) {
                        Some(&id) => id,
                        None => {
                            let id = self.resolve(r, external);
                            self.resolved.insert(r, id);
                            id
                        }
                    };
                    let Some(id) = id else {
                        unknown += 1;
                        p.taken += 1;
                        continue;
                    };
                    let i = match index.get(&id) {
                        Some(&i) => i,
                        None if req.series.len() >= MAX_BATCH_SERIES => break,
                        None => {
                            let fs = self.series_entry(id, &mut bytes);
                            req.series.push(fs);
                            index.insert(id, req.series.len() - 1);
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
                    bytes += 17;
                    oldest = oldest.min(s.t);
                    newest = newest.max(s.t);
                }
                if p.taken < p.samples.len() {
                    self.at = At { wal: p.start, skip: p.taken as u64, replay: None };
                    self.partial = Some(p);
                    break;
                }
                self.at = At { wal: p.end, skip: 0, replay: None };
                continue;
            }
            if n >= limit || bytes >= MAX_BATCH_BYTES || req.metadata.len() >= MAX_BATCH_METADATA {
                break;
            }
            let before = self.reader.cursor();
            let Some((rec, after)) = self.reader.next_record()? else { break };
            if after.segment != self.segment {
                // A new segment names its references anew (after a restart they may mean
                // other series).
                self.previous_segment_series = self.labels.len();
                self.labels.clear();
                self.resolved.clear();
                self.segment = after.segment;
            }
            match rec {
                WalRecord::Series { series_ref, labels } => {
                    self.labels.insert(series_ref, labels);
                    self.at = At { wal: after, skip: 0, replay: None };
                }
                WalRecord::Metadata { family, meta } => {
                    bytes += family.len() + meta.help.len() + meta.unit.len() + 16;
                    req.metadata.push(metadata_to_pb(&family, &meta));
                    self.at = At { wal: after, skip: 0, replay: None };
                }
                WalRecord::Samples(samples) => {
                    let start = if before.segment == after.segment {
                        before
                    } else {
                        WalCursor { segment: after.segment, offset: 0 }
                    };
                    // Only the record the cursor names was partly sent before.
                    let skip = if start == self.resume { std::mem::take(&mut self.skip) } else { 0 };
                    let taken = usize::try_from(skip).unwrap_or(usize::MAX).min(samples.len());
                    self.partial = Some(Partial { start, end: after, samples, taken });
                }
            }
        }
        Ok(Batch {
            request: req,
            next: self.at,
            samples: n as u64,
            oldest,
            newest,
            unknown,
            lost: 0,
            lost_range: (i64::MAX, i64::MIN),
            chunks: false,
        })
    }
}

#[cfg(test)]
mod session_tests {
    use super::*;

    /// A session whose series table holds many more series than the segment being read
    /// names (series that churned away) is due for a new session, which forgets them.
    #[test]
    fn a_session_outgrown_by_churned_series_is_due_for_rotation() {
        let d = tempfile::tempdir().unwrap();
        let db = Tsdb::open(d.path(), Default::default()).unwrap();
        let c = Cursor { storage_id: String::new(), wal: WalCursor { segment: 0, offset: 0 }, skip: 0, replay: None };
        let Ok(mut src) = WalSource::new(Arc::new(db), &c, None) else { panic!("opening the WAL") };
        let external = Labels::default();
        for i in 0..6_000u64 {
            let l = Labels::from_pairs([("__name__", "x"), ("i", &i.to_string())]);
            src.labels.insert(i, l);
            assert!(src.resolve(i, &(external.clone(), false)).is_some());
        }
        assert!(!src.outgrown(), "live series alone never rotate a session");
        // A new segment has named only a few so far: the previous one's count stands.
        src.previous_segment_series = src.labels.len();
        src.labels.retain(|r, _| *r < 10);
        assert!(!src.outgrown(), "a segment switch alone rotates the session");
        // The segment moves on and names only 100 of them; the rest churned away.
        src.previous_segment_series = 100;
        src.labels.retain(|r, _| *r < 100);
        for i in 6_000..20_000u64 {
            src.labels.insert(i, Labels::from_pairs([("__name__", "y"), ("i", &i.to_string())]));
            src.resolve(i, &(external.clone(), false));
            src.labels.remove(&i);
        }
        assert!(src.outgrown());
    }
}
