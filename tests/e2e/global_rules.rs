//! A global that runs rules itself (Thanos' ruler mode) over an HA pair of edges scraping
//! the simulator: one recorded series and one alert per GPU, not per replica; a rule
//! reading what an earlier one recorded; alerts in a real Alertmanager with the global's
//! external labels; recorded series and `for` state kept across a restart; the recorded
//! series served over the global's StoreAPI to a global stacked above; a reload that adds
//! a rule, and a bad one that keeps the rules; one replica down changes nothing, both down
//! fail the evaluation instead of recording a partial result.

use crate::alerting::{alertmanager_installed, alerts_of, am_alerts, start_alertmanager, wait_for};
use crate::common::{api_data, client, free_port, labelled_value, require_prometheus, start_sim, wait_ready, Proc};
use crate::global::start_global;
use std::path::Path;
use std::time::Duration;

const RULES: &str = "groups:
  - name: fleet
    interval: 1s
    rules:
      - record: cluster:gpu_temp:max
        expr: max by (cluster) (DCGM_FI_DEV_GPU_TEMP)
      - record: cluster:gpu_temp:max_plus_one
        expr: cluster:gpu_temp:max + 1
      - alert: GpuWarm
        expr: DCGM_FI_DEV_GPU_TEMP > 0
        for: 2s
        annotations:
          summary: 'GPU {{ $labels.gpu }} of {{ $labels.cluster }}'
";

/// An edge of cluster `c0`, replica `replica`, scraping node 0 of the simulator every
/// second and serving the StoreAPI; its gRPC address.
fn scraping_edge(d: &Path, sim: u16, replica: &str) -> (Proc, String) {
    let cfg = d.join(format!("edge-{replica}.yml"));
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  external_labels: {{cluster: c0, replica: {replica}}}\nscrape_configs:\n  - job_name: dcgm\n    static_configs:\n      - targets: ['127.0.0.1:{sim}']\n        labels: {{__metrics_path__: /node/0/metrics}}\n"
        ),
    )
    .unwrap();
    let (http, grpc) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let (cfg, data) = (cfg.display().to_string(), d.join(format!("edge-{replica}")).display().to_string());
    let args = ["edge", "--config", &cfg, "--data", &data, "--http-listen", &http, "--grpc-listen", &grpc];
    let mut p = Proc::strata(&args, d, &format!("edge-{replica}"));
    wait_ready(&format!("http://{http}/-/ready"), &mut p, Duration::from_secs(60));
    (p, grpc)
}

/// The instant vector `query` at the global at `base`: (metric, value) pairs.
fn instant(base: &str, query: &str) -> Vec<(serde_json::Value, f64)> {
    let v = api_data(&format!("{base}/api/v1/query?query={}", crate::hostile_queries::encode(query)));
    v["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            let value = r["value"][1].as_str().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
            (r["metric"].clone(), value)
        })
        .collect()
}

