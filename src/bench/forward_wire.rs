//! Forwarding at steady state against Prometheus 2.42's remote write, in one run: an edge
//! scrapes the simulated fleet and forwards to a regional (or, with `--edge-remote-write`,
//! remote-writes to a receiving Prometheus), while Prometheus scrapes the same fleet and
//! remote-writes to a second Prometheus. Each link goes through a byte-counting proxy in
//! this process, so bytes on the wire are measured the same way for both (framing, headers
//! and compression included); CPU comes from `/proc/<pid>` of each process.

use super::vs_prometheus::{
    counter_sum, fleet_targets, free_port, get, proc_stats, serve_fleet, spawn_edge, spawn_prometheus, spawn_regional,
    wait_ready,
};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TCP proxy from a free port to `to`, counting the bytes it carries both ways.
async fn counting_proxy(to: u16) -> anyhow::Result<(u16, Arc<AtomicU64>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let bytes = Arc::new(AtomicU64::new(0));
    let counted = bytes.clone();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else { continue };
            let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = outbound.into_split();
            tokio::spawn(pump(ri, wo, counted.clone()));
            tokio::spawn(pump(ro, wi, counted.clone()));
        }
    });
    Ok((port, bytes))
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    bytes: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                bytes.fetch_add(n as u64, Ordering::Relaxed);
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}

