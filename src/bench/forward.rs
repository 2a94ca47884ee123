//! `strata bench forward`: an edge's backlog (a simulated outage: `series` DCGM-like
//! series, one sample every `interval` seconds for `seconds`) forwarded to a regional
//! process on loopback. Prints the catch-up time against the outage (the goal is at least
//! 20× real time), samples per second, the CPU each side spent per million samples (the
//! edge's forwarder in this process, the regional from `/proc`), and the bytes per sample
//! of the batches (protobuf, before compression).

use super::vs_prometheus::{free_port, proc_stats, wait_ready};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_forward::{Forwarder, ForwarderOptions, ForwarderStats, WalHolds};
use strata_model::{Labels, Sample};
use strata_tsdb::db::{Tsdb, TsdbOptions};
use strata_tsdb::head::MemSeries;

/// The simulated fleet's series at the edge.
fn fleet(db: &Tsdb, series: usize) -> anyhow::Result<Vec<Arc<MemSeries>>> {
    (0..series)
        .map(|i| {
            let l = Labels::from_pairs([
                ("__name__", format!("DCGM_FI_DEV_{}", ["GPU_UTIL", "GPU_TEMP", "POWER_USAGE", "SM_CLOCK"][i % 4])),
                ("Hostname", format!("gpu-node-{:03}", i / 32)),
                ("UUID", format!("GPU-{:08x}-2ae6-d264-8628-e90fdc725b93", i / 4)),
                ("device", format!("nvidia{}", (i / 4) % 8)),
                ("gpu", ((i / 4) % 8).to_string()),
                ("instance", format!("10.0.{}.{}:9400", i / 8192, (i / 32) % 256)),
                ("job", "dcgm".to_string()),
                ("modelName", "NVIDIA H100 80GB HBM3".to_string()),
                ("pci_bus_id", format!("00000000:{:02X}:00.0", (i / 4) % 8 * 16 + 13)),
            ]);
            Ok(db.series(&l)?)
        })
        .collect()
}

/// Scrape `k` of the fleet (at `t0 + k · interval`), written as a scrape writes it: one
/// commit for the instant.
fn scrape(db: &Tsdb, series: &[Arc<MemSeries>], t0: i64, k: u64, interval: u64) -> anyhow::Result<u64> {
    let t = t0 + (k * interval * 1000) as i64;
    let batch: Vec<_> = series
        .iter()
        .enumerate()
        .map(|(i, x)| {
            // Scrape jitter, and values as a GPU's: integers and a few decimals.
            let v = ((k as usize * 7 + i * 13) % 100) as f64 + if i % 4 == 2 { 0.25 } else { 0.0 };
            (x.clone(), Sample::new(t + (i % 40) as i64, v))
        })
        .collect();
    Ok(db.commit(&batch)?.appended as u64)
}

/// Runs a forwarder until it acknowledged `until` samples; what it acknowledged.
async fn forward_until(f: Forwarder, until: impl Fn(u64) -> bool) -> anyhow::Result<()> {
    let stats = f.stats();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(f.run(rx));
    let started = Instant::now();
    while !until(stats.samples_acked.get()) {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "the forwarder did not get there in 10 minutes");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = stop.send(true);
    let _ = task.await;
    Ok(())
}

/// The seed's 16,000-GPU job on one edge (the brief's scale).
const FLEET_SAMPLES_PER_SECOND: f64 = 470_000.0;

