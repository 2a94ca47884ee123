//! The edge as a process against targets served by this test: gzip bodies, OpenMetrics by
//! content negotiation, a bad page (up = 0, a log line naming the target and the line, and
//! nothing lost), reload by `POST /-/reload` and SIGHUP, a bad config refused, file SD.

use crate::common::*;
use flate2::write::GzEncoder;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// Serves fixed pages by path on a loopback port until the process ends.
fn serve_pages() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).to_string();
            let path = req.split_whitespace().nth(1).unwrap_or("/").to_string();
            let (ct, enc, body): (&str, Option<&str>, Vec<u8>) = match path.as_str() {
                "/gz" => {
                    let mut e = GzEncoder::new(Vec::new(), flate2::Compression::default());
                    e.write_all(b"# TYPE gz_metric gauge\ngz_metric{a=\"1\"} 42\n").unwrap();
                    ("text/plain; version=0.0.4", Some("gzip"), e.finish().unwrap())
                }
                "/om" => {
                    let accepts_om = req.to_ascii_lowercase().contains("accept: application/openmetrics-text");
                    let body = if accepts_om {
                        "# TYPE om_energy counter\n# UNIT om_energy joules\nom_energy_total 7 # {trace_id=\"x\"} 1\n# EOF\n"
                    } else {
                        "not_negotiated 1\n"
                    };
                    ("application/openmetrics-text; version=1.0.0; charset=utf-8", None, body.as_bytes().to_vec())
                }
                "/bad" => ("text/plain; version=0.0.4", None, b"good_metric 1\nthis line is garbage\n".to_vec()),
                _ => ("text/plain", None, b"plain_metric 1\n".to_vec()),
            };
            let mut head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {ct}\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            if let Some(e) = enc {
                head.push_str(&format!("Content-Encoding: {e}\r\n"));
            }
            head.push_str("\r\n");
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(&body);
        }
    });
    port
}

fn job(name: &str, port: u16, path: &str) -> String {
    format!(
        "  - job_name: {name}\n    metrics_path: {path}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )
}

fn series(base: &str, selector: &str) -> Vec<serde_json::Value> {
    let url = format!(
        "{base}/api/v1/series?match[]={}",
        selector.replace('{', "%7B").replace('}', "%7D").replace('"', "%22").replace('=', "%3D")
    );
    let data = api_data(&url);
    data.as_array().cloned().unwrap_or_else(|| panic!("series data is not an array: {data}"))
}

/// An edge with this configuration that may be reloaded over HTTP, ready; its base URL.
fn lifecycle_edge(dir: &std::path::Path, cfg: &std::path::Path) -> (Proc, String) {
    let edge_port = free_port();
    let base = format!("http://127.0.0.1:{edge_port}");
    let (cfg, data) = (cfg.display().to_string(), dir.join("data").display().to_string());
    let listen = format!("127.0.0.1:{edge_port}");
    let args = ["edge", "--config", &cfg, "--data", &data, "--http-listen", &listen, "--web.enable-lifecycle"];
    let mut edge = Proc::strata(&args, dir, "edge");
    wait_ready(&format!("{base}/-/ready"), &mut edge, Duration::from_secs(30));
    (edge, base)
}

fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("timed out waiting for {what}");
}

