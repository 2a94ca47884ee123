//! Measures a remote-write body's protobuf before it is decoded.
//!
//! Decoding allocates per message, not per byte: an empty `TimeSeries` costs two bytes on
//! the wire and about 80 in memory, so a body within the size limit could still expand
//! forty-fold. [`scan`] walks the wire format without allocating, counts the series,
//! labels, samples, exemplars and metadata, and [`Shape::decoded_bytes`] bounds what
//! decoding would take, so the receiver refuses a body before it costs memory.

use std::mem::size_of;
use strata_proto::prometheus::{
    ReceivedLabel as Label, ReceivedMetricMetadata as MetricMetadata, ReceivedTimeSeries as TimeSeries, Sample, Skipped,
};

/// What a `WriteRequest` holds, counted on the wire.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub series: u64,
    pub labels: u64,
    pub samples: u64,
    pub exemplars: u64,
    /// Native histogram samples, which Strata does not store.
    pub histograms: u64,
    pub metadata: u64,
    /// Bytes of strings and nested messages that decode into heap data.
    pub payload_bytes: u64,
}

impl Shape {
    /// An upper bound of the heap a decoded request takes (exemplars and histograms are
    /// decoded as empty markers).
    pub fn decoded_bytes(&self) -> u64 {
        let per = |n: u64, size: usize| n.saturating_mul(size as u64);
        per(self.series, size_of::<TimeSeries>())
            .saturating_add(per(self.labels, size_of::<Label>()))
            .saturating_add(per(self.samples, size_of::<Sample>()))
            .saturating_add(per(self.exemplars.saturating_add(self.histograms), size_of::<Skipped>().max(1)))
            .saturating_add(per(self.metadata, size_of::<MetricMetadata>()))
            .saturating_add(self.payload_bytes.saturating_mul(1 + size_of::<Label>() as u64 / 2))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("truncated protobuf at byte {0}")]
    Truncated(usize),
    #[error("invalid protobuf wire type {wire} at byte {at}")]
    WireType { wire: u64, at: usize },
    #[error("invalid protobuf field number at byte {0}")]
    Field(usize),
    #[error("protobuf varint too long at byte {0}")]
    Varint(usize),
}

/// Walks a `WriteRequest`, checks every message in it as [`super::wire`] reads them (so a
/// body that passes stores nothing it then fails on), and counts what it holds.
pub fn scan(buf: &[u8]) -> Result<Shape, ShapeError> {
    use crate::wire::{bytes, label, metadata, sample, skipped};
    let mut shape = Shape::default();
    fields(buf, 0, &mut |field, body, at| {
        match field {
            1 => {
                shape.series += 1;
                fields(bytes(body, at)?, at, &mut |f, b, at| {
                    match f {
                        1 => {
                            let l = bytes(b, at)?;
                            label(l, at)?;
                            shape.labels += 1;
                            shape.payload_bytes += l.len() as u64;
                        }
                        2 => {
                            sample(bytes(b, at)?, at)?;
                            shape.samples += 1;
                        }
                        3 => {
                            skipped(bytes(b, at)?, at)?;
                            shape.exemplars += 1;
                        }
                        4 => {
                            skipped(bytes(b, at)?, at)?;
                            shape.histograms += 1;
                        }
                        _ => {}
                    }
                    Ok(())
                })?;
            }
            3 => {
                let m = bytes(body, at)?;
                metadata(m, at)?;
                shape.metadata += 1;
                shape.payload_bytes += m.len() as u64;
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(shape)
}

/// One field's value as the wire holds it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32,
    Bytes(&'a [u8]),
}

/// Calls `f(field, value, offset)` for each field of a message, in wire order.
pub(super) fn fields<'a>(
    buf: &'a [u8],
    base: usize,
    f: &mut dyn FnMut(u64, Wire<'a>, usize) -> Result<(), ShapeError>,
) -> Result<(), ShapeError> {
    let mut i = 0;
    while i < buf.len() {
        let key = varint(buf, &mut i, base)?;
        let (field, wire) = (key >> 3, key & 7);
        let at = base + i;
        if field == 0 || key > u64::from(u32::MAX) {
            return Err(ShapeError::Field(at));
        }
        match wire {
            0 => {
                let v = varint(buf, &mut i, base)?;
                f(field, Wire::Varint(v), at)?;
            }
            1 => {
                let b = buf.get(i..i.saturating_add(8)).ok_or(ShapeError::Truncated(at))?;
                let v = u64::from_le_bytes(b.try_into().map_err(|_| ShapeError::Truncated(at))?);
                i += 8;
                f(field, Wire::Fixed64(v), at)?;
            }
            5 => {
                i = i.checked_add(4).filter(|e| *e <= buf.len()).ok_or(ShapeError::Truncated(at))?;
                f(field, Wire::Fixed32, at)?;
            }
            2 => {
                let len = usize::try_from(varint(buf, &mut i, base)?).map_err(|_| ShapeError::Truncated(at))?;
                let end = i.checked_add(len).filter(|e| *e <= buf.len()).ok_or(ShapeError::Truncated(at))?;
                f(field, Wire::Bytes(&buf[i..end]), base + i)?;
                i = end;
            }
            _ => return Err(ShapeError::WireType { wire, at }),
        }
    }
    Ok(())
}

fn varint(buf: &[u8], i: &mut usize, base: usize) -> Result<u64, ShapeError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*i).ok_or(ShapeError::Truncated(base + *i))?;
        *i += 1;
        // The tenth byte holds the 64th bit only: anything more overflows (prost refuses it).
        if shift == 63 && b > 1 {
            return Err(ShapeError::Varint(base + *i));
        }
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(ShapeError::Varint(base + *i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use strata_proto::prometheus::{Label, TimeSeries, WriteRequest};

    fn request(series: usize, labels: usize, samples: usize) -> WriteRequest {
        WriteRequest {
            timeseries: (0..series)
                .map(|s| TimeSeries {
                    labels: (0..labels).map(|l| Label { name: format!("l{l}"), value: format!("v{s}") }).collect(),
                    samples: (0..samples).map(|t| Sample { value: 1.0, timestamp: t as i64 }).collect(),
                    exemplars: vec![],
                })
                .collect(),
            metadata: vec![],
        }
    }

    #[test]
    fn counts_what_prost_decodes() {
        let r = request(7, 3, 5);
        let s = scan(&r.encode_to_vec()).unwrap();
        assert_eq!((s.series, s.labels, s.samples), (7, 21, 35));
        let back = WriteRequest::decode(r.encode_to_vec().as_slice()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn empty_messages_that_expand_are_counted() {
        // A million empty TimeSeries: two bytes each on the wire.
        let wire: Vec<u8> = std::iter::repeat_n([0x0a, 0x00], 1_000_000).flatten().collect();
        let s = scan(&wire).unwrap();
        assert_eq!(s.series, 1_000_000);
        assert!(s.decoded_bytes() >= 1_000_000 * size_of::<TimeSeries>() as u64);
        assert!(s.decoded_bytes() > 30 * wire.len() as u64);
    }

    #[test]
    fn damaged_bodies_are_errors() {
        for bad in [&[0x0a, 0x05, 0x01][..], &[0x0b][..], &[0xff; 12][..], &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f][..]] {
            assert!(scan(bad).is_err(), "{bad:?}");
        }
    }
}
