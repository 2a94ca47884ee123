//! [`ArchiveStore`]: the archive served back as a [`Store`], so a global queries it as one
//! more store and the engine and the API need nothing of their own for it.
//!
//! The block list is read from the bucket (every folder with a `meta.json`) and refreshed
//! at most every `refresh`. A query opens the blocks its range overlaps, keeping their
//! series tables and footers in a cache bounded by series count, finds the matching series
//! in each table, and fetches only the row groups that hold them by byte range, each one
//! checked against its checksum ([`crate::ranged`]). A query over most of a block reads its
//! series' whole range there and keeps their chunks for the next ([`ChunkCache`]). A block that cannot be read (a file
//! missing or damaged, a meta that does not parse) leaves its range out of the answer and
//! says so in the request's warnings, or fails the request under `partial_response=false`:
//! never a silent gap.

use crate::archiver::ProgressRecord;
use crate::block_cache::{ChunkCache, WindowCache};
use crate::compactor::DELETION_MARK;
use crate::layout::META;
use crate::layout::{parse_block_dir, resolution_dir, shard_of};
use crate::meta::BlockMeta;
use crate::reader::{read_meta, ArchivedSeries, BlockReader};
use crate::ArchiveError;
use async_trait::async_trait;
use object_store::path::Path;
use object_store::ObjectStore;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use strata_chunk::Chunk;
use strata_model::{Labels, Matcher, Metadata, MetricType, Sample};
use strata_store::{QueryScope, SelectBudget, SelectRequest, SeriesChunks, Store, StoreError};

/// Blocks opened at once by a query.
pub(crate) const OPEN_AT_ONCE: usize = 8;

/// How an [`ArchiveStore`] reads.
#[derive(Debug, Clone)]
pub struct ArchiveStoreOptions {
    /// The block list is read again once older than this.
    pub refresh: Duration,
    /// Series of open blocks kept in memory (their labels and footers, about 1 KB each);
    /// past it the least recently used blocks are closed.
    pub cache_series: usize,
    /// Bytes of series' chunks kept for the next query ([`ChunkCache`]); 0: none.
    pub cache_chunk_bytes: usize,
    /// Bytes of series' aggregate windows kept for the next query ([`WindowCache`]); 0: none.
    pub cache_window_bytes: usize,
}

impl Default for ArchiveStoreOptions {
    fn default() -> Self {
        ArchiveStoreOptions {
            refresh: Duration::from_secs(60),
            cache_series: 250_000,
            cache_chunk_bytes: 256 << 20,
            cache_window_bytes: 256 << 20,
        }
    }
}

/// A block as the list shows it.
#[derive(Clone)]
pub(crate) struct Listed {
    pub(crate) dir: Path,
    /// The meta object's size, time and tag when it was read: unchanged, it is not read
    /// again at the next listing.
    stamp: String,
    pub(crate) meta: Result<BlockMeta, String>,
}

#[derive(Default)]
struct Catalog {
    listed_at: Option<Instant>,
    blocks: Arc<[Listed]>,
    /// Per shard (`None`: the root), its progress record (where every raw range before
    /// is archived or held nothing, and the gaps passed), with the record's stamp.
    progress: BTreeMap<Option<String>, (String, ProgressRecord)>,
    /// Per shard, why its progress record could not be read, when it never was: the
    /// ranges it passed as empty are then unknown, and queries say so.
    unreadable: BTreeMap<Option<String>, String>,
}

/// Open blocks, least recently used first.
#[derive(Default)]
struct OpenBlocks {
    blocks: Vec<(Path, Arc<BlockReader>)>,
    series: usize,
}

pub struct ArchiveStore {
    objects: Arc<dyn ObjectStore>,
    /// Named in warnings: the archive's URL.
    name: String,
    opts: ArchiveStoreOptions,
    catalog: tokio::sync::Mutex<Catalog>,
    open: Mutex<OpenBlocks>,
    chunks: ChunkCache,
    pub(crate) windows: WindowCache,
    /// See [`ArchiveStore::set_served_until`].
    served_until: std::sync::atomic::AtomicI64,
}

impl ArchiveStore {
    pub fn new(objects: Arc<dyn ObjectStore>, name: impl Into<String>, opts: ArchiveStoreOptions) -> Self {
        ArchiveStore {
            objects,
            name: name.into(),
            opts: opts.clone(),
            catalog: tokio::sync::Mutex::new(Catalog::default()),
            open: Mutex::new(OpenBlocks::default()),
            chunks: ChunkCache::new(opts.cache_chunk_bytes),
            windows: WindowCache::new(opts.cache_window_bytes),
            served_until: std::sync::atomic::AtomicI64::new(i64::MAX),
        }
    }

