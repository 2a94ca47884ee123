//! [`BlockReader`]: a block read back: its meta first (no meta, no block), its files
//! checked against the sizes the meta records, its series table, and the samples of the
//! series asked for, row groups skipped by their `series_id` and `timestamp` statistics.
//! A file that is not what the writer writes (a column missing, an id past the table, a
//! row with neither value column) is an error naming the object, never a wrong sample.

use crate::layout::{DATA, META, SERIES};
use crate::meta::{BlockMeta, Segment};
use crate::ranged::SparseFile;
use crate::values;
use crate::ArchiveError;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type, TimestampMillisecondType};
use arrow_array::{Array, RecordBatch};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::file::statistics::Statistics;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use strata_model::matcher::matches_all;
use strata_model::{Label, Labels, MatchOp, Matcher, MetricType, Sample};

/// A series of a block.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchivedSeries {
    pub labels: Labels,
    pub metric_type: MetricType,
    pub unit: Arc<str>,
    pub help: Arc<str>,
    /// Its first and last sample in the block, and how many it has there.
    pub min_time: i64,
    pub max_time: i64,
    pub samples: u64,
}

pub struct BlockReader {
    store: Arc<dyn ObjectStore>,
    pub dir: Path,
    pub meta: BlockMeta,
    series: Vec<ArchivedSeries>,
    /// Series ids by metric name: a query names its metric, and a block holds many.
    by_name: HashMap<String, Vec<usize>>,
    /// The data file's footer and page indexes, fetched at the first read.
    footer: tokio::sync::OnceCell<DataFooter>,
}

/// A data file's checked tail, parsed.
struct DataFooter {
    tail: (u64, bytes::Bytes),
    arrow: ArrowReaderMetadata,
    /// Each row group's checked byte range, as the meta records it.
    groups: Vec<Segment>,
    len: u64,
}

