//! [`BlockWriter`]: one block of raw samples from any [`Store`], as Parquet files in an
//! object store. Series are read in batches in label order and numbered as they come, so
//! the data file is sorted by series, then time, with row groups cut between series; the
//! series table and then `meta.json` follow it, the meta last of all.

use crate::layout::{block_dir, DATA, META, SERIES};
use crate::meta::{BlockMeta, FileMeta, FORMAT, VERSION};
use crate::values;
use crate::ArchiveError;
use arrow_array::builder::{Float64Builder, Int32Builder, Int64Builder, StringBuilder, TimestampMillisecondBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use strata_model::{Labels, Matcher, MetricType};
use strata_store::{SelectRequest, Store};

/// How blocks are written.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// A row group is closed at the first series boundary past this many rows.
    pub row_group_rows: usize,
    pub zstd_level: i32,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions { row_group_rows: 1 << 20, zstd_level: 3 }
    }
}

/// The data file's columns.
pub(crate) fn data_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("series_id", DataType::Int64, false),
        Field::new("timestamp", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false),
        Field::new("value_mantissa", DataType::Int64, true),
        Field::new("value_scale", DataType::Int32, false),
        Field::new("value_float", DataType::Float64, true),
    ]))
}

/// The series table's fixed columns; label columns follow, named as the labels (a label
/// named like a fixed column is stored as `label_<name>`).
pub const FIXED_SERIES_COLUMNS: [&str; 3] = ["series_id", "metric_type", "unit"];

pub(crate) fn label_column(name: &str) -> String {
    if FIXED_SERIES_COLUMNS.contains(&name) || name.starts_with("label_") {
        format!("label_{name}")
    } else {
        name.to_string()
    }
}

fn data_properties(opts: &WriteOptions) -> Result<WriterProperties, ArchiveError> {
    let zstd = ZstdLevel::try_new(opts.zstd_level).map_err(|e| ArchiveError::Invalid(format!("zstd level: {e}")))?;
    let delta = |b: parquet::file::properties::WriterPropertiesBuilder, c: &str| {
        b.set_column_encoding(ColumnPath::from(c), Encoding::DELTA_BINARY_PACKED)
            .set_column_dictionary_enabled(ColumnPath::from(c), false)
    };
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(zstd))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(None)
        .set_sorting_columns(Some(vec![
            parquet::file::metadata::SortingColumn { column_idx: 0, descending: false, nulls_first: false },
            parquet::file::metadata::SortingColumn { column_idx: 1, descending: false, nulls_first: false },
        ]));
    for c in ["series_id", "timestamp", "value_mantissa", "value_scale"] {
        b = delta(b, c);
    }
    b = b.set_column_dictionary_enabled(ColumnPath::from("value_float"), false);
    Ok(b.build())
}

/// Rows being gathered for the data file.
struct DataRows {
    ids: Int64Builder,
    ts: TimestampMillisecondBuilder,
    mantissa: Int64Builder,
    scale: Int32Builder,
    float: Float64Builder,
    rows: usize,
}

impl DataRows {
    fn new() -> Self {
        DataRows {
            ids: Int64Builder::new(),
            ts: TimestampMillisecondBuilder::new().with_timezone("UTC"),
            mantissa: Int64Builder::new(),
            scale: Int32Builder::new(),
            float: Float64Builder::new(),
            rows: 0,
        }
    }

    /// Appends a series' samples; returns how many went to the DOUBLE column.
    fn push(&mut self, id: i64, samples: &[strata_model::Sample]) -> u64 {
        let scale = values::series_scale(samples.iter().map(|s| s.v));
        let mut doubles = 0;
        for s in samples {
            self.ids.append_value(id);
            self.ts.append_value(s.t);
            self.scale.append_value(scale);
            match values::as_decimal(s.v, scale) {
                Some(m) => {
                    self.mantissa.append_value(m);
                    self.float.append_null();
                }
                None => {
                    self.mantissa.append_null();
                    self.float.append_value(s.v);
                    doubles += 1;
                }
            }
        }
        self.rows += samples.len();
        doubles
    }

