//! The edge and Prometheus 2.42 (`--web.enable-remote-write-receiver`) receiving the same
//! remote-write requests in one run: the simulated fleet's pages, parsed here into
//! requests of about 2,000 samples (Prometheus' `max_samples_per_send`), each posted to
//! both in turn, so that the machine's noise falls on both alike. CPU time comes from
//! `/proc/<pid>` from the first request to the last, samples from each one's own
//! appended-samples counter.

use super::vs_prometheus::{counter_sum, free_port, proc_stats, spawn_edge, spawn_prometheus, wait_ready};
use anyhow::Context;
use prost::Message;
use std::process::Stdio;
use strata_ingest::exposition::{parse_series, Entry, Format, Parser};
use strata_proto::prometheus::{Label, Sample, TimeSeries, WriteRequest};

const SAMPLES_PER_REQUEST: usize = 2000;

/// One node's page at `t_ms` as remote-write series, with the labels a scrape would add.
fn node_series(fleet: &strata_simulator::Fleet, node: usize, t_ms: i64) -> anyhow::Result<Vec<TimeSeries>> {
    let page = fleet.render_node(node, t_ms).context("the simulator rendered no page")?;
    let mut out = Vec::new();
    for entry in Parser::new(page.as_bytes(), Format::Text) {
        let Entry::Sample { series, value, .. } = entry? else { continue };
        let labels = parse_series(series).map_err(anyhow::Error::msg)?;
        let mut pb: Vec<Label> = labels
            .iter()
            .map(|l| Label { name: l.name.to_string(), value: l.value.to_string() })
            .chain([
                Label { name: "instance".into(), value: format!("gpu-node-{node:03}:9400") },
                Label { name: "job".into(), value: "dcgm".into() },
            ])
            .collect();
        pb.sort_by(|a, b| a.name.cmp(&b.name));
        out.push(TimeSeries { labels: pb, samples: vec![Sample { value, timestamp: t_ms }], exemplars: vec![] });
    }
    Ok(out)
}

/// The requests for one instant of the whole fleet, snappy-compressed.
fn bodies_at(fleet: &strata_simulator::Fleet, nodes: usize, t_ms: i64) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut all = Vec::new();
    for n in 0..nodes {
        all.extend(node_series(fleet, n, t_ms)?);
    }
    let mut out = Vec::new();
    for part in all.chunks(SAMPLES_PER_REQUEST) {
        let req = WriteRequest { timeseries: part.to_vec(), ..Default::default() };
        out.push(snap::raw::Encoder::new().compress_vec(&req.encode_to_vec())?);
    }
    Ok(out)
}

async fn post(client: &reqwest::Client, url: &str, body: Vec<u8>) -> anyhow::Result<()> {
    let r = client
        .post(url)
        .header("Content-Encoding", "snappy")
        .header("Content-Type", "application/x-protobuf")
        .header("X-Prometheus-Remote-Write-Version", "0.1.0")
        .body(body)
        .send()
        .await?;
    if !r.status().is_success() {
        anyhow::bail!("{url} answered {}: {}", r.status(), r.text().await.unwrap_or_default());
    }
    Ok(())
}

pub async fn run(nodes: usize, interval: u64, instants: usize, prometheus: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg_path = dir.path().join("empty.yml");
    std::fs::write(&cfg_path, "scrape_configs: []\n")?;
    let (edge_port, prom_port) = (free_port()?, free_port()?);
    let edge = spawn_edge(&cfg_path, &dir.path().join("edge"), edge_port, Stdio::null())?;
    let prom = spawn_prometheus(
        prometheus,
        &cfg_path,
        &dir.path().join("prom"),
        prom_port,
        &["--web.enable-remote-write-receiver"],
    )?;
    wait_ready(&format!("http://127.0.0.1:{edge_port}/-/ready")).await?;
    wait_ready(&format!("http://127.0.0.1:{prom_port}/-/ready")).await?;
    let fleet = strata_simulator::Fleet::new(1, nodes, 8);
    let step = i64::try_from(interval.max(1) * 1000)?;
    // Every instant inside the last hour, in order: both take them into their heads.
    let last = strata_model::time::now_ms() - 1000;
    let first = last - step * i64::try_from(instants.saturating_sub(1))?;
    println!(
        "bench vs-prometheus --remote-write: {nodes} nodes x 8 GPUs (~{} series), {instants} instants {interval} s apart, \
         in requests of {SAMPLES_PER_REQUEST} samples posted to both",
        nodes * 8 * 25
    );
    // Pages are rendered ahead on another thread, a few instants at a time.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<anyhow::Result<Vec<Vec<u8>>>>(4);
    let render = tokio::task::spawn_blocking(move || {
        for k in 0..instants {
            let t = first + step * k as i64;
            if tx.blocking_send(bodies_at(&fleet, nodes, t)).is_err() {
                return;
            }
        }
    });
    let (edge_url, prom_url) =
        (format!("http://127.0.0.1:{edge_port}/api/v1/write"), format!("http://127.0.0.1:{prom_port}/api/v1/write"));
    let client = reqwest::Client::new();
    let (e0, p0) = (proc_stats(edge.0.id())?, proc_stats(prom.0.id())?);
    let mut requests = 0usize;
    while let Some(bodies) = rx.recv().await {
        for b in bodies? {
            post(&client, &edge_url, b.clone()).await?;
            post(&client, &prom_url, b).await?;
            requests += 1;
        }
    }
    render.await?;
    let (e1, p1) = (proc_stats(edge.0.id())?, proc_stats(prom.0.id())?);
    let edge_page = reqwest::get(format!("http://127.0.0.1:{edge_port}/metrics")).await?.text().await?;
    let prom_page = reqwest::get(format!("http://127.0.0.1:{prom_port}/metrics")).await?.text().await?;
    let es = counter_sum(&edge_page, "strata_head_samples_appended_total");
    let ps = counter_sum(&prom_page, "prometheus_tsdb_head_samples_appended_total");
    let (ec, pc) = (e1.cpu_secs - e0.cpu_secs, p1.cpu_secs - p0.cpu_secs);
    let per_m = |x: f64, n: f64| x / (n / 1e6).max(1e-9);
    println!("  {requests} requests to each");
    println!("  {:<12} {:>12} {:>10} {:>16}", "", "samples", "CPU s", "CPU s / M samp.");
    for (name, s, c) in [("prometheus", ps, pc), ("strata edge", es, ec)] {
        println!("  {:<12} {:>12.0} {:>10.2} {:>16.3}", name, s, c, per_m(c, s));
    }
    println!(
        "  strata / prometheus: CPU per sample received {:.2} (goal <= 0.33)",
        per_m(ec, es) / per_m(pc, ps).max(1e-12)
    );
    drop(edge);
    drop(prom);
    Ok(())
}
