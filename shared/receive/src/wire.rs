//! Reads a remote-write `WriteRequest` in place: label names and values stay slices of the
//! decompressed body, and one series' labels and samples reuse the same two vectors, so a
//! request whose series the head already holds allocates nothing per sample. (Decoding
//! into owned messages spent about half the receiver's CPU in malloc and free: a request of
//! 2,000 samples, one per series as Prometheus sends them, holds some 25,000 strings.)
//!
//! The wire semantics are protobuf's, as prost applies them: unknown fields are skipped, a
//! scalar field given twice keeps the last value, a known field with the wrong wire type
//! is an error, and a nested message must itself parse. One difference: groups (wire
//! types 3 and 4, deprecated since proto2 and sent by no remote-write client) are refused
//! anywhere, where prost skips them as unknown fields inside a label or a sample.

use crate::shape::{fields, ShapeError, Wire};
use strata_model::Sample;

/// One `TimeSeries`, borrowed from the body.
#[derive(Default)]
pub struct WireSeries<'a> {
    pub labels: Vec<(&'a [u8], &'a [u8])>,
    pub samples: Vec<Sample>,
    pub exemplars: usize,
    pub histograms: usize,
}

/// One `MetricMetadata`, borrowed from the body.
pub struct WireMetadata<'a> {
    pub metric_type: i32,
    pub family: &'a [u8],
    pub help: &'a [u8],
    pub unit: &'a [u8],
}

fn wrong_wire(at: usize) -> ShapeError {
    ShapeError::WireType { wire: u64::MAX, at }
}

pub(super) fn bytes(w: Wire<'_>, at: usize) -> Result<&[u8], ShapeError> {
    match w {
        Wire::Bytes(b) => Ok(b),
        _ => Err(wrong_wire(at)),
    }
}

/// A nested message Strata does not read (an exemplar, a histogram): it must parse.
pub(super) fn skipped(b: &[u8], at: usize) -> Result<(), ShapeError> {
    fields(b, at, &mut |_, _, _| Ok(()))
}

pub(super) fn label(b: &[u8], at: usize) -> Result<(&[u8], &[u8]), ShapeError> {
    let (mut name, mut value): (&[u8], &[u8]) = (&[], &[]);
    fields(b, at, &mut |f, w, at| {
        match f {
            1 => name = bytes(w, at)?,
            2 => value = bytes(w, at)?,
            _ => {}
        }
        Ok(())
    })?;
    Ok((name, value))
}

pub(super) fn sample(b: &[u8], at: usize) -> Result<Sample, ShapeError> {
    let (mut v, mut t) = (0.0f64, 0i64);
    fields(b, at, &mut |f, w, at| {
        match (f, w) {
            (1, Wire::Fixed64(bits)) => v = f64::from_bits(bits),
            // int64 on the wire: the varint's bits, two's complement.
            (2, Wire::Varint(x)) => t = x as i64,
            (1 | 2, _) => return Err(wrong_wire(at)),
            _ => {}
        }
        Ok(())
    })?;
    Ok(Sample::new(t, v))
}

/// Calls `each` with every `TimeSeries` of the request, in order. `into` is the scratch
/// the series is read into (cleared before each).
pub fn each_series<'a>(
    body: &'a [u8],
    into: &mut WireSeries<'a>,
    each: &mut dyn FnMut(&WireSeries<'a>),
) -> Result<(), ShapeError> {
    fields(body, 0, &mut |f, w, at| {
        if f != 1 {
            return Ok(());
        }
        let ts = bytes(w, at)?;
        into.labels.clear();
        into.samples.clear();
        (into.exemplars, into.histograms) = (0, 0);
        fields(ts, at, &mut |f, w, at| {
            match f {
                1 => into.labels.push(label(bytes(w, at)?, at)?),
                2 => into.samples.push(sample(bytes(w, at)?, at)?),
                3 => {
                    skipped(bytes(w, at)?, at)?;
                    into.exemplars += 1;
                }
                4 => {
                    skipped(bytes(w, at)?, at)?;
                    into.histograms += 1;
                }
                _ => {}
            }
            Ok(())
        })?;
        each(into);
        Ok(())
    })
}

/// Calls `each` with every `MetricMetadata` of the request, in order.
pub fn each_metadata<'a>(body: &'a [u8], each: &mut dyn FnMut(WireMetadata<'a>)) -> Result<(), ShapeError> {
    fields(body, 0, &mut |f, w, at| {
        if f != 3 {
            return Ok(());
        }
        each(metadata(bytes(w, at)?, at)?);
        Ok(())
    })
}

