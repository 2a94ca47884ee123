//! The fleet-day set behind a global querier: one database served as an HA pair (two
//! StoreAPI servers on loopback with external labels `replica="a"` and `"b"`, the same data
//! as two edges that scraped the same fleet would hold), read through the fan-out and the
//! replica dedup, as `strata global` reads edges. Prints the bytes per sample a `Series`
//! call over the whole day puts on the wire.

use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_dedup::ReplicaDedup;
use strata_fanout::{Fanout, StoreTarget};
use strata_grpc::{pb, selection_wire_bytes, RemoteStore, RemoteStoreOptions, StoreInfo, StoreService};
use strata_model::{Labels, MatchOp, Matcher};
use strata_store::{SelectLimits, SelectRequest, Store};

fn everything() -> anyhow::Result<SelectRequest> {
    let all = vec![Matcher::new(MatchOp::Regex, "__name__", ".+")?];
    let mut req = SelectRequest::new(all, i64::MIN, i64::MAX);
    req.limits = SelectLimits { max_series: usize::MAX, max_samples: u64::MAX };
    Ok(req)
}

/// Starts the pair and returns the global's store (dedup over the fan-out).
pub async fn serve_pair(local: Arc<dyn Store>) -> anyhow::Result<Arc<dyn Store>> {
    let (global, stages) = start_pair(local.clone(), true).await?;
    stage_times(&local, &stages, &global).await?;
    // One whole-day select through the global, timed: the fan-out, two streams, the dedup.
    let started = Instant::now();
    let n = global.select(&everything()?).await?.len();
    println!(
        "  the whole day through the global (2 replicas, deduplicated): {n} series in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(global)
}

/// The layers under the global's store, to time each on its own.
struct Layers {
    one_replica: Arc<dyn Store>,
    fanout: Arc<dyn Store>,
}

/// The pair's servers and the global over them; with `print`, the wire bytes per sample.
async fn start_pair(local: Arc<dyn Store>, print: bool) -> anyhow::Result<(Arc<dyn Store>, Layers)> {
    let day = if print { local.select(&everything()?).await? } else { Vec::new() };
    let samples: u64 = day.iter().flat_map(|s| &s.chunks).map(|c| c.n as u64).sum();
    let mut targets = Vec::new();
    for replica in ["a", "b"] {
        let external = Labels::from_pairs([("replica", replica)]);
        let wire = selection_wire_bytes(&day, &external);
        if replica == "a" && print {
            println!(
                "  Series over the whole day: {:.0} MB for {samples} samples: {:.3} bytes/sample on the wire (protobuf, before gzip)",
                wire as f64 / 1e6,
                wire as f64 / samples.max(1) as f64
            );
        }
        let info = Arc::new(|| StoreInfo {
            min_time: i64::MIN,
            max_time: i64::MAX,
            kind: pb::ComponentKind::Edge,
            label_sets: vec![],
        });
        let limits = SelectLimits { max_series: 10_000_000, max_samples: 2_000_000_000 };
        let service = StoreService::new(local.clone(), external.clone(), limits, info);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        tokio::spawn(strata_grpc::serve(listener, service, Duration::from_secs(600), std::future::pending()));
        let remote =
            RemoteStore::new(&addr, RemoteStoreOptions { timeout: Duration::from_secs(600), ..Default::default() })?;
        targets.push(StoreTarget {
            name: addr,
            store: Arc::new(remote),
            label_sets: vec![external],
            min_time: i64::MIN,
            max_time: i64::MAX,
        });
    }
    drop(day);
    let one_replica = targets[0].store.clone();
    let fanout: Arc<dyn Store> = Arc::new(Fanout::new(targets, Duration::from_secs(600)));
    let global = Arc::new(ReplicaDedup::new(fanout.clone(), vec!["replica".into()]));
    Ok((global, Layers { one_replica, fanout }))
}

/// One metric's day selected from each layer in turn (median of 15), so the global's
/// overhead shows where it is spent: the store itself, one replica over gRPC, both through
/// the fan-out, and the dedup over them.
async fn stage_times(local: &Arc<dyn Store>, layers: &Layers, global: &Arc<dyn Store>) -> anyhow::Result<()> {
    let metric = Matcher::new(MatchOp::Equal, "__name__", "DCGM_FI_DEV_GPU_UTIL")?;
    let mut req = SelectRequest::new(vec![metric], i64::MIN, i64::MAX);
    req.limits = everything()?.limits;
    let mut line = String::from("  one metric's day selected from");
    for (name, store) in [
        ("the store", local),
        ("one replica over gRPC", &layers.one_replica),
        ("both through the fan-out", &layers.fanout),
        ("the fan-out and dedup", global),
    ] {
        let mut times = Vec::new();
        for _ in 0..15 {
            let started = Instant::now();
            store.select(&req).await?;
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        line.push_str(&format!(" {name} {:.1} ms,", times[times.len() / 2]));
    }
    println!("{}", line.trim_end_matches(','));
    Ok(())
}

/// `strata bench global`: `series` simulated DCGM series (a minute of samples each) served
/// as an HA pair, all selected through the global. The process's peak memory during the
/// select, over what it held before, is the global's (the two servers' selections, which
/// share the database's chunks, are counted in it too).
pub async fn fanout_memory(series: usize) -> anyhow::Result<()> {
    use super::scale::fleet::SimFleet;
    let dir = tempfile::tempdir()?;
    let db = Arc::new(strata_tsdb::db::Tsdb::open(dir.path(), Default::default())?);
    let started = Instant::now();
    let mut fleet = SimFleet::new(series);
    let handles: Vec<_> = (0..series).map(|i| db.series(&SimFleet::labels(i))).collect::<Result<_, _>>()?;
    for (family, metric_type, help) in SimFleet::metadata() {
        db.set_metadata(family, strata_model::Metadata { metric_type, help: help.to_string(), unit: String::new() })?;
    }
    let t0 = strata_model::time::now_ms() - 120_000;
    for k in 0..12 {
        fleet.step();
        let batch: Vec<_> = handles
            .iter()
            .zip(&fleet.values)
            .map(|(h, &v)| (h.clone(), strata_model::Sample::new(t0 + k * 5_000, v)))
            .collect();
        db.commit_distinct(&batch)?;
    }
    drop(handles);
    println!("bench global: {series} series x 12 samples loaded in {:.1} s", started.elapsed().as_secs_f64());
    let (global, _) = start_pair(Arc::new(strata_tsdb::TsdbStore(db)), false).await?;
    // Peak memory from here on: the kernel resets VmHWM to the current RSS.
    std::fs::write("/proc/self/clear_refs", "5")?;
    let before = super::scale::rss_mb_of("self", "VmRSS:");
    let started = Instant::now();
    let found = global.select(&everything()?).await?;
    let secs = started.elapsed().as_secs_f64();
    let peak = super::scale::rss_mb_of("self", "VmHWM:");
    println!(
        "  {} series from 2 replicas fanned out, streamed and deduplicated in {secs:.1} s ({:.0} k series/s)",
        found.len(),
        found.len() as f64 / secs / 1e3
    );
    println!(
        "  peak memory of the select: {:.0} MB over {before:.0} MB before it: {:.0} bytes per series returned",
        peak - before,
        (peak - before) * 1e6 / found.len().max(1) as f64
    );
    Ok(())
}
