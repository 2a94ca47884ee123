//! The edge's `remote_write` against real receivers: Prometheus 2.42 stopped and restarted
//! under a running edge that is itself restarted during the backlog (afterwards Prometheus
//! holds every sample the edge holds), and a SigV4 receiver that checks each request's
//! signature with botocore, the AWS SDK for Python.

use crate::common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Every series' samples over the last hour as `/api/v1/query` returns a range selector
/// (staleness markers are not returned, on either side), by label set with `add` set.
fn samples_via_api(base: &str, add: &[(&str, &str)]) -> BTreeMap<String, Vec<(String, String)>> {
    let now = now_ms() as f64 / 1000.0;
    let data = api_data(&format!("{base}/api/v1/query?query=%7B__name__%3D~%22.%2B%22%7D%5B1h%5D&time={now}"));
    let mut out = BTreeMap::new();
    for s in data["result"].as_array().unwrap_or_else(|| panic!("{base}: no result: {data}")) {
        let mut labels: BTreeMap<String, String> = s["metric"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        for (k, v) in add {
            labels.insert(k.to_string(), v.to_string());
        }
        let values = s["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].to_string(), p[1].as_str().unwrap_or_default().to_string()))
            .collect();
        out.insert(format!("{labels:?}"), values);
    }
    out
}

fn start_prometheus(dir: &Path, port: u16) -> Proc {
    let cfg = dir.join("prometheus.yml");
    std::fs::write(&cfg, "global:\n  scrape_interval: 1h\nscrape_configs: []\n").unwrap();
    let args = vec![
        format!("--config.file={}", cfg.display()),
        format!("--storage.tsdb.path={}", dir.join("prom-data").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        "--web.enable-remote-write-receiver".to_string(),
    ];
    let mut p = Proc::start("prometheus", &args, dir, "prometheus");
    wait_ready(&format!("http://127.0.0.1:{port}/-/ready"), &mut p, Duration::from_secs(60));
    p
}

fn edge_config(dir: &Path, file: &str, sim: Option<u16>, remote_write: &str) -> std::path::PathBuf {
    let mut text = "global:\n  scrape_interval: 1s\n  external_labels:\n    cluster: c0\n".to_string();
    match sim {
        Some(port) => text.push_str(&format!(
            "scrape_configs:\n  - job_name: dcgm\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n        labels: {{__metrics_path__: /node/0/metrics}}\n"
        )),
        None => text.push_str("scrape_configs: []\n"),
    }
    text.push_str(remote_write);
    let p = dir.join(file);
    std::fs::write(&p, text).unwrap();
    p
}

fn metrics(base: &str) -> String {
    client().get(format!("{base}/metrics")).send().unwrap().text().unwrap()
}

#[test]
fn prometheus_stopped_and_the_edge_restarted_mid_backlog_lose_nothing() {
    if !require_prometheus() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_sim, sim) = start_sim(dir.path(), 1);
    let prom_port = free_port();
    let mut prom = start_prometheus(dir.path(), prom_port);
    let rw = format!(
        "remote_write:\n  - url: http://127.0.0.1:{prom_port}/api/v1/write\n    name: prom\n    \
         queue_config: {{max_samples_per_send: 500, batch_send_deadline: 1s, min_backoff: 50ms, max_backoff: 1s}}\n"
    );
    // A 10 s block range: the edge cuts blocks and checkpoints its head during the outage,
    // so the backlog goes to Prometheus from blocks, per series in order.
    let rw = format!("{rw}strata:\n  block_range: 10s\n");
    let edata = dir.path().join("edge");
    let scraping = edge_config(dir.path(), "edge.yml", Some(sim), &rw);
    let (mut edge, base) = start_edge(dir.path(), &scraping, &edata, "edge-1");
    std::thread::sleep(Duration::from_secs(4));
    // Prometheus is down for a minute; the edge restarts in the middle of it.
    prom.terminate();
    std::thread::sleep(Duration::from_secs(25));
    let page = metrics(&base);
    assert!(
        labelled_value(&page, "prometheus_remote_storage_samples_retried_total").unwrap_or(0.0) > 0.0,
        "no retries while Prometheus was down:\n{page}"
    );
    assert!(labelled_value(&page, "strata_remote_write_queue_pending_bytes").unwrap_or(0.0) > 0.0);
    // The edge restarts with the backlog unsent; it scrapes on meanwhile.
    edge.terminate();
    let (mut edge, base) = start_edge(dir.path(), &scraping, &edata, "edge-2");
    std::thread::sleep(Duration::from_secs(30));
    let page = metrics(&base);
    assert!(
        metric_value(&page, "strata_blocks_written_total").unwrap_or(0.0) > 0.0,
        "the edge cut no block during the outage:\n{page}"
    );
    let _prom = start_prometheus(dir.path(), prom_port);
    std::thread::sleep(Duration::from_secs(3));
    // Scraping stops (an edge without jobs on the same data) so both sides can settle.
    edge.terminate();
    let idle = edge_config(dir.path(), "edge-idle.yml", None, &rw);
    let (_edge, base) = start_edge(dir.path(), &idle, &edata, "edge-3");
    let deadline = Instant::now() + Duration::from_secs(60);
    let page = loop {
        let page = metrics(&base);
        if labelled_value(&page, "strata_remote_write_queue_pending_bytes") == Some(0.0) {
            break page;
        }
        assert!(Instant::now() < deadline, "the edge did not catch up:\n{page}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(labelled_value(&page, "prometheus_remote_storage_samples_failed_total"), Some(0.0), "{page}");
    let ours = samples_via_api(&base, &[("cluster", "c0")]);
    let theirs = samples_via_api(&format!("http://127.0.0.1:{prom_port}"), &[]);
    let stored: usize = ours.values().map(Vec::len).sum();
    assert!(stored > 2000, "too little data to compare: {stored} samples");
    assert_eq!(ours.len(), theirs.len(), "series differ");
    for (k, v) in &ours {
        assert_eq!(Some(v), theirs.get(k), "series {k} differs between the edge and Prometheus");
    }
}

/// The botocore verifier: accepts a request whose SigV4 signature it computes itself from
/// the given keys, refuses any other with 403; writes its counts to `out` after each.
const VERIFIER: &str = r#"
import http.server, json, sys
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

AK, SK, REGION, PORT, OUT = sys.argv[1:6]
counts = {"accepted": 0, "refused": 0}

class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        ok = False
        try:
            auth = self.headers["authorization"]
            assert auth.startswith("AWS4-HMAC-SHA256 ")
            parts = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 "):].split(","))
            scope = parts["Credential"].split("/")
            signed = parts["SignedHeaders"].split(";")
            headers = {h: self.headers[h] for h in signed}
            req = AWSRequest(method="POST", url="http://%s%s" % (self.headers["host"], self.path), data=body, headers=headers)
            req.context["timestamp"] = self.headers["x-amz-date"]
            signer = SigV4Auth(Credentials(AK, SK), "aps", REGION)
            sts = signer.string_to_sign(req, signer.canonical_request(req))
            ok = scope[0] == AK and scope[2] == REGION and scope[3] == "aps" and "content-type" in signed \
                and signer.signature(sts, req) == parts["Signature"]
        except Exception as e:
            sys.stderr.write("verify error: %r\n" % (e,))
        counts["accepted" if ok else "refused"] += 1
        self.send_response(204 if ok else 403)
        self.end_headers()
        with open(OUT + ".tmp", "w") as f:
            json.dump(counts, f)
        import os
        os.replace(OUT + ".tmp", OUT)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(PORT)), Handler).serve_forever()
"#;

fn require_botocore() {
    let ok = Command::new("python3").args(["-c", "import botocore"]).output().is_ok_and(|o| o.status.success());
    assert!(ok, "python3 with botocore is needed (pip install botocore); the README's test command installs it");
}

fn verifier_counts(out: &Path) -> (u64, u64) {
    let Ok(text) = std::fs::read_to_string(out) else { return (0, 0) };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    (v["accepted"].as_u64().unwrap_or(0), v["refused"].as_u64().unwrap_or(0))
}

#[test]
fn sigv4_requests_verify_with_botocore_and_a_wrong_secret_is_refused() {
    require_botocore();
    let dir = tempfile::tempdir().unwrap();
    let (_sim, sim) = start_sim(dir.path(), 1);
    let script = dir.path().join("verifier.py");
    std::fs::write(&script, VERIFIER).unwrap();
    let port = free_port();
    let out = dir.path().join("counts.json");
    let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    let args: Vec<String> = [script.display().to_string(), "AKIDSTRATA".into(), secret.into(), "us-west-2".into()]
        .into_iter()
        .chain([port.to_string(), out.display().to_string()])
        .collect();
    let mut verifier = Proc::start("python3", &args, dir.path(), "verifier");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        verifier.assert_running();
        assert!(Instant::now() < deadline, "the verifier did not start:\n{}", verifier.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    let rw = |secret: &str| {
        format!(
            "remote_write:\n  - url: http://127.0.0.1:{port}/workspaces/ws-1/api/v1/remote_write\n    \
             sigv4: {{region: us-west-2, access_key: AKIDSTRATA, secret_key: '{secret}'}}\n    \
             queue_config: {{batch_send_deadline: 1s, min_backoff: 50ms, max_backoff: 500ms}}\n"
        )
    };

    let good = edge_config(dir.path(), "good.yml", Some(sim), &rw(secret));
    let (mut edge, base) = start_edge(dir.path(), &good, &dir.path().join("good"), "edge-good");
    let deadline = Instant::now() + Duration::from_secs(30);
    while verifier_counts(&out).0 < 3 {
        assert!(
            Instant::now() < deadline,
            "no signed request verified: {:?}\n{}",
            verifier_counts(&out),
            verifier.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let page = metrics(&base);
    assert_eq!(verifier_counts(&out).1, 0, "a correctly signed request was refused:\n{}", verifier.log_text());
    assert!(labelled_value(&page, "prometheus_remote_storage_samples_total").unwrap_or(0.0) > 0.0, "{page}");
    assert_eq!(labelled_value(&page, "prometheus_remote_storage_samples_failed_total"), Some(0.0), "{page}");
    edge.terminate();

    let accepted = verifier_counts(&out).0;
    let bad = edge_config(dir.path(), "bad.yml", Some(sim), &rw("not-the-secret"));
    let (_edge, base) = start_edge(dir.path(), &bad, &dir.path().join("bad"), "edge-bad");
    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        let page = metrics(&base);
        if labelled_value(&page, "prometheus_remote_storage_samples_failed_total").unwrap_or(0.0) > 0.0 {
            break page;
        }
        assert!(Instant::now() < deadline, "a wrongly signed write was not refused and counted:\n{page}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(verifier_counts(&out).0, accepted, "a request signed with the wrong secret verified");
    assert_eq!(labelled_value(&page, "prometheus_remote_storage_samples_total"), Some(0.0), "{page}");
}
