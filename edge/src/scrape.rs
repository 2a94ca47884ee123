//! Scraping one target: [`ScrapeIngest`] turns a page into appends (no I/O, so the ingest
//! benchmark and the tests drive it directly) and [`ScrapeLoop`] fetches the page on a
//! per-target offset within the interval.
//!
//! A scrape is all or nothing: the page is parsed, relabeled and checked against the
//! limits before anything is appended, so a bad page (garbage, an unterminated label value,
//! a duplicate series, too many samples, an oversize body) stores nothing, leaves earlier
//! data untouched, and reports `up` = 0 with the reason in the log. As in Prometheus, a
//! failed scrape marks the target's series stale, and so does a series that leaves the page.

use crate::config::ScrapeJob;
use crate::http_client::{BufferPool, HttpError, ScrapeClient};
use crate::metrics::{EdgeMetrics, JobLabel};
use crate::targets::Target;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_ingest::exposition::{self, Entry, Format, ParseError};
use strata_ingest::relabel;
use strata_model::time::now_ms;
use strata_model::{stale_nan, Labels, LabelsBuilder, Metadata, Sample, METRIC_NAME};
use strata_tsdb::db::{Tsdb, TsdbError};
use strata_tsdb::head::{HeadError, MemSeries, SampleError};
use strata_tsdb::index::SeriesRef;
use tokio::sync::watch;

