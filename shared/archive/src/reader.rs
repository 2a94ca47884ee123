//! [`BlockReader`]: a block read back: its meta first (no meta, no block), its files
//! checked against the sizes the meta records, its series table, and the samples of the
//! series asked for, row groups skipped by their `series_id` and `timestamp` statistics.
//! A file that is not what the writer writes (a column missing, an id past the table, a
//! row with neither value column) is an error naming the object, never a wrong sample.

use crate::layout::{DATA, META, SERIES};
use crate::meta::BlockMeta;
use crate::values;
use crate::ArchiveError;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type, TimestampMillisecondType};
use arrow_array::{Array, RecordBatch};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::statistics::Statistics;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use strata_model::{Labels, MetricType, Sample};

/// A series of a block.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchivedSeries {
    pub labels: Labels,
    pub metric_type: MetricType,
    pub unit: String,
}

pub struct BlockReader {
    store: Arc<dyn ObjectStore>,
    dir: Path,
    pub meta: BlockMeta,
    series: Vec<ArchivedSeries>,
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

async fn read_meta(store: &dyn ObjectStore, dir: &Path) -> Result<BlockMeta, ArchiveError> {
    let path = dir.clone().join(META);
    let head = store
        .head(&path)
        .await
        .map_err(|e| ArchiveError::Object { object: path.to_string(), reason: e.to_string() })?;
    if head.size > MAX_META_BYTES {
        return Err(ArchiveError::Corrupt { object: path.to_string(), reason: format!("{} bytes", head.size) });
    }
    BlockMeta::parse(&get(store, &path).await?)
        .map_err(|reason| ArchiveError::Corrupt { object: path.to_string(), reason })
}

fn corrupt(path: &Path, reason: impl Into<String>) -> ArchiveError {
    ArchiveError::Corrupt { object: path.to_string(), reason: reason.into() }
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
        for batch in reader {
            let batch = batch.map_err(|e| corrupt(&path, e.to_string()))?;
            Self::series_rows(&batch, &path, &mut series)?;
        }
        if series.len() as u64 != meta.series {
            return Err(corrupt(&path, format!("{} series, the meta says {}", series.len(), meta.series)));
        }
        Ok(BlockReader { store, dir, meta, series })
    }

    fn series_rows(batch: &RecordBatch, path: &Path, out: &mut Vec<ArchivedSeries>) -> Result<(), ArchiveError> {
        let column = |name: &str| batch.column_by_name(name).ok_or_else(|| corrupt(path, format!("no column {name}")));
        let ids = column("series_id")?
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| corrupt(path, "series_id is not INT64"))?;
        let types = column("metric_type")?
            .as_string_opt::<i32>()
            .ok_or_else(|| corrupt(path, "metric_type is not a string"))?;
        let units = column("unit")?.as_string_opt::<i32>().ok_or_else(|| corrupt(path, "unit is not a string"))?;
        let schema = batch.schema();
        let mut labels = Vec::new();
        for (i, f) in schema.fields().iter().enumerate() {
            if crate::writer::FIXED_SERIES_COLUMNS.contains(&f.name().as_str()) {
                continue;
            }
            let name = f.name().strip_prefix("label_").unwrap_or(f.name()).to_string();
            let values = batch
                .column(i)
                .as_string_opt::<i32>()
                .ok_or_else(|| corrupt(path, format!("label {name} is not a string")))?;
            labels.push((name, values));
        }
        for row in 0..batch.num_rows() {
            if ids.is_null(row) || ids.value(row) != out.len() as i64 {
                return Err(corrupt(path, format!("series ids out of order at row {}", out.len())));
            }
            let pairs = labels.iter().filter(|(_, v)| !v.is_null(row)).map(|(n, v)| (n.as_str(), v.value(row)));
            out.push(ArchivedSeries {
                labels: Labels::from_pairs(pairs),
                metric_type: MetricType::parse(types.value(row)).unwrap_or_default(),
                unit: units.value(row).to_string(),
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

    /// The samples of the series `ids` (indexes into [`series`](Self::series)) in
    /// `[start, end]`, by id, in time order.
    pub async fn samples(
        &self,
        ids: &BTreeSet<i64>,
        start: i64,
        end: i64,
    ) -> Result<BTreeMap<i64, Vec<Sample>>, ArchiveError> {
        let mut out: BTreeMap<i64, Vec<Sample>> = BTreeMap::new();
        if ids.is_empty() {
            return Ok(out);
        }
        let path = self.dir.clone().join(DATA);
        let bytes = self.file(DATA).await?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| corrupt(&path, e.to_string()))?;
        // Columns by name, type and nullability as the writer writes them, or no reading:
        // two INT64 columns swapped would otherwise read as other values.
        let expected = crate::writer::data_schema();
        if builder.schema().fields() != expected.fields() {
            return Err(corrupt(&path, format!("columns {:?}, not the archive's", builder.schema().fields())));
        }
        let rows = builder.metadata().file_metadata().num_rows();
        if u64::try_from(rows).ok() != Some(self.meta.samples) {
            return Err(corrupt(&path, format!("{rows} rows, the meta says {} samples", self.meta.samples)));
        }
        let mut groups = Vec::new();
        for (i, g) in builder.metadata().row_groups().iter().enumerate() {
            let (id, t) = (int_range(g.column(0).statistics()), int_range(g.column(1).statistics()));
            if id.is_some_and(|(a, b)| a > b) || t.is_some_and(|(a, b)| a > b) {
                return Err(corrupt(&path, format!("row group {i}: statistics with min past max")));
            }
            let id = id.is_none_or(|(a, b)| ids.range(a..=b).next().is_some());
            if id && t.is_none_or(|(a, b)| a <= end && b >= start) {
                groups.push(i);
            }
        }
        let reader = builder.with_row_groups(groups).build().map_err(|e| corrupt(&path, e.to_string()))?;
        for batch in reader {
            let batch = batch.map_err(|e| corrupt(&path, e.to_string()))?;
            self.data_rows(&batch, &path, ids, start, end, &mut out)?;
        }
        Ok(out)
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
        if id.null_count() + ts.null_count() + scale.null_count() > 0 {
            return Err(corrupt(path, "nulls in series_id, timestamp or value_scale"));
        }
        for row in 0..batch.num_rows() {
            let s = id.value(row);
            if s < 0 || s as u64 >= self.meta.series {
                return Err(corrupt(path, format!("series id {s} past the table's {}", self.meta.series)));
            }
            let t = ts.value(row);
            if t < self.meta.min_time || t >= self.meta.max_time {
                return Err(corrupt(path, format!("series {s}: a sample at {t}, outside the block")));
            }
            if !(0..=values::MAX_SCALE).contains(&scale.value(row)) {
                return Err(corrupt(path, format!("series {s}: scale {}", scale.value(row))));
            }
            if !ids.contains(&s) || t < start || t > end {
                continue;
            }
            let v = if !mantissa.is_null(row) {
                values::decimal_value(mantissa.value(row), scale.value(row))
            } else if !float.is_null(row) {
                float.value(row)
            } else {
                return Err(corrupt(path, format!("row of series {s} at {t} has no value")));
            };
            let list = out.entry(s).or_default();
            if list.last().is_some_and(|p| p.t >= t) {
                return Err(corrupt(path, format!("series {s}: samples out of order at {t}")));
            }
            list.push(Sample::new(t, v));
        }
        Ok(())
    }
}
