//! The head checkpoint: the head (every series with its chunks, the open one sealed in the
//! block encoding, and the metadata) written to `<data>/head.checkpoint` with the WAL
//! cursor it covers, so that the WAL segments before that cursor can go and a start loads
//! the checkpoint and replays only the WAL after it (Prometheus' checkpoint plus its
//! `memory-snapshot-on-shutdown`, in one file).
//!
//! It is written by maintenance once the WAL since the last checkpoint outgrows the head's
//! chunks (so checkpoints write no more than the WAL did), and at every clean shutdown. The
//! cursor is taken at a fresh segment, under the WAL lock, so everything before it is in
//! memory; the series are then written one at a time without holding the WAL, so commits go
//! on. A series may hold samples from after the cursor: replay skips what a series already
//! holds (per series, samples are appended in time order, so anything not newer than its
//! last sample is there). The floor recorded is the durable one (`floor`): a cut that is
//! still writing its block never makes its window look stored.
//!
//! Encoding: a series' chunks go in the block encoding. Labels and timestamps repeat from
//! series to series (every series of a target is scraped at the same instants, so their
//! chunks hold the same timestamp bits), so each distinct string and each distinct run of
//! timestamp bits is written once, where it first appears, and referred to by number after
//! (`strata_chunk::split`): on the fleet-day set this halves the checkpoint. The dictionary
//! of timestamp runs is bounded ([`MAX_TIMES_BYTES`]); past it, chunks go whole.
//!
//! Safety: the file is written under a temporary name, `fsync`ed, read back to check its
//! CRC-32, renamed, and only then are the segments it covers deleted. A checkpoint that
//! fails any check at start is moved aside to `head.checkpoint.damaged` (never deleted) and
//! the start goes on with the WAL that is left, saying loudly what it could not restore.

use super::{Tsdb, TsdbError};
use crate::head::{block_end, HeadBlock};
use crate::wal::WalCursor;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;
use strata_block::encoding::{put_str, put_uvarint, put_varint, Decoder};
use strata_chunk::split::Split;
use strata_chunk::{Chunk, CHUNK_MAX_SAMPLES};
use strata_model::{Label, Labels, Metadata, MetricType, Sample};

pub const CHECKPOINT_FILE: &str = "head.checkpoint";
/// What earlier versions wrote at shutdown, with the whole WAL beside it: ignored and
/// removed (the WAL it came with is replayed).
pub const LEGACY_SNAPSHOT_FILE: &str = "head.snapshot";
const MAGIC: &[u8; 8] = b"STRHCK02";
/// After the magic, the records and their CRC-32 are deflated: labels and record framing
/// shrink, and the chunks (already entropy-coded) nearly do not.
const DEFLATE_LEVEL: u32 = 6;
/// The length that ends the records.
const END_OF_RECORDS: u32 = u32::MAX;
/// A record longer than this is damage (one series' labels and chunks take kilobytes).
const MAX_RECORD_BYTES: u32 = 64 << 20;
/// A chunk larger than this is damage.
const MAX_CHUNK_BYTES: usize = 64 << 10;
/// Bytes of distinct timestamp runs the writer remembers to refer back to.
const MAX_TIMES_BYTES: usize = 64 << 20;
/// Chunk kinds in a series record.
const CHUNK_WHOLE: u8 = 0;
const CHUNK_SPLIT: u8 = 1;

/// The writer's dictionaries: strings and timestamp runs already written, by number.
#[derive(Default)]
struct Dictionary {
    symbols: HashMap<Arc<str>, u64>,
    times: HashMap<(Vec<u8>, u32), u64>,
    times_bytes: usize,
    /// Runs written so far, remembered or not (the reader numbers every one).
    times_written: u64,
}

impl Dictionary {
    /// A string as a reference: `0` and the string when new, else its number plus one.
    fn put_symbol(&mut self, b: &mut Vec<u8>, s: &Arc<str>) {
        if let Some(&i) = self.symbols.get(s) {
            put_uvarint(b, i + 1);
            return;
        }
        put_uvarint(b, 0);
        put_str(b, s);
        let next = self.symbols.len() as u64;
        self.symbols.insert(s.clone(), next);
    }

