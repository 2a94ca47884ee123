//! [`Compactor`]: merges the blocks of each archived UTC day into one day block per
//! resolution (raw samples read back and written again; 5 m and 1 h windows copied as
//! they are, [`crate::merge`]), and applies retention per resolution, one process at a time.
//!
//! One compactor works on a bucket at a time: it holds `compaction/lease.json`, created
//! only when absent and taken over once its lease has run out. A day is compacted once the
//! progress record is past its end (every range of it archived): its blocks are read back
//! through an [`ArchiveStore`] (each file checked against its checksum), written as the
//! day's block, and the day block's sample count checked against theirs before anything is
//! let go, and again once it is up (read back whole against its checksums). The day block
//! lists the blocks it replaces and their counts, and only those are ever let go for it.
//! Blocks are never deleted at once: a `deletion-mark.json` goes into the folder
//! first, readers leave marked blocks out from their next listing, and the files go
//! `delete_delay` later (the meta first, so a deletion cut short leaves no block that
//! reads as damaged). A compactor killed at any step leaves either the old blocks, or both
//! (the day block then wins: its sources are marked at the next round), or marks whose
//! deletion the next round finishes. A day that cannot be compacted (a damaged block in
//! it, counts that disagree) halts: logged, counted, shown in `/metrics` and `/-/ready`,
//! and its blocks kept as they are. A day that compaction does not apply to (blocks that
//! overlap or cross into it, more samples than `max_day_samples`, which bounds the
//! compactor's memory) is left as it is and counted as skipped: readers merge it as is.
//!
//! The lease is taken over with a conditional write where the store has one (S3, GCS,
//! Azure), and checked again before each day is written, so a compactor whose round
//! outlasts its lease stops rather than writing beside the one that took over.

use crate::archiver::read_progress;
use crate::layout::{resolution_dir, META};
use crate::meta::{BlockMeta, Source};
use crate::reader::{read_meta, BlockReader};
use crate::writer::BlockWriter;
use crate::{ArchiveError, ArchiveStore, ArchiveStoreOptions};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, UpdateVersion};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use strata_model::Metadata;
use strata_store::QueryScope;
use tokio::sync::watch;

/// The compactor's lease object.
pub const LEASE: &str = "compaction/lease.json";
/// In a block's folder: the block is being deleted; readers leave it out.
pub const DELETION_MARK: &str = "deletion-mark.json";
const DAY: i64 = 86_400_000;

#[derive(Debug, Clone)]
pub struct CompactorOptions {
    /// Time between rounds.
    pub interval: Duration,
    /// The lease lasts this long unless renewed (each round renews it).
    pub lease: Duration,
    /// A marked block's files are deleted this long after the mark: longer than readers
    /// keep a block list.
    pub delete_delay: Duration,
    /// Raw blocks ending longer ago than this are deleted; `None`: kept for ever.
    pub retention_raw: Option<Duration>,
    /// The same for 5 m and 1 h aggregate blocks (kept longer than raw data, usually).
    pub retention_5m: Option<Duration>,
    pub retention_1h: Option<Duration>,
    /// A day with more raw samples than this is not compacted (it is read whole into
    /// memory, about 4 bytes per sample).
    pub max_day_samples: u64,
    pub owner: String,
}

impl Default for CompactorOptions {
    fn default() -> Self {
        CompactorOptions {
            interval: Duration::from_secs(300),
            lease: Duration::from_secs(15 * 60),
            delete_delay: Duration::from_secs(15 * 60),
            retention_raw: None,
            retention_5m: None,
            retention_1h: None,
            max_day_samples: 100_000_000,
            owner: "strata".into(),
        }
    }
}

/// The compactor's figures in `/metrics` (prefix `strata_archive_`).
#[derive(Clone, Default)]
pub struct CompactorMetrics {
    compactions: Counter,
    marked: Counter,
    deleted: Counter,
    failures: Counter,
    halted: Gauge,
    skipped: Gauge,
}

impl CompactorMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("archive");
        r.register("compactions", "Days whose blocks were merged into one day block", self.compactions.clone());
        r.register(
            "blocks_marked_for_deletion",
            "Blocks marked for deletion (compacted, or past retention)",
            self.marked.clone(),
        );
        r.register("blocks_deleted", "Marked blocks whose files were deleted", self.deleted.clone());
        r.register("compaction_failures", "Compaction rounds that failed (each logged)", self.failures.clone());
        r.register(
            "compaction_halted_days",
            "Days that cannot be compacted (a damaged block, counts that disagree): see the log",
            self.halted.clone(),
        );
        r.register(
            "compaction_skipped_days",
            "Archived days left uncompacted: blocks overlap or cross into them, or more samples than the budget",
            self.skipped.clone(),
        );
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Lease {
    owner: String,
    expires: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Mark {
    /// Unix ms.
    marked: i64,
    reason: String,
}

/// What one round did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct CompactRound {
    /// Day blocks written, by their start.
    pub compacted: Vec<i64>,
    pub marked: usize,
    pub deleted: usize,
    /// Days that could not be compacted, with why.
    pub halted: Vec<String>,
    /// Days compaction does not apply to, with why.
    pub skipped: Vec<String>,
    /// Set when another compactor holds the lease.
    pub elsewhere: Option<String>,
}

/// A block folder as listed: its meta (if it has one) and whether it is marked.
struct Folder {
    meta: Option<Result<BlockMeta, String>>,
    /// When it was marked; `i64::MAX` for a mark that cannot be read (the block stays out
    /// of listings, and its files stay until the mark reads).
    mark: Option<i64>,
    files: Vec<Path>,
}

pub struct Compactor {
    objects: Arc<dyn ObjectStore>,
    writer: BlockWriter,
    opts: CompactorOptions,
    metrics: CompactorMetrics,
}

