use super::samples::{merge, merge_replicas, Merged};
use super::*;
use strata_model::{stale_nan, Labels, Sample};
use strata_store::conformance::{fixture, run_all};
use strata_store::memory::MemoryStore;

#[tokio::test]
async fn dedup_over_two_identical_replicas_passes_the_conformance_suite() {
    let mut m = MemoryStore::default();
    for replica in ["a", "b"] {
        for s in fixture() {
            let family = s.labels.metric_name().unwrap_or_default().to_string();
            m.set_metadata(&family, Metadata { metric_type: s.metric_type, help: String::new(), unit: String::new() });
            let mut pairs: Vec<(String, String)> =
                s.labels.iter().map(|l| (l.name.to_string(), l.value.to_string())).collect();
            pairs.push(("replica".into(), replica.into()));
            m.add(Labels::from_pairs(pairs), s.metric_type, s.samples);
        }
    }
    run_all(&ReplicaDedup::new(Arc::new(m), vec!["replica".into()])).await;
}

/// The merge's output as samples (a whole replica, or the merged samples).
fn merged(reps: &[Vec<Sample>], counter: bool) -> Vec<Sample> {
    match merge(reps, counter) {
        Merged::Replica(k) => reps[k].clone(),
        Merged::Samples(v) => v,
    }
}

/// A counter's resets, as PromQL's `resets()` counts them.
fn resets(s: &[Sample]) -> usize {
    s.windows(2).filter(|w| w[1].v < w[0].v).count()
}

/// `rate` over `[t - range, t]` as the raw extrapolation-free slope with resets handled:
/// enough to tell an exact 1/s from a glitch.
fn increase_between(s: &[Sample], from: i64, to: i64) -> f64 {
    let w: Vec<&Sample> = s.iter().filter(|x| x.t >= from && x.t <= to).collect();
    let mut inc = 0.0;
    for p in w.windows(2) {
        inc += if p[1].v >= p[0].v { p[1].v - p[0].v } else { p[1].v };
    }
    inc
}

/// A 1/s counter with resets at the given seconds, read at `t` ms.
fn counter_at(t: i64, resets_at: &[i64]) -> f64 {
    let since = resets_at.iter().filter(|&&r| r * 1000 <= t).max().map(|r| r * 1000).unwrap_or(0);
    ((t - since) / 1000) as f64
}

fn scrape(offset_s: i64, every_s: i64, until_s: i64, resets_at: &[i64], keep: impl Fn(i64) -> bool) -> Vec<Sample> {
    (0..)
        .map(|k| (offset_s + k * every_s) * 1000)
        .take_while(|&t| t <= until_s * 1000)
        .filter(|&t| keep(t))
        .map(|t| Sample::new(t, counter_at(t, resets_at)))
        .collect()
}

#[test]
fn a_counter_scraped_by_two_offset_replicas_has_a_rate_of_exactly_one() {
    // thanos-io/thanos 1326 and 2401: a 1/s counter, 30 s scrapes, replicas 15 s apart.
    let a = scrape(0, 30, 3600, &[], |_| true);
    let b = scrape(15, 30, 3600, &[], |_| true);
    for out in
        [vec![a.clone(), b.clone()], vec![b, a]].into_iter().flat_map(|r| [merge_replicas(&r, true), merged(&r, true)])
    {
        assert_eq!(resets(&out), 0);
        for end in (600..=3600).step_by(60) {
            let (from, to) = ((end - 300) * 1000, end * 1000);
            let w: Vec<&Sample> = out.iter().filter(|x| x.t >= from && x.t <= to).collect();
            let (first, last) = (w[0], w[w.len() - 1]);
            let slope = increase_between(&out, from, to) / ((last.t - first.t) as f64 / 1000.0);
            assert_eq!(slope, 1.0, "window ending {end} s");
        }
    }
}

