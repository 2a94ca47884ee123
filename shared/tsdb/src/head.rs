//! The head block: every active series in memory, as sealed chunks plus one open chunk,
//! with the inverted index over their labels.
//!
//! Concurrency: the series table and index sit behind one `RwLock` (taken for writing only
//! when a series is created or garbage-collected); each series' samples behind their own
//! mutex, so queries and appends to different series do not contend.

use crate::index::{Interner, PostingsIndex, SeriesRef};
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use strata_chunk::{Chunk, ChunkAppender, CHUNK_MAX_SAMPLES};
use strata_model::matcher::Matcher;
use strata_model::{Labels, Metadata, MetricType, Sample, METRIC_NAME};

/// Why one sample was refused. Matches Prometheus' append errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    #[error("out of order sample")]
    OutOfOrder,
    #[error("duplicate sample for timestamp")]
    DuplicateTimestamp,
    #[error("out of bounds: older than the retention window")]
    OutOfBounds,
    #[error("too far in the future: more than the grace period ahead of the wall clock")]
    TooFarInFuture,
    #[error("series limit reached")]
    SeriesLimit,
}

impl SampleError {
    pub fn reason(&self) -> &'static str {
        match self {
            SampleError::OutOfOrder => "out_of_order",
            SampleError::DuplicateTimestamp => "duplicate",
            SampleError::OutOfBounds => "out_of_bounds",
            SampleError::TooFarInFuture => "too_far_in_future",
            SampleError::SeriesLimit => "series_limit",
        }
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum HeadError {
    #[error("series limit of {limit} reached: refusing new series {series}")]
    SeriesLimit { limit: usize, series: String },
    #[error("invalid series {series}: {reason}")]
    InvalidSeries { series: String, reason: String },
}

/// The end of the block-range window that holds `t`.
pub fn block_end(t: i64, block_range: i64) -> i64 {
    let r = block_range.max(1);
    t.div_euclid(r).saturating_add(1).saturating_mul(r)
}

/// A series' open chunk continued by a chunk from another head (see
/// [`SeriesSamples::continuation`]).
pub struct OpenContinuation {
    /// The chunk starts after the newest sample: the open chunk is sealed before it.
    pub fresh: bool,
    pub appender: ChunkAppender,
    /// The samples it adds, in order.
    pub samples: Vec<Sample>,
    /// It continues the newest sealed chunk (see `reopened_for`), which it replaces.
    pub replaces_sealed: bool,
}

pub struct SeriesSamples {
    sealed: Vec<Chunk>,
    open: ChunkAppender,
    last: Option<Sample>,
    /// Restored from a head snapshot and not appended to since (see `reopen`).
    restored: bool,
}

impl SeriesSamples {
    fn new() -> Self {
        SeriesSamples { sealed: Vec::new(), open: ChunkAppender::new(), last: None, restored: false }
    }

    /// Checks a sample against this series' newest one: `Some(Ok(true))` is newer,
    /// `Some(Ok(false))` an exact duplicate of the newest (accepted and ignored, so a retried
    /// write is idempotent), `None` older, which is a duplicate only if it is stored: the
    /// caller asks [`holds_each`](Self::holds_each) for all of a batch's older samples at
    /// once, since that decodes chunks.
    pub fn check(&self, s: &Sample) -> Option<Result<bool, SampleError>> {
        match self.last {
            None => Some(Ok(true)),
            Some(last) if s.t > last.t => Some(Ok(true)),
            Some(last) if s.t == last.t => {
                Some(if last.v.to_bits() == s.v.to_bits() { Ok(false) } else { Err(SampleError::DuplicateTimestamp) })
            }
            Some(_) => None,
        }
    }