impl Compactor {
    pub fn new(objects: Arc<dyn ObjectStore>, writer: BlockWriter, opts: CompactorOptions) -> Self {
        Compactor { objects, writer, opts, metrics: CompactorMetrics::default() }
    }

    pub fn metrics(&self) -> &CompactorMetrics {
        &self.metrics
    }

    /// False while some day cannot be compacted.
    pub fn ready(&self) -> bool {
        self.metrics.halted.get() == 0
    }

    pub async fn round(&self, now_ms: i64) -> Result<CompactRound, ArchiveError> {
        let started = std::time::Instant::now();
        let clock = || now_ms.saturating_add(ms(started.elapsed()));
        let mut round = CompactRound::default();
        if let Some(other) = self.lease(now_ms).await? {
            // Not this compactor's to judge.
            self.metrics.halted.set(0);
            self.metrics.skipped.set(0);
            round.elsewhere = Some(other);
            return Ok(round);
        }
        let folders = self.scan().await?;
        // 1. Marked blocks whose delay has passed go, meta first.
        let delay = ms(self.opts.delete_delay);
        for (dir, f) in &folders {
            if f.mark.is_some_and(|m| now_ms.saturating_sub(m) >= delay) {
                self.delete(dir, f).await?;
                round.deleted += 1;
            }
        }
        let until = read_progress(self.objects.as_ref()).await?;
        let mut halted = 0;
        // Raw blocks, then each resolution of aggregates: compacted and expired alike.
        for res in [0, strata_downsample::FIVE_MINUTES, strata_downsample::ONE_HOUR] {
            let live: BTreeMap<&Path, &BlockMeta> = folders
                .iter()
                .filter(|(_, f)| f.mark.is_none())
                .filter_map(|(d, f)| match &f.meta {
                    Some(Ok(m)) if m.resolution_ms == res => Some((d, m)),
                    _ => None,
                })
                .collect();
            // 2. Retention, counted from the archive's progress when there is one (a clock
            // that jumps ahead does not expire what was just archived).
            let mut expired: BTreeSet<&Path> = BTreeSet::new();
            if let Some(keep) = self.retention(res) {
                let before = now_ms.min(until.unwrap_or(now_ms)).saturating_sub(ms(keep));
                let why = format!("past the {} retention", resolution_dir(res));
                for (dir, m) in &live {
                    if m.max_time <= before {
                        self.mark(dir, now_ms, &why).await?;
                        round.marked += 1;
                        expired.insert(dir);
                    }
                }
            }
            // 3. Days wholly archived with more than their day block in them.
            let until = until.unwrap_or(i64::MIN);
            let res_dir = resolution_dir(res);
            let mut days: BTreeMap<i64, Vec<(&Path, &BlockMeta)>> = BTreeMap::new();
            // Days that a block crosses into are left as they are: their day block would hold
            // samples of a block it does not replace.
            let mut crossed: BTreeSet<i64> = BTreeSet::new();
            for (dir, m) in &live {
                let day = m.min_time.div_euclid(DAY).saturating_mul(DAY);
                if m.max_time <= day.saturating_add(DAY) {
                    days.entry(day).or_default().push((dir, m));
                } else {
                    let last = m.max_time.saturating_sub(1).div_euclid(DAY).saturating_mul(DAY);
                    let mut d = day;
                    while d <= last && crossed.len() < 10_000 {
                        crossed.insert(d);
                        d = d.saturating_add(DAY);
                    }
                }
            }
            let damaged: BTreeSet<i64> = folders
                .iter()
                .filter(|(_, f)| f.mark.is_none() && matches!(f.meta, Some(Err(_))))
                .filter_map(|(d, _)| crate::layout::parse_block_dir(d))
                .filter(|(r, ..)| *r == res_dir)
                .map(|(_, lo, _)| lo.div_euclid(DAY) * DAY)
                .collect();
            for (day, blocks) in days {
                let end = day.saturating_add(DAY);
                if end > until {
                    continue;
                }
                // A day on its way out is not worth compacting.
                if blocks.iter().any(|(d, _)| expired.contains(d)) {
                    continue;
                }
                if let Some((whole_dir, whole)) = blocks.iter().find(|(_, m)| m.min_time == day && m.max_time == end) {
                    // Written before (a round cut short after the day block went up): what it
                    // lists as replaced is let go, once the day block reads back whole; anything
                    // else beside it stays.
                    let replaced = blocks
                        .iter()
                        .filter(|(d, _)| d != whole_dir && whole.compacted_from.iter().any(|s| s.dir == d.as_ref()))
                        .count();
                    if replaced > 0 {
                        let verified = async {
                            BlockReader::open(self.objects.clone(), (*whole_dir).clone()).await?.verify().await
                        };
                        if let Err(e) = verified.await {
                            halted += 1;
                            tracing::error!(day, error = %e, "compaction halted for a day: its day block does not read back; the blocks it replaces are kept");
                            round
                                .halted
                                .push(format!("{res_dir} day starting {day}: its day block does not read back: {e}"));
                            continue;
                        }
                        // Verifying a day takes a while: the lease is checked again before marking.
                        if let Some(other) = self.lease(clock()).await? {
                            tracing::warn!(owner = %other, "the compaction lease was taken over during a round: stopping");
                            round.elsewhere = Some(other);
                            break;
                        }
                    }
                    let mut others = 0;
                    for (dir, _) in blocks.iter().filter(|(d, _)| d != whole_dir) {
                        if whole.compacted_from.iter().any(|s| s.dir == dir.as_ref()) {
                            self.mark(dir, now_ms, "compacted into the day block").await?;
                            round.marked += 1;
                        } else {
                            others += 1;
                        }
                    }
                    if others > 0 {
                        round.skipped.push(format!(
                            "{res_dir} day starting {day}: {others} blocks beside its day block overlap it"
                        ));
                    }
                    continue;
                }
                if blocks.len() < 2 {
                    continue;
                }
                if crossed.contains(&day) {
                    round.skipped.push(format!("{res_dir} day starting {day}: a block crosses into it"));
                    continue;
                }
                let mut ranges: Vec<(i64, i64)> = blocks.iter().map(|(_, m)| (m.min_time, m.max_time)).collect();
                ranges.sort_unstable();
                if ranges.windows(2).any(|w| w[1].0 < w[0].1) {
                    round.skipped.push(format!("{res_dir} day starting {day}: its blocks overlap"));
                    continue;
                }
                // A day block of windows claims the whole day: its blocks must cover it (a
                // day archived before aggregates were has hours without them).
                let tiled = ranges.first().is_some_and(|r| r.0 == day)
                    && ranges.last().is_some_and(|r| r.1 == end)
                    && ranges.windows(2).all(|w| w[0].1 == w[1].0);
                if res > 0 && !tiled {
                    round.skipped.push(format!("{res_dir} day starting {day}: its blocks do not cover the whole day"));
                    continue;
                }
                let samples = blocks.iter().fold(0u64, |n, (_, m)| n.saturating_add(m.samples));
                if samples > self.opts.max_day_samples {
                    round.skipped.push(format!(
                        "{res_dir} day starting {day}: {samples} samples, over the budget of {}",
                        self.opts.max_day_samples
                    ));
                    continue;
                }
                if damaged.contains(&day) {
                    halted += 1;
                    let why = format!(
                        "{res_dir} day starting {day}: a block of it is damaged (see `strata archive inspect`)"
                    );
                    tracing::error!(
                        day,
                        "compaction halted for a day: a block of it is damaged; its blocks are kept as they are"
                    );
                    round.halted.push(why);
                    continue;
                }
                // Still this compactor's bucket (a long round can outlast the lease).
                if let Some(other) = self.lease(clock()).await? {
                    tracing::warn!(owner = %other, "the compaction lease was taken over during a round: stopping");
                    round.elsewhere = Some(other);
                    break;
                }
                match self.compact_day(res, day, &blocks, clock()).await {
                    Ok(()) => {
                        // The day block went up under the lease; marking what it replaces waits
                        // for the lease too (a new owner marks them, from the day block's list).
                        if let Some(other) = self.lease(clock()).await? {
                            tracing::warn!(owner = %other, "the compaction lease was taken over during a day: stopping");
                            round.elsewhere = Some(other);
                            break;
                        }
                        for (dir, _) in &blocks {
                            self.mark(dir, now_ms, "compacted into the day block").await?;
                            round.marked += 1;
                        }
                        self.metrics.compactions.inc();
                        round.compacted.push(day);
                    }
                    Err(e) => {
                        halted += 1;
                        tracing::error!(day, error = %e, "compaction halted for a day; its blocks are kept as they are");
                        round.halted.push(format!("{res_dir} day starting {day}: {e}"));
                    }
                }
            }
            if round.elsewhere.is_some() {
                break;
            }
        }
        for why in &round.skipped {
            tracing::debug!(why, "an archived day is left uncompacted");
        }
        self.metrics.halted.set(halted);
        self.metrics.skipped.set(i64::try_from(round.skipped.len()).unwrap_or(i64::MAX));
        Ok(round)
    }

