//! The head checkpoint's file: `STRHCK02`, then, deflated, length-framed records (a
//! header, one record per series), an end marker and the CRC-32 of everything before it.
//!
//! A series record holds its reference, its labels and its chunks. Labels and timestamps
//! repeat from series to series (every series of a target is scraped at the same instants,
//! so their chunks hold the same timestamp bits): each distinct string and each distinct
//! run of timestamp bits is written once, where it first appears, and referred to by number
//! after (`strata_chunk::split`). Both sides bound the dictionary of timestamp runs alike
//! ([`MAX_TIMES_BYTES`], counting each entry's keeping too); past it, runs are written
//! where they are used and not kept.
//!
//! Reading is one parser ([`parse`]) for the load and for the check after writing, so
//! what is written is known to load. A damaged file is an error, never a panic, and what
//! it can make the reader allocate is bounded by [`MAX_RECORD_BYTES`] at a time.

use crate::head::block_end;
use crate::index::SeriesRef;
use crate::wal::WalCursor;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::Arc;
use strata_block::encoding::{put_str, put_uvarint, put_varint, Decoder};
use strata_chunk::split::Split;
use strata_chunk::{Chunk, CHUNK_MAX_SAMPLES};
use strata_model::{Label, Labels, Metadata, MetricType, Sample};

pub(super) const MAGIC: &[u8; 8] = b"STRHCK02";
/// After the magic, the records and their CRC-32 are deflated: labels and record framing
/// shrink, and the chunks (already entropy-coded) nearly do not.
pub(super) const DEFLATE_LEVEL: u32 = 6;
/// The length that ends the records.
const END_OF_RECORDS: u32 = u32::MAX;
/// A record longer than this is damage (one series' labels and chunks take kilobytes).
const MAX_RECORD_BYTES: u32 = 64 << 20;
/// A chunk larger than this is damage.
const MAX_CHUNK_BYTES: usize = 64 << 10;
/// What the dictionary of timestamp runs may keep, counting each entry's bytes and its
/// keeping ([`ENTRY_BYTES`]).
const MAX_TIMES_BYTES: usize = 64 << 20;
const ENTRY_BYTES: usize = 64;
/// Chunk kinds in a series record.
const CHUNK_WHOLE: u8 = 0;
const CHUNK_SPLIT: u8 = 1;

/// The header record: where the WAL resumes, the durable floor, the metadata.
#[derive(Debug)]
pub(super) struct Header {
    pub cursor: WalCursor,
    pub floor: i64,
    pub metadata: Vec<(String, Metadata)>,
    pub series: usize,
}

/// One series of a checkpoint.
pub(super) struct SeriesRecord {
    pub series_ref: SeriesRef,
    pub labels: Labels,
    pub last: Option<Sample>,
    pub chunks: Vec<Chunk>,
}

/// Why a checkpoint could not be read: the disk (try again later), or the file (damage).
#[derive(Debug)]
pub(super) enum ReadError {
    Io(std::io::Error),
    Damaged(&'static str),
}

impl From<&'static str> for ReadError {
    fn from(reason: &'static str) -> Self {
        ReadError::Damaged(reason)
    }
}

/// A read error: running out of data, or a deflate stream that does not inflate, is the
/// file's fault; anything else the disk's.
fn read_error(e: std::io::Error) -> ReadError {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput => {
            ReadError::Damaged("truncated or not inflating")
        }
        _ => ReadError::Io(e),
    }
}

pub(super) fn encode_header(b: &mut Vec<u8>, h: &Header) {
    put_uvarint(b, h.cursor.segment as u64);
    put_uvarint(b, h.cursor.offset);
    put_varint(b, h.floor);
    put_uvarint(b, h.metadata.len() as u64);
    for (family, m) in &h.metadata {
        put_str(b, family);
        b.push(m.metric_type.to_u8());
        put_str(b, &m.help);
        put_str(b, &m.unit);
    }
    put_uvarint(b, h.series as u64);
}

/// The writer's dictionaries: strings and timestamp runs already written, by number.
#[derive(Default)]
pub(super) struct Dictionary {
    symbols: HashMap<Arc<str>, u64>,
    times: HashMap<(Vec<u8>, u32), u64>,
    times_bytes: usize,
    /// Runs written so far, kept or not (the reader numbers every one).
    times_written: u64,
}

