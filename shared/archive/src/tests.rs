//! Round trips: what a store held, archived and read back, bit for bit.

use super::*;
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::BTreeSet;
use std::sync::Arc;
use strata_model::{Labels, Metadata, MetricType, Sample};
use strata_store::memory::MemoryStore;

/// A small deterministic generator (xorshift), so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A value of one of the kinds a fleet reports, and the awkward ones.
fn value(r: &mut Rng, k: u64) -> f64 {
    match r.below(12) {
        0 => f64::NAN,
        1 => strata_model::stale_nan(),
        2 => -0.0,
        3 => 0.1 + 0.2,
        4 => 1e300 * (r.below(9) as f64 + 1.0),
        5 => 5e-324,
        6 => f64::INFINITY,
        7 => (r.below(100_000) as f64) / 1000.0,
        8 => f64::from_bits(r.next()),
        _ => (k * 3 + r.below(5)) as f64,
    }
}

type Expected = Vec<(Labels, MetricType, Vec<Sample>)>;

fn fleet(seed: u64, series: usize) -> (MemoryStore, Expected) {
    let mut r = Rng(seed);
    let mut m = MemoryStore::default();
    m.set_metadata("gpu_temp", Metadata { metric_type: MetricType::Gauge, help: "t".into(), unit: "celsius".into() });
    let mut expected = Vec::new();
    for i in 0..series {
        let name = ["gpu_temp", "xid_errors_total", "mixed"][i % 3];
        let mut pairs = vec![("__name__".to_string(), name.to_string()), ("gpu".into(), (i % 8).to_string())];
        pairs.push(("node".into(), format!("n{}", i / 8)));
        // Sorts before `__name__`: by labels alone, metrics would interleave.
        pairs.push(("Hostname".into(), format!("h{}", i / 3)));
        // Labels named like the series table's own columns, and many labels.
        if i % 5 == 0 {
            pairs.push(("unit".into(), "x".into()));
            pairs.push(("label_odd".into(), "y".into()));
            pairs.extend((0..30).map(|k| (format!("extra_{k}"), format!("v{k}"))));
        }
        let labels = Labels::from_pairs(pairs.iter().map(|(a, b)| (a.as_str(), b.as_str())));
        let metric_type = if name.ends_with("_total") { MetricType::Counter } else { MetricType::Gauge };
        let mut t = 1_000_000 + r.below(5000) as i64;
        let mut samples = Vec::new();
        let mut counter = 0.0;
        for k in 0..(50 + r.below(300)) {
            let v = match (name, r.below(40)) {
                // Counters rise and now and then reset.
                ("xid_errors_total", 0) => {
                    counter = 0.0;
                    counter
                }
                ("xid_errors_total", _) => {
                    counter += r.below(3) as f64;
                    counter
                }
                ("gpu_temp", _) => 30.0 + (r.below(600) as f64) / 10.0,
                _ => value(&mut r, k),
            };
            samples.push(Sample::new(t, v));
            t += 1000 + r.below(40) as i64;
        }
        m.add(labels.clone(), metric_type, samples.clone());
        expected.push((labels, metric_type, samples));
    }
    // As blocks hold them: metric by metric, then by labels.
    expected.sort_by(|a, b| (a.0.metric_name(), &a.0).cmp(&(b.0.metric_name(), &b.0)));
    (m, expected)
}

fn bits(s: &[Sample]) -> Vec<(i64, u64)> {
    s.iter().map(|x| (x.t, x.v.to_bits())).collect()
}

async fn round_trip(row_group_rows: usize, multipart_over: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let (source, expected) = fleet(row_group_rows as u64 + 7, 60);
    let writer = BlockWriter::new(store.clone(), WriteOptions { row_group_rows, multipart_over, ..Default::default() });
    let (start, end) = (0, 10_000_000);
    let meta = writer.write_raw(&source, start, end).await.unwrap().expect("a block");
    let total: usize = expected.iter().map(|e| e.2.len()).sum();
    assert_eq!((meta.series, meta.samples), (expected.len() as u64, total as u64));
    assert!(meta.double_values > 0 && meta.double_values < meta.samples, "{meta:?}");
    let blocks = list_blocks(store.as_ref()).await.unwrap();
    assert_eq!(blocks.len(), 1);
    let (path, listed) = &blocks[0];
    assert_eq!(listed.as_ref().unwrap(), &meta);
    let block = BlockReader::open(store.clone(), path.clone()).await.unwrap();
    assert_eq!(block.series().len(), expected.len());
    let ids: BTreeSet<i64> = (0..expected.len() as i64).collect();
    let got = block.samples(&ids, start, end, u64::MAX).await.unwrap();
    for (i, (labels, metric_type, samples)) in expected.iter().enumerate() {
        let s = &block.series()[i];
        assert_eq!((&s.labels, s.metric_type), (labels, *metric_type));
        let (unit, help) = if labels.metric_name() == Some("gpu_temp") { ("celsius", "t") } else { ("", "") };
        assert_eq!((s.unit.as_str(), s.help.as_str()), (unit, help));
        assert_eq!(
            (s.min_time, s.max_time, s.samples),
            (samples[0].t, samples[samples.len() - 1].t, samples.len() as u64)
        );
        assert_eq!(bits(&got[&(i as i64)]), bits(samples), "series {labels}");
    }
    // A few series and a time slice: only those, only then.
    let some: BTreeSet<i64> = [3, 17, 40].into();
    let (lo, hi) = (1_050_000, 1_120_000);
    let got = block.samples(&some, lo, hi, u64::MAX).await.unwrap();
    for &i in &some {
        let want: Vec<Sample> = expected[i as usize].2.iter().copied().filter(|s| s.t >= lo && s.t <= hi).collect();
        assert_eq!(bits(got.get(&i).map(Vec::as_slice).unwrap_or(&[])), bits(&want));
    }
    assert!(got.keys().all(|k| some.contains(k)));
}