    /// For each of `samples` (in time order), whether that exact sample (timestamp and
    /// value bits) is stored. Each chunk they fall in is decoded once, however many there are.
    pub fn holds_each(&self, samples: &[Sample]) -> Vec<bool> {
        let mut decoded: Option<(usize, Vec<Sample>)> = None;
        let open = (!self.open.is_empty()).then(|| self.open.seal());
        samples
            .iter()
            .map(|s| {
                let i = self.sealed.partition_point(|c| c.max_t < s.t);
                let chunk = match self.sealed.get(i) {
                    Some(c) if c.min_t <= s.t => c,
                    Some(_) => return false,
                    None => match &open {
                        Some(o) if o.min_t <= s.t => o,
                        _ => return false,
                    },
                };
                if decoded.as_ref().map(|(at, _)| *at) != Some(i) {
                    decoded = Some((i, chunk.iter().collect()));
                }
                let got = decoded.as_ref().map_or(&[][..], |(_, v)| &v[..]);
                let at = got.partition_point(|x| x.t < s.t);
                got.get(at).is_some_and(|x| x.bit_eq(s))
            })
            .collect()
    }

    /// Appends a sample that passed [`check`](Self::check). A chunk never spans a multiple
    /// of `block_range`: the head cuts blocks at those times, so every chunk belongs wholly
    /// to one block and goes to disk as it is.
    pub fn append(&mut self, s: Sample, block_range: i64) {
        self.reopen(s.t, block_range);
        if !self.open.is_empty() && s.t >= block_end(self.open.min_t(), block_range) {
            self.seal_open(false);
        }
        self.open.append(s.t, s.v);
        self.last = Some(s);
        if self.open.is_full() {
            // Sealed as soon as it fills, so queries of the recent past meet the block form.
            self.seal_open(true);
        }
    }

    /// Whether [`adopt`](Self::adopt) may take `chunk`: it starts after this series' newest
    /// sample and lies within one block-range window (as every chunk of the head does).
    pub fn can_adopt(&self, chunk: &Chunk, block_range: i64) -> bool {
        self.last.is_none_or(|l| chunk.min_t > l.t)
            && chunk.min_t <= chunk.max_t
            && chunk.max_t < block_end(chunk.min_t, block_range)
    }

    /// Takes a sealed chunk that passed [`can_adopt`](Self::can_adopt) as it is, `last`
    /// being its newest sample: a backlog forwarded from another tier is stored without
    /// appending its samples one by one. The open chunk is sealed first, so chunks stay
    /// in time order and apart.
    pub fn adopt(&mut self, chunk: Chunk, last: Sample) {
        self.restored = false;
        if !self.open.is_empty() {
            // Not transcoded now (a catching-up backlog seals one per series and batch):
            // a block cut takes it in the block encoding (see `chunks_within`).
            let sealed = self.open.seal();
            self.open = ChunkAppender::new();
            self.sealed.push(sealed);
        }
        self.sealed.push(chunk);
        self.last = Some(last);
    }

    pub fn last(&self) -> Option<Sample> {
        self.last
    }

    /// After a restore from a head snapshot (which holds the open chunk sealed, in the
    /// block encoding), makes the newest chunk the open one again when it ends at the newest
    /// sample, is not full, and `t` falls in its block window: appended again in the
    /// streaming encoding, it is the chunk appending without the restart would have made
    /// (the coder is deterministic), so a regional's open chunk stays the bits of its
    /// edge's (see [`continuation`](Self::continuation)). Once per restore.
    fn reopen(&mut self, t: i64, block_range: i64) {
        if !std::mem::take(&mut self.restored) || !self.open.is_empty() {
            return;
        }
        let Some(c) = self.sealed.last() else { return };
        if c.n >= CHUNK_MAX_SAMPLES || t >= block_end(c.min_t, block_range) || self.last.is_none_or(|l| l.t != c.max_t)
        {
            return;
        }
        let Ok(samples) = c.decode() else { return };
        let mut open = ChunkAppender::with_capacity(c.data.len() + c.data.len() / 4);
        for s in &samples {
            open.append(s.t, s.v);
        }
        self.sealed.pop();
        self.open = open;
    }

