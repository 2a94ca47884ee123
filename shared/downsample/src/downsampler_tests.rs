//! The downsampler over a real database seen through the replica dedup, and the answers
//! its aggregates give against the engine over the same deduplicated raw data.

use crate::answer::answer;
use crate::downsampler::{DownsampleOptions, Downsampler};
use crate::{FIVE_MINUTES, ONE_HOUR};

const DAY: i64 = 24 * ONE_HOUR;
use std::sync::Arc;
use strata_dedup::ReplicaDedup;
use strata_model::{Labels, MatchOp, Matcher, Metadata, MetricType, Sample};
use strata_promql::{Engine, EngineOptions, QueryValue};
use strata_store::{StepsRequest, Store};
use strata_tsdb::db::{Tsdb, TsdbOptions};
use strata_tsdb::TsdbStore;

struct Setup {
    _dir: tempfile::TempDir,
    db: Arc<Tsdb>,
    dedup: ReplicaDedup,
    down: Downsampler,
    /// The first slice's start, aligned to six hours.
    t0: i64,
}

/// Six hours that end before today's midnight whatever the time of day, so that no day is
/// complete and the slices stay as computed.
fn setup() -> Setup {
    let today = strata_model::time::now_ms().div_euclid(DAY) * DAY;
    setup_at(today - DAY + 6 * ONE_HOUR)
}

fn setup_at(t0: i64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(Tsdb::open(&dir.path().join("db"), TsdbOptions::default()).unwrap());
    db.set_metadata("gpu_energy_total", Metadata { metric_type: MetricType::Counter, ..Default::default() }).unwrap();
    db.set_metadata("gpu_temp", Metadata { metric_type: MetricType::Gauge, ..Default::default() }).unwrap();
    let dedup = ReplicaDedup::new(Arc::new(TsdbStore(db.clone())), vec!["replica".into()]);
    let opts = DownsampleOptions { max_delay: std::time::Duration::from_secs(60), ..Default::default() };
    let down = Downsampler::open(&dir.path().join("downsample"), opts).unwrap();
    Setup { _dir: dir, db, dedup, down, t0 }
}

fn labels(name: &str, replica: &str) -> Labels {
    Labels::from_pairs([("__name__", name), ("gpu", "0"), ("replica", replica)])
}

/// Samples every 15 s with a replica's jitter, `[from, to)`.
fn write(db: &Tsdb, l: &Labels, from: i64, to: i64, jitter: i64, value: impl Fn(i64) -> f64) {
    let s = db.series(l).unwrap();
    let batch: Vec<_> = (from / 15_000..to / 15_000)
        .map(|i| i * 15_000 + jitter)
        .filter(|t| *t >= from && *t < to)
        .map(|t| (s.clone(), Sample::new(t, value(t))))
        .collect();
    let out = db.commit(&batch).unwrap();
    assert!(out.rejected.is_empty(), "{:?}", out.rejected.first());
}

fn energy(t: i64) -> f64 {
    ((t / 1000) * 300 % 9_000_000) as f64
}

fn temp(t: i64) -> f64 {
    40.0 + ((t / 15_000) * 7919 % 23) as f64
}

/// The engine's answer over the deduplicated raw data, one value per step, per series.
async fn raw(store: &dyn Store, query: &str, start: i64, end: i64, step: i64) -> Vec<(Labels, Vec<Option<f64>>)> {
    let engine = Engine::new(EngineOptions { pushdown: false, ..Default::default() });
    let expr = strata_promql::parse(query).unwrap();
    let QueryValue::Matrix(m) = engine.range(store, &expr, start, end, step).await.unwrap() else { panic!() };
    let n = ((end - start) / step + 1) as usize;
    m.into_iter()
        .map(|s| {
            let mut v = vec![None; n];
            for (t, x) in s.points {
                v[((t - start) / step) as usize] = Some(x);
            }
            (s.labels, v)
        })
        .collect()
}

/// The aggregates' answer, labels as the engine shows them (the name dropped by functions).
fn from_aggregates(
    d: &Downsampler,
    width: i64,
    function: Option<(&str, i64)>,
    name: &str,
    grid: (i64, i64, i64),
) -> Vec<(Labels, Vec<Option<f64>>)> {
    let m = Matcher::new(MatchOp::Equal, "__name__", name).unwrap();
    let mut req = StepsRequest::new(vec![m], grid, 300_000);
    req.function = function.map(|(f, r)| (f.to_string(), r));
    let steps = answer(&d.blocks(width).unwrap(), &req).unwrap();
    steps
        .series
        .into_iter()
        .map(|s| {
            let l = if s.name_dropped {
                let mut b = s.labels.to_builder();
                b.del("__name__");
                b.build()
            } else {
                s.labels
            };
            (l, s.values.to_options())
        })
        .collect()
}

