use super::*;
use std::sync::Arc;
use std::time::Duration;
use strata_model::{Labels, Matcher, Metadata};
use strata_store::conformance::{fixture, run_all};
use strata_store::memory::MemoryStore;
use strata_store::{SelectLimits, SelectRequest, Store, StoreError};

fn fixture_store() -> MemoryStore {
    let mut m = MemoryStore::default();
    for s in fixture() {
        let family = s.labels.metric_name().unwrap_or_default().to_string();
        m.set_metadata(
            &family,
            Metadata { metric_type: s.metric_type, help: format!("{family} help"), unit: String::new() },
        );
        m.add(s.labels, s.metric_type, s.samples);
    }
    m
}

/// A server for `service` on a free loopback port; returns its address and a stopper.
async fn start(service: StoreService) -> (String, tokio::sync::oneshot::Sender<()>) {
    start_with(service, ServeOptions::new(Duration::from_secs(30))).await
}

async fn start_tls(service: StoreService, tls: Option<ServerTlsConfig>) -> (String, tokio::sync::oneshot::Sender<()>) {
    start_with(service, ServeOptions::new(Duration::from_secs(30)).with_tls(tls)).await
}

async fn start_with(service: StoreService, opts: ServeOptions) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, service, opts, async {
        let _ = rx.await;
    }));
    (addr, tx)
}

/// A server whose connection limits are these.
async fn start_limited(limits: ConnectionLimits) -> (String, tokio::sync::oneshot::Sender<()>) {
    let opts = ServeOptions { connections: limits, ..ServeOptions::new(Duration::from_secs(30)) };
    start_with(service(fixture_store(), Labels::default()), opts).await
}

fn service(store: impl Store + 'static, external: Labels) -> StoreService {
    let info = Arc::new(|| StoreInfo {
        min_time: 0,
        max_time: 1,
        kind: pb::ComponentKind::Edge,
        label_sets: vec![],
        resolutions: vec![],
        complete_until: None,
    });
    StoreService::new(Arc::new(store), external, SelectLimits::default(), info)
}

#[tokio::test]
async fn a_remote_store_passes_the_store_conformance_suite() {
    let (addr, stop) = start(service(fixture_store(), Labels::default())).await;
    for gzip in [false, true] {
        let remote = RemoteStore::new(&addr, RemoteStoreOptions { gzip, ..Default::default() }).unwrap();
        run_all(&remote).await;
    }
    let _ = stop.send(());
}

#[tokio::test]
async fn external_labels_are_advertised_attached_and_matched() {
    let ext = Labels::from_pairs([("cluster", "c0"), ("replica", "a")]);
    let (addr, stop) = start(service(fixture_store(), ext)).await;
    let remote = RemoteStore::new(&addr, RemoteStoreOptions::default()).unwrap();
    let info = remote.info().await.unwrap();
    assert_eq!(info.label_sets.len(), 1);
    assert_eq!(info.label_sets[0].labels.len(), 2);
    let sel = |ms: Vec<Matcher>| SelectRequest::new(ms, i64::MIN, i64::MAX);
    let all = remote.select(&sel(vec![Matcher::eq("__name__", "DCGM_FI_DEV_GPU_UTIL")])).await.unwrap();
    assert_eq!(all.len(), 3);
    assert!(all.iter().all(|s| s.labels.get("cluster") == Some("c0") && s.labels.get("replica") == Some("a")));
    // A matcher on an external label alone selects everything, or nothing.
    let c0 = remote.select(&sel(vec![Matcher::eq("cluster", "c0")])).await.unwrap();
    assert_eq!(c0.len(), fixture().len());
    let c1 = remote.select(&sel(vec![Matcher::eq("cluster", "c1")])).await.unwrap();
    assert!(c1.is_empty());
    assert_eq!(remote.label_values("cluster", &[], i64::MIN, i64::MAX).await.unwrap(), ["c0"]);
    assert!(remote.label_names(&[], i64::MIN, i64::MAX).await.unwrap().contains(&"replica".to_string()));
    let _ = stop.send(());
}

/// A hostile server: answers `Series` and `Steps` with whatever frames the test gives it.
/// Frames to send whatever is asked, and how many `Steps` frames the client has taken.
struct Hostile(Vec<pb::SeriesResponse>, Vec<pb::StepsResponse>, Arc<std::sync::atomic::AtomicUsize>);