pub const ACCEPT_HEADER: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// Fetching the page failed; a status or size refusal reads as itself, anything else
    /// as a failure to fetch.
    #[error("{}", describe_fetch(.0))]
    Http(#[from] HttpError),
    #[error("parsing the page: {0}")]
    Parse(#[from] ParseError),
    #[error("invalid series on the page: {0}")]
    InvalidSeries(String),
    #[error("duplicate series on the page: {0}")]
    DuplicateSeries(String),
    #[error("line {line}: sample timestamp {t} is too far in the future{hint}")]
    FutureTimestamp { line: usize, t: i64, hint: &'static str },
    #[error("sample_limit of {0} exceeded")]
    SampleLimit(u64),
    #[error("label_limit of {limit} exceeded by {series}")]
    LabelLimit { limit: u64, series: String },
    #[error(transparent)]
    Head(#[from] HeadError),
    #[error("storing: {0}")]
    Storage(#[from] TsdbError),
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ScrapeReport {
    pub scraped: usize,
    pub post_relabel: usize,
    pub series_added: usize,
    pub appended: usize,
    /// Samples of new series dropped because the database is at its series limit; the
    /// scrape still succeeds for the series that exist.
    pub series_limit_dropped: usize,
    /// Samples the database refused (Prometheus' `prometheus_target_scrapes_sample_*`):
    /// out of order, a different value at a stored timestamp, older than retention.
    pub out_of_order: usize,
    pub duplicate_timestamp: usize,
    pub out_of_bounds: usize,
}

/// What a raw series line resolves to: a head series, or nothing (dropped by relabeling).
#[derive(Clone)]
struct Slot {
    series: Option<Arc<MemSeries>>,
    last_seen: u64,
    /// The raw text, in `SeriesCache::keys`.
    key: std::ops::Range<usize>,
    /// Next slot with the same key hash.
    next: u32,
}

const NO_SLOT: u32 = u32::MAX;

/// Raw series text → slot. Each key is stored once, in an arena in the order series were
/// first seen, which for a steady target is page order.
///
/// Line k of a page is first compared with the slot at position k of the last good scrape:
/// a sequential compare through the arena that the CPU prefetches, instead of hashing ~300
/// bytes and comparing against a key at a random address. The hash index is the fallback
/// when the page changed.
#[derive(Default)]
struct SeriesCache {
    /// Key hash → first slot with that hash (keys are hashes already: no rehashing).
    index: HashMap<u64, u32, BuildHasherDefault<RefHasher>>,
    hasher: foldhash::fast::RandomState,
    slots: Vec<Slot>,
    keys: Vec<u8>,
    order: Vec<u32>,
    next_order: Vec<u32>,
}

impl SeriesCache {
    fn key(&self, slot: u32) -> &[u8] {
        &self.keys[self.slots[slot as usize].key.clone()]
    }

    fn positional(&self, pos: usize, raw: &[u8]) -> Option<u32> {
        let &slot = self.order.get(pos)?;
        (self.key(slot) == raw).then_some(slot)
    }

    fn lookup(&self, raw: &[u8]) -> Option<u32> {
        let mut s = *self.index.get(&self.hasher.hash_one(raw))?;
        while s != NO_SLOT {
            if self.key(s) == raw {
                return Some(s);
            }
            s = self.slots[s as usize].next;
        }
        None
    }

    fn insert(&mut self, raw: &[u8], series: Option<Arc<MemSeries>>, now: u64) -> u32 {
        let slot = self.slots.len() as u32;
        let start = self.keys.len();
        self.keys.extend_from_slice(raw);
        let next = self.index.insert(self.hasher.hash_one(raw), slot).unwrap_or(NO_SLOT);
        self.slots.push(Slot { series, last_seen: now, key: start..self.keys.len(), next });
        slot
    }

    /// The scrape succeeded: its order becomes the one to compare against.
    fn commit_order(&mut self) {
        std::mem::swap(&mut self.order, &mut self.next_order);
        self.next_order.clear();
    }

    /// Forgets series not seen since `oldest`, compacting slots and keys.
    fn evict(&mut self, oldest: u64) {
        if self.slots.iter().all(|s| s.last_seen >= oldest) {
            return;
        }
        let old_slots = std::mem::take(&mut self.slots);
        let old_keys = std::mem::take(&mut self.keys);
        self.index.clear();
        self.order.clear();
        for s in old_slots.into_iter().filter(|s| s.last_seen >= oldest) {
            let raw = &old_keys[s.key.clone()];
            self.insert(raw, s.series, s.last_seen);
        }
    }
}

/// Hashes a u64 that is already a hash or a unique reference, with one multiply.
#[derive(Default)]
struct RefHasher(u64);
impl Hasher for RefHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}
type RefSet = HashSet<SeriesRef, BuildHasherDefault<RefHasher>>;

/// How many scrapes a cache entry survives without being seen.
const CACHE_KEEP_SCRAPES: u64 = 10;

type ChangedMeta = HashSet<String, foldhash::fast::RandomState>;

pub struct ScrapeIngest {
    pub target: Target,
    job: Arc<ScrapeJob>,
    db: Arc<Tsdb>,
    cache: SeriesCache,
    /// Metadata as last seen on this target's pages (with the scrape that last showed it),
    /// so unchanged pages cost no allocation.
    metadata: HashMap<String, (Metadata, u64), foldhash::fast::RandomState>,
    iteration: u64,
    /// Series appended by the last successful scrape, for staleness.
    previous: Vec<Arc<MemSeries>>,
    seen: RefSet,
    /// Series of the current page whose samples carried their own timestamps.
    explicit: RefSet,
    /// Whether the last good page had any.
    had_explicit: bool,
    synthetic: HashMap<&'static str, Arc<MemSeries>>,
    batch: Vec<(Arc<MemSeries>, Sample)>,
    /// New series of the current page refused by the series limit.
    series_limit_dropped: usize,
    /// The thread the current page is ingested on.
    thread: Thread,
}

impl ScrapeIngest {
    pub fn new(target: Target, job: Arc<ScrapeJob>, db: Arc<Tsdb>) -> Self {
        ScrapeIngest {
            target,
            job,
            db,
            cache: SeriesCache::default(),
            metadata: HashMap::default(),
            iteration: 0,
            previous: Vec::new(),
            seen: RefSet::default(),
            explicit: RefSet::default(),
            had_explicit: false,
            series_limit_dropped: 0,
            synthetic: HashMap::new(),
            batch: Vec::new(),
            thread: Thread::MayBlock,
        }
    }

    /// Whether a page can be ingested on an async worker: besides the page's own size
    /// (the caller's), what it may touch is small (the series a shrinking page marks
    /// stale, the cache a periodic trim walks).
    fn is_light(&self) -> bool {
        self.previous.len() <= INLINE_SERIES && self.cache.slots.len() <= INLINE_SERIES
    }

    fn target_series_labels(&self, scraped: Labels) -> LabelsBuilder {
        let mut lb = scraped.to_builder();
        let mut conflicts: Vec<(&str, &str)> = Vec::new();
        for l in self.target.labels.iter() {
            let existing = scraped.get(&l.name).unwrap_or("");
            if self.job.honor_labels {
                if existing.is_empty() {
                    lb.set_shared(l.name.clone(), l.value.clone());
                }
            } else {
                if !existing.is_empty() {
                    conflicts.push((&l.name, existing));
                }
                lb.set_shared(l.name.clone(), l.value.clone());
            }
        }
        // As Prometheus: the page's value moves to `exported_<name>`, or to
        // `exported_exported_<name>` and so on while that is taken; shorter names first.
        conflicts.sort_by_key(|(name, _)| name.len());
        for (name, value) in conflicts {
            let mut moved = format!("exported_{name}");
            while lb.get(&moved).is_some_and(|v| !v.is_empty()) {
                moved.insert_str(0, "exported_");
            }
            lb.set(&moved, value);
        }
        lb
    }

    /// Resolves the raw series on line position `pos` to its head series, or `None` when
    /// relabeling drops it. Bytes found in the cache were validated when first seen; new ones
    /// are validated here.
    /// `full`: the page already holds `sample_limit` samples, so a series it would add
    /// fails the scrape before it is created (Prometheus' limit appender).
    fn resolve(
        &mut self,
        pos: usize,
        raw: &[u8],
        line: usize,
        steady: &mut bool,
        full: bool,
    ) -> Result<(Option<Arc<MemSeries>>, bool), ScrapeError> {
        let known = match self.cache.positional(pos, raw) {
            Some(slot) => Some(slot),
            None => {
                *steady = false;
                self.cache.lookup(raw)
            }
        };
        if let Some(slot) = known {
            let s = &mut self.cache.slots[slot as usize];
            if s.last_seen == self.iteration {
                return Err(ScrapeError::DuplicateSeries(String::from_utf8_lossy(raw).into_owned()));
            }
            s.last_seen = self.iteration;
            let series = s.series.clone();
            self.cache.next_order.push(slot);
            return Ok((series, false));
        }
        *steady = false;
        let scraped = exposition::parse_series_at(raw, line)?;
        let lb = self.target_series_labels(scraped);
        let resolved = match relabel::process(&self.job.metric_relabel, lb) {
            None => None,
            Some(labels) => {
                if labels.metric_name().is_none_or(str::is_empty) {
                    return Err(ScrapeError::InvalidSeries(format!(
                        "{}: relabeling removed the metric name",
                        String::from_utf8_lossy(raw)
                    )));
                }
                if self.job.label_limit > 0 && labels.len() as u64 > self.job.label_limit {
                    return Err(ScrapeError::LabelLimit { limit: self.job.label_limit, series: labels.to_string() });
                }
                if full {
                    return Err(ScrapeError::SampleLimit(self.job.sample_limit));
                }
                // Creating a series takes the head's table lock, which a heavy query may hold.
                let db = &self.db;
                match self.thread.may_wait(|| db.head().get_or_create(&labels)) {
                    Ok(s) => Some(s),
                    Err(HeadError::SeriesLimit { .. }) => {
                        // Not cached: the series is tried again once there is room.
                        self.series_limit_dropped += 1;
                        return Ok((None, false));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        };
        let created = resolved.as_ref().is_some_and(|r| r.1);
        let series = resolved.map(|r| r.0);
        let slot = self.cache.insert(raw, series.clone(), self.iteration);
        self.cache.next_order.push(slot);
        Ok((series, created))
    }

    /// Updates the metadata cache from one `# TYPE`/`# HELP`/`# UNIT` line; a family that
    /// is new or changed goes into `changed` once (a set: a page of 200 k `# TYPE` lines
    /// costs linear time).
    fn note_metadata(&mut self, family: &str, update: impl FnOnce(&mut Metadata) -> bool, changed: &mut ChangedMeta) {
        let iteration = self.iteration;
        let (m, new) = match self.metadata.get_mut(family) {
            Some(m) => (m, false),
            None => (self.metadata.entry(family.to_string()).or_insert((Metadata::default(), iteration)), true),
        };
        m.1 = iteration;
        if (update(&mut m.0) || new) && !changed.contains(family) {
            changed.insert(family.to_string());
        }
    }

    /// Parses, relabels and appends one page scraped at `ts` (ms) that took `duration` to
    /// fetch, with its report series (`up` = 1, `scrape_*`), in one commit. Nothing is
    /// appended on error: call [`fail`](Self::fail) then.
    pub fn ingest(
        &mut self,
        body: &[u8],
        format: Format,
        ts: i64,
        duration: Duration,
    ) -> Result<ScrapeReport, ScrapeError> {
        self.ingest_from(body, format, ts, duration, Thread::MayBlock)
    }

    fn ingest_from(
        &mut self,
        body: &[u8],
        format: Format,
        ts: i64,
        duration: Duration,
        thread: Thread,
    ) -> Result<ScrapeReport, ScrapeError> {
        let mut changed_meta = ChangedMeta::default();
        self.thread = thread;
        let out = self.ingest_page(body, format, ts, duration, &mut changed_meta, thread);
        self.thread = Thread::MayBlock;
        if out.is_err() {
            // Nothing of a failed page is stored, its metadata included: forget what it
            // taught the cache, so the next good page stores it.
            for family in &changed_meta {
                self.metadata.remove(family);
            }
        }
        out
    }

    fn ingest_page(
        &mut self,
        body: &[u8],
        format: Format,
        ts: i64,
        duration: Duration,
        changed_meta: &mut ChangedMeta,
        thread: Thread,
    ) -> Result<ScrapeReport, ScrapeError> {
        self.iteration += 1;
        self.batch.clear();
        self.series_limit_dropped = 0;
        self.cache.next_order.clear();
        let mut report = ScrapeReport::default();
        // Every line where it was last time: then nothing can be duplicated or gone stale.
        let mut steady = true;
        let limit = self.job.sample_limit;
        // Series whose samples carry their own timestamps get no staleness markers unless
        // the job tracks them (as Prometheus: a marker at scrape time would make every
        // later sample of a target stamping the past out of order).
        self.explicit.clear();
        for entry in exposition::Parser::new(body, format) {
            match entry? {
                Entry::Sample { series, value, timestamp_ms, line, .. } => {
                    let full = limit > 0 && self.batch.len() as u64 >= limit;
                    let (resolved, created) = self.resolve(report.scraped, series, line, &mut steady, full)?;
                    report.scraped += 1;
                    let Some(s) = resolved else { continue };
                    if full {
                        return Err(ScrapeError::SampleLimit(limit));
                    }
                    report.series_added += created as usize;
                    let t = match timestamp_ms {
                        Some(t) if self.job.honor_timestamps => {
                            if t > self.db.max_valid_time(ts) {
                                return Err(future_timestamp(t, ts, line));
                            }
                            if !self.job.track_timestamps_staleness {
                                self.explicit.insert(s.series_ref);
                            }
                            t
                        }
                        _ => ts,
                    };
                    self.batch.push((s, Sample::new(t, value)));
                }
                Entry::Type { family, metric_type } => self.note_metadata(
                    family,
                    |m| std::mem::replace(&mut m.metric_type, metric_type) != metric_type,
                    changed_meta,
                ),
                Entry::Help { family, help } => self.note_metadata(
                    family,
                    |m| {
                        m.help != help && {
                            m.help = help.into_owned();
                            true
                        }
                    },
                    changed_meta,
                ),
                Entry::Unit { family, unit } => self.note_metadata(
                    family,
                    |m| {
                        m.unit != unit && {
                            m.unit = unit.to_string();
                            true
                        }
                    },
                    changed_meta,
                ),
            }
        }
        report.post_relabel = self.batch.len();
        report.series_limit_dropped = self.series_limit_dropped;
        if !changed_meta.is_empty() {
            // Logged under the WAL lock, which a large remote write may hold for a slice.
            thread.may_wait(|| {
                for family in changed_meta.iter() {
                    if let Some((meta, _)) = self.metadata.get(family) {
                        self.db.set_metadata(family, meta.clone())?;
                    }
                }
                Ok::<_, ScrapeError>(())
            })?;
        }
        steady &= report.scraped == self.cache.order.len();
        // Which series are left out of staleness can change on a page that is otherwise
        // the same: such pages rebuild `previous` every time.
        let any_explicit = !self.explicit.is_empty();
        steady &= !any_explicit && !self.had_explicit;
        if !steady {
            // Two lines that relabel into one series are a duplicate too.
            self.seen.clear();
            for (s, _) in &self.batch {
                if !self.seen.insert(s.series_ref) {
                    return Err(ScrapeError::DuplicateSeries(s.labels.to_string()));
                }
            }
            // Series that left the page get a staleness marker.
            let stale: Vec<_> = self.previous.iter().filter(|s| !self.seen.contains(&s.series_ref)).cloned().collect();
            for s in stale {
                self.batch.push((s, Sample::new(ts, stale_nan())));
            }
        }
        let page_samples = self.batch.len();
        let report_samples = self.report_samples(ts, true, duration, &report)?;
        // The page's series are distinct (checked for duplicates, or line for line the last
        // page); the report's are too, unless the page exposes one of them itself.
        let distinct =
            !self.batch.iter().any(|(s, _)| report_samples.iter().any(|(r, _)| r.series_ref == s.series_ref));
        self.batch.extend(report_samples);
        let (db, batch) = (&self.db, &self.batch);
        let mut out = match thread {
            Thread::AsyncWorker if distinct => match db.try_commit_distinct(batch) {
                Some(out) => out?,
                None => thread.may_wait(|| db.commit_distinct(batch))?,
            },
            _ if distinct => thread.may_wait(|| db.commit_distinct(batch))?,
            // The page exposes one of its report series: still one commit, all or nothing.
            _ => thread.may_wait(|| db.commit_whole(batch))?,
        };
        out.appended = out.appended.saturating_sub(self.batch.len() - page_samples);
        report.appended = out.appended;
        for (_, _, e) in &out.rejected {
            match e {
                SampleError::OutOfOrder => report.out_of_order += 1,
                SampleError::DuplicateTimestamp => report.duplicate_timestamp += 1,
                _ => report.out_of_bounds += 1,
            }
        }
        if !steady {
            self.previous.clear();
            let explicit = &self.explicit;
            self.previous.extend(
                self.batch
                    .iter()
                    .take(report.post_relabel)
                    .filter(|(s, _)| !explicit.contains(&s.series_ref))
                    .map(|(s, _)| s.clone()),
            );
        }
        self.had_explicit = any_explicit;
        self.cache.commit_order();
        if self.iteration.is_multiple_of(CACHE_KEEP_SCRAPES) {
            let oldest = self.iteration.saturating_sub(CACHE_KEEP_SCRAPES);
            self.cache.evict(oldest);
            self.metadata.retain(|_, (_, seen)| *seen >= oldest);
        }
        Ok(report)
    }

    /// A failed scrape: every series of the last good scrape goes stale, and `up` = 0 is
    /// recorded, in one commit.
    pub fn fail(&mut self, ts: i64, duration: Duration) -> Result<(), ScrapeError> {
        // `previous` is emptied here, so the next scrape must not count as steady.
        self.cache.order.clear();
        let mut batch: Vec<_> = self.previous.drain(..).map(|s| (s, Sample::new(ts, stale_nan()))).collect();
        batch.extend(self.report_samples(ts, false, duration, &ScrapeReport::default())?);
        self.db.commit(&batch)?;
        Ok(())
    }

    fn synthetic_series(&mut self, name: &'static str) -> Result<Arc<MemSeries>, ScrapeError> {
        if let Some(s) = self.synthetic.get(name) {
            return Ok(s.clone());
        }
        let mut lb = self.target.labels.to_builder();
        lb.set(METRIC_NAME, name);
        let (s, _) = self.db.head().get_or_create(&lb.build())?;
        self.synthetic.insert(name, s.clone());
        Ok(s)
    }

    /// The report series of a scrape: `up`, `scrape_duration_seconds` and the sample counts.
    fn report_samples(
        &mut self,
        ts: i64,
        up: bool,
        duration: Duration,
        r: &ScrapeReport,
    ) -> Result<Vec<(Arc<MemSeries>, Sample)>, ScrapeError> {
        let values: [(&'static str, f64); 5] = [
            ("up", if up { 1.0 } else { 0.0 }),
            ("scrape_duration_seconds", duration.as_secs_f64()),
            ("scrape_samples_scraped", r.scraped as f64),
            ("scrape_samples_post_metric_relabeling", r.post_relabel as f64),
            ("scrape_series_added", r.series_added as f64),
        ];
        let mut batch = Vec::with_capacity(values.len());
        for (name, v) in values {
            batch.push((self.synthetic_series(name)?, Sample::new(ts, v)));
        }
        Ok(batch)
    }

    /// The target went away: everything it wrote, synthetic series included, goes stale.
    pub fn end(&mut self, ts: i64) -> Result<(), ScrapeError> {
        self.cache.order.clear();
        let mut batch: Vec<_> = self.previous.drain(..).map(|s| (s, Sample::new(ts, stale_nan()))).collect();
        batch.extend(self.synthetic.drain().map(|(_, s)| (s, Sample::new(ts, stale_nan()))));
        self.db.commit(&batch)?;
        Ok(())
    }
}

/// The scrape error for an explicit timestamp past the grace period, with a hint when it
/// reads as a present time in microseconds or nanoseconds (the exposition formats want ms).
fn future_timestamp(t: i64, now: i64, line: usize) -> ScrapeError {
    let near = |x: i64| (x - now).abs() < 86_400_000;
    let hint = if near(t / 1000) {
        " (it reads as microseconds: exposition timestamps are in milliseconds)"
    } else if near(t / 1_000_000) {
        " (it reads as nanoseconds: exposition timestamps are in milliseconds)"
    } else {
        ""
    };
    ScrapeError::FutureTimestamp { line, t, hint }
}

fn describe_fetch(e: &HttpError) -> String {
    match e {
        HttpError::Status(_) | HttpError::BodyTooLarge(_) => e.to_string(),
        other => format!("fetching: {other}"),
    }
}

/// The thread a page is ingested on, which decides how its commit may wait for the WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Thread {
    /// One that may block (a test's, or a worker that has handed its queue over).
    MayBlock,
    /// An async worker running a small page inline: it takes the WAL only when it is free
    /// and the commit will not `fsync`, and otherwise hands its queue over to wait.
    AsyncWorker,
}

impl Thread {
    fn may_wait<T>(self, f: impl FnOnce() -> T) -> T {
        match self {
            Thread::MayBlock => f(),
            Thread::AsyncWorker => off_async_workers(f),
        }
    }
}

/// Pages up to this size (inflated) are parsed and appended on the async worker that
/// fetched them: a DCGM page of a few hundred series takes a fraction of a millisecond,
/// less than handing the worker's queue to another thread would cost. Larger pages go off
/// the workers whole.
const INLINE_PAGE_BYTES: u64 = 256 << 10;

/// ... and pages of targets whose last page and series cache are at most this large.
const INLINE_SERIES: usize = 20_000;

/// Runs CPU-bound work (inflating, parsing, appending with its WAL write) so that it does
/// not hold up the runtime's other tasks: on a multi-threaded runtime the worker hands its
/// queue over first. Elsewhere (single-threaded tests) it simply runs.
fn off_async_workers<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Offset of a target's scrapes within the interval, stable for the same target.
pub fn scrape_offset(target: &Target, interval: Duration) -> Duration {
    let ms = interval.as_millis().max(1) as u64;
    let h = target.labels.stable_hash() ^ Labels::from_pairs([("url", target.url.as_str())]).stable_hash();
    Duration::from_millis(h % ms)
}

/// What a scrape loop is told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopState {
    Run,
    /// The target left the configuration or discovery.
    Removed,
    /// The process is stopping.
    Shutdown,
}

pub struct ScrapeLoop {
    pub ingest: ScrapeIngest,
    pub client: ScrapeClient,
    pub metrics: Arc<EdgeMetrics>,
    pub buffers: Arc<BufferPool>,
}

impl ScrapeLoop {
    pub fn new(
        target: Target,
        job: Arc<ScrapeJob>,
        db: Arc<Tsdb>,
        metrics: Arc<EdgeMetrics>,
        buffers: Arc<BufferPool>,
    ) -> Self {
        let client = ScrapeClient::with_security(&target.url, ACCEPT_HEADER, job.timeout, job.security.clone());
        ScrapeLoop { ingest: ScrapeIngest::new(target, job, db), client, metrics, buffers }
    }
}

impl ScrapeLoop {
    /// Scrapes once at `ts`; returns the error if the scrape failed.
    pub async fn scrape_once(&mut self, ts: i64) -> Option<ScrapeError> {
        let job = self.ingest.job.clone();
        let label = JobLabel { job: job.job_name.clone() };
        self.metrics.scrapes.get_or_create(&label).inc();
        let started = Instant::now();
        let mut bufs = self.buffers.take();
        let fetched = self.client.fetch(&mut bufs, job.timeout, job.body_size_limit).await;
        // As Prometheus: scrape_duration_seconds is the time the fetch took.
        let duration = started.elapsed();
        let result = match fetched {
            Ok(f) => {
                let format = Format::from_content_type(f.content_type.as_deref());
                let limit = job.body_size_limit;
                let inline_limit = if limit == 0 { INLINE_PAGE_BYTES } else { limit.min(INLINE_PAGE_BYTES) };
                let light = bufs.fetched_bytes() as u64 <= inline_limit && self.ingest.is_light();
                let inline = light.then(|| bufs.page(f.gzip, inline_limit));
                match inline {
                    Some(Ok(body)) => self.ingest.ingest_from(body, format, ts, duration, Thread::AsyncWorker),
                    Some(Err(e)) if !matches!(e, HttpError::BodyTooLarge(_)) => Err(e.into()),
                    // Too large to inflate inline (or over the job's limit anyway, which
                    // inflating again off the workers says).
                    _ => off_async_workers(|| {
                        let body = bufs.page(f.gzip, limit)?;
                        self.ingest.ingest(body, format, ts, duration)
                    }),
                }
            }
            Err(e) => Err(e.into()),
        };
        self.buffers.put(bufs);
        match result {
            Ok(r) => {
                let refused = r.out_of_order + r.duplicate_timestamp + r.out_of_bounds;
                if refused > 0 {
                    self.metrics.scrape_out_of_order.inc_by(r.out_of_order as u64);
                    self.metrics.scrape_duplicate_timestamp.inc_by(r.duplicate_timestamp as u64);
                    self.metrics.scrape_out_of_bounds.inc_by(r.out_of_bounds as u64);
                    tracing::warn!(
                        target_url = %self.ingest.target.url,
                        out_of_order = r.out_of_order,
                        duplicate_timestamp = r.duplicate_timestamp,
                        out_of_bounds = r.out_of_bounds,
                        "scraped samples refused by the database"
                    );
                }
                if r.series_limit_dropped > 0 {
                    self.metrics
                        .scrape_series_limit_dropped
                        .get_or_create(&label)
                        .inc_by(r.series_limit_dropped as u64);
                    tracing::warn!(
                        target_url = %self.ingest.target.url,
                        dropped = r.series_limit_dropped,
                        "series limit reached: samples of new series dropped, existing series kept"
                    );
                }
                None
            }
            Err(e) => {
                self.metrics.scrape_failures.get_or_create(&label).inc();
                if let Err(e2) = off_async_workers(|| self.ingest.fail(ts, duration)) {
                    tracing::error!(target_url = %self.ingest.target.url, error = %e2, "writing staleness markers and up = 0 failed");
                }
                Some(e)
            }
        }
    }

    /// A changed job for the same target (a reload): the loop keeps its series cache and
    /// staleness state (as Prometheus reuses a loop's cache across interval, timeout,
    /// limit and client changes), unless what a page resolves to changed.
    fn reconfigure(&mut self, job: Arc<ScrapeJob>) {
        let old = &self.ingest.job;
        let resolves_alike = old.honor_labels == job.honor_labels
            && old.honor_timestamps == job.honor_timestamps
            && old.label_limit == job.label_limit
            && old.track_timestamps_staleness == job.track_timestamps_staleness
            && format!("{:?}", old.metric_relabel) == format!("{:?}", job.metric_relabel);
        if !resolves_alike {
            self.ingest.cache = SeriesCache::default();
        }
        self.client =
            ScrapeClient::with_security(&self.ingest.target.url, ACCEPT_HEADER, job.timeout, job.security.clone());
        self.ingest.job = job;
    }

    /// The first scrape slot at or after now: the target's offset within the interval.
    fn first_slot(&self) -> i64 {
        let period = self.ingest.job.interval.as_millis().max(1) as i64;
        let offset = scrape_offset(&self.ingest.target, self.ingest.job.interval).as_millis() as i64;
        let now = now_ms();
        let next = now - now.rem_euclid(period) + offset;
        if next < now {
            next + period
        } else {
            next
        }
    }

    /// Scrapes until `state` leaves [`LoopState::Run`], taking job changes from `jobs`.
    /// Removed, it marks the target's series stale as Prometheus does: at the time its
    /// next scrape would have been, written one interval later, so a loop that replaces it
    /// (the same series from a re-added target) masks the markers. At a shutdown it
    /// writes none: the data stays valid until its lookback ends, and a restart goes on.
    pub async fn run(mut self, mut state: watch::Receiver<LoopState>, mut jobs: watch::Receiver<Arc<ScrapeJob>>) {
        let mut next = self.first_slot();
        let mut last_error: Option<String> = None;
        let mut last_scrape: Option<i64> = None;
        loop {
            let wait = Duration::from_millis((next - now_ms()).max(0) as u64);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = state.changed() => break,
                changed = jobs.changed() => {
                    if changed.is_ok() {
                        let job = jobs.borrow_and_update().clone();
                        let moved = job.interval != self.ingest.job.interval;
                        self.reconfigure(job);
                        if moved {
                            next = self.first_slot();
                        }
                    }
                    continue;
                }
            }
            let period = self.ingest.job.interval.as_millis().max(1) as i64;
            let ts = now_ms();
            last_scrape = Some(ts);
            let err = self.scrape_once(ts).await;
            match (&err, &last_error) {
                (Some(e), prev) if prev.as_deref() != Some(&e.to_string()) => {
                    tracing::warn!(job = %self.ingest.job.job_name, target_url = %self.ingest.target.url, error = %e, "scrape failed");
                    last_error = Some(e.to_string());
                }
                (None, Some(_)) => {
                    tracing::info!(job = %self.ingest.job.job_name, target_url = %self.ingest.target.url, "scrape recovered");
                    last_error = None;
                }
                _ => {}
            }
            next += period;
            let now = now_ms();
            if next <= now {
                // Fell behind (a slow scrape): skip to the next slot instead of bursting.
                next += ((now - next) / period + 1) * period;
            }
        }
        if *state.borrow() != LoopState::Removed {
            return;
        }
        let period = self.ingest.job.interval.as_millis().max(1) as i64;
        let stale_at = last_scrape.map_or_else(now_ms, |t| t.saturating_add(period));
        let write_at = stale_at.saturating_add(period);
        let wait = Duration::from_millis(write_at.saturating_sub(now_ms()).max(0) as u64);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            // A shutdown while waiting: no markers.
            _ = state.changed() => return,
        }
        if let Err(e) = off_async_workers(|| self.ingest.end(stale_at)) {
            tracing::error!(target_url = %self.ingest.target.url, error = %e, "writing end-of-target staleness markers failed");
        }
    }
}

#[cfg(test)]
mod tests;