pub async fn run(
    nodes: usize,
    interval: u64,
    seconds: u64,
    prometheus: &str,
    edge_remote_write: bool,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (sim_port, stop_tx) = serve_fleet(nodes).await?;
    let targets = fleet_targets(sim_port, nodes);
    let scrape = format!("global:\n  scrape_interval: {interval}s\n  scrape_timeout: {interval}s\n  external_labels: {{cluster: c0}}\nscrape_configs:\n  - job_name: dcgm\n    static_configs:\n{targets}");

    // Receivers first, each behind its counting proxy.
    let receiver_cfg = dir.path().join("receiver.yml");
    std::fs::write(&receiver_cfg, "global:\n  scrape_interval: 1h\nscrape_configs: []\n")?;
    let (prom_rx_port, strata_rx_http, strata_rx_grpc) = (free_port()?, free_port()?, free_port()?);
    let prom_rx = spawn_prometheus(
        prometheus,
        &receiver_cfg,
        &dir.path().join("prom-rx"),
        prom_rx_port,
        &["--web.enable-remote-write-receiver"],
    )?;
    let (strata_rx, strata_rx_ready, strata_link) = if edge_remote_write {
        let rx_port = free_port()?;
        let g = spawn_prometheus(
            prometheus,
            &receiver_cfg,
            &dir.path().join("prom-rx-2"),
            rx_port,
            &["--web.enable-remote-write-receiver"],
        )?;
        (g, format!("http://127.0.0.1:{rx_port}/-/ready"), rx_port)
    } else {
        let g = spawn_regional(dir.path(), strata_rx_http, strata_rx_grpc)?;
        (g, format!("http://127.0.0.1:{strata_rx_http}/-/ready"), strata_rx_grpc)
    };
    wait_ready(&format!("http://127.0.0.1:{prom_rx_port}/-/ready")).await?;
    wait_ready(&strata_rx_ready).await?;
    let (prom_proxy, prom_wire) = counting_proxy(prom_rx_port).await?;
    let (strata_proxy, strata_wire) = counting_proxy(strata_link).await?;

    let prom_cfg = dir.path().join("prom.yml");
    std::fs::write(
        &prom_cfg,
        format!("{scrape}remote_write:\n  - url: http://127.0.0.1:{prom_proxy}/api/v1/write\n    queue_config: {{batch_send_deadline: 1s}}\n"),
    )?;
    let edge_cfg = dir.path().join("edge.yml");
    let link = if edge_remote_write {
        format!("remote_write:\n  - url: http://127.0.0.1:{strata_proxy}/api/v1/write\n    name: rx\n    queue_config: {{batch_send_deadline: 1s}}\n")
    } else {
        format!("strata:\n  forward:\n    - address: 127.0.0.1:{strata_proxy}\n")
    };
    std::fs::write(&edge_cfg, format!("{scrape}{link}"))?;
    let (edge_port, prom_port) = (free_port()?, free_port()?);
    let edge = spawn_edge(&edge_cfg, &dir.path().join("edge"), edge_port, Stdio::null())?;
    let prom = spawn_prometheus(prometheus, &prom_cfg, &dir.path().join("prom"), prom_port, &[])?;
    wait_ready(&format!("http://127.0.0.1:{edge_port}/-/ready")).await?;
    wait_ready(&format!("http://127.0.0.1:{prom_port}/-/ready")).await?;
    let what = if edge_remote_write { "remote write to a second Prometheus" } else { "forward to a regional" };
    println!(
        "bench forward-vs-prometheus: {nodes} nodes x 8 GPUs scraped every {interval} s; the edge's {what} against Prometheus' remote write to a second Prometheus, {seconds} s after 15 s of warm-up"
    );
    tokio::time::sleep(Duration::from_secs(15)).await;

    let edge_sent = |page: &str| {
        if edge_remote_write {
            counter_sum(page, "prometheus_remote_storage_samples_total")
        } else {
            counter_sum(page, "strata_forward_samples_acked_total")
        }
    };
    let pids = [prom.0.id(), prom_rx.0.id(), edge.0.id(), strata_rx.0.id()];
    let cpu0: Vec<f64> = pids.iter().map(|&p| proc_stats(p).map(|s| s.cpu_secs)).collect::<Result<_, _>>()?;
    let (pw0, sw0) = (prom_wire.load(Ordering::Relaxed), strata_wire.load(Ordering::Relaxed));
    let ps0 = counter_sum(
        &get(&format!("http://127.0.0.1:{prom_port}/metrics")).await?,
        "prometheus_remote_storage_samples_total",
    );
    let es0 = edge_sent(&get(&format!("http://127.0.0.1:{edge_port}/metrics")).await?);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let ps = counter_sum(
        &get(&format!("http://127.0.0.1:{prom_port}/metrics")).await?,
        "prometheus_remote_storage_samples_total",
    ) - ps0;
    let edge_page = get(&format!("http://127.0.0.1:{edge_port}/metrics")).await?;
    let es = edge_sent(&edge_page) - es0;
    let cpu: Vec<f64> =
        pids.iter().zip(&cpu0).map(|(&p, c0)| proc_stats(p).map(|s| s.cpu_secs - c0)).collect::<Result<_, _>>()?;
    let (pw, sw) = (prom_wire.load(Ordering::Relaxed) - pw0, strata_wire.load(Ordering::Relaxed) - sw0);
    let per_m = |x: f64, n: f64| x / (n / 1e6).max(1e-9);
    println!(
        "  {:<34} {:>12} {:>10} {:>14} {:>14} {:>14}",
        "", "samples/s", "wire B/s.", "sender CPU s", "sender s/M", "receiver s/M"
    );
    let rows = [
        ("prometheus remote write", ps, pw, cpu[0], cpu[1]),
        (if edge_remote_write { "strata edge remote write" } else { "strata edge forward" }, es, sw, cpu[2], cpu[3]),
    ];
    for (name, n, wire, tx, rx) in rows {
        println!(
            "  {:<34} {:>12.0} {:>10.2} {:>14.2} {:>14.3} {:>14.3}",
            name,
            n / seconds as f64,
            wire as f64 / n.max(1.0),
            tx,
            per_m(tx, n),
            per_m(rx, n)
        );
    }
    println!(
        "  strata / prometheus: wire bytes per sample {:.2}, sender CPU per sample {:.2} (scraping included on both), receiver CPU per sample {:.2}",
        (sw as f64 / es.max(1.0)) / (pw as f64 / ps.max(1.0)),
        per_m(cpu[2], es) / per_m(cpu[0], ps),
        per_m(cpu[3], es) / per_m(cpu[1], ps)
    );
    let _ = stop_tx.send(true);
    drop((edge, prom, prom_rx, strata_rx));
    Ok(())
}