    fn retention(&self, resolution: i64) -> Option<Duration> {
        match resolution {
            0 => self.opts.retention_raw,
            strata_downsample::FIVE_MINUTES => self.opts.retention_5m,
            strata_downsample::ONE_HOUR => self.opts.retention_1h,
            _ => None,
        }
    }

    /// Writes the day block of `blocks` (of `resolution`), checked against them before
    /// and after it goes up.
    async fn compact_day(
        &self,
        resolution: i64,
        day: i64,
        blocks: &[(&Path, &BlockMeta)],
        now_ms: i64,
    ) -> Result<(), ArchiveError> {
        let end = day.saturating_add(DAY);
        // Units and help as the blocks have them (not as the newest blocks do).
        let mut families = std::collections::HashMap::new();
        let mut opened = Vec::with_capacity(blocks.len());
        for (dir, _) in blocks {
            let block = BlockReader::open(self.objects.clone(), (*dir).clone()).await?;
            for s in block.series() {
                if s.help.is_empty() && s.unit.is_empty() {
                    continue;
                }
                let name = s.labels.metric_name().unwrap_or_default();
                families.entry(name.to_string()).or_insert_with(|| Metadata {
                    metric_type: s.metric_type,
                    help: s.help.to_string(),
                    unit: s.unit.to_string(),
                });
            }
            opened.push(block);
        }
        let encoded = if resolution > 0 {
            // Windows copied as they are, every file read checked against its checksum.
            let opts = self.writer.options();
            crate::merge::merge_aggregate_blocks(&opened, (day, end), day_gaps(blocks), &families, opts).await?
        } else {
            // Every file read is checked against its checksum, and any failure fails the
            // day. Exactly these blocks, listed once: a block landing meanwhile is not read.
            let reader = ArchiveStore::over_blocks(
                self.objects.clone(),
                "compaction",
                blocks.iter().map(|(d, m)| ((*d).clone(), (*m).clone())).collect(),
                ArchiveStoreOptions { cache_chunk_bytes: 0, cache_window_bytes: 0, ..Default::default() },
            );
            QueryScope::new(false, false)
                .run(self.writer.encode_raw(&reader, day, end, day_gaps(blocks), Some(families)))
                .await?
        };
        let Some(mut block) = encoded else {
            return Err(ArchiveError::Invalid("its blocks read back empty".into()));
        };
        let want = blocks.iter().fold(0u64, |n, (_, m)| n.saturating_add(m.samples));
        if block.meta.samples != want {
            return Err(ArchiveError::Invalid(format!(
                "the day block would hold {} samples, its {} blocks {want}",
                block.meta.samples,
                blocks.len()
            )));
        }
        block.meta.compacted_from =
            blocks.iter().map(|(d, m)| Source { dir: d.as_ref().to_string(), samples: m.samples }).collect();
        let dir = block.dir.clone();
        let written = self.writer.publish(block).await?;
        // Read back whole before anything is let go; a day block that does not read back is
        // taken away again (its meta), so the next round neither trusts nor serves it.
        let check = async {
            let back = BlockReader::open(self.objects.clone(), dir.clone()).await?;
            back.verify().await?;
            if back.meta != written {
                return Err(ArchiveError::Corrupt {
                    object: dir.clone().join(META).to_string(),
                    reason: "reads back other than it was written".into(),
                });
            }
            Ok(())
        };
        if let Err(e) = check.await {
            self.take_back(&dir, &written, now_ms).await;
            return Err(e);
        }
        tracing::info!(day, blocks = blocks.len(), samples = want, "compacted a day of the archive");
        Ok(())
    }

