//! `strata bench alert-latency`: how long a GPU's memory overheating takes to reach
//! Alertmanager, through Strata and through Prometheus 2.42 in the same run.
//!
//! The simulator's thermal episodes are deterministic, so the benchmark picks one (a GPU
//! whose memory passes 85 °C during it) and sets the simulator's clock so that it begins 90
//! seconds after the start. An HA pair of edges scrapes the fleet every 5 s and forwards to
//! a regional that evaluates the GPU pack's alerts (`deploy/rules/gpu-alerts.yml`: the
//! `GpuMemoryTemperatureRising` rule has `for: 1m` in a 30 s group); a Prometheus scrapes
//! the same fleet every 5 s with the same rule file. Both send to one real Alertmanager,
//! told apart by their `region` external label, which is polled every 250 ms. Printed:
//! from the episode's start and from the memory passing 85 °C (the rule's threshold) to
//! each one's alert arriving, and the `startsAt` each sent.

use super::vs_prometheus::{fleet_targets, free_port, spawn_edge, spawn_prometheus, wait_ready, Guard};
use anyhow::Context;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The rule timed, from the GPU pack.
const ALERT: &str = "GpuMemoryTemperatureRising";

/// The memory temperature of `gpu` on `node` in the simulator's page at `t` (seconds).
fn memory_temp(fleet: &strata_simulator::Fleet, node: usize, gpu: usize, t: i64) -> Option<f64> {
    let page = fleet.render_node(node, t * 1000)?;
    let device = format!("device=\"nvidia{gpu}\"");
    let line = page.lines().find(|l| l.starts_with("DCGM_FI_DEV_MEMORY_TEMP{") && l.contains(&device))?;
    line.rsplit(' ').next()?.parse().ok()
}

/// The first episode after `from` on a whole GPU (not MIG) that starts below 80 °C and
/// passes 85 °C: `(node, gpu, start, crossing)`, in simulator seconds.
fn pick_episode(fleet: &strata_simulator::Fleet, from: i64) -> Option<(usize, usize, i64, i64)> {
    for (node, gpu, start) in fleet.thermal_episodes(from, from + 7 * 86_400) {
        if fleet.is_mig(node, gpu) || memory_temp(fleet, node, gpu, start - 5).is_none_or(|t| t >= 80.0) {
            continue;
        }
        // The climb lasts 420 s; sampled as the edges scrape, every 5 s.
        if let Some(crossing) =
            (0..=84).map(|i| start + i * 5).find(|&t| memory_temp(fleet, node, gpu, t).is_some_and(|v| v > 85.0))
        {
            return Some((node, gpu, start, crossing));
        }
    }
    None
}

/// `region`'s alert for the GPU in Alertmanager's answer: its `startsAt`.
fn arrived(alerts: &serde_json::Value, region: &str, host: &str, gpu: usize) -> Option<String> {
    alerts.as_array()?.iter().find_map(|a| {
        let l = &a["labels"];
        let ours = l["alertname"] == ALERT
            && l["region"] == region
            && l["Hostname"] == host
            && l["gpu"].as_str() == Some(&gpu.to_string());
        ours.then(|| a["startsAt"].as_str().unwrap_or_default().to_string())
    })
}

