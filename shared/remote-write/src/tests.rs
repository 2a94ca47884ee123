//! Remote write from a database's WAL to a receiver on loopback that decodes what it is
//! sent and answers what a test tells it to (5xx, 429, 400), as Prometheus would.

use super::*;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use prost::Message;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use strata_forward::{Forwarder, ForwarderStats, WalHolds};
use strata_model::{Labels, Metadata, MetricType, Sample};
use strata_proto::prometheus as prompb;
use strata_tsdb::db::{Tsdb, TsdbOptions};

#[derive(Default)]
struct Received {
    series: BTreeMap<String, Vec<(i64, u64)>>,
    metadata: BTreeMap<String, prompb::MetricMetadata>,
    /// Statuses to answer requests with samples before accepting them, in order.
    answers: VecDeque<u16>,
    requests: usize,
    largest_request: usize,
    headers: Option<HeaderMap>,
    /// As Prometheus 2.42: a request with any sample older than its series' newest is
    /// refused whole (400, "out of order sample") and none of it stored.
    rollback_out_of_order: bool,
}

type Shared = std::sync::Arc<Mutex<Received>>;

async fn write(State(s): State<Shared>, headers: HeaderMap, body: Bytes) -> (StatusCode, String) {
    let mut r = s.lock();
    r.requests += 1;
    r.headers = Some(headers);
    let raw = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
    let req = prompb::WriteRequest::decode(&raw[..]).unwrap();
    // The answers a test sets are for requests that carry samples.
    if !req.timeseries.is_empty() {
        if let Some(code) = r.answers.pop_front() {
            return (StatusCode::from_u16(code).unwrap(), String::new());
        }
    }
    if r.rollback_out_of_order {
        for ts in &req.timeseries {
            let key = Labels::from_pairs(ts.labels.iter().map(|l| (l.name.as_str(), l.value.as_str()))).to_string();
            let newest = r.series.get(&key).and_then(|v| v.last()).map(|x| x.0);
            if ts.samples.iter().any(|x| newest.is_some_and(|t| x.timestamp < t)) {
                return (StatusCode::BAD_REQUEST, "out of order sample".into());
            }
        }
    }
    let n: usize = req.timeseries.iter().map(|t| t.samples.len()).sum();
    r.largest_request = r.largest_request.max(n);
    for ts in req.timeseries {
        let names: Vec<&str> = ts.labels.iter().map(|l| l.name.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "labels must arrive sorted");
        let key = Labels::from_pairs(ts.labels.iter().map(|l| (l.name.as_str(), l.value.as_str()))).to_string();
        let v = r.series.entry(key).or_default();
        for x in ts.samples {
            // Idempotent, as a TSDB is for an identical sample; out of order is a bug.
            match v.last() {
                Some(&(t, bits)) if t == x.timestamp => assert_eq!(bits, x.value.to_bits()),
                Some(&(t, _)) if t > x.timestamp => panic!("sample out of order: {} after {t}", x.timestamp),
                _ => v.push((x.timestamp, x.value.to_bits())),
            }
        }
    }
    for m in req.metadata {
        r.metadata.insert(m.metric_family_name.clone(), m);
    }
    (StatusCode::NO_CONTENT, String::new())
}

async fn receiver() -> (Shared, SocketAddr) {
    let state: Shared = Default::default();
    let app = axum::Router::new().route("/write", axum::routing::post(write)).with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (state, addr)
}

fn options(addr: SocketAddr) -> RemoteWriteOptions {
    RemoteWriteOptions {
        name: "test".into(),
        url: format!("http://{addr}/write"),
        timeout: Duration::from_secs(5),
        headers: vec![("x-scope-orgid".into(), "tenant-1".into())],
        tls: None,
        sigv4: None,
        queue: QueueConfig {
            max_samples_per_send: Some(100),
            capacity: Some(100),
            max_shards: Some(4),
            min_backoff: Some(strata_model::duration::PromDuration(Duration::from_millis(10))),
            max_backoff: Some(strata_model::duration::PromDuration(Duration::from_millis(50))),
            ..Default::default()
        }
        .resolve()
        .unwrap(),
        metadata: MetadataConfig::default().resolve().unwrap(),
        relabel: Vec::new(),
        metadata_source: None,
    }
}

/// `n` samples of each of `series` series, one commit per timestamp, the last a
/// staleness marker; and the metadata of their family.
fn fill(db: &Tsdb, series: usize, n: usize) {
    let refs: Vec<_> = (0..series)
        .map(|i| db.series(&Labels::from_pairs([("__name__", "gpu_util"), ("gpu", &i.to_string())])).unwrap())
        .collect();
    db.set_metadata(
        "gpu_util",
        Metadata { metric_type: MetricType::Gauge, help: "GPU use".into(), unit: String::new() },
    )
    .unwrap();
    for k in 0..n {
        let t = 1_000_000 + k as i64 * 1000;
        let v = if k + 1 == n { strata_model::stale_nan() } else { (k * 3 % 100) as f64 };
        let batch: Vec<_> = refs.iter().map(|r| (r.clone(), Sample::new(t, v))).collect();
        db.commit(&batch).unwrap();
    }
}

