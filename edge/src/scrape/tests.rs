use super::*;
use crate::config::EdgeConfig;
use std::path::Path;
use strata_model::matcher::Matcher;
use strata_model::{is_stale, MetricType};
use strata_tsdb::db::TsdbOptions;

struct Fixture {
    _dir: tempfile::TempDir,
    db: Arc<Tsdb>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(Tsdb::open(dir.path(), TsdbOptions::default()).unwrap());
    Fixture { _dir: dir, db }
}

fn ingest_for(db: &Arc<Tsdb>, job_yaml: &str) -> ScrapeIngest {
    let cfg = EdgeConfig::parse(job_yaml, Path::new("x.yml")).unwrap();
    let job = Arc::new(cfg.jobs[0].clone());
    let target = Target {
        job: job.job_name.clone(),
        labels: Labels::from_pairs([("job", "dcgm"), ("instance", "node-0")]),
        url: "http://x/metrics".into(),
    };
    ScrapeIngest::new(target, job, db.clone())
}

const JOB: &str = "scrape_configs:\n  - job_name: dcgm\n";

fn samples_of(db: &Tsdb, matchers: &[Matcher]) -> Vec<(Labels, Vec<Sample>)> {
    db.head()
        .select(matchers, i64::MIN, i64::MAX)
        .into_iter()
        .map(|(s, cs)| (s.labels.clone(), cs.iter().flat_map(|c| c.decode().unwrap()).collect()))
        .collect()
}

fn name(n: &str) -> Matcher {
    Matcher::eq("__name__", n)
}

