//! The planner over a regional (raw data and aggregates) behind a fan-out and the replica
//! dedup, as a global sees it: the answers equal the raw ones, the aggregates answer the
//! aligned steps they cover, raw data the rest, and a store whose data the aggregates lack
//! keeps the leaf raw.

use crate::downsampler::{DownsampleOptions, Downsampler};
use crate::plan::ResolutionPlanner;
use crate::store::WithAggregates;
use crate::{FIVE_MINUTES, ONE_HOUR};
use std::sync::Arc;
use std::time::Duration;
use strata_dedup::ReplicaDedup;
use strata_fanout::{Fanout, StoreTarget};
use strata_model::{Labels, Metadata, MetricType, Sample};
use strata_promql::pushdown::{Evaluating, GroupingAggregates};
use strata_promql::{Engine, EngineOptions, QueryValue};
use strata_store::{QueryScope, Store};
use strata_tsdb::db::{Tsdb, TsdbOptions};
use strata_tsdb::TsdbStore;

pub(crate) struct Stack {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) planner: ResolutionPlanner,
    pub(crate) reference: Arc<dyn Store>,
    pub(crate) fanout: Arc<Fanout>,
    pub(crate) down: Arc<Downsampler>,
    pub(crate) regional: Arc<dyn Store>,
    pub(crate) db: Arc<Tsdb>,
    pub(crate) t0: i64,
    pub(crate) end: i64,
}

fn series(db: &Tsdb, name: &str, replica: &str, from: i64, to: i64, jitter: i64) {
    let l = Labels::from_pairs([("__name__", name), ("cluster", "c0"), ("gpu", "1"), ("replica", replica)]);
    let s = db.series(&l).unwrap();
    let batch: Vec<_> = (from / 15_000..to / 15_000)
        .map(|i| {
            let t = i * 15_000 + jitter;
            let v = if name.ends_with("_total") { (i * 37 % 100_000) as f64 } else { 30.0 + (i * 7919 % 41) as f64 };
            (s.clone(), Sample::new(t, v))
        })
        .collect();
    assert!(db.commit(&batch).unwrap().rejected.is_empty());
}

/// An empty database that knows `energy_total` is a counter and `temp` a gauge.
fn typed_db(dir: &std::path::Path) -> Arc<Tsdb> {
    let db = Arc::new(Tsdb::open(dir, TsdbOptions::default()).unwrap());
    db.set_metadata("energy_total", Metadata { metric_type: MetricType::Counter, ..Default::default() }).unwrap();
    db.set_metadata("temp", Metadata { metric_type: MetricType::Gauge, ..Default::default() }).unwrap();
    db
}

pub(crate) async fn stack() -> Stack {
    let dir = tempfile::tempdir().unwrap();
    let db = typed_db(&dir.path().join("db"));
    let now = strata_model::time::now_ms();
    let t0 = (now - 9 * ONE_HOUR).div_euclid(6 * ONE_HOUR) * 6 * ONE_HOUR;
    let end = t0 + 9 * ONE_HOUR;
    for name in ["energy_total", "temp"] {
        series(&db, name, "a", t0, now - 60_000, 11);
        series(&db, name, "b", t0, now - 60_000, 5_003);
    }
    let down = Arc::new(
        Downsampler::open(
            &dir.path().join("down"),
            DownsampleOptions { max_delay: Duration::ZERO, ..Default::default() },
        )
        .unwrap(),
    );
    let source = ReplicaDedup::new(Arc::new(TsdbStore(db.clone())), vec!["replica".into()]);
    // Downsampled as if it were eight hours in: the ninth hour is raw data only.
    down.run(&source, Some(t0 + 1), t0 + 8 * ONE_HOUR).await.unwrap();
    let oldest_db = db.clone();
    let regional: Arc<dyn Store> = Arc::new(GroupingAggregates::new(Arc::new(
        WithAggregates::new(Arc::new(Evaluating::new(TsdbStore(db.clone()))), down.clone())
            .with_oldest_raw(Arc::new(move || oldest_db.min_time())),
    )));
    let fanout = Arc::new(Fanout::new(Vec::new(), Duration::from_secs(30)));
    let dedup: Arc<dyn Store> = Arc::new(ReplicaDedup::new(fanout.clone(), vec!["replica".into()]));
    let planner =
        ResolutionPlanner::new(dedup.clone(), fanout.clone(), vec!["replica".into()], Duration::from_secs(30))
            .with_preference(crate::plan::Prefer::Coarsest);
    let s = Stack { _dir: dir, planner, reference: dedup, fanout, down, regional, db, t0, end };
    s.targets(false);
    s
}