    /// A chunk: its timestamps by reference when it is block-encoded, else whole.
    fn put_chunk(&mut self, b: &mut Vec<u8>, c: &Chunk) {
        put_varint(b, c.min_t);
        put_varint(b, c.max_t);
        put_uvarint(b, c.n as u64);
        let Some(split) = c.split_times() else {
            b.push(CHUNK_WHOLE);
            put_uvarint(b, c.data.len() as u64);
            b.extend_from_slice(&c.data);
            return;
        };
        b.push(CHUNK_SPLIT);
        let key = (split.times, split.time_bits);
        match self.times.get(&key) {
            Some(&i) => put_uvarint(b, i + 1),
            None => {
                put_uvarint(b, 0);
                put_uvarint(b, key.1 as u64);
                put_uvarint(b, key.0.len() as u64);
                b.extend_from_slice(&key.0);
                if self.times_bytes + key.0.len() <= MAX_TIMES_BYTES {
                    self.times_bytes += key.0.len();
                    self.times.insert(key, self.times_written);
                }
                self.times_written += 1;
            }
        }
        put_uvarint(b, split.rest_bits as u64);
        put_uvarint(b, split.rest.len() as u64);
        b.extend_from_slice(&split.rest);
    }
}

/// The reader's dictionaries, as the writer numbered them.
#[derive(Default)]
struct Entries {
    symbols: Vec<Arc<str>>,
    times: Vec<(Arc<[u8]>, u32)>,
}

impl Entries {
    fn symbol(&mut self, d: &mut Decoder) -> Option<Arc<str>> {
        match d.uvarint()? {
            0 => {
                let s: Arc<str> = Arc::from(d.str()?);
                self.symbols.push(s.clone());
                Some(s)
            }
            i => self.symbols.get(usize::try_from(i - 1).ok()?).cloned(),
        }
    }

    fn chunk(&mut self, d: &mut Decoder) -> Result<Chunk, &'static str> {
        const BAD: &str = "malformed chunk";
        let (min_t, max_t) = (d.varint().ok_or(BAD)?, d.varint().ok_or(BAD)?);
        let n = d
            .uvarint()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|&n| n > 0 && n <= CHUNK_MAX_SAMPLES)
            .ok_or("chunk sample count")?;
        if min_t > max_t {
            return Err("chunk time range");
        }
        match d.u8().ok_or(BAD)? {
            CHUNK_WHOLE => {
                let len = d.len(MAX_CHUNK_BYTES).ok_or(BAD)?;
                let data: Arc<[u8]> = Arc::from(d.bytes(len).ok_or(BAD)?);
                Ok(Chunk { data, n, min_t, max_t })
            }
            CHUNK_SPLIT => {
                let (times, time_bits) = match d.uvarint().ok_or(BAD)? {
                    0 => {
                        let bits = d.uvarint().and_then(|v| u32::try_from(v).ok()).ok_or(BAD)?;
                        let len = d.len(MAX_CHUNK_BYTES).ok_or(BAD)?;
                        let t: Arc<[u8]> = Arc::from(d.bytes(len).ok_or(BAD)?);
                        self.times.push((t.clone(), bits));
                        (t, bits)
                    }
                    i => self.times.get(usize::try_from(i - 1).map_err(|_| BAD)?).cloned().ok_or(BAD)?,
                };
                let rest_bits = d.uvarint().and_then(|v| u32::try_from(v).ok()).ok_or(BAD)?;
                let len = d.len(MAX_CHUNK_BYTES).ok_or(BAD)?;
                let rest = d.bytes(len).ok_or(BAD)?.to_vec();
                let split = Split { times: times.to_vec(), time_bits, rest, rest_bits };
                let c = Chunk::join_times(&split, n, min_t, max_t).ok_or("a chunk that does not join")?;
                if c.data.len() > MAX_CHUNK_BYTES {
                    return Err("chunk too large");
                }
                Ok(c)
            }
            _ => Err("unknown chunk kind"),
        }
    }
}

