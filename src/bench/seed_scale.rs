//! `strata bench seed-scale`: the seed's "over a billion points" job at its own scale,
//! 16,000 GPUs × the six fleet-day fields, 24 h at 30 s (276 M samples). The day is written
//! straight into a database (no parsing: `bench ingest` measures that) and cut into blocks;
//! a regional beside it downsamples the day (its peak memory measured while it does), and a
//! global over the day served as an HA pair and the regional answers the fleet-day
//! benchmark's twelve queries over the whole day through the HTTP API, each timed, from the
//! aggregates where they are exact and from raw data only (twelve queries, ten distinct:
//! the set asks two of them at step 60 too, here all are at 300). The seed's self-managed
//! Prometheus timed out at 60 s on such queries; the goal is under 1 s each.
//!
//! The memory figure is the process' resident peak from just before the regional starts
//! downsampling (the peak reset through `/proc/self/clear_refs`) to when the servers are up:
//! heap the loading freed can be reused without showing, so it is a lower bound.

use super::scale::fleet::Rng;
use super::scale::{peak_rss_mb_of, rss_mb_of};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_model::{Labels, Metadata, MetricType, Sample};
use strata_tsdb::db::{Tsdb, TsdbOptions};

/// The fleet-day benchmark's queries (`../shared/bench/queries.tsv`), each over the day.
pub(super) const QUERIES: [&str; 12] = [
    "avg by (cluster) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m]))",
    "max by (Hostname) (max_over_time(DCGM_FI_DEV_GPU_TEMP[5m]))",
    "sum by (cluster) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])) / 1000",
    "topk(10, avg_over_time(DCGM_FI_DEV_GPU_TEMP[1h]))",
    "sum by (namespace) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h]))",
    "count by (cluster) (max_over_time(DCGM_FI_DEV_XID_ERRORS[5m]) > 0)",
    "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL)",
    "quantile by (cluster) (0.99, DCGM_FI_DEV_POWER_USAGE)",
    "avg by (cluster) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m]))",
    "sum by (cluster) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])) / 1000",
    "max by (cluster) (DCGM_FI_DEV_FB_USED)",
    "avg(DCGM_FI_DEV_GPU_UTIL > 0) by (cluster)",
];

/// The six fields, as dcgm-exporter types them.
pub(super) const FIELDS: [(&str, MetricType); 6] = [
    ("DCGM_FI_DEV_GPU_UTIL", MetricType::Gauge),
    ("DCGM_FI_DEV_GPU_TEMP", MetricType::Gauge),
    ("DCGM_FI_DEV_POWER_USAGE", MetricType::Gauge),
    ("DCGM_FI_DEV_FB_USED", MetricType::Gauge),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", MetricType::Counter),
    ("DCGM_FI_DEV_XID_ERRORS", MetricType::Gauge),
];

const DAY_MS: i64 = 86_400_000;

