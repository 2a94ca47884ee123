//! An upstream's backlog read from storage instead of the WAL.
//!
//! The edge's WAL is the forward queue, but it takes about three times the disk its blocks
//! do: holding it through a long outage would cost disk the edge does not otherwise use. So
//! once the head checkpoint covers WAL segments an upstream still needs (everything in them
//! is then in blocks or in the checkpointed head), the forwarder notes what those segments
//! hold that the upstream has not acknowledged, one [`BacklogEntry`] per series: its labels,
//! the first and last timestamps of those samples, and how many there were. The WAL holds
//! each series' samples in time order, so that is exactly the series' samples within
//! `[first, last]` in storage: they are sent from there (blocks and head, oldest data first
//! per series), and then the WAL the edge still keeps, and the segments are let go. Nothing
//! is sent twice or skipped; where storage no longer holds all an entry counted (past
//! retention, a damaged block) the shortfall is counted and logged with its range.
//!
//! An upstream met again far behind (after an outage) gets the WAL written so far the same
//! way, since reading storage series by series is several times faster than replaying the
//! WAL record by record. A regional met for the first time, or back with a new storage
//! identity, gets everything the edge holds ([`Backlog::everything`]): every stored series
//! up to its last sample in the WAL as far as it was scanned, and the WAL from there.
//!
//! The backlog is written beside the upstream's cursor (`<upstream>.backlog`), whole and
//! `fsync`ed before the cursor that refers to it, and read back whole; a damaged one is
//! refused, never half used.

use crate::cursor::ReplayAt;
use crate::FastMap as HashMap;
use std::io::Write;
use std::path::Path;
use strata_chunk::Chunk;
use strata_model::matcher::{MatchOp, Matcher};
use strata_model::{Labels, Sample};
use strata_store::{SelectBudget, SelectLimits, SelectRequest, StoreError};
use strata_tsdb::db::Tsdb;
use strata_tsdb::index::SeriesRef;
use strata_tsdb::wal::{self, WalCursor, WalError, WalReader, WalRecord};
use strata_tsdb::TsdbStore;

/// One series' samples an upstream still needs: those within `[first, last]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BacklogEntry {
    pub labels: Labels,
    pub first: i64,
    pub last: i64,
    /// How many the WAL held (`None`: not counted, for [`Backlog::everything`]).
    pub samples: Option<u64>,
}

/// Entries sorted by labels, one per series.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backlog {
    pub entries: Vec<BacklogEntry>,
}

/// Why a backlog file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BacklogError {
    /// It may read next time.
    #[error("{0}")]
    Io(String),
    /// It never will: what it listed is lost.
    #[error("{0}")]
    Damaged(String),
}

/// What a WAL scan found besides the backlog.
#[derive(Debug, Clone)]
pub struct Scanned {
    /// Samples of references their segment does not name (damage): not in the backlog.
    pub unnamed: u64,
    /// The position after the last record read.
    pub reached: WalCursor,
    /// The labels `reached`'s segment named before it, by reference: a reader going on
    /// from there needs them, and need not read the segment again to find them.
    pub labels_before: HashMap<SeriesRef, Labels>,
}

const HEADER: &[u8] = b"strata forward backlog v1\n";

impl Backlog {
    /// The samples of the WAL from `from` (of whose record the first `skip` are
    /// acknowledged) up to the record boundary `until`, per series; `Scanned::reached` is
    /// where reading stopped (before `until` when the WAL ends earlier).
    pub fn scan_wal(db: &Tsdb, from: WalCursor, skip: u64, until: WalCursor) -> Result<(Backlog, Scanned), WalError> {
        let mut reader = WalReader::new(&db.wal_dir(), from);
        let mut segment = from.segment;
        // Per segment: reference → entry; entries found by labels across segments. A
        // segment names each series once: its labels become an entry (or find the one
        // an earlier segment made) as they are read, so they are neither kept per
        // reference nor cloned.
        let mut by_ref = RefSlots::default();
        let mut entries = EntryIndex::default();
        for (r, labels) in labels_before(db, from)? {
            by_ref.insert(r, entries.find_or_add(labels));
        }
        let mut scanned = Scanned { unnamed: 0, reached: from, labels_before: HashMap::default() };
        let mut skip = usize::try_from(skip).unwrap_or(usize::MAX);
        while let Some((rec, after)) = reader.next_record()? {
            if after > until {
                break;
            }
            scanned.reached = after;
            if after.segment != segment {
                by_ref.clear();
                segment = after.segment;
            }
            let skip_here = std::mem::take(&mut skip);
            match rec.chunk_as_samples() {
                WalRecord::Series { series_ref, labels } => {
                    by_ref.insert(series_ref, entries.find_or_add(labels));
                }
                // Chunks were made samples above.
                WalRecord::Metadata { .. } | WalRecord::Chunk { .. } => {}
                WalRecord::Samples(samples) => {
                    for &(r, s) in samples.iter().skip(skip_here) {
                        let Some(e) = by_ref.get(r).and_then(|i| entries.entries.get_mut(i)) else {
                            scanned.unnamed += 1;
                            continue;
                        };
                        // A repeat (a segment rewritten after a crash) is stored once; an
                        // older sample (appended out of order) widens the range.
                        if e.last == i64::MIN {
                            (e.first, e.last, e.samples) = (s.t, s.t, Some(1));
                        } else if s.t < e.first {
                            e.first = s.t;
                            e.samples = e.samples.map(|n| n + 1);
                        } else if s.t > e.last {
                            e.last = s.t;
                            e.samples = e.samples.map(|n| n + 1);
                        }
                    }
                    reader.recycle(samples);
                }
            }
        }
        scanned.labels_before = by_ref.labels(&entries.entries);
        // Series named but without a sample after `from`.
        let mut entries = entries.entries;
        entries.retain(|e| e.last != i64::MIN);
        entries.sort_unstable_by(|a, b| a.labels.cmp(&b.labels));
        Ok((Backlog { entries }, scanned))
    }

