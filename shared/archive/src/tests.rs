//! Round trips: what a store held, archived and read back, bit for bit.

use super::*;
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use strata_model::Matcher;
use strata_model::{Labels, Metadata, MetricType, Sample};
use strata_store::memory::MemoryStore;
use strata_store::{StepsRequest, Store, StoreError};

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
        assert_eq!((&*s.unit, &*s.help), (unit, help));
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

/// Counters with resets, gauges with decimals and NaNs, staleness markers and gaps, every
/// ~15 s with jitter over three hours, some samples exactly on window edges.
fn aggregate_fleet(seed: u64) -> MemoryStore {
    const T0: i64 = 1_764_547_200_000;
    let mut r = Rng(seed);
    let mut m = MemoryStore::default();
    for i in 0..12 {
        let name = ["gpu_power", "energy_total"][i % 2];
        let labels = Labels::from_pairs([("__name__", name), ("gpu", &i.to_string())]);
        let counter = name.ends_with("_total");
        let (mut t, mut c, mut samples) = (T0 + r.below(15_000) as i64, 0.0, Vec::new());
        while t < T0 + 3 * 3_600_000 {
            let v = match r.below(60) {
                0 if counter => {
                    c = r.below(3) as f64;
                    c
                }
                1 => strata_model::stale_nan(),
                2 if !counter => f64::NAN,
                _ if counter => {
                    c += r.below(500) as f64 / 4.0;
                    c
                }
                _ => 100.0 + r.below(3000) as f64 / 10.0,
            };
            samples.push(Sample::new(t, v));
            // Now and then on an edge, now and then a gap of minutes.
            t = match r.below(40) {
                0 => (t / 300_000 + 1) * 300_000,
                1 => t + 400_000,
                _ => t + 15_000 + r.below(40) as i64 - 20,
            };
        }
        m.add(labels, if counter { MetricType::Counter } else { MetricType::Gauge }, samples);
    }
    m
}

/// The archive's aggregate blocks answer every leaf the planner asks them for as the raw
/// samples do: each function, at 5 m and 1 h, ranges and steps over several windows and
/// across the blocks' edges.
#[tokio::test]
async fn aggregate_blocks_answer_as_the_raw_samples_do() {
    const T0: i64 = 1_764_547_200_000;
    const HOUR: i64 = 3_600_000;
    let dir = tempfile::tempdir().unwrap();
    let objects: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let source = aggregate_fleet(7);
    let opts = WriteOptions { row_group_rows: 200, aggregate_row_group_rows: 30, ..Default::default() };
    let writer = BlockWriter::new(objects.clone(), opts);
    let widths = [strata_downsample::FIVE_MINUTES, strata_downsample::ONE_HOUR];
    for h in -1..3 {
        let (start, end) = (T0 + h * HOUR, T0 + (h + 1) * HOUR);
        let encoded = writer.encode_range(&source, start, end, &widths, Vec::new(), None).await.unwrap();
        for a in encoded.aggregates {
            assert!(a.meta.raw_samples > 0 && a.meta.samples < a.meta.raw_samples, "{:?}", a.meta);
            writer.publish(a).await.unwrap();
        }
        if let Some(raw) = encoded.raw {
            writer.publish(raw).await.unwrap();
        }
    }
    // Twice over: windows kept by the cache (each query after the first of a block hits
    // it), and read each time.
    let uncached = ArchiveStoreOptions { cache_window_bytes: 0, ..Default::default() };
    for store in [
        ArchiveStore::new(objects.clone(), "test", ArchiveStoreOptions::default()),
        ArchiveStore::new(objects.clone(), "test", uncached),
    ] {
        compare_aggregates_with_raw(&store, &source).await;
    }
    let store = ArchiveStore::new(objects.clone(), "test", ArchiveStoreOptions::default());
    // A grid the windows do not fit is refused, so the planner reads raw data.
    let mut req = StepsRequest::new(vec![], (T0 + 2 * HOUR + 1, T0 + 3 * HOUR, 300_000), 300_000);
    req.matchers = vec![Matcher::new(strata_model::MatchOp::Equal, "__name__", "gpu_power").unwrap()];
    req.function = Some(("rate".into(), 300_000));
    req.resolution = 300_000;
    assert!(matches!(store.steps(&req).await, Err(StoreError::InvalidRequest(_))));
    // A block missing in the middle of the windows a grid reads: refused, not answered
    // without its windows.
    req.start = T0 + 2 * HOUR;
    req.function = Some(("count_over_time".into(), HOUR));
    assert!(matches!(store.steps(&req).await, Ok(Some(_))));
    let middle = crate::layout::block_dir(300_000, T0 + HOUR, T0 + 2 * HOUR).join(crate::layout::META);
    std::fs::remove_file(dir.path().join(middle.as_ref())).unwrap();
    let fresh = ArchiveStore::new(
        Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap()),
        "test",
        ArchiveStoreOptions::default(),
    );
    match fresh.steps(&req).await {
        Err(StoreError::InvalidRequest(e)) => assert!(e.contains("no 300000 ms aggregate block"), "{e}"),
        other => panic!("answered without the middle block: {other:?}"),
    }
}

