//! Write-ahead log: what the edge acknowledged survives a crash.
//!
//! Layout: a directory of segment files named by a zero-padded number. Each segment starts
//! with the 8-byte magic [`SEGMENT_MAGIC`]; then records, each framed as
//! `len: u32 LE | crc32(type ‖ payload): u32 LE | type: u8 | payload`.
//!
//! A series' labels are logged once, when it is created: a fleet of millions of series
//! re-logged per segment would fill segments with labels. Segments are deleted only once a
//! head checkpoint (`db::checkpoint`: the head's series, chunks and metadata) covers them,
//! whatever the age of their samples, so the WAL holds what came after the newest
//! checkpoint and nothing the blocks and the checkpoint already hold. Metadata is also
//! logged again at the head of every segment. Label checkpoints `checkpoint.NNNNNNNN`
//! (the series and metadata of the segments before `NNNNNNNN`), which earlier versions
//! wrote, are still read by a replay without a head checkpoint.
//!
//! Sample records are compact (see [`encode_samples`]): values that are exact decimals,
//! as nearly every DCGM reading is, take their scaled integer, not eight bytes; a power
//! reading with three decimals takes 4 bytes instead of 9, as small as Snappy made the
//! record, without its CPU. A chunk a regional receives whole (a forwarded backlog) is
//! logged as one chunk record, its bytes as they came, and checked against its header
//! whenever it is read back.
//!
//! Durability, per method:
//! * [`Wal::log`] writes the records to the OS before it returns: they survive the process
//!   being killed (SIGKILL, panic, OOM). With [`SyncPolicy::Always`] it also `fsync`s, so
//!   they survive power loss; with [`SyncPolicy::Interval`] (the default, 1 s) a background
//!   task calls [`Wal::sync`], so power loss can lose up to that interval.
//! * Rotation to a new segment `fsync`s the old one first.
//! * A write that fails leaves nothing behind: the segment is truncated back to the last
//!   whole record, so no torn record ever sits after acknowledged ones. A record larger
//!   than replay accepts ([`MAX_RECORD_BYTES`]) is refused, never written.
//! * [`replay`] cuts a torn or corrupt tail with a warning (never fatal) and keeps going
//!   with the next segment. The damaged segment is first copied whole into `quarantine/`
//!   beside the segments, so nothing is destroyed that someone may want to inspect.

use crate::index::SeriesRef;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_chunk::Chunk;
use strata_model::{Label, Labels, Metadata, MetricType, Sample};

pub const SEGMENT_MAGIC: &[u8; 8] = b"STRWAL01";
/// A segment is rotated once it passes this size.
pub const DEFAULT_SEGMENT_BYTES: u64 = 128 << 20;
/// No record may be larger than this; a larger length field means corruption.
pub const MAX_RECORD_BYTES: u32 = 256 << 20;
/// Where replay keeps copies of the segments it had to cut.
pub const QUARANTINE_DIR: &str = "quarantine";
/// A checkpoint's file name: this prefix and the first segment replayed after it.
pub const CHECKPOINT_PREFIX: &str = "checkpoint.";

const REC_SERIES: u8 = 1;
/// Samples as first written: reference, time delta, raw value bits (about 13 bytes each).
const REC_SAMPLES: u8 = 2;
const REC_METADATA: u8 = 3;
/// Samples, compact with whole numbers only (written by earlier versions).
const REC_SAMPLES_COMPACT: u8 = 4;
/// [`REC_SAMPLES_COMPACT`]'s payload, Snappy-compressed (written by earlier versions).
const REC_SAMPLES_SNAPPY: u8 = 5;
/// Samples, compact with exact decimals (what the writer writes now): see [`encode_samples`].
const REC_SAMPLES_DECIMAL: u8 = 6;
/// One series' samples as a sealed chunk, stored as it came (a forwarded backlog).
const REC_CHUNK: u8 = 7;
/// A chunk record's data at most (a chunk of 960 samples takes a few KiB).
const MAX_CHUNK_RECORD_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("WAL {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("WAL record of {bytes} bytes is over the {max} bytes replay accepts; nothing was written")]
    RecordTooLarge { bytes: usize, max: u32 },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> WalError + '_ {
    move |source| WalError::Io { path: path.to_path_buf(), source }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// `fsync` after every [`Wal::log`].
    Always,
    /// `fsync` from a background task at this interval.
    Interval(Duration),
}