    /// Everything `db` holds, read from storage up to the returned WAL position and from
    /// the WAL after it: every stored series up to its last sample in the WAL so far (from
    /// `wal_from` on), or up to the newest stored when the WAL has none of it.
    pub fn everything(db: &std::sync::Arc<Tsdb>, wal_from: WalCursor) -> Result<(Backlog, Scanned), String> {
        let (in_wal, scanned) = Backlog::scan_wal(db, wal_from, 0, db.wal_cursor()).map_err(|e| e.to_string())?;
        let in_wal: HashMap<&Labels, &BacklogEntry> = in_wal.entries.iter().map(|e| (&e.labels, e)).collect();
        // A series with nothing in the WAL so far and samples appended after the scan: its
        // newest samples may go twice (from storage, then the WAL), which the upstream
        // ignores as identical; none goes missing.
        let newest =
            db.head().max_time().max(db.blocks().healthy().iter().map(|b| b.meta().max_time).max().unwrap_or(i64::MIN));
        let all = Matcher::new(MatchOp::Regex, "__name__", ".+").map_err(|e| e.to_string())?;
        let mut budget = unlimited(i64::MIN, i64::MAX);
        let series =
            TsdbStore(db.clone()).series_now(&[all], i64::MIN, i64::MAX, &mut budget).map_err(|e| e.to_string())?;
        let mut entries: Vec<BacklogEntry> = series
            .into_iter()
            .map(|labels| {
                let last = in_wal.get(&labels).map_or(newest, |w| w.last);
                BacklogEntry { labels, first: i64::MIN, last, samples: None }
            })
            .collect();
        // Series the WAL names that storage no longer holds (retention took them): listed
        // with the WAL's count, so that they count as lost rather than vanish.
        let stored: std::collections::HashSet<&Labels> = entries.iter().map(|e| &e.labels).collect();
        let gone: Vec<BacklogEntry> =
            in_wal.values().filter(|w| !stored.contains(&w.labels)).map(|w| (*w).clone()).collect();
        entries.extend(gone);
        entries.sort_unstable_by(|a, b| a.labels.cmp(&b.labels));
        // What each entry holds now, so that what retention takes before it is read is
        // counted exactly: what storage holds before the series' first sample in the WAL,
        // and the WAL's own count (what storage lost of the WAL's samples counts as lost).
        let stored_until = |e: &BacklogEntry| in_wal.get(&e.labels).map_or(e.last, |w| w.first.saturating_sub(1));
        match count_stored(db, &entries, newest, stored_until).map_err(|e| e.to_string())? {
            Some(counts) => {
                for (e, stored) in entries.iter_mut().zip(counts) {
                    let wal = in_wal.get(&e.labels).map_or(Some(0), |w| w.samples);
                    e.samples = stored.zip(wal).map(|(a, b)| a + b);
                }
            }
            None => tracing::warn!(
                "forward: storage spans too many block ranges to count what a backlog of everything holds: \
                 what retention takes before it is read will not be counted"
            ),
        }
        Ok((Backlog { entries }, scanned))
    }

    /// What is left of this backlog after `at`, then `newer` (samples the WAL held after
    /// all of these): one entry per series, its range from the older start to the newer end.
    pub fn rest_then(self, at: ReplayAt, newer: Backlog) -> Backlog {
        let mut rest = self.entries;
        if at.slice > i64::MIN {
            // Acknowledged: every entry before the slice, the entries before `entry`
            // through the slice, and that entry up to `after`.
            let through = at.slice.saturating_add(SLICE_MS);
            for (j, e) in rest.iter_mut().enumerate() {
                let acked_before = match (j as u64).cmp(&at.entry) {
                    std::cmp::Ordering::Less => through,
                    std::cmp::Ordering::Equal => at.slice.max(at.after.saturating_add(1)),
                    std::cmp::Ordering::Greater => at.slice,
                };
                if acked_before > e.first {
                    // Part of the entry was acknowledged: its count is no longer known.
                    e.first = acked_before;
                    e.samples = None;
                }
            }
        }
        rest.retain(|e| e.first <= e.last);
        let mut index: HashMap<Labels, usize> = rest.iter().enumerate().map(|(i, e)| (e.labels.clone(), i)).collect();
        for n in newer.entries {
            match index.get(&n.labels) {
                Some(&i) => {
                    let e = &mut rest[i];
                    // Ranges that overlap may have counted a sample twice (one the older
                    // listing found in storage and the newer scan in the WAL).
                    e.samples = if n.first <= e.last { None } else { e.samples.zip(n.samples).map(|(a, b)| a + b) };
                    e.last = e.last.max(n.last);
                }
                None => {
                    index.insert(n.labels.clone(), rest.len());
                    rest.push(n);
                }
            }
        }
        rest.sort_unstable_by(|a, b| a.labels.cmp(&b.labels));
        Backlog { entries: rest }
    }

