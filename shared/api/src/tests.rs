use super::*;
use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use strata_model::{Labels, Metadata, MetricType, Sample};
use strata_tsdb::TsdbStore;
use strata_tsdb::{Tsdb, TsdbOptions};
use tower::ServiceExt;

fn app() -> (tempfile::TempDir, Router) {
    let d = tempfile::tempdir().unwrap();
    let db = Arc::new(Tsdb::open(d.path(), TsdbOptions::default()).unwrap());
    for gpu in 0..3 {
        for name in ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP"] {
            let s = db
                .series(&Labels::from_pairs([
                    ("__name__", name.to_string()),
                    ("gpu", gpu.to_string()),
                    ("job", "dcgm".into()),
                ]))
                .unwrap();
            db.commit(&[(s, Sample::new(1_700_000_000_000, 1.0))]).unwrap();
        }
    }
    db.set_metadata(
        "DCGM_FI_DEV_GPU_UTIL",
        Metadata { metric_type: MetricType::Gauge, help: "GPU utilization (in %).".into(), unit: String::new() },
    )
    .unwrap();
    (d, router(Arc::new(TsdbStore(db))))
}

async fn call(app: &Router, req: Request<Body>) -> (u16, Value) {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn get(app: &Router, uri: &str) -> (u16, Value) {
    call(app, Request::get(uri).body(Body::empty()).unwrap()).await
}

#[tokio::test]
async fn series_by_get_and_post() {
    let (_d, app) = app();
    let (code, v) = get(&app, "/api/v1/series?match[]=DCGM_FI_DEV_GPU_UTIL&match[]=%7Bgpu%3D%220%22%7D").await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "success");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 4, "3 GPU_UTIL + GPU_TEMP of gpu 0, deduplicated: {v}");
    assert_eq!(data[0]["__name__"], "DCGM_FI_DEV_GPU_TEMP");
    let req = Request::post("/api/v1/series")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from(
            "match[]=DCGM_FI_DEV_GPU_TEMP%7Bgpu%3D~%221%7C2%22%7D&start=1699999999&end=2023-11-14T22:13:21Z",
        ))
        .unwrap();
    let (code, v) = call(&app, req).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn bad_requests_are_bad_data() {
    let (_d, app) = app();
    for uri in [
        "/api/v1/series",
        "/api/v1/series?match[]=rate(x%5B5m%5D)",
        "/api/v1/series?match[]=x%7B",
        "/api/v1/series?match[]=%7Ba%3D~%22.*%22%7D",
        "/api/v1/series?match[]=up&start=yesterday",
        "/api/v1/labels?limit=-1",
        "/api/v1/label/1bad/values",
    ] {
        let (code, v) = get(&app, uri).await;
        assert_eq!(code, 400, "{uri}: {v}");
        assert_eq!(v["status"], "error");
        assert_eq!(v["errorType"], "bad_data");
        assert!(!v["error"].as_str().unwrap().is_empty());
    }
}

#[tokio::test]
async fn labels_values_metadata_and_limits() {
    let (_d, app) = app();
    let (_, v) = get(&app, "/api/v1/labels").await;
    assert_eq!(v["data"], json!(["__name__", "gpu", "job"]));
    let (_, v) = get(&app, "/api/v1/label/gpu/values").await;
    assert_eq!(v["data"], json!(["0", "1", "2"]));
    let (_, v) = get(&app, "/api/v1/label/gpu/values?limit=2").await;
    assert_eq!(v["data"], json!(["0", "1"]));
    assert_eq!(v["warnings"][0], "results truncated due to limit");
    let (_, v) = get(&app, "/api/v1/label/__name__/values?match[]=%7Bgpu%3D%221%22%7D").await;
    assert_eq!(v["data"], json!(["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL"]));
    let (_, v) = get(&app, "/api/v1/metadata?metric=DCGM_FI_DEV_GPU_UTIL").await;
    assert_eq!(v["data"]["DCGM_FI_DEV_GPU_UTIL"][0]["type"], "gauge");
    let (code, v) = get(&app, "/api/v1/status/buildinfo").await;
    assert_eq!(code, 200);
    assert!(v["data"]["version"].is_string());
}

