//! Aggregate blocks (`5m/`, `1h/`): one row per series and window, holding the window's
//! aggregates ([`Window`], the downsampling crate's) in plain columns that DuckDB or Spark
//! read as they are (`sum / count` is a window's average, `max` its maximum), and from
//! which the reader answers PromQL leaves exactly as from the raw samples.
//!
//! A window is `(end − width, end]`, stamped at its end (`timestamp`); an aggregate block
//! over `[start, end)` holds the windows ending in `(start, end]`, computed from the raw
//! samples there, so it is exactly the raw block's range shifted by the left-open edge.
//! Values are DOUBLE, bit for bit the window's; timestamps are absolute milliseconds
//! (DELTA_BINARY_PACKED makes their regular steps cheap). A quantity a series' metric type
//! does not need (a gauge's reset correction, a counter's moments, the least-squares sums
//! unless asked for) is null, and a reader learns what was kept from the nulls.

use crate::ArchiveError;
use arrow_array::builder::{BooleanBuilder, Float64Builder, Int64Builder, TimestampMillisecondBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, TimestampMillisecondType};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use object_store::path::Path;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use strata_downsample::{Kept, Window};
use strata_model::Sample;

/// The columns of an aggregate block's data file.
pub(crate) fn aggregate_schema() -> SchemaRef {
    let time = |name: &str, nullable: bool| {
        Field::new(name, DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), nullable)
    };
    let float = |name: &str, nullable: bool| Field::new(name, DataType::Float64, nullable);
    Arc::new(Schema::new(vec![
        Field::new("series_id", DataType::Int64, false),
        time("timestamp", false),
        Field::new("count", DataType::Int64, false),
        float("sum", false),
        float("min", false),
        float("max", false),
        Field::new("has_nan", DataType::Boolean, false),
        time("first_timestamp", false),
        float("first_value", false),
        time("last_timestamp", false),
        float("last_value", false),
        time("penult_timestamp", true),
        float("penult_value", true),
        time("stale_timestamp", true),
        Field::new("changes", DataType::Int64, false),
        Field::new("resets", DataType::Int64, false),
        float("correction", true),
        float("m2n", true),
        float("sx", true),
        float("sxx", true),
        float("sxy", true),
        time("min_timestamp", true),
        time("max_timestamp", true),
    ]))
}

/// How many of [`aggregate_schema`]'s columns blocks written before the extremes' times
/// were kept have: they still read, and those functions read finer data.
pub(crate) const COLUMNS_BEFORE_EXTREME_TIMES: usize = 21;

/// The integer and time columns, which take DELTA_BINARY_PACKED.
pub(crate) const DELTA_COLUMNS: [&str; 10] = [
    "series_id",
    "timestamp",
    "count",
    "first_timestamp",
    "last_timestamp",
    "penult_timestamp",
    "changes",
    "resets",
    "min_timestamp",
    "max_timestamp",
];

/// One series' windows as data rows; `kept` says which optional columns it fills.
pub(crate) fn window_rows(id: i64, windows: &[Window], kept: Kept) -> Result<RecordBatch, ArchiveError> {
    let n = windows.len();
    let time = || TimestampMillisecondBuilder::with_capacity(n).with_timezone("UTC");
    let (mut ts, mut first_t, mut last_t, mut penult_t, mut stale_t) = (time(), time(), time(), time(), time());
    let (mut min_t, mut max_t) = (time(), time());
    let (mut count, mut changes, mut resets) =
        (Int64Builder::with_capacity(n), Int64Builder::with_capacity(n), Int64Builder::with_capacity(n));
    let float = || Float64Builder::with_capacity(n);
    let (mut sum, mut min, mut max, mut first_v, mut last_v, mut penult_v) =
        (float(), float(), float(), float(), float(), float());
    let (mut correction, mut m2n, mut sx, mut sxx, mut sxy) = (float(), float(), float(), float(), float());
    let mut nan = BooleanBuilder::with_capacity(n);
    let opt = |b: &mut Float64Builder, keep: bool, v: f64| if keep { b.append_value(v) } else { b.append_null() };
    for w in windows {
        ts.append_value(w.end);
        count.append_value(i64::from(w.count));
        sum.append_value(w.sum);
        min.append_value(w.min);
        max.append_value(w.max);
        nan.append_value(w.nan);
        first_t.append_value(w.first.t);
        first_v.append_value(w.first.v);
        last_t.append_value(w.last.t);
        last_v.append_value(w.last.v);
        penult_t.append_option(w.penult.map(|s| s.t));
        penult_v.append_option(w.penult.map(|s| s.v));
        stale_t.append_option(w.stale);
        changes.append_value(i64::from(w.changes));
        resets.append_value(i64::from(w.resets));
        opt(&mut correction, kept.correction, w.correction);
        opt(&mut m2n, kept.moments, w.m2n);
        opt(&mut sx, kept.least_squares, w.sx);
        opt(&mut sxx, kept.least_squares, w.sxx);
        opt(&mut sxy, kept.least_squares, w.sxy);
        min_t.append_option(kept.extreme_times.then_some(w.min_t));
        max_t.append_option(kept.extreme_times.then_some(w.max_t));
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(arrow_array::Int64Array::from_value(id, n)),
        Arc::new(ts.finish()),
        Arc::new(count.finish()),
        Arc::new(sum.finish()),
        Arc::new(min.finish()),
        Arc::new(max.finish()),
        Arc::new(nan.finish()),
        Arc::new(first_t.finish()),
        Arc::new(first_v.finish()),
        Arc::new(last_t.finish()),
        Arc::new(last_v.finish()),
        Arc::new(penult_t.finish()),
        Arc::new(penult_v.finish()),
        Arc::new(stale_t.finish()),
        Arc::new(changes.finish()),
        Arc::new(resets.finish()),
        Arc::new(correction.finish()),
        Arc::new(m2n.finish()),
        Arc::new(sx.finish()),
        Arc::new(sxx.finish()),
        Arc::new(sxy.finish()),
        Arc::new(min_t.finish()),
        Arc::new(max_t.finish()),
    ];
    RecordBatch::try_new(aggregate_schema(), columns).map_err(|e| ArchiveError::Invalid(e.to_string()))
}

