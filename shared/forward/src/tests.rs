//! Forwarding between two databases over gRPC on loopback: exactness, restarts of either
//! side, a regional that lost its data, conflicts, and hostile batches.

use super::*;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use strata_model::matcher::{MatchOp, Matcher};
use strata_model::{Labels, Metadata, MetricType, Sample};
use strata_tsdb::db::{Tsdb, TsdbOptions};
use tokio::sync::{oneshot, watch};

struct Regional {
    db: Arc<Tsdb>,
    stats: ReceiverStats,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Regional {
    async fn start(dir: &Path) -> Regional {
        Self::start_with(dir, TsdbOptions::default()).await
    }

    async fn start_with(dir: &Path, opts: TsdbOptions) -> Regional {
        Self::start_on(dir, opts, "127.0.0.1:0".parse().unwrap()).await
    }

    async fn start_on(dir: &Path, opts: TsdbOptions, addr: SocketAddr) -> Regional {
        let db = Arc::new(Tsdb::open(dir, opts).unwrap());
        let receiver = ForwardReceiver::new(db.clone(), StorageId::load_or_create(dir).unwrap());
        let stats = receiver.stats();
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(receiver.into_server())
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await;
        });
        Regional { db, stats, addr, stop: Some(tx), task }
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = self.task.await;
    }
}

/// Every series' samples in the head and the blocks, as a query reads them.
fn all(db: &Arc<Tsdb>) -> Vec<(String, Vec<(i64, u64)>)> {
    use strata_store::Store;
    let m = Matcher::new(MatchOp::Regex, "__name__", ".+").unwrap();
    let store = strata_tsdb::TsdbStore(db.clone());
    let req = strata_store::SelectRequest::new(vec![m], i64::MIN, i64::MAX);
    let series = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(store.select(&req)).unwrap()
        })
        .join()
        .unwrap()
    });
    let mut v: Vec<_> = series
        .into_iter()
        .map(|s| {
            let samples = s.samples(i64::MIN, i64::MAX).unwrap().iter().map(|x| (x.t, x.v.to_bits())).collect();
            (s.labels.to_string(), samples)
        })
        .collect();
    v.sort();
    v
}

/// The edge's data as the regional should hold it: with the edge's external label.
fn expected(edge: &Arc<Tsdb>) -> Vec<(String, Vec<(i64, u64)>)> {
    let mut v: Vec<_> =
        all(edge).into_iter().map(|(l, s)| (l.replacen('{', "{cluster=\"a\", ", 1).replace(", }", "}"), s)).collect();
    v.sort();
    v
}

/// `n` samples for each of `series` series from `t0` on, one commit per timestamp (as
/// scrapes write them), the last one a staleness marker.
fn write(edge: &Tsdb, series: usize, t0: i64, n: usize) {
    let s: Vec<_> = (0..series)
        .map(|i| edge.series(&Labels::from_pairs([("__name__", "gpu_util"), ("gpu", &i.to_string())])).unwrap())
        .collect();
    for k in 0..n {
        let t = t0 + k as i64 * 1000;
        let v = if k + 1 == n { strata_model::stale_nan() } else { (k * 7 % 100) as f64 };
        let batch: Vec<_> = s.iter().map(|x| (x.clone(), Sample::new(t, v))).collect();
        assert_eq!(edge.commit(&batch).unwrap().appended, series);
    }
}

/// A forwarding edge's database: labels in every WAL segment.
fn edge_options() -> TsdbOptions {
    TsdbOptions { wal_labels_per_segment: true, ..Default::default() }
}

fn options(name: &str, addr: SocketAddr, batch: usize) -> ForwarderOptions {
    let mut o = ForwarderOptions::new(name);
    o.endpoint = format!("http://{addr}");
    o.batch_samples = batch;
    o.poll = Duration::from_millis(20);
    o.min_backoff = Duration::from_millis(20);
    o.max_backoff = Duration::from_millis(200);
    o.external_labels = Labels::from_pairs([("cluster", "a")]);
    o
}

/// Runs `f` until `done` holds of its stats (or 20 s pass), then stops it; its stats.
async fn run_until(f: Forwarder, done: impl Fn(&ForwarderStats) -> bool) -> ForwarderStats {
    let stats = f.stats();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(f.run(rx));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done(&stats) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(true);
    task.await.unwrap();
    stats
}