impl Dictionary {
    /// A series record: reference, labels (strings by reference), last sample, chunks.
    pub fn encode_series(
        &mut self,
        b: &mut Vec<u8>,
        r: SeriesRef,
        labels: &Labels,
        last: Option<Sample>,
        chunks: &[Chunk],
    ) {
        put_uvarint(b, r);
        put_uvarint(b, labels.len() as u64);
        for l in labels.iter() {
            self.put_symbol(b, &l.name);
            self.put_symbol(b, &l.value);
        }
        match last {
            Some(last) => {
                b.push(1);
                put_varint(b, last.t);
                b.extend_from_slice(&last.v.to_le_bytes());
            }
            None => b.push(0),
        }
        put_uvarint(b, chunks.len() as u64);
        for c in chunks {
            self.put_chunk(b, c);
        }
    }

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
                if keeps(self.times_bytes, key.0.len()) {
                    self.times_bytes += key.0.len() + ENTRY_BYTES;
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

/// Whether a dictionary holding `held` bytes keeps a run of `len` more: the same rule on
/// both sides, so their numbers agree.
fn keeps(held: usize, len: usize) -> bool {
    held + len + ENTRY_BYTES <= MAX_TIMES_BYTES
}

/// The reader's dictionaries, as the writer numbered them (`None`: a run it did not keep).
#[derive(Default)]
struct Entries {
    symbols: Vec<Arc<str>>,
    times: Vec<Option<(Arc<[u8]>, u32)>>,
    times_bytes: usize,
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

    /// A chunk; `Ok(None)` for one that parsed but does not join (skipped, counted).
    fn chunk(&mut self, d: &mut Decoder) -> Result<Option<Chunk>, &'static str> {
        const BAD: &str = "malformed chunk";
        let (min_t, max_t) = (d.varint().ok_or(BAD)?, d.varint().ok_or(BAD)?);
        let n = d
            .uvarint()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|&n| n > 0 && n <= CHUNK_MAX_SAMPLES)
            .ok_or("chunk sample count")?;
        let sound = min_t <= max_t;
        match d.u8().ok_or(BAD)? {
            CHUNK_WHOLE => {
                let len = d.len(MAX_CHUNK_BYTES).ok_or(BAD)?;
                let data: Arc<[u8]> = Arc::from(d.bytes(len).ok_or(BAD)?);
                Ok(sound.then_some(Chunk { data, n, min_t, max_t }))
            }
            CHUNK_SPLIT => {
                let (times, time_bits) = match d.uvarint().ok_or(BAD)? {
                    0 => {
                        let bits = d.uvarint().and_then(|v| u32::try_from(v).ok()).ok_or(BAD)?;
                        let len = d.len(MAX_CHUNK_BYTES).ok_or(BAD)?;
                        let t: Arc<[u8]> = Arc::from(d.bytes(len).ok_or(BAD)?);
                        let kept = keeps(self.times_bytes, t.len());
                        if kept {
                            self.times_bytes += t.len() + ENTRY_BYTES;
                        }
                        self.times.push(kept.then(|| (t.clone(), bits)));
                        (t, bits)
                    }
                    i => {
                        let i = usize::try_from(i - 1).map_err(|_| BAD)?;
                        self.times.get(i).cloned().flatten().ok_or("a reference to timestamps not kept")?
                    }
                };
                let rest_bits = d.uvarint().and_then(|v| u32::try_from(v).ok()).ok_or(BAD)?;
                let len = d.len(MAX_CHUNK_BYTES).ok_or(BAD)?;
                let rest = d.bytes(len).ok_or(BAD)?.to_vec();
                let split = Split { times: times.to_vec(), time_bits, rest, rest_bits };
                let c = Chunk::join_times(&split, n, min_t, max_t).filter(|c| c.data.len() <= MAX_CHUNK_BYTES);
                Ok(c.filter(|_| sound))
            }
            _ => Err("unknown chunk kind"),
        }
    }

    /// A series record. Chunks that parse but are not sound are left out and counted.
    fn series(&mut self, b: &[u8], block_range: i64, skipped: &mut usize) -> Result<SeriesRecord, &'static str> {
        const BAD: &str = "malformed series";
        let mut d = Decoder::new(b);
        let series_ref = d.uvarint().ok_or(BAD)?;
        let nl = d.len(d.b.len()).ok_or(BAD)?;
        let mut labels = Vec::with_capacity(nl.min(1024));
        for _ in 0..nl {
            let (name, value) = (self.symbol(&mut d).ok_or(BAD)?, self.symbol(&mut d).ok_or(BAD)?);
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
        // Every chunk takes at least five bytes.
        let nc = d.len(d.b.len()).ok_or(BAD)?;
        let mut chunks = Vec::with_capacity(nc.min(d.b.len() / 5 + 1));
        for _ in 0..nc {
            match self.chunk(&mut d)? {
                Some(c) => chunks.push(c),
                None => *skipped += 1,
            }
        }
        let chunks = fit_to_windows(chunks, block_range, skipped);
        Ok(SeriesRecord { series_ref, labels, last, chunks })
    }
}

/// A series' chunks with every chunk inside one block window, as the head keeps them: a
/// checkpoint written under another block range has chunks across this range's
/// boundaries, which a cut would otherwise never take. A chunk that does not decode is
/// left out and counted.
fn fit_to_windows(chunks: Vec<Chunk>, range: i64, skipped: &mut usize) -> Vec<Chunk> {
    let inside = |c: &Chunk| block_end(c.min_t, range) > c.max_t;
    if chunks.iter().all(inside) {
        return chunks;
    }
    let mut out = Vec::with_capacity(chunks.len() + 1);
    for c in chunks {
        if inside(&c) {
            out.push(c);
            continue;
        }
        let Ok(samples) = c.decode() else {
            *skipped += 1;
            continue;
        };
        for part in samples.chunk_by(|a, b| block_end(a.t, range) == block_end(b.t, range)) {
            out.extend(Chunk::encode_samples(part.iter().copied()).into_iter().map(Chunk::compact));
        }
    }
    out
}

