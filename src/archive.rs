//! `strata archive import` and `strata archive inspect`: thin wiring over `strata_archive`.
//! An import reads an OpenMetrics file (as `promtool tsdb create-blocks-from openmetrics`
//! does) into a scratch database, then writes one raw block per `--block` range.

use anyhow::Context;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_archive::{archive_store, list_blocks, BlockReader, BlockWriter, WriteOptions};
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
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    fn every_second(st: &strata_ingest::import::ImportStats, last: &mut Instant) {
        if last.elapsed() > Duration::from_secs(1) {
            eprint!("\r  read {} samples of {} series ({:.0} MB)", st.samples, st.series, st.bytes as f64 / 1e6);
            *last = Instant::now();
        }
    }
    // In parts on every core; a file that cannot be read in parts (samples out of order,
    // a bad line, whose number only one pass tells) is read again in one pass.
    let db = Arc::new(Tsdb::open(&scratch.path().join("parts"), opts.clone()).context("opening the scratch database")?);
    let (db2, path, last) = (db.clone(), openmetrics.to_path_buf(), std::sync::Mutex::new(Instant::now()));
    let parallel = tokio::task::spawn_blocking(move || {
        strata_ingest::import::import_openmetrics_file(&db2, &path, threads, |st| {
            if let Ok(mut last) = last.lock() {
                every_second(st, &mut last);
            }
        })
    })
    .await?;
    let (db, stats) = match parallel {
        Ok(stats) => (db, stats),
        Err(strata_ingest::import::ImportError::Parallel(why)) => {
            eprintln!("\n  {why}: reading the file again in one pass");
            drop(db);
            // The first attempt's samples make room for the second's.
            let _ = std::fs::remove_dir_all(scratch.path().join("parts"));
            let db = Arc::new(Tsdb::open(&scratch.path().join("one"), opts).context("opening the scratch database")?);
            let file =
                std::fs::File::open(openmetrics).with_context(|| format!("opening {}", openmetrics.display()))?;
            let reader = std::io::BufReader::with_capacity(1 << 20, file);
            let (db2, mut last) = (db.clone(), Instant::now());
            let stats = tokio::task::spawn_blocking(move || {
                strata_ingest::import::import_openmetrics(&db2, reader, |st| every_second(st, &mut last))
            })
            .await??;
            (db, stats)
        }
        Err(e) => return Err(e.into()),
    };
    eprintln!(
        "\r  read {} samples of {} series in {:.1} s ({} rejected)",
        stats.samples,
        stats.series,
        started.elapsed().as_secs_f64(),
        stats.rejected
    );
    let (min, max) = (db.min_time(), db.max_time());
    anyhow::ensure!(min <= max, "{}: no samples", openmetrics.display());
    let written = write_blocks(archive, &TsdbStore(db.clone()), (min, max), block_ms, true).await?;
    println!(
        "imported {} samples into {} raw blocks at {url}: {} bytes, {:.3} bytes per sample, in {:.1} s",
        written.samples,
        written.raw_blocks,
        written.raw_bytes,
        written.raw_bytes as f64 / written.samples.max(1) as f64,
        started.elapsed().as_secs_f64()
    );
    for (width, b) in &written.aggregate_bytes {
        println!(
            "  and {} aggregate blocks: {} windows: {b} bytes, {:.3} bytes per raw sample",
            written.aggregate_blocks,
            strata_archive::layout::resolution_dir(*width),
            *b as f64 / written.samples.max(1) as f64
        );
    }
    anyhow::ensure!(
        written.kept.is_empty(),
        "{} blocks were already in the archive and were not written (this file's samples in their ranges not imported): {} (remove those blocks to import them)",
        written.kept.len(),
        written.kept.into_iter().collect::<Vec<_>>().join(", ")
    );
    Ok(())
}