#[test]
fn simulator_page_is_stored_with_target_labels_and_metadata() {
    let f = fixture();
    let mut ing = ingest_for(&f.db, JOB);
    let page = strata_simulator::Fleet::new(1, 4, 8).render_node(0, 1_764_460_800_000).unwrap();
    let r = ing.ingest(page.as_bytes(), Format::Text, 1000, Duration::ZERO).unwrap();
    assert_eq!(r.scraped, 25 * 8);
    assert_eq!(r.appended, 25 * 8);
    assert_eq!(r.series_added, 25 * 8);
    let got = samples_of(&f.db, &[name("DCGM_FI_DEV_GPU_TEMP"), Matcher::eq("gpu", "3")]);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.get("job"), Some("dcgm"));
    assert_eq!(got[0].0.get("instance"), Some("node-0"));
    assert_eq!(got[0].1[0].t, 1000);
    assert_eq!(f.db.head().metric_type("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), MetricType::Counter);
    // the second scrape adds no series
    let r = ing.ingest(page.as_bytes(), Format::Text, 6000, Duration::ZERO).unwrap();
    assert_eq!(r.series_added, 0);
}

#[test]
fn bad_pages_store_nothing_and_keep_earlier_data() {
    let f = fixture();
    let mut ing = ingest_for(&f.db, "scrape_configs:\n  - job_name: dcgm\n    sample_limit: 3\n");
    ing.ingest(b"m{a=\"1\"} 1\nm{a=\"2\"} 2\n", Format::Text, 1000, Duration::ZERO).unwrap();
    let bad: [(&str, &str); 5] = [
        ("m{a=\"1\"} 5\nthis is garbage\n", "line 2"),
        ("m{a=\"1\"} 5\nm{a=\"2} 1\n", "unterminated"),
        ("m{a=\"1\"} 5\nm{a=\"1\"} 6\n", "duplicate series"),
        ("m{a=\"1\"} 5\nm{a=\"2\"} 5\nm{a=\"3\"} 5\nm{a=\"4\"} 5\n", "sample_limit"),
        ("m{a=\"1\"} 5\nm{a=\"2\",a=\"3\"} 1\n", "duplicate label"),
    ];
    for (i, (page, want)) in bad.iter().enumerate() {
        let e = ing.ingest(page.as_bytes(), Format::Text, 2000 + i as i64, Duration::ZERO).expect_err(page).to_string();
        assert!(e.contains(want), "{page:?}: {e}");
    }
    let got = samples_of(&f.db, &[name("m")]);
    assert_eq!(got.len(), 2, "no new series from bad pages");
    for (_, s) in &got {
        assert_eq!(s.len(), 1, "no sample of a bad page was stored");
        assert_eq!(s[0].t, 1000);
    }
}

#[test]
fn disappearing_series_and_failed_scrapes_go_stale() {
    let f = fixture();
    let mut ing = ingest_for(&f.db, JOB);
    ing.ingest(b"m{a=\"1\"} 1\nm{a=\"2\"} 2\n", Format::Text, 1000, Duration::ZERO).unwrap();
    ing.ingest(b"m{a=\"1\"} 1\n", Format::Text, 2000, Duration::ZERO).unwrap();
    let a2 = samples_of(&f.db, &[name("m"), Matcher::eq("a", "2")]);
    assert_eq!(a2[0].1.len(), 2);
    assert!(is_stale(a2[0].1[1].v) && a2[0].1[1].t == 2000);
    // a failed scrape marks the rest stale, and up = 0 is recorded
    ing.fail(3000, Duration::from_millis(5)).unwrap();
    let a1 = samples_of(&f.db, &[name("m"), Matcher::eq("a", "1")]);
    assert!(is_stale(a1[0].1.last().unwrap().v));
    let up = samples_of(&f.db, &[name("up")]);
    assert_eq!(up[0].1.last().unwrap().v, 0.0);
    assert_eq!(up[0].0.get("instance"), Some("node-0"));
    // the target goes away: synthetic series go stale too
    ing.end(4000).unwrap();
    let up = samples_of(&f.db, &[name("up")]);
    assert!(is_stale(up[0].1.last().unwrap().v));
}

#[test]
fn honor_labels_and_timestamps() {
    let f = fixture();
    let page = b"m{job=\"inner\",x=\"1\"} 1 500\n";
    let mut ing = ingest_for(&f.db, JOB);
    ing.ingest(page, Format::Text, 1000, Duration::ZERO).unwrap();
    let got = samples_of(&f.db, &[name("m")]);
    assert_eq!(got[0].0.get("job"), Some("dcgm"));
    assert_eq!(got[0].0.get("exported_job"), Some("inner"));
    assert_eq!(got[0].1[0].t, 500, "honor_timestamps defaults to true");

    let f = fixture();
    let mut ing =
        ingest_for(&f.db, "scrape_configs:\n  - job_name: dcgm\n    honor_labels: true\n    honor_timestamps: false\n");
    ing.ingest(page, Format::Text, 1000, Duration::ZERO).unwrap();
    let got = samples_of(&f.db, &[name("m")]);
    assert_eq!(got[0].0.get("job"), Some("inner"));
    assert_eq!(got[0].0.get("exported_job"), None);
    assert_eq!(got[0].1[0].t, 1000);
}

#[test]
fn metric_relabeling_and_label_limit() {
    let f = fixture();
    let yaml = "scrape_configs:\n  - job_name: dcgm\n    label_limit: 4\n    metric_relabel_configs:\n      - source_labels: [__name__]\n        regex: drop_me\n        action: drop\n      - regex: noisy\n        action: labeldrop\n";
    let mut ing = ingest_for(&f.db, yaml);
    let r = ing.ingest(b"drop_me 1\nkeep{noisy=\"x\"} 2\n", Format::Text, 1000, Duration::ZERO).unwrap();
    assert_eq!((r.scraped, r.post_relabel), (2, 1));
    assert!(samples_of(&f.db, &[name("drop_me")]).is_empty());
    assert_eq!(samples_of(&f.db, &[name("keep")])[0].0.get("noisy"), None);
    let e = ing.ingest(b"keep{a=\"1\",b=\"2\",c=\"3\"} 2\n", Format::Text, 2000, Duration::ZERO).unwrap_err();
    assert!(e.to_string().contains("label_limit"), "{e}");
}

#[test]
fn a_reordered_or_changed_page_resolves_every_series_right() {
    let f = fixture();
    let mut ing = ingest_for(&f.db, JOB);
    ing.ingest(b"# TYPE u untyped\nm{a=\"1\"} 1\nm{a=\"2\"} 2\nm{a=\"3\"} 3\n", Format::Text, 1000, Duration::ZERO)
        .unwrap();
    // same series, other order, one new and one gone
    ing.ingest(b"m{a=\"3\"} 30\nm{a=\"4\"} 40\nm{a=\"1\"} 10\n", Format::Text, 2000, Duration::ZERO).unwrap();
    ing.ingest(b"m{a=\"3\"} 300\nm{a=\"4\"} 400\nm{a=\"1\"} 100\n", Format::Text, 3000, Duration::ZERO).unwrap();
    let v = |a: &str| {
        samples_of(&f.db, &[name("m"), Matcher::eq("a", a)])[0]
            .1
            .iter()
            .map(|s| s.v)
            .filter(|v| !is_stale(*v))
            .collect::<Vec<_>>()
    };
    assert_eq!(v("1"), [1.0, 10.0, 100.0]);
    assert_eq!(v("2"), [2.0]);
    assert_eq!(v("3"), [3.0, 30.0, 300.0]);
    assert_eq!(v("4"), [40.0, 400.0]);
    assert_eq!(
        f.db.head().all_metadata().iter().find(|m| m.0 == "u").map(|m| m.1.metric_type),
        Some(MetricType::Unknown),
        "untyped families are recorded too"
    );
    // many scrapes later the cache has been evicted and rebuilt, and still resolves right
    for i in 0..25 {
        ing.ingest(b"m{a=\"1\"} 5\n", Format::Text, 4000 + i * 1000, Duration::ZERO).unwrap();
    }
    ing.ingest(b"m{a=\"4\"} 7\n", Format::Text, 100_000, Duration::ZERO).unwrap();
    assert_eq!(v("4").last(), Some(&7.0));
}

#[test]
fn openmetrics_page_with_units_and_exemplars() {
    let f = fixture();
    let mut ing = ingest_for(&f.db, JOB);
    let page = b"# TYPE e counter\n# UNIT e joules\ne_total 10 # {trace_id=\"x\"} 1\n# EOF\n";
    ing.ingest(page, Format::OpenMetrics, 1000, Duration::ZERO).unwrap();
    assert_eq!(f.db.head().metric_type("e_total"), MetricType::Counter);
    assert_eq!(samples_of(&f.db, &[name("e_total")])[0].1[0].v, 10.0);
}

#[test]
fn series_limit_fails_the_scrape_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(Tsdb::open(dir.path(), TsdbOptions { max_series: 2, ..Default::default() }).unwrap());
    let mut ing = ingest_for(&db, JOB);
    let e = ing.ingest(b"m{a=\"1\"} 1\nm{a=\"2\"} 2\nm{a=\"3\"} 3\n", Format::Text, 1000, Duration::ZERO).unwrap_err();
    assert!(e.to_string().contains("series limit of 2"), "{e}");
    assert!(samples_of(&db, &[name("m")]).iter().all(|(_, s)| s.is_empty()), "nothing of the failed scrape was stored");
}