/// Runs a forwarder until the regional holds what the edge holds (or 20 s pass).
async fn forward_until_equal(
    edge: &Arc<Tsdb>,
    holds: &Arc<WalHolds>,
    opts: ForwarderOptions,
    regional: &Arc<Tsdb>,
) -> ForwarderStats {
    let f = Forwarder::new(edge.clone(), holds.clone(), opts, ForwarderStats::default());
    let stats = f.stats();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(f.run(rx));
    let want = expected(edge);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while all(regional) != want && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(true);
    task.await.unwrap();
    assert_eq!(all(regional), want, "the regional does not hold exactly what the edge holds");
    stats
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_regional_holds_exactly_what_the_edge_stored_across_restarts_of_either_side() {
    let (e, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let edge = Arc::new(Tsdb::open(e.path(), edge_options()).unwrap());
    let holds = WalHolds::new(edge.clone());
    let now = strata_model::time::now_ms() - 600_000;
    edge.set_metadata(
        "gpu_util",
        Metadata { metric_type: MetricType::Gauge, help: "GPU use".into(), unit: "percent".into() },
    )
    .unwrap();
    write(&edge, 30, now, 40);
    let regional = Regional::start(r.path()).await;
    // Batches of 7 samples: every WAL record (30 samples) goes in parts.
    let stats = forward_until_equal(&edge, &holds, options("regional", regional.addr, 7), &regional.db).await;
    assert_eq!(stats.samples_acked.get(), 1200);
    let meta = regional.db.head().all_metadata().into_iter().find(|(f, _)| f == "gpu_util").map(|(_, m)| m.unit);
    assert_eq!(meta, Some("percent".into()));

    // The edge restarts (a new forwarder from the persisted cursor) with more data: the
    // regional is sent only what is new.
    write(&edge, 30, now + 40_000, 10);
    let before = regional.stats.samples("duplicate");
    let stats = forward_until_equal(&edge, &holds, options("regional", regional.addr, 1000), &regional.db).await;
    assert_eq!(stats.samples_acked.get(), 300, "the restarted forwarder sent old data again");
    assert_eq!(regional.stats.samples("duplicate"), before);

    // The regional restarts on the same data: the cursor stays good.
    let addr_dir = r.path().to_path_buf();
    regional.stop().await;
    let regional = Regional::start(&addr_dir).await;
    write(&edge, 30, now + 50_000, 5);
    let stats = forward_until_equal(&edge, &holds, options("regional", regional.addr, 1000), &regional.db).await;
    assert_eq!(stats.samples_acked.get(), 150);
    regional.stop().await;

    // The regional comes back empty (a new data directory): it gets everything again.
    let r2 = tempfile::tempdir().unwrap();
    let regional = Regional::start(r2.path()).await;
    let stats = forward_until_equal(&edge, &holds, options("regional", regional.addr, 1000), &regional.db).await;
    assert_eq!(stats.restarts_from_oldest.get(), 1);
    assert_eq!(stats.samples_acked.get(), 30 * 55);
    regional.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_value_is_counted_and_the_stored_one_kept() {
    let (e, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let edge = Arc::new(Tsdb::open(e.path(), edge_options()).unwrap());
    let holds = WalHolds::new(edge.clone());
    let now = strata_model::time::now_ms() - 60_000;
    write(&edge, 1, now, 3);
    let regional = Regional::start(r.path()).await;
    // The regional already holds another value at the first timestamp.
    let s =
        regional.db.series(&Labels::from_pairs([("__name__", "gpu_util"), ("cluster", "a"), ("gpu", "0")])).unwrap();
    regional.db.commit(&[(s, Sample::new(now, 55.0))]).unwrap();
    let f =
        Forwarder::new(edge.clone(), holds.clone(), options("regional", regional.addr, 100), ForwarderStats::default());
    run_until(f, |stats| stats.samples_acked.get() >= 3).await;
    assert_eq!(regional.stats.samples("conflict"), 1);
    let got = all(&regional.db);
    assert_eq!(got[0].1[0], (now, 55f64.to_bits()), "the stored value was replaced");
    assert_eq!(got[0].1.len(), 3);
    regional.stop().await;
}

/// Numbered batches of a session pushed at once are stored in their order: the second,
/// which names its series by the number the first gave, arrives first and waits; one whose
/// predecessor is refused is refused too, and stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbered_batches_are_stored_in_order_whatever_order_they_arrive_in() {
    use pb::forward_client::ForwardClient;
    let r = tempfile::tempdir().unwrap();
    let regional = Regional::start(r.path()).await;
    let mut c = ForwardClient::connect(format!("http://{}", regional.addr)).await.unwrap();
    let hello = c.hello(pb::HelloRequest::default()).await.unwrap().into_inner();
    assert!(hello.max_in_flight > 1, "the receiver says it takes batches in flight");
    let now = strata_model::time::now_ms();
    let batch = |session: &str, seq: u64, labels: bool, t: i64| pb::PushRequest {
        storage_id: hello.storage_id.clone(),
        series: vec![pb::ForwardSeries {
            labels: if labels {
                vec![strata_grpc::pb::Label { name: "__name__".into(), value: format!("m_{session}") }]
            } else {
                vec![]
            },
            timestamps: vec![t],
            values: vec![(t as f64).to_bits()],
            r#ref: 1,
            ..Default::default()
        }],
        session: session.into(),
        seq,
        ..Default::default()
    };
    // Batch 2 of a session, pushed first: it must still be waiting 200 ms later.
    type Answer = tokio::task::JoinHandle<Result<u64, tonic::Code>>;
    async fn pushed_first(mut client: ForwardClient<tonic::transport::Channel>, b: pb::PushRequest) -> Answer {
        let second =
            tokio::spawn(async move { client.push(b).await.map(|r| r.into_inner().appended).map_err(|e| e.code()) });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!second.is_finished(), "batch 2 was answered before batch 1 came");
        second
    }
    let second = pushed_first(c.clone(), batch("ok", 2, false, now + 1)).await;
    assert_eq!(c.push(batch("ok", 1, true, now)).await.unwrap().into_inner().appended, 1);
    assert_eq!(second.await.unwrap(), Ok(1));
    let stored = all(&regional.db).into_iter().find(|(l, _)| l.contains("m_ok")).map(|(_, s)| s.len());
    assert_eq!(stored, Some(2));
    // Batch 1 refused (a series without a metric name): batch 2, waiting, fails with it.
    let second = pushed_first(c.clone(), batch("bad", 2, false, now + 1)).await;
    let mut first = batch("bad", 1, true, now);
    first.series[0].labels[0].name = "job".into();
    assert_eq!(c.push(first).await.map(|_| ()).map_err(|e| e.code()), Err(tonic::Code::InvalidArgument));
    assert_eq!(second.await.unwrap(), Err(tonic::Code::FailedPrecondition));
    assert!(all(&regional.db).iter().all(|(l, _)| !l.contains("bad")), "a refused session stored something");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_batches_get_errors_and_leave_stored_data_intact() {
    use pb::forward_client::ForwardClient;
    let r = tempfile::tempdir().unwrap();
    let regional = Regional::start(r.path()).await;
    let mut c = ForwardClient::connect(format!("http://{}", regional.addr)).await.unwrap();
    let id = c.hello(pb::HelloRequest::default()).await.unwrap().into_inner().storage_id;
    let label = |n: &str, v: &str| strata_grpc::pb::Label { name: n.into(), value: v.into() };
    let series = |labels, ts: Vec<i64>, vs: Vec<u64>| pb::ForwardSeries {
        labels,
        timestamps: ts,
        values: vs,
        ..Default::default()
    };
    let now = strata_model::time::now_ms();
    let good = series(vec![label("__name__", "m")], vec![now], vec![1f64.to_bits()]);
    let push = |storage_id: &str, s: Vec<pb::ForwardSeries>| pb::PushRequest {
        storage_id: storage_id.into(),
        series: s,
        metadata: vec![],
        session: String::new(),
        upstream: String::new(),
        complete_until: None,
        seq: 0,
    };
    let by_ref = |session: &str, r: u64| pb::PushRequest {
        storage_id: id.clone(),
        series: vec![pb::ForwardSeries {
            labels: vec![],
            timestamps: vec![now + 5],
            values: vec![0],
            r#ref: r,
            ..Default::default()
        }],
        metadata: vec![],
        session: session.into(),
        upstream: String::new(),
        complete_until: None,
        seq: 0,
    };
    // A batch naming its series by labels: refused for its number alone.
    let numbered =
        |session: &str, seq: u64| pb::PushRequest { seq, session: session.into(), ..push(&id, vec![good.clone()]) };
    assert_eq!(c.push(push(&id, vec![good.clone()])).await.unwrap().into_inner().appended, 1);
    let before = all(&regional.db);
    let cases = [
        (push("another", vec![good.clone()]), tonic::Code::FailedPrecondition),
        (
            push(&id, vec![series(vec![label("z", "1"), label("__name__", "m")], vec![now + 1], vec![0])]),
            tonic::Code::InvalidArgument,
        ),
        (
            push(&id, vec![series(vec![label("__name__", "m"), label("0bad", "1")], vec![now + 1], vec![0])]),
            tonic::Code::InvalidArgument,
        ),
        (push(&id, vec![series(vec![label("job", "x")], vec![now + 1], vec![0])]), tonic::Code::InvalidArgument),
        (
            push(&id, vec![series(vec![label("__name__", "m")], vec![now + 2, now + 1], vec![0, 0])]),
            tonic::Code::InvalidArgument,
        ),
        (push(&id, vec![series(vec![label("__name__", "m")], vec![now + 1], vec![])]), tonic::Code::InvalidArgument),
        // A good series beside one without samples: neither is created.
        (
            push(
                &id,
                vec![
                    series(vec![label("__name__", "new")], vec![now + 1], vec![0]),
                    series(vec![label("__name__", "m")], vec![], vec![]),
                ],
            ),
            tonic::Code::InvalidArgument,
        ),
        (
            push(
                &id,
                vec![series(
                    vec![label("__name__", "m")],
                    (1..=MAX_BATCH_SAMPLES as i64 + 1).collect(),
                    vec![0; MAX_BATCH_SAMPLES + 1],
                )],
            ),
            tonic::Code::InvalidArgument,
        ),
    ];
    // Chunks: each must hold what it declares, in order after the series' samples, and
    // what they declare counts against the batch before anything is decoded.
    let samples: Vec<Sample> = (1..=40).map(|k| Sample::new(now + k * 1000, k as f64)).collect();
    let chunk = strata_grpc::chunk_to_pb(&strata_chunk::Chunk::encode_sealed(&samples)[0]);
    let with_chunks = |ts: Vec<i64>, chunks: Vec<strata_grpc::pb::Chunk>| {
        let mut s = series(vec![label("__name__", "m")], ts.clone(), vec![0; ts.len()]);
        s.chunks = chunks;
        push(&id, vec![s])
    };
    let lying = |f: &dyn Fn(&mut strata_grpc::pb::Chunk)| {
        let mut c = chunk.clone();
        f(&mut c);
        with_chunks(vec![], vec![c])
    };
    let chunk_cases = [
        lying(&|c| c.samples = 41),
        lying(&|c| c.samples = 39),
        lying(&|c| c.samples = 0),
        lying(&|c| c.max_time += 1),
        lying(&|c| c.data = c.data.slice(..c.data.len() / 2)),
        lying(&|c| c.data = vec![0xff; 64].into()),
        // The samples field after the chunk's: not increasing.
        with_chunks(vec![now + 30_000], vec![chunk.clone()]),
        // Two copies of one chunk.
        with_chunks(vec![], vec![chunk.clone(), chunk.clone()]),
        // Declared far past the batch limit, with hardly any bytes.
        with_chunks(
            vec![],
            vec![strata_grpc::pb::Chunk { samples: 960, data: vec![0xe0].into(), ..chunk.clone() }; 210],
        ),
    ];
    // Open chunks: at most a chunk's samples each, and a bounded total per batch declared
    // before anything is decoded; bounds that send something; a header whose first
    // timestamp is not its data's (it would place the chunk); none leaves anything stored.
    let mut appender = strata_chunk::ChunkAppender::new();
    for x in &samples {
        appender.append(x.t, x.v);
    }
    let open = strata_grpc::chunk_to_pb(&appender.seal());
    let with_open = |name: &str, c: strata_grpc::pb::Chunk, from: i64, through: i64| {
        let mut s = series(vec![label("__name__", name)], vec![], vec![]);
        (s.open_chunk, s.open_from, s.open_through) = (Some(c), from, through);
        s
    };
    let open_cases = [
        push(&id, vec![with_open("m", strata_grpc::pb::Chunk { samples: 961, ..open.clone() }, now, now + 40_000)]),
        push(&id, vec![with_open("m", open.clone(), now + 40_000, now + 1000)]),
        push(
            &id,
            vec![with_open("m", strata_grpc::pb::Chunk { min_time: now + 1001, ..open.clone() }, now, now + 40_000)],
        ),
        push(
            &id,
            (0..=crate::MAX_BATCH_OPEN_SAMPLES / 960)
                .map(|i| with_open(&format!("m{i}"), strata_grpc::pb::Chunk { samples: 960, ..open.clone() }, now, now))
                .collect(),
        ),
    ];
    let chunk_cases: Vec<_> = chunk_cases.into_iter().chain(open_cases).collect();
    // A series by number: without a session, or one this regional does not know.
    let cases: Vec<_> = cases
        .into_iter()
        .chain(chunk_cases.into_iter().map(|r| (r, tonic::Code::InvalidArgument)))
        .chain([
            (by_ref("", 1), tonic::Code::InvalidArgument),
            (by_ref("s", 0), tonic::Code::InvalidArgument),
            (by_ref("never-seen", 7), tonic::Code::FailedPrecondition),
            (by_ref(&"s".repeat(65), 1), tonic::Code::InvalidArgument),
            // A numbered batch further ahead than a sender is told it may run.
            (numbered("ahead", 1 + crate::order::MAX_IN_FLIGHT), tonic::Code::FailedPrecondition),
        ])
        .collect();
    for (i, (req, code)) in cases.into_iter().enumerate() {
        let got = c.push(req).await.expect_err(&format!("case {i} was accepted"));
        assert_eq!(got.code(), code, "case {i}: {}", got.message());
    }
    // A frame over the message bound is refused by the transport, not decoded.
    let huge = series(vec![label("__name__", "m"), label("x", &"v".repeat(17 << 20))], vec![now + 1], vec![0]);
    assert!(c.push(push(&id, vec![huge])).await.is_err());
    // The same batch again: a duplicate, nothing changes.
    let again = c.push(push(&id, vec![good])).await.unwrap().into_inner();
    assert_eq!((again.appended, again.duplicates), (0, 1));
    assert_eq!(all(&regional.db), before, "a refused batch changed stored data");
    assert_eq!(regional.db.head().stats().series, 1, "a refused batch created series");
    // A series' samples and then chunks, one ending in a staleness marker: stored bit for bit.
    let t0 = now - 3_600_000;
    let samples: Vec<Sample> = (1..=1100).map(|k| Sample::new(t0 + k * 1000, (k % 13) as f64 * 0.5)).collect();
    let tail = [Sample::new(t0 + 1_101_000, strata_model::stale_nan())];
    let mut s = series(vec![label("__name__", "c")], vec![t0 + 1000], vec![2.5f64.to_bits()]);
    let chunks = strata_chunk::Chunk::encode_sealed(&samples[1..].iter().chain(&tail).copied().collect::<Vec<_>>());
    assert_eq!(chunks.len(), 2);
    s.chunks = chunks.iter().map(strata_grpc::chunk_to_pb).collect();
    let ok = c.push(push(&id, vec![s])).await.unwrap().into_inner();
    assert_eq!(ok.appended, 1101);
    let names: Vec<String> = all(&regional.db).into_iter().map(|(l, _)| l).collect();
    let stored = all(&regional.db).into_iter().find(|(l, _)| l.starts_with("c")).map(|(_, s)| s);
    let want: Vec<(i64, u64)> = std::iter::once((t0 + 1000, 2.5f64.to_bits()))
        .chain(samples[1..].iter().chain(&tail).map(|x| (x.t, x.v.to_bits())))
        .collect();
    assert!(stored.as_ref() == Some(&want), "series {names:?}: {:?} samples stored", stored.map(|s| s.len()));
    regional.stop().await;
}

/// Commits `steps` samples 15 s apart from `t0 + k0 * 15 s` for each series.
fn write_steps(edge: &Tsdb, series: &[Arc<strata_tsdb::head::MemSeries>], t0: i64, k0: i64, steps: i64) {
    for k in k0..k0 + steps {
        let batch: Vec<_> = series.iter().map(|x| (x.clone(), Sample::new(t0 + k * 15_000, (k % 90) as f64))).collect();
        edge.commit(&batch).unwrap();
    }
}

fn gpu_series(edge: &Tsdb, n: usize) -> Vec<Arc<strata_tsdb::head::MemSeries>> {
    (0..n)
        .map(|i| edge.series(&Labels::from_pairs([("__name__", "gpu_temp"), ("gpu", &i.to_string())])).unwrap())
        .collect()
}

/// An edge that cuts `block_range_s` blocks from small WAL segments and keeps
/// `retention_s` of data.
fn cutting_options(block_range_s: u64, retention_s: u64) -> TsdbOptions {
    TsdbOptions {
        block_range: Duration::from_secs(block_range_s),
        wal_segment_bytes: 8 << 10,
        retention: Duration::from_secs(retention_s),
        ..edge_options()
    }
}

/// An upstream that is behind keeps the WAL it needs: block cuts and head checkpoints run
/// at the edge meanwhile and delete no segment the upstream has not acknowledged; once it
/// has, they go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_an_upstream_needs_outlives_block_cuts_and_checkpoints() {
    let (e, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let edge = Arc::new(Tsdb::open(e.path(), cutting_options(1200, 100 * 86400)).unwrap());
    let holds = WalHolds::new(edge.clone());
    let s = gpu_series(&edge, 50);
    let t0 = strata_model::time::now_ms() - 2 * 3600 * 1000;
    let write_from = |k0: i64, n: i64| write_steps(&edge, &s, t0, k0, n);
    // The upstream is unreachable from the start: its forwarder holds everything.
    let regional = Regional::start(r.path()).await;
    let addr = regional.addr;
    regional.stop().await;
    let f = Forwarder::new(edge.clone(), holds.clone(), options("regional", addr, 5000), ForwarderStats::default());
    drop(f);
    write_from(0, 320);
    let segments = strata_tsdb::wal::list_segments(&edge.wal_dir()).unwrap();
    let out = edge.maintain().unwrap();
    assert!(out.blocks_cut > 0 && out.checkpointed, "{out:?}");
    assert_eq!(out.wal_segments_deleted, 0, "a segment the upstream needs was deleted: {out:?}");
    let after = strata_tsdb::wal::list_segments(&edge.wal_dir()).unwrap();
    assert!(segments.iter().all(|n| after.contains(n)), "{segments:?} then {after:?}");

    // The regional comes back (a new one on the same data): everything arrives, from the
    // held WAL, though the edge's head no longer holds the older part.
    let regional = Regional::start(r.path()).await;
    let stats = forward_until_equal(&edge, &holds, options("regional", regional.addr, 5000), &regional.db).await;
    assert_eq!(stats.samples_acked.get(), 50 * 320);
    // Acknowledged, the WAL may go.
    write_from(320, 100);
    let out = edge.maintain().unwrap();
    assert!(out.wal_segments_deleted > 0, "the acknowledged WAL was kept: {out:?}");
    regional.stop().await;
}

/// One edge's backlog arrives after another edge moved the regional's head on and blocks
/// were cut past it: the regional stores it (as blocks of their own), refuses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_older_than_the_regionals_head_is_stored_not_refused() {
    let (e, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ropts = TsdbOptions { block_range: Duration::from_secs(600), ..Default::default() };
    let regional = Regional::start_with(r.path(), ropts).await;
    let now = strata_model::time::now_ms();
    let t0 = now - 3 * 3600 * 1000;
    // Another edge's series, current, kept the regional's head moving: blocks are cut.
    let other = regional.db.series(&Labels::from_pairs([("__name__", "up"), ("cluster", "b")])).unwrap();
    for k in 0..=720 {
        regional.db.commit(&[(other.clone(), Sample::new(t0 + k * 15_000, 1.0))]).unwrap();
    }
    assert!(regional.db.maintain().unwrap().blocks_cut > 0);
    // This edge was cut off: its first hour arrives now.
    let edge = Arc::new(Tsdb::open(e.path(), edge_options()).unwrap());
    let holds = WalHolds::new(edge.clone());
    write(&edge, 20, t0, 240);
    let f = Forwarder::new(
        edge.clone(),
        holds.clone(),
        options("regional", regional.addr, 1000),
        ForwarderStats::default(),
    );
    run_until(f, |stats| stats.samples_acked.get() >= 20 * 240).await;
    assert_eq!(regional.stats.samples("out_of_bounds"), 0, "the backlog was refused");
    let want = expected(&edge);
    let got: Vec<_> = all(&regional.db).into_iter().filter(|(l, _)| l.starts_with("gpu_util")).collect();
    assert_eq!(got, want, "the regional does not hold the backlog exactly");
    regional.stop().await;
}

/// Serves `service` as the `Forward` gRPC service on a free loopback port until aborted.
async fn serve_forward(service: impl pb::forward_server::Forward) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    serve_forward_taking(service, true).await
}

/// [`serve_forward`], taking batches compressed with zstd only when `zstd` (an older
/// regional takes gzip alone).
async fn serve_forward_taking(
    service: impl pb::forward_server::Forward,
    zstd: bool,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use tonic::codec::CompressionEncoding;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut service = pb::forward_server::ForwardServer::new(service).accept_compressed(CompressionEncoding::Gzip);
    if zstd {
        service = service.accept_compressed(CompressionEncoding::Zstd);
    }
    let server = tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let _ = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await;
    });
    (addr, server)
}

