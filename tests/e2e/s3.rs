//! The archive on a real S3-protocol server (moto's, from PyPI) with faults injected
//! between Strata and it by a proxy: answers of 500, connections dropped half-way through
//! an upload, slow answers. An import through the faults, then `inspect` and a global
//! reading the bucket through them, must find every block once, whole, and answer as the
//! same archive on a local folder does; an archiver writing through them must write every
//! range once.

use crate::common::*;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// moto's S3 server on a free port, with one bucket.
struct Moto {
    proc: Proc,
    port: u16,
}

fn moto(dir: &std::path::Path) -> Option<Moto> {
    let has = std::process::Command::new("python3").args(["-c", "import moto.server"]).output();
    if !has.map(|o| o.status.success()).unwrap_or(false) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true")
                && std::env::var("STRATA_SKIP_PROMETHEUS").as_deref() == Ok("1"),
            "python3 with moto[server] is needed (pip install 'moto[server]'); the README's test command installs it"
        );
        report_not_run("s3", "moto not installed and STRATA_SKIP_PROMETHEUS=1");
        return None;
    }
    let port = free_port();
    let args: Vec<String> =
        ["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()].map(String::from).to_vec();
    let proc = Proc::start("python3", &args, dir, "moto");
    let started = Instant::now();
    loop {
        let made = client().put(format!("http://127.0.0.1:{port}/archive")).send();
        if made.is_ok_and(|r| r.status().is_success()) {
            return Some(Moto { proc, port });
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "moto did not start: see {}",
            dir.join("moto.log").display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A proxy in front of `upstream` that spoils some requests: every `every`-th answers
/// 500, the one after it has its connection dropped after half its body, the one after
/// that waits 300 ms before it is forwarded. Counts what it spoiled.
struct FaultyProxy {
    port: u16,
    spoiled: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl FaultyProxy {
    fn start(upstream: u16, every: usize) -> FaultyProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (spoiled, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (count, s, st) = (Arc::new(AtomicUsize::new(0)), spoiled.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (count, s) = (count.clone(), s.clone());
                std::thread::spawn(move || serve(conn, upstream, every, &count, &s));
            }
        });
        FaultyProxy { port, spoiled, stop }
    }
}

impl Drop for FaultyProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// One request: its head and its body (by `Content-Length`), or `None` at the end.
fn read_request(conn: &mut TcpStream) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
        if head.len() > 64 << 10 {
            return None;
        }
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let length = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).ok()?;
    Some((head, body))
}

fn serve(mut conn: TcpStream, upstream: u16, every: usize, count: &AtomicUsize, spoiled: &AtomicUsize) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    while let Some((head, body)) = read_request(&mut conn) {
        let n = count.fetch_add(1, Ordering::Relaxed) + 1;
        match n % every {
            0 => {
                spoiled.fetch_add(1, Ordering::Relaxed);
                let msg = "<Error><Code>InternalError</Code><Message>injected</Message></Error>";
                // An answer to HEAD has no body (RFC 9110 9.3.2): bytes after its head would be
                // read by the client as the start of the next answer on this connection.
                let body = if head.starts_with(b"HEAD ") { "" } else { msg };
                let _ = write!(
                    conn,
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{body}",
                    msg.len()
                );
                continue;
            }
            1 if body.len() > 2 => {
                // Dropped half-way: upstream gets half a body and the connection closes.
                spoiled.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)) {
                    let _ = up.write_all(&head);
                    let _ = up.write_all(&body[..body.len() / 2]);
                    let _ = up.shutdown(Shutdown::Both);
                }
                let _ = conn.shutdown(Shutdown::Both);
                return;
            }
            2 => {
                spoiled.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(300));
            }
            _ => {}
        }
        // One request per upstream connection, its answer read whole (moto closes).
        let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)) else { return };
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines: Vec<&str> =
            text.split("\r\n").filter(|l| !l.to_ascii_lowercase().starts_with("connection:")).collect();
        lines.retain(|l| !l.is_empty());
        let head = format!("{}\r\nConnection: close\r\n\r\n", lines.join("\r\n"));
        if up.write_all(head.as_bytes()).is_err() || up.write_all(&body).is_err() {
            return;
        }
        let mut answer = Vec::new();
        if up.read_to_end(&mut answer).is_err() {
            return;
        }
        if conn.write_all(&answer).is_err() {
            return;
        }
        // moto answers with `Connection: close`: the client opens a new connection.
        let _ = conn.shutdown(Shutdown::Both);
        return;
    }
}

fn s3_env(port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")),
        ("AWS_ALLOW_HTTP", "true".into()),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false".into()),
    ]
}

