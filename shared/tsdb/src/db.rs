//! `Tsdb`: the head block made durable by the WAL and the head checkpoint, the immutable
//! blocks the head's aged data is cut into (`compact`), retention, and the append policy.
//! Where the head ends and the blocks begin is `floor`'s one invariant; `checkpoint` says
//! what lets the WAL go.
//!
//! Append policy (documented for users in the README):
//! * per series, samples must arrive in time order: an older timestamp is refused as
//!   "out of order"; the same timestamp with a different value as "duplicate sample for
//!   timestamp"; a sample identical (timestamp and value) to one already stored is accepted
//!   and ignored, so a retried write is harmless;
//! * a sample older than `newest sample held − retention` is refused as "out of bounds",
//!   where the newest sample counts only up to the wall clock;
//! * a sample more than `future_grace_period` (10 minutes) ahead of the wall clock is
//!   refused as "too far in the future": it would otherwise become the newest sample and
//!   push the retention window past everything held. WAL replay skips such samples too, so
//!   a WAL written before this rule cannot poison a restart;
//! * a sample older than the end of the newest block on disk is refused as "out of
//!   bounds": that range is immutable;
//! * an empty database accepts any timestamp, so a day of history can be backfilled in
//!   time order.
//!
//! Every append is logged to the WAL before it is applied in memory and before the call
//! returns; a refused sample is neither logged nor applied.

use crate::blocks::BlockSet;
use crate::head::{HeadBlock, HeadError, HeadStats, MemSeries, SampleError};
use crate::index::SeriesRef;
use crate::metrics::TsdbMetrics;
use crate::wal::{self, SyncPolicy, Wal, WalError, WalRecord};
use floor::HeadFloor;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_model::time::now_ms;
use strata_model::{Labels, Metadata, Sample};

/// How far ahead of the wall clock a sample may be, by default (as Mimir's
/// `creation_grace_period`).
pub const DEFAULT_FUTURE_GRACE_PERIOD: Duration = Duration::from_secs(600);
/// Prometheus' minimum block duration.
pub const DEFAULT_BLOCK_RANGE: Duration = Duration::from_secs(2 * 3600);

#[derive(Debug, Clone)]
pub struct TsdbOptions {
    pub retention: Duration,
    /// How far ahead of the wall clock a sample may be stamped.
    pub future_grace_period: Duration,
    pub max_series: usize,
    pub wal_sync: SyncPolicy,
    pub wal_segment_bytes: u64,
    /// The head's data is cut into blocks of this range (Prometheus' 2 h), once the head
    /// spans one and a half of them; compaction merges them into 3× and 12× ranges.
    pub block_range: Duration,
    /// Oldest blocks are deleted while blocks and WAL together exceed this many bytes
    /// (Prometheus' `--storage.tsdb.retention.size`); `None`: no size limit.
    pub retention_size: Option<u64>,
    /// Bytes of block chunks kept in memory for queries (see `strata_block::cache`).
    pub block_cache_bytes: usize,
    /// Log each series' labels once per WAL segment (not only once): a reader of the WAL
    /// that starts in any segment (a forwarder) then resolves every reference from the
    /// segment itself. Costs the active series' labels once per segment.
    pub wal_labels_per_segment: bool,
}