impl Stack {
    /// The regional as the global sees it: both replicas' labels, its aggregates' coverage.
    fn regional_target(&self) -> StoreTarget {
        let mut regional = StoreTarget::new("regional", self.regional.clone());
        regional.label_sets = vec![
            Labels::from_pairs([("cluster", "c0"), ("replica", "a")]),
            Labels::from_pairs([("cluster", "c0"), ("replica", "b")]),
        ];
        regional.resolutions = self.down.coverage();
        regional
    }

    /// The regional, and (`with_edge`) an edge of another cluster that forwards nowhere.
    fn targets(&self, with_edge: bool) {
        let mut targets = vec![self.regional_target()];
        if with_edge {
            let mut edge = StoreTarget::new("edge-c1", Arc::new(strata_store::memory::MemoryStore::default()));
            edge.label_sets = vec![Labels::from_pairs([("cluster", "c1"), ("replica", "a")])];
            targets.push(edge);
        }
        self.fanout.set_targets(targets);
    }
}

async fn run(
    store: &dyn Store,
    query: &str,
    grid: (i64, i64, i64),
    scope: QueryScope,
) -> Vec<(Labels, Vec<(i64, f64)>)> {
    run_with(EngineOptions::default(), store, query, grid, scope).await
}

/// The answer from the samples alone: no store evaluates anything.
async fn from_samples(store: &dyn Store, query: &str, grid: (i64, i64, i64)) -> Vec<(Labels, Vec<(i64, f64)>)> {
    let opts = EngineOptions { pushdown: false, ..Default::default() };
    run_with(opts, store, query, grid, QueryScope::default()).await
}

async fn run_with(
    opts: EngineOptions,
    store: &dyn Store,
    query: &str,
    (start, end, step): (i64, i64, i64),
    scope: QueryScope,
) -> Vec<(Labels, Vec<(i64, f64)>)> {
    let engine = Engine::new(opts);
    let expr = strata_promql::parse(query).unwrap();
    let v = scope.run(engine.range(store, &expr, start, end, step)).await.unwrap();
    let QueryValue::Matrix(m) = v else { panic!("a matrix") };
    m.into_iter().map(|s| (s.labels, s.points)).collect()
}

fn assert_same(query: &str, a: &[(Labels, Vec<(i64, f64)>)], b: &[(Labels, Vec<(i64, f64)>)]) {
    assert_eq!(a.len(), b.len(), "{query}");
    for ((la, pa), (lb, pb)) in a.iter().zip(b) {
        assert_eq!(la, lb, "{query}");
        assert_eq!(pa.len(), pb.len(), "{query} {la}: points");
        for ((ta, va), (tb, vb)) in pa.iter().zip(pb) {
            assert_eq!(ta, tb, "{query}");
            assert!((va - vb).abs() <= 1e-12 * va.abs().max(vb.abs()), "{query} {la} at {ta}: {va} vs {vb}");
        }
    }
}

const QUERIES: &[&str] = &[
    "avg by (cluster) (avg_over_time(temp[5m]))",
    "max_over_time(temp[1h])",
    "sum by (cluster) (rate(energy_total[5m]))",
    "increase(energy_total[1h])",
    "temp",
    "count_over_time(temp[10m])",
    "max by (gpu) (max_over_time(temp[5m]))",
    "count by (cluster) (avg_over_time(temp[5m]) > 40)",
    // Keeps the metric name from aggregates as from raw data; a time in seconds.
    "first_over_time(temp[1h])",
    "ts_of_last_over_time(energy_total[5m])",
];

