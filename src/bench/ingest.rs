//! Ingest throughput: simulated pages through the scrape path (parse, relabel with one
//! metric_relabel rule, append, WAL write) on one thread. Page rendering is not timed.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_edge::config::EdgeConfig;
use strata_edge::scrape::ScrapeIngest;
use strata_edge::targets::Target;
use strata_ingest::exposition::Format;
use strata_model::Labels;
use strata_tsdb::db::{Tsdb, TsdbOptions};

/// Runs the measurement `reps` times on fresh databases; prints the best and the median.
pub fn run(nodes: usize, gpus: usize, scrapes: usize, reps: usize) -> anyhow::Result<()> {
    println!(
        "bench ingest: {nodes} nodes x {gpus} GPUs x 25 DCGM fields, {scrapes} scrapes each, one thread, {reps} runs"
    );
    let mut rates = Vec::new();
    for rep in 0..reps.max(1) {
        rates.push(once(nodes, gpus, scrapes, rep + 1 == reps.max(1))?);
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    println!(
        "  parse + relabel + append + WAL: best {:.2}, median {:.2} M samples/s per core  (goal >= 2 M)",
        rates[rates.len() - 1] / 1e6,
        rates[rates.len() / 2] / 1e6
    );
    Ok(())
}

fn once(nodes: usize, gpus: usize, scrapes: usize, report: bool) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let db = Arc::new(Tsdb::open(dir.path(), TsdbOptions::default())?);
    let cfg = EdgeConfig::parse(
        "scrape_configs:\n  - job_name: dcgm\n    metric_relabel_configs:\n      - source_labels: [__name__]\n        regex: DCGM_FI_DEV_VGPU_LICENSE_STATUS\n        action: drop\n",
        Path::new("bench.yml"),
    )?;
    let job = Arc::new(cfg.jobs[0].clone());
    let fleet = strata_simulator::Fleet::new(1, nodes, gpus);
    let mut loops: Vec<ScrapeIngest> = (0..nodes)
        .map(|n| {
            let t = Target {
                job: "dcgm".into(),
                labels: Labels::from_pairs([
                    ("job", "dcgm".to_string()),
                    ("instance", format!("gpu-node-{n:03}:9400")),
                ]),
                url: String::new(),
            };
            ScrapeIngest::new(t, job.clone(), db.clone())
        })
        .collect();
    let t0 = 1_764_460_800_000i64;
    let (mut busy, mut samples, mut bytes) = (Duration::ZERO, 0u64, 0u64);
    for s in 0..scrapes {
        let ts = t0 + s as i64 * 5000 + 3;
        for (n, lp) in loops.iter_mut().enumerate() {
            let page = fleet.render_node(n, ts).unwrap_or_default();
            let started = Instant::now();
            let r = lp.ingest(page.as_bytes(), Format::Text, ts, Duration::ZERO)?;
            busy += started.elapsed();
            samples += r.scraped as u64;
            bytes += page.len() as u64;
        }
    }
    let secs = busy.as_secs_f64();
    if report {
        println!("  {samples} samples, {:.1} MB of pages in {secs:.2} s of ingest time (last run)", bytes as f64 / 1e6);
        super::print_head_stats(&db);
        println!("  WAL bytes per sample: {:.1}", db.wal_disk_bytes() as f64 / samples as f64);
        // The maintenance loop writes one of these each time the WAL outgrows its bound, so
        // its cost per sample is part of what ingest costs.
        let started = Instant::now();
        let cp = db.checkpoint()?;
        let secs = started.elapsed().as_secs_f64();
        println!(
            "  head checkpoint: {} series, {:.3} bytes/sample, {secs:.3} s ({:.0} ns per sample held)",
            cp.series,
            cp.bytes as f64 / samples as f64,
            secs * 1e9 / samples as f64
        );
    }
    Ok(samples as f64 / secs)
}