fn assert_close(what: &str, a: &[(Labels, Vec<Option<f64>>)], b: &[(Labels, Vec<Option<f64>>)]) {
    assert_eq!(a.len(), b.len(), "{what}: series");
    for ((la, va), (lb, vb)) in a.iter().zip(b) {
        assert_eq!(la, lb, "{what}");
        for (i, (x, y)) in va.iter().zip(vb).enumerate() {
            let ok = match (x, y) {
                (Some(x), Some(y)) => (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
                (None, None) => true,
                _ => false,
            };
            assert!(ok, "{what} {la} step {i}: raw {x:?}, aggregates {y:?}");
        }
    }
    assert!(a.iter().flat_map(|s| &s.1).filter(|x| x.is_some()).count() >= 5, "{what}: too few values to compare");
}

/// Every slice's aggregates against the engine over the same slice of the deduplicated raw
/// data (the dedup chooses its replica over what it is asked for, so the raw side is asked
/// for what the downsampler read).
async fn compare_all(s: &Setup, from: i64, to: i64) {
    for (width, slice) in [(FIVE_MINUTES, 2 * ONE_HOUR), (ONE_HOUR, 6 * ONE_HOUR)] {
        for a in (from..to).step_by(slice as usize) {
            let grid = (a + width, a + slice, width);
            for (f, name) in [
                (Some(("rate", width)), "gpu_energy_total"),
                (Some(("increase", width)), "gpu_energy_total"),
                (Some(("count_over_time", width)), "gpu_temp"),
                (Some(("avg_over_time", width)), "gpu_temp"),
                (Some(("max_over_time", width)), "gpu_temp"),
                (Some(("stddev_over_time", width)), "gpu_temp"),
                (None, "gpu_temp"),
            ] {
                let query = match f {
                    Some((f, r)) => format!("{f}({name}[{r}ms])"),
                    None => name.to_string(),
                };
                let want = raw(&s.dedup, &query, grid.0, grid.1, grid.2).await;
                let got = from_aggregates(&s.down, width, f, name, grid);
                assert_close(&query, &want, &got);
            }
        }
    }
}

/// A grid over several slices' blocks answers what the slices' grids answer one by one:
/// the blocks' windows are joined (from the decoded-window cache, which the slices'
/// queries filled first).
fn assert_joined(s: &Setup, from: i64, to: i64) {
    let (width, slice) = (FIVE_MINUTES, 2 * ONE_HOUR);
    for (f, name) in [
        (Some(("rate", width)), "gpu_energy_total"),
        (Some(("max_over_time", width)), "gpu_temp"),
        (Some(("stddev_over_time", width)), "gpu_temp"),
        (None, "gpu_temp"),
    ] {
        let mut joined: Vec<(Labels, Vec<Option<u64>>)> = Vec::new();
        for a in (from..to).step_by(slice as usize) {
            for (i, (l, v)) in
                from_aggregates(&s.down, width, f, name, (a + width, a + slice, width)).into_iter().enumerate()
            {
                if joined.len() <= i {
                    joined.push((l.clone(), Vec::new()));
                }
                assert_eq!(joined[i].0, l);
                joined[i].1.extend(v.iter().map(|x| x.map(f64::to_bits)));
            }
        }
        let whole: Vec<(Labels, Vec<Option<u64>>)> =
            from_aggregates(&s.down, width, f, name, (from + width, to, width))
                .into_iter()
                .map(|(l, v)| (l, v.iter().map(|x| x.map(f64::to_bits)).collect()))
                .collect();
        assert_eq!(whole, joined, "{f:?} {name} over ({from}, {to}]");
    }
    let (entries, bytes) = s.down.blocks(width).unwrap().window_cache().expect("a cache by default").held();
    assert!(entries > 0 && bytes > 0, "decoded windows are kept");
}

/// One replica's worth of samples in every 5 m window that has any: the pair is counted
/// once, and where one replica died the other fills in.
fn assert_counted_once(s: &Setup, from: i64, to: i64) {
    let counts = from_aggregates(
        &s.down,
        FIVE_MINUTES,
        Some(("count_over_time", FIVE_MINUTES)),
        "gpu_temp",
        (from + FIVE_MINUTES, to, FIVE_MINUTES),
    );
    assert_eq!(counts.len(), 1);
    assert!(counts[0].1.iter().all(|c| *c == Some(20.0)), "{:?}", counts[0].1);
}

#[tokio::test]
async fn aggregates_of_an_ha_pair_equal_the_deduplicated_raw_answer_with_a_replica_killed_mid_window() {
    let s = setup();
    let end = s.t0 + 6 * ONE_HOUR;
    for (name, f) in [("gpu_energy_total", energy as fn(i64) -> f64), ("gpu_temp", temp)] {
        write(&s.db, &labels(name, "a"), s.t0 - ONE_HOUR, end, 17, f);
        // Replica b dies 2 h 7 min 30 s in: in the middle of a 5 m window.
        write(&s.db, &labels(name, "b"), s.t0 - ONE_HOUR, s.t0 + 2 * ONE_HOUR + 450_000, 4_031, f);
    }
    let now = end + 2 * ONE_HOUR;
    let out = s.down.run(&s.dedup, Some(s.t0 + 1), now).await.unwrap();
    assert_eq!(out.written.len(), 3 + 1, "three 2 h slices and one 6 h slice: {:?}", out.written);
    assert_eq!(out.series, 2 * 4, "one aggregated series per deduplicated series and slice");
    let cov = s.down.coverage();
    assert!(cov.contains(&(FIVE_MINUTES, s.t0 + 1, end)), "{cov:?}");
    compare_all(&s, s.t0, end).await;
    assert_counted_once(&s, s.t0, end);
    // Nothing more is due until time passes.
    assert!(s.down.run(&s.dedup, Some(s.t0 + 1), now).await.unwrap().written.is_empty());
}

#[tokio::test]
async fn a_backlog_arriving_after_its_windows_were_computed_recomputes_them() {
    let s = setup();
    let end = s.t0 + 6 * ONE_HOUR;
    let gap = (s.t0 + ONE_HOUR + 100_000, s.t0 + 3 * ONE_HOUR);
    let both = [("gpu_energy_total", energy as fn(i64) -> f64), ("gpu_temp", temp)];
    for (name, f) in both {
        // Replica a lost two hours of scrapes; replica b was cut off from the regional.
        write(&s.db, &labels(name, "a"), s.t0, gap.0, 17, f);
        write(&s.db, &labels(name, "a"), gap.1, end, 17, f);
    }
    let now = end + 2 * ONE_HOUR;
    s.down.run(&s.dedup, Some(s.t0 + 1), now).await.unwrap();
    // Queried before the backlog: what the cache keeps of these blocks must not answer
    // once their slices are computed again.
    for (f, name) in
        [(Some(("rate", FIVE_MINUTES)), "gpu_energy_total"), (Some(("avg_over_time", FIVE_MINUTES)), "gpu_temp")]
    {
        let before = from_aggregates(&s.down, FIVE_MINUTES, f, name, (s.t0 + FIVE_MINUTES, end, FIVE_MINUTES));
        assert!(before.iter().all(|(_, v)| v.iter().any(Option::is_none)), "the gap shows before the backlog");
    }
    // Replica b's backlog is stored, and the receiver says so before acknowledging it.
    for (name, f) in both {
        write(&s.db, &labels(name, "b"), s.t0, end, 4_031, f);
    }
    s.down.progress().arrived("edge-b", s.t0 + 4_031, end, i64::MIN).unwrap();
    let dirty = s.down.progress().dirty(FIVE_MINUTES);
    assert_eq!(dirty, vec![s.t0, s.t0 + 2 * ONE_HOUR, s.t0 + 4 * ONE_HOUR]);
    let again = s.down.run(&s.dedup, Some(s.t0 + 1), now).await.unwrap();
    assert_eq!(again.written.len(), 4, "{:?}", again.written);
    assert!(s.down.progress().dirty(FIVE_MINUTES).is_empty());
    compare_all(&s, s.t0, end).await;
    assert_counted_once(&s, s.t0, end);
    assert_joined(&s, s.t0, end);
}

#[tokio::test]
async fn a_range_not_computed_is_an_error_not_a_short_answer() {
    let s = setup();
    let end = s.t0 + 6 * ONE_HOUR;
    write(&s.db, &labels("gpu_temp", "a"), s.t0, end, 17, temp);
    // Only the first 2 h slice is due: the sender has not got further.
    s.down.progress().arrived("edge-a", s.t0, s.t0 + 2 * ONE_HOUR, i64::MIN).unwrap();
    let out = s.down.run(&s.dedup, Some(s.t0 + 1), s.t0 + 2 * ONE_HOUR + 60_000).await.unwrap();
    assert_eq!(out.written, vec![(FIVE_MINUTES, s.t0)]);
    let m = Matcher::new(MatchOp::Equal, "__name__", "gpu_temp").unwrap();
    let mut req = StepsRequest::new(vec![m], (s.t0 + FIVE_MINUTES, s.t0 + 3 * ONE_HOUR, FIVE_MINUTES), 300_000);
    req.function = Some(("avg_over_time".into(), FIVE_MINUTES));
    let blocks = s.down.blocks(FIVE_MINUTES).unwrap();
    assert!(answer(&blocks, &req).is_err(), "past what was computed");
    req.end = s.t0 + 2 * ONE_HOUR;
    assert!(answer(&blocks, &req).is_ok());
    // A quantile does not decompose.
    req.function = Some(("quantile_over_time".into(), FIVE_MINUTES));
    assert!(answer(&blocks, &req).is_err());
}

#[tokio::test]
async fn merged_slices_answer_the_same_and_a_slice_computed_again_wins_over_its_day() {
    let s = setup();
    let end = s.t0 + 6 * ONE_HOUR;
    let both = [("gpu_energy_total", energy as fn(i64) -> f64), ("gpu_temp", temp)];
    let gap = (s.t0 + 2 * ONE_HOUR + 100_000, s.t0 + 3 * ONE_HOUR);
    for (name, f) in both {
        write(&s.db, &labels(name, "a"), s.t0, gap.0, 17, f);
        write(&s.db, &labels(name, "a"), gap.1, end, 17, f);
    }
    let now = end + 2 * ONE_HOUR;
    s.down.run(&s.dedup, Some(s.t0 + 1), now).await.unwrap();
    let blocks = s.down.blocks(FIVE_MINUTES).unwrap();
    compare_all(&s, s.t0, end).await;
    let cache = blocks.window_cache().expect("a cache by default");
    let held = cache.held();
    assert!(blocks.compact((s.t0, end)).unwrap(), "three slices merged");
    // The slices' blocks are gone, and what the cache held of them with them.
    assert!(cache.held().0 < held.0 && cache.held().1 < held.1, "{held:?} then {:?}", cache.held());
    assert!(!blocks.compact((s.t0, end)).unwrap(), "one block left: nothing to merge");
    compare_all(&s, s.t0, end).await;
    // Replica b's backlog fills the gap: its slices are computed again beside the merged
    // block.
    for (name, f) in both {
        write(&s.db, &labels(name, "b"), s.t0, end, 4_031, f);
    }
    s.down.progress().arrived("edge-b", s.t0 + 4_031, end, i64::MIN).unwrap();
    s.down.run(&s.dedup, Some(s.t0 + 1), now).await.unwrap();
    compare_all(&s, s.t0, end).await;
    assert_counted_once(&s, s.t0, end);
    assert!(blocks.compact((s.t0, end)).unwrap(), "the slice merged in again");
    compare_all(&s, s.t0, end).await;
    assert_counted_once(&s, s.t0, end);
}

#[tokio::test]
async fn a_day_completed_is_merged_and_still_covers_only_what_was_computed() {
    // The source begins at 18:00 yesterday: the run that reaches midnight completes the day
    // and merges its slices, whose windows start at 18:00, not at the day's start.
    let today = strata_model::time::now_ms().div_euclid(DAY) * DAY;
    let s = setup_at(today - 6 * ONE_HOUR);
    let end = s.t0 + 6 * ONE_HOUR;
    for (name, f) in [("gpu_energy_total", energy as fn(i64) -> f64), ("gpu_temp", temp)] {
        write(&s.db, &labels(name, "a"), s.t0, end, 17, f);
    }
    let out = s.down.run(&s.dedup, Some(s.t0 + 1), end + 2 * ONE_HOUR).await.unwrap();
    assert_eq!(out.written.len(), 3 + 1, "{:?}", out.written);
    let five = s.down.blocks(FIVE_MINUTES).unwrap();
    assert!(!five.compact((today - DAY, today)).unwrap(), "the day's three slices were merged into one block");
    assert_eq!(five.min_time(), s.t0 + 1, "the merged block starts where its first slice did");
    let cov = s.down.coverage();
    assert!(cov.contains(&(FIVE_MINUTES, s.t0 + 1, end)), "{cov:?}");
    assert!(cov.contains(&(ONE_HOUR, s.t0 + 1, end)), "{cov:?}");
    // Before the source began nothing was computed: an error, not an empty answer.
    let m = Matcher::new(MatchOp::Equal, "__name__", "gpu_temp").unwrap();
    let mut req = StepsRequest::new(vec![m], (s.t0 - ONE_HOUR, s.t0 + ONE_HOUR, FIVE_MINUTES), 300_000);
    req.function = Some(("avg_over_time".into(), FIVE_MINUTES));
    assert!(answer(&five, &req).is_err(), "windows before the first slice were never computed");
    compare_all(&s, s.t0, end).await;
}

/// What a regional claims empty before its first window rests on this: a damaged block
/// counts, and one whose range cannot be read leaves nothing claimable.
#[tokio::test]
async fn the_oldest_time_held_counts_every_block_and_is_unknown_with_an_unreadable_one() {
    let s = setup();
    let end = s.t0 + 6 * ONE_HOUR;
    write(&s.db, &labels("gpu_temp", "a"), s.t0, end, 17, temp);
    s.down.run(&s.dedup, Some(s.t0 + 1), end + 2 * ONE_HOUR).await.unwrap();
    assert_eq!(s.down.oldest_held(), Some(s.t0 + 1), "the first slice's block starts just after t0");
    let blocks = s._dir.path().join("downsample").join("5m").join(strata_tsdb::blocks::BLOCKS_DIR);
    let junk = blocks.join("01JUNKJUNKJUNKJUNKJUNKJUNK");
    std::fs::create_dir_all(&junk).unwrap();
    std::fs::write(junk.join("meta.json"), b"{not json").unwrap();
    let opts = DownsampleOptions { max_delay: std::time::Duration::from_secs(60), ..Default::default() };
    let reopened = Downsampler::open(&s._dir.path().join("downsample"), opts).unwrap();
    assert_eq!(reopened.oldest_held(), None);
}

/// Retention per resolution: past its own, a resolution's blocks go and its coverage with
/// them, while the longer-kept 1 h windows of the same times stay and still answer.
#[tokio::test]
async fn each_resolution_is_kept_for_its_own_retention() {
    let today = strata_model::time::now_ms().div_euclid(DAY) * DAY;
    let t0 = today - 2 * DAY;
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(Tsdb::open(&dir.path().join("db"), TsdbOptions::default()).unwrap());
    db.set_metadata("gpu_temp", Metadata { metric_type: MetricType::Gauge, ..Default::default() }).unwrap();
    write(&db, &labels("gpu_temp", "a"), t0, t0 + 6 * ONE_HOUR, 17, temp);
    let dedup = ReplicaDedup::new(Arc::new(TsdbStore(db.clone())), vec!["replica".into()]);
    let opts = DownsampleOptions {
        max_delay: std::time::Duration::from_secs(60),
        retention_5m: std::time::Duration::from_secs(3 * 86400),
        retention_1h: std::time::Duration::from_secs(30 * 86400),
        ..Default::default()
    };
    let down = Downsampler::open(&dir.path().join("downsample"), opts).unwrap();
    down.run(&dedup, Some(t0 + 1), t0 + 8 * ONE_HOUR).await.unwrap();
    let held = |width: i64| down.coverage().iter().any(|c| c.0 == width && c.1 <= t0 + ONE_HOUR);
    assert!(held(FIVE_MINUTES) && held(ONE_HOUR), "{:?}", down.coverage());
    // Five days on: the 5 m windows of that day are past their three days.
    down.run(&dedup, Some(t0 + 1), t0 + 5 * DAY).await.unwrap();
    assert!(!held(FIVE_MINUTES), "5 m windows kept past their retention: {:?}", down.coverage());
    assert!(held(ONE_HOUR), "1 h windows gone with the 5 m ones: {:?}", down.coverage());
    let hourly = down.blocks(ONE_HOUR).unwrap();
    let m = Matcher::new(MatchOp::Equal, "__name__", "gpu_temp").unwrap();
    let mut req = StepsRequest::new(vec![m], (t0 + 2 * ONE_HOUR, t0 + 5 * ONE_HOUR, ONE_HOUR), 300_000);
    req.function = Some(("avg_over_time".into(), ONE_HOUR));
    let got = answer(&hourly, &req).expect("the 1 h windows still answer");
    assert!(!got.series.is_empty(), "{got:?}");
}