/// An upstream that refuses every batch as invalid (a broken or incompatible peer): each
/// batch is tried three times, across sessions, then dropped, counted and logged, so
/// forwarding moves on and the WAL is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_for_good_is_dropped_and_counted_after_three_tries() {
    // It says it takes batches in flight, so the sender pushes the next ones before each
    // refusal: each is still tried three times and dropped once.
    struct Refusing;
    #[tonic::async_trait]
    impl pb::forward_server::Forward for Refusing {
        async fn hello(
            &self,
            _: tonic::Request<pb::HelloRequest>,
        ) -> Result<tonic::Response<pb::HelloResponse>, tonic::Status> {
            Ok(tonic::Response::new(pb::HelloResponse {
                storage_id: "refusing".into(),
                max_batch_samples: 100,
                takes_chunks: true,
                takes_open_chunks: true,
                max_in_flight: 4,
                takes_zstd: false,
            }))
        }
        async fn push(
            &self,
            _: tonic::Request<pb::PushRequest>,
        ) -> Result<tonic::Response<pb::PushResponse>, tonic::Status> {
            Err(tonic::Status::invalid_argument("never"))
        }
    }
    let (addr, server) = serve_forward(Refusing).await;
    let e = tempfile::tempdir().unwrap();
    let edge = Arc::new(Tsdb::open(e.path(), edge_options()).unwrap());
    let holds = WalHolds::new(edge.clone());
    write(&edge, 10, strata_model::time::now_ms() - 60_000, 30);
    let f = Forwarder::new(edge.clone(), holds, options("refusing", addr, 100), ForwarderStats::default());
    let stats = run_until(f, |stats| stats.dropped_samples.get() >= 300).await;
    server.abort();
    assert_eq!(stats.dropped_samples.get(), 300, "every sample dropped once, none twice");
    assert_eq!(stats.samples_acked.get(), 0);
    // Three tries per batch of 100: two failed sessions before each drop.
    assert!(stats.retries.get() >= 6, "{} retries", stats.retries.get());
}

