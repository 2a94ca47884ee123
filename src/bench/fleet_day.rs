//! The fleet-day set (`../shared/bench/`): a day of 512 GPUs, loaded into an empty
//! database, then cut into blocks and compacted as the maintenance loop would; bytes on disk
//! per sample, and the restart time against Prometheus 2.42's on the same data.

use std::path::PathBuf;
use std::time::Instant;
use strata_ingest::import::import_openmetrics;
use strata_tsdb::db::{Tsdb, TsdbOptions};

/// The loaded database, with the directory that holds its WAL (removed when dropped).
pub struct Loaded(pub Tsdb, pub tempfile::TempDir);

pub fn run(file: Option<PathBuf>) -> anyhow::Result<Loaded> {
    let (db, dir, opts, samples) = import(file)?;
    super::print_head_stats(&db);
    // Where the bytes go, per metric.
    let mut per: std::collections::BTreeMap<String, (usize, u64, usize, usize)> = Default::default();
    let all = strata_model::matcher::Matcher::new(strata_model::matcher::MatchOp::Regex, "__name__", ".+")?;
    for (s, chunks) in db.head().select(&[all], i64::MIN, i64::MAX) {
        let e = per.entry(s.labels.metric_name().unwrap_or_default().to_string()).or_default();
        e.0 += chunks.iter().map(|c| c.data.len()).sum::<usize>();
        e.1 += chunks.iter().map(|c| c.n as u64).sum::<u64>();
        e.2 += chunks.iter().filter(|c| c.is_block()).count();
        e.3 += chunks.len();
    }
    for (name, (bytes, n, blocks, chunks)) in per {
        println!(
            "    {name:<40} {:.3} bytes/sample, {blocks} of {chunks} chunks in the block encoding",
            bytes as f64 / n.max(1) as f64
        );
    }
    print_decode_speed(&db)?;
    let db = to_blocks(db, dir.path(), &opts, samples)?;
    Ok(Loaded(db, dir))
}

/// The fleet-day file (`file`, or the cached one) imported into the head of an empty
/// database in a temporary directory; the options it was opened with and the samples read.
pub fn import(file: Option<PathBuf>) -> anyhow::Result<(Tsdb, tempfile::TempDir, TsdbOptions, u64)> {
    let default = fleet_day_cache().join("small/fleet.om");
    let file = file.unwrap_or(default);
    if !file.exists() {
        anyhow::bail!(
            "the fleet-day data is absent: {} does not exist. Generate it with `python3 ../shared/bench/fleet_day.py prepare` \
             (needs the shared/ reference folder beside the project) or pass --file",
            file.display()
        );
    }
    let dir = tempfile::tempdir()?;
    let opts = TsdbOptions { retention: std::time::Duration::from_secs(100 * 86400), ..Default::default() };
    let db = Tsdb::open(dir.path(), opts.clone())?;
    println!("bench fleet-day: importing {}", file.display());
    let started = Instant::now();
    let f = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(&file)?);
    let st = import_openmetrics(&db, f, |_| {})?;
    let secs = started.elapsed().as_secs_f64();
    println!("  {} samples, {} series, {} rejected, {:.2} GB of text in {secs:.1} s: {:.2} M samples/s (import with WAL, one thread)",
        st.samples, st.series, st.rejected, st.bytes as f64 / 1e9, st.samples as f64 / secs / 1e6);
    Ok((db, dir, opts, st.samples))
}

