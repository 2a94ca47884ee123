//! Archivers that split the work by external labels (`--archive.shard`): each writes its
//! shard under `shards/<name>/`, a reader of the root serves them together, and a shard
//! that is behind is never answered short in silence.

use crate::archiver::{Archiver, ArchiverOptions, Coverage};
use crate::{check_sharding, shard_store, ArchiveStore, ArchiveStoreOptions, BlockWriter, ObjectStore, WriteOptions};
use std::sync::Arc;
use std::time::Duration;
use strata_model::{Labels, MatchOp, Matcher, Metadata, MetricType, Sample};
use strata_store::memory::MemoryStore;
use strata_store::{QueryScope, Scoped, SelectRequest, StepsRequest, Store, StoreError};

const T0: i64 = 1_764_547_200_000; // 2025-12-01T00:00:00Z
const HOUR: i64 = 3_600_000;

/// Two clusters of two GPUs' temperature every 15 s over four hours.
fn fleet() -> Arc<MemoryStore> {
    let mut m = MemoryStore::default();
    m.set_metadata("gpu_temp", Metadata { metric_type: MetricType::Gauge, ..Default::default() });
    for cluster in ["c0", "c1"] {
        for gpu in ["0", "1"] {
            let labels = Labels::from_pairs([("__name__", "gpu_temp"), ("cluster", cluster), ("gpu", gpu)]);
            let samples = (0..4 * HOUR / 15_000).map(|k| Sample::new(T0 + 7 + k * 15_000, 40.0 + (k % 17) as f64));
            m.add(labels, MetricType::Gauge, samples);
        }
    }
    Arc::new(m)
}

fn equal(name: &str, value: &str) -> Matcher {
    Matcher::new(MatchOp::Equal, name, value).unwrap()
}

/// The archiver of shard `name` (`cluster="<name>"`) over `fleet`.
fn shard_archiver(root: &Arc<dyn ObjectStore>, fleet: &Arc<MemoryStore>, name: &str) -> Archiver {
    let objects = shard_store(root.clone(), name).unwrap();
    let source = Arc::new(Scoped::new(fleet.clone(), vec![equal("cluster", name)]));
    let coverage = Coverage { min_time: Some(T0), complete_until: T0 + 5 * HOUR, missing: Vec::new() };
    let opts = ArchiverOptions {
        block: Duration::from_secs(3600),
        settle: Duration::from_secs(600),
        owner: format!("archiver-{name}"),
        ..Default::default()
    };
    let writer = BlockWriter::new(objects.clone(), WriteOptions::default());
    Archiver::new(objects, writer, source, Arc::new(move || coverage.clone()), opts)
}

async fn samples_of(store: &dyn Store, start: i64, end: i64) -> Vec<(Labels, Vec<(i64, u64)>)> {
    let req = SelectRequest::new(vec![equal("__name__", "gpu_temp")], start, end);
    let mut out = Vec::new();
    for s in store.select(&req).await.unwrap() {
        let samples = s.samples(start, end).unwrap().into_iter().map(|x| (x.t, x.v.to_bits())).collect();
        out.push((s.labels.clone(), samples));
    }
    out
}

