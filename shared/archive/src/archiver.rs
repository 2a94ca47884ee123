//! [`Archiver`]: writes every complete block range of a source (a global's deduplicated
//! view of its stores) into the archive, once.
//!
//! A range `[s, s + block)` is archived when it is complete: it ended `settle` ago, every
//! store that feeds it answers and has data past its end ([`Coverage`]). A store that stays
//! down holds the archive back for at most `max_wait`; the range is then written from the
//! stores that answer, and the block's meta names what was missing (`gaps`), so readers
//! warn instead of answering short in silence. Reads are made with `partial_response`
//! off, so a store failing mid-read fails the attempt rather than leaving a hole.
//!
//! Progress lives in the bucket, not in the process: `progress/raw.json` says up to where
//! every range is archived or empty, a range whose `meta.json` exists is done, and a range
//! being written has a `claim.json` beside its files, created only when
//! absent (an atomic create in every backend) and taken over once older than `lease`.
//! A restart, or a second archiver on the same bucket, therefore never writes a finished
//! range again, and two never write the same range at once (the claim is read back before
//! the meta goes up: an archiver that lost its claim leaves the block to the winner).
//! Failures back off exponentially; after `unready_after` failures in a row the archiver
//! reports itself not ready (the global's `/-/ready`) until a round succeeds.

use crate::layout::{block_dir, META};
use crate::meta::BlockMeta;
use crate::writer::BlockWriter;
use crate::ArchiveError;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_store::{QueryScope, Store};
use tokio::sync::watch;

/// What the stores behind the source hold, as the global sees it now.
#[derive(Debug, Clone, Default)]
pub struct Coverage {
    /// The oldest sample any store holds; `None` when none holds any.
    pub min_time: Option<i64>,
    /// Every store that holds data has data up to here (ms).
    pub complete_until: i64,
    /// Stores that do not answer: a range is not complete while there are any.
    pub missing: Vec<String>,
    /// What holds `complete_until` back when a store's sender is behind (a regional's
    /// edge), said in a block's gaps when the range is written without it.
    pub behind: Option<String>,
}

/// Called at each round for the stores' state.
pub type CoverageFn = Arc<dyn Fn() -> Coverage + Send + Sync>;

#[derive(Debug, Clone)]
pub struct ArchiverOptions {
    /// Width of a raw block (aligned to it from the epoch).
    pub block: Duration,
    /// How long after a range's end it may still be written to by late scrapes.
    pub settle: Duration,
    /// A range held back by a store that does not answer is written anyway after this,
    /// its gaps named in its meta.
    pub max_wait: Duration,
    /// Time between rounds (and the first backoff after a failure).
    pub interval: Duration,
    /// A claim older than this belongs to an archiver that died: taken over.
    pub lease: Duration,
    /// Failures in a row after which the archiver is not ready.
    pub unready_after: u32,
    /// Named in claims and logs (host and port of the global, by default).
    pub owner: String,
    /// Data older than this is not archived (a store that says it holds data from the
    /// epoch would otherwise send the archiver through every range since).
    pub lookback: Duration,
    /// Ranges looked at in one round; the rest wait for the next.
    pub max_ranges: usize,
}

impl Default for ArchiverOptions {
    fn default() -> Self {
        ArchiverOptions {
            block: Duration::from_secs(2 * 3600),
            settle: Duration::from_secs(10 * 60),
            max_wait: Duration::from_secs(6 * 3600),
            interval: Duration::from_secs(30),
            lease: Duration::from_secs(15 * 60),
            unready_after: 3,
            owner: "strata".into(),
            lookback: Duration::from_secs(35 * 86_400),
            max_ranges: 48,
        }
    }
}

/// The archiver's figures in `/metrics` (prefix `strata_archive_`).
#[derive(Clone, Default)]
pub struct ArchiverMetrics {
    blocks: Counter,
    samples: Counter,
    bytes: Counter,
    failures: Counter,
    incomplete: Counter,
    archived_until: Gauge,
    lag: Gauge,
    ready: Gauge,
}

impl ArchiverMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("archive");
        r.register("blocks_written", "Raw blocks written to the archive", self.blocks.clone());
        r.register("samples_written", "Samples written to the archive", self.samples.clone());
        r.register("bytes_written", "Bytes of data and series files written to the archive", self.bytes.clone());
        r.register("failures", "Archiving attempts that failed (each logged with the object)", self.failures.clone());
        r.register(
            "incomplete_blocks",
            "Blocks written after max_wait while a store did not answer (their meta names the gaps)",
            self.incomplete.clone(),
        );
        r.register(
            "archived_until_seconds",
            "End of the newest range archived without a hole before it, Unix seconds",
            self.archived_until.clone(),
        );
        r.register("lag_seconds", "How far the archive is behind now", self.lag.clone());
        r.register("ready", "1 unless the last rounds failed (the global's /-/ready)", self.ready.clone());
    }
}

/// Claims and progress records are a few hundred bytes: larger ones are not read.
const SMALL_OBJECT: u64 = 64 << 10;

/// What [`Archiver::write_claimed`] did with a range.
enum Claimed {
    Written(BlockMeta),
    /// The stores hold nothing there (and what was missing when they said so).
    Empty {
        gaps: Vec<String>,
    },
    /// Another archiver finished it meanwhile.
    Done,
    /// Another archiver holds its claim.
    Elsewhere,
}

/// The progress record of the raw blocks.
pub const PROGRESS: &str = "progress/raw.json";

/// Where every raw range before is archived or empty, from the bucket's progress record;
/// `None` when there is none yet. A regional reads it to hold what is not archived.
pub async fn read_progress(objects: &dyn ObjectStore) -> Result<Option<i64>, ArchiveError> {
    Ok(read_progress_at(objects, &Path::from(PROGRESS)).await?.map(|p| p.until))
}

/// What a record holds as written; its gaps are read one by one (one that does not
/// parse is left out, and said), so a damaged gap never stops a reader of `until`.
#[derive(Deserialize)]
struct StoredProgress {
    until: i64,
    #[serde(default)]
    gaps: serde_json::Value,
}

