//! [`BlockReader`]: a block opened for queries and compaction.

use crate::cache::{next_block_number, ChunkCache};
use crate::encoding::Decoder;
use crate::meta::{BlockMeta, CHUNKS_FILE, INDEX_FILE};
use crate::postings::{self, PostingsSource, SeriesId};
use crate::{BlockError, CHUNKS_MAGIC, INDEX_MAGIC};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use strata_chunk::{Chunk, CHUNK_MAX_SAMPLES};
use strata_model::{Label, Labels, Matcher, Metadata, MetricType};

const FOOTER_BYTES: usize = 7 * 8 + 4 + 4;
/// A read that fails (an I/O error, a chunk failing its CRC-32) is tried this often before
/// the block is called damaged: a transient EIO or a torn page-cache read is not damage.
const READ_ATTEMPTS: u32 = 3;
/// A chunk larger than this is damage, not data (960 samples of 16 bytes each, doubled).
const MAX_CHUNK_BYTES: u64 = 64 << 10;

/// One series read from a block: its labels and the chunks that overlap the range asked.
#[derive(Debug, Clone)]
pub struct BlockSeries {
    pub labels: Labels,
    pub chunks: Vec<Chunk>,
    /// The series' number in this block: with [`BlockReader::number`], a key for what a
    /// caller derives from its chunks.
    pub id: u64,
}

/// Where a chunk lies in the `chunks` file, and what it holds.
#[derive(Debug, Clone, Copy)]
struct ChunkRef {
    offset: u64,
    len: u64,
    crc: u32,
    n: u16,
    min_t: i64,
    max_t: i64,
}

/// What made a block damaged; `found` counts the findings, so that a check that began
/// before the latest one never clears it.
#[derive(Debug, Default)]
struct Damage {
    why: Option<(String, std::time::Instant)>,
    found: u64,
}

pub struct BlockReader {
    dir: PathBuf,
    meta: BlockMeta,
    index: Box<[u8]>,
    symbols: Vec<Arc<str>>,
    series_table: usize,
    n_series: usize,
    /// (name symbol, value symbol, offset of the postings list), sorted by name and value.
    postings: Vec<(u32, u32, u64)>,
    metadata: Vec<(String, Metadata)>,
    chunks: File,
    chunks_len: u64,
    /// Set when a read keeps failing: the block is then kept out of queries and
    /// compaction until [`verify`](Self::verify) finds it whole again.
    damaged: AtomicBool,
    /// Why, since when, and how often it was found: the flag changes only under this lock.
    damage: parking_lot::Mutex<Damage>,
    /// This block's key in the shared cache, and the cache.
    number: u64,
    cache: Option<Arc<ChunkCache>>,
}

/// The largest index a block may inflate to: far above any real one (2.4 M series take
/// about 160 MB), and a bound on what a damaged `meta.json` can make a reader allocate.
const MAX_INDEX_BYTES: u64 = 4 << 30;

/// An index deflated on disk, inflated to exactly `raw` bytes.
fn inflate(stored: &[u8], raw: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    if raw > MAX_INDEX_BYTES {
        return Err(format!("it claims {raw} bytes"));
    }
    // Reserved on the file's word only as far as deflate can plausibly reach; beyond it
    // the buffer grows with what really inflates.
    let mut out = Vec::with_capacity(raw.min(stored.len() as u64 * 32) as usize);
    let mut d = flate2::read::DeflateDecoder::new(stored).take(raw + 1);
    d.read_to_end(&mut out).map_err(|e| e.to_string())?;
    if out.len() as u64 != raw {
        return Err(format!("{} bytes, meta.json says {raw}", out.len()));
    }
    Ok(out)
}

impl BlockReader {
    /// Opens the block in `dir`, checking its meta, the index's size and CRC-32 and the
    /// chunks file's size. Chunks are checked as they are read.
    pub fn open(dir: &Path) -> Result<BlockReader, BlockError> {
        Self::open_with_cache(dir, None)
    }

