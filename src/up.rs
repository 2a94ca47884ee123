//! `strata up`: a simulated GPU fleet in two clusters (`cluster="c0"`, `"c1"`), each scraped
//! by an HA pair of edges (`replica="a"`/`"b"`) that forward everything they store to one
//! regional, and a global querier over the four edges' and the regional's StoreAPI, with
//! data under `./strata-data`. Every configuration file is written next to its data, so
//! what `up` runs can be rerun by hand with `strata edge`, `strata regional` and
//! `strata global --config`.
//!
//! The regional evaluates the GPU rule pack of `deploy/rules` (built in, written to
//! `strata-data/regional/rules/` where it can be edited) and sends its alerts to an
//! Alertmanager that `up` starts when one is installed (Debian's `prometheus-alertmanager`,
//! or `alertmanager` on the PATH).
//!
//! Ports from `--port-base` (9400): the simulator, the four edges' HTTP (9401–9404, c0-a,
//! c0-b, c1-a, c1-b), their StoreAPI (9405–9408), the global's HTTP (9409), the regional's
//! HTTP (9410) and its gRPC (9411: the forward receiver and the StoreAPI), Alertmanager
//! (9412).

use anyhow::Context;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args)]
pub struct UpArgs {
    /// Directory for all data and generated configuration.
    #[arg(long, default_value = "strata-data")]
    data: PathBuf,
    /// First of the thirteen ports used: simulator, four edges, their StoreAPI, the global,
    /// the regional's HTTP and gRPC, Alertmanager.
    #[arg(long, default_value_t = 9400)]
    port_base: u16,
    /// Simulated nodes per cluster (two clusters, each scraped by an HA pair of edges).
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// GPUs on each simulated node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: usize,
    /// On a first start (no data yet), the simulated fleet's history over this span before
    /// now is scraped into the edges first, as it would have been served, so that a 24 h
    /// graph has a day to show (answered from the regional's aggregates). `0s`: none.
    #[arg(long, default_value = "24h", value_parser = parse_span)]
    backfill: Duration,
}

fn parse_span(s: &str) -> Result<Duration, String> {
    strata_model::duration::parse_duration(s).map_err(|e| e.to_string())
}

/// The clusters `up` simulates, each with its own nodes of the simulator.
const CLUSTERS: [&str; 2] = ["c0", "c1"];
const REPLICAS: [&str; 2] = ["a", "b"];

fn edge_config(
    cluster: &str,
    replica: &str,
    sim: SocketAddr,
    nodes: std::ops::Range<usize>,
    regional: SocketAddr,
) -> String {
    let mut targets = String::new();
    for i in nodes {
        targets.push_str(&format!(
            "      - targets: ['{sim}']\n        labels:\n          __metrics_path__: /node/{i}/metrics\n          node: gpu-node-{i:03}\n"
        ));
    }
    format!(
        "# Written by `strata up`. A Prometheus configuration file; Strata's keys are under `strata:`.\n\
         global:\n  scrape_interval: 5s\n  external_labels:\n    cluster: {cluster}\n    replica: {replica}\n\
         scrape_configs:\n  - job_name: dcgm\n    static_configs:\n{targets}\
         strata:\n  retention: 24h\n  forward:\n    - address: {regional}\n"
    )
}

fn global_config(stores: &[SocketAddr]) -> String {
    let list: Vec<String> = stores.iter().map(|s| format!("  - {s}\n")).collect();
    format!(
        "# Written by `strata up`: the global querier's stores (the edges' and the regional's StoreAPI).\n\
         # `aggregates: coarsest`: the regional's 5 m and 1 h aggregates answer what they answer\n\
         # exactly even where the edges hold raw data (docs/downsample.md).\n\
         stores:\n{}store_timeout: 30s\ninfo_interval: 10s\nreplica_labels: [replica]\naggregates: coarsest\n",
        list.concat()
    )
}

/// The GPU rule pack of `deploy/rules`, built in.
pub(crate) const RULE_PACK: [(&str, &str); 3] = [
    ("gpu-recording.yml", include_str!("../deploy/rules/gpu-recording.yml")),
    ("gpu-alerts.yml", include_str!("../deploy/rules/gpu-alerts.yml")),
    ("strata-health.yml", include_str!("../deploy/rules/strata-health.yml")),
];

