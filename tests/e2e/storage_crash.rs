//! Crash safety of the storage: an edge is made to abort (as SIGKILL: no unwinding, no
//! clean-up) at each step of writing a block, compacting and deleting, through the
//! `STRATA_CRASH_AT` crash points. After a restart every acknowledged sample is there once:
//! none lost, none duplicated, and maintenance goes on.

use crate::common::*;
use crate::differential::{remote_write_all, Series};
use serde_json::Value;
use std::time::Duration;

const POINTS: [&str; 4] =
    ["block-before-rename", "head-cut-before-truncate", "compaction-before-delete", "block-delete-after-rename"];

/// Eight minutes of 4 series at 5 s, ending a minute ago.
fn data(now: i64) -> Vec<Series> {
    let start = (now - 9 * 60_000) / 1000 * 1000;
    (0..4)
        .map(|g| {
            let labels = vec![("__name__".to_string(), "crash_test".to_string()), ("gpu".to_string(), g.to_string())];
            let samples = (0..96).map(|i| (start + i * 5_000, (i * 10 + g) as f64)).collect();
            (labels, samples)
        })
        .collect()
}

fn stored(base: &str, now: i64) -> Vec<(String, Vec<(i64, f64)>)> {
    let url = format!("{base}/api/v1/query?query=crash_test%5B1h%5D&time={:.3}", now as f64 / 1000.0);
    let data = api_data(&url);
    let mut out: Vec<(String, Vec<(i64, f64)>)> = data["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s: &Value| {
            let pts = s["values"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|p| ((p[0].as_f64().unwrap() * 1000.0).round() as i64, p[1].as_str().unwrap().parse().unwrap()))
                .collect();
            (s["metric"]["gpu"].as_str().unwrap_or("").to_string(), pts)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn a_crash_at_any_storage_step_loses_and_duplicates_nothing() {
    for point in POINTS {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("edge.yml");
        std::fs::write(&cfg, "scrape_configs: []\nstrata:\n  block_range: 10s\n").unwrap();
        let (cfg, data_dir) = (cfg.display().to_string(), dir.path().join("data").display().to_string());
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let args = ["edge", "--config", &cfg, "--data", &data_dir, "--http-listen", &listen];
        let base = format!("http://127.0.0.1:{port}");
        let mut edge = Proc::strata_with_env(&args, &[("STRATA_CRASH_AT", point)], dir.path(), "edge");
        wait_ready(&format!("{base}/-/ready"), &mut edge, Duration::from_secs(30));
        let now = now_ms();
        let series = data(now);
        remote_write_all(&base, &series);
        // Maintenance runs every second with 10 s blocks: the crash point comes quickly.
        let st = edge.wait_exit(Duration::from_secs(30));
        let st = st.unwrap_or_else(|| panic!("{point}: the edge never reached the crash point:\n{}", edge.log_text()));
        assert!(!st.success(), "{point}: the edge exited cleanly instead of crashing");
        assert!(edge.log_text().contains(point), "{point}: crashed elsewhere:\n{}", edge.log_text());

        let mut edge = Proc::strata(&args, dir.path(), "edge-restarted");
        wait_ready(&format!("{base}/-/ready"), &mut edge, Duration::from_secs(30));
        let want: Vec<(String, Vec<(i64, f64)>)> = series.iter().map(|(l, s)| (l[1].1.clone(), s.clone())).collect();
        assert_eq!(stored(&base, now), want, "{point}: after the restart");
        // The next maintenance runs are clean and change nothing a query sees.
        std::thread::sleep(Duration::from_secs(3));
        edge.assert_running();
        assert_eq!(stored(&base, now), want, "{point}: after maintenance resumed");
        let ready = client().get(format!("{base}/-/ready")).send().unwrap();
        assert!(ready.status().is_success(), "{point}: not ready after the restart");
        edge.terminate();
    }
}

/// A maintenance run that cannot write its block turns `/-/ready` to 503 with the reason
/// and counts the failure; once the cause is gone the next run cuts the block and the edge
/// is ready again, with every sample still served.
#[test]
fn a_failed_block_cut_makes_the_edge_unready_until_maintenance_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("edge.yml");
    std::fs::write(&cfg, "scrape_configs: []\nstrata:\n  block_range: 10s\n").unwrap();
    let data_path = dir.path().join("data");
    let (cfg, data_dir) = (cfg.display().to_string(), data_path.display().to_string());
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let args = ["edge", "--config", &cfg, "--data", &data_dir, "--http-listen", &listen];
    let base = format!("http://127.0.0.1:{port}");
    let mut edge = Proc::strata(&args, dir.path(), "edge");
    wait_ready(&format!("{base}/-/ready"), &mut edge, Duration::from_secs(30));
    // Blocks cannot be written where a file stands in for their directory (root ignores
    // permissions, so a read-only directory would not do).
    let blocks = data_path.join("blocks");
    std::fs::remove_dir_all(&blocks).unwrap();
    std::fs::write(&blocks, b"not a directory").unwrap();
    let now = now_ms();
    let series = data(now);
    remote_write_all(&base, &series);

    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let body = loop {
        let r = client().get(format!("{base}/-/ready")).send().unwrap();
        if r.status().as_u16() == 503 {
            break r.text().unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "never unready:\n{}", edge.log_text());
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(body.contains("storage maintenance"), "the 503 does not say why: {body}");
    let metrics = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    let failures: f64 = metrics
        .lines()
        .find(|l| l.starts_with("strata_storage_maintenance_failures_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0);
    assert!(failures >= 1.0, "no failure counted:\n{metrics}");
    edge.assert_running();
    let want: Vec<(String, Vec<(i64, f64)>)> = series.iter().map(|(l, s)| (l[1].1.clone(), s.clone())).collect();
    assert_eq!(stored(&base, now), want, "while maintenance fails");

    std::fs::remove_file(&blocks).unwrap();
    std::fs::create_dir(&blocks).unwrap();
    wait_ready(&format!("{base}/-/ready"), &mut edge, Duration::from_secs(20));
    let cut = std::fs::read_dir(&blocks).unwrap().flatten().any(|e| e.path().join("meta.json").exists());
    assert!(cut, "ready again without a block cut");
    assert_eq!(stored(&base, now), want, "after maintenance recovered");
    edge.terminate();
}

/// A stop that arrives while a block cut is writing (Kubernetes sends SIGTERM, then SIGKILL
/// when the grace period ends): the cut has closed its window to new samples before its
/// block exists, so whatever the stop writes must not record that window as on disk. The
/// cut is held at `head-cut-writing` (`STRATA_PAUSE_AT`), SIGTERM arrives, and SIGKILL a
/// few seconds later; after a restart every acknowledged sample is back.
#[test]
fn sigterm_during_a_block_cut_then_sigkill_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("edge.yml");
    std::fs::write(&cfg, "scrape_configs: []\nstrata:\n  block_range: 10s\n").unwrap();
    let (cfg, data_dir) = (cfg.display().to_string(), dir.path().join("data").display().to_string());
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let args = ["edge", "--config", &cfg, "--data", &data_dir, "--http-listen", &listen];
    let base = format!("http://127.0.0.1:{port}");
    let pause = [("STRATA_PAUSE_AT", "head-cut-writing:20000")];
    let mut edge = Proc::strata_with_env(&args, &pause, dir.path(), "edge");
    wait_ready(&format!("{base}/-/ready"), &mut edge, Duration::from_secs(30));
    let now = now_ms();
    let series = data(now);
    remote_write_all(&base, &series);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !edge.log_text().contains("head-cut-writing: pausing") {
        edge.assert_running();
        assert!(std::time::Instant::now() < deadline, "no block cut began:\n{}", edge.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    edge.signal_term();
    // The grace period ends before the cut does.
    std::thread::sleep(Duration::from_secs(3));
    edge.kill9();

    let mut edge = Proc::strata(&args, dir.path(), "edge-restarted");
    wait_ready(&format!("{base}/-/ready"), &mut edge, Duration::from_secs(30));
    let want: Vec<(String, Vec<(i64, f64)>)> = series.iter().map(|(l, s)| (l[1].1.clone(), s.clone())).collect();
    let got = stored(&base, now);
    let missing: Vec<(String, i64)> = want
        .iter()
        .flat_map(|(g, s)| s.iter().map(move |p| (g, p)))
        .filter(|(g, p)| !got.iter().any(|(h, v)| h == *g && v.contains(p)))
        .map(|(g, p)| (g.clone(), p.0))
        .collect();
    assert!(missing.is_empty(), "{} acknowledged samples lost, the first {:?}", missing.len(), missing.first());
    assert_eq!(got, want, "after SIGTERM during a cut and SIGKILL");
    edge.terminate();
}
