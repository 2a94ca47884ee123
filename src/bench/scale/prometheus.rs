//! The anchor for `bench scale`: Prometheus 2.42 fed the same simulated fleet for the same
//! simulated time through its remote-write receiver, in time order, and its peak resident
//! memory read from `/proc`. Requests carry 2,000 series × 60 scrapes (about as large as
//! Prometheus' own remote-write batches, far smaller than its head), so the request bodies
//! do not weigh on its memory.

use super::fleet::SimFleet;
use super::peak_rss_mb_of;
use crate::bench::vs_prometheus::{free_port, Guard};
use anyhow::Context;
use prost::Message;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use strata_proto::prometheus::{Label, Sample, TimeSeries, WriteRequest};

const SERIES_PER_WRITE: usize = 2_000;
const STEPS_PER_WRITE: usize = 60;

/// Returns Prometheus' peak RSS in MB.
pub fn run(series: usize, hours: f64, interval_s: u64, prometheus: &str) -> anyhow::Result<f64> {
    let tmp = tempfile::tempdir()?;
    let cfg = tmp.path().join("prometheus.yml");
    std::fs::write(&cfg, "global: {}\n")?;
    let port = free_port()?;
    let child = Command::new(prometheus)
        .args([
            format!("--config.file={}", cfg.display()),
            format!("--storage.tsdb.path={}", tmp.path().join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--web.enable-remote-write-receiver".to_string(),
            "--storage.tsdb.retention.time=100y".to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {prometheus} (apt-get install -y prometheus)"))?;
    let pid = child.id().to_string();
    let _guard = Guard(child);
    let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let base = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    while !client.get(format!("{base}/-/ready")).send().map(|r| r.status().is_success()).unwrap_or(false) {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(60), "Prometheus not ready within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut fleet = SimFleet::new(series);
    let labels = |s: usize| -> Vec<Label> {
        SimFleet::labels(s).iter().map(|x| Label { name: x.name.to_string(), value: x.value.to_string() }).collect()
    };
    let (start, steps, step_ms) = super::sim_window(hours, interval_s);
    println!("  prometheus: the same {series} series for {hours} simulated hours through its remote-write receiver");
    let ingest_started = Instant::now();
    let mut k = 0usize;
    while k < steps {
        let n = STEPS_PER_WRITE.min(steps - k);
        // values[series][step] for this round.
        let mut values: Vec<Vec<(i64, f64)>> = vec![Vec::with_capacity(n); series];
        for j in 0..n {
            fleet.step();
            let t = start + (k + j) as i64 * step_ms + ((k + j) % 7) as i64;
            for (s, &v) in fleet.values.iter().enumerate() {
                values[s].push((t, v));
            }
        }
        for group in (0..series).collect::<Vec<_>>().chunks(SERIES_PER_WRITE) {
            let timeseries = group
                .iter()
                .map(|&s| TimeSeries {
                    labels: labels(s),
                    samples: values[s].iter().map(|&(timestamp, value)| Sample { value, timestamp }).collect(),
                    exemplars: vec![],
                })
                .collect();
            let body = snap::raw::Encoder::new()
                .compress_vec(&WriteRequest { timeseries, ..Default::default() }.encode_to_vec())?;
            let resp = client
                .post(format!("{base}/api/v1/write"))
                .header("Content-Encoding", "snappy")
                .header("Content-Type", "application/x-protobuf")
                .header("X-Prometheus-Remote-Write-Version", "0.1.0")
                .body(body)
                .send()?;
            anyhow::ensure!(
                resp.status().is_success(),
                "Prometheus refused a write: {}",
                resp.text().unwrap_or_default()
            );
        }
        k += n;
    }
    let secs = ingest_started.elapsed().as_secs_f64();
    let page = client.get(format!("{base}/metrics")).send()?.text()?;
    let appended: f64 = page
        .lines()
        .find(|l| l.starts_with("prometheus_tsdb_head_samples_appended_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0);
    let peak = peak_rss_mb_of(&pid);
    println!(
        "  prometheus: {appended:.0} samples appended in {secs:.1} s ({:.0} k samples/s through HTTP), peak RSS {peak:.0} MB",
        appended / secs / 1e3
    );
    Ok(peak)
}