#[tokio::test]
async fn shards_are_archived_apart_and_read_together_and_one_behind_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let root: Arc<dyn ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let fleet = fleet();
    // c0 archives all four hours; c1 only the first two (its archiver is behind).
    let c0 = shard_archiver(&root, &fleet, "c0").round(T0 + 4 * HOUR + 11 * 60_000).await.unwrap();
    let c1 = shard_archiver(&root, &fleet, "c1").round(T0 + 2 * HOUR + 11 * 60_000).await.unwrap();
    assert_eq!((c0.written.len(), c1.written.len()), (4, 2));
    // Each shard holds its own series alone, under its folder.
    for (m, shard) in c0.written.iter().map(|m| (m, "c0")).chain(c1.written.iter().map(|m| (m, "c1"))) {
        assert_eq!(m.series, 2, "{shard}: {m:?}");
    }
    let reader = ArchiveStore::new(root.clone(), "test", ArchiveStoreOptions::default());
    let blocks = crate::list_blocks(root.as_ref()).await.unwrap();
    assert!(blocks.iter().all(|(d, _)| crate::layout::shard_of(d).is_some()), "{blocks:?}");

    // Where both shards are archived: the root answers as the fleet itself, bit for bit.
    let (lo, hi) = (T0, T0 + 2 * HOUR - 1);
    let want = samples_of(fleet.as_ref(), lo, hi).await;
    assert_eq!(want.len(), 4);
    let scope = QueryScope::new(true, true);
    let got = scope.clone().run(samples_of(&reader, lo, hi)).await;
    assert_eq!(got, want);
    assert!(scope.warnings().is_empty(), "{:?}", scope.warnings());

    // Past c1's end: c0's series, and a warning naming c1; without partial response, an error.
    let scope = QueryScope::new(true, true);
    let got = scope.clone().run(samples_of(&reader, T0, T0 + 4 * HOUR - 1)).await;
    assert_eq!(got.len(), 4);
    let warnings = scope.warnings();
    assert!(warnings.iter().any(|w| w.contains("shard c1 is archived only up to")), "{warnings:?}");
    let strict = QueryScope::new(false, true);
    let req = SelectRequest::new(vec![equal("__name__", "gpu_temp")], T0, T0 + 4 * HOUR - 1);
    let err = strict.run(async { reader.select(&req).await }).await.unwrap_err();
    assert!(matches!(&err, StoreError::Unavailable(m) if m.contains("shard c1")), "{err:?}");

    // Aggregates: where both shards cover the windows they answer for all four series;
    // past c1's end they refuse (raw data then answers, with its warning).
    let steps = |end: i64| {
        let mut req = StepsRequest::new(vec![equal("__name__", "gpu_temp")], (T0 + HOUR, end, 300_000), 300_000);
        req.function = Some(("avg_over_time".into(), 300_000));
        req.resolution = 300_000;
        req
    };
    let answered = reader.steps(&steps(T0 + 2 * HOUR)).await.unwrap().unwrap();
    assert_eq!(answered.series.len(), 4);
    let err = reader.steps(&steps(T0 + 3 * HOUR)).await.unwrap_err();
    assert!(matches!(&err, StoreError::InvalidRequest(m) if m.contains("of shard c1")), "{err:?}");

    // A bucket archived in shards is not archived whole too, nor the reverse.
    check_sharding(root.as_ref(), Some(("c0", "{cluster=\"c0\"}"))).await.unwrap();
    check_sharding(root.as_ref(), Some(("c0", "{cluster=\"c0\"}"))).await.unwrap();
    let typo = check_sharding(root.as_ref(), Some(("c0", "{cluster=\"c1\"}"))).await.unwrap_err().to_string();
    assert!(typo.contains("another selector"), "{typo}");
    let whole = check_sharding(root.as_ref(), None).await.unwrap_err().to_string();
    assert!(whole.contains("archived in shards"), "{whole}");
    check_sharding(root.as_ref(), Some(("c2", "{cluster=\"c2\"}"))).await.unwrap();
    // A whole archiver that started first (no progress record yet) keeps shards out too.
    let early = tempfile::tempdir().unwrap();
    let fresh: Arc<dyn ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(early.path()).unwrap());
    check_sharding(fresh.as_ref(), None).await.unwrap();
    let late = check_sharding(fresh.as_ref(), Some(("c0", "{}"))).await.unwrap_err().to_string();
    assert!(late.contains("archived whole"), "{late}");
    let other = tempfile::tempdir().unwrap();
    let flat: Arc<dyn ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(other.path()).unwrap());
    let writer = BlockWriter::new(flat.clone(), WriteOptions::default());
    let coverage = Coverage { min_time: Some(T0), complete_until: T0 + 5 * HOUR, missing: Vec::new() };
    let opts = ArchiverOptions { block: Duration::from_secs(3600), ..Default::default() };
    Archiver::new(flat.clone(), writer, fleet.clone(), Arc::new(move || coverage.clone()), opts)
        .round(T0 + 2 * HOUR)
        .await
        .unwrap();
    let sharded = check_sharding(flat.as_ref(), Some(("c0", "{}"))).await.unwrap_err().to_string();
    assert!(sharded.contains("archived whole"), "{sharded}");
    check_sharding(flat.as_ref(), None).await.unwrap();
}
