//! The edge's side: one [`Forwarder`] per upstream reads the WAL from its cursor and sends
//! it in batches, persisting the cursor after each acknowledgement.

use crate::backlog::Backlog;
use crate::conversion::{backlog_from_storage, everything_backlog, remove_backlogs_but, Stored, Until};
use crate::source::{At, BacklogAt, Batch, ReadError, WalSource};
use crate::upstream::{BatchCompression, GrpcUpstream, PushError, Upstream, UpstreamSession};
use crate::{Cursor, CursorFile, ForwardError, ForwarderStats, WalHolds, MAX_BATCH_SAMPLES};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_grpc::ClientTlsConfig;
use strata_model::Labels;
use strata_tsdb::db::Tsdb;
use strata_tsdb::wal::{self, WalCursor};
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct ForwarderOptions {
    /// The upstream's name in logs, metrics and the cursor's file name (its address).
    pub upstream: String,
    /// For [`Forwarder::new`]'s gRPC upstream: `http://host:port`, or `https://` with `tls`.
    pub endpoint: String,
    pub tls: Option<ClientTlsConfig>,
    /// For the gRPC upstream: how batches are compressed.
    pub compression: BatchCompression,
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
    /// Batches pushed before the first of them is acknowledged, when the upstream stores
    /// a session's batches in order (a regional says how many it takes).
    pub max_in_flight: usize,
}

impl ForwarderOptions {
    pub fn new(upstream: &str) -> ForwarderOptions {
        let endpoint = if upstream.contains("://") { upstream.to_string() } else { format!("http://{upstream}") };
        ForwarderOptions {
            upstream: upstream.to_string(),
            endpoint,
            tls: None,
            compression: BatchCompression::default(),
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
            max_in_flight: 2,
        }
    }
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
    /// Samples of the backlog from storage not acknowledged yet (at least 1 while it is
    /// replayed, whatever its counts), so that pending never reads 0 before it is done.
    backlog_left: AtomicU64,
}

/// What a sample of a backlog from storage counts for in `pending_bytes`: about what it
/// takes in blocks.
const BACKLOG_BYTES_PER_SAMPLE: u64 = 2;

