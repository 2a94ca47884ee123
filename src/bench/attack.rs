//! `strata bench attack`: the attacks of issue 8, run together against a live edge that
//! scrapes a simulated fleet and receives remote write all the while. Prints, per attack,
//! what the edge answered, and the edge's peak resident memory before and under attack
//! (from `/proc/<pid>/status`), as the README's "What a hostile client gets" table.

use super::vs_prometheus::{free_port, proc_stats, spawn_edge, wait_ready};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Minimal protobuf writer for remote-write bodies (the binary carries no protobuf crate).
fn field(out: &mut Vec<u8>, num: u64, wire: u64, payload: &[u8]) {
    varint(out, num << 3 | wire);
    if wire == 2 {
        varint(out, payload.len() as u64);
    }
    out.extend_from_slice(payload);
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// One series to write: label pairs and (timestamp, value) samples.
type Series<'a> = (Vec<(&'a str, String)>, Vec<(i64, f64)>);

/// A snappy-compressed `WriteRequest` of one series per `(labels, samples)`.
fn write_body(series: &[Series]) -> Vec<u8> {
    let mut req = Vec::new();
    for (labels, samples) in series {
        let mut ts = Vec::new();
        for (n, v) in labels {
            let mut l = Vec::new();
            field(&mut l, 1, 2, n.as_bytes());
            field(&mut l, 2, 2, v.as_bytes());
            field(&mut ts, 1, 2, &l);
        }
        for (t, v) in samples {
            let mut s = Vec::new();
            field(&mut s, 1, 1, &v.to_le_bytes());
            let mut tv = Vec::new();
            varint(&mut tv, *t as u64);
            field(&mut s, 2, 0, &tv);
            field(&mut ts, 2, 2, &s);
        }
        field(&mut req, 1, 2, &ts);
    }
    snap::raw::Encoder::new().compress_vec(&req).unwrap_or_default()
}

fn now_ms() -> i64 {
    strata_model::time::now_ms()
}

/// (status, first line of the body), or the transport error.
fn answer(r: reqwest::Result<reqwest::blocking::Response>) -> String {
    match r {
        Ok(r) => {
            let code = r.status().as_u16();
            let text = r.text().unwrap_or_default();
            let msg: String = text.lines().next().unwrap_or("").chars().take(110).collect();
            format!("{code} {msg}")
        }
        Err(e) => format!("no answer: {e}"),
    }
}

