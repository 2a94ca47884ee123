//! `strata bench forward`: an edge's backlog (a simulated outage: `series` DCGM-like
//! series, one sample every `interval` seconds for `seconds`) forwarded to a regional
//! process on loopback. Prints the catch-up time against the outage (the goal is at least
//! 20× real time), samples per second, the CPU each side spent per million samples (the
//! edge's forwarder in this process, the regional from `/proc`), and the bytes per sample
//! of the batches (protobuf, before gzip).

use super::vs_prometheus::{free_port, proc_stats, wait_ready};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_forward::{Forwarder, ForwarderOptions, ForwarderStats, WalHolds};
use strata_model::{Labels, Sample};
use strata_tsdb::db::{Tsdb, TsdbOptions};

/// The edge's backlog, written as scrapes write it: one commit per instant.
fn fill(db: &Tsdb, series: usize, seconds: u64, interval: u64) -> anyhow::Result<u64> {
    let s: Vec<_> = (0..series)
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
            db.series(&l)
        })
        .collect::<Result<_, _>>()?;
    let t0 = strata_model::time::now_ms() - seconds as i64 * 1000;
    let steps = seconds / interval.max(1);
    let mut n = 0u64;
    for k in 0..steps {
        let t = t0 + (k * interval * 1000) as i64;
        let batch: Vec<_> = s
            .iter()
            .enumerate()
            .map(|(i, x)| {
                // Scrape jitter, and values as a GPU's: integers and a few decimals.
                let v = ((k as usize * 7 + i * 13) % 100) as f64 + if i % 4 == 2 { 0.25 } else { 0.0 };
                (x.clone(), Sample::new(t + (i % 40) as i64, v))
            })
            .collect();
        n += db.commit(&batch)?.appended as u64;
    }
    Ok(n)
}

pub async fn run(
    series: usize,
    seconds: u64,
    interval: u64,
    batch: usize,
    gzip: bool,
    from_wal: bool,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let opts = TsdbOptions {
        wal_labels_per_segment: true,
        retention: Duration::from_secs(seconds + 86400),
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
    o.gzip = gzip;
    if from_wal {
        o.storage_backlog_bytes = u64::MAX;
    }
    // The edge met the regional before the outage: the backlog is sent as after any
    // outage, from the cursor (not as to a regional met for the first time).
    let cursor_file = strata_forward::CursorFile::new(edge.dir(), &format!("127.0.0.1:{grpc}"));
    {
        let f = Forwarder::new(edge.clone(), holds.clone(), o.clone(), ForwarderStats::default());
        let (stop, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(f.run(rx));
        let met = Instant::now();
        while cursor_file.load().is_none_or(|c| c.replay.is_some()) {
            anyhow::ensure!(met.elapsed() < Duration::from_secs(30), "the forwarder never reached the regional");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = stop.send(true);
        let _ = task.await;
    }
    let db = edge.clone();
    let total = tokio::task::spawn_blocking(move || fill(&db, series, seconds, interval)).await??;
    println!(
        "bench forward: a {seconds} s outage of {series} series at {interval} s ({total} samples, {:.0} samples/s) forwarded to a regional",
        total as f64 / seconds as f64
    );
    let f = Forwarder::new(edge.clone(), holds, o, ForwarderStats::default());
    let stats = f.stats();
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
    let mut moved: Option<(u64, u64)> = None;
    let (me0, r0) = (proc_stats(std::process::id())?, proc_stats(rpid)?);
    let started = Instant::now();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(f.run(rx));
    while stats.samples_acked.get() < total {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(3600), "not caught up within an hour");
        if moved.is_none() {
            let replay = cursor_file.load().and_then(|c| c.replay);
            if let Some(m) = replay.and_then(|r| std::fs::metadata(cursor_file.backlog_path(r.generation)).ok()) {
                moved = Some((m.len(), started.elapsed().as_millis() as u64));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = started.elapsed().as_secs_f64();
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
    let (me1, r1) = (proc_stats(std::process::id())?, proc_stats(rpid)?);
    // Nothing lost: the regional's own count of what it stored.
    let page = super::vs_prometheus::get(&format!("http://127.0.0.1:{http}/metrics")).await?;
    let stored: f64 = ["appended", "duplicate"]
        .iter()
        .map(|r| {
            super::vs_prometheus::counter_sum(
                &page,
                &format!("strata_forward_received_samples_total{{result=\"{r}\"}}"),
            )
        })
        .sum();
    println!("  the regional stored {stored:.0} of {total} samples ({} lost)", total as f64 - stored);
    let _ = stop.send(true);
    let _ = task.await;
    let _ = regional.0.kill();
    let m = total as f64 / 1e6;
    println!(
        "  caught up in {took:.2} s: {:.0}x real time (goal >= 20x), {:.2} M samples/s",
        seconds as f64 / took,
        m / took
    );
    println!(
        "  CPU per million samples: edge (forwarder) {:.3} s, regional {:.3} s; {} batches",
        (me1.cpu_secs - me0.cpu_secs) / m,
        (r1.cpu_secs - r0.cpu_secs) / m,
        stats.batches_acked.get()
    );
    println!("  batch bytes per sample (protobuf, before gzip): {:.2}", stats.sent_bytes.get() as f64 / total as f64);
    Ok(())
}
