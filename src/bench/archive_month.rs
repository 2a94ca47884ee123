//! `strata bench archive-month`: the archive reader's memory over a month of the fleet. The
//! six fleet-day fields of a fleet (512 GPUs at 15 s by default: the fleet-day set's 3,072
//! series and 17.7 M samples a day) are simulated day by day into a scratch database and
//! written to a local archive by the import's own block writer (`archive::write_blocks`:
//! raw, 5 m and 1 h day blocks, as compaction leaves them). A `strata global --archive`
//! process then serves it alone, and its resident peak (`VmHWM`) is read after a fixed set
//! of queries: the fleet-day benchmark's twelve over the whole span at step 1 h, over the
//! newest day at step 5 m, two at step 1 m from raw data, a `series` and a label-values
//! call over the span, and the twelve again at once. The anchors, in the same run: the same
//! process over the first day alone, and over the month with 32 MB caches. What a larger
//! archive makes grow is bounded each by its own setting: the chunk and window caches
//! (`--archive.chunk-cache-mb`, `--archive.window-cache-mb`), the series tables of open
//! blocks (250 k series), and each running query's working set (its sample limit).

use super::scale::fleet::Rng;
use super::seed_scale::{labels, next_value, FIELDS, QUERIES};
use super::vs_prometheus::{free_port, wait_ready, Guard};
use anyhow::Context;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_model::{Metadata, Sample};
use strata_tsdb::db::{Tsdb, TsdbOptions};

const DAY_MS: i64 = 86_400_000;
/// `--archive.chunk-cache-mb` and `--archive.window-cache-mb` of the second month's run.
const SMALL_CACHES_MB: usize = 32;

/// The fleet's state from one day to the next, so that the month is one history: gauges
/// drift on and the counter keeps counting across midnight.
struct History {
    gpus: usize,
    interval_ms: i64,
    values: Vec<f64>,
    rng: Rng,
}

impl History {
    fn new(gpus: usize, interval_s: u64) -> Self {
        let values =
            (0..gpus * FIELDS.len()).map(|i| [50.0, 60.0, 300.0, 40_000.0, 0.0, 0.0][i % FIELDS.len()]).collect();
        History { gpus, interval_ms: interval_s as i64 * 1000, values, rng: Rng(0x2545_F491_4F6C_DD1D) }
    }

    /// The day `[day, day + 24 h)` into a scratch database. Samples sit 1 ms after their
    /// grid point (plus up to 39 ms of scrape jitter) so that none is on midnight: the
    /// window that ends there belongs to the day before, whose database is gone.
    fn day(&mut self, dir: &Path, day: i64) -> anyhow::Result<(Tsdb, u64)> {
        let opts = TsdbOptions {
            retention: Duration::from_secs(100 * 365 * 86_400),
            block_range: Duration::from_secs(100 * 365 * 86_400),
            ..Default::default()
        };
        let db = Tsdb::open(dir, opts)?;
        for (name, metric_type) in FIELDS {
            db.set_metadata(name, Metadata { metric_type, ..Default::default() })?;
        }
        let series: Vec<_> = (0..self.gpus)
            .flat_map(|g| (0..FIELDS.len()).map(move |f| (g, f)))
            .map(|(g, f)| db.series(&labels(g, f)).map(|s| (f, s)))
            .collect::<Result<_, _>>()?;
        let steps = DAY_MS / self.interval_ms;
        let mut batch = Vec::with_capacity(series.len());
        for k in 0..steps {
            batch.clear();
            for (i, (f, s)) in series.iter().enumerate() {
                self.values[i] = next_value(*f, self.values[i], self.rng.next());
                let t = day + k * self.interval_ms + 1 + (self.rng.next() % 40) as i64;
                batch.push((s.clone(), Sample::new(t, self.values[i])));
            }
            let out = db.commit(&batch)?;
            anyhow::ensure!(out.rejected.is_empty(), "{} samples refused at step {k}", out.rejected.len());
        }
        Ok((db, steps as u64 * series.len() as u64))
    }
}