#[test]
fn scrape_formats_bad_pages_reload_and_file_sd() {
    let dir = tempfile::tempdir().unwrap();
    let port = serve_pages();
    let cfg = dir.path().join("edge.yml");
    let head = "global:\n  scrape_interval: 1s\nscrape_configs:\n";
    let big = format!("  - job_name: big\n    metrics_path: /plain\n    body_size_limit: 4B\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n");
    std::fs::write(
        &cfg,
        format!("{head}{}{}{}{big}", job("gz", port, "/gz"), job("om", port, "/om"), job("bad", port, "/bad")),
    )
    .unwrap();
    let (mut edge, base) = lifecycle_edge(dir.path(), &cfg);

    wait_for("gzip and OpenMetrics pages", Duration::from_secs(15), || {
        !series(&base, "gz_metric").is_empty() && !series(&base, "om_energy_total").is_empty()
    });
    assert!(series(&base, "not_negotiated").is_empty(), "the edge asked for OpenMetrics");
    let md: serde_json::Value = serde_json::from_str(
        &client().get(format!("{base}/api/v1/metadata?metric=om_energy")).send().unwrap().text().unwrap(),
    )
    .unwrap();
    assert_eq!(md["data"]["om_energy"][0]["type"], "counter");
    assert_eq!(md["data"]["om_energy"][0]["unit"], "joules");

    // The bad page: no series from it, a failure counted, and a log line with target and line.
    wait_for("a failed scrape of the bad page", Duration::from_secs(15), || {
        let m = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
        m.contains("strata_scrape_failures_total{job=\"bad\"}")
    });
    assert!(series(&base, "good_metric").is_empty(), "nothing of a bad page is stored");
    // The counter goes up before the line is logged and read back from the pipe.
    let bad_line = |log: &str| log.lines().any(|l| l.contains("scrape failed") && l.contains("/bad"));
    let waited = std::time::Instant::now();
    while !bad_line(&edge.log_text()) && waited.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = edge.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("scrape failed") && l.contains("/bad"))
        .unwrap_or_else(|| panic!("no log line for the bad target:\n{log}"));
    assert!(line.contains("line 2") && line.contains("this line is garbage"), "{line}");
    assert_eq!(series(&base, "up{job=\"bad\"}").len(), 1, "up is recorded for the failing target");
    // An oversize body fails its scrape too.
    wait_for("a failed scrape of the oversize page", Duration::from_secs(15), || {
        edge.log_text().contains("body size limit of 4 bytes exceeded")
    });
    assert!(series(&base, "plain_metric{job=\"big\"}").is_empty());

    // Reload by POST: a new job starts scraping.
    std::fs::write(&cfg, format!("{head}{}{}", job("gz", port, "/gz"), job("plain", port, "/plain"))).unwrap();
    let r = client().post(format!("{base}/-/reload")).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    wait_for("the reloaded job", Duration::from_secs(15), || !series(&base, "plain_metric").is_empty());

    // A bad config is refused and the running one keeps scraping.
    std::fs::write(&cfg, "scrape_configs:\n  - job_name: x\n    scrape_interval: nonsense\n").unwrap();
    let r = client().post(format!("{base}/-/reload")).send().unwrap();
    assert_eq!(r.status().as_u16(), 500);
    assert!(r.text().unwrap().contains("duration"));
    let m = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    assert_eq!(metric_value(&m, "strata_config_last_reload_successful"), Some(0.0));
    edge.assert_running();

    // SIGHUP with file SD: targets come from a file, and a change to the file is picked up.
    let sd = dir.path().join("targets.json");
    std::fs::write(&sd, format!("[{{\"targets\": [\"127.0.0.1:{port}\"], \"labels\": {{\"zone\": \"z1\"}}}}]"))
        .unwrap();
    std::fs::write(&cfg, format!("{head}  - job_name: filesd\n    metrics_path: /plain\n    file_sd_configs:\n      - files: ['targets.json']\n")).unwrap();
    let pid = edge.child.as_ref().map(|c| c.id()).unwrap();
    assert!(std::process::Command::new("kill").arg("-HUP").arg(pid.to_string()).status().unwrap().success());
    wait_for("the file-SD target after SIGHUP", Duration::from_secs(15), || {
        !series(&base, "plain_metric{job=\"filesd\",zone=\"z1\"}").is_empty()
    });
    std::fs::write(&sd, format!("[{{\"targets\": [\"127.0.0.1:{port}\"], \"labels\": {{\"zone\": \"z2\"}}}}]"))
        .unwrap();
    wait_for("the changed file-SD target", Duration::from_secs(20), || {
        !series(&base, "plain_metric{job=\"filesd\",zone=\"z2\"}").is_empty()
    });
    edge.terminate();
}