#[tokio::test]
async fn aligned_steps_come_from_aggregates_the_newest_from_raw_data_and_answers_equal_the_raw_ones() {
    let s = stack().await;
    let covered = s.down.coverage();
    assert!(covered.iter().any(|c| c.0 == FIVE_MINUTES) && covered.iter().any(|c| c.0 == ONE_HOUR), "{covered:?}");
    let start = s.t0 + ONE_HOUR;
    for (step, want) in [(FIVE_MINUTES, FIVE_MINUTES), (ONE_HOUR, ONE_HOUR)] {
        let grid = (start, s.end.div_euclid(step) * step, step);
        for q in QUERIES {
            let scope = QueryScope::default();
            let got = run(&s.planner, q, grid, scope.clone()).await;
            let raw = run(&*s.reference, q, grid, QueryScope::default()).await;
            assert_same(q, &raw, &got);
            let used = scope.resolutions();
            // `[5m]` at a 1 h step reads 5 m windows; otherwise (a plain selector too) the step's width where it
            // is computed (the 1 h windows end two hours before the 5 m ones here).
            let coarsest = used.iter().map(|u| u.resolution).max().unwrap_or(0);
            let short = q.contains("[5m]") || q.contains("[10m]");
            let expect = if step == ONE_HOUR && short { FIVE_MINUTES } else { want };
            assert_eq!(coarsest, expect, "{q} at step {step}: {used:?}");
            assert!(used.iter().any(|u| u.resolution == 0), "{q}: the newest steps from raw data: {used:?}");
        }
    }
    // `max_source_resolution=5m` at an hour's step: 5 m windows, never 1 h ones.
    let grid = (start, s.end.div_euclid(ONE_HOUR) * ONE_HOUR, ONE_HOUR);
    for q in ["max_over_time(temp[1h])", "increase(energy_total[1h])", "temp"] {
        let mut scope = QueryScope::default();
        scope.max_source_resolution = Some(FIVE_MINUTES);
        let got = run(&s.planner, q, grid, scope.clone()).await;
        assert_same(q, &run(&*s.reference, q, grid, QueryScope::default()).await, &got);
        let used = scope.resolutions();
        assert!(used.iter().all(|u| u.resolution <= FIVE_MINUTES), "{q}: {used:?}");
        assert!(used.iter().any(|u| u.resolution == FIVE_MINUTES), "{q}: {used:?}");
    }
}

#[tokio::test]
async fn unaligned_steps_and_a_store_the_aggregates_lack_stay_raw() {
    let s = stack().await;
    let grid = (s.t0 + ONE_HOUR + 60_000, s.end, 60_000);
    let scope = QueryScope::default();
    let got = run(&s.planner, QUERIES[0], grid, scope.clone()).await;
    assert_same(QUERIES[0], &run(&*s.reference, QUERIES[0], grid, QueryScope::default()).await, &got);
    assert!(scope.resolutions().iter().all(|u| u.resolution == 0), "{:?}", scope.resolutions());
    s.targets(true);
    let grid = (s.t0 + ONE_HOUR, s.end.div_euclid(FIVE_MINUTES) * FIVE_MINUTES, FIVE_MINUTES);
    let scope = QueryScope::default();
    run(&s.planner, QUERIES[0], grid, scope.clone()).await;
    assert!(
        scope.resolutions().iter().all(|u| u.resolution == 0),
        "an edge forwarding nowhere: {:?}",
        scope.resolutions()
    );
    // Each replica shown, or a replica asked for: the aggregates hold neither.
    s.targets(false);
    let scope = QueryScope::new(true, false);
    run(&s.planner, QUERIES[0], grid, scope.clone()).await;
    assert!(scope.resolutions().is_empty(), "dedup=false: {:?}", scope.resolutions());
    let scope = QueryScope::default();
    run(&s.planner, "avg_over_time(temp{replica=\"a\"}[5m])", grid, scope.clone()).await;
    assert!(scope.resolutions().iter().all(|u| u.resolution == 0), "{:?}", scope.resolutions());
    // Asking for raw data only.
    let mut scope = QueryScope::default();
    scope.max_source_resolution = Some(0);
    run(&s.planner, QUERIES[0], grid, scope.clone()).await;
    assert!(scope.resolutions().is_empty());
}

