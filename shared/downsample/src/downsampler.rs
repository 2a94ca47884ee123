//! The loop's one step: which slices of which resolution are due, and computing them from
//! a source store (a regional's own storage seen through its replica dedup, so each
//! series is aggregated once, without its replica labels, with its scraped type).
//!
//! A slice `(a, b]` is due once every sender heard from lately has sent samples past `b`,
//! or `max_delay` after `b` whatever they did (a sender that went silent is waited for no
//! longer). Slices late data touched are computed again first; then the next one after
//! the frontier. Each run does a bounded number of slices.

use crate::blocks::{AggregateBlocks, AggregateError, SeriesWindows};
use crate::progress::{Progress, Slicing};
use crate::window::windows_of;
use crate::window_cache::WindowCache;
use crate::{Kept, FIVE_MINUTES, ONE_HOUR};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use strata_chunk::Chunk;
use strata_model::{Labels, MatchOp, Matcher};
use strata_store::{SelectLimits, SelectRequest, Store, StoreError};

/// How a regional downsamples.
#[derive(Debug, Clone)]
pub struct DownsampleOptions {
    /// Wait at most this long after a slice ends for silent senders.
    pub max_delay: Duration,
    /// The aggregates kept only when asked for.
    pub asked: crate::Asked,
    /// How long aggregates are kept, per resolution (5 m, 1 h).
    pub retention_5m: Duration,
    pub retention_1h: Duration,
    /// Slices computed per run at most.
    pub slices_per_run: usize,
    /// The block readers' cache of aggregate chunks (encoded).
    pub cache_bytes: usize,
    /// Decoded windows kept for the queries to come ([`crate::window_cache::WindowCache`]).
    pub window_cache_bytes: usize,
}

impl Default for DownsampleOptions {
    fn default() -> Self {
        DownsampleOptions {
            max_delay: Duration::from_secs(15 * 60),
            asked: crate::Asked::default(),
            retention_5m: Duration::from_secs(90 * 86400),
            retention_1h: Duration::from_secs(730 * 86400),
            slices_per_run: 24,
            cache_bytes: 64 << 20,
            window_cache_bytes: crate::window_cache::DEFAULT_WINDOW_CACHE_BYTES,
        }
    }
}

const DAY: i64 = 24 * ONE_HOUR;

/// 5 m windows two hours at a time; 1 h windows six hours at a time.
pub const SLICINGS: [Slicing; 2] =
    [Slicing { width: FIVE_MINUTES, slice: 2 * ONE_HOUR }, Slicing { width: ONE_HOUR, slice: 6 * ONE_HOUR }];

