//! Kill -9 of the edge under steady scrape and remote-write load loses no acknowledged
//! sample: every remote write answered 204 and every sample the edge counted as appended
//! is there after a restart.

use crate::common::*;
use prost::Message;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_model::matcher::Matcher;
use strata_proto::prometheus::{Label, Sample as PbSample, TimeSeries, WriteRequest};
use strata_tsdb::db::{Tsdb, TsdbOptions};

fn write_body(batch: u64, series: usize, t: i64) -> (Vec<u8>, Vec<(String, i64, f64)>) {
    let mut acked = Vec::new();
    let ts = (0..series)
        .map(|i| {
            let name = format!("rw_load_{i}");
            let v = (batch * 1000 + i as u64) as f64 + 0.25;
            acked.push((name.clone(), t, v));
            TimeSeries {
                labels: vec![
                    Label { name: "__name__".into(), value: name },
                    Label { name: "source".into(), value: "test".into() },
                ],
                samples: vec![PbSample { value: v, timestamp: t }],
                exemplars: vec![],
            }
        })
        .collect();
    let req = WriteRequest { timeseries: ts, metadata: vec![] };
    (snap::raw::Encoder::new().compress_vec(&req.encode_to_vec()).expect("snappy"), acked)
}

#[test]
fn sigkill_under_load_loses_no_acknowledged_sample() {
    let dir = tempfile::tempdir().unwrap();
    let sim_port = free_port();
    let edge_port = free_port();
    let sim_addr = format!("127.0.0.1:{sim_port}");
    let mut sim = Proc::strata(
        &["simulate", "--nodes", "4", "--listen", &sim_addr, "--start-at", &quiet_start(4)],
        dir.path(),
        "sim",
    );
    wait_ready(&format!("http://127.0.0.1:{sim_port}/node/0/metrics"), &mut sim, Duration::from_secs(30));

    let mut targets = String::new();
    for i in 0..4 {
        targets.push_str(&format!("      - targets: ['127.0.0.1:{sim_port}']\n        labels: {{__metrics_path__: /node/{i}/metrics, node: '{i}'}}\n"));
    }
    let cfg = dir.path().join("edge.yml");
    std::fs::write(
        &cfg,
        format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: dcgm\n    static_configs:\n{targets}"),
    )
    .unwrap();
    let data = dir.path().join("data");
    let edge_args = |port: u16| {
        vec![
            "edge".to_string(),
            "--config".into(),
            cfg.display().to_string(),
            "--data".into(),
            data.display().to_string(),
            "--http-listen".into(),
            format!("127.0.0.1:{port}"),
        ]
    };
    let start_edge = |port: u16, name: &str| {
        let args = edge_args(port);
        Proc::start(env!("CARGO_BIN_EXE_strata"), &args, dir.path(), name)
    };
    let mut edge = start_edge(edge_port, "edge-1");
    let base = format!("http://127.0.0.1:{edge_port}");
    wait_ready(&format!("{base}/-/ready"), &mut edge, Duration::from_secs(30));

    // Remote-write load from two threads for up to 6 s while the edge scrapes every second.
    let acked: Arc<parking_lot_free::Acked> = Arc::new(Default::default());
    let stop_at = Instant::now() + Duration::from_secs(6);
    let handles: Vec<_> = (0..2)
        .map(|thread| {
            let acked = acked.clone();
            let url = format!("{base}/api/v1/write");
            std::thread::spawn(move || {
                let c = client();
                let mut batch = thread as u64 * 1_000_000;
                let mut sent = 0;
                while Instant::now() < stop_at && sent < 20_000 {
                    batch += 1;
                    sent += 1;
                    let (body, samples) = write_body(batch, 50, now_ms());
                    let r = c
                        .post(&url)
                        .header("Content-Encoding", "snappy")
                        .header("Content-Type", "application/x-protobuf")
                        .body(body)
                        .send();
                    if let Ok(r) = r {
                        if r.status().as_u16() == 204 {
                            acked.add(samples);
                        }
                    }
                }
            })
        })
        .collect();
    // The kill lands while both writers still have requests in flight.
    std::thread::sleep(Duration::from_secs(2));
    let page = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    let appended = metric_value(&page, "strata_head_samples_appended_total").expect("appended counter");
    let in_flight_at_kill = handles.iter().filter(|h| !h.is_finished()).count();
    edge.kill9();
    let killed_at = now_ms();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(in_flight_at_kill, 2, "the writers had stopped before the kill");
    let acked = acked.take();
    assert!(acked.len() > 1000, "the load wrote {} acknowledged samples", acked.len());

    // Restart: it replays and serves the series again.
    let port2 = free_port();
    let mut edge = start_edge(port2, "edge-2");
    wait_ready(&format!("http://127.0.0.1:{port2}/-/ready"), &mut edge, Duration::from_secs(60));
    assert_eq!(series_count(&format!("http://127.0.0.1:{port2}"), "{source=\"test\"}"), 50);
    edge.kill9();

    // Every acknowledged sample is stored, bit for bit; nothing the edge counted is missing.
    let db = Tsdb::open(&data, TsdbOptions::default()).unwrap();
    let mut stored: HashMap<(String, i64), f64> = HashMap::new();
    let mut before_kill = 0u64;
    for (s, chunks) in db.head().select(
        &[Matcher::new(strata_model::matcher::MatchOp::Regex, "__name__", ".+").unwrap()],
        i64::MIN,
        i64::MAX,
    ) {
        let name = s.labels.metric_name().unwrap_or_default().to_string();
        for c in chunks {
            for x in c.decode().unwrap() {
                if x.t <= killed_at {
                    before_kill += 1;
                }
                if s.labels.get("source") == Some("test") {
                    stored.insert((name.clone(), x.t), x.v);
                }
            }
        }
    }
    let missing: Vec<_> = acked
        .iter()
        .filter(|(n, t, v)| stored.get(&(n.clone(), *t)).map(|x| x.to_bits()) != Some(v.to_bits()))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "acknowledged samples missing after kill -9: {missing:?}");
    assert!(
        before_kill as f64 >= appended,
        "the edge had appended {appended} samples before the kill, {before_kill} came back"
    );
}

/// A tiny mutex-protected list, to keep the test free of extra dependencies.
mod parking_lot_free {
    use std::sync::Mutex;
    #[derive(Default)]
    pub struct Acked(Mutex<Vec<(String, i64, f64)>>);
    impl Acked {
        pub fn add(&self, v: Vec<(String, i64, f64)>) {
            if let Ok(mut g) = self.0.lock() {
                g.extend(v);
            }
        }
        pub fn take(&self) -> Vec<(String, i64, f64)> {
            self.0.lock().map(|mut g| std::mem::take(&mut *g)).unwrap_or_default()
        }
    }
}