#[test]
fn scrape_offsets_spread_over_the_interval() {
    let interval = Duration::from_secs(5);
    let offsets: std::collections::HashSet<_> = (0..64)
        .map(|i| {
            let t = Target {
                job: "dcgm".into(),
                labels: Labels::from_pairs([("instance", format!("node-{i}:9400"))]),
                url: format!("http://node-{i}:9400/metrics"),
            };
            let o = scrape_offset(&t, interval);
            assert!(o < interval);
            o.as_millis() / 500
        })
        .collect();
    assert!(offsets.len() >= 8, "64 targets fall in only {} of 10 half-second slots", offsets.len());
}

#[test]
fn after_a_failed_scrape_a_series_that_leaves_still_goes_stale() {
    let f = fixture();
    let mut ing = ingest_for(&f.db, JOB);
    let page = b"m{a=\"1\"} 1\nm{a=\"2\"} 2\n";
    ing.ingest(page, Format::Text, 1000, Duration::ZERO).unwrap();
    ing.fail(2000, Duration::ZERO).unwrap();
    ing.ingest(page, Format::Text, 3000, Duration::ZERO).unwrap();
    ing.ingest(page, Format::Text, 4000, Duration::ZERO).unwrap();
    ing.ingest(b"m{a=\"1\"} 1\n", Format::Text, 5000, Duration::ZERO).unwrap();
    let a2 = &samples_of(&f.db, &[name("m"), Matcher::eq("a", "2")])[0].1;
    let last = a2.last().unwrap();
    assert!(is_stale(last.v) && last.t == 5000, "{a2:?}");
}

