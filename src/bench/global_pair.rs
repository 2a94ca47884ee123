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
    if print {
        let wire = selection_wire_bytes(&day, &Labels::from_pairs([("replica", "a")]));
        println!(
            "  Series over the whole day: {:.0} MB for {samples} samples: {:.3} bytes/sample on the wire (protobuf, before gzip)",
            wire as f64 / 1e6,
            wire as f64 / samples.max(1) as f64
        );
    }
    drop(day);
    let addrs = start_servers(local).await?;
    global_over(&addrs)
}

/// Two StoreAPI servers over `local`, with external labels `replica="a"` and `"b"`, on
/// free loopback ports; their addresses.
async fn start_servers(local: Arc<dyn Store>) -> anyhow::Result<Vec<String>> {
    let mut addrs = Vec::new();
    for replica in ["a", "b"] {
        let external = Labels::from_pairs([("replica", replica)]);
        let info = StoreInfo {
            min_time: i64::MIN,
            max_time: i64::MAX,
            kind: pb::ComponentKind::Edge,
            label_sets: vec![],
            resolutions: vec![],
            complete_until: None,
        };
        addrs.push(start_server(local.clone(), external, info, &format!("edge-{replica}"))?);
    }
    Ok(addrs)
}

/// A StoreAPI server over `store` on a free loopback port, on a runtime of its own (as a
/// process of its own would be: its work does not wait behind the global's tasks, nor
/// theirs behind it); its address.
pub(super) fn start_server(
    store: Arc<dyn Store>,
    external: Labels,
    info: StoreInfo,
    name: &str,
) -> anyhow::Result<String> {
    let info = Arc::new(move || info.clone());
    let limits = SelectLimits { max_series: 10_000_000, max_samples: 2_000_000_000 };
    let service = StoreService::new(store, external, limits, info);
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?.to_string();
    std::thread::Builder::new().name(name.to_string()).spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
        let Ok(rt) = rt else { return };
        rt.block_on(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
            let _ = strata_grpc::serve(
                listener,
                service,
                strata_grpc::ServeOptions::new(Duration::from_secs(600)),
                std::future::pending(),
            )
            .await;
        });
    })?;
    Ok(addr)
}