/// A series' chunks with every chunk inside one block window, as the head keeps them: a
/// checkpoint written under another block range has chunks across this range's
/// boundaries, which a cut would otherwise never take.
fn fit_to_windows(chunks: Vec<Chunk>, range: i64) -> Result<Vec<Chunk>, &'static str> {
    let inside = |c: &Chunk| block_end(c.min_t, range) > c.max_t;
    if chunks.iter().all(inside) {
        return Ok(chunks);
    }
    let mut out = Vec::with_capacity(chunks.len() + 1);
    for c in chunks {
        if inside(&c) {
            out.push(c);
            continue;
        }
        let samples = c.decode().map_err(|_| "a chunk that does not decode")?;
        for part in samples.chunk_by(|a, b| block_end(a.t, range) == block_end(b.t, range)) {
            out.extend(Chunk::encode_samples(part.iter().copied()).into_iter().map(Chunk::compact));
        }
    }
    Ok(out)
}

/// What a loaded checkpoint says beside the head.
pub(crate) struct Loaded {
    pub head: HeadBlock,
    pub cursor: WalCursor,
    /// The durable floor when it was written.
    pub floor: i64,
    pub series: usize,
}

/// What writing a checkpoint did.
#[derive(Debug, Clone, Copy, Default)]
pub struct CheckpointStats {
    pub series: usize,
    pub bytes: u64,
    pub segments_deleted: usize,
}

/// A writer that keeps the CRC-32 of what it wrote.
struct Crc<W: Write> {
    w: W,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Crc<W> {
    /// Writes one record, framed by its length, so that a reader parses it from memory.
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        let len = u32::try_from(b.len())
            .ok()
            .filter(|&n| n <= MAX_RECORD_BYTES)
            .ok_or_else(|| std::io::Error::other("a checkpoint record over its limit"))?;
        self.crc.update(&len.to_le_bytes());
        self.crc.update(b);
        self.w.write_all(&len.to_le_bytes())?;
        self.w.write_all(b)?;
        self.bytes += 4 + b.len() as u64;
        Ok(())
    }

    /// Ends the records, then the CRC-32 of everything before it.
    fn end(&mut self) -> std::io::Result<()> {
        let end = END_OF_RECORDS.to_le_bytes();
        self.crc.update(&end);
        self.w.write_all(&end)?;
        let crc = self.crc.clone().finalize();
        self.w.write_all(&crc.to_le_bytes())
    }
}

impl Tsdb {
    /// Writes a head checkpoint and deletes the WAL segments it covers (the caller holds
    /// the maintenance lock, so no cut is half done).
    pub(crate) fn write_checkpoint_locked(&self) -> Result<CheckpointStats, TsdbError> {
        let started = std::time::Instant::now();
        let path = self.dir.join(CHECKPOINT_FILE);
        let tmp = self.dir.join(format!("{CHECKPOINT_FILE}.tmp"));
        let io = |e: std::io::Error| TsdbError::Internal(format!("head checkpoint {}: {e}", tmp.display()));
        // A fresh segment: every record before it has been applied to the head.
        let cursor = {
            let mut w = self.wal.lock();
            w.wal.rotate()?;
            w.wal.cursor()
        };
        let write = || -> std::io::Result<(usize, u64)> {
            strata_block::fault::fail("checkpoint-write")?;
            let mut file = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
            file.write_all(MAGIC)?;
            let deflated = flate2::write::DeflateEncoder::new(file, flate2::Compression::new(DEFLATE_LEVEL));
            let mut out = Crc { w: deflated, crc: crc32fast::Hasher::new(), bytes: 0 };
            out.crc.update(MAGIC);
            let mut b = Vec::with_capacity(1 << 16);
            put_uvarint(&mut b, cursor.segment as u64);
            put_uvarint(&mut b, cursor.offset);
            put_varint(&mut b, self.floor.durable());
            let metadata = self.head.all_metadata();
            put_uvarint(&mut b, metadata.len() as u64);
            for (family, m) in &metadata {
                put_str(&mut b, family);
                b.push(m.metric_type.to_u8());
                put_str(&mut b, &m.help);
                put_str(&mut b, &m.unit);
            }
            let mut all = self.head.all_series();
            // In reference order: loading then appends to the postings lists, never inserts.
            all.sort_unstable_by_key(|s| s.series_ref);
            put_uvarint(&mut b, all.len() as u64);
            out.put(&b)?;
            let mut dict = Dictionary::default();
            for s in &all {
                b.clear();
                let (last, chunks) = {
                    let g = s.samples.lock();
                    (g.last(), g.all_chunks())
                };
                put_uvarint(&mut b, s.series_ref);
                put_uvarint(&mut b, s.labels.len() as u64);
                for l in s.labels.iter() {
                    dict.put_symbol(&mut b, &l.name);
                    dict.put_symbol(&mut b, &l.value);
                }
                match last {
                    Some(last) => {
                        b.push(1);
                        put_varint(&mut b, last.t);
                        b.extend_from_slice(&last.v.to_le_bytes());
                    }
                    None => b.push(0),
                }
                put_uvarint(&mut b, chunks.len() as u64);
                for c in chunks.into_iter().map(Chunk::compact) {
                    dict.put_chunk(&mut b, &c);
                }
                out.put(&b)?;
            }
            out.end()?;
            let file = out.w.finish()?;
            let f = file.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
            let bytes = f.metadata()?.len();
            Ok((all.len(), bytes))
        };
        let written = write().and_then(|n| verify(&tmp).map(|()| n));
        let (series, bytes) = match written {
            Ok(n) => n,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(io(e));
            }
        };
        std::fs::rename(&tmp, &path).map_err(io)?;
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        strata_block::fault::point("checkpoint-before-wal-delete");
        let segments_deleted = {
            let mut w = self.wal.lock();
            w.wal.delete_before(cursor.segment)?
        };
        *self.checkpoint_at.lock() = Some(cursor);
        // What earlier versions left is superseded now; failing to remove it costs space, not data.
        if let Err(e) = crate::wal::remove_label_checkpoints(&self.wal_dir()) {
            tracing::warn!(error = %e, "could not remove an old label checkpoint");
        }
        let legacy = self.dir.join(LEGACY_SNAPSHOT_FILE);
        if legacy.exists() {
            if let Err(e) = std::fs::remove_file(&legacy) {
                tracing::warn!(path = %legacy.display(), error = %e, "could not remove an old head snapshot");
            }
        }
        tracing::info!(
            series,
            bytes,
            segments_deleted,
            secs = started.elapsed().as_secs_f64(),
            path = %path.display(),
            "head checkpoint written"
        );
        Ok(CheckpointStats { series, bytes, segments_deleted })
    }
}