    /// Samples counted, and the oldest first timestamp.
    pub fn summary(&self) -> (u64, i64, i64) {
        let samples = self.entries.iter().filter_map(|e| e.samples).sum();
        let oldest = self.entries.iter().map(|e| e.first).min().unwrap_or(i64::MAX);
        let newest = self.entries.iter().map(|e| e.last).max().unwrap_or(i64::MIN);
        (samples, oldest, newest)
    }

    /// Writes the backlog to `path` whole (temporary file, `fsync`, rename, directory `fsync`).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let mut b = Vec::with_capacity(64 + self.entries.len() * 96);
        b.extend_from_slice(HEADER);
        b.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            b.extend_from_slice(&(e.labels.len() as u32).to_le_bytes());
            for l in e.labels.iter() {
                for s in [l.name.as_bytes(), l.value.as_bytes()] {
                    b.extend_from_slice(&(s.len() as u32).to_le_bytes());
                    b.extend_from_slice(s);
                }
            }
            b.extend_from_slice(&e.first.to_le_bytes());
            b.extend_from_slice(&e.last.to_le_bytes());
            b.extend_from_slice(&e.samples.map_or(u64::MAX, |n| n.min(u64::MAX - 1)).to_le_bytes());
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("backlog.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&b)?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Reads a backlog [`save`](Self::save) wrote; any damage is an error.
    pub fn load(path: &Path) -> Result<Backlog, BacklogError> {
        let b = std::fs::read(path).map_err(|e| BacklogError::Io(format!("{}: {e}", path.display())))?;
        let damaged = |why: &str| BacklogError::Damaged(format!("{}: damaged backlog ({why})", path.display()));
        let body_len = b.len().checked_sub(4).ok_or_else(|| damaged("too short"))?;
        let (body, crc) = b.split_at(body_len);
        if crc32fast::hash(body).to_le_bytes() != crc {
            return Err(damaged("checksum"));
        }
        let mut r = Bytes(body.strip_prefix(HEADER).ok_or_else(|| damaged("header"))?);
        let n = r.u64().ok_or_else(|| damaged("count"))?;
        // Each entry takes at least 28 bytes: a count larger than the file can hold is damage.
        if n > (r.0.len() / 28) as u64 {
            return Err(damaged("count"));
        }
        let mut entries = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let pairs = r.u32().ok_or_else(|| damaged("labels"))?;
            let mut builder = strata_model::LabelsBuilder::default();
            for _ in 0..pairs {
                let name = r.str().ok_or_else(|| damaged("label name"))?;
                let value = r.str().ok_or_else(|| damaged("label value"))?;
                builder.set(name, value);
            }
            let first = r.i64().ok_or_else(|| damaged("first"))?;
            let last = r.i64().ok_or_else(|| damaged("last"))?;
            let samples = r.u64().ok_or_else(|| damaged("samples"))?;
            entries.push(BacklogEntry {
                labels: builder.build(),
                first,
                last,
                samples: (samples != u64::MAX).then_some(samples),
            });
        }
        if !r.0.is_empty() {
            return Err(damaged("trailing bytes"));
        }
        if entries.windows(2).any(|w| w[0].labels >= w[1].labels) {
            return Err(damaged("entries out of order"));
        }
        Ok(Backlog { entries })
    }
}

struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes)
    }
    fn i64(&mut self) -> Option<i64> {
        self.take(8).and_then(|b| b.try_into().ok()).map(i64::from_le_bytes)
    }
    fn str(&mut self) -> Option<&'a str> {
        let n = usize::try_from(self.u32()?).ok()?;
        std::str::from_utf8(self.take(n)?).ok()
    }
}

/// A scan's entries, found by their labels' hash (the labels are not cloned for a key).
#[derive(Default)]
struct EntryIndex {
    entries: Vec<BacklogEntry>,
    by_hash: HashMap<u64, usize>,
    /// Entries whose hash an earlier entry with other labels has.
    collided: std::collections::HashMap<Labels, usize>,
    hasher: foldhash::fast::RandomState,
}

impl EntryIndex {
    /// The entry of `labels` (new ones have no samples yet: `last` is `i64::MIN`).
    fn find_or_add(&mut self, labels: Labels) -> usize {
        use std::hash::BuildHasher;
        let h = self.hasher.hash_one(&labels);
        match self.by_hash.get(&h) {
            Some(&i) if self.entries[i].labels == labels => return i,
            Some(_) => {
                if let Some(&i) = self.collided.get(&labels) {
                    return i;
                }
                self.collided.insert(labels.clone(), self.entries.len());
            }
            None => {
                self.by_hash.insert(h, self.entries.len());
            }
        }
        self.entries.push(BacklogEntry { labels, first: i64::MAX, last: i64::MIN, samples: Some(0) });
        self.entries.len() - 1
    }
}