/// The progress record at `path` (a shard's, read from the root), whole.
pub(crate) async fn read_progress_at(
    objects: &dyn ObjectStore,
    path: &Path,
) -> Result<Option<ProgressRecord>, ArchiveError> {
    let failed = |e: &dyn std::fmt::Display| ArchiveError::Object { object: path.to_string(), reason: e.to_string() };
    let got = match objects.get(path).await {
        Ok(got) if got.meta.size > SMALL_OBJECT => return Err(failed(&"larger than a progress record can be")),
        Ok(got) => got.bytes().await.map_err(|e| failed(&e))?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(failed(&e)),
    };
    let p: StoredProgress = serde_json::from_slice(&got).map_err(|e| failed(&format!("not a progress record: {e}")))?;
    let listed = match p.gaps {
        serde_json::Value::Array(list) => list,
        serde_json::Value::Null => Vec::new(),
        other => {
            tracing::warn!(object = %path, gaps = %other, "a record's gaps that are not a list: left out");
            Vec::new()
        }
    };
    let mut gaps = Vec::new();
    for g in listed {
        match serde_json::from_value::<Gap>(g) {
            Ok(mut g) if g.start < g.end => {
                cut_why(&mut g);
                gaps.push(g);
            }
            Ok(g) => {
                tracing::warn!(object = %path, start = g.start, end = g.end, "a gap range that ends before it starts: left out")
            }
            Err(e) => tracing::warn!(object = %path, error = %e, "a gap range that does not parse: left out"),
        }
    }
    let mut merged = Vec::new();
    merge_gaps(&mut merged, gaps);
    Ok(Some(ProgressRecord { until: p.until, gaps: merged }))
}

/// What a progress record says: where the archiver has got to, and the ranges it passed
/// as empty while some store did not answer (their data may be missing from the archive,
/// and no block is there to say so).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProgressRecord {
    pub until: i64,
    pub gaps: Vec<Gap>,
}

/// A range `[start, end)` archived as empty without every store, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gap {
    pub start: i64,
    pub end: i64,
    pub why: String,
}

/// Gap ranges a record keeps: past it, the two closest are merged into one (which says
/// more may be missing, never less); and the bytes of a reason. Together they keep a
/// record far below the size a reader accepts.
const MAX_GAPS: usize = 64;
const MAX_WHY: usize = 200;

#[derive(Debug, Serialize, Deserialize)]
struct Progress {
    /// Every range ending at or before this is archived, or held nothing.
    until: i64,
    owner: String,
    updated: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    gaps: Vec<Gap>,
}

/// Adds `gap` to `gaps`: joined to the newest when it follows it for the same reason, the
/// oldest two merged when there are too many.
fn add_gap(gaps: &mut Vec<Gap>, mut gap: Gap) {
    cut_why(&mut gap);
    merge_gaps(gaps, vec![gap]);
}

fn cut_why(gap: &mut Gap) {
    // (Cut once: a reason cut already is left as it is.)
    if gap.why.len() > MAX_WHY && !(gap.why.len() <= MAX_WHY + 6 && gap.why.ends_with(" [cut]")) {
        let mut cut = MAX_WHY;
        while !gap.why.is_char_boundary(cut) {
            cut -= 1;
        }
        gap.why.truncate(cut);
        gap.why.push_str(" [cut]");
    }
}

/// Merges the two closest gaps (`gaps` in order of start) until at most [`MAX_GAPS`] are
/// left: the healthy time between them is the least that can be.
fn bound_gaps(gaps: &mut Vec<Gap>) {
    while gaps.len() > MAX_GAPS {
        let Some(i) = (1..gaps.len()).min_by_key(|&i| gaps[i].start.saturating_sub(gaps[i - 1].end)) else { break };
        let next = gaps.remove(i);
        let prev = &mut gaps[i - 1];
        prev.start = prev.start.min(next.start);
        prev.end = prev.end.max(next.end);
        prev.why = "stores did not answer (several ranges merged)".into();
    }
}

/// `gaps` and `more` as one list in order of start, bounded: gaps that overlap (the same
/// one recorded twice, or once joined to its neighbour) become one, as do neighbours
/// for the same reason.
fn merge_gaps(gaps: &mut Vec<Gap>, more: Vec<Gap>) {
    gaps.extend(more);
    gaps.sort_by_key(|g| g.start);
    let mut out: Vec<Gap> = Vec::with_capacity(gaps.len());
    for g in gaps.drain(..) {
        match out.last_mut() {
            Some(prev) if g.start < prev.end || (g.start == prev.end && g.why == prev.why) => {
                prev.end = prev.end.max(g.end);
            }
            _ => out.push(g),
        }
    }
    *gaps = out;
    bound_gaps(gaps);
}

#[derive(Debug, Serialize, Deserialize)]
struct Claim {
    owner: String,
    /// Unix ms; the claim is stale past it.
    expires: i64,
}

/// What one round did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Round {
    pub written: Vec<BlockMeta>,
    /// Ranges found already archived (or being written by another archiver).
    pub skipped: usize,
    /// Why the round stopped before now, if it did.
    pub waiting: Option<String>,
}

pub struct Archiver {
    objects: Arc<dyn ObjectStore>,
    writer: BlockWriter,
    source: Arc<dyn Store>,
    coverage: CoverageFn,
    opts: ArchiverOptions,
    metrics: ArchiverMetrics,
    failures_in_row: AtomicU32,
    archived_until: AtomicI64,
    /// The progress record's gap ranges, written with it each time.
    gaps: parking_lot::Mutex<Vec<Gap>>,
}

impl Archiver {
    pub fn new(
        objects: Arc<dyn ObjectStore>,
        writer: BlockWriter,
        source: Arc<dyn Store>,
        coverage: CoverageFn,
        opts: ArchiverOptions,
    ) -> Self {
        let metrics = ArchiverMetrics::default();
        metrics.ready.set(1);
        Archiver {
            objects,
            writer,
            source,
            coverage,
            opts,
            metrics,
            failures_in_row: AtomicU32::new(0),
            archived_until: AtomicI64::new(i64::MIN),
            gaps: parking_lot::Mutex::new(Vec::new()),
        }
    }

    pub fn metrics(&self) -> &ArchiverMetrics {
        &self.metrics
    }

    /// False after `unready_after` failed rounds in a row.
    pub fn ready(&self) -> bool {
        self.failures_in_row.load(Ordering::Relaxed) < self.opts.unready_after
    }

    fn block_ms(&self) -> i64 {
        i64::try_from(self.opts.block.as_millis()).unwrap_or(i64::MAX).max(60_000)
    }

