//! The conformance suite every [`Store`] implementation runs.
//!
//! An implementation provides a constructor that loads a fixed data set (series with their
//! metric types and samples) and returns the store; [`run_all`] then checks selection by
//! every matcher kind, time ranges, ordering, special values, label queries, metadata and
//! limits. A test in each implementation's crate calls it.

use crate::{SelectLimits, SelectRequest, Store, StoreError};
use strata_model::{stale_nan, Labels, MatchOp, Matcher, MetricType, Sample, STALE_NAN_BITS};

/// One series of the fixed data set.
pub struct FixtureSeries {
    pub labels: Labels,
    pub metric_type: MetricType,
    pub samples: Vec<Sample>,
}

/// The data set: 3 GPUs × 2 metrics and an irregular series, 1 h at 15 s, plus one
/// series long enough to fill two chunks and start a third: a store that seals as the head
/// does holds one in the block encoding and one kept in the streaming encoding by its
/// staleness marker.
pub fn fixture() -> Vec<FixtureSeries> {
    let mut out = Vec::new();
    for gpu in 0..3 {
        for (name, ty) in
            [("DCGM_FI_DEV_GPU_UTIL", MetricType::Gauge), ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", MetricType::Counter)]
        {
            let labels = Labels::from_pairs([
                ("__name__", name.to_string()),
                ("gpu", gpu.to_string()),
                ("Hostname", format!("node-{}", gpu % 2)),
            ]);
            let samples = (0..240)
                .map(|i| {
                    let t = 1_700_000_000_000 + i * 15_000 + gpu * 7;
                    let v =
                        if ty == MetricType::Counter { (i * 1000 + gpu) as f64 } else { ((i * 7 + gpu) % 101) as f64 };
                    Sample::new(t, v)
                })
                .collect();
            out.push(FixtureSeries { labels, metric_type: ty, samples });
        }
    }
    out.push(FixtureSeries {
        labels: Labels::from_pairs([("__name__", "odd_values"), ("kind", "special")]),
        metric_type: MetricType::Unknown,
        samples: vec![
            Sample::new(1_700_000_000_000, f64::NAN),
            Sample::new(1_700_000_001_000, f64::INFINITY),
            Sample::new(1_700_000_002_000, f64::NEG_INFINITY),
            Sample::new(1_700_000_003_000, stale_nan()),
            Sample::new(1_700_000_004_000, -0.5),
        ],
    });
    out.push(FixtureSeries {
        labels: Labels::from_pairs([("__name__", "DCGM_FI_DEV_POWER_USAGE"), ("gpu", "0"), ("Hostname", "node-0")]),
        metric_type: MetricType::Gauge,
        samples: (0..LONG)
            .map(|i| {
                // Scrape jitter of a few ms, three-decimal readings, one stale marker.
                let t = T0 + i * 15_000 + (i * 7919 % 23);
                let v = if i == 1_000 { stale_nan() } else { (300_000 + (i * 104_729 % 9_973)) as f64 / 1000.0 };
                Sample::new(t, v)
            })
            .collect(),
    });
    out
}

/// Samples of the long series: more than two chunks of 960.
const LONG: i64 = 2_500;
const T_LONG_END: i64 = T0 + LONG * 15_000;

fn m(op: MatchOp, n: &str, v: &str) -> Matcher {
    Matcher::new(op, n, v).expect("valid matcher")
}

const T0: i64 = 1_700_000_000_000;
const T_END: i64 = T0 + 240 * 15_000;

/// Runs every check against a store loaded with [`fixture`].
pub async fn run_all<S: Store>(store: &S) {
    select_by_every_matcher(store).await;
    select_returns_exact_samples_sorted(store).await;
    time_range_filters_series_and_samples(store).await;
    special_values_survive(store).await;
    label_queries(store).await;
    metadata_and_types(store).await;
    limits_are_errors(store).await;
    empty_matchers_are_refused(store).await;
    batches_hold_the_selection_in_order(store).await;
}

/// `select_batches` hands over what `select` returns, in the request's order: by labels,
/// or by labels without `order_without` (here `Hostname`, which sorts first).
async fn batches_hold_the_selection_in_order(store: &impl Store) {
    let ids = |v: &[crate::SeriesChunks]| -> Vec<(String, usize)> {
        v.iter().map(|s| (s.labels.to_string(), s.chunks.iter().map(|c| c.n as usize).sum())).collect()
    };
    let mut req = SelectRequest::new(vec![m(MatchOp::Regex, "__name__", "DCGM_.*")], T0, T_END);
    let whole = store.select(&req).await.expect("select");
    let streamed = crate::collect_batches(store.select_batches(&req).await.expect("batches")).await.expect("batches");
    assert_eq!(ids(&streamed), ids(&whole));
    req.order_without = vec!["Hostname".into()];
    let reordered = crate::collect_batches(store.select_batches(&req).await.expect("batches")).await.expect("batches");
    let mut want = whole.clone();
    want.sort_by(|a, b| crate::selection_order(&a.labels, &b.labels, &req.order_without));
    assert_eq!(ids(&reordered), ids(&want), "ordered without Hostname");
    assert_ne!(ids(&want), ids(&whole), "the fixture orders differently without Hostname");
}

async fn names(store: &impl Store, ms: Vec<Matcher>) -> Vec<String> {
    let r = store.select(&SelectRequest::new(ms, T0, T_END)).await.expect("select");
    r.iter().map(|s| s.labels.to_string()).collect()
}

async fn select_by_every_matcher(store: &impl Store) {
    use MatchOp::*;
    assert_eq!(names(store, vec![m(Equal, "__name__", "DCGM_FI_DEV_GPU_UTIL")]).await.len(), 3);
    assert_eq!(
        names(store, vec![m(Equal, "__name__", "DCGM_FI_DEV_GPU_UTIL"), m(NotEqual, "gpu", "1")]).await.len(),
        2
    );
    assert_eq!(names(store, vec![m(Regex, "__name__", "DCGM_.*"), m(Regex, "gpu", "0|2")]).await.len(), 5);
    assert_eq!(
        names(store, vec![m(Regex, "__name__", ".+"), m(NotRegex, "Hostname", "node-0")]).await.len(),
        3,
        "node-1 twice plus the series without Hostname"
    );
    assert_eq!(
        names(store, vec![m(Regex, "__name__", ".+"), m(Equal, "gpu", "")]).await,
        ["odd_values{kind=\"special\"}"]
    );
    assert!(names(store, vec![m(Equal, "__name__", "nope")]).await.is_empty());
}

async fn select_returns_exact_samples_sorted(store: &impl Store) {
    let r = store
        .select(&SelectRequest::new(vec![m(MatchOp::Regex, "__name__", "DCGM_.*")], T0, T_LONG_END))
        .await
        .expect("select");
    let labels: Vec<_> = r.iter().map(|s| s.labels.clone()).collect();
    let mut sorted = labels.clone();
    sorted.sort();
    assert_eq!(labels, sorted, "series are sorted by labels");
    for f in fixture().into_iter().filter(|f| f.labels.metric_name().is_some_and(|n| n.starts_with("DCGM"))) {
        let got = r.iter().find(|s| s.labels == f.labels).expect("every fixture series is returned");
        let samples = got.samples(T0, T_LONG_END).expect("decodes");
        assert_eq!(samples.len(), f.samples.len());
        assert!(samples.iter().zip(&f.samples).all(|(a, b)| a.bit_eq(b)), "{} samples differ", f.labels);
    }
}

async fn time_range_filters_series_and_samples(store: &impl Store) {
    let ms = vec![m(MatchOp::Equal, "__name__", "DCGM_FI_DEV_GPU_UTIL"), m(MatchOp::Equal, "gpu", "0")];
    let (a, b) = (T0 + 60_000, T0 + 120_000);
    let r = store.select(&SelectRequest::new(ms.clone(), a, b)).await.expect("select");
    let s = r[0].samples(a, b).expect("decodes");
    assert_eq!(s.first().map(|x| x.t), Some(T0 + 60_000));
    assert_eq!(s.last().map(|x| x.t), Some(T0 + 120_000), "bounds are inclusive");
    assert_eq!(s.len(), 5);
    let r =
        store.select(&SelectRequest::new(ms, T_LONG_END + 1_000_000, T_LONG_END + 2_000_000)).await.expect("select");
    assert!(r.is_empty(), "no series without samples in range");
    // A cut through the middle of sealed chunks.
    let ms = vec![m(MatchOp::Equal, "__name__", "DCGM_FI_DEV_POWER_USAGE")];
    let (a, b) = (T0 + 900 * 15_000 + 5, T0 + 2_100 * 15_000);
    let r = store.select(&SelectRequest::new(ms, a, b)).await.expect("select");
    let got = r[0].samples(a, b).expect("decodes");
    let want: Vec<Sample> =
        fixture().pop().expect("the long series").samples.into_iter().filter(|s| s.t >= a && s.t <= b).collect();
    assert_eq!(got.len(), want.len());
    assert!(got.iter().zip(&want).all(|(x, y)| x.bit_eq(y)), "samples cut from sealed chunks differ");
}

async fn special_values_survive(store: &impl Store) {
    let r =
        store.select(&SelectRequest::new(vec![m(MatchOp::Equal, "kind", "special")], T0, T_END)).await.expect("select");
    let s = r[0].samples(T0, T_END).expect("decodes");
    assert!(s[0].v.is_nan() && s[0].v.to_bits() != STALE_NAN_BITS);
    assert_eq!(s[1].v, f64::INFINITY);
    assert_eq!(s[2].v, f64::NEG_INFINITY);
    assert_eq!(s[3].v.to_bits(), STALE_NAN_BITS, "staleness markers are kept bit-exact");
    assert_eq!(s[4].v, -0.5);
}

async fn label_queries(store: &impl Store) {
    let names = store.label_names(&[], T0, T_END).await.expect("names");
    assert_eq!(names, ["Hostname", "__name__", "gpu", "kind"]);
    let vals = store.label_values("gpu", &[], T0, T_END).await.expect("values");
    assert_eq!(vals, ["0", "1", "2"]);
    let ms = [m(MatchOp::Equal, "Hostname", "node-1")];
    assert_eq!(store.label_values("gpu", &ms, T0, T_END).await.expect("values"), ["1"]);
    assert_eq!(store.label_names(&ms, T0, T_END).await.expect("names"), ["Hostname", "__name__", "gpu"]);
    let series = store.series(&ms, T0, T_END).await.expect("series");
    assert_eq!(series.len(), 2);
}

async fn metadata_and_types(store: &impl Store) {
    let r = store.select(&SelectRequest::new(vec![m(MatchOp::Equal, "gpu", "0")], T0, T_END)).await.expect("select");
    for s in &r {
        let want = if s.labels.metric_name() == Some("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") {
            MetricType::Counter
        } else {
            MetricType::Gauge
        };
        assert_eq!(s.metric_type, want, "{}", s.labels);
    }
    let md = store.metadata(Some("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")).await.expect("metadata");
    assert_eq!(md.len(), 1);
    assert_eq!(md[0].1.metric_type, MetricType::Counter);
}

async fn limits_are_errors(store: &impl Store) {
    let mut req = SelectRequest::new(vec![m(MatchOp::Regex, "__name__", "DCGM_.*")], T0, T_END);
    req.limits = SelectLimits { max_series: 2, max_samples: u64::MAX };
    assert!(matches!(store.select(&req).await, Err(StoreError::LimitExceeded { what: "series", .. })));
    req.limits = SelectLimits { max_series: 100, max_samples: 300 };
    assert!(matches!(store.select(&req).await, Err(StoreError::LimitExceeded { what: "samples", .. })));
}

async fn empty_matchers_are_refused(store: &impl Store) {
    let r = store.select(&SelectRequest::new(vec![m(MatchOp::Regex, "gpu", ".*")], T0, T_END)).await;
    assert!(matches!(r, Err(StoreError::InvalidRequest(_))));
}