    /// The newest chunk as the open one again, when `c`, an open chunk, begins where it
    /// does and continues its samples: that chunk came whole (a backlog's samples, sealed
    /// again by its sender) while the sender went on appending to its own open chunk, and
    /// appended again in the streaming encoding it is the chunk the sender has been
    /// continuing (the coder is deterministic). Without this, `c`'s samples would go one
    /// by one until it ends. `None` when the bits do not agree. Nothing changes here:
    /// [`continue_open`](Self::continue_open) replaces the sealed chunk, once the batch is
    /// taken.
    fn reopened_for(&self, c: &Chunk, block_range: i64) -> Option<ChunkAppender> {
        if !self.open.is_empty() || c.is_block() {
            return None;
        }
        let s = self.sealed.last()?;
        let candidate = s.min_t == c.min_t
            && s.n < c.n
            && s.n < CHUNK_MAX_SAMPLES
            && s.max_t < c.max_t
            && c.max_t < block_end(s.min_t, block_range)
            && self.last.is_some_and(|l| l.t == s.max_t);
        if !candidate {
            return None;
        }
        let samples = s.decode().ok()?;
        // Sized from what is stored, never from what the sender sent.
        let mut open = ChunkAppender::with_capacity(s.data.len().saturating_mul(2));
        for x in &samples {
            open.append(x.t, x.v);
        }
        open.is_continued_by(c).then_some(open)
    }

    /// What taking `c`'s samples up to `through` as this series' open chunk would give,
    /// without decoding what the series holds: `c` continues the open chunk (its first
    /// bits are the open chunk's: the sender's head appended the same samples), or starts
    /// after the newest sample (`fresh`). `Ok(None)` when neither holds, or when the
    /// samples would cross the open chunk's block window; an error when the bits after
    /// the shared ones do not decode.
    pub fn continuation(
        &mut self,
        c: &Chunk,
        through: i64,
        block_range: i64,
    ) -> Result<Option<OpenContinuation>, strata_chunk::ChunkError> {
        self.reopen(c.min_t, block_range);
        if through >= block_end(c.min_t, block_range) {
            return Ok(None);
        }
        let reopened = self.reopened_for(c, block_range);
        let fresh = reopened.is_none() && !self.open.is_continued_by(c);
        if fresh && self.last.is_some_and(|l| c.min_t <= l.t) {
            return Ok(None);
        }
        let k = match (&reopened, fresh) {
            (Some(r), _) => r.continued_by(c, through)?,
            (None, true) => ChunkAppender::new().continued_by(c, through)?,
            (None, false) => self.open.continued_by(c, through)?,
        };
        let Some(k) = k else { return Ok(None) };
        if k.samples.first().zip(self.last).is_some_and(|(f, l)| f.t <= l.t) {
            return Ok(None);
        }
        Ok(Some(OpenContinuation {
            fresh,
            appender: k.appender,
            samples: k.samples,
            replaces_sealed: reopened.is_some(),
        }))
    }

    /// `c` as a chunk begun anew after chunks a batch takes before it (whose newest sample
    /// is `after`): [`continuation`](Self::continuation)'s fresh case, judged against those
    /// chunks rather than against what the series holds now.
    pub fn begun_anew(
        c: &Chunk,
        through: i64,
        block_range: i64,
        after: Sample,
    ) -> Result<Option<OpenContinuation>, strata_chunk::ChunkError> {
        if through >= block_end(c.min_t, block_range) || c.min_t <= after.t || c.n > CHUNK_MAX_SAMPLES {
            return Ok(None);
        }
        let Some(k) = ChunkAppender::new().continued_by(c, through)? else { return Ok(None) };
        if k.samples.first().is_some_and(|f| f.t <= after.t) {
            return Ok(None);
        }
        Ok(Some(OpenContinuation { fresh: true, appender: k.appender, samples: k.samples, replaces_sealed: false }))
    }