impl Default for SyncPolicy {
    fn default() -> Self {
        SyncPolicy::Interval(Duration::from_secs(1))
    }
}

impl SyncPolicy {
    /// `always`, or the interval as a Prometheus duration (`1s`; at least 10 ms).
    pub fn parse(s: &str) -> Result<SyncPolicy, String> {
        if s == "always" {
            return Ok(SyncPolicy::Always);
        }
        let d = strata_model::duration::parse_duration(s).map_err(|e| e.to_string())?;
        Ok(SyncPolicy::Interval(d.max(Duration::from_millis(10))))
    }
}

/// A position in the WAL: the record starting at `offset` in segment `segment`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WalCursor {
    pub segment: u32,
    pub offset: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum WalRecord {
    Series {
        series_ref: SeriesRef,
        labels: Labels,
    },
    Samples(Vec<(SeriesRef, Sample)>),
    Metadata {
        family: String,
        meta: Metadata,
    },
    /// A series' samples as one sealed chunk, and its newest sample. Decoding the record
    /// checks the chunk against its header ([`Chunk::decode_checked`]), so a chunk read
    /// back is whole and in order.
    Chunk {
        series_ref: SeriesRef,
        chunk: Chunk,
        last: Sample,
    },
}

// ---- encoding ----

// The varint helpers and the bounds-checked decoder are the block files' (one home).
use strata_block::encoding::{put_str, put_uvarint, put_varint, Decoder as Dec};

impl WalRecord {
    /// A chunk record as the samples it holds (checked when the record was read), any
    /// other record as it is: for readers of the WAL that take samples, not chunks.
    pub fn chunk_as_samples(self) -> WalRecord {
        match self {
            WalRecord::Chunk { series_ref, chunk, .. } => {
                let mut samples = Vec::with_capacity(usize::from(chunk.n));
                // Checked when read: a chunk that fails now yields what it decoded.
                let _ = chunk.decode_into(i64::MIN, i64::MAX, &mut samples);
                WalRecord::Samples(samples.into_iter().map(|s| (series_ref, s)).collect())
            }
            other => other,
        }
    }