#[tonic::async_trait]
impl pb::store_server::Store for Hostile {
    async fn info(
        &self,
        _: tonic::Request<pb::InfoRequest>,
    ) -> Result<tonic::Response<pb::InfoResponse>, tonic::Status> {
        Ok(tonic::Response::new(pb::InfoResponse::default()))
    }
    type SeriesStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::SeriesResponse, tonic::Status>> + Send>>;
    async fn series(
        &self,
        _: tonic::Request<pb::SeriesRequest>,
    ) -> Result<tonic::Response<Self::SeriesStream>, tonic::Status> {
        let frames: Vec<_> = self.0.iter().cloned().map(Ok).collect();
        Ok(tonic::Response::new(Box::pin(tokio_stream::iter(frames))))
    }
    type StepsStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::StepsResponse, tonic::Status>> + Send>>;
    async fn steps(
        &self,
        _: tonic::Request<pb::StepsRequest>,
    ) -> Result<tonic::Response<Self::StepsStream>, tonic::Status> {
        let frames: Vec<_> = self.1.iter().cloned().map(Ok).collect();
        let taken = self.2.clone();
        let counted = tokio_stream::StreamExt::map(tokio_stream::iter(frames), move |f| {
            taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            f
        });
        Ok(tonic::Response::new(Box::pin(counted)))
    }
    async fn label_names(
        &self,
        _: tonic::Request<pb::LabelNamesRequest>,
    ) -> Result<tonic::Response<pb::LabelNamesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("no"))
    }
    async fn label_values(
        &self,
        _: tonic::Request<pb::LabelValuesRequest>,
    ) -> Result<tonic::Response<pb::LabelValuesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("no"))
    }
    async fn metadata(
        &self,
        _: tonic::Request<pb::MetadataRequest>,
    ) -> Result<tonic::Response<pb::MetadataResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("no"))
    }
}

/// A hostile server with these frames; returns its address and a stopper.
async fn start_hostile(
    frames: Vec<pb::SeriesResponse>,
    steps: Vec<pb::StepsResponse>,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let (addr, stop, _) = start_hostile_counted(frames, steps).await;
    (addr, stop)
}

/// [`start_hostile`], with the count of `Steps` frames the server has sent.
async fn start_hostile_counted(
    frames: Vec<pb::SeriesResponse>,
    steps: Vec<pb::StepsResponse>,
) -> (String, tokio::sync::oneshot::Sender<()>, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let server =
        pb::store_server::StoreServer::new(Hostile(frames, steps, taken.clone())).max_encoding_message_size(64 << 20);
    tokio::spawn(tonic::transport::Server::builder().add_service(server).serve_with_incoming_shutdown(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        async {
            let _ = rx.await;
        },
    ));
    (addr, tx, taken)
}

async fn ask_hostile(frames: Vec<pb::SeriesResponse>) -> Result<Vec<strata_store::SeriesChunks>, StoreError> {
    let (addr, stop) = start_hostile(frames, Vec::new()).await;
    let remote = RemoteStore::new(&addr, RemoteStoreOptions::default()).unwrap();
    let out = remote.select(&SelectRequest::new(vec![Matcher::eq("__name__", "x")], 0, i64::MAX)).await;
    let _ = stop.send(());
    out
}

fn series(labels: &[(&str, &str)], chunks: Vec<pb::Chunk>) -> pb::Series {
    pb::Series {
        labels: labels.iter().map(|(n, v)| pb::Label { name: n.to_string(), value: v.to_string() }).collect(),
        chunks,
        ..Default::default()
    }
}

fn chunk(samples: u32, data: Vec<u8>) -> pb::Chunk {
    pb::Chunk { min_time: 0, max_time: 10, samples, data: data.into(), ..Default::default() }
}

