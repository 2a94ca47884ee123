//! Prometheus remote write 1.0 receiver (`POST /api/v1/write`).
//!
//! A request is a snappy-compressed (raw block format) `WriteRequest`. Answers:
//! * 204: every sample stored (exact duplicates of stored samples count as stored);
//! * 400: the body is not snappy or protobuf (nothing stored), or some samples were
//!   refused (out of order, out of bounds, native histograms): the valid samples of the
//!   request **are stored**, the refused ones are named in the message by reason with the
//!   first example. Senders do not retry a 400, and a retry would be harmless since exact
//!   duplicates are ignored. A series with invalid labels (a value that is not UTF-8
//!   included) is skipped, counted and logged, and alone does not make a 400, as in
//!   Prometheus;
//! * 415: not remote write 1.0 (`Content-Type` with `proto=io.prometheus.write.v2.Request`,
//!   another media type, an encoding other than snappy), so the sender can fall back;
//! * 413: the body, its decompressed size, its sample count or the memory its decoding
//!   would take is over the limit (measured on the wire before decoding: see [`shape`]);
//! * 500: the WAL could not be written. Nothing from the failed commit slice on is stored;
//!   a request over one slice (16,384 samples) may have its earlier slices stored, and the
//!   sender's retry stores the rest (exact duplicates are ignored);
//! * 503: the bodies being uploaded already declare `max_buffered_bytes`, or more writes
//!   than `max_concurrent` waited too long for their turn (the sender retries). A write
//!   takes a processing slot only once its body has arrived.
//!
//! A series is created only for a time series that carries samples.
//!
//! Every tier that takes remote write (the edge, the regional) mounts [`router`] over its
//! own database and registers [`ReceiveMetrics`] in its `/metrics`.

mod http;
mod metrics;
mod shape;
mod wire;

pub use http::router;
pub use metrics::{CodeLabel, ReasonLabel, ReceiveMetrics};
use shape::ShapeError;
use std::collections::BTreeMap;
use std::sync::Arc;
use strata_model::{Label, Labels, Metadata, MetricType};
use strata_proto::prometheus::metric_metadata::MetricType as PbType;
use strata_tsdb::db::Tsdb;
use strata_tsdb::head::HeadError;

#[derive(Debug, Clone, Copy)]
pub struct WriteLimits {
    pub max_body_bytes: usize,
    pub max_decoded_bytes: usize,
    /// Heap the decoded request may take, bounded from its shape before decoding.
    pub max_decoded_memory: u64,
    pub max_samples: usize,
    /// Writes processed at once; the rest wait their turn.
    pub max_concurrent: usize,
    /// Bytes of bodies being uploaded or waiting, over all writes; past it a write gets 503.
    pub max_buffered_bytes: usize,
}