async fn compare_aggregates_with_raw(store: &ArchiveStore, source: &MemoryStore) {
    const T0: i64 = 1_764_547_200_000;
    const HOUR: i64 = 3_600_000;
    let ranges = store.time_ranges().await.unwrap();
    assert!(ranges.contains_key(&300_000) && ranges.contains_key(&3_600_000), "{ranges:?}");
    let functions = [
        None,
        Some("rate"),
        Some("increase"),
        Some("delta"),
        Some("sum_over_time"),
        Some("avg_over_time"),
        Some("count_over_time"),
        Some("min_over_time"),
        Some("max_over_time"),
        Some("last_over_time"),
        Some("changes"),
        Some("resets"),
        Some("stddev_over_time"),
    ];
    let grids = [
        (300_000, 300_000, 300_000),
        (300_000, 900_000, 300_000),
        (300_000, 3_600_000, 900_000),
        (3_600_000, 3_600_000, 3_600_000),
        (3_600_000, 7_200_000, 3_600_000),
    ];
    let (mut compared, mut values) = (0, 0);
    for name in ["gpu_power", "energy_total"] {
        let m = vec![Matcher::new(strata_model::MatchOp::Equal, "__name__", name).unwrap()];
        for f in functions {
            for (width, range, step) in grids {
                let mut req = StepsRequest::new(m.clone(), (T0 + 2 * HOUR, T0 + 3 * HOUR, step), 300_000);
                req.function = f.map(|f| (f.to_string(), range));
                let raw = strata_promql::pushdown::evaluate(source, &req, &|l| l.clone(), Duration::from_secs(60))
                    .await
                    .unwrap();
                req.resolution = width;
                let agg = match store.steps(&req).await {
                    Ok(Some(a)) => a,
                    // A counter keeps no moments, a gauge no reset correction: those leaves
                    // read raw data, as the planner does on this error.
                    Err(StoreError::InvalidRequest(e))
                        if (name == "energy_total" && f == Some("stddev_over_time"))
                            || (name == "gpu_power" && matches!(f, Some("rate" | "increase"))) =>
                    {
                        assert!(e.contains("keep no"), "{e}");
                        continue;
                    }
                    other => panic!("{name} {f:?} {width} {range} {step}: {other:?}"),
                };
                let raw: BTreeMap<_, _> = raw.series.iter().map(|s| (&s.labels, s.values.to_options())).collect();
                let agg: BTreeMap<_, _> = agg.series.iter().map(|s| (&s.labels, s.values.to_options())).collect();
                let present = |m: &BTreeMap<&Labels, Vec<Option<f64>>>| {
                    m.iter()
                        .filter(|(_, v)| v.iter().any(Option::is_some))
                        .map(|(l, _)| (*l).clone())
                        .collect::<Vec<_>>()
                };
                assert_eq!(present(&raw), present(&agg), "{name} {f:?} {width} {range} {step}");
                for (labels, want) in &raw {
                    let Some(got) = agg.get(labels) else { continue };
                    for (i, (w, g)) in want.iter().zip(got).enumerate() {
                        let same = match (w, g) {
                            (None, None) => true,
                            (Some(a), Some(b)) => {
                                (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
                            }
                            _ => false,
                        };
                        assert!(same, "{name} {f:?} at {width} range {range} step {step}, {labels} step {i}: raw {w:?}, aggregates {g:?}");
                        values += usize::from(w.is_some());
                    }
                }
                compared += 1;
            }
        }
    }
    assert!(compared >= 110 && values > 1000, "{compared} leaves, {values} values");
}

/// What a store answers for `name` over `[start, end]`: each series' samples in range.
async fn answered(store: &ArchiveStore, name: &str, start: i64, end: i64) -> Vec<(Labels, Vec<(i64, u64)>)> {
    let m = vec![Matcher::new(strata_model::MatchOp::Equal, "__name__", name).unwrap()];
    let mut out = Vec::new();
    for s in store.select(&strata_store::SelectRequest::new(m, start, end)).await.unwrap() {
        out.push((s.labels.clone(), bits(&s.samples(start, end).unwrap())));
    }
    out
}

/// After a query over the whole block fills the chunk cache, narrower queries answer from
/// it exactly as a store without the cache does, a series whose gap holds the whole range
/// is no answer, and a block written again is never answered from the old one's chunks.
#[tokio::test]
async fn the_chunk_cache_answers_as_the_blocks_do() {
    const T0: i64 = 1_764_547_200_000;
    const MIN: i64 = 60_000;
    let dir = tempfile::tempdir().unwrap();
    let objects: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let source = |offset: f64| {
        let mut m = MemoryStore::default();
        for gpu in ["0", "1"] {
            let labels = Labels::from_pairs([("__name__", "gpu_temp"), ("gpu", gpu)]);
            // GPU 1 is silent from minute 20 to 40: its chunk spans the gap.
            let samples = (0..240)
                .map(|k| Sample::new(T0 + k * 15_000 + 7, offset + (k % 17) as f64))
                .filter(|s| gpu == "0" || s.t < T0 + 20 * MIN || s.t > T0 + 40 * MIN);
            m.add(labels, MetricType::Gauge, samples);
        }
        m
    };
    let writer = BlockWriter::new(objects.clone(), WriteOptions::default());
    writer.write_raw(&source(0.0), T0, T0 + 60 * MIN).await.unwrap().unwrap();
    let opts = ArchiveStoreOptions { refresh: Duration::ZERO, ..Default::default() };
    let cached = ArchiveStore::new(objects.clone(), "test", opts.clone());
    let plain = ArchiveStore::new(objects.clone(), "test", ArchiveStoreOptions { cache_chunk_bytes: 0, ..opts });
    let whole = answered(&cached, "gpu_temp", T0, T0 + 60 * MIN).await;
    assert_eq!(cached.cached_series(), 2, "the whole block's range kept");
    assert_eq!(whole, answered(&plain, "gpu_temp", T0, T0 + 60 * MIN).await);
    for (a, b) in [(25, 35), (10, 12), (19, 21), (0, 1), (39, 60), (59, 70)] {
        let (a, b) = (T0 + a * MIN, T0 + b * MIN);
        let got = answered(&cached, "gpu_temp", a, b).await;
        assert_eq!(got, answered(&plain, "gpu_temp", a, b).await, "[{a}, {b}]");
        assert!(got.iter().all(|(_, s)| !s.is_empty()), "a series with no sample in range answered: {got:?}");
    }
    assert_eq!(answered(&cached, "gpu_temp", T0 + 25 * MIN, T0 + 35 * MIN).await.len(), 1, "GPU 1 is silent there");
    // Written again with other values: read from the new files.
    writer.write_raw(&source(1000.0), T0, T0 + 60 * MIN).await.unwrap().unwrap();
    let again = answered(&cached, "gpu_temp", T0 + 10 * MIN, T0 + 12 * MIN).await;
    assert_eq!(again, answered(&plain, "gpu_temp", T0 + 10 * MIN, T0 + 12 * MIN).await);
    assert!(again[0].1.iter().all(|(_, v)| f64::from_bits(*v) >= 1000.0), "{again:?}");
}

/// A grid whose first steps reach back before the archive's oldest data: the windows
/// there are empty, and the aggregates answer as the raw samples do; once a block holds
/// older data, they refuse (and the planner reads raw data).
#[tokio::test]
async fn steps_reaching_back_before_the_archives_data_are_answered_from_aggregates() {
    const T0: i64 = 1_764_547_200_000;
    const HOUR: i64 = 3_600_000;
    let dir = tempfile::tempdir().unwrap();
    let objects: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let source = aggregate_fleet(11);
    let any = vec![Matcher::new(strata_model::MatchOp::Regex, "__name__", ".+").unwrap()];
    let oldest = source.select(&strata_store::SelectRequest::new(any, i64::MIN, i64::MAX)).await.unwrap();
    assert!(oldest.iter().all(|s| s.chunks.iter().all(|c| c.min_t > T0)), "no sample on the first window's end");
    let writer = BlockWriter::new(objects.clone(), WriteOptions::default());
    let widths = [strata_downsample::FIVE_MINUTES, strata_downsample::ONE_HOUR];
    for h in 0..3 {
        let encoded = writer.encode_range(&source, T0 + h * HOUR, T0 + (h + 1) * HOUR, &widths, Vec::new(), None);
        let encoded = encoded.await.unwrap();
        assert!(encoded.raw.as_ref().unwrap().meta.first_sample.is_some_and(|t| t > T0 + h * HOUR - 1));
        for b in encoded.aggregates.into_iter().chain(encoded.raw) {
            writer.publish(b).await.unwrap();
        }
    }
    let leaves = [
        ("gpu_power", "max_over_time", HOUR),
        ("energy_total", "increase", HOUR),
        ("gpu_power", "count_over_time", 1_800_000),
    ];
    let request = |(name, f, range): (&str, &str, i64)| {
        let m = vec![Matcher::new(strata_model::MatchOp::Equal, "__name__", name).unwrap()];
        let mut req = StepsRequest::new(m, (T0 + 300_000, T0 + 3 * HOUR, 300_000), 300_000);
        req.function = Some((f.to_string(), range));
        req
    };
    let store = ArchiveStore::new(objects.clone(), "test", ArchiveStoreOptions::default());
    for leaf in leaves {
        let mut req = request(leaf);
        let raw =
            strata_promql::pushdown::evaluate(&source, &req, &|l| l.clone(), Duration::from_secs(60)).await.unwrap();
        req.resolution = 300_000;
        let agg = store.steps(&req).await.unwrap().unwrap();
        let values = |s: &strata_store::Steps| -> BTreeMap<Labels, Vec<Option<u64>>> {
            s.series
                .iter()
                .map(|x| {
                    (
                        x.labels.clone(),
                        x.values.to_options().iter().map(|v| v.map(|v| (v * 1e6).round() as u64)).collect(),
                    )
                })
                .collect()
        };
        assert_eq!(values(&raw), values(&agg), "{leaf:?}");
        assert!(agg.series.iter().any(|s| s.values.to_options()[0].is_some()), "{leaf:?}: the first step has values");
    }
    // A raw block of the hour before: its samples fall in the windows the first steps read.
    let mut older = MemoryStore::default();
    older.add(
        Labels::from_pairs([("__name__", "gpu_power"), ("gpu", "0")]),
        MetricType::Gauge,
        vec![Sample::new(T0 - 600_000, 1.0)],
    );
    writer.write_raw(&older, T0 - HOUR, T0).await.unwrap().unwrap();
    let fresh = ArchiveStore::new(objects, "test", ArchiveStoreOptions::default());
    let mut req = request(leaves[0]);
    req.resolution = 300_000;
    match fresh.steps(&req).await {
        Err(StoreError::InvalidRequest(e)) => assert!(e.contains("aggregate block"), "{e}"),
        other => panic!("answered though a block holds older data: {other:?}"),
    }
}

/// A meta whose oldest sample is not the series table's is damage, named, not a plan.
#[tokio::test]
async fn a_meta_lying_about_its_first_sample_is_damage() {
    let (_dir, objects) = archived_fixture().await;
    let blocks = crate::list_blocks(objects.as_ref()).await.unwrap();
    let (dir, meta) = &blocks[0];
    let mut meta = meta.as_ref().unwrap().clone();
    let first = meta.first_sample.expect("a raw block records its first sample");
    assert!(BlockReader::open(objects.clone(), dir.clone()).await.is_ok());
    meta.first_sample = Some(first + 1);
    let path = dir.clone().join(crate::layout::META);
    objects.put(&path, serde_json::to_vec(&meta).unwrap().into()).await.unwrap();
    let err = BlockReader::open(objects.clone(), dir.clone()).await.err().expect("refused");
    assert!(err.to_string().contains("first sample") && err.to_string().contains("meta.json"), "{err}");
}
