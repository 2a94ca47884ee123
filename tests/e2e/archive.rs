//! The Parquet archive from the outside: an OpenMetrics file imported with `strata archive
//! import`, listed by `strata archive inspect`, and read by DuckDB and pyarrow (PyPI) with
//! no plugin, using the view docs/ARCHIVE.md gives: every series' count, min and max equal
//! what the file holds, bit for bit, and its sum to rounding. A damaged file is named by
//! `inspect`, which then exits 1.

use crate::common::report_not_run;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

fn python_has(modules: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true")
                && std::env::var("STRATA_SKIP_PROMETHEUS").as_deref() == Ok("1"),
            "python3 with {modules} is needed (pip install duckdb pyarrow); the README's test command installs them"
        );
        report_not_run("archive", "duckdb or pyarrow not installed and STRATA_SKIP_PROMETHEUS=1");
    }
    ok
}

/// Per (metric, gpu): every value written, in the text it was written with.
type Written = BTreeMap<(String, String), Vec<f64>>;

/// An OpenMetrics file of three families over eight GPUs, three hours at 15 s, with
/// values of every kind the archive stores apart: decimals, NaN, non-decimals, huge ones.
fn openmetrics(path: &Path) -> Written {
    let mut text = String::new();
    let mut written = Written::new();
    let t0 = 1_764_547_200i64; // 2025-12-01T00:00:00Z
    for (family, kind) in [("gpu_temp", "gauge"), ("xid_errors", "counter"), ("odd_values", "gauge")] {
        let _ = writeln!(text, "# TYPE {family} {kind}");
        let sample = if kind == "counter" { format!("{family}_total") } else { family.to_string() };
        for gpu in 0..8 {
            let mut counter = 0u64;
            for k in 0..720i64 {
                let v: f64 = match family {
                    "gpu_temp" => 40.0 + ((k * 7 + gpu * 3) % 300) as f64 / 10.0,
                    "xid_errors" => {
                        counter += (k % 3) as u64;
                        if k == 400 {
                            counter = 0; // a reset
                        }
                        counter as f64
                    }
                    _ => match k % 5 {
                        0 => f64::NAN,
                        1 => 0.1 + 0.2,
                        2 => 1e300 / (k as f64 + 1.0),
                        3 => -(k as f64) / 8.0,
                        _ => std::f64::consts::E * k as f64,
                    },
                };
                // Rust prints the shortest text that reads back to the same double.
                let shown = if v.is_nan() { "NaN".to_string() } else { format!("{v:?}") };
                let _ = writeln!(text, "{sample}{{gpu=\"{gpu}\"}} {shown} {}", t0 + k * 15);
                written.entry((sample.clone(), gpu.to_string())).or_default().push(v);
            }
        }
    }
    // A series only in the first hour's block, with a label no other has: the blocks'
    // series files differ in columns.
    let _ = writeln!(text, "# TYPE lone gauge");
    for k in 0..200i64 {
        let v = 1.5 + k as f64;
        let _ = writeln!(text, "lone{{gpu=\"0\",rack=\"r7\"}} {v:?} {}", t0 + k * 15);
        written.entry(("lone".into(), "0".into())).or_default().push(v);
    }
    text.push_str("# EOF\n");
    std::fs::write(path, text).unwrap();
    written
}

const QUERY: &str = r#"
import duckdb, json, sys, glob, struct
import pyarrow.parquet as pq
root = sys.argv[1]
c = duckdb.connect()
c.execute(f"""CREATE VIEW samples AS
SELECT s.*, d.timestamp,
       coalesce(d.value_float, d.value_mantissa / 10 ** d.value_scale) AS value
FROM read_parquet('{root}/raw/*/*/data.parquet', filename = true) d
JOIN read_parquet('{root}/raw/*/*/series.parquet', filename = true, union_by_name = true) s
  ON d.series_id = s.series_id
 AND parse_dirpath(d.filename) = parse_dirpath(s.filename)
WHERE parse_dirpath(d.filename) NOT IN
      (SELECT parse_dirpath(file) FROM glob('{root}/raw/*/*/deletion-mark.json'))""")