    /// Appends the framed record to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut payload = Vec::new();
        let ty = match self {
            WalRecord::Series { series_ref, labels } => {
                put_uvarint(&mut payload, *series_ref);
                put_uvarint(&mut payload, labels.len() as u64);
                for l in labels.iter() {
                    put_str(&mut payload, &l.name);
                    put_str(&mut payload, &l.value);
                }
                REC_SERIES
            }
            WalRecord::Samples(samples) => {
                encode_samples(samples, &mut payload);
                REC_SAMPLES_DECIMAL
            }
            WalRecord::Chunk { series_ref, chunk, .. } => {
                put_uvarint(&mut payload, *series_ref);
                put_uvarint(&mut payload, u64::from(chunk.n));
                put_varint(&mut payload, chunk.min_t);
                put_varint(&mut payload, chunk.max_t);
                put_uvarint(&mut payload, chunk.data.len() as u64);
                payload.extend_from_slice(&chunk.data);
                REC_CHUNK
            }
            WalRecord::Metadata { family, meta } => {
                put_str(&mut payload, family);
                payload.push(meta.metric_type.to_u8());
                put_str(&mut payload, &meta.help);
                put_str(&mut payload, &meta.unit);
                REC_METADATA
            }
        };
        let mut h = crc32fast::Hasher::new();
        h.update(&[ty]);
        h.update(&payload);
        out.extend_from_slice(&(payload.len() as u32 + 1).to_le_bytes());
        out.extend_from_slice(&h.finalize().to_le_bytes());
        out.push(ty);
        out.extend_from_slice(&payload);
    }

    #[cfg(test)]
    fn decode(ty: u8, payload: &[u8]) -> Option<WalRecord> {
        Self::decode_into(ty, payload, &mut Vec::new())
    }

    /// [`decode`](Self::decode), a samples record decoded into `spare` (cleared first): a
    /// reader that hands each record's samples back ([`WalReader::recycle`]) allocates them
    /// once, not once per record (a record may hold a million samples).
    fn decode_into(ty: u8, payload: &[u8], spare: &mut Vec<(SeriesRef, Sample)>) -> Option<WalRecord> {
        let mut d = Dec::new(payload);
        let rec = match ty {
            REC_SERIES => {
                let series_ref = d.uvarint()?;
                let n = d.uvarint()? as usize;
                let mut labels = Vec::with_capacity(n.min(256));
                for _ in 0..n {
                    let name: Arc<str> = d.str()?.into();
                    let value: Arc<str> = d.str()?.into();
                    labels.push(Label { name, value });
                }
                if !labels.windows(2).all(|w| w[0].name < w[1].name) {
                    return None;
                }
                WalRecord::Series { series_ref, labels: Labels::from_sorted_unchecked(labels) }
            }
            REC_SAMPLES => {
                let n = d.uvarint()? as usize;
                let base = d.varint()?;
                let mut v = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    let r = d.uvarint()?;
                    let t = base.wrapping_add(d.varint()?);
                    v.push((r, Sample { t, v: d.f64()? }));
                }
                WalRecord::Samples(v)
            }
            REC_SAMPLES_COMPACT => WalRecord::Samples(decode_samples(&mut d, false, spare)?),
            REC_SAMPLES_DECIMAL => WalRecord::Samples(decode_samples(&mut d, true, spare)?),
            REC_SAMPLES_SNAPPY => {
                // The length is checked before anything is allocated: damage never asks
                // for more than a record may hold.
                let n = snap::raw::decompress_len(payload).ok().filter(|&n| n <= MAX_RECORD_BYTES as usize)?;
                let mut raw = vec![0u8; n];
                let got = snap::raw::Decoder::new().decompress(payload, &mut raw).ok()?;
                raw.truncate(got);
                let mut inner = Dec::new(&raw);
                let v = decode_samples(&mut inner, false, spare)?;
                return (inner.i == raw.len()).then_some(WalRecord::Samples(v));
            }
            REC_CHUNK => {
                let series_ref = d.uvarint()?;
                let n = u16::try_from(d.uvarint()?).ok().filter(|&n| n > 0)?;
                let (min_t, max_t) = (d.varint()?, d.varint()?);
                let len = d.len(MAX_CHUNK_RECORD_BYTES)?;
                let chunk = Chunk { data: Arc::from(d.bytes(len)?), n, min_t, max_t };
                let mut samples = Vec::with_capacity(usize::from(n));
                match chunk.decode_checked(&mut samples).map(|()| samples.last().copied()) {
                    Ok(Some(last)) => WalRecord::Chunk { series_ref, chunk, last },
                    // The record is whole (its checksum holds) but its chunk does not decode
                    // to what it declares (a stricter decoder than the writer's): that one
                    // record is skipped, logged with what it held, and the segment after it
                    // is read on rather than cut as damaged.
                    Ok(None) | Err(_) => {
                        tracing::warn!(
                            series_ref,
                            samples = n,
                            min_t,
                            max_t,
                            "WAL: a chunk record that does not decode to what it declares was skipped"
                        );
                        WalRecord::Samples(Vec::new())
                    }
                }
            }
            REC_METADATA => {
                let family = d.str()?.to_string();
                let metric_type = MetricType::from_u8(d.u8()?);
                let help = d.str()?.to_string();
                let unit = d.str()?.to_string();
                WalRecord::Metadata { family, meta: Metadata { metric_type, help, unit } }
            }
            _ => return None,
        };
        (d.i == payload.len()).then_some(rec)
    }
}

/// The compact samples record. A batch is mostly one scrape: consecutive references, one
/// timestamp, values that DCGM prints as integers or with a few decimals. So each sample is
/// the reference as a zig-zag delta from the previous one, the time as a zig-zag delta from
/// the previous one, and the value as a uvarint whose low bit says which form follows: `0`
/// an exact decimal (the zig-zag scaled integer, shifted past the 3-bit scale 0 to 6), `1`
/// the raw 8 bytes. A scraped DCGM sample takes 3 to 7 bytes instead of 13.
fn encode_samples(samples: &[(SeriesRef, Sample)], out: &mut Vec<u8>) {
    put_uvarint(out, samples.len() as u64);
    out.reserve(samples.len() * 6);
    let (mut prev_ref, mut prev_t) = (0u64, 0i64);
    for (r, s) in samples {
        put_varint(out, r.wrapping_sub(prev_ref) as i64);
        put_varint(out, s.t.wrapping_sub(prev_t));
        (prev_ref, prev_t) = (*r, s.t);
        match strata_chunk::to_decimal(s.v) {
            Some((k, i)) => put_uvarint(out, ((zigzag(i) << 3) | u64::from(k)) << 1),
            None => {
                put_uvarint(out, 1);
                out.extend_from_slice(&s.v.to_bits().to_le_bytes());
            }
        }
    }
}