#[test]
fn a_replica_missing_scrapes_is_filled_from_the_other_without_gaps_or_false_resets() {
    let true_resets = [700, 1900, 3100];
    // A deterministic 10 % of replica A's scrapes lost.
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut lost = std::collections::HashSet::new();
    for k in 0..121 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if x.is_multiple_of(10) {
            lost.insert(k * 30_000);
        }
    }
    assert!(lost.len() >= 6, "the draw lost {} scrapes", lost.len());
    let a = scrape(0, 30, 3600, &true_resets, |t| !lost.contains(&t));
    let b = scrape(15, 30, 3600, &true_resets, |_| true);
    for out in [vec![a.clone(), b.clone()], vec![b.clone(), a.clone()]]
        .into_iter()
        .flat_map(|r| [merge_replicas(&r, true), merged(&r, true)])
    {
        let worst = out.windows(2).map(|w| w[1].t - w[0].t).max().unwrap();
        assert!(worst <= 45_000, "an output gap of {worst} ms");
        assert_eq!(resets(&out), true_resets.len(), "resets()");
        assert!(out.windows(2).all(|w| w[0].t < w[1].t));
    }
}

#[test]
fn replicas_that_see_a_reset_at_different_times_give_one_reset_and_no_jump() {
    // thanos-io/thanos 1326: replica A sees the reset first (at 990 s), replica B's view
    // lags (it still reads the pre-reset value at 1005 s, and the reset at 1035 s). A then
    // loses scrapes, so the output must switch to B right after A's reset: taking B's
    // pre-reset value would jump back up by ~1000 and count the reset twice.
    let a = scrape(0, 30, 2000, &[990], |t| !(1_020_000..=1_200_000).contains(&t));
    let b: Vec<Sample> = scrape(15, 30, 2000, &[1035], |_| true)
        .into_iter()
        .map(|s| if s.t == 1_005_000 { Sample::new(s.t, 1004.0) } else { s })
        .collect();
    let out = merge_replicas(&[a, b], true);
    assert_eq!(resets(&out), 1, "{:?}", &out[30..45]);
    // No step larger than a scrape's worth of increase (30 per 30 s, 45 across a switch).
    let jump = out.windows(2).filter(|w| w[1].v >= w[0].v).map(|w| w[1].v - w[0].v).fold(0.0, f64::max);
    assert!(jump <= 45.0, "a jump of {jump}");
    let worst = out.windows(2).map(|w| w[1].t - w[0].t).max().unwrap();
    assert!(worst <= 75_000, "an output gap of {worst} ms");
}

#[test]
fn a_lagging_sample_at_a_switch_is_not_a_reset() {
    // thanos-io/thanos 7623: after a switch, the other replica's next sample is a little
    // lower than the last one emitted though it is later (it read the counter earlier).
    let a = vec![Sample::new(0, 100.0), Sample::new(30_000, 130.0), Sample::new(60_000, 160.0)];
    let b = vec![
        Sample::new(15_000, 115.0),
        Sample::new(45_000, 144.0),
        Sample::new(61_000, 159.0),
        Sample::new(91_000, 190.0),
        Sample::new(121_000, 220.0),
    ];
    let out = merge_replicas(&[a, b], true);
    assert_eq!(resets(&out), 0, "{out:?}");
    assert_eq!(out.last().map(|s| s.v), Some(220.0));
}

#[test]
fn gauges_are_never_averaged_and_a_stale_marker_does_not_cut_the_series() {
    let a: Vec<Sample> =
        (0..10).map(|k| Sample::new(k * 5_000, 50.0 + k as f64)).chain([Sample::new(50_000, stale_nan())]).collect();
    let b: Vec<Sample> = (0..20).map(|k| Sample::new(2_000 + k * 5_000, 70.0 + k as f64)).collect();
    // A ends with a marker B does not show: not complete, so the sample-level merge runs.
    assert!(matches!(merge(&[a.clone(), b.clone()], false), Merged::Replica(1)));
    let out = merge_replicas(&[a.clone(), b.clone()], false);
    for s in &out {
        let from_a = a.iter().any(|x| x.t == s.t && x.v.to_bits() == s.v.to_bits());
        let from_b = b.iter().any(|x| x.t == s.t && x.v.to_bits() == s.v.to_bits());
        assert!(from_a || from_b, "{s:?} is no replica's sample");
    }
    assert!(out.iter().all(|s| !strata_model::is_stale(s.v)), "A's marker ended the series while B went on");
    assert_eq!(out.last().map(|s| s.t), Some(2_000 + 19 * 5_000));
    let worst = out.windows(2).map(|w| w[1].t - w[0].t).max().unwrap();
    assert!(worst <= 7_500, "a gap of {worst} ms");
}

