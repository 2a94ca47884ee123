//! The head snapshot: on a clean shutdown the head (every series with its chunks, the open
//! one sealed, and the metadata) is written to `<data>/head.snapshot` with the WAL cursor it
//! covers, so that the next start loads it and replays only the WAL after that cursor,
//! instead of the whole head window (Prometheus' `memory-snapshot-on-shutdown`).
//!
//! Safety: the file is written under a temporary name, `fsync`ed and renamed; it ends with
//! a CRC-32 of everything before it, and a snapshot that fails any check is ignored (the
//! WAL, which still holds the whole head, is replayed instead). It is deleted once a start
//! has loaded it, so it never outlives the WAL it was cut against. After a crash there is
//! no snapshot and the WAL is replayed as before.

use super::{Tsdb, TsdbError};
use crate::head::HeadBlock;
use crate::wal::WalCursor;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use strata_block::encoding::{put_str, put_uvarint, put_varint, Decoder};
use strata_chunk::{Chunk, CHUNK_MAX_SAMPLES};
use strata_model::{Label, Labels, Metadata, MetricType, Sample};

pub const SNAPSHOT_FILE: &str = "head.snapshot";
const MAGIC: &[u8; 8] = b"STRSNP01";
/// A chunk larger than this is damage.
const MAX_CHUNK_BYTES: usize = 64 << 10;

/// What a loaded snapshot says beside the head.
pub(crate) struct Loaded {
    pub head: HeadBlock,
    pub cursor: WalCursor,
    pub floor: i64,
    /// (segment, newest sample) of the WAL segments before the cursor.
    pub segments: Vec<(u32, i64)>,
    pub series: usize,
}

/// A writer that keeps the CRC-32 of what it wrote.
struct Crc<W: Write> {
    w: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Crc<W> {
    /// Writes one record, framed by its length, so that a reader parses it from memory.
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        let len = u32::try_from(b.len()).map_err(|_| std::io::Error::other("snapshot record over 4 GiB"))?;
        self.crc.update(&len.to_le_bytes());
        self.crc.update(b);
        self.w.write_all(&len.to_le_bytes())?;
        self.w.write_all(b)
    }
}

impl Tsdb {
    /// Writes the head snapshot (clean shutdown). Appends wait meanwhile. Returns the
    /// series written.
    pub fn write_head_snapshot(&self) -> Result<usize, TsdbError> {
        let path = self.dir.join(SNAPSHOT_FILE);
        let tmp = self.dir.join(format!("{SNAPSHOT_FILE}.tmp"));
        let io = |e: std::io::Error| TsdbError::Internal(format!("head snapshot {}: {e}", tmp.display()));
        let writer = self.wal.lock();
        let cursor = writer.wal.cursor();
        let segments = writer.wal.segments().to_vec();
        let mut out = Crc {
            w: BufWriter::with_capacity(1 << 20, File::create(&tmp).map_err(io)?),
            crc: crc32fast::Hasher::new(),
        };
        out.w.write_all(MAGIC).map_err(io)?;
        out.crc.update(MAGIC);
        let mut b = Vec::with_capacity(1 << 16);
        put_uvarint(&mut b, cursor.segment as u64);
        put_uvarint(&mut b, cursor.offset);
        put_varint(&mut b, self.head_floor.load(Ordering::Relaxed));
        put_uvarint(&mut b, segments.len() as u64);
        for (n, t) in &segments {
            put_uvarint(&mut b, *n as u64);
            put_varint(&mut b, *t);
        }
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
        out.put(&b).map_err(io)?;
        for s in &all {
            b.clear();
            let g = s.samples.lock();
            put_uvarint(&mut b, s.series_ref);
            put_uvarint(&mut b, s.labels.len() as u64);
            for l in s.labels.iter() {
                put_str(&mut b, &l.name);
                put_str(&mut b, &l.value);
            }
            match g.last() {
                Some(last) => {
                    b.push(1);
                    put_varint(&mut b, last.t);
                    b.extend_from_slice(&last.v.to_le_bytes());
                }
                None => b.push(0),
            }
            let chunks = g.all_chunks();
            drop(g);
            put_uvarint(&mut b, chunks.len() as u64);
            for c in &chunks {
                put_varint(&mut b, c.min_t);
                put_varint(&mut b, c.max_t);
                put_uvarint(&mut b, c.n as u64);
                put_uvarint(&mut b, c.data.len() as u64);
                b.extend_from_slice(&c.data);
            }
            out.put(&b).map_err(io)?;
        }
        let crc = out.crc.clone().finalize();
        out.w.write_all(&crc.to_le_bytes()).map_err(io)?;
        let f = out.w.into_inner().map_err(|e| io(e.into_error()))?;
        f.sync_all().map_err(io)?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(io)?;
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        drop(writer);
        tracing::info!(series = all.len(), path = %path.display(), "head snapshot written");
        Ok(all.len())
    }
}

/// Reads the length-framed records, keeping the CRC-32 of what it read.
struct Records<R: Read> {
    r: R,
    crc: crc32fast::Hasher,
    buf: Vec<u8>,
    left: u64,
}

