//! `strata up`: the simulator and an HA pair of edges start, both replicas scrape the whole
//! fleet, and Ctrl-C (SIGINT) stops everything cleanly with the data kept.

use crate::common::*;
use std::time::{Duration, Instant};

#[test]
fn up_runs_the_stack_and_stops_cleanly_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    // three consecutive free ports: retry a few bases until one is free as a block
    let base = (0..20)
        .map(|_| free_port())
        .find(|&p| p < 65000 && (1..3).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()))
        .expect("three free ports");
    let data = dir.path().join("strata-data");
    let mut up = Proc::strata(
        &["up", "--data", &data.display().to_string(), "--port-base", &base.to_string(), "--nodes", "2"],
        dir.path(),
        "up",
    );
    for port in [base + 1, base + 2] {
        wait_ready(&format!("http://127.0.0.1:{port}/-/ready"), &mut up, Duration::from_secs(60));
    }
    // both replicas hold every GPU of both simulated nodes
    let deadline = Instant::now() + Duration::from_secs(30);
    for port in [base + 1, base + 2] {
        loop {
            let n = series_count(&format!("http://127.0.0.1:{port}"), "DCGM_FI_DEV_GPU_TEMP");
            if n >= 16 {
                break;
            }
            assert!(Instant::now() < deadline, "edge on {port} has {n} GPU_TEMP series");
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    // Reloading over HTTP is off unless asked for, as in Prometheus.
    let r = client().post(format!("http://127.0.0.1:{}/-/reload", base + 1)).send().unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let out = up.log_text();
    assert!(out.contains(&format!("http://127.0.0.1:{base}/node/0/metrics")), "up prints where things run:\n{out}");
    assert!(out.contains("replica=a") && out.contains("replica=b"));

    let pid = up.child.as_ref().map(|c| c.id()).unwrap();
    assert!(std::process::Command::new("kill").arg("-INT").arg(pid.to_string()).status().unwrap().success());
    let mut child = up.child.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "strata up did not stop within 30 s of Ctrl-C");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "exit status {status}:\n{}", up.log_text());
    assert!(up.log_text().contains("stopped; data kept"));
    for r in ["a", "b"] {
        assert!(data.join(format!("edge-{r}/data/wal")).is_dir());
        assert!(data.join(format!("edge-{r}/edge.yml")).is_file());
    }
}