    /// Series' chunks the cache holds.
    #[cfg(test)]
    pub(crate) fn cached_series(&self) -> usize {
        self.chunks.held().0
    }

    /// A store over exactly `blocks`, never listing the bucket: what compaction reads, so
    /// that every query of it sees the same blocks whatever lands in the bucket meanwhile.
    pub fn over_blocks(
        objects: Arc<dyn ObjectStore>,
        name: impl Into<String>,
        blocks: Vec<(Path, BlockMeta)>,
        opts: ArchiveStoreOptions,
    ) -> Self {
        let mut store = Self::new(objects, name, ArchiveStoreOptions { refresh: Duration::MAX, ..opts });
        let mut blocks: Vec<Listed> =
            blocks.into_iter().map(|(dir, meta)| Listed { dir, stamp: String::new(), meta: Ok(meta) }).collect();
        blocks.sort_by(|a, b| a.dir.cmp(&b.dir));
        let progress = BTreeMap::new();
        store.catalog = tokio::sync::Mutex::new(Catalog {
            listed_at: Some(Instant::now()),
            blocks: blocks.into(),
            progress,
            unreadable: BTreeMap::new(),
        });
        store
    }

    /// The blocks listed now (read again when older than `refresh`); a meta already read
    /// and unchanged is not fetched again, new ones are fetched a few at a time.
    pub(crate) async fn listed(&self) -> Result<Arc<[Listed]>, StoreError> {
        Ok(self.catalog().await?.blocks)
    }

    /// The block list and the progress records, as listed now.
    async fn catalog(&self) -> Result<Snapshot, StoreError> {
        use futures_util::{StreamExt, TryStreamExt};
        let mut c = self.catalog.lock().await;
        if c.listed_at.is_none_or(|t| t.elapsed() >= self.opts.refresh) {
            let failed =
                |e: object_store::Error| StoreError::Unavailable(format!("archive {}: listing: {e}", self.name));
            let all: Vec<object_store::ObjectMeta> = self
                .objects
                .list(None)
                .try_filter(|o| {
                    let name = o.location.filename();
                    std::future::ready(name == Some(META) || name == Some(DELETION_MARK) || is_progress(&o.location))
                })
                .try_collect()
                .await
                .map_err(failed)?;
            let folder = |o: &object_store::ObjectMeta| -> Path {
                o.location.parts().take(o.location.parts().count().saturating_sub(1)).collect()
            };
            // A block marked for deletion (compacted, or past retention) is left out.
            let marked: BTreeSet<Path> =
                all.iter().filter(|o| o.location.filename() == Some(DELETION_MARK)).map(folder).collect();
            let stamp = |m: &object_store::ObjectMeta| format!("{} {} {:?}", m.size, m.last_modified, m.e_tag);
            // Progress records are read again only when they changed. One that cannot be
            // read now keeps what it said last (a failed read says nothing new); one never
            // read counts as none (the shard's blocks alone say where it is).
            let mut progress = BTreeMap::new();
            let mut unreadable = BTreeMap::new();
            // (Owned, so the reads may run a few at a time.)
            let records: Vec<(Option<String>, String, Path, Option<ProgressRecord>)> = all
                .iter()
                .filter(|o| is_progress(&o.location))
                .map(|o| {
                    let (shard, stamp) = (shard_of(&o.location), stamp(o));
                    let known = c.progress.get(&shard).filter(|(was, _)| *was == stamp).map(|(_, r)| r.clone());
                    (shard, stamp, o.location.clone(), known)
                })
                .collect();
            let objects = self.objects.clone();
            let read: Vec<_> = futures_util::stream::iter(records)
                .map(move |(shard, stamp, path, known)| {
                    let objects = objects.clone();
                    async move {
                        let got = match known {
                            Some(record) => Ok(Some(record)),
                            None => crate::archiver::read_progress_at(objects.as_ref(), &path).await,
                        };
                        (shard, stamp, got)
                    }
                })
                .buffered(OPEN_AT_ONCE)
                .collect()
                .await;
            for (shard, stamp, got) in read {
                match got {
                    Ok(Some(record)) => {
                        progress.insert(shard, (stamp, record));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(archive = %self.name, error = %e, "reading a progress record");
                        // A failed read says nothing new: what was read before stands.
                        match c.progress.get(&shard) {
                            Some(before) => {
                                progress.insert(shard, before.clone());
                            }
                            None => {
                                unreadable.insert(shard, e.to_string());
                            }
                        }
                    }
                }
            }
            c.progress = progress;
            c.unreadable = unreadable;
            let metas: Vec<object_store::ObjectMeta> = all
                .into_iter()
                .filter(|o| o.location.filename() == Some(META) && !marked.contains(&folder(o)))
                .collect();
            let known = c.blocks.clone();
            let known = &known;
            let mut blocks: Vec<Listed> = futures_util::stream::iter(metas)
                .map(|m| async move {
                    let dir: Path = m.location.parts().take(m.location.parts().count().saturating_sub(1)).collect();
                    let stamp = stamp(&m);
                    if let Some(k) = known.iter().find(|k| k.dir == dir && k.stamp == stamp) {
                        return k.clone();
                    }
                    let meta = read_meta(self.objects.as_ref(), &dir).await.map_err(|e| e.to_string());
                    Listed { dir, stamp, meta }
                })
                .buffered(OPEN_AT_ONCE)
                .collect()
                .await;
            blocks.sort_by(|a, b| a.dir.cmp(&b.dir));
            c.blocks = blocks.into();
            c.listed_at = Some(Instant::now());
        }
        let progress = c.progress.iter().map(|(shard, (_, record))| (shard.clone(), record.clone())).collect();
        Ok(Snapshot { blocks: c.blocks.clone(), progress, unreadable: c.unreadable.clone() })
    }

