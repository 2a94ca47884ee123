//! The fleet-day set behind a global querier: one database served as an HA pair (two
//! StoreAPI servers on loopback with external labels `replica="a"` and `"b"`, the same data
//! as two edges that scraped the same fleet would hold), read through the fan-out and the
//! replica dedup, as `strata global` reads edges. Prints the bytes per sample a `Series`
//! call over the whole day puts on the wire.

use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_dedup::ReplicaDedup;
use strata_fanout::{Fanout, StoreTarget};
use strata_grpc::{pb, series_wire_bytes, RemoteStore, RemoteStoreOptions, StoreInfo, StoreService};
use strata_model::{Labels, MatchOp, Matcher};
use strata_store::{SelectLimits, SelectRequest, Store};

/// Starts the pair and returns the global's store (dedup over the fan-out).
pub async fn serve_pair(local: Arc<dyn Store>) -> anyhow::Result<Arc<dyn Store>> {
    let all = vec![Matcher::new(MatchOp::Regex, "__name__", ".+")?];
    let mut req = SelectRequest::new(all, i64::MIN, i64::MAX);
    req.limits = SelectLimits { max_series: usize::MAX, max_samples: u64::MAX };
    let day = local.select(&req).await?;
    let samples: u64 = day.iter().flat_map(|s| &s.chunks).map(|c| c.n as u64).sum();
    let mut targets = Vec::new();
    for replica in ["a", "b"] {
        let external = Labels::from_pairs([("replica", replica)]);
        let wire: usize = day.iter().map(|s| series_wire_bytes(s, &external)).sum();
        if replica == "a" {
            println!(
                "  Series over the whole day: {:.0} MB for {samples} samples: {:.3} bytes/sample on the wire (protobuf, before gzip)",
                wire as f64 / 1e6,
                wire as f64 / samples.max(1) as f64
            );
        }
        let info = Arc::new(|| StoreInfo {
            min_time: i64::MIN,
            max_time: i64::MAX,
            kind: pb::ComponentKind::Edge,
            label_sets: vec![],
        });
        let limits = SelectLimits { max_series: 10_000_000, max_samples: 2_000_000_000 };
        let service = StoreService::new(local.clone(), external.clone(), limits, info);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        tokio::spawn(strata_grpc::serve(listener, service, Duration::from_secs(600), std::future::pending()));
        let remote =
            RemoteStore::new(&addr, RemoteStoreOptions { timeout: Duration::from_secs(600), ..Default::default() })?;
        targets.push(StoreTarget {
            name: addr,
            store: Arc::new(remote),
            label_sets: vec![external],
            min_time: i64::MIN,
            max_time: i64::MAX,
        });
    }
    drop(day);
    let fanout: Arc<dyn Store> = Arc::new(Fanout::new(targets, Duration::from_secs(600)));
    let global: Arc<dyn Store> = Arc::new(ReplicaDedup::new(fanout, vec!["replica".into()]));
    // One whole-day select through the global, timed: the fan-out, two streams, the dedup.
    let started = Instant::now();
    let all = vec![Matcher::new(MatchOp::Regex, "__name__", ".+")?];
    let mut req = SelectRequest::new(all, i64::MIN, i64::MAX);
    req.limits = SelectLimits { max_series: usize::MAX, max_samples: u64::MAX };
    let n = global.select(&req).await?.len();
    println!(
        "  the whole day through the global (2 replicas, deduplicated): {n} series in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(global)
}