#[tokio::test]
async fn raw_where_held_aggregates_answer_only_what_raw_data_no_longer_holds() {
    let s = stack().await;
    // The regional keeps raw data from three hours in: older steps need the aggregates.
    let mut regional = StoreTarget::new("regional", s.regional.clone());
    regional.label_sets = vec![Labels::from_pairs([("cluster", "c0"), ("replica", "a")])];
    regional.resolutions = s.down.coverage();
    regional.min_time = s.t0 + 3 * ONE_HOUR;
    s.fanout.set_targets(vec![regional]);
    let dedup: Arc<dyn Store> = Arc::new(ReplicaDedup::new(s.fanout.clone(), vec!["replica".into()]));
    let planner = ResolutionPlanner::new(dedup, s.fanout.clone(), vec!["replica".into()], Duration::from_secs(30))
        .with_preference(crate::plan::Prefer::RawWhereHeld);
    let grid = (s.t0 + ONE_HOUR, s.end.div_euclid(FIVE_MINUTES) * FIVE_MINUTES, FIVE_MINUTES);
    let scope = QueryScope::default();
    run(&planner, QUERIES[0], grid, scope.clone()).await;
    let used = scope.resolutions();
    let from_aggregates: Vec<_> = used.iter().filter(|u| u.resolution > 0).collect();
    assert_eq!(from_aggregates.len(), 1, "{used:?}");
    assert!(from_aggregates[0].end - FIVE_MINUTES < s.t0 + 3 * ONE_HOUR, "{used:?}");
    assert!(used.iter().any(|u| u.resolution == 0 && u.start >= s.t0 + 3 * ONE_HOUR), "{used:?}");
    // Raw data gone for the whole range: the aggregates still answer what they cover.
    let mut regional = StoreTarget::new("regional", s.regional.clone());
    regional.label_sets = vec![Labels::from_pairs([("cluster", "c0"), ("replica", "a")])];
    regional.resolutions = s.down.coverage();
    regional.min_time = s.t0 + 10 * ONE_HOUR;
    s.fanout.set_targets(vec![regional]);
    let grid = (s.t0 + ONE_HOUR, s.t0 + 8 * ONE_HOUR, FIVE_MINUTES);
    let scope = QueryScope::default();
    let got = run(&planner, QUERIES[0], grid, scope.clone()).await;
    assert!(!got.is_empty());
    assert!(scope.resolutions().iter().all(|u| u.resolution == FIVE_MINUTES), "{:?}", scope.resolutions());
    // A holder asked for no raw range at all (`(MIN, MIN)`, as an archive whose raw
    // blocks are gone is): its aggregates answer, not an empty raw read.
    let mut archive = StoreTarget::new("archive", s.regional.clone());
    archive.resolutions = s.down.coverage();
    (archive.min_time, archive.max_time) = (i64::MIN, i64::MIN);
    s.fanout.set_targets(vec![archive]);
    let scope = QueryScope::default();
    let again = run(&planner, QUERIES[0], grid, scope.clone()).await;
    assert_same(QUERIES[0], &got, &again);
    assert!(scope.resolutions().iter().all(|u| u.resolution == FIVE_MINUTES), "{:?}", scope.resolutions());
    assert!(!scope.resolutions().is_empty());
}

#[tokio::test]
async fn an_aggregation_over_a_leaf_is_evaluated_where_the_aggregates_are_and_equals_the_raw_one() {
    let s = stack().await;
    // Inside what the aggregates cover: no raw part, the holder's groups are the answer.
    let grid = (s.t0 + ONE_HOUR, s.t0 + 8 * ONE_HOUR, FIVE_MINUTES);
    for q in [QUERIES[0], QUERIES[2], QUERIES[6], QUERIES[7]] {
        let scope = QueryScope::default();
        let got = run(&s.planner, q, grid, scope.clone()).await;
        assert_same(q, &run(&*s.reference, q, grid, QueryScope::default()).await, &got);
        assert!(scope.resolutions().iter().all(|u| u.resolution == FIVE_MINUTES), "{q}: {:?}", scope.resolutions());
        assert!(!got.is_empty(), "{q}: no groups");
    }
}

