//! [`BlockWriter`]: one block of raw samples from any [`Store`], as Parquet files in an
//! object store. Series are read in batches in label order and numbered as they come, so
//! the data file is sorted by series, then time, with row groups cut between series; the
//! series table and then `meta.json` follow it, the meta last of all.

use crate::layout::{block_dir, DATA, META, SERIES};
use crate::meta::{BlockMeta, FileMeta, FORMAT, VERSION};
use crate::values;
use crate::ArchiveError;
use arrow_array::builder::{Float64Builder, Int64Builder, StringBuilder, TimestampMillisecondBuilder};
use arrow_array::{ArrayRef, Int32Array, Int64Array, RecordBatch};
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
    /// The same for aggregate blocks, whose rows are wide; their row groups are closed at
    /// each metric's end too (past a few thousand rows), so that a query of one metric
    /// reads and decodes that metric's windows only.
    pub aggregate_row_group_rows: usize,
    pub zstd_level: i32,
    /// Files larger than this are uploaded in parts (16 MiB; parts of 8 MiB, or of this
    /// size when smaller).
    pub multipart_over: usize,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            row_group_rows: 1 << 20,
            aggregate_row_group_rows: 1 << 17,
            zstd_level: 3,
            multipart_over: 16 << 20,
        }
    }
}

/// The most rows of one series in one data page: a longer series is cut into pages this
/// long (each restarts its deltas, which costs a few bytes).
const PAGE_ROWS: usize = 1 << 16;
/// Fewer rows than this are not a row group of their own at a metric's end: a metric of a
/// few series shares one with the next.
const MIN_METRIC_ROWS: usize = 4096;
/// The size of a part of a multipart upload (S3's smallest is 5 MiB, but for the last).
const MULTIPART_PART: usize = 8 << 20;

/// The data file's columns.
pub(crate) fn data_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("series_id", DataType::Int64, false),
        Field::new("timestamp", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false),
        Field::new("value_mantissa", DataType::Int64, false),
        Field::new("value_scale", DataType::Int32, false),
        Field::new("value_float", DataType::Float64, true),
    ]))
}

/// The series table's fixed columns; label columns follow, named as the labels (a label
/// named like a fixed column is stored as `label_<name>`).
pub const FIXED_SERIES_COLUMNS: [&str; 7] =
    ["series_id", "metric_type", "unit", "help", "min_time", "max_time", "samples"];

pub(crate) fn label_column(name: &str) -> String {
    if FIXED_SERIES_COLUMNS.contains(&name) || name.starts_with("label_") {
        format!("label_{name}")
    } else {
        name.to_string()
    }
}

/// The data file's encodings, chosen by measurement on the fleet-day set (docs/ARCHIVE.md).
/// Timestamps and mantissas are cut into a page per series: DELTA_BINARY_PACKED takes one
/// minimum delta per 128 values, so a block of values that spans two series (a jump back
/// by the block's length) would cost every value in it 24 bits instead of 7. Each series
/// is written on its own with a row limit of one on those two columns, and the writer
/// closes a page after every write that reaches its limit. Their page index then also
/// says which rows hold which series and times. The other columns keep large pages: a
/// nullable column with no nulls in a write is split into writes of its row limit.
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
        .set_write_batch_size(PAGE_ROWS)
        .set_sorting_columns(Some(vec![
            parquet::file::metadata::SortingColumn { column_idx: 0, descending: false, nulls_first: false },
            parquet::file::metadata::SortingColumn { column_idx: 1, descending: false, nulls_first: false },
        ]));
    for c in ["series_id", "timestamp", "value_mantissa", "value_scale"] {
        b = delta(b, c);
    }
    for c in ["timestamp", "value_mantissa"] {
        b = b.set_column_data_page_row_count_limit(ColumnPath::from(c), 1);
    }
    b = b.set_column_dictionary_enabled(ColumnPath::from("value_float"), false);
    Ok(b.build())
}

