//! Edge → regional forwarding with real processes: the regional killed (-9) under steady
//! scraping and then restarted, the edge killed (-9) while forwarding and restarted, and
//! at the end the regional holds exactly what the edge holds, sample for sample, with the
//! edge's external labels.

use crate::common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use strata_model::matcher::{MatchOp, Matcher};
use strata_tsdb::db::{Tsdb, TsdbOptions};

/// Every series' samples (timestamp, value bits), by label set with `add` set, from the
/// head and the blocks, read as a query reads them.
fn stored(dir: &Path, add: &[(&str, &str)]) -> BTreeMap<String, Vec<(i64, u64)>> {
    use strata_store::Store;
    let db = Tsdb::open(dir, TsdbOptions { retention: Duration::from_secs(86400 * 30), ..Default::default() })
        .unwrap_or_else(|e| panic!("opening {}: {e}", dir.display()));
    let store = strata_tsdb::TsdbStore(std::sync::Arc::new(db));
    let all = Matcher::new(MatchOp::Regex, "__name__", ".+").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let req = strata_store::SelectRequest::new(vec![all], i64::MIN, i64::MAX);
    let series = rt.block_on(store.select(&req)).unwrap();
    let mut out = BTreeMap::new();
    for s in series {
        let v: Vec<_> = s.samples(i64::MIN, i64::MAX).unwrap().iter().map(|x| (x.t, x.v.to_bits())).collect();
        let mut b = s.labels.to_builder();
        for (name, value) in add {
            b.set(name, value);
        }
        out.insert(b.build().to_string(), v);
    }
    out
}

fn edge_config(dir: &Path, sim: u16, regional: u16, scrape: bool) -> std::path::PathBuf {
    let mut text = "global:\n  scrape_interval: 1s\n  external_labels:\n    cluster: c0\n    replica: a\n".to_string();
    if scrape {
        text.push_str("scrape_configs:\n  - job_name: dcgm\n    static_configs:\n");
        for i in 0..2 {
            text.push_str(&format!(
                "      - targets: ['127.0.0.1:{sim}']\n        labels: {{__metrics_path__: /node/{i}/metrics, node: '{i}'}}\n"
            ));
        }
    }
    text.push_str(&format!("strata:\n  forward:\n    - address: 127.0.0.1:{regional}\n      batch_samples: 500\n"));
    let p = dir.join(if scrape { "edge.yml" } else { "edge-idle.yml" });
    std::fs::write(&p, text).unwrap();
    p
}

/// A regional's configuration, data directory and ports, kept across its restarts.
struct RegionalSetup {
    cfg: PathBuf,
    data: PathBuf,
    http: u16,
    grpc: u16,
}

