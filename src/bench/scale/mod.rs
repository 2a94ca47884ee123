//! `strata bench scale`: the storage at a chosen number of series, driven through the
//! database's append path directly (no HTTP, no parsing: `bench ingest` measures those),
//! with DCGM-like series at 5 s over simulated hours, the maintenance loop cutting and
//! compacting blocks beside it as it does in a tier. Prints the sustained ingest rate, peak
//! resident memory, bytes on disk per sample and the restart time at the end.

use anyhow::Context;
use fleet::SimFleet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_model::{Metadata, Sample};
use strata_tsdb::db::{Tsdb, TsdbOptions};
use strata_tsdb::head::MemSeries;

pub(super) mod fleet;
mod prometheus;

pub use prometheus::run as run_prometheus;

/// Series appended per commit (a large scrape's worth).
const BATCH: usize = 20_000;

fn peak_rss_mb() -> f64 {
    peak_rss_mb_of("self")
}

/// VmHWM of a process (`self` or a pid), in MB.
pub(super) fn peak_rss_mb_of(pid: &str) -> f64 {
    rss_mb_of(pid, "VmHWM:")
}

/// A memory line of `/proc/<pid>/status` (`VmHWM:` peak, `VmRSS:` now), in MB.
pub(super) fn rss_mb_of(pid: &str, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).map(str::to_string))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()))
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// Lookups of existing series (what a remote write or a scrape with a cold cache does per
/// series) from one thread and from two at once: whether the head's series table, a hash
/// map under a read-write lock, holds back concurrent ingest, the case for a sharded map
/// such as `dashmap`.
fn print_lookup_scaling(db: &Tsdb, series: usize) {
    let sample: Vec<_> = (0..series.min(50_000)).map(|i| SimFleet::labels(i * (series / 50_000).max(1))).collect();
    let rate = |threads: usize| -> f64 {
        let started = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..4 {
                        for l in &sample {
                            let _ = db.series(l);
                        }
                    }
                });
            }
        });
        (threads * 4 * sample.len()) as f64 / started.elapsed().as_secs_f64()
    };
    let (one, two) = (rate(1), rate(2));
    println!(
        "  series lookup: {:.2} M/s from 1 thread, {:.2} M/s from 2 ({:.2}x; 2.0 is no contention)",
        one / 1e6,
        two / 1e6,
        two / one
    );
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

/// The simulated time: `(start, steps, step_ms)`. The start is the beginning of a 2-hour
/// window (the default block range), so that whether and when blocks are cut depends on
/// the hours asked, not on the time of day the benchmark runs; both sides of the Prometheus
/// comparison use it.
pub(super) fn sim_window(hours: f64, interval_s: u64) -> (i64, usize, i64) {
    let step_ms = (interval_s.max(1) * 1000) as i64;
    let steps = ((hours * 3600.0) / interval_s.max(1) as f64).ceil() as usize;
    let range: i64 = 2 * 3600 * 1000;
    let start = (strata_model::time::now_ms() - steps as i64 * step_ms).div_euclid(range) * range;
    (start, steps, step_ms)
}