    /// The time range each resolution holds, from the block list: what a global plans
    /// with and shows in its store list.
    pub async fn time_ranges(&self) -> Result<BTreeMap<i64, (i64, i64)>, StoreError> {
        let mut out: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
        let Snapshot { blocks, progress, .. } = self.catalog().await?;
        for b in blocks.iter() {
            // A block whose meta is damaged still counts, by its folder's name: queries over
            // its range must reach the archive, to be told it is left out.
            let range = match &b.meta {
                // Raw data from its oldest sample, where the meta says.
                Ok(m) => Some((m.resolution_ms, m.first_sample.unwrap_or(m.min_time), m.max_time)),
                Err(_) => parse_block_dir(&b.dir).and_then(|(res, lo, hi)| {
                    [0, 300_000, 3_600_000].into_iter().find(|r| resolution_dir(*r) == res).map(|r| (r, lo, hi))
                }),
            };
            if let Some((res, lo, hi)) = range.filter(|(_, lo, hi)| lo < hi) {
                let r = out.entry(res).or_insert((lo, hi));
                *r = (r.0.min(lo), r.1.max(hi));
            }
        }
        // Ranges passed as empty without every store after the raw blocks' start: queries
        // over them must reach the archive, to be told so. (Not before: gaps outlive raw
        // retention, and an archive's raw range is what the planner takes as held.)
        if let Some(raw) = out.get_mut(&0) {
            for g in progress.values().flat_map(|r| &r.gaps).filter(|g| g.end > raw.0) {
                raw.1 = raw.1.max(g.end);
            }
        }
        Ok(out)
    }