/// Reads a checkpoint file through, checking its CRC-32 (what was written reads back).
fn verify(path: &Path) -> std::io::Result<()> {
    let mut r = BufReader::with_capacity(1 << 20, File::open(path)?);
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(std::io::Error::other("the checkpoint does not read back as written"));
    }
    let mut rec = Records::after_magic(r);
    while rec.next().map_err(std::io::Error::other)?.is_some() {}
    rec.check_crc().map_err(|_| std::io::Error::other("the checkpoint does not read back as written"))
}

/// Reads the length-framed records out of the deflated stream after the magic, keeping the
/// CRC-32 of what it read.
struct Records<R: Read> {
    r: flate2::read::DeflateDecoder<R>,
    crc: crc32fast::Hasher,
    buf: Vec<u8>,
}

impl<R: Read> Records<R> {
    fn after_magic(r: R) -> Self {
        let mut crc = crc32fast::Hasher::new();
        crc.update(MAGIC);
        Records { r: flate2::read::DeflateDecoder::new(r), crc, buf: Vec::new() }
    }

    /// The next record; `None` at the end of the records.
    fn next(&mut self) -> Result<Option<&[u8]>, &'static str> {
        let mut len = [0u8; 4];
        self.r.read_exact(&mut len).map_err(|_| "truncated")?;
        self.crc.update(&len);
        let n = u32::from_le_bytes(len);
        if n == END_OF_RECORDS {
            return Ok(None);
        }
        if n > MAX_RECORD_BYTES {
            return Err("a record longer than any");
        }
        self.buf.resize(n as usize, 0);
        self.r.read_exact(&mut self.buf).map_err(|_| "truncated")?;
        self.crc.update(&self.buf);
        Ok(Some(&self.buf))
    }

    /// After the last record: the CRC-32 that follows must be that of what was read.
    fn check_crc(&mut self) -> Result<(), &'static str> {
        let want = self.crc.clone().finalize();
        let mut tail = [0u8; 4];
        self.r.read_exact(&mut tail).map_err(|_| "no CRC")?;
        if u32::from_le_bytes(tail) != want {
            return Err("CRC-32 mismatch");
        }
        Ok(())
    }
}