    /// Takes what [`continuation`](Self::continuation) gave, the series unchanged since.
    pub fn continue_open(&mut self, k: OpenContinuation) {
        let Some(&newest) = k.samples.last() else { return };
        if k.fresh && !self.open.is_empty() {
            self.seal_open(false);
        }
        // The newest sealed chunk is the continued one's beginning (`reopened_for`; nothing
        // appended to the series since: the WAL's lock is held throughout).
        if k.replaces_sealed {
            if self.sealed.last().is_some_and(|s| s.min_t == k.appender.min_t()) {
                self.sealed.pop();
            } else {
                // Cannot happen while the WAL's lock spans the two calls; if it did, the
                // head would hold those samples twice (the same values), not lose them.
                debug_assert!(false, "the reopened chunk is no longer the newest sealed one");
                tracing::error!(min_t = k.appender.min_t(), "head: a reopened chunk was not the newest sealed one");
            }
        }
        self.open = k.appender;
        self.last = Some(newest);
        if self.open.is_full() {
            self.seal_open(true);
        }
    }

    /// Seals the open chunk (in the block encoding when that is no larger) and begins a new
    /// one: after a full chunk with a quarter of its bytes (the buffer then grows by
    /// eighths, see the chunk crate's `BitWriter`, so a fresh chunk does not hold a full
    /// one's memory), else empty.
    fn seal_open(&mut self, full: bool) {
        let sealed = self.open.seal();
        self.open = ChunkAppender::with_capacity(if full { sealed.data.len() / 4 } else { 0 });
        self.sealed.push(sealed.compact());
    }

    /// Every chunk, the open one sealed as a snapshot: what a head snapshot writes.
    pub fn all_chunks(&self) -> Vec<Chunk> {
        self.chunks(i64::MIN, i64::MAX)
    }

    /// Puts back what a head snapshot held: sealed chunks (the open one among them, sealed)
    /// and the newest sample. Appends continue the open one (see `reopen`).
    pub fn restore(&mut self, sealed: Vec<Chunk>, last: Option<Sample>) {
        self.sealed = sealed;
        self.open = ChunkAppender::new();
        self.last = last;
        self.restored = true;
    }

    /// Chunks overlapping `[mint, maxt]`, the open one sealed as a snapshot.
    fn chunks(&self, mint: i64, maxt: i64) -> Vec<Chunk> {
        let mut v: Vec<Chunk> = self.sealed.iter().filter(|c| c.overlaps(mint, maxt)).cloned().collect();
        if !self.open.is_empty() && self.open.min_t() <= maxt && self.open.max_t() >= mint {
            v.push(self.open.seal());
        }
        v
    }

    fn byte_size(&self) -> usize {
        self.sealed.iter().map(|c| c.data.len()).sum::<usize>() + self.open.byte_len()
    }

    fn sample_count(&self) -> u64 {
        self.sealed.iter().map(|c| c.n as u64).sum::<u64>() + self.open.len() as u64
    }
}

/// The key of the head's series-by-labels map (in memory only, so any fast hash does): the
/// names and values with separators, so that ("ab", "c") and ("a", "bc") differ.
fn series_hash<'a>(seed: &impl std::hash::BuildHasher, pairs: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> u64 {
    use std::hash::Hasher;
    let mut h = seed.build_hasher();
    for (name, value) in pairs {
        h.write(name);
        h.write_u8(0xff);
        h.write(value);
        h.write_u8(0xff);
    }
    h.finish()
}

pub struct MemSeries {
    pub series_ref: SeriesRef,
    pub labels: Labels,
    pub samples: Mutex<SeriesSamples>,
    /// WAL segment in which this series' labels were last logged (u32::MAX: never).
    pub logged_segment: AtomicU32,
    /// Set when retention removed the series from the head. A holder of the old handle (a
    /// scrape's series cache) that appends again gets a live series with the same labels
    /// from the database instead of writing into a series no query can see.
    pub removed: std::sync::atomic::AtomicBool,
}

impl MemSeries {
    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Relaxed)
    }

    /// The chunks wholly inside `[start, end)`: what a block cut of that window takes
    /// (chunks end at block boundaries, see [`SeriesSamples::append`]). The open chunk,
    /// when the window holds it (a flush, or no sample yet past the boundary), goes in
    /// the block encoding like every sealed one, so that blocks hold no streaming chunk
    /// that queries would decode several times slower.
    pub fn chunks_within(&self, start: i64, end: i64) -> Vec<Chunk> {
        let mut chunks = self.samples.lock().chunks(start, end.saturating_sub(1));
        chunks.retain(|c| c.min_t >= start && c.max_t < end);
        chunks.into_iter().map(Chunk::compact).collect()
    }
}