#[tokio::test]
async fn random_series_archived_and_read_back_are_equal_bit_for_bit() {
    // One row group, and a row group every few series uploaded in parts of 4 KiB.
    round_trip(1 << 20, 16 << 20).await;
    round_trip(500, 4096).await;
}

#[tokio::test]
async fn a_block_without_its_meta_or_with_a_damaged_file_is_refused_naming_the_object() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let (source, _) = fleet(1, 10);
    let writer = BlockWriter::new(store.clone(), WriteOptions::default());
    writer.write_raw(&source, 0, 10_000_000).await.unwrap().unwrap();
    let block = crate::layout::block_dir(0, 0, 10_000_000);
    // Cut the data file short: the sizes disagree with the meta.
    let data = block.clone().join(crate::layout::DATA);
    let bytes = store.get(&data).await.unwrap().bytes().await.unwrap();
    store.put(&data, bytes.slice(..bytes.len() / 2).into()).await.unwrap();
    let err = BlockReader::open(store.clone(), block.clone()).await.err().unwrap().to_string();
    assert!(err.contains("data.parquet") && err.contains("the meta says"), "{err}");
    // The same size with garbage inside: opening passes the size check, reading fails on
    // the checksum.
    let mut garbage = bytes.to_vec();
    let mid = garbage.len() / 2;
    garbage[mid..mid + 64].iter_mut().for_each(|b| *b = !*b);
    store.put(&data, garbage.into()).await.unwrap();
    if let Ok(r) = BlockReader::open(store.clone(), block.clone()).await {
        let all: BTreeSet<i64> = (0..r.series().len() as i64).collect();
        let err = r.samples(&all, 0, 10_000_000, u64::MAX).await.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            err.contains("data.parquet") && err.contains("checksum"),
            "a damaged data file read without an error: {err:?}"
        );
    }
    // No meta: no block.
    store.delete(&block.clone().join(crate::layout::META)).await.unwrap();
    assert!(list_blocks(store.as_ref()).await.unwrap().is_empty());
    let err = BlockReader::open(store.clone(), block).await.err().unwrap().to_string();
    assert!(err.contains("meta.json"), "{err}");
    // An empty range writes nothing.
    assert!(writer.write_raw(&source, 20_000_000, 30_000_000).await.unwrap().is_none());
}

#[tokio::test]
async fn timestamps_and_mantissas_get_a_page_per_series() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let (source, expected) = fleet(3, 40);
    let writer = BlockWriter::new(store.clone(), WriteOptions::default());
    writer.write_raw(&source, 0, 10_000_000).await.unwrap().unwrap();
    let data = crate::layout::block_dir(0, 0, 10_000_000).join(crate::layout::DATA);
    let bytes = store.get(&data).await.unwrap().bytes().await.unwrap();
    let opts = parquet::file::serialized_reader::ReadOptionsBuilder::new().with_page_index().build();
    let file = SerializedFileReader::new_with_options(bytes, opts).unwrap();
    let index = file.metadata().page_index_for_row_group(0);
    // Columns 1 and 2 (timestamp, mantissa): a page starts exactly where each series does.
    let mut starts = Vec::new();
    let mut row = 0i64;
    for e in &expected {
        starts.push(row);
        row += e.2.len() as i64;
    }
    for column in [1, 2] {
        let offsets = index.offset_index(column).expect("an offset index");
        let pages: Vec<i64> = offsets.page_locations().iter().map(|p| p.first_row_index).collect();
        assert_eq!(pages, starts, "column {column}");
    }
}