/// One series' samples as data rows, in pages of at most [`PAGE_ROWS`]; how many went to
/// the DOUBLE column. A value that is not a decimal has mantissa 0 and its bits in
/// `value_float`, which a reader takes first.
fn series_rows(id: i64, samples: &[strata_model::Sample]) -> Result<(Vec<RecordBatch>, u64), ArchiveError> {
    let scale = values::series_scale(samples.iter().map(|s| s.v));
    let mut doubles = 0;
    let mut out = Vec::new();
    for page in samples.chunks(PAGE_ROWS) {
        let mut ts = TimestampMillisecondBuilder::with_capacity(page.len()).with_timezone("UTC");
        let mut mantissa = Int64Builder::with_capacity(page.len());
        let mut float = Float64Builder::with_capacity(page.len());
        for s in page {
            ts.append_value(s.t);
            match values::as_decimal(s.v, scale) {
                Some(m) => {
                    mantissa.append_value(m);
                    float.append_null();
                }
                None => {
                    mantissa.append_value(0);
                    float.append_value(s.v);
                    doubles += 1;
                }
            }
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_value(id, page.len())),
            Arc::new(ts.finish()),
            Arc::new(mantissa.finish()),
            Arc::new(Int32Array::from_value(scale, page.len())),
            Arc::new(float.finish()),
        ];
        out.push(RecordBatch::try_new(data_schema(), columns).map_err(|e| ArchiveError::Invalid(e.to_string()))?);
    }
    Ok((out, doubles))
}

/// A series as the series table lists it.
struct SeriesRow {
    labels: Labels,
    metric_type: MetricType,
    /// The first and last sample's times and the count.
    min_time: i64,
    max_time: i64,
    samples: u64,
}

/// Each metric family's metadata (unit and help), from the store.
async fn source_families(source: &dyn Store) -> HashMap<String, strata_model::Metadata> {
    match source.metadata(None).await {
        Ok(m) => m.into_iter().collect(),
        Err(e) => {
            tracing::warn!(error = %e, "no metadata from the source: the archive's units and help are empty");
            HashMap::new()
        }
    }
}

/// A series' family metadata: by its metric name, or it without a histogram's, summary's
/// or counter's suffix.
fn family_of<'a>(
    families: &'a HashMap<String, strata_model::Metadata>,
    name: &str,
) -> Option<&'a strata_model::Metadata> {
    let stems = ["_bucket", "_sum", "_count", "_total", "_created"];
    families.get(name).or_else(|| stems.iter().find_map(|s| name.strip_suffix(s).and_then(|f| families.get(f))))
}

fn series_batch(
    rows: &[SeriesRow],
    families: &HashMap<String, strata_model::Metadata>,
) -> Result<RecordBatch, ArchiveError> {
    let names: BTreeSet<&str> = rows.iter().flat_map(|r| r.labels.iter().map(|l| l.name.as_ref())).collect();
    let mut fields = vec![
        Field::new("series_id", DataType::Int64, false),
        Field::new("metric_type", DataType::Utf8, false),
        Field::new("unit", DataType::Utf8, false),
        Field::new("help", DataType::Utf8, false),
        Field::new("min_time", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false),
        Field::new("max_time", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false),
        Field::new("samples", DataType::Int64, false),
    ];
    let mut ids = Int64Builder::new();
    let mut min_time = TimestampMillisecondBuilder::new().with_timezone("UTC");
    let mut max_time = TimestampMillisecondBuilder::new().with_timezone("UTC");
    let mut samples = Int64Builder::new();
    let (mut types, mut unit, mut help) = (StringBuilder::new(), StringBuilder::new(), StringBuilder::new());
    let mut label_columns: BTreeMap<&str, StringBuilder> = names.iter().map(|n| (*n, StringBuilder::new())).collect();
    for (i, r) in rows.iter().enumerate() {
        ids.append_value(i as i64);
        types.append_value(r.metric_type.as_str());
        let family = family_of(families, r.labels.metric_name().unwrap_or_default());
        unit.append_value(family.map_or("", |f| f.unit.as_str()));
        help.append_value(family.map_or("", |f| f.help.as_str()));
        min_time.append_value(r.min_time);
        max_time.append_value(r.max_time);
        samples.append_value(i64::try_from(r.samples).unwrap_or(i64::MAX));
        for (name, col) in label_columns.iter_mut() {
            match r.labels.get(name) {
                Some(v) => col.append_value(v),
                None => col.append_null(),
            }
        }
    }
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(ids.finish()),
        Arc::new(types.finish()),
        Arc::new(unit.finish()),
        Arc::new(help.finish()),
        Arc::new(min_time.finish()),
        Arc::new(max_time.finish()),
        Arc::new(samples.finish()),
    ];
    for (name, mut col) in label_columns {
        fields.push(Field::new(label_column(name), DataType::Utf8, true));
        columns.push(Arc::new(col.finish()));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| ArchiveError::Invalid(e.to_string()))
}