/// Writes length-framed records, keeping the CRC-32 of what it wrote.
pub(super) struct Crc<W: Write> {
    pub w: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Crc<W> {
    /// After the magic (which the CRC-32 covers too).
    pub fn after_magic(w: W) -> Self {
        let mut crc = crc32fast::Hasher::new();
        crc.update(MAGIC);
        Crc { w, crc }
    }

    /// Writes one record, framed by its length, so that a reader parses it from memory.
    pub fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        let len = u32::try_from(b.len())
            .ok()
            .filter(|&n| n <= MAX_RECORD_BYTES)
            .ok_or_else(|| std::io::Error::other("a checkpoint record over its limit"))?;
        self.crc.update(&len.to_le_bytes());
        self.crc.update(b);
        self.w.write_all(&len.to_le_bytes())?;
        self.w.write_all(b)
    }

    /// Ends the records, then the CRC-32 of everything before it.
    pub fn end(&mut self) -> std::io::Result<()> {
        let end = END_OF_RECORDS.to_le_bytes();
        self.crc.update(&end);
        self.w.write_all(&end)?;
        let crc = self.crc.clone().finalize();
        self.w.write_all(&crc.to_le_bytes())
    }
}

/// Reads the length-framed records out of the deflated stream after the magic, keeping the
/// CRC-32 of what it read.
struct Records<R: Read> {
    r: flate2::read::DeflateDecoder<R>,
    crc: crc32fast::Hasher,
    buf: Vec<u8>,
}

impl<R: Read> Records<R> {
    /// The next record; `None` at the end of the records.
    fn next(&mut self) -> Result<Option<&[u8]>, ReadError> {
        let mut len = [0u8; 4];
        self.r.read_exact(&mut len).map_err(read_error)?;
        self.crc.update(&len);
        let n = u32::from_le_bytes(len);
        if n == END_OF_RECORDS {
            return Ok(None);
        }
        if n > MAX_RECORD_BYTES {
            return Err(ReadError::Damaged("a record longer than any"));
        }
        self.buf.resize(n as usize, 0);
        self.r.read_exact(&mut self.buf).map_err(read_error)?;
        self.crc.update(&self.buf);
        Ok(Some(&self.buf))
    }

    /// After the last record: the CRC-32 that follows must be that of what was read.
    fn check_crc(&mut self) -> Result<(), ReadError> {
        let want = self.crc.clone().finalize();
        let mut tail = [0u8; 4];
        self.r.read_exact(&mut tail).map_err(read_error)?;
        if u32::from_le_bytes(tail) != want {
            return Err(ReadError::Damaged("CRC-32 mismatch"));
        }
        Ok(())
    }
}

fn parse_header(b: &[u8]) -> Result<Header, &'static str> {
    const BAD: &str = "malformed header";
    let mut d = Decoder::new(b);
    let cursor = WalCursor {
        segment: d.uvarint().and_then(|v| u32::try_from(v).ok()).ok_or(BAD)?,
        offset: d.uvarint().ok_or(BAD)?,
    };
    let floor = d.varint().ok_or(BAD)?;
    let n_meta = d.len(d.b.len()).ok_or(BAD)?;
    let mut metadata = Vec::with_capacity(n_meta.min(1 << 16));
    for _ in 0..n_meta {
        let family = d.str().ok_or(BAD)?.to_string();
        let metric_type = MetricType::from_u8(d.u8().ok_or(BAD)?);
        let (help, unit) = (d.str().ok_or(BAD)?.to_string(), d.str().ok_or(BAD)?.to_string());
        metadata.push((family, Metadata { metric_type, help, unit }));
    }
    let series = d.uvarint().and_then(|v| usize::try_from(v).ok()).ok_or(BAD)?;
    Ok(Header { cursor, floor, metadata, series })
}

/// Reads a checkpoint through: `header` with its header, `each` with every series, then
/// the CRC-32 is checked (so a caller keeps nothing until this returns `Ok`). Returns the
/// header and how many chunks were left out as unsound.
pub(super) fn parse(
    mut r: impl Read,
    block_range: i64,
    header: impl FnOnce(&Header),
    mut each: impl FnMut(SeriesRecord),
) -> Result<(Header, usize), ReadError> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(read_error)?;
    if &magic != MAGIC {
        return Err(ReadError::Damaged("no checkpoint magic"));
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(MAGIC);
    let mut rec = Records { r: flate2::read::DeflateDecoder::new(r), crc, buf: Vec::new() };
    let h = parse_header(rec.next()?.ok_or("no header")?)?;
    header(&h);
    let (mut entries, mut skipped) = (Entries::default(), 0usize);
    for _ in 0..h.series {
        let b = rec.next()?.ok_or("fewer series than the header says")?;
        each(entries.series(b, block_range, &mut skipped)?);
    }
    if rec.next()?.is_some() {
        return Err(ReadError::Damaged("more records than the header says"));
    }
    rec.check_crc()?;
    Ok((h, skipped))
}