    /// A warning (an error under `partial_response=false`) for what the archive lacks in
    /// `[start, end]`: every shard whose raw blocks end before `end` while another's go on
    /// (its archiver is behind), and every range an archiver passed as empty while a store
    /// did not answer (its data may never have reached the archive).
    pub(crate) async fn warn_incomplete(&self, start: i64, end: i64) -> Result<(), StoreError> {
        // Past where the archive alone answers, the stores beside it hold the data.
        let end = end.min(self.served_until.load(std::sync::atomic::Ordering::Relaxed));
        let mut messages = Vec::new();
        let snapshot = self.catalog().await?;
        let ends = snapshot.shard_ends(0);
        let furthest = ends.values().copied().max().unwrap_or(i64::MIN);
        for (shard, &until) in &ends {
            // The block ranges are half-open: `until` is past the newest sample held.
            if until <= end && until < furthest {
                let name = shard.as_deref().unwrap_or("(root)");
                messages.push(format!(
                    "archive {}: shard {name} is archived only up to {until} ms: its series are missing after that",
                    self.name
                ));
            }
        }
        for (shard, record) in &snapshot.progress {
            // One message per record, however many of its gaps the query meets.
            let met: Vec<&crate::archiver::Gap> =
                record.gaps.iter().filter(|g| g.start <= end && g.end > start).collect();
            let Some(first) = met.first() else { continue };
            let of = shard.as_ref().map(|s| format!(" (shard {s})")).unwrap_or_default();
            let more = match met.len() {
                1 => String::new(),
                n => format!(" and {} more such ranges", n - 1),
            };
            messages.push(format!(
                "archive {}{of}: [{}, {}) ms was archived as empty while {}{more}: series may be missing there",
                self.name, first.start, first.end, first.why
            ));
        }
        for (shard, e) in snapshot.unreadable.iter().filter(|_| start <= end) {
            let of = shard.as_ref().map(|s| format!(" of shard {s}")).unwrap_or_default();
            messages.push(format!(
                "archive {}: the progress record{of} cannot be read ({e}): ranges archived as empty without every store are not known",
                self.name
            ));
        }
        let scope = QueryScope::current();
        if let Some(first) = messages.first() {
            if !scope.partial_response {
                let mut first = first.clone();
                if first.len() > 1024 {
                    let mut cut = 1024;
                    while !first.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    first.truncate(cut);
                }
                return Err(StoreError::Unavailable(first));
            }
        }
        for m in messages {
            scope.warn(m);
        }
        Ok(())
    }

    /// The newest time that only the archive answers for (the stores beside it, in a
    /// global, hold what is newer); `i64::MAX` when it stands alone.
    pub fn set_served_until(&self, t: i64) {
        self.served_until.store(t, std::sync::atomic::Ordering::Relaxed);
    }

    /// A block, opened or from the cache (a cached one whose meta differs from the
    /// listed one was written again: opened afresh).
    pub(crate) async fn open(&self, dir: &Path, meta: &BlockMeta) -> Result<Arc<BlockReader>, ArchiveError> {
        if let Ok(mut open) = self.open.lock() {
            if let Some(i) = open.blocks.iter().position(|(d, _)| d == dir) {
                let entry = open.blocks.remove(i);
                if entry.1.meta == *meta {
                    let reader = entry.1.clone();
                    open.blocks.push(entry);
                    return Ok(reader);
                }
                open.series = open.series.saturating_sub(entry.1.series().len());
            }
        }
        let reader = Arc::new(BlockReader::open(self.objects.clone(), dir.clone()).await?);
        if let Ok(mut open) = self.open.lock() {
            if !open.blocks.iter().any(|(d, _)| d == dir) {
                open.series = open.series.saturating_add(reader.series().len());
                open.blocks.push((dir.clone(), reader.clone()));
                // The block just opened stays, however large: the query needs it.
                while open.series > self.opts.cache_series && open.blocks.len() > 1 {
                    let (_, old) = open.blocks.remove(0);
                    open.series = open.series.saturating_sub(old.series().len());
                }
            }
        }
        Ok(reader)
    }

    /// The listed blocks of `resolution_ms` that overlap `[start, end]`, oldest first.
    pub(crate) async fn candidates(&self, resolution_ms: i64, start: i64, end: i64) -> Result<Vec<Listed>, StoreError> {
        let mut listed: Vec<Listed> = self
            .listed()
            .await?
            .iter()
            .filter(|b| match &b.meta {
                Ok(m) => m.resolution_ms == resolution_ms && m.min_time <= end && m.max_time > start,
                // A damaged meta: its folder says its resolution and range.
                Err(_) => parse_block_dir(&b.dir)
                    .is_none_or(|(res, lo, hi)| res == resolution_dir(resolution_ms) && lo <= end && hi > start),
            })
            .cloned()
            .collect();
        listed.sort_by_key(|b| b.meta.as_ref().map_or(i64::MIN, |m| m.min_time));
        Ok(listed)
    }