/// What one serving of the archive cost.
struct Served {
    /// After the queries one at a time.
    one_at_a_time_mb: f64,
    /// After the twelve at once too.
    peak_mb: f64,
    seconds: f64,
    queries: usize,
}

/// Starts `strata global --archive` over `archive` alone, asks the set of queries over
/// `[from, to)` (seconds), and reads the process' peak.
async fn serve_and_query(archive: &Path, from: i64, to: i64, cache_mb: Option<usize>) -> anyhow::Result<Served> {
    let port = free_port()?;
    let mut command = std::process::Command::new(std::env::current_exe()?);
    command.args(["global", "--http-listen", &format!("127.0.0.1:{port}"), "--archive"]).arg(archive);
    command.arg("--archive.read-only");
    if let Some(mb) = cache_mb {
        let mb = mb.to_string();
        command.args(["--archive.chunk-cache-mb", &mb, "--archive.window-cache-mb", &mb]);
    }
    let child = command
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("starting strata global --archive")?;
    let pid = child.id().to_string();
    let _guard = Guard(child);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{base}/-/ready")).await?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(600)).build()?;
    let day_from = to - 86_400;
    let mut asks: Vec<(String, Vec<(&str, String)>)> = Vec::new();
    let range = |q: &str, start: i64, step: u32| {
        vec![
            ("query", q.to_string()),
            ("start", start.to_string()),
            ("end", to.to_string()),
            ("step", step.to_string()),
        ]
    };
    for q in QUERIES {
        asks.push(("query_range".into(), range(q, from, 3600)));
    }
    for q in QUERIES {
        asks.push(("query_range".into(), range(q, day_from, 300)));
    }
    for q in &QUERIES[..2] {
        let mut form = range(q, day_from, 60);
        form.push(("max_source_resolution", "raw".into()));
        asks.push(("query_range".into(), form));
    }
    asks.push((
        "series".into(),
        vec![("match[]", "DCGM_FI_DEV_GPU_TEMP".into()), ("start", from.to_string()), ("end", to.to_string())],
    ));
    asks.push(("label/Hostname/values".into(), vec![("start", from.to_string()), ("end", to.to_string())]));
    let ask = |path: String, form: Vec<(&'static str, String)>| {
        let (client, base) = (client.clone(), base.clone());
        async move {
            let resp = client.get(format!("{base}/api/v1/{path}")).query(&form).send().await?;
            let status = resp.status();
            let text = resp.text().await?;
            let body: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{path} {form:?}: HTTP {status}: {text}"))?;
            anyhow::ensure!(body["status"] == "success", "{path} {form:?}: {body}");
            // (A query may rightly be empty: XID errors are rare.)
            anyhow::ensure!(
                path == "query_range" || body["data"].as_array().is_some_and(|a| !a.is_empty()),
                "{path} {form:?}: an empty answer"
            );
            Ok::<_, anyhow::Error>(())
        }
    };
    let started = Instant::now();
    for (path, form) in asks.clone() {
        ask(path, form).await?;
    }
    let one_at_a_time_mb = super::scale::peak_rss_mb_of(&pid);
    // The whole-span twelve at once, as a dashboard asks them.
    let together: Vec<_> = asks[..QUERIES.len()].iter().map(|(p, f)| tokio::spawn(ask(p.clone(), f.clone()))).collect();
    for t in together {
        t.await??;
    }
    Ok(Served {
        one_at_a_time_mb,
        peak_mb: super::scale::peak_rss_mb_of(&pid),
        seconds: started.elapsed().as_secs_f64(),
        queries: asks.len() + QUERIES.len(),
    })
}

