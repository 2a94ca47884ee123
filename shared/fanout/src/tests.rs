use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use strata_store::conformance::{fixture, run_all};
use strata_store::memory::MemoryStore;

fn memory(part: impl Fn(usize) -> bool) -> MemoryStore {
    let mut m = MemoryStore::default();
    for (_, s) in fixture().into_iter().enumerate().filter(|(i, _)| part(*i)) {
        let family = s.labels.metric_name().unwrap_or_default().to_string();
        m.set_metadata(&family, Metadata { metric_type: s.metric_type, help: String::new(), unit: String::new() });
        m.add(s.labels, s.metric_type, s.samples);
    }
    m
}

#[tokio::test]
async fn a_fanout_over_split_and_overlapping_stores_passes_the_conformance_suite() {
    // Series split between two stores, and the first two in both (a stacked global sees
    // one edge twice): each must come back once, whole.
    let a = StoreTarget::new("a", Arc::new(memory(|i| i % 2 == 0 || i < 2)));
    let b = StoreTarget::new("b", Arc::new(memory(|i| i % 2 == 1 || i < 2)));
    run_all(&Fanout::new(vec![a, b], Duration::from_secs(5))).await;
}

/// A store that never answers, one that refuses, and one that counts its calls.
struct Hangs;
struct Refuses;
struct Counts(AtomicUsize, MemoryStore);

#[async_trait]
impl Store for Hangs {
    async fn select_within(&self, _: &SelectRequest, _: &mut SelectBudget) -> Result<Vec<SeriesChunks>, StoreError> {
        std::future::pending().await
    }
    async fn series_within(
        &self,
        _: &[Matcher],
        _: i64,
        _: i64,
        _: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        std::future::pending().await
    }
    async fn label_names(&self, _: &[Matcher], _: i64, _: i64) -> Result<Vec<String>, StoreError> {
        std::future::pending().await
    }
    async fn label_values(&self, _: &str, _: &[Matcher], _: i64, _: i64) -> Result<Vec<String>, StoreError> {
        std::future::pending().await
    }
    async fn metadata(&self, _: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        std::future::pending().await
    }
}

fn refused() -> StoreError {
    StoreError::Unavailable("connection refused".into())
}

#[async_trait]
impl Store for Refuses {
    async fn select_within(&self, _: &SelectRequest, _: &mut SelectBudget) -> Result<Vec<SeriesChunks>, StoreError> {
        Err(refused())
    }
    async fn series_within(
        &self,
        _: &[Matcher],
        _: i64,
        _: i64,
        _: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        Err(refused())
    }
    async fn label_names(&self, _: &[Matcher], _: i64, _: i64) -> Result<Vec<String>, StoreError> {
        Err(refused())
    }
    async fn label_values(&self, _: &str, _: &[Matcher], _: i64, _: i64) -> Result<Vec<String>, StoreError> {
        Err(refused())
    }
    async fn metadata(&self, _: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        Err(refused())
    }
}

#[async_trait]
impl Store for Counts {
    async fn select_within(&self, r: &SelectRequest, b: &mut SelectBudget) -> Result<Vec<SeriesChunks>, StoreError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        self.1.select_within(r, b).await
    }
    async fn series_within(
        &self,
        m: &[Matcher],
        s: i64,
        e: i64,
        b: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        self.1.series_within(m, s, e, b).await
    }
    async fn label_names(&self, m: &[Matcher], s: i64, e: i64) -> Result<Vec<String>, StoreError> {
        self.1.label_names(m, s, e).await
    }
    async fn label_values(&self, n: &str, m: &[Matcher], s: i64, e: i64) -> Result<Vec<String>, StoreError> {
        self.1.label_values(n, m, s, e).await
    }
    async fn metadata(&self, m: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        self.1.metadata(m).await
    }
}