impl Default for TsdbOptions {
    fn default() -> Self {
        TsdbOptions {
            retention: Duration::from_secs(24 * 3600),
            future_grace_period: DEFAULT_FUTURE_GRACE_PERIOD,
            max_series: 5_000_000,
            wal_sync: SyncPolicy::default(),
            wal_segment_bytes: wal::DEFAULT_SEGMENT_BYTES,
            block_range: DEFAULT_BLOCK_RANGE,
            retention_size: None,
            block_cache_bytes: strata_block::cache::DEFAULT_CACHE_BYTES,
            wal_labels_per_segment: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TsdbError {
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error(transparent)]
    Head(#[from] HeadError),
    #[error(transparent)]
    Block(#[from] strata_block::BlockError),
    #[error("the database is stopping")]
    Stopping,
    #[error("the data directory {dir} is in use by another process (it holds {dir}/lock)")]
    Locked { dir: PathBuf },
    #[error("internal error: {0}")]
    Internal(String),
}

/// What happened to a batch of samples.
#[derive(Debug, Default)]
pub struct CommitOutcome {
    pub appended: usize,
    /// Exact duplicates of stored samples, accepted and ignored.
    pub ignored_duplicates: usize,
    pub rejected: Vec<(SeriesRef, Sample, SampleError)>,
}

impl CommitOutcome {
    fn merge(&mut self, o: CommitOutcome) {
        self.appended += o.appended;
        self.ignored_duplicates += o.ignored_duplicates;
        self.rejected.extend(o.rejected);
    }
}

/// The WAL writer and the scratch space of [`Tsdb::commit`], which the WAL lock serialises.
struct Writer {
    wal: Wal,
    /// Newest accepted sample per series within the batch being committed.
    pending: HashMap<SeriesRef, Sample, foldhash::fast::RandomState>,
    /// Each commit's oldest sample, for a forwarder's watermark.
    times: crate::wal_times::WalTimes,
}

pub struct Tsdb {
    head: HeadBlock,
    pub(crate) blocks: BlockSet,
    /// Where the head ends and the blocks begin (see [`floor`]).
    pub(crate) floor: HeadFloor,
    /// Held by a maintenance run (cut, compaction, retention, checkpoint): one at a time,
    /// and a stop waits for the one running.
    pub(crate) maintenance: Mutex<()>,
    /// Set by [`shutdown`](Self::shutdown): maintenance stops, a running cut gives up.
    stopping: AtomicBool,
    /// The WAL cursor of the newest head checkpoint.
    pub(crate) checkpoint_at: Mutex<Option<wal::WalCursor>>,
    /// Blocks past retention kept for a forward upstream still behind: those ending after
    /// the time, newest first, up to the bytes ([`hold_blocks`](Tsdb::hold_blocks)).
    pub(crate) block_hold: Mutex<Option<(i64, u64)>>,
    /// The durable floor the newest checkpoint recorded: a higher floor now means a block
    /// was cut since (`i64::MIN`: no checkpoint).
    pub(crate) checkpoint_floor: AtomicI64,
    /// The last block cut, compaction or retention failed: the tier reports itself not ready.
    pub(crate) maintenance_failed: AtomicBool,
    /// This start loaded a head checkpoint (and replayed only the WAL after it).
    from_checkpoint: bool,
    /// Readers hold it shared while they list blocks and read the head; a cut (block in,
    /// head range out) and a compaction (merged block in, sources out) hold it exclusively,
    /// so a query never sees a range twice or not at all.
    pub(crate) layout: parking_lot::RwLock<()>,
    wal: Mutex<Writer>,
    dir: PathBuf,
    opts: TsdbOptions,
    metrics: TsdbMetrics,
    /// The last WAL write failed: nothing is accepted until one succeeds, and the tier
    /// reports itself not ready.
    wal_failed: AtomicBool,
    /// `<data>/lock`, locked while this database is open: one process per directory.
    _lock: std::fs::File,
    /// Tests: called at named points of a commit and a cut, to interleave them.
    #[cfg(test)]
    pub(crate) hook: Mutex<Option<TestHook>>,
    /// Tests: a WAL file swapped in after a batch's first slice (a disk that fills mid-request).
    #[cfg(test)]
    pub(crate) wal_file_after_first_slice: Mutex<Option<Arc<std::fs::File>>>,
}

/// Tests: a function called at named points (see [`Tsdb::at`]).
#[cfg(test)]
pub(crate) type TestHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Samples per WAL record at most.
const MAX_SAMPLES_PER_RECORD: usize = 1 << 20;
/// Samples committed under one hold of the WAL lock (about 10 ms of work).
const COMMIT_SLICE: usize = 16_384;

/// How a batch is committed: in slices that let waiting writers in, or whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slicing {
    Sliced,
    /// Whole, its series all different (no repeats to track).
    Distinct,
    /// Whole, series may repeat.
    Whole,
}

impl Tsdb {
    /// Opens (or creates) the database in `dir`: loads the head checkpoint, then replays the
    /// WAL after it.
    pub fn open(dir: &Path, opts: TsdbOptions) -> Result<Tsdb, TsdbError> {
        let wal_dir = dir.join("wal");
        let lock = lock_dir(dir)?;
        let blocks = BlockSet::open(dir, opts.block_cache_bytes)?;
        // A damaged checkpoint is moved aside and logged: whatever the WAL holds is replayed.
        let (head, from, checkpoint_floor) =
            match checkpoint::load(dir, opts.max_series, duration_ms(opts.block_range).max(1))? {
                Some(l) => (l.head, Some(l.cursor), l.floor),
                None => (HeadBlock::new(opts.max_series), None, i64::MIN),
            };
        // Samples before the newest block's end are in blocks: replay skips them.
        let floor = blocks.max_time().max(checkpoint_floor);
        let range = duration_ms(opts.block_range);
        let mut in_blocks = 0u64;
        let mut unknown_refs = 0u64;
        let mut future = 0u64;
        let mut aliases: HashMap<SeriesRef, SeriesRef> = HashMap::new();
        let max_valid = now_ms().saturating_add(duration_ms(opts.future_grace_period));
        let stats = wal::replay_from(&wal_dir, from, |rec| {
            match adopt_replayed(&head, &aliases, rec, floor, max_valid, range) {
                None => {}
                Some(WalRecord::Chunk { .. }) => {}
                Some(WalRecord::Series { series_ref, labels }) => {
                    let s = head.restore(series_ref, &labels);
                    if s.series_ref != series_ref {
                        aliases.insert(series_ref, s.series_ref);
                    } else {
                        aliases.remove(&series_ref);
                    }
                }
                Some(WalRecord::Samples(samples)) => {
                    for (r, s) in samples {
                        let r = aliases.get(&r).copied().unwrap_or(r);
                        let Some(series) = head.series(r) else {
                            unknown_refs += 1;
                            continue;
                        };
                        if s.t > max_valid {
                            future += 1;
                            continue;
                        }
                        if s.t < floor {
                            in_blocks += 1;
                            continue;
                        }
                        let mut g = series.samples.lock();
                        // A series appends in time order, so what is not newer than its last
                        // sample it holds already: a record the checkpoint covered, or a
                        // segment repeated after a crash.
                        if g.last().is_none_or(|l| s.t > l.t) {
                            g.append(s, range);
                            head.note_time(s.t);
                        }
                    }
                }
                Some(WalRecord::Metadata { family, meta }) => {
                    head.set_metadata(&family, meta);
                }
            }
        })?;
        if unknown_refs > 0 {
            tracing::warn!(
                samples = unknown_refs,
                "WAL replay: samples for series whose definition was lost to damage were skipped"
            );
        }
        if future > 0 {
            tracing::warn!(
                samples = future,
                dir = %wal_dir.display(),
                "WAL replay: samples stamped too far in the future were skipped (written before the grace period applied)"
            );
        }
        if floor > i64::MIN {
            // Series whose every sample is in blocks were restored for nothing.
            head.truncate_before(floor);
            tracing::debug!(samples = in_blocks, "WAL replay: samples already in blocks skipped");
        }
        let damaged = stats.damaged_segments;
        let mut wal = Wal::open(&wal_dir, opts.wal_sync)?.with_segment_bytes(opts.wal_segment_bytes);
        // The new segment starts with the metadata, as every segment after a rotation does.
        let metadata: Vec<WalRecord> =
            head.all_metadata().into_iter().map(|(family, meta)| WalRecord::Metadata { family, meta }).collect();
        if !metadata.is_empty() {
            wal.log(&metadata)?;
        }
        let metrics = TsdbMetrics::default();
        metrics.wal_quarantined_segments.inc_by(damaged as u64);
        let db = Tsdb {
            head,
            blocks,
            floor: HeadFloor::new(floor),
            maintenance: Mutex::new(()),
            stopping: AtomicBool::new(false),
            checkpoint_at: Mutex::new(from),
            block_hold: Mutex::new(None),
            checkpoint_floor: AtomicI64::new(checkpoint_floor),
            maintenance_failed: AtomicBool::new(false),
            from_checkpoint: from.is_some(),
            layout: parking_lot::RwLock::new(()),
            wal: Mutex::new(Writer {
                times: crate::wal_times::WalTimes::new(wal.cursor()),
                wal,
                pending: HashMap::default(),
            }),
            dir: dir.to_path_buf(),
            opts,
            metrics,
            wal_failed: AtomicBool::new(false),
            _lock: lock,
            #[cfg(test)]
            hook: Mutex::new(None),
            #[cfg(test)]
            wal_file_after_first_slice: Mutex::new(None),
        };
        db.apply_retention()?;
        let legacy = dir.join(checkpoint::LEGACY_SNAPSHOT_FILE);
        if legacy.exists() {
            // Written by an earlier version beside a whole WAL, which was just replayed.
            std::fs::remove_file(&legacy).map_err(|e| TsdbError::Internal(format!("{}: {e}", legacy.display())))?;
        }
        Ok(db)
    }

    /// Stops the database cleanly: maintenance ends (a cut that is writing gives up, its
    /// window staying in the head and the WAL), the WAL is synced and a head checkpoint is
    /// written, so that the next start replays only what comes after it. Commits after this
    /// are still logged, and replayed by the next start.
    pub fn shutdown(&self) -> Result<CheckpointStats, TsdbError> {
        self.stopping.store(true, Ordering::Relaxed);
        let _run = match self.maintenance.try_lock() {
            Some(g) => g,
            None => {
                tracing::info!(dir = %self.dir.display(), "stopping: waiting for the running storage maintenance");
                self.maintenance.lock()
            }
        };
        self.sync_wal()?;
        self.write_checkpoint_locked()
    }

    /// Whether [`shutdown`](Self::shutdown) has begun.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Bytes the database takes on disk: every file in the blocks directory, the WAL and
    /// the head checkpoint (what `retention_size` bounds).
    pub fn disk_bytes(&self) -> u64 {
        let checkpoint = std::fs::metadata(self.dir.join(checkpoint::CHECKPOINT_FILE)).map_or(0, |m| m.len());
        self.blocks.disk_bytes().saturating_add(self.wal_disk_bytes()).saturating_add(checkpoint)
    }

    /// Tests: runs the hook at point `name`.
    #[cfg(test)]
    pub(crate) fn at(&self, name: &str) {
        let hook = self.hook.lock().clone();
        if let Some(h) = hook {
            h(name);
        }
    }

    #[cfg(not(test))]
    #[inline(always)]
    pub(crate) fn at(&self, _name: &str) {}

    pub fn head(&self) -> &HeadBlock {
        &self.head
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn wal_dir(&self) -> PathBuf {
        self.dir.join("wal")
    }

    pub fn options(&self) -> &TsdbOptions {
        &self.opts
    }

    pub fn metrics(&self) -> &TsdbMetrics {
        &self.metrics
    }

    #[cfg(test)]
    pub(crate) fn swap_wal_file(&self, f: Arc<std::fs::File>) -> Arc<std::fs::File> {
        self.wal.lock().wal.swap_file(f)
    }

    /// False while the WAL cannot be written (the last write failed).
    pub fn is_writable(&self) -> bool {
        !self.wal_failed.load(Ordering::Relaxed)
    }

    /// Whether the tier may say it is ready: the WAL is writable and the last block cut,
    /// compaction and retention succeeded.
    pub fn is_healthy(&self) -> bool {
        self.is_writable() && !self.maintenance_failed.load(Ordering::Relaxed)
    }

    /// Whether this start loaded a head checkpoint.
    pub fn restored_from_checkpoint(&self) -> bool {
        self.from_checkpoint
    }

    /// Held while reading blocks and head as one (see the field).
    pub fn read_layout(&self) -> parking_lot::RwLockReadGuard<'_, ()> {
        self.layout.read()
    }

    pub fn blocks(&self) -> &BlockSet {
        &self.blocks
    }

    /// The block range in milliseconds.
    pub fn block_range_ms(&self) -> i64 {
        duration_ms(self.opts.block_range).max(1)
    }

    /// The oldest time held, in the head or in blocks, damaged blocks included; `None`
    /// when a damaged block's range is unknown (see [`crate::blocks::BlockSet::oldest_held`]).
    pub fn oldest_held(&self) -> Option<i64> {
        Some(self.head.min_time().min(self.blocks.oldest_held()?))
    }

    /// The oldest sample held, in blocks or the head; `i64::MAX` when empty.
    pub fn min_time(&self) -> i64 {
        self.blocks.min_sample_time().min(self.head.min_time())
    }

    /// The newest sample held, in the head or in blocks; `i64::MIN` when empty.
    pub fn max_time(&self) -> i64 {
        self.head.max_time().max(self.blocks.max_sample_time())
    }

    /// The time range to advertise to a querier (the StoreAPI's `Info`), which may skip the
    /// store for queries outside it until it asks again: from the oldest sample held, or
    /// the oldest time a commit is still accepted at if that is older (a new series within
    /// retention), to an open end, since a database that takes samples holds newer ones by
    /// the time the querier asks (as Thanos' sidecar advertises the head).
    pub fn advertised_range(&self) -> (i64, i64) {
        // Damaged blocks' ranges too: a querier must ask, to be told they were skipped.
        let min = self.min_time().min(self.blocks.min_time()).min(self.min_valid_time(now_ms()));
        (min, i64::MAX)
    }

    /// A metric's type from the head's metadata, else from the newest block that knows it.
    pub fn metric_type(&self, metric: &str) -> strata_model::MetricType {
        match self.head.metric_type(metric) {
            strata_model::MetricType::Unknown => self.blocks.metric_type(metric).unwrap_or_default(),
            t => t,
        }
    }

    /// Finds or creates the series; creation is logged with the next commit that uses it.
    pub fn series(&self, labels: &Labels) -> Result<Arc<MemSeries>, HeadError> {
        self.head.get_or_create(labels).map(|(s, _)| s)
    }

    /// Oldest timestamp still accepted at wall-clock time `now`: the retention window back
    /// from the newest sample held, but never from beyond the wall clock.
    pub fn min_valid_time(&self, now: i64) -> i64 {
        let floor = self.floor.admit();
        let max = self.max_time();
        if max == i64::MIN {
            return floor;
        }
        max.min(now).saturating_sub(duration_ms(self.opts.retention)).max(floor)
    }

    /// The oldest time retention keeps at wall-clock time `now` (`i64::MIN`: keep all).
    pub(crate) fn retention_cutoff(&self, now: i64) -> i64 {
        let max = self.max_time();
        if max == i64::MIN {
            return i64::MIN;
        }
        max.min(now).saturating_sub(duration_ms(self.opts.retention))
    }

    /// Newest timestamp accepted at wall-clock time `now`.
    pub fn max_valid_time(&self, now: i64) -> i64 {
        now.saturating_add(duration_ms(self.opts.future_grace_period))
    }

    /// Validates, logs and applies a batch. Samples of one series must be in time order
    /// within the batch; each refused sample is reported and the rest still go in.
    pub fn commit(&self, batch: &[(Arc<MemSeries>, Sample)]) -> Result<CommitOutcome, TsdbError> {
        let mut out = CommitOutcome::default();
        self.commit_inner(batch, Slicing::Sliced, &mut out)?;
        Ok(out)
    }

    /// [`commit`](Self::commit) that keeps what happened before a failure: a batch over one
    /// slice may have its earlier slices stored when a later slice's WAL write fails, and
    /// the outcome says what they stored and refused (a caller counts those refusals
    /// before it answers the failure).
    pub fn commit_partial(&self, batch: &[(Arc<MemSeries>, Sample)]) -> (CommitOutcome, Result<(), TsdbError>) {
        let mut out = CommitOutcome::default();
        let done = self.commit_inner(batch, Slicing::Sliced, &mut out);
        (out, done)
    }

    /// [`commit`](Self::commit) in one slice, all or nothing: a scrape's page that exposes
    /// one of its own report series (so its series are not distinct) still goes in with its
    /// staleness markers and `up`.
    pub fn commit_whole(&self, batch: &[(Arc<MemSeries>, Sample)]) -> Result<CommitOutcome, TsdbError> {
        let mut out = CommitOutcome::default();
        self.commit_inner(batch, Slicing::Whole, &mut out)?;
        Ok(out)
    }

    /// [`commit`](Self::commit) for a batch whose samples all belong to different series,
    /// as a scrape's (checked for duplicate series before): skips tracking repeats within
    /// the batch. A batch that breaks the contract would let a series' samples in out of order.
    pub fn commit_distinct(&self, batch: &[(Arc<MemSeries>, Sample)]) -> Result<CommitOutcome, TsdbError> {
        debug_assert!({
            let mut refs: Vec<_> = batch.iter().map(|(s, _)| s.series_ref).collect();
            refs.sort_unstable();
            refs.windows(2).all(|w| w[0] != w[1])
        });
        let mut out = CommitOutcome::default();
        self.commit_inner(batch, Slicing::Distinct, &mut out)?;
        Ok(out)
    }

    /// [`commit_distinct`](Self::commit_distinct) when it cannot wait: `None` when the WAL
    /// lock is held, the commit would `fsync` (a full segment to rotate, or
    /// [`SyncPolicy::Always`]), so the caller can commit from a thread that may block. An
    /// async worker commits a scrape's page this way without handing its queue to another
    /// thread, which costs more than the commit.
    pub fn try_commit_distinct(&self, batch: &[(Arc<MemSeries>, Sample)]) -> Option<Result<CommitOutcome, TsdbError>> {
        if self.opts.wal_sync == SyncPolicy::Always {
            return None;
        }
        let mut writer = self.wal.try_lock()?;
        if writer.wal.is_full() {
            return None;
        }
        let mut out = CommitOutcome::default();
        Some(self.commit_slice(&mut writer, batch, true, &mut out).map(|()| out))
    }

    fn commit_inner(
        &self,
        batch: &[(Arc<MemSeries>, Sample)],
        slicing: Slicing,
        out: &mut CommitOutcome,
    ) -> Result<(), TsdbError> {
        let distinct = slicing == Slicing::Distinct;
        // A large batch (a remote-write request of millions of samples) goes in slices, and
        // the WAL lock is handed to a waiting writer between them: a scrape or a small
        // write waits for one slice at most, never for a whole large request.
        let mut writer = self.wal.lock();
        // A scrape's batch stays whole: its staleness markers and `up` go in with it, or
        // nothing does.
        let slice = if slicing == Slicing::Sliced { COMMIT_SLICE } else { batch.len().max(1) };
        let mut slices = batch.chunks(slice).peekable();
        while let Some(slice) = slices.next() {
            self.commit_slice(&mut writer, slice, distinct, out)?;
            #[cfg(test)]
            if let Some(f) = self.wal_file_after_first_slice.lock().take() {
                writer.wal.swap_file(f);
            }
            if slices.peek().is_some() {
                parking_lot::MutexGuard::bump(&mut writer);
            }
        }
        Ok(())
    }

    /// Commits one slice; `total` takes its outcome only once its WAL write succeeded (a
    /// failed slice stores nothing, and its refusals are the retry's to report).
    fn commit_slice(
        &self,
        writer: &mut Writer,
        batch: &[(Arc<MemSeries>, Sample)],
        distinct: bool,
        total: &mut CommitOutcome,
    ) -> Result<(), TsdbError> {
        if batch.is_empty() {
            return Ok(());
        }
        let out = &mut CommitOutcome::default();
        let Writer { wal, pending, times } = writer;
        pending.clear();
        let rotated = wal.rotate_if_full()?;
        let segment = wal.current_segment();
        let now = now_ms();
        let min_valid = self.min_valid_time(now);
        let max_valid = self.max_valid_time(now);

        let mut records = self.segment_start_records(rotated);
        let mut accepted: Vec<(SeriesRef, Sample)> = Vec::with_capacity(batch.len());
        let mut accepted_idx: Vec<usize> = Vec::with_capacity(batch.len());
        // Live stand-ins for series retention removed while a caller still held them.
        let mut revived: HashMap<usize, Arc<MemSeries>> = HashMap::new();
        // Samples older than their series' newest: duplicates only if stored, looked up
        // together after the loop (a lookup decodes a chunk).
        let mut older: Vec<(usize, SeriesRef, Sample)> = Vec::new();
        for (i, (series, s)) in batch.iter().enumerate() {
            let series = if series.is_removed() {
                match self.head.get_or_create(&series.labels) {
                    Ok((live, _)) => &*revived.entry(i).or_insert(live),
                    Err(_) => {
                        out.rejected.push((series.series_ref, *s, SampleError::SeriesLimit));
                        continue;
                    }
                }
            } else {
                series
            };
            if s.t < min_valid {
                out.rejected.push((series.series_ref, *s, SampleError::OutOfBounds));
                continue;
            }
            if s.t > max_valid {
                out.rejected.push((series.series_ref, *s, SampleError::TooFarInFuture));
                continue;
            }
            let repeat = if distinct { None } else { pending.get(&series.series_ref) };
            let check = match repeat {
                Some(p) if s.t > p.t => Ok(true),
                Some(p) if s.t == p.t && p.v.to_bits() == s.v.to_bits() => Ok(false),
                Some(p) if s.t == p.t => Err(SampleError::DuplicateTimestamp),
                Some(_) => Err(SampleError::OutOfOrder),
                None => match series.samples.lock().check(s) {
                    Some(c) => c,
                    None => {
                        older.push((i, series.series_ref, *s));
                        continue;
                    }
                },
            };
            match check {
                Ok(true) => {
                    if self.labels_due(series, segment) && (distinct || !pending.contains_key(&series.series_ref)) {
                        records
                            .push(WalRecord::Series { series_ref: series.series_ref, labels: series.labels.clone() });
                    }
                    if !distinct {
                        pending.insert(series.series_ref, *s);
                    }
                    accepted.push((series.series_ref, *s));
                    accepted_idx.push(i);
                }
                Ok(false) => out.ignored_duplicates += 1,
                Err(e) => out.rejected.push((series.series_ref, *s, e)),
            }
        }
        self.classify_older(batch, &revived, &mut older, out);
        self.at("commit-checked");
        if accepted.is_empty() && records.is_empty() {
            total.merge(std::mem::take(out));
            return Ok(());
        }
        let n = accepted.len();
        // Records stay far below what replay accepts (a sample takes at most 28 bytes).
        while accepted.len() > MAX_SAMPLES_PER_RECORD {
            let rest = accepted.split_off(MAX_SAMPLES_PER_RECORD);
            records.push(WalRecord::Samples(std::mem::replace(&mut accepted, rest)));
        }
        if !accepted.is_empty() {
            records.push(WalRecord::Samples(accepted));
        }
        let start = wal.cursor();
        let oldest = accepted_idx.iter().map(|&i| batch[i].1.t).min().unwrap_or(i64::MAX);
        let logged = wal.log(&records);
        // Written but not synced (a failed `fsync`), the records are in the file and a
        // forwarder reads them: noted all the same.
        if wal.cursor() != start {
            times.note(start, wal.cursor(), oldest);
        }
        if let Err(e) = logged {
            self.wal_failed.store(true, Ordering::Relaxed);
            return Err(e.into());
        }
        self.wal_failed.store(false, Ordering::Relaxed);
        let (mut lo, mut hi) = (i64::MAX, i64::MIN);
        let range = self.block_range_ms();
        for &i in &accepted_idx {
            let (series, s) = &batch[i];
            let series = revived.get(&i).unwrap_or(series);
            series.logged_segment.store(segment, std::sync::atomic::Ordering::Relaxed);
            series.samples.lock().append(*s, range);
            lo = lo.min(s.t);
            hi = hi.max(s.t);
        }
        if lo <= hi {
            self.head.note_time(lo);
            self.head.note_time(hi);
        }
        out.appended += n;
        self.metrics.samples_appended.inc_by(n as u64);
        total.merge(std::mem::take(out));
        Ok(())
    }

    /// Whether a series' labels go into the WAL before its next record in `segment`: once
    /// per series (the head checkpoint keeps them past truncation), or with
    /// `wal_labels_per_segment` once per series and segment, for a reader of the WAL that
    /// starts in any segment.
    fn labels_due(&self, series: &MemSeries, segment: u32) -> bool {
        let logged = series.logged_segment.load(Ordering::Relaxed);
        if self.opts.wal_labels_per_segment {
            logged != segment
        } else {
            logged == u32::MAX
        }
    }

    /// The records a segment just rotated to starts with: every family's metadata.
    fn segment_start_records(&self, rotated: bool) -> Vec<WalRecord> {
        if !rotated {
            return Vec::new();
        }
        self.head.all_metadata().into_iter().map(|(family, meta)| WalRecord::Metadata { family, meta }).collect()
    }

    /// Sorts out samples older than their series' newest: an exact copy of a stored sample
    /// is an ignored duplicate, anything else is out of order. Each series' chunks are
    /// decoded once for all of its older samples.
    fn classify_older(
        &self,
        batch: &[(Arc<MemSeries>, Sample)],
        revived: &HashMap<usize, Arc<MemSeries>>,
        older: &mut [(usize, SeriesRef, Sample)],
        out: &mut CommitOutcome,
    ) {
        older.sort_unstable_by_key(|&(i, r, s)| (r, s.t, i));
        for run in older.chunk_by(|a, b| a.1 == b.1) {
            let i = run[0].0;
            let series = revived.get(&i).unwrap_or(&batch[i].0);
            let samples: Vec<Sample> = run.iter().map(|x| x.2).collect();
            let held = series.samples.lock().holds_each(&samples);
            for (&(_, r, s), held) in run.iter().zip(held) {
                if held {
                    out.ignored_duplicates += 1;
                } else {
                    out.rejected.push((r, s, SampleError::OutOfOrder));
                }
            }
        }
    }

    /// Records a metric family's metadata, logging it when it changed.
    pub fn set_metadata(&self, family: &str, meta: Metadata) -> Result<(), TsdbError> {
        if let Some(meta) = self.head.set_metadata(family, meta) {
            let logged = self.wal.lock().wal.log(&[WalRecord::Metadata { family: family.to_string(), meta }]);
            self.wal_failed.store(logged.is_err(), Ordering::Relaxed);
            if logged.is_err() {
                // Not logged, so not stored: a retry logs it.
                self.head.forget_metadata(family);
            }
            logged?;
        }
        Ok(())
    }

    /// `fsync`s the WAL; returns how long it took.
    ///
    /// The `fsync` runs without the WAL lock: commits (scrapes, remote writes) go on
    /// meanwhile instead of waiting milliseconds for the disk. (A rotation syncs the segment
    /// it closes under the lock.)
    pub fn sync_wal(&self) -> Result<Duration, TsdbError> {
        let (file, path) = self.wal.lock().wal.sync_handle();
        let t0 = std::time::Instant::now();
        file.sync_data().map_err(|e| wal::WalError::Io { path, source: e })?;
        let took = t0.elapsed();
        self.wal.lock().wal.last_fsync = Some(took);
        Ok(took)
    }

    /// Keeps the WAL from `cursor`'s segment on, whatever checkpoints would delete, until
    /// released with `None`: forwarding holds what upstream has not acknowledged. Read it
    /// with [`WalReader`](crate::wal::WalReader).
    pub fn hold_wal(&self, cursor: Option<wal::WalCursor>) {
        self.wal.lock().wal.hold_from(cursor.map(|c| c.segment));
    }

    /// Keeps blocks that time retention would delete while they hold data after `from`
    /// (ms), newest first, up to `max_bytes` of them; `None` releases them. Forwarding holds
    /// what an upstream that is behind still needs this way.
    pub fn hold_blocks(&self, hold: Option<(i64, u64)>) {
        *self.block_hold.lock() = hold;
    }

    /// The hold [`hold_blocks`](Self::hold_blocks) set.
    pub fn blocks_held(&self) -> Option<(i64, u64)> {
        *self.block_hold.lock()
    }

    /// The first WAL segment the head still needs: the last head checkpoint covers the
    /// ones before it, which only a hold ([`hold_wal`](Self::hold_wal)) keeps. `None`
    /// before the first checkpoint (the head needs every segment).
    pub fn wal_needed_from(&self) -> Option<u32> {
        self.checkpoint_at.lock().map(|c| c.segment)
    }

    /// The oldest sample time of the records that end past `at` (`i64::MAX`: none yet);
    /// `None` when that is not known (written before the database opened, or longer ago
    /// than the last [`crate::wal_times::MAX_COMMITS`] commits).
    pub fn wal_oldest_after(&self, at: wal::WalCursor) -> Option<i64> {
        self.wal.lock().times.oldest_after(at)
    }

    /// Where the next WAL record will be written.
    pub fn wal_cursor(&self) -> wal::WalCursor {
        self.wal.lock().wal.cursor()
    }

    pub fn wal_disk_bytes(&self) -> u64 {
        self.wal.lock().wal.disk_bytes()
    }

    pub fn stats(&self) -> HeadStats {
        self.head.stats()
    }
}

/// Replays a chunk record the way it was stored, taking the chunk whole when the series
/// can (`None`: done); anything else, and a chunk it cannot take (a segment replayed twice,
/// data in blocks since), comes back to be replayed as samples.
fn adopt_replayed(
    head: &HeadBlock,
    aliases: &HashMap<SeriesRef, SeriesRef>,
    rec: WalRecord,
    floor: i64,
    max_valid: i64,
    range: i64,
) -> Option<WalRecord> {
    let WalRecord::Chunk { series_ref, chunk, last } = rec else { return Some(rec) };
    let r = aliases.get(&series_ref).copied().unwrap_or(series_ref);
    if let Some(series) = head.series(r) {
        let mut g = series.samples.lock();
        // An open chunk continued (see `commit_chunks`): continued again. One the head holds
        // already (a segment replayed twice) or cannot continue comes back as samples below,
        // of which those not newer than the series' last are skipped.
        if chunk.min_t >= floor && chunk.max_t <= max_valid && !chunk.is_block() {
            if let Ok(Some(k)) = g.continuation(&chunk, chunk.max_t, range) {
                if let (Some(f), Some(l)) = (k.samples.first(), k.samples.last()) {
                    head.note_time(f.t);
                    head.note_time(l.t);
                }
                g.continue_open(k);
                return None;
            }
        }
        if chunk.min_t >= floor && chunk.max_t <= max_valid && g.can_adopt(&chunk, range) {
            head.note_time(chunk.min_t);
            head.note_time(chunk.max_t);
            g.adopt(chunk, last);
            return None;
        }
    }
    Some(WalRecord::Chunk { series_ref, chunk, last }.chunk_as_samples())
}

/// Locks `<dir>/lock` for this process (released when the file closes, a crash included):
/// a second process on one data directory would delete the other's block writes as
/// leftovers and interleave WALs.
fn lock_dir(dir: &Path) -> Result<std::fs::File, TsdbError> {
    std::fs::create_dir_all(dir).map_err(|e| TsdbError::Internal(format!("{}: {e}", dir.display())))?;
    let path = dir.join("lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| TsdbError::Internal(format!("{}: {e}", path.display())))?;
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock takes a file descriptor this function owns, and no pointers.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Err(TsdbError::Locked { dir: dir.to_path_buf() });
            }
            return Err(TsdbError::Internal(format!("locking {}: {e}", path.display())));
        }
    }
    Ok(f)
}

/// A duration in milliseconds, saturating (a configured duration can be any size).
fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

mod adopt;
mod checkpoint;
mod compact;
mod floor;
mod late;
pub use adopt::{AdoptOutcome, OpenChunk, WholeChunks};
pub use checkpoint::{CheckpointStats, CHECKPOINT_FILE};
pub use compact::{release_free_memory, MaintenanceOutcome};
pub use late::LateOutcome;
#[cfg(test)]
mod tests;