/// Loads the checkpoint in `dir`, if there is one, into a new head. `Err` when one is
/// there but unsound: it has been moved aside, and what it held is lost unless the WAL
/// before its cursor is still there (the caller replays what is).
pub(crate) fn load(dir: &Path, max_series: usize, block_range: i64) -> Result<Option<Loaded>, String> {
    let path = dir.join(CHECKPOINT_FILE);
    let Ok(file) = File::open(&path) else { return Ok(None) };
    let started = std::time::Instant::now();
    match read(BufReader::with_capacity(1 << 20, file), max_series, block_range) {
        Ok(l) => {
            tracing::info!(
                series = l.series,
                secs = started.elapsed().as_secs_f64(),
                "head checkpoint loaded; the WAL replays from its cursor"
            );
            Ok(Some(l))
        }
        Err(reason) => {
            let aside = dir.join(format!("{CHECKPOINT_FILE}.damaged"));
            let moved = std::fs::rename(&path, &aside);
            tracing::error!(
                path = %path.display(),
                reason,
                moved_to = %aside.display(),
                moved = moved.is_ok(),
                "head checkpoint unreadable: the head's samples before its WAL cursor cannot be restored; replaying the WAL that is left"
            );
            Err(format!("{}: {reason}", path.display()))
        }
    }
}

fn read(mut r: impl Read, max_series: usize, block_range: i64) -> Result<Loaded, &'static str> {
    const BAD: &str = "malformed";
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(|_| "truncated")?;
    if &magic != MAGIC {
        return Err("no checkpoint magic");
    }
    let mut rec = Records::after_magic(r);
    let head = HeadBlock::new(max_series);
    let (cursor, floor, n_series) = {
        let mut d = Decoder::new(rec.next()?.ok_or("truncated")?);
        let cursor = WalCursor {
            segment: d.uvarint().and_then(|v| u32::try_from(v).ok()).ok_or(BAD)?,
            offset: d.uvarint().ok_or(BAD)?,
        };
        let floor = d.varint().ok_or(BAD)?;
        let n_meta = d.len(d.b.len()).ok_or(BAD)?;
        for _ in 0..n_meta {
            let family = d.str().ok_or(BAD)?.to_string();
            let metric_type = MetricType::from_u8(d.u8().ok_or(BAD)?);
            let (help, unit) = (d.str().ok_or(BAD)?.to_string(), d.str().ok_or(BAD)?.to_string());
            head.set_metadata(&family, Metadata { metric_type, help, unit });
        }
        let n_series = d.uvarint().and_then(|v| usize::try_from(v).ok()).ok_or(BAD)?;
        (cursor, floor, n_series)
    };
    let mut entries = Entries::default();
    for _ in 0..n_series {
        let mut d = Decoder::new(rec.next()?.ok_or("truncated")?);
        let r = d.uvarint().ok_or(BAD)?;
        let nl = d.len(256).ok_or(BAD)?;
        let mut labels = Vec::with_capacity(nl);
        for _ in 0..nl {
            let (name, value) = (entries.symbol(&mut d).ok_or(BAD)?, entries.symbol(&mut d).ok_or(BAD)?);
            labels.push(Label { name, value });
        }
        if !labels.windows(2).all(|w| w[0].name < w[1].name) {
            return Err("labels not sorted");
        }
        let labels = Labels::from_sorted_unchecked(labels);
        let last = match d.u8().ok_or(BAD)? {
            1 => Some(Sample::new(d.varint().ok_or(BAD)?, d.f64().ok_or(BAD)?)),
            _ => None,
        };
        let nc = d.len(d.b.len()).ok_or(BAD)?;
        let mut chunks = Vec::with_capacity(nc);
        for _ in 0..nc {
            let c = entries.chunk(&mut d)?;
            head.note_time(c.min_t);
            head.note_time(c.max_t);
            chunks.push(c);
        }
        let chunks = fit_to_windows(chunks, block_range)?;
        let s = head.restore(r, &labels);
        s.samples.lock().restore(chunks, last);
    }
    if rec.next()?.is_some() {
        return Err("more records than the header says");
    }
    rec.check_crc()?;
    Ok(Loaded { head, cursor, floor, series: n_series })
}
