//! The global querier over real processes: an HA pair of edges (same cluster, replicas
//! `a` and `b`), a store that refuses connections and one that accepts and never answers.
//! The global answers within its store timeout with each series once, names the two bad
//! stores in warnings (or fails with `partial_response=false`), and lists every store with
//! its health at `/api/v1/stores`.

use crate::common::*;
use crate::differential::{remote_write_all, Series};
use serde_json::Value;
use std::time::{Duration, Instant};

pub(crate) fn edge(dir: &std::path::Path, replica: &str) -> (Proc, String, String) {
    edge_with(dir, replica, &[])
}

/// An edge of cluster `c0` with replica label `replica`, started with `extra` arguments.
fn edge_with(dir: &std::path::Path, replica: &str, extra: &[&str]) -> (Proc, String, String) {
    edge_of(dir, "c0", replica, extra)
}

/// An edge of `cluster` with replica label `replica`, started with `extra` arguments.
pub(crate) fn edge_of(dir: &std::path::Path, cluster: &str, replica: &str, extra: &[&str]) -> (Proc, String, String) {
    // Files as before for cluster c0; the other clusters' beside them.
    let name = if cluster == "c0" { replica.to_string() } else { format!("{cluster}-{replica}") };
    let cfg = dir.join(format!("edge-{name}.yml"));
    let text =
        format!("global:\n  external_labels:\n    cluster: {cluster}\n    replica: {replica}\nscrape_configs: []\n");
    std::fs::write(&cfg, text).unwrap();
    let data = dir.join(format!("data-{name}"));
    let (http, grpc) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let (cfg, data) = (cfg.display().to_string(), data.display().to_string());
    let mut args = vec!["edge", "--config", &cfg, "--data", &data, "--http-listen", &http, "--grpc-listen", &grpc];
    args.extend_from_slice(extra);
    let mut p = Proc::strata(&args, dir, &format!("edge-{name}"));
    wait_ready(&format!("http://{http}/-/ready"), &mut p, Duration::from_secs(30));
    (p, format!("http://{http}"), grpc)
}

/// A global named `name` with this configuration file, started with `extra` arguments;
/// returns it and its base URL.
pub(crate) fn start_global(dir: &std::path::Path, name: &str, config: &str, extra: &[&str]) -> (Proc, String) {
    let cfg = dir.join(format!("{name}.yml"));
    std::fs::write(&cfg, config).unwrap();
    let (cfg, http) = (cfg.display().to_string(), format!("127.0.0.1:{}", free_port()));
    let mut args = vec!["global", "--config", &cfg, "--http-listen", &http];
    args.extend_from_slice(extra);
    let mut p = Proc::strata(&args, dir, name);
    wait_ready(&format!("http://{http}/-/ready"), &mut p, Duration::from_secs(30));
    (p, format!("http://{http}"))
}