    /// [`open`](Self::open), keeping series read by queries in `cache`.
    pub fn open_with_cache(dir: &Path, cache: Option<Arc<ChunkCache>>) -> Result<BlockReader, BlockError> {
        crate::fault::fail("block-open").map_err(|e| BlockError::io(dir, e))?;
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let corrupt = |reason: String| BlockError::Corrupt { block: name.clone(), reason };
        let meta = BlockMeta::read(dir).map_err(corrupt)?;
        let want = |f: &str| meta.file(f).cloned().ok_or_else(|| corrupt(format!("meta.json lists no {f} file")));
        let (index_meta, chunks_meta) = (want(INDEX_FILE)?, want(CHUNKS_FILE)?);
        let index_path = dir.join(INDEX_FILE);
        let stored = std::fs::read(&index_path).map_err(|e| BlockError::io(&index_path, e))?;
        if stored.len() as u64 != index_meta.bytes || crc32fast::hash(&stored) != index_meta.crc32 {
            return Err(corrupt(format!(
                "index is {} bytes with a CRC-32 other than meta.json's ({} bytes)",
                stored.len(),
                index_meta.bytes
            )));
        }
        let index = match index_meta.raw_bytes {
            None => stored,
            Some(raw) => inflate(&stored, raw).map_err(|e| corrupt(format!("index does not inflate: {e}")))?,
        };
        let chunks_path = dir.join(CHUNKS_FILE);
        let chunks = File::open(&chunks_path).map_err(|e| BlockError::io(&chunks_path, e))?;
        let chunks_len = chunks.metadata().map_err(|e| BlockError::io(&chunks_path, e))?.len();
        if chunks_len != chunks_meta.bytes {
            return Err(corrupt(format!("chunks file is {chunks_len} bytes, meta.json says {}", chunks_meta.bytes)));
        }
        let mut magic = [0u8; 8];
        chunks.read_exact_at(&mut magic, 0).map_err(|e| BlockError::io(&chunks_path, e))?;
        if &magic != CHUNKS_MAGIC {
            return Err(corrupt("chunks file does not start with the chunks magic".into()));
        }
        let mut r = BlockReader {
            dir: dir.to_path_buf(),
            meta,
            index: index.into_boxed_slice(),
            symbols: Vec::new(),
            series_table: 0,
            n_series: 0,
            postings: Vec::new(),
            metadata: Vec::new(),
            chunks,
            chunks_len,
            damaged: AtomicBool::new(false),
            damage: parking_lot::Mutex::new(Damage::default()),
            number: next_block_number(),
            cache,
        };
        r.parse_index().ok_or_else(|| corrupt("index does not parse".into()))?;
        Ok(r)
    }

    fn parse_index(&mut self) -> Option<()> {
        let b = &self.index;
        if b.len() < INDEX_MAGIC.len() + FOOTER_BYTES || &b[..8] != INDEX_MAGIC {
            return None;
        }
        let footer = b.len() - FOOTER_BYTES;
        let mut f = Decoder::at(b, footer);
        let [symbols_off, n_symbols, series_table, n_series, postings_off, n_postings, metadata_off] =
            [(); 7].map(|_| f.u64().and_then(|v| usize::try_from(v).ok()));
        let (symbols_off, n_symbols, series_table, n_series) = (symbols_off?, n_symbols?, series_table?, n_series?);
        let (postings_off, n_postings, metadata_off) = (postings_off?, n_postings?, metadata_off?);
        if f.u32()? != crc32fast::hash(&b[..footer + 7 * 8]) {
            return None;
        }
        if n_symbols > footer || n_series.checked_mul(8)? > footer || n_postings.checked_mul(16)? > footer {
            return None;
        }
        let mut d = Decoder::at(&b[..footer], symbols_off);
        let mut symbols = Vec::with_capacity(n_symbols);
        for _ in 0..n_symbols {
            symbols.push(Arc::<str>::from(d.str()?));
        }
        if series_table.checked_add(n_series * 8)? > footer {
            return None;
        }
        let mut d = Decoder::at(&b[..footer], postings_off);
        let mut postings = Vec::with_capacity(n_postings);
        for _ in 0..n_postings {
            let (n, v, off) = (d.u32()?, d.u32()?, d.u64()?);
            if n as usize >= n_symbols || v as usize >= n_symbols || off >= postings_off as u64 {
                return None;
            }
            postings.push((n, v, off));
        }
        let mut d = Decoder::at(&b[..footer], metadata_off);
        let n_meta = d.len(footer)?;
        let mut metadata = Vec::with_capacity(n_meta.min(1 << 16));
        for _ in 0..n_meta {
            let family = d.str()?.to_string();
            let metric_type = MetricType::from_u8(d.u8()?);
            let (help, unit) = (d.str()?.to_string(), d.str()?.to_string());
            metadata.push((family, Metadata { metric_type, help, unit }));
        }
        self.symbols = symbols;
        self.series_table = series_table;
        self.n_series = n_series;
        self.postings = postings;
        self.metadata = metadata;
        Some(())
    }