    fn finish(&mut self) -> Result<RecordBatch, ArchiveError> {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.ids.finish()),
            Arc::new(self.ts.finish()),
            Arc::new(self.mantissa.finish()),
            Arc::new(self.scale.finish()),
            Arc::new(self.float.finish()),
        ];
        self.rows = 0;
        RecordBatch::try_new(data_schema(), columns).map_err(|e| ArchiveError::Invalid(e.to_string()))
    }
}

/// A series as the series table lists it.
struct SeriesRow {
    labels: Labels,
    metric_type: MetricType,
}

/// The unit of each metric family, from the store's metadata.
async fn units(source: &dyn Store) -> HashMap<String, String> {
    match source.metadata(None).await {
        Ok(m) => m.into_iter().filter(|(_, md)| !md.unit.is_empty()).map(|(f, md)| (f, md.unit)).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "no metadata from the source: the archive's units are empty");
            HashMap::new()
        }
    }
}

/// A series' family name for its unit: the metric name, or it without a histogram's or
/// summary's or counter's suffix.
fn unit_of<'a>(units: &'a HashMap<String, String>, name: &str) -> &'a str {
    let stems = ["_bucket", "_sum", "_count", "_total", "_created"];
    units
        .get(name)
        .or_else(|| stems.iter().find_map(|s| name.strip_suffix(s).and_then(|f| units.get(f))))
        .map(String::as_str)
        .unwrap_or("")
}

fn series_batch(rows: &[SeriesRow], units: &HashMap<String, String>) -> Result<RecordBatch, ArchiveError> {
    let names: BTreeSet<&str> = rows.iter().flat_map(|r| r.labels.iter().map(|l| l.name.as_ref())).collect();
    let mut fields = vec![
        Field::new("series_id", DataType::Int64, false),
        Field::new("metric_type", DataType::Utf8, false),
        Field::new("unit", DataType::Utf8, false),
    ];
    let mut ids = Int64Builder::new();
    let (mut types, mut unit) = (StringBuilder::new(), StringBuilder::new());
    let mut label_columns: BTreeMap<&str, StringBuilder> = names.iter().map(|n| (*n, StringBuilder::new())).collect();
    for (i, r) in rows.iter().enumerate() {
        ids.append_value(i as i64);
        types.append_value(r.metric_type.as_str());
        unit.append_value(unit_of(units, r.labels.metric_name().unwrap_or_default()));
        for (name, col) in label_columns.iter_mut() {
            match r.labels.get(name) {
                Some(v) => col.append_value(v),
                None => col.append_null(),
            }
        }
    }
    let mut columns: Vec<ArrayRef> = vec![Arc::new(ids.finish()), Arc::new(types.finish()), Arc::new(unit.finish())];
    for (name, mut col) in label_columns {
        fields.push(Field::new(label_column(name), DataType::Utf8, true));
        columns.push(Arc::new(col.finish()));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| ArchiveError::Invalid(e.to_string()))
}

/// Writes blocks into one object store.
pub struct BlockWriter {
    store: Arc<dyn ObjectStore>,
    opts: WriteOptions,
}

impl BlockWriter {
    pub fn new(store: Arc<dyn ObjectStore>, opts: WriteOptions) -> Self {
        BlockWriter { store, opts }
    }