/// A block encoded and not yet uploaded.
pub struct EncodedBlock {
    pub dir: object_store::path::Path,
    pub meta: BlockMeta,
    data: bytes::Bytes,
    series: bytes::Bytes,
}

/// A range's blocks encoded and not yet uploaded: its raw block, and its aggregate
/// blocks (none where the range held nothing).
pub struct EncodedRange {
    pub raw: Option<EncodedBlock>,
    pub aggregates: Vec<EncodedBlock>,
}

/// One block's data file as series are added, and its series table.
pub(crate) struct FileBuilder {
    resolution: i64,
    start: i64,
    end: i64,
    dir: Path,
    writer: ArrowWriter<Vec<u8>>,
    series: Vec<SeriesRow>,
    rows: u64,
    doubles: u64,
    /// An aggregate block: the raw samples its windows summarise.
    pub(crate) raw_samples: u64,
}

impl FileBuilder {
    pub(crate) fn new(resolution: i64, start: i64, end: i64, opts: &WriteOptions) -> Result<Self, ArchiveError> {
        let dir = block_dir(resolution, start, end);
        let (schema, props) = match resolution {
            0 => (data_schema(), data_properties(opts)?),
            _ => (crate::aggregates::aggregate_schema(), aggregate_properties(opts)?),
        };
        let writer = ArrowWriter::try_new(Vec::new(), schema, Some(props))
            .map_err(|e| ArchiveError::parquet(&dir.clone().join(DATA), e))?;
        Ok(FileBuilder { resolution, start, end, dir, writer, series: Vec::new(), rows: 0, doubles: 0, raw_samples: 0 })
    }

    fn failed(&self, e: parquet::errors::ParquetError) -> ArchiveError {
        ArchiveError::parquet(&self.dir.clone().join(DATA), e)
    }

    /// Lists a series whose rows were written: `rows` of them from `(min_time, max_time)`
    /// out of `raw` samples; closes the row group at this series boundary once it is long
    /// enough.
    fn series_done(
        &mut self,
        (labels, metric_type): (&Labels, MetricType),
        (min_time, max_time): (i64, i64),
        (rows, raw): (u64, u64),
        opts: &WriteOptions,
    ) -> Result<(), ArchiveError> {
        self.rows += rows;
        self.raw_samples += raw;
        self.series.push(SeriesRow { labels: labels.clone(), metric_type, min_time, max_time, samples: rows });
        let limit = if self.resolution > 0 { opts.aggregate_row_group_rows } else { opts.row_group_rows };
        if self.writer.in_progress_rows() >= limit {
            self.writer.flush().map_err(|e| self.failed(e))?;
        }
        Ok(())
    }

    /// A metric's series are all added: an aggregate block's row group is closed here.
    pub(crate) fn metric_done(&mut self) -> Result<(), ArchiveError> {
        if self.resolution > 0 && self.writer.in_progress_rows() >= MIN_METRIC_ROWS {
            self.writer.flush().map_err(|e| self.failed(e))?;
        }
        Ok(())
    }