    pub fn meta(&self) -> &BlockMeta {
        &self.meta
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn id(&self) -> &str {
        &self.meta.id
    }

    /// This reader's number, unique in the process and never reused (a block written
    /// again is opened under another): with a series' id, a cache key.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Drops this block's series from the shared cache (before the block is deleted).
    pub fn forget_cached(&self) {
        if let Some(c) = &self.cache {
            c.forget_block(self.number);
        }
    }

    pub fn is_damaged(&self) -> bool {
        self.damaged.load(Ordering::Relaxed)
    }

    pub fn num_series(&self) -> usize {
        self.n_series
    }

    /// Bytes this reader holds in memory (the index and what was parsed from it).
    pub fn memory_bytes(&self) -> usize {
        self.index.len()
            + self.symbols.iter().map(|s| s.len() + 32).sum::<usize>()
            + self.postings.len() * 16
            + self.metadata.iter().map(|(f, m)| f.len() + m.help.len() + m.unit.len() + 64).sum::<usize>()
    }

    pub fn metadata(&self) -> &[(String, Metadata)] {
        &self.metadata
    }

    fn corrupt(&self, reason: impl Into<String>) -> BlockError {
        let reason = reason.into();
        self.mark_damaged(&reason);
        BlockError::Corrupt { block: self.meta.id.clone(), reason }
    }

    fn mark_damaged(&self, reason: &str) {
        let mut d = self.damage.lock();
        d.why = Some((reason.to_string(), std::time::Instant::now()));
        d.found += 1;
        self.damaged.store(true, Ordering::Relaxed);
        drop(d);
        tracing::error!(block = %self.dir.display(), %reason, "damaged block: kept out of queries and compaction");
    }

    /// Why the block was found damaged, and how long ago; `None` while it is whole.
    pub fn damage(&self) -> Option<(String, std::time::Duration)> {
        self.damage.lock().why.as_ref().map(|(r, at)| (r.clone(), at.elapsed()))
    }

    /// Reads every chunk of the block, checking each; when all read back whole, a block
    /// found damaged earlier (the disk failed for a while) is taken back into queries.
    /// Returns whether the block is whole.
    pub fn verify(&self) -> bool {
        let found = self.damage.lock().found;
        for id in 0..self.n_series {
            let Ok((labels, refs)) = self.series_entry(id as SeriesId) else { return false };
            if let Err(reason) = self.read_chunks_once(&labels, &refs) {
                tracing::warn!(block = %self.dir.display(), %reason, "damaged block still fails to read");
                if let Some(d) = self.damage.lock().why.as_mut() {
                    d.1 = std::time::Instant::now();
                }
                return false;
            }
        }
        let mut d = self.damage.lock();
        // A query that found damage while this check read is newer news: it stands.
        if d.found == found && d.why.take().is_some() {
            self.damaged.store(false, Ordering::Relaxed);
            tracing::info!(block = %self.dir.display(), "block reads whole again: back in queries and compaction");
        }
        d.found == found
    }

    fn sym(&self, i: u32) -> &str {
        self.symbols.get(i as usize).map(|s| &**s).unwrap_or("")
    }

    /// The labels and chunk references of series `id`.
    fn series_entry(&self, id: SeriesId) -> Result<(Labels, Vec<ChunkRef>), BlockError> {
        let bad = |what: &str| self.corrupt(format!("series {id}: {what}"));
        let id = usize::try_from(id).ok().filter(|&i| i < self.n_series).ok_or_else(|| bad("no such series"))?;
        let mut t = Decoder::at(&self.index, self.series_table + id * 8);
        let off = t.u64().and_then(|o| usize::try_from(o).ok()).ok_or_else(|| bad("offset"))?;
        let mut d = Decoder::at(&self.index[..self.series_table], off);
        let parse = |d: &mut Decoder| -> Option<(Labels, Vec<ChunkRef>)> {
            let n = d.len(256)?;
            let mut labels = Vec::with_capacity(n);
            for _ in 0..n {
                let (name, value) = (d.len(u32::MAX as usize)?, d.len(u32::MAX as usize)?);
                labels.push(Label { name: self.symbols.get(name)?.clone(), value: self.symbols.get(value)?.clone() });
            }
            let nc = d.len(1 << 24)?;
            let mut offset = d.uvarint()?;
            let mut chunks = Vec::with_capacity(nc);
            let mut prev_max = 0i64;
            for _ in 0..nc {
                let min_t = prev_max.checked_add(d.varint()?)?;
                let max_t = min_t.checked_add(i64::try_from(d.uvarint()?).ok()?)?;
                let n = u16::try_from(d.uvarint()?).ok().filter(|&n| n > 0 && n <= CHUNK_MAX_SAMPLES)?;
                let len = d.uvarint()?;
                let crc = d.u32()?;
                if len == 0 || len > MAX_CHUNK_BYTES {
                    return None;
                }
                chunks.push(ChunkRef { offset, len, crc, n, min_t, max_t });
                offset = offset.checked_add(len)?;
                prev_max = max_t;
            }
            if offset > self.chunks_len {
                return None;
            }
            Some((Labels::from_sorted_unchecked(labels), chunks))
        };
        parse(&mut d).ok_or_else(|| bad("entry does not parse"))
    }

    /// Reads the chunks (contiguous in the file) with one positioned read, checking each;
    /// a failure is retried ([`READ_ATTEMPTS`]) before the block is marked damaged.
    fn read_chunks(&self, labels: &Labels, refs: &[ChunkRef]) -> Result<Vec<Chunk>, BlockError> {
        let mut attempt = 1;
        loop {
            match self.read_chunks_once(labels, refs) {
                Ok(chunks) => return Ok(chunks),
                Err(reason) if attempt < READ_ATTEMPTS => {
                    tracing::warn!(block = %self.dir.display(), %reason, attempt, "block read failed: retrying");
                    std::thread::sleep(std::time::Duration::from_millis(5 * u64::from(attempt)));
                    attempt += 1;
                }
                Err(reason) => return Err(self.corrupt(format!("{reason} ({READ_ATTEMPTS} attempts)"))),
            }
        }
    }

    fn read_chunks_once(&self, labels: &Labels, refs: &[ChunkRef]) -> Result<Vec<Chunk>, String> {
        let (Some(first), Some(last)) = (refs.first(), refs.last()) else { return Ok(Vec::new()) };
        let len = usize::try_from(last.offset + last.len - first.offset).map_err(|_| "chunk range".to_string())?;
        let mut buf = vec![0u8; len];
        crate::fault::fail("block-read")
            .and_then(|()| self.chunks.read_exact_at(&mut buf, first.offset))
            .map_err(|e| format!("reading {}: {e}", self.dir.join(CHUNKS_FILE).display()))?;
        let mut out = Vec::with_capacity(refs.len());
        for r in refs {
            let at = (r.offset - first.offset) as usize;
            let data = &buf[at..at + r.len as usize];
            if crc32fast::hash(data) != r.crc {
                return Err(format!("series {labels}: chunk at byte {} fails its CRC-32", r.offset));
            }
            out.push(Chunk { data: Arc::from(data), n: r.n, min_t: r.min_t, max_t: r.max_t });
        }
        Ok(out)
    }

    /// Series matching the matchers with chunks overlapping `[mint, maxt]`, sorted by
    /// labels. `charge` sees each series' chunks before they are kept and may stop the
    /// selection with its error.
    pub fn select<E: From<BlockError>>(
        &self,
        matchers: &[Matcher],
        mint: i64,
        maxt: i64,
        mut charge: impl FnMut(&[Chunk]) -> Result<(), E>,
    ) -> Result<Vec<BlockSeries>, E> {
        if self.is_damaged() {
            return Err(BlockError::Corrupt { block: self.meta.id.clone(), reason: "damaged earlier".into() }.into());
        }
        let mut out = Vec::new();
        for id in postings::select(self, matchers) {
            let (labels, refs) = self.series_entry(id)?;
            let overlaps = |min_t: i64, max_t: i64| min_t <= maxt && max_t >= mint;
            if !refs.iter().any(|c| overlaps(c.min_t, c.max_t)) {
                continue;
            }
            let chunks: Vec<Chunk> = match &self.cache {
                Some(cache) => {
                    let all = match cache.get(self.number, id) {
                        Some(all) => all,
                        None => {
                            let all: Arc<[Chunk]> = Arc::from(self.read_chunks(&labels, &refs)?);
                            cache.insert(self.number, id, all.clone());
                            all
                        }
                    };
                    all.iter().filter(|c| overlaps(c.min_t, c.max_t)).cloned().collect()
                }
                None => {
                    let refs: Vec<ChunkRef> = refs.into_iter().filter(|c| overlaps(c.min_t, c.max_t)).collect();
                    self.read_chunks(&labels, &refs)?
                }
            };
            charge(&chunks)?;
            out.push(BlockSeries { labels, chunks, id });
        }
        Ok(out)
    }

    /// Label sets of matching series with samples in `[mint, maxt]`, sorted.
    pub fn series_labels(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Result<Vec<Labels>, BlockError> {
        let mut out = Vec::new();
        for id in postings::select(self, matchers) {
            let (labels, refs) = self.series_entry(id)?;
            if refs.iter().any(|c| c.min_t <= maxt && c.max_t >= mint) {
                out.push(labels);
            }
        }
        Ok(out)
    }

    /// Every series with all its chunks, in label order: compaction's input. `id` runs
    /// from 0 to [`num_series`](Self::num_series).
    pub fn series_at(&self, id: usize) -> Result<BlockSeries, BlockError> {
        let (labels, refs) = self.series_entry(id as SeriesId)?;
        let chunks = self.read_chunks(&labels, &refs)?;
        Ok(BlockSeries { labels, chunks, id: id as u64 })
    }

    pub fn label_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for &(n, _, _) in &self.postings {
            if names.last().map(String::as_str) != Some(self.sym(n)) {
                names.push(self.sym(n).to_string());
            }
        }
        names
    }

    pub fn label_values(&self, name: &str) -> Vec<String> {
        self.name_range(name).iter().map(|&(_, v, _)| self.sym(v).to_string()).collect()
    }

    /// The postings table's entries for one label name.
    fn name_range(&self, name: &str) -> &[(u32, u32, u64)] {
        let lo = self.postings.partition_point(|&(n, _, _)| self.sym(n) < name);
        let hi = self.postings.partition_point(|&(n, _, _)| self.sym(n) <= name);
        &self.postings[lo..hi]
    }

    fn postings_list(&self, off: u64) -> Vec<SeriesId> {
        let mut d = Decoder::at(&self.index, off as usize);
        let mut out = Vec::new();
        let Some(n) = d.len(self.n_series) else {
            self.corrupt(format!("postings list at {off}"));
            return out;
        };
        let mut id = 0u64;
        for _ in 0..n {
            let Some(delta) = d.uvarint() else {
                self.corrupt(format!("postings list at {off}"));
                return Vec::new();
            };
            id = id.saturating_add(delta);
            out.push(id);
        }
        out
    }
}

impl PostingsSource for BlockReader {
    fn postings(&self, name: &str, value: &str) -> Vec<SeriesId> {
        let range = self.name_range(name);
        match range.binary_search_by(|&(_, v, _)| self.sym(v).cmp(value)) {
            Ok(i) => self.postings_list(range[i].2),
            Err(_) => Vec::new(),
        }
    }

    fn matching(&self, name: &str, accept: &dyn Fn(&str) -> bool) -> Vec<SeriesId> {
        let lists: Vec<Vec<SeriesId>> = self
            .name_range(name)
            .iter()
            .filter(|&&(_, v, _)| accept(self.sym(v)))
            .map(|&(_, _, off)| self.postings_list(off))
            .collect();
        postings::union_all(lists.iter().map(Vec::as_slice))
    }

    fn all(&self) -> Vec<SeriesId> {
        (0..self.n_series as SeriesId).collect()
    }
}