fn zigzag(i: i64) -> u64 {
    ((i << 1) ^ (i >> 63)) as u64
}

fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Decodes [`encode_samples`]' payload; `decimals: false` reads the earlier form, whose
/// first value form is a whole number without a scale.
fn decode_samples(
    d: &mut Dec,
    decimals: bool,
    spare: &mut Vec<(SeriesRef, Sample)>,
) -> Option<Vec<(SeriesRef, Sample)>> {
    let n = d.uvarint()? as usize;
    // Every sample takes at least three bytes: a count past that is damage.
    if n > d.b.len().saturating_sub(d.i) / 3 + 1 {
        return None;
    }
    let mut v = std::mem::take(spare);
    v.clear();
    v.reserve(n);
    let (mut r, mut t) = (0u64, 0i64);
    for _ in 0..n {
        r = r.wrapping_add(d.varint()? as u64);
        t = t.wrapping_add(d.varint()?);
        let code = d.uvarint()?;
        let value = match (code & 1, decimals) {
            (0, true) => strata_chunk::from_decimal(((code >> 1) & 7) as u32, unzigzag(code >> 4))?,
            (0, false) => unzigzag(code >> 1) as f64,
            _ => d.f64()?,
        };
        v.push((r, Sample { t, v: value }));
    }
    Some(v)
}

pub fn segment_path(dir: &Path, n: u32) -> PathBuf {
    dir.join(format!("{n:08}"))
}

fn checkpoint_path(dir: &Path, n: u32) -> PathBuf {
    dir.join(format!("{CHECKPOINT_PREFIX}{n:08}"))
}

/// The newest checkpoint in `dir`: the first segment it precedes.
pub fn latest_checkpoint(dir: &Path) -> Result<Option<u32>, WalError> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(dir)(e)),
    };
    let mut best = None;
    for e in rd {
        let e = e.map_err(io_err(dir))?;
        let name = e.file_name();
        let n = name.to_str().and_then(|s| s.strip_prefix(CHECKPOINT_PREFIX)).and_then(|s| s.parse::<u32>().ok());
        if let Some(n) = n {
            best = best.max(Some(n));
        }
    }
    Ok(best)
}

/// Segment numbers present in `dir`, ascending. Files with other names are ignored.
pub fn list_segments(dir: &Path) -> Result<Vec<u32>, WalError> {
    let mut v = Vec::new();
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(v),
        Err(e) => return Err(io_err(dir)(e)),
    };
    for e in rd {
        let e = e.map_err(io_err(dir))?;
        if let Some(n) = e.file_name().to_str().filter(|s| s.len() == 8).and_then(|s| s.parse::<u32>().ok()) {
            v.push(n);
        }
    }
    v.sort_unstable();
    Ok(v)
}

/// Reads records of one segment from `offset` (0 = from the start, past the magic). Only
/// the bytes from `offset` on are read: a forwarder reopens the segment being written at
/// its tail again and again.
pub struct SegmentReader {
    path: PathBuf,
    /// Whether the segment starts with the magic (an empty file: `None`).
    magic: Option<bool>,
    /// The segment's bytes from `base` on.
    data: Vec<u8>,
    base: usize,
    pos: usize,
    /// A samples record's vector handed back, for the next one.
    spare: Vec<(SeriesRef, Sample)>,
}

pub enum ReadOutcome {
    Record(WalRecord),
    End,
    /// Damage at this offset; nothing after it in this segment can be trusted.
    Damaged {
        offset: u64,
        reason: String,
    },
}

impl SegmentReader {
    pub fn open(path: &Path, offset: u64) -> Result<Self, WalError> {
        Self::open_range(path, offset, u64::MAX)
    }

