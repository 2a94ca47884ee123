//! The edge's StoreAPI, as a global querier reads it: a real edge process with external
//! labels, remote-written data, and a `RemoteStore` over loopback.

use crate::common::*;
use crate::differential::{remote_write_all, Series};
use std::time::Duration;
use strata_grpc::{RemoteStore, RemoteStoreOptions};
use strata_model::Matcher;
use strata_store::{SelectRequest, Store};

#[test]
fn the_edge_serves_its_data_over_grpc_with_its_external_labels() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("edge.yml");
    std::fs::write(&cfg, "global:\n  external_labels:\n    cluster: c0\n    replica: a\nscrape_configs: []\n").unwrap();
    let (cfg, data_dir) = (cfg.display().to_string(), dir.path().join("data").display().to_string());
    let (port, grpc_port) = (free_port(), free_port());
    let (listen, grpc) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{grpc_port}"));
    let args = ["edge", "--config", &cfg, "--data", &data_dir, "--http-listen", &listen, "--grpc-listen", &grpc];
    let base = format!("http://127.0.0.1:{port}");
    let mut edge = Proc::strata(&args, dir.path(), "edge");
    wait_ready(&format!("{base}/-/ready"), &mut edge, Duration::from_secs(30));
    let now = now_ms();
    let start = (now - 10 * 60_000) / 1000 * 1000;
    let series: Vec<Series> = (0..3)
        .map(|g| {
            let labels = vec![("__name__".to_string(), "grpc_test".to_string()), ("gpu".to_string(), g.to_string())];
            (labels, (0..100).map(|i| (start + i * 5_000, (i * 3 + g) as f64)).collect())
        })
        .collect();
    remote_write_all(&base, &series);

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let remote = RemoteStore::new(&grpc, RemoteStoreOptions::default()).unwrap();
        let info = remote.info().await.unwrap();
        let ext: Vec<(String, String)> =
            info.label_sets[0].labels.iter().map(|l| (l.name.clone(), l.value.clone())).collect();
        assert_eq!(ext, [("cluster".into(), "c0".into()), ("replica".into(), "a".into())]);
        assert!(info.min_time <= start && info.max_time >= start + 99 * 5_000, "{info:?}");
        let req = SelectRequest::new(vec![Matcher::eq("__name__", "grpc_test")], start, now);
        let found = remote.select(&req).await.unwrap();
        assert_eq!(found.len(), 3);
        for (s, (_, want)) in found.iter().zip(&series) {
            assert_eq!(s.labels.get("cluster"), Some("c0"));
            assert_eq!(s.labels.get("replica"), Some("a"));
            let got: Vec<(i64, f64)> = s.samples(start, now).unwrap().iter().map(|x| (x.t, x.v)).collect();
            assert_eq!(&got, want, "{}", s.labels);
        }
        let other =
            SelectRequest::new(vec![Matcher::eq("__name__", "grpc_test"), Matcher::eq("cluster", "c1")], start, now);
        assert!(remote.select(&other).await.unwrap().is_empty());
    });
    // The edge's own Prometheus API answers without external labels, as Prometheus does.
    let data =
        api_data(&format!("{base}/api/v1/query?query=grpc_test&time={:.3}", (start + 99 * 5_000) as f64 / 1000.0));
    let result = data["result"].as_array().unwrap();
    assert_eq!(result.len(), 3);
    assert!(result.iter().all(|s| s["metric"].get("cluster").is_none()), "{data}");
    edge.terminate();
}
