//! The StoreAPI's `Series` at a resolution, over a regional's aggregates: the windows as
//! computed (equal bit for bit to those of the deduplicated raw series), only what is
//! complete with a warning for the rest, the coarsest resolution held at or below the one
//! asked, and bad requests refused.

use crate::plan_tests::stack;
use crate::{decode, decode_served, encode, windows_of, Asked, Kept, Window, FIVE_MINUTES, ONE_HOUR};
use std::sync::Arc;
use std::time::Duration;
use strata_grpc::{pb, serve, RemoteStore, RemoteStoreOptions, ServeOptions, StoreInfo, StoreService};
use strata_model::{Labels, Matcher};
use strata_store::{AggregateSeries, QueryScope, SelectLimits, SelectRequest, Store, StoreError};

/// The windows a series' chunks hold, in order, and what they keep (every chunk the same).
fn windows(s: &AggregateSeries) -> (Vec<Window>, Kept) {
    let (mut out, mut kept) = (Vec::new(), None);
    for c in &s.chunks {
        let (ws, k) = decode_served(c, s.resolution).expect("chunks decode as described");
        assert!(kept.is_none_or(|kept| kept == k), "{:?} then {k:?}", kept);
        kept = Some(k);
        out.extend(ws);
    }
    (out, kept.expect("a chunk at least"))
}

#[tokio::test]
async fn series_at_a_resolution_serves_the_windows_as_computed_and_says_what_it_leaves_out() {
    let s = stack().await;
    let coverage = s.down.coverage();
    let info_coverage = coverage.clone();
    let info = Arc::new(move || StoreInfo {
        min_time: 0,
        max_time: 1,
        kind: pb::ComponentKind::Regional,
        label_sets: vec![],
        resolutions: info_coverage.clone(),
        complete_until: None,
    });
    let service = StoreService::new(s.regional.clone(), Labels::default(), SelectLimits::default(), info);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, service, ServeOptions::new(Duration::from_secs(30)), async {
        let _ = stopped.await;
    }));
    let remote = RemoteStore::new(&addr, RemoteStoreOptions::default()).unwrap();

    for name in ["temp", "energy_total"] {
        // The deduplicated raw series, as the regional downsampled it.
        let req = SelectRequest::new(vec![Matcher::eq("__name__", name)], s.t0, s.end);
        let raw = s.reference.select(&req).await.unwrap();
        assert_eq!(raw.len(), 1, "{name}");
        let samples = raw[0].samples(s.t0, s.end).unwrap();
        for width in [FIVE_MINUTES, ONE_HOUR] {
            let (_, first, last) = *coverage.iter().find(|c| c.0 == width).expect("both resolutions computed");
            let scope = QueryScope::default();
            let got = scope.clone().run(remote.select_aggregates(&req, width)).await.unwrap();
            assert_eq!(got.len(), 1, "{name} at {width}");
            assert_eq!(got[0].labels, raw[0].labels, "the replica label dropped, as the dedup drops it");
            assert_eq!(got[0].metric_type, raw[0].metric_type);
            // The ninth hour is raw data only: the answer stops where the windows do.
            let warnings = scope.warnings();
            assert!(warnings.iter().any(|w| w.contains("not in this answer")), "{name} at {width}: {warnings:?}");
            let (served, kept) = windows(&got[0]);
            assert_eq!(kept, Kept::of(raw[0].metric_type, Asked::default()));
            let expected: Vec<Window> = windows_of(&samples, width)
                .into_iter()
                .filter(|w| w.end - width >= first - 1 && w.end <= last && w.end >= s.t0 && w.end <= s.end)
                .collect();
            // What the series' type keeps of them (the rest reads as not kept).
            let expected = decode(&encode(&expected, width, kept)).unwrap().0;
            assert!(expected.len() as i64 * width >= 4 * ONE_HOUR, "{name} at {width}: {} windows", expected.len());
            assert_eq!(served.len(), expected.len(), "{name} at {width}");
            for (a, b) in served.iter().zip(&expected) {
                assert!(a.same_bits(b), "{name} at {width}: {a:?} vs {b:?}");
            }
        }
    }

    // Below the finest resolution held, a store serves raw data: the client that asked
    // for windows of that width says it got something else.
    let req = SelectRequest::new(vec![Matcher::eq("__name__", "temp")], s.t0, s.end);
    let err = remote.select_aggregates(&req, 60_000).await.unwrap_err();
    assert!(err.to_string().contains("where windows of 60000 ms were asked"), "{err}");
    // Limits hold at the store, before anything is decoded, and through the client.
    let few = SelectRequest { limits: SelectLimits { max_series: 1_000, max_samples: 5 }, ..req.clone() };
    let err = s.regional.select_aggregates(&few, FIVE_MINUTES).await.unwrap_err();
    assert!(matches!(err, StoreError::LimitExceeded { what: "samples", .. }), "{err}");
    let err = remote.select_aggregates(&few, FIVE_MINUTES).await.unwrap_err();
    assert!(matches!(err, StoreError::LimitExceeded { .. }), "{err}");
    // A function whose aggregates are not kept as configured is refused at once (finer
    // data answers it), with a message saying which.
    let mut steps = strata_store::StepsRequest::new(
        req.matchers.clone(),
        (s.t0 + ONE_HOUR, s.t0 + 2 * ONE_HOUR, FIVE_MINUTES),
        300_000,
    );
    steps.function = Some(("ts_of_max_over_time".into(), FIVE_MINUTES));
    steps.resolution = FIVE_MINUTES;
    let err = s.regional.steps(&steps).await.unwrap_err();
    assert!(err.to_string().contains("downsample.extreme_times"), "{err}");
    steps.function = Some(("max_over_time".into(), FIVE_MINUTES));
    assert!(s.regional.steps(&steps).await.unwrap().is_some(), "max_over_time is kept");
    // Without partial response, a range the windows do not wholly cover is an error.
    let whole = QueryScope::new(false, true);
    let err = whole.run(s.regional.select_aggregates(&req, FIVE_MINUTES)).await.unwrap_err();
    assert!(err.to_string().contains("partial response is disabled"), "{err}");

    // Single aggregates (Thanos' kind) and negative resolutions are refused.
    let mut client = pb::store_client::StoreClient::connect(format!("http://{addr}")).await.unwrap();
    let ask = |max_resolution_ms: i64, aggregates: Vec<i32>| pb::SeriesRequest {
        min_time: s.t0,
        max_time: s.end,
        matchers: vec![pb::LabelMatcher { r#type: 0, name: "__name__".into(), value: "temp".into() }],
        max_resolution_ms,
        aggregates,
        ..Default::default()
    };
    // A client that does not say it takes windows gets raw chunks, as before.
    for aggregates in [vec![], vec![pb::Aggregate::Raw as i32]] {
        let mut frames = client.series(ask(FIVE_MINUTES, aggregates)).await.unwrap().into_inner();
        let mut chunks = 0;
        while let Some(f) = frames.message().await.unwrap() {
            for series in f.series {
                assert!(series.chunks.iter().all(|c| c.resolution_ms == 0 && c.aggregate == pb::Aggregate::Raw as i32));
                chunks += series.chunks.len();
            }
        }
        assert!(chunks > 0);
    }
    for (max, aggregates, says) in
        [(FIVE_MINUTES, vec![pb::Aggregate::Count as i32], "AGGREGATE_WINDOWS"), (-1, vec![], "negative")]
    {
        let status = client.series(ask(max, aggregates)).await.map(|_| ()).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(says), "{}", status.message());
    }
    let _ = stop.send(());
}
