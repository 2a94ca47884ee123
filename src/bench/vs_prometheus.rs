//! The edge and Prometheus 2.42 scraping the same simulated fleet in one run. Each runs as
//! its own process; CPU time (from both being ready to the end) and peak resident memory
//! come from `/proc/<pid>`, samples from each one's own appended-samples counter.

use anyhow::Context;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub(super) struct ProcStats {
    pub(super) cpu_secs: f64,
    pub(super) peak_rss_mb: f64,
}

pub(super) fn proc_stats(pid: u32) -> anyhow::Result<ProcStats> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // fields after the command name, which is in parentheses and may hold spaces
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = 100.0; // USER_HZ on Linux
    let utime: f64 = f.get(11).and_then(|s| s.parse().ok()).unwrap_or(0.0);
    let stime: f64 = f.get(12).and_then(|s| s.parse().ok()).unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let hwm_kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    Ok(ProcStats { cpu_secs: (utime + stime) / ticks, peak_rss_mb: hwm_kb / 1024.0 })
}

pub(super) fn counter_sum(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(name) && (l[name.len()..].starts_with(' ') || l[name.len()..].starts_with('{')))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(super) struct Guard(pub(super) Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(super) async fn get(url: &str) -> anyhow::Result<String> {
    Ok(reqwest::get(url).await?.text().await?)
}

/// The simulated fleet (`nodes` nodes of 8 GPUs) served in this process on a free port
/// until the returned sender says stop; its port.
pub(super) async fn serve_fleet(nodes: usize) -> anyhow::Result<(u16, tokio::sync::watch::Sender<bool>)> {
    let port = free_port()?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(strata_simulator::serve(
        listener,
        strata_simulator::Fleet::new(1, nodes, 8),
        0,
        Default::default(),
        async move {
            let _ = stop_rx.changed().await;
        },
    ));
    Ok((port, stop_tx))
}

/// `static_configs` entries for every node of the fleet on `port` (one target per node).
pub(super) fn fleet_targets(port: u16, nodes: usize) -> String {
    (0..nodes)
        .map(|i| {
            format!("      - targets: ['127.0.0.1:{port}']\n        labels: {{__metrics_path__: /node/{i}/metrics, node: '{i}'}}\n")
        })
        .collect()
}

/// This binary as a regional with data under `dir`, on `127.0.0.1` ports `http` and
/// `grpc`; killed on drop.
pub(super) fn spawn_regional(dir: &std::path::Path, http: u16, grpc: u16) -> anyhow::Result<Guard> {
    let cfg = dir.join("regional.yml");
    std::fs::write(&cfg, "strata:\n  retention: 30d\n")?;
    let child = Command::new(std::env::current_exe()?)
        .args(["regional", "--config", &cfg.display().to_string()])
        .args(["--data", &dir.join("regional").display().to_string()])
        .args(["--http-listen", &format!("127.0.0.1:{http}"), "--grpc-listen", &format!("127.0.0.1:{grpc}")])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the regional")?;
    Ok(Guard(child))
}

/// This binary as an edge on `127.0.0.1:port` (warnings only in its log), killed on drop.
pub(super) fn spawn_edge(
    cfg: &std::path::Path,
    data: &std::path::Path,
    port: u16,
    stderr: Stdio,
) -> anyhow::Result<Guard> {
    let child = Command::new(std::env::current_exe()?)
        .args(["edge", "--config", &cfg.display().to_string(), "--data", &data.display().to_string()])
        .args(["--http-listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .context("starting the edge")?;
    Ok(Guard(child))
}

/// The Prometheus binary `bin` with config `cfg` and data in `data`, on `127.0.0.1:port`,
/// with `extra` flags; killed on drop.
pub(super) fn spawn_prometheus(
    bin: &str,
    cfg: &std::path::Path,
    data: &std::path::Path,
    port: u16,
    extra: &[&str],
) -> anyhow::Result<Guard> {
    let child = Command::new(bin)
        .args([
            format!("--config.file={}", cfg.display()),
            format!("--storage.tsdb.path={}", data.display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {bin} (apt-get install -y prometheus)"))?;
    Ok(Guard(child))
}

pub(super) async fn wait_ready(url: &str) -> anyhow::Result<()> {
    for _ in 0..300 {
        if reqwest::get(url).await.map(|r| r.status().is_success()).unwrap_or(false) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("{url} did not become ready")
}

pub async fn run(nodes: usize, interval: u64, seconds: u64, prometheus: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (sim_port, stop_tx) = serve_fleet(nodes).await?;
    let targets = fleet_targets(sim_port, nodes);
    let cfg = format!("global:\n  scrape_interval: {interval}s\n  scrape_timeout: {interval}s\nscrape_configs:\n  - job_name: dcgm\n    static_configs:\n{targets}");
    let cfg_path = dir.path().join("scrape.yml");
    std::fs::write(&cfg_path, &cfg)?;
    let (edge_port, prom_port) = (free_port()?, free_port()?);
    let edge = spawn_edge(&cfg_path, &dir.path().join("edge"), edge_port, Stdio::null())?;
    let prom = spawn_prometheus(prometheus, &cfg_path, &dir.path().join("prom"), prom_port, &[])?;
    wait_ready(&format!("http://127.0.0.1:{edge_port}/-/ready")).await?;
    wait_ready(&format!("http://127.0.0.1:{prom_port}/-/ready")).await?;
    println!(
        "bench vs-prometheus: {nodes} nodes x 8 GPUs (~{} series) scraped every {interval} s by both, for {seconds} s",
        nodes * 8 * 25
    );
    // From ready on: start-up is not a cost per sample.
    let (e0, p0) = (proc_stats(edge.0.id())?, proc_stats(prom.0.id())?);
    let edge_before = counter_sum(
        &get(&format!("http://127.0.0.1:{edge_port}/metrics")).await?,
        "strata_head_samples_appended_total",
    );
    let prom_before = counter_sum(
        &get(&format!("http://127.0.0.1:{prom_port}/metrics")).await?,
        "prometheus_tsdb_head_samples_appended_total",
    );
    tokio::time::sleep(Duration::from_secs(seconds)).await;

    let edge_page = get(&format!("http://127.0.0.1:{edge_port}/metrics")).await?;
    let prom_page = get(&format!("http://127.0.0.1:{prom_port}/metrics")).await?;
    let edge_samples = counter_sum(&edge_page, "strata_head_samples_appended_total") - edge_before;
    let prom_samples = counter_sum(&prom_page, "prometheus_tsdb_head_samples_appended_total") - prom_before;
    let mut es = proc_stats(edge.0.id())?;
    let mut ps = proc_stats(prom.0.id())?;
    es.cpu_secs -= e0.cpu_secs;
    ps.cpu_secs -= p0.cpu_secs;
    let per_m = |x: f64, n: f64| x / (n / 1e6).max(1e-9);
    println!(
        "  {:<12} {:>12} {:>10} {:>16} {:>13} {:>18}",
        "", "samples", "CPU s", "CPU s / M samp.", "peak RSS MB", "peak MB / M samp."
    );
    for (name, s, st) in [("prometheus", prom_samples, &ps), ("strata edge", edge_samples, &es)] {
        println!(
            "  {:<12} {:>12.0} {:>10.2} {:>16.3} {:>13.1} {:>18.1}",
            name,
            s,
            st.cpu_secs,
            per_m(st.cpu_secs, s),
            st.peak_rss_mb,
            per_m(st.peak_rss_mb, s)
        );
    }
    let cpu_ratio = per_m(es.cpu_secs, edge_samples) / per_m(ps.cpu_secs, prom_samples);
    let mem_ratio = per_m(es.peak_rss_mb, edge_samples) / per_m(ps.peak_rss_mb, prom_samples);
    println!("  strata / prometheus: CPU per sample {cpu_ratio:.2} (goal <= 0.33), peak memory per sample {mem_ratio:.2} (goal <= 0.5)");
    let _ = stop_tx.send(true);
    drop(edge);
    drop(prom);
    Ok(())
}