/// Waits until the upstream's persisted cursor is past the WAL the edge's head needs (its
/// forwarder moved the backlog to storage).
async fn wait_backlog_moved(edge: &Tsdb, upstream: &str) -> Cursor {
    let file = CursorFile::new(edge.dir(), upstream);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let c = file.load();
        let needed = edge.wal_needed_from().unwrap_or(0);
        if let Some(c) = c.filter(|c| c.replay.is_some() && c.wal.segment >= needed) {
            return c;
        }
        assert!(std::time::Instant::now() < deadline, "the backlog never moved to storage");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An outage across block cuts and head checkpoints: the WAL the upstream still needs is
/// let go once checkpointed (no extra disk), the backlog is sent from blocks and head,
/// exactly (nothing twice, nothing missing), and a forwarder restarted in the middle of
/// it goes on from where it was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_the_wal_no_longer_holds_is_sent_from_blocks_exactly() {
    let (e, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let edge = Arc::new(Tsdb::open(e.path(), cutting_options(1200, 100 * 86400)).unwrap());
    let holds = WalHolds::new(edge.clone());
    let s = gpu_series(&edge, 50);
    let t0 = strata_model::time::now_ms() - 2 * 3600 * 1000;
    // The first 100 steps reach the regional; then it goes down.
    write_steps(&edge, &s, t0, 0, 100);
    let regional = Regional::start(r.path()).await;
    let addr = regional.addr;
    forward_until_equal(&edge, &holds, options("regional", addr, 5000), &regional.db).await;
    regional.stop().await;
    write_steps(&edge, &s, t0, 100, 380);
    let (stop, rx) = watch::channel(false);
    let f = Forwarder::new(edge.clone(), holds.clone(), options("regional", addr, 5000), ForwarderStats::default());
    let task = tokio::spawn(f.run(rx));
    let out = edge.maintain().unwrap();
    assert!(out.blocks_cut > 0 && out.checkpointed, "{out:?}");
    let moved = wait_backlog_moved(&edge, "regional").await;
    let _ = stop.send(true);
    task.await.unwrap();
    let generation = moved.replay.map(|r| r.generation).unwrap();
    let Ok(backlog) = Backlog::load(&CursorFile::new(edge.dir(), "regional").backlog_path(generation)) else {
        panic!("the backlog file does not read")
    };
    assert_eq!(backlog.entries.len(), 50);
    assert!(
        backlog.entries.iter().all(|e| e.first == t0 + 100 * 15_000),
        "the backlog starts after what was acknowledged"
    );
    // The WAL it needed goes with the next maintenance: the outage costs no extra disk.
    let before = edge.wal_disk_bytes();
    let out = edge.maintain().unwrap();
    assert!(out.wal_segments_deleted > 0, "the checkpointed WAL was kept: {out:?}");
    assert!(edge.wal_disk_bytes() < before / 2, "{} bytes of WAL left of {before}", edge.wal_disk_bytes());
    assert!(moved.wal.segment >= edge.wal_needed_from().unwrap());
    // More data meanwhile, in the WAL.
    write_steps(&edge, &s, t0, 480, 20);

    // The regional comes back. A forwarder stopped after its first acknowledged batches
    // of the backlog, then another from the persisted cursor: everything, exactly once.
    let regional = Regional::start_on(r.path(), TsdbOptions::default(), addr).await;
    let f = Forwarder::new(edge.clone(), holds.clone(), options("regional", addr, 700), ForwarderStats::default());
    let held = edge.blocks_held().map(|h| h.0);
    assert_eq!(held, Some(t0 + 100 * 15_000), "blocks are held from the backlog's oldest sample");
    let first = run_until(f, |stats| stats.samples_acked.get() >= 10_000).await;
    let replay = CursorFile::new(edge.dir(), "regional").load().unwrap().replay;
    let Some(at) = replay else { panic!("stopped after the backlog") };
    // Blocks are held only from the slice being read on.
    assert!(at.slice > t0 + 100 * 15_000, "{at:?}");
    assert_eq!(edge.blocks_held().map(|h| h.0), Some(at.slice), "{at:?}");
    let rest = forward_until_equal(&edge, &holds, options("regional", addr, 700), &regional.db).await;
    assert_eq!(first.samples_acked.get() + rest.samples_acked.get(), 50 * 400, "samples sent twice or missing");
    assert_eq!(regional.stats.samples("duplicate"), 0, "samples sent twice");
    assert_eq!(first.budget_dropped_samples.get() + rest.budget_dropped_samples.get(), 0);
    let file = CursorFile::new(edge.dir(), "regional");
    assert_eq!(file.load().unwrap().replay, None);
    let left: Vec<_> = std::fs::read_dir(file.path().parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains(".backlog"))
        .collect();
    assert!(left.is_empty(), "the finished backlog's file was kept: {left:?}");
    regional.stop().await;
}

/// An outage longer than the edge's retention: blocks past retention are kept for the
/// upstream within `forward_max_disk`, newest first; what retention deletes beyond it is
/// dropped for the upstream, counted exactly, and everything the edge still holds arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_retention_and_the_disk_budget_the_oldest_is_dropped_counted_and_the_rest_sent() {
    let (e, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let edge = Arc::new(Tsdb::open(e.path(), cutting_options(600, 1800)).unwrap());
    let holds = WalHolds::new(edge.clone());
    let s = gpu_series(&edge, 20);
    let t0 = strata_model::time::now_ms() - 7 * 3600 * 1000;
    let down = Regional::start(r.path()).await;
    let addr = down.addr;
    down.stop().await;
    // The upstream is down from the start: the first two hours are cut into blocks and
    // the forwarder moves its backlog to storage.
    write_steps(&edge, &s, t0, 0, 480);
    let mut o = options("regional", addr, 5000);
    drop(Forwarder::new(edge.clone(), holds.clone(), o.clone(), ForwarderStats::default()));
    assert!(edge.maintain().unwrap().checkpointed);
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(Forwarder::new(edge.clone(), holds.clone(), o.clone(), ForwarderStats::default()).run(rx));
    wait_backlog_moved(&edge, "regional").await;
    let _ = stop.send(true);
    task.await.unwrap();
    // Five more hours, cut and compacted: retention (30 minutes) will pass the first
    // hours' blocks. The budget has room for the newest of them only.
    write_steps(&edge, &s, t0, 480, 1200);
    edge.cut_head_blocks().unwrap();
    edge.compact().unwrap();
    let cutoff = t0 + 1679 * 15_000 - 1800 * 1000;
    let mut doomed: Vec<_> =
        edge.blocks().healthy().iter().map(|b| b.meta().clone()).filter(|m| m.max_time <= cutoff).collect();
    doomed.sort_by_key(|m| std::cmp::Reverse(m.max_time));
    assert!(doomed.len() >= 2, "{doomed:?}");
    o.max_disk = Some(doomed[0].bytes() + doomed[1].bytes() - 1);
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(Forwarder::new(edge.clone(), holds.clone(), o.clone(), ForwarderStats::default()).run(rx));
    edge.maintain().unwrap();
    wait_backlog_moved(&edge, "regional").await;
    let _ = stop.send(true);
    task.await.unwrap();
    let oldest = edge.blocks().healthy().iter().map(|b| b.meta().min_time).min().unwrap();
    assert_eq!(oldest, doomed[0].min_time, "not exactly the newest block past retention was kept");
    let kept = all(&edge);
    let oldest_kept = kept.iter().filter_map(|(_, v)| v.first().map(|x| x.0)).min().unwrap();
    assert!(oldest_kept > t0, "retention deleted nothing");
    assert!(oldest_kept < cutoff, "no block past retention was kept for the upstream");
    let held: u64 = kept.iter().map(|(_, v)| v.len() as u64).sum();

    let regional = Regional::start_on(r.path(), TsdbOptions::default(), addr).await;
    let stats = forward_until_equal(&edge, &holds, o, &regional.db).await;
    let dropped = stats.budget_dropped_samples.get();
    assert_eq!(dropped, 20 * 1680 - held, "dropped samples miscounted");
    assert_eq!(stats.samples_acked.get(), held, "samples sent twice or missing");
    regional.stop().await;
}

/// Series go by number after a session named them once; a regional that restarts under a
/// running session does not know the numbers, refuses them, and the forwarder starts a
/// new session that names every series again: nothing lost, nothing mislabelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regional_restart_under_a_session_starts_a_new_one_and_loses_nothing() {
    let (e, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let edge = Arc::new(Tsdb::open(e.path(), edge_options()).unwrap());
    let holds = WalHolds::new(edge.clone());
    let now = strata_model::time::now_ms() - 600_000;
    write(&edge, 30, now, 20);
    let regional = Regional::start(r.path()).await;
    let addr = regional.addr;
    let f = Forwarder::new(edge.clone(), holds.clone(), options("regional", addr, 100), ForwarderStats::default());
    let stats = f.stats();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(f.run(rx));
    let wait_for = |n: u64| {
        let stats = stats.clone();
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while stats.samples_acked.get() < n && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_for(600).await;
    // Numbers, not labels, after the first batches: far fewer bytes than labels would take.
    assert!(stats.sent_bytes.get() < 600 * 60, "{} bytes for 600 samples", stats.sent_bytes.get());
    regional.stop().await;
    let regional = Regional::start_on(r.path(), TsdbOptions::default(), addr).await;
    write(&edge, 30, now + 20_000, 20);
    wait_for(1200).await;
    let _ = stop.send(true);
    task.await.unwrap();
    assert_eq!(all(&regional.db), expected(&edge), "the regional does not hold exactly what the edge holds");
    assert!(stats.retries.get() >= 1, "the restart went unnoticed");
    regional.stop().await;
}

/// A regional with no blocks yet (its floor unset) given a sample older than its retention
/// refuses that one, counted, and stores the rest: the batch is acknowledged, not refused
/// again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sample_past_retention_is_counted_not_a_stall() {
    let (e, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let regional =
        Regional::start_with(r.path(), TsdbOptions { retention: Duration::from_secs(3600), ..Default::default() })
            .await;
    let edge = Arc::new(
        Tsdb::open(e.path(), TsdbOptions { retention: Duration::from_secs(86400), ..edge_options() }).unwrap(),
    );
    let holds = WalHolds::new(edge.clone());
    let now = strata_model::time::now_ms();
    // Recent samples first (one batch), then another series' sample from past the
    // regional's retention (the next batch): the regional's head is current by then.
    write(&edge, 1, now - 60_000, 10);
    let f =
        Forwarder::new(edge.clone(), holds.clone(), options("regional", regional.addr, 10), ForwarderStats::default());
    let stats = run_until(f, |stats| stats.batches_acked.get() >= 1).await;
    assert_eq!(stats.samples_acked.get(), 10);
    let old = edge.series(&Labels::from_pairs([("__name__", "ancient")])).unwrap();
    edge.commit(&[(old, Sample::new(now - 3 * 3600 * 1000, 1.0))]).unwrap();
    let f = Forwarder::new(edge.clone(), holds, options("regional", regional.addr, 10), ForwarderStats::default());
    let stats = run_until(f, |stats| stats.batches_acked.get() >= 1).await;
    assert_eq!(stats.batches_acked.get(), 1, "a batch was never acknowledged");
    assert_eq!(regional.stats.samples("out_of_bounds"), 1);
    assert_eq!(regional.stats.samples("appended"), 10);
    regional.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_far_behind_gets_its_backlog_from_storage_as_chunks_exactly() {
    let (e, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let edge = Arc::new(Tsdb::open(e.path(), edge_options()).unwrap());
    let holds = WalHolds::new(edge.clone());
    let regional = Regional::start(r.path()).await;
    // The start of a 2 h block window 100 to 220 minutes ago, and a minute: everything
    // written lies in that window, which no block cut takes (the heads' newest sample is
    // never an hour past its end), so the series' newest chunks stay open.
    let window = 2 * 3600 * 1000;
    let t0 = (strata_model::time::now_ms() - 6_000_000).div_euclid(window) * window + 60_000;
    write(&edge, 50, t0, 10);
    forward_until_equal(&edge, &holds, options("regional", regional.addr, 1000), &regional.db).await;

    // An outage: 200 series, 300 samples each, the WAL well past the threshold.
    let outage: Vec<_> = (0..200)
        .map(|i| edge.series(&Labels::from_pairs([("__name__", "gpu_temp"), ("gpu", &i.to_string())])).unwrap())
        .collect();
    write_steps(&edge, &outage, t0, 0, 300);
    write(&edge, 50, t0 + 10_000, 5);
    let mut o = options("regional", regional.addr, 20_000);
    o.storage_backlog_bytes = 1;
    let sent = 200 * 300 + 50 * 5;
    // Stopped after its first batches: the backlog's rest still counts as pending (the WAL
    // after the cursor is empty by then).
    let mut small = o.clone();
    small.batch_samples = 200;
    let f = Forwarder::new(edge.clone(), holds.clone(), small, ForwarderStats::default());
    let part = run_until(f, |s| s.samples_acked.get() >= 1).await;
    assert!(CursorFile::new(edge.dir(), "regional").load().unwrap().replay.is_some(), "stopped after the backlog");
    assert!(part.pending_bytes.get() > 0, "a backlog still being sent reads as caught up");
    let f = Forwarder::new(edge.clone(), holds.clone(), o, ForwarderStats::default());
    let stats = run_until(f, |s| part.samples_acked.get() + s.samples_acked.get() >= sent).await;
    assert_eq!(all(&regional.db), expected(&edge), "the regional does not hold exactly what the edge holds");
    let total = part.samples_acked.get() + stats.samples_acked.get();
    assert_eq!(total, sent, "the backlog from storage is not exactly what the WAL held");
    assert_eq!(stats.pending_bytes.get(), 0);
    let bytes_per_sample = (part.sent_bytes.get() + stats.sent_bytes.get()) as f64 / sent as f64;
    assert!(bytes_per_sample < 6.0, "{bytes_per_sample:.1} bytes a sample: the backlog was not sent as chunks");
    // The 50 series forwarded before the outage went as the edge's open chunks, which
    // continued the regional's own (only their new bits decoded there).
    let continued = regional.db.metrics().chunks_continued.get();
    assert!(continued >= 50, "{continued} open chunks continued at the regional, of the 50 series it followed");
    assert_eq!(regional.stats.samples("duplicate"), 0);
    let cursor = CursorFile::new(edge.dir(), "regional").load().unwrap();
    assert!(cursor.replay.is_none(), "the backlog is done: {cursor:?}");

    // Just behind (under the threshold): the WAL, record by record, nothing twice.
    write(&edge, 50, t0 + 15_000, 3);
    let stats = forward_until_equal(&edge, &holds, options("regional", regional.addr, 1000), &regional.db).await;
    assert_eq!(stats.samples_acked.get(), 150);
    assert_eq!(regional.stats.samples("conflict"), 0);
    regional.stop().await;
}

/// An edge with history in blocks older than its WAL, forwarding for the first time to a
/// regional that is down: when the head checkpoint lets the WAL go, the backlog it keeps
/// is everything stored, so the regional, once up, holds what the edge holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regional_never_reached_before_the_wal_goes_still_gets_the_history_in_blocks() {
    let (e, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let edge = Arc::new(Tsdb::open(e.path(), cutting_options(1200, 100 * 86400)).unwrap());
    let s = gpu_series(&edge, 20);
    let t0 = strata_model::time::now_ms() - 2 * 3600 * 1000;
    // History from before forwarding was configured: cut into blocks, its WAL gone.
    write_steps(&edge, &s, t0, 0, 200);
    let out = edge.maintain().unwrap();
    assert!(out.blocks_cut > 0 && out.wal_segments_deleted > 0, "{out:?}");
    // Forwarding configured, the regional down (its address taken, then freed).
    let regional = Regional::start(r.path()).await;
    let addr = regional.addr;
    regional.stop().await;
    let holds = WalHolds::new(edge.clone());
    let (stop, rx) = watch::channel(false);
    let f = Forwarder::new(edge.clone(), holds.clone(), options("regional", addr, 5000), ForwarderStats::default());
    let task = tokio::spawn(f.run(rx));
    write_steps(&edge, &s, t0, 200, 280);
    let out = edge.maintain().unwrap();
    assert!(out.checkpointed, "{out:?}");
    wait_backlog_moved(&edge, "regional").await;
    let _ = stop.send(true);
    task.await.unwrap();

    let regional = Regional::start_on(r.path(), TsdbOptions::default(), addr).await;
    let stats = forward_until_equal(&edge, &holds, options("regional", addr, 5000), &regional.db).await;
    assert_eq!(regional.stats.samples("appended"), 20 * 480);
    assert_eq!(stats.restarts_from_oldest.get(), 0);
    regional.stop().await;
}

/// A regional of an older version answering behind one that takes chunks (a rolling
/// upgrade): it refuses a batch of chunks as a series without samples. The edge goes back
/// to samples, and nothing is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regional_that_refuses_chunks_gets_samples_and_nothing_is_dropped() {
    use pb::forward_server::Forward;
    struct Older(ForwardReceiver);
    #[tonic::async_trait]
    impl Forward for Older {
        async fn hello(
            &self,
            r: tonic::Request<pb::HelloRequest>,
        ) -> Result<tonic::Response<pb::HelloResponse>, tonic::Status> {
            // Older than open chunks and zstd too: it is served taking gzip only, so a
            // batch sent as zstd would fail.
            let mut h = self.0.hello(r).await?;
            h.get_mut().takes_open_chunks = false;
            h.get_mut().takes_zstd = false;
            Ok(h)
        }
        async fn push(
            &self,
            r: tonic::Request<pb::PushRequest>,
        ) -> Result<tonic::Response<pb::PushResponse>, tonic::Status> {
            assert!(
                r.get_ref().series.iter().all(|s| s.open_chunk.is_none()),
                "an open chunk to a regional that did not say it takes them"
            );
            if r.get_ref().series.iter().any(|s| !s.chunks.is_empty()) {
                return Err(tonic::Status::invalid_argument("series 0 of the batch: no samples"));
            }
            self.0.push(r).await
        }
    }
    let (e, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let regional_db = Arc::new(Tsdb::open(r.path(), TsdbOptions::default()).unwrap());
    let receiver = ForwardReceiver::new(regional_db.clone(), StorageId::load_or_create(r.path()).unwrap());
    let (addr, server) = serve_forward_taking(Older(receiver), false).await;
    let edge = Arc::new(Tsdb::open(e.path(), edge_options()).unwrap());
    let holds = WalHolds::new(edge.clone());
    // First contact: everything goes as a backlog from storage, as chunks at first.
    write(&edge, 20, strata_model::time::now_ms() - 600_000, 200);
    let f = Forwarder::new(edge.clone(), holds, options("older", addr, 10_000), ForwarderStats::default());
    let stats = run_until(f, |stats| stats.samples_acked.get() >= 4000).await;
    server.abort();
    assert_eq!(stats.dropped_samples.get(), 0, "a batch of chunks was dropped instead of sent as samples");
    assert_eq!(stats.samples_acked.get(), 4000);
    assert!(stats.retries.get() >= 1);
    assert_eq!(all(&regional_db), expected(&edge));
}

/// Every batch says up to when the edge has sent everything (`complete_until`), and says
/// no more than is true: no later batch carries a sample at or before it. A backlog from
/// storage goes series by series, so its batches hold the watermark at its oldest sample
/// however late their own samples are; the WAL's batches move it on. The regional keeps
/// the furthest each sender got, which its StoreAPI `Info` gives an archiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_batch_says_up_to_when_everything_was_sent_and_never_more() {
    use pb::forward_server::Forward;
    type Seen = Arc<parking_lot::Mutex<Vec<(Option<i64>, Vec<i64>)>>>;
    struct Recording(ForwardReceiver, Seen);
    #[tonic::async_trait]
    impl Forward for Recording {
        async fn hello(
            &self,
            r: tonic::Request<pb::HelloRequest>,
        ) -> Result<tonic::Response<pb::HelloResponse>, tonic::Status> {
            self.0.hello(r).await
        }
        async fn push(
            &self,
            r: tonic::Request<pb::PushRequest>,
        ) -> Result<tonic::Response<pb::PushResponse>, tonic::Status> {
            let mut copy = r.get_ref().clone();
            let times: Vec<i64> = copy.series.iter_mut().flat_map(|s| samples_of(s).unwrap()).map(|x| x.t).collect();
            let answer = self.0.push(r).await;
            if answer.is_ok() {
                self.1.lock().push((copy.complete_until, times));
            }
            answer
        }
    }
    let (e, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let edge = Arc::new(Tsdb::open(e.path(), cutting_options(1200, 100 * 86400)).unwrap());
    let s = gpu_series(&edge, 20);
    let t0 = strata_model::time::now_ms() - 2 * 3600 * 1000;
    // History in blocks (its WAL gone), then more in the WAL.
    write_steps(&edge, &s, t0, 0, 200);
    let out = edge.maintain().unwrap();
    assert!(out.blocks_cut > 0 && out.wal_segments_deleted > 0, "{out:?}");
    write_steps(&edge, &s, t0, 200, 60);

    let regional_db = Arc::new(Tsdb::open(r.path(), TsdbOptions::default()).unwrap());
    let watermarks = Arc::new(Watermarks::open(r.path(), []));
    let receiver = ForwardReceiver::new(regional_db.clone(), StorageId::load_or_create(r.path()).unwrap())
        .with_watermarks(watermarks.clone());
    let seen: Seen = Arc::default();
    let (addr, server) = serve_forward(Recording(receiver, seen.clone())).await;
    let holds = WalHolds::new(edge.clone());
    let f = Forwarder::new(edge.clone(), holds.clone(), options("regional", addr, 700), ForwarderStats::default());
    let stats = run_until(f, |stats| stats.samples_acked.get() >= 20 * 260).await;
    assert_eq!(stats.samples_acked.get(), 20 * 260);
    // First contact sent everything stored as a backlog; what is stored next goes from
    // the WAL, and a series stored late with older samples (a remote write, a slow
    // scrape), after newer ones: no batch before it may claim past its samples.
    write_steps(&edge, &s, t0, 260, 40);
    // (Within the head: older ones may fall before the head's oldest admissible time,
    // which depends on where the wall clock puts the block boundaries.)
    let late = gpu_series(&edge, 21).pop().unwrap();
    for k in 250..260 {
        assert_eq!(edge.commit(&[(late.clone(), Sample::new(t0 + k * 15_000, 1.0))]).unwrap().appended, 1);
    }
    write_steps(&edge, &s, t0, 300, 5);
    let f = Forwarder::new(edge.clone(), holds, options("regional", addr, 300), ForwarderStats::default());
    let stats = run_until(f, |stats| stats.samples_acked.get() >= 20 * 45 + 10).await;
    server.abort();
    let why = format!(
        "retries {}, dropped {}, unsendable {}, batches {} sent {} acked",
        stats.retries.get(),
        stats.dropped_samples.get(),
        stats.unsendable_samples.get(),
        stats.batches_sent.get(),
        stats.batches_acked.get()
    );
    assert_eq!(stats.samples_acked.get(), 20 * 45 + 10, "{why}");
    assert_eq!(all(&regional_db), expected(&edge));

    let seen = seen.lock().clone();
    assert!(seen.len() >= 8, "{} batches", seen.len());
    let mut backlog_batches = 0;
    for (i, (until, times)) in seen.iter().enumerate() {
        let Some(until) = *until else {
            assert!(times.is_empty(), "batch {i} carries samples and no watermark");
            continue;
        };
        let later = seen[i + 1..].iter().flat_map(|(_, t)| t).min();
        assert!(
            later.is_none_or(|&t| t > until),
            "batch {i} says everything up to {until} was sent; {later:?} came later"
        );
        // The backlog's batches: samples well past a watermark held before the history.
        if until < t0 && times.iter().any(|&t| t >= t0 + 100 * 15_000) {
            backlog_batches += 1;
        }
    }
    assert!(backlog_batches >= 2, "{backlog_batches} batches of the backlog");
    // The WAL's batches moved it on, past the history.
    let furthest = seen.iter().filter_map(|(u, _)| *u).max().unwrap();
    assert!(furthest >= t0 + 300 * 15_000, "{}", furthest.saturating_sub(t0));
    assert_eq!(watermarks.complete_until(), Some((furthest, "{cluster=\"a\"}".to_string())));
}

/// What was forwarded before an outage spanned a block boundary, so the edge sent it as
/// samples sealed again (its head held two chunks), and the regional's newest chunk is a
/// sealed copy of the edge's open one: after the outage the edge's open chunk still
/// continues it (the regional reopens it), rather than its samples going one by one,
/// which halved the catch-up's speed at the regional.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_chunk_continues_one_the_regional_took_sealed_before_an_outage() {
    for before_boundary in [false, true] {
        let (e, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let edge = Arc::new(Tsdb::open(e.path(), edge_options()).unwrap());
        let holds = WalHolds::new(edge.clone());
        let regional = Regional::start(r.path()).await;
        let window = 2 * 3600 * 1000;
        let boundary = (strata_model::time::now_ms() - 3 * 3600 * 1000).div_euclid(window) * window + window;
        let t0 = if before_boundary { boundary - 120_000 } else { boundary + 60_000 };
        let s = gpu_series(&edge, 50);
        let at5 = |k0: i64, n: i64| {
            for k in k0..k0 + n {
                let batch: Vec<_> =
                    s.iter().map(|x| (x.clone(), Sample::new(t0 + k * 5_000, (k % 90) as f64))).collect();
                edge.commit(&batch).unwrap();
            }
        };
        at5(0, 180);
        forward_until_equal(&edge, &holds, options("regional", regional.addr, 200_000), &regional.db).await;
        let first = regional.db.metrics().chunks_continued.get();
        at5(180, 120);
        edge.maintain().unwrap();
        let mut o = options("regional", regional.addr, 200_000);
        o.storage_backlog_bytes = 1;
        forward_until_equal(&edge, &holds, o, &regional.db).await;
        let m = regional.db.metrics();
        let (continued, adopted) = (m.chunks_continued.get() - first, m.chunks_adopted.get());
        assert!(
            continued >= 50,
            "boundary {before_boundary}: {continued} continued after the outage ({adopted} adopted)"
        );
        assert_eq!(regional.stats.samples("duplicate"), 0);
        regional.stop().await;
    }
}