fn gpu_util() -> SelectRequest {
    SelectRequest::new(vec![Matcher::eq("__name__", "DCGM_FI_DEV_GPU_UTIL")], i64::MIN, i64::MAX)
}

#[tokio::test]
async fn hanging_and_refusing_stores_are_named_in_warnings_or_fail_the_request() {
    let fanout = Fanout::new(
        vec![
            StoreTarget::new("good", Arc::new(memory(|_| true))),
            StoreTarget::new("slow:10901", Arc::new(Hangs)),
            StoreTarget::new("down:10901", Arc::new(Refuses)),
        ],
        Duration::from_millis(300),
    );
    let scope = QueryScope::default();
    let started = Instant::now();
    let got = scope.clone().run(fanout.select(&gpu_util())).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "waited {:?} for a hanging store", started.elapsed());
    assert_eq!(got.len(), 3, "the good store's answer");
    let w = scope.warnings();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].starts_with("store slow:10901: no answer within"), "{w:?}");
    assert_eq!(w[1], "store down:10901: connection refused");
    // Within the same request, the failed stores are not asked again: no second wait.
    let again = Instant::now();
    let (got, names) = scope
        .clone()
        .run(async { (fanout.select(&gpu_util()).await, fanout.label_names(&[], i64::MIN, i64::MAX).await) })
        .await;
    assert!(again.elapsed() < Duration::from_millis(250), "asked the hanging store again: {:?}", again.elapsed());
    assert_eq!(got.unwrap().len(), 3);
    assert!(names.unwrap().contains(&"gpu".to_string()));
    assert_eq!(scope.warnings().len(), 2, "the warnings stand: {:?}", scope.warnings());

    let strict = QueryScope::new(false, true);
    let err = strict.clone().run(fanout.select(&gpu_util())).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("slow:10901") && msg.contains("down:10901") && msg.contains("partial_response=false"),
        "{msg}"
    );
    // Label queries follow the same rule.
    let names = QueryScope::default().run(fanout.label_names(&[], i64::MIN, i64::MAX)).await.unwrap();
    assert!(names.contains(&"gpu".to_string()));
    assert!(strict.run(fanout.label_names(&[], i64::MIN, i64::MAX)).await.is_err());
}

#[tokio::test]
async fn a_request_error_fails_the_request_even_with_partial_response() {
    let fanout = Fanout::new(
        vec![StoreTarget::new("a", Arc::new(memory(|_| true))), StoreTarget::new("b", Arc::new(Refuses))],
        Duration::from_secs(5),
    );
    let mut req = gpu_util();
    req.limits.max_series = 1;
    let r = QueryScope::default().run(fanout.select(&req)).await;
    assert!(matches!(r, Err(StoreError::LimitExceeded { what: "series", .. })), "{r:?}");
}

#[tokio::test]
async fn only_stores_whose_labels_and_time_can_match_are_asked() {
    let c0 = Arc::new(Counts(AtomicUsize::new(0), memory(|_| true)));
    let c1 = Arc::new(Counts(AtomicUsize::new(0), memory(|_| true)));
    let old = Arc::new(Counts(AtomicUsize::new(0), memory(|_| true)));
    let target = |name: &str, store: Arc<Counts>, cluster: &str, min: i64, max: i64| StoreTarget {
        name: name.into(),
        store,
        label_sets: vec![Labels::from_pairs([("cluster", cluster)])],
        min_time: min,
        max_time: max,
        resolutions: vec![],
    };
    let fanout = Fanout::new(
        vec![
            target("c0", c0.clone(), "c0", i64::MIN, i64::MAX),
            target("c1", c1.clone(), "c1", i64::MIN, i64::MAX),
            target("old", old.clone(), "c0", 0, 1000),
        ],
        Duration::from_secs(5),
    );
    let mut req = gpu_util();
    req.matchers.push(Matcher::eq("cluster", "c0"));
    req.start = 1_700_000_000_000;
    fanout.select(&req).await.unwrap();
    let calls = |c: &Counts| c.0.load(Ordering::Relaxed);
    assert_eq!((calls(&c0), calls(&c1), calls(&old)), (1, 0, 0));
    req.matchers.pop();
    req.matchers.push(Matcher::new(strata_model::MatchOp::Regex, "cluster", "c.*").unwrap());
    req.start = 0;
    fanout.select(&req).await.unwrap();
    assert_eq!((calls(&c0), calls(&c1), calls(&old)), (2, 1, 1));
}