#[tokio::test]
async fn dedup_false_shows_every_replica_and_the_type_comes_from_metadata() {
    let mut m = MemoryStore::default();
    m.set_metadata("energy", Metadata { metric_type: MetricType::Counter, help: String::new(), unit: String::new() });
    for (replica, off) in [("a", 0), ("b", 15)] {
        let labels = Labels::from_pairs([("__name__", "energy"), ("replica", replica)]);
        m.add(labels, MetricType::Counter, scrape(off, 30, 600, &[], |_| true));
    }
    let d = ReplicaDedup::new(Arc::new(m), vec!["replica".into()]);
    let req = SelectRequest::new(vec![Matcher::eq("__name__", "energy")], 0, i64::MAX);
    let merged = d.select(&req).await.unwrap();
    assert_eq!(merged.len(), 1);
    assert_eq!(merged[0].labels, Labels::from_pairs([("__name__", "energy")]));
    assert_eq!(merged[0].metric_type, MetricType::Counter);
    let both = QueryScope::new(true, false).run(d.select(&req)).await.unwrap();
    assert_eq!(both.len(), 2);
    assert!(d.label_names(&[], 0, i64::MAX).await.unwrap().iter().all(|n| n != "replica"));
}

#[test]
fn a_replica_that_covers_the_span_without_gaps_is_the_answer_as_it_is() {
    let a = scrape(0, 30, 600, &[], |t| t != 300_000);
    let b = scrape(15, 30, 600, &[], |_| true);
    assert_eq!(merge(&[a.clone(), b.clone()], true), Merged::Replica(1));
    // Neither complete: the samples are merged.
    let b_gappy = scrape(15, 30, 600, &[], |t| t != 135_000);
    assert!(matches!(merge(&[a, b_gappy], true), Merged::Samples(_)));
}

#[test]
fn covers_needs_the_whole_span_without_gaps_or_markers() {
    let full = scrape(0, 30, 600, &[], |_| true);
    assert!(super::samples::covers(&full, 0, 600_000));
    assert!(super::samples::covers(&full, 10_000, 610_000), "within 1.5 intervals of either end");
    assert!(!super::samples::covers(&full, 0, 700_000), "ends too early");
    let gappy = scrape(0, 30, 600, &[], |t| t != 300_000);
    assert!(!super::samples::covers(&gappy, 0, 600_000));
    let mut stale = full.clone();
    stale[5] = Sample::new(stale[5].t, stale_nan());
    assert!(!super::samples::covers(&stale, 0, 600_000));
}

fn block_chunk(samples: &[Sample]) -> strata_chunk::Chunk {
    let mut a = strata_chunk::ChunkAppender::new();
    for s in samples {
        a.append(s.t, s.v);
    }
    let c = a.seal().compact();
    assert!(c.is_block(), "the test needs block-encoded chunks");
    c
}

#[test]
fn chunk_headers_tell_a_gap_free_replica_without_decoding() {
    // Readings that take the block form (three-decimal noise, as DCGM power readings).
    let s: Vec<Sample> = (0..41)
        .map(|i| Sample::new(i * 30_000 + (i * 7) % 23, (300_000 + i * 104_729 % 9_973) as f64 / 1000.0))
        .collect();
    let (a, b) = s.split_at(20);
    let whole = vec![block_chunk(a), block_chunk(b)];
    assert!(super::covers_by_headers(&whole, 0, 1_200_000));
    assert!(!super::covers_by_headers(&whole, 0, 1_300_000), "short of the span");
    // A missing minute between the chunks, then one inside a chunk.
    let between = vec![block_chunk(&s[..20]), block_chunk(&s[22..])];
    assert!(!super::covers_by_headers(&between, 0, 1_200_000));
    // A gap inside a chunk: whichever encoding it gets, the headers do not vouch for it.
    let inside: Vec<Sample> = s.iter().copied().filter(|x| x.t / 30_000 != 10).collect();
    let mut app = strata_chunk::ChunkAppender::new();
    for x in &inside {
        app.append(x.t, x.v);
    }
    assert!(!super::covers_by_headers(&[app.seal().compact()], 0, 1_200_000));
}

/// A store that hands its selection over one series at a time, so groups of replicas
/// straddle batches.
struct Trickle(MemoryStore);

struct OneByOne(std::vec::IntoIter<SeriesChunks>);