#[tokio::test]
async fn instant_and_range_queries_in_prometheus_shapes() {
    let (_d, app) = app();
    let (code, v) = get(&app, "/api/v1/query?query=sum(DCGM_FI_DEV_GPU_UTIL)&time=1700000000").await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["data"]["resultType"], "vector");
    assert_eq!(v["data"]["result"][0]["value"], json!([1700000000, "3"]));
    assert_eq!(v["data"]["result"][0]["metric"], json!({}));
    let (code, v) = get(
        &app,
        "/api/v1/query_range?query=DCGM_FI_DEV_GPU_TEMP%7Bgpu%3D%220%22%7D&start=1700000000&end=1700000060&step=30s",
    )
    .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["data"]["resultType"], "matrix");
    let s = &v["data"]["result"][0];
    assert_eq!(s["metric"]["__name__"], "DCGM_FI_DEV_GPU_TEMP");
    assert_eq!(s["values"], json!([[1700000000, "1"], [1700000030, "1"], [1700000060, "1"]]));
    let (_, v) = get(&app, "/api/v1/query?query=1%2B1&time=10").await;
    assert_eq!(v["data"], json!({"resultType": "scalar", "result": [10, "2"]}));
}

#[tokio::test]
async fn stats_on_request_count_the_samples_touched() {
    let (_d, app) = app();
    let (_, v) = get(&app, "/api/v1/query?query=sum(DCGM_FI_DEV_GPU_UTIL)&time=1700000000").await;
    assert!(v["data"].get("stats").is_none(), "no stats unless asked: {v}");
    let (code, v) = get(&app, "/api/v1/query?query=sum(DCGM_FI_DEV_GPU_UTIL)&time=1700000000&stats=1").await;
    assert_eq!(code, 200, "{v}");
    let st = &v["data"]["stats"];
    assert_eq!(st["samples"]["totalQueryableSamples"], 3, "{st}");
    assert_eq!(st["samples"]["peakSamples"], 3, "{st}");
    assert!(st["samples"].get("totalQueryableSamplesPerStep").is_none());
    assert!(st["timings"]["evalTotalTime"].as_f64().is_some_and(|t| t >= 0.0), "{st}");
    // Three GPUs, one sample each, looked back at from three steps 30 s apart.
    let (_, v) =
        get(&app, "/api/v1/query_range?query=DCGM_FI_DEV_GPU_TEMP&start=1700000000&end=1700000060&step=30s&stats=all")
            .await;
    let st = &v["data"]["stats"]["samples"];
    assert_eq!(st["totalQueryableSamples"], 9, "{st}");
    assert_eq!(st["totalQueryableSamplesPerStep"], json!([[1700000000, 3], [1700000030, 3], [1700000060, 3]]));
    let (_, v) =
        get(&app, "/api/v1/query?query=count_over_time(DCGM_FI_DEV_GPU_TEMP[5m])&time=1700000060&stats=all").await;
    assert_eq!(v["data"]["stats"]["samples"]["totalQueryableSamplesPerStep"], json!([[1700000060, 3]]));
}

#[tokio::test]
async fn query_errors_have_prometheus_types_and_codes() {
    let (_d, app) = app();
    let (code, v) = get(&app, "/api/v1/query?query=sum(").await;
    assert_eq!((code, v["errorType"].as_str()), (400, Some("bad_data")), "{v}");
    assert!(v["error"].as_str().unwrap().contains("query"), "{v}");
    let (code, v) = get(&app, "/api/v1/query_range?query=up&start=0&end=100000&step=1").await;
    assert_eq!(code, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("11,000 points"), "{v}");
    let (code, _) = get(&app, "/api/v1/query_range?query=up&start=0&end=100&step=0").await;
    assert_eq!(code, 400);
    // a sample limit names itself and answers 422
    let d = tempfile::tempdir().unwrap();
    let db = Arc::new(Tsdb::open(d.path(), TsdbOptions::default()).unwrap());
    let s = db.series(&Labels::from_pairs([("__name__", "m")])).unwrap();
    let batch: Vec<_> = (0..100).map(|i| (s.clone(), Sample::new(i * 1000, 1.0))).collect();
    db.commit(&batch).unwrap();
    let small = router_with(
        Arc::new(TsdbStore(db)),
        ApiOptions {
            engine: strata_promql::EngineOptions { max_samples: 10, ..Default::default() },
            ..Default::default()
        },
    );
    let (code, v) = get(&small, "/api/v1/query?query=sum_over_time(m%5B100s%5D)&time=100").await;
    assert_eq!((code, v["errorType"].as_str()), (422, Some("execution")), "{v}");
    assert!(v["error"].as_str().unwrap().contains("10"), "{v}");
}