#[tokio::test]
async fn bad_frames_are_errors_naming_the_store_never_panics() {
    let frame = |s: Vec<pb::Series>| vec![pb::SeriesResponse { series: s, ..Default::default() }];
    // Labels as references into the frame's symbols.
    let by_refs = |symbols: &[&str], refs: Vec<u32>| {
        let s = pb::Series { label_refs: refs, chunks: vec![chunk(1, vec![0; 8])], ..Default::default() };
        vec![pb::SeriesResponse {
            series: vec![s],
            symbols: symbols.iter().map(|x| x.to_string()).collect(),
            ..Default::default()
        }]
    };
    let cases: Vec<(&str, Vec<pb::SeriesResponse>)> = vec![
        ("invalid label name", frame(vec![series(&[("bad name", "x")], vec![chunk(1, vec![0; 8])])])),
        ("unsorted labels", frame(vec![series(&[("b", "1"), ("a", "2")], vec![chunk(1, vec![0; 8])])])),
        ("a reference past the symbols", by_refs(&["__name__", "x"], vec![0, 2])),
        ("an odd number of references", by_refs(&["__name__", "x"], vec![0, 1, 0])),
        ("an invalid name by reference", by_refs(&["bad name", "x"], vec![0, 1])),
        ("repeated names by reference", by_refs(&["__name__", "x"], vec![0, 1, 0, 1])),
        ("zero samples", frame(vec![series(&[("__name__", "x")], vec![chunk(0, vec![0; 8])])])),
        ("too many samples", frame(vec![series(&[("__name__", "x")], vec![chunk(100_000, vec![0; 8])])])),
        ("empty chunk", frame(vec![series(&[("__name__", "x")], vec![chunk(5, vec![])])])),
        ("oversized chunk", frame(vec![series(&[("__name__", "x")], vec![chunk(5, vec![7; 1 << 20])])])),
        (
            "series out of order",
            frame(vec![
                series(&[("__name__", "y")], vec![chunk(1, vec![0; 8])]),
                series(&[("__name__", "x")], vec![chunk(1, vec![0; 8])]),
            ]),
        ),
    ];
    for (what, frames) in cases {
        match ask_hostile(frames).await {
            Err(StoreError::Corrupt { reason, .. }) => assert!(reason.contains("store 127.0.0.1:"), "{what}: {reason}"),
            other => panic!("{what}: {other:?}"),
        }
    }
    // Garbage chunk bytes with a plausible header: decoding refuses them (or yields
    // samples), it never panics.
    for seed in 0..50u64 {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let data: Vec<u8> = (0..64)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let got = ask_hostile(frame(vec![series(&[("__name__", "x")], vec![chunk(20, data)])])).await;
        if let Ok(found) = got {
            let _ = found[0].samples(0, i64::MAX);
        }
    }
}

#[tokio::test]
async fn an_oversize_message_is_an_error() {
    // 40 MB of labels in one frame: over the client's 16 MiB cap.
    let big: Vec<pb::Series> = (0..40)
        .map(|i| series(&[("__name__", "x"), ("pad", &format!("{i}{}", "p".repeat(1 << 20)))], vec![]))
        .collect();
    let r = ask_hostile(vec![pb::SeriesResponse { series: big, ..Default::default() }]).await;
    assert!(matches!(r, Err(StoreError::Unavailable(ref m)) if m.contains("store 127.0.0.1:")), "{r:?}");
}

#[tokio::test]
async fn a_store_that_is_down_is_an_error_naming_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let opts = RemoteStoreOptions {
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let remote = RemoteStore::new(&addr, opts).unwrap();
    let r = remote.select(&SelectRequest::new(vec![Matcher::eq("__name__", "x")], 0, 1)).await;
    assert!(matches!(r, Err(StoreError::Unavailable(ref m)) if m.contains(&addr)), "{r:?}");
}

#[tokio::test]
async fn an_order_over_too_many_labels_is_refused_and_a_fair_one_is_kept() {
    let (addr, stop) = start(service(fixture_store(), Labels::from_pairs([("replica", "a")]))).await;
    let remote = RemoteStore::new(&addr, RemoteStoreOptions::default()).unwrap();
    let mut req = SelectRequest::new(vec![Matcher::eq("__name__", "DCGM_FI_DEV_GPU_UTIL")], 0, i64::MAX);
    req.order_without = (0..17).map(|i| format!("l{i}")).collect();
    let r = remote.select(&req).await;
    assert!(matches!(r, Err(StoreError::InvalidRequest(ref m)) if m.contains("order_without")), "{r:?}");
    // Ordered without `Hostname` (which sorts first), the series come in that order.
    req.order_without = vec!["Hostname".into()];
    let got: Vec<String> =
        remote.select(&req).await.unwrap().iter().map(|s| s.labels.get("gpu").unwrap_or("").to_string()).collect();
    assert_eq!(got, ["0", "1", "2"]);
    let _ = stop.send(());
}