/// An HA pair's edges beside the regional, as `strata up` runs them: the regional holds
/// copies of the edges' series. The newest (raw) steps are evaluated where the data is,
/// on the edges' copies when they hold all the regional's (the fan-out keeps those, or the
/// edges' groups), the older ones from the aggregates; where an edge lacks samples its
/// regional holds, the planner evaluates those steps in process from the merged samples.
/// Either way every answer is the one from the samples alone.
#[tokio::test]
async fn the_raw_steps_beside_the_aggregates_are_evaluated_where_the_edges_hold_everything() {
    for edge_lost_a_sample in [false, true] {
        let s = stack().await;
        let mut targets = vec![s.regional_target()];
        for (replica, jitter) in [("a", 11), ("b", 5_003)] {
            let db = typed_db(&s._dir.path().join(replica));
            for name in ["energy_total", "temp"] {
                if edge_lost_a_sample {
                    // A sample the regional holds, gone from the edge in the newest hour.
                    let lost = s.end - 30 * 60_000;
                    series(&db, name, replica, s.t0, lost, jitter);
                    series(&db, name, replica, lost + 15_000, s.end, jitter);
                } else {
                    series(&db, name, replica, s.t0, s.end, jitter);
                }
            }
            let mut edge = StoreTarget::new(replica, Arc::new(Evaluating::new(TsdbStore(db))));
            edge.label_sets = vec![Labels::from_pairs([("cluster", "c0"), ("replica", replica)])];
            targets.push(edge);
        }
        s.fanout.set_targets(targets);
        let dedup: Arc<dyn Store> = Arc::new(ReplicaDedup::new(s.fanout.clone(), vec!["replica".into()]));
        let evaluator = Arc::new(Evaluating::new(ReplicaDedup::new(s.fanout.clone(), vec!["replica".into()])));
        let planner =
            ResolutionPlanner::new(dedup.clone(), s.fanout.clone(), vec!["replica".into()], Duration::from_secs(30))
                .with_preference(crate::plan::Prefer::Coarsest)
                .with_raw_evaluator(evaluator.clone());
        let grid = (s.t0 + ONE_HOUR, s.end.div_euclid(FIVE_MINUTES) * FIVE_MINUTES, FIVE_MINUTES);
        let shifted = ["sum by (cluster) (rate(energy_total[5m] offset 1h))", "temp offset 30m"];
        for q in QUERIES.iter().chain(&shifted) {
            let scope = QueryScope::default();
            let got = run(&planner, q, grid, scope.clone()).await;
            assert_same(q, &from_samples(&*dedup, q, grid).await, &got);
            assert!(!got.is_empty(), "{q}");
            let used = scope.resolutions();
            assert!(used.iter().any(|u| u.resolution == FIVE_MINUTES), "{q}: {used:?}");
            assert!(used.iter().any(|u| u.resolution == 0), "{q}: the newest steps from raw data: {used:?}");
        }
        match edge_lost_a_sample {
            false => assert_eq!(evaluator.evaluated(), 0, "every raw step was evaluated where the data is"),
            true => assert!(evaluator.evaluated() > 0, "the merged samples answered where an edge lacks one"),
        }
    }
}

