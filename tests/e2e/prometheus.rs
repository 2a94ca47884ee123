//! A real client: Debian's Prometheus 2.42 scrapes the same simulated fleet as the edge and
//! remote-writes what it scraped to the edge. The edge's scraped series must equal
//! Prometheus' scraped series, and what Prometheus remote-wrote must arrive whole.
//!
//! Needs the `prometheus` binary (the README's test command installs it): see
//! [`require_prometheus`].

use crate::common::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use strata_model::is_stale;
use strata_model::matcher::{MatchOp, Matcher};
use strata_tsdb::db::{Tsdb, TsdbOptions};

const NODES: usize = 2;
const SEED: u64 = 1;

/// A simulated instant with 5 quiet minutes ahead: no job change (jobs change on 10-minute
/// slot boundaries) and no GPU falling off the bus, so both scrapers see the same series.
fn quiet_start() -> i64 {
    let fleet = strata_simulator::Fleet::new(SEED, NODES, 8);
    let mut t = 1_764_460_800 + 30;
    loop {
        if (0..NODES).all(|n| (0..300).step_by(5).all(|s| fleet.gpu_off_bus(n, t + s).is_none())) {
            return t;
        }
        t += 600;
    }
}

/// The whole API answer, `status` and `data`, after checking it succeeded.
fn get_json(url: &str) -> Value {
    serde_json::json!({ "status": "success", "data": api_data(url) })
}

fn label_set(v: &Value) -> BTreeMap<String, String> {
    v.as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string())).collect()
}

