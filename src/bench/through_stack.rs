//! `strata bench fleet-day --serve ADDR --through-stack`: the fleet day flowing through the
//! tiers as users run them. Two edges of an HA pair (replicas `a` and `b`, each its own copy
//! of the day, each a StoreAPI on loopback) forward everything they hold to a `strata
//! regional` process, which stores it, deduplicates and downsamples it on its own loop; a
//! `strata global` process over the two edges and the regional serves the Prometheus API
//! at `ADDR`. Prints how long forwarding and downsampling took and the regional's peak
//! memory; the queries are then `fleet_day_at_step.py`'s, against the global.
//!
//! The day is a year or more old and the regional's clock is today's: its windows are all
//! due at once, and its retentions are set so that nothing of the day is aged out.

use super::vs_prometheus::{free_port, wait_ready, Guard};
use anyhow::Context;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_forward::{Forwarder, ForwarderOptions, ForwarderStats, WalHolds};
use strata_grpc::{pb, RemoteStore, RemoteStoreOptions, StoreInfo};
use strata_model::Labels;
use strata_tsdb::db::{Tsdb, TsdbOptions};

/// What keeps the stack up: the processes (killed when dropped) and the forwarders.
pub struct Stack {
    _regional: Guard,
    _global: Guard,
    _forwarders: tokio::sync::watch::Sender<bool>,
    _edge_dirs: tempfile::TempDir,
}

/// The regional's configuration: nothing of an old day aged out.
const REGIONAL_CONFIG: &str = "strata:
  retention: 3650d
  downsample:
    retention_5m: 3650d
    retention_1h: 3650d
";

/// Edge `a` is `day` (in `day_dir`); edge `b` a copy of it. Returns once the global at
/// `serve` answers from aggregates covering the whole day.
pub async fn start(day: Tsdb, serve: std::net::SocketAddr) -> anyhow::Result<Stack> {
    let work = tempfile::tempdir()?;
    let opts = TsdbOptions { retention: Duration::from_secs(100 * 86400), ..Default::default() };
    let copy_from = day.dir().to_path_buf();
    drop(day);
    let mut edges = Vec::new();
    for replica in ["a", "b"] {
        let dir = work.path().join(format!("edge-{replica}"));
        super::fleet_day::copy_dir(&copy_from, &dir)?;
        edges.push((replica, Arc::new(Tsdb::open(&dir, opts.clone())?)));
    }
    let (first, last) = (edges[0].1.min_time(), edges[0].1.max_time());
    let samples = edges[0].1.blocks().healthy().iter().map(|b| b.meta().stats.samples).sum::<u64>();

    let (http, grpc) = (free_port()?, free_port()?);
    let cfg = work.path().join("regional.yml");
    std::fs::write(&cfg, REGIONAL_CONFIG)?;
    let regional = Guard(
        Command::new(std::env::current_exe()?)
            .args(["regional", "--config", &cfg.display().to_string()])
            .args(["--data", &work.path().join("regional").display().to_string()])
            .args(["--http-listen", &format!("127.0.0.1:{http}"), "--grpc-listen", &format!("127.0.0.1:{grpc}")])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .context("starting the regional")?,
    );
    wait_ready(&format!("http://127.0.0.1:{http}/-/ready")).await?;
    let regional_pid = regional.0.id().to_string();

    // Each edge forwards everything it holds (a regional met for the first time), and goes
    // on forwarding, as an edge does.
    let started = Instant::now();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut stats = Vec::new();
    let mut store_addrs = Vec::new();
    for (replica, db) in &edges {
        let mut o = ForwarderOptions::new(&format!("127.0.0.1:{grpc}"));
        o.upstream = format!("regional-{replica}");
        o.external_labels = Labels::from_pairs([("replica", *replica)]);
        let s = ForwarderStats::default();
        stats.push(s.clone());
        let f = Forwarder::new(db.clone(), WalHolds::new(db.clone()), o, s);
        tokio::spawn(f.run(stopped.clone()));
        let info = StoreInfo {
            min_time: first,
            max_time: last,
            kind: pb::ComponentKind::Edge,
            label_sets: vec![],
            resolutions: vec![],
            complete_until: None,
        };
        let store = Arc::new(strata_tsdb::TsdbStore(db.clone()));
        let external = Labels::from_pairs([("replica", *replica)]);
        store_addrs.push(super::global_pair::start_server(store, external, info, &format!("edge-{replica}"))?);
    }
    while stats.iter().any(|s| s.samples_acked.get() < samples) {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "the edges did not forward the day in 30 minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let forwarded = started.elapsed().as_secs_f64();
    println!(
        "  2 edges forwarded {samples} samples each to the regional process in {forwarded:.1} s: {:.2} M samples/s",
        2.0 * samples as f64 / forwarded / 1e6
    );

    // The regional's own loop downsamples the deduplicated day; its `Info` says when the
    // windows of both resolutions cover it.
    let remote = RemoteStore::new(&format!("127.0.0.1:{grpc}"), RemoteStoreOptions::default())?;
    loop {
        let info = remote.info().await?;
        let covers = |w: i64| {
            info.resolution_ranges.iter().any(|r| r.resolution_ms == w && r.min_time <= first + 1 && r.max_time >= last)
        };
        if covers(strata_downsample::FIVE_MINUTES) && covers(strata_downsample::ONE_HOUR) {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "the regional did not downsample the day in 30 minutes: it covers {:?}",
            info.resolution_ranges
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "  the regional's windows cover the day {:.1} s after forwarding began; its peak memory {:.0} MB",
        started.elapsed().as_secs_f64(),
        super::scale::peak_rss_mb_of(&regional_pid)
    );

    store_addrs.push(format!("127.0.0.1:{grpc}"));
    let stores: Vec<String> = store_addrs.iter().map(|a| format!("'{a}'")).collect();
    let gcfg = work.path().join("global.yml");
    std::fs::write(&gcfg, format!("stores: [{}]\nstore_timeout: 5m\n", stores.join(", ")))?;
    let global = Guard(
        Command::new(std::env::current_exe()?)
            .args(["global", "--config", &gcfg.display().to_string(), "--http-listen", &serve.to_string()])
            // The limits `fleet_day.py` gives Prometheus (Strata counts samples over all steps).
            .args(["--query.max-samples", "1000000000"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .context("starting the global")?,
    );
    wait_ready(&format!("http://{serve}/-/ready")).await?;
    Ok(Stack { _regional: regional, _global: global, _forwarders: stop, _edge_dirs: work })
}