/// Which backlog entry each of a segment's series references stands for: a lookup per
/// sample of the WAL scanned, so references (dense numbers from the head) index a vector
/// while they are small, and a map holds the rest.
#[derive(Default)]
struct RefSlots {
    dense: Vec<u32>,
    sparse: HashMap<SeriesRef, usize>,
}

impl RefSlots {
    /// References below this index the vector (4 bytes each).
    const DENSE: u64 = 1 << 24;
    const NONE: u32 = u32::MAX;

    fn get(&self, r: SeriesRef) -> Option<usize> {
        let dense = if r < Self::DENSE { self.dense.get(r as usize).copied() } else { None };
        match dense {
            Some(i) if i != Self::NONE => Some(i as usize),
            _ => self.sparse.get(&r).copied(),
        }
    }

    fn insert(&mut self, r: SeriesRef, i: usize) {
        match u32::try_from(i) {
            Ok(i) if r < Self::DENSE && i != Self::NONE => {
                let at = r as usize;
                if self.dense.len() <= at {
                    self.dense.resize(at + 1, Self::NONE);
                }
                self.dense[at] = i;
                self.sparse.remove(&r);
            }
            _ => {
                if let Some(slot) = self.dense.get_mut(usize::try_from(r).unwrap_or(usize::MAX)) {
                    *slot = Self::NONE;
                }
                self.sparse.insert(r, i);
            }
        }
    }

    fn clear(&mut self) {
        self.dense.clear();
        self.sparse.clear();
    }

    /// Each reference's labels.
    fn labels(&self, entries: &[BacklogEntry]) -> HashMap<SeriesRef, Labels> {
        let dense =
            self.dense.iter().enumerate().filter(|(_, &i)| i != Self::NONE).map(|(r, &i)| (r as u64, i as usize));
        let sparse = self.sparse.iter().map(|(&r, &i)| (r, i));
        dense.chain(sparse).filter_map(|(r, i)| Some((r, entries.get(i)?.labels.clone()))).collect()
    }
}

/// The labels a WAL segment named before `at` (a reader starting mid-segment needs them).
/// The entries from `start` whose labels begin with the same label (a host's series, say:
/// one postings lookup), and their chunks within `[lo, hi]` by entry index. `entries` are
/// sorted by labels.
fn select_group(
    store: &TsdbStore,
    entries: &[BacklogEntry],
    start: usize,
    lo: i64,
    hi: i64,
) -> Result<(usize, HashMap<usize, Vec<Chunk>>), StoreError> {
    let mut chunks = HashMap::default();
    let Some(head) = entries.get(start) else { return Ok((start + 1, chunks)) };
    let key = head.labels.iter().next().map(|l| (l.name.clone(), l.value.clone()));
    let end = start
        + entries[start..]
            .iter()
            .take_while(|e| e.labels.iter().next().map(|l| (l.name.clone(), l.value.clone())) == key)
            .count();
    let end = end.max(start + 1);
    let Some((name, value)) = key else { return Ok((end, chunks)) };
    let group = &entries[start..end];
    let m = Matcher::new(MatchOp::Equal, &name, &value).map_err(|e| StoreError::InvalidRequest(e.to_string()))?;
    let req = SelectRequest::new(vec![m], lo, hi);
    for s in store.select_now(&req, &mut unlimited(lo, hi))? {
        if let Ok(k) = group.binary_search_by(|e| e.labels.cmp(&s.labels)) {
            chunks.insert(start + k, s.chunks);
        }
    }
    Ok((end, chunks))
}

/// Entries a reader loads at once, at least (their chunks, compressed).
const LOAD_ENTRIES: usize = 2048;

/// Samples (as stored, whole chunks) a reader decodes ahead at once: a few MB.
const DECODE_SAMPLES: usize = 256 * 1024;

/// Block ranges storage is counted over at most; beyond, a backlog of everything goes
/// uncounted (storage with data scattered over years, say).
const MAX_COUNT_WINDOWS: usize = 20_000;

/// Each entry's stored samples up to `until(entry)`, read one block range at a time (so a
/// group's chunks in memory are at most a block range's), or `None` when storage spans
/// more than [`MAX_COUNT_WINDOWS`] ranges.
fn count_stored(
    db: &std::sync::Arc<Tsdb>,
    entries: &[BacklogEntry],
    newest: i64,
    until: impl Fn(&BacklogEntry) -> i64,
) -> Result<Option<Vec<Option<u64>>>, StoreError> {
    let range = i64::try_from(db.options().block_range.as_millis()).unwrap_or(i64::MAX).max(1);
    let head = db.head();
    let spans = db
        .blocks()
        .healthy()
        .iter()
        .map(|b| (b.meta().min_time, b.meta().max_time))
        .chain((head.min_time() <= head.max_time()).then(|| (head.min_time(), head.max_time())))
        .collect::<Vec<_>>();
    let mut windows = std::collections::BTreeSet::new();
    for (lo, hi) in spans {
        let mut w = lo.div_euclid(range);
        while w <= hi.min(newest).div_euclid(range) {
            if windows.len() >= MAX_COUNT_WINDOWS {
                return Ok(None);
            }
            windows.insert(w);
            w += 1;
        }
    }
    let store = TsdbStore(db.clone());
    let mut counts = vec![Some(0u64); entries.len()];
    for w in windows {
        let lo = w.saturating_mul(range);
        let hi = lo.saturating_add(range - 1).min(newest);
        let mut start = 0;
        while start < entries.len() {
            let (end, chunks) = select_group(&store, entries, start, lo, hi)?;
            for (i, c) in chunks {
                let n = count_within(&c, lo, hi.min(until(&entries[i])));
                counts[i] = counts[i].zip(n).map(|(a, b)| a + b);
            }
            start = end;
        }
    }
    Ok(Some(counts))
}