/// Every step of `up{job=...}` over the last `secs` seconds at 0.25 s: the steps with no
/// value (a staleness marker, or a missed scrape past the lookback) are returned.
fn up_gaps(base: &str, job: &str, from: f64, to: f64, lookback: &str) -> Vec<f64> {
    let url = format!(
        "{base}/api/v1/query_range?query=up%7Bjob%3D%22{job}%22%7D&start={from:.3}&end={to:.3}&step=0.25&lookback_delta={lookback}"
    );
    let data = api_data(&url);
    let mut present: Vec<f64> = data["result"]
        .as_array()
        .and_then(|r| r.first())
        .and_then(|s| s["values"].as_array())
        .map(|v| v.iter().filter_map(|p| p[0].as_f64()).collect())
        .unwrap_or_default();
    present.sort_by(f64::total_cmp);
    let mut gaps = Vec::new();
    let mut t = from;
    while t <= to {
        if !present.iter().any(|p| (p - t).abs() < 0.01) {
            gaps.push(t);
        }
        t += 0.25;
    }
    gaps
}

/// Edge review (issue 20, items 5 and 6): a reload that changes a job's settings (its
/// `sample_limit`) keeps its targets' loops, with no staleness marker and no missed scrape;
/// a file-SD file rewritten with garbage keeps its last good targets.
#[test]
fn a_reload_that_changes_a_job_and_a_broken_sd_file_leave_no_gap() {
    let dir = tempfile::tempdir().unwrap();
    let port = serve_pages();
    let cfg = dir.path().join("edge.yml");
    let sd = dir.path().join("targets.json");
    std::fs::write(&sd, format!("[{{\"targets\": [\"127.0.0.1:{port}\"]}}]")).unwrap();
    let text = |limit: u32| {
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: fixed\n    metrics_path: /plain\n    sample_limit: {limit}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n  - job_name: filesd\n    metrics_path: /plain\n    file_sd_configs:\n      - files: ['targets.json']\n"
        )
    };
    std::fs::write(&cfg, text(100)).unwrap();
    let (mut edge, base) = lifecycle_edge(dir.path(), &cfg);
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    wait_for("both jobs scraped", Duration::from_secs(15), || {
        !series(&base, "up{job=\"fixed\"}").is_empty() && !series(&base, "up{job=\"filesd\"}").is_empty()
    });
    std::thread::sleep(Duration::from_secs(2));
    // A clean start is a successful load, and the metrics the docs name are there at 0.
    let m = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    assert_eq!(metric_value(&m, "strata_config_last_reload_successful"), Some(1.0), "{m}");
    assert_eq!(metric_value(&m, "strata_config_reloads_total{reason=\"failure\"}"), Some(0.0), "{m}");
    assert_eq!(metric_value(&m, "strata_scrape_failures_total{job=\"fixed\"}"), Some(0.0), "{m}");
    assert!(metric_value(&m, "strata_remote_write_requests_total{code=\"204\"}").is_some(), "{m}");

    let before = now();
    std::fs::write(&cfg, text(200)).unwrap();
    let r = client().post(format!("{base}/-/reload")).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // An editor rewriting the file in place: garbage for a while.
    std::fs::write(&sd, "[{\"targets\": [\"127.0.0.1:").unwrap();
    std::thread::sleep(Duration::from_secs(12));
    let after = now();
    // A 1.5 s lookback: a scrape every second keeps every step covered, a missed one or a
    // staleness marker does not.
    let gaps = up_gaps(&base, "fixed", before - 1.0, after - 1.0, "1500ms");
    assert!(gaps.is_empty(), "up of the reloaded job has gaps at {gaps:?}");
    let gaps = up_gaps(&base, "filesd", before - 1.0, after - 1.0, "1500ms");
    assert!(gaps.is_empty(), "up of the file-SD job has gaps at {gaps:?}");
    let m = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    assert!(metric_value(&m, "strata_sd_file_read_errors_total").is_some_and(|v| v >= 1.0), "{m}");
    edge.terminate();
}