impl Default for WriteLimits {
    fn default() -> Self {
        WriteLimits {
            max_body_bytes: 32 << 20,
            max_decoded_bytes: 64 << 20,
            max_decoded_memory: 256 << 20,
            max_samples: 5_000_000,
            max_concurrent: 4,
            max_buffered_bytes: 256 << 20,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct WriteOutcome {
    pub status: u16,
    pub message: String,
    pub stored: usize,
    /// The oldest and newest timestamp of the request's samples, when it stored any.
    pub span: Option<(i64, i64)>,
}

fn convert_type(t: i32) -> MetricType {
    match PbType::try_from(t).unwrap_or(PbType::Unknown) {
        PbType::Counter => MetricType::Counter,
        PbType::Gauge => MetricType::Gauge,
        PbType::Histogram => MetricType::Histogram,
        PbType::Gaugehistogram => MetricType::GaugeHistogram,
        PbType::Summary => MetricType::Summary,
        PbType::Info => MetricType::Info,
        PbType::Stateset => MetricType::StateSet,
        PbType::Unknown => MetricType::Unknown,
    }
}

#[derive(Debug, thiserror::Error)]
enum LabelsError {
    #[error("invalid label name {0:?}")]
    Invalid(String),
    #[error("label {0:?} has a value that is not UTF-8")]
    Utf8(String),
    #[error("duplicate label name")]
    Duplicate,
    #[error("missing metric name")]
    NoMetricName,
}

/// Checks a series' labels as read from the wire into `out`, sorted by name without empty
/// values, refusing what Prometheus refuses: names or values that are not UTF-8, invalid or
/// duplicate names, a missing metric name.
fn to_pairs<'a>(wire: &[(&'a [u8], &'a [u8])], out: &mut Vec<(&'a str, &'a str)>) -> Result<(), LabelsError> {
    out.clear();
    for &(name, value) in wire {
        let name =
            std::str::from_utf8(name).map_err(|_| LabelsError::Invalid(String::from_utf8_lossy(name).into_owned()))?;
        if !strata_model::is_valid_label_name(name) {
            return Err(LabelsError::Invalid(name.to_string()));
        }
        if value.is_empty() {
            continue;
        }
        let value = std::str::from_utf8(value).map_err(|_| LabelsError::Utf8(name.to_string()))?;
        out.push((name, value));
    }
    // Senders sort their labels: check before sorting.
    if !out.windows(2).all(|w| w[0].0 < w[1].0) {
        out.sort_unstable_by(|a, b| a.0.cmp(b.0));
        if out.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(LabelsError::Duplicate);
        }
    }
    if !out.iter().any(|(n, _)| *n == strata_model::METRIC_NAME) {
        return Err(LabelsError::NoMetricName);
    }
    Ok(())
}

fn to_labels(pairs: &[(&str, &str)]) -> Labels {
    Labels::from_sorted_unchecked(pairs.iter().map(|(n, v)| Label { name: (*n).into(), value: (*v).into() }).collect())
}

/// Decodes and stores one request body. Runs on a blocking thread: it writes the WAL.
pub fn handle(db: &Tsdb, metrics: &ReceiveMetrics, body: &[u8], limits: &WriteLimits) -> WriteOutcome {
    let out = process(db, metrics, body, limits);
    metrics.remote_write_requests.get_or_create(&CodeLabel { code: out.status.to_string() }).inc();
    metrics.remote_write_samples.inc_by(out.stored as u64);
    out
}

fn reject(
    metrics: &ReceiveMetrics,
    reasons: &mut BTreeMap<&'static str, (usize, String)>,
    reason: &'static str,
    n: usize,
    example: String,
) {
    metrics.remote_write_rejected.get_or_create(&ReasonLabel { reason: reason.to_string() }).inc_by(n as u64);
    let e = reasons.entry(reason).or_insert((0, example));
    e.0 += n;
}

fn process(db: &Tsdb, metrics: &ReceiveMetrics, body: &[u8], limits: &WriteLimits) -> WriteOutcome {
    let fail = |status: u16, message: String| WriteOutcome { status, message, stored: 0, span: None };
    if body.len() > limits.max_body_bytes {
        return fail(413, format!("body of {} bytes is over the limit of {} bytes", body.len(), limits.max_body_bytes));
    }
    let decoded_len = match snap::raw::decompress_len(body) {
        Ok(n) => n,
        Err(e) => return fail(400, format!("body is not snappy-compressed: {e}")),
    };
    if decoded_len > limits.max_decoded_bytes {
        return fail(
            413,
            format!("decompressed body of {decoded_len} bytes is over the limit of {} bytes", limits.max_decoded_bytes),
        );
    }
    let raw = match snap::raw::Decoder::new().decompress_vec(body) {
        Ok(r) => r,
        Err(e) => return fail(400, format!("body is not snappy-compressed: {e}")),
    };
    let shape = match shape::scan(&raw) {
        Ok(s) => s,
        Err(e) => return fail(400, format!("body is not a remote-write WriteRequest: {e}")),
    };
    if shape.samples > limits.max_samples as u64 {
        return fail(
            413,
            format!("{} samples in one request is over the limit of {}", shape.samples, limits.max_samples),
        );
    }
    if shape.decoded_bytes() > limits.max_decoded_memory {
        return fail(
            413,
            format!(
                "decoding the request ({} series, {} labels, {} samples) would take over {} bytes of memory",
                shape.series, shape.labels, shape.samples, limits.max_decoded_memory
            ),
        );
    }
    let not_a_request = |e: ShapeError| fail(400, format!("body is not a remote-write WriteRequest: {e}"));
    let mut reasons: BTreeMap<&'static str, (usize, String)> = BTreeMap::new();
    let mut metadata = Vec::new();
    if let Err(e) = wire::each_metadata(&raw, &mut |m| metadata.push(m)) {
        return not_a_request(e);
    }
    // `scan` checked every message: nothing below fails to read after something is stored.
    let mut scratch = wire::WireSeries::default();
    for m in metadata {
        if m.family.is_empty() {
            continue;
        }
        let (Ok(family), Ok(help), Ok(unit)) =
            (std::str::from_utf8(m.family), std::str::from_utf8(m.help), std::str::from_utf8(m.unit))
        else {
            metrics.remote_write_rejected_metadata.inc();
            tracing::warn!("remote write: metadata with a family name, help or unit that is not UTF-8 skipped");
            continue;
        };
        let meta =
            Metadata { metric_type: convert_type(m.metric_type), help: help.to_string(), unit: unit.to_string() };
        if let Err(e) = db.set_metadata(family, meta) {
            return fail(500, format!("storing metadata: {e}"));
        }
    }
    let total = usize::try_from(shape.samples).unwrap_or(usize::MAX);
    let mut batch = Vec::with_capacity(total);
    // Series Prometheus would skip (invalid labels) are skipped and counted; like
    // Prometheus, they alone do not make the answer a 400.
    let mut skipped: Option<(usize, String)> = None;
    let mut pairs = Vec::new();
    let read = wire::each_series(&raw, &mut scratch, &mut |ts| {
        let n = ts.samples.len();
        let histograms = ts.histograms;
        if n == 0 && histograms == 0 {
            return;
        }
        // The usual case: labels sent sorted, none empty, and the head holds exactly them.
        // Stored labels are valid, so bytes equal to them need no other check, and the
        // lookup allocates nothing.
        let direct = histograms == 0
            && ts.labels.iter().all(|(_, v)| !v.is_empty())
            && ts.labels.windows(2).all(|w| w[0].0 < w[1].0);
        if let Some(series) = direct.then(|| db.head().find_pairs(&ts.labels)).flatten() {
            batch.extend(ts.samples.iter().map(|s| (series.clone(), *s)));
            return;
        }
        if let Err(e) = to_pairs(&ts.labels, &mut pairs) {
            let lost = n + histograms;
            metrics
                .remote_write_rejected
                .get_or_create(&ReasonLabel { reason: "invalid_labels".into() })
                .inc_by(lost as u64);
            let s = skipped.get_or_insert((0, e.to_string()));
            s.0 += lost;
            return;
        }
        if histograms > 0 {
            let example = format!("native histogram samples are not supported: series {}", to_labels(&pairs));
            reject(metrics, &mut reasons, "native_histograms", histograms, example);
        }
        if n == 0 {
            return;
        }
        let series = match db.series(&to_labels(&pairs)) {
            Ok(s) => s,
            Err(e @ HeadError::SeriesLimit { .. }) => {
                reject(metrics, &mut reasons, "series_limit", n, e.to_string());
                return;
            }
            Err(e) => {
                reject(metrics, &mut reasons, "invalid_labels", n, e.to_string());
                return;
            }
        };
        batch.extend(ts.samples.iter().map(|s| (series.clone(), *s)));
    });
    if let Err(e) = read {
        return not_a_request(e);
    }
    drop(raw);
    // Refusals of slices stored before a WAL failure are counted like any others.
    let (committed, done) = db.commit_partial(&batch);
    for (r, s, e) in &committed.rejected {
        let series = db.head().series(*r).map(|x| x.labels.to_string()).unwrap_or_default();
        reject(metrics, &mut reasons, e.reason(), 1, format!("{e}: series {series}, timestamp {}, value {}", s.t, s.v));
    }
    let stored = committed.appended + committed.ignored_duplicates;
    let span = batch
        .iter()
        .map(|(_, s)| s.t)
        .fold(None, |acc: Option<(i64, i64)>, t| Some(acc.map_or((t, t), |(lo, hi)| (lo.min(t), hi.max(t)))));
    if let Err(e) = done {
        // Counters count attempts: the sender's retry counts its refusals again, as any
        // refused request's retry does.
        tracing::warn!(stored, error = %e, "remote write: the WAL failed part way; the sender retries the rest");
        return WriteOutcome {
            status: 500,
            message: format!("writing the WAL: {e} ({stored} samples of earlier slices stored)"),
            stored,
            span,
        };
    }
    if let Some((n, first)) = &skipped {
        tracing::warn!(samples = n, first = %first, "remote write: series with invalid labels skipped");
    }
    if reasons.is_empty() {
        return WriteOutcome { status: 204, message: String::new(), stored, span };
    }
    if let Some((n, first)) = skipped {
        reasons.insert("invalid_labels", (n, first));
    }
    let refused: usize = reasons.values().map(|r| r.0).sum();
    let detail: Vec<String> = reasons.iter().map(|(k, (n, ex))| format!("{k}: {n} (first: {ex})")).collect();
    tracing::warn!(stored, refused, detail = %detail.join("; "), "remote write: samples refused");
    WriteOutcome {
        status: 400,
        message: format!("{refused} of {total} samples refused, {stored} stored; {}", detail.join("; ")),
        stored,
        span,
    }
}

/// Shared state the HTTP handler needs.
pub struct RemoteWrite {
    pub db: Arc<Tsdb>,
    pub metrics: Arc<ReceiveMetrics>,
    pub limits: WriteLimits,
    /// One permit per write processed at once, taken once its body is read.
    pub slots: Arc<tokio::sync::Semaphore>,
    /// One permit per KiB of body uploaded or waiting ([`WriteLimits::max_buffered_bytes`]).
    pub upload_kib: Arc<tokio::sync::Semaphore>,
    /// Told, before a request that stored samples is answered, the span of their times
    /// (a regional's downsampling computes again the windows late data fell in); an error
    /// answers 503, so the sender retries.
    pub on_stored: Option<OnStored>,
}

/// See [`RemoteWrite::on_stored`]: (sender, oldest, newest).
pub type OnStored = Arc<dyn Fn(&str, i64, i64) -> Result<(), String> + Send + Sync>;

impl RemoteWrite {
    pub fn new(db: Arc<Tsdb>, metrics: Arc<ReceiveMetrics>, limits: WriteLimits) -> Self {
        let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_concurrent.max(1)));
        // Room for at least one body of the largest size.
        let kib = (limits.max_buffered_bytes / 1024).max(limits.max_body_bytes.div_ceil(1024)).min(u32::MAX as usize);
        let upload_kib = Arc::new(tokio::sync::Semaphore::new(kib));
        RemoteWrite { db, metrics, limits, slots, upload_kib, on_stored: None }
    }

    pub fn with_on_stored(mut self, f: OnStored) -> Self {
        self.on_stored = Some(f);
        self
    }
}