/// The conformance suite's data set in two raw blocks, split inside its hour.
async fn archived_fixture() -> (tempfile::TempDir, Arc<dyn ObjectStore>) {
    let dir = tempfile::tempdir().unwrap();
    let objects: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let mut m = MemoryStore::default();
    for f in strata_store::conformance::fixture() {
        let name = f.labels.metric_name().unwrap_or_default().to_string();
        m.set_metadata(&name, Metadata { metric_type: f.metric_type, ..Default::default() });
        m.add(f.labels, f.metric_type, f.samples);
    }
    let writer = BlockWriter::new(objects.clone(), WriteOptions { row_group_rows: 300, ..Default::default() });
    let split = 1_700_001_800_000;
    writer.write_raw(&m, 1_600_000_000_000, split).await.unwrap().unwrap();
    writer.write_raw(&m, split, 1_800_000_000_000).await.unwrap().unwrap();
    (dir, objects)
}

#[tokio::test]
async fn the_archive_store_passes_the_store_conformance_suite() {
    let (_dir, objects) = archived_fixture().await;
    assert_eq!(list_blocks(objects.as_ref()).await.unwrap().len(), 2);
    let store = ArchiveStore::new(objects, "test", ArchiveStoreOptions::default());
    strata_store::conformance::run_all(&store).await;
    // Again, answered from the chunks the first run kept.
    strata_store::conformance::run_all(&store).await;
    // With no chunk cache, every query reads its own range.
    let (_dir, objects) = archived_fixture().await;
    let uncached =
        ArchiveStore::new(objects, "test", ArchiveStoreOptions { cache_chunk_bytes: 0, ..Default::default() });
    strata_store::conformance::run_all(&uncached).await;
    // A cache of one series' worth still answers (blocks are opened again as needed).
    let (_dir, objects) = archived_fixture().await;
    let small = ArchiveStore::new(objects, "test", ArchiveStoreOptions { cache_series: 1, ..Default::default() });
    strata_store::conformance::run_all(&small).await;
}

#[tokio::test]
async fn a_damaged_block_is_a_warning_naming_it_or_the_error_without_partial_response() {
    use strata_store::{QueryScope, SelectRequest, Store};
    let (dir, objects) = archived_fixture().await;
    let store = ArchiveStore::new(
        objects.clone(),
        "bucket-x",
        ArchiveStoreOptions { refresh: std::time::Duration::ZERO, ..Default::default() },
    );
    let all =
        || SelectRequest::new(vec![strata_model::Matcher::eq("__name__", "DCGM_FI_DEV_GPU_UTIL")], 0, i64::MAX / 2);
    let whole = store.select(&all()).await.unwrap();
    let count = |r: &[strata_store::SeriesChunks]| -> usize {
        r.iter().map(|s| s.samples(i64::MIN, i64::MAX).unwrap().len()).sum()
    };
    assert_eq!(count(&whole), 3 * 240);
    // Flip bytes in the middle of the second block's data file, same size.
    let blocks = list_blocks(objects.as_ref()).await.unwrap();
    let data = blocks[1].0.clone().join(crate::layout::DATA);
    let path = dir.path().join(data.as_ref());
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 3;
    bytes[mid..mid + 16].iter_mut().for_each(|b| *b = !*b);
    std::fs::write(&path, bytes).unwrap();
    let store = ArchiveStore::new(objects.clone(), "bucket-x", ArchiveStoreOptions::default());
    let scope = QueryScope::new(true, true);
    let partial = scope.clone().run(store.select(&all())).await.unwrap();
    let first_block: usize = count(&partial);
    assert!(first_block > 0 && first_block < 3 * 240, "{first_block}");
    let warnings = scope.warnings();
    assert!(
        warnings.iter().any(|w| w.contains("bucket-x") && w.contains(blocks[1].0.as_ref()) && w.contains("checksum")),
        "{warnings:?}"
    );
    let strict = QueryScope::new(false, true);
    let err = strict.run(store.select(&all())).await.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains(blocks[1].0.as_ref()), "{err}");
    // A meta that does not parse: its folder's range is left out, with a warning.
    let meta = blocks[0].0.clone().join(crate::layout::META);
    objects.put(&meta, bytes::Bytes::from_static(b"{not json").into()).await.unwrap();
    let store = ArchiveStore::new(objects, "bucket-x", ArchiveStoreOptions::default());
    let scope = QueryScope::new(true, true);
    let got = scope.clone().run(store.series(&[strata_model::Matcher::eq("gpu", "0")], 0, i64::MAX / 2)).await.unwrap();
    assert!(scope.warnings().iter().any(|w| w.contains(blocks[0].0.as_ref()) && w.contains("not a block meta")));
    assert!(!got.is_empty(), "the readable block still answers");
}

/// Every object whose file name is `name`.
pub(crate) async fn objects_named(objects: &dyn ObjectStore, name: &str) -> Vec<String> {
    use futures_util::TryStreamExt;
    let all: Vec<object_store::ObjectMeta> = objects.list(None).try_collect().await.unwrap();
    all.into_iter().filter(|o| o.location.filename() == Some(name)).map(|o| o.location.to_string()).collect()
}
