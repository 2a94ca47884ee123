//! `prometheus.WriteRequest` encoded by hand, series by series: a series' labels are
//! encoded once per session and copied into each request as bytes, where building prost
//! messages would allocate two strings per label per request (most of the sender's CPU).
//! The bytes are what prost writes for the same message (tested), so any receiver reads
//! them as it reads Prometheus'.

use prost::encoding::{encode_varint, encoded_len_varint};

/// `WriteRequest.timeseries` (1), `TimeSeries.labels` (1) and `.samples` (2),
/// `Label.name` (1) and `.value` (2), `Sample.value` (1, a double) and `.timestamp` (2).
const LEN: u64 = 2;
const TIMESERIES: u64 = (1 << 3) | LEN;
const LABELS: u64 = (1 << 3) | LEN;
const SAMPLES: u64 = (2 << 3) | LEN;
const NAME: u64 = (1 << 3) | LEN;
const VALUE: u64 = (2 << 3) | LEN;
const SAMPLE_VALUE: u64 = (1 << 3) | 1;
const SAMPLE_TS: u64 = 2 << 3;

/// A series' labels as the repeated `labels` field of a `TimeSeries`.
pub fn encode_labels<'a>(labels: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in labels {
        let inner = 1
            + encoded_len_varint(name.len() as u64)
            + name.len()
            + 1
            + encoded_len_varint(value.len() as u64)
            + value.len();
        encode_varint(LABELS, &mut out);
        encode_varint(inner as u64, &mut out);
        encode_varint(NAME, &mut out);
        encode_varint(name.len() as u64, &mut out);
        out.extend_from_slice(name.as_bytes());
        encode_varint(VALUE, &mut out);
        encode_varint(value.len() as u64, &mut out);
        out.extend_from_slice(value.as_bytes());
    }
    out
}

fn sample_len(t: i64) -> usize {
    // The value always (8 bytes), the timestamp always: prost leaves zeros out, and a
    // receiver reads an explicit zero as the same.
    1 + 8 + 1 + encoded_len_varint(t as u64)
}

/// Appends one `TimeSeries` of pre-encoded `labels` and the samples `(t, value bits)` to a
/// `WriteRequest` being written in `out`.
pub fn append_series(out: &mut Vec<u8>, labels: &[u8], samples: &[(i64, u64)]) {
    let body: usize = labels.len()
        + samples
            .iter()
            .map(|&(t, _)| {
                let inner = sample_len(t);
                1 + encoded_len_varint(inner as u64) + inner
            })
            .sum::<usize>();
    encode_varint(TIMESERIES, out);
    encode_varint(body as u64, out);
    out.extend_from_slice(labels);
    for &(t, v) in samples {
        encode_varint(SAMPLES, out);
        encode_varint(sample_len(t) as u64, out);
        encode_varint(SAMPLE_VALUE, out);
        out.extend_from_slice(&v.to_le_bytes());
        encode_varint(SAMPLE_TS, out);
        encode_varint(t as u64, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use strata_proto::prometheus as prompb;

    #[test]
    fn the_bytes_decode_as_prost_reads_a_write_request() {
        let labels = [("__name__", "DCGM_FI_DEV_GPU_TEMP"), ("gpu", "0"), ("Hostname", "node-é")];
        let samples = [(0i64, 0f64.to_bits()), (1_733_150_000_123, 61.5f64.to_bits()), (-5, f64::NAN.to_bits())];
        let mut out = Vec::new();
        let encoded = encode_labels(labels.iter().copied());
        append_series(&mut out, &encoded, &samples);
        append_series(&mut out, &encode_labels([("a", "")].into_iter()), &samples[1..2]);
        let req = prompb::WriteRequest::decode(&out[..]).unwrap();
        assert_eq!(req.timeseries.len(), 2);
        let ts = &req.timeseries[0];
        let got: Vec<(&str, &str)> = ts.labels.iter().map(|l| (l.name.as_str(), l.value.as_str())).collect();
        assert_eq!(got, labels);
        let got: Vec<(i64, u64)> = ts.samples.iter().map(|s| (s.timestamp, s.value.to_bits())).collect();
        assert_eq!(got, samples);
        assert_eq!(req.timeseries[1].labels[0].value, "");
        // Without zeros, the bytes are prost's own.
        let mut ours = Vec::new();
        append_series(&mut ours, &encoded, &samples[1..2]);
        let theirs = prompb::WriteRequest {
            timeseries: vec![prompb::TimeSeries {
                labels: labels
                    .iter()
                    .map(|(n, v)| prompb::Label { name: n.to_string(), value: v.to_string() })
                    .collect(),
                samples: vec![prompb::Sample { value: 61.5, timestamp: 1_733_150_000_123 }],
                exemplars: vec![],
            }],
            metadata: vec![],
        };
        assert_eq!(ours, theirs.encode_to_vec());
    }
}