/// The pair as `serve_pair` starts it, and a regional that holds the day's 5 m and 1 h
/// aggregates (computed here from `local`, timed) and no raw data: the global plans each
/// leaf's resolution over the three.
pub async fn serve_pair_with_aggregates(local: Arc<dyn Store>) -> anyhow::Result<Arc<dyn Store>> {
    let dir = tempfile::tempdir()?;
    let down = Arc::new(strata_downsample::Downsampler::open(dir.path(), Default::default())?);
    let started = Instant::now();
    let series = local.series(&everything()?.matchers, i64::MIN, i64::MAX).await?;
    let (first, last) = sample_span(&local).await?;
    // As if the regional ran a while after the day: every window of it is due.
    let now = last + 6 * strata_downsample::ONE_HOUR + 20 * 60_000;
    let mut slices = 0;
    loop {
        let out = down.run(local.as_ref(), Some(first), now).await?;
        if out.written.is_empty() {
            break;
        }
        slices += out.written.len();
    }
    let bytes: u64 = [strata_downsample::FIVE_MINUTES, strata_downsample::ONE_HOUR]
        .iter()
        .filter_map(|w| down.blocks(*w))
        .map(|b| b.disk_bytes())
        .sum();
    println!(
        "  downsampled {} series into {slices} slices of 5 m and 1 h windows in {:.1} s: {:.1} MB on disk",
        series.len(),
        started.elapsed().as_secs_f64(),
        bytes as f64 / 1e6
    );
    let mut addrs = start_servers(local).await?;
    // It holds no raw data (the pair does): it says so, as an archive of aggregates does.
    let aggregates_only: Arc<dyn Store> = Arc::new(
        strata_downsample::WithAggregates::new(Arc::new(strata_store::memory::MemoryStore::default()), down.clone())
            .with_oldest_raw(Arc::new(|| i64::MAX)),
    );
    let info = StoreInfo {
        min_time: i64::MIN,
        max_time: i64::MIN,
        kind: pb::ComponentKind::Regional,
        label_sets: vec![Labels::from_pairs([("replica", "a")]), Labels::from_pairs([("replica", "b")])],
        resolutions: down.coverage(),
        complete_until: None,
    };
    addrs.push(start_server(aggregates_only, Labels::default(), info.clone(), "regional")?);
    // The pair says what its data spans, as an edge's `Info` does: steps whose ranges reach
    // back before it are then answered from aggregates whole.
    let mut targets = targets_of(&addrs[..2], Some((first, last)))?;
    let remote =
        RemoteStore::new(&addrs[2], RemoteStoreOptions { timeout: Duration::from_secs(600), ..Default::default() })?;
    targets.push(StoreTarget {
        name: addrs[2].clone(),
        store: Arc::new(remote),
        label_sets: info.label_sets,
        min_time: info.min_time,
        max_time: info.max_time,
        resolutions: info.resolutions,
    });
    let fanout = Arc::new(Fanout::new(targets, Duration::from_secs(600)));
    let dedup: Arc<dyn Store> = Arc::new(ReplicaDedup::new(fanout.clone(), vec!["replica".into()]));
    std::mem::forget(dir);
    // As the global wires it: raw steps between aggregate segments evaluated in process.
    let evaluator =
        Arc::new(strata_promql::pushdown::Evaluating::new(ReplicaDedup::new(fanout.clone(), vec!["replica".into()])));
    let planner =
        strata_downsample::ResolutionPlanner::new(dedup, fanout, vec!["replica".into()], Duration::from_secs(600))
            .with_preference(strata_downsample::Prefer::Coarsest)
            .with_raw_evaluator(evaluator);
    Ok(Arc::new(planner))
}

/// The oldest and newest sample of one of the day's metrics.
async fn sample_span(store: &Arc<dyn Store>) -> anyhow::Result<(i64, i64)> {
    let m = Matcher::new(MatchOp::Equal, "__name__", "DCGM_FI_DEV_GPU_UTIL")?;
    let mut req = SelectRequest::new(vec![m], i64::MIN, i64::MAX);
    req.limits = everything()?.limits;
    let found = store.select(&req).await?;
    let first = found.iter().filter_map(|s| s.chunks.first().map(|c| c.min_t)).min();
    let last = found.iter().filter_map(|s| s.chunks.last().map(|c| c.max_t)).max();
    first.zip(last).ok_or_else(|| anyhow::anyhow!("no DCGM_FI_DEV_GPU_UTIL in the data"))
}

/// The fan-out's targets for the pair at `addrs` (replicas a and b); `span`: the time
/// range their data covers, as their `Info` says (unknown without it).
fn targets_of(addrs: &[String], span: Option<(i64, i64)>) -> anyhow::Result<Vec<StoreTarget>> {
    let (min_time, max_time) = span.unwrap_or((i64::MIN, i64::MAX));
    let mut targets = Vec::new();
    for (addr, replica) in addrs.iter().zip(["a", "b"]) {
        let remote =
            RemoteStore::new(addr, RemoteStoreOptions { timeout: Duration::from_secs(600), ..Default::default() })?;
        targets.push(StoreTarget {
            name: addr.clone(),
            store: Arc::new(remote),
            label_sets: vec![Labels::from_pairs([("replica", replica)])],
            min_time,
            max_time,
            resolutions: vec![],
        });
    }
    Ok(targets)
}