pub fn run(
    series: usize,
    hours: f64,
    interval_s: u64,
    dir: Option<std::path::PathBuf>,
    crash_restart: bool,
) -> anyhow::Result<f64> {
    let tmp = tempfile::tempdir()?;
    let dir = dir.unwrap_or_else(|| tmp.path().to_path_buf());
    let opts = TsdbOptions::default();
    let db = Arc::new(Tsdb::open(&dir, opts.clone()).with_context(|| format!("opening {}", dir.display()))?);
    let started = Instant::now();
    let mut fleet = SimFleet::new(series);
    println!(
        "bench scale: {series} series ({} GPUs x 25 DCGM fields) at {interval_s} s for {hours} simulated hours, in {}",
        series.div_ceil(25),
        dir.display()
    );
    let handles: Vec<Arc<MemSeries>> =
        (0..fleet.len()).map(|i| db.series(&SimFleet::labels(i))).collect::<Result<_, _>>()?;
    for (family, metric_type, help) in SimFleet::metadata() {
        db.set_metadata(family, Metadata { metric_type, help: help.to_string(), unit: String::new() })?;
    }
    println!("  {} series created in {:.1} s", handles.len(), started.elapsed().as_secs_f64());
    print_lookup_scaling(&db, series);

    // Maintenance beside the ingest, as the tier's loop runs it.
    let stop = Arc::new(AtomicBool::new(false));
    let maint = {
        let (db, stop) = (db.clone(), stop.clone());
        std::thread::spawn(move || -> anyhow::Result<(usize, usize)> {
            let (mut cut, mut compacted) = (0, 0);
            // The tier's interval (60 s for 2-hour blocks), in simulated time: the ingest runs
            // faster than the clock, so the loop is paced by the data's time, not the wall's.
            let every = strata_tsdb::loops::maintenance_interval(db.options().block_range).as_millis() as i64;
            let mut last = i64::MIN;
            while !stop.load(Ordering::Relaxed) {
                let now = db.head().max_time();
                if now != i64::MIN && now.saturating_sub(last) >= every {
                    last = now;
                    let (rss, started) = (rss_mb_of("self", "VmRSS:"), Instant::now());
                    let out = db.maintain()?;
                    if out.blocks_cut + out.blocks_compacted > 0 {
                        println!(
                            "  ... maintenance: {} cut, {} compacted in {:.1} s; RSS {rss:.0} MB before, {:.0} MB after, peak {:.0} MB",
                            out.blocks_cut,
                            out.blocks_compacted,
                            started.elapsed().as_secs_f64(),
                            rss_mb_of("self", "VmRSS:"),
                            peak_rss_mb()
                        );
                    }
                    cut += out.blocks_cut;
                    compacted += out.blocks_compacted;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok((cut, compacted))
        })
    };

    let (start, steps, step_ms) = sim_window(hours, interval_s);
    let steps = steps as i64;
    let (mut samples, mut rejected) = (0u64, 0usize);
    let ingest_started = Instant::now();
    let mut batch: Vec<(Arc<MemSeries>, Sample)> = Vec::with_capacity(BATCH);
    let mut last_report = Instant::now();
    for k in 0..steps {
        let t = start + k * step_ms + (k % 7);
        fleet.step();
        for (h, &v) in handles.iter().zip(&fleet.values) {
            batch.push((h.clone(), Sample::new(t, v)));
            if batch.len() == BATCH {
                let out = db.commit_distinct(&batch)?;
                samples += out.appended as u64;
                rejected += out.rejected.len();
                batch.clear();
            }
        }
        if !batch.is_empty() {
            let out = db.commit_distinct(&batch)?;
            samples += out.appended as u64;
            rejected += out.rejected.len();
            batch.clear();
        }
        if last_report.elapsed() > Duration::from_secs(30) {
            last_report = Instant::now();
            println!(
                "  ... {:.1} of {hours} simulated hours, {:.0} k samples/s so far, peak RSS {:.0} MB, {} blocks",
                (k + 1) as f64 * interval_s as f64 / 3600.0,
                samples as f64 / ingest_started.elapsed().as_secs_f64() / 1e3,
                peak_rss_mb(),
                db.blocks().len()
            );
        }
    }
    let secs = ingest_started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (cut, compacted) = maint.join().map_err(|_| anyhow::anyhow!("maintenance thread panicked"))??;
    let final_out = db.maintain()?;
    let st = db.stats();
    println!(
        "  ingest: {samples} samples in {secs:.1} s: {:.0} k samples/s sustained (goal >= 470 k on 2 cores), {rejected} rejected",
        samples as f64 / secs / 1e3
    );
    println!(
        "  blocks: {} cut, {} compacted during the run; {} on disk; head {} series, {} samples, {:.0} MB of chunks, {:.0} B of index per series",
        cut + final_out.blocks_cut,
        compacted + final_out.blocks_compacted,
        db.blocks().len(),
        st.series,
        st.samples,
        st.chunk_bytes as f64 / 1e6,
        st.index_bytes as f64 / st.series.max(1) as f64
    );
    let disk = dir_bytes(&dir);
    println!(
        "  on disk: {:.0} MB, {:.3} bytes/sample (blocks {:.0} MB, WAL {:.0} MB)",
        disk as f64 / 1e6,
        disk as f64 / samples.max(1) as f64,
        db.blocks().disk_bytes() as f64 / 1e6,
        db.wal_disk_bytes() as f64 / 1e6
    );
    let peak = peak_rss_mb();
    println!("  peak RSS during ingest: {peak:.0} MB (goal <= 8192 at 2.4 M series)");
    drop(batch);
    drop(handles);
    drop(fleet);
    if crash_restart {
        // As after a crash: the last checkpoint, then the WAL after it.
        drop(db);
        let started = Instant::now();
        let db = Tsdb::open(&dir, opts.clone())?;
        println!(
            "  restart after a crash: {:.2} s to ready, {} head samples (the last checkpoint and the WAL after it)",
            started.elapsed().as_secs_f64(),
            db.stats().samples
        );
        restart_clean(db, &dir, &opts)?;
    } else {
        restart_clean(Arc::into_inner(db).context("the database is still shared")?, &dir, &opts)?;
    }
    Ok(peak)
}

/// A clean shutdown (head checkpoint) and a start, timed.
fn restart_clean(db: Tsdb, dir: &std::path::Path, opts: &TsdbOptions) -> anyhow::Result<()> {
    let started = Instant::now();
    db.shutdown()?;
    let shutdown = started.elapsed().as_secs_f64();
    drop(db);
    let started = Instant::now();
    let db = Tsdb::open(dir, opts.clone())?;
    println!(
        "  restart after a clean shutdown: {:.2} s to ready (goal <= 60 s at 2.4 M series; the checkpoint took {shutdown:.2} s at shutdown), {} head samples, {} blocks, from a checkpoint: {}",
        started.elapsed().as_secs_f64(),
        db.stats().samples,
        db.blocks().len(),
        db.restored_from_checkpoint()
    );
    Ok(())
}
