//! Pushdown through the dedup gives the dedup's answer: the same queries over replicas
//! whose stores evaluate leaves and over replicas that only select, with the leaf pushed
//! exactly when a replica of every series would pass whole.

use super::*;
use strata_model::Labels;
use strata_model::Sample;
use strata_promql::pushdown::Evaluating;
use strata_promql::{Engine, EngineOptions, QueryValue};
use strata_store::memory::MemoryStore;

/// A 1/s counter scraped every `every` s from `offset` s for an hour, and a gauge beside it,
/// for replica `replica`, keeping the scrapes `keep` accepts.
fn add_replica(m: &mut MemoryStore, replica: &str, offset: i64, every: i64, keep: impl Fn(i64) -> bool) {
    add_gpu(m, "0", replica, offset, every, keep)
}

fn add_gpu(m: &mut MemoryStore, gpu: &str, replica: &str, offset: i64, every: i64, keep: impl Fn(i64) -> bool) {
    let l = |name: &str| Labels::from_pairs([("__name__", name), ("gpu", gpu), ("replica", replica)]);
    let times: Vec<i64> =
        (0..).map(|k| (offset + k * every) * 1000).take_while(|&t| t <= 3_600_000).filter(|&t| keep(t)).collect();
    m.add(l("c_total"), MetricType::Counter, times.iter().map(|&t| Sample::new(t, (t / 1000) as f64)));
    m.add(l("g"), MetricType::Gauge, times.iter().map(|&t| Sample::new(t, ((t / 1000) % 97) as f64)));
}

fn answer(dedup: &ReplicaDedup, q: &str) -> Result<QueryValue, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().map_err(|e| e.to_string())?;
    let expr = strata_promql::parse(q).map_err(|e| e.to_string())?;
    let engine = Engine::new(EngineOptions::default());
    rt.block_on(QueryScope::new(true, true).run(engine.range(dedup, &expr, 600_000, 3_600_000, 30_000)))
        .map_err(|e| e.to_string())
}

/// Fills a store with a scenario's replicas.
type Build = Box<dyn Fn(&mut MemoryStore)>;

const MIXED: &str = "each replica whole for one series of two";

#[test]
fn pushed_leaves_through_the_dedup_answer_as_merged_samples_do() {
    // About one scrape in ten missing, at places that depend on the seed.
    let holes = |seed: i64| move |t: i64| ((t / 1000 + seed) * 2_654_435_761) % 97 >= 10;
    let scenarios: Vec<(&str, Build, bool)> = vec![
        (
            "identical replicas",
            Box::new(|m| {
                add_replica(m, "a", 0, 15, |_| true);
                add_replica(m, "b", 0, 15, |_| true);
            }),
            true,
        ),
        (
            "replicas 15 s apart, 30 s scrapes",
            Box::new(|m| {
                add_replica(m, "a", 0, 30, |_| true);
                add_replica(m, "b", 15, 30, |_| true);
            }),
            true,
        ),
        (
            "one replica missing a tenth of its scrapes",
            Box::new(move |m| {
                add_replica(m, "a", 0, 15, holes(3));
                add_replica(m, "b", 5, 15, |_| true);
            }),
            true,
        ),
        (
            "both replicas with gaps: merged sample by sample",
            Box::new(move |m| {
                add_replica(m, "a", 0, 15, holes(3));
                add_replica(m, "b", 5, 15, holes(5));
            }),
            false,
        ),
    ];
    // (query, an aggregation a store may take)
    let queries = [
        ("rate(c_total[5m])", false),
        ("resets(c_total[30m])", false),
        ("sum(increase(c_total[10m]))", true),
        ("g", false),
        ("max_over_time(g[2m])", false),
        ("avg by (gpu) (rate(c_total[5m]))", true),
        ("count(g > 10)", true),
        ("max without (gpu) (g)", true),
        ("sum by (replica) (g)", false),
    ];
    for (what, build, whole) in scenarios {
        let mut m = MemoryStore::default();
        build(&mut m);
        let mut plain = MemoryStore::default();
        build(&mut plain);
        let evaluating = Arc::new(Evaluating::new(m));
        let pushing = ReplicaDedup::new(evaluating.clone(), vec!["replica".into()]);
        let merging = ReplicaDedup::new(Arc::new(plain), vec!["replica".into()]);
        for (q, aggregation) in queries {
            // Twice: without a guess of the replica, then with the one the first left.
            for round in ["first", "second"] {
                let (before, aggregated) = (evaluating.evaluated(), evaluating.aggregated());
                let got = answer(&pushing, q);
                assert_eq!(got, answer(&merging, q), "{what}: {q} ({round})");
                assert!(matches!(got, Ok(QueryValue::Matrix(ref v)) if !v.is_empty()), "{what}: {q}: {got:?}");
                assert_eq!(evaluating.evaluated() > before, whole, "{what}: {q} ({round}): pushed down or not");
                // Aggregated by a store once a guess (left by the leaves before) holds every
                // series whole.
                let expect = aggregation && whole && what != MIXED;
                assert_eq!(evaluating.aggregated() > aggregated, expect, "{what}: {q} ({round}): aggregated or not");
            }
        }
    }
}