/// A store whose selection is endless batches of one series, counting those taken.
struct Endless(Arc<AtomicUsize>);

struct EndlessBatches(Arc<AtomicUsize>);

#[async_trait]
impl strata_store::SeriesBatches for EndlessBatches {
    async fn next_batch(&mut self) -> Result<Option<Vec<SeriesChunks>>, StoreError> {
        let i = self.0.fetch_add(1, Ordering::SeqCst);
        let labels = Labels::from_pairs([("__name__", "x".to_string()), ("i", format!("{i:09}"))]);
        Ok(Some(vec![SeriesChunks { labels, metric_type: Default::default(), chunks: vec![] }]))
    }
}

#[async_trait]
impl Store for Endless {
    async fn select_within(&self, _: &SelectRequest, _: &mut SelectBudget) -> Result<Vec<SeriesChunks>, StoreError> {
        Err(StoreError::InvalidRequest("read me in batches".into()))
    }
    async fn select_batches(&self, _: &SelectRequest) -> Result<BoxBatches, StoreError> {
        Ok(Box::new(EndlessBatches(self.0.clone())))
    }
    async fn series_within(
        &self,
        _: &[Matcher],
        _: i64,
        _: i64,
        _: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        Ok(vec![])
    }
    async fn label_names(&self, _: &[Matcher], _: i64, _: i64) -> Result<Vec<String>, StoreError> {
        Ok(vec![])
    }
    async fn label_values(&self, _: &str, _: &[Matcher], _: i64, _: i64) -> Result<Vec<String>, StoreError> {
        Ok(vec![])
    }
    async fn metadata(&self, _: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        Ok(vec![])
    }
}