#[test]
fn edge_matches_prometheus_and_receives_its_remote_write() {
    if !require_prometheus() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (sim_port, edge_port, prom_port) = (free_port(), free_port(), free_port());
    let start = quiet_start().to_string();
    let mut sim = Proc::strata(
        &[
            "simulate",
            "--nodes",
            &NODES.to_string(),
            "--seed",
            &SEED.to_string(),
            "--start-at",
            &start,
            "--listen",
            &format!("127.0.0.1:{sim_port}"),
        ],
        dir.path(),
        "sim",
    );
    wait_ready(&format!("http://127.0.0.1:{sim_port}/node/0/metrics"), &mut sim, Duration::from_secs(30));

    let mut targets = String::new();
    for i in 0..NODES {
        targets.push_str(&format!("      - targets: ['127.0.0.1:{sim_port}']\n        labels: {{__metrics_path__: /node/{i}/metrics, node: '{i}'}}\n"));
    }
    let scrape =
        format!("scrape_configs:\n  - job_name: dcgm\n    scrape_interval: 2s\n    static_configs:\n{targets}");
    let edge_cfg = dir.path().join("edge.yml");
    std::fs::write(&edge_cfg, format!("global:\n  scrape_interval: 2s\n{scrape}")).unwrap();
    let prom_cfg = dir.path().join("prometheus.yml");
    std::fs::write(
        &prom_cfg,
        format!(
            "global:\n  scrape_interval: 2s\n  external_labels: {{source: prometheus}}\n{scrape}remote_write:\n  - url: http://127.0.0.1:{edge_port}/api/v1/write\n    queue_config: {{batch_send_deadline: 1s, max_samples_per_send: 500}}\n    metadata_config: {{send_interval: 1s}}\n"
        ),
    )
    .unwrap();
    let data = dir.path().join("edge-data");
    let mut edge = Proc::strata(
        &[
            "edge",
            "--config",
            &edge_cfg.display().to_string(),
            "--data",
            &data.display().to_string(),
            "--http-listen",
            &format!("127.0.0.1:{edge_port}"),
        ],
        dir.path(),
        "edge",
    );
    wait_ready(&format!("http://127.0.0.1:{edge_port}/-/ready"), &mut edge, Duration::from_secs(30));
    let prom_args: Vec<String> = vec![
        format!("--config.file={}", prom_cfg.display()),
        format!("--storage.tsdb.path={}", dir.path().join("prom-data").display()),
        format!("--web.listen-address=127.0.0.1:{prom_port}"),
    ];
    let mut prom = Proc::start("prometheus", &prom_args, dir.path(), "prometheus");
    let prom_base = format!("http://127.0.0.1:{prom_port}");
    wait_ready(&format!("{prom_base}/-/ready"), &mut prom, Duration::from_secs(60));

    // Let both scrape for a while.
    std::thread::sleep(Duration::from_secs(12));
    let t_end = now_ms() as f64 / 1000.0;

    // 1. The same series, label for label (synthetic `up` and `scrape_*` included).
    let q = "match[]=%7Bjob%3D%22dcgm%22%7D";
    let prom_series: BTreeSet<_> = get_json(&format!("{prom_base}/api/v1/series?{q}&end={t_end}"))["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(label_set)
        .collect();
    let edge_series: BTreeSet<_> = get_json(&format!("http://127.0.0.1:{edge_port}/api/v1/series?{q}&end={t_end}"))
        ["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(label_set)
        .filter(|l| !l.contains_key("source"))
        .collect();
    assert!(prom_series.len() > 25 * 8 * NODES, "Prometheus scraped {} series", prom_series.len());
    let only_prom: Vec<_> = prom_series.difference(&edge_series).take(3).collect();
    let only_edge: Vec<_> = edge_series.difference(&prom_series).take(3).collect();
    assert!(
        only_prom.is_empty() && only_edge.is_empty(),
        "series differ: only in Prometheus {only_prom:?}, only in the edge {only_edge:?}"
    );

    // 2. What Prometheus holds up to t_end, raw, to compare with what it remote-wrote.
    let raw = get_json(&format!("{prom_base}/api/v1/query?query=%7Bjob%3D%22dcgm%22%7D%5B1h%5D&time={t_end}"));
    let mut want: BTreeMap<BTreeMap<String, String>, Vec<(i64, String)>> = BTreeMap::new();
    for s in raw["data"]["result"].as_array().unwrap() {
        let mut l = label_set(&s["metric"]);
        l.insert("source".into(), "prometheus".into());
        let vals = s["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| ((p[0].as_f64().unwrap() * 1000.0).round() as i64, p[1].as_str().unwrap().to_string()))
            .collect();
        want.insert(l, vals);
    }
    // Give remote write time to deliver everything up to t_end.
    std::thread::sleep(Duration::from_secs(6));

    // 3. A real client: promtool gets the same answers from the edge as from Prometheus, over
    //    the samples Prometheus scraped (the edge holds them as remote-written, source="prometheus").
    let edge_base = format!("http://127.0.0.1:{edge_port}");
    let promtool = |args: &[&str]| -> String {
        let out = std::process::Command::new("promtool").args(args).output().expect("promtool runs");
        assert!(out.status.success(), "promtool {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let t = format!("{:.3}", t_end - 1.0);
    let (t0, t1) = (format!("{:.3}", t_end - 8.0), format!("{:.3}", t_end - 1.0));
    let pairs = [
        (
            "sum by (gpu) (DCGM_FI_DEV_GPU_TEMP{node=\"0\"})",
            "sum by (gpu) (DCGM_FI_DEV_GPU_TEMP{node=\"0\",source=\"prometheus\"})",
        ),
        (
            "max by (node) (DCGM_FI_DEV_POWER_USAGE) * 2",
            "max by (node) (DCGM_FI_DEV_POWER_USAGE{source=\"prometheus\"}) * 2",
        ),
        ("count(up == 1)", "count(up{source=\"prometheus\"} == 1)"),
    ];
    for (pq, eq) in pairs {
        let a = promtool(&["query", "instant", "--time", &t, &prom_base, pq]);
        let b = promtool(&["query", "instant", "--time", &t, &edge_base, eq]);
        assert!(!a.trim().is_empty(), "no answer from Prometheus for {pq}");
        assert_eq!(a, b, "instant {pq}");
        let a = promtool(&["query", "range", "--start", &t0, "--end", &t1, "--step", "2s", &prom_base, pq]);
        let b = promtool(&["query", "range", "--start", &t0, "--end", &t1, "--step", "2s", &edge_base, eq]);
        assert_eq!(a, b, "range {pq}");
    }
    // series and label values of what both scraped themselves
    let a = promtool(&["query", "series", "--match", "DCGM_FI_DEV_GPU_TEMP{node=\"1\"}", &prom_base]);
    let b = promtool(&["query", "series", "--match", "DCGM_FI_DEV_GPU_TEMP{node=\"1\",source=\"\"}", &edge_base]);
    assert_eq!(a, b, "series");
    assert_eq!(
        promtool(&["query", "labels", &prom_base, "gpu"]),
        promtool(&["query", "labels", &edge_base, "gpu"]),
        "label values"
    );

    prom.terminate();
    edge.terminate();

    let db = Tsdb::open(&data, TsdbOptions::default()).unwrap();
    let mut got: BTreeMap<BTreeMap<String, String>, Vec<(i64, f64)>> = BTreeMap::new();
    for (s, chunks) in db.head().select(
        &[Matcher::new(MatchOp::Equal, "source", "prometheus").unwrap()],
        i64::MIN,
        (t_end * 1000.0) as i64,
    ) {
        let l: BTreeMap<String, String> = s.labels.iter().map(|x| (x.name.to_string(), x.value.to_string())).collect();
        let samples = chunks
            .iter()
            .flat_map(|c| c.decode().unwrap())
            .filter(|x| x.t <= (t_end * 1000.0) as i64 && !is_stale(x.v))
            .map(|x| (x.t, x.v))
            .collect();
        got.insert(l, samples);
    }
    assert_eq!(got.len(), want.len(), "every series Prometheus scraped arrived by remote write");
    let mut total = 0;
    for (l, w) in &want {
        let g = got.get(l).unwrap_or_else(|| panic!("series {l:?} did not arrive"));
        assert_eq!(g.len(), w.len(), "sample count of {l:?}");
        for ((gt, gv), (wt, wv)) in g.iter().zip(w) {
            assert_eq!(gt, wt, "{l:?}");
            let wv: f64 = wv.parse().unwrap();
            assert!(gv.to_bits() == wv.to_bits() || (gv.is_nan() && wv.is_nan()), "{l:?} at {gt}: {gv} != {wv}");
            total += 1;
        }
    }
    assert!(total > 500, "compared {total} samples");
    // and Prometheus' metadata came along: the edge knows the energy counter is a counter
    assert_eq!(db.head().metric_type("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), strata_model::MetricType::Counter);
}