rows = c.execute("""SELECT __name__, gpu, count(*),
    count(*) FILTER (WHERE isnan(value)),
    min(value) FILTER (WHERE NOT isnan(value)),
    max(value) FILTER (WHERE NOT isnan(value)),
    sum(value) FILTER (WHERE NOT isnan(value))
  FROM samples GROUP BY ALL ORDER BY ALL""").fetchall()
rack_rows = c.execute("SELECT count(*) FROM samples WHERE rack = 'r7' AND __name__ = 'lone'").fetchone()[0]
arrow_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in glob.glob(f"{root}/raw/*/*/data.parquet"))
bits = lambda x: struct.unpack("<Q", struct.pack("<d", x))[0]
print(json.dumps({"series": [[r[0], r[1], r[2], r[3], bits(r[4]), bits(r[5]), r[6]] for r in rows],
                  "arrow_rows": arrow_rows, "rack_rows": rack_rows}))
"#;

#[test]
fn an_imported_archive_reads_in_duckdb_and_pyarrow_as_it_was_written() {
    if !python_has("duckdb, pyarrow") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let written = openmetrics(&d.join("fleet.om"));
    let archive = d.join("archive");
    let strata = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().unwrap();
    let (om, arch) = (d.join("fleet.om").display().to_string(), archive.display().to_string());
    let out = strata(&["archive", "import", "--openmetrics", &om, "--archive", &arch, "--block", "1h"]);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let total: usize = written.values().map(Vec::len).sum();
    assert!(
        text(&out.stdout).contains(&format!("imported {total} samples into 3 raw blocks")),
        "{}",
        text(&out.stdout)
    );
    let listed = strata(&["archive", "inspect", &arch]);
    assert!(listed.status.success(), "{}", text(&listed.stdout));
    assert_eq!(text(&listed.stdout).lines().filter(|l| l.starts_with("raw ")).count(), 3, "{}", text(&listed.stdout));
    // Imported again: no block is written over, and the import says which it left.
    let again = strata(&["archive", "import", "--openmetrics", &om, "--archive", &arch, "--block", "1h"]);
    assert!(!again.status.success(), "{}", text(&again.stdout));
    // The three raw blocks, and the 5 m and 1 h blocks of the range before the first hour
    // (its sample at 00:00:00 closes a window that ends there).
    assert!(text(&again.stderr).contains("11 blocks were already in the archive"), "{}", text(&again.stderr));
    for res in ["5m ", "1h "] {
        let n = text(&listed.stdout).lines().filter(|l| l.starts_with(res)).count();
        assert_eq!(n, 4, "{res}aggregate blocks: {}", text(&listed.stdout));
    }
    assert!(text(&again.stdout).contains("imported 0 samples into 0 raw blocks"), "{}", text(&again.stdout));
    // Imported in blocks of another size: none lands beside the blocks it overlaps.
    let coarser = strata(&["archive", "import", "--openmetrics", &om, "--archive", &arch, "--block", "2h"]);
    assert!(!coarser.status.success(), "{}", text(&coarser.stdout));
    assert!(text(&coarser.stdout).contains("imported 0 samples into 0 raw blocks"), "{}", text(&coarser.stdout));
    let relisted = strata(&["archive", "inspect", &arch]);
    assert_eq!(text(&relisted.stdout), text(&listed.stdout), "nothing written beside the blocks there");

    let script = d.join("query.py");
    std::fs::write(&script, QUERY).unwrap();
    let out = Command::new("python3").arg(&script).arg(&archive).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["arrow_rows"], total, "pyarrow's row count");
    assert_eq!(got["rack_rows"], 200, "the label only one block has, on its series alone");
    let series = got["series"].as_array().unwrap();
    assert_eq!(series.len(), written.len(), "{got}");
    for row in series {
        let key = (row[0].as_str().unwrap().to_string(), row[1].as_str().unwrap().to_string());
        let values = &written[&key];
        let real: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
        assert_eq!(row[2], values.len(), "{key:?}: count");
        assert_eq!(row[3], values.len() - real.len(), "{key:?}: NaNs");
        // Min and max compared bit for bit.
        let min = real.iter().copied().fold(f64::INFINITY, f64::min);
        let max = real.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(row[4].as_u64(), Some(min.to_bits()), "{key:?}: min {min}");
        assert_eq!(row[5].as_u64(), Some(max.to_bits()), "{key:?}: max {max}");
        let sum: f64 = real.iter().sum();
        let theirs = row[6].as_f64().unwrap();
        assert!((theirs - sum).abs() <= sum.abs() * 1e-12, "{key:?}: sum {theirs} against {sum}");
    }

    // A damaged data file: named, and inspect fails.
    let data = std::fs::read_dir(archive.join("raw"))
        .unwrap()
        .flat_map(|day| std::fs::read_dir(day.unwrap().path()).unwrap())
        .map(|b| b.unwrap().path().join("data.parquet"))
        .next()
        .unwrap();
    let mut bytes = std::fs::read(&data).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&data, bytes).unwrap();
    let listed = strata(&["archive", "inspect", &arch]);
    assert_eq!(listed.status.code(), Some(1));
    let report = text(&listed.stdout);
    assert!(report.contains("DAMAGED") && report.contains("data.parquet") && report.contains("checksum"), "{report}");
    assert_eq!(report.lines().filter(|l| l.starts_with("raw ")).count(), 2, "the other blocks still listed: {report}");
}

