//! Archivers that split the work by external labels (`--archive.shard`): each writes its
//! shard under `shards/<name>/`, a reader of the root serves them together, and a shard
//! that is behind is never answered short in silence.

use crate::archiver::{Archiver, ArchiverOptions, Coverage};
use crate::{check_sharding, shard_store, ArchiveStore, ArchiveStoreOptions, BlockWriter, ObjectStore, WriteOptions};
use object_store::ObjectStoreExt;
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
    let coverage = Coverage { min_time: Some(T0), complete_until: T0 + 5 * HOUR, missing: Vec::new(), behind: None };
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

    // The series and label endpoints say so too.
    let scope = QueryScope::new(true, true);
    let names = [equal("__name__", "gpu_temp")];
    let series = scope.clone().run(reader.series(&names, T0, T0 + 4 * HOUR - 1)).await.unwrap();
    assert_eq!(series.len(), 4);
    let values = scope.clone().run(reader.label_values("cluster", &names, T0, T0 + 4 * HOUR - 1)).await.unwrap();
    assert_eq!(values, ["c0", "c1"]);
    assert_eq!(scope.warnings().iter().filter(|w| w.contains("shard c1")).count(), 1, "{:?}", scope.warnings());

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
    let coverage = Coverage { min_time: Some(T0), complete_until: T0 + 5 * HOUR, missing: Vec::new(), behind: None };
    let opts = ArchiverOptions { block: Duration::from_secs(3600), ..Default::default() };
    Archiver::new(flat.clone(), writer, fleet.clone(), Arc::new(move || coverage.clone()), opts)
        .round(T0 + 2 * HOUR)
        .await
        .unwrap();
    let sharded = check_sharding(flat.as_ref(), Some(("c0", "{}"))).await.unwrap_err().to_string();
    assert!(sharded.contains("archived whole"), "{sharded}");
    check_sharding(flat.as_ref(), None).await.unwrap();
}

/// A shard whose series stopped writes no blocks for its newest ranges, but its progress
/// record goes on: it is not behind, and nothing is said. Without the record, its blocks
/// alone would say it is.
#[tokio::test]
async fn a_shard_with_nothing_new_is_not_behind() {
    let dir = tempfile::tempdir().unwrap();
    let root: Arc<dyn ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let mut m = MemoryStore::default();
    for (cluster, hours) in [("c0", 4), ("c1", 1)] {
        let labels = Labels::from_pairs([("__name__", "gpu_temp"), ("cluster", cluster), ("gpu", "0")]);
        let samples = (0..hours * HOUR / 15_000).map(|k| Sample::new(T0 + 7 + k * 15_000, 40.0 + (k % 17) as f64));
        m.add(labels, MetricType::Gauge, samples);
    }
    let fleet = Arc::new(m);
    let now = T0 + 4 * HOUR + 11 * 60_000;
    let c0 = shard_archiver(&root, &fleet, "c0").round(now).await.unwrap();
    let c1 = shard_archiver(&root, &fleet, "c1").round(now).await.unwrap();
    assert_eq!((c0.written.len(), c1.written.len()), (4, 1));
    let progress = object_store::path::Path::from(format!("shards/c1/{}", crate::archiver::PROGRESS));
    assert!(root.head(&progress).await.is_ok(), "c1 recorded its progress");

    let reader = ArchiveStore::new(root.clone(), "test", ArchiveStoreOptions::default());
    let scope = QueryScope::new(true, true);
    let got = scope.clone().run(samples_of(&reader, T0, T0 + 4 * HOUR - 1)).await;
    assert_eq!(got, samples_of(fleet.as_ref(), T0, T0 + 4 * HOUR - 1).await);
    assert!(scope.warnings().is_empty(), "{:?}", scope.warnings());

    // A record of a shard with no blocks (one taken out of service, its blocks gone),
    // and one from a clock far ahead: neither makes the others look behind.
    let record = |until: i64| serde_json::json!({"until": until, "owner": "x", "updated": 0}).to_string();
    let gone = object_store::path::Path::from(format!("shards/gone/{}", crate::archiver::PROGRESS));
    root.put(&gone, record(T0 + 2 * HOUR).into()).await.unwrap();
    let ahead = object_store::path::Path::from(format!("shards/c0/{}", crate::archiver::PROGRESS));
    let c0_record = root.get(&ahead).await.unwrap().bytes().await.unwrap();
    let tomorrow = strata_model::time::now_ms() + 24 * HOUR;
    root.put(&ahead, record(tomorrow).into()).await.unwrap();
    let reader = ArchiveStore::new(root.clone(), "test", ArchiveStoreOptions::default());
    let scope = QueryScope::new(true, true);
    scope.clone().run(samples_of(&reader, T0, T0 + 10 * HOUR)).await;
    assert!(scope.warnings().is_empty(), "{:?}", scope.warnings());
    root.put(&ahead, c0_record.into()).await.unwrap();
    // A quiet shard's record that has gone further shows the other one behind: c1's
    // archiver went on to six hours, c0's stopped at four.
    let c1_path = object_store::path::Path::from(format!("shards/c1/{}", crate::archiver::PROGRESS));
    let c1_record = root.get(&c1_path).await.unwrap().bytes().await.unwrap();
    root.put(&c1_path, record(T0 + 6 * HOUR).into()).await.unwrap();
    let reader = ArchiveStore::new(root.clone(), "test", ArchiveStoreOptions::default());
    let scope = QueryScope::new(true, true);
    scope.clone().run(samples_of(&reader, T0, T0 + 10 * HOUR)).await;
    assert!(scope.warnings().iter().any(|w| w.contains("shard c0 is archived only up to")), "{:?}", scope.warnings());
    root.put(&c1_path, c1_record.into()).await.unwrap();

    // A backfill of the first hour into the root (`strata archive import`, no progress
    // record of the root's) is not an archiver that stopped there.
    let mut old = MemoryStore::default();
    let labels = Labels::from_pairs([("__name__", "gpu_temp"), ("cluster", "c9"), ("gpu", "0")]);
    old.add(labels, MetricType::Gauge, (0..240).map(|k| Sample::new(T0 + 7 + k * 15_000, 1.0)));
    let backfill = BlockWriter::new(root.clone(), WriteOptions::default());
    assert!(backfill.write_raw(&old, T0, T0 + HOUR).await.unwrap().is_some());
    let reader = ArchiveStore::new(root.clone(), "test", ArchiveStoreOptions::default());
    let scope = QueryScope::new(true, true);
    let got = scope.clone().run(samples_of(&reader, T0, T0 + 4 * HOUR - 1)).await;
    assert_eq!(got.len(), 3);
    assert!(scope.warnings().is_empty(), "{:?}", scope.warnings());

    // The record gone (an archiver that never got past its last block): c1 is behind.
    root.delete(&progress).await.unwrap();
    let reader = ArchiveStore::new(root.clone(), "test", ArchiveStoreOptions::default());
    let scope = QueryScope::new(true, true);
    scope.clone().run(samples_of(&reader, T0, T0 + 4 * HOUR - 1)).await;
    assert!(scope.warnings().iter().any(|w| w.contains("shard c1")), "{:?}", scope.warnings());
}