    fn add_samples(
        &mut self,
        labels: &Labels,
        metric_type: MetricType,
        got: &[strata_model::Sample],
        opts: &WriteOptions,
    ) -> Result<(), ArchiveError> {
        let (Some(first), Some(last)) = (got.first(), got.last()) else { return Ok(()) };
        let (pages, d) = series_rows(self.series.len() as i64, got)?;
        for page in &pages {
            self.writer.write(page).map_err(|e| self.failed(e))?;
        }
        self.doubles += d;
        let n = got.len() as u64;
        self.series_done((labels, metric_type), (first.t, last.t), (n, n), opts)
    }

    /// The windows of `got`, the series' samples in `(start, end]`.
    fn add_windows(
        &mut self,
        labels: &Labels,
        metric_type: MetricType,
        got: &[strata_model::Sample],
        opts: &WriteOptions,
    ) -> Result<(), ArchiveError> {
        let windows = strata_downsample::windows_of(got, self.resolution);
        let (Some(first), Some(last)) = (windows.first(), windows.last()) else { return Ok(()) };
        let kept = strata_downsample::Kept::of(metric_type, strata_downsample::Asked::default());
        let batch = crate::aggregates::window_rows(self.series.len() as i64, &windows, kept)?;
        self.writer.write(&batch).map_err(|e| self.failed(e))?;
        let span = (first.end, last.end);
        self.series_done((labels, metric_type), span, (windows.len() as u64, got.len() as u64), opts)
    }

    /// Windows read from aggregate blocks, written as they are (a merge of blocks); the
    /// raw samples they summarise are the caller's to set.
    pub(crate) fn add_read_windows(
        &mut self,
        labels: &Labels,
        metric_type: MetricType,
        windows: &[strata_downsample::Window],
        kept: strata_downsample::Kept,
        opts: &WriteOptions,
    ) -> Result<(), ArchiveError> {
        let (Some(first), Some(last)) = (windows.first(), windows.last()) else { return Ok(()) };
        let batch = crate::aggregates::window_rows(self.series.len() as i64, windows, kept)?;
        self.writer.write(&batch).map_err(|e| self.failed(e))?;
        self.series_done((labels, metric_type), (first.end, last.end), (windows.len() as u64, 0), opts)
    }

    pub(crate) fn finish(
        self,
        gaps: Vec<String>,
        families: &HashMap<String, strata_model::Metadata>,
        opts: &WriteOptions,
    ) -> Result<Option<EncodedBlock>, ArchiveError> {
        if self.series.is_empty() {
            return Ok(None);
        }
        let dir = self.dir;
        let failed = |e: parquet::errors::ParquetError| ArchiveError::parquet(&dir.clone().join(DATA), e);
        let data = bytes::Bytes::from(self.writer.into_inner().map_err(failed)?);
        let (tail, row_groups) = crate::ranged::segments_of(&data).map_err(failed)?;
        let table = series_batch(&self.series, families)?;
        let series_props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(opts.zstd_level).unwrap_or_default()))
            .build();
        let mut sw = ArrowWriter::try_new(Vec::new(), table.schema(), Some(series_props))
            .map_err(|e| ArchiveError::parquet(&dir.clone().join(SERIES), e))?;
        sw.write(&table).map_err(|e| ArchiveError::parquet(&dir.clone().join(SERIES), e))?;
        let series_bytes = sw.into_inner().map_err(|e| ArchiveError::parquet(&dir.clone().join(SERIES), e))?;
        let meta = BlockMeta {
            format: FORMAT.into(),
            version: VERSION,
            resolution_ms: self.resolution,
            min_time: self.start,
            max_time: self.end,
            series: self.series.len() as u64,
            samples: self.rows,
            double_values: self.doubles,
            raw_samples: if self.resolution > 0 { self.raw_samples } else { 0 },
            first_sample: match self.resolution {
                0 => self.series.iter().filter(|s| s.samples > 0).map(|s| s.min_time).min(),
                _ => None,
            },
            gaps,
            compacted_from: Vec::new(),
            files: vec![
                FileMeta {
                    path: DATA.into(),
                    bytes: data.len() as u64,
                    crc32: crc32fast::hash(&data),
                    tail: Some(tail),
                    row_groups,
                },
                FileMeta {
                    path: SERIES.into(),
                    bytes: series_bytes.len() as u64,
                    crc32: crc32fast::hash(&series_bytes),
                    tail: None,
                    row_groups: Vec::new(),
                },
            ],
        };
        Ok(Some(EncodedBlock { dir, meta, data, series: series_bytes.into() }))
    }
}

