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

/// Replicas behind one store, as a fan-out shows them, with replica `b` able to go down:
/// asked for `b` alone it fails; asked for every replica it answers with the others (a
/// fan-out that lets a twin stand in for a failed replica).
struct ReplicaBDown {
    inner: Evaluating<MemoryStore>,
    down: std::sync::atomic::AtomicBool,
}

impl ReplicaBDown {
    fn down(&self) -> bool {
        self.down.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn only_b(&self, matchers: &[Matcher]) -> Result<(), StoreError> {
        let asks_b =
            matchers.iter().any(|m| m.name == "replica" && m.op == strata_model::MatchOp::Equal && m.value == "b");
        match self.down() && asks_b {
            true => Err(StoreError::Unavailable("store b: connection refused".into())),
            false => Ok(()),
        }
    }

    fn kept(&self, l: &Labels) -> bool {
        !(self.down() && l.get("replica") == Some("b"))
    }
}

#[async_trait::async_trait]
impl Store for ReplicaBDown {
    async fn select_within(
        &self,
        r: &strata_store::SelectRequest,
        b: &mut strata_store::SelectBudget,
    ) -> Result<Vec<strata_store::SeriesChunks>, StoreError> {
        self.only_b(&r.matchers)?;
        Ok(self.inner.select_within(r, b).await?.into_iter().filter(|s| self.kept(&s.labels)).collect())
    }
    async fn series_within(
        &self,
        m: &[Matcher],
        s: i64,
        e: i64,
        b: &mut strata_store::SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        self.only_b(m)?;
        Ok(self.inner.series_within(m, s, e, b).await?.into_iter().filter(|l| self.kept(l)).collect())
    }
    async fn label_names(&self, m: &[Matcher], s: i64, e: i64) -> Result<Vec<String>, StoreError> {
        self.inner.label_names(m, s, e).await
    }
    async fn label_values(&self, n: &str, m: &[Matcher], s: i64, e: i64) -> Result<Vec<String>, StoreError> {
        self.inner.label_values(n, m, s, e).await
    }
    async fn metadata(&self, m: Option<&str>) -> Result<Vec<(String, strata_model::Metadata)>, StoreError> {
        self.inner.metadata(m).await
    }
    async fn steps(&self, req: &StepsRequest) -> Result<Option<Steps>, StoreError> {
        self.only_b(&req.matchers)?;
        Ok(self.inner.steps(req).await?.map(|mut s| {
            s.series.retain(|x| self.kept(&x.labels));
            s.groups.retain(|x| self.kept(&x.labels));
            s
        }))
    }
}

#[test]
fn a_guessed_replica_that_goes_down_is_stood_in_for_when_partial_response_is_off() {
    let build = |m: &mut MemoryStore, with_b: bool| {
        // Replica a has a gap, so the merge follows b and the guess becomes `replica="b"`.
        add_replica(m, "a", 0, 15, |t| !(1_200_000..1_800_000).contains(&t));
        if with_b {
            add_replica(m, "b", 3, 15, |_| true);
        }
    };
    let mut m = MemoryStore::default();
    build(&mut m, true);
    let store = Arc::new(ReplicaBDown { inner: Evaluating::new(m), down: false.into() });
    let pushing = ReplicaDedup::new(store.clone(), vec!["replica".into()]);
    let mut only_a = MemoryStore::default();
    build(&mut only_a, false);
    let merging = ReplicaDedup::new(Arc::new(only_a), vec!["replica".into()]);
    let strict = |dedup: &ReplicaDedup, q: &str| -> Result<QueryValue, String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().map_err(|e| e.to_string())?;
        let expr = strata_promql::parse(q).map_err(|e| e.to_string())?;
        let engine = Engine::new(EngineOptions::default());
        rt.block_on(QueryScope::new(false, true).run(engine.range(dedup, &expr, 600_000, 3_600_000, 30_000)))
            .map_err(|e| e.to_string())
    };
    for q in ["max_over_time(g[2m])", "sum(rate(c_total[5m]))"] {
        strict(&pushing, q).unwrap_or_else(|e| panic!("{q} with both replicas up: {e}"));
        store.down.store(true, std::sync::atomic::Ordering::SeqCst);
        let got = strict(&pushing, q);
        assert_eq!(got, strict(&merging, q), "{q}: replica b down, a stands in");
        assert!(got.is_ok(), "{q}: {got:?}");
        store.down.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}