/// The global's store over the pair at `addrs` (replicas a and b): dedup over the fan-out.
fn global_over(addrs: &[String]) -> anyhow::Result<(Arc<dyn Store>, Layers)> {
    let targets = targets_of(addrs, None)?;
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

/// `series` simulated DCGM series, a minute of samples each, in a fresh database.
fn load_simulated(series: usize, dir: &std::path::Path) -> anyhow::Result<Arc<strata_tsdb::db::Tsdb>> {
    use super::scale::fleet::SimFleet;
    let db = Arc::new(strata_tsdb::db::Tsdb::open(dir, Default::default())?);
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
    Ok(db)
}

/// `strata bench global-servers` (run by `bench global` as its child): the simulated
/// series served as an HA pair; the two addresses go to `addr_file` once serving.
pub async fn serve_simulated_pair(series: usize, addr_file: &std::path::Path) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = load_simulated(series, dir.path())?;
    let addrs = start_servers(Arc::new(strata_tsdb::TsdbStore(db))).await?;
    let tmp = addr_file.with_extension("tmp");
    std::fs::write(&tmp, addrs.join("\n"))?;
    std::fs::rename(&tmp, addr_file)?;
    std::future::pending::<()>().await;
    Ok(())
}

/// The child process serving the pair; killed when dropped.
struct Servers(std::process::Child);

impl Drop for Servers {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `strata bench global`: `series` simulated DCGM series (a minute of samples each) served
/// as an HA pair by a child process, all selected through the global here, so the peak
/// memory measured is the global's alone: streamed a batch at a time (as a stacked
/// global's StoreAPI passes the merge on), then gathered whole (as the engine reads it).
pub async fn fanout_memory(series: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let addr_file = dir.path().join("addrs");
    let started = Instant::now();
    let child = std::process::Command::new(std::env::current_exe()?)
        .args(["bench", "global-servers", "--series", &series.to_string(), "--addr-file"])
        .arg(&addr_file)
        .spawn()?;
    let mut child = Servers(child);
    let addrs = loop {
        if let Ok(text) = std::fs::read_to_string(&addr_file) {
            break text.lines().map(str::to_string).collect::<Vec<_>>();
        }
        if let Some(status) = child.0.try_wait()? {
            anyhow::bail!("the servers' process ended ({status}) before serving");
        }
        if started.elapsed() > Duration::from_secs(1800) {
            anyhow::bail!("the servers' process did not start serving within 30 minutes");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "bench global: {series} series x 12 samples loaded and served as an HA pair by a child process in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (global, _) = global_over(&addrs)?;
    let (n, secs, peak) = peak_during(async {
        let mut batches = global.select_batches(&everything()?).await?;
        let mut n = 0;
        while let Some(b) = batches.next_batch().await? {
            n += b.len();
        }
        Ok(n)
    })
    .await?;
    println!(
        "  {n} series from 2 replicas fanned out, merged and deduplicated a batch at a time in {secs:.1} s ({:.0} k series/s): the global's peak memory {peak:.0} MB over what it held before",
        n as f64 / secs / 1e3
    );
    let (n, secs, peak) = peak_during(async { Ok(global.select(&everything()?).await?.len()) }).await?;
    println!(
        "  the same gathered whole (as the PromQL engine reads a selection) in {secs:.1} s: peak {peak:.0} MB over before, {:.0} bytes per series returned",
        peak * 1e6 / n.max(1) as f64
    );
    drop(child);
    Ok(())
}

/// Runs `f`; returns its answer, the seconds it took and the process's peak RSS during it
/// over the RSS before it, in MB (the kernel resets VmHWM to the current RSS on request).
async fn peak_during(f: impl std::future::Future<Output = anyhow::Result<usize>>) -> anyhow::Result<(usize, f64, f64)> {
    std::fs::write("/proc/self/clear_refs", "5")?;
    // One measurement's freed memory would otherwise hide the next one's peak.
    strata_tsdb::db::release_free_memory();
    let before = super::scale::rss_mb_of("self", "VmRSS:");
    let started = Instant::now();
    let n = f.await?;
    let secs = started.elapsed().as_secs_f64();
    Ok((n, secs, super::scale::rss_mb_of("self", "VmHWM:") - before))
}
