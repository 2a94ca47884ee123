//! Prometheus remote write 1.0 receiver (`POST /api/v1/write`).
//!
//! A request is a snappy-compressed (raw block format) `WriteRequest`. Answers:
//! * 204: every sample stored (exact duplicates of stored samples count as stored);
//! * 400: the body is not snappy or protobuf (nothing stored), or some samples were
//!   refused: the valid samples of the request **are stored**, the refused ones are named
//!   in the message by reason with the first example. Senders do not retry a 400, and a
//!   retry would be harmless since exact duplicates are ignored;
//! * 413: the body, its decompressed size, its sample count or the memory its decoding
//!   would take is over the limit (measured on the wire before decoding: see [`shape`]);
//! * 500: the WAL could not be written (nothing stored; the sender retries);
//! * 503: more writes than `max_concurrent` waited too long for their turn (the sender
//!   retries).
//!
//! A series is created only for a time series that carries samples.

mod shape;

use crate::metrics::{CodeLabel, EdgeMetrics, ReasonLabel};
use prost::Message;
use std::collections::BTreeMap;
use std::sync::Arc;
use strata_model::{Label, Labels, Metadata, MetricType, Sample};
use strata_proto::prometheus::{metric_metadata::MetricType as PbType, WriteRequest};
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
}

impl Default for WriteLimits {
    fn default() -> Self {
        WriteLimits {
            max_body_bytes: 32 << 20,
            max_decoded_bytes: 64 << 20,
            max_decoded_memory: 256 << 20,
            max_samples: 5_000_000,
            max_concurrent: 4,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct WriteOutcome {
    pub status: u16,
    pub message: String,
    pub stored: usize,
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
    #[error("duplicate label name")]
    Duplicate,
    #[error("missing metric name")]
    NoMetricName,
}

/// Builds a label set, refusing what Prometheus refuses: invalid or duplicate names,
/// a missing metric name.
fn to_labels(pb: Vec<strata_proto::prometheus::Label>) -> Result<Labels, LabelsError> {
    let mut v: Vec<Label> = Vec::with_capacity(pb.len());
    for l in pb {
        if !strata_model::is_valid_label_name(&l.name) {
            return Err(LabelsError::Invalid(l.name));
        }
        if l.value.is_empty() {
            continue;
        }
        v.push(Label { name: l.name.into(), value: l.value.into() });
    }
    v.sort_by(|a, b| a.name.cmp(&b.name));
    if v.windows(2).any(|w| w[0].name == w[1].name) {
        return Err(LabelsError::Duplicate);
    }
    let labels = Labels::from_sorted_unchecked(v);
    if labels.metric_name().is_none() {
        return Err(LabelsError::NoMetricName);
    }
    Ok(labels)
}

/// Decodes and stores one request body. Runs on a blocking thread: it writes the WAL.
pub fn handle(db: &Tsdb, metrics: &EdgeMetrics, body: &[u8], limits: &WriteLimits) -> WriteOutcome {
    let out = process(db, metrics, body, limits);
    metrics.remote_write_requests.get_or_create(&CodeLabel { code: out.status.to_string() }).inc();
    metrics.remote_write_samples.inc_by(out.stored as u64);
    out
}

fn reject(
    metrics: &EdgeMetrics,
    reasons: &mut BTreeMap<&'static str, (usize, String)>,
    reason: &'static str,
    n: usize,
    example: String,
) {
    metrics.remote_write_rejected.get_or_create(&ReasonLabel { reason: reason.to_string() }).inc_by(n as u64);
    let e = reasons.entry(reason).or_insert((0, example));
    e.0 += n;
}

fn process(db: &Tsdb, metrics: &EdgeMetrics, body: &[u8], limits: &WriteLimits) -> WriteOutcome {
    let fail = |status: u16, message: String| WriteOutcome { status, message, stored: 0 };
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
    let req = match WriteRequest::decode(raw.as_slice()) {
        Ok(r) => r,
        Err(e) => return fail(400, format!("body is not a remote-write WriteRequest: {e}")),
    };
    drop(raw);
    let total: usize = req.timeseries.iter().map(|t| t.samples.len()).sum();
    let mut reasons: BTreeMap<&'static str, (usize, String)> = BTreeMap::new();
    for m in req.metadata {
        if m.metric_family_name.is_empty() {
            continue;
        }
        let meta = Metadata { metric_type: convert_type(m.r#type), help: m.help, unit: m.unit };
        if let Err(e) = db.set_metadata(&m.metric_family_name, meta) {
            return fail(500, format!("storing metadata: {e}"));
        }
    }
    let mut batch = Vec::with_capacity(total);
    for ts in req.timeseries {
        let n = ts.samples.len();
        if n == 0 {
            continue;
        }
        let labels = match to_labels(ts.labels) {
            Ok(l) => l,
            Err(e) => {
                reject(metrics, &mut reasons, "invalid_labels", n, e.to_string());
                continue;
            }
        };
        let series = match db.series(&labels) {
            Ok(s) => s,
            Err(e @ HeadError::SeriesLimit { .. }) => {
                reject(metrics, &mut reasons, "series_limit", n, e.to_string());
                continue;
            }
            Err(e) => {
                reject(metrics, &mut reasons, "invalid_labels", n, e.to_string());
                continue;
            }
        };
        for s in ts.samples {
            batch.push((series.clone(), Sample::new(s.timestamp, s.value)));
        }
    }
    let committed = match db.commit(&batch) {
        Ok(c) => c,
        Err(e) => return fail(500, format!("writing the WAL: {e}")),
    };
    for (r, s, e) in &committed.rejected {
        let series = db.head().series(*r).map(|x| x.labels.to_string()).unwrap_or_default();
        reject(metrics, &mut reasons, e.reason(), 1, format!("{e}: series {series}, timestamp {}, value {}", s.t, s.v));
    }
    let stored = committed.appended + committed.ignored_duplicates;
    if reasons.is_empty() {
        return WriteOutcome { status: 204, message: String::new(), stored };
    }
    let refused: usize = reasons.values().map(|r| r.0).sum();
    let detail: Vec<String> = reasons.iter().map(|(k, (n, ex))| format!("{k}: {n} (first: {ex})")).collect();
    tracing::warn!(stored, refused, detail = %detail.join("; "), "remote write: samples refused");
    WriteOutcome {
        status: 400,
        message: format!("{refused} of {total} samples refused, {stored} stored; {}", detail.join("; ")),
        stored,
    }
}

/// Shared state the HTTP handler needs.
pub struct RemoteWrite {
    pub db: Arc<Tsdb>,
    pub metrics: Arc<EdgeMetrics>,
    pub limits: WriteLimits,
    /// One permit per write processed at once; a write takes one before reading its body,
    /// so queued writes hold no memory.
    pub slots: Arc<tokio::sync::Semaphore>,
}

impl RemoteWrite {
    pub fn new(db: Arc<Tsdb>, metrics: Arc<EdgeMetrics>, limits: WriteLimits) -> Self {
        let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_concurrent.max(1)));
        RemoteWrite { db, metrics, limits, slots }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_model::matcher::Matcher;
    use strata_proto::prometheus::{Label as PbLabel, Sample as PbSample, TimeSeries};
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

    fn setup() -> (tempfile::TempDir, Tsdb, EdgeMetrics) {
        let d = tempfile::tempdir().unwrap();
        let db = Tsdb::open(d.path(), TsdbOptions::default()).unwrap();
        let metrics = EdgeMetrics::new(db.metrics());
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