#[derive(Default)]
struct SeriesTable {
    by_hash: HashMap<u64, Vec<SeriesRef>, foldhash::fast::RandomState>,
    series: HashMap<SeriesRef, Arc<MemSeries>, foldhash::fast::RandomState>,
    index: PostingsIndex,
    interner: Interner,
}

/// Counts the head exposes for self-monitoring and benchmarks.
/// A selected series and its chunks that overlap the selected range.
pub type SelectedSeries = (Arc<MemSeries>, Vec<Chunk>);

#[derive(Debug, Clone, Copy, Default)]
pub struct HeadStats {
    pub series: usize,
    pub samples: u64,
    pub chunk_bytes: usize,
    pub index_bytes: usize,
    pub label_bytes: usize,
}

pub struct HeadBlock {
    table: RwLock<SeriesTable>,
    metadata: RwLock<HashMap<String, Metadata>>,
    next_ref: AtomicU64,
    max_series: usize,
    min_t: AtomicI64,
    max_t: AtomicI64,
    /// Seeds the series-by-labels keys: random per process, so that no client can choose
    /// labels that all land in one bucket.
    label_hasher: foldhash::fast::RandomState,
}

/// Suffixes under which a metric's samples appear while its metadata names the family.
const FAMILY_SUFFIXES: [&str; 6] = ["_total", "_bucket", "_count", "_sum", "_created", "_info"];

/// A metric's type from metadata keyed by family: by its own name, else by the family its
/// suffix implies (`foo_total` → `foo`).
pub fn lookup_type(get: impl Fn(&str) -> Option<MetricType>, metric: &str) -> Option<MetricType> {
    get(metric).or_else(|| FAMILY_SUFFIXES.iter().filter_map(|s| metric.strip_suffix(s)).find_map(&get))
}

/// Longest family name, help or unit kept.
pub const MAX_METADATA_BYTES: usize = 1024;
/// Metric families whose metadata the head keeps at most.
pub const MAX_METADATA_FAMILIES: usize = 100_000;

fn truncate_utf8(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}

impl HeadBlock {
    pub fn new(max_series: usize) -> Self {
        HeadBlock {
            table: RwLock::new(SeriesTable::default()),
            metadata: RwLock::new(HashMap::new()),
            next_ref: AtomicU64::new(1),
            max_series,
            min_t: AtomicI64::new(i64::MAX),
            max_t: AtomicI64::new(i64::MIN),
            label_hasher: Default::default(),
        }
    }

    /// Oldest sample timestamp held (a lower bound after truncation), `i64::MAX` when empty.
    pub fn min_time(&self) -> i64 {
        self.min_t.load(Ordering::Relaxed)
    }

    /// Newest sample timestamp held, `i64::MIN` when empty.
    pub fn max_time(&self) -> i64 {
        self.max_t.load(Ordering::Relaxed)
    }

    pub fn note_time(&self, t: i64) {
        self.min_t.fetch_min(t, Ordering::Relaxed);
        self.max_t.fetch_max(t, Ordering::Relaxed);
    }

    fn find(table: &SeriesTable, hash: u64, labels: &Labels) -> Option<Arc<MemSeries>> {
        table.by_hash.get(&hash)?.iter().filter_map(|r| table.series.get(r)).find(|s| &s.labels == labels).cloned()
    }

    /// The series with exactly these labels, if the head holds it.
    pub fn get(&self, labels: &Labels) -> Option<Arc<MemSeries>> {
        let hash = series_hash(&self.label_hasher, labels.iter().map(|l| (l.name.as_bytes(), l.value.as_bytes())));
        Self::find(&self.table.read(), hash, labels)
    }

