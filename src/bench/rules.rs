//! `strata bench rules`: what one evaluation round of a rule pack costs over the fleet-day
//! data, Strata against Prometheus 2.42 in the same run.
//!
//! Both serve the same day (Strata from the OpenMetrics file loaded into a database here,
//! Prometheus from the blocks `fleet_day.py prepare` backfilled with promtool), and both
//! are asked every rule's expression as an instant query at the same evaluation times
//! through their HTTP API, one after another, as a rules manager asks its engine once per
//! interval. The answers are compared: a round that differs is counted, not timed alone.
//! Recording rules' outputs are not fed back (neither side holds them), so rules that read
//! recorded series evaluate to nothing on both.

use super::vs_prometheus::{free_port, spawn_prometheus, wait_ready};
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

    // Strata: the day in a database here, served on loopback.
    let super::fleet_day::Loaded(db, _dir) = tokio::task::spawn_blocking(move || super::fleet_day::run(file)).await??;
    let store: std::sync::Arc<dyn strata_store::Store> =
        std::sync::Arc::new(strata_tsdb::TsdbStore(std::sync::Arc::new(db)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let strata = format!("http://{}", listener.local_addr()?);
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let app = strata_api::router_with(store, strata_api::ApiOptions::default());
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.changed().await;
            })
            .await;
    });

    // Prometheus on the backfilled blocks (kept: the data is older than any retention).
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("prometheus.yml");
    std::fs::write(&cfg, "global: {}\n")?;
    let port = free_port()?;
    let _prom = spawn_prometheus(prometheus, &cfg, &tsdb, port, &["--storage.tsdb.retention.time=100y"])?;
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
    let _ = stop.send(true);
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
    if differ > 0 {
        anyhow::bail!("{differ} rule evaluations answered differently from Prometheus");
    }
    Ok(())
}