/// A series' windows read from a block, with what its rows kept.
#[derive(Debug, Clone)]
pub(crate) struct ReadWindows {
    pub kept: Kept,
    pub windows: Vec<Window>,
}

/// What a batch must satisfy to be read: the block's range and width, and how many series
/// its table lists.
pub(crate) struct Bounds {
    pub width: i64,
    pub min_time: i64,
    pub max_time: i64,
    pub series: u64,
}

fn corrupt(path: &Path, reason: impl Into<String>) -> ArchiveError {
    ArchiveError::Corrupt { object: path.to_string(), reason: reason.into() }
}

/// The windows of the series `ids` ending in `(from, to]` from one batch of an aggregate
/// data file, each row checked: a window's end on the block's grid and inside it, its
/// samples' times inside the window and consistent with its count, counts that fit. A
/// crafted file is an error naming it, never a wrong answer. Returns the windows added.
pub(crate) fn read_rows(
    batch: &RecordBatch,
    path: &Path,
    bounds: &Bounds,
    ids: &BTreeSet<i64>,
    (from, to): (i64, i64),
    out: &mut BTreeMap<i64, ReadWindows>,
) -> Result<u64, ArchiveError> {
    let col = |i: usize| batch.columns().get(i).ok_or_else(|| corrupt(path, format!("no column {i}")));
    let bad = |i: usize| corrupt(path, format!("column {i} has the wrong type"));
    let int = |i: usize| col(i)?.as_primitive_opt::<Int64Type>().ok_or_else(|| bad(i));
    let time = |i: usize| col(i)?.as_primitive_opt::<TimestampMillisecondType>().ok_or_else(|| bad(i));
    let float = |i: usize| col(i)?.as_primitive_opt::<Float64Type>().ok_or_else(|| bad(i));
    let (id, end, count) = (int(0)?, time(1)?, int(2)?);
    let (sum, min, max) = (float(3)?, float(4)?, float(5)?);
    let nan = col(6)?.as_boolean_opt().ok_or_else(|| bad(6))?;
    let (first_t, first_v, last_t, last_v) = (time(7)?, float(8)?, time(9)?, float(10)?);
    let (penult_t, penult_v, stale_t) = (time(11)?, float(12)?, time(13)?);
    let (changes, resets) = (int(14)?, int(15)?);
    let (correction, m2n, sx, sxx, sxy) = (float(16)?, float(17)?, float(18)?, float(19)?, float(20)?);
    // Absent from blocks written before they were kept.
    let (min_at, max_at) = match batch.num_columns() {
        COLUMNS_BEFORE_EXTREME_TIMES => (None, None),
        _ => (Some(time(21)?), Some(time(22)?)),
    };
    let required: [&dyn Array; 13] =
        [id, end, count, sum, min, max, nan, first_t, first_v, last_t, last_v, changes, resets];
    if required.iter().any(|a| a.null_count() > 0) {
        return Err(corrupt(path, "nulls in a column that has none"));
    }
    let width = bounds.width;
    let ids_col = id.values();
    let mut added = 0u64;
    for r in 0..batch.num_rows() {
        let s = ids_col[r];
        if s < 0 || s as u64 >= bounds.series {
            return Err(corrupt(path, format!("series id {s} past the table's {}", bounds.series)));
        }
        let e = end.value(r);
        if e <= bounds.min_time || e > bounds.max_time || e.rem_euclid(width) != 0 {
            return Err(corrupt(path, format!("series {s}: a window ending at {e}, not one of the block's")));
        }
        if !ids.contains(&s) || e <= from || e > to {
            continue;
        }
        let inside = |t: i64| t > e - width && t <= e;
        let n = u32::try_from(count.value(r)).map_err(|_| corrupt(path, format!("series {s}: count out of range")))?;
        let (ft, lt) = (first_t.value(r), last_t.value(r));
        let penult = (!penult_t.is_null(r) && !penult_v.is_null(r))
            .then(|| Sample { t: penult_t.value(r), v: penult_v.value(r) });
        let stale = (!stale_t.is_null(r)).then(|| stale_t.value(r));
        if !inside(ft) || !inside(lt) || ft > lt || penult.is_some_and(|p| !inside(p.t) || p.t > lt) {
            return Err(corrupt(path, format!("series {s}: a sample time outside its window ending at {e}")));
        }
        if stale.is_some_and(|t| !inside(t)) {
            return Err(corrupt(path, format!("series {s}: a staleness marker outside its window ending at {e}")));
        }
        // What a window of `n` samples holds (as `Window::of` writes it): none but a
        // marker; one, first and last; two or more, first before the one before last.
        let consistent = match n {
            0 => stale.is_some() && penult.is_none(),
            1 => ft == lt && penult.is_none(),
            _ => ft < lt && penult.is_some_and(|p| p.t >= ft && p.t < lt),
        };
        let pairs = i64::from(n.saturating_sub(1));
        let halves = [
            (penult_t.is_null(r), penult_v.is_null(r)),
            (sx.is_null(r), sxx.is_null(r)),
            (sx.is_null(r), sxy.is_null(r)),
        ];
        if !consistent
            || !(0..=pairs).contains(&changes.value(r))
            || !(0..=pairs).contains(&resets.value(r))
            || halves.iter().any(|(a, b)| a != b)
        {
            return Err(corrupt(path, format!("series {s}: a window ending at {e} that contradicts its count {n}")));
        }
        let small = |v: i64| u32::try_from(v).map_err(|_| corrupt(path, format!("series {s}: a count out of range")));
        let at = |c: Option<&arrow_array::TimestampMillisecondArray>| c.filter(|c| !c.is_null(r)).map(|c| c.value(r));
        let (min_t, max_t) = (at(min_at), at(max_at));
        // An extreme is one of the window's samples (none: the window holds only a marker).
        let extreme = |t: Option<i64>| t.is_none_or(|t| n == 0 || (t >= ft && t <= lt));
        if min_t.is_some() != max_t.is_some() || !extreme(min_t) || !extreme(max_t) {
            return Err(corrupt(path, format!("series {s}: an extreme's time outside its window ending at {e}")));
        }
        let kept = Kept {
            correction: !correction.is_null(r),
            moments: !m2n.is_null(r),
            least_squares: !sx.is_null(r),
            extreme_times: min_t.is_some(),
        };
        let w = Window {
            end: e,
            count: n,
            first: Sample { t: ft, v: first_v.value(r) },
            last: Sample { t: lt, v: last_v.value(r) },
            penult,
            stale,
            sum: sum.value(r),
            min: min.value(r),
            max: max.value(r),
            min_t: if n == 0 { e } else { min_t.unwrap_or(e) },
            max_t: if n == 0 { e } else { max_t.unwrap_or(e) },
            nan: nan.value(r),
            m2n: if kept.moments { m2n.value(r) } else { 0.0 },
            changes: small(changes.value(r))?,
            resets: small(resets.value(r))?,
            correction: if kept.correction { correction.value(r) } else { 0.0 },
            sx: if kept.least_squares { sx.value(r) } else { 0.0 },
            sxx: if kept.least_squares && !sxx.is_null(r) { sxx.value(r) } else { 0.0 },
            sxy: if kept.least_squares && !sxy.is_null(r) { sxy.value(r) } else { 0.0 },
        };
        let entry = out.entry(s).or_insert(ReadWindows { kept, windows: Vec::new() });
        entry.kept = entry.kept.and(kept);
        if entry.windows.last().is_some_and(|l| l.end >= e) {
            return Err(corrupt(path, format!("series {s}: windows out of order at {e}")));
        }
        entry.windows.push(w);
        added += 1;
    }
    Ok(added)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_downsample::windows_of;

    #[test]
    fn windows_round_trip_bit_for_bit_and_bad_rows_are_refused() {
        let raw: Vec<Sample> = (0..400)
            .map(|k| {
                Sample::new(k * 15_000 + (k % 7) * 3, if k % 50 == 49 { f64::NAN } else { (k % 13) as f64 * 0.25 })
            })
            .chain([Sample::new(400 * 15_000, strata_model::stale_nan())])
            .collect();
        let windows = windows_of(&raw, 300_000);
        let kept = Kept { correction: true, moments: false, least_squares: false, extreme_times: true };
        let batch = window_rows(3, &windows, kept).unwrap();
        let bounds = Bounds { width: 300_000, min_time: -1, max_time: 400 * 15_000, series: 4 };
        let mut out = BTreeMap::new();
        let path = Path::from("5m/x/data.parquet");
        read_rows(&batch, &path, &bounds, &BTreeSet::from([3]), (i64::MIN, i64::MAX), &mut out).unwrap();
        let got = &out[&3];
        assert_eq!(got.kept, kept);
        // A block written before the extremes' times were kept reads, without them.
        let older = batch.project(&(0..COLUMNS_BEFORE_EXTREME_TIMES).collect::<Vec<_>>()).unwrap();
        let mut before = BTreeMap::new();
        read_rows(&older, &path, &bounds, &BTreeSet::from([3]), (i64::MIN, i64::MAX), &mut before).unwrap();
        assert_eq!(before[&3].kept, Kept { extreme_times: false, ..kept });
        assert_eq!(before[&3].windows.len(), windows.len());
        assert_eq!(got.windows.len(), windows.len());
        for (a, b) in got.windows.iter().zip(&windows) {
            let mut b = *b;
            (b.m2n, b.sx, b.sxx, b.sxy) = (0.0, 0.0, 0.0, 0.0);
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "NaN-aware equality");
        }
        // A window off the block's grid, or a series past its table, is damage.
        let narrow = Bounds { width: 300_000, min_time: 0, max_time: 300_000, series: 4 };
        assert!(read_rows(&batch, &path, &narrow, &BTreeSet::from([3]), (i64::MIN, i64::MAX), &mut BTreeMap::new())
            .is_err());
        let few = Bounds { series: 3, ..bounds };
        assert!(
            read_rows(&batch, &path, &few, &BTreeSet::from([3]), (i64::MIN, i64::MAX), &mut BTreeMap::new()).is_err()
        );
    }

    /// Rows that contradict themselves: each would answer some function wrongly.
    #[test]
    fn a_window_that_contradicts_its_count_is_refused() {
        let raw: Vec<Sample> = (1..=20).map(|k| Sample::new(k * 15_000, (k % 4) as f64)).collect();
        let good = windows_of(&raw, 300_000)[0];
        assert_eq!(good.count, 20);
        let all = Kept::ALL;
        let bounds = Bounds { width: 300_000, min_time: 0, max_time: 300_000, series: 1 };
        let path = Path::from("5m/x/data.parquet");
        let read = |batch: &RecordBatch| {
            read_rows(batch, &path, &bounds, &BTreeSet::from([0]), (i64::MIN, i64::MAX), &mut BTreeMap::new())
        };
        assert_eq!(read(&window_rows(0, &[good], all).unwrap()).unwrap(), 1);
        let crafted = [
            Window { count: 0, stale: None, ..good },
            Window { penult: None, ..good },
            Window { count: 1, ..good },
            Window { penult: Some(Sample::new(good.first.t - 1, 1.0)), ..good },
            Window { changes: 20, ..good },
            Window { resets: 20, ..good },
        ];
        for w in crafted {
            let err = read(&window_rows(0, &[w], all).unwrap()).unwrap_err();
            assert!(err.to_string().contains("contradicts its count"), "{w:?}: {err}");
        }
        // An extreme taken before the window's first sample, or after its last.
        for w in [Window { min_t: good.first.t - 1, ..good }, Window { max_t: good.last.t + 1, ..good }] {
            let err = read(&window_rows(0, &[w], all).unwrap()).unwrap_err();
            assert!(err.to_string().contains("an extreme's time outside"), "{w:?}: {err}");
        }
        // Half of a pair of columns: the least-squares sums, or the sample before last.
        for column in [19, 20, 12] {
            let batch = window_rows(0, &[good], all).unwrap();
            let mut columns = batch.columns().to_vec();
            columns[column] = arrow_array::new_null_array(columns[column].data_type(), 1);
            let batch = RecordBatch::try_new(aggregate_schema(), columns).unwrap();
            assert!(read(&batch).is_err(), "column {column} null alone");
        }
    }
}