#[tokio::test]
async fn tls_and_client_certificates_are_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let certs = strata_server::test_certs::write(dir.path()).unwrap();
    let server = |client_ca: Option<std::path::PathBuf>| {
        ServerTlsFiles { cert: certs.server_cert.clone(), key: certs.server_key.clone(), client_ca }.load().unwrap()
    };
    let client = |cert: bool| {
        let (cert, key) =
            if cert { (Some(certs.client_cert.clone()), Some(certs.client_key.clone())) } else { (None, None) };
        let files = ClientTlsFiles { ca: certs.ca.clone(), cert, key, server_name: Some("localhost".into()) };
        RemoteStoreOptions {
            tls: Some(files.load().unwrap()),
            connect_timeout: Duration::from_secs(2),
            ..Default::default()
        }
    };
    // TLS: the conformance suite passes over it, and a plaintext client gets an error.
    let (addr, stop) = start_tls(service(fixture_store(), Labels::default()), Some(server(None))).await;
    run_all(&RemoteStore::new(&addr, client(false)).unwrap()).await;
    let plain = RemoteStore::new(&addr, RemoteStoreOptions::default()).unwrap();
    let sel = SelectRequest::new(vec![Matcher::eq("__name__", "DCGM_FI_DEV_GPU_UTIL")], i64::MIN, i64::MAX);
    match plain.select(&sel).await {
        Err(StoreError::Unavailable(m)) => assert!(m.contains("connection error"), "the cause is named: {m}"),
        other => panic!("{other:?}"),
    }
    let _ = stop.send(());
    // Mutual TLS: a client without a certificate is refused, one with it is served.
    let (addr, stop) =
        start_tls(service(fixture_store(), Labels::default()), Some(server(Some(certs.ca.clone())))).await;
    match RemoteStore::new(&addr, client(false)).unwrap().select(&sel).await {
        Err(StoreError::Unavailable(m)) => assert!(m.contains("CertificateRequired"), "the cause is named: {m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(RemoteStore::new(&addr, client(true)).unwrap().select(&sel).await.unwrap().len(), 3);
    let _ = stop.send(());
    // Files that are missing or hold no PEM are errors naming them.
    let missing = ServerTlsFiles { cert: dir.path().join("nope.crt"), key: certs.server_key.clone(), client_ca: None };
    assert!(matches!(missing.load(), Err(GrpcError::Tls { file, .. }) if file.ends_with("nope.crt")));
    std::fs::write(dir.path().join("junk.crt"), "not a certificate").unwrap();
    let junk = ClientTlsFiles { ca: dir.path().join("junk.crt"), ..Default::default() };
    assert!(matches!(junk.load(), Err(GrpcError::Tls { file, .. }) if file.ends_with("junk.crt")));
    let half = ClientTlsFiles { ca: certs.ca.clone(), cert: Some(certs.client_cert.clone()), ..Default::default() };
    assert!(half.load().is_err(), "a certificate without its key");
}

#[tokio::test]
async fn idle_connections_cannot_hold_the_server() {
    use tokio::io::AsyncReadExt;
    let limits =
        ConnectionLimits { max_connections: 2, first_byte_timeout: Duration::from_millis(300), ..Default::default() };
    let (addr, stop) = start_limited(limits).await;
    // Every slot taken by a connection that never speaks.
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    // A real client still gets its answer: the idle ones are closed, freeing their slots.
    let remote = RemoteStore::new(&addr, RemoteStoreOptions::default()).unwrap();
    let sel = SelectRequest::new(vec![Matcher::eq("__name__", "DCGM_FI_DEV_GPU_UTIL")], i64::MIN, i64::MAX);
    let got = tokio::time::timeout(Duration::from_secs(10), remote.select(&sel)).await;
    assert_eq!(got.expect("served within 10 s").unwrap().len(), 3);
    // The server speaks first (its HTTP/2 settings), then closes what stays silent.
    for mut c in idle {
        let mut buf = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut buf)).await;
        assert!(closed.is_ok(), "an idle connection was kept");
    }
    let _ = stop.send(());

    // One slot, held by a silent connection: a client waits in the backlog until it goes.
    let limits =
        ConnectionLimits { max_connections: 1, first_byte_timeout: Duration::from_secs(30), ..Default::default() };
    let (addr, stop) = start_limited(limits).await;
    let silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let remote = RemoteStore::new(&addr, RemoteStoreOptions::default()).unwrap();
    let call = tokio::spawn(async move { remote.select(&sel).await.map(|v| v.len()) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!call.is_finished(), "served past the connection limit");
    drop(silent);
    let got = tokio::time::timeout(Duration::from_secs(10), call).await.expect("served once the slot was free");
    assert_eq!(got.unwrap().unwrap(), 3);
    let _ = stop.send(());
}