pub async fn run(gpus: usize, days: u32, interval_s: u64, keep: Option<&Path>) -> anyhow::Result<()> {
    let series = gpus * FIELDS.len();
    println!(
        "bench archive-month: {gpus} GPUs x {} fields ({series} series) at {interval_s} s over {days} days",
        FIELDS.len()
    );
    let tmp = tempfile::tempdir()?;
    let root = keep.unwrap_or(tmp.path());
    let archive_dir = root.join("archive");
    std::fs::create_dir_all(&archive_dir)?;
    let archive = strata_archive::archive_store(&archive_dir.display().to_string(), true)?;
    let end = strata_model::time::now_ms().div_euclid(DAY_MS) * DAY_MS;
    let start = end - i64::from(days) * DAY_MS;
    let mut history = History::new(gpus, interval_s);
    let (mut samples, mut raw_bytes, mut agg_bytes) = (0u64, 0u64, std::collections::BTreeMap::<i64, u64>::new());
    let (mut generate_s, mut write_s) = (0.0, 0.0);
    let mut first_day = None;
    for d in 0..i64::from(days) {
        let day = start + d * DAY_MS;
        let scratch = tempfile::tempdir()?;
        let started = Instant::now();
        let (db, n) = {
            let dir = scratch.path().to_path_buf();
            let mut h = std::mem::replace(&mut history, History::new(0, interval_s));
            let (h, out) = tokio::task::spawn_blocking(move || {
                let out = h.day(&dir, day);
                (h, out)
            })
            .await?;
            history = h;
            out?
        };
        generate_s += started.elapsed().as_secs_f64();
        let started = Instant::now();
        let db = Arc::new(db);
        let source = strata_tsdb::TsdbStore(db.clone());
        let written =
            crate::archive::write_blocks(archive.clone(), &source, (db.min_time(), db.max_time()), DAY_MS, false)
                .await?;
        anyhow::ensure!(written.samples == n, "day {d}: {n} samples simulated, {} archived", written.samples);
        anyhow::ensure!(written.kept.is_empty(), "the archive at {} was not empty", archive_dir.display());
        write_s += started.elapsed().as_secs_f64();
        samples += written.samples;
        raw_bytes += written.raw_bytes;
        for (w, b) in written.aggregate_bytes {
            *agg_bytes.entry(w).or_default() += b;
        }
        eprint!("\r  day {}/{days}: {samples} samples archived", d + 1);
        if d == 0 {
            eprintln!();
            let served = serve_and_query(&archive_dir, day / 1000, (day + DAY_MS) / 1000, None).await?;
            println!(
                "  the reader over 1 day ({} MB archived): {} queries in {:.1} s, peak {:.0} MB ({:.0} MB one query at a time)",
                (raw_bytes + agg_bytes.values().sum::<u64>()) / 1_000_000,
                served.queries,
                served.seconds,
                served.peak_mb,
                served.one_at_a_time_mb
            );
            first_day = Some(served);
        }
    }
    eprintln!();
    let total = raw_bytes + agg_bytes.values().sum::<u64>();
    println!(
        "  simulated in {generate_s:.0} s, archived in {write_s:.0} s ({:.2} M samples/s written): raw {:.3} bytes per sample{}, {} MB in all",
        samples as f64 / write_s.max(1e-9) / 1e6,
        raw_bytes as f64 / samples.max(1) as f64,
        agg_bytes
            .iter()
            .map(|(w, b)| format!(
                ", {} {:.3}",
                strata_archive::layout::resolution_dir(*w),
                *b as f64 / samples.max(1) as f64
            ))
            .collect::<String>(),
        total / 1_000_000
    );
    let served = serve_and_query(&archive_dir, start / 1000, end / 1000, None).await?;
    println!(
        "  the reader over {days} days ({} MB archived, {samples} samples): {} queries in {:.1} s, peak {:.0} MB ({:.0} MB one query at a time)",
        total / 1_000_000,
        served.queries,
        served.seconds,
        served.peak_mb,
        served.one_at_a_time_mb
    );
    // The caches are what grows with a larger archive: with small ones, what is left.
    let small = serve_and_query(&archive_dir, start / 1000, end / 1000, Some(SMALL_CACHES_MB)).await?;
    println!(
        "  the same with {SMALL_CACHES_MB} MB caches (chunks and windows): {:.1} s, peak {:.0} MB ({:.0} MB one query at a time)",
        small.seconds, small.peak_mb, small.one_at_a_time_mb
    );
    if let Some(one) = first_day {
        println!(
            "  peak over {days} days / over 1 day: {:.0} / {:.0} MB = {:.2}",
            served.peak_mb,
            one.peak_mb,
            served.peak_mb / one.peak_mb.max(1.0)
        );
    }
    Ok(())
}
