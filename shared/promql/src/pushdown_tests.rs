//! Pushdown gives what evaluating above gives: the same queries over a store that
//! evaluates leaves itself and over one that only selects, with every answer, annotation
//! and error compared.

use crate::pushdown::Evaluating;
use crate::{Engine, EngineOptions, QueryStats, QueryValue};
use strata_model::{stale_nan, Labels, MetricType, Sample};
use strata_store::memory::MemoryStore;
use strata_store::Store;

fn data() -> MemoryStore {
    let mut m = MemoryStore::default();
    let l = |pairs: &[(&str, &str)]| Labels::from_pairs(pairs.iter().map(|(k, v)| (*k, v.to_string())));
    // Counters scraped every 15 s, one with a reset and a missing stretch.
    for (job, reset) in [("a", 400), ("b", 0)] {
        let samples = (0..=240)
            .filter(|i| !(100..110).contains(i) || reset == 0)
            .map(|i| Sample::new(i * 15_000, if reset > 0 && i >= 200 { (i - 200) as f64 } else { i as f64 * 3.0 }));
        m.add(l(&[("__name__", "c_total"), ("job", job)]), MetricType::Counter, samples);
    }
    m.add(
        l(&[("__name__", "d_total"), ("job", "a")]),
        MetricType::Counter,
        (0..=240).map(|i| Sample::new(i * 15_000, i as f64)),
    );
    // A gauge that goes stale for a while.
    let gauge =
        (0..=240).map(|i| Sample::new(i * 15_000 + 3, if i == 120 { stale_nan() } else { (i % 17) as f64 / 4.0 }));
    m.add(
        l(&[("__name__", "g"), ("job", "a")]),
        MetricType::Gauge,
        gauge.filter(|s| !(121..130).contains(&(s.t / 15_000))),
    );
    m.add(l(&[("__name__", "g"), ("job", "b")]), MetricType::Gauge, (0..=240).map(|i| Sample::new(i * 15_000, 1.5)));
    m
}

type Answer = Result<(QueryValue, Vec<String>, Vec<String>, u64), String>;

fn run(store: &dyn Store, q: &str, range: bool, delayed: bool) -> Answer {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().map_err(|e| e.to_string())?;
    let engine = Engine::new(EngineOptions { delayed_name_removal: delayed, ..Default::default() });
    let expr = crate::parse(q).map_err(|e| e.to_string())?;
    let answer: Result<(QueryValue, QueryStats), _> = rt.block_on(async {
        if range {
            engine.range_with_stats(store, &expr, 0, 3_600_000, 60_000, false).await
        } else {
            engine.instant_with_stats(store, &expr, 1_830_000, false).await
        }
    });
    let (v, s) = answer.map_err(|e| e.to_string())?;
    Ok((v, s.warnings, s.infos, s.total_queryable_samples))
}

#[test]
fn pushed_leaves_answer_as_the_engine_does() {
    let plain = data();
    let pushing = Evaluating::new(data());
    // (query, a leaf pushed, the aggregation pushed too)
    let queries = [
        ("rate(c_total[5m])", true, false),
        ("sum by (job) (increase(c_total[10m]))", true, true),
        ("avg_over_time(g[10m] offset 5m)", true, false),
        ("last_over_time(g[5m])", true, false),
        ("resets(c_total[30m]) + changes(g[15m])", true, false),
        ("g", true, false),
        ("g > 1 or c_total", true, false),
        ("irate(c_total[1m]) * 2", true, false),
        ("deriv(g[10m] offset -2m)", true, false),
        ("rate({__name__=~\"c_total|d_total\"}[5m])", true, false),
        ("label_replace(rate({job=\"a\"}[5m]), \"from\", \"$1\", \"__name__\", \"(.+)\")", true, false),
        ("quantile by (job) (0.5, stddev_over_time(g[20m]))", true, true),
        ("count_over_time(nothing[5m])", true, false),
        ("count by (job) (max_over_time(g[5m]) > 1)", true, true),
        ("avg(g > 0.5) by (job)", true, true),
        ("max without (job) (g offset 1m)", true, true),
        ("sum by (__name__) (rate(c_total[5m]))", true, false),
        ("sum(rate(c_total[5m]) > bool 0)", true, false),
        ("topk(1, g)", true, false),
        ("stddev(c_total)", true, true),
        ("sum(nothing)", true, true),
        ("sum by (job) (rate(c_total[5m] offset -1m))", true, true),
        ("min(g offset 90s > 0.25)", true, true),
    ];
    let (mut pushed_before, mut aggregated_before) = (0, 0);
    for (q, expect_push, expect_aggregate) in queries {
        for range in [true, false] {
            for delayed in [false, true] {
                let want = run(&plain, q, range, delayed);
                let got = run(&pushing, q, range, delayed);
                assert_eq!(got, want, "{q} (range {range}, delayed name removal {delayed})");
                let (pushed, aggregated) = (pushing.evaluated(), pushing.aggregated());
                assert_eq!(pushed > pushed_before, expect_push, "{q}: pushed or not");
                assert_eq!(aggregated > aggregated_before, expect_aggregate, "{q}: aggregated or not");
                (pushed_before, aggregated_before) = (pushed, aggregated);
            }
        }
    }
}

#[test]
fn leaves_that_read_times_or_another_grid_stay_above() {
    let pushing = Evaluating::new(data());
    for q in [
        "timestamp(g)",
        "max_over_time(g[10m:1m])",
        "rate(c_total[5m] @ 600)",
        "g @ 600",
        "quantile_over_time(0.5, g[5m])",
    ] {
        let want = run(&data(), q, true, false);
        assert_eq!(run(&pushing, q, true, false), want, "{q}");
    }
    assert_eq!(pushing.evaluated(), 0);
}

#[test]
fn a_part_a_store_cannot_take_is_declined_not_failed() {
    use strata_store::{AggregateSpec, StepsRequest};
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let store = Evaluating::new(data());
    let req = |aggregate: AggregateSpec| StepsRequest {
        aggregate: Some(aggregate),
        ..StepsRequest::new(vec![strata_model::Matcher::eq("__name__", "g")], (0, 600_000, 60_000), 300_000)
    };
    let spec = AggregateSpec { op: "sum".into(), param: None, without: false, labels: vec![], filter: None };
    let declined = [
        AggregateSpec { op: "topk".into(), ..spec.clone() },
        AggregateSpec { labels: vec!["bad label".into()], ..spec.clone() },
        AggregateSpec { filter: Some(("=~".into(), 1.0)), ..spec.clone() },
        AggregateSpec { param: Some(f64::NAN), ..spec.clone() },
    ];
    for d in declined {
        let got = rt.block_on(store.steps(&req(d.clone())));
        assert!(matches!(got, Ok(None)), "{d:?}: {got:?}");
    }
    assert!(matches!(rt.block_on(store.steps(&req(spec))), Ok(Some(_))));
}