pub async fn run(nodes: usize, seconds: u64) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let sim_port = free_port()?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", sim_port)).await?;
    tokio::spawn(strata_simulator::serve(
        listener,
        strata_simulator::Fleet::new(1, nodes, 8),
        0,
        Default::default(),
        std::future::pending(),
    ));
    // A hostile target: a gzip bomb (1 GiB of zeros) and microsecond timestamps.
    let bomb = {
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![b'0'; 1 << 20];
        for _ in 0..1024 {
            z.write_all(&zeros)?;
        }
        Arc::new(z.finish()?)
    };
    let evil_port = free_port()?;
    let evil = axum::Router::new()
        .route(
            "/bomb",
            axum::routing::get(move || {
                let b = bomb.clone();
                async move { ([("content-encoding", "gzip")], b.as_ref().clone()) }
            }),
        )
        .route("/micro", axum::routing::get(|| async { format!("m 1 {}\n", now_ms() * 1000) }));
    let evil_listener = tokio::net::TcpListener::bind(("127.0.0.1", evil_port)).await?;
    tokio::spawn(async move { axum::serve(evil_listener, evil).await });

    let mut targets = String::new();
    for i in 0..nodes {
        targets.push_str(&format!("      - targets: ['127.0.0.1:{sim_port}']\n        labels: {{__metrics_path__: /node/{i}/metrics, node: '{i}'}}\n"));
    }
    let cfg = format!("global:\n  scrape_interval: 5s\nscrape_configs:\n  - job_name: dcgm\n    static_configs:\n{targets}  - job_name: bomb\n    metrics_path: /bomb\n    static_configs:\n      - targets: ['127.0.0.1:{evil_port}']\n  - job_name: micro\n    metrics_path: /micro\n    honor_timestamps: true\n    static_configs:\n      - targets: ['127.0.0.1:{evil_port}']\n");
    let cfg_path = dir.path().join("edge.yml");
    std::fs::write(&cfg_path, &cfg)?;
    let edge_port = free_port()?;
    let log = std::fs::File::create(dir.path().join("edge.log"))?;
    let edge = spawn_edge(&cfg_path, &dir.path().join("edge"), edge_port, Stdio::from(log))?;
    let base = format!("http://127.0.0.1:{edge_port}");
    wait_ready(&format!("{base}/-/ready")).await?;
    let pid = edge.0.id();
    println!("bench attack: an edge scraping {nodes} nodes x 8 GPUs every 5 s, with remote write, for {seconds} s");
    // Normal load: remote write of 200 series every 100 ms, the whole run.
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let load = {
        let (stop, written, url) = (stop.clone(), written.clone(), format!("{base}/api/v1/write"));
        std::thread::spawn(move || {
            let c = reqwest::blocking::Client::new();
            while !stop.load(Ordering::Relaxed) {
                let t = now_ms();
                let series: Vec<_> = (0..200)
                    .map(|i| (vec![("__name__", "rw_load".to_string()), ("i", i.to_string())], vec![(t, 1.0)]))
                    .collect();
                if c.post(&url).body(write_body(&series)).send().map(|r| r.status().as_u16() == 204).unwrap_or(false) {
                    written.fetch_add(200, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(seconds.min(20))).await;
    let before = proc_stats(pid)?.peak_rss_mb;

    type Attack = (&'static str, Box<dyn FnOnce(&str) -> String + Send>);
    let q = |query: &'static str| -> Box<dyn FnOnce(&str) -> String + Send> {
        Box::new(move |base: &str| {
            let c = reqwest::blocking::Client::builder().timeout(Duration::from_secs(200)).build().unwrap_or_default();
            answer(c.get(format!("{base}/api/v1/query")).query(&[("query", query)]).send())
        })
    };
    let post = |path: &'static str, body: Vec<u8>| -> Box<dyn FnOnce(&str) -> String + Send> {
        Box::new(move |base: &str| {
            let c = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap_or_default();
            answer(c.post(format!("{base}{path}")).body(body).send())
        })
    };
    let deep = format!("{}1{}", "(".repeat(20_000), ")".repeat(20_000));
    let empty_series: Vec<u8> = std::iter::repeat_n([0x0a, 0x00], 8_000_000).flatten().collect();
    let attacks: Vec<Attack> = vec![
        ("subquery of 3 trillion steps: `max_over_time(vector(1)[100y:1ms])`", q("max_over_time(vector(1)[100y:1ms])")),
        ("range out of range: `up[300y]`", q("up[300y]")),
        ("offset that overflows: `up offset Inf`", q("up offset Inf")),
        (
            "20,000 nested parentheses",
            Box::new(move |base: &str| {
                let c = reqwest::blocking::Client::new();
                answer(c.post(format!("{base}/api/v1/query")).form(&[("query", deep.as_str())]).send())
            }),
        ),
        (
            "50 queries at once, each a subquery of 86,400 steps (20 run at a time, the rest queue)",
            Box::new(|base: &str| {
                let hs: Vec<_> = (0..50)
                    .map(|_| {
                        let url = format!(
                            "{base}/api/v1/query?query=quantile_over_time(0.5,vector(time())%5B1d:1s%5D)&timeout=20s"
                        );
                        std::thread::spawn(move || {
                            answer(
                                reqwest::blocking::Client::builder()
                                    .timeout(Duration::from_secs(60))
                                    .build()
                                    .unwrap_or_default()
                                    .get(url)
                                    .send(),
                            )
                        })
                    })
                    .collect();
                let mut codes: std::collections::BTreeMap<String, usize> = Default::default();
                for h in hs {
                    let a = h.join().unwrap_or_default();
                    *codes.entry(a.split(' ').next().unwrap_or("?").to_string()).or_default() += 1;
                }
                codes.iter().map(|(c, n)| format!("{n}x {c}")).collect::<Vec<_>>().join(", ")
            }),
        ),
        (
            "remote write: a sample stamped in 2100",
            post("/api/v1/write", write_body(&[(vec![("__name__", "future".into())], vec![(4_102_444_800_000, 1.0)])])),
        ),
        (
            "remote write: 8 M empty series (16 MB that decode to 640 MB)",
            post("/api/v1/write", snap::raw::Encoder::new().compress_vec(&empty_series).unwrap_or_default()),
        ),
        ("remote write: garbage", post("/api/v1/write", b"\xff\x00garbage".to_vec())),
        (
            "remote write: a 40 MB body (limit 32 MB)",
            Box::new(|base: &str| {
                let c =
                    reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap_or_default();
                let sent = answer(c.post(format!("{base}/api/v1/write")).body(vec![0u8; 40 << 20]).send());
                // The edge answers 413 as soon as the limit is passed and closes the connection,
                // so this client may see the close before the answer: the counter says what it was.
                let page = c.get(format!("{base}/metrics")).send().and_then(|r| r.text()).unwrap_or_default();
                let n413 = page
                    .lines()
                    .find(|l| l.starts_with("strata_remote_write_requests_total{code=\"413\"}"))
                    .unwrap_or("no 413 counted");
                format!("{}; edge: {n413}", sent.chars().take(40).collect::<String>())
            }),
        ),
        ("POST /-/reload without --web.enable-lifecycle", post("/-/reload", Vec::new())),
        (
            "600 slow-header connections (slowloris), then /-/ready",
            Box::new(|base: &str| {
                let addr = base.trim_start_matches("http://").to_string();
                let conns: Vec<_> = (0..600)
                    .filter_map(|_| {
                        let mut s = TcpStream::connect(&addr).ok()?;
                        s.write_all(b"GET /-/ready HTTP/1.1\r\nHost: x\r\n").ok()?;
                        Some(s)
                    })
                    .collect();
                std::thread::sleep(Duration::from_secs(12));
                let closed = conns
                    .into_iter()
                    .filter(|s| {
                        let mut s = s;
                        let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
                        matches!(s.read(&mut [0u8; 1]), Ok(0))
                    })
                    .count();
                let ready = answer(reqwest::blocking::Client::new().get(format!("{base}/-/ready")).send());
                format!("{closed} of 600 closed by the 10 s header timeout (512 accepted at most, the rest wait in the backlog); then /-/ready: {ready}")
            }),
        ),
    ];
    let began = Instant::now();
    let handles: Vec<_> = attacks
        .into_iter()
        .map(|(name, f)| {
            let base = base.clone();
            std::thread::spawn(move || (name, f(&base)))
        })
        .collect();
    // Peak memory is the kernel's high-water mark; sample it while the attacks run too.
    let mut results = Vec::new();
    for h in handles {
        results.push(h.join().unwrap_or(("an attack thread", "panicked".into())));
    }
    let took = began.elapsed();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let log = std::fs::read_to_string(dir.path().join("edge.log")).unwrap_or_default();
    let scrape = |job: &str| {
        log.lines()
            .find(|l| l.contains("scrape failed") && l.contains(job))
            .map(|l| l.split("error=").nth(1).unwrap_or(l).chars().take(110).collect::<String>())
            .unwrap_or_else(|| "no scrape error logged".into())
    };
    results.push(("scrape target: a gzip bomb (1 GiB of zeros, 1 MB on the wire)", scrape("/bomb")));
    results.push(("scrape target: timestamps in microseconds", scrape("/micro")));
    stop.store(true, Ordering::Relaxed);
    let _ = load.join();
    let stats = proc_stats(pid)?;
    let alive = reqwest::get(format!("{base}/-/ready")).await.map(|r| r.status().as_u16()).unwrap_or(0);
    println!("\n| attack | what the edge answered |\n|---|---|");
    for (name, r) in &results {
        println!("| {name} | {} |", r.replace('|', "\\|"));
    }
    println!(
        "\nattacks ran together for {:.1} s; the edge answered /-/ready {alive} afterwards; remote-write load stored {} samples meanwhile",
        took.as_secs_f64(),
        written.load(Ordering::Relaxed)
    );
    println!(
        "edge peak RSS: {before:.0} MB before the attacks, {:.0} MB with them (CPU {:.1} s)",
        stats.peak_rss_mb, stats.cpu_secs
    );
    Ok(())
}