pub(super) fn metadata(b: &[u8], at: usize) -> Result<WireMetadata<'_>, ShapeError> {
    let mut m = WireMetadata { metric_type: 0, family: &[], help: &[], unit: &[] };
    fields(b, at, &mut |f, w, at| {
        match (f, w) {
            // An enum: prost keeps the varint's low 32 bits.
            (1, Wire::Varint(x)) => m.metric_type = x as i32,
            (1, _) => return Err(wrong_wire(at)),
            (2, w) => m.family = bytes(w, at)?,
            (4, w) => m.help = bytes(w, at)?,
            (5, w) => m.unit = bytes(w, at)?,
            _ => {}
        }
        Ok(())
    })?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use strata_proto::prometheus::{ReceivedWriteRequest, WriteRequest};

    /// Every body prost reads, this reads alike; every body prost refuses, this refuses.
    #[test]
    fn reads_what_prost_reads_and_refuses_what_it_refuses() {
        use strata_proto::prometheus::{Label, MetricMetadata, Sample as PbSample, TimeSeries};
        let req = WriteRequest {
            timeseries: (0..5)
                .map(|s| TimeSeries {
                    labels: vec![
                        Label { name: "__name__".into(), value: format!("m{s}") },
                        Label { name: "job".into(), value: "j".into() },
                    ],
                    samples: (0..3).map(|t| PbSample { value: t as f64 * 0.5 - 1.0, timestamp: t - 1 }).collect(),
                    exemplars: vec![],
                })
                .collect(),
            metadata: vec![MetricMetadata {
                r#type: 1,
                metric_family_name: "m0".into(),
                help: "h".into(),
                unit: "u".into(),
            }],
        };
        let mut body = req.encode_to_vec();
        // Beside the sender's messages: a series with unsorted labels, an empty value, an
        // exemplar, a histogram and an unknown field, as Prometheus 3 may send them.
        let odd = strata_proto::prometheus::ReceivedTimeSeries {
            labels: vec![
                strata_proto::prometheus::ReceivedLabel { name: b"job".to_vec(), value: b"j".to_vec() },
                strata_proto::prometheus::ReceivedLabel { name: b"__name__".to_vec(), value: b"odd".to_vec() },
                strata_proto::prometheus::ReceivedLabel { name: b"empty".to_vec(), value: vec![] },
            ],
            samples: vec![strata_proto::prometheus::Sample { value: 2.5, timestamp: 7 }],
            exemplars: vec![strata_proto::prometheus::Skipped {}],
            histograms: vec![strata_proto::prometheus::Skipped {}, strata_proto::prometheus::Skipped {}],
        };
        body.extend(ReceivedWriteRequest { timeseries: vec![odd], metadata: vec![] }.encode_to_vec());
        // field 9, varint 5: unknown at the top
        body.extend_from_slice(&[0x48, 0x05]);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..20_000 {
            let mut b = body.clone();
            if round > 0 {
                for _ in 0..1 + round % 3 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let i = (rng as usize) % b.len();
                    b[i] = (rng >> 32) as u8;
                }
            }
            let theirs = ReceivedWriteRequest::decode(b.as_slice());
            // The check before anything is stored refuses exactly what prost refuses.
            assert_eq!(crate::shape::scan(&b).is_ok(), theirs.is_ok(), "round {round}: scan and prost differ");
            let mut ours = Vec::new();
            let mut scratch = WireSeries::default();
            let series = each_series(&b, &mut scratch, &mut |s| {
                ours.push((s.labels.clone(), s.samples.clone(), s.exemplars, s.histograms));
            });
            let mut meta = Vec::new();
            let metadata = each_metadata(&b, &mut |m| meta.push((m.metric_type, m.family, m.help, m.unit)));
            match theirs {
                Err(e) => assert!(
                    series.is_err() || metadata.is_err(),
                    "round {round}: prost refused ({e}), we read it: {b:?}"
                ),
                Ok(r) => {
                    assert!(series.is_ok() && metadata.is_ok(), "round {round}: prost read it, we refused");
                    let want: Vec<_> = r
                        .timeseries
                        .iter()
                        .map(|t| {
                            let labels: Vec<(&[u8], &[u8])> =
                                t.labels.iter().map(|l| (l.name.as_slice(), l.value.as_slice())).collect();
                            let samples: Vec<Sample> =
                                t.samples.iter().map(|s| Sample::new(s.timestamp, s.value)).collect();
                            (labels, samples, t.exemplars.len(), t.histograms.len())
                        })
                        .collect();
                    assert_eq!(ours.len(), want.len(), "round {round}");
                    for (o, w) in ours.iter().zip(&want) {
                        assert_eq!(o.0, w.0, "round {round}");
                        assert_eq!((o.2, o.3), (w.2, w.3), "round {round}");
                        let bits = |v: &[Sample]| v.iter().map(|s| (s.t, s.v.to_bits())).collect::<Vec<_>>();
                        assert_eq!(bits(&o.1), bits(&w.1), "round {round}");
                    }
                    let want_meta: Vec<_> = r
                        .metadata
                        .iter()
                        .map(|m| (m.r#type, m.metric_family_name.as_slice(), m.help.as_slice(), m.unit.as_slice()))
                        .collect();
                    assert_eq!(meta, want_meta, "round {round}");
                }
            }
        }
    }
}