#[tokio::test]
async fn the_merge_reads_stores_only_as_far_as_it_is_read() {
    // Two endless stores: the merged stream hands on batches in order, and reading three
    // of them takes a bounded number of batches from each store, not its whole answer.
    let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let fanout = Fanout::new(
        vec![StoreTarget::new("a", Arc::new(Endless(a.clone()))), StoreTarget::new("b", Arc::new(Endless(b.clone())))],
        Duration::from_secs(5),
    );
    let mut batches = fanout.select_batches(&gpu_util()).await.unwrap();
    let mut last: Option<Labels> = None;
    for _ in 0..3 {
        for s in batches.next_batch().await.unwrap().unwrap() {
            assert!(last.as_ref().is_none_or(|l| *l < s.labels), "in order, equal series merged");
            last = Some(s.labels);
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let taken = a.load(Ordering::SeqCst) + b.load(Ordering::SeqCst);
    // Both stores hold the same series, merged: 3 batches of 1024 take 3 × 1024 from each,
    // plus per store the series waiting in the merge, two in its channel and one its
    // reader is blocked sending.
    assert!(taken <= 2 * (3 * 1024 + 4), "{taken} batches taken from the stores");
    drop(batches);
}

#[test]
fn leaves_evaluated_by_several_stores_merge_only_when_nothing_is_split() {
    use strata_store::{Steps, StepsSeries};
    let series = |name: &str| StepsSeries {
        labels: Labels::from_pairs([("__name__", name)]),
        metric_type: Default::default(),
        summary: Default::default(),
        values: strata_store::StepValues::from_options(&[Some(1.0)]),
        name_dropped: false,
    };
    let steps = |s: &[&str], g: &[&str]| {
        let steps = Steps {
            series: s.iter().map(|n| series(n)).collect(),
            groups: g.iter().map(|n| series(n)).collect(),
            ..Default::default()
        };
        (Vec::<Labels>::new(), steps)
    };
    let limits = |n: usize, samples: u64| SelectLimits { max_series: n, max_samples: samples };
    let ten = limits(10, 1000);
    let merged = merged_steps(vec![Some(steps(&["b", "c"], &[])), Some(steps(&["a"], &[]))], ten).unwrap().unwrap();
    let names: Vec<_> = merged.series.iter().map(|s| s.labels.metric_name().unwrap_or("").to_string()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    // A store that does not evaluate leaves: the engine selects samples instead.
    assert!(merged_steps(vec![Some(steps(&["a"], &[])), None], ten).unwrap().is_none());
    // One series from two stores, or one group each computed a part of.
    assert!(merged_steps(vec![Some(steps(&["a"], &[])), Some(steps(&["a"], &[]))], ten).unwrap().is_none());
    assert!(merged_steps(vec![Some(steps(&[], &["g"])), Some(steps(&[], &["g"]))], ten).unwrap().is_none());
    assert!(merged_steps(vec![Some(steps(&[], &["g"])), Some(steps(&[], &["h"]))], ten).unwrap().is_some());
    assert!(matches!(
        merged_steps(vec![Some(steps(&["a", "b"], &[])), Some(steps(&["c"], &[]))], limits(2, 1000)),
        Err(StoreError::LimitExceeded { what: "series", .. })
    ));
    // The sample budget holds for every store's values together, not for each store's.
    assert!(matches!(
        merged_steps(vec![Some(steps(&["a", "b"], &[])), Some(steps(&["c"], &[]))], limits(10, 2)),
        Err(StoreError::LimitExceeded { what: "samples", limit: 2 })
    ));
}

/// An edge's series and the regional's copy of it (the regional lists the edge's label
/// set): the edge's copy answers when it holds every sample of the regional's; anything
/// less sure (a copy the edge's lacks, a marker only the regional has, stores that do not
/// feed one another) is left to the merge of samples.
#[test]
fn of_one_series_from_an_edge_and_its_regional_the_edges_copy_answers_when_it_holds_all() {
    use strata_model::Sample;
    use strata_store::{SeriesSummary, Steps, StepsSeries};
    let a = Labels::from_pairs([("replica", "a")]);
    let b = Labels::from_pairs([("replica", "b")]);
    let (edge_sets, regional_sets) = (vec![a.clone()], vec![a.clone(), b.clone()]);
    let answer = |sets: &Vec<Labels>, samples: &[Sample], value: f64| {
        let mut app = strata_chunk::ChunkAppender::new();
        samples.iter().for_each(|s| app.append(s.t, s.v));
        let summary = SeriesSummary::of(&[app.seal()], true).unwrap();
        let steps = Steps {
            series: vec![StepsSeries {
                labels: Labels::from_pairs([("__name__", "up"), ("replica", "a")]),
                metric_type: Default::default(),
                summary,
                values: strata_store::StepValues::from_options(&[Some(value)]),
                name_dropped: false,
            }],
            ..Default::default()
        };
        (sets.clone(), steps)
    };
    let every = |from: i64, to: i64| (from..to).map(|k| Sample::new(k * 15_000, k as f64)).collect::<Vec<_>>();
    let limits = SelectLimits { max_series: 10, max_samples: 1000 };
    let picked = |answers: Vec<Option<(Vec<Labels>, Steps)>>| {
        merged_steps(answers, limits).unwrap().map(|m| {
            assert_eq!(m.series.len(), 1);
            m.series[0].values.to_options()[0]
        })
    };
    let edge = answer(&edge_sets, &every(0, 240), 1.0);
    // The regional one sample behind, or forty, or level: the edge's, in either order.
    for behind in [1, 40, 0] {
        let regional = answer(&regional_sets, &every(0, 240 - behind), 2.0);
        assert_eq!(picked(vec![Some(edge.clone()), Some(regional.clone())]), Some(Some(1.0)), "{behind} behind");
        assert_eq!(picked(vec![Some(regional), Some(edge.clone())]), Some(Some(1.0)), "{behind} behind");
    }
    // The edge lost a sample the regional holds: a gap of its own, merged instead.
    let lost: Vec<Sample> = every(0, 240).into_iter().filter(|s| s.t != 1_500_000).collect();
    assert_eq!(
        picked(vec![Some(answer(&edge_sets, &lost, 1.0)), Some(answer(&regional_sets, &every(0, 200), 2.0))]),
        None
    );
    // Only the regional's copy ends with a staleness marker.
    let mut ended = every(0, 200);
    ended.push(Sample::new(200 * 15_000, strata_model::stale_nan()));
    assert_eq!(picked(vec![Some(edge.clone()), Some(answer(&regional_sets, &ended, 2.0))]), None);
    // The edge's own marker is its copy's: it still answers.
    let mut edge_ended = every(0, 240);
    edge_ended.push(Sample::new(240 * 15_000, strata_model::stale_nan()));
    let regional = answer(&regional_sets, &every(0, 239), 2.0);
    assert_eq!(picked(vec![Some(answer(&edge_sets, &edge_ended, 1.0)), Some(regional.clone())]), Some(Some(1.0)));
    // Stores that do not feed one another (the same sets, listed once or twice, none, or
    // another edge's).
    for sets in [edge_sets.clone(), vec![], vec![b.clone()], vec![a.clone(), a.clone()]] {
        let other = answer(&sets, &every(0, 200), 2.0);
        assert_eq!(picked(vec![Some(edge.clone()), Some(other)]), None, "{sets:?}");
    }
    // Two regionals both fed by the edge: the edge's copy holds both.
    let second = answer(&regional_sets, &every(0, 230), 3.0);
    assert_eq!(picked(vec![Some(regional.clone()), Some(edge.clone()), Some(second.clone())]), Some(Some(1.0)));
    // Both copies end with the marker: the edge's holds the regional's.
    let regional_ended = answer(&regional_sets, &edge_ended, 2.0);
    assert_eq!(picked(vec![Some(regional_ended), Some(answer(&edge_sets, &edge_ended, 1.0))]), Some(Some(1.0)));
    // A few samples prove no regularity: scrapes every minute, the edge lost the middle one
    // the regional holds, and the regional has not the newest yet.
    let minute = |ts: &[i64]| ts.iter().map(|&m| Sample::new(m * 60_000, m as f64)).collect::<Vec<_>>();
    let few =
        vec![Some(answer(&edge_sets, &minute(&[0, 2]), 1.0)), Some(answer(&regional_sets, &minute(&[0, 1]), 2.0))];
    assert_eq!(picked(few), None);
    // Several series per store: the regional's own series stay, its copy of the edge's goes.
    let with_labels = |(sets, mut steps): (Vec<Labels>, Steps), name: &str, v: f64| {
        steps.series[0].labels = Labels::from_pairs([("__name__", name), ("replica", "a")]);
        steps.series[0].values = strata_store::StepValues::from_options(&[Some(v)]);
        (sets, steps)
    };
    let (sets, mut both) = with_labels(answer(&regional_sets, &every(0, 230), 2.0), "up", 2.0);
    both.series.insert(0, with_labels(answer(&regional_sets, &every(0, 230), 3.0), "temp", 3.0).1.series.remove(0));
    let regional_two = (sets, both);
    for answers in [vec![Some(edge.clone()), Some(regional_two.clone())], vec![Some(regional_two), Some(edge.clone())]]
    {
        let merged = merged_steps(answers, limits).unwrap().expect("the edge holds its series");
        let got: Vec<(String, Option<f64>)> = merged
            .series
            .iter()
            .map(|s| (s.labels.metric_name().unwrap_or("").to_string(), s.values.to_options()[0]))
            .collect();
        assert_eq!(got, [("temp".to_string(), Some(3.0)), ("up".to_string(), Some(1.0))]);
    }
    // Under an aggregation the regional's answer goes whole when the edges hold each of its
    // series, and the edge's groups are the answer; else there is none.
    let grouped = |(sets, mut s): (Vec<Labels>, Steps), v: f64| {
        s.groups = vec![s.series[0].clone()];
        s.groups[0].labels = Labels::from_pairs([("cluster", "c0")]);
        s.groups[0].values = strata_store::StepValues::from_options(&[Some(v)]);
        s.series[0].values = Default::default();
        (sets, s)
    };
    for answers in [
        vec![Some(grouped(edge.clone(), 1.0)), Some(grouped(regional.clone(), 2.0))],
        vec![Some(grouped(regional.clone(), 2.0)), Some(grouped(edge.clone(), 1.0))],
    ] {
        let merged = merged_steps(answers, limits).unwrap().expect("the edge holds the regional's copy");
        assert_eq!(merged.groups.len(), 1);
        assert_eq!(merged.groups[0].values.to_options(), [Some(1.0)], "the edge's groups");
    }
    let lagging_edge = answer(&edge_sets, &every(0, 200), 1.0);
    let ahead = answer(&regional_sets, &every(0, 240), 2.0);
    assert!(merged_steps(vec![Some(grouped(lagging_edge, 1.0)), Some(grouped(ahead, 2.0))], limits).unwrap().is_none());
}

/// Findings of the global review: a store's timeout must not count the consumer's time,
/// and one store's own refusal must not fail the request.
mod review {
    use super::*;

    /// `n` series in batches of 100, quickly.
    struct Finite(usize);

    struct FiniteBatches(usize, usize);

    #[async_trait]
    impl strata_store::SeriesBatches for FiniteBatches {
        async fn next_batch(&mut self) -> Result<Option<Vec<SeriesChunks>>, StoreError> {
            if self.0 >= self.1 {
                return Ok(None);
            }
            let end = (self.0 + 100).min(self.1);
            let out = (self.0..end)
                .map(|i| SeriesChunks {
                    labels: Labels::from_pairs([("__name__", "x".to_string()), ("i", format!("{i:09}"))]),
                    metric_type: Default::default(),
                    chunks: vec![],
                })
                .collect();
            self.0 = end;
            Ok(Some(out))
        }
    }

    #[async_trait]
    impl Store for Finite {
        async fn select_within(
            &self,
            _: &SelectRequest,
            _: &mut SelectBudget,
        ) -> Result<Vec<SeriesChunks>, StoreError> {
            Err(StoreError::InvalidRequest("read me in batches".into()))
        }
        async fn select_batches(&self, _: &SelectRequest) -> Result<BoxBatches, StoreError> {
            Ok(Box::new(FiniteBatches(0, self.0)))
        }
        async fn series_within(
            &self,
            _: &[Matcher],
            _: i64,
            _: i64,
            _: &mut SelectBudget,
        ) -> Result<Vec<Labels>, StoreError> {
            Ok(vec![])
        }
        async fn label_names(&self, _: &[Matcher], _: i64, _: i64) -> Result<Vec<String>, StoreError> {
            Ok(vec![])
        }
        async fn label_values(&self, _: &str, _: &[Matcher], _: i64, _: i64) -> Result<Vec<String>, StoreError> {
            Ok(vec![])
        }
        async fn metadata(&self, _: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
            Ok(vec![])
        }
    }

    /// A healthy store streams 5,000 series at once to a consumer that takes 150 ms per
    /// batch of 1,024: the whole takes longer than the store's 300 ms timeout, yet the store
    /// itself answered in a few milliseconds. Nothing is cut off.
    #[tokio::test]
    async fn a_slow_consumer_does_not_make_a_fast_store_time_out() {
        let fanout = Fanout::new(vec![StoreTarget::new("fast", Arc::new(Finite(5000)))], Duration::from_millis(300));
        let scope = QueryScope::default();
        let got = scope
            .clone()
            .run(async {
                let mut batches = fanout.select_batches(&gpu_util()).await.unwrap();
                let mut n = 0;
                while let Some(b) = batches.next_batch().await.unwrap() {
                    n += b.len();
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
                n
            })
            .await;
        assert!(scope.warnings().is_empty(), "{:?}", scope.warnings());
        assert_eq!(got, 5000, "series dropped");
    }

    /// Stores that refuse a request themselves.
    struct RefusesWith(fn() -> StoreError);

    #[async_trait]
    impl Store for RefusesWith {
        async fn select_within(
            &self,
            _: &SelectRequest,
            _: &mut SelectBudget,
        ) -> Result<Vec<SeriesChunks>, StoreError> {
            Err((self.0)())
        }
        async fn series_within(
            &self,
            _: &[Matcher],
            _: i64,
            _: i64,
            _: &mut SelectBudget,
        ) -> Result<Vec<Labels>, StoreError> {
            Err((self.0)())
        }
        async fn label_names(&self, _: &[Matcher], _: i64, _: i64) -> Result<Vec<String>, StoreError> {
            Err((self.0)())
        }
        async fn label_values(&self, _: &str, _: &[Matcher], _: i64, _: i64) -> Result<Vec<String>, StoreError> {
            Err((self.0)())
        }
        async fn metadata(&self, _: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
            Err((self.0)())
        }
    }

    /// A store that answers `INVALID_ARGUMENT` (an older version) and one whose own samples
    /// limit is below the request's: each is that store's failure, named in the warnings,
    /// and the others' answer stands; `partial_response=false` fails the request.
    #[tokio::test]
    async fn one_stores_refusal_is_that_stores_failure() {
        let fanout = Fanout::new(
            vec![
                StoreTarget::new("good", Arc::new(memory(|_| true))),
                StoreTarget::new(
                    "old:10901",
                    Arc::new(RefusesWith(|| StoreError::InvalidRequest("unknown field".into()))),
                ),
                StoreTarget::new(
                    "small:10901",
                    Arc::new(RefusesWith(|| StoreError::LimitExceeded { what: "samples", limit: 10 })),
                ),
            ],
            Duration::from_secs(5),
        );
        let want = QueryScope::default().run(memory(|_| true).select(&gpu_util())).await.unwrap().len();
        let scope = QueryScope::default();
        let got = scope.clone().run(fanout.select(&gpu_util())).await;
        let got = got.unwrap_or_else(|e| panic!("one store's refusal failed the request: {e}"));
        assert_eq!(got.len(), want);
        let w = scope.warnings();
        assert!(w.iter().any(|w| w.contains("old:10901")) && w.iter().any(|w| w.contains("small:10901")), "{w:?}");
        let scope = QueryScope::default();
        let names = scope.clone().run(fanout.label_names(&[], i64::MIN, i64::MAX)).await;
        assert!(names.is_ok_and(|n| !n.is_empty()), "label names failed");
        assert_eq!(scope.warnings().len(), 2, "{:?}", scope.warnings());
        let strict = QueryScope::new(false, true);
        assert!(strict.run(fanout.select(&gpu_util())).await.is_err(), "partial_response=false must fail");
        // Every store refuses it: the request is what is wrong, not an empty answer.
        let refusing = Fanout::new(
            vec![
                StoreTarget::new("a", Arc::new(RefusesWith(|| StoreError::InvalidRequest("bad matcher".into())))),
                StoreTarget::new("b", Arc::new(RefusesWith(|| StoreError::InvalidRequest("bad matcher".into())))),
            ],
            Duration::from_secs(5),
        );
        let r = QueryScope::default().run(refusing.select(&gpu_util())).await;
        assert!(matches!(r, Err(StoreError::InvalidRequest(_))), "{r:?}");
        let r = QueryScope::default().run(refusing.label_names(&[], 0, 1)).await;
        assert!(matches!(r, Err(StoreError::InvalidRequest(_))), "{r:?}");
        // A store that claims a limit above the one asked is not believed to be the request's.
        let odd = Fanout::new(
            vec![
                StoreTarget::new("good", Arc::new(memory(|_| true))),
                StoreTarget::new(
                    "odd",
                    Arc::new(RefusesWith(|| StoreError::LimitExceeded { what: "samples", limit: u64::MAX })),
                ),
            ],
            Duration::from_secs(5),
        );
        assert!(QueryScope::default().run(odd.select(&gpu_util())).await.is_ok());
    }
}

#[tokio::test]
async fn with_partial_response_false_a_failed_replica_fails_the_request_only_when_no_replica_answered() {
    let labelled = |name: &str, store: Arc<dyn Store>, replica: &str| StoreTarget {
        label_sets: vec![Labels::from_pairs([("cluster", "c0"), ("replica", replica)])],
        min_time: 0,
        max_time: i64::MAX,
        ..StoreTarget::new(name, store)
    };
    let pair = || vec![labelled("a:1", Arc::new(memory(|_| true)), "a"), labelled("b:1", Arc::new(Refuses), "b")];
    let strict = || QueryScope::new(false, true);
    let req = gpu_util();
    let whole = Fanout::new(pair(), Duration::from_secs(2)).with_replica_labels(vec!["replica".into()]);
    for select in [true, false] {
        let scope = strict();
        let got = if select {
            scope.clone().run(whole.select(&req)).await.map(|s| s.len())
        } else {
            scope.clone().run(whole.series(&req.matchers, i64::MIN, i64::MAX)).await.map(|s| s.len())
        };
        assert_eq!(got.unwrap(), 3, "replica a answered: the answer is whole");
        assert!(
            scope.warnings().iter().any(|w| w.contains("b:1")),
            "the failure is still named: {:?}",
            scope.warnings()
        );
    }
    // Later in the same request, asked for replica b alone: no replica of it is asked, so
    // its earlier failure fails this call.
    let scope = strict();
    scope.clone().run(whole.select(&req)).await.unwrap();
    let mut only_b = req.clone();
    only_b.matchers.push(Matcher::eq("replica", "b"));
    let err = scope.clone().run(whole.select(&only_b)).await.unwrap_err().to_string();
    assert!(err.contains("b:1") && err.contains("failed earlier"), "{err}");
    assert!(scope.run(whole.series(&only_b.matchers, i64::MIN, i64::MAX)).await.is_err());
    // With dedup=false every replica's series are asked for: no stand-in.
    assert!(QueryScope::new(false, false).run(whole.select(&req)).await.is_err());
    // Replica labels unknown to the fan-out, or the replica's data younger than the request:
    // the failure fails the request.
    let unknown = Fanout::new(pair(), Duration::from_secs(2));
    assert!(strict().run(unknown.select(&req)).await.is_err());
    let mut young = pair();
    young[0].min_time = 500_000;
    let young = Fanout::new(young, Duration::from_secs(2)).with_replica_labels(vec!["replica".into()]);
    assert!(strict().run(young.select(&req)).await.is_err());
    assert!(strict().run(young.series(&req.matchers, i64::MIN, i64::MAX)).await.is_err());
    // Both replicas down: no cover.
    let both = vec![labelled("a:1", Arc::new(Refuses), "a"), labelled("b:1", Arc::new(Refuses), "b")];
    let both = Fanout::new(both, Duration::from_secs(2)).with_replica_labels(vec!["replica".into()]);
    assert!(strict().run(both.select(&req)).await.is_err());
}
