//! The fleet day remote-written into an empty edge, as a user backfilling through remote
//! write would: ingest rate and the edge's CPU per million samples, then what the data
//! directory holds once the writes stop (sampled every 10 s for two minutes, and split into
//! blocks, WAL and head checkpoint), then the time to ready after a clean stop and after a
//! SIGKILL. VictoriaMetrics (Debian's `victoria-metrics`, when installed) gets the same
//! requests in the same run, and its data directory is measured the same way.

use super::vs_prometheus::{free_port, proc_stats, wait_ready, Guard};
use anyhow::Context;
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use strata_proto::prometheus::{Label, Sample as PbSample, TimeSeries, WriteRequest};

/// Minutes of the day per request: every series' samples in that slice.
const SLICE_MINUTES: i64 = 10;

/// Bytes of every file under `p`.
fn tree_bytes(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else { return 0 };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => tree_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The day as remote-write bodies in time order, and its sample count.
fn bodies(file: &Path) -> anyhow::Result<(Vec<Vec<u8>>, u64)> {
    let dir = tempfile::tempdir()?;
    let opts = strata_tsdb::TsdbOptions { retention: Duration::from_secs(100 * 86400), ..Default::default() };
    let db = strata_tsdb::Tsdb::open(dir.path(), opts)?;
    let f = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(file)?);
    let st = strata_ingest::import::import_openmetrics(&db, f, |_| {})?;
    let all = strata_model::matcher::Matcher::new(strata_model::matcher::MatchOp::Regex, "__name__", ".+")?;
    let mut series = Vec::new();
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    for (s, chunks) in db.head().select(&[all], i64::MIN, i64::MAX) {
        let mut v = Vec::new();
        strata_chunk::Chunk::decode_range(&chunks, i64::MIN, i64::MAX, &mut v)?;
        lo = lo.min(v.first().map_or(i64::MAX, |x| x.t));
        hi = hi.max(v.last().map_or(i64::MIN, |x| x.t));
        let labels: Vec<Label> =
            s.labels.iter().map(|l| Label { name: l.name.to_string(), value: l.value.to_string() }).collect();
        series.push((labels, v));
    }
    let slice = SLICE_MINUTES * 60_000;
    let mut out = Vec::new();
    let mut pos = vec![0usize; series.len()];
    let mut t = lo.div_euclid(slice) * slice;
    while t <= hi {
        let end = t + slice;
        let mut timeseries = Vec::with_capacity(series.len());
        for (k, (labels, v)) in series.iter().enumerate() {
            let from = pos[k];
            while pos[k] < v.len() && v[pos[k]].t < end {
                pos[k] += 1;
            }
            if pos[k] > from {
                let samples = v[from..pos[k]].iter().map(|s| PbSample { value: s.v, timestamp: s.t }).collect();
                timeseries.push(TimeSeries { labels: labels.clone(), samples, exemplars: vec![] });
            }
        }
        let req = WriteRequest { timeseries, ..Default::default() };
        out.push(snap::raw::Encoder::new().compress_vec(&req.encode_to_vec())?);
        t = end;
    }
    Ok((out, st.samples))
}