/// How many of a series' chunks' samples are within `[lo, hi]`; `None` when a chunk that
/// must be decoded to tell is damaged.
fn count_within(chunks: &[Chunk], lo: i64, hi: i64) -> Option<u64> {
    let mut n = 0u64;
    if hi < lo {
        return Some(0);
    }
    for c in chunks.iter().filter(|c| c.overlaps(lo, hi)) {
        if c.min_t >= lo && c.max_t <= hi {
            n += u64::from(c.n);
        } else {
            let mut part = Vec::new();
            c.decode_into(lo, hi, &mut part).ok()?;
            n += part.len() as u64;
        }
    }
    Some(n)
}

pub(crate) fn labels_before(db: &Tsdb, at: WalCursor) -> Result<HashMap<SeriesRef, Labels>, WalError> {
    let mut labels = HashMap::default();
    if at.offset == 0 {
        return Ok(labels);
    }
    let path = wal::segment_path(&db.wal_dir(), at.segment);
    if path.exists() {
        // Records before the cursor end at it: nothing after it is read.
        let mut r = wal::SegmentReader::open_range(&path, 0, at.offset)?;
        while r.offset() < at.offset {
            match r.next_series_record() {
                // A record at or past the cursor is not "before" it.
                wal::ReadOutcome::Record(_) if r.offset() > at.offset => break,
                wal::ReadOutcome::Record(WalRecord::Series { series_ref, labels: l }) => {
                    labels.insert(series_ref, l);
                }
                wal::ReadOutcome::Record(_) => {}
                _ => break,
            }
        }
    }
    Ok(labels)
}

fn unlimited(start: i64, end: i64) -> SelectBudget {
    SelectBudget::new(SelectLimits { max_series: usize::MAX, max_samples: u64::MAX }, start, end)
}

/// The time slice a backlog is read in: every series' samples of one slice before the next
/// slice's, so a receiver's newest time never runs far ahead of what it is sent next (a
/// Prometheus receiver refuses samples older than an hour before its newest), and one
/// select never spans more than this.
pub const SLICE_MS: i64 = 30 * 60 * 1000;

/// Samples of one entry within one slice, read from storage.
pub(crate) struct Piece {
    /// The entry's index in the backlog (see [`BacklogReader::labels`]).
    pub entry: usize,
    pub samples: Vec<Sample>,
    /// Or the entry's samples as a chunk holds them (see [`BacklogReader::open_chunk_of`]).
    pub open: Option<OpenPiece>,
    /// Of what the entry counted, how many storage no longer holds (known at the entry's
    /// last slice, when its earlier slices were read by this reader), and the entry's range.
    pub lost: u64,
    pub range: (i64, i64),
}

/// An entry's samples as the chunk that holds them: those within `[from, through]`,
/// `count` of them.
pub(crate) struct OpenPiece {
    pub chunk: Chunk,
    pub from: i64,
    pub through: i64,
    pub count: u64,
}

/// Reads a backlog's samples from storage in its order: slice by slice, and in a slice one
/// select per group of entries that share their first label (a metric family), holding
/// that group's chunks (compressed) and one entry's samples at a time.
pub(crate) struct BacklogReader {
    store: TsdbStore,
    backlog: Backlog,
    at: ReplayAt,
    /// The slice after the newest sample any entry needs.
    end: i64,
    /// The group loaded for the current slice: entries before `group_end`, chunks by index.
    group_end: usize,
    chunks: HashMap<usize, Vec<Chunk>>,
    /// Loaded entries' samples in the slice, decoded ahead (or why they could not be).
    decoded: HashMap<usize, Result<Vec<Sample>, strata_chunk::ChunkError>>,
    /// The entry being sent in the current slice: its samples after `at.after`, and how
    /// far they were taken.
    current: Option<(usize, Vec<Sample>, usize)>,
    /// Samples found per entry, for entries this reader read from their first slice on.
    found: HashMap<usize, u64>,
    /// Where this reader started: entries begun before are not counted for losses.
    started: ReplayAt,
    /// The slice of the oldest data storage held when the reader started: nothing before
    /// it is there to read.
    origin: i64,
    /// The upstream takes open chunks (see [`open_chunk_of`](Self::open_chunk_of)).
    pub open_chunks: bool,
    /// Entries sent whole that way, skipped in later slices. (A reader started again
    /// after a restart does not know them, and sends their later slices again: stored
    /// once, counted as duplicates.)
    sent_whole: std::collections::HashSet<usize>,
}

fn slice_of(t: i64) -> i64 {
    t.div_euclid(SLICE_MS).saturating_mul(SLICE_MS)
}