    /// [`open`](Self::open), reading no bytes at or past `end`: the records that end by
    /// then (a reader after what precedes a position need not read the rest).
    pub fn open_range(path: &Path, offset: u64, end: u64) -> Result<Self, WalError> {
        use std::io::{Seek, SeekFrom};
        let mut f = File::open(path).map_err(io_err(path))?;
        let mut head = Vec::with_capacity(SEGMENT_MAGIC.len());
        (&mut f).take(SEGMENT_MAGIC.len() as u64).read_to_end(&mut head).map_err(io_err(path))?;
        let magic = if head.is_empty() { None } else { Some(head == SEGMENT_MAGIC) };
        let base = usize::try_from(offset).unwrap_or(usize::MAX).max(SEGMENT_MAGIC.len());
        let mut data = Vec::new();
        if magic == Some(true) {
            f.seek(SeekFrom::Start(base as u64)).map_err(io_err(path))?;
            // Sized from the file up front: grown by doubling, a segment's bytes would be
            // copied again at each step (into fresh pages, with an allocator that does not
            // remap).
            let len = f.metadata().map_err(io_err(path))?.len();
            let want = len.min(end).saturating_sub(base as u64);
            // (A reservation only: a file past a gigabyte is not taken at its word.)
            data.reserve_exact(usize::try_from(want.min(1 << 30)).unwrap_or(0));
            f.take(end.saturating_sub(base as u64)).read_to_end(&mut data).map_err(io_err(path))?;
        }
        Ok(SegmentReader { path: path.to_path_buf(), magic, data, base, pos: 0, spare: Vec::new() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Offset of the next record.
    pub fn offset(&self) -> u64 {
        (self.base + self.pos) as u64
    }

    pub fn next_record(&mut self) -> ReadOutcome {
        self.next_record_of(|_| true).unwrap_or(ReadOutcome::End)
    }

    /// The next Series record, checking every record before it but decoding none of them
    /// (labels resolved mid-segment need only these).
    pub fn next_series_record(&mut self) -> ReadOutcome {
        loop {
            match self.next_record_of(|ty| ty == REC_SERIES) {
                Some(out) => return out,
                None => continue,
            }
        }
    }

    /// The next record if `wanted` its type (`None`, and the reader past it, if not).
    fn next_record_of(&mut self, wanted: impl Fn(u8) -> bool) -> Option<ReadOutcome> {
        match self.magic {
            None => return Some(ReadOutcome::End),
            Some(false) => return Some(ReadOutcome::Damaged { offset: 0, reason: "bad segment magic".into() }),
            Some(true) => {}
        }
        let start = self.pos;
        if start == self.data.len() {
            return Some(ReadOutcome::End);
        }
        let damaged = |reason: &str| {
            Some(ReadOutcome::Damaged { offset: (self.base + start) as u64, reason: reason.to_string() })
        };
        let Some(head) = self.data.get(start..start + 8) else {
            return damaged("torn record header");
        };
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if len == 0 || len > MAX_RECORD_BYTES {
            return damaged("invalid record length");
        }
        let Some(body) = self.data.get(start + 8..start + 8 + len as usize) else {
            return damaged("torn record");
        };
        if crc32fast::hash(body) != crc {
            return damaged("checksum mismatch");
        }
        if !wanted(body[0]) {
            self.pos = start + 8 + len as usize;
            return None;
        }
        match WalRecord::decode_into(body[0], &body[1..], &mut self.spare) {
            Some(r) => {
                self.pos = start + 8 + len as usize;
                Some(ReadOutcome::Record(r))
            }
            None => damaged("undecodable record"),
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct ReplayStats {
    pub segments: usize,
    pub records: u64,
    pub samples: u64,
    pub damaged_segments: usize,
}

/// Copies a damaged segment whole to `quarantine/<segment>-at-<offset>` before replay
/// cuts it; returns the copy's path.
fn quarantine(dir: &Path, path: &Path, n: u32, offset: u64) -> Result<PathBuf, WalError> {
    let qdir = dir.join(QUARANTINE_DIR);
    fs::create_dir_all(&qdir).map_err(io_err(&qdir))?;
    let copy = qdir.join(format!("{n:08}-at-{offset}"));
    fs::copy(path, &copy).map_err(io_err(&copy))?;
    Ok(copy)
}

/// Replays every segment in order, calling `f` for each record. A damaged tail is cut off
/// (the file is truncated there) with a warning; replay continues with the next segment.
pub fn replay(dir: &Path, f: impl FnMut(WalRecord)) -> Result<ReplayStats, WalError> {
    replay_from(dir, None, f)
}

/// [`replay`] from a cursor on (a head checkpoint covers what is before it). Segments
/// before the cursor's are not read.
pub fn replay_from(dir: &Path, from: Option<WalCursor>, mut f: impl FnMut(WalRecord)) -> Result<ReplayStats, WalError> {
    let mut segs = list_segments(dir)?;
    let mut stats = ReplayStats::default();
    let started = Instant::now();
    let mut last_log = Instant::now();
    // Without a snapshot: the newest checkpoint first, then the segments after it. Segments
    // before it are what a crash left between writing the checkpoint and deleting them.
    if let (None, Some(cp)) = (from, latest_checkpoint(dir)?) {
        let path = checkpoint_path(dir, cp);
        let mut r = SegmentReader::open(&path, 0)?;
        while let ReadOutcome::Record(rec) = r.next_record() {
            stats.records += 1;
            f(rec);
        }
        for n in segs.iter().filter(|&&n| n < cp) {
            let old = segment_path(dir, *n);
            fs::remove_file(&old).map_err(io_err(&old))?;
        }
        segs.retain(|&n| n >= cp);
    }
    for (i, &n) in segs.iter().enumerate() {
        let path = segment_path(dir, n);
        let offset = match from {
            Some(c) if n < c.segment => continue,
            Some(c) if n == c.segment => c.offset,
            _ => 0,
        };
        let mut r = SegmentReader::open(&path, offset)?;
        loop {
            match r.next_record() {
                ReadOutcome::Record(rec) => {
                    stats.records += 1;
                    match &rec {
                        WalRecord::Samples(s) => stats.samples += s.len() as u64,
                        WalRecord::Chunk { chunk, .. } => stats.samples += u64::from(chunk.n),
                        _ => {}
                    }
                    f(rec);
                }
                ReadOutcome::End => break,
                ReadOutcome::Damaged { offset, reason } => {
                    let kept = quarantine(dir, &path, n, offset)?;
                    tracing::warn!(
                        segment = %path.display(),
                        offset,
                        reason,
                        copy = %kept.display(),
                        "WAL damaged: the segment is copied aside, cut here, and replay continues with the next one"
                    );
                    stats.damaged_segments += 1;
                    let keep = if offset == 0 { 0 } else { offset };
                    let file = OpenOptions::new().write(true).open(&path).map_err(io_err(&path))?;
                    file.set_len(keep).map_err(io_err(&path))?;
                    file.sync_all().map_err(io_err(&path))?;
                    break;
                }
            }
        }
        stats.segments += 1;
        if last_log.elapsed() > Duration::from_secs(2) {
            tracing::info!(segment = i + 1, of = segs.len(), samples = stats.samples, "replaying WAL");
            last_log = Instant::now();
        }
    }
    if !segs.is_empty() {
        tracing::info!(
            segments = stats.segments,
            records = stats.records,
            samples = stats.samples,
            damaged = stats.damaged_segments,
            secs = started.elapsed().as_secs_f64(),
            "WAL replayed"
        );
    }
    Ok(stats)
}

/// The WAL writer. Not thread-safe by itself; the database holds it behind a mutex.
pub struct Wal {
    dir: PathBuf,
    policy: SyncPolicy,
    segment_bytes: u64,
    current: u32,
    /// Written whole per call to [`log`](Self::log), so a failed write can be cut back.
    /// Shared with [`sync_handle`](Self::sync_handle)'s callers, who `fsync` it unlocked.
    file: Arc<File>,
    written: u64,
    /// Every segment on disk, oldest first, the current one last.
    segments: Vec<u32>,
    scratch: Vec<u8>,
    /// Seconds of the last fsync, for the self-monitoring histogram.
    pub last_fsync: Option<Duration>,
    /// Segments from this one on are kept whatever their age: a reader (forwarding
    /// upstream) has not acknowledged them yet.
    hold: Option<u32>,
}

impl Wal {
    /// Opens the WAL for writing in a new segment after the existing ones (call [`replay`]
    /// first).
    pub fn open(dir: &Path, policy: SyncPolicy) -> Result<Wal, WalError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let mut segments = list_segments(dir)?;
        let next = segments.last().map(|n| n + 1).unwrap_or(0);
        let (file, _) = Self::create_segment(dir, next)?;
        segments.push(next);
        Ok(Wal {
            dir: dir.to_path_buf(),
            policy,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            current: next,
            file: Arc::new(file),
            written: SEGMENT_MAGIC.len() as u64,
            segments,
            scratch: Vec::new(),
            last_fsync: None,
            hold: None,
        })
    }

    /// Puts another file in place of the current segment's (tests: a file that fails).
    #[cfg(test)]
    pub(crate) fn swap_file(&mut self, f: Arc<File>) -> Arc<File> {
        std::mem::replace(&mut self.file, f)
    }

    pub fn with_segment_bytes(mut self, n: u64) -> Self {
        self.segment_bytes = n.max(1024);
        self
    }

    fn create_segment(dir: &Path, n: u32) -> Result<(File, PathBuf), WalError> {
        let path = segment_path(dir, n);
        let mut f = OpenOptions::new().create(true).write(true).truncate(true).open(&path).map_err(io_err(&path))?;
        f.write_all(SEGMENT_MAGIC).map_err(io_err(&path))?;
        f.sync_all().map_err(io_err(&path))?;
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok((f, path))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every segment on disk, oldest first.
    pub fn segments(&self) -> &[u32] {
        &self.segments
    }

    pub fn current_segment(&self) -> u32 {
        self.current
    }

    pub fn cursor(&self) -> WalCursor {
        WalCursor { segment: self.current, offset: self.written }
    }

    /// Bytes of all segments on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.segments
            .iter()
            .filter_map(|n| fs::metadata(segment_path(&self.dir, *n)).ok())
            .map(|m| m.len())
            .sum::<u64>()
            .max(self.written)
    }

    /// Bytes of the segments from `segment` on.
    pub fn bytes_from(&self, segment: u32) -> u64 {
        self.segments
            .iter()
            .filter(|&&n| n >= segment)
            .map(|&n| {
                if n == self.current {
                    self.written
                } else {
                    fs::metadata(segment_path(&self.dir, n)).map_or(0, |m| m.len())
                }
            })
            .sum()
    }

    /// Rotates to a new segment if the current one is full. Returns true when it did: the
    /// caller must then re-log series definitions and metadata before their next use.
    /// Whether the next write rotates to a new segment (and so `fsync`s the current one).
    pub fn is_full(&self) -> bool {
        self.written >= self.segment_bytes
    }

    pub fn rotate_if_full(&mut self) -> Result<bool, WalError> {
        if !self.is_full() {
            return Ok(false);
        }
        self.rotate()?;
        Ok(true)
    }

    /// Starts a new segment. The caller re-logs metadata; series are re-logged at their
    /// next sample, since their logged segment is no longer the current one.
    pub fn rotate(&mut self) -> Result<(), WalError> {
        self.sync()?;
        let next = self.current + 1;
        let (file, _) = Self::create_segment(&self.dir, next)?;
        self.file = Arc::new(file);
        self.current = next;
        self.written = SEGMENT_MAGIC.len() as u64;
        self.segments.push(next);
        Ok(())
    }

    /// Writes the records to the OS (and to disk under [`SyncPolicy::Always`]).
    pub fn log(&mut self, records: &[WalRecord]) -> Result<(), WalError> {
        self.scratch.clear();
        for r in records {
            let before = self.scratch.len();
            r.encode(&mut self.scratch);
            let framed = self.scratch.len() - before;
            if framed > MAX_RECORD_BYTES as usize + 8 {
                return Err(WalError::RecordTooLarge { bytes: framed, max: MAX_RECORD_BYTES });
            }
        }
        let path = segment_path(&self.dir, self.current);
        if let Err(e) = (&*self.file).write_all(&self.scratch) {
            // Part of the records may be in the file: cut back to the last whole record so
            // that the next write does not follow a torn one.
            let cut = self.file.set_len(self.written).and_then(|()| (&*self.file).seek(SeekFrom::Start(self.written)));
            if let Err(e2) = cut {
                tracing::error!(segment = %path.display(), error = %e2, "could not cut a failed WAL write back");
            }
            return Err(io_err(&path)(e));
        }
        self.written += self.scratch.len() as u64;
        if self.policy == SyncPolicy::Always {
            self.sync()?;
        }
        Ok(())
    }

    /// Flushes and `fsync`s the current segment.
    pub fn sync(&mut self) -> Result<(), WalError> {
        let path = segment_path(&self.dir, self.current);
        let t0 = Instant::now();
        self.file.sync_data().map_err(io_err(&path))?;
        self.last_fsync = Some(t0.elapsed());
        Ok(())
    }

    /// The current segment and its path, to `fsync` without holding the WAL (`sync_data`
    /// covers every write made before it began). Shared, not duplicated: no descriptor is
    /// taken, so the sync works when descriptors run out.
    pub fn sync_handle(&self) -> (Arc<File>, PathBuf) {
        (self.file.clone(), segment_path(&self.dir, self.current))
    }

    /// Keeps segment `from` and every later one until the hold moves on (`None`: no hold):
    /// a reader that streams the WAL upstream holds what it has not had acknowledged.
    pub fn hold_from(&mut self, from: Option<u32>) {
        self.hold = from;
    }

    /// Deletes the segments before `segment` (a head checkpoint covers them), oldest first;
    /// never the current one, nor a held one. Returns how many were deleted.
    pub fn delete_before(&mut self, segment: u32) -> Result<usize, WalError> {
        let keep_from = self.hold.map_or(segment, |h| h.min(segment)).min(self.current);
        let mut deleted = 0;
        while self.segments.first().is_some_and(|&n| n < keep_from) {
            let n = self.segments.remove(0);
            let path = segment_path(&self.dir, n);
            match fs::remove_file(&path) {
                Ok(()) => deleted += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    self.segments.insert(0, n);
                    return Err(io_err(&path)(e));
                }
            }
        }
        if deleted > 0 {
            if let Ok(d) = File::open(&self.dir) {
                let _ = d.sync_all();
            }
        }
        Ok(deleted)
    }
}

/// Removes the label checkpoints `checkpoint.NNNNNNNN` earlier versions wrote, once a head
/// checkpoint holds everything they did.
pub fn remove_label_checkpoints(dir: &Path) -> Result<(), WalError> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    for e in rd.flatten() {
        if e.file_name().to_str().is_some_and(|n| n.starts_with(CHECKPOINT_PREFIX)) {
            let p = e.path();
            fs::remove_file(&p).map_err(io_err(&p))?;
        }
    }
    Ok(())
}

/// Reads the WAL from a cursor onwards, across segments: the source for streaming upstream.
pub struct WalReader {
    dir: PathBuf,
    cursor: WalCursor,
    current: Option<SegmentReader>,
}

impl WalReader {
    pub fn new(dir: &Path, from: WalCursor) -> Self {
        WalReader { dir: dir.to_path_buf(), cursor: from, current: None }
    }

    /// Hands a samples record's vector back, so the next samples record is decoded into
    /// it rather than into a new allocation.
    pub fn recycle(&mut self, samples: Vec<(SeriesRef, Sample)>) {
        if let Some(r) = self.current.as_mut() {
            r.spare = samples;
        }
    }

    pub fn cursor(&self) -> WalCursor {
        self.cursor
    }

    /// The next record and the cursor just after it; `Ok(None)` at the current end.
    pub fn next_record(&mut self) -> Result<Option<(WalRecord, WalCursor)>, WalError> {
        loop {
            if self.current.is_none() {
                let path = segment_path(&self.dir, self.cursor.segment);
                if !path.exists() {
                    // The segment was deleted by retention or never existed: move to the next one that does.
                    let segs = list_segments(&self.dir)?;
                    match segs.into_iter().find(|&n| n > self.cursor.segment) {
                        Some(n) => {
                            self.cursor = WalCursor { segment: n, offset: 0 };
                            continue;
                        }
                        None => return Ok(None),
                    }
                }
                self.current = Some(SegmentReader::open(&path, self.cursor.offset)?);
            }
            let Some(r) = self.current.as_mut() else { return Ok(None) };
            match r.next_record() {
                ReadOutcome::Record(rec) => {
                    self.cursor.offset = r.offset();
                    return Ok(Some((rec, self.cursor)));
                }
                ReadOutcome::End | ReadOutcome::Damaged { .. } => {
                    let has_next = list_segments(&self.dir)?.into_iter().any(|n| n > self.cursor.segment);
                    if !has_next {
                        // Re-open later to see records appended since.
                        self.current = None;
                        return Ok(None);
                    }
                    // The writer finishes a segment before it creates the next, and a
                    // reader holds the segment as it was when opened: read it once more,
                    // so a record written between that and the listing is not skipped.
                    let path = segment_path(&self.dir, self.cursor.segment);
                    let mut again = SegmentReader::open(&path, self.cursor.offset)?;
                    if let ReadOutcome::Record(rec) = again.next_record() {
                        self.cursor.offset = again.offset();
                        self.current = Some(again);
                        return Ok(Some((rec, self.cursor)));
                    }
                    self.cursor = WalCursor { segment: self.cursor.segment + 1, offset: 0 };
                    self.current = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