#[allow(clippy::too_many_arguments)]
pub async fn run(
    series: usize,
    seconds: u64,
    before: u64,
    interval: u64,
    batch: usize,
    compression: strata_forward::BatchCompression,
    from_wal: bool,
    in_flight: usize,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let opts = TsdbOptions {
        wal_labels_per_segment: true,
        retention: Duration::from_secs(before + seconds + 86400),
        ..Default::default()
    };
    let edge = Arc::new(Tsdb::open(&dir.path().join("edge"), opts)?);
    let (http, grpc) = (free_port()?, free_port()?);
    let mut regional = super::vs_prometheus::spawn_regional(dir.path(), http, grpc)?;
    wait_ready(&format!("http://127.0.0.1:{http}/-/ready")).await?;
    let rpid = regional.0.id();

    let holds = WalHolds::new(edge.clone());
    let mut o = ForwarderOptions::new(&format!("127.0.0.1:{grpc}"));
    o.batch_samples = batch;
    o.compression = compression;
    o.max_in_flight = in_flight;
    if from_wal {
        o.storage_backlog_bytes = u64::MAX;
    }
    let forwarder = || Forwarder::new(edge.clone(), holds.clone(), o.clone(), ForwarderStats::default());
    let cursor_file = strata_forward::CursorFile::new(edge.dir(), &format!("127.0.0.1:{grpc}"));
    let fleet = Arc::new(fleet(&edge, series)?);
    let step = interval.max(1);
    let t0 = strata_model::time::now_ms() - (before + seconds) as i64 * 1000;
    let (k_before, k_outage) = (before / step, (before + seconds) / step);
    let write = |from: u64, to: u64| {
        let (db, fleet) = (edge.clone(), fleet.clone());
        tokio::task::spawn_blocking(move || {
            (from..to).map(|k| scrape(&db, &fleet, t0, k, step)).sum::<anyhow::Result<u64>>()
        })
    };
    // Before the outage the edge forwarded as usual: the outage starts inside the head's
    // open chunks, as a real one does. The edge met the regional then, so the outage's
    // backlog is sent as after any outage, from the cursor.
    let sent_before = write(0, k_before).await??;
    forward_until(forwarder(), |acked| acked >= sent_before && cursor_file.load().is_some_and(|c| c.replay.is_none()))
        .await?;
    let total = write(k_before, k_outage).await??;
    println!(
        "bench forward: a {seconds} s outage of {series} series at {interval} s ({total} samples, {:.0} samples/s) forwarded to a regional, after {before} s forwarded before it",
        total as f64 / seconds as f64
    );
    // The edge's maintenance during the outage (block cuts, head checkpoints): the WAL
    // stays held for the upstream until its forwarder has moved the backlog to storage.
    let db = edge.clone();
    let (wal_held, block_bytes) = tokio::task::spawn_blocking(move || -> anyhow::Result<(u64, u64)> {
        db.maintain()?;
        Ok((db.wal_disk_bytes(), db.blocks().disk_bytes()))
    })
    .await??;
    println!(
        "  disk at the edge after its maintenance, before the forwarder runs: WAL {:.1} MB ({:.2} bytes per sample of the outage), blocks {:.1} MB",
        wal_held as f64 / 1e6,
        wal_held as f64 / total as f64,
        block_bytes as f64 / 1e6
    );
    let f = forwarder();
    let stats = f.stats();
    let mut moved: Option<(u64, u64)> = None;
    let (me0, r0) = (proc_stats(std::process::id())?, proc_stats(rpid)?);
    let started = Instant::now();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(f.run(rx));
    // Scraping goes on meanwhile, in real time: catching up means reaching the newest of it.
    let fresh = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let scraping = {
        let (db, fleet, fresh) = (edge.clone(), fleet.clone(), fresh.clone());
        tokio::spawn(async move {
            for k in k_outage.. {
                let (db, fleet) = (db.clone(), fleet.clone());
                let n = tokio::task::spawn_blocking(move || scrape(&db, &fleet, t0, k, step)).await??;
                fresh.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(step)).await;
            }
            anyhow::Ok(())
        })
    };
    let mut first_fresh_lag = None;
    loop {
        let written = fresh.load(std::sync::atomic::Ordering::SeqCst);
        let acked = stats.samples_acked.get();
        if first_fresh_lag.is_none() && written > 0 && acked >= total + series as u64 {
            first_fresh_lag = Some(started.elapsed().as_secs_f64());
        }
        if written > 0 && acked >= total + written {
            break;
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(3600), "not caught up within an hour");
        if moved.is_none() {
            let replay = cursor_file.load().and_then(|c| c.replay);
            if let Some(m) = replay.and_then(|r| std::fs::metadata(cursor_file.backlog_path(r.generation)).ok()) {
                moved = Some((m.len(), started.elapsed().as_millis() as u64));
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed().as_secs_f64();
    scraping.abort();
    let (me1, r1) = (proc_stats(std::process::id())?, proc_stats(rpid)?);
    // The session's connection was opened for the catch-up: all it carried is the backlog
    // and the fresh scrapes.
    let wire = bytes_received_on(grpc);
    let fresh_written = fresh.load(std::sync::atomic::Ordering::SeqCst);
    let db = edge.clone();
    let wal_after = tokio::task::spawn_blocking(move || db.maintain().map(|_| db.wal_disk_bytes())).await??;
    match moved {
        Some((backlog, listed_ms)) => println!(
            "  the backlog read from storage (listed in {:.2} s): backlog file {:.2} MB ({:.3} bytes per sample of the outage); WAL after the next maintenance {:.1} MB",
            listed_ms as f64 / 1e3,
            backlog as f64 / 1e6,
            backlog as f64 / total as f64,
            wal_after as f64 / 1e6
        ),
        None => println!("  the backlog was sent from the WAL, record by record"),
    }
    // Nothing lost: the regional's own count of what it stored.
    let page = super::vs_prometheus::get(&format!("http://127.0.0.1:{http}/metrics")).await?;
    let received = |r: &str| {
        super::vs_prometheus::counter_sum(&page, &format!("strata_forward_received_samples_total{{result=\"{r}\"}}"))
    };
    let (stored, duplicates) = (received("appended"), received("duplicate"));
    let head = |name: &str| super::vs_prometheus::counter_sum(&page, name);
    println!(
        "  the regional's head: {:.0} chunks taken whole, {:.0} open chunks continued",
        head("strata_head_chunks_adopted_total"),
        head("strata_head_chunks_continued_total")
    );
    let everything = sent_before + total + fresh_written;
    println!(
        "  the regional stored {stored:.0} of the {everything} samples written ({} lost; {duplicates:.0} more received again, stored once)",
        everything as f64 - stored
    );
    let _ = stop.send(true);
    let _ = task.await;
    let _ = regional.0.kill();
    let m = (total + fresh_written) as f64 / 1e6;
    // The goal is for the seed's fleet on one edge: 470 k samples/s.
    let rate = m * 1e6 / took;
    println!(
        "  caught up in {took:.2} s (zero lag, the scrapes written meanwhile included), {:.2} M samples/s with {in_flight} batch(es) in flight: \
         {:.0}x real time at this bench's {:.0} samples/s, {:.1}x at the fleet's 470 k samples/s (goal >= 20x)",
        rate / 1e6,
        seconds as f64 / took,
        total as f64 / seconds as f64,
        rate / FLEET_SAMPLES_PER_SECOND - 1.0
    );
    if let Some(lag) = first_fresh_lag {
        println!("  fresh data waited behind the backlog: the first scrape after the outage was acknowledged {lag:.2} s after it was written");
    }
    println!(
        "  CPU per million samples: edge (forwarder and scrapes) {:.3} s, regional {:.3} s; {} batches",
        (me1.cpu_secs - me0.cpu_secs) / m,
        (r1.cpu_secs - r0.cpu_secs) / m,
        stats.batches_acked.get()
    );
    println!(
        "  bytes per sample: {:.2} in the batches (protobuf), {} on the wire ({compression:?}, the regional's TCP payload)",
        stats.sent_bytes.get() as f64 / (total + fresh_written) as f64,
        wire.map_or("unknown".to_string(), |b| format!("{:.2}", b as f64 / (total + fresh_written) as f64))
    );
    Ok(())
}

/// The payload bytes the connections open to local port `port` have received (the
/// kernel's `tcp_info`, through `ss`); `None` when `ss` is missing.
fn bytes_received_on(port: u16) -> Option<u64> {
    let out = std::process::Command::new("ss")
        .args(["-tinH", "state", "established", &format!("( sport = :{port} )")])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let counts: Vec<u64> =
        text.split_whitespace().filter_map(|w| w.strip_prefix("bytes_received:")?.parse().ok()).collect();
    // No connection found (an `ss` without these fields): not measured, rather than 0.
    (!counts.is_empty()).then(|| counts.iter().sum())
}