impl BacklogReader {
    pub fn new(db: std::sync::Arc<Tsdb>, backlog: Backlog, mut at: ReplayAt) -> BacklogReader {
        // Entries from "the beginning" start at the oldest data storage holds.
        let stored_from = db
            .blocks()
            .healthy()
            .iter()
            .map(|b| b.meta().min_time)
            .chain(std::iter::once(db.head().min_time()))
            .min()
            .unwrap_or(i64::MAX);
        let from = backlog.entries.iter().map(|e| e.first.max(stored_from)).min().unwrap_or(i64::MAX);
        let last = backlog.entries.iter().map(|e| e.last).max().unwrap_or(i64::MIN);
        let end = if from > last { i64::MIN } else { slice_of(last).saturating_add(SLICE_MS) };
        if at.slice == i64::MIN {
            at = ReplayAt {
                slice: if from > last { i64::MAX } else { slice_of(from) },
                entry: 0,
                after: i64::MIN,
                ..at
            };
        }
        BacklogReader {
            store: TsdbStore(db),
            backlog,
            at,
            end,
            group_end: 0,
            chunks: HashMap::default(),
            decoded: HashMap::default(),
            current: None,
            found: HashMap::default(),
            started: at,
            origin: slice_of(stored_from),
            open_chunks: false,
            sent_whole: Default::default(),
        }
    }

    /// Entry `i`'s samples, from the slice at the reader's position to its last, when they
    /// can go at once as the chunk that holds them, not decoded (see `strata_chunk::resume`):
    /// the chunk, the entry's last sample, and how many samples that is (what the WAL
    /// counted). So when the entry begins in this slice, this reader counts it, and one
    /// chunk in the streaming encoding (the head's open chunk, or one not transcoded yet)
    /// holds all of its samples; the chunk's samples before them, if any, were
    /// acknowledged before the backlog (the upstream's open chunk holds them, sent one by
    /// one as the edge appended them, or it takes them one by one again).
    fn open_chunk_of(&self, i: usize) -> Option<OpenPiece> {
        // (The entry the reader stands in, partly sent: read on from where it is.)
        let partly_sent = self.at.entry == i as u64 && self.at.after != i64::MIN;
        if !self.open_chunks || partly_sent {
            return None;
        }
        let slice = self.at.slice;
        let e = self.backlog.entries.get(i)?;
        let first_slice = slice_of(e.first.max(i64::MIN + SLICE_MS)).max(self.origin);
        if first_slice != slice || !self.counts(i, first_slice) {
            return None;
        }
        let count = e.samples.filter(|&n| n > 0)?;
        let from = e.first.max(slice);
        let mut within = self.chunks.get(&i)?.iter().filter(|c| c.overlaps(from, e.last));
        let c = within.next()?;
        // The chunk holds the entry's first sample too, so what the WAL counted is all there
        // (an entry whose oldest samples storage lost goes slice by slice, the loss
        // counted); or the entry is everything stored up to its last.
        let from_first = c.min_t <= e.first || e.first == i64::MIN;
        let holds_all = within.next().is_none() && from_first && c.max_t >= e.last && !c.is_block();
        holds_all.then(|| OpenPiece { chunk: c.clone(), from, through: e.last, count })
    }

    /// Where the reader stands: what is acknowledged once everything read so far is.
    pub fn at(&self) -> ReplayAt {
        self.at
    }

    pub fn is_done(&self) -> bool {
        self.at.slice >= self.end
    }

    /// The labels of entry `i` (of a [`Piece`]).
    pub fn labels(&self, i: usize) -> Option<&Labels> {
        self.backlog.entries.get(i).map(|e| &e.labels)
    }

    /// How many entries the backlog has.
    pub fn len(&self) -> usize {
        self.backlog.entries.len()
    }

    /// Whether this reader read entry `i` from its first slice (so its losses are known).
    fn counts(&self, i: usize, first_slice: i64) -> bool {
        let s = self.started;
        first_slice > s.slice
            || (first_slice == s.slice && (i as u64 > s.entry || (i as u64 == s.entry && s.after == i64::MIN)))
    }