    /// The raw samples `source` holds in `[start, end)` as one block; `None` when it
    /// holds none there (nothing is written).
    pub async fn write_raw(&self, source: &dyn Store, start: i64, end: i64) -> Result<Option<BlockMeta>, ArchiveError> {
        if start >= end {
            return Err(ArchiveError::Invalid(format!("empty range [{start}, {end})")));
        }
        let dir = block_dir(0, start, end);
        let all = Matcher::new(strata_model::MatchOp::Regex, "__name__", ".+")
            .map_err(|e| ArchiveError::Invalid(e.to_string()))?;
        // Bounded by the block: a block range is chosen to fit, and the series stream.
        let mut req = SelectRequest::new(vec![all], start, end - 1);
        req.limits = strata_store::SelectLimits { max_series: usize::MAX, max_samples: u64::MAX };
        let mut batches = source.select_batches(&req).await?;
        let mut writer = ArrowWriter::try_new(Vec::new(), data_schema(), Some(data_properties(&self.opts)?))
            .map_err(|e| ArchiveError::parquet(&dir.clone().join(DATA), e))?;
        let (mut rows, mut series) = (DataRows::new(), Vec::<SeriesRow>::new());
        let (mut samples, mut doubles) = (0u64, 0u64);
        while let Some(batch) = batches.next_batch().await? {
            for s in batch {
                let got = s
                    .samples(start, end - 1)
                    .map_err(|e| ArchiveError::Source { series: s.labels.to_string(), reason: e.to_string() })?;
                if got.is_empty() {
                    continue;
                }
                doubles += rows.push(series.len() as i64, &got);
                samples += got.len() as u64;
                series.push(SeriesRow { labels: s.labels, metric_type: s.metric_type });
                if rows.rows >= self.opts.row_group_rows {
                    let b = rows.finish()?;
                    writer.write(&b).map_err(|e| ArchiveError::parquet(&dir.clone().join(DATA), e))?;
                    writer.flush().map_err(|e| ArchiveError::parquet(&dir.clone().join(DATA), e))?;
                }
            }
        }
        if series.is_empty() {
            return Ok(None);
        }
        if rows.rows > 0 {
            let b = rows.finish()?;
            writer.write(&b).map_err(|e| ArchiveError::parquet(&dir.clone().join(DATA), e))?;
        }
        let data = writer.into_inner().map_err(|e| ArchiveError::parquet(&dir.clone().join(DATA), e))?;
        let units = units(source).await;
        let table = series_batch(&series, &units)?;
        let series_props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(self.opts.zstd_level).unwrap_or_default()))
            .build();
        let mut sw = ArrowWriter::try_new(Vec::new(), table.schema(), Some(series_props))
            .map_err(|e| ArchiveError::parquet(&dir.clone().join(SERIES), e))?;
        sw.write(&table).map_err(|e| ArchiveError::parquet(&dir.clone().join(SERIES), e))?;
        let series_bytes = sw.into_inner().map_err(|e| ArchiveError::parquet(&dir.clone().join(SERIES), e))?;
        let meta = BlockMeta {
            format: FORMAT.into(),
            version: VERSION,
            resolution_ms: 0,
            min_time: start,
            max_time: end,
            series: series.len() as u64,
            samples,
            double_values: doubles,
            files: vec![
                FileMeta { path: DATA.into(), bytes: data.len() as u64, crc32: crc32fast::hash(&data) },
                FileMeta {
                    path: SERIES.into(),
                    bytes: series_bytes.len() as u64,
                    crc32: crc32fast::hash(&series_bytes),
                },
            ],
        };
        // A block written again: its old meta goes first, so no reader pairs it with the
        // new files (and one that dies here leaves no block, not a damaged one).
        let meta_path = dir.clone().join(META);
        match self.store.delete(&meta_path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(ArchiveError::Object { object: meta_path.to_string(), reason: e.to_string() }),
        }
        self.put(&dir.clone().join(DATA), data).await?;
        self.put(&dir.clone().join(SERIES), series_bytes).await?;
        let json = serde_json::to_vec_pretty(&meta).map_err(|e| ArchiveError::Invalid(e.to_string()))?;
        // Last: until it is there, readers do not see the block.
        self.put(&dir.clone().join(META), json).await?;
        Ok(Some(meta))
    }

    async fn put(&self, path: &Path, bytes: Vec<u8>) -> Result<(), ArchiveError> {
        self.store
            .put(path, bytes::Bytes::from(bytes).into())
            .await
            .map_err(|e| ArchiveError::Object { object: path.to_string(), reason: e.to_string() })?;
        Ok(())
    }
}