fn steps_request(values: bool) -> strata_store::StepsRequest {
    let all = vec![Matcher::new(strata_model::MatchOp::Regex, "__name__", ".+").unwrap()];
    // Inside the fixture's hour.
    let grid = (1_700_000_000_000, 1_700_003_600_000, 60_000);
    let mut r = strata_store::StepsRequest::new(all, grid, 300_000);
    (r.function, r.values) = (Some(("rate".into(), 300_000)), values);
    r
}

#[tokio::test]
async fn a_remote_leaf_is_the_local_leaf_with_external_labels() {
    let ext = Labels::from_pairs([("replica", "a")]);
    let (addr, stop) = start(service(fixture_store(), ext.clone())).await;
    let remote = RemoteStore::new(&addr, RemoteStoreOptions::default()).unwrap();
    let local = fixture_store();
    let view = |l: &Labels| {
        let mut b = l.to_builder();
        b.set("replica", "a");
        b.build()
    };
    for function in [None, Some(("rate".to_string(), 300_000)), Some(("max_over_time".to_string(), 120_000))] {
        for values in [true, false] {
            let req = strata_store::StepsRequest { function: function.clone(), ..steps_request(values) };
            let want = strata_promql::pushdown::evaluate(&local, &req, &view, Duration::from_secs(10)).await.unwrap();
            let got = remote.steps(&req).await.unwrap().expect("the server evaluates leaves");
            assert!(!want.series.is_empty());
            assert_eq!(got.series.len(), want.series.len(), "{function:?}");
            for (g, w) in got.series.iter().zip(&want.series) {
                assert_eq!(g.labels, w.labels);
                assert_eq!(g.summary, w.summary);
                assert_eq!(g.name_dropped, w.name_dropped);
                assert_eq!(g.values.steps(), w.values.steps());
                assert!(g.values.iter().zip(w.values.iter()).all(|(a, b)| a.map(f64::to_bits) == b.map(f64::to_bits)));
            }
            assert_eq!((got.samples, &got.infos), (want.samples, &want.infos));
        }
    }
    // Only the series asked for, by the hash of the labels the caller sees.
    let all = remote.steps(&steps_request(true)).await.unwrap().unwrap();
    let one = all.series[1].labels.clone();
    let mut req = steps_request(true);
    req.only = Some(Arc::new([strata_store::labels_hash(&one)].into_iter().collect()));
    let got = remote.steps(&req).await.unwrap().unwrap();
    assert_eq!(got.series.iter().map(|s| &s.labels).collect::<Vec<_>>(), [&one]);
    // A grid too large is refused before anything is evaluated.
    let huge = strata_store::StepsRequest { step: 1, end: 1_700_010_000_000, ..steps_request(true) };
    assert!(matches!(remote.steps(&huge).await, Err(StoreError::InvalidRequest(_))));
    let _ = stop.send(());
}

