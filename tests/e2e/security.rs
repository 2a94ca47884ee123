//! Real clients against a TLS + basic-auth edge: `promtool check web-config` accepts
//! Strata's web config file, Prometheus 2.42 remote-writes into the edge with its own
//! `tls_config` and `basic_auth`, and curl (the reference HTTP client) is refused without
//! credentials and served with them.

use crate::common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `curl` over TLS with the test CA; returns (status, body).
fn curl(certs: &strata_server::test_certs::TestCerts, url: &str, user: Option<&str>) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args(["-sS", "-m", "10", "--cacert"]).arg(&certs.ca).args(["-w", "\n%{http_code}"]);
    if let Some(u) = user {
        c.args(["-u", u]);
    }
    let out = c.arg(url).output().expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let code = code.trim().parse().unwrap_or(0);
    if code == 0 {
        return (0, String::from_utf8_lossy(&out.stderr).into_owned());
    }
    (code, body.to_string())
}

fn write_web_config(dir: &Path) -> (strata_server::test_certs::TestCerts, std::path::PathBuf) {
    let certs = strata_server::test_certs::write(dir).expect("test certificates");
    let hash = bcrypt::hash("s3cret", 4).expect("bcrypt");
    let web = dir.join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nbasic_auth_users:\n  alice: {hash}\n"
        ),
    )
    .unwrap();
    (certs, web)
}