#[test]
fn a_page_that_exposes_up_itself_keeps_the_first_sample() {
    let f = fixture();
    let mut ing = ingest_for(&f.db, JOB);
    // after target labels this `up` is the synthetic `up` series: as in Prometheus, the page's
    // sample is stored and the report's sample for the same timestamp is refused
    ing.ingest(b"up 0\nother 1\n", Format::Text, 1000, Duration::ZERO).unwrap();
    ing.ingest(b"up 0\nother 1\n", Format::Text, 2000, Duration::ZERO).unwrap();
    let up = samples_of(&f.db, &[name("up")]);
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].1.iter().map(|s| (s.t, s.v)).collect::<Vec<_>>(), [(1000, 0.0), (2000, 0.0)]);
}

#[test]
fn microsecond_timestamps_fail_the_scrape_with_a_clear_error() {
    let f = fixture();
    let mut ing = ingest_for(&f.db, JOB);
    let now = strata_model::time::now_ms();
    let page = format!("a 1 {now}\nb 2 {}\n", now * 1000);
    let e = ing.ingest(page.as_bytes(), Format::Text, now, Duration::ZERO).unwrap_err();
    assert!(matches!(e, ScrapeError::FutureTimestamp { line: 2, .. }), "{e}");
    assert!(e.to_string().contains("microseconds"), "{e}");
    assert!(samples_of(&f.db, &[name("a")]).iter().all(|(_, s)| s.is_empty()), "a failed scrape stored samples");
    assert_eq!(f.db.head().max_time(), i64::MIN, "the head's time moved");
    // Within the grace period, an explicit timestamp is kept as it is.
    let page = format!("a 1 {}\n", now + 60_000);
    ing.ingest(page.as_bytes(), Format::Text, now, Duration::ZERO).unwrap();
    assert_eq!(samples_of(&f.db, &[name("a")])[0].1[0].t, now + 60_000);
}

#[test]
fn the_series_limit_drops_new_series_but_keeps_the_target_and_its_series() {
    let dir = tempfile::tempdir().unwrap();
    // Room for the page's two series and the five report series, not more.
    let db = Arc::new(Tsdb::open(dir.path(), TsdbOptions { max_series: 7, ..Default::default() }).unwrap());
    let mut ing = ingest_for(&db, JOB);
    ing.ingest(b"a 1\nb 1\n", Format::Text, 1000, Duration::ZERO).unwrap();
    let r = ing.ingest(b"a 2\nb 2\nc 2\nd 2\n", Format::Text, 2000, Duration::ZERO).unwrap();
    assert_eq!(r.series_limit_dropped, 2);
    assert_eq!(r.appended, 2);
    for n in ["a", "b"] {
        let got = samples_of(&db, &[name(n)]);
        assert_eq!(got[0].1.len(), 2, "{n} lost samples");
        assert!(got[0].1.iter().all(|s| !is_stale(s.v)), "{n} was marked stale");
    }
    assert!(samples_of(&db, &[name("c")]).is_empty());
    assert_eq!(samples_of(&db, &[name("up")])[0].1.last().map(|s| s.v), Some(1.0), "the target is up");
}

/// Edge review (issue 20, item 12): a page label that clashes with a target label moves
/// to `exported_<name>`, and on to `exported_exported_<name>` when that is taken, so two
/// series that differ only there stay two series.
#[test]
fn conflicting_exported_labels_chain_as_in_prometheus() {
    let f = fixture();
    let mut ing = ingest_for(&f.db, JOB);
    let page = "m{job=\"a\",exported_job=\"b\"} 1\nm{job=\"a\",exported_job=\"c\"} 2\n";
    let r = ing.ingest(page.as_bytes(), Format::Text, 1000, Duration::ZERO).expect("no duplicate series");
    assert_eq!(r.appended, 2);
    let mut got: Vec<String> = samples_of(&f.db, &[name("m")]).iter().map(|(l, _)| l.to_string()).collect();
    got.sort();
    assert_eq!(
        got,
        [
            "m{exported_exported_job=\"a\", exported_job=\"b\", instance=\"node-0\", job=\"dcgm\"}",
            "m{exported_exported_job=\"a\", exported_job=\"c\", instance=\"node-0\", job=\"dcgm\"}",
        ]
    );
}

