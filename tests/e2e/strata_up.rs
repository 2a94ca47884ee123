//! `strata up`: the simulator, two clusters each scraped by an HA pair of edges, and the
//! global start; both replicas of a cluster scrape its nodes; the global answers for both
//! clusters with each series once; Ctrl-C (SIGINT) stops everything cleanly with the data
//! kept.

use crate::common::*;
use std::time::{Duration, Instant};

#[test]
fn up_runs_the_stack_and_stops_cleanly_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    // thirteen consecutive free ports: retry a few bases until one is free as a block
    let base = (0..40)
        .map(|_| free_port())
        .find(|&p| p < 65000 && (1..13).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()))
        .expect("thirteen free ports");
    let data = dir.path().join("strata-data");
    let mut up = Proc::strata(
        &[
            "up",
            "--data",
            &data.display().to_string(),
            "--port-base",
            &base.to_string(),
            "--nodes",
            "2",
            "--backfill",
            "3h",
        ],
        dir.path(),
        "up",
    );
    for port in (base + 1..=base + 4).chain([base + 9, base + 10]) {
        wait_ready(&format!("http://127.0.0.1:{port}/-/ready"), &mut up, Duration::from_secs(60));
    }
    // Each replica scrapes every GPU of its cluster's two simulated nodes (less one a node
    // while the simulator has a GPU off the bus, 15 minutes in some hours).
    let deadline = Instant::now() + Duration::from_secs(30);
    for port in base + 1..=base + 4 {
        loop {
            let n = current_count(port);
            if n >= 14 {
                break;
            }
            assert!(Instant::now() < deadline, "edge on {port} has {n} GPU_TEMP series");
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    // The global: both clusters, each GPU once (replicas merged), no replica label: as many
    // as one replica of the cluster scrapes now (MIG GPUs give a series per instance; the
    // backfilled hours hold more series, as pods came and went). Asked again while a GPU
    // leaving or coming back makes the instants disagree.
    let global = format!("http://127.0.0.1:{}", base + 9);
    let deadline = Instant::now() + Duration::from_secs(30);
    let per_edge = loop {
        let data_q = api_data(&format!("{global}/api/v1/query?query=count%20by%20(cluster)%20(DCGM_FI_DEV_GPU_TEMP)"));
        let mut counts: Vec<(String, String)> = data_q["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (s["metric"]["cluster"].as_str().unwrap().to_string(), s["value"][1].as_str().unwrap().to_string())
            })
            .collect();
        counts.sort();
        let per_edge: Vec<usize> = (base + 1..=base + 4).map(current_count).collect();
        let want = [("c0".to_string(), per_edge[0].to_string()), ("c1".to_string(), per_edge[2].to_string())];
        if counts == want && per_edge[0] == per_edge[1] && per_edge[2] == per_edge[3] {
            break per_edge;
        }
        assert!(Instant::now() < deadline, "global {counts:?}, edges {per_edge:?}: {data_q}");
        std::thread::sleep(Duration::from_millis(500));
    };
    let raw = api_data(&format!("{global}/api/v1/query?query=count(DCGM_FI_DEV_GPU_TEMP)&dedup=false"));
    let all: usize = per_edge.iter().sum();
    assert_eq!(raw["result"][0]["value"][1], all.to_string().as_str(), "every replica with dedup=false: {raw}");
    let stores = api_data(&format!("{global}/api/v1/stores"));
    // The four edges and the regional; the regional's copies of the edges' series are
    // merged with them (the counts above, with and without dedup, are the edges' alone).
    assert_eq!(stores.as_array().unwrap().len(), 5, "{stores}");
    assert!(stores.as_array().unwrap().iter().all(|s| s["health"] == "up"), "{stores}");
    the_rule_pack_runs_on_the_regional(&global, base, &mut up);
    backfilled_hours_are_answered_from_aggregates(&global, &format!("http://127.0.0.1:{}", base + 10), &mut up);
    // The README's quick-start commands, as a user pastes them (ports moved to this run's).
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md");
    let commands = readme_commands(&readme, "curl ");
    assert!(commands.len() >= 4, "the README's quick start lost its commands: {commands:?}");
    for cmd in commands {
        let run = (0..13)
            .fold(cmd.clone(), |c, k| c.replace(&format!("localhost:94{k:02}"), &format!("127.0.0.1:{}", base + k)));
        let out = std::process::Command::new("bash").arg("-c").arg(&run).output().expect("bash runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success() && !text.trim().is_empty(), "README command failed: {cmd}\n{text}");
        if text.starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{cmd}: {e}: {text}"));
            assert_eq!(v["status"], "success", "{cmd}: {text}");
        }
        if cmd.contains("count by (cluster)") {
            assert!(text.contains("\"c0\"") && text.contains("\"c1\""), "{cmd}: {text}");
        }
    }
    // The README's outage walk-through: its commands stopped the regional; the edges keep
    // what it has not acknowledged; started again as the README says, it catches up.
    let edge_metrics =
        || client().get(format!("http://127.0.0.1:{}/metrics", base + 1)).send().unwrap().text().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while labelled_value(&edge_metrics(), "strata_forward_pending_bytes").unwrap_or(0.0) == 0.0 {
        assert!(Instant::now() < deadline, "nothing pending with the regional stopped:\n{}", up.log_text());
        std::thread::sleep(Duration::from_millis(300));
    }
    // The edges notice the listener gone before `up` has finished stopping the regional.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !up.log_text().contains("regional stopped") {
        assert!(Instant::now() < deadline, "{}", up.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    let (rcfg, rdata) = (data.join("regional/regional.yml"), data.join("regional/data"));
    let (rhttp, rgrpc) = (format!("127.0.0.1:{}", base + 10), format!("127.0.0.1:{}", base + 11));
    let (rcfg, rdata) = (rcfg.display().to_string(), rdata.display().to_string());
    let mut regional = Proc::strata(
        &[
            "regional",
            "--config",
            &rcfg,
            "--data",
            &rdata,
            "--http-listen",
            &rhttp,
            "--grpc-listen",
            &rgrpc,
            "--web.enable-lifecycle",
        ],
        dir.path(),
        "regional-again",
    );
    wait_ready(&format!("http://{rhttp}/-/ready"), &mut regional, Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let page = edge_metrics();
        let caught_up = labelled_value(&page, "strata_forward_pending_bytes") == Some(0.0)
            && labelled_value(&page, "strata_forward_lag_seconds") == Some(0.0);
        if caught_up {
            break;
        }
        assert!(Instant::now() < deadline, "the edge did not catch up:\n{page}");
        std::thread::sleep(Duration::from_millis(300));
    }
    // Reloading over HTTP is off unless asked for, as in Prometheus.
    let r = client().post(format!("http://127.0.0.1:{}/-/reload", base + 1)).send().unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let out = up.log_text();
    assert!(out.contains(&format!("http://127.0.0.1:{base}/node/0/metrics")), "up prints where things run:\n{out}");
    assert!(out.contains("replica=a") && out.contains("replica=b") && out.contains("cluster=c1"));
    assert!(out.contains(&format!("http://127.0.0.1:{}", base + 9)), "up prints the global's URL:\n{out}");

    let pid = up.child.as_ref().map(|c| c.id()).unwrap();
    assert!(std::process::Command::new("kill").arg("-INT").arg(pid.to_string()).status().unwrap().success());
    let mut child = up.child.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "strata up did not stop within 30 s of Ctrl-C");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "exit status {status}:\n{}", up.log_text());
    assert!(up.log_text().contains("stopped; data kept"));
    for e in ["c0-a", "c0-b", "c1-a", "c1-b"] {
        assert!(data.join(format!("edge-{e}/data/wal")).is_dir());
        assert!(data.join(format!("edge-{e}/edge.yml")).is_file());
    }
    assert!(data.join("global/global.yml").is_file());
    assert!(data.join("regional/regional.yml").is_file() && data.join("regional/data/wal").is_dir());
}