    /// Archives every complete range up to `now_ms` not archived yet, oldest first, at
    /// most `max_ranges` of them; the progress record moves after each.
    pub async fn round(&self, now_ms: i64) -> Result<Round, ArchiveError> {
        let began = std::time::Instant::now();
        // The claims' leases count from when they are taken, not from the round's start.
        let now_then = || now_ms.saturating_add(ms(began.elapsed()));
        let mut round = Round::default();
        let cov = (self.coverage)();
        let Some(min_time) = cov.min_time else {
            round.waiting = Some("no store holds data".into());
            return Ok(round);
        };
        let block = self.block_ms();
        let settle = ms(self.opts.settle);
        let max_wait = ms(self.opts.max_wait);
        let recorded = self.progress().await?;
        let oldest = now_ms.saturating_sub(ms(self.opts.lookback));
        if min_time < oldest && recorded < oldest {
            tracing::warn!(
                stores_from = min_time,
                archived_from = oldest,
                "the stores hold data older than --archive.lookback: it is not archived"
            );
        }
        let mut start = min_time.max(oldest).max(recorded).div_euclid(block).saturating_mul(block);
        let mut until = self.archived_until.load(Ordering::Relaxed).max(recorded);
        let mut done = 0usize;
        while let Some(end) = start.checked_add(block).filter(|e| e.saturating_add(settle) <= now_ms) {
            if done >= self.opts.max_ranges {
                round.waiting = Some(format!("{done} ranges this round; the rest in the next"));
                break;
            }
            done += 1;
            if self.archived(start, end).await? {
                round.skipped += 1;
                until = self.advance(until, end, now_ms).await?;
                start = end;
                continue;
            }
            // Past `end`, not at it: the range's aggregate windows end at `end` and read
            // the samples there.
            let complete = cov.missing.is_empty() && end < cov.complete_until;
            let overdue = now_ms.saturating_sub(end) >= max_wait;
            if !complete && !overdue {
                round.waiting = Some(match cov.missing.is_empty() {
                    true => match &cov.behind {
                        Some(b) => format!("range ending {end} waits for the stores' data to reach it ({b})"),
                        None => format!("range ending {end} waits for the stores' data to reach it"),
                    },
                    false => {
                        format!("range ending {end} waits for stores that do not answer: {}", cov.missing.join(", "))
                    }
                });
                break;
            }
            let gaps = match complete {
                true => Vec::new(),
                false if cov.missing.is_empty() => vec![match &cov.behind {
                    Some(b) => format!("{b} when this block was written"),
                    None => format!("the stores' data ended at {} when this block was written", cov.complete_until),
                }],
                false => cov
                    .missing
                    .iter()
                    .map(|s| format!("store {s} did not answer when this block was written"))
                    .collect(),
            };
            let mut written = self.write_claimed(start, end, now_then(), gaps.clone()).await;
            if let (Err(e), true) = (&written, overdue && gaps.is_empty()) {
                // A range that keeps failing whole is written from what answers once it is
                // overdue, its error named, rather than holding every later range back.
                tracing::warn!(block = %block_dir(0, start, end), error = %e, "an overdue range failed whole: writing what the stores give");
                let gaps = vec![format!("reading the stores failed when this block was written: {e}")];
                written = self.write_claimed(start, end, now_then(), gaps).await;
            }
            match written? {
                Claimed::Written(meta) => {
                    if !meta.gaps.is_empty() {
                        self.metrics.incomplete.inc();
                        tracing::warn!(block = %block_dir(0, start, end), gaps = ?meta.gaps, "archived a range past max_wait without every store");
                    }
                    self.metrics.blocks.inc();
                    self.metrics.samples.inc_by(meta.samples);
                    self.metrics.bytes.inc_by(meta.bytes());
                    round.written.push(meta);
                }
                Claimed::Empty { gaps } => {
                    if !gaps.is_empty() {
                        // No block to carry them: the progress record does (readers warn
                        // over the range), with the log and the counter.
                        self.metrics.incomplete.inc();
                        tracing::warn!(range_start = start, range_end = end, gaps = ?gaps, "a range archived as empty without every store");
                        add_gap(&mut self.gaps.lock(), Gap { start, end, why: gaps.join("; ") });
                    }
                }
                Claimed::Done => round.skipped += 1,
                Claimed::Elsewhere => {
                    // Another archiver holds the claim: not archived until its meta is up.
                    round.skipped += 1;
                    round.waiting = Some(format!("range ending {end} is being written by another archiver"));
                    break;
                }
            }
            until = self.advance(until, end, now_ms).await?;
            start = end;
        }
        self.archived_until.store(until, Ordering::Relaxed);
        if until > i64::MIN {
            self.metrics.archived_until.set(until / 1000);
            self.metrics.lag.set(now_ms.saturating_sub(until).max(0) / 1000);
        }
        Ok(round)
    }