#[test]
fn prometheus_remote_writes_into_a_tls_and_basic_auth_edge() {
    if !require_prometheus() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (certs, web) = write_web_config(dir.path());
    let check = Command::new("promtool").arg("check").arg("web-config").arg(&web).output().expect("promtool runs");
    assert!(
        check.status.success(),
        "promtool refused Strata's web config: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    let web_arg = web.display().to_string();
    let (mut edge, edge_port) = edge_with(dir.path(), "scrape_configs: []\n", &["--web.config.file", &web_arg]);
    let prom_port = free_port();
    let base = format!("https://127.0.0.1:{edge_port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = curl(&certs, &format!("{base}/-/ready"), Some("alice:s3cret"));
        if code == 200 {
            break;
        }
        edge.assert_running();
        assert!(Instant::now() < deadline, "the TLS edge never became ready ({code} {body}):\n{}", edge.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(curl(&certs, &format!("{base}/-/ready"), None).0, 401, "no credentials");
    assert_eq!(curl(&certs, &format!("{base}/api/v1/labels"), Some("alice:wrong")).0, 401, "a wrong password");
    assert_eq!(curl(&certs, &format!("{base}/api/v1/write"), None).0, 401, "remote write needs credentials too");

    let prom_cfg = dir.path().join("prometheus.yml");
    std::fs::write(
        &prom_cfg,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: prometheus\n    static_configs:\n      - targets: ['127.0.0.1:{prom_port}']\nremote_write:\n  - url: {base}/api/v1/write\n    tls_config: {{ca_file: {}}}\n    basic_auth: {{username: alice, password: s3cret}}\n    queue_config: {{batch_send_deadline: 1s}}\n",
            certs.ca.display()
        ),
    )
    .unwrap();
    let prom_args: Vec<String> = vec![
        format!("--config.file={}", prom_cfg.display()),
        format!("--storage.tsdb.path={}", dir.path().join("prom-data").display()),
        format!("--web.listen-address=127.0.0.1:{prom_port}"),
    ];
    let mut prom = Proc::start("prometheus", &prom_args, dir.path(), "prometheus");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        prom.assert_running();
        let (code, body) = curl(&certs, &format!("{base}/api/v1/series?match[]=up"), Some("alice:s3cret"));
        if code == 200 && body.contains("\"job\":\"prometheus\"") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus' remote write never arrived ({code} {body});\nprometheus log:\n{}\nedge log:\n{}",
            prom.log_text(),
            edge.log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn the_edge_scrapes_an_https_target_that_demands_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let (certs, web) = write_web_config(dir.path());
    let sim_port = free_port();
    let mut sim = Proc::strata(
        &[
            "simulate",
            "--nodes",
            "1",
            "--listen",
            &format!("127.0.0.1:{sim_port}"),
            "--web.config.file",
            &web.display().to_string(),
            "--start-at",
            &quiet_start(1),
        ],
        dir.path(),
        "sim",
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while curl(&certs, &format!("https://127.0.0.1:{sim_port}/node/0/metrics"), Some("alice:s3cret")).0 != 200 {
        sim.assert_running();
        assert!(Instant::now() < deadline, "the https simulator never answered:\n{}", sim.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::write(dir.path().join("password"), "s3cret\n").unwrap();
    let job = |name: &str, auth: &str| {
        format!("  - job_name: {name}\n    scheme: https\n    metrics_path: /node/0/metrics\n    tls_config: {{ca_file: ca.crt}}\n{auth}    static_configs:\n      - targets: ['127.0.0.1:{sim_port}']\n")
    };
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n{}{}",
        job("dcgm", "    basic_auth: {username: alice, password_file: password}\n"),
        job("nocreds", "")
    );
    let (mut edge, edge_port) = edge_with(dir.path(), &config, &[]);
    let base = format!("http://127.0.0.1:{edge_port}");
    wait_ready(&format!("{base}/-/ready"), &mut edge, Duration::from_secs(30));
    let series = |q: &str| series_count(&base, q);
    let deadline = Instant::now() + Duration::from_secs(30);
    while series("DCGM_FI_DEV_GPU_TEMP") < 8 {
        edge.assert_running();
        assert!(Instant::now() < deadline, "no GPU series scraped over https:\n{}", edge.log_text());
        std::thread::sleep(Duration::from_millis(300));
    }
    // The job without credentials is refused by the target and says so.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !edge.log_text().contains("HTTP status 401") {
        assert!(Instant::now() < deadline, "no 401 logged for the job without credentials:\n{}", edge.log_text());
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Sends a request's head over a raw connection and returns the stream, still open.
fn raw_request(addr: &str, head: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.write_all(head.as_bytes()).expect("send");
    s
}

/// What the server has written back on `s` so far (its status line), if anything, without
/// waiting more than a moment.
fn answer_on(s: &mut std::net::TcpStream) -> Option<String> {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_millis(50))).ok()?;
    let mut buf = [0u8; 256];
    match s.read(&mut buf) {
        Ok(0) => Some("closed".into()),
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or("").to_string()),
        Err(_) => None,
    }
}

/// An edge with this configuration and `extra` flags, started (not yet ready); returns it
/// with its port.
fn edge_with(dir: &Path, config: &str, extra: &[&str]) -> (Proc, u16) {
    let port = free_port();
    let cfg = dir.join("edge.yml");
    std::fs::write(&cfg, config).unwrap();
    let (cfg, data, listen) =
        (cfg.display().to_string(), dir.join("edge-data").display().to_string(), format!("127.0.0.1:{port}"));
    let mut args = vec!["edge", "--config", &cfg, "--data", &data, "--http-listen", &listen];
    args.extend_from_slice(extra);
    (Proc::strata(&args, dir, "edge"), port)
}

/// An edge with no scrape jobs and `extra` flags, ready; returns it with its port.
fn idle_edge(dir: &Path, extra: &[&str]) -> (Proc, u16) {
    let (mut edge, port) = edge_with(dir, "scrape_configs: []\n", extra);
    wait_ready(&format!("http://127.0.0.1:{port}/-/ready"), &mut edge, Duration::from_secs(30));
    (edge, port)
}

/// Slow uploads hold only the bytes they declared, never the processing slots: four (as
/// many as the slots) stalled mid-body leave the next write served at once. Uploads that
/// together declare the whole upload budget (256 MiB) make the next one a 503, not memory.
#[test]
fn slow_uploads_hold_no_write_slot_and_their_bytes_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (_edge, port) = idle_edge(dir.path(), &[]);
    let base = format!("http://127.0.0.1:{port}");
    let addr = format!("127.0.0.1:{port}");
    let c = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let body = snap::raw::Encoder::new().compress_vec(&[]).unwrap();

    let stalled: Vec<_> = (0..4)
        .map(|_| raw_request(&addr, "POST /api/v1/write HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\npartial"))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let r = c.post(format!("{base}/api/v1/write")).body(body.clone()).send().expect("served beside stalled uploads");
    assert_eq!(r.status().as_u16(), 204);
    assert!(t.elapsed() < Duration::from_secs(5), "the write waited {:?} behind stalled uploads", t.elapsed());
    drop(stalled);

    // Eight stalled uploads of 32 MiB each declare the whole budget (a ninth, in case a
    // probe below took its kibibyte while the eighth reserved: then the eighth is the 503).
    // On a loaded machine an upload may legitimately be let go (its body not arriving within
    // the edge's 30 s): then the edge has answered it on its socket, and the round is redone.
    let mut code = 0;
    let mut big = Vec::new();
    for round in 0..3 {
        big = (0..9)
            .map(|_| {
                raw_request(&addr, "POST /api/v1/write HTTP/1.1\r\nHost: x\r\nContent-Length: 33554432\r\n\r\npartial")
            })
            .collect();
        // Once the edge has read their heads (it may be busy), the next write is past the budget.
        std::thread::sleep(Duration::from_secs(1));
        for _ in 0..100 {
            code =
                c.post(format!("{base}/api/v1/write")).body(body.clone()).send().expect("answered").status().as_u16();
            if code == 503 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if code == 503 {
            break;
        }
        let answered: Vec<String> = big.iter_mut().filter_map(answer_on).collect();
        assert!(
            !answered.is_empty() && round < 2,
            "a write past the upload budget got {code} while the nine uploads were still held (round {round})"
        );
        eprintln!("round {round}: the edge let uploads go ({answered:?}); again");
    }
    assert_eq!(code, 503, "a write past the upload budget");
    drop(big);
    for _ in 0..50 {
        code = c.post(format!("{base}/api/v1/write")).body(body.clone()).send().expect("answered").status().as_u16();
        if code == 204 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(code, 204, "the budget came back once the uploads went away");
}

#[test]
fn a_query_whose_client_disconnects_stops_and_frees_its_slot() {
    let dir = tempfile::tempdir().unwrap();
    let (_edge, port) = idle_edge(dir.path(), &["--query.max-concurrency", "1", "--query.max-samples", "4000000000"]);
    let base = format!("http://127.0.0.1:{port}");
    let heavy = "/api/v1/query_range?query=quantile_over_time(0.5,vector(time())%5B7d:1s%5D)&start=0&end=10000&step=1";
    // It runs long: past a 2 s timeout, rather than being refused up front.
    let c = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let text = c.get(format!("{base}{heavy}&timeout=2s")).send().unwrap().text().unwrap_or_default();
    let head: String = text.chars().take(300).collect();
    assert!(text.contains("\"errorType\":\"timeout\""), "the heavy query did not run long: {head}");
    // Its client goes away half a second in: the only query slot is free soon after.
    let s = raw_request(&format!("127.0.0.1:{port}"), &format!("GET {heavy} HTTP/1.1\r\nHost: x\r\n\r\n"));
    std::thread::sleep(Duration::from_millis(500));
    drop(s);
    let began = Instant::now();
    let r = c.get(format!("{base}/api/v1/query?query=1&timeout=20s")).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(began.elapsed() < Duration::from_secs(5), "the abandoned query held the slot for {:?}", began.elapsed());
}
