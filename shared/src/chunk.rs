//! Per-series compressed chunks, appended sample by sample.
//!
//! Timestamps are delta-of-delta coded (Gorilla) with a short 8-bit bucket first, because
//! real scrapes carry a few milliseconds of jitter that Prometheus' 14-bit bucket wastes.
//! Values take one of two paths, chosen per sample with a one-bit tag:
//!
//! * **decimal**: when this and the previous value are exact decimals at the chunk's scale
//!   (`v == round(v·10^k)/10^k`, `k` fixed by the chunk's first value, 0..=6), the scaled
//!   integers are delta-of-delta coded. DCGM prints gauges with fixed decimals and counters as
//!   integers, so almost every sample takes this path; decoding divides by `10^k`, which
//!   returns bit-identical floats.
//! * **xor**: everything else (NaN, the stale marker, ±Inf, values needing more digits) uses
//!   Gorilla's XOR of the float bits against the previous value.
//!
//! A chunk is sealed at [`CHUNK_MAX_SAMPLES`]; sealed chunks are immutable byte strings
//! that can be shipped between tiers as they are.

use crate::model::Sample;
use std::sync::Arc;

/// Samples per chunk before it is sealed (Prometheus uses 120).
pub const CHUNK_MAX_SAMPLES: u16 = 240;
const MAX_SCALE: u32 = 6;
const POW10: [f64; 7] = [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6];
/// Largest scaled integer that still maps back to an exact float.
const MAX_EXACT: f64 = 9_007_199_254_740_992.0; // 2^53

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ChunkError {
    #[error("chunk data ends early after {0} samples")]
    Truncated(u16),
    #[error("chunk encoding {0} is unknown")]
    UnknownEncoding(u8),
}

/// Smallest scale `k` at which `v` is an exact decimal, if any.
fn decimal_scale(v: f64) -> Option<u32> {
    if !v.is_finite() {
        return None;
    }
    (0..=MAX_SCALE).find(|&k| scaled_at(v, k).is_some())
}

/// `v·10^k` as an integer when that round-trips exactly.
fn scaled_at(v: f64, k: u32) -> Option<i64> {
    if !v.is_finite() {
        return None;
    }
    let p = POW10[k as usize];
    let s = (v * p).round();
    if s.abs() >= MAX_EXACT {
        return None;
    }
    // Compare through the integer so that -0.0 (which would come back as +0.0) is refused.
    let i = s as i64;
    (unscale(i, k).to_bits() == v.to_bits()).then_some(i)
}

fn unscale(s: i64, k: u32) -> f64 {
    s as f64 / POW10[k as usize]
}

// ---- bit I/O ----

#[derive(Debug, Clone, Default)]
struct BitWriter {
    bytes: Vec<u8>,
    /// Bits used in the last byte (0 = the last byte is full or there is none).
    used: u8,
}

impl BitWriter {
    fn write_bit(&mut self, bit: bool) {
        if self.used == 0 {
            self.bytes.push(0);
        }
        if bit {
            let last = self.bytes.len() - 1;
            self.bytes[last] |= 0x80 >> self.used;
        }
        self.used = (self.used + 1) % 8;
    }

    fn write_bits(&mut self, value: u64, n: u32) {
        let mut remaining = n;
        while remaining > 0 {
            if self.used == 0 {
                self.bytes.push(0);
            }
            let free = 8 - self.used as u32;
            let take = free.min(remaining);
            let shift = remaining - take;
            let chunk = ((value >> shift) & ((1u64 << take) - 1)) as u8;
            let last = self.bytes.len() - 1;
            self.bytes[last] |= chunk << (free - take);
            self.used = ((self.used as u32 + take) % 8) as u8;
            remaining -= take;
        }
    }
}

#[derive(Debug, Clone)]
struct BitReader<'a> {
    bytes: &'a [u8],
    pos: usize, // in bits
}

impl<'a> BitReader<'a> {
    fn read_bit(&mut self) -> Option<bool> {
        let byte = *self.bytes.get(self.pos / 8)?;
        let bit = byte & (0x80 >> (self.pos % 8)) != 0;
        self.pos += 1;
        Some(bit)
    }

    fn read_bits(&mut self, n: u32) -> Option<u64> {
        if self.pos + n as usize > self.bytes.len() * 8 {
            return None;
        }
        let mut v = 0u64;
        let mut remaining = n;
        while remaining > 0 {
            let byte = self.bytes[self.pos / 8];
            let offset = (self.pos % 8) as u32;
            let avail = 8 - offset;
            let take = avail.min(remaining);
            let bits = (byte >> (avail - take)) & ((1u16 << take) - 1) as u8;
            v = (v << take) | bits as u64;
            self.pos += take as usize;
            remaining -= take;
        }
        Some(v)
    }
}

// ---- bucketed signed integers ----