    /// Whether the block of `[start, end)` is there (its meta); an error other than
    /// "not found" fails the round rather than writing the range again.
    async fn archived(&self, start: i64, end: i64) -> Result<bool, ArchiveError> {
        // The range's own block, or the day block that compaction replaced it with (one
        // that lists it: a day block from an import holds other data).
        let own = block_dir(0, start, end);
        match self.objects.head(&own.clone().join(META)).await {
            Ok(_) => return Ok(true),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(ArchiveError::Object { object: own.join(META).to_string(), reason: e.to_string() }),
        }
        const DAY: i64 = 86_400_000;
        let day = start.div_euclid(DAY).saturating_mul(DAY);
        if end > day.saturating_add(DAY) || (start, end) == (day, day.saturating_add(DAY)) {
            return Ok(false);
        }
        let day_dir = block_dir(0, day, day.saturating_add(DAY));
        match self.objects.head(&day_dir.clone().join(META)).await {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => {
                return Err(ArchiveError::Object { object: day_dir.join(META).to_string(), reason: e.to_string() })
            }
        }
        match crate::reader::read_meta(self.objects.as_ref(), &day_dir).await {
            Ok(m) => Ok(m.compacted_from.iter().any(|s| s.dir == own.as_ref())),
            // A damaged day meta vouches for nothing: the range is written on its own.
            Err(ArchiveError::Corrupt { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every range before `end` is done: the record moves there (never past now).
    async fn advance(&self, until: i64, end: i64, now_ms: i64) -> Result<i64, ArchiveError> {
        if end <= until || end > now_ms {
            return Ok(until);
        }
        // Another archiver may have got further: where the record now stands.
        self.record_progress(end, now_ms).await
    }

    /// Writes `[start, end)` under a claim.
    async fn write_claimed(
        &self,
        start: i64,
        end: i64,
        now_ms: i64,
        gaps: Vec<String>,
    ) -> Result<Claimed, ArchiveError> {
        let claim_path = block_dir(0, start, end).join("claim.json");
        if !self.claim(&claim_path, now_ms).await? {
            return Ok(Claimed::Elsewhere);
        }
        // Another archiver may have finished it between the look and the claim.
        if self.archived(start, end).await? {
            self.release(&claim_path).await;
            return Ok(Claimed::Done);
        }
        let partial = !gaps.is_empty();
        let scope = QueryScope::new(partial, true);
        let widths = [strata_downsample::FIVE_MINUTES, strata_downsample::ONE_HOUR];
        let encoded = scope
            .clone()
            .run(self.writer.encode_range(self.source.as_ref(), start, end, &widths, gaps.clone(), None))
            .await
            .map(|r| (r.raw, r.aggregates));
        // What the stores warned of is a hole in the block: with every store required
        // (an HA replica stood in for one that failed, say) it fails the attempt; past
        // max_wait it joins the gaps.
        let warned = scope.warnings();
        let (mut raw, mut aggregates) = encoded?;
        if raw.is_none() && aggregates.is_empty() {
            self.release(&claim_path).await;
            let mut gaps = gaps;
            gaps.extend(warned);
            return Ok(Claimed::Empty { gaps });
        }
        if !warned.is_empty() {
            if !partial {
                self.release(&claim_path).await;
                return Err(ArchiveError::Invalid(format!(
                    "range [{start}, {end}) read with warnings, not archived: {}",
                    warned.join("; ")
                )));
            }
            for b in raw.iter_mut().chain(aggregates.iter_mut()) {
                b.meta.gaps.extend(warned.iter().cloned());
            }
        }
        // Read back just before the upload: an archiver that stalled past its lease and
        // lost the claim leaves the range to the one that took it.
        if !self.holds(&claim_path).await? {
            tracing::warn!(object = %claim_path, "lost the claim while reading the range: left to its new owner");
            return Ok(Claimed::Elsewhere);
        }
        // The aggregates first: the raw block's meta is the record that the range is done.
        // A range with no raw sample may still close a window with a sample at its end.
        for a in aggregates {
            self.writer.publish(a).await?;
        }
        let Some(block) = raw else {
            self.release(&claim_path).await;
            let mut gaps = gaps;
            gaps.extend(warned);
            return Ok(Claimed::Empty { gaps });
        };
        let meta = self.writer.publish(block).await?;
        // Done: the meta is the record now.
        self.release(&claim_path).await;
        Ok(Claimed::Written(meta))
    }

    /// Removes this archiver's claim; one left behind only delays another archiver by
    /// its lease.
    async fn release(&self, claim_path: &Path) {
        if !matches!(self.holds(claim_path).await, Ok(true)) {
            return;
        }
        if let Err(e) = self.objects.delete(claim_path).await {
            tracing::warn!(object = %claim_path, error = %e, "removing a claim");
        }
    }

    /// Where the ranges before it are all archived or empty (`progress/raw.json`), so a
    /// round, a restart or another archiver starts there and not at the stores' oldest
    /// sample; 0 when there is no record yet.
    async fn progress(&self) -> Result<i64, ArchiveError> {
        let Some(record) = read_progress_at(self.objects.as_ref(), &Path::from(PROGRESS)).await? else {
            return Ok(i64::MIN);
        };
        // Another archiver's (or an earlier life's) gaps are kept, with this one's.
        merge_gaps(&mut self.gaps.lock(), record.gaps);
        Ok(record.until)
    }

    /// Records `until` (or where another archiver got to, if further) with the gaps, and
    /// says which it recorded.
    async fn record_progress(&self, until: i64, now_ms: i64) -> Result<i64, ArchiveError> {
        // Another archiver on the bucket may have recorded gaps (or got further) since
        // this one read the record: read again and keep them. Gaps older than the
        // lookback go: nothing there is archived or asked of the archiver any more.
        let mut until = until;
        if let Ok(Some(there)) = read_progress_at(self.objects.as_ref(), &Path::from(PROGRESS)).await {
            until = until.max(there.until);
            merge_gaps(&mut self.gaps.lock(), there.gaps);
        }
        let oldest = now_ms.saturating_sub(ms(self.opts.lookback));
        let gaps = {
            let mut gaps = self.gaps.lock();
            gaps.retain(|g| g.end > oldest);
            gaps.clone()
        };
        let p = Progress { until, owner: self.opts.owner.clone(), updated: now_ms, gaps };
        let body = serde_json::to_vec(&p).map_err(|e| ArchiveError::Invalid(e.to_string()))?;
        self.objects
            .put(&Path::from(PROGRESS), body.into())
            .await
            .map_err(|e| ArchiveError::Object { object: PROGRESS.into(), reason: e.to_string() })?;
        Ok(until)
    }

    /// Takes the claim at `path`: created when absent, taken over when stale (its lease
    /// ran out, or it claims to last longer than a lease can: a clock ahead).
    async fn claim(&self, path: &Path, now_ms: i64) -> Result<bool, ArchiveError> {
        let lease = ms(self.opts.lease);
        let claim = Claim { owner: self.opts.owner.clone(), expires: now_ms.saturating_add(lease) };
        let body = serde_json::to_vec(&claim).map_err(|e| ArchiveError::Invalid(e.to_string()))?;
        let create = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.objects.put_opts(path, body.clone().into(), create).await {
            Ok(_) => return Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(ArchiveError::Object { object: path.to_string(), reason: e.to_string() }),
        }
        match self.read_claim(path).await? {
            Some(c)
                if c.owner != self.opts.owner && c.expires > now_ms && c.expires <= now_ms.saturating_add(lease) =>
            {
                return Ok(false)
            }
            Some(c) if c.owner != self.opts.owner => {
                tracing::warn!(object = %path, owner = %c.owner, expires = c.expires, "taking over a stale claim: its archiver stopped before it finished");
            }
            _ => {}
        }
        self.objects
            .put(path, body.into())
            .await
            .map_err(|e| ArchiveError::Object { object: path.to_string(), reason: e.to_string() })?;
        Ok(true)
    }

    /// The claim at `path`; `None` when there is none or it is not a claim (damaged, or
    /// larger than a claim can be).
    async fn read_claim(&self, path: &Path) -> Result<Option<Claim>, ArchiveError> {
        let failed = |e: object_store::Error| ArchiveError::Object { object: path.to_string(), reason: e.to_string() };
        let got = match self.objects.get(path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(failed(e)),
        };
        if got.meta.size > SMALL_OBJECT {
            return Ok(None);
        }
        let bytes = got.bytes().await.map_err(failed)?;
        Ok(serde_json::from_slice(&bytes).ok())
    }

    /// Whether the claim at `path` is still this archiver's.
    async fn holds(&self, path: &Path) -> Result<bool, ArchiveError> {
        Ok(self.read_claim(path).await?.is_some_and(|c| c.owner == self.opts.owner))
    }

    /// Counts a round's outcome; the time to wait before the next: `interval`, or after a
    /// failure a backoff that doubles up to ten intervals.
    pub fn record(&self, result: &Result<Round, ArchiveError>) -> Duration {
        match result {
            Ok(r) => {
                self.failures_in_row.store(0, Ordering::Relaxed);
                self.metrics.ready.set(1);
                if let Some(w) = &r.waiting {
                    tracing::debug!(waiting = %w, "archiver");
                }
                self.opts.interval
            }
            Err(e) => {
                self.metrics.failures.inc();
                let n = self.failures_in_row.fetch_add(1, Ordering::Relaxed).saturating_add(1);
                self.metrics.ready.set(i64::from(self.ready()));
                let backoff = self.opts.interval.saturating_mul(1 << (n - 1).min(10)).min(self.opts.interval * 10);
                tracing::error!(error = %e, failures_in_row = n, retry_in = ?backoff, "archiving failed");
                backoff
            }
        }
    }

    /// Rounds until `stop`.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            // Stopped mid-round, it leaves at most a claim that goes stale: nothing half
            // published is ever read (the meta goes last).
            let result = tokio::select! {
                r = self.round(strata_model::time::now_ms()) => r,
                _ = stop.changed() => return,
            };
            let wait = self.record(&result).max(Duration::from_secs(1));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ArchiveStore, ArchiveStoreOptions, WriteOptions};
    use async_trait::async_trait;
    use object_store::local::LocalFileSystem;
    use std::collections::BTreeSet;
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;
    use strata_model::{Labels, Matcher, Metadata, MetricType, Sample};
    use strata_store::memory::MemoryStore;
    use strata_store::{SelectBudget, SelectRequest, SeriesChunks, StoreError};

    const T0: i64 = 1_764_547_200_000; // 2025-12-01T00:00:00Z
    const HOUR: i64 = 3_600_000;

    /// Two GPUs' temperature every 15 s over 3.5 h, and a store that fails on demand.
    struct Flaky {
        inner: MemoryStore,
        failing: AtomicBool,
        /// Answers with a warning, as a fan-out does when a replica stood in for a store.
        warning: AtomicBool,
    }

    fn source() -> Arc<Flaky> {
        let mut m = MemoryStore::default();
        m.set_metadata("gpu_temp", Metadata { metric_type: MetricType::Gauge, ..Default::default() });
        for gpu in ["0", "1"] {
            let labels = Labels::from_pairs([("__name__", "gpu_temp"), ("gpu", gpu)]);
            let samples = (0..(7 * HOUR / 2 / 15_000)).map(|k| Sample { t: T0 + k * 15_000, v: 40.0 + k as f64 });
            m.add(labels, MetricType::Gauge, samples);
        }
        Arc::new(Flaky { inner: m, failing: AtomicBool::new(false), warning: AtomicBool::new(false) })
    }

    #[async_trait]
    impl Store for Flaky {
        async fn select_within(
            &self,
            req: &SelectRequest,
            budget: &mut SelectBudget,
        ) -> Result<Vec<SeriesChunks>, StoreError> {
            if self.failing.load(Ordering::Relaxed) {
                return Err(StoreError::Unavailable("store down".into()));
            }
            if self.warning.load(Ordering::Relaxed) {
                QueryScope::current().warn("store edge-b failed; its replica answered");
            }
            self.inner.select_within(req, budget).await
        }
        async fn series_within(
            &self,
            m: &[Matcher],
            start: i64,
            end: i64,
            budget: &mut SelectBudget,
        ) -> Result<Vec<Labels>, StoreError> {
            self.inner.series_within(m, start, end, budget).await
        }
        async fn label_names(&self, m: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
            self.inner.label_names(m, start, end).await
        }
        async fn label_values(
            &self,
            name: &str,
            m: &[Matcher],
            start: i64,
            end: i64,
        ) -> Result<Vec<String>, StoreError> {
            self.inner.label_values(name, m, start, end).await
        }
        async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
            self.inner.metadata(metric).await
        }
    }

    struct Setup {
        _dir: tempfile::TempDir,
        objects: Arc<dyn ObjectStore>,
        source: Arc<Flaky>,
        coverage: Arc<Mutex<Coverage>>,
    }

    fn setup() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let objects: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let coverage =
            Coverage { min_time: Some(T0), complete_until: T0 + 7 * HOUR / 2, missing: Vec::new(), behind: None };
        Setup { _dir: dir, objects, source: source(), coverage: Arc::new(Mutex::new(coverage)) }
    }

    fn archiver(s: &Setup, owner: &str) -> Archiver {
        let cov = s.coverage.clone();
        let opts = ArchiverOptions {
            block: Duration::from_secs(3600),
            settle: Duration::from_secs(600),
            max_wait: Duration::from_secs(4 * 3600),
            owner: owner.into(),
            ..Default::default()
        };
        let writer = BlockWriter::new(s.objects.clone(), WriteOptions::default());
        Archiver::new(s.objects.clone(), writer, s.source.clone(), Arc::new(move || cov.lock().unwrap().clone()), opts)
    }

    fn ranges(r: &Round) -> Vec<(i64, i64)> {
        r.written.iter().map(|m| (m.min_time, m.max_time)).collect()
    }

    #[tokio::test]
    async fn complete_ranges_are_archived_once_and_read_back_whole() {
        let s = setup();
        // The stores say they hold five empty hours before the data.
        s.coverage.lock().unwrap().min_time = Some(T0 - 5 * HOUR + 1);
        let now = T0 + 7 * HOUR / 2 + 60_000;
        let first = archiver(&s, "a").round(now).await.unwrap();
        // The fourth hour has not ended (and settled): not yet.
        assert_eq!(ranges(&first), vec![(T0, T0 + HOUR), (T0 + HOUR, T0 + 2 * HOUR), (T0 + 2 * HOUR, T0 + 3 * HOUR)]);
        assert_eq!(first.written.iter().map(|m| m.samples).sum::<u64>(), 2 * 3 * 240);
        // A restart, or a second archiver: nothing written twice, and the progress record
        // spares them even a look at what is done.
        let progress = s.objects.get(&Path::from(PROGRESS)).await.unwrap().bytes().await.unwrap();
        let progress: Progress = serde_json::from_slice(&progress).unwrap();
        assert_eq!(progress.until, T0 + 3 * HOUR);
        for owner in ["a", "b"] {
            let again = archiver(&s, owner).round(now).await.unwrap();
            assert_eq!(again, Round::default());
        }
        // Without the record, the blocks themselves say what is done.
        s.objects.delete(&Path::from(PROGRESS)).await.unwrap();
        let again = archiver(&s, "c").round(now).await.unwrap();
        assert!(again.written.is_empty(), "{again:?}");
        assert_eq!(again.skipped, 3);
        // Claims are gone once the metas are up, and from the empty hours.
        let claims = crate::tests::objects_named(s.objects.as_ref(), "claim.json").await;
        assert!(claims.is_empty(), "{claims:?}");
        let store = ArchiveStore::new(s.objects.clone(), "t", ArchiveStoreOptions::default());
        let all = Matcher::new(strata_model::MatchOp::Regex, "__name__", ".+").unwrap();
        let got = store.select(&SelectRequest::new(vec![all.clone()], T0, T0 + 3 * HOUR - 1)).await.unwrap();
        let want = s.source.inner.select(&SelectRequest::new(vec![all], T0, T0 + 3 * HOUR - 1)).await.unwrap();
        let samples = |v: &[SeriesChunks]| -> Vec<(Labels, Vec<(i64, u64)>)> {
            v.iter()
                .map(|s| {
                    let pts = s.samples(i64::MIN, i64::MAX).unwrap().iter().map(|p| (p.t, p.v.to_bits())).collect();
                    (s.labels.clone(), pts)
                })
                .collect()
        };
        assert_eq!(samples(&got), samples(&want));
    }

    #[tokio::test]
    async fn a_store_that_does_not_answer_holds_ranges_back_until_max_wait_and_the_block_names_it() {
        let s = setup();
        s.coverage.lock().unwrap().missing = vec!["edge-b:10901".into()];
        let now = T0 + 7 * HOUR / 2 + 60_000;
        let a = archiver(&s, "a");
        let held = a.round(now).await.unwrap();
        assert!(held.written.is_empty());
        assert!(held.waiting.as_deref().is_some_and(|w| w.contains("edge-b:10901")), "{held:?}");
        // Four hours past its end, the first hour is written without the store, and says so.
        let later = a.round(T0 + 5 * HOUR + 1).await.unwrap();
        assert_eq!(ranges(&later), vec![(T0, T0 + HOUR)]);
        assert!(later.written[0].gaps.iter().any(|g| g.contains("edge-b:10901")), "{later:?}");
        let store = ArchiveStore::new(s.objects.clone(), "bucket", ArchiveStoreOptions::default());
        let all = Matcher::new(strata_model::MatchOp::Regex, "__name__", ".+").unwrap();
        let scope = QueryScope::new(true, true);
        let (got, scope) = scope
            .clone()
            .run(async move { (store.select(&SelectRequest::new(vec![all], T0, T0 + HOUR - 1)).await, scope) })
            .await;
        assert_eq!(got.unwrap().len(), 2);
        let warned = scope.warnings();
        assert!(warned.iter().any(|w| w.contains("may be incomplete") && w.contains("edge-b:10901")), "{warned:?}");
    }

    /// A regional's edge that is behind (the global's coverage names it) holds ranges
    /// back as a store that does not answer does, and a range written without it past
    /// `max_wait` names the edge in its gaps.
    #[tokio::test]
    async fn an_edge_behind_its_regional_holds_ranges_back_and_the_block_names_it() {
        let s = setup();
        let behind = "store regional:10901: sender {cluster=\"b\"} had sent everything only up to 1000 ms";
        {
            let mut c = s.coverage.lock().unwrap();
            c.complete_until = T0 + HOUR / 2;
            c.behind = Some(behind.into());
        }
        let a = archiver(&s, "a");
        let held = a.round(T0 + 7 * HOUR / 2 + 60_000).await.unwrap();
        assert!(held.written.is_empty(), "{held:?}");
        assert!(held.waiting.as_deref().is_some_and(|w| w.contains("cluster=\"b\"")), "{held:?}");
        let later = a.round(T0 + 5 * HOUR + 1).await.unwrap();
        assert_eq!(ranges(&later), vec![(T0, T0 + HOUR)]);
        assert!(later.written[0].gaps.iter().any(|g| g.contains(behind)), "{later:?}");
    }

    /// A range with no data passed as empty while a store did not answer leaves no block
    /// to say so: the progress record keeps it, and readers over it warn.
    #[tokio::test]
    async fn a_range_passed_as_empty_without_every_store_is_recorded_and_readers_say_so() {
        let s = setup();
        {
            let mut c = s.coverage.lock().unwrap();
            c.min_time = Some(T0 - 2 * HOUR);
            c.missing = vec!["edge-b:10901".into()];
        }
        let now = T0 + 5 * HOUR + 1;
        let r = archiver(&s, "a").round(now).await.unwrap();
        assert_eq!(ranges(&r), vec![(T0, T0 + HOUR)]);
        let record = read_progress_at(s.objects.as_ref(), &Path::from(PROGRESS)).await.unwrap().unwrap();
        assert_eq!(record.until, T0 + HOUR);
        // The two empty hours, for one reason: one gap.
        assert_eq!(record.gaps.len(), 1, "{record:?}");
        assert_eq!((record.gaps[0].start, record.gaps[0].end), (T0 - 2 * HOUR, T0));
        assert!(record.gaps[0].why.contains("edge-b:10901"), "{record:?}");
        // A restart keeps them, once.
        archiver(&s, "a").round(now).await.unwrap();
        let again = read_progress_at(s.objects.as_ref(), &Path::from(PROGRESS)).await.unwrap().unwrap();
        assert_eq!(again.gaps, record.gaps);

        let store = ArchiveStore::new(s.objects.clone(), "bucket", ArchiveStoreOptions::default());
        let all = || vec![Matcher::new(strata_model::MatchOp::Regex, "__name__", ".+").unwrap()];
        let scope = QueryScope::new(true, true);
        let got = scope.clone().run(store.select(&SelectRequest::new(all(), T0 - HOUR, T0 - 1))).await.unwrap();
        assert!(got.is_empty());
        let warned = scope.warnings();
        assert!(warned.iter().any(|w| w.contains("archived as empty") && w.contains("edge-b:10901")), "{warned:?}");
        let strict = QueryScope::new(false, true);
        let err = strict.run(store.label_names(&all(), T0 - HOUR, T0 - 1)).await.unwrap_err();
        assert!(matches!(&err, StoreError::Unavailable(m) if m.contains("archived as empty")), "{err:?}");
        // The archive's raw range (what a global plans with) is its blocks': a gap before
        // them does not make raw data look held there (gaps outlive raw retention).
        let raw = store.time_ranges().await.unwrap()[&0];
        assert!(raw.0 >= T0 && raw.1 == T0 + HOUR, "{raw:?}");
        // Before the gap, nothing is said about it.
        let scope = QueryScope::new(true, true);
        scope.clone().run(store.select(&SelectRequest::new(all(), T0 - 5 * HOUR, T0 - 3 * HOUR))).await.unwrap();
        assert!(scope.warnings().is_empty(), "{:?}", scope.warnings());
    }

    #[test]
    fn gaps_join_when_they_follow_and_stay_bounded() {
        let gap = |start: i64, why: &str| Gap { start, end: start + HOUR, why: why.into() };
        let mut gaps = Vec::new();
        add_gap(&mut gaps, gap(0, "a"));
        add_gap(&mut gaps, gap(HOUR, "a"));
        add_gap(&mut gaps, gap(2 * HOUR, "b"));
        assert_eq!(gaps, vec![Gap { start: 0, end: 2 * HOUR, why: "a".into() }, gap(2 * HOUR, "b")]);
        for k in 0..1000 {
            add_gap(&mut gaps, gap((4 + 2 * k) * HOUR, "c"));
        }
        assert_eq!(gaps.len(), MAX_GAPS);
        // The oldest merged: what they cover is still covered.
        assert_eq!(gaps[0].start, 0);
        assert_eq!(gaps.last().unwrap().end, (4 + 2 * 999) * HOUR + HOUR);
        assert!(gaps.windows(2).all(|w| w[0].end <= w[1].start));
        // The same gaps again (a second archiver's record), and one joined since: one list.
        let mut twice = gaps.clone();
        merge_gaps(&mut twice, gaps.clone());
        assert_eq!(twice, gaps);
        let joined = Gap { start: 0, end: 2 * HOUR, why: "a".into() };
        let mut one = vec![gap(0, "a")];
        merge_gaps(&mut one, vec![joined.clone()]);
        assert_eq!(one, vec![joined]);
        // A reason is cut, on a character.
        let mut long = Vec::new();
        add_gap(&mut long, Gap { start: 0, end: 1, why: "é".repeat(500) });
        assert!(long[0].why.len() <= MAX_WHY + 6 && long[0].why.ends_with("[cut]"));
    }

    /// A damaged gap is left out; the record, and its `until`, are still read.
    #[tokio::test]
    async fn a_record_with_damaged_gaps_still_reads() {
        let s = setup();
        let body = serde_json::json!({"until": T0, "owner": "a", "updated": 0, "gaps": [
            {"start": "soon", "end": 1, "why": "x"},
            {"start": 5, "end": 1, "why": "backwards"},
            {"start": 0, "end": 10, "why": "y".repeat(5000)},
        ]});
        s.objects.put(&Path::from(PROGRESS), body.to_string().into()).await.unwrap();
        assert_eq!(read_progress(s.objects.as_ref()).await.unwrap(), Some(T0));
        let record = read_progress_at(s.objects.as_ref(), &Path::from(PROGRESS)).await.unwrap().unwrap();
        assert_eq!(record.gaps.len(), 1);
        assert_eq!((record.gaps[0].start, record.gaps[0].end), (0, 10));
        assert!(record.gaps[0].why.len() < 300);
    }

    #[tokio::test]
    async fn another_archivers_live_claim_is_left_alone_and_a_stale_one_taken_over() {
        let s = setup();
        let now = T0 + 7 * HOUR / 2 + 60_000;
        let claim = block_dir(0, T0, T0 + HOUR).join("claim.json");
        let live = serde_json::json!({"owner": "b", "expires": now + 60_000}).to_string();
        s.objects.put(&claim, live.into()).await.unwrap();
        let a = archiver(&s, "a");
        let r = a.round(now).await.unwrap();
        assert!(r.written.is_empty(), "{r:?}");
        assert!(r.waiting.as_deref().is_some_and(|w| w.contains("another archiver")), "{r:?}");
        // b died: once its lease has run out, a takes the range over and goes on.
        let r = a.round(now + 120_000).await.unwrap();
        assert_eq!(ranges(&r).len(), 3, "{r:?}");
    }

    #[tokio::test]
    async fn failed_rounds_are_counted_and_make_the_archiver_unready_until_one_succeeds() {
        let s = setup();
        let a = archiver(&s, "a");
        s.source.failing.store(true, Ordering::Relaxed);
        let now = T0 + 7 * HOUR / 2 + 60_000;
        let mut waits = Vec::new();
        for _ in 0..3 {
            assert!(a.ready());
            let r = a.round(now).await;
            assert!(r.as_ref().is_err_and(|e| e.to_string().contains("store down")), "{r:?}");
            waits.push(a.record(&r));
        }
        assert!(!a.ready(), "three failures in a row");
        // The retries back off: 30 s, 60 s, 120 s.
        assert_eq!(waits, [30, 60, 120].map(Duration::from_secs));
        // Nothing half written is visible.
        assert!(crate::list_blocks(s.objects.as_ref()).await.unwrap().is_empty());
        s.source.failing.store(false, Ordering::Relaxed);
        let r = a.round(now).await;
        assert_eq!(r.as_ref().map(|r| r.written.len()).ok(), Some(3));
        assert_eq!(a.record(&r), Duration::from_secs(30));
        assert!(a.ready());
    }

    #[tokio::test]
    async fn a_store_claiming_data_from_the_epoch_costs_bounded_rounds() {
        let s = setup();
        s.coverage.lock().unwrap().min_time = Some(i64::MIN + 1);
        let now = T0 + 7 * HOUR / 2 + 60_000;
        let a = archiver(&s, "a");
        let r = a.round(now).await.unwrap();
        assert!(r.written.is_empty());
        assert!(r.waiting.as_deref().is_some_and(|w| w.contains("48 ranges")), "{r:?}");
        // From 35 days back, the empty hours move the record on, 48 a round.
        let from = (now - 35 * 24 * HOUR).div_euclid(HOUR) * HOUR;
        assert_eq!(read_progress(s.objects.as_ref()).await.unwrap(), Some(from + 48 * HOUR));
    }

    #[tokio::test]
    async fn a_read_with_warnings_is_not_archived_as_whole_and_past_max_wait_names_them() {
        let s = setup();
        s.source.warning.store(true, Ordering::Relaxed);
        let a = archiver(&s, "a");
        let err = a.round(T0 + 7 * HOUR / 2 + 60_000).await.unwrap_err();
        assert!(err.to_string().contains("read with warnings") && err.to_string().contains("edge-b"), "{err}");
        assert!(crate::list_blocks(s.objects.as_ref()).await.unwrap().is_empty());
        // The first hour overdue: written from what answered, the warning in its gaps;
        // the second, not overdue yet, fails the round again.
        assert!(a.round(T0 + 5 * HOUR + 1).await.is_err());
        // The raw block and its 5 m and 1 h aggregates, each naming the gap.
        let blocks = crate::list_blocks(s.objects.as_ref()).await.unwrap();
        assert_eq!(blocks.len(), 3);
        for (_, meta) in &blocks {
            let meta = meta.as_ref().unwrap();
            assert_eq!((meta.min_time, meta.max_time), (T0, T0 + HOUR));
            assert!(meta.gaps.iter().any(|g| g.contains("edge-b")), "{meta:?}");
        }
        assert_eq!(read_progress(s.objects.as_ref()).await.unwrap(), Some(T0 + HOUR));
    }

    #[tokio::test]
    async fn a_claim_from_a_clock_far_ahead_is_stale() {
        let s = setup();
        let now = T0 + 7 * HOUR / 2 + 60_000;
        let claim = block_dir(0, T0, T0 + HOUR).join("claim.json");
        let ahead = serde_json::json!({"owner": "b", "expires": now + 100 * HOUR}).to_string();
        s.objects.put(&claim, ahead.into()).await.unwrap();
        let r = archiver(&s, "a").round(now).await.unwrap();
        assert_eq!(ranges(&r).len(), 3, "{r:?}");
    }

    #[tokio::test]
    async fn an_archiver_killed_after_the_data_before_the_meta_leaves_a_range_written_once_later() {
        let s = setup();
        let now = T0 + 7 * HOUR / 2 + 60_000;
        // The first hour's files went up, then the archiver died: its claim and no meta.
        let writer = BlockWriter::new(s.objects.clone(), WriteOptions::default());
        writer.write_raw(s.source.as_ref(), T0, T0 + HOUR).await.unwrap().unwrap();
        s.objects.delete(&block_dir(0, T0, T0 + HOUR).join(META)).await.unwrap();
        let claim = block_dir(0, T0, T0 + HOUR).join("claim.json");
        let dead = serde_json::json!({"owner": "dead", "expires": now - 1}).to_string();
        s.objects.put(&claim, dead.into()).await.unwrap();
        assert!(crate::list_blocks(s.objects.as_ref()).await.unwrap().is_empty(), "no meta: no block");
        let r = archiver(&s, "a").round(now).await.unwrap();
        assert_eq!(ranges(&r).len(), 3, "{r:?}");
        // Three ranges, each a raw block and its 5 m and 1 h aggregates.
        let blocks = crate::list_blocks(s.objects.as_ref()).await.unwrap();
        assert_eq!(blocks.len(), 9);
        let widths: BTreeSet<i64> = blocks.iter().map(|(_, m)| m.as_ref().unwrap().resolution_ms).collect();
        assert_eq!(widths, BTreeSet::from([0, 300_000, 3_600_000]));
        for (dir, meta) in &blocks {
            let reader = crate::BlockReader::open(s.objects.clone(), dir.clone()).await.unwrap();
            reader.verify().await.unwrap();
            let meta = meta.as_ref().unwrap();
            match meta.resolution_ms {
                0 => assert_eq!(meta.samples, 2 * 240),
                _ => assert_eq!(meta.raw_samples, 2 * 240),
            }
        }
    }

    #[tokio::test]
    async fn a_day_block_counts_for_a_range_only_when_compaction_lists_it() {
        let s = setup();
        let now = T0 + 7 * HOUR / 2 + 60_000;
        // An import's day block over the same day: it lists nothing, so it stands for no
        // range of the archiver's.
        let writer = BlockWriter::new(s.objects.clone(), WriteOptions::default());
        writer.write_raw(s.source.as_ref(), T0, T0 + 24 * HOUR).await.unwrap().unwrap();
        let a = archiver(&s, "a");
        assert!(!a.archived(T0, T0 + HOUR).await.unwrap());
        assert_eq!(ranges(&a.round(now).await.unwrap()).len(), 3);
        // A compacted day block that lists the first hour does.
        let mut block =
            writer.encode_raw(s.source.as_ref(), T0, T0 + 24 * HOUR, Vec::new(), None).await.unwrap().unwrap();
        let first = block_dir(0, T0, T0 + HOUR);
        block.meta.compacted_from = vec![crate::meta::Source { dir: first.to_string(), samples: 480 }];
        writer.publish(block).await.unwrap();
        s.objects.delete(&first.join(META)).await.unwrap();
        assert!(a.archived(T0, T0 + HOUR).await.unwrap());
        assert!(a.archived(T0 + HOUR, T0 + 2 * HOUR).await.unwrap(), "its own block");
        s.objects.delete(&block_dir(0, T0 + HOUR, T0 + 2 * HOUR).join(META)).await.unwrap();
        assert!(!a.archived(T0 + HOUR, T0 + 2 * HOUR).await.unwrap());
    }
}