/// Cuts and compacts as the maintenance loop does, prints what is on disk, restarts the
/// database (timed) and returns the restarted one.
fn to_blocks(db: Tsdb, dir: &std::path::Path, opts: &TsdbOptions, samples: u64) -> anyhow::Result<Tsdb> {
    let started = Instant::now();
    let out = db.maintain()?;
    println!(
        "  maintenance (as the loop runs it): {} blocks cut, {} compacted in {:.1} s; head {} samples, WAL {:.3} bytes/sample (the import wrote series after series, so no segment is old yet)",
        out.blocks_cut,
        out.blocks_compacted,
        started.elapsed().as_secs_f64(),
        db.stats().samples,
        db.wal_disk_bytes() as f64 / samples.max(1) as f64,
    );
    let started = Instant::now();
    let n = db.flush_head()?;
    println!(
        "  flush (end of a backfill, as promtool's): {n} more blocks, compacted, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (blocks, wal) = (db.blocks().disk_bytes(), db.wal_disk_bytes());
    let ranges: Vec<String> = db
        .blocks()
        .healthy()
        .iter()
        .map(|b| format!("{}h", (b.meta().max_time - b.meta().min_time) / 3_600_000))
        .collect();
    println!(
        "  on disk: {:.3} bytes/sample in total (blocks {:.3}, WAL {:.3}; goal <= 1.3, VictoriaMetrics 1.7, Prometheus backfilled 4.6); blocks {}, head {} samples",
        (blocks + wal) as f64 / samples.max(1) as f64,
        blocks as f64 / samples.max(1) as f64,
        wal as f64 / samples.max(1) as f64,
        ranges.join(" "),
        db.stats().samples
    );
    drop(db);
    let started = Instant::now();
    let db = Tsdb::open(dir, opts.clone())?;
    let strata_restart = started.elapsed().as_secs_f64();
    println!("  restart: {strata_restart:.3} s to ready (goal <= 1 s); head {} samples replayed", db.stats().samples);
    match prometheus_restart() {
        Ok(Some(secs)) => println!(
            "  restart, Prometheus 2.42 on its backfilled copy of the same day: {secs:.3} s to ready (strata / prometheus {:.2})",
            strata_restart / secs
        ),
        Ok(None) => println!("  restart, Prometheus 2.42: not measured (no backfilled copy in the fleet-day cache or no `prometheus`)"),
        Err(e) => println!("  restart, Prometheus 2.42: failed: {e:#}"),
    }
    Ok(db)
}

/// Prometheus 2.42 started on a copy of the fleet-day cache's backfilled data: seconds from
/// start to `/-/ready`.
fn prometheus_restart() -> anyhow::Result<Option<f64>> {
    let src = fleet_day_cache().join("small/prometheus");
    let has_prometheus = std::process::Command::new("prometheus").arg("--version").output().is_ok();
    if !src.is_dir() || !has_prometheus {
        return Ok(None);
    }
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("data");
    copy_dir(&src, &data)?;
    let cfg = tmp.path().join("prometheus.yml");
    std::fs::write(&cfg, "global: {}\n")?;
    let port = super::vs_prometheus::free_port()?;
    let started = Instant::now();
    let child = std::process::Command::new("prometheus")
        .args([
            format!("--config.file={}", cfg.display()),
            format!("--storage.tsdb.path={}", data.display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            // The day is in the past: keep it.
            "--storage.tsdb.retention.time=100y".to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let _guard = super::vs_prometheus::Guard(child);
    let url = format!("http://127.0.0.1:{port}/-/ready");
    let client = reqwest::blocking::Client::builder().timeout(std::time::Duration::from_secs(2)).build()?;
    while started.elapsed() < std::time::Duration::from_secs(120) {
        if client.get(&url).send().map(|r| r.status().is_success()).unwrap_or(false) {
            return Ok(Some(started.elapsed().as_secs_f64()));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    anyhow::bail!("not ready within 120 s")
}

pub(super) fn copy_dir(src: &std::path::Path, dst: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let to = dst.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &to)?;
        } else {
            std::fs::copy(e.path(), to)?;
        }
    }
    Ok(())
}

/// Where `fleet_day.py` caches its data: `$FLEET_DAY_CACHE`, else `~/.cache/strata-fleet-day`.
pub(super) fn fleet_day_cache() -> PathBuf {
    std::env::var_os("FLEET_DAY_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/strata-fleet-day")))
        .unwrap_or_else(|| PathBuf::from("strata-fleet-day"))
}

/// Single-threaded decoding speed over every chunk of the head: the query path's floor.
fn print_decode_speed(db: &Tsdb) -> anyhow::Result<()> {
    let all = strata_model::matcher::Matcher::new(strata_model::matcher::MatchOp::Regex, "__name__", ".+")?;
    let chunks: Vec<_> = db.head().select(&[all], i64::MIN, i64::MAX).into_iter().flat_map(|(_, c)| c).collect();
    let mut buf = Vec::new();
    let mut times = Vec::new();
    let mut n = 0usize;
    for _ in 0..15 {
        let started = Instant::now();
        n = 0;
        for c in &chunks {
            buf.clear();
            c.decode_into(i64::MIN, i64::MAX, &mut buf)?;
            n += buf.len();
        }
        times.push(started.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    println!(
        "  decode, one thread: {:.2} ns/sample median of 15 ({n} samples, best {:.2})",
        times[7] * 1e9 / n as f64,
        times[0] * 1e9 / n as f64
    );
    // What sealing costs: the streaming chunks rebuilt, then transcoded to blocks.
    let mut stream = Vec::new();
    for c in chunks.iter().take(2000) {
        let mut a = strata_chunk::ChunkAppender::new();
        for s in c.decode()? {
            a.append(s.t, s.v);
        }
        stream.push(a.seal());
    }
    let n: u64 = stream.iter().map(|c| c.n as u64).sum();
    let (stream_bytes, started) = (stream.iter().map(|c| c.data.len()).sum::<usize>(), Instant::now());
    let blocks: Vec<_> = stream.into_iter().map(|c| c.compact()).collect();
    let secs = started.elapsed().as_secs_f64();
    let block_bytes: usize = blocks.iter().map(|c| c.data.len()).sum();
    println!(
        "  seal-time transcoding: {:.1} ns/sample, once per sample; blocks {:.3} vs stream {:.3} bytes/sample over {} chunks",
        secs * 1e9 / n as f64,
        block_bytes as f64 / n as f64,
        stream_bytes as f64 / n as f64,
        blocks.len()
    );
    Ok(())
}