#[tokio::test]
async fn bad_steps_frames_are_errors_never_panics() {
    let label = |v: &str| vec![pb::Label { name: "__name__".into(), value: v.into() }];
    let one = |s: pb::StepSeries| vec![pb::StepsResponse { series: vec![s], ..Default::default() }];
    // The request's grid has 11 steps: two presence bytes.
    let good =
        pb::StepSeries { labels: label("x"), present: vec![0b11, 0], values: vec![1.0, 2.0], ..Default::default() };
    let cases: Vec<(&str, Vec<pb::StepsResponse>)> = vec![
        ("presence bytes for another grid", one(pb::StepSeries { present: vec![0b11; 7], ..good.clone() })),
        ("fewer values than present", one(pb::StepSeries { values: vec![1.0], ..good.clone() })),
        ("more values than present", one(pb::StepSeries { values: vec![1.0, 2.0, 3.0], ..good.clone() })),
        (
            "invalid label name",
            one(pb::StepSeries {
                labels: label("x")
                    .into_iter()
                    .map(|mut l| {
                        l.name = "bad name".into();
                        l
                    })
                    .collect(),
                ..good.clone()
            }),
        ),
        (
            "a label reference past the symbols",
            vec![pb::StepsResponse {
                series: vec![pb::StepSeries { labels: vec![], label_refs: vec![0, 1], ..good.clone() }],
                symbols: vec!["__name__".into()],
                ..Default::default()
            }],
        ),
        (
            "groups for a leaf without an aggregation",
            vec![pb::StepsResponse { groups: vec![good.clone()], ..Default::default() }],
        ),
        (
            "series out of order",
            vec![pb::StepsResponse {
                series: vec![pb::StepSeries { labels: label("y"), ..good.clone() }, good.clone()],
                ..Default::default()
            }],
        ),
    ];
    for (what, frames) in cases {
        let (addr, stop) = start_hostile(Vec::new(), frames).await;
        let remote = RemoteStore::new(&addr, RemoteStoreOptions::default()).unwrap();
        match remote.steps(&steps_request(true)).await {
            Err(StoreError::Corrupt { reason, .. }) => assert!(reason.contains("store 127.0.0.1:"), "{what}: {reason}"),
            other => panic!("{what}: {other:?}"),
        }
        let _ = stop.send(());
    }
    // More series than the request allows.
    let many: Vec<pb::StepSeries> =
        (0..5).map(|i| pb::StepSeries { labels: label(&format!("x{i}")), ..good.clone() }).collect();
    let (addr, stop) = start_hostile(Vec::new(), vec![pb::StepsResponse { series: many, ..Default::default() }]).await;
    let remote = RemoteStore::new(&addr, RemoteStoreOptions::default()).unwrap();
    let mut req = steps_request(true);
    req.limits.max_series = 3;
    assert!(matches!(remote.steps(&req).await, Err(StoreError::LimitExceeded { what: "series", .. })));
    let _ = stop.send(());
}

/// Findings of the global review: bounds a hostile or slow peer could break.
mod review {
    use super::*;