/// The GPU_TEMP series the edge on `port` holds now (an instant query).
fn current_count(port: u16) -> usize {
    let d = api_data(&format!("http://127.0.0.1:{port}/api/v1/query?query=count(DCGM_FI_DEV_GPU_TEMP)"));
    d["result"][0]["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The hours `up` backfilled before the edges started: forwarded to the regional and
/// downsampled there, the global answers their aligned steps from the 5 m aggregates and
/// the newest from raw data, and the answer equals raw data's alone.
fn backfilled_hours_are_answered_from_aggregates(global: &str, regional: &str, up: &mut Proc) {
    let now = now_ms() / 1000;
    let (start, end) = ((now - 3 * 3600) / 300 * 300 + 300, (now - 600) / 300 * 300);
    let q = "sum%20by%20(cluster)%20(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION%5B5m%5D))";
    let url = |res: &str| {
        format!(
            "{global}/api/v1/query_range?query={q}&start={start}&end={end}&step=300&stats=all&max_source_resolution={res}"
        )
    };
    let deadline = Instant::now() + Duration::from_secs(150);
    let planned = loop {
        up.assert_running();
        let d = api_data(&url("auto"));
        let used = d["stats"]["resolutions"].as_array().cloned().unwrap_or_default();
        if used.iter().any(|u| u["resolution"] == "5m") {
            // The newest steps are raw, unless the regional has aggregated up to the end
            // already (an hour's slice is computed once it has passed: just after the
            // hour, the last ten minutes before it are aggregates too).
            let raw_newest = used.iter().any(|u| u["resolution"] == "raw");
            let aggregated_to_end = used.iter().any(|u| u["resolution"] == "5m" && u["end"].as_i64() == Some(end));
            assert!(raw_newest || aggregated_to_end, "steps answered by neither: {used:?}");
            break d;
        }
        assert!(
            Instant::now() < deadline,
            "no 5 m aggregates answered the backfilled hours: {d}
{}",
            up.log_text()
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    let raw = api_data(&url("raw"));
    let by_cluster = |d: &serde_json::Value| -> Vec<(String, Vec<(i64, f64)>)> {
        let mut out: Vec<_> = d["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let points = s["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| (p[0].as_f64().unwrap() as i64, p[1].as_str().unwrap().parse::<f64>().unwrap()))
                    .collect();
                (s["metric"]["cluster"].as_str().unwrap().to_string(), points)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    };
    let (got, want) = (by_cluster(&planned), by_cluster(&raw));
    assert_eq!(got.len(), 2, "{planned}");
    for ((cg, pg), (cw, pw)) in got.iter().zip(&want) {
        assert_eq!(cg, cw);
        assert_eq!(pg.len(), pw.len(), "{cg}: steps with a value");
        for ((tg, vg), (tw, vw)) in pg.iter().zip(pw) {
            assert_eq!(tg, tw);
            assert!((vg - vw).abs() <= 1e-9 * vw.abs().max(1.0), "{cg} at {tg}: {vg} from aggregates, {vw} raw");
        }
    }
    // What the 5 m aggregates that answered hold on disk, in the regional's `/metrics` (set
    // once the run that wrote them ends).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let page = client().get(format!("{regional}/metrics")).send().unwrap().text().unwrap();
        let five = page
            .lines()
            .find_map(|l| l.strip_prefix("strata_downsample_bytes{resolution=\"5m\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        if five.is_some_and(|b| b > 0.0) {
            break;
        }
        assert!(Instant::now() < deadline, "no 5 m aggregate bytes in the regional's metrics: {five:?}");
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The lines of the README's `sh` code blocks that start with `prefix`.
fn readme_commands(readme: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in readme.lines() {
        if line.starts_with("```") {
            in_sh = !in_sh && line.trim() == "```sh";
            continue;
        }
        if in_sh && line.starts_with(prefix) {
            out.push(line.to_string());
        }
    }
    out
}

/// The regional evaluates the built-in GPU rule pack: its groups in the regional's and the
/// global's `/api/v1/rules`, what it records answered by the global for both clusters
/// (one series per cluster: the HA pairs deduplicated), alerts sent to the Alertmanager
/// `up` started.
fn the_rule_pack_runs_on_the_regional(global: &str, base: u16, up: &mut Proc) {
    let group_names = |url: &str| -> Vec<String> {
        let v = api_data(url);
        let mut names: Vec<String> =
            v["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap().to_string()).collect();
        names.sort();
        names
    };
    let regional = format!("http://127.0.0.1:{}", base + 10);
    let names = group_names(&format!("{regional}/api/v1/rules"));
    for want in ["gpu-allocation", "gpu-health", "gpu-utilisation", "strata-health"] {
        assert!(names.iter().any(|n| n == want), "group {want} missing from {names:?}");
    }
    assert_eq!(group_names(&format!("{global}/api/v1/rules")), names, "the global shows the regional's groups");
    // The first evaluation comes within one interval (30 s) of the start.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let v = api_data(&format!("{global}/api/v1/query?query=cluster:gpu_utilization:avg"));
        let mut clusters: Vec<(String, String)> = v["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let m = &s["metric"];
                (m["cluster"].as_str().unwrap_or("").to_string(), m["region"].as_str().unwrap_or("").to_string())
            })
            .collect();
        clusters.sort();
        if clusters == [("c0".to_string(), "local".to_string()), ("c1".to_string(), "local".to_string())] {
            break;
        }
        assert!(Instant::now() < deadline, "recorded series: {v}\n{}", up.log_text());
        std::thread::sleep(Duration::from_secs(1));
    }
    if !crate::alerting::alertmanager_installed() {
        return;
    }
    let page = client().get(format!("{regional}/metrics")).send().unwrap().text().unwrap();
    assert_eq!(
        metric_value(&page, "prometheus_notifications_alertmanagers_discovered"),
        Some(1.0),
        "the regional sends to the Alertmanager `up` started:\n{page}"
    );
    let am = client().get(format!("http://127.0.0.1:{}/-/ready", base + 12)).send().map(|r| r.status().as_u16());
    assert_eq!(am.ok(), Some(200), "Alertmanager not ready:\n{}", up.log_text());
}