/// (prefix bits, prefix length, payload bits) per bucket; the last bucket holds any i64.
const TS_BUCKETS: [(u64, u32, u32); 5] = [(0b0, 1, 0), (0b10, 2, 8), (0b110, 3, 14), (0b1110, 4, 20), (0b1111, 4, 64)];
const INT_BUCKETS: [(u64, u32, u32); 6] =
    [(0b0, 1, 0), (0b10, 2, 7), (0b110, 3, 13), (0b1110, 4, 20), (0b11110, 5, 32), (0b11111, 5, 64)];

fn fits(v: i64, bits: u32) -> bool {
    if bits == 0 {
        return v == 0;
    }
    if bits >= 64 {
        return true;
    }
    let lo = -(1i64 << (bits - 1));
    let hi = (1i64 << (bits - 1)) - 1;
    (lo..=hi).contains(&v)
}

fn write_bucketed(w: &mut BitWriter, v: i64, buckets: &[(u64, u32, u32)]) {
    for &(prefix, plen, bits) in buckets {
        if fits(v, bits) {
            w.write_bits(prefix, plen);
            if bits > 0 {
                let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
                w.write_bits(v as u64 & mask, bits);
            }
            return;
        }
    }
}

fn read_bucketed(r: &mut BitReader, buckets: &[(u64, u32, u32)]) -> Option<i64> {
    let mut ones = 0usize;
    // Prefixes are unary: count leading ones up to the last bucket's length.
    let last = buckets.len() - 1;
    while ones < last {
        if !r.read_bit()? {
            break;
        }
        ones += 1;
    }
    let bits = buckets[ones].2;
    if bits == 0 {
        return Some(0);
    }
    let raw = r.read_bits(bits)?;
    if bits == 64 {
        return Some(raw as i64);
    }
    // sign-extend
    let shift = 64 - bits;
    Some(((raw << shift) as i64) >> shift)
}

// ---- appender ----

/// State shared by the encoder and the decoder: both derive it from the values they see,
/// so the decoder replays exactly the encoder's choices.
#[derive(Debug, Clone, Default)]
struct ValueState {
    scale: u32,
    prev_bits: u64,
    prev_scaled: Option<i64>,
    prev_delta: i64,
    leading: u32,
    trailing: u32,
    xor_window_set: bool,
}

impl ValueState {
    fn after(&mut self, v: f64, scaled: Option<i64>) {
        self.prev_delta = match (self.prev_scaled, scaled) {
            (Some(a), Some(b)) => b.wrapping_sub(a),
            _ => 0,
        };
        self.prev_scaled = scaled;
        self.prev_bits = v.to_bits();
    }
}

/// An open chunk that accepts samples in time order.
#[derive(Debug, Clone)]
pub struct ChunkAppender {
    w: BitWriter,
    n: u16,
    min_t: i64,
    prev_t: i64,
    prev_dt: i64,
    vs: ValueState,
}

impl Default for ChunkAppender {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkAppender {
    pub fn new() -> Self {
        ChunkAppender { w: BitWriter::default(), n: 0, min_t: 0, prev_t: 0, prev_dt: 0, vs: ValueState::default() }
    }

    pub fn len(&self) -> u16 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn is_full(&self) -> bool {
        self.n >= CHUNK_MAX_SAMPLES
    }

    pub fn min_t(&self) -> i64 {
        self.min_t
    }

    pub fn max_t(&self) -> i64 {
        self.prev_t
    }

    /// Bytes the encoded data occupies so far.
    pub fn byte_len(&self) -> usize {
        self.w.bytes.len()
    }

    /// Appends a sample. The caller guarantees `t` is greater than the previous timestamp.
    pub fn append(&mut self, t: i64, v: f64) {
        if self.n == 0 {
            let scale = decimal_scale(v).unwrap_or(0);
            self.w.write_bits(scale as u64, 3);
            self.w.write_bits(t as u64, 64);
            self.w.write_bits(v.to_bits(), 64);
            self.min_t = t;
            self.prev_t = t;
            self.vs.scale = scale;
            let scaled = scaled_at(v, scale);
            self.vs.after(v, scaled);
            self.n = 1;
            return;
        }
        let dt = t.wrapping_sub(self.prev_t);
        write_bucketed(&mut self.w, dt.wrapping_sub(self.prev_dt), &TS_BUCKETS);
        self.prev_dt = dt;
        self.prev_t = t;

        let scaled = scaled_at(v, self.vs.scale);
        match (self.vs.prev_scaled, scaled) {
            (Some(p), Some(s)) => {
                self.w.write_bit(false);
                let delta = s.wrapping_sub(p);
                write_bucketed(&mut self.w, delta.wrapping_sub(self.vs.prev_delta), &INT_BUCKETS);
            }
            _ => {
                self.w.write_bit(true);
                self.write_xor(v.to_bits());
            }
        }
        self.vs.after(v, scaled);
        self.n += 1;
    }