/// Every block folder of the archive (any folder holding a `meta.json`), each with its
/// meta or what is wrong with it.
pub async fn list_blocks(
    store: &dyn ObjectStore,
) -> Result<Vec<(Path, Result<BlockMeta, ArchiveError>)>, ArchiveError> {
    use futures_util::TryStreamExt;
    let metas: Vec<object_store::ObjectMeta> = store
        .list(None)
        .try_filter(|o| std::future::ready(o.location.filename() == Some(META)))
        .try_collect()
        .await
        .map_err(|e| ArchiveError::Object { object: "(listing)".into(), reason: e.to_string() })?;
    let mut out = Vec::new();
    for m in metas {
        let dir: Path = m.location.parts().take(m.location.parts().count().saturating_sub(1)).collect();
        let meta = read_meta(store, &dir).await;
        out.push((dir, meta));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

async fn get(store: &dyn ObjectStore, path: &Path) -> Result<bytes::Bytes, ArchiveError> {
    let got =
        store.get(path).await.map_err(|e| ArchiveError::Object { object: path.to_string(), reason: e.to_string() })?;
    got.bytes().await.map_err(|e| ArchiveError::Object { object: path.to_string(), reason: e.to_string() })
}

impl BlockReader {
    /// A file of the block, whole, checked against the size and checksum its meta records.
    async fn file(&self, name: &str) -> Result<bytes::Bytes, ArchiveError> {
        checked_file(self.store.as_ref(), &self.dir, &self.meta, name).await
    }
}

async fn checked_file(
    store: &dyn ObjectStore,
    dir: &Path,
    meta: &BlockMeta,
    name: &str,
) -> Result<bytes::Bytes, ArchiveError> {
    let path = dir.clone().join(name);
    let f = meta.files.iter().find(|f| f.path == name).ok_or_else(|| corrupt(&path, "not listed in the meta"))?;
    let bytes = get(store, &path).await?;
    if bytes.len() as u64 != f.bytes {
        return Err(corrupt(&path, format!("{} bytes, the meta says {}", bytes.len(), f.bytes)));
    }
    let crc = crc32fast::hash(&bytes);
    if crc != f.crc32 {
        return Err(corrupt(&path, format!("checksum {crc:08x}, the meta says {:08x}", f.crc32)));
    }
    Ok(bytes)
}

/// The largest `meta.json` read.
const MAX_META_BYTES: u64 = 1 << 20;

pub(crate) async fn read_meta(store: &dyn ObjectStore, dir: &Path) -> Result<BlockMeta, ArchiveError> {
    let path = dir.clone().join(META);
    let head = store
        .head(&path)
        .await
        .map_err(|e| ArchiveError::Object { object: path.to_string(), reason: e.to_string() })?;
    if head.size > MAX_META_BYTES {
        return Err(ArchiveError::Corrupt { object: path.to_string(), reason: format!("{} bytes", head.size) });
    }
    let meta = BlockMeta::parse(&get(store, &path).await?)
        .map_err(|reason| ArchiveError::Corrupt { object: path.to_string(), reason })?;
    // A block's name is its range: a meta that says otherwise was not written by Strata
    // (and trusting it would let a crafted meta stand for blocks it does not hold).
    // A folder that is not a block's (`[shards/<name>/]<resolution>/<day>/<start>-<end>`)
    // has no range to hold its meta to: refused.
    let Some((res, lo, hi)) = crate::layout::parse_block_dir(dir) else {
        return Err(ArchiveError::Corrupt { object: path.to_string(), reason: "not in a block's folder".into() });
    };
    {
        if (res.as_str(), lo, hi)
            != (crate::layout::resolution_dir(meta.resolution_ms).as_str(), meta.min_time, meta.max_time)
        {
            let reason = format!(
                "the meta says {} [{}, {}), the folder's name {res} [{lo}, {hi})",
                crate::layout::resolution_dir(meta.resolution_ms),
                meta.min_time,
                meta.max_time
            );
            return Err(ArchiveError::Corrupt { object: path.to_string(), reason });
        }
    }
    Ok(meta)
}

fn corrupt(path: &Path, reason: impl Into<String>) -> ArchiveError {
    ArchiveError::Corrupt { object: path.to_string(), reason: reason.into() }
}

/// One copy of each string of a series table.
#[derive(Default)]
struct Interner(std::collections::HashSet<Arc<str>>);

impl Interner {
    fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(held) = self.0.get(s) {
            return held.clone();
        }
        let held: Arc<str> = Arc::from(s);
        self.0.insert(held.clone());
        held
    }
}

/// The min and max of an INT64 column chunk's statistics, if it has them.
fn int_range(s: Option<&Statistics>) -> Option<(i64, i64)> {
    match s? {
        Statistics::Int64(v) => Some((*v.min_opt()?, *v.max_opt()?)),
        _ => None,
    }
}

impl BlockReader {
    /// Opens the block in `dir`: its meta, its files' sizes, its series table.
    pub async fn open(store: Arc<dyn ObjectStore>, dir: Path) -> Result<BlockReader, ArchiveError> {
        let meta = read_meta(store.as_ref(), &dir).await?;
        for f in &meta.files {
            let path = dir.clone().join(f.path.as_str());
            let head = store.head(&path).await.map_err(|e| corrupt(&path, format!("listed in the meta: {e}")))?;
            if head.size != f.bytes {
                return Err(corrupt(&path, format!("{} bytes, the meta says {}", head.size, f.bytes)));
            }
        }
        let path = dir.clone().join(SERIES);
        let bytes = checked_file(store.as_ref(), &dir, &meta, SERIES).await?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|b| b.build())
            .map_err(|e| corrupt(&path, e.to_string()))?;
        let mut series = Vec::new();
        let mut strings = Interner::default();
        for batch in reader {
            let batch = batch.map_err(|e| corrupt(&path, e.to_string()))?;
            Self::series_rows(&batch, &path, &mut series, &mut strings)?;
        }
        if series.len() as u64 != meta.series {
            return Err(corrupt(&path, format!("{} series, the meta says {}", series.len(), meta.series)));
        }
        // Planners trust the meta's oldest sample: it must be the series table's.
        if let Some(first) = meta.first_sample {
            let oldest = series.iter().filter(|s| s.samples > 0).map(|s| s.min_time).min();
            if oldest != Some(first) {
                let meta_path = dir.clone().join(META);
                return Err(corrupt(&meta_path, format!("first sample {first}, the series table's {oldest:?}")));
            }
        }
        let mut by_name: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, s) in series.iter().enumerate() {
            by_name.entry(s.labels.metric_name().unwrap_or_default().to_string()).or_default().push(i);
        }
        Ok(BlockReader { store, dir, meta, series, by_name, footer: tokio::sync::OnceCell::new() })
    }

    fn series_rows(
        batch: &RecordBatch,
        path: &Path,
        out: &mut Vec<ArchivedSeries>,
        strings: &mut Interner,
    ) -> Result<(), ArchiveError> {
        let column = |name: &str| batch.column_by_name(name).ok_or_else(|| corrupt(path, format!("no column {name}")));
        let ids = column("series_id")?
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| corrupt(path, "series_id is not INT64"))?;
        let types = column("metric_type")?
            .as_string_opt::<i32>()
            .ok_or_else(|| corrupt(path, "metric_type is not a string"))?;
        let units = column("unit")?.as_string_opt::<i32>().ok_or_else(|| corrupt(path, "unit is not a string"))?;
        let helps = column("help")?.as_string_opt::<i32>().ok_or_else(|| corrupt(path, "help is not a string"))?;
        let time = |name: &str| {
            column(name)?
                .as_primitive_opt::<TimestampMillisecondType>()
                .ok_or_else(|| corrupt(path, format!("{name} is not a timestamp")))
        };
        let (min_times, max_times) = (time("min_time")?, time("max_time")?);
        let counts =
            column("samples")?.as_primitive_opt::<Int64Type>().ok_or_else(|| corrupt(path, "samples is not INT64"))?;
        if min_times.null_count() + max_times.null_count() + counts.null_count() > 0 {
            return Err(corrupt(path, "nulls in min_time, max_time or samples"));
        }
        let schema = batch.schema();
        let mut labels = Vec::new();
        for (i, f) in schema.fields().iter().enumerate() {
            if crate::writer::FIXED_SERIES_COLUMNS.contains(&f.name().as_str()) {
                continue;
            }
            let name = f.name().strip_prefix("label_").unwrap_or(f.name());
            let values = batch
                .column(i)
                .as_string_opt::<i32>()
                .ok_or_else(|| corrupt(path, format!("label {name} is not a string")))?;
            labels.push((strings.get(name), values));
        }
        // In name order, once each (of two columns naming one label, the later wins, as
        // `Labels::from_pairs` has it), so that each row's labels come out sorted.
        labels.reverse();
        labels.sort_by(|a, b| a.0.cmp(&b.0));
        labels.dedup_by(|later, earlier| later.0 == earlier.0);
        for row in 0..batch.num_rows() {
            if ids.is_null(row) || ids.value(row) != out.len() as i64 {
                return Err(corrupt(path, format!("series ids out of order at row {}", out.len())));
            }
            // The strings of a block's series table repeat (a node's name in every series of
            // it, a metric's in every series of the metric): each is held once.
            let row_labels: Vec<Label> = labels
                .iter()
                .filter(|(_, v)| !v.is_null(row) && !v.value(row).is_empty())
                .map(|(n, v)| Label { name: n.clone(), value: strings.get(v.value(row)) })
                .collect();
            out.push(ArchivedSeries {
                labels: Labels::from_sorted_unchecked(row_labels),
                metric_type: MetricType::parse(types.value(row)).unwrap_or_default(),
                unit: strings.get(units.value(row)),
                help: strings.get(helps.value(row)),
                min_time: min_times.value(row),
                max_time: max_times.value(row),
                samples: u64::try_from(counts.value(row)).map_err(|_| corrupt(path, "a negative sample count"))?,
            });
        }
        Ok(())
    }

    /// Reads every file of the block against its meta's checksums (what `inspect` does).
    pub async fn verify(&self) -> Result<(), ArchiveError> {
        for f in &self.meta.files {
            self.file(&f.path).await?;
        }
        Ok(())
    }

    pub fn series(&self) -> &[ArchivedSeries] {
        &self.series
    }

    /// The ids of the series that match `matchers`, in order: those of the metric an
    /// equality matcher names, else every series, each checked against all of them.
    pub fn matching_ids<'a>(&'a self, matchers: &'a [Matcher]) -> impl Iterator<Item = usize> + 'a {
        let named = matchers.iter().find(|m| m.name == "__name__" && m.op == MatchOp::Equal);
        let ids: Box<dyn Iterator<Item = usize> + 'a> = match named {
            Some(m) => Box::new(self.by_name.get(&m.value).into_iter().flatten().copied()),
            None => Box::new(0..self.series.len()),
        };
        ids.filter(move |&i| matches_all(matchers, &self.series[i].labels))
    }

    /// A checked byte range of the data file.
    async fn data_range(&self, seg: &Segment, len: u64) -> Result<bytes::Bytes, ArchiveError> {
        let path = self.dir.clone().join(DATA);
        let range = seg.range(len).ok_or_else(|| corrupt(&path, format!("segment {seg:?} past the file's end")))?;
        let bytes = self
            .store
            .get_range(&path, range)
            .await
            .map_err(|e| ArchiveError::Object { object: path.to_string(), reason: e.to_string() })?;
        let crc = crc32fast::hash(&bytes);
        if bytes.len() as u64 != seg.bytes || crc != seg.crc32 {
            return Err(corrupt(
                &path,
                format!("bytes {}..+{}: checksum {crc:08x}, the meta says {:08x}", seg.offset, seg.bytes, seg.crc32),
            ));
        }
        Ok(bytes)
    }

    /// The data file's footer, fetched and checked once; its columns must be the
    /// archive's by name, type and nullability (two INT64 columns swapped would otherwise
    /// read as other values) and its rows as many as the meta's samples.
    async fn footer(&self) -> Result<&DataFooter, ArchiveError> {
        self.footer
            .get_or_try_init(|| async {
                let path = self.dir.clone().join(DATA);
                let file = self
                    .meta
                    .files
                    .iter()
                    .find(|f| f.path == DATA)
                    .ok_or_else(|| corrupt(&path, "not listed in the meta"))?;
                let tail = file.tail.ok_or_else(|| corrupt(&path, "the meta records no footer segment"))?;
                let bytes = self.data_range(&tail, file.bytes).await?;
                let sparse = SparseFile::new(file.bytes).with(tail.offset, bytes.clone());
                let arrow = ArrowReaderMetadata::load(&sparse, ArrowReaderOptions::new())
                    .map_err(|e| corrupt(&path, e.to_string()))?;
                let expected = match self.meta.resolution_ms {
                    0 => crate::writer::data_schema(),
                    _ => crate::aggregates::aggregate_schema(),
                };
                let found = arrow.schema().fields();
                // Aggregate blocks from before the extremes' times were kept lack only those.
                let older = self.meta.resolution_ms != 0
                    && found.len() == crate::aggregates::COLUMNS_BEFORE_EXTREME_TIMES
                    && found[..] == expected.fields()[..found.len()];
                if found != expected.fields() && !older {
                    return Err(corrupt(&path, format!("columns {:?}, not the archive's", arrow.schema().fields())));
                }
                let rows = arrow.metadata().file_metadata().num_rows();
                if u64::try_from(rows).ok() != Some(self.meta.samples) {
                    return Err(corrupt(&path, format!("{rows} rows, the meta says {} samples", self.meta.samples)));
                }
                if file.row_groups.len() != arrow.metadata().num_row_groups() {
                    return Err(corrupt(&path, "the meta's row groups are not the file's"));
                }
                Ok(DataFooter { tail: (tail.offset, bytes), arrow, groups: file.row_groups.clone(), len: file.bytes })
            })
            .await
    }

    /// The samples of the series `ids` (indexes into [`series`](Self::series)) in
    /// `[start, end]`, by id, in time order; more than `max_samples` is an error, met
    /// before more than a row group past it is decoded.
    pub async fn samples(
        &self,
        ids: &BTreeSet<i64>,
        start: i64,
        end: i64,
        max_samples: u64,
    ) -> Result<BTreeMap<i64, Vec<Sample>>, ArchiveError> {
        let mut out: BTreeMap<i64, Vec<Sample>> = BTreeMap::new();
        if ids.is_empty() {
            return Ok(out);
        }
        if self.meta.resolution_ms != 0 {
            return Err(ArchiveError::Invalid(format!("{}: an aggregate block has no raw samples", self.dir)));
        }
        let path = self.dir.clone().join(DATA);
        self.scan(ids, start, end, |batch| match batch {
            Some(batch) => self.data_rows(batch, &path, ids, start, end, &mut out),
            None if out.values().map(|v| v.len() as u64).sum::<u64>() > max_samples => {
                Err(ArchiveError::Limit { limit: max_samples })
            }
            None => Ok(()),
        })
        .await?;
        Ok(out)
    }

    /// The windows of the series `ids` ending in `(from, to]`, by id, in time order; more
    /// than `max_windows` is an error, met before more than a row group past it is decoded.
    pub(crate) async fn windows(
        &self,
        ids: &BTreeSet<i64>,
        (from, to): (i64, i64),
        max_windows: u64,
    ) -> Result<BTreeMap<i64, crate::aggregates::ReadWindows>, ArchiveError> {
        let mut out = BTreeMap::new();
        if ids.is_empty() {
            return Ok(out);
        }
        let path = self.dir.clone().join(DATA);
        let width = self.meta.resolution_ms;
        if width <= 0 {
            return Err(ArchiveError::Invalid(format!("{}: a raw block has no windows", self.dir)));
        }
        let bounds = crate::aggregates::Bounds {
            width,
            min_time: self.meta.min_time,
            max_time: self.meta.max_time,
            series: self.meta.series,
        };
        // Counted batch by batch: a row group may hold far more windows than the limit.
        let mut held = 0u64;
        self.scan(ids, from.saturating_add(1), to, |batch| {
            let Some(batch) = batch else { return Ok(()) };
            let added = crate::aggregates::read_rows(batch, &path, &bounds, ids, (from, to), &mut out)?;
            held = held.saturating_add(added);
            match held > max_windows {
                true => Err(ArchiveError::Limit { limit: max_windows }),
                false => Ok(()),
            }
        })
        .await?;
        Ok(out)
    }

    /// Hands `each` the batches of the row groups that may hold `ids` in `[start, end]`
    /// (by their `series_id` and `timestamp` statistics), each fetched by byte range and
    /// checked against its checksum; `None` after each row group (a limit's check).
    async fn scan(
        &self,
        ids: &BTreeSet<i64>,
        start: i64,
        end: i64,
        mut each: impl FnMut(Option<&RecordBatch>) -> Result<(), ArchiveError>,
    ) -> Result<(), ArchiveError> {
        let path = self.dir.clone().join(DATA);
        let footer = self.footer().await?;
        for (i, g) in footer.arrow.metadata().row_groups().iter().enumerate() {
            let (id, t) = (int_range(g.column(0).statistics()), int_range(g.column(1).statistics()));
            if id.is_some_and(|(a, b)| a > b) || t.is_some_and(|(a, b)| a > b) {
                return Err(corrupt(&path, format!("row group {i}: statistics with min past max")));
            }
            let id = id.is_none_or(|(a, b)| ids.range(a..=b).next().is_some());
            if !id || t.is_some_and(|(a, b)| a > end || b < start) {
                continue;
            }
            let seg = footer.groups.get(i).ok_or_else(|| corrupt(&path, format!("no segment for row group {i}")))?;
            // The row group's column chunks must lie inside its checked bytes.
            for c in g.columns() {
                // `byte_range` panics on negative offsets, which a crafted footer can hold.
                let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
                let (Ok(from), Ok(len)) = (u64::try_from(start), u64::try_from(c.compressed_size())) else {
                    return Err(corrupt(&path, format!("row group {i}: a column with a negative offset or size")));
                };
                if from < seg.offset || from.saturating_add(len) > seg.offset.saturating_add(seg.bytes) {
                    return Err(corrupt(&path, format!("row group {i}: a column outside its checked bytes")));
                }
            }
            let bytes = self.data_range(seg, footer.len).await?;
            let file = SparseFile::new(footer.len).with(footer.tail.0, footer.tail.1.clone()).with(seg.offset, bytes);
            let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, footer.arrow.clone())
                .with_row_groups(vec![i])
                .build()
                .map_err(|e| corrupt(&path, e.to_string()))?;
            for batch in reader {
                let batch = batch.map_err(|e| corrupt(&path, e.to_string()))?;
                each(Some(&batch))?;
            }
            each(None)?;
        }
        Ok(())
    }

    fn data_rows(
        &self,
        batch: &RecordBatch,
        path: &Path,
        ids: &BTreeSet<i64>,
        start: i64,
        end: i64,
        out: &mut BTreeMap<i64, Vec<Sample>>,
    ) -> Result<(), ArchiveError> {
        let typed = |i: usize| batch.columns().get(i).ok_or_else(|| corrupt(path, format!("no column {i}")));
        let bad = |what: &str| corrupt(path, format!("column {what} has the wrong type"));
        let id = typed(0)?.as_primitive_opt::<Int64Type>().ok_or_else(|| bad("series_id"))?;
        let ts = typed(1)?.as_primitive_opt::<TimestampMillisecondType>().ok_or_else(|| bad("timestamp"))?;
        let mantissa = typed(2)?.as_primitive_opt::<Int64Type>().ok_or_else(|| bad("value_mantissa"))?;
        let scale = typed(3)?.as_primitive_opt::<Int32Type>().ok_or_else(|| bad("value_scale"))?;
        let float = typed(4)?.as_primitive_opt::<Float64Type>().ok_or_else(|| bad("value_float"))?;
        if id.null_count() + ts.null_count() + mantissa.null_count() + scale.null_count() > 0 {
            return Err(corrupt(path, "nulls in series_id, timestamp, value_mantissa or value_scale"));
        }
        // Rows come sorted by series: each run of one series is looked up once.
        let (ids_col, n) = (id.values(), batch.num_rows());
        let mut row = 0;
        while row < n {
            let s = ids_col[row];
            let run_end = row + ids_col[row..].iter().position(|&x| x != s).unwrap_or(n - row);
            if s < 0 || s as u64 >= self.meta.series {
                return Err(corrupt(path, format!("series id {s} past the table's {}", self.meta.series)));
            }
            let wanted = ids.contains(&s);
            let mut list = wanted.then(|| out.entry(s).or_default());
            for r in row..run_end {
                let t = ts.value(r);
                if t < self.meta.min_time || t >= self.meta.max_time {
                    return Err(corrupt(path, format!("series {s}: a sample at {t}, outside the block")));
                }
                if !(0..=values::MAX_SCALE).contains(&scale.value(r)) {
                    return Err(corrupt(path, format!("series {s}: scale {}", scale.value(r))));
                }
                let Some(list) = list.as_mut() else { continue };
                if t < start || t > end {
                    continue;
                }
                let v = if float.is_null(r) {
                    values::decimal_value(mantissa.value(r), scale.value(r))
                } else {
                    float.value(r)
                };
                if list.last().is_some_and(|p| p.t >= t) {
                    return Err(corrupt(path, format!("series {s}: samples out of order at {t}")));
                }
                list.push(Sample::new(t, v));
            }
            row = run_end;
        }
        Ok(())
    }
}
