//! Rules on a regional fed by an HA pair of edges, alerts to two real Alertmanagers
//! (Debian's `prometheus-alertmanager`): one alert per GPU, not per replica, in both;
//! recorded series stored with the regional's external labels; `for` state kept across a
//! restart; a global merging the regional's rules and alerts and naming a store that does
//! not answer; alerts resolved after a reload while one Alertmanager is down, the other
//! still told; a bad rule file on reload refused with the old rules kept.

use crate::common::{client, free_port, metric_value, require_prometheus, start_edge, start_sim, wait_ready, Proc};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

pub(crate) fn alertmanager_installed() -> bool {
    let ok =
        Command::new("prometheus-alertmanager").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true") && std::env::var("STRATA_SKIP_PROMETHEUS").as_deref() == Ok("1"),
            "Debian's prometheus-alertmanager is needed (apt-get install -y prometheus-alertmanager); the README's test command installs it"
        );
        crate::common::report_not_run("alerting", "prometheus-alertmanager not installed and STRATA_SKIP_PROMETHEUS=1");
    }
    ok
}

/// An Alertmanager's base URL and a client that reaches it (with its TLS when it has it).
pub(crate) struct Am {
    pub(crate) base: String,
    client: reqwest::blocking::Client,
}

/// A standalone Alertmanager; with `tls`, served over TLS that demands a client certificate
/// the CA signed.
pub(crate) fn start_alertmanager(
    dir: &Path,
    name: &str,
    tls: Option<&strata_server::test_certs::TestCerts>,
) -> (Proc, Am) {
    let cfg = dir.join(format!("{name}.yml"));
    std::fs::write(&cfg, "route:\n  receiver: 'null'\n  group_wait: 1s\nreceivers:\n  - name: 'null'\n").unwrap();
    let port = free_port();
    let mut args = vec![
        format!("--config.file={}", cfg.display()),
        format!("--storage.path={}", dir.join(format!("{name}-data")).display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        // No gossip: each Alertmanager stands alone, and binds no other port.
        "--cluster.listen-address=".to_string(),
    ];
    let (base, client) = match tls {
        None => (format!("http://127.0.0.1:{port}"), client()),
        Some(c) => {
            let web = dir.join(format!("{name}-web.yml"));
            std::fs::write(
                &web,
                format!(
                    "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n",
                    c.server_cert.display(),
                    c.server_key.display(),
                    c.ca.display()
                ),
            )
            .unwrap();
            args.push(format!("--web.config.file={}", web.display()));
            let tls = strata_tls::TlsConfig {
                ca_file: Some(c.ca.clone()),
                cert_file: Some(c.client_cert.clone()),
                key_file: Some(c.client_key.clone()),
                ..Default::default()
            };
            let config = strata_tls::client_config(dir, &tls).unwrap();
            let client = reqwest::blocking::Client::builder()
                .use_preconfigured_tls(config)
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            (format!("https://127.0.0.1:{port}"), client)
        }
    };
    let mut p = Proc::start("prometheus-alertmanager", &args, dir, name);
    let ready = format!("{base}/-/ready");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !client.get(&ready).send().is_ok_and(|r| r.status().is_success()) {
        p.assert_running();
        assert!(Instant::now() < deadline, "{name} not ready:\n{}", p.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    (p, Am { base, client })
}

/// The alerts an Alertmanager holds, active ones only, named `alertname`.
pub(crate) fn am_alerts(am: &Am, alertname: &str) -> Vec<serde_json::Value> {
    let v: serde_json::Value = am
        .client
        .get(format!("{}/api/v2/alerts?filter=alertname%3D%22{alertname}%22", am.base))
        .send()
        .and_then(|r| r.text())
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    v.as_array().cloned().unwrap_or_default()
}

pub(crate) fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The alerts named `alertname` the regional at `base` holds: (gpu, state, `activeAt` to
/// the second, as `ALERTS_FOR_STATE` keeps it and Prometheus restores it), sorted.
pub(crate) fn alerts_of(base: &str, alertname: &str) -> Vec<(String, String, String)> {
    let v = crate::common::api_data(&format!("{base}/api/v1/alerts"));
    let mut out: Vec<(String, String, String)> = v["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|a| a["labels"]["alertname"] == alertname)
        .map(|a| {
            let f = |k: &str| a[k].as_str().unwrap_or_default().to_string();
            let since: String = f("activeAt").chars().take(19).collect();
            (a["labels"]["gpu"].as_str().unwrap_or_default().to_string(), f("state"), since)
        })
        .collect();
    out.sort();
    out
}

const RULES: &str = "groups:
  - name: gpu
    interval: 1s
    rules:
      - record: node:gpu_temp:max
        expr: max by (cluster, Hostname) (DCGM_FI_DEV_GPU_TEMP)
      - alert: GpuHeld
        expr: max by (gpu) (DCGM_FI_DEV_GPU_TEMP) > THRESHOLD
        for: 2s
      - alert: GpuWaiting
        expr: max by (gpu) (DCGM_FI_DEV_GPU_TEMP) > THRESHOLD
        for: 30s
      - alert: GpuReporting
        expr: DCGM_FI_DEV_GPU_TEMP > THRESHOLD
        labels:
          severity: test
        annotations:
          summary: 'GPU {{ $labels.gpu }} at {{ $value }}'
";

#[test]
fn one_alert_per_gpu_from_an_ha_pair_reaches_every_alertmanager_and_resolves() {
    if !require_prometheus() || !alertmanager_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_sim, sim) = start_sim(d, 1);
    let (mut am1, am1_url) = start_alertmanager(d, "am1", None);
    let (mut am2, am2_url) = start_alertmanager(d, "am2", None);
    // The third over TLS with client certificates, as Prometheus' `tls_config` reaches it.
    let certs = strata_server::test_certs::write(d).unwrap();
    let (mut am3, am3_url) = start_alertmanager(d, "am3", Some(&certs));
    // A CA that did not sign am3's certificate: sending there (the same Alertmanager by
    // another name) must fail and be counted, not go through unverified.
    let other = d.join("other-ca");
    std::fs::create_dir_all(&other).unwrap();
    let wrong = strata_server::test_certs::write(&other).unwrap();
    let rules = d.join("rules.yml");
    std::fs::write(&rules, RULES.replace("THRESHOLD", "0")).unwrap();
    let (rhttp, rgrpc) = (free_port(), free_port());
    let am_target = |am: &Am| am.base.trim_start_matches("http://").trim_start_matches("https://").to_string();
    std::fs::write(
        d.join("regional.yml"),
        format!(
            "global:\n  evaluation_interval: 1s\n  external_labels: {{region: r1}}\nrule_files: [rules.yml]\nalerting:\n  alertmanagers:\n    - static_configs: [{{targets: ['{}', '{}']}}]\n    - scheme: https\n      tls_config: {{ca_file: {}, cert_file: {}, key_file: {}}}\n      static_configs: [{{targets: ['{}']}}]\n    - scheme: https\n      tls_config: {{ca_file: {}, cert_file: {}, key_file: {}}}\n      static_configs: [{{targets: ['{}']}}]\n",
            am_target(&am1_url),
            am_target(&am2_url),
            certs.ca.display(),
            certs.client_cert.display(),
            certs.client_key.display(),
            am_target(&am3_url),
            wrong.ca.display(),
            certs.client_cert.display(),
            certs.client_key.display(),
            am_target(&am3_url).replace("127.0.0.1", "localhost")
        ),
    )
    .unwrap();
    let (cfg, data) = (d.join("regional.yml").display().to_string(), d.join("regional").display().to_string());
    let (http, grpc) = (format!("127.0.0.1:{rhttp}"), format!("127.0.0.1:{rgrpc}"));
    let args = [
        "regional",
        // Restores the `for` state of every rule, `for: 2s` included.
        "--rules.alert.for-grace-period=0s",
        "--config",
        &cfg,
        "--data",
        &data,
        "--http-listen",
        &http,
        "--grpc-listen",
        &grpc,
        "--web.enable-lifecycle",
    ];
    let mut regional = Proc::strata(&args, d, "regional");
    let base = format!("http://{http}");
    wait_ready(&format!("{base}/-/ready"), &mut regional, Duration::from_secs(30));
    let mut edges = Vec::new();
    for replica in ["a", "b"] {
        let cfg = d.join(format!("edge-{replica}.yml"));
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  external_labels: {{cluster: c0, replica: {replica}}}\nscrape_configs:\n  - job_name: dcgm\n    static_configs:\n      - targets: ['127.0.0.1:{sim}']\n        labels: {{__metrics_path__: /node/0/metrics}}\nstrata:\n  forward:\n    - address: 127.0.0.1:{rgrpc}\n"
            ),
        )
        .unwrap();
        edges.push(start_edge(d, &cfg, &d.join(format!("edge-{replica}")), &format!("edge-{replica}")));
    }

    // The 30 s alert starts pending with the data.
    wait_for("eight waiting alerts pending", Duration::from_secs(60), || {
        (alerts_of(&base, "GpuWaiting").len() == 8).then_some(())
    });
    let waiting_since = Instant::now();

    // Eight GPUs, both replicas forwarding: eight alerts in each Alertmanager.
    for am in [&am1_url, &am2_url, &am3_url] {
        let alerts = wait_for("eight alerts in an Alertmanager", Duration::from_secs(60), || {
            let a = am_alerts(am, "GpuReporting");
            (a.len() >= 8).then_some(a)
        });
        assert_eq!(alerts.len(), 8, "one alert per GPU, not per replica: {alerts:#?}");
        for a in &alerts {
            let l = &a["labels"];
            assert_eq!(l["region"], "r1", "the regional's external label: {a}");
            assert_eq!(l["severity"], "test");
            assert!(l.get("replica").is_none(), "a replica label reached Alertmanager: {a}");
            let gpu = l["gpu"].as_str().unwrap_or_default().to_string();
            assert!(
                a["annotations"]["summary"].as_str().unwrap_or_default().starts_with(&format!("GPU {gpu} at ")),
                "{a}"
            );
            assert!(a["generatorURL"].as_str().unwrap_or_default().starts_with(&base), "{a}");
        }
    }
    // What the recording rule wrote: one series, with the regional's label, no replica.
    let recorded = wait_for("the recorded series", Duration::from_secs(30), || {
        let v = crate::common::api_data(&format!("{base}/api/v1/query?query=node:gpu_temp:max"));
        let r = v["result"].as_array().cloned().unwrap_or_default();
        (!r.is_empty()).then_some(r)
    });
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0]["metric"]["region"], "r1");
    assert!(recorded[0]["metric"].get("replica").is_none());
    let rules_api = crate::common::api_data(&format!("{base}/api/v1/rules?type=alert"));
    let rule = &rules_api["groups"][0]["rules"][2];
    assert_eq!(
        (rule["name"].as_str(), rule["health"].as_str(), rule["state"].as_str()),
        (Some("GpuReporting"), Some("ok"), Some("firing")),
        "{rules_api}"
    );
    assert_eq!(rule["alerts"].as_array().map(|a| a.len()), Some(8));

    // A restart keeps `for` state: held alerts come back firing since the same time
    // (found in `ALERTS_FOR_STATE`, stored with the regional's external labels), and the
    // pending ones fire `for` after they began plus the time down, not `for` after the
    // restart.
    let before = wait_for("eight held alerts firing", Duration::from_secs(30), || {
        let h = alerts_of(&base, "GpuHeld");
        (h.len() == 8 && h.iter().all(|a| a.1 == "firing")).then_some(h)
    });
    // Pending for at least 10 of its 30 s, and written in `ALERTS_FOR_STATE` since.
    std::thread::sleep((waiting_since + Duration::from_secs(10)).saturating_duration_since(Instant::now()));
    let waiting = alerts_of(&base, "GpuWaiting");
    assert!(waiting.len() == 8 && waiting.iter().all(|a| a.1 == "pending"), "{waiting:?}");
    regional.terminate();
    let restarted = Instant::now();
    let mut regional = Proc::strata(&args, d, "regional-restarted");
    wait_ready(&format!("{base}/-/ready"), &mut regional, Duration::from_secs(30));
    let after = wait_for("the held alerts back", Duration::from_secs(30), || {
        let h = alerts_of(&base, "GpuHeld");
        (h.len() == 8 && h.iter().all(|a| a.1 == "firing")).then_some(h)
    });
    assert_eq!(after, before, "the restart lost the alerts' `for` state");
    wait_for("the waiting alerts firing", Duration::from_secs(40), || {
        let h = alerts_of(&base, "GpuWaiting");
        (h.len() == 8 && h.iter().all(|a| a.1 == "firing")).then_some(())
    });
    // 30 s of `for`, at least 10 of them spent before the restart: about 20 s after it
    // (evaluation and restore add a few), never the 30 s a `for` started afresh takes.
    let took = restarted.elapsed();
    assert!(took < Duration::from_secs(27), "the pending alerts fired {took:?} after the restart, not on time");

    // The global merges every regional's rules and alerts (with their external labels)
    // and names a regional that does not answer.
    let dead = format!("127.0.0.1:{}", free_port());
    let (mut global, gbase) = crate::global::start_global(
        d,
        "global",
        &format!("stores: ['{grpc}', '{dead}']\nstore_timeout: 2s\ninfo_interval: 1s\n"),
        &[],
    );
    let whole = |path: &str| -> (u16, serde_json::Value) {
        let r = client().get(format!("{gbase}{path}")).send().unwrap();
        let code = r.status().as_u16();
        (code, serde_json::from_str(&r.text().unwrap()).unwrap())
    };
    let (code, alerts) = whole("/api/v1/alerts");
    assert_eq!(code, 200, "{alerts}");
    let list = alerts["data"]["alerts"].as_array().cloned().unwrap_or_default();
    assert_eq!(list.len(), 24, "eight GPUs, three rules: {alerts}");
    assert!(list.iter().all(|a| a["labels"]["region"] == "r1" && a["state"] == "firing"), "{alerts}");
    let warned = alerts["warnings"].as_array().cloned().unwrap_or_default();
    assert!(warned.iter().any(|w| w.as_str().unwrap_or_default().contains(&dead)), "{alerts}");
    let (code, strict) = whole("/api/v1/alerts?partial_response=false");
    assert_eq!(code, 503, "{strict}");
    let (code, rules_global) = whole("/api/v1/rules?type=alert");
    assert_eq!(code, 200, "{rules_global}");
    let rule = &rules_global["data"]["groups"][0]["rules"][2];
    assert_eq!((rule["name"].as_str(), rule["labels"]["region"].as_str()), (Some("GpuReporting"), Some("r1")));
    assert_eq!(rule["alerts"].as_array().map(|a| a.len()), Some(8), "{rules_global}");
    let (code, bad) = whole("/api/v1/rules?match[]=%7B");
    assert_eq!(code, 400, "{bad}");
    global.assert_running();

    // A bad file on reload: refused, the old rules stay.
    std::fs::write(&rules, "groups:\n  - name: gpu\n    rules:\n      - record: x\n        expr: sum(\n").unwrap();
    let r = client().post(format!("{base}/-/reload")).send().unwrap();
    assert_eq!(r.status().as_u16(), 500);
    assert!(r.text().unwrap().contains("could not parse expression"));
    let page = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    assert_eq!(metric_value(&page, "prometheus_config_last_reload_successful"), Some(0.0), "{page}");
    assert_eq!(
        crate::common::api_data(&format!("{base}/api/v1/alerts"))["alerts"].as_array().map(|a| a.len()),
        Some(24)
    );

    // One Alertmanager down; the rule now resolves every alert: the other one hears it.
    am2.kill9();
    std::fs::write(&rules, RULES.replace("THRESHOLD", "1000")).unwrap();
    let r = client().post(format!("{base}/-/reload")).send().unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap_or_default());
    wait_for("the alerts resolved in the Alertmanager that is up", Duration::from_secs(60), || {
        am_alerts(&am1_url, "GpuReporting").iter().all(|a| a["status"]["state"] != "active").then_some(())
    });
    let page = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    let errors: f64 = page
        .lines()
        .filter(|l| l.starts_with("prometheus_notifications_errors_total{") && l.contains(&am_target(&am2_url)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(errors > 0.0, "sending to the Alertmanager that is down is not counted:\n{page}");
    let untrusted: f64 = page
        .lines()
        .filter(|l| {
            l.starts_with("prometheus_notifications_errors_total{")
                && l.contains(&am_target(&am3_url).replace("127.0.0.1", "localhost"))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(untrusted > 0.0, "an Alertmanager whose certificate the CA did not sign was not refused:\n{page}");
    regional.assert_running();
    am1.assert_running();
    am3.assert_running();
    for (mut e, _) in edges {
        e.assert_running();
    }
}