#[test]
fn a_global_runs_rules_over_an_ha_pair_stores_what_they_record_and_alerts_once_per_gpu() {
    if !require_prometheus() || !alertmanager_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_sim, sim) = start_sim(d, 1);
    let (_am, am) = start_alertmanager(d, "am", None);
    let (mut edge_a, grpc_a) = scraping_edge(d, sim, "a");
    let (mut edge_b, grpc_b) = scraping_edge(d, sim, "b");
    let rules = d.join("fleet.yml");
    std::fs::write(&rules, RULES).unwrap();
    let am_target = am.base.trim_start_matches("http://").to_string();
    let config = format!(
        "stores: ['{grpc_a}', '{grpc_b}']\ninfo_interval: 1s\nglobal:\n  evaluation_interval: 1s\n  external_labels: {{ruler: g1}}\nrule_files: [fleet.yml]\nalerting:\n  alertmanagers:\n    - static_configs: [{{targets: ['{am_target}']}}]\n"
    );
    let (data, grpc) = (d.join("global-data").display().to_string(), format!("127.0.0.1:{}", free_port()));
    let extra = [
        "--data",
        &data,
        "--grpc-listen",
        &grpc,
        "--web.enable-lifecycle",
        // Restores the `for` state of every alert after the restart below.
        "--rules.alert.for-grace-period=0s",
    ];
    let (mut global, base) = start_global(d, "global", &config, &extra);

    // One recorded series for the pair, with the global's external label and no replica.
    let recorded = wait_for("the recorded series", Duration::from_secs(60), || {
        let r = instant(&base, "cluster:gpu_temp:max");
        (!r.is_empty()).then_some(r)
    });
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0].0["cluster"], "c0");
    assert_eq!(recorded[0].0["ruler"], "g1");
    assert!(recorded[0].0.get("replica").is_none(), "{recorded:?}");
    assert!(recorded[0].1 > 20.0 && recorded[0].1 < 120.0, "a GPU temperature: {recorded:?}");
    // The second rule read what the first recorded, at the same evaluation.
    let pairs = instant(&base, "cluster:gpu_temp:max_plus_one - on (cluster) cluster:gpu_temp:max");
    assert_eq!(pairs.len(), 1, "{pairs:?}");
    assert_eq!(pairs[0].1, 1.0, "the chained rule did not read the first one's output: {pairs:?}");

    // Eight GPUs, two replicas: eight alerts, at the global and in Alertmanager.
    let firing = wait_for("eight alerts firing", Duration::from_secs(60), || {
        let a = alerts_of(&base, "GpuWarm");
        (a.len() == 8 && a.iter().all(|x| x.1 == "firing")).then_some(a)
    });
    let sent = wait_for("eight alerts in Alertmanager", Duration::from_secs(60), || {
        let a = am_alerts(&am, "GpuWarm");
        (a.len() >= 8).then_some(a)
    });
    assert_eq!(sent.len(), 8, "one alert per GPU, not per replica: {sent:#?}");
    for a in &sent {
        assert_eq!(a["labels"]["ruler"], "g1", "{a}");
        assert!(a["labels"].get("replica").is_none(), "{a}");
        assert!(a["annotations"]["summary"].as_str().unwrap_or_default().ends_with("of c0"), "{a}");
        assert!(a["generatorURL"].as_str().unwrap_or_default().starts_with(&base), "{a}");
    }
    let listed = api_data(&format!("{base}/api/v1/rules"));
    let group = &listed["groups"][0];
    assert_eq!(group["name"], "fleet", "{listed}");
    let names: Vec<&str> = group["rules"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["cluster:gpu_temp:max", "cluster:gpu_temp:max_plus_one", "GpuWarm"]);
    assert!(group["rules"].as_array().unwrap().iter().all(|r| r["health"] == "ok"), "{listed}");
    let page = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    assert!(
        page.lines().any(|l| l.starts_with("prometheus_rule_evaluations_total{") && !l.ends_with(" 0")),
        "the rules' metrics are not on the global's /metrics:\n{page}"
    );
    assert!(labelled_value(&page, "prometheus_notifications_sent_total").is_some_and(|v| v >= 8.0), "{page}");

    // A global stacked above reads the recorded series through this one's StoreAPI.
    let (mut upper, upper_base) = start_global(d, "upper", &format!("stores: ['{grpc}']\ninfo_interval: 1s\n"), &[]);
    let above = wait_for("the recorded series from above", Duration::from_secs(30), || {
        let r = instant(&upper_base, "cluster:gpu_temp:max");
        (!r.is_empty()).then_some(r)
    });
    assert_eq!(above.len(), 1, "{above:?}");
    assert_eq!(above[0].0["ruler"], "g1");
    upper.terminate();

    // A restart keeps what was recorded and the alerts' `for` state.
    let samples =
        |base: &str| instant(base, "count_over_time(cluster:gpu_temp:max[10m])").first().map(|r| r.1).unwrap_or(0.0);
    let before = samples(&base);
    assert!(before >= 3.0, "{before}");
    global.terminate();
    let (mut global, base) = start_global(d, "global-restarted", &config, &extra);
    let after = samples(&base);
    assert!(after >= before, "the restart lost recorded samples: {after} after, {before} before");
    let back = wait_for("the alerts firing again", Duration::from_secs(30), || {
        let a = alerts_of(&base, "GpuWarm");
        (a.len() == 8 && a.iter().all(|x| x.1 == "firing")).then_some(a)
    });
    assert_eq!(back, firing, "the restart lost the alerts' `for` state (activeAt)");

    // A reload adds a rule; a broken file keeps the rules that run.
    std::fs::write(
        &rules,
        format!(
            "{RULES}      - record: cluster:gpu_power:sum\n        expr: sum by (cluster) (DCGM_FI_DEV_POWER_USAGE)\n"
        ),
    )
    .unwrap();
    let r = client().post(format!("{base}/-/reload")).send().unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap_or_default());
    wait_for("the added rule's series", Duration::from_secs(30), || {
        (instant(&base, "cluster:gpu_power:sum").len() == 1).then_some(())
    });
    std::fs::write(&rules, "groups:\n  - name: fleet\n    rules:\n      - record: x\n        expr: sum(\n").unwrap();
    let r = client().post(format!("{base}/-/reload")).send().unwrap();
    assert_eq!(r.status().as_u16(), 500);
    let listed = api_data(&format!("{base}/api/v1/rules"));
    assert_eq!(listed["groups"][0]["rules"].as_array().map(|r| r.len()), Some(4), "{listed}");

    // One replica down: its twin answers, the rules record on (a sample newer than the kill).
    let newest = |base: &str| instant(base, "timestamp(cluster:gpu_temp:max)").first().map(|r| r.1).unwrap_or(0.0);
    let group = |base: &str| api_data(&format!("{base}/api/v1/rules"))["groups"][0]["rules"][0].clone();
    edge_b.kill9();
    let killed = crate::common::now_ms() as f64 / 1000.0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while newest(&base) <= killed + 3.0 {
        assert!(std::time::Instant::now() < deadline, "no sample recorded with one replica down: {}", group(&base));
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(group(&base)["health"], "ok", "{}", group(&base));
    // Both down: no answer is whole. The evaluation fails, naming a store, and records
    // nothing rather than a partial result.
    edge_a.kill9();
    let failed = wait_for("the rule failing with both replicas down", Duration::from_secs(30), || {
        let r = group(&base);
        (r["health"] == "err").then_some(r)
    });
    let error = failed["lastError"].as_str().unwrap_or_default().to_string();
    assert!(error.contains(&grpc_a) || error.contains(&grpc_b), "the error names no store: {failed}");
    let last = newest(&base);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(newest(&base), last, "a sample was recorded with every store down");
    global.assert_running();
}
