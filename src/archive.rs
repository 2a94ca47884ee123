//! `strata archive import` and `strata archive inspect`: thin wiring over `strata_archive`.
//! An import reads an OpenMetrics file (as `promtool tsdb create-blocks-from openmetrics`
//! does) into a scratch database, then writes one raw block per `--block` range.

use anyhow::Context;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_archive::{archive_store, list_blocks, BlockReader, BlockWriter, ObjectStoreExt, WriteOptions};
use strata_tsdb::db::{Tsdb, TsdbOptions};
use strata_tsdb::TsdbStore;

pub async fn import(openmetrics: &Path, url: &str, block: Duration) -> anyhow::Result<()> {
    let block_ms = i64::try_from(block.as_millis()).context("--block is too long")?;
    anyhow::ensure!(block_ms >= 60_000, "--block must be at least 1m");
    let archive = archive_store(url, true)?;
    let scratch = tempfile::tempdir().context("a scratch folder for the import")?;
    // Whatever the file's times, nothing is dropped for age or cut into blocks meanwhile.
    let opts = TsdbOptions {
        retention: Duration::from_secs(100 * 365 * 86_400),
        block_range: Duration::from_secs(100 * 365 * 86_400),
        ..Default::default()
    };
    let db = Arc::new(Tsdb::open(scratch.path(), opts).context("opening the scratch database")?);
    let started = Instant::now();
    let file = std::fs::File::open(openmetrics).with_context(|| format!("opening {}", openmetrics.display()))?;
    let reader = std::io::BufReader::with_capacity(1 << 20, file);
    let (db2, mut last) = (db.clone(), Instant::now());
    let stats = tokio::task::spawn_blocking(move || {
        strata_ingest::import::import_openmetrics(&db2, reader, |st| {
            if last.elapsed() > Duration::from_secs(1) {
                eprint!("\r  read {} samples of {} series ({:.0} MB)", st.samples, st.series, st.bytes as f64 / 1e6);
                last = Instant::now();
            }
        })
    })
    .await??;
    eprintln!(
        "\r  read {} samples of {} series in {:.1} s ({} rejected)",
        stats.samples,
        stats.series,
        started.elapsed().as_secs_f64(),
        stats.rejected
    );
    let (min, max) = (db.min_time(), db.max_time());
    anyhow::ensure!(min <= max, "{}: no samples", openmetrics.display());
    let writer = BlockWriter::new(archive.clone(), WriteOptions::default());
    let source = TsdbStore(db.clone());
    let (mut blocks, mut bytes, mut samples) = (0, 0u64, 0u64);
    let (mut agg_blocks, mut agg_bytes) = (0, BTreeMap::<i64, u64>::new());
    let mut kept = Vec::new();
    // From the range before the first sample's when it sits on a range's start: its
    // window `(start − W, start]` is in that range's aggregate block.
    let mut start = min.saturating_sub(1).div_euclid(block_ms) * block_ms;
    let exists = |dir: strata_archive::ObjectPath| {
        let archive = archive.clone();
        async move {
            match archive.head(&dir.clone().join(strata_archive::layout::META)).await {
                Ok(_) => Ok(true),
                Err(strata_archive::ObjectStoreError::NotFound { .. }) => Ok(false),
                Err(e) => Err(anyhow::anyhow!("{dir}: {e}")),
            }
        }
    };
    while start <= max {
        let end = start.saturating_add(block_ms);
        // A block already there (the archiver's, a compacted day, an earlier import) is
        // never written over: what it holds may not be in this file.
        let dir = strata_archive::layout::block_dir(0, start, end);
        if exists(dir.clone()).await? {
            eprintln!("\n  {dir} is already in the archive: left as it is, this file's samples in it not imported");
            kept.push(dir.to_string());
            start = end;
            continue;
        }
        let widths = [strata_downsample::FIVE_MINUTES, strata_downsample::ONE_HOUR];
        let encoded = writer.encode_range(&source, start, end, &widths, Vec::new(), None).await?;
        // The aggregates first, as the archiver writes them.
        for a in encoded.aggregates {
            if exists(a.dir.clone()).await? {
                eprintln!("\n  {} is already in the archive: left as it is", a.dir);
                kept.push(a.dir.to_string());
                continue;
            }
            let meta = writer.publish(a).await?;
            agg_blocks += 1;
            *agg_bytes.entry(meta.resolution_ms).or_default() += meta.bytes();
        }
        if let Some(raw) = encoded.raw {
            let meta = writer.publish(raw).await?;
            blocks += 1;
            bytes += meta.bytes();
            samples += meta.samples;
            eprint!("\r  wrote {blocks} blocks, {samples} samples");
        }
        start = end;
    }
    eprintln!();
    println!(
        "imported {samples} samples into {blocks} raw blocks at {url}: {bytes} bytes, {:.3} bytes per sample, in {:.1} s",
        bytes as f64 / samples.max(1) as f64,
        started.elapsed().as_secs_f64()
    );
    for (width, b) in &agg_bytes {
        println!(
            "  and {} aggregate blocks: {} windows: {b} bytes, {:.3} bytes per raw sample",
            agg_blocks,
            strata_archive::layout::resolution_dir(*width),
            *b as f64 / samples.max(1) as f64
        );
    }
    anyhow::ensure!(
        kept.is_empty(),
        "{} blocks were already in the archive and were not written (this file's samples in their ranges not imported): {} (remove those blocks to import them)",
        kept.len(),
        kept.join(", ")
    );
    Ok(())
}

/// Lists every block with what it holds, and what is damaged; exits non-zero when any is.
pub async fn inspect(url: &str) -> anyhow::Result<bool> {
    let archive = archive_store(url, false)?;
    let blocks = list_blocks(archive.as_ref()).await?;
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let mut damaged = 0;
    // A reader that went away (`| head`) ends the listing, not the process with a panic.
    macro_rules! out {
        ($($a:tt)*) => {
            if writeln!(stdout, $($a)*).is_err() {
                return Ok(damaged == 0);
            }
        };
    }
    out!(
        "{:<10} {:<24} {:<24} {:>9} {:>12} {:>12} {:>8}  status",
        "resolution",
        "from",
        "to",
        "series",
        "samples",
        "bytes",
        "B/sample"
    );
    for (dir, meta) in blocks {
        let checked = match meta {
            Err(e) => Err(e),
            Ok(_) => match BlockReader::open(archive.clone(), dir.clone()).await {
                Ok(b) => b.verify().await.map(|_| b.meta.clone()),
                Err(e) => Err(e),
            },
        };
        // An aggregate block: the raw samples its windows summarise, and bytes per one.
        match checked {
            Ok(m) => out!(
                "{:<10} {:<24} {:<24} {:>9} {:>12} {:>12} {:>8.3}  ok{}",
                strata_archive::layout::resolution_dir(m.resolution_ms),
                strata_rules::notifier::rfc3339(m.min_time),
                strata_rules::notifier::rfc3339(m.max_time),
                m.series,
                m.samples.max(m.raw_samples),
                m.bytes(),
                m.bytes() as f64 / m.samples.max(m.raw_samples).max(1) as f64,
                if m.resolution_ms > 0 { format!(" ({} windows)", m.samples) } else { String::new() }
            ),
            Err(e) => {
                damaged += 1;
                out!("{dir}: DAMAGED: {e}");
            }
        }
    }
    Ok(damaged == 0)
}