    /// Deletes a day block that did not read back, meta first, unless its meta is now
    /// another's (a compactor that took the lease over and wrote the day again).
    async fn take_back(&self, dir: &Path, written: &BlockMeta, now_ms: i64) {
        // Another compactor that took the lease over writes the same day block, with the
        // same meta: only while the lease is still ours is it ours to take back, and only
        // a meta that reads back as written (a missing or unreadable one may be the
        // other's, half-written: nothing is deleted then; the next round judges).
        if !matches!(self.lease(now_ms).await, Ok(None)) {
            tracing::warn!(block = %dir, "a day block that did not read back is left: the lease is no longer ours");
            return;
        }
        match read_meta(self.objects.as_ref(), dir).await {
            Ok(now) if now == *written => {}
            _ => {
                tracing::warn!(block = %dir, "a day block that did not read back is left: its meta is not the one written");
                return;
            }
        }
        let files = written.files.iter().map(|f| dir.clone().join(f.path.as_str()));
        for path in std::iter::once(dir.clone().join(META)).chain(files) {
            match self.objects.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => tracing::warn!(object = %path, error = %e, "could not take back a day block's object"),
            }
        }
    }

    /// Marks `dir` for deletion (readers leave it out from their next listing).
    async fn mark(&self, dir: &Path, now_ms: i64, reason: &str) -> Result<(), ArchiveError> {
        let path = dir.clone().join(DELETION_MARK);
        let body = serde_json::to_vec(&Mark { marked: now_ms, reason: reason.into() })
            .map_err(|e| ArchiveError::Invalid(e.to_string()))?;
        self.objects
            .put(&path, body.into())
            .await
            .map_err(|e| ArchiveError::Object { object: path.to_string(), reason: e.to_string() })?;
        self.metrics.marked.inc();
        tracing::info!(block = %dir, reason, "marked for deletion");
        Ok(())
    }

    /// Deletes a marked block: its meta first (no reader sees it after), then its files,
    /// then the mark.
    async fn delete(&self, dir: &Path, f: &Folder) -> Result<(), ArchiveError> {
        let meta = dir.clone().join(META);
        let mark = dir.clone().join(DELETION_MARK);
        let order = std::iter::once(&meta)
            .chain(f.files.iter().filter(|p| **p != meta && **p != mark))
            .chain(std::iter::once(&mark));
        for path in order {
            match self.objects.delete(path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(ArchiveError::Object { object: path.to_string(), reason: e.to_string() }),
            }
        }
        self.metrics.deleted.inc();
        tracing::info!(block = %dir, "deleted a marked block");
        Ok(())
    }

    /// Every block folder with its objects, meta and mark.
    async fn scan(&self) -> Result<BTreeMap<Path, Folder>, ArchiveError> {
        use futures_util::TryStreamExt;
        let all: Vec<object_store::ObjectMeta> = self
            .objects
            .list(None)
            .try_collect()
            .await
            .map_err(|e| ArchiveError::Object { object: "(listing)".into(), reason: e.to_string() })?;
        let mut folders: BTreeMap<Path, Folder> = BTreeMap::new();
        for o in all {
            let parts: Vec<_> = o.location.parts().collect();
            // Blocks only: `<resolution>/<day>/<start>-<end>/<file>`.
            if parts.len() != 4 {
                continue;
            }
            let dir: Path = parts[..3].iter().cloned().collect();
            if crate::layout::parse_block_dir(&dir).is_none() {
                continue;
            }
            let f = folders.entry(dir).or_insert(Folder { meta: None, mark: None, files: Vec::new() });
            f.files.push(o.location.clone());
        }
        for (dir, f) in folders.iter_mut() {
            if f.files.iter().any(|p| p.filename() == Some(META)) {
                f.meta = Some(read_meta(self.objects.as_ref(), dir).await.map_err(|e| e.to_string()));
            }
            if f.files.iter().any(|p| p.filename() == Some(DELETION_MARK)) {
                f.mark = Some(self.read_mark(&dir.clone().join(DELETION_MARK)).await);
            }
        }
        Ok(folders)
    }

    /// When a block was marked; `i64::MAX` (not yet) for a mark that cannot be read, so
    /// no block goes before its readers have had the delay to let go of it.
    async fn read_mark(&self, path: &Path) -> i64 {
        let read = async {
            let got = self.objects.get(path).await.ok()?;
            if got.meta.size > 64 << 10 {
                return None;
            }
            let bytes = got.bytes().await.ok()?;
            serde_json::from_slice::<Mark>(&bytes).ok().map(|m| m.marked)
        };
        match read.await {
            Some(t) => t,
            None => {
                tracing::warn!(mark = %path, "a deletion mark that cannot be read: its block is left out and kept");
                i64::MAX
            }
        }
    }

    /// Takes or renews the lease; the owner of a live lease otherwise. A takeover is a
    /// conditional write on the lease's version where the store has one, so of two
    /// compactors that both find it expired only one gets it.
    async fn lease(&self, now_ms: i64) -> Result<Option<String>, ArchiveError> {
        let path = Path::from(LEASE);
        let failed = |e: object_store::Error| ArchiveError::Object { object: LEASE.into(), reason: e.to_string() };
        let lease = ms(self.opts.lease);
        let body = serde_json::to_vec(&Lease { owner: self.opts.owner.clone(), expires: now_ms.saturating_add(lease) })
            .map_err(|e| ArchiveError::Invalid(e.to_string()))?;
        let create = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.objects.put_opts(&path, body.clone().into(), create).await {
            Ok(_) => return Ok(None),
            Err(object_store::Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(failed(e)),
        }
        let (held, version) = match self.objects.get(&path).await {
            Ok(got) => {
                let version = UpdateVersion { e_tag: got.meta.e_tag.clone(), version: got.meta.version.clone() };
                let held = if got.meta.size <= 64 << 10 {
                    serde_json::from_slice::<Lease>(&got.bytes().await.map_err(failed)?).ok()
                } else {
                    None
                };
                (held, Some(version))
            }
            Err(object_store::Error::NotFound { .. }) => (None, None),
            Err(e) => return Err(failed(e)),
        };
        if let Some(l) = &held {
            // Live, unless further ahead than a clock could be off by (a lease that would
            // never run out otherwise).
            let live = l.expires > now_ms && l.expires <= now_ms.saturating_add(lease.saturating_mul(4));
            if l.owner != self.opts.owner && live {
                return Ok(Some(l.owner.clone()));
            }
        }
        let conditional = version
            .filter(|v| v.e_tag.is_some() || v.version.is_some())
            .map(|v| PutOptions { mode: PutMode::Update(v), ..Default::default() });
        if let Some(opts) = conditional {
            match self.objects.put_opts(&path, body.clone().into(), opts).await {
                Ok(_) => return Ok(None),
                Err(object_store::Error::Precondition { .. }) => {
                    return Ok(Some("(another compactor, which took the lease just now)".into()));
                }
                // Stores without conditional updates (a local folder, where one process
                // runs): the plain write below.
                Err(object_store::Error::NotImplemented { .. }) => {}
                Err(e) => return Err(failed(e)),
            }
        }
        self.objects.put(&path, body.into()).await.map_err(failed)?;
        Ok(None)
    }

    /// Rounds every `interval` until `stop`.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            let result = tokio::select! {
                r = self.round(strata_model::time::now_ms()) => r,
                _ = stop.changed() => return,
            };
            match result {
                Ok(r) if r.elsewhere.is_some() => {
                    tracing::debug!(owner = ?r.elsewhere, "another compactor holds the lease");
                }
                Ok(_) => {}
                Err(e) => {
                    self.metrics.failures.inc();
                    tracing::error!(error = %e, "compaction round failed");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.opts.interval.max(Duration::from_secs(1))) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// The gaps of a day's blocks, each once, and no more than a meta should carry.
fn day_gaps(blocks: &[(&Path, &BlockMeta)]) -> Vec<String> {
    const MAX: usize = 64;
    let all: BTreeSet<&String> = blocks.iter().flat_map(|(_, m)| m.gaps.iter()).collect();
    let mut out: Vec<String> = all.iter().take(MAX).map(|g| g.chars().take(1024).collect()).collect();
    if all.len() > MAX {
        out.push(format!("... and {} more gaps", all.len() - MAX));
    }
    out
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{list_blocks, WriteOptions};
    use futures_util::TryStreamExt;
    use object_store::local::LocalFileSystem;
    use strata_model::{Labels, Matcher, Metadata, MetricType, Sample};
    use strata_store::memory::MemoryStore;
    use strata_store::{SelectRequest, Store};

    const T0: i64 = 1_764_547_200_000; // a UTC midnight
    const HOUR: i64 = 3_600_000;

    /// Two series every 15 s over 26 hours, archived in one-hour blocks, and the progress
    /// record at the end of the first day plus an hour.
    async fn archived() -> (tempfile::TempDir, Arc<dyn ObjectStore>, MemoryStore) {
        let dir = tempfile::tempdir().unwrap();
        let objects: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let mut m = MemoryStore::default();
        m.set_metadata("gpu_temp", Metadata { metric_type: MetricType::Gauge, ..Default::default() });
        for gpu in ["0", "1"] {
            let labels = Labels::from_pairs([("__name__", "gpu_temp"), ("gpu", gpu)]);
            let samples = (0..26 * 240).map(|k| Sample { t: T0 + k * 15_000 + 3, v: (k % 91) as f64 / 4.0 });
            m.add(labels, MetricType::Gauge, samples);
        }
        let writer = BlockWriter::new(objects.clone(), WriteOptions::default());
        for h in 0..26 {
            writer.write_raw(&m, T0 + h * HOUR, T0 + (h + 1) * HOUR).await.unwrap().unwrap();
        }
        let record = serde_json::json!({"until": T0 + 25 * HOUR, "owner": "a", "updated": 0}).to_string();
        objects.put(&Path::from(crate::archiver::PROGRESS), record.into()).await.unwrap();
        (dir, objects, m)
    }

    fn compactor(objects: &Arc<dyn ObjectStore>, owner: &str) -> Compactor {
        let opts = CompactorOptions { owner: owner.into(), ..Default::default() };
        Compactor::new(objects.clone(), BlockWriter::new(objects.clone(), WriteOptions::default()), opts)
    }

    async fn everything(objects: &Arc<dyn ObjectStore>) -> Vec<(Labels, Vec<(i64, u64)>)> {
        let store = ArchiveStore::new(
            objects.clone(),
            "t",
            ArchiveStoreOptions { refresh: Duration::ZERO, ..Default::default() },
        );
        let all = Matcher::new(strata_model::MatchOp::Regex, "__name__", ".+").unwrap();
        let got = store.select(&SelectRequest::new(vec![all], T0, T0 + 26 * HOUR)).await.unwrap();
        got.iter()
            .map(|s| {
                let pts = s.samples(i64::MIN, i64::MAX).unwrap().iter().map(|p| (p.t, p.v.to_bits())).collect();
                (s.labels.clone(), pts)
            })
            .collect()
    }

    #[tokio::test]
    async fn an_archived_day_becomes_one_block_and_its_hours_go_after_the_delay() {
        let (_dir, objects, source) = archived().await;
        let want = {
            let all = Matcher::new(strata_model::MatchOp::Regex, "__name__", ".+").unwrap();
            let got = source.select(&SelectRequest::new(vec![all], T0, T0 + 26 * HOUR)).await.unwrap();
            got.iter()
                .map(|s| {
                    let pts = s.samples(i64::MIN, i64::MAX).unwrap().iter().map(|p| (p.t, p.v.to_bits())).collect();
                    (s.labels.clone(), pts)
                })
                .collect::<Vec<_>>()
        };
        let c = compactor(&objects, "a");
        let now = T0 + 26 * HOUR + 60_000;
        let r = c.round(now).await.unwrap();
        // The second day is not archived whole yet: left alone.
        assert_eq!((r.compacted.clone(), r.marked, r.deleted), (vec![T0], 24, 0), "{r:?}");
        assert!(c.ready());
        // Readers leave the marked hours out at once, and read the same samples.
        assert_eq!(everything(&objects).await, want);
        // Before the delay nothing goes; after it, the hours' files do, also those of a
        // block whose deletion was cut short after its meta.
        assert_eq!(c.round(now + 60_000).await.unwrap().deleted, 0);
        let cut = crate::layout::block_dir(0, T0 + 3 * HOUR, T0 + 4 * HOUR);
        objects.delete(&cut.clone().join(META)).await.unwrap();
        let r = c.round(now + 16 * 60_000).await.unwrap();
        assert_eq!(r.deleted, 24, "{r:?}");
        let blocks = list_blocks(objects.as_ref()).await.unwrap();
        let ranges: Vec<(i64, i64)> =
            blocks.iter().map(|(_, m)| m.as_ref().map(|m| (m.min_time, m.max_time)).unwrap()).collect();
        assert_eq!(
            ranges,
            vec![(T0, T0 + 24 * HOUR), (T0 + 24 * HOUR, T0 + 25 * HOUR), (T0 + 25 * HOUR, T0 + 26 * HOUR)]
        );
        assert!(crate::tests::objects_named(objects.as_ref(), DELETION_MARK).await.is_empty());
        assert!(crate::tests::objects_named(objects.as_ref(), "data.parquet").await.len() == 3);
        assert_eq!(everything(&objects).await, want);
    }

    #[tokio::test]
    async fn a_round_cut_short_after_the_day_block_marks_its_hours_next_time() {
        let (_dir, objects, _) = archived().await;
        let c = compactor(&objects, "a");
        // The day block went up, and the compactor died before marking the hours.
        let day: Vec<(Path, BlockMeta)> = list_blocks(objects.as_ref())
            .await
            .unwrap()
            .into_iter()
            .map(|(d, m)| (d, m.unwrap()))
            .filter(|(_, m)| m.max_time <= T0 + 24 * HOUR)
            .collect();
        let refs: Vec<(&Path, &BlockMeta)> = day.iter().map(|(d, m)| (d, m)).collect();
        c.compact_day(0, T0, &refs, T0 + 26 * HOUR).await.unwrap();
        // A day block damaged since lets go of nothing: the day halts.
        let data = crate::layout::block_dir(0, T0, T0 + 24 * HOUR).join(crate::layout::DATA);
        let good = objects.get(&data).await.unwrap().bytes().await.unwrap();
        let mut bad = good.to_vec();
        let mid = bad.len() / 2;
        bad[mid] ^= 0xff;
        objects.put(&data, bad.into()).await.unwrap();
        let r = c.round(T0 + 26 * HOUR).await.unwrap();
        assert_eq!((r.compacted.len(), r.marked, r.halted.len()), (0, 0, 1), "{r:?}");
        assert!(!c.ready());
        objects.put(&data, good.into()).await.unwrap();
        let r = c.round(T0 + 26 * HOUR).await.unwrap();
        assert_eq!((r.compacted.len(), r.marked), (0, 24), "{r:?}");
        assert!(c.ready());
    }

    #[tokio::test]
    async fn a_day_block_taken_back_leaves_no_file_and_anothers_is_left_alone() {
        let (_dir, objects, _) = archived().await;
        let c = compactor(&objects, "a");
        let mut blocks = list_blocks(objects.as_ref()).await.unwrap().into_iter().map(|(d, m)| (d, m.unwrap()));
        let (dir, meta) = blocks.next().unwrap();
        let (_, other) = blocks.next().unwrap();
        let files =
            || async { objects.list(Some(&dir)).map_ok(|o| o.location).try_collect::<Vec<_>>().await.unwrap().len() };
        assert_eq!(files().await, 3);
        let now = T0 + 26 * HOUR;
        assert!(compactor(&objects, "b").lease(now).await.unwrap().is_none(), "b holds the lease");
        c.take_back(&dir, &meta, now).await;
        assert_eq!(files().await, 3, "not while another holds the lease");
        let later = now + 100 * HOUR;
        c.take_back(&dir, &other, later).await;
        assert_eq!(files().await, 3, "a meta not ours is left alone");
        c.take_back(&dir, &meta, later).await;
        assert_eq!(files().await, 0);
    }

    #[tokio::test]
    async fn a_day_block_from_an_import_lets_go_of_nothing() {
        let (_dir, objects, source) = archived().await;
        // `strata archive import` wrote a day block beside the archiver's hours: it lists
        // nothing it replaces, so the hours stay (readers merge the two).
        BlockWriter::new(objects.clone(), WriteOptions::default())
            .write_raw(&source, T0, T0 + 24 * HOUR)
            .await
            .unwrap()
            .unwrap();
        let c = compactor(&objects, "a");
        let r = c.round(T0 + 26 * HOUR).await.unwrap();
        assert_eq!((r.compacted.len(), r.marked, r.skipped.len()), (0, 0, 1), "{r:?}");
        assert!(c.ready());
        assert_eq!(list_blocks(objects.as_ref()).await.unwrap().len(), 27);
    }

    #[tokio::test]
    async fn a_day_over_the_sample_budget_is_skipped_and_kept() {
        let (_dir, objects, _) = archived().await;
        let opts = CompactorOptions { owner: "a".into(), max_day_samples: 24 * 480 - 1, ..Default::default() };
        let c = Compactor::new(objects.clone(), BlockWriter::new(objects.clone(), WriteOptions::default()), opts);
        let r = c.round(T0 + 26 * HOUR).await.unwrap();
        assert!(r.compacted.is_empty() && r.marked == 0 && r.halted.is_empty(), "{r:?}");
        assert_eq!(r.skipped.len(), 1, "{r:?}");
        assert!(c.ready());
    }

    #[tokio::test]
    async fn a_mark_that_cannot_be_read_deletes_nothing() {
        let (_dir, objects, _) = archived().await;
        let dir = crate::layout::block_dir(0, T0, T0 + HOUR);
        objects.put(&dir.clone().join(DELETION_MARK), "not json".into()).await.unwrap();
        let r = compactor(&objects, "a").round(T0 + 400 * HOUR).await.unwrap();
        assert_eq!(r.deleted, 0, "{r:?}");
        assert!(objects.head(&dir.join(crate::layout::DATA)).await.is_ok());
    }

    #[tokio::test]
    async fn a_damaged_block_halts_its_day_loudly_and_keeps_every_block() {
        let (_dir, objects, _) = archived().await;
        let data = crate::layout::block_dir(0, T0 + 5 * HOUR, T0 + 6 * HOUR).join(crate::layout::DATA);
        let mut bytes = objects.get(&data).await.unwrap().bytes().await.unwrap().to_vec();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        objects.put(&data, bytes.into()).await.unwrap();
        let c = compactor(&objects, "a");
        let r = c.round(T0 + 26 * HOUR).await.unwrap();
        assert!(r.compacted.is_empty() && r.marked == 0, "{r:?}");
        assert_eq!(r.halted.len(), 1, "{r:?}");
        assert!(!c.ready());
        assert_eq!(list_blocks(objects.as_ref()).await.unwrap().len(), 26);
    }

    #[tokio::test]
    async fn a_day_that_a_block_crosses_into_is_left_as_it_is() {
        let (_dir, objects, _) = archived().await;
        let mut other = MemoryStore::default();
        let labels = Labels::from_pairs([("__name__", "gpu_temp"), ("gpu", "2")]);
        other.add(labels, MetricType::Gauge, (0..480).map(|k| Sample { t: T0 + 23 * HOUR + k * 15_000, v: 1.0 }));
        BlockWriter::new(objects.clone(), WriteOptions::default())
            .write_raw(&other, T0 + 23 * HOUR, T0 + 25 * HOUR)
            .await
            .unwrap()
            .unwrap();
        let c = compactor(&objects, "a");
        let r = c.round(T0 + 26 * HOUR).await.unwrap();
        assert!(r.compacted.is_empty() && r.marked == 0 && r.halted.is_empty(), "{r:?}");
        assert!(c.ready());
    }

    #[tokio::test]
    async fn one_compactor_at_a_time_and_retention_marks_what_is_past_it() {
        let (_dir, objects, _) = archived().await;
        let now = T0 + 26 * HOUR;
        assert!(compactor(&objects, "a").lease(now).await.unwrap().is_none());
        let r = compactor(&objects, "b").round(now).await.unwrap();
        assert_eq!(r.elsewhere.as_deref(), Some("a"));
        assert!(r.compacted.is_empty());
        // a's clock is half an hour ahead of b's: its lease still counts as live for b.
        assert!(compactor(&objects, "a").lease(now + HOUR / 2).await.unwrap().is_none());
        assert_eq!(compactor(&objects, "b").lease(now).await.unwrap().as_deref(), Some("a"));
        // A lease further ahead than any clock could be is taken over (and back).
        assert!(compactor(&objects, "a").lease(now + 1000 * HOUR).await.unwrap().is_none());
        assert!(compactor(&objects, "b").lease(now).await.unwrap().is_none());
        assert_eq!(compactor(&objects, "a").lease(now).await.unwrap().as_deref(), Some("b"));
        // b holds the lease; retention of 3 hours marks the 22 blocks that end 3 hours
        // before the archive's progress (not the clock's now), and the first day (on its
        // way out) is not compacted.
        let mut opts = CompactorOptions { owner: "b".into(), ..Default::default() };
        opts.retention_raw = Some(Duration::from_secs(3 * 3600));
        let b = Compactor::new(objects.clone(), BlockWriter::new(objects.clone(), WriteOptions::default()), opts);
        let r = b.round(now + 16 * 60_000).await.unwrap();
        assert!(r.compacted.is_empty(), "{r:?}");
        assert_eq!(r.marked, 22, "{r:?}");
    }

    /// What the archive's 5 m and 1 h windows answer for a few leaves over the first day.
    async fn from_aggregates(objects: &Arc<dyn ObjectStore>) -> Vec<Vec<(Labels, Vec<Option<u64>>)>> {
        let store = ArchiveStore::new(
            objects.clone(),
            "t",
            ArchiveStoreOptions { refresh: Duration::ZERO, ..Default::default() },
        );
        let mut out = Vec::new();
        for (width, f, range) in [
            (strata_downsample::FIVE_MINUTES, "avg_over_time", HOUR),
            (strata_downsample::FIVE_MINUTES, "max_over_time", 300_000),
            (strata_downsample::ONE_HOUR, "count_over_time", 3 * HOUR),
        ] {
            let m = vec![Matcher::new(strata_model::MatchOp::Equal, "__name__", "gpu_temp").unwrap()];
            let mut req = strata_store::StepsRequest::new(m, (T0 + 3 * HOUR, T0 + 24 * HOUR, width), 300_000);
            req.function = Some((f.to_string(), range));
            req.resolution = width;
            let got = store.steps(&req).await.unwrap().unwrap();
            let bits = |v: Vec<Option<f64>>| v.into_iter().map(|x| x.map(f64::to_bits)).collect();
            out.push(got.series.into_iter().map(|s| (s.labels, bits(s.values.to_options()))).collect());
        }
        out
    }

    #[tokio::test]
    async fn aggregate_blocks_become_day_blocks_bit_for_bit_and_expire_by_their_own_retention() {
        let (_dir, objects, source) = archived().await;
        // The same hours' 5 m and 1 h blocks beside the raw ones, as the archiver writes them.
        let writer = BlockWriter::new(objects.clone(), WriteOptions::default());
        let widths = [strata_downsample::FIVE_MINUTES, strata_downsample::ONE_HOUR];
        for h in 0..26 {
            let encoded = writer.encode_range(&source, T0 + h * HOUR, T0 + (h + 1) * HOUR, &widths, Vec::new(), None);
            for a in encoded.await.unwrap().aggregates {
                writer.publish(a).await.unwrap();
            }
        }
        let before = from_aggregates(&objects).await;
        assert!(before.iter().all(|leaf| leaf.len() == 2), "{before:?}");
        // An hour of the day without its 5 m block: that day is not compacted at 5 m.
        let hour = crate::layout::block_dir(strata_downsample::FIVE_MINUTES, T0 + 5 * HOUR, T0 + 6 * HOUR);
        let kept = objects.get(&hour.clone().join(META)).await.unwrap().bytes().await.unwrap();
        objects.delete(&hour.clone().join(META)).await.unwrap();
        let r = compactor(&objects, "a").round(T0 + 26 * HOUR).await.unwrap();
        assert!(r.skipped.iter().any(|s| s.contains("5m day") && s.contains("whole day")), "{r:?}");
        assert_eq!(r.compacted, vec![T0, T0], "raw and 1 h: {r:?}");
        objects.put(&hour.clone().join(META), kept.into()).await.unwrap();
        let c = compactor(&objects, "a");
        let now = T0 + 26 * HOUR + 60_000;
        let r = c.round(now).await.unwrap();
        assert_eq!((r.compacted.clone(), r.marked), (vec![T0], 24), "the 5 m day: {r:?}");
        assert_eq!(c.round(now + 16 * 60_000).await.unwrap().deleted, 72);
        let blocks = list_blocks(objects.as_ref()).await.unwrap();
        let days: Vec<(String, i64, i64, u64)> = blocks
            .iter()
            .map(|(d, m)| {
                let m = m.as_ref().unwrap();
                (d.parts().next().unwrap().as_ref().to_string(), m.min_time, m.max_time, m.raw_samples)
            })
            .filter(|b| b.1 == T0)
            .collect();
        assert_eq!(days.len(), 3, "{days:?}");
        for (res, _, end, raw) in &days {
            assert_eq!(*end, T0 + 24 * HOUR);
            assert_eq!(*raw, if res == "raw" { 0 } else { 2 * 24 * 240 }, "{res}: raw samples summarised");
        }
        // The day blocks answer as the hours did, bit for bit.
        assert_eq!(from_aggregates(&objects).await, before);
        // 5 m blocks kept an hour past the archive's progress (T0 + 25 h), the rest for
        // ever: the 5 m day block ends by T0 + 24 h and goes, nothing else.
        let mut opts = CompactorOptions { owner: "a".into(), ..Default::default() };
        opts.retention_5m = Some(Duration::from_secs(3600));
        let c = Compactor::new(objects.clone(), BlockWriter::new(objects.clone(), WriteOptions::default()), opts);
        let r = c.round(now + 32 * 60_000).await.unwrap();
        assert_eq!(r.marked, 1, "{r:?}");
        let marked: Vec<Path> =
            c.scan().await.unwrap().into_iter().filter(|(_, f)| f.mark.is_some()).map(|(d, _)| d).collect();
        assert_eq!(marked.len(), 1);
        assert!(marked[0].as_ref().starts_with("5m/"), "{marked:?}");
    }
}