    /// The series with exactly these labels, given as (name, value) pairs sorted by name and
    /// without empty values, if the head holds it: a lookup that allocates nothing, for a
    /// receiver that reads labels in place. Stored labels are valid, so bytes that match
    /// them need no other check.
    pub fn find_pairs(&self, pairs: &[(&[u8], &[u8])]) -> Option<Arc<MemSeries>> {
        let hash = series_hash(&self.label_hasher, pairs.iter().copied());
        let t = self.table.read();
        let same = |s: &&Arc<MemSeries>| {
            s.labels.len() == pairs.len()
                && s.labels.iter().zip(pairs).all(|(l, (n, v))| l.name.as_bytes() == *n && l.value.as_bytes() == *v)
        };
        t.by_hash.get(&hash)?.iter().filter_map(|r| t.series.get(r)).find(same).cloned()
    }

    /// The series with these labels, created if new. The bool says whether it was created.
    pub fn get_or_create(&self, labels: &Labels) -> Result<(Arc<MemSeries>, bool), HeadError> {
        let hash = series_hash(&self.label_hasher, labels.iter().map(|l| (l.name.as_bytes(), l.value.as_bytes())));
        if let Some(s) = Self::find(&self.table.read(), hash, labels) {
            return Ok((s, false));
        }
        if labels.metric_name().is_none() {
            return Err(HeadError::InvalidSeries { series: labels.to_string(), reason: "no metric name".into() });
        }
        let mut t = self.table.write();
        if let Some(s) = Self::find(&t, hash, labels) {
            return Ok((s, false));
        }
        if t.series.len() >= self.max_series {
            return Err(HeadError::SeriesLimit { limit: self.max_series, series: labels.to_string() });
        }
        let r = self.next_ref.fetch_add(1, Ordering::Relaxed);
        Ok((Self::insert(&mut t, r, hash, labels), true))
    }

    fn insert(t: &mut SeriesTable, r: SeriesRef, hash: u64, labels: &Labels) -> Arc<MemSeries> {
        let labels = t.interner.intern_labels(labels);
        let s = Arc::new(MemSeries {
            series_ref: r,
            labels,
            samples: Mutex::new(SeriesSamples::new()),
            logged_segment: AtomicU32::new(u32::MAX),
            removed: std::sync::atomic::AtomicBool::new(false),
        });
        t.index.add(r, &s.labels);
        t.by_hash.entry(hash).or_default().push(r);
        t.series.insert(r, s.clone());
        s
    }

    /// Re-creates a series under the reference the WAL recorded (replay). The series limit
    /// does not apply: what was acknowledged once is never refused on restart. When the
    /// labels already belong to a series under another reference (a series removed by
    /// retention and created again under a new one), that series is returned: the caller
    /// maps `r` to it, so one label set is always one series.
    pub fn restore(&self, r: SeriesRef, labels: &Labels) -> Arc<MemSeries> {
        // No reference the WAL has used is handed out again, whether it maps to a series of
        // its own or to one restored under another reference: a later start would replay
        // the old use and the new one under the same number.
        self.next_ref.fetch_max(r.saturating_add(1), Ordering::Relaxed);
        let mut t = self.table.write();
        let hash = series_hash(&self.label_hasher, labels.iter().map(|l| (l.name.as_bytes(), l.value.as_bytes())));
        if let Some(s) = Self::find(&t, hash, labels) {
            return s;
        }
        if t.series.contains_key(&r) {
            // The reference names other labels here (damage, or a reference reused by an
            // older version): these labels get one of their own.
            let fresh = self.next_ref.fetch_add(1, Ordering::Relaxed);
            return Self::insert(&mut t, fresh, hash, labels);
        }
        Self::insert(&mut t, r, hash, labels)
    }

    pub fn series(&self, r: SeriesRef) -> Option<Arc<MemSeries>> {
        self.table.read().series.get(&r).cloned()
    }

    /// Every series held, in no order.
    pub fn all_series(&self) -> Vec<Arc<MemSeries>> {
        self.table.read().series.values().cloned().collect()
    }

    /// Every series, in label order: handles only, so that a caller reading their chunks
    /// one at a time holds one series' chunk list, not all of them.
    pub fn all_series_sorted(&self) -> Vec<Arc<MemSeries>> {
        let mut all = self.all_series();
        all.sort_unstable_by(|a, b| a.labels.cmp(&b.labels));
        all
    }