    /// A connection that only answers HTTP/2 pings (keepalive) and never calls: it holds
    /// its slot only until the idle timeout, and a real client is then served.
    #[tokio::test]
    async fn a_connection_that_only_pings_is_closed_when_idle() {
        let limits = ConnectionLimits {
            max_connections: 1,
            first_byte_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(500),
        };
        let (addr, stop) = start_limited(limits).await;
        let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let (_client, mut conn) = h2::client::handshake(tcp).await.unwrap();
        let mut pings = conn.ping_pong().expect("ping_pong");
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let pinger = tokio::spawn(async move {
            while pings.ping(h2::Ping::opaque()).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let remote = RemoteStore::new(&addr, RemoteStoreOptions::default()).unwrap();
        let sel = SelectRequest::new(vec![Matcher::eq("__name__", "DCGM_FI_DEV_GPU_UTIL")], i64::MIN, i64::MAX);
        let got = tokio::time::timeout(Duration::from_secs(5), remote.select(&sel)).await;
        assert!(got.is_ok(), "a connection that only pings held the only slot for 5 s");
        assert_eq!(got.unwrap().unwrap().len(), 3);
        let ended = tokio::time::timeout(Duration::from_secs(5), pinger).await;
        assert!(ended.is_ok(), "the pinging connection was kept");
        conn.abort();
        let _ = stop.send(());
    }

    /// 2,000 series of 960 samples each, about 16 MB of chunks: more than HTTP/2's window.
    fn large_store() -> MemoryStore {
        let mut m = MemoryStore::default();
        for i in 0..2000 {
            let labels = Labels::from_pairs([("__name__", "big".to_string()), ("i", format!("{i:05}"))]);
            let samples = (0..960i64).map(|k| {
                strata_model::Sample::new(k * 1000 + (k * 7919) % 13, ((k * 104_729 + i) % 100_003) as f64 / 7.0)
            });
            m.add(labels, strata_model::MetricType::Gauge, samples);
        }
        m
    }

    /// A client that asks for a large selection and stops reading: the server ends the
    /// stream once the longest a call may take has passed, freeing what it held, instead of
    /// keeping the selection until the client comes back; the client then sees an error,
    /// not an answer that looks complete.
    #[tokio::test]
    async fn a_stream_the_client_stops_reading_is_ended() {
        for external in [Labels::default(), Labels::from_pairs([("replica", "a")])] {
            // No call, its streamed answer included, runs longer than this.
            let opts = ServeOptions::new(Duration::from_secs(1));
            let (addr, stop) = start_with(service(large_store(), external.clone()), opts).await;
            let mut client = pb::store_client::StoreClient::connect(format!("http://{addr}"))
                .await
                .unwrap()
                .max_decoding_message_size(MAX_MESSAGE_BYTES);
            let req = pb::SeriesRequest {
                min_time: i64::MIN,
                max_time: i64::MAX,
                matchers: vec![pb::LabelMatcher { r#type: 0, name: "__name__".into(), value: "big".into() }],
                ..Default::default()
            };
            let mut stream = client.series(req).await.unwrap().into_inner();
            let mut got = stream.message().await.unwrap().map_or(0, |f| f.series.len());
            tokio::time::sleep(Duration::from_secs(2)).await;
            let mut ended_early = false;
            loop {
                match stream.message().await {
                    Ok(Some(f)) => got += f.series.len(),
                    Ok(None) => break,
                    Err(_) => {
                        ended_early = true;
                        break;
                    }
                }
            }
            assert!(
                ended_early && got < 2000,
                "external {external}: the server kept the stream for a client that stopped reading ({got} series came)"
            );
            let _ = stop.send(());
        }
    }

    /// A hostile store answers a leaf with far more values than the request's sample
    /// budget allows, frame after frame: the client stops at the first frame past the
    /// budget instead of holding every frame.
    #[tokio::test]
    async fn a_leaf_answer_over_the_sample_budget_fails_as_it_arrives() {
        // The request's grid has 61 steps: eight presence bytes.
        let frames: Vec<pb::StepsResponse> = (0..60)
            .map(|f| pb::StepsResponse {
                series: (0..2000)
                    .map(|i| pb::StepSeries {
                        labels: vec![pb::Label { name: "__name__".into(), value: format!("x{:06}", f * 2000 + i) }],
                        present: vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f],
                        values: vec![1.0; 61],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        let (addr, stop, taken) = start_hostile_counted(Vec::new(), frames).await;
        let remote = RemoteStore::new(&addr, RemoteStoreOptions::default()).unwrap();
        let mut req = steps_request(true);
        req.limits.max_samples = 200_000;
        let got = remote.steps(&req).await;
        assert!(
            matches!(got, Err(StoreError::LimitExceeded { what: "samples", limit: 200_000 })),
            "{:?}",
            got.map(|s| s.map(|s| s.series.len()))
        );
        // The budget is past in the second frame; what else the server sent is what fits
        // the connection's flow-control window (16 MiB, about 15 frames), not all 60.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = taken.load(std::sync::atomic::Ordering::SeqCst);
        assert!(sent < 30, "the client took {sent} of 60 frames before it stopped");
        let _ = stop.send(());
    }

    /// A summary without a step (an older peer's `gap` fields, or damage) vouches for
    /// nothing: the replica is never taken for whole on it.
    #[test]
    fn a_coverage_without_a_step_says_nothing() {
        let cov = pb::Coverage { first: 0, last: 600_000, step: 0, max_step: 0, stale: false };
        let s = pb::StepSeries {
            labels: vec![pb::Label { name: "__name__".into(), value: "x".into() }],
            summary: Some(pb::SeriesSummary {
                samples: 41,
                has_span: true,
                span_start: 0,
                span_end: 600_000,
                by_headers: Some(cov),
                by_samples: Some(cov),
            }),
            ..Default::default()
        };
        let mut pool = crate::convert::StringPool::default();
        let symbols = crate::convert::FrameSymbols::new(vec![], &mut pool);
        let got = crate::steps::series_from_pb(s, 11, false, &symbols, &mut pool).unwrap();
        assert_eq!((got.summary.by_headers, got.summary.by_samples), (None, None));
        let one = got.summary.clone();
        assert!(strata_store::whole_replica(&[&one, &got.summary]).is_none());
    }

    /// Step values are kept as the wire carries them: the values present and a bit per
    /// step, not 16 bytes a step.
    #[test]
    fn step_values_are_dense() {
        let v: Vec<Option<f64>> = (0..1000).map(|i| (i % 10 == 0).then_some(i as f64)).collect();
        let dense = strata_store::StepValues::from_options(&v);
        assert_eq!(dense.to_options(), v);
        assert!(
            dense.heap_bytes() <= 100 * 8 + 1000 / 8 + 16,
            "{} bytes for 100 values over 1000 steps",
            dense.heap_bytes()
        );
    }
}