    /// Up to `room` samples of the entry at the reader's position (fewer at its end in the
    /// slice); `None` once the backlog is read.
    pub fn next_piece(&mut self, room: usize) -> Result<Option<Piece>, StoreError> {
        loop {
            if self.is_done() {
                return Ok(None);
            }
            let (slice, slice_end) = (self.at.slice, self.at.slice.saturating_add(SLICE_MS));
            let i = usize::try_from(self.at.entry).unwrap_or(usize::MAX);
            let Some(entry) = self.backlog.entries.get(i) else {
                // The slice is done: the next one, from the first entry.
                self.at = ReplayAt { slice: slice_end, entry: 0, after: i64::MIN, ..self.at };
                self.group_end = 0;
                self.chunks.clear();
                self.decoded.clear();
                continue;
            };
            let (first, last, counted) = (entry.first, entry.last, entry.samples);
            if last < slice || first >= slice_end || self.sent_whole.contains(&i) {
                self.at = ReplayAt { entry: self.at.entry + 1, after: i64::MIN, ..self.at };
                continue;
            }
            let first_slice = slice_of(first.max(i64::MIN + SLICE_MS)).max(self.origin);
            if self.current.as_ref().is_none_or(|c| c.0 != i) {
                if i >= self.group_end {
                    self.load_group(i, slice, slice_end - 1)?;
                }
                if let Some(o) = self.open_chunk_of(i).filter(|o| o.count <= room.max(1) as u64) {
                    self.decoded.remove(&i);
                    self.found.remove(&i);
                    self.sent_whole.insert(i);
                    self.at = ReplayAt { entry: self.at.entry + 1, after: i64::MIN, ..self.at };
                    let range = (first, last);
                    return Ok(Some(Piece { entry: i, samples: Vec::new(), open: Some(o), lost: 0, range }));
                }
                if !self.decoded.contains_key(&i) {
                    self.decode_from(i, slice, slice_end - 1);
                }
                let all = self.decoded.remove(&i).unwrap_or(Ok(Vec::new())).map_err(|e| StoreError::Corrupt {
                    series: self.labels(i).map(|l| l.to_string()).unwrap_or_default(),
                    reason: e.to_string(),
                })?;
                if self.counts(i, first_slice) {
                    *self.found.entry(i).or_default() += all.len() as u64;
                }
                let from = all.partition_point(|s| s.t <= self.at.after);
                self.current = Some((i, all, from));
            }
            let Some((_, samples, taken)) = self.current.as_mut() else { continue };
            let end = samples.len().min(taken.saturating_add(room.max(1)));
            let piece: Vec<Sample> = if *taken == 0 && end == samples.len() {
                std::mem::take(samples)
            } else {
                samples[*taken..end].to_vec()
            };
            *taken = end;
            let mut lost = 0;
            if *taken >= samples.len() {
                self.current = None;
                self.at = ReplayAt { entry: self.at.entry + 1, after: i64::MIN, ..self.at };
                // The entry's last slice: what storage no longer holds is known.
                if last < slice_end {
                    if let (Some(n), Some(found)) = (counted, self.found.remove(&i)) {
                        lost = n.saturating_sub(found);
                    }
                }
            } else if let Some(s) = piece.last() {
                self.at = ReplayAt { after: s.t, ..self.at };
            }
            if piece.is_empty() && lost == 0 {
                continue;
            }
            return Ok(Some(Piece { entry: i, samples: piece, open: None, lost, range: (first, last) }));
        }
    }

    /// Selects, over `[lo, hi]`, the group of entries from `start` that share its first
    /// label.
    /// Groups after it are loaded with it up to about [`LOAD_ENTRIES`] entries (compressed),
    /// so that their samples can be decoded many at a time.
    fn load_group(&mut self, start: usize, lo: i64, hi: i64) -> Result<(), StoreError> {
        let (mut end, mut chunks) = select_group(&self.store, &self.backlog.entries, start, lo, hi)?;
        while end < self.backlog.entries.len() && end - start < LOAD_ENTRIES {
            let (next_end, more) = select_group(&self.store, &self.backlog.entries, end, lo, hi)?;
            chunks.extend(more);
            end = next_end;
        }
        self.group_end = end;
        self.chunks = chunks;
        self.decoded.clear();
        Ok(())
    }