/// What the receiver should hold: every stored sample, with the external label.
fn expected(series: usize, n: usize) -> BTreeMap<String, Vec<(i64, u64)>> {
    (0..series)
        .map(|i| {
            let key = Labels::from_pairs([("__name__", "gpu_util"), ("cluster", "a"), ("gpu", &i.to_string())]);
            let v = (0..n)
                .map(|k| {
                    let v = if k + 1 == n { strata_model::stale_nan() } else { (k * 3 % 100) as f64 };
                    (1_000_000 + k as i64 * 1000, v.to_bits())
                })
                .collect();
            (key.to_string(), v)
        })
        .collect()
}

/// Runs the remote write until the receiver holds `want` (or 20 s pass).
async fn run(
    db: &std::sync::Arc<Tsdb>,
    opts: RemoteWriteOptions,
    rx: &Shared,
    done: impl Fn(&Received) -> bool,
) -> (QueueStats, ForwarderStats) {
    let (stop, stop_rx) = watch::channel(false);
    let stats = QueueStats::default();
    let up = RemoteWriteUpstream::new(opts, stats.clone(), stop_rx.clone()).await.unwrap();
    let mut fo = up.forwarder_options();
    fo.external_labels = Labels::from_pairs([("cluster", "a")]);
    fo.poll = Duration::from_millis(20);
    let f = Forwarder::with_upstream(db.clone(), WalHolds::new(db.clone()), fo, ForwarderStats::default(), up);
    let fstats = f.stats();
    let task = tokio::spawn(f.run(stop_rx));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done(&rx.lock()) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(true);
    task.await.unwrap();
    (stats, fstats)
}