/// Checks that a request speaks remote write 1.0, as Prometheus 3 does: `Content-Type`
/// absent or `application/x-protobuf` (with no `proto` or `proto=prometheus.WriteRequest`),
/// `Content-Encoding` absent or `snappy`. Anything else is answered 415 with the reason,
/// so that a remote write 2.0 sender knows to fall back instead of having its data dropped.
pub fn protocol(headers: &axum::http::HeaderMap) -> Result<(), String> {
    let get = |h| headers.get(h).map(|v| v.to_str().unwrap_or("\u{fffd}").trim().to_string());
    if let Some(enc) = get(axum::http::header::CONTENT_ENCODING) {
        if !enc.eq_ignore_ascii_case("snappy") {
            return Err(format!("unsupported Content-Encoding {enc:?}: remote write takes snappy"));
        }
    }
    let Some(ct) = get(axum::http::header::CONTENT_TYPE) else { return Ok(()) };
    let mut parts = ct.split(';').map(str::trim);
    let media = parts.next().unwrap_or("");
    if !media.eq_ignore_ascii_case("application/x-protobuf") {
        return Err(format!("unsupported Content-Type {ct:?}: remote write takes application/x-protobuf"));
    }
    for p in parts {
        let Some((k, v)) = p.split_once('=') else { continue };
        if k.trim().eq_ignore_ascii_case("proto") {
            let v = v.trim().trim_matches('"');
            if v == "io.prometheus.write.v2.Request" {
                return Err("remote write 2.0 (io.prometheus.write.v2.Request) is not supported yet: \
                            send prometheus.WriteRequest (remote write 1.0)"
                    .into());
            }
            if v != "prometheus.WriteRequest" {
                return Err(format!("unsupported remote-write message {v:?}: Strata takes prometheus.WriteRequest"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use strata_model::matcher::Matcher;
    use strata_proto::prometheus::{
        Label as PbLabel, ReceivedLabel, ReceivedTimeSeries, ReceivedWriteRequest, Sample as PbSample, Skipped,
        TimeSeries, WriteRequest,
    };
    use strata_tsdb::db::TsdbOptions;

    /// One test series: label pairs and (timestamp, value) samples.
    type TestSeries<'a> = (Vec<(&'a str, &'a str)>, Vec<(i64, f64)>);

    fn body(series: Vec<TestSeries>) -> Vec<u8> {
        let req = WriteRequest {
            timeseries: series
                .into_iter()
                .map(|(l, s)| TimeSeries {
                    labels: l.into_iter().map(|(n, v)| PbLabel { name: n.into(), value: v.into() }).collect(),
                    samples: s.into_iter().map(|(t, v)| PbSample { timestamp: t, value: v }).collect(),
                    exemplars: vec![],
                })
                .collect(),
            metadata: vec![],
        };
        snap::raw::Encoder::new().compress_vec(&req.encode_to_vec()).unwrap()
    }

    fn setup() -> (tempfile::TempDir, Tsdb, ReceiveMetrics) {
        let d = tempfile::tempdir().unwrap();
        let db = Tsdb::open(d.path(), TsdbOptions::default()).unwrap();
        let metrics = ReceiveMetrics::default();
        (d, db, metrics)
    }

    fn count(db: &Tsdb, name: &str) -> usize {
        db.head()
            .select(&[Matcher::eq("__name__", name)], i64::MIN, i64::MAX)
            .iter()
            .map(|(_, c)| c.iter().map(|c| c.n as usize).sum::<usize>())
            .sum()
    }

    #[test]
    fn good_request_is_stored() {
        let (_d, db, m) = setup();
        let b = body(vec![(vec![("__name__", "a"), ("x", "1")], vec![(1000, 1.0), (2000, 2.0)])]);
        let out = handle(&db, &m, &b, &WriteLimits::default());
        assert_eq!(out.status, 204, "{}", out.message);
        assert_eq!(count(&db, "a"), 2);
        // retrying the same request is harmless
        assert_eq!(handle(&db, &m, &b, &WriteLimits::default()).status, 204);
        assert_eq!(count(&db, "a"), 2);
    }

    #[test]
    fn malformed_bodies_are_400_and_store_nothing() {
        let (_d, db, m) = setup();
        for b in
            [b"not snappy at all".to_vec(), snap::raw::Encoder::new().compress_vec(b"\xff\xff\xff garbage").unwrap()]
        {
            let out = handle(&db, &m, &b, &WriteLimits::default());
            assert_eq!(out.status, 400, "{}", out.message);
        }
        assert_eq!(db.head().num_series(), 0);
    }

    #[test]
    fn partly_bad_request_stores_the_good_part_and_says_what_was_refused() {
        let (_d, db, m) = setup();
        handle(&db, &m, &body(vec![(vec![("__name__", "a")], vec![(5000, 1.0)])]), &WriteLimits::default());
        let b = body(vec![
            (vec![("__name__", "a")], vec![(4000, 1.0), (5000, 9.0), (6000, 2.0)]),
            (vec![("__name__", "b"), ("1bad", "x")], vec![(1000, 1.0)]),
            (vec![("x", "no name")], vec![(1000, 1.0)]),
            (vec![("__name__", "c")], vec![(1000, 1.0)]),
        ]);
        let out = handle(&db, &m, &b, &WriteLimits::default());
        assert_eq!(out.status, 400);
        assert!(out.message.contains("out_of_order: 1"), "{}", out.message);
        assert!(out.message.contains("duplicate: 1"), "{}", out.message);
        assert!(out.message.contains("invalid_labels: 2"), "{}", out.message);
        assert_eq!(count(&db, "a"), 2);
        assert_eq!(count(&db, "c"), 1);
        assert!(m.encode().contains("strata_remote_write_rejected_samples_total{reason=\"out_of_order\"} 1"));
    }

    fn received_series(labels: &[(&[u8], &[u8])], samples: usize, histograms: usize) -> ReceivedTimeSeries {
        ReceivedTimeSeries {
            labels: labels.iter().map(|(n, v)| ReceivedLabel { name: n.to_vec(), value: v.to_vec() }).collect(),
            samples: (0..samples).map(|i| PbSample { timestamp: 1000 * (i as i64 + 1), value: 1.0 }).collect(),
            exemplars: vec![],
            histograms: vec![Skipped {}; histograms],
        }
    }

    fn received_body(series: Vec<ReceivedTimeSeries>) -> Vec<u8> {
        let req = ReceivedWriteRequest { timeseries: series, metadata: vec![] };
        snap::raw::Encoder::new().compress_vec(&req.encode_to_vec()).unwrap()
    }

    /// A series the head holds is found from the body's bytes when its labels come sorted
    /// and none is empty; any other spelling of the same labels (unsorted, with an empty
    /// value) goes through the checks and lands in the same series, and bytes that only
    /// look alike (a stored series' labels with one invalid byte) are still refused.
    #[test]
    fn every_spelling_of_a_held_series_lands_in_it_and_bad_bytes_are_still_refused() {
        let (_d, db, m) = setup();
        let at = |labels: &[(&[u8], &[u8])], t: i64| {
            let mut s = received_series(labels, 1, 0);
            s.samples[0].timestamp = t;
            s
        };
        let b = received_body(vec![
            at(&[(b"__name__", b"m"), (b"gpu", b"0")], 1000),
            at(&[(b"__name__", b"m"), (b"gpu", b"0")], 2000),
            at(&[(b"gpu", b"0"), (b"__name__", b"m")], 3000),
            at(&[(b"__name__", b"m"), (b"empty", b""), (b"gpu", b"0")], 4000),
            at(&[(b"__name__", b"m"), (b"gpu", b"0"), (b"gpu", b"0")], 5000),
            at(&[(b"__name__", b"m"), (b"gpu", b"\xff")], 6000),
        ]);
        let out = handle(&db, &m, &b, &WriteLimits::default());
        assert_eq!(out.status, 204, "{}", out.message);
        assert_eq!(db.head().stats().series, 1);
        assert_eq!(count(&db, "m"), 4);
        assert!(m.encode().contains("strata_remote_write_rejected_samples_total{reason=\"invalid_labels\"} 2"));
    }

    /// A body that does not read (here: its last series has a label whose name is a
    /// varint) stores nothing, not the metadata nor the series before the damage.
    #[test]
    fn a_body_damaged_after_good_series_stores_nothing() {
        let (_d, db, m) = setup();
        let good = ReceivedWriteRequest {
            timeseries: vec![received_series(&[(b"__name__", b"before")], 2, 0)],
            metadata: vec![strata_proto::prometheus::ReceivedMetricMetadata {
                r#type: 1,
                metric_family_name: b"before".to_vec(),
                help: b"h".to_vec(),
                unit: vec![],
            }],
        };
        let mut raw = good.encode_to_vec();
        // timeseries { labels { name: varint 1 } }
        raw.extend_from_slice(&[0x0a, 0x04, 0x0a, 0x02, 0x08, 0x01]);
        let body = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
        let out = handle(&db, &m, &body, &WriteLimits::default());
        assert_eq!(out.status, 400, "{}", out.message);
        assert_eq!(db.head().stats().series, 0, "series created by a refused body");
        assert!(db.head().all_metadata().is_empty(), "metadata stored from a refused body");
    }

    /// Prometheus skips a series whose label value is not UTF-8 and stores the rest; the
    /// string decoder used to refuse the whole body for it.
    #[test]
    fn a_label_value_that_is_not_utf8_skips_only_its_series() {
        let (_d, db, m) = setup();
        let b = received_body(vec![
            received_series(&[(b"__name__", b"good"), (b"gpu", b"0")], 3, 0),
            received_series(&[(b"__name__", b"bad"), (b"gpu", b"\xff\xfe")], 2, 0),
            received_series(&[(b"__name__", b"good"), (b"gpu", b"1")], 3, 0),
        ]);
        let out = handle(&db, &m, &b, &WriteLimits::default());
        assert_eq!(out.status, 204, "{}", out.message);
        assert_eq!((count(&db, "good"), count(&db, "bad")), (6, 0));
        assert!(m.encode().contains("strata_remote_write_rejected_samples_total{reason=\"invalid_labels\"} 2"));
    }

    /// Native histogram samples cannot be stored: they are counted and named in a 400, and
    /// the float samples beside them are stored.
    #[test]
    fn native_histograms_are_counted_and_answered_not_dropped() {
        let (_d, db, m) = setup();
        let b = received_body(vec![
            received_series(&[(b"__name__", b"latency")], 0, 2),
            received_series(&[(b"__name__", b"floats")], 3, 0),
        ]);
        let out = handle(&db, &m, &b, &WriteLimits::default());
        assert_eq!(out.status, 400);
        assert!(out.message.contains("native_histograms: 2"), "{}", out.message);
        assert_eq!(count(&db, "floats"), 3);
        assert!(m.encode().contains("strata_remote_write_rejected_samples_total{reason=\"native_histograms\"} 2"));
    }

    #[test]
    fn only_remote_write_1_0_is_taken() {
        use axum::http::{header, HeaderMap, HeaderValue};
        let with = |ct: Option<&'static str>, enc: Option<&'static str>| {
            let mut h = HeaderMap::new();
            if let Some(ct) = ct {
                h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
            }
            if let Some(enc) = enc {
                h.insert(header::CONTENT_ENCODING, HeaderValue::from_static(enc));
            }
            protocol(&h)
        };
        assert!(with(None, None).is_ok());
        assert!(with(Some("application/x-protobuf"), Some("snappy")).is_ok());
        assert!(with(Some("application/x-protobuf;proto=prometheus.WriteRequest"), Some("snappy")).is_ok());
        let v2 = with(Some("application/x-protobuf;proto=io.prometheus.write.v2.Request"), Some("snappy"));
        assert!(v2.is_err_and(|e| e.contains("remote write 2.0")));
        assert!(with(Some("application/json"), None).is_err());
        assert!(with(Some("application/x-protobuf"), Some("zstd")).is_err());
    }

    #[test]
    fn limits_give_413() {
        let (_d, db, m) = setup();
        let b = body(vec![(vec![("__name__", "a")], (0..100).map(|i| (i, 1.0)).collect())]);
        let small = WriteLimits { max_samples: 10, ..Default::default() };
        assert_eq!(handle(&db, &m, &b, &small).status, 413);
        let tiny = WriteLimits { max_body_bytes: 10, ..Default::default() };
        assert_eq!(handle(&db, &m, &b, &tiny).status, 413);
        let tiny_decoded = WriteLimits { max_decoded_bytes: 10, ..Default::default() };
        assert_eq!(handle(&db, &m, &b, &tiny_decoded).status, 413);
        assert_eq!(db.head().num_series(), 0);
    }

    #[test]
    fn a_sample_from_the_future_is_refused_and_later_samples_still_go_in() {
        let (_d, db, m) = setup();
        let now = strata_model::time::now_ms();
        let year_2100 = 4_102_444_800_000;
        let b = body(vec![
            (vec![("__name__", "a")], vec![(now - 1000, 1.0)]),
            (vec![("__name__", "b")], vec![(year_2100, 1.0)]),
        ]);
        let out = handle(&db, &m, &b, &WriteLimits::default());
        assert_eq!(out.status, 400);
        assert!(out.message.contains("too_far_in_future: 1"), "{}", out.message);
        assert!(
            m.encode().contains(r#"strata_remote_write_rejected_samples_total{reason="too_far_in_future"} 1"#),
            "{}",
            m.encode()
        );
        let b = body(vec![(vec![("__name__", "a")], vec![(now, 2.0)])]);
        assert_eq!(handle(&db, &m, &b, &WriteLimits::default()).status, 204);
        assert_eq!(count(&db, "a"), 2);
        assert_eq!(count(&db, "b"), 0);
    }

    #[test]
    fn a_body_that_would_expand_in_memory_is_refused_before_decoding() {
        let (_d, db, m) = setup();
        // A million empty TimeSeries: 2 MB on the wire, about 80 MB decoded.
        let wire: Vec<u8> = std::iter::repeat_n([0x0a, 0x00], 1_000_000).flatten().collect();
        let b = snap::raw::Encoder::new().compress_vec(&wire).unwrap();
        let limits = WriteLimits { max_decoded_memory: 16 << 20, ..Default::default() };
        let out = handle(&db, &m, &b, &limits);
        assert_eq!(out.status, 413, "{}", out.message);
        assert!(out.message.contains("1000000 series"), "{}", out.message);
        // Within the limit it is harmless: no samples, so no series either.
        let out = handle(&db, &m, &b, &WriteLimits::default());
        assert_eq!(out.status, 204, "{}", out.message);
        assert_eq!(db.head().num_series(), 0);
    }

    #[test]
    fn a_time_series_without_samples_creates_no_series() {
        let (_d, db, m) = setup();
        let b = body(
            (0..1000).map(|i| (vec![("__name__", "a"), ("i", if i % 2 == 0 { "x" } else { "y" })], vec![])).collect(),
        );
        assert_eq!(handle(&db, &m, &b, &WriteLimits::default()).status, 204);
        assert_eq!(db.head().num_series(), 0);
    }

    /// Valid bodies with bytes flipped, dropped or inserted, before and after snappy:
    /// every answer is 204, 400 or 413, and nothing panics.
    #[test]
    fn mutated_bodies_get_an_answer_never_a_panic() {
        let (_d, db, m) = setup();
        let now = strata_model::time::now_ms();
        let raw = WriteRequest::decode(
            snap::raw::Decoder::new()
                .decompress_vec(&body(vec![
                    (vec![("__name__", "a"), ("gpu", "0")], vec![(now - 2000, 1.0), (now - 1000, 2.0)]),
                    (vec![("__name__", "b")], vec![(now, 3.5)]),
                ]))
                .unwrap()
                .as_slice(),
        )
        .unwrap()
        .encode_to_vec();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..1000 {
            let mut b = raw.clone();
            for _ in 0..(1 + next() % 3) {
                let i = (next() as usize) % b.len().max(1);
                match next() % 3 {
                    0 if !b.is_empty() => b[i] = next() as u8,
                    1 if !b.is_empty() => {
                        b.remove(i);
                    }
                    _ => b.insert(i.min(b.len()), next() as u8),
                }
            }
            let mut wire = snap::raw::Encoder::new().compress_vec(&b).unwrap();
            if round % 3 == 0 && !wire.is_empty() {
                let i = (next() as usize) % wire.len();
                wire[i] ^= 1 << (next() % 8);
            }
            let out = handle(&db, &m, &wire, &WriteLimits::default());
            assert!([204, 400, 413].contains(&out.status), "status {}: {}", out.status, out.message);
        }
    }
}