    /// `some` blocks opened together (on an object store each is several round trips);
    /// a query takes its candidates [`OPEN_AT_ONCE`] at a time, so it holds no more than
    /// that many beside the cache. What cannot be read is a warning of the request (or
    /// its error under `partial_response=false`), naming the block and the range left out.
    async fn open_some(&self, some: &[Listed]) -> Result<Vec<Arc<BlockReader>>, StoreError> {
        let opened = futures_util::future::join_all(some.iter().map(|b| async move {
            match &b.meta {
                Ok(m) => self.open(&b.dir, m).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.clone()),
            }
        }))
        .await;
        let mut out = Vec::new();
        for (b, opened) in some.iter().zip(opened) {
            match opened {
                Ok(r) => {
                    if !r.meta.gaps.is_empty() {
                        let gaps = r.meta.gaps.join("; ");
                        QueryScope::current()
                            .warn(format!("archive {}: block {} may be incomplete: {gaps}", self.name, b.dir));
                    }
                    out.push(r)
                }
                Err(e) => self.unreadable(&b.dir, &e)?,
            }
        }
        Ok(out)
    }

    /// A block that could not be read: a warning, or the request's error.
    fn unreadable(&self, dir: &Path, error: &str) -> Result<(), StoreError> {
        let message = format!("archive {}: block {dir} left out of this answer: {error}", self.name);
        let scope = QueryScope::current();
        if !scope.partial_response {
            return Err(StoreError::Unavailable(message));
        }
        tracing::warn!(archive = %self.name, block = %dir, error, "an archive block could not be read");
        scope.warn(message);
        Ok(())
    }

    /// The series of `blocks` that match and have samples in `[start, end]`, by labels.
    fn matching<'a>(
        blocks: &'a [Arc<BlockReader>],
        matchers: &[Matcher],
        start: i64,
        end: i64,
    ) -> impl Iterator<Item = &'a ArchivedSeries> + 'a {
        let matchers = matchers.to_vec();
        blocks.iter().flat_map(move |b| {
            let ids: Vec<usize> = b.matching_ids(&matchers).collect();
            ids.into_iter()
                .map(|i| &b.series()[i])
                .filter(move |s| s.samples > 0 && s.max_time >= start && s.min_time <= end)
        })
    }
}

/// One series' samples from block after block, kept as chunks as they come (so a query
/// over many days holds compressed samples, not 16 bytes each). Blocks of one resolution
/// do not overlap, but for a moment after a compaction (the day block beside the blocks it
/// replaces): then the overlap is merged, one sample kept per timestamp.
struct SeriesBuilder {
    metric_type: MetricType,
    chunks: Vec<Chunk>,
    last: Option<i64>,
}

impl SeriesBuilder {
    fn new(metric_type: MetricType) -> Self {
        SeriesBuilder { metric_type, chunks: Vec::new(), last: None }
    }

    /// Adds `more`, sorted by time, as sealed chunks (the block encoding, which queries
    /// decode fastest, written in one pass).
    fn add(&mut self, more: Vec<Sample>) -> Result<(), String> {
        let (Some(first), Some(newest)) = (more.first(), more.last()) else { return Ok(()) };
        let newest = newest.t;
        if self.last.is_some_and(|l| first.t <= l) {
            // Only the chunks that reach into `more` are decoded: a series read from many
            // blocks overlapping one another costs each overlap, not the whole series again.
            // Chunks wholly before or wholly after `more` stay as they are.
            let keep = self.chunks.partition_point(|c| c.max_t < first.t);
            let after = keep + self.chunks[keep..].partition_point(|c| c.min_t <= newest);
            let tail: Vec<Chunk> = self.chunks.drain(after..).collect();
            let mut all = Vec::new();
            for c in self.chunks.drain(keep..) {
                c.decode_checked(&mut all)?;
            }
            all.extend(more);
            all.sort_by_key(|s| s.t);
            all.dedup_by_key(|s| s.t);
            self.chunks.extend(Chunk::encode_sealed(&all));
            self.chunks.extend(tail);
            self.last = self.chunks.last().map(|c| c.max_t);
            return Ok(());
        }
        self.chunks.extend(Chunk::encode_sealed(&more));
        self.last = Some(newest);
        Ok(())
    }

    /// Adds chunks, sorted by time, as they are (samples outside the query's range in
    /// them are the engine's to skip, as with the head's chunks).
    fn add_chunks(&mut self, more: Vec<Chunk>) -> Result<(), String> {
        let (Some(first), Some(newest)) = (more.first(), more.last()) else { return Ok(()) };
        if self.last.is_some_and(|l| first.min_t <= l) {
            let mut samples = Vec::new();
            for c in &more {
                c.decode_checked(&mut samples)?;
            }
            return self.add(samples);
        }
        self.last = Some(newest.max_t);
        self.chunks.extend(more);
        Ok(())
    }

    fn finish(self) -> Vec<Chunk> {
        self.chunks
    }
}

fn limit_error(e: ArchiveError) -> Result<StoreError, String> {
    match e {
        ArchiveError::Limit { limit } => Ok(StoreError::LimitExceeded { what: "samples", limit }),
        e => Err(e.to_string()),
    }
}