/// The plan alone: a holder answers for its steps only if it accepts; here what the
/// planner asks of it (the archive's store accepts it, `strata_archive`'s tests).
#[tokio::test]
async fn steps_reaching_back_before_any_data_are_planned_from_aggregates() {
    let s = stack().await;
    // The regional's oldest sample, as its Info says: nothing anywhere is older.
    let mut regional = s.regional_target();
    (regional.min_time, regional.max_time) = (s.t0 + 11, s.end);
    s.fanout.set_targets(vec![regional.clone()]);
    let mut req = strata_store::StepsRequest::new(
        vec![strata_model::Matcher::new(strata_model::MatchOp::Equal, "__name__", "temp").unwrap()],
        (s.t0 + FIVE_MINUTES, s.t0 + 6 * ONE_HOUR, FIVE_MINUTES),
        300_000,
    );
    req.function = Some(("max_over_time".into(), ONE_HOUR));
    let first = |segments: &[crate::plan::Segment]| segments.iter().map(|g| g.first).min();
    assert_eq!(first(&s.planner.plan(&req, None, true)), Some(0), "the first step reaches back before any data");
    // The regional holds no raw data before its aggregates either: it answers every step,
    // the windows before its first empty, as raw data would.
    let grid = (s.t0 + FIVE_MINUTES, s.t0 + 6 * ONE_HOUR, FIVE_MINUTES);
    let query = "max_over_time(temp[1h])";
    let scope = QueryScope::default();
    let got = run(&s.planner, query, grid, scope.clone()).await;
    assert_same(query, &run(&*s.reference, query, grid, QueryScope::default()).await, &got);
    let used = scope.resolutions();
    assert!(used.iter().all(|u| u.resolution == FIVE_MINUTES) && used[0].start == grid.0, "{used:?}");
    // Raw data older than its aggregates arrives (a backlog, not yet downsampled): it
    // refuses the steps before them, and the plan without those is asked instead.
    let older = Labels::from_pairs([("__name__", "temp"), ("cluster", "c0"), ("gpu", "2"), ("replica", "a")]);
    let older = s.db.series(&older).unwrap();
    let batch: Vec<_> = (0..60).map(|i| (older.clone(), Sample::new(s.t0 - ONE_HOUR + i * 15_000, 40.0))).collect();
    assert!(s.db.commit(&batch).unwrap().rejected.is_empty());
    let scope = QueryScope::default();
    let got = run(&s.planner, query, grid, scope.clone()).await;
    assert_same(query, &run(&*s.reference, query, grid, QueryScope::default()).await, &got);
    let used = scope.resolutions();
    assert!(used.iter().any(|u| u.resolution == 0 && u.start == grid.0), "{used:?}");
    assert!(used.iter().any(|u| u.resolution == FIVE_MINUTES && u.start == grid.0 + 11 * FIVE_MINUTES), "{used:?}");
    // A store that may hold older data (or does not say when its data starts): the steps
    // reaching back before the aggregates are not planned from them.
    for min_time in [s.t0 - ONE_HOUR, i64::MIN] {
        regional.min_time = min_time;
        s.fanout.set_targets(vec![regional.clone()]);
        assert_eq!(first(&s.planner.plan(&req, None, true)), Some(11), "min_time {min_time}");
    }
}