/// What [`write_blocks`] wrote, and what it left alone.
#[derive(Debug, Default)]
pub struct Written {
    pub raw_blocks: usize,
    pub raw_bytes: u64,
    pub samples: u64,
    pub aggregate_blocks: usize,
    /// Bytes of aggregate blocks per window width.
    pub aggregate_bytes: BTreeMap<i64, u64>,
    /// Blocks already in the archive over a range, whose range was therefore not written.
    pub kept: std::collections::BTreeSet<String>,
}

/// Writes `source`'s samples in `[min, max]` to `archive` as raw, 5 m and 1 h blocks of
/// `block_ms`, a range at a time, the aggregates before the raw block (as the archiver
/// publishes them). A range where the archive already holds a block of any resolution is
/// left whole (in [`Written::kept`]).
pub async fn write_blocks(
    archive: Arc<dyn strata_archive::ObjectStore>,
    source: &dyn strata_store::Store,
    (min, max): (i64, i64),
    block_ms: i64,
    progress: bool,
) -> anyhow::Result<Written> {
    let writer = BlockWriter::new(archive.clone(), WriteOptions::default());
    let mut out = Written::default();
    // From the range before the first sample's when it sits on a range's start: its
    // window `(start − W, start]` is in that range's aggregate block.
    let mut start = min.saturating_sub(1).div_euclid(block_ms) * block_ms;
    // Every block already there, by its folder (resolution and range), whatever its meta.
    let existing: Vec<(String, i64, i64, String)> = list_blocks(archive.as_ref())
        .await?
        .into_iter()
        .filter_map(|(dir, _)| {
            strata_archive::layout::parse_block_dir(&dir).map(|(res, lo, hi)| (res, lo, hi, dir.to_string()))
        })
        .collect();
    // A block there that overlaps the range at the resolution (the archiver's, a compacted
    // day, an earlier import) is never written over nor beside: what it holds may not be in
    // this source, and two blocks of one resolution over one time would answer twice.
    let overlapping = |resolution_ms: i64, start: i64, end: i64| -> Option<String> {
        let res = strata_archive::layout::resolution_dir(resolution_ms);
        existing.iter().find(|(r, lo, hi, _)| *r == res && *lo < end && *hi > start).map(|e| e.3.clone())
    };
    while start <= max {
        let end = start.saturating_add(block_ms);
        let widths = [strata_downsample::FIVE_MINUTES, strata_downsample::ONE_HOUR];
        // A range is written whole (raw and aggregates) or not at all: raw blocks beside
        // aggregates that lack their samples would answer differently by resolution.
        let there: Vec<String> = [0].iter().chain(&widths).filter_map(|&r| overlapping(r, start, end)).collect();
        if !there.is_empty() {
            eprintln!(
                "\n  {} already in the archive: left as it is, the samples in [{start}, {end}) not imported",
                there.join(", ")
            );
            out.kept.extend(there);
            start = end;
            continue;
        }
        let encoded = writer.encode_range(source, start, end, &widths, Vec::new(), None).await?;
        for a in encoded.aggregates {
            let meta = writer.publish(a).await?;
            out.aggregate_blocks += 1;
            *out.aggregate_bytes.entry(meta.resolution_ms).or_default() += meta.bytes();
        }
        if let Some(raw) = encoded.raw {
            let meta = writer.publish(raw).await?;
            out.raw_blocks += 1;
            out.raw_bytes += meta.bytes();
            out.samples += meta.samples;
            if progress {
                eprint!("\r  wrote {} blocks, {} samples", out.raw_blocks, out.samples);
            }
        }
        start = end;
    }
    if progress {
        eprintln!();
    }
    Ok(out)
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
        // A shard's blocks (`shards/<name>/...`) say whose they are.
        let shard = strata_archive::layout::shard_of(&dir).map(|s| format!(" (shard {s})")).unwrap_or_default();
        // An aggregate block: the raw samples its windows summarise, and bytes per one.
        match checked {
            Ok(m) => out!(
                "{:<10} {:<24} {:<24} {:>9} {:>12} {:>12} {:>8.3}  ok{}{shard}",
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