/// Item 11: `sample_limit` stops series creation at the limit, as Prometheus' limit
/// appender does; a churning target cannot fill the head for everyone.
#[test]
fn sample_limit_stops_before_creating_series() {
    let f = fixture();
    let mut ing = ingest_for(&f.db, "scrape_configs:\n  - job_name: dcgm\n    sample_limit: 10\n");
    let page: String = (0..5000).map(|i| format!("churn{{i=\"{i}\"}} 1\n")).collect();
    let e = ing.ingest(page.as_bytes(), Format::Text, 1000, Duration::ZERO).expect_err("over the limit");
    assert!(matches!(e, ScrapeError::SampleLimit(10)), "{e}");
    let created = f.db.head().num_series();
    assert!(created <= 10, "{created} series created by a scrape limited to 10 samples");
}

/// Item 9: metadata first seen on a page that fails is stored by the next good page.
#[test]
fn metadata_of_a_failed_page_is_stored_by_the_next_good_one() {
    let f = fixture();
    let mut ing = ingest_for(&f.db, JOB);
    let bad = "# TYPE energy_total counter\nenergy_total 1\nenergy_total{ 2\n";
    assert!(ing.ingest(bad.as_bytes(), Format::Text, 1000, Duration::ZERO).is_err());
    let good = "# TYPE energy_total counter\nenergy_total 1\n";
    ing.ingest(good.as_bytes(), Format::Text, 6000, Duration::ZERO).unwrap();
    assert_eq!(f.db.head().metric_type("energy_total"), MetricType::Counter);
}

/// Item 10: a page of 200 k `# TYPE` lines is linear, and families that leave the page
/// leave the target's metadata cache.
#[test]
fn a_flood_of_type_lines_is_linear_and_the_cache_is_trimmed() {
    let f = fixture();
    let mut ing = ingest_for(&f.db, JOB);
    let flood: String = (0..200_000).map(|i| format!("# TYPE f{i} gauge\n")).collect::<String>() + "x 1\n";
    let t = Instant::now();
    ing.ingest(flood.as_bytes(), Format::Text, 1000, Duration::ZERO).unwrap();
    // Quadratic was 34 s of CPU; linear is well under a second even in a debug build.
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert_eq!(ing.metadata.len(), 200_000);
    for k in 1..=2 * CACHE_KEEP_SCRAPES {
        ing.ingest(b"x 1\n", Format::Text, 1000 + k as i64 * 5000, Duration::ZERO).unwrap();
    }
    assert!(ing.metadata.len() < 10, "{} families kept after they left the page", ing.metadata.len());
}

/// Item 8: a target stamping its samples in the past gets no staleness markers when it
/// misses a scrape (unless `track_timestamps_staleness`), so its later samples still go in;
/// samples the database refuses are counted.
#[test]
fn explicit_timestamps_get_no_staleness_markers_and_refusals_are_counted() {
    let f = fixture();
    let now = strata_model::time::now_ms();
    let mut ing = ingest_for(&f.db, JOB);
    let page = |t: i64| format!("stamped 1 {t}\nplain 1\n");
    ing.ingest(page(now - 60_000).as_bytes(), Format::Text, now, Duration::ZERO).unwrap();
    ing.fail(now + 5_000, Duration::ZERO).unwrap();
    for k in 1..=4 {
        let r =
            ing.ingest(page(now - 60_000 + k * 1000).as_bytes(), Format::Text, now + 5_000 * (k + 1), Duration::ZERO);
        assert_eq!(r.unwrap().out_of_order, 0, "scrape {k}");
    }
    let stamped = &samples_of(&f.db, &[name("stamped")])[0].1;
    assert_eq!(stamped.len(), 5, "{stamped:?}");
    assert!(stamped.iter().all(|s| !is_stale(s.v)));
    let plain = &samples_of(&f.db, &[name("plain")])[0].1;
    assert!(plain.iter().any(|s| is_stale(s.v)), "series without timestamps still go stale");

    // A sample older than the series' newest, and no copy of a stored one: refused, counted.
    let older = format!("stamped 2 {}\nplain 1\n", now - 59_500);
    let r = ing.ingest(older.as_bytes(), Format::Text, now + 60_000, Duration::ZERO).unwrap();
    assert_eq!(r.out_of_order, 1);

    let mut tracked = ingest_for(&f.db, "scrape_configs:\n  - job_name: t\n    track_timestamps_staleness: true\n");
    tracked.ingest(b"tracked 1 1000\n", Format::Text, now, Duration::ZERO).unwrap();
    tracked.fail(now + 5_000, Duration::ZERO).unwrap();
    assert!(samples_of(&f.db, &[name("tracked")])[0].1.iter().any(|s| is_stale(s.v)));
}