    fn write_xor(&mut self, bits: u64) {
        let x = bits ^ self.vs.prev_bits;
        if x == 0 {
            self.w.write_bit(false);
            return;
        }
        self.w.write_bit(true);
        let leading = x.leading_zeros().min(31);
        let trailing = x.trailing_zeros();
        if self.vs.xor_window_set && leading >= self.vs.leading && trailing >= self.vs.trailing {
            self.w.write_bit(false);
            let sig = 64 - self.vs.leading - self.vs.trailing;
            self.w.write_bits(x >> self.vs.trailing, sig);
        } else {
            self.w.write_bit(true);
            let sig = 64 - leading - trailing;
            self.w.write_bits(leading as u64, 5);
            // 64 significant bits are written as 0: sig is never 0 here.
            self.w.write_bits((sig % 64) as u64, 6);
            self.w.write_bits(x >> trailing, sig);
            self.vs.leading = leading;
            self.vs.trailing = trailing;
            self.vs.xor_window_set = true;
        }
    }

    /// Freezes the data written so far into an immutable chunk.
    pub fn seal(&self) -> Chunk {
        Chunk { data: Arc::from(self.w.bytes.as_slice()), n: self.n, min_t: self.min_t, max_t: self.prev_t }
    }

    /// Iterates the samples appended so far.
    pub fn iter(&self) -> ChunkIter<'_> {
        ChunkIter::new(&self.w.bytes, self.n)
    }
}

/// A sealed chunk: encoded bytes plus what a reader needs to skip it without decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub data: Arc<[u8]>,
    pub n: u16,
    pub min_t: i64,
    pub max_t: i64,
}

impl Chunk {
    pub fn iter(&self) -> ChunkIter<'_> {
        ChunkIter::new(&self.data, self.n)
    }

    /// Decodes every sample, failing on damaged data instead of returning garbage.
    pub fn decode(&self) -> Result<Vec<Sample>, ChunkError> {
        let mut it = self.iter();
        let mut out = Vec::with_capacity(self.n as usize);
        for s in it.by_ref() {
            out.push(s);
        }
        match it.error() {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    pub fn overlaps(&self, mint: i64, maxt: i64) -> bool {
        self.min_t <= maxt && self.max_t >= mint
    }
}

/// Decodes a chunk's samples in order. Damaged data ends the iteration; `error()` tells.
pub struct ChunkIter<'a> {
    r: BitReader<'a>,
    n: u16,
    read: u16,
    prev_t: i64,
    prev_dt: i64,
    vs: ValueState,
    err: Option<ChunkError>,
}

impl<'a> ChunkIter<'a> {
    fn new(bytes: &'a [u8], n: u16) -> Self {
        ChunkIter { r: BitReader { bytes, pos: 0 }, n, read: 0, prev_t: 0, prev_dt: 0, vs: ValueState::default(), err: None }
    }

    pub fn error(&self) -> Option<ChunkError> {
        self.err.clone()
    }

    fn read_first(&mut self) -> Option<Sample> {
        let scale = self.r.read_bits(3)? as u32;
        let t = self.r.read_bits(64)? as i64;
        let v = f64::from_bits(self.r.read_bits(64)?);
        self.vs.scale = scale.min(MAX_SCALE);
        self.prev_t = t;
        let scaled = scaled_at(v, self.vs.scale);
        self.vs.after(v, scaled);
        Some(Sample { t, v })
    }

    fn read_next(&mut self) -> Option<Sample> {
        let dod = read_bucketed(&mut self.r, &TS_BUCKETS)?;
        let dt = self.prev_dt.wrapping_add(dod);
        let t = self.prev_t.wrapping_add(dt);
        self.prev_dt = dt;
        self.prev_t = t;
        let v = if !self.r.read_bit()? {
            let prev = self.vs.prev_scaled?;
            let ddelta = read_bucketed(&mut self.r, &INT_BUCKETS)?;
            let s = prev.wrapping_add(self.vs.prev_delta.wrapping_add(ddelta));
            unscale(s, self.vs.scale)
        } else {
            f64::from_bits(self.read_xor()?)
        };
        let scaled = scaled_at(v, self.vs.scale);
        self.vs.after(v, scaled);
        Some(Sample { t, v })
    }

    fn read_xor(&mut self) -> Option<u64> {
        if !self.r.read_bit()? {
            return Some(self.vs.prev_bits);
        }
        if self.r.read_bit()? {
            let leading = self.r.read_bits(5)? as u32;
            let mut sig = self.r.read_bits(6)? as u32;
            if sig == 0 {
                sig = 64;
            }
            if leading + sig > 64 {
                return None;
            }
            self.vs.leading = leading;
            self.vs.trailing = 64 - leading - sig;
            self.vs.xor_window_set = true;
        } else if !self.vs.xor_window_set {
            return None;
        }
        let sig = 64 - self.vs.leading - self.vs.trailing;
        let bits = self.r.read_bits(sig)?;
        Some(self.vs.prev_bits ^ (bits << self.vs.trailing))
    }
}