impl Forwarder<GrpcUpstream> {
    /// A forwarder to the regional at `opts.endpoint`, counting into `stats` (from
    /// [`crate::ForwardMetrics::upstream`], or a default of its own).
    pub fn new(db: Arc<Tsdb>, holds: Arc<WalHolds>, opts: ForwarderOptions, stats: ForwarderStats) -> Forwarder {
        let upstream = GrpcUpstream {
            endpoint: opts.endpoint.clone(),
            tls: opts.tls.clone(),
            compression: opts.compression,
            timeout: opts.timeout,
            external_labels: opts.external_labels.clone(),
            max_in_flight: opts.max_in_flight,
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
        let mut backlog_left = 0;
        if loaded.as_ref().is_some_and(|c| c.replay.is_some()) {
            let summary = loaded
                .as_ref()
                .and_then(|c| c.replay)
                .and_then(|r| Backlog::load(&cursor_file.backlog_path(r.generation)).ok().map(|b| (r, b)))
                // What is left of it from the position, and its oldest.
                .map(|(r, b)| (b.clone().rest_then(r, Backlog::default()).summary().0, b.summary().1));
            backlog_left = summary.map_or(0, |s| s.0).max(1);
            holds.set_backlog(&opts.upstream, Some((summary.map_or(i64::MIN, |s| s.1), opts.max_disk.unwrap_or(0))));
        }
        // What is pending shows from the start: a 0 before the first session would read
        // as "caught up".
        let pending = pending_bytes(&db, held).saturating_add(backlog_left.saturating_mul(BACKLOG_BYTES_PER_SAMPLE));
        stats.pending_bytes.set(i64::try_from(pending).unwrap_or(i64::MAX));
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
            backlog_left: AtomicU64::new(backlog_left),
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
        self.backlog_left.store(stored.backlog.summary().0.max(1), Ordering::Relaxed);
        *self.stored.lock() = Some(stored);
        Ok(true)
    }

    /// Pending bytes and lag while the upstream cannot be reached: from the persisted
    /// cursor and the newest sample acknowledged.
    fn note_pending(&self) {
        let at = self.cursor_file.load().map_or_else(|| oldest(&self.db), |c| c.wal);
        let pending = self.pending(at);
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
        let pending = self.pending(acked);
        self.stats.pending_bytes.set(i64::try_from(pending).unwrap_or(i64::MAX));
        let newest = self.newest_acked.load(std::sync::atomic::Ordering::Relaxed);
        let since = if newest > i64::MIN { newest } else { batch_oldest };
        if since < i64::MAX {
            let behind = strata_model::time::now_ms().saturating_sub(since).max(0);
            self.stats.lag_seconds.set(behind as f64 / 1000.0);
        }
    }

    /// WAL bytes after `wal`, and what is left of a backlog from storage.
    fn pending(&self, wal: WalCursor) -> u64 {
        let left = self.backlog_left.load(Ordering::Relaxed);
        pending_bytes(&self.db, wal).saturating_add(left.saturating_mul(BACKLOG_BYTES_PER_SAMPLE))
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
            self.backlog_left.store(0, Ordering::Relaxed);
        }
        let backlog = cursor.replay.map(|r| {
            let kept =
                self.stored.lock().take().filter(|s| s.cursor.replay.map(|x| x.generation) == Some(r.generation));
            match kept {
                Some(s) => BacklogAt::Here(s.backlog, s.labels_before),
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
            s.open_chunks = hello.takes_open_chunks;
        }
        // Series numbers are the session's: a new session (this one) names every series
        // again with its labels.
        let session = session_id();
        let upstream = self.opts.external_labels.to_string();
        let mut prefetched: Option<tokio::task::JoinHandle<(WalSource, Result<Batch, ReadError>)>> = None;
        // Batches pushed and not yet acknowledged, oldest first. An upstream that stores a
        // session's batches in order takes more than one (see `Greeting::max_in_flight`);
        // acknowledgements then come in that order, and the cursor moves past each.
        let depth = usize::try_from(hello.max_in_flight).unwrap_or(1).clamp(1, self.opts.max_in_flight.max(1));
        let mut in_flight: std::collections::VecDeque<InFlight> = std::collections::VecDeque::new();
        // The last read found nothing to send: the next waits until what is in flight is
        // acknowledged (then, if it finds nothing again, the poll interval).
        let mut drained = false;
        let mut seq = 0u64;
        loop {
            // Stopping, what is in flight is waited for: its acknowledgements are kept, so
            // the next start sends none of it again.
            let stopping = *stop.borrow();
            if stopping && in_flight.is_empty() {
                return Ok(SessionEnd::Stopped);
            }
            // Moving the backlog to storage moves the persisted cursor: a new session
            // starts from it (what is in flight is abandoned; acknowledged or not, it is
            // sent again from there, and the upstream ignores what it holds already).
            let checkpointed = self.db.wal_needed_from().is_some_and(|n| n > cursor.wal.segment);
            if checkpointed && self.take_backlog_from_storage(Until::Checkpoint).await? {
                return Ok(SessionEnd::Rotate);
            }
            if in_flight.is_empty() {
                drained = false;
            }
            if in_flight.len() < depth && !drained && !stopping {
                // The batch read while the previous one was in flight, or one read now.
                let (mut src, read) = match prefetched.take() {
                    Some(h) => h.await.map_err(|e| self.fail(format!("reading the WAL: {e}")))?,
                    None => {
                        let Some(mut src) = source.take() else { return Err(self.fail("lost the WAL reader")) };
                        if src.outgrown() {
                            if !in_flight.is_empty() {
                                // Rotated once what is in flight is acknowledged.
                                source = Some(src);
                                drained = true;
                                continue;
                            }
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
                self.stats.pending_bytes.set(i64::try_from(self.pending(cursor.wal)).unwrap_or(i64::MAX));
                if !more {
                    if !in_flight.is_empty() {
                        // Records that carry nothing to send (labels), or backlog storage no
                        // longer holds: passed once what is before them is acknowledged.
                        in_flight.push_back(InFlight { batch, push: None, pushed_at: std::time::Instant::now() });
                        drained = true;
                        continue;
                    }
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
                request.upstream = upstream.clone();
                request.complete_until = batch.complete_until;
                if depth > 1 {
                    seq += 1;
                    request.seq = seq;
                }
                self.stats.batches_sent.inc();
                self.stats.sent_bytes.inc_by(prost::Message::encoded_len(&request) as u64);
                // Its own task, so that it goes on while an earlier one is awaited; aborted
                // when the session ends.
                let push = PushTask(tokio::spawn(client.push(request)));
                in_flight.push_back(InFlight { batch, push: Some(push), pushed_at: std::time::Instant::now() });
                continue;
            }
            let Some(InFlight { batch, push, pushed_at }) = in_flight.pop_front() else {
                return Err(self.fail("nothing in flight to wait for"));
            };
            let Some(mut push) = push else {
                if batch.next != At::of(&cursor) {
                    cursor = self.advance(cursor, &batch).await?;
                }
                continue;
            };
            // A push may take long (a remote write retries inside it through an outage):
            // meanwhile lag and pending go on growing in /metrics.
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            let result = loop {
                tokio::select! {
                    r = &mut push.0 => break r.unwrap_or_else(|e| Err(PushError::Failed(format!("the push's task failed: {e}")))),
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
                    if depth > 1 {
                        // An upstream that orders a session's batches fails those after
                        // a refused one: a new session sends them (and the next) again.
                        return Ok(SessionEnd::Rotate);
                    }
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
        if cursor.replay.is_some() {
            let left = self.backlog_left.load(Ordering::Relaxed);
            self.backlog_left.store(left.saturating_sub(batch.samples).max(1), Ordering::Relaxed);
        } else {
            self.backlog_left.store(0, Ordering::Relaxed);
        }
        self.stats.pending_bytes.set(i64::try_from(self.pending(cursor.wal)).unwrap_or(i64::MAX));
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
        self.backlog_left.store(stored.backlog.summary().0.max(1), Ordering::Relaxed);
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

/// A batch pushed and not acknowledged yet; without a push, records that carry nothing to
/// send, passed once the batches before them are acknowledged.
struct InFlight {
    batch: Batch,
    push: Option<PushTask>,
    pushed_at: std::time::Instant,
}

/// A push's task, aborted when dropped (its session ended).
struct PushTask(tokio::task::JoinHandle<Result<crate::upstream::PushAck, PushError>>);

impl Drop for PushTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A push in flight this long is retrying through an outage: the disk budget applies.
const STUCK_PUSH: Duration = Duration::from_secs(10);

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
pub(crate) fn oldest(db: &Tsdb) -> WalCursor {
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