#[async_trait]
impl Store for ArchiveStore {
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        let candidates = self.candidates(0, req.start, req.end).await?;
        self.warn_incomplete(req.start, req.end).await?;
        let mut found: BTreeMap<Labels, SeriesBuilder> = BTreeMap::new();
        let mut read = 0u64;
        for some in candidates.chunks(OPEN_AT_ONCE) {
            for b in &self.open_some(some).await? {
                let mut ids = BTreeSet::new();
                for i in b.matching_ids(&req.matchers) {
                    let s = &b.series()[i];
                    if s.samples > 0 && s.max_time >= req.start && s.min_time <= req.end {
                        ids.insert(i as i64);
                    }
                }
                if ids.is_empty() {
                    continue;
                }
                let new = ids.iter().filter(|&&i| !found.contains_key(&b.series()[i as usize].labels)).count();
                budget.check_series_count(found.len().saturating_add(new))?;
                let left = req.limits.max_samples.saturating_sub(read);
                // Series whose chunks the cache holds; the rest are read, the whole block's
                // range of them (and kept) when the query covers most of the block.
                let data_crc = b.meta.files.iter().find(|f| f.path == crate::layout::DATA).map_or(0, |f| f.crc32);
                let block = (b.dir.clone(), data_crc);
                let mut cached: Vec<(i64, Arc<[Chunk]>)> = Vec::new();
                if self.chunks.enabled() {
                    cached = self.chunks.get_many(&block, ids.iter().copied());
                    for (id, _) in &cached {
                        ids.remove(id);
                    }
                }
                let (lo, hi) = (b.meta.min_time, b.meta.max_time.saturating_sub(1));
                let covered = req.end.min(hi).saturating_sub(req.start.max(lo));
                let wanted: u64 = ids.iter().map(|&i| b.series()[i as usize].samples).sum();
                let whole = self.chunks.enabled()
                    && !ids.is_empty()
                    && covered.saturating_mul(2) >= hi.saturating_sub(lo)
                    && wanted <= left;
                let (from, to) = if whole { (lo, hi) } else { (req.start, req.end) };
                let got = match b.samples(&ids, from, to, left).await {
                    Ok(got) => got,
                    Err(e) => match limit_error(e) {
                        Ok(_) => {
                            return Err(StoreError::LimitExceeded { what: "samples", limit: req.limits.max_samples })
                        }
                        Err(e) => {
                            self.unreadable(&b.dir, &e)?;
                            continue;
                        }
                    },
                };
                for (id, samples) in got {
                    if whole {
                        let chunks: Arc<[Chunk]> = Chunk::encode_sealed(&samples).into();
                        self.chunks.insert(&block, id, chunks.clone());
                        cached.push((id, chunks));
                        continue;
                    }
                    read = read.saturating_add(samples.len() as u64);
                    let s = &b.series()[id as usize];
                    let entry = found.entry(s.labels.clone()).or_insert_with(|| SeriesBuilder::new(s.metric_type));
                    if let Err(e) = entry.add(samples) {
                        let series = format!("{} (archive {})", s.labels, self.name);
                        return Err(StoreError::Corrupt { series, reason: e });
                    }
                }
                cached.sort_by_key(|(id, _)| *id);
                for (id, chunks) in cached {
                    let (start, end) = (req.start, req.end);
                    let some: Vec<Chunk> = chunks.iter().filter(|c| c.overlaps(start, end)).cloned().collect();
                    // Counted exactly: a chunk reaching past the range is decoded to count
                    // its samples inside, and a series with none there (a chunk spanning a
                    // gap that holds the whole range) is no answer.
                    let mut inside = 0u64;
                    for c in &some {
                        if c.min_t >= start && c.max_t <= end {
                            inside = inside.saturating_add(u64::from(c.n));
                            continue;
                        }
                        let mut decoded = Vec::new();
                        if let Err(e) = c.decode_checked(&mut decoded) {
                            let series = format!("{} (archive {})", b.series()[id as usize].labels, self.name);
                            return Err(StoreError::Corrupt { series, reason: e });
                        }
                        inside =
                            inside.saturating_add(decoded.iter().filter(|x| x.t >= start && x.t <= end).count() as u64);
                    }
                    if inside == 0 {
                        continue;
                    }
                    read = read.saturating_add(inside);
                    if read > req.limits.max_samples {
                        return Err(StoreError::LimitExceeded { what: "samples", limit: req.limits.max_samples });
                    }
                    let s = &b.series()[id as usize];
                    let entry = found.entry(s.labels.clone()).or_insert_with(|| SeriesBuilder::new(s.metric_type));
                    if let Err(e) = entry.add_chunks(some) {
                        let series = format!("{} (archive {})", s.labels, self.name);
                        return Err(StoreError::Corrupt { series, reason: e });
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(found.len());
        for (labels, series) in found {
            let metric_type = series.metric_type;
            let chunks = series.finish();
            if chunks.is_empty() {
                continue;
            }
            budget.charge_series(&chunks)?;
            out.push(SeriesChunks { labels, metric_type, chunks });
        }
        Ok(out)
    }

    async fn series_within(
        &self,
        matchers: &[Matcher],
        start: i64,
        end: i64,
        budget: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        self.warn_incomplete(start, end).await?;
        let mut out = BTreeSet::new();
        for some in self.candidates(0, start, end).await?.chunks(OPEN_AT_ONCE) {
            let blocks = self.open_some(some).await?;
            for s in Self::matching(&blocks, matchers, start, end) {
                if !out.contains(&s.labels) {
                    budget.charge_labels()?;
                    out.insert(s.labels.clone());
                }
            }
        }
        Ok(out.into_iter().collect())
    }

    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        self.warn_incomplete(start, end).await?;
        let mut names = BTreeSet::new();
        for some in self.candidates(0, start, end).await?.chunks(OPEN_AT_ONCE) {
            let blocks = self.open_some(some).await?;
            for s in Self::matching(&blocks, matchers, start, end) {
                names.extend(s.labels.iter().map(|l| l.name.to_string()));
            }
        }
        Ok(names.into_iter().collect())
    }

    async fn label_values(
        &self,
        name: &str,
        matchers: &[Matcher],
        start: i64,
        end: i64,
    ) -> Result<Vec<String>, StoreError> {
        self.warn_incomplete(start, end).await?;
        let mut values = BTreeSet::new();
        for some in self.candidates(0, start, end).await?.chunks(OPEN_AT_ONCE) {
            let blocks = self.open_some(some).await?;
            values.extend(
                Self::matching(&blocks, matchers, start, end).filter_map(|s| s.labels.get(name).map(str::to_string)),
            );
        }
        Ok(values.into_iter().collect())
    }

    /// A leaf from the aggregate blocks when a resolution is asked for
    /// ([`crate::answer`]); raw selections are the engine's.
    async fn steps(&self, req: &strata_store::StepsRequest) -> Result<Option<strata_store::Steps>, StoreError> {
        if req.resolution == 0 {
            return Ok(None);
        }
        self.steps_from_aggregates(req).await.map(Some)
    }

    /// Families from the series tables: a histogram's or summary's series under their
    /// family's name, every other series under its metric name.
    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        // From the newest blocks that answer: metadata changes seldom, and reading every
        // block's series table for it would open the whole archive.
        let mut candidates = self.candidates(0, i64::MIN, i64::MAX).await?;
        candidates.reverse();
        let mut out: HashMap<String, Metadata> = HashMap::new();
        for some in candidates.chunks(OPEN_AT_ONCE) {
            let blocks = self.open_some(some).await?;
            Self::families(&blocks, metric, &mut out);
            if !out.is_empty() {
                break;
            }
        }
        let mut v: Vec<_> = out.into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(v)
    }
}

impl ArchiveStore {
    /// Adds the families of `blocks`' series (those of `metric` only, when given).
    fn families(blocks: &[Arc<BlockReader>], metric: Option<&str>, out: &mut HashMap<String, Metadata>) {
        for s in blocks.iter().flat_map(|b| b.series().iter()) {
            let Some(name) = s.labels.metric_name() else { continue };
            let family = match s.metric_type {
                MetricType::Histogram | MetricType::GaugeHistogram | MetricType::Summary => {
                    ["_bucket", "_sum", "_count"].iter().find_map(|x| name.strip_suffix(x)).unwrap_or(name)
                }
                _ => name,
            };
            if metric.is_some_and(|m| m != family) || out.contains_key(family) {
                continue;
            }
            out.insert(
                family.to_string(),
                Metadata { metric_type: s.metric_type, help: s.help.to_string(), unit: s.unit.to_string() },
            );
        }
    }
}

/// The block list and the progress records at one listing: a request reads them once.
pub(crate) struct Snapshot {
    pub blocks: Arc<[Listed]>,
    /// Per shard (`None`: the root's), its progress record.
    pub progress: BTreeMap<Option<String>, ProgressRecord>,
    /// Per shard, the error reading a record never read.
    pub unreadable: BTreeMap<Option<String>, String>,
}

impl Snapshot {
    /// Per shard (`None`: the root's own blocks) of the listed blocks of `resolution_ms`,
    /// the newest time it holds, when the blocks come from more than one: where each
    /// shard's archiver has got to.
    pub fn shard_ends(&self, resolution_ms: i64) -> BTreeMap<Option<String>, i64> {
        let mut ends: BTreeMap<Option<String>, i64> = BTreeMap::new();
        for b in self.blocks.iter() {
            let Ok(m) = &b.meta else { continue };
            if m.resolution_ms == resolution_ms {
                let e = ends.entry(shard_of(&b.dir)).or_insert(m.max_time);
                *e = (*e).max(m.max_time);
            }
        }
        // The root's own blocks beside shards, with no progress record of the root's, are
        // a backfill (`strata archive import`) of the ranges it covers, not an archiver
        // that stopped: they are not behind anything.
        let sharded = ends.keys().chain(self.progress.keys()).any(Option::is_some);
        if !self.progress.contains_key(&None) && sharded {
            ends.remove(&None);
        }
        // A shard whose series held nothing in its newest ranges wrote no blocks there,
        // but its progress record went on: it is not behind, and the others are measured
        // against it too. Only shards with blocks count (one whose blocks are all gone,
        // taken out of service, is behind nothing), and a record past the reader's clock
        // is not believed (a clock ahead, or damage, would make every other shard look
        // behind). Raw progress: aggregates are written with the raw blocks of their range.
        if resolution_ms == 0 {
            let believable = strata_model::time::now_ms().saturating_add(RECORD_CLOCK_SLACK_MS);
            for (shard, record) in &self.progress {
                if let Some(e) = ends.get_mut(shard) {
                    if record.until <= believable {
                        *e = (*e).max(record.until);
                    }
                }
            }
        }
        if ends.len() < 2 {
            ends.clear();
        }
        ends
    }
}

/// How far past the reader's clock a progress record may reach and still be believed.
const RECORD_CLOCK_SLACK_MS: i64 = 3_600_000;

/// Whether `path` is a progress record: the root's (`progress/raw.json`) or a shard's.
fn is_progress(path: &Path) -> bool {
    if path.filename() != crate::archiver::PROGRESS.rsplit('/').next() {
        return false;
    }
    let parts: Vec<_> = path.parts().collect();
    let tail = crate::archiver::PROGRESS.split('/').collect::<Vec<_>>();
    let own = parts.len().checked_sub(tail.len()).map(|n| &parts[n..]);
    let prefix_ok = match parts.len().saturating_sub(tail.len()) {
        0 => true,
        2 => shard_of(path).is_some(),
        _ => false,
    };
    prefix_ok && own.is_some_and(|o| o.iter().map(|p| p.as_ref()).eq(tail.iter().copied()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_of_two_blocks_merge_in_order_once() {
        let s = |t: i64| Sample::new(t, t as f64);
        let mut b = SeriesBuilder::new(MetricType::Gauge);
        b.add(vec![s(1), s(2)]).unwrap();
        b.add(vec![s(3), s(4)]).unwrap();
        b.add(vec![s(2), s(5)]).unwrap();
        b.add(vec![]).unwrap();
        let mut v = Vec::new();
        for c in b.finish() {
            c.decode_checked(&mut v).unwrap();
        }
        assert_eq!(v.iter().map(|x| x.t).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        // Over many chunks: an overlap at the end, then one deep inside.
        let mut b = SeriesBuilder::new(MetricType::Gauge);
        b.add((0..1000).map(s).collect()).unwrap();
        b.add((990..1100).map(s).collect()).unwrap();
        b.add((500..505).map(s).collect()).unwrap();
        b.add_chunks(Chunk::encode_sealed(&(1050..1200).map(s).collect::<Vec<_>>())).unwrap();
        let mut v = Vec::new();
        for c in b.finish() {
            c.decode_checked(&mut v).unwrap();
        }
        assert_eq!(v.iter().map(|x| x.t).collect::<Vec<_>>(), (0..1200).collect::<Vec<_>>());
    }
}