#[tokio::test]
async fn a_timeout_is_503_and_the_query_is_cancelled() {
    let d = tempfile::tempdir().unwrap();
    let db = Arc::new(Tsdb::open(d.path(), TsdbOptions::default()).unwrap());
    for g in 0..50 {
        let s = db.series(&Labels::from_pairs([("__name__", "m".to_string()), ("g", g.to_string())])).unwrap();
        let batch: Vec<_> = (0..20_000).map(|i| (s.clone(), Sample::new(i * 1000, i as f64))).collect();
        db.commit(&batch).unwrap();
    }
    let app = router(Arc::new(TsdbStore(db)));
    let started = std::time::Instant::now();
    // a heavy nested subquery: far more than a millisecond of evaluation
    let (code, v) = get(&app, "/api/v1/query_range?query=max_over_time(sum_over_time(m%5B10m%5D)%5B1h%3A1s%5D)&start=3600&end=20000&step=10&timeout=1ms").await;
    assert_eq!((code, v["errorType"].as_str()), (503, Some("timeout")), "{v}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "the evaluation stopped soon after its deadline");
}

#[tokio::test]
async fn gzip_on_request() {
    use std::io::Read;
    let (_d, app) = app();
    let req = Request::get("/api/v1/labels").header("accept-encoding", "gzip, deflate").body(Body::empty()).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.headers().get("content-encoding").map(|v| v.to_str().unwrap()), Some("gzip"));
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let mut text = String::new();
    flate2::read::GzDecoder::new(&bytes[..]).read_to_string(&mut text).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["data"], json!(["__name__", "gpu", "job"]));
    // without the header, plain JSON
    let (code, v) = get(&app, "/api/v1/labels").await;
    assert_eq!((code, v["status"].as_str()), (200, Some("success")));
}

/// A query that runs for minutes unless stopped: a median over a day of 1 s subquery steps
/// at each of 10,001 steps, with the sample limits lifted so only cancellation stops it.
const ENDLESS: &str =
    "/api/v1/query_range?query=quantile_over_time(0.5,vector(time())%5B1d:1s%5D)&start=0&end=10000&step=1";