/// An aggregate data file's encodings: integers and times delta-coded, sorted by series
/// and window.
fn aggregate_properties(opts: &WriteOptions) -> Result<WriterProperties, ArchiveError> {
    let zstd = ZstdLevel::try_new(opts.zstd_level).map_err(|e| ArchiveError::Invalid(format!("zstd level: {e}")))?;
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(zstd))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(None)
        .set_sorting_columns(Some(vec![
            parquet::file::metadata::SortingColumn { column_idx: 0, descending: false, nulls_first: false },
            parquet::file::metadata::SortingColumn { column_idx: 1, descending: false, nulls_first: false },
        ]));
    for c in crate::aggregates::DELTA_COLUMNS {
        b = b
            .set_column_encoding(ColumnPath::from(c), Encoding::DELTA_BINARY_PACKED)
            .set_column_dictionary_enabled(ColumnPath::from(c), false);
    }
    Ok(b.build())
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

    pub(crate) fn options(&self) -> &WriteOptions {
        &self.opts
    }

    /// The raw samples `source` holds in `[start, end)` as one block; `None` when it
    /// holds none there (nothing is written).
    pub async fn write_raw(&self, source: &dyn Store, start: i64, end: i64) -> Result<Option<BlockMeta>, ArchiveError> {
        match self.encode_raw(source, start, end, Vec::new(), None).await? {
            Some(block) => self.publish(block).await.map(Some),
            None => Ok(None),
        }
    }

    /// The block [`Self::write_raw`] writes, in memory; `gaps` go into its meta (what the
    /// source could not give, for readers to warn about). Units and help come from
    /// `families` when given, else from the source's metadata.
    pub async fn encode_raw(
        &self,
        source: &dyn Store,
        start: i64,
        end: i64,
        gaps: Vec<String>,
        families: Option<HashMap<String, strata_model::Metadata>>,
    ) -> Result<Option<EncodedBlock>, ArchiveError> {
        Ok(self.encode_range(source, start, end, &[], gaps, families).await?.raw)
    }

    /// The raw block of `[start, end)` and, for each of `widths` that the range's edges
    /// are multiples of, the aggregate block of the windows ending in `(start, end]`
    /// (computed from the raw samples there, so the source is read up to `end` itself),
    /// from one read of the source.
    pub async fn encode_range(
        &self,
        source: &dyn Store,
        start: i64,
        end: i64,
        widths: &[i64],
        gaps: Vec<String>,
        families: Option<HashMap<String, strata_model::Metadata>>,
    ) -> Result<EncodedRange, ArchiveError> {
        if start >= end {
            return Err(ArchiveError::Invalid(format!("empty range [{start}, {end})")));
        }
        let widths: Vec<i64> =
            widths.iter().copied().filter(|&w| w > 0 && start.rem_euclid(w) == 0 && end.rem_euclid(w) == 0).collect();
        let mut raw = FileBuilder::new(0, start, end, &self.opts)?;
        let mut aggregates =
            widths.iter().map(|&w| FileBuilder::new(w, start, end, &self.opts)).collect::<Result<Vec<_>, _>>()?;
        let last = if widths.is_empty() { end - 1 } else { end };
        // Metric by metric, so that a metric's series are neighbours in the file and a query
        // for one metric reads its row groups only (stores sort series by all their labels,
        // which interleaves metrics: `Hostname` sorts before `__name__`). The names without
        // matchers: from the stores' indexes, not their series lists, which are limited.
        let names = source.label_values("__name__", &[], start, last).await?;
        for name in &names {
            let one = Matcher::new(strata_model::MatchOp::Equal, "__name__", name)
                .map_err(|e| ArchiveError::Invalid(e.to_string()))?;
            // Bounded by the block: a block range is chosen to fit, and the series stream.
            let mut req = SelectRequest::new(vec![one], start, last);
            req.limits = strata_store::SelectLimits { max_series: usize::MAX, max_samples: u64::MAX };
            let mut batches = source.select_batches(&req).await?;
            while let Some(batch) = batches.next_batch().await? {
                for s in batch {
                    let got = s
                        .samples(start, last)
                        .map_err(|e| ArchiveError::Source { series: s.labels.to_string(), reason: e.to_string() })?;
                    let before_end = got.partition_point(|x| x.t < end);
                    raw.add_samples(&s.labels, s.metric_type, &got[..before_end], &self.opts)?;
                    let after_start = got.partition_point(|x| x.t <= start);
                    for agg in &mut aggregates {
                        agg.add_windows(&s.labels, s.metric_type, &got[after_start..], &self.opts)?;
                    }
                }
            }
            for agg in &mut aggregates {
                agg.metric_done()?;
            }
        }
        let families = match families {
            Some(f) => f,
            None => source_families(source).await,
        };
        let raw = raw.finish(gaps.clone(), &families, &self.opts)?;
        let aggregates = aggregates
            .into_iter()
            .map(|a| a.finish(gaps.clone(), &families, &self.opts))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect();
        Ok(EncodedRange { raw, aggregates })
    }

    /// Uploads a block: data and series files, then its meta.
    pub async fn publish(&self, block: EncodedBlock) -> Result<BlockMeta, ArchiveError> {
        let EncodedBlock { dir, meta, data, series } = block;
        // A block written again: its old meta goes first, so no reader pairs it with the
        // new files (and one that dies here leaves no block, not a damaged one).
        let meta_path = dir.clone().join(META);
        match self.store.delete(&meta_path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(ArchiveError::Object { object: meta_path.to_string(), reason: e.to_string() }),
        }
        self.put(&dir.clone().join(DATA), data).await?;
        self.put(&dir.clone().join(SERIES), series).await?;
        let json = serde_json::to_vec_pretty(&meta).map_err(|e| ArchiveError::Invalid(e.to_string()))?.into();
        // Last: until it is there, readers do not see the block.
        self.put(&dir.clone().join(META), json).await?;
        Ok(meta)
    }

    /// One object; a large one in parts (an S3 PUT is limited to 5 GB, and a part that
    /// fails is retried alone).
    async fn put(&self, path: &Path, bytes: bytes::Bytes) -> Result<(), ArchiveError> {
        let failed = |e: object_store::Error| ArchiveError::Object { object: path.to_string(), reason: e.to_string() };
        if bytes.len() <= self.opts.multipart_over {
            self.store.put(path, bytes.into()).await.map_err(failed)?;
            return Ok(());
        }
        let upload = self.store.put_multipart(path).await.map_err(failed)?;
        let part = MULTIPART_PART.min(self.opts.multipart_over.max(1));
        let mut parts = object_store::WriteMultipart::new_with_chunk_size(upload, part);
        for piece in bytes.chunks(part) {
            if let Err(e) = parts.wait_for_capacity(4).await {
                // Aborted, so the parts uploaded so far are not kept (and billed) by the store.
                let _ = parts.abort().await;
                return Err(failed(e));
            }
            parts.write(piece);
        }
        parts.finish().await.map_err(failed)?;
        Ok(())
    }
}