#[derive(Debug, thiserror::Error)]
pub enum DownsampleError {
    #[error("reading the source: {0}")]
    Source(#[from] StoreError),
    #[error(transparent)]
    Aggregates(#[from] AggregateError),
    #[error("progress file: {0}")]
    Progress(#[from] std::io::Error),
    #[error("decoding {series}: {reason}")]
    Decode { series: String, reason: String },
    #[error("a downsampling task failed: {0}")]
    Task(String),
}

/// What one run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    /// (width, slice start) of each slice written.
    pub written: Vec<(i64, i64)>,
    pub series: usize,
    pub windows: usize,
}

pub struct Downsampler {
    resolutions: Vec<(Slicing, Arc<AggregateBlocks>)>,
    progress: Arc<Progress>,
    opts: DownsampleOptions,
}

impl Downsampler {
    /// The aggregates under `dir` (`5m/`, `1h/`, `progress.json`).
    pub fn open(dir: &Path, opts: DownsampleOptions) -> Result<Downsampler, DownsampleError> {
        let mut resolutions = Vec::new();
        // One for both resolutions: what is read most gets the room.
        let cache = Arc::new(WindowCache::new(opts.window_cache_bytes));
        for sl in SLICINGS {
            let sub = dir.join(if sl.width == FIVE_MINUTES { "5m" } else { "1h" });
            let blocks = AggregateBlocks::open(&sub, sl.width, opts.cache_bytes / 2)?.with_window_cache(cache.clone());
            resolutions.push((sl, Arc::new(blocks)));
        }
        let progress = Arc::new(Progress::open(dir, SLICINGS.to_vec())?);
        Ok(Downsampler { resolutions, progress, opts })
    }

    /// The oldest time any resolution's blocks cover, damaged ones included; `None` when
    /// a damaged block's range is unknown.
    pub fn oldest_held(&self) -> Option<i64> {
        self.resolutions.iter().try_fold(i64::MAX, |oldest, (_, b)| Some(oldest.min(b.oldest_held()?)))
    }

    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// The blocks of windows `width` wide.
    pub fn blocks(&self, width: i64) -> Option<Arc<AggregateBlocks>> {
        self.resolutions.iter().find(|(s, _)| s.width == width).map(|(_, b)| b.clone())
    }

    /// Per resolution, the sample times its aggregates cover completely and currently
    /// (see `Progress::complete_until`): `(width, first, last)`, inclusive ms, for those
    /// that have any.
    pub fn coverage_of(&self, width: i64) -> Option<(i64, i64, i64)> {
        self.coverage().into_iter().find(|c| c.0 == width)
    }

    /// The aggregates kept only when asked for, as configured (chunks written under another
    /// configuration may keep more or less).
    pub fn asked(&self) -> crate::Asked {
        self.opts.asked
    }

    pub fn coverage(&self) -> Vec<(i64, i64, i64)> {
        self.resolutions
            .iter()
            .filter_map(|(sl, b)| {
                let last = self.progress.complete_until(sl.width, self.opts.max_delay.as_millis() as u64)?;
                let first = b.min_time();
                (first <= last).then_some((sl.width, first, last))
            })
            .collect()
    }

    /// Computes what is due at `now` (ms) from `source`, whose oldest sample is at
    /// `oldest` (where the first slice starts).
    pub async fn run(&self, source: &dyn Store, oldest: Option<i64>, now: i64) -> Result<RunOutcome, DownsampleError> {
        let mut out = RunOutcome::default();
        let delay = i64::try_from(self.opts.max_delay.as_millis()).unwrap_or(i64::MAX);
        for (sl, blocks) in &self.resolutions {
            let mut todo: Vec<i64> = self.progress.dirty(sl.width);
            if self.progress.frontier(sl.width).is_none() {
                match oldest {
                    Some(t) => self.progress.start_at(sl.width, sl.slice_of(t)),
                    None => continue,
                }
            }
            let mut next = self.progress.frontier(sl.width).unwrap_or(i64::MAX);
            while todo.len() < self.opts.slices_per_run {
                let end = next.saturating_add(sl.slice);
                let due = end <= now
                    && (self.progress.senders_past(end, self.opts.max_delay.as_millis() as u64)
                        || now >= end.saturating_add(delay));
                if !due {
                    break;
                }
                todo.push(next);
                next = end;
            }
            for a in todo.into_iter().take(self.opts.slices_per_run) {
                let b = a + sl.slice;
                self.progress.begin(sl.width, a, b);
                match self.slice(source, blocks, *sl, (a, b)).await {
                    Ok((series, windows)) => {
                        let (progress, sl) = (self.progress.clone(), *sl);
                        tokio::task::spawn_blocking(move || progress.done(sl, a))
                            .await
                            .map_err(|e| DownsampleError::Task(e.to_string()))??;
                        out.written.push((sl.width, a));
                        out.series += series;
                        out.windows += windows;
                    }
                    Err(e) => {
                        self.progress.abandon(sl.width);
                        return Err(e);
                    }
                }
            }
            self.compact_days(*sl, blocks).await?;
            let keep = if sl.width == FIVE_MINUTES { self.opts.retention_5m } else { self.opts.retention_1h };
            let keep = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
            let blocks = blocks.clone();
            tokio::task::spawn_blocking(move || blocks.delete_before(now.saturating_sub(keep)))
                .await
                .map_err(|e| DownsampleError::Task(e.to_string()))??;
        }
        Ok(out)
    }

    /// Merges each day's slices into one block once the day is computed and nothing in it
    /// waits to be computed again (the last month is looked at): a chunk per series and
    /// day holds its columns' headers once instead of twelve times, and a query reads one
    /// block instead of twelve.
    async fn compact_days(&self, sl: Slicing, blocks: &Arc<AggregateBlocks>) -> Result<(), DownsampleError> {
        let Some(frontier) = self.progress.frontier(sl.width) else { return Ok(()) };
        let dirty = self.progress.dirty(sl.width);
        let last_day = frontier.div_euclid(DAY) * DAY;
        let mut day = (last_day - 30 * DAY).max(blocks.min_time().saturating_sub(1).div_euclid(DAY) * DAY);
        while day < last_day {
            let end = day + DAY;
            if !dirty.iter().any(|&a| a >= day && a < end) {
                let b = blocks.clone();
                tokio::task::spawn_blocking(move || b.compact((day, end)))
                    .await
                    .map_err(|e| DownsampleError::Task(e.to_string()))??;
            }
            day = end;
        }
        Ok(())
    }

    /// Computes and writes one slice; (series, windows) written.
    async fn slice(
        &self,
        source: &dyn Store,
        blocks: &Arc<AggregateBlocks>,
        sl: Slicing,
        (a, b): (i64, i64),
    ) -> Result<(usize, usize), DownsampleError> {
        // A family at a time, each series' windows encoded as soon as they are computed:
        // what is held at once is the largest family's windows and every family's chunks.
        let names = source.label_values("__name__", &[], a + 1, b).await?;
        let metadata = source.metadata(None).await?;
        let mut chunks: Vec<(Labels, Chunk)> = Vec::new();
        let (mut series, mut windows) = (0, 0);
        for name in names {
            let m = Matcher::new(MatchOp::Equal, "__name__", &name)
                .map_err(|e| StoreError::InvalidRequest(e.to_string()))?;
            let mut req = SelectRequest::new(vec![m], a + 1, b);
            req.limits = SelectLimits { max_series: 50_000_000, max_samples: u64::MAX };
            let found = source.select(&req).await?;
            let (asked, family_blocks) = (self.opts.asked, blocks.clone());
            // Decoding, windowing and encoding are CPU work: off the async threads.
            series += found.len();
            let done =
                tokio::task::spawn_blocking(move || -> Result<(Vec<(Labels, Chunk)>, usize), DownsampleError> {
                    let mut out = Vec::with_capacity(found.len());
                    let mut windows = 0;
                    for s in found {
                        let samples = s.samples(a + 1, b).map_err(|e| DownsampleError::Decode {
                            series: s.labels.to_string(),
                            reason: e.to_string(),
                        })?;
                        let kept = Kept::of(s.metric_type, asked);
                        let w = SeriesWindows {
                            labels: s.labels,
                            metric_type: s.metric_type,
                            kept,
                            windows: windows_of(&samples, sl.width),
                        };
                        if !w.windows.is_empty() {
                            windows += w.windows.len();
                            let c = family_blocks.chunk(&w);
                            out.push((w.labels, c));
                        }
                    }
                    Ok((out, windows))
                })
                .await
                .map_err(|e| DownsampleError::Task(e.to_string()))??;
            windows += done.1;
            chunks.extend(done.0);
        }
        // The block writer wants label order, which `__name__` does not give.
        chunks.sort_by(|x, y| x.0.cmp(&y.0));
        let blocks = blocks.clone();
        tokio::task::spawn_blocking(move || blocks.write_slice((a, b), chunks, metadata))
            .await
            .map_err(|e| DownsampleError::Task(e.to_string()))??;
        Ok((series, windows))
    }
}
