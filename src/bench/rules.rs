//! `strata bench rules`: what one evaluation round of a rule pack costs over the fleet-day
//! data, Strata against Prometheus 2.42 in the same run.
//!
//! Both serve the same day, each in a process of its own (Strata: `strata bench fleet-day
//! --serve`, the OpenMetrics file loaded into a database; Prometheus: the blocks
//! `fleet_day.py prepare` backfilled with promtool), and both are asked every rule's
//! expression as an instant query at the same evaluation times through their HTTP API, one
//! after another, as a rules manager asks its engine once per interval. Time per round and
//! per group, and each server's CPU over the timed rounds (from `/proc`), are printed; the
//! answers are compared, and a difference fails the run.
//! Recording rules' outputs are not fed back (neither side holds them), so rules that read
//! recorded series evaluate to nothing on both.

use super::vs_prometheus::{free_port, proc_stats, spawn_prometheus, wait_ready, Guard};
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The fleet-day set ends here (`fleet_day.py`'s `END`).
const DAY_END: i64 = 1_764_460_800;

/// One instant query's answer, as comparable text per series: labels → value.
async fn query(client: &reqwest::Client, base: &str, expr: &str, t: i64) -> anyhow::Result<BTreeMap<String, f64>> {
    let url = format!("{base}/api/v1/query");
    let text = client.get(&url).query(&[("query", expr), ("time", &t.to_string())]).send().await?.text().await?;
    let body: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{base}: {text}"))?;
    if body["status"] != "success" {
        anyhow::bail!("{base}: {expr}: {body}");
    }
    let mut out = BTreeMap::new();
    match body["data"]["resultType"].as_str() {
        Some("vector") => {
            for s in body["data"]["result"].as_array().cloned().unwrap_or_default() {
                let v: f64 = s["value"][1].as_str().and_then(|x| x.parse().ok()).unwrap_or(f64::NAN);
                out.insert(s["metric"].to_string(), v);
            }
        }
        Some("scalar") => {
            let v: f64 = body["data"]["result"][1].as_str().and_then(|x| x.parse().ok()).unwrap_or(f64::NAN);
            out.insert(String::new(), v);
        }
        other => anyhow::bail!("{expr}: unexpected result type {other:?}"),
    }
    Ok(out)
}

fn same(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((ka, va), (kb, vb))| {
            ka == kb && (va == vb || (va.is_nan() && vb.is_nan()) || (va - vb).abs() <= 1e-9 * va.abs().max(vb.abs()))
        })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

pub async fn run(file: Option<PathBuf>, rules: Vec<PathBuf>, rounds: usize, prometheus: &str) -> anyhow::Result<()> {
    let rounds = rounds.max(1);
    let cache = super::fleet_day::fleet_day_cache().join("small");
    let tsdb = cache.join("prometheus");
    if !tsdb.with_extension("done").exists() {
        anyhow::bail!(
            "{} holds no backfilled Prometheus data: run `../shared/bench/fleet_day.py prepare` first",
            tsdb.display()
        );
    }
    let files = if rules.is_empty() {
        ["gpu-recording.yml", "gpu-alerts.yml", "strata-health.yml"]
            .iter()
            .map(|f| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/rules").join(f))
            .collect()
    } else {
        rules
    };
    let mut exprs: Vec<(String, String)> = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let groups =
            strata_rules::file::parse_groups(&f.display().to_string(), &text).map_err(|e| anyhow::anyhow!("{}", e))?;
        for g in groups {
            for r in g.rules {
                exprs.push((format!("{}/{}", g.name, r.name), r.expr_text.clone()));
            }
        }
    }
    println!(
        "bench rules: {} rules of {} files, {rounds} evaluation rounds over the fleet day",
        exprs.len(),
        files.len()
    );

    // Strata: the day loaded by a process of its own, served on loopback.
    let port = free_port()?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["bench", "fleet-day", "--serve", &format!("127.0.0.1:{port}")]);
    if let Some(f) = &file {
        cmd.arg("--file").arg(f);
    }
    let child = cmd
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting `strata bench fleet-day --serve`")?;
    let strata_pid = child.id();
    let _strata = Guard(child);
    let strata = format!("http://127.0.0.1:{port}");
    println!("  loading the day into Strata ...");
    let loading = Instant::now();
    while query(&reqwest::Client::new(), &strata, "vector(1)", DAY_END).await.is_err() {
        if loading.elapsed() > Duration::from_secs(900) {
            anyhow::bail!("Strata did not serve the fleet day within 15 minutes");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Prometheus on the backfilled blocks (kept: the data is older than any retention).
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("prometheus.yml");
    std::fs::write(&cfg, "global: {}\n")?;
    let port = free_port()?;
    let prom_proc = spawn_prometheus(prometheus, &cfg, &tsdb, port, &["--storage.tsdb.retention.time=100y"])?;
    let prom_pid = prom_proc.0.id();
    let prom = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{prom}/-/ready")).await?;

    let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    // Rounds spread over the day's second half (every range the rules read is inside it).
    let step = (12 * 3600 / rounds.max(1) as i64).max(30);
    let times: Vec<i64> = (0..rounds as i64).map(|i| DAY_END - 12 * 3600 + i * step).collect();
    // One warm-up round each, untimed.
    for (_, e) in &exprs {
        query(&client, &strata, e, times[0]).await?;
        query(&client, &prom, e, times[0]).await?;
    }
    let cpu = |pid: u32| proc_stats(pid).map(|p| p.cpu_secs).unwrap_or(f64::NAN);
    let (cpu_ours, cpu_theirs) = (cpu(strata_pid), cpu(prom_pid));
    let (mut ours, mut theirs, mut differ, mut series) = (Vec::new(), Vec::new(), 0usize, 0usize);
    let mut per_rule: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for &t in &times {
        let (mut a, mut b) = (0.0, 0.0);
        for (name, e) in &exprs {
            let started = Instant::now();
            let s = query(&client, &strata, e, t).await?;
            let ds = started.elapsed().as_secs_f64();
            let started = Instant::now();
            let p = query(&client, &prom, e, t).await?;
            let dp = started.elapsed().as_secs_f64();
            if !same(&s, &p) {
                differ += 1;
                if differ <= 3 {
                    println!("  differs at {t}: {name}: strata {} series, prometheus {}", s.len(), p.len());
                }
            }
            series += p.len();
            a += ds;
            b += dp;
            let slot = per_rule.entry(name.clone()).or_default();
            slot.0 += ds;
            slot.1 += dp;
        }
        ours.push(a);
        theirs.push(b);
    }
    let (cpu_ours, cpu_theirs) = (cpu(strata_pid) - cpu_ours, cpu(prom_pid) - cpu_theirs);
    let mut groups: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for (name, (s, p)) in &per_rule {
        let slot = groups.entry(name.split('/').next().unwrap_or("")).or_default();
        slot.0 += s;
        slot.1 += p;
    }
    let n = times.len().max(1) as f64;
    println!("  per group, mean ms per evaluation: strata / prometheus 2.42");
    for (g, (s, p)) in &groups {
        println!("    {g:<40} {:>7.2} / {:>7.2}", s / n * 1e3, p / n * 1e3);
    }
    let mut costly: Vec<(String, (f64, f64))> = per_rule.into_iter().collect();
    costly.sort_by(|x, y| y.1 .1.total_cmp(&x.1 .1));
    println!("  the rules Prometheus spends most on (total over the rounds, ms: prometheus / strata):");
    for (name, (s, p)) in costly.iter().take(5) {
        println!("    {name:<55} {:>8.1} / {:>8.1}", p * 1e3, s * 1e3);
    }
    let (m_ours, m_theirs) = (median(ours), median(theirs));
    println!(
        "  one round of {} rules, median: strata {:.1} ms, prometheus 2.42 {:.1} ms: {:.2}x Prometheus' speed",
        exprs.len(),
        m_ours * 1e3,
        m_theirs * 1e3,
        m_theirs / m_ours.max(1e-9)
    );
    println!(
        "  answers: {} of {} rule evaluations differ ({} series in Prometheus' answers)",
        differ,
        exprs.len() * times.len(),
        series
    );
    println!(
        "  CPU per round (the server process, from /proc): strata {:.1} ms, prometheus 2.42 {:.1} ms: {:.2}x less",
        cpu_ours / n * 1e3,
        cpu_theirs / n * 1e3,
        cpu_theirs / cpu_ours.max(1e-9)
    );
    if differ > 0 {
        anyhow::bail!("{differ} rule evaluations answered differently from Prometheus");
    }
    Ok(())
}