/// Posts every body in order; returns the seconds it took.
async fn send_all(url: &str, bodies: &[Vec<u8>]) -> anyhow::Result<f64> {
    let client = reqwest::Client::new();
    let started = Instant::now();
    for b in bodies {
        let r = client
            .post(url)
            .header("Content-Encoding", "snappy")
            .header("Content-Type", "application/x-protobuf")
            .header("X-Prometheus-Remote-Write-Version", "0.1.0")
            .body(b.clone())
            .send()
            .await?;
        if !r.status().is_success() {
            anyhow::bail!("{url} answered {}: {}", r.status(), r.text().await.unwrap_or_default());
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Samples the directory's size every 10 s for two minutes; returns the last.
async fn watch(what: &str, dir: &Path, samples: u64) -> u64 {
    let mut last = 0;
    for i in 0..=12 {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        last = tree_bytes(dir);
        if i % 3 == 0 {
            println!(
                "    {what}, {:>3} s after the last write: {:.3} bytes/sample",
                i * 10,
                last as f64 / samples as f64
            );
        }
    }
    last
}

async fn time_to_ready(edge_bin: &Path, cfg: &Path, data: &Path, port: u16) -> anyhow::Result<(f64, Guard)> {
    let started = Instant::now();
    let edge = spawn(edge_bin, cfg, data, port)?;
    wait_ready(&format!("http://127.0.0.1:{port}/-/ready")).await?;
    Ok((started.elapsed().as_secs_f64(), edge))
}

fn spawn(edge_bin: &Path, cfg: &Path, data: &Path, port: u16) -> anyhow::Result<Guard> {
    let child = Command::new(edge_bin)
        .args(["edge", "--config", &cfg.display().to_string(), "--data", &data.display().to_string()])
        .args(["--http-listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", edge_bin.display()))?;
    Ok(Guard(child))
}

fn terminate(g: &mut Guard) {
    let _ = Command::new("kill").arg("-TERM").arg(g.0.id().to_string()).status();
    let _ = g.0.wait();
}

pub async fn run(
    file: Option<PathBuf>,
    edge_bin: Option<PathBuf>,
    vm: bool,
    keep: Option<PathBuf>,
    ingest_only: bool,
) -> anyhow::Result<()> {
    let file = file.unwrap_or_else(|| super::fleet_day::fleet_day_cache().join("small/fleet.om"));
    if !file.exists() {
        anyhow::bail!(
            "the fleet-day data is absent: {} does not exist. Generate it with `python3 ../shared/bench/fleet_day.py prepare` or pass --file",
            file.display()
        );
    }
    let edge_bin = match edge_bin {
        Some(b) => b,
        None => std::env::current_exe()?,
    };
    println!("bench wal-day: {} remote-written in {SLICE_MINUTES}-minute requests", file.display());
    let f = file.clone();
    let (bodies, samples) = tokio::task::spawn_blocking(move || bodies(&f)).await??;
    let wire: usize = bodies.iter().map(Vec::len).sum();
    println!("  {samples} samples in {} requests ({:.2} MB on the wire)", bodies.len(), wire as f64 / 1e6);

    let dir = tempfile::tempdir()?;
    let dir = match &keep {
        Some(k) => {
            std::fs::create_dir_all(k)?;
            tempfile::Builder::new().prefix("wal-day").tempdir_in(k)?
        }
        None => dir,
    };
    let cfg = dir.path().join("edge.yml");
    std::fs::write(&cfg, "scrape_configs: []\nstrata:\n  retention: 3d\n")?;
    let data = dir.path().join("data");
    let port = free_port()?;
    let mut edge = spawn(&edge_bin, &cfg, &data, port)?;
    wait_ready(&format!("http://127.0.0.1:{port}/-/ready")).await?;
    let cpu0 = proc_stats(edge.0.id())?.cpu_secs;
    let secs = send_all(&format!("http://127.0.0.1:{port}/api/v1/write"), &bodies).await?;
    let cpu = proc_stats(edge.0.id())?.cpu_secs - cpu0;
    println!(
        "  strata ({}): {:.2} M samples/s written, {:.3} CPU s per million samples",
        edge_bin.display(),
        samples as f64 / secs / 1e6,
        cpu / (samples as f64 / 1e6)
    );
    if ingest_only {
        terminate(&mut edge);
        return Ok(());
    }
    let strata = watch("strata data directory", &data, samples).await;
    let part = |p: &str| tree_bytes(&data.join(p)) as f64 / samples as f64;
    let checkpoint = std::fs::metadata(data.join("head.checkpoint")).map_or(0, |m| m.len()) as f64 / samples as f64;
    println!(
        "  strata, two minutes after the last write: {:.3} bytes/sample (blocks {:.3}, WAL {:.3}, head checkpoint {:.3}; goal <= 1.3)",
        strata as f64 / samples as f64,
        part("blocks"),
        part("wal"),
        checkpoint
    );
    terminate(&mut edge);
    let (clean, mut edge) = time_to_ready(&edge_bin, &cfg, &data, port).await?;
    let _ = edge.0.kill();
    let _ = edge.0.wait();
    let (crash, mut edge) = time_to_ready(&edge_bin, &cfg, &data, port).await?;
    terminate(&mut edge);
    println!("  strata restart: {clean:.2} s to ready after a clean stop, {crash:.2} s after SIGKILL (goal <= 1 s)");

    if let Some(k) = &keep {
        println!("  the data directory is kept: {}", dir.keep().display());
        let _ = k;
        return Ok(());
    }
    if !vm {
        return Ok(());
    }
    let vm_dir = dir.path().join("victoria-metrics");
    let vm_port = free_port()?;
    let child = Command::new("victoria-metrics")
        .arg(format!("-storageDataPath={}", vm_dir.display()))
        .arg(format!("-httpListenAddr=127.0.0.1:{vm_port}"))
        .arg("-retentionPeriod=100y")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting victoria-metrics (apt-get install victoria-metrics)")?;
    let vm_proc = Guard(child);
    wait_ready(&format!("http://127.0.0.1:{vm_port}/health")).await?;
    let cpu0 = proc_stats(vm_proc.0.id())?.cpu_secs;
    let secs = send_all(&format!("http://127.0.0.1:{vm_port}/api/v1/write"), &bodies).await?;
    let cpu = proc_stats(vm_proc.0.id())?.cpu_secs - cpu0;
    println!(
        "  victoria-metrics, same run: {:.2} M samples/s written, {:.3} CPU s per million samples",
        samples as f64 / secs / 1e6,
        cpu / (samples as f64 / 1e6)
    );
    let _ = reqwest::get(format!("http://127.0.0.1:{vm_port}/internal/force_flush")).await;
    let vm_bytes = watch("victoria-metrics data directory", &vm_dir, samples).await;
    println!(
        "  victoria-metrics, two minutes after the last write: {:.3} bytes/sample (strata / victoria-metrics {:.2})",
        vm_bytes as f64 / samples as f64,
        strata as f64 / vm_bytes.max(1) as f64
    );
    Ok(())
}