    /// Decodes the slice's samples of the loaded entries from `start` on, about
    /// [`DECODE_SAMPLES`] at a time, over the cores (the decode is most of what reading a
    /// backlog costs the edge).
    fn decode_from(&mut self, start: usize, lo: i64, hi: i64) {
        let mut jobs: Vec<(usize, Vec<Chunk>, i64, i64)> = Vec::new();
        let mut weight = 0usize;
        for i in start..self.group_end {
            if weight >= DECODE_SAMPLES {
                break;
            }
            let Some(e) = self.backlog.entries.get(i) else { continue };
            // Sent, or likely to go as its open chunk: decoded when it comes, if at all.
            if self.sent_whole.contains(&i) || (i != start && self.open_chunk_of(i).is_some()) {
                continue;
            }
            let Some(c) = self.chunks.remove(&i) else {
                // Nothing of it in the slice (a series with a gap there): known to be empty,
                // so that reaching it does not scan the group again (quadratic in a group
                // of such series).
                self.decoded.entry(i).or_insert_with(|| Ok(Vec::new()));
                continue;
            };
            weight += c.iter().map(|c| usize::from(c.n)).sum::<usize>();
            jobs.push((i, c, e.first.max(lo), e.last.min(hi)));
        }
        let weigh = |j: &(usize, Vec<Chunk>, i64, i64)| j.1.iter().map(|c| usize::from(c.n)).sum::<usize>();
        let decoded = strata_model::parallel::map_in_parts(jobs, weigh, |(i, chunks, from, to)| {
            let mut samples = Vec::new();
            (i, Chunk::decode_range(&chunks, from, to, &mut samples).map(|()| samples))
        });
        self.decoded.extend(decoded);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(gpu: &str, first: i64, last: i64, samples: Option<u64>) -> BacklogEntry {
        BacklogEntry { labels: Labels::from_pairs([("__name__", "up"), ("gpu", gpu)]), first, last, samples }
    }

    #[test]
    fn a_backlog_survives_a_round_trip_and_any_damage_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("forward").join("x.backlog");
        let b = Backlog { entries: vec![entry("0", 10, 20, Some(3)), entry("1", i64::MIN, 5, None)] };
        b.save(&path).unwrap();
        assert_eq!(Backlog::load(&path).ok(), Some(b));
        let bytes = std::fs::read(&path).unwrap();
        for cut in [0, 10, bytes.len() - 1] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            assert!(Backlog::load(&path).is_err(), "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        assert!(Backlog::load(&path).is_err());
    }

    /// What is left after a partly acknowledged entry, merged with newer WAL samples: one
    /// entry per series, spanning from the unacknowledged start to the newer end.
    #[test]
    fn the_rest_of_a_backlog_merges_with_newer_samples() {
        let older = Backlog {
            entries: vec![entry("0", 10, 20, Some(3)), entry("1", 10, 20, Some(3)), entry("2", 10, 20, Some(3))],
        };
        let newer = Backlog { entries: vec![entry("1", 30, 40, Some(2)), entry("3", 30, 40, Some(2))] };
        // Nothing acknowledged yet: all of it, then the newer samples.
        let merged = older.clone().rest_then(ReplayAt::start(0), newer.clone());
        assert_eq!(
            merged.entries,
            vec![
                entry("0", 10, 20, Some(3)),
                entry("1", 10, 40, Some(5)),
                entry("2", 10, 20, Some(3)),
                entry("3", 30, 40, Some(2))
            ]
        );
        // In the first slice, entry 0 whole and entry 1 up to 15 acknowledged.
        let merged = older.rest_then(ReplayAt { generation: 0, slice: 0, entry: 1, after: 15 }, newer);
        assert_eq!(
            merged.entries,
            vec![entry("1", 16, 40, None), entry("2", 10, 20, Some(3)), entry("3", 30, 40, Some(2))]
        );
    }

    /// A backlog of everything `db`'s WAL holds.
    fn whole_wal(db: &Tsdb) -> Backlog {
        let (from, to) = (WalCursor { segment: 0, offset: 0 }, WalCursor { segment: u32::MAX, offset: 0 });
        Backlog::scan_wal(db, from, 0, to).unwrap().0
    }

    /// Every series' samples of one slice come before any of the next slice's: a receiver's
    /// newest time is never more than a slice ahead of what it is sent next.
    #[test]
    fn a_backlog_is_read_slice_by_slice_in_order_and_whole() {
        let d = tempfile::tempdir().unwrap();
        let db = std::sync::Arc::new(Tsdb::open(d.path(), Default::default()).unwrap());
        let series: Vec<_> = (0..3)
            .map(|i| db.series(&Labels::from_pairs([("__name__", "up"), ("gpu", &i.to_string())])).unwrap())
            .collect();
        let t0 = strata_model::time::now_ms() - 4 * 3600 * 1000;
        for k in 0..960 {
            let batch: Vec<_> = series.iter().map(|s| (s.clone(), Sample::new(t0 + k * 15_000, k as f64))).collect();
            db.commit(&batch).unwrap();
        }
        let backlog = whole_wal(&db);
        assert_eq!(backlog.summary().0, 3 * 960);
        let mut r = BacklogReader::new(db.clone(), backlog, ReplayAt::start(1));
        let (mut newest, mut n, mut lost) = (i64::MIN, 0, 0);
        while let Some(p) = r.next_piece(100).unwrap() {
            lost += p.lost;
            for s in &p.samples {
                assert!(s.t > newest.saturating_sub(SLICE_MS), "a sample {} ms behind one sent before", newest - s.t);
                newest = newest.max(s.t);
                n += 1;
            }
        }
        assert_eq!((n, lost), (3 * 960, 0));
        assert!(r.is_done());
    }

    /// Series with gaps of whole slices (pods that come back): every sample read once, none
    /// counted lost, across slices where a series spans but holds nothing.
    #[test]
    fn series_with_gaps_of_whole_slices_are_read_whole() {
        let d = tempfile::tempdir().unwrap();
        let db = std::sync::Arc::new(Tsdb::open(d.path(), Default::default()).unwrap());
        let series: Vec<_> = (0..50)
            .map(|i| db.series(&Labels::from_pairs([("__name__", "up"), ("pod", &i.to_string())])).unwrap())
            .collect();
        let t0 = strata_model::time::now_ms() - 4 * 3600 * 1000;
        let mut want = 0;
        for k in 0..960i64 {
            // Every other hour (240 samples) each series is absent: a whole 30 min slice
            // or more it spans holds nothing of it.
            let batch: Vec<_> = series
                .iter()
                .enumerate()
                .filter(|(i, _)| (k / 240) % 2 != *i as i64 % 2)
                .map(|(_, s)| (s.clone(), Sample::new(t0 + k * 15_000, k as f64)))
                .collect();
            want += batch.len();
            db.commit(&batch).unwrap();
        }
        let backlog = whole_wal(&db);
        let mut r = BacklogReader::new(db.clone(), backlog, ReplayAt::start(1));
        let mut seen = std::collections::HashSet::new();
        let mut lost = 0;
        while let Some(p) = r.next_piece(7).unwrap() {
            lost += p.lost;
            for s in &p.samples {
                assert!(seen.insert((p.entry, s.t)), "entry {} at {} read twice", p.entry, s.t);
            }
        }
        assert_eq!((seen.len(), lost), (want, 0));
    }
}