    pub fn num_series(&self) -> usize {
        self.table.read().series.len()
    }

    /// Records a family's metadata. Bounded: family names, help
    /// and unit are cut to [`MAX_METADATA_BYTES`] (as Mimir's `max_metadata_length`), and
    /// past [`MAX_METADATA_FAMILIES`] a new family is not recorded. Returns what was stored
    /// when it changed, for the WAL.
    pub fn set_metadata(&self, family: &str, mut meta: Metadata) -> Option<Metadata> {
        if family.is_empty() || family.len() > MAX_METADATA_BYTES {
            return None;
        }
        truncate_utf8(&mut meta.help, MAX_METADATA_BYTES);
        truncate_utf8(&mut meta.unit, MAX_METADATA_BYTES);
        let mut m = self.metadata.write();
        match m.get(family) {
            Some(old) if *old == meta => return None,
            None if m.len() >= MAX_METADATA_FAMILIES => return None,
            _ => {}
        }
        m.insert(family.to_string(), meta.clone());
        Some(meta)
    }

    /// Forgets a family's metadata (its WAL record could not be written: the next
    /// [`set_metadata`](Self::set_metadata) must see a change and log it).
    pub(crate) fn forget_metadata(&self, family: &str) {
        self.metadata.write().remove(family);
    }

    /// Forgets the metadata of families that no longer have a series (after retention).
    fn collect_unused_metadata(&self) {
        let names: HashSet<String> = self.label_values(METRIC_NAME).into_iter().collect();
        let used = |family: &str| {
            names.contains(family) || FAMILY_SUFFIXES.iter().any(|s| names.contains(&format!("{family}{s}")))
        };
        self.metadata.write().retain(|family, _| used(family));
    }