pub async fn run(nodes: usize, prometheus: &str, alertmanager: &str) -> anyhow::Result<()> {
    let fleet = strata_simulator::Fleet::new(1, nodes, 8);
    let (wall_ms, base) = (strata_model::time::now_ms(), Instant::now());
    let real_now = wall_ms / 1000;
    let (node, gpu, start, crossing) =
        pick_episode(&fleet, real_now).context("no thermal episode passes 85 °C within a week of simulated time")?;
    // The episode begins `LEAD` seconds from now on the simulator's clock.
    const LEAD: i64 = 90;
    let offset_ms = (start - (real_now + LEAD)) * 1000;
    let host = fleet.hostname(node);
    println!(
        "bench alert-latency: {host} gpu {gpu}: its episode begins in {LEAD} s, its memory passes 85 °C {} s into it",
        crossing - start
    );

    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let sim_port = free_port()?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", sim_port)).await?;
    let (stop_sim, mut stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(strata_simulator::serve(listener, fleet.clone(), offset_ms, Default::default(), async move {
        let _ = stopped.changed().await;
    }));

    // Alertmanager, polled for both.
    let am_port = free_port()?;
    std::fs::write(d.join("am.yml"), "route:\n  receiver: none\nreceivers:\n  - name: none\n")?;
    let _am = Guard(
        Command::new(alertmanager)
            .arg(format!("--config.file={}", d.join("am.yml").display()))
            .arg(format!("--storage.path={}", d.join("am").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{am_port}"))
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {alertmanager} (apt-get install -y prometheus-alertmanager)"))?,
    );
    let am = format!("http://127.0.0.1:{am_port}");
    wait_ready(&format!("{am}/-/ready")).await?;

    let rules = d.join("rules");
    std::fs::create_dir_all(&rules)?;
    let (_, pack) = crate::up::RULE_PACK.iter().find(|(n, _)| *n == "gpu-alerts.yml").context("the pack's alerts")?;
    std::fs::write(rules.join("gpu-alerts.yml"), pack)?;
    let alerting =
        format!("alerting:\n  alertmanagers:\n    - static_configs: [{{targets: ['127.0.0.1:{am_port}']}}]\n");
    let targets = fleet_targets(sim_port, nodes);

    // Strata: a regional with the rules, fed by an HA pair of edges.
    let (rhttp, rgrpc) = (free_port()?, free_port()?);
    std::fs::write(
        d.join("regional.yml"),
        format!(
            "global:\n  evaluation_interval: 30s\n  external_labels: {{region: strata}}\nrule_files: [rules/*.yml]\n{alerting}"
        ),
    )?;
    let _regional = Guard(
        Command::new(std::env::current_exe()?)
            .args(["regional", "--config", &d.join("regional.yml").display().to_string()])
            .args(["--data", &d.join("regional").display().to_string()])
            .args(["--http-listen", &format!("127.0.0.1:{rhttp}"), "--grpc-listen", &format!("127.0.0.1:{rgrpc}")])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the regional")?,
    );
    wait_ready(&format!("http://127.0.0.1:{rhttp}/-/ready")).await?;
    let mut edges = Vec::new();
    for replica in ["a", "b"] {
        let cfg = d.join(format!("edge-{replica}.yml"));
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 5s\n  external_labels: {{cluster: c0, replica: {replica}}}\nscrape_configs:\n  - job_name: dcgm\n    static_configs:\n{targets}strata:\n  forward:\n    - address: 127.0.0.1:{rgrpc}\n"
            ),
        )?;
        let port = free_port()?;
        edges.push(spawn_edge(&cfg, &d.join(format!("edge-{replica}")), port, Stdio::null())?);
        wait_ready(&format!("http://127.0.0.1:{port}/-/ready")).await?;
    }

    // Prometheus: the same scrapes and rule file, alerts to the same Alertmanager.
    let pcfg = d.join("prometheus.yml");
    std::fs::write(
        &pcfg,
        format!(
            "global:\n  scrape_interval: 5s\n  evaluation_interval: 30s\n  external_labels: {{region: prometheus}}\nrule_files: ['{}']\n{alerting}scrape_configs:\n  - job_name: dcgm\n    static_configs:\n{targets}",
            rules.join("gpu-alerts.yml").display()
        ),
    )?;
    let pport = free_port()?;
    let _prom = spawn_prometheus(prometheus, &pcfg, &d.join("prometheus"), pport, &[])?;
    wait_ready(&format!("http://127.0.0.1:{pport}/-/ready")).await?;

    // Real time of the episode's start and of the crossing.
    let episode_at = base + Duration::from_millis(((real_now + LEAD) * 1000 - wall_ms).max(0) as u64);
    if Instant::now() > episode_at {
        anyhow::bail!("starting the stack took longer than the {LEAD} s lead: the episode began before it was watched");
    }
    let crossing_at = episode_at + Duration::from_secs((crossing - start) as u64);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    // When each one's alert arrived, and the `startsAt` it carried.
    type Arrival = Option<(Instant, String)>;
    let (mut strata, mut prom): (Arrival, Arrival) = (None, None);
    let deadline = crossing_at + Duration::from_secs(600);
    while (strata.is_none() || prom.is_none()) && Instant::now() < deadline {
        let url = format!("{am}/api/v2/alerts?filter=alertname%3D%22{ALERT}%22");
        if let Ok(body) = client.get(&url).send().await {
            if let Ok(v) = body.text().await.map(|t| serde_json::from_str::<serde_json::Value>(&t).unwrap_or_default())
            {
                if strata.is_none() {
                    strata = arrived(&v, "strata", &host, gpu).map(|s| (Instant::now(), s));
                }
                if prom.is_none() {
                    prom = arrived(&v, "prometheus", &host, gpu).map(|s| (Instant::now(), s));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let _ = stop_sim.send(true);
    drop(edges);
    let secs = |a: Instant, b: Instant| a.saturating_duration_since(b).as_secs_f64();
    for (name, got) in [("strata (HA pair, regional)", &strata), ("prometheus 2.42", &prom)] {
        match got {
            Some((at, starts)) => println!(
                "  {name:<28} alert in Alertmanager {:.1} s after the episode began, {:.1} s after memory passed 85 °C (startsAt {starts})",
                secs(*at, episode_at),
                secs(*at, crossing_at)
            ),
            None => println!("  {name:<28} no alert within 10 minutes of memory passing 85 °C"),
        }
    }
    println!("  (the rule holds `for: 1m` in a 30 s group: about 60–90 s of the time after 85 °C is the rule's own)");
    if strata.is_none() {
        anyhow::bail!("Strata's alert never arrived");
    }
    Ok(())
}