fn strata(args: &[&str], env: &[(&'static str, String)]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// An OpenMetrics file of four GPUs over five hours, 15 s apart, with NaN and staleness.
fn openmetrics(path: &std::path::Path, t0: i64) -> usize {
    let mut text = String::from("# TYPE gpu_temp gauge\n");
    let mut n = 0;
    for gpu in 0..4 {
        for k in 0..1200i64 {
            let v = match k % 97 {
                13 => "NaN".to_string(),
                _ => format!("{:?}", 30.0 + ((k * 7 + gpu) % 53) as f64 / 4.0),
            };
            text.push_str(&format!("gpu_temp{{gpu=\"{gpu}\"}} {v} {}\n", t0 + k * 15));
            n += 1;
        }
    }
    text.push_str("# EOF\n");
    std::fs::write(path, text).unwrap();
    n
}

#[test]
fn an_archive_on_s3_survives_faults_whole_and_answers_as_a_local_one() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut moto) = moto(dir.path()) else { return };
    let proxy = FaultyProxy::start(moto.port, 5);
    let env = s3_env(proxy.port);
    let t0 = 1_764_547_200; // 2025-12-01T00:00:00Z, seconds
    let om = dir.path().join("fleet.om");
    let samples = openmetrics(&om, t0);
    let om = om.display().to_string();
    let local = dir.path().join("local").display().to_string();
    let url = "s3://archive/fleet";
    for (target, e) in [(local.as_str(), &Vec::new()), (url, &env)] {
        let (ok, out) = strata(&["archive", "import", "--openmetrics", &om, "--archive", target, "--block", "1h"], e);
        assert!(ok, "import into {target}: {out}");
        assert!(out.contains(&format!("imported {samples} samples into 5 raw blocks")), "{out}");
    }
    assert!(proxy.spoiled.load(Ordering::Relaxed) >= 3, "the proxy spoiled no request");
    // Every block once, every file whole (inspect reads each against its checksum).
    let (ok, listing) = strata(&["archive", "inspect", url], &env);
    assert!(ok, "{listing}");
    let blocks: Vec<&str> = listing.lines().filter(|l| l.starts_with("raw ")).collect();
    assert_eq!(blocks.len(), 5, "{listing}");
    assert!(!listing.contains("DAMAGED"), "{listing}");

    // Two globals, one on each archive: the same answers, through the faults.
    let global = |archive: &str, env: &[(&'static str, String)], name: &str| {
        let http = format!("127.0.0.1:{}", free_port());
        let args = ["global", "--http-listen", &http, "--archive", archive, "--archive.read-only"];
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut p = Proc::strata_with_env(&args, &env, dir.path(), name);
        wait_ready(&format!("http://{http}/-/ready"), &mut p, Duration::from_secs(30));
        (p, format!("http://{http}"))
    };
    let (mut on_disk, disk_base) = global(&local, &[], "global-local");
    let (mut on_s3, s3_base) = global(url, &env, "global-s3");
    let (start, end) = (t0 + 600, t0 + 5 * 3600 - 600);
    for q in ["gpu_temp", "avg_over_time(gpu_temp[7m])", "count_over_time(gpu_temp[1h])"] {
        let path =
            format!("/api/v1/query_range?query={}&start={start}&end={end}&step=300", crate::hostile_queries::encode(q));
        let want = api_data(&format!("{disk_base}{path}"));
        assert!(!want["result"].as_array().unwrap().is_empty(), "{q}: {want}");
        let started = Instant::now();
        let patient = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
        let got = patient.get(format!("{s3_base}{path}")).send();
        let log = std::fs::read_to_string(dir.path().join("global-s3.log")).unwrap_or_default();
        let got = got.unwrap_or_else(|e| panic!("{q}: {e} after {:?}\n{log}", started.elapsed()));
        let got: serde_json::Value = serde_json::from_str(&got.text().unwrap()).unwrap();
        // (A block the retries could not read is left out with a warning: shown here.)
        assert_eq!(got["data"], want, "{q}: warnings {:?}\n{log}", got.get("warnings"));
    }
    on_s3.terminate();
    on_disk.terminate();
    drop(proxy);
    moto.proc.terminate();
}

#[test]
fn an_archiver_writes_every_range_once_through_s3_faults() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut moto) = moto(dir.path()) else { return };
    let proxy = FaultyProxy::start(moto.port, 7);
    let env = s3_env(proxy.port);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    crate::archive::global::archive_edges_once(dir.path(), "s3://archive/live", &env);
    assert!(proxy.spoiled.load(Ordering::Relaxed) >= 3, "the proxy spoiled no request");
    drop(proxy);
    moto.proc.terminate();
}