impl RegionalSetup {
    fn new(dir: &Path, config: &str) -> RegionalSetup {
        let cfg = dir.join("regional.yml");
        std::fs::write(&cfg, config).unwrap();
        RegionalSetup { cfg, data: dir.join("regional"), http: free_port(), grpc: free_port() }
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    /// `strata regional` on the setup's ports and data, ready.
    fn start(&self, dir: &Path, name: &str) -> Proc {
        let (http, grpc) = (format!("127.0.0.1:{}", self.http), format!("127.0.0.1:{}", self.grpc));
        let (cfg, data) = (self.cfg.display().to_string(), self.data.display().to_string());
        let args = ["regional", "--config", &cfg, "--data", &data, "--http-listen", &http, "--grpc-listen", &grpc];
        let mut p = Proc::strata(&args, dir, name);
        wait_ready(&format!("{}/-/ready", self.base()), &mut p, Duration::from_secs(30));
        p
    }
}

/// Waits until the edge at `base` has nothing pending for its upstream; its last metrics page.
fn wait_caught_up(base: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let page = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
        if labelled_value(&page, "strata_forward_pending_bytes") == Some(0.0) {
            return page;
        }
        assert!(Instant::now() < deadline, "the edge did not catch up:\n{page}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn kill_9_of_either_side_loses_nothing_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim, sim_port) = start_sim(dir.path(), 2);
    let rs = RegionalSetup::new(dir.path(), "strata:\n  retention: 30d\n");
    let (rdata, edata) = (rs.data.clone(), dir.path().join("edge"));
    let regional = |name: &str| rs.start(dir.path(), name);
    let rg_grpc = rs.grpc;
    let edge = |cfg: &Path, name: &str| start_edge(dir.path(), cfg, &edata, name);

    let mut rg = regional("regional-1");
    let (mut e, base) = edge(&edge_config(dir.path(), sim_port, rg_grpc, true), "edge-1");
    std::thread::sleep(Duration::from_secs(3));
    // The regional dies in the middle of whatever it was doing; the edge scrapes on.
    rg.kill9();
    std::thread::sleep(Duration::from_secs(3));
    let page = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    let pending = labelled_value(&page, "strata_forward_pending_bytes").expect("pending bytes metric");
    assert!(pending > 0.0, "nothing pending while the regional was down:\n{page}");
    let mut rg = regional("regional-2");
    std::thread::sleep(Duration::from_secs(2));
    // The edge dies while forwarding (its batches are 500 samples: several a second).
    e.kill9();

    // The edge again, without scraping, so that what it holds stops growing: it resumes
    // from its cursor and sends the rest.
    let (mut e, base) = edge(&edge_config(dir.path(), sim_port, rg_grpc, false), "edge-2");
    wait_caught_up(&base);
    e.terminate();
    rg.terminate();

    // The regional's series carry the edge's external labels.
    let edge_data = stored(&edata, &[("cluster", "c0"), ("replica", "a")]);
    let regional_data = stored(&rdata, &[]);
    assert!(edge_data.len() > 100, "the edge holds {} series", edge_data.len());
    let mut missing = Vec::new();
    for (want, samples) in &edge_data {
        match regional_data.get(want) {
            Some(got) if got == samples => {}
            Some(got) => {
                missing.push(format!("{want}: {} samples at the edge, {} at the regional", samples.len(), got.len()))
            }
            None => missing.push(format!("{want}: absent at the regional")),
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} series differ, e.g. {:?}; regional has e.g. {:?}",
        missing.len(),
        edge_data.len(),
        &missing[..missing.len().min(3)],
        regional_data.keys().take(3).collect::<Vec<_>>()
    );
    assert_eq!(regional_data.len(), edge_data.len(), "the regional holds series the edge does not");
}

/// A global over the edges and the regional they forward to answers exactly as a global
/// over the edges alone: the regional's copy of a series has the same labels, so it is
/// merged, never counted twice (instant and range queries, pushed down or not, with and
/// without HA dedup).
#[test]
fn a_global_over_edges_and_their_regional_answers_as_over_the_edges_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim, sim_port) = start_sim(dir.path(), 2);
    let rs = RegionalSetup::new(dir.path(), "");
    let _rg = rs.start(dir.path(), "regional");
    let rg_grpc = rs.grpc;
    let mut edges = Vec::new();
    let mut edge_grpc = Vec::new();
    for replica in ["a", "b"] {
        let cfg = dir.path().join(format!("edge-{replica}.yml"));
        let mut text = format!(
            "global:\n  scrape_interval: 1s\n  external_labels:\n    cluster: c0\n    replica: {replica}\nscrape_configs:\n  - job_name: dcgm\n    static_configs:\n"
        );
        for i in 0..2 {
            text.push_str(&format!(
                "      - targets: ['127.0.0.1:{sim_port}']\n        labels: {{__metrics_path__: /node/{i}/metrics, node: '{i}'}}\n"
            ));
        }
        text.push_str(&format!("strata:\n  forward:\n    - address: 127.0.0.1:{rg_grpc}\n"));
        std::fs::write(&cfg, text).unwrap();
        let (http, grpc) = (free_port(), free_port());
        let data = dir.path().join(format!("edge-{replica}")).display().to_string();
        let cfg = cfg.display().to_string();
        let args = [
            "edge",
            "--config",
            &cfg,
            "--data",
            &data,
            "--http-listen",
            &format!("127.0.0.1:{http}"),
            "--grpc-listen",
            &format!("127.0.0.1:{grpc}"),
        ];
        let mut p = Proc::strata(&args, dir.path(), &format!("edge-{replica}"));
        wait_ready(&format!("http://127.0.0.1:{http}/-/ready"), &mut p, Duration::from_secs(30));
        edges.push(p);
        edge_grpc.push(format!("127.0.0.1:{grpc}"));
    }
    let stores = |list: &[String]| {
        let l: Vec<String> = list.iter().map(|s| format!("  - {s}\n")).collect();
        format!("stores:\n{}replica_labels: [replica]\n", l.concat())
    };
    let (_g1, edges_only) = crate::global::start_global(dir.path(), "global-edges", &stores(&edge_grpc), &[]);
    let mut both = edge_grpc.clone();
    both.push(format!("127.0.0.1:{rg_grpc}"));
    let (_g2, with_regional) = crate::global::start_global(dir.path(), "global-both", &stores(&both), &[]);
    // Some scraped history, forwarded.
    std::thread::sleep(Duration::from_secs(8));
    let t = (now_ms() - 3_000) / 1000;
    let data = api_data(&format!("{with_regional}/api/v1/stores"));
    assert_eq!(data.as_array().map(Vec::len), Some(3), "{data}");
    // The regional says up to when both edges have sent it everything (what an archiver
    // over it waits for): current edges, so within seconds of now, and which is last.
    // (The global reads Info every 10 s.)
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let regional = loop {
        let data = api_data(&format!("{with_regional}/api/v1/stores"));
        let regional = data.as_array().unwrap().iter().find(|s| s["kind"] == "regional").cloned();
        let regional = regional.expect("the regional listed");
        let current = regional["completeUntil"].as_i64().is_some_and(|t| t > now_ms() - 30_000);
        if current || std::time::Instant::now() > deadline {
            break regional;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let until = regional["completeUntil"].as_i64().unwrap_or_else(|| panic!("no completeUntil: {regional}"));
    assert!(until > now_ms() - 30_000 && until <= now_ms(), "{until}: {regional}");
    assert!(regional["behind"].as_str().is_some_and(|b| b.contains("replica")), "{regional}");
    let regional_series = series_count(&rs.base(), "DCGM_FI_DEV_GPU_TEMP");
    // Both replicas' 16 GPUs, less one a node when the simulator has taken a GPU off the bus
    // (15 minutes in some hours): more than one replica's 16 either way.
    assert!(regional_series >= 28, "the regional holds {regional_series} GPU_TEMP series (both replicas)");
    let queries = [
        "count(DCGM_FI_DEV_GPU_TEMP)",
        "sum by (gpu) (DCGM_FI_DEV_GPU_UTIL)",
        "sum(rate(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE[5s]))",
        "max_over_time(DCGM_FI_DEV_GPU_TEMP[5s])",
        "count_over_time(DCGM_FI_DEV_POWER_USAGE[6s])",
        "avg(DCGM_FI_DEV_MEM_COPY_UTIL)",
    ];
    let enc =
        |q: &str| q.replace(' ', "%20").replace('(', "%28").replace(')', "%29").replace('[', "%5B").replace(']', "%5D");
    for q in queries {
        for extra in ["", "&dedup=false"] {
            let instant = format!("/api/v1/query?query={}&time={t}{extra}", enc(q));
            let range = format!("/api/v1/query_range?query={}&start={}&end={t}&step=1{extra}", enc(q), t - 5);
            for path in [instant, range] {
                let a = api_data(&format!("{edges_only}{path}"));
                let b = api_data(&format!("{with_regional}{path}"));
                assert!(a["result"].as_array().is_some_and(|r| !r.is_empty()), "{path}: empty over the edges: {a}");
                let (a, b) = (sorted(&a), sorted(&b));
                if a != b {
                    let again = sorted(&api_data(&format!("{edges_only}{path}")));
                    let only_a: Vec<_> = a.iter().filter(|x| !b.contains(x)).collect();
                    let only_b: Vec<_> = b.iter().filter(|x| !a.contains(x)).collect();
                    panic!("{path}: the regional changed the answer (edges alone again equal: {}):\nedges alone: {only_a:?}\nwith regional: {only_b:?}", again == a);
                }
            }
        }
    }
}

/// An answer's series sorted by their labels.
fn sorted(data: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> =
        data["result"].as_array().map(|r| r.iter().map(|s| s.to_string()).collect()).unwrap_or_default();
    v.sort();
    v
}

/// The regional's data directory is lost while it is down (a replaced disk): it comes back
/// with a new storage identity, and the edge sends it everything it still holds.
#[test]
fn a_regional_that_lost_its_data_gets_everything_the_edge_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim, sim_port) = start_sim(dir.path(), 1);
    let rs = RegionalSetup::new(dir.path(), "");
    let (rdata, edata) = (rs.data.clone(), dir.path().join("edge"));
    let regional = |name: &str| rs.start(dir.path(), name);
    let rg_grpc = rs.grpc;
    let edge = |cfg: &Path, name: &str| start_edge(dir.path(), cfg, &edata, name);
    let mut rg = regional("regional-1");
    let (mut e, _) = edge(&edge_config(dir.path(), sim_port, rg_grpc, true), "edge-1");
    std::thread::sleep(Duration::from_secs(3));
    rg.terminate();
    std::fs::remove_dir_all(&rdata).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    e.terminate();
    let mut rg = regional("regional-2");
    let (mut e, base) = edge(&edge_config(dir.path(), sim_port, rg_grpc, false), "edge-2");
    // The edge learns of the new storage in its first session: only then is "nothing
    // pending" about the new regional.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let page = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
        if labelled_value(&page, "strata_forward_restarts_from_oldest_total") == Some(1.0) {
            break;
        }
        assert!(Instant::now() < deadline, "the edge never met the new regional:\n{page}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let page = wait_caught_up(&base);
    assert_eq!(labelled_value(&page, "strata_forward_restarts_from_oldest_total"), Some(1.0), "{page}");
    e.terminate();
    rg.terminate();
    let edge_data = stored(&edata, &[("cluster", "c0"), ("replica", "a")]);
    let regional_data = stored(&rdata, &[]);
    assert!(edge_data.len() > 50, "the edge holds {} series", edge_data.len());
    assert_eq!(regional_data, edge_data, "the new regional does not hold what the edge holds");
}

/// The regional takes Prometheus remote write too (the same receiver as the edge's): a
/// request is stored and served, and a request in remote write 2.0 is answered 415.
#[test]
fn the_regional_takes_remote_write() {
    use prost::Message;
    use strata_proto::prometheus::{Label, Sample as PbSample, TimeSeries, WriteRequest};
    let dir = tempfile::tempdir().unwrap();
    let rs = RegionalSetup::new(dir.path(), "");
    let _rg = rs.start(dir.path(), "regional");
    let base = rs.base();
    let now = now_ms();
    let req = WriteRequest {
        timeseries: vec![TimeSeries {
            labels: vec![
                Label { name: "__name__".into(), value: "written".into() },
                Label { name: "cluster".into(), value: "legacy".into() },
            ],
            samples: (0..5).map(|k| PbSample { value: k as f64, timestamp: now - 5000 + k * 1000 }).collect(),
            exemplars: vec![],
        }],
        metadata: vec![],
    };
    let body = snap::raw::Encoder::new().compress_vec(&req.encode_to_vec()).unwrap();
    let post = |content_type: &str| {
        client()
            .post(format!("{base}/api/v1/write"))
            .header("Content-Encoding", "snappy")
            .header("Content-Type", content_type)
            .body(body.clone())
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(post("application/x-protobuf"), 204);
    assert_eq!(post("application/x-protobuf;proto=io.prometheus.write.v2.Request"), 415);
    let data = api_data(&format!("{base}/api/v1/query?query=count_over_time(written%5B1m%5D)&time={}", now / 1000));
    assert_eq!(data["result"][0]["value"][1], "5", "{data}");
    let page = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    assert!(page.contains("strata_remote_write_samples_total 5"), "{page}");
    // Stopping over HTTP is off unless asked for (`--web.enable-lifecycle`), as in Prometheus.
    assert_eq!(client().post(format!("{base}/-/quit")).send().unwrap().status().as_u16(), 403);
}

/// The regional down under steady scraping and remote-write load while the edge cuts
/// blocks, checkpoints its head and deletes the WAL segments the regional still needed (a
/// 10 s block range): the backlog is sent from blocks, and after the regional's restart it
/// holds exactly what the edge holds, sample for sample.
#[test]
fn the_regional_down_across_edge_block_cuts_gets_every_sample() {
    use prost::Message;
    use strata_proto::prometheus::{Label, Sample as PbSample, TimeSeries, WriteRequest};
    let dir = tempfile::tempdir().unwrap();
    let (_sim, sim_port) = start_sim(dir.path(), 2);
    let rs = RegionalSetup::new(dir.path(), "strata:\n  retention: 30d\n");
    let (rdata, edata) = (rs.data.clone(), dir.path().join("edge"));
    let mut rg = rs.start(dir.path(), "regional-1");
    let mut cfg_text = std::fs::read_to_string(edge_config(dir.path(), sim_port, rs.grpc, true)).unwrap();
    cfg_text.push_str("  block_range: 10s\n");
    let cfg = dir.path().join("edge-blocks.yml");
    std::fs::write(&cfg, cfg_text).unwrap();
    let (mut e, base) = start_edge(dir.path(), &cfg, &edata, "edge-1");

    // Remote-write load into the edge from another thread for the whole outage.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, base) = (stop.clone(), base.clone());
        std::thread::spawn(move || {
            let mut k = 0i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = now_ms();
                let timeseries = (0..20)
                    .map(|i| TimeSeries {
                        labels: vec![
                            Label { name: "__name__".into(), value: "written_load".into() },
                            Label { name: "i".into(), value: i.to_string() },
                        ],
                        samples: vec![PbSample { value: (k * 20 + i) as f64, timestamp: t }],
                        exemplars: vec![],
                    })
                    .collect();
                let body = snap::raw::Encoder::new()
                    .compress_vec(&WriteRequest { timeseries, metadata: vec![] }.encode_to_vec());
                let status = client()
                    .post(format!("{base}/api/v1/write"))
                    .header("Content-Encoding", "snappy")
                    .header("Content-Type", "application/x-protobuf")
                    .body(body.unwrap())
                    .send()
                    .map(|r| r.status().as_u16());
                assert_eq!(status.ok(), Some(204), "remote write into the edge failed");
                k += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    std::thread::sleep(Duration::from_secs(3));
    let first_segment = || {
        std::fs::read_dir(edata.join("wal"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .min()
            .unwrap_or(0)
    };
    let oldest_before = first_segment();
    rg.kill9();
    // Down until the edge has cut blocks twice, the forwarder has moved the backlog to
    // storage, and the WAL segments it covered are deleted.
    let backlog_file = || {
        std::fs::read_dir(edata.join("forward"))
            .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().contains(".backlog.")))
            .unwrap_or(false)
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let page = client().get(format!("{base}/metrics")).send().unwrap().text().unwrap();
        let cut = metric_value(&page, "strata_blocks_written_total").unwrap_or(0.0) >= 2.0;
        let backlog = backlog_file();
        if cut && backlog && first_segment() > oldest_before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "blocks cut: {cut}, backlog: {backlog}, first WAL segment {} (was {oldest_before})",
            first_segment()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut rg = rs.start(dir.path(), "regional-2");
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    e.terminate();
    // The edge again without scraping, so what it holds stops growing while it catches up.
    let (mut e, base) = start_edge(dir.path(), &edge_config(dir.path(), sim_port, rs.grpc, false), &edata, "edge-2");
    wait_caught_up(&base);
    // The backlog from storage came as chunks, and the regional stored them as they came.
    let page = client().get(format!("{}/metrics", rs.base())).send().unwrap().text().unwrap();
    let adopted = metric_value(&page, "strata_head_chunks_adopted_total").unwrap_or(0.0);
    assert!(adopted > 0.0, "the regional took no chunk whole:\n{page}");
    e.terminate();
    rg.terminate();
    let edge_data = stored(&edata, &[("cluster", "c0"), ("replica", "a")]);
    let regional_data = stored(&rdata, &[]);
    assert!(edge_data.keys().any(|k| k.contains("written_load")), "the remote-write load is not at the edge");
    let differ: Vec<&String> =
        edge_data.iter().filter(|(k, v)| regional_data.get(*k) != Some(v)).map(|(k, _)| k).collect();
    assert!(
        differ.is_empty(),
        "{} of {} series differ, e.g. {:?}",
        differ.len(),
        edge_data.len(),
        &differ[..differ.len().min(3)]
    );
    assert_eq!(regional_data.len(), edge_data.len(), "the regional holds series the edge does not");
}