/// The archive inside a global: an HA pair of edges holding 2.5 hours, a global that
/// archives them (`--archive`, one-hour blocks), and a second global that serves the
/// archive alone (no `--config`).
pub(crate) mod global {
    use crate::common::*;
    use crate::differential::{remote_write_all, Series};
    use crate::global::edge;
    use std::time::{Duration, Instant};

    const HOUR: i64 = 3_600_000;

    fn metrics(base: &str) -> String {
        client().get(format!("{base}/metrics")).send().unwrap().text().unwrap()
    }

    /// Polls `/metrics` until `name` reaches `want`, for at most `within`.
    fn wait_metric(base: &str, name: &str, want: f64, within: Duration) -> f64 {
        let started = Instant::now();
        loop {
            let got = metric_value(&metrics(base), name).unwrap_or(f64::NAN);
            if got >= want || started.elapsed() > within {
                return got;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn range(base: &str, q: &str, start: i64, end: i64) -> serde_json::Value {
        let url = format!(
            "{base}/api/v1/query_range?query={}&start={}&end={}&step=60",
            crate::hostile_queries::encode(q),
            start / 1000,
            end / 1000
        );
        // Patient: an archive on S3 behind a faulty proxy retries its reads.
        let patient = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
        let text = patient.get(&url).send().and_then(|r| r.text()).unwrap_or_else(|e| panic!("{url}: {e}"));
        let body: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: {e}: {text}"));
        let data = body["data"].clone();
        assert_eq!(data["resultType"], "matrix", "{url}: {text}");
        data["result"].clone()
    }

    #[test]
    fn a_global_archives_its_stores_once_and_another_serves_the_archive_alone() {
        let dir = tempfile::tempdir().unwrap();
        let arch = dir.path().join("archive").display().to_string();
        archive_edges_once(dir.path(), &arch, &[]);
    }

    /// Two clusters' edges, each cluster archived by a global of its own
    /// (`--archive.shard`) into one archive; a global on the archive alone answers for both
    /// as the edges do, and a global that would archive the whole bucket beside the shards
    /// refuses to start.
    #[test]
    fn two_globals_archive_a_shard_each_and_one_reader_serves_both() {
        let dir = tempfile::tempdir().unwrap();
        let arch = dir.path().join("archive").display().to_string();
        let (mut edge_0, base_0, grpc_0) = crate::global::edge_of(dir.path(), "c0", "a", &[]);
        let (mut edge_1, base_1, grpc_1) = crate::global::edge_of(dir.path(), "c1", "a", &[]);
        let now = now_ms();
        let first = (now - 5 * HOUR / 2) / 15_000 * 15_000;
        for (base, offset) in [(&base_0, 0.0), (&base_1, 100.0)] {
            let series: Vec<Series> = (0..2)
                .map(|gpu| {
                    let labels = vec![("__name__".into(), "gpu_temp".into()), ("gpu".into(), gpu.to_string())];
                    let samples = (0..).map(|k| first + k * 15_000).take_while(|t| *t < now - 60_000);
                    let value = move |t: i64| offset + 40.0 + ((t / 15_000) % 17) as f64 + gpu as f64;
                    (labels, samples.map(|t| (t, value(t))).collect())
                })
                .collect();
            remote_write_all(base, &series);
        }
        let cfg_path = dir.path().join("global.yml");
        std::fs::write(&cfg_path, format!("stores: ['{grpc_0}', '{grpc_1}']\ninfo_interval: 1s\n")).unwrap();
        let cfg_path = cfg_path.display().to_string();
        let flags = |shard: &'static str| -> Vec<String> {
            let mut f: Vec<String> = ["--config", &cfg_path, "--archive", &arch, "--archive.block", "1h"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            f.extend(["--archive.settle", "1s", "--archive.interval", "1s"].map(String::from));
            f.extend(["--archive.shard".to_string(), shard.to_string()]);
            f
        };
        let complete = (now / HOUR - first / HOUR) as f64;
        let mut globals = Vec::new();
        for (name, shard) in [("global-c0", r#"c0={cluster="c0"}"#), ("global-c1", r#"c1={cluster="c1"}"#)] {
            let f = flags(shard);
            let args: Vec<&str> = f.iter().map(String::as_str).collect();
            let (p, base) = global_with(dir.path(), name, &args, &[]);
            globals.push((p, base));
        }
        for (_, base) in &globals {
            let written = wait_metric(base, "strata_archive_blocks_written_total", complete, Duration::from_secs(90));
            assert_eq!(written, complete, "{}", metrics(base));
        }
        // Each shard's blocks hold its cluster's two series, under its own folder.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata")).args(["archive", "inspect", &arch]).output();
        let listing = String::from_utf8_lossy(&out.unwrap().stdout).into_owned();
        for shard in ["c0", "c1"] {
            let blocks: Vec<&str> =
                listing.lines().filter(|l| l.starts_with("raw ") && l.ends_with(&format!("(shard {shard})"))).collect();
            assert_eq!(blocks.len() as f64, complete, "{shard}: {listing}");
            assert!(blocks.iter().all(|l| l.split_whitespace().nth(3) == Some("2")), "two series: {listing}");
        }
        assert!(std::path::Path::new(&arch).join("shards/c0/progress/raw.json").exists());

        // One reader of the root: both clusters, as the edges answer.
        let (from, to) = (first / HOUR * HOUR + HOUR, now / HOUR * HOUR - 60_000);
        let (mut reader, reader_base) =
            global_with(dir.path(), "global-archive", &["--archive", &arch, "--archive.read-only"], &[]);
        for q in ["gpu_temp", "sum by (cluster) (avg_over_time(gpu_temp[10m]))"] {
            let live = range(&globals[0].1, q, from, to);
            let archived = range(&reader_base, q, from, to);
            assert_eq!(archived.as_array().map(Vec::len), Some(if q == "gpu_temp" { 4 } else { 2 }), "{q}");
            assert_eq!(archived, live, "{q}: the archive's shards answer as the edges do");
        }
        reader.terminate();

        // Archiving the whole bucket beside its shards is refused at start, saying why.
        let http = format!("127.0.0.1:{}", free_port());
        let whole = ["global", "--http-listen", &http, "--config", &cfg_path, "--archive", &arch];
        let mut p = Proc::strata(&whole, dir.path(), "global-whole");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = p.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                break status;
            }
            assert!(Instant::now() < deadline, "a global archiving the whole bucket beside its shards kept running");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(!status.success());
        let log = std::fs::read_to_string(&p.log).unwrap();
        assert!(log.contains("archived in shards"), "{log}");
        for (mut g, _) in globals {
            g.terminate();
        }
        edge_0.terminate();
        edge_1.terminate();
    }

    /// A global with `extra` arguments and environment, waited for.
    fn global_with(dir: &std::path::Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> (Proc, String) {
        let http = format!("127.0.0.1:{}", free_port());
        let mut all = vec!["global", "--http-listen", &http];
        all.extend_from_slice(args);
        let mut p = Proc::strata_with_env(&all, env, dir, name);
        wait_ready(&format!("http://{http}/-/ready"), &mut p, Duration::from_secs(30));
        (p, format!("http://{http}"))
    }

    /// Two edges of an HA pair, archived at `arch` (with `env`) by a global, then read
    /// back by a global on the archive alone, then archived again by a restarted global,
    /// which writes nothing.
    pub(crate) fn archive_edges_once(dir: &std::path::Path, arch: &str, env: &[(&str, &str)]) {
        let (mut edge_a, base_a, grpc_a) = edge(dir, "a");
        let (mut edge_b, base_b, grpc_b) = edge(dir, "b");
        let now = now_ms();
        let first = (now - 5 * HOUR / 2) / 15_000 * 15_000;
        // Both replicas hold the very same samples, so that one answer is right for the
        // edges' dedup and the archive's (replicas that differ leave the choice of replica
        // to each query's range); a gauge and a counter that resets.
        for base in [&base_a, &base_b] {
            let mut series: Vec<Series> = (0..3)
                .map(|gpu| {
                    let labels = vec![("__name__".into(), "gpu_temp".into()), ("gpu".into(), gpu.to_string())];
                    let samples = (0..).map(|k| first + k * 15_000).take_while(|t| *t < now - 60_000);
                    (labels, samples.map(|t| (t, 40.0 + ((t / 15_000) % 17) as f64 + gpu as f64)).collect())
                })
                .collect();
            let labels = vec![("__name__".into(), "xid_total".into()), ("gpu".into(), "0".into())];
            let samples = (0..).map(|k| first + k * 15_000).take_while(|t| *t < now - 60_000);
            series.push((labels, samples.map(|t| (t, ((t / 15_000) % 500) as f64)).collect()));
            remote_write_all(base, &series);
        }
        let cfg = format!("stores: ['{grpc_a}', '{grpc_b}']\ninfo_interval: 1s\n");
        let cfg_path = dir.join("global.yml");
        std::fs::write(&cfg_path, &cfg).unwrap();
        let cfg_path = cfg_path.display().to_string();
        let flags = [
            "--config",
            &cfg_path,
            "--archive",
            arch,
            "--archive.block",
            "1h",
            "--archive.settle",
            "1s",
            "--archive.interval",
            "1s",
        ];
        let (mut global, base) = global_with(dir, "global", &flags, env);
        // Every hour that ended before now: the first holds part of an hour.
        let complete = (now / HOUR - first / HOUR) as f64;
        let written = wait_metric(&base, "strata_archive_blocks_written_total", complete, Duration::from_secs(90));
        assert_eq!(written, complete, "{}", metrics(&base));
        let ready = client().get(format!("{base}/-/ready")).send().unwrap();
        assert_eq!(ready.status().as_u16(), 200);

        // Each series once, without the replica label.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["archive", "inspect", arch])
            .envs(env.iter().copied())
            .output();
        let listing = String::from_utf8_lossy(&out.unwrap().stdout).into_owned();
        let blocks: Vec<&str> = listing.lines().filter(|l| l.starts_with("raw ")).collect();
        assert_eq!(blocks.len() as f64, complete, "{listing}");
        assert!(blocks.iter().all(|l| l.split_whitespace().any(|w| w == "4")), "four series per block: {listing}");

        // The same questions over the archived hours, from the edges and from the archive.
        let (from, to) = (first / HOUR * HOUR + HOUR, now / HOUR * HOUR - 60_000);
        let (mut reader, reader_base) =
            global_with(dir, "global-archive", &["--archive", arch, "--archive.read-only"], env);
        for q in ["gpu_temp", "sum_over_time(gpu_temp[10m])", "rate(xid_total[5m])", "resets(xid_total[30m])"] {
            let live = range(&base, q, from, to);
            let archived = range(&reader_base, q, from, to);
            assert!(!live.as_array().unwrap().is_empty(), "{q}");
            assert_eq!(archived, live, "{q}: the archive answers as the edges do");
        }
        let stores = api_data(&format!("{reader_base}/api/v1/stores"));
        assert_eq!(stores[0]["kind"], "archive", "{stores}");
        reader.terminate();

        // A restart archives nothing again: every range is there once.
        global.terminate();
        let (mut again, base) = global_with(dir, "global", &flags, env);
        let until = wait_metric(&base, "strata_archive_archived_until_seconds", 1.0, Duration::from_secs(30));
        assert_eq!(until as i64, now / HOUR * HOUR / 1000, "{}", metrics(&base));
        assert_eq!(metric_value(&metrics(&base), "strata_archive_blocks_written_total"), Some(0.0));
        again.terminate();
        edge_a.terminate();
        edge_b.terminate();
    }
}