impl<R: Read> Records<R> {
    /// The next record; it must fit in what is left of the file.
    fn next(&mut self) -> Result<&[u8], &'static str> {
        let mut len = [0u8; 4];
        self.r.read_exact(&mut len).map_err(|_| "truncated")?;
        let n = u32::from_le_bytes(len) as u64;
        if n.saturating_add(4) > self.left {
            return Err("record longer than the file");
        }
        self.left -= n + 4;
        self.buf.resize(n as usize, 0);
        self.r.read_exact(&mut self.buf).map_err(|_| "truncated")?;
        self.crc.update(&len);
        self.crc.update(&self.buf);
        Ok(&self.buf)
    }
}

/// Loads the snapshot in `dir`, if there is a sound one, into a new head.
pub(crate) fn load(dir: &Path, max_series: usize) -> Option<Loaded> {
    let path = dir.join(SNAPSHOT_FILE);
    let file = File::open(&path).ok()?;
    let size = file.metadata().ok()?.len();
    let started = std::time::Instant::now();
    match read(BufReader::with_capacity(1 << 20, file), size, max_series) {
        Ok(l) => {
            tracing::info!(
                series = l.series,
                secs = started.elapsed().as_secs_f64(),
                "head snapshot loaded; the WAL replays from its cursor"
            );
            Some(l)
        }
        Err(reason) => {
            tracing::warn!(path = %path.display(), reason, "head snapshot unreadable: removed, the WAL is replayed whole");
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

fn read(mut r: impl Read, size: u64, max_series: usize) -> Result<Loaded, &'static str> {
    const BAD: &str = "malformed";
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(|_| "truncated")?;
    if &magic != MAGIC {
        return Err("no snapshot magic");
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&magic);
    let mut rec = Records { r, crc, buf: Vec::new(), left: size.saturating_sub(12) };
    let head = HeadBlock::new(max_series);
    let (cursor, floor, segments, n_series) = {
        let mut d = Decoder::new(rec.next()?);
        let cursor = WalCursor {
            segment: d.uvarint().and_then(|v| u32::try_from(v).ok()).ok_or(BAD)?,
            offset: d.uvarint().ok_or(BAD)?,
        };
        let floor = d.varint().ok_or(BAD)?;
        let n = d.len(d.b.len()).ok_or(BAD)?;
        let mut segments = Vec::with_capacity(n);
        for _ in 0..n {
            segments.push((d.uvarint().and_then(|v| u32::try_from(v).ok()).ok_or(BAD)?, d.varint().ok_or(BAD)?));
        }
        let n_meta = d.len(d.b.len()).ok_or(BAD)?;
        for _ in 0..n_meta {
            let family = d.str().ok_or(BAD)?.to_string();
            let metric_type = MetricType::from_u8(d.u8().ok_or(BAD)?);
            let (help, unit) = (d.str().ok_or(BAD)?.to_string(), d.str().ok_or(BAD)?.to_string());
            head.set_metadata(&family, Metadata { metric_type, help, unit });
        }
        let n_series = d.uvarint().and_then(|v| usize::try_from(v).ok()).filter(|&n| n as u64 <= size).ok_or(BAD)?;
        (cursor, floor, segments, n_series)
    };
    for _ in 0..n_series {
        let mut d = Decoder::new(rec.next()?);
        let r = d.uvarint().ok_or(BAD)?;
        let nl = d.len(256).ok_or(BAD)?;
        let mut labels = Vec::with_capacity(nl);
        for _ in 0..nl {
            let (name, value) = (d.str().ok_or(BAD)?, d.str().ok_or(BAD)?);
            labels.push(Label { name: Arc::from(name), value: Arc::from(value) });
        }
        let labels = Labels::from_sorted_unchecked(labels);
        let last = match d.u8().ok_or(BAD)? {
            1 => Some(Sample::new(d.varint().ok_or(BAD)?, d.f64().ok_or(BAD)?)),
            _ => None,
        };
        let nc = d.len(d.b.len()).ok_or(BAD)?;
        let mut chunks = Vec::with_capacity(nc);
        for _ in 0..nc {
            let (min_t, max_t) = (d.varint().ok_or(BAD)?, d.varint().ok_or(BAD)?);
            let n = d
                .uvarint()
                .and_then(|n| u16::try_from(n).ok())
                .filter(|&n| n > 0 && n <= CHUNK_MAX_SAMPLES)
                .ok_or("chunk sample count")?;
            let len = d.len(MAX_CHUNK_BYTES).ok_or(BAD)?;
            let data: Arc<[u8]> = Arc::from(d.bytes(len).ok_or(BAD)?);
            if min_t > max_t {
                return Err("chunk time range");
            }
            head.note_time(min_t);
            head.note_time(max_t);
            chunks.push(Chunk { data, n, min_t, max_t });
        }
        let s = head.restore(r, &labels);
        s.samples.lock().restore(chunks, last);
    }
    let want = rec.crc.clone().finalize();
    let mut tail = [0u8; 4];
    rec.r.read_exact(&mut tail).map_err(|_| "no CRC")?;
    if u32::from_le_bytes(tail) != want {
        return Err("CRC-32 mismatch");
    }
    Ok(Loaded { head, cursor, floor, segments, series: n_series })
}
