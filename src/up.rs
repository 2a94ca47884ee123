//! `strata up`: a simulated GPU fleet and an HA pair of edges (`replica="a"`/`"b"`) scraping
//! it, with data under `./strata-data`. The edges' configuration files are written next to
//! their data, so what `up` runs can be rerun by hand with `strata edge --config`.

use anyhow::Context;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args)]
pub struct UpArgs {
    /// Directory for all data and generated configuration.
    #[arg(long, default_value = "strata-data")]
    data: PathBuf,
    /// First of the ports used: simulator, then edge a, edge b.
    #[arg(long, default_value_t = 9400)]
    port_base: u16,
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    #[arg(long, default_value_t = 8)]
    gpus_per_node: usize,
    #[arg(long, default_value = "cluster-0")]
    cluster: String,
}

fn edge_config(cluster: &str, replica: &str, sim: SocketAddr, nodes: usize) -> String {
    let mut targets = String::new();
    for i in 0..nodes {
        targets.push_str(&format!(
            "      - targets: ['{sim}']\n        labels:\n          __metrics_path__: /node/{i}/metrics\n          node: gpu-node-{i:03}\n"
        ));
    }
    format!(
        "# Written by `strata up`. A Prometheus configuration file; Strata's keys are under `strata:`.\n\
         global:\n  scrape_interval: 5s\n  external_labels:\n    cluster: {cluster}\n    replica: {replica}\n\
         scrape_configs:\n  - job_name: dcgm\n    static_configs:\n{targets}\
         strata:\n  retention: 24h\n"
    )
}

fn write_config(dir: &Path, name: &str, text: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let p = dir.join(name);
    std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    Ok(p)
}

pub async fn run(a: UpArgs) -> anyhow::Result<()> {
    let sim_addr: SocketAddr = ([127, 0, 0, 1], a.port_base).into();
    let listener = tokio::net::TcpListener::bind(sim_addr)
        .await
        .with_context(|| format!("binding the simulator to {sim_addr}"))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let fleet = strata_simulator::Fleet::new(1, a.nodes, a.gpus_per_node);
    let mut rx = stop_rx.clone();
    let sim = tokio::spawn(strata_simulator::serve(listener, fleet, 0, Default::default(), async move {
        let _ = rx.changed().await;
    }));

    let mut edges = Vec::new();
    for (i, replica) in ["a", "b"].iter().enumerate() {
        let dir = a.data.join(format!("edge-{replica}"));
        let cfg = write_config(&dir, "edge.yml", &edge_config(&a.cluster, replica, sim_addr, a.nodes))?;
        let mut opts = strata_edge::EdgeOptions::new(cfg);
        opts.http_listen = Some(([127, 0, 0, 1], a.port_base + 1 + i as u16).into());
        opts.data_dir = Some(dir.join("data"));
        edges.push((replica.to_string(), strata_edge::Edge::start(opts).await?));
    }

    println!(
        "strata up: {} nodes x {} GPUs in {}, data under {}",
        a.nodes,
        a.gpus_per_node,
        a.cluster,
        a.data.display()
    );
    println!("  simulator (dcgm-exporter)  http://{sim_addr}/node/0/metrics");
    for (replica, e) in &edges {
        println!(
            "  edge replica={replica}            http://{}/metrics   remote write: http://{}/api/v1/write",
            e.http_addr, e.http_addr
        );
    }
    println!("Ctrl-C stops everything.");
    crate::shutdown_signal().await;
    println!("stopping ...");
    for (_, e) in edges {
        tokio::time::timeout(Duration::from_secs(30), e.stop()).await.context("an edge took over 30 s to stop")?;
    }
    let _ = stop_tx.send(true);
    let _ = sim.await;
    println!("stopped; data kept in {}", a.data.display());
    Ok(())
}
