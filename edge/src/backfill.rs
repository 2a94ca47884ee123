//! Backfill: the pages an edge's targets would have served over a past span, ingested by the
//! scrape pipeline itself ([`ScrapeIngest`]: target labels, `honor_labels`, metric
//! relabeling, limits, the report series) into the edge's data directory before the edge
//! starts. A simulator is a function of time, so what it would have served is known; going
//! through the same pipeline is what makes a backfilled series carry exactly the labels a
//! live scrape gives it, so that the day before and the minutes after are one series at every
//! tier. The edge then forwards the backfill upstream as it forwards any backlog.
//!
//! Only `static_configs` targets are backfilled (file SD describes the present, not the past).
//! The data directory must not be in use: the database's lock says so if it is.

use crate::config::EdgeConfig;
use crate::scrape::{scrape_offset, ScrapeError, ScrapeIngest};
use crate::server::{data_dir_of, tsdb_options, EdgeError, EdgeOptions};
use crate::targets::{build_targets, Target};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_ingest::exposition::Format;
use strata_tsdb::db::Tsdb;

/// What a backfill wrote.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BackfillReport {
    pub targets: usize,
    /// Pages ingested.
    pub pages: u64,
    /// Pages the source had none for, or that failed to ingest (recorded as `up` = 0, as a
    /// failed scrape is).
    pub failed: u64,
    /// Samples the database refused (out of order, a different value at a stored time,
    /// older than retention), as a live scrape counts them.
    pub refused: u64,
    /// Blocks cut from the backfill (the newest hours stay in the head, where live scrapes
    /// continue them).
    pub blocks: usize,
    /// The span's start: `from` raised to the edge's retention when it reached past it.
    pub from: i64,
}