#[async_trait]
impl SeriesBatches for OneByOne {
    async fn next_batch(&mut self) -> Result<Option<Vec<SeriesChunks>>, StoreError> {
        Ok(self.0.next().map(|s| vec![s]))
    }
}

#[async_trait]
impl Store for Trickle {
    async fn select_within(&self, r: &SelectRequest, b: &mut SelectBudget) -> Result<Vec<SeriesChunks>, StoreError> {
        self.0.select_within(r, b).await
    }
    async fn select_batches(&self, req: &SelectRequest) -> Result<BoxBatches, StoreError> {
        let mut found = self.0.select(req).await?;
        found.sort_by(|a, b| strata_store::selection_order(&a.labels, &b.labels, &req.order_without));
        Ok(Box::new(OneByOne(found.into_iter())))
    }
    async fn series_within(
        &self,
        m: &[Matcher],
        s: i64,
        e: i64,
        b: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        self.0.series_within(m, s, e, b).await
    }
    async fn label_names(&self, m: &[Matcher], s: i64, e: i64) -> Result<Vec<String>, StoreError> {
        self.0.label_names(m, s, e).await
    }
    async fn label_values(&self, n: &str, m: &[Matcher], s: i64, e: i64) -> Result<Vec<String>, StoreError> {
        self.0.label_values(n, m, s, e).await
    }
    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        self.0.metadata(metric).await
    }
}