    pub fn all_metadata(&self) -> Vec<(String, Metadata)> {
        let mut v: Vec<_> = self.metadata.read().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The type of a metric, looked up by its name or by its family (`foo_total` → `foo`).
    pub fn metric_type(&self, metric: &str) -> MetricType {
        let m = self.metadata.read();
        lookup_type(|family| m.get(family).map(|x| x.metric_type), metric).unwrap_or_default()
    }

    /// Series matching the matchers that hold samples in `[mint, maxt]`, sorted by labels.
    pub fn select(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Vec<SelectedSeries> {
        let unlimited: Result<_, std::convert::Infallible> = self.select_charged(matchers, mint, maxt, |_| Ok(()));
        unlimited.unwrap_or_else(|never| match never {})
    }

    /// [`select`](Self::select) that calls `charge` with each matching series' chunks as
    /// it collects them and stops at the first error, so a selection over a limit ends
    /// there instead of after gathering every match.
    pub fn select_charged<E>(
        &self,
        matchers: &[Matcher],
        mint: i64,
        maxt: i64,
        mut charge: impl FnMut(&[Chunk]) -> Result<(), E>,
    ) -> Result<Vec<SelectedSeries>, E> {
        let refs = self.table.read().index.select(matchers);
        let mut out = Vec::new();
        for r in refs {
            let Some(s) = self.table.read().series.get(&r).cloned() else { continue };
            let chunks = s.samples.lock().chunks(mint, maxt);
            if chunks.is_empty() {
                continue;
            }
            charge(&chunks)?;
            out.push((s, chunks));
        }
        out.sort_by(|a, b| a.0.labels.cmp(&b.0.labels));
        Ok(out)
    }

    /// Matching series that have samples in range, without their data (for label queries).
    pub fn select_labels(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Vec<Labels> {
        let series: Vec<Arc<MemSeries>> = {
            let t = self.table.read();
            t.index.select(matchers).iter().filter_map(|r| t.series.get(r).cloned()).collect()
        };
        let mut out: Vec<Labels> = series
            .into_iter()
            .filter(|s| {
                let g = s.samples.lock();
                let lo = g.sealed.first().map(|c| c.min_t).unwrap_or(g.open.min_t());
                g.last.is_some_and(|l| l.t >= mint) && lo <= maxt
            })
            .map(|s| s.labels.clone())
            .collect();
        out.sort();
        out
    }

    pub fn label_names(&self) -> Vec<String> {
        self.table.read().index.label_names()
    }

    pub fn label_values(&self, name: &str) -> Vec<String> {
        self.table.read().index.label_values(name)
    }

    /// Drops chunks entirely older than `cutoff`, and series left with nothing newer.
    /// Returns the number of series removed.
    pub fn truncate_before(&self, cutoff: i64) -> usize {
        if cutoff <= self.min_t.load(Ordering::Relaxed) {
            // Nothing is that old: skip the pass over every series (retention runs often).
            return 0;
        }
        let all: Vec<Arc<MemSeries>> = self.table.read().series.values().cloned().collect();
        let mut dead = Vec::new();
        for s in all {
            let mut g = s.samples.lock();
            g.sealed.retain(|c| c.max_t >= cutoff);
            let empty = g.last.is_none_or(|l| l.t < cutoff);
            if empty {
                dead.push(s.clone());
            }
        }
        let removed = dead.len();
        if !dead.is_empty() {
            let mut t = self.table.write();
            t.index.remove_all(dead.iter().map(|s| (s.series_ref, &s.labels)));
            for s in &dead {
                s.removed.store(true, Ordering::Relaxed);
                t.series.remove(&s.series_ref);
                let hash =
                    series_hash(&self.label_hasher, s.labels.iter().map(|l| (l.name.as_bytes(), l.value.as_bytes())));
                if let Some(v) = t.by_hash.get_mut(&hash) {
                    v.retain(|r| *r != s.series_ref);
                    if v.is_empty() {
                        t.by_hash.remove(&hash);
                    }
                }
            }
            drop(t);
            // The dead series' labels hold their strings until `dead` drops.
            drop(dead);
            self.table.write().interner.gc();
            self.collect_unused_metadata();
        }
        if cutoff > self.min_t.load(Ordering::Relaxed) {
            self.min_t.store(cutoff, Ordering::Relaxed);
        }
        removed
    }

    pub fn stats(&self) -> HeadStats {
        let t = self.table.read();
        let mut st = HeadStats { series: t.series.len(), ..Default::default() };
        for s in t.series.values() {
            let g = s.samples.lock();
            st.chunk_bytes += g.byte_size();
            st.samples += g.sample_count();
        }
        // per series: the Arc'd MemSeries struct, its label vector, two map entries
        let per_series = std::mem::size_of::<MemSeries>() + 16 + 8 + 16 + 24;
        st.label_bytes = t.series.values().map(|s| s.labels.len() * std::mem::size_of::<strata_model::Label>()).sum();
        st.index_bytes = t.index.byte_size() + t.interner.byte_size() + t.series.len() * per_series + st.label_bytes;
        st
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_find_exactly_the_series_with_those_labels() {
        let head = HeadBlock::new(100);
        let a = Labels::from_pairs([("__name__", "m"), ("gpu", "0"), ("job", "dcgm")]);
        let (s, created) = head.get_or_create(&a).unwrap();
        assert!(created);
        let b = |v: &[(&'static str, &'static str)]| -> Vec<(&'static [u8], &'static [u8])> {
            v.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())).collect()
        };
        let found = head.find_pairs(&b(&[("__name__", "m"), ("gpu", "0"), ("job", "dcgm")])).unwrap();
        assert_eq!(found.series_ref, s.series_ref);
        for other in [
            &[("__name__", "m"), ("gpu", "1"), ("job", "dcgm")][..],
            &[("__name__", "m"), ("gpu", "0")][..],
            &[("__name__", "m"), ("gpu", "0"), ("job", "dcgm"), ("x", "y")][..],
            &[("__name__", "m"), ("gpu0", ""), ("job", "dcgm")][..],
            &[("__name__", "m"), ("job", "dcgm"), ("gpu", "0")][..],
        ] {
            assert!(head.find_pairs(&b(other)).is_none(), "{other:?}");
        }
    }
}