fn open_db(dir: &std::path::Path) -> std::sync::Arc<Tsdb> {
    std::sync::Arc::new(Tsdb::open(dir, TsdbOptions { wal_labels_per_segment: true, ..Default::default() }).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sample_arrives_once_in_order_in_bounded_requests_with_metadata_and_headers() {
    let d = tempfile::tempdir().unwrap();
    let db = open_db(d.path());
    fill(&db, 30, 40);
    let (rx, addr) = receiver().await;
    let want = expected(30, 40);
    let (stats, fstats) = run(&db, options(addr), &rx, |r| r.series == want).await;
    let r = rx.lock();
    assert_eq!(r.series, want);
    assert!(r.largest_request <= 100, "a request carried {} samples (max_samples_per_send 100)", r.largest_request);
    let m = r.metadata.get("gpu_util").expect("metadata sent");
    assert_eq!((m.r#type, m.help.as_str()), (prompb::metric_metadata::MetricType::Gauge as i32, "GPU use"));
    let h = r.headers.as_ref().unwrap();
    assert_eq!(h.get("content-encoding").unwrap(), "snappy");
    assert_eq!(h.get("x-prometheus-remote-write-version").unwrap(), "0.1.0");
    assert_eq!(h.get("x-scope-orgid").unwrap(), "tenant-1");
    assert_eq!(stats.samples.get(), 1200);
    assert_eq!(stats.samples_failed.get() + stats.samples_dropped.get(), 0);
    assert!(fstats.batches_acked.get() > 0);
    assert_eq!(stats.highest_sent.get(), (1_000_000 + 39 * 1000) as f64 / 1000.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_and_429_are_retried_until_everything_arrives() {
    let d = tempfile::tempdir().unwrap();
    let db = open_db(d.path());
    fill(&db, 10, 30);
    let (rx, addr) = receiver().await;
    rx.lock().answers = [503, 500, 429, 502, 429].into();
    let want = expected(10, 30);
    let (stats, _) = run(&db, options(addr), &rx, |r| r.series == want).await;
    assert_eq!(rx.lock().series, want);
    assert!(stats.samples_retried.get() > 0);
    assert_eq!(stats.samples_failed.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_drops_that_request_counted_and_the_rest_still_arrives() {
    let d = tempfile::tempdir().unwrap();
    let db = open_db(d.path());
    fill(&db, 10, 30);
    let (rx, addr) = receiver().await;
    rx.lock().answers = [400].into();
    let (stats, _) = run(&db, options(addr), &rx, |r| r.series.values().map(Vec::len).sum::<usize>() >= 200).await;
    let got: usize = rx.lock().series.values().map(Vec::len).sum();
    assert!(stats.samples_failed.get() > 0, "the refused request is counted");
    assert_eq!(got as u64 + stats.samples_failed.get(), 300, "every sample is either delivered or counted as failed");
    // 429 is dropped too when the configuration says so, as Prometheus does by default.
    let d2 = tempfile::tempdir().unwrap();
    let db2 = open_db(d2.path());
    fill(&db2, 2, 5);
    let (rx2, addr2) = receiver().await;
    rx2.lock().answers = [429].into();
    let mut o = options(addr2);
    o.queue.retry_on_http_429 = false;
    let (stats2, _) = run(&db2, o, &rx2, |r| r.requests >= 2).await;
    // One shard: the 10 samples in one request.
    assert_eq!(stats2.samples_failed.get(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_relabel_configs_drop_series_and_rename_labels() {
    let d = tempfile::tempdir().unwrap();
    let db = open_db(d.path());
    fill(&db, 4, 5);
    let (rx, addr) = receiver().await;
    let mut o = options(addr);
    let rules: Vec<strata_ingest::relabel::RelabelConfig> = serde_saphyr::from_str(
        "- source_labels: [gpu]\n  regex: '0|1'\n  action: drop\n- source_labels: [cluster]\n  target_label: site\n- regex: cluster\n  action: labeldrop\n",
    )
    .unwrap();
    o.relabel = strata_ingest::relabel::compile_all(&rules).unwrap();
    let (stats, _) = run(&db, o, &rx, |r| r.series.values().map(Vec::len).sum::<usize>() >= 10).await;
    let keys: Vec<String> = rx.lock().series.keys().cloned().collect();
    assert_eq!(keys, vec![r#"gpu_util{gpu="2", site="a"}"#.to_string(), r#"gpu_util{gpu="3", site="a"}"#.to_string(),]);
    assert_eq!(stats.samples_dropped.get(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_from_the_cursor_without_resending_what_was_acknowledged() {
    let d = tempfile::tempdir().unwrap();
    let db = open_db(d.path());
    fill(&db, 5, 10);
    let (rx, addr) = receiver().await;
    let want = expected(5, 10);
    run(&db, options(addr), &rx, |r| r.series == want).await;
    let first = rx.lock().requests;
    // A second run with nothing new sends nothing.
    let t0 = std::time::Instant::now();
    let (stats, _) = run(&db, options(addr), &rx, move |_| t0.elapsed() > Duration::from_secs(1)).await;
    assert_eq!(stats.samples.get(), 0, "acknowledged samples were sent again");
    assert_eq!(rx.lock().requests, first);
}

/// Every `send_interval` the queue sends every family the edge knows, also families whose
/// metadata the session never read (named before its cursor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_the_edge_knows_is_sent_every_interval() {
    let d = tempfile::tempdir().unwrap();
    let db = open_db(d.path());
    fill(&db, 2, 3);
    let (rx, addr) = receiver().await;
    let mut o = options(addr);
    let known = Metadata { metric_type: MetricType::Counter, help: "known before".into(), unit: "joules".into() };
    o.metadata_source = Some(std::sync::Arc::new(move || vec![("energy_total".to_string(), known.clone())]));
    run(&db, o, &rx, |r| r.metadata.contains_key("energy_total") && r.metadata.contains_key("gpu_util")).await;
    let r = rx.lock();
    let m = r.metadata.get("energy_total").expect("the known family's metadata was sent");
    assert_eq!((m.help.as_str(), m.unit.as_str()), ("known before", "joules"));
    assert!(r.metadata.contains_key("gpu_util"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_series_own_label_wins_over_an_external_label_as_in_prometheus() {
    let d = tempfile::tempdir().unwrap();
    let db = open_db(d.path());
    let own = db.series(&Labels::from_pairs([("__name__", "kube_info"), ("cluster", "own")])).unwrap();
    let plain = db.series(&Labels::from_pairs([("__name__", "up")])).unwrap();
    db.commit(&[(own, Sample::new(1_000, 1.0)), (plain, Sample::new(1_000, 1.0))]).unwrap();
    let (rx, addr) = receiver().await;
    run(&db, options(addr), &rx, |r| r.series.len() >= 2).await;
    let keys: Vec<String> = rx.lock().series.keys().cloned().collect();
    assert_eq!(keys, vec![r#"kube_info{cluster="own"}"#.to_string(), r#"up{cluster="a"}"#.to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_series_relabelled_to_no_labels_is_dropped_and_counted() {
    let d = tempfile::tempdir().unwrap();
    let db = open_db(d.path());
    fill(&db, 2, 3);
    let (rx, addr) = receiver().await;
    let mut o = options(addr);
    let rules: Vec<strata_ingest::relabel::RelabelConfig> =
        serde_saphyr::from_str("- regex: '.*'\n  action: labeldrop\n").unwrap();
    o.relabel = strata_ingest::relabel::compile_all(&rules).unwrap();
    let (stats, _) = run(&db, o, &rx, |r| r.requests >= 1).await;
    // Only the metadata request: no series with an empty label set was sent.
    assert!(rx.lock().series.is_empty(), "{:?}", rx.lock().series.keys().collect::<Vec<_>>());
    assert_eq!(stats.samples_dropped.get(), 6);
}

/// A receiver out while the edge checkpoints: the WAL the queue still needs moves to a
/// backlog read from blocks while the request keeps failing inside one push, the WAL goes,
/// and once the receiver is back every sample arrives, in order per series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_moves_to_blocks_while_a_push_is_stuck_in_an_outage() {
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions {
        wal_labels_per_segment: true,
        wal_segment_bytes: 8 << 10,
        block_range: Duration::from_secs(1200),
        retention: Duration::from_secs(100 * 86400),
        ..Default::default()
    };
    let db = std::sync::Arc::new(Tsdb::open(d.path(), opts).unwrap());
    let s: Vec<_> = (0..50)
        .map(|i| db.series(&Labels::from_pairs([("__name__", "gpu_temp"), ("gpu", &i.to_string())])).unwrap())
        .collect();
    let t0 = strata_model::time::now_ms() - 2 * 3600 * 1000;
    let write = |from: i64, to: i64| {
        for k in from..to {
            let batch: Vec<_> = s.iter().map(|x| (x.clone(), Sample::new(t0 + k * 15_000, (k % 90) as f64))).collect();
            db.commit(&batch).unwrap();
        }
    };
    write(0, 2);
    let (rx, addr) = receiver().await;
    rx.lock().answers = std::iter::repeat_n(503, 100_000).collect();
    let (stop, stop_rx) = watch::channel(false);
    let up = RemoteWriteUpstream::new(options(addr), QueueStats::default(), stop_rx.clone()).await.unwrap();
    let mut fo = up.forwarder_options();
    fo.max_disk = Some(32 << 10);
    let f = Forwarder::with_upstream(db.clone(), WalHolds::new(db.clone()), fo, ForwarderStats::default(), up);
    let fstats = f.stats();
    let task = tokio::spawn(f.run(stop_rx));
    // The first push is under way (and refused) before the backlog grows past the budget.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while rx.lock().requests == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(rx.lock().requests > 0);
    write(2, 320);
    assert!(db.maintain().unwrap().checkpointed);
    let cursor = strata_forward::CursorFile::new(d.path(), "remote-write/test");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while cursor.load().and_then(|c| c.replay).is_none() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        cursor.load().and_then(|c| c.replay).is_some(),
        "the backlog did not move to blocks while the push was stuck"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(db.maintain().unwrap().wal_segments_deleted > 0, "the WAL was kept");
    rx.lock().answers.clear();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let got = || rx.lock().series.values().map(Vec::len).sum::<usize>() as u64;
    while got() + fstats.budget_dropped_samples.get() < 50 * 320 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(true);
    task.await.unwrap();
    assert_eq!(fstats.budget_dropped_samples.get(), 0);
    assert_eq!(got(), 50 * 320, "samples lost or sent twice");
}

/// A batch sent again after some of its requests were acknowledged (the edge crashed
/// mid-round): Prometheus refuses a request whole for the series it already holds newer
/// samples of. Such a request goes again in halves down to single series, so only what the
/// receiver already has is refused, and everything else arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_for_some_series_goes_again_in_halves_and_the_rest_arrives() {
    let d = tempfile::tempdir().unwrap();
    let db = open_db(d.path());
    fill(&db, 20, 50);
    let (rx, addr) = receiver().await;
    let want = expected(20, 50);
    {
        let mut r = rx.lock();
        r.rollback_out_of_order = true;
        // What the acknowledged requests of the round delivered: every third series (by
        // label order, which mixes them with the others in every shard).
        for (i, (k, v)) in want.iter().enumerate() {
            if i % 3 == 0 {
                r.series.insert(k.clone(), v.clone());
            }
        }
        // And half of one more: its newer samples must arrive too.
        let (k, v) = want.iter().nth(1).unwrap();
        r.series.insert(k.clone(), v[..25].to_vec());
    }
    let (stats, _) = run(&db, options(addr), &rx, |r| r.series == want).await;
    let held = rx.lock().series.clone();
    assert!(held == want, "samples the receiver did not have were dropped: {} of {} series", held.len(), want.len());
    // Refused: exactly what it held already, but for the newest of each series (an
    // identical sample is taken): 7 series of 50 samples, and 25 of the eighth.
    assert_eq!(stats.samples_failed.get(), 7 * 49 + 24);
}