fn get(url: &str) -> (u16, Value) {
    let resp = client().get(url).send().unwrap_or_else(|e| panic!("{url}: {e}"));
    let code = resp.status().as_u16();
    let text = resp.text().unwrap();
    (code, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: {e}: {text}")))
}

#[test]
fn the_global_dedups_an_ha_pair_and_names_bad_stores() {
    let dir = tempfile::tempdir().unwrap();
    let (mut edge_a, base_a, grpc_a) = edge(dir.path(), "a");
    let (mut edge_b, base_b, grpc_b) = edge(dir.path(), "b");
    let now = now_ms();
    let start = (now - 10 * 60_000) / 1000 * 1000;
    // Both replicas hold the same GPUs; replica b's scrapes come 2.5 s later.
    for (base, offset) in [(&base_a, 0), (&base_b, 2_500)] {
        let series: Vec<Series> = (0..3)
            .map(|g| {
                let labels = vec![("__name__".to_string(), "gpu_temp".to_string()), ("gpu".to_string(), g.to_string())];
                (labels, (0..100).map(|i| (start + offset + i * 5_000, (40 + g) as f64)).collect())
            })
            .collect();
        remote_write_all(base, &series);
    }
    // A store that refuses (nothing listens) and one that accepts and never answers.
    let refused = format!("127.0.0.1:{}", free_port());
    let hanging = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hanging_addr = hanging.local_addr().unwrap().to_string();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        hanging.set_nonblocking(true).unwrap();
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            match hanging.accept() {
                Ok((c, _)) => conns.push(c),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    let stores = format!("stores: ['{grpc_a}', '{grpc_b}', '{refused}', '{hanging_addr}']\n");
    let (mut global, base) =
        start_global(dir.path(), "global", &format!("{stores}store_timeout: 2s\ninfo_interval: 1s\n"), &[]);

    let t = (start + 99 * 5_000) as f64 / 1000.0;
    let asked = Instant::now();
    let (code, body) = get(&format!("{base}/api/v1/query?query=gpu_temp&time={t:.3}"));
    assert!(asked.elapsed() < Duration::from_secs(8), "the answer took {:?}", asked.elapsed());
    assert_eq!(code, 200, "{body}");
    let result = body["data"]["result"].as_array().unwrap();
    assert_eq!(result.len(), 3, "each GPU once: {body}");
    for s in result {
        assert_eq!(s["metric"]["cluster"], "c0");
        assert!(s["metric"].get("replica").is_none(), "the replica label is deduplicated away: {s}");
    }
    let warnings: Vec<String> = body["warnings"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|w| w.as_str().unwrap().to_string())
        .collect();
    assert!(warnings.iter().any(|w| w.contains(&refused)), "{warnings:?}");
    assert!(warnings.iter().any(|w| w.contains(&hanging_addr)), "{warnings:?}");
    assert!(!warnings.iter().any(|w| w.contains(&grpc_a) || w.contains(&grpc_b)), "{warnings:?}");

    let (code, body) = get(&format!("{base}/api/v1/query?query=gpu_temp&time={t:.3}&partial_response=false"));
    assert_ne!(code, 200, "{body}");
    let err = body["error"].as_str().unwrap_or_default();
    assert!(err.contains(&refused) && err.contains(&hanging_addr), "{body}");

    let (_, body) = get(&format!("{base}/api/v1/query?query=gpu_temp&time={t:.3}&dedup=false"));
    assert_eq!(body["data"]["result"].as_array().unwrap().len(), 6, "both replicas of each GPU: {body}");

    let data = api_data(&format!("{base}/api/v1/stores"));
    let stores = data.as_array().unwrap();
    assert_eq!(stores.len(), 4, "{data}");
    let health = |addr: &str| stores.iter().find(|s| s["address"] == addr).map(|s| s["health"].clone());
    assert_eq!(health(&grpc_a), Some(Value::from("up")), "{data}");
    assert_eq!(health(&refused), Some(Value::from("down")), "{data}");
    assert_eq!(health(&hanging_addr), Some(Value::from("down")), "{data}");
    let a = stores.iter().find(|s| s["address"] == grpc_a.as_str()).unwrap();
    assert_eq!(a["labelSets"][0]["replica"], "a", "{a}");
    assert_eq!(a["kind"], "edge");

    // The global's own metrics (issue 20, item 28): each store's health, its requests.
    let m = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    let store_up = |addr: &str| metric_value(&m, &format!("strata_global_store_up{{store=\"{addr}\"}}"));
    assert_eq!((store_up(&grpc_a), store_up(&refused)), (Some(1.0), Some(0.0)), "{m}");
    assert_eq!(metric_value(&m, "strata_global_stores"), Some(4.0), "{m}");
    assert!(m.contains("strata_global_http_requests_total{handler=\"/api/v1/query\",code=\"200\"}"), "{m}");
    assert!(m.contains("strata_global_http_request_duration_seconds_bucket{"), "{m}");

    // Globals stack: a global over the pair serves the StoreAPI (streaming the fan-out's
    // merge through), and a global over it deduplicates as the first one did.
    let mid_grpc = format!("127.0.0.1:{}", free_port());
    let mid_cfg = format!("stores: ['{grpc_a}', '{grpc_b}']\ninfo_interval: 1s\n");
    let (mut mid, _) = start_global(dir.path(), "global-mid", &mid_cfg, &["--grpc-listen", &mid_grpc]);
    let top_cfg = format!("stores: ['{mid_grpc}']\ninfo_interval: 1s\n");
    let (mut top, top_base) = start_global(dir.path(), "global-top", &top_cfg, &[]);
    let range_q = |base: &str, extra: &str| {
        let url = format!(
            "{base}/api/v1/query_range?query=gpu_temp&start={:.3}&end={t:.3}&step=5{extra}",
            start as f64 / 1000.0
        );
        api_data(&url)["result"].clone()
    };
    let (direct, stacked) = (range_q(&base, ""), range_q(&top_base, ""));
    assert_eq!(stacked.as_array().map(Vec::len), Some(3), "{stacked}");
    assert_eq!(stacked, direct, "the stacked global answers as the one over the edges");
    assert_eq!(range_q(&top_base, "&dedup=false").as_array().map(Vec::len), Some(6));
    top.terminate();
    mid.terminate();

    global.terminate();
    edge_a.terminate();
    edge_b.terminate();
    drop(held);
}

/// An edge of the HA pair scraping `sim` every 2 s, with its StoreAPI; returns it and its
/// arguments (to restart it on the same data). Two seconds, not one: under a loaded CI
/// machine a 1 s scrape can slip past the 1.5-interval gap limit, and the healthy replica
/// would no longer be gap-free.
fn scraping_edge(dir: &std::path::Path, replica: &str, sim: &str) -> (Proc, Vec<String>, String, String) {
    let cfg = dir.join(format!("edge-{replica}.yml"));
    let text = format!(
        "global:\n  scrape_interval: 2s\n  external_labels:\n    cluster: c0\n    replica: {replica}\n\
         scrape_configs:\n  - job_name: dcgm\n    static_configs:\n      - targets: ['{sim}']\n        labels:\n          __metrics_path__: /node/0/metrics\n"
    );
    std::fs::write(&cfg, text).unwrap();
    let (http, grpc) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let args: Vec<String> = [
        "edge",
        "--config",
        &cfg.display().to_string(),
        "--data",
        &dir.join(format!("data-{replica}")).display().to_string(),
        "--http-listen",
        &http,
        "--grpc-listen",
        &grpc,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut p = Proc::strata(&refs, dir, &format!("edge-{replica}"));
    wait_ready(&format!("http://{http}/-/ready"), &mut p, Duration::from_secs(30));
    (p, args, format!("http://{http}"), grpc)
}

/// `query_range` results keyed by their labels without `replica`.
fn range(base: &str, q: &str, start: f64, end: f64) -> Vec<(String, Vec<(f64, f64)>)> {
    let url = format!("{base}/api/v1/query_range?query={q}&start={start:.3}&end={end:.3}&step=1");
    let data = api_data(&url);
    let mut out: Vec<(String, Vec<(f64, f64)>)> = data["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let mut m = s["metric"].as_object().unwrap().clone();
            m.remove("replica");
            let pts = s["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_f64().unwrap(), p[1].as_str().unwrap().parse::<f64>().unwrap()))
                .collect();
            (serde_json::to_string(&m).unwrap(), pts)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn a_replica_killed_and_restarted_mid_run_leaves_no_mark_on_the_global() {
    let dir = tempfile::tempdir().unwrap();
    let sim_port = free_port();
    let sim_addr = format!("127.0.0.1:{sim_port}");
    let start = quiet_start(1);
    let mut sim =
        Proc::strata(&["simulate", "--nodes", "1", "--listen", &sim_addr, "--start-at", &start], dir.path(), "sim");
    wait_ready(&format!("http://{sim_addr}/node/0/metrics"), &mut sim, Duration::from_secs(30));
    let started = now_ms() as f64 / 1000.0;
    let (mut edge_a, args_a, _base_a, grpc_a) = scraping_edge(dir.path(), "a", &sim_addr);
    let (mut edge_b, _, base_b, grpc_b) = scraping_edge(dir.path(), "b", &sim_addr);
    let cfg = format!("stores: ['{grpc_a}', '{grpc_b}']\nstore_timeout: 5s\ninfo_interval: 1s\n");
    let (mut global, base) = start_global(dir.path(), "global", &cfg, &[]);

    std::thread::sleep(Duration::from_secs(8));
    edge_a.kill9();
    std::thread::sleep(Duration::from_secs(7));
    let refs: Vec<&str> = args_a.iter().map(String::as_str).collect();
    let mut edge_a = Proc::strata(&refs, dir.path(), "edge-a-restarted");
    std::thread::sleep(Duration::from_secs(8));

    // From when both replicas scrape to a scrape ago.
    let (start, end) = (started.ceil() + 5.0, now_ms() as f64 / 1000.0 - 2.0);
    for q in ["DCGM_FI_DEV_GPU_TEMP", "rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION%5B10s%5D)"] {
        let global_answer = range(&base, q, start, end);
        let healthy = range(&base_b, q, start, end);
        assert_eq!(global_answer.len(), healthy.len(), "{q}: series");
        assert!(!healthy.is_empty(), "{q}: no data");
        for ((gl, gp), (hl, hp)) in global_answer.iter().zip(&healthy) {
            let hl = hl.replace(",\"cluster\":\"c0\"", "").replace("\"cluster\":\"c0\",", "");
            let gl = gl.replace(",\"cluster\":\"c0\"", "").replace("\"cluster\":\"c0\",", "");
            assert_eq!(gl, hl, "{q}");
            let times = |v: &[(f64, f64)]| v.iter().map(|p| p.0 as i64).collect::<std::collections::BTreeSet<_>>();
            let (gt, ht) = (times(gp), times(hp));
            let only_global: Vec<_> = gt.difference(&ht).take(5).collect();
            let only_healthy: Vec<_> = ht.difference(&gt).take(5).collect();
            assert_eq!(
                gp.len(),
                hp.len(),
                "{q} {gl}: points (a gap at the global?); only at the global {only_global:?}, only at the healthy replica {only_healthy:?}, range {start}..{end}"
            );
            for (g, h) in gp.iter().zip(hp) {
                assert_eq!(g.0, h.0, "{q} {gl}");
                // Gauges equal exactly; a rate may differ by the replicas' few ms of scrape
                // timing, never by a false reset or a jump.
                let tol = if q.starts_with("rate") { 0.02 * h.1.abs().max(1.0) } else { 0.0 };
                assert!((g.1 - h.1).abs() <= tol, "{q} {gl} at {}: global {} vs healthy replica {}", g.0, g.1, h.1);
            }
        }
    }
    let resets = api_data(&format!(
        "{base}/api/v1/query?query=resets(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION%5B1m%5D)&time={end:.3}"
    ));
    assert!(
        resets["result"].as_array().unwrap().iter().all(|s| s["value"][1] == "0"),
        "a false reset at the global: {resets}"
    );
    for p in [&mut global, &mut edge_a, &mut edge_b, &mut sim] {
        p.terminate();
    }
}

#[test]
fn the_global_reads_an_edge_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let certs = strata_server::test_certs::write(dir.path()).unwrap();
    let (cert, key, ca) = (
        certs.server_cert.display().to_string(),
        certs.server_key.display().to_string(),
        certs.ca.display().to_string(),
    );
    let tls = ["--grpc-server-tls-cert", &cert, "--grpc-server-tls-key", &key, "--grpc-server-tls-client-ca", &ca];
    let (mut edge, edge_base, grpc) = edge_with(dir.path(), "a", &tls);
    let start = (now_ms() - 60_000) / 1000 * 1000;
    let labels = vec![("__name__".to_string(), "gpu_temp".to_string()), ("gpu".to_string(), "0".to_string())];
    remote_write_all(&edge_base, &[(labels, (0..10).map(|i| (start + i * 5_000, 41.0)).collect())]);

    // One global with the client certificate, one without TLS at all.
    let client_tls = format!(
        "grpc_client_tls:\n  ca_file: {}\n  cert_file: {}\n  key_file: {}\n",
        certs.ca.display(),
        certs.client_cert.display(),
        certs.client_key.display()
    );
    let mut globals = Vec::new();
    for (name, extra) in [("global-tls", client_tls.as_str()), ("global-plain", "")] {
        let cfg = format!("stores: ['{grpc}']\nstore_timeout: 5s\ninfo_interval: 1s\n{extra}");
        globals.push(start_global(dir.path(), name, &cfg, &[]));
    }
    let t = (start + 9 * 5_000) as f64 / 1000.0;
    let (code, body) = get(&format!("{}/api/v1/query?query=gpu_temp&time={t:.3}", globals[0].1));
    assert_eq!(code, 200, "{body}");
    let result = body["data"]["result"].as_array().unwrap();
    assert_eq!(result.len(), 1, "{body}");
    assert_eq!((&result[0]["metric"]["cluster"], &result[0]["metric"]["replica"]), (&"c0".into(), &Value::Null));
    assert!(body.get("warnings").is_none(), "{body}");
    // Without TLS the edge does not serve the global: the store is down and named.
    let (code, body) = get(&format!("{}/api/v1/query?query=gpu_temp&time={t:.3}", globals[1].1));
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["data"]["result"].as_array().unwrap().len(), 0, "{body}");
    let stores = api_data(&format!("{}/api/v1/stores", globals[1].1));
    assert_eq!(stores[0]["health"], "down", "{stores}");
    for (mut p, _) in globals {
        p.assert_running();
        p.terminate();
    }
    edge.assert_running();
    edge.terminate();
}

/// Findings of the global review that need real processes.
mod review {
    use super::*;

    fn write_now(base: &str, name: &str, t: i64, v: f64) {
        let labels = vec![("__name__".to_string(), name.to_string()), ("gpu".to_string(), "0".to_string())];
        remote_write_all(base, &[(labels, vec![(t, v)])]);
    }

    /// The global reads a store's `Info` once an hour here; meanwhile the edge receives
    /// newer samples. A query over the last seconds must still ask the edge: a store that
    /// takes samples advertises an open end, never the newest sample it held when asked.
    #[test]
    fn a_store_still_taking_samples_is_asked_for_ranges_past_its_last_info() {
        let dir = tempfile::tempdir().unwrap();
        let (mut edge_a, base_a, grpc_a) = edge(dir.path(), "a");
        let now = now_ms();
        write_now(&base_a, "gpu_temp", now - 60_000, 40.0);
        let cfg = format!("stores: ['{grpc_a}']\ninfo_interval: 1h\n");
        let (mut global, base) = start_global(dir.path(), "global", &cfg, &[]);
        let later = now_ms();
        write_now(&base_a, "gpu_temp", later, 41.0);
        let t = later as f64 / 1000.0 + 0.5;
        let data = api_data(&format!("{base}/api/v1/query?query=max_over_time(gpu_temp%5B5s%5D)&time={t:.3}"));
        let result = data["result"].as_array().cloned().unwrap_or_default();
        assert_eq!(result.len(), 1, "the edge was skipped by the time range of its last Info: {data}");
        assert_eq!(result[0]["value"][1], "41");
        global.terminate();
        edge_a.terminate();
    }

    /// A top global over a middle global whose own edge is down: the top's answer carries
    /// the middle's warning, and `partial_response=false` at the top reaches the middle,
    /// which then fails instead of answering in part.
    #[test]
    fn warnings_and_partial_response_travel_through_stacked_globals() {
        let dir = tempfile::tempdir().unwrap();
        let (mut edge_a, base_a, grpc_a) = edge(dir.path(), "a");
        let now = now_ms();
        write_now(&base_a, "gpu_temp", now - 10_000, 40.0);
        let down = format!("127.0.0.1:{}", free_port());
        let mid_grpc = format!("127.0.0.1:{}", free_port());
        let mid_cfg = format!("stores: ['{grpc_a}', '{down}']\nstore_timeout: 2s\ninfo_interval: 1s\n");
        let (mut mid, _) = start_global(dir.path(), "global-mid", &mid_cfg, &["--grpc-listen", &mid_grpc]);
        let top_cfg = format!("stores: ['{mid_grpc}']\nstore_timeout: 5s\ninfo_interval: 1s\n");
        let (mut top, base) = start_global(dir.path(), "global-top", &top_cfg, &[]);
        let t = now as f64 / 1000.0;
        let (code, body) = get(&format!("{base}/api/v1/query?query=gpu_temp&time={t:.3}"));
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["data"]["result"].as_array().map(Vec::len), Some(1), "{body}");
        let warnings = body["warnings"].to_string();
        assert!(warnings.contains(&down), "the middle global's warning did not reach the top: {body}");
        // The store that is down may hold another cluster: the middle global must not
        // advertise only the labels of the stores that answered, or the top skips it.
        let c1 = "gpu_temp%7Bcluster%3D%22c1%22%7D";
        let (code, body) = get(&format!("{base}/api/v1/query?query={c1}&time={t:.3}"));
        assert_eq!(code, 200, "{body}");
        assert!(
            body["warnings"].to_string().contains(&down),
            "the top global skipped the middle for cluster c1: {body}"
        );
        let (code, body) = get(&format!("{base}/api/v1/query?query=gpu_temp&time={t:.3}&partial_response=false"));
        assert_ne!(code, 200, "partial_response=false did not reach the middle global: {body}");
        assert!(body["error"].as_str().unwrap_or_default().contains(&down), "{body}");
        top.terminate();
        mid.terminate();
        edge_a.terminate();
    }
}