/// Raw data gone from the older steps and no exact resolution for the leaf (a range of
/// 5m15s, steps a minute apart): those steps come from the 5 m aggregates, the range the
/// nearest whole number of windows and each step read at the window end before it, with
/// an info saying so; the newer steps stay raw and exact. Not empty (Thanos 4634), not
/// silently approximate. A leaf the aggregates cannot give gets a warning instead.
#[tokio::test]
async fn steps_raw_data_no_longer_reaches_come_from_the_closest_aggregates_and_say_so() {
    let s = stack().await;
    let raw_from = s.t0 + 5 * ONE_HOUR;
    let mut regional = s.regional_target();
    (regional.min_time, regional.max_time) = (raw_from, s.end);
    s.fanout.set_targets(vec![regional.clone()]);
    let (start, end, step) = (s.t0 + ONE_HOUR + 60_000, s.t0 + 7 * ONE_HOUR, 60_000);
    let floor = |t: i64| t.div_euclid(FIVE_MINUTES) * FIVE_MINUTES;
    // What the aggregates give exactly: the 5 m range at the window ends.
    let aligned =
        run(&*s.reference, "avg_over_time(temp[5m])", (floor(start), floor(end), FIVE_MINUTES), QueryScope::default())
            .await;
    let exact = run(&*s.reference, "avg_over_time(temp[5m15s])", (start, end, step), QueryScope::default()).await;
    for q in ["avg_over_time(temp[5m15s])", "avg by (cluster, gpu) (avg_over_time(temp[5m15s]))"] {
        let scope = QueryScope::default();
        let got = run(&s.planner, q, (start, end, step), scope.clone()).await;
        assert_eq!(got.len(), 1, "{q}: {got:?}");
        let mut approximated = 0;
        for &(t, v) in &got[0].1 {
            let want = if t - 315_000 < raw_from - 1 {
                approximated += 1;
                aligned[0].1.iter().find(|p| p.0 == floor(t)).map(|p| p.1)
            } else {
                exact[0].1.iter().find(|p| p.0 == t).map(|p| p.1)
            };
            let want = want.unwrap_or_else(|| panic!("{q} at {t}: a value where there should be none"));
            assert!((v - want).abs() <= 1e-12 * v.abs().max(want.abs()), "{q} at {t}: {v} against {want}");
        }
        let before = ((raw_from - 1 + 315_000 - start) / step) as usize;
        assert!(
            approximated >= before - 1 && approximated <= before + 1,
            "{q}: {approximated} approximated, ~{before} expected"
        );
        assert_eq!(got[0].1.len() as i64, (end - start) / step + 1, "{q}: every step answered");
        let infos = scope.infos();
        assert!(
            infos.iter().any(|i| i.contains("approximately from 5m aggregates") && i.contains("5m15s")),
            "{q}: {infos:?}"
        );
        let used = scope.resolutions();
        assert!(used.iter().any(|u| u.resolution == FIVE_MINUTES && u.start == start), "{q}: {used:?}");
        assert!(used.iter().any(|u| u.resolution == 0 && u.start > raw_from), "{q}: {used:?}");
    }
    // 5 m windows kept for less time than 1 h ones: the steps before them from 1 h windows
    // (the range then one window), the rest as before; the info says each.
    let five_from = s.t0 + 3 * ONE_HOUR;
    let mut shorter = regional.clone();
    for r in shorter.resolutions.iter_mut().filter(|r| r.0 == FIVE_MINUTES) {
        r.1 = five_from;
    }
    s.fanout.set_targets(vec![shorter]);
    let hourly = run(
        &*s.reference,
        "avg_over_time(temp[1h])",
        (start.div_euclid(ONE_HOUR) * ONE_HOUR, end, ONE_HOUR),
        QueryScope::default(),
    )
    .await;
    let scope = QueryScope::default();
    let got = run(&s.planner, "avg_over_time(temp[5m15s])", (start, end, step), scope.clone()).await;
    let used = scope.resolutions();
    assert!(used.iter().any(|u| u.resolution == ONE_HOUR && u.start == start), "{used:?}");
    assert!(used.iter().any(|u| u.resolution == FIVE_MINUTES), "{used:?}");
    for &(t, v) in &got[0].1 {
        // (The 5 m part reads whole windows from the one ending at or before the step.)
        if floor(t) - FIVE_MINUTES < five_from - 1 {
            let want = hourly[0].1.iter().find(|p| p.0 == t.div_euclid(ONE_HOUR) * ONE_HOUR).map(|p| p.1);
            assert_eq!(Some(v), want, "at {t}, from the 1 h windows");
        }
    }
    assert_eq!(got[0].1.len() as i64, (end - start) / step + 1, "every step answered");
    assert!(scope.infos().iter().any(|i| i.contains("from 1h aggregates")), "{:?}", scope.infos());
    s.fanout.set_targets(vec![regional.clone()]);
    // A selection by replica: the aggregates hold neither replica; the raw answer, warned.
    let scope = QueryScope::default();
    run(&s.planner, "avg_over_time(temp{replica=\"a\"}[5m15s])", (start, end, step), scope.clone()).await;
    assert!(scope.infos().is_empty(), "{:?}", scope.infos());
    let warnings = scope.warnings();
    assert!(warnings.iter().any(|w| w.contains("no longer kept") && w.contains("replica")), "{warnings:?}");
    // No raw data kept at all (a cluster gone, its aggregates kept): every step from them.
    let mut gone = regional.clone();
    (gone.min_time, gone.max_time) = (i64::MIN, i64::MIN);
    s.fanout.set_targets(vec![gone]);
    let scope = QueryScope::default();
    let got = run(&s.planner, "avg_over_time(temp[5m15s])", (start, s.t0 + 7 * ONE_HOUR, step), scope.clone()).await;
    assert!(!got.is_empty() && !got[0].1.is_empty());
    assert!(scope.resolutions().iter().all(|u| u.resolution > 0), "{:?}", scope.resolutions());
    assert!(scope.infos().iter().any(|i| i.contains("approximately")), "{:?}", scope.infos());
    // Raw data as old as the aggregates (nothing lost): the raw answer, exact, unannotated.
    (regional.min_time, regional.max_time) = (s.t0 + 11, s.end);
    s.fanout.set_targets(vec![regional]);
    let scope = QueryScope::default();
    let got = run(&s.planner, "avg_over_time(temp[5m15s])", (start, end, step), scope.clone()).await;
    assert_same("all raw", &exact, &got);
    assert!(scope.infos().is_empty() && scope.warnings().is_empty(), "{:?} {:?}", scope.infos(), scope.warnings());
}