#[tokio::test]
async fn replicas_that_sort_apart_and_straddle_batches_are_one_series_each() {
    // `zone` sorts after `replica`: by whole labels the replicas of a zone are apart.
    let mut m = MemoryStore::default();
    for replica in ["a", "b"] {
        for zone in ["1", "2", "3"] {
            let labels = Labels::from_pairs([("__name__", "x"), ("replica", replica), ("zone", zone)]);
            let keep = |t: i64| replica == "b" || t != 300_000; // a misses a scrape
            m.add(labels, MetricType::Counter, scrape(if replica == "a" { 0 } else { 15 }, 30, 600, &[], keep));
        }
    }
    let d = ReplicaDedup::new(Arc::new(Trickle(m)), vec!["replica".into()]);
    let req = SelectRequest::new(vec![Matcher::eq("__name__", "x")], 0, i64::MAX);
    let got = d.select(&req).await.unwrap();
    let zones: Vec<_> = got.iter().map(|s| s.labels.to_string()).collect();
    assert_eq!(zones, [r#"x{zone="1"}"#, r#"x{zone="2"}"#, r#"x{zone="3"}"#]);
    for s in &got {
        let v = s.samples(0, i64::MAX).unwrap();
        assert!(v.windows(2).all(|w| w[1].t - w[0].t <= 45_000), "{}: a gap", s.labels);
        assert_eq!(resets(&v), 0, "{}", s.labels);
    }
}

/// Findings of the global review: untyped counters, replicas that disagree on a type, a
/// flapping target's markers, a replica that saw a reset before the output did, and one
/// decision of which replica is whole.
mod review {
    use super::*;
    use strata_store::SeriesSummary;

    fn store_of(replicas: &[(&str, MetricType, Vec<Sample>)], name: &str) -> MemoryStore {
        let mut m = MemoryStore::default();
        for (replica, t, samples) in replicas {
            m.add(Labels::from_pairs([("__name__", name), ("replica", replica)]), *t, samples.clone());
        }
        m
    }

    /// A page without `# TYPE` (or remote write before its metadata): the series is
    /// untyped, but its name says counter, and a lagging replica at a switch must not read
    /// as a reset.
    #[tokio::test]
    async fn an_untyped_total_is_merged_as_a_counter() {
        // A stops, B takes over with a reading taken a little before A's last one.
        let a = vec![Sample::new(0, 100.0), Sample::new(30_000, 130.0), Sample::new(60_000, 160.0)];
        let b = vec![
            Sample::new(61_000, 159.0),
            Sample::new(91_000, 190.0),
            Sample::new(121_000, 220.0),
            Sample::new(151_000, 250.0),
        ];
        for name in ["energy_total", "requests_count", "latency_sum", "latency_bucket"] {
            let m = store_of(&[("a", MetricType::Unknown, a.clone()), ("b", MetricType::Unknown, b.clone())], name);
            let d = ReplicaDedup::new(Arc::new(m), vec!["replica".into()]);
            let got = d.select(&SelectRequest::new(vec![Matcher::eq("__name__", name)], 0, i64::MAX)).await.unwrap();
            let v = got[0].samples(0, i64::MAX).unwrap();
            assert_eq!(resets(&v), 0, "{name}: a false reset at the switch: {v:?}");
        }
    }

    /// Replicas that disagree on a series' type: the answer says so instead of letting the
    /// replica order decide in silence.
    #[tokio::test]
    async fn replicas_that_disagree_on_a_type_are_named_in_a_warning() {
        let s = scrape(0, 30, 600, &[], |_| true);
        let m = store_of(&[("a", MetricType::Counter, s.clone()), ("b", MetricType::Gauge, s)], "energy");
        let d = ReplicaDedup::new(Arc::new(m), vec!["replica".into()]);
        let scope = QueryScope::default();
        let req = SelectRequest::new(vec![Matcher::eq("__name__", "energy")], 0, i64::MAX);
        scope.clone().run(d.select(&req)).await.unwrap();
        let w = scope.warnings();
        assert!(w.iter().any(|w| w.contains("energy") && w.contains("counter") && w.contains("gauge")), "{w:?}");
    }

    /// A flapping target: both replicas show a staleness marker every other scrape. The
    /// merge must not scan the other replica whole for each marker (quadratic: minutes of
    /// CPU for one query); it finishes well within a second's work.
    #[test]
    fn a_flapping_targets_markers_merge_in_linear_time() {
        let n = 100_000i64;
        let flap = |off: i64| -> Vec<Sample> {
            (0..n).map(|k| Sample::new(off + k * 5_000, if k % 2 == 1 { stale_nan() } else { k as f64 })).collect()
        };
        // A counter that flaps and resets, seen by both replicas: the counter rule's look
        // at each replica's history must stay linear too.
        let counter = |off: i64| -> Vec<Sample> {
            (0..n)
                .map(|k| Sample::new(off + k * 5_000, if k % 2 == 1 { stale_nan() } else { (k % 1000) as f64 }))
                .collect()
        };
        for (what, a, b, is_counter) in
            [("gauge", flap(0), flap(2_000), false), ("counter", counter(0), counter(2_000), true)]
        {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let out = merge_replicas(&[a, b], is_counter);
                let _ = tx.send(out.len());
            });
            let got = rx.recv_timeout(std::time::Duration::from_secs(5));
            assert!(
                got.is_ok_and(|n| n > 0),
                "{what}: the merge of {n} flapping samples per replica did not finish in 5 s"
            );
        }
    }

    /// thanos-io/thanos 1326, the other way round: replica B reads the reset at 1,005 s,
    /// the output's replica A only at 1,020 s, and A then loses scrapes. B's next sample
    /// (35 at 1,035 s) is after a reset B itself has shown: it belongs in the output.
    #[test]
    fn a_replica_that_saw_the_reset_first_is_followed_at_once() {
        let a = scrape(0, 30, 2000, &[1000], |t| !(1_050_000..=1_200_000).contains(&t));
        let b = scrape(15, 30, 2000, &[1000], |_| true);
        let out = merge_replicas(&[a, b], true);
        assert!(
            out.contains(&Sample::new(1_035_000, 35.0)),
            "B's first sample after the switch was dropped: {:?}",
            &out[30..40]
        );
        assert_eq!(resets(&out), 1);
        let jump = out.windows(2).filter(|w| w[1].v >= w[0].v).map(|w| w[1].v - w[0].v).fold(0.0, f64::max);
        assert!(jump <= 45.0, "a jump of {jump}");
    }

    /// One decision of which replica is whole: for every group, when the summaries name a
    /// replica (what pushdown evaluates), the merge passes exactly that one; when they do
    /// not, the merge merges samples and never passes some replica by another rule.
    #[test]
    fn the_merge_and_pushdown_decide_which_replica_is_whole_alike() {
        let full = |off: i64, every: i64, from: i64, to: i64| scrape(off, every, to, &[], move |t| t >= from * 1000);
        let holed = |off: i64, every: i64, hole: (i64, i64)| {
            scrape(off, every, 3600, &[], move |t| !(hole.0 * 1000..hole.1 * 1000).contains(&t))
        };
        let scenarios: Vec<(&str, Vec<Vec<Sample>>)> = vec![
            ("identical", vec![full(0, 30, 0, 3600), full(0, 30, 0, 3600)]),
            ("offset", vec![full(0, 30, 0, 3600), full(15, 30, 0, 3600)]),
            ("one with a hole", vec![holed(0, 30, (900, 1000)), full(15, 30, 0, 3600)]),
            // The fullest replica (10 s) has a hole; the 15 s one is whole by the group's gap.
            ("fullest with a hole", vec![holed(0, 10, (1800, 1860)), full(5, 15, 0, 3600)]),
            ("both holed", vec![holed(0, 30, (900, 1000)), holed(15, 30, (2000, 2100))]),
            ("late start", vec![full(0, 30, 600, 3600), full(15, 30, 0, 3600)]),
        ];
        for (what, reps) in scenarios {
            let group = replicas_of_x(MetricType::Counter, reps.iter().map(|s| Chunk::encode_samples(s.clone())));
            let summaries: Vec<SeriesSummary> =
                group.iter().map(|g| SeriesSummary::of(&g.chunks, true).unwrap()).collect();
            let decision = whole_replica(&summaries.iter().collect::<Vec<_>>());
            let merged = merge_group(Labels::from_pairs([("__name__", "x")]), group.clone(), ALL).unwrap();
            match decision {
                Some(k) => assert_eq!(
                    merged.chunks, group[k].chunks,
                    "{what}: pushdown evaluates replica {k}, the merge did not pass it"
                ),
                None => {
                    let mut got = Vec::new();
                    Chunk::decode_range(&merged.chunks, i64::MIN, i64::MAX, &mut got).unwrap();
                    assert_eq!(
                        got,
                        merge_replicas(&reps, true),
                        "{what}: no replica is whole, yet the merge passed one"
                    );
                }
            }
        }
    }

    const ALL: (i64, i64) = (i64::MIN, i64::MAX);

    /// Series `x` in replicas `0`, `1`, ... holding these chunks.
    fn replicas_of_x(metric_type: MetricType, chunks: impl IntoIterator<Item = Vec<Chunk>>) -> Vec<SeriesChunks> {
        chunks
            .into_iter()
            .enumerate()
            .map(|(k, chunks)| SeriesChunks {
                labels: Labels::from_pairs([("__name__", "x".to_string()), ("replica", k.to_string())]),
                metric_type,
                chunks,
            })
            .collect()
    }

    /// Where a store cut a series' chunks changes no decision: a regional's copy of an
    /// edge's series, cut elsewhere, must answer as the edge's own. Only the samples in the
    /// request's range are weighed, by the merge and by pushdown's summaries alike.
    #[test]
    fn where_chunks_are_cut_changes_neither_the_merge_nor_pushdown() {
        let reps = [scrape(0, 30, 3600, &[], |_| true), scrape(15, 30, 3600, &[], |_| true)];
        let range = (615_000, 1_785_000);
        // Each replica whole in one chunk, or the first one cut at its 20th and 60th sample.
        let cut = |s: &[Sample]| {
            [&s[..20], &s[20..60], &s[60..]].iter().flat_map(|p| Chunk::encode_samples(p.to_vec())).collect()
        };
        let layouts: [[Vec<Chunk>; 2]; 2] = [
            [Chunk::encode_samples(reps[0].clone()), Chunk::encode_samples(reps[1].clone())],
            [cut(&reps[0]), Chunk::encode_samples(reps[1].clone())],
        ];
        let mut answers = Vec::new();
        for chunks in layouts {
            // A store hands on the chunks that overlap the range, whole.
            let overlapping = chunks.map(|c| c.into_iter().filter(|c| c.overlaps(range.0, range.1)).collect());
            let group = replicas_of_x(MetricType::Gauge, overlapping);
            let summaries: Vec<SeriesSummary> =
                group.iter().map(|g| SeriesSummary::of_range(&g.chunks, range.0, range.1, true).unwrap().0).collect();
            let decision = whole_replica(&summaries.iter().collect::<Vec<_>>());
            let merged = merge_group(Labels::from_pairs([("__name__", "x")]), group, range).unwrap();
            let mut got = Vec::new();
            Chunk::decode_range(&merged.chunks, range.0, range.1, &mut got).unwrap();
            answers.push((decision, got));
        }
        assert_eq!(answers[0].0, Some(1), "replica 1 has one sample more in the range");
        assert_eq!(answers[0], answers[1], "the cut changed the answer");
    }
}