fn unlimited(max_concurrency: usize) -> (tempfile::TempDir, Router) {
    let d = tempfile::tempdir().unwrap();
    let db = Arc::new(Tsdb::open(d.path(), TsdbOptions::default()).unwrap());
    let engine = strata_promql::EngineOptions { max_samples: u64::MAX / 4, ..Default::default() };
    (d, router_with(Arc::new(TsdbStore(db)), ApiOptions { engine, max_concurrency }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_past_the_concurrency_limit_wait_and_time_out_in_the_queue() {
    let (_d, app) = unlimited(1);
    let busy = tokio::spawn({
        let app = app.clone();
        async move { get(&app, ENDLESS).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let began = std::time::Instant::now();
    let (code, v) = get(&app, "/api/v1/query?query=1&timeout=0.5").await;
    assert_eq!(code, 503, "{v}");
    assert_eq!(v["errorType"], "timeout", "{v}");
    assert!(v["error"].as_str().unwrap_or_default().contains("query slots"), "{v}");
    assert!(began.elapsed() < std::time::Duration::from_secs(5));
    // The client of the running query goes away: its evaluation stops and frees the slot.
    busy.abort();
    let began = std::time::Instant::now();
    let (code, v) = get(&app, "/api/v1/query?query=1&timeout=10").await;
    assert_eq!(code, 200, "{v}");
    assert!(began.elapsed() < std::time::Duration::from_secs(5), "the slot was freed only after {:?}", began.elapsed());
}

#[test]
fn a_query_whose_caller_goes_away_stops_evaluating() {
    let (_d, app) = unlimited(4);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let r =
        rt.block_on(async { tokio::time::timeout(std::time::Duration::from_millis(300), get(&app, ENDLESS)).await });
    assert!(r.is_err(), "the query was expected to run past 300 ms");
    // Dropping the runtime waits for its blocking threads, the evaluation among them.
    let began = std::time::Instant::now();
    drop(rt);
    assert!(began.elapsed() < std::time::Duration::from_secs(5), "evaluation ran on for {:?}", began.elapsed());
}

#[tokio::test]
async fn annotations_come_back_as_warnings_and_infos() {
    let (_d, app) = app();
    // A quantile outside [0, 1]: a warning, in the vector and the matrix shape alike.
    let (code, v) = get(&app, "/api/v1/query?query=quantile(2,DCGM_FI_DEV_GPU_UTIL)&time=1700000000").await;
    assert_eq!(code, 200, "{v}");
    // Worded as Prometheus 3 words it, with the argument's line and column in the query.
    assert_eq!(v["warnings"][0], "PromQL warning: quantile value should be between 0 and 1, got 2 (1:10)", "{v}");
    let (code, v) =
        get(&app, "/api/v1/query_range?query=quantile(2,DCGM_FI_DEV_GPU_UTIL)&start=1700000000&end=1700000060&step=15")
            .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["data"]["resultType"], "matrix");
    assert!(v["warnings"][0].as_str().unwrap_or_default().contains("quantile value"), "{v}");
    // rate() over a name that does not look like a counter: an info.
    let (_, v) = get(&app, "/api/v1/query?query=rate(DCGM_FI_DEV_GPU_UTIL%5B5m%5D)&time=1700000000").await;
    assert_eq!(
        v["infos"][0],
        "PromQL info: metric might not be a counter, name does not end in _total/_sum/_count/_bucket: \"DCGM_FI_DEV_GPU_UTIL\" (1:6)",
        "{v}"
    );
    // One warning per message, as Prometheus keys them (the position is the last one's).
    let (_, v) = get(
        &app,
        "/api/v1/query?query=quantile(2,DCGM_FI_DEV_GPU_UTIL)%2Bquantile(2,DCGM_FI_DEV_GPU_UTIL)&time=1700000000",
    )
    .await;
    assert_eq!(v["warnings"].as_array().map(Vec::len), Some(1), "{v}");
    // The position is the argument's in the text as sent, across lines.
    let (_, v) =
        get(&app, "/api/v1/query?query=sum(%0A%20%20rate(DCGM_FI_DEV_GPU_UTIL%5B5m%5D))&time=1700000000").await;
    assert!(v["infos"][0].as_str().unwrap_or_default().ends_with("\" (2:8)"), "{v}");
    // No annotation, no key.
    let (_, v) = get(&app, "/api/v1/query?query=DCGM_FI_DEV_GPU_UTIL&time=1700000000").await;
    assert!(v.get("warnings").is_none() && v.get("infos").is_none(), "{v}");
}

/// Edge review (issue 20, items 18 and 19), each against Prometheus 3's answer.
#[tokio::test]
async fn points_limit_limit_lookback_and_expired_timeouts_as_prometheus() {
    let (_d, app) = app();
    // Exactly 11,000 points is allowed; 11,001 is not.
    let (code, v) = get(&app, "/api/v1/query_range?query=1&start=0&end=11000&step=1").await;
    assert_eq!(code, 200, "{v}");
    let (code, _) = get(&app, "/api/v1/query_range?query=1&start=0&end=11001&step=1").await;
    assert_eq!(code, 400);

    // `limit` cuts the result and warns.
    let (code, v) = get(&app, "/api/v1/query?query=DCGM_FI_DEV_GPU_UTIL&time=1700000000&limit=2").await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["data"]["result"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["warnings"][0], "results truncated due to limit");
    let (_, v) = get(&app, "/api/v1/query?query=DCGM_FI_DEV_GPU_UTIL&time=1700000000&limit=0").await;
    assert_eq!(v["data"]["result"].as_array().map(Vec::len), Some(3));
    assert!(v.get("warnings").is_none());
    let range = "/api/v1/query_range?query=DCGM_FI_DEV_GPU_UTIL&start=1700000000&end=1700000060&step=15&limit=1";
    let (_, v) = get(&app, range).await;
    assert_eq!(v["data"]["result"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["warnings"][0], "results truncated due to limit");

    // `lookback_delta`: the sample at 1700000000 is found 60 s later only with a lookback over a minute.
    let (_, v) = get(&app, "/api/v1/query?query=DCGM_FI_DEV_GPU_UTIL&time=1700000060&lookback_delta=30s").await;
    assert_eq!(v["data"]["result"].as_array().map(Vec::len), Some(0), "{v}");
    let (_, v) = get(&app, "/api/v1/query?query=DCGM_FI_DEV_GPU_UTIL&time=1700000060&lookback_delta=2m").await;
    assert_eq!(v["data"]["result"].as_array().map(Vec::len), Some(3), "{v}");

    // A timeout that has expired before the query starts.
    for t in ["0", "-1", "0.0001"] {
        let (code, v) = get(&app, &format!("/api/v1/query?query=1&timeout={t}")).await;
        assert_eq!((code, v["errorType"].as_str()), (503, Some("timeout")), "timeout={t}: {v}");
    }
}

/// Edge review (issue 20, items 17, 20-23, 25), each against Prometheus' answer.
#[tokio::test]
async fn boundary_times_empty_ranges_body_params_cors_and_build_info_as_prometheus() {
    let (_d, app) = app();
    // client_golang's boundary times, as numbers and in Go's RFC 3339 spelling.
    for (start, end) in [
        ("-9223309901257974", "9223309901257974"),
        ("-292273086-05-16T16:47:06Z", "292277025-08-18T07:12:54.999999999Z"),
    ] {
        let (code, v) =
            get(&app, &format!("/api/v1/series?match[]=DCGM_FI_DEV_GPU_UTIL&start={start}&end={end}")).await;
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["data"].as_array().map(Vec::len), Some(3));
        let (code, v) = get(&app, &format!("/api/v1/labels?start={start}&end={end}")).await;
        assert_eq!(code, 200, "{v}");
    }
    // An end before the start: an empty list.
    for path in ["/api/v1/series?match[]=up&", "/api/v1/labels?", "/api/v1/label/job/values?"] {
        let (code, v) = get(&app, &format!("{path}start=200&end=100")).await;
        assert_eq!((code, v["data"].clone()), (200, json!([])), "{path}");
    }
    // Metadata limits as Prometheus 3.
    let (_, v) = get(&app, "/api/v1/metadata?limit=0").await;
    assert_eq!(v["data"], json!({}));
    let (_, v) = get(&app, "/api/v1/metadata?limit=-1").await;
    assert_eq!(v["data"].as_object().map(|m| m.len()), Some(1));
    let (code, _) = get(&app, "/api/v1/metadata?limit_per_metric=x").await;
    assert_eq!(code, 400);
    // A POST whose body and URL both carry `query`: the body's is evaluated.
    let req = Request::post("/api/v1/query?query=1")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from("query=2"))
        .unwrap();
    let (_, v) = call(&app, req).await;
    assert_eq!(v["data"]["result"][1], "2", "{v}");
    // CORS: a preflight is 204 with the headers, and answers to an origin carry them.
    let resp = app
        .clone()
        .oneshot(Request::options("/api/v1/query").header("origin", "http://grafana").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    assert_eq!(resp.headers()["access-control-allow-origin"], "*");
    assert!(resp.headers()["access-control-allow-methods"].to_str().unwrap().contains("POST"));
    // Unknown paths, exemplars, build info.
    let resp = app.clone().oneshot(Request::get("/api/v1/nope").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    assert_eq!(&resp.into_body().collect().await.unwrap().to_bytes()[..], b"404 page not found\n");
    let (code, v) = get(&app, "/api/v1/query_exemplars?query=up&start=0&end=1").await;
    assert_eq!((code, v["data"].clone()), (200, json!([])));
    let (_, v) = get(&app, "/api/v1/status/buildinfo").await;
    assert!(v["data"]["version"].as_str().is_some_and(|s| s.starts_with("3.")), "{v}");
    assert_eq!(v["data"]["strataVersion"], env!("CARGO_PKG_VERSION"));
    assert!(v["data"]["buildDate"].as_str().is_some_and(|d| d.len() == 17), "{v}");
}

/// Item 23: at most ten annotations of a kind, then a count of the rest.
#[test]
fn annotations_are_capped_at_ten_with_a_count() {
    let many: Vec<String> = (0..13).map(|i| format!("info {i}")).collect();
    let capped = capped(&many, "info");
    assert_eq!(capped.len(), 11);
    assert_eq!(capped[10], "3 more info annotations omitted");
    assert_eq!(super::capped(&many[..10], "info").len(), 10);
}

/// Thanos' `max_source_resolution` values: `auto` (or none) lets the planner choose,
/// `raw` and `0s` mean raw data, `5m` and `1h` cap the aggregates; anything else is a 400.
#[test]
fn max_source_resolution_takes_thanos_values() {
    let of = |q: &str| {
        let p = Params::from_request(&Method::GET, &HeaderMap::new(), Some(q), &Bytes::new()).unwrap();
        max_source_resolution(&p)
    };
    assert_eq!(of("query=up").unwrap(), None);
    assert_eq!(of("max_source_resolution=auto").unwrap(), None);
    assert_eq!(of("max_source_resolution=raw").unwrap(), Some(0));
    assert_eq!(of("max_source_resolution=0s").unwrap(), Some(0));
    assert_eq!(of("max_source_resolution=5m").unwrap(), Some(300_000));
    assert_eq!(of("max_source_resolution=1h").unwrap(), Some(3_600_000));
    assert!(of("max_source_resolution=fine").is_err());
}