impl Iterator for ChunkIter<'_> {
    type Item = Sample;

    fn next(&mut self) -> Option<Sample> {
        if self.read >= self.n || self.err.is_some() {
            return None;
        }
        let s = if self.read == 0 { self.read_first() } else { self.read_next() };
        match s {
            Some(s) => {
                self.read += 1;
                Some(s)
            }
            None => {
                self.err = Some(ChunkError::Truncated(self.read));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{stale_nan, STALE_NAN_BITS};

    fn roundtrip(samples: &[Sample]) -> usize {
        let mut a = ChunkAppender::new();
        for s in samples {
            a.append(s.t, s.v);
        }
        let c = a.seal();
        let back = c.decode().expect("decodes");
        assert_eq!(back.len(), samples.len());
        for (x, y) in samples.iter().zip(&back) {
            assert!(x.bit_eq(y), "{x:?} != {y:?}");
        }
        // the open appender reads the same
        assert_eq!(a.iter().count(), samples.len());
        c.data.len()
    }

    /// xorshift64*: deterministic test data without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    #[test]
    fn random_floats_and_times_roundtrip() {
        let mut r = Rng(42);
        for _ in 0..50 {
            let mut t = (r.next() % 1_000_000_000) as i64;
            let mut v = Vec::new();
            for _ in 0..CHUNK_MAX_SAMPLES {
                t += 1 + (r.next() % 100_000) as i64;
                v.push(Sample::new(t, f64::from_bits(r.next())));
            }
            roundtrip(&v);
        }
    }

    #[test]
    fn adversarial_values_roundtrip() {
        let vals = [
            0.0,
            -0.0,
            f64::NAN,
            stale_nan(),
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e308,
            -1e308,
            f64::MIN_POSITIVE,
            5e-324,
            9_223_372_036_854_775_794.0,
            1.0,
            612.318,
            612.319,
            1e15,
            -1e15,
            0.1,
            0.2,
            0.30000000000000004,
            f64::from_bits(0x7ff8_0000_0000_0001),
            123456.789012,
            1.0,
            1.0,
        ];
        let samples: Vec<_> = vals.iter().enumerate().map(|(i, &v)| Sample::new(i as i64 * 15_000, v)).collect();
        roundtrip(&samples);
        let back = {
            let mut a = ChunkAppender::new();
            samples.iter().for_each(|s| a.append(s.t, s.v));
            a.seal().decode().unwrap()
        };
        assert_eq!(back[3].v.to_bits(), STALE_NAN_BITS);
    }

    #[test]
    fn huge_time_jumps_and_negative_times_roundtrip() {
        let ts = [i64::MIN / 4, -1, 0, 1, 2, 1 << 40, (1 << 40) + 1, i64::MAX / 4, i64::MAX / 4 + 5000];
        let samples: Vec<_> = ts.iter().map(|&t| Sample::new(t, t as f64)).collect();
        roundtrip(&samples);
    }

    #[test]
    fn decimal_gauges_compress_well() {
        // a power reading with three decimals, scraped every 5 s with ms jitter
        let mut r = Rng(7);
        let mut samples = Vec::new();
        let mut t = 1_700_000_000_000i64;
        for i in 0..CHUNK_MAX_SAMPLES as i64 {
            t += 5000 + (r.next() % 20) as i64 - 10;
            let milli = 600_000 + (r.next() % 2000) as i64 + i;
            samples.push(Sample::new(t, milli as f64 / 1000.0));
        }
        let bytes = roundtrip(&samples);
        let per = bytes as f64 / samples.len() as f64;
        assert!(per < 3.5, "power gauge took {per} bytes/sample");
        // an integer counter with a steady rate: almost nothing per sample
        let samples: Vec<_> = (0..CHUNK_MAX_SAMPLES as i64).map(|i| Sample::new(i * 5000, (31_035_686_671 + i * 3_000_000) as f64)).collect();
        let bytes = roundtrip(&samples);
        assert!(bytes < 120, "steady counter took {bytes} bytes");
    }

    #[test]
    fn truncated_data_is_an_error_not_garbage() {
        let mut a = ChunkAppender::new();
        for i in 0..100 {
            a.append(i * 1000, (i as f64).sin());
        }
        let c = a.seal();
        let cut = Chunk { data: Arc::from(&c.data[..c.data.len() / 2]), ..c.clone() };
        assert!(matches!(cut.decode(), Err(ChunkError::Truncated(_))));
    }
}