/// Writes the rule pack into `dir/rules`; a file already there (a user's edit) is kept.
fn write_rule_pack(dir: &Path) -> anyhow::Result<()> {
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).with_context(|| format!("creating {}", rules.display()))?;
    for (name, text) in RULE_PACK {
        let p = rules.join(name);
        if !p.exists() {
            std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        }
    }
    Ok(())
}

fn regional_config(alertmanager: Option<SocketAddr>) -> String {
    let mut text = "# Written by `strata up`: the regional that every edge forwards to. It evaluates the\n\
         # GPU rule pack (rules/, from deploy/rules) over the deduplicated data of each HA pair;\n\
         # what it records carries `region`, as alerts do.\n\
         global:\n  evaluation_interval: 30s\n  external_labels:\n    region: local\n\
         strata:\n  retention: 15d\nrule_files:\n  - rules/*.yml\n"
        .to_string();
    if let Some(am) = alertmanager {
        text.push_str(&format!("alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{am}']\n"));
    }
    text
}

/// An Alertmanager `up` started; stopped with `up`.
struct AlertmanagerProcess(std::process::Child);

impl Drop for AlertmanagerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts Debian's `prometheus-alertmanager` (or an `alertmanager` on the PATH) on `addr`,
/// with a receiver that only shows alerts in its UI, and waits for it to be ready; `None`
/// when neither is installed or it does not come up (its log says why).
async fn start_alertmanager(dir: &Path, addr: SocketAddr) -> anyhow::Result<Option<AlertmanagerProcess>> {
    let installed =
        |p: &&str| std::process::Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success());
    let Some(program) = ["prometheus-alertmanager", "alertmanager"].into_iter().find(installed) else {
        return Ok(None);
    };
    let cfg = write_config(
        dir,
        "alertmanager.yml",
        "# Written by `strata up`: alerts are shown in Alertmanager's UI and sent nowhere; add a\n\
         # receiver (Slack, PagerDuty, email) to be told.\n\
         route:\n  receiver: ui-only\n  group_wait: 10s\nreceivers:\n  - name: ui-only\n",
    )?;
    let log_path = dir.join("alertmanager.log");
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut cmd = std::process::Command::new(program);
    cmd.arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={addr}"))
        // Alone: no gossip port.
        .arg("--cluster.listen-address=")
        .stdout(log.try_clone()?)
        .stderr(log);
    // Stopped with `up` even when `up` is killed outright (its `Drop` then never runs). The
    // signal follows the thread that started it: `up` runs on the main thread, which lives
    // as long as the process.
    // SAFETY: between fork and exec the closure only calls prctl, which is
    // async-signal-safe, and touches no memory of the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let child = cmd.spawn().with_context(|| format!("starting {program}"))?;
    let mut am = AlertmanagerProcess(child);
    let ready = format!("http://{addr}/-/ready");
    for _ in 0..60 {
        if let Ok(Some(status)) = am.0.try_wait() {
            println!("  Alertmanager exited at start ({status}); see {}: running without it", log_path.display());
            return Ok(None);
        }
        if reqwest::get(&ready).await.is_ok_and(|r| r.status().is_success()) {
            return Ok(Some(am));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!("  Alertmanager not ready within 15 s; see {}: running without it", log_path.display());
    Ok(None)
}

fn write_config(dir: &Path, name: &str, text: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let p = dir.join(name);
    std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    Ok(p)
}

/// Whether the edge data directory `data` is to be backfilled (`wanted`: `--backfill` is not
/// zero): then the marker written beside it, to remove once the backfill has ended. A
/// backfill cut short (an error, Ctrl-C) leaves its marker: the partial data goes (and is
/// backfilled again when wanted) before an edge starts on it, or the edges of a pair would
/// hold different histories. A directory without a marker is kept as it is.
fn backfill_due(data: &Path, wanted: bool) -> anyhow::Result<Option<PathBuf>> {
    let marker = data.with_extension("backfilling");
    if marker.exists() {
        std::fs::remove_dir_all(data)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .with_context(|| format!("removing the partial backfill in {}", data.display()))?;
        if !wanted {
            std::fs::remove_file(&marker).with_context(|| format!("removing {}", marker.display()))?;
        }
    }
    if !wanted || data.exists() {
        return Ok(None);
    }
    std::fs::write(&marker, b"").with_context(|| format!("writing {}", marker.display()))?;
    Ok(Some(marker))
}

/// Samples of the history a first start backfills are this far apart (the live scrapes are
/// every 5 s): a day of it is then scraped in seconds, not minutes.
const BACKFILL_EVERY: Duration = Duration::from_secs(30);

/// Scrapes the fleet's pages of the last `span`, every [`BACKFILL_EVERY`], into the edge
/// `opts` describes, before it starts (see `strata_edge::backfill`).
async fn backfill(
    opts: &strata_edge::EdgeOptions,
    fleet: &strata_simulator::Fleet,
    span: Duration,
    name: &str,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let to = strata_model::time::now_ms();
    let from = to.saturating_sub(span.as_millis() as i64);
    let (opts, fleet) = (opts.clone(), fleet.clone());
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let report = tokio::task::spawn_blocking(move || {
        strata_edge::backfill::backfill(&opts, (from, to), Some(BACKFILL_EVERY), threads, |target, t| {
            let node = target.url.split("/node/").nth(1)?.split('/').next()?.parse().ok()?;
            fleet.render_node(node, t)
        })
    })
    .await??;
    println!(
        "  backfilled edge {name}: {} pages of {} targets over the last {}, every {}, in {:.1} s",
        report.pages,
        report.targets,
        strata_model::duration::format_duration_ms(to.saturating_sub(report.from)),
        strata_model::duration::format_duration(BACKFILL_EVERY),
        started.elapsed().as_secs_f64()
    );
    if report.failed + report.refused > 0 {
        println!("    {} pages failed, {} samples refused by the database", report.failed, report.refused);
    }
    Ok(())
}

pub async fn run(a: UpArgs) -> anyhow::Result<()> {
    let sim_addr: SocketAddr = ([127, 0, 0, 1], a.port_base).into();
    let listener = tokio::net::TcpListener::bind(sim_addr)
        .await
        .with_context(|| format!("binding the simulator to {sim_addr}"))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let fleet = strata_simulator::Fleet::new(1, a.nodes * CLUSTERS.len(), a.gpus_per_node);
    let mut rx = stop_rx.clone();
    let sim = tokio::spawn(strata_simulator::serve(listener, fleet.clone(), 0, Default::default(), async move {
        let _ = rx.changed().await;
    }));

    let port = |i: usize| -> SocketAddr { ([127, 0, 0, 1], a.port_base.saturating_add(i as u16)).into() };
    let rdir = a.data.join("regional");
    let am_addr = port(12);
    let alertmanager = start_alertmanager(&a.data.join("alertmanager"), am_addr).await?;
    write_rule_pack(&rdir)?;
    let rcfg = write_config(&rdir, "regional.yml", &regional_config(alertmanager.as_ref().map(|_| am_addr)))?;
    let mut ropts = strata_regional::RegionalOptions::new(rcfg);
    ropts.http_listen = Some(port(10));
    ropts.grpc_listen = Some(port(11));
    ropts.data_dir = Some(rdir.join("data"));
    ropts.enable_lifecycle = true;
    let regional = strata_regional::Regional::start(ropts).await?;
    let (rhttp, rgrpc) = (regional.http_addr, regional.grpc_addr);
    let mut configured = Vec::new();
    for (c, cluster) in CLUSTERS.iter().enumerate() {
        for (r, replica) in REPLICAS.iter().enumerate() {
            let k = c * REPLICAS.len() + r;
            let dir = a.data.join(format!("edge-{cluster}-{replica}"));
            let nodes = c * a.nodes..(c + 1) * a.nodes;
            let cfg =
                write_config(&dir, "edge.yml", &edge_config(cluster, replica, sim_addr, nodes, regional.grpc_addr))?;
            let mut opts = strata_edge::EdgeOptions::new(cfg);
            opts.http_listen = Some(port(1 + k));
            opts.grpc_listen = Some(port(5 + k));
            opts.data_dir = Some(dir.join("data"));
            configured.push((format!("cluster={cluster} replica={replica}"), opts));
        }
    }
    // Every backfill before any edge starts: one edge's forwarding would slow the next's.
    for (name, opts) in &configured {
        let Some(data) = &opts.data_dir else { continue };
        if let Some(marker) = backfill_due(data, !a.backfill.is_zero())? {
            backfill(opts, &fleet, a.backfill, name).await?;
            std::fs::remove_file(&marker).with_context(|| format!("removing {}", marker.display()))?;
        }
    }
    let mut edges = Vec::new();
    for (name, opts) in configured {
        edges.push((name, strata_edge::Edge::start(opts).await?));
    }
    let mut stores: Vec<SocketAddr> = edges.iter().filter_map(|(_, e)| e.grpc_addr).collect();
    stores.push(regional.grpc_addr);
    let gdir = a.data.join("global");
    let mut gopts =
        strata_global::GlobalOptions::new(Some(write_config(&gdir, "global.yml", &global_config(&stores))?));
    gopts.http_listen = port(9);
    let global = strata_global::Global::start(gopts).await?;

    println!(
        "strata up: {} clusters x {} nodes x {} GPUs, data under {}",
        CLUSTERS.len(),
        a.nodes,
        a.gpus_per_node,
        a.data.display()
    );
    println!("  simulator (dcgm-exporter)      http://{sim_addr}/node/0/metrics");
    for (name, e) in &edges {
        let grpc = e.grpc_addr.map(|g| g.to_string()).unwrap_or_default();
        println!("  edge {name:<22} http://{}   StoreAPI {grpc}", e.http_addr);
    }
    println!("  regional (every edge forwards) http://{}   gRPC {}", regional.http_addr, regional.grpc_addr);
    println!(
        "  global (query here)            http://{}   (/api/v1/query, /api/v1/stores, /api/v1/alerts)",
        global.http_addr
    );
    match &alertmanager {
        Some(_) => println!("  alertmanager (the rule pack's alerts) http://{am_addr}"),
        None => println!(
            "  no Alertmanager installed (apt-get install prometheus-alertmanager): alerts show at /api/v1/alerts"
        ),
    }
    println!(
        "Try: curl -s 'http://{}/api/v1/query?query=count%20by%20(cluster)%20(DCGM_FI_DEV_GPU_TEMP)'",
        global.http_addr
    );
    println!("Ctrl-C stops everything.");
    // The regional alone can be stopped (POST /-/quit) to watch the edges hold their data
    // and catch up when it is started again by hand.
    let mut regional = Some(regional);
    loop {
        let quit = async {
            match &regional {
                Some(r) => r.quit_requested().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = crate::shutdown_signal() => break,
            _ = quit => {
                if let Some(r) = regional.take() {
                    // Ctrl-C meanwhile still stops everything at once.
                    tokio::select! {
                        stopped = tokio::time::timeout(Duration::from_secs(30), r.stop()) => {
                            if stopped.is_err() {
                                tracing::error!("the regional took over 30 s to stop");
                            }
                        }
                        _ = crate::shutdown_signal() => break,
                    }
                    println!(
                        "regional stopped; the edges keep what it has not acknowledged. Start it again with:\n  strata regional --config {} --data {} --http-listen {rhttp} --grpc-listen {rgrpc} --web.enable-lifecycle",
                        rdir.join("regional.yml").display(),
                        rdir.join("data").display(),
                    );
                }
            }
        }
    }
    println!("stopping ...");
    global.stop().await;
    for (_, e) in edges {
        tokio::time::timeout(Duration::from_secs(30), e.stop()).await.context("an edge took over 30 s to stop")?;
    }
    if let Some(regional) = regional {
        tokio::time::timeout(Duration::from_secs(30), regional.stop())
            .await
            .context("the regional took over 30 s to stop")?;
    }
    drop(alertmanager);
    let _ = stop_tx.send(true);
    let _ = sim.await;
    println!("stopped; data kept in {}", a.data.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::backfill_due;

    #[test]
    fn a_backfill_cut_short_is_redone_and_a_finished_one_kept() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("data");
        // A first start: due, with its marker written.
        let marker = backfill_due(&data, true).unwrap().expect("due on a first start");
        assert!(marker.exists() && marker.parent() == data.parent());
        // Cut short: the partial data and the marker are there; the next start redoes it.
        std::fs::create_dir_all(data.join("wal")).unwrap();
        assert_eq!(backfill_due(&data, true).unwrap(), Some(marker.clone()));
        assert!(!data.exists(), "the partial data went");
        // Finished: the marker removed, the data kept, nothing due.
        std::fs::create_dir_all(data.join("wal")).unwrap();
        std::fs::remove_file(&marker).unwrap();
        assert_eq!(backfill_due(&data, true).unwrap(), None);
        assert!(data.join("wal").exists());
        // Cut short, then started with `--backfill 0s`: the partial data and the marker go.
        std::fs::write(&marker, b"").unwrap();
        assert_eq!(backfill_due(&data, false).unwrap(), None);
        assert!(!data.exists() && !marker.exists());
        // Not wanted on a first start: nothing written.
        assert_eq!(backfill_due(&data, false).unwrap(), None);
        assert!(!marker.exists());
    }
}