/// Labels of field `f` of GPU `g`: eight GPUs a node, 250 nodes a cluster, a namespace per
/// GPU (its job's team).
pub(super) fn labels(g: usize, f: usize) -> Labels {
    let (node, dev) = (g / 8, g % 8);
    let uuid = Rng((g as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1).next();
    Labels::from_pairs([
        ("__name__", FIELDS[f].0.to_string()),
        ("gpu", dev.to_string()),
        ("UUID", format!("GPU-{:08x}-{:04x}", uuid as u32, (uuid >> 32) as u16)),
        ("device", format!("nvidia{dev}")),
        ("modelName", "NVIDIA H100 80GB HBM3".to_string()),
        ("Hostname", format!("gpu-node-{node:05}")),
        ("cluster", format!("c{}", node / 250)),
        ("namespace", format!("team-{:02}", (uuid >> 40) % 24)),
        ("instance", format!("10.{}.{}.{}:9400", node / 65536, (node / 256) % 256, node % 256)),
        ("job", "dcgm".to_string()),
    ])
}

/// The next value of field `f` from `v` (DCGM-like: integer gauges that drift, power in
/// milliwatt-exact watts, an energy counter in mJ, XID errors mostly 0).
pub(super) fn next_value(f: usize, v: f64, r: u64) -> f64 {
    match f {
        0 => (v + (r % 21) as f64 - 10.0).clamp(0.0, 100.0),
        1 => (v + (r % 3) as f64 - 1.0).clamp(28.0, 92.0),
        2 => ((v * 1000.0 + (r % 20_001) as f64 - 10_000.0).clamp(60_000.0, 700_000.0)).round() / 1000.0,
        3 => (v + ((r % 2049) as f64 - 1024.0)).clamp(0.0, 81_559.0),
        4 => v + 6_000_000.0 + (r % 3_000_000) as f64,
        _ => {
            if r.is_multiple_of(200_000) {
                [13.0, 31.0, 43.0, 79.0][(r >> 20) as usize % 4]
            } else {
                0.0
            }
        }
    }
}

/// The day `[end − 24 h, end)` of `gpus` GPUs every `interval_s`, in blocks.
fn load(dir: &std::path::Path, gpus: usize, hours: u64, interval_s: u64) -> anyhow::Result<(Tsdb, i64)> {
    let opts = TsdbOptions { retention: Duration::from_secs(100 * 86400), ..Default::default() };
    let db = Tsdb::open(dir, opts)?;
    for (name, metric_type) in FIELDS {
        db.set_metadata(name, Metadata { metric_type, ..Default::default() })?;
    }
    let series: Vec<_> = (0..gpus)
        .flat_map(|g| (0..FIELDS.len()).map(move |f| (g, f)))
        .map(|(g, f)| db.series(&labels(g, f)).map(|s| (f, s)))
        .collect::<Result<_, _>>()?;
    let end = strata_model::time::now_ms().div_euclid(DAY_MS) * DAY_MS;
    let (step, steps) = (interval_s as i64 * 1000, hours * 3600 / interval_s);
    let start = end - steps as i64 * step;
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut values: Vec<f64> = series.iter().map(|(f, _)| [50.0, 60.0, 300.0, 40_000.0, 0.0, 0.0][*f]).collect();
    let started = Instant::now();
    let mut batch = Vec::with_capacity(series.len());
    for k in 0..steps as i64 {
        batch.clear();
        for (i, (f, s)) in series.iter().enumerate() {
            values[i] = next_value(*f, values[i], rng.next());
            // Scrape jitter, as the fleet-day set has: up to 39 ms.
            let t = start + k * step + (rng.next() % 40) as i64;
            batch.push((s.clone(), Sample::new(t, values[i])));
        }
        let out = db.commit(&batch)?;
        anyhow::ensure!(out.rejected.is_empty(), "{} samples refused at step {k}", out.rejected.len());
    }
    let samples = steps * series.len() as u64;
    println!(
        "  {samples} samples of {} series appended in {:.1} s ({:.2} M samples/s)",
        series.len(),
        started.elapsed().as_secs_f64(),
        samples as f64 / started.elapsed().as_secs_f64() / 1e6
    );
    let started = Instant::now();
    let blocks = db.flush_head()?;
    println!(
        "  cut into {blocks} blocks and compacted in {:.1} s: {:.3} bytes per sample on disk",
        started.elapsed().as_secs_f64(),
        db.blocks().disk_bytes() as f64 / samples.max(1) as f64
    );
    Ok((db, end))
}

pub async fn run(gpus: usize, hours: u64, interval_s: u64, reps: usize, through_stack: bool) -> anyhow::Result<()> {
    println!("bench seed-scale: {gpus} GPUs x {} fields, {hours} h at {interval_s} s", FIELDS.len());
    let dir = tempfile::tempdir()?;
    let path = dir.path().to_path_buf();
    let (db, end) = tokio::task::spawn_blocking(move || load(&path, gpus, hours, interval_s)).await??;
    let (end, start) = (end / 1000, end / 1000 - hours as i64 * 3600);
    if through_stack {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], super::vs_prometheus::free_port()?));
        let started = Instant::now();
        let _stack = super::through_stack::start(db, addr).await?;
        println!("  through the tiers: the global answers {:.0} s after loading", started.elapsed().as_secs_f64());
        return ask_each(addr, (start, end), reps).await;
    }
    let local: Arc<dyn strata_store::Store> = Arc::new(strata_tsdb::TsdbStore(Arc::new(db)));
    // The peak from here on: the raw day is already held (its head emptied into blocks).
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = rss_mb_of("self", "VmRSS:");
    let store = super::global_pair::serve_pair_with_aggregates(local).await?;
    let peak = peak_rss_mb_of("self");
    if reset {
        println!(
            "  memory while downsampling: {before:.0} MB resident before, peak {peak:.0} MB (+{:.0} MB)",
            peak - before
        );
    } else {
        println!("  memory: {before:.0} MB resident before downsampling; the process' peak {peak:.0} MB (its peak could not be reset)");
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let mut opts = strata_api::ApiOptions::default();
    opts.engine.max_samples = 1_000_000_000;
    opts.engine.timeout = Duration::from_secs(300);
    let app = strata_api::router_with(store, opts);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let asked = ask_each(addr, (start, end), reps).await;
    server.abort();
    asked
}

/// The twelve queries over `[start, end]` (seconds) at the Prometheus API at `addr`, each
/// asked `reps` times, from aggregates where exact and from raw data only; their medians.
async fn ask_each(addr: std::net::SocketAddr, (start, end): (i64, i64), reps: usize) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(600)).build()?;
    for resolution in ["auto", "raw"] {
        let mut worst: f64 = 0.0;
        println!(
            "  the twelve queries over the data at step 300, max_source_resolution={resolution} (median of {reps}):"
        );
        for q in QUERIES {
            let form = [
                ("query", q.to_string()),
                ("start", start.to_string()),
                ("end", end.to_string()),
                ("step", "300".to_string()),
                ("max_source_resolution", resolution.to_string()),
            ];
            let mut times = Vec::with_capacity(reps);
            let mut series = 0;
            for _ in 0..reps {
                let started = Instant::now();
                let resp = client.post(format!("http://{addr}/api/v1/query_range")).form(&form).send().await?;
                let text = resp.text().await?;
                times.push(started.elapsed().as_secs_f64());
                let body: serde_json::Value = serde_json::from_str(&text)?;
                anyhow::ensure!(body["status"] == "success", "{q}: {body}");
                series = body["data"]["result"].as_array().map_or(0, Vec::len);
            }
            times.sort_by(f64::total_cmp);
            // The lower middle of an even count.
            let median = times[(times.len() - 1) / 2];
            worst = worst.max(median);
            println!("    {:>8.1} ms  {series:>5} series  {q}", median * 1e3);
        }
        println!("    slowest: {:.2} s (goal < 1 s; the seed's Prometheus timed out at 60 s)", worst);
    }
    Ok(())
}