/// Why a backfill stopped.
#[derive(Debug, thiserror::Error)]
pub enum BackfillError {
    #[error(transparent)]
    Edge(#[from] EdgeError),
    /// The database could not store a page: the backfill stops rather than record every
    /// later page as failed.
    #[error("backfill of {target}: storing the page at {ts}: {source}")]
    Storage {
        target: String,
        ts: i64,
        #[source]
        source: ScrapeError,
    },
}

/// Ingests, for each static target of the edge configured by `opts`, the page `page(target,
/// t)` at each of its scrape times in `[from, to)` (every `every`, by default the job's
/// interval, at the target's offset in it), oldest first, on `threads` threads. Each
/// target's pages go through one [`ScrapeIngest`], in time order, as its scrape loop's would.
/// A span reaching past the edge's retention starts at it (what is older would be refused, or
/// deleted at once).
///
/// The whole span is held in the head until the end, when what the head has moved past is
/// cut into blocks (cutting earlier would refuse the older pages of targets not done yet):
/// memory grows with the span times the targets' series.
pub fn backfill(
    opts: &EdgeOptions,
    (from, to): (i64, i64),
    every: Option<Duration>,
    threads: usize,
    page: impl Fn(&Target, i64) -> Option<String> + Sync,
) -> Result<BackfillReport, BackfillError> {
    let cfg = EdgeConfig::load(&opts.config_path).map_err(EdgeError::from)?;
    let data_dir = data_dir_of(opts, &cfg);
    let tsdb_opts = tsdb_options(&cfg);
    // A minute inside retention: the database's bound moves with its newest sample.
    let kept = i64::try_from(tsdb_opts.retention.as_millis()).unwrap_or(i64::MAX).saturating_sub(60_000);
    let from = if tsdb_opts.retention.is_zero() { from } else { from.max(to.saturating_sub(kept)) };
    let db =
        Arc::new(Tsdb::open(&data_dir, tsdb_opts).map_err(|source| EdgeError::Open { dir: data_dir.clone(), source })?);
    let mut work = Vec::new();
    for job in &cfg.jobs {
        let (targets, errors) = build_targets(job, &job.static_configs);
        for e in errors {
            tracing::warn!(job = %job.job_name, error = %e, "backfill: dropping target");
        }
        let job = Arc::new(job.clone());
        work.extend(targets.into_iter().map(|t| (t, job.clone())));
    }
    let pages = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    let refused = AtomicU64::new(0);
    let next = AtomicU64::new(0);
    let stopped: parking_lot::Mutex<Option<BackfillError>> = parking_lot::Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, work.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some((target, job)) = work.get(i) else { break };
                if stopped.lock().is_some() {
                    break;
                }
                let interval = every.unwrap_or(job.interval).max(Duration::from_millis(1));
                let mut ingest = ScrapeIngest::new(target.clone(), job.clone(), db.clone());
                // At the live scrapes' offset: with `every` a multiple of the job's
                // interval, the backfill's times are times a live scrape would have taken.
                for ts in scrape_times(from, to, interval, scrape_offset(target, job.interval)) {
                    let ok = match page(target, ts) {
                        Some(body) => match ingest.ingest(body.as_bytes(), Format::Text, ts, Duration::ZERO) {
                            Ok(r) => {
                                let n = r.out_of_order + r.duplicate_timestamp + r.out_of_bounds;
                                refused.fetch_add(n as u64, Ordering::Relaxed);
                                true
                            }
                            Err(e @ (ScrapeError::Storage(_) | ScrapeError::Head(_))) => {
                                let target = target.url.clone();
                                *stopped.lock() = Some(BackfillError::Storage { target, ts, source: e });
                                return;
                            }
                            Err(e) => {
                                tracing::warn!(target = %target.url, ts, error = %e, "backfill: page refused");
                                false
                            }
                        },
                        None => false,
                    };
                    pages.fetch_add(1, Ordering::Relaxed);
                    if !ok {
                        failed.fetch_add(1, Ordering::Relaxed);
                        if let Err(e) = ingest.fail(ts, Duration::ZERO) {
                            let target = target.url.clone();
                            *stopped.lock() = Some(BackfillError::Storage { target, ts, source: e });
                            return;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = stopped.into_inner() {
        return Err(e);
    }
    // Cut what the head has moved past, as the edge's maintenance would: the edge then starts
    // without replaying the whole span from its WAL.
    let blocks = db.cut_head_blocks().map_err(|source| EdgeError::Open { dir: data_dir.clone(), source })?;
    Ok(BackfillReport {
        targets: work.len(),
        pages: pages.into_inner(),
        failed: failed.into_inner(),
        refused: refused.into_inner(),
        blocks,
        from,
    })
}

/// The scrape times of a target in `[from, to)`: `offset` past each multiple of `interval`.
fn scrape_times(from: i64, to: i64, interval: Duration, offset: Duration) -> impl Iterator<Item = i64> {
    let step = (interval.as_millis() as i64).max(1);
    let offset = offset.as_millis() as i64 % step;
    let first = from.div_euclid(step).saturating_mul(step).saturating_add(offset);
    let first = if first < from { first.saturating_add(step) } else { first };
    (0..).map(move |k: i64| first.saturating_add(k.saturating_mul(step))).take_while(move |&t| t < to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_model::{is_stale, Labels, MatchOp, Matcher};
    use strata_store::{SelectRequest, Store};

    const HOUR: i64 = 3_600_000;

    /// What a live scrape of the same target gives: the target's labels, the job's metric
    /// relabeling and the page's conflicting label moved to `exported_`, plus `up`; two
    /// targets on two threads; a span longer than retention starts at retention.
    #[tokio::test]
    async fn a_backfilled_series_is_the_one_a_live_scrape_continues() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("edge.yml");
        std::fs::write(
            &cfg,
            "global:\n  scrape_interval: 5s\nscrape_configs:\n  - job_name: dcgm\n    static_configs:\n      \
             - targets: ['127.0.0.1:1', '127.0.0.1:2']\n        labels:\n          node: n1\n    \
             metric_relabel_configs:\n      - source_labels: [gpu]\n        target_label: card\n\
             strata:\n  retention: 4h\n",
        )
        .unwrap();
        let mut opts = EdgeOptions::new(cfg);
        opts.data_dir = Some(dir.path().join("data"));
        let (from, to) = (20 * HOUR, 25 * HOUR);
        // The source had nothing for the fourth hour: a failed scrape, as live.
        let gap = 23 * HOUR..24 * HOUR;
        let report = backfill(&opts, (from, to), None, 2, |t, ts| {
            assert!(t.url.starts_with("http://127.0.0.1:") && t.url.ends_with("/metrics"), "{}", t.url);
            (!gap.contains(&ts)).then(|| format!("# TYPE m gauge\nm{{gpu=\"0\",node=\"page\"}} {}\n", ts / 1000))
        })
        .unwrap();
        // Four hours of retention less a minute: 2,868 scrape times from 21:01.
        assert_eq!(report.from, 21 * HOUR + 60_000);
        let (per_target, gap_pages) = (2_868usize, 720usize);
        assert_eq!(
            (report.targets, report.pages, report.failed, report.refused),
            (2, 2 * per_target as u64, 2 * gap_pages as u64, 0)
        );
        assert!(report.blocks >= 1, "the older hours are cut into blocks: {report:?}");

        let db = Tsdb::open(&dir.path().join("data"), Default::default()).unwrap();
        let store = strata_tsdb::TsdbStore(Arc::new(db));
        let all = |name: &str| {
            SelectRequest::new(vec![Matcher::new(MatchOp::Equal, "__name__", name).unwrap()], i64::MIN, i64::MAX)
        };
        let m = store.select(&all("m")).await.unwrap();
        assert_eq!(m.len(), 2);
        let want = Labels::from_pairs([
            ("__name__", "m"),
            ("card", "0"),
            ("exported_node", "page"),
            ("gpu", "0"),
            ("instance", "127.0.0.1:1"),
            ("job", "dcgm"),
            ("node", "n1"),
        ]);
        assert_eq!(m[0].labels, want);
        for s in &m {
            let samples = s.samples(i64::MIN, i64::MAX).unwrap();
            let stale = samples.iter().filter(|s| is_stale(s.v)).count();
            assert_eq!((samples.len() - stale, stale), (per_target - gap_pages, 1), "one staleness marker at the gap");
            assert!(samples.iter().all(|s| s.t >= report.from && s.t < to));
            assert!(samples.iter().filter(|s| !is_stale(s.v)).all(|s| s.v == (s.t / 1000) as f64));
        }
        let up = store.select(&all("up")).await.unwrap();
        let up = up[0].samples(i64::MIN, i64::MAX).unwrap();
        assert_eq!(up.iter().filter(|s| s.v == 0.0).count(), gap_pages);
    }

    #[test]
    fn scrape_times_keep_the_live_cadence_inside_the_span() {
        let t: Vec<i64> = scrape_times(10_000, 30_000, Duration::from_secs(5), Duration::from_millis(1_200)).collect();
        assert_eq!(t, vec![11_200, 16_200, 21_200, 26_200]);
        let t: Vec<i64> = scrape_times(11_200, 16_200, Duration::from_secs(5), Duration::from_millis(1_200)).collect();
        assert_eq!(t, vec![11_200], "from is inclusive, to exclusive");
        assert_eq!(scrape_times(0, 0, Duration::from_secs(5), Duration::ZERO).count(), 0);
    }
}
