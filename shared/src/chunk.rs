//! Per-series compressed chunks, appended sample by sample.
//!
//! Every sample after a chunk's first is coded as a residual against a prediction, with an
//! adaptive Rice code whose parameter follows the running mean of recent residuals (so a
//! steady series costs about a bit per value and a noisy one about its entropy, with no
//! per-chunk tuning and no bits spent on the parameter):
//!
//! * **timestamps**: delta of delta. Regular scrapes cost 1 bit; millisecond jitter a few.
//! * **values, decimal path**: when this and the previous values are exact decimals at the
//!   chunk's scale (`v == round(v·10^k)/10^k`, `k` fixed by the first value, 0..=6), the
//!   scaled integers are predicted by FLAC's fixed polynomial predictors of order 1 to 3
//!   (last value, linear, quadratic), picking per sample the order whose recent residuals
//!   were smallest: gauges with noise use order 1, counters with a steady rate order 2,
//!   smooth counters order 3. DCGM prints gauges with fixed decimals and counters as
//!   integers, so nearly every sample takes this path; decoding divides by `10^k`, which
//!   returns bit-identical floats.
//! * **values, XOR path**: NaN, the stale marker, ±Inf and values needing more digits use
//!   Gorilla's XOR against the previous value, announced by an escape in the Rice code.
//!
//! Encoder and decoder derive all adaptive state from the samples themselves, so the
//! decoder replays the encoder's choices exactly. A chunk is sealed at
//! [`CHUNK_MAX_SAMPLES`]; sealed chunks are immutable byte strings that travel between
//! tiers as they are.

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

/// Bits are written most significant first into a 64-bit accumulator and moved to the
/// byte vector whole bytes at a time.
#[derive(Debug, Clone, Default)]
struct BitWriter {
    bytes: Vec<u8>,
    acc: u64,
    /// Bits pending in `acc` (always < 8 between calls).
    nacc: u32,
}

fn low_mask(n: u32) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

impl BitWriter {
    fn write_bit(&mut self, bit: bool) {
        self.write_bits(bit as u64, 1);
    }

    fn write_bits(&mut self, value: u64, n: u32) {
        if n > 32 {
            self.write_bits(value >> 32, n - 32);
            self.write_bits(value, 32);
            return;
        }
        if n == 0 {
            return;
        }
        self.acc = (self.acc << n) | (value & low_mask(n));
        self.nacc += n;
        while self.nacc >= 8 {
            self.nacc -= 8;
            self.bytes.push((self.acc >> self.nacc) as u8);
        }
        self.acc &= low_mask(self.nacc);
    }

    fn len(&self) -> usize {
        self.bytes.len() + (self.nacc > 0) as usize
    }

    /// The bytes written so far, the last one padded with zero bits.
    fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.bytes);
        if self.nacc > 0 {
            v.push((self.acc << (8 - self.nacc)) as u8);
        }
        v
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

// ---- adaptive Rice codes ----

/// Unary runs this long mean "escape": what follows is not a Rice remainder.
const ESCAPE: u64 = 24;

fn zigzag(x: i64) -> u64 {
    ((x << 1) ^ (x >> 63)) as u64
}

fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Running mean of zigzagged residuals, as 16×mean, from which the Rice parameter follows.
/// Encoder and decoder update it identically, so `k` needs no bits.
#[derive(Debug, Clone, Copy)]
struct Mean(u64);

impl Default for Mean {
    fn default() -> Self {
        Mean(16 * 8)
    }
}

impl Mean {
    fn update(&mut self, z: u64) {
        self.0 = self.0 - (self.0 >> 4) + z.min(u64::MAX >> 8);
    }
    /// Rice parameter ≈ log2(0.69 · mean), near-optimal for geometric-like residuals.
    fn k(&self) -> u32 {
        let x = (self.0 >> 4).saturating_mul(11) >> 4;
        (64 - x.leading_zeros()).min(62)
    }
}

/// Writes `z` with Rice parameter `k`, or an escape when the quotient is too long.
fn write_rice(w: &mut BitWriter, z: u64, k: u32) {
    let q = z >> k;
    if q < ESCAPE {
        w.write_bits((1u64 << q) - 1, q as u32);
        w.write_bit(false);
        w.write_bits(z & ((1u64 << k) - 1), k);
    } else {
        write_escape(w);
        w.write_bit(false);
        write_long(w, z);
    }
}

fn write_escape(w: &mut BitWriter) {
    w.write_bits((1u64 << ESCAPE) - 1, ESCAPE as u32);
}

/// A value of any size: its bit length in 7 bits, then the bits.
fn write_long(w: &mut BitWriter, z: u64) {
    let len = 64 - z.leading_zeros();
    w.write_bits(len as u64, 7);
    w.write_bits(z, len);
}

fn read_long(r: &mut BitReader) -> Option<u64> {
    let len = r.read_bits(7)? as u32;
    if len > 64 {
        return None;
    }
    r.read_bits(len)
}

enum RiceRead {
    Value(u64),
    /// The escape was followed by a 1: the caller's alternative encoding follows.
    Alternative,
}

fn read_rice(r: &mut BitReader, k: u32) -> Option<RiceRead> {
    let mut q = 0u64;
    while q < ESCAPE {
        if !r.read_bit()? {
            let rem = r.read_bits(k)?;
            return Some(RiceRead::Value((q << k) | rem));
        }
        q += 1;
    }
    if r.read_bit()? {
        return Some(RiceRead::Alternative);
    }
    read_long(r).map(RiceRead::Value)
}

// ---- appender ----

/// Prediction orders of the decimal path: previous value, linear, quadratic extrapolation
/// (FLAC's fixed predictors 1–3). The order with the smallest running residual is used.
const ORDERS: usize = 3;

/// State shared by the encoder and the decoder: both derive it from the values they see,
/// so the decoder replays exactly the encoder's choices.
#[derive(Debug, Clone, Default)]
struct ValueState {
    scale: u32,
    prev_bits: u64,
    /// Last scaled values, newest first; `hist_len` of them are valid.
    hist: [i64; ORDERS],
    hist_len: usize,
    means: [Mean; ORDERS],
    leading: u32,
    trailing: u32,
    xor_window_set: bool,
}

impl ValueState {
    fn prediction(&self, order: usize) -> i64 {
        let h = &self.hist;
        match order {
            0 => h[0],
            1 => h[0].wrapping_mul(2).wrapping_sub(h[1]),
            _ => h[0].wrapping_mul(3).wrapping_sub(h[1].wrapping_mul(3)).wrapping_add(h[2]),
        }
    }

    /// The order to use next: the available one with the smallest running residual.
    fn best_order(&self) -> usize {
        (0..self.hist_len.min(ORDERS)).min_by_key(|&o| self.means[o].0).unwrap_or(0)
    }

    /// Moves the decimal path to a finer scale, multiplying the history exactly. False
    /// (and nothing changed) when the history would no longer be exact.
    fn rescale(&mut self, to: u32) -> bool {
        if to <= self.scale || to > MAX_SCALE {
            return false;
        }
        let f = 10i64.pow(to - self.scale);
        let mut hist = self.hist;
        for h in hist.iter_mut().take(self.hist_len) {
            match h.checked_mul(f) {
                Some(x) if (x as f64).abs() < MAX_EXACT => *h = x,
                _ => return false,
            }
        }
        self.hist = hist;
        for m in &mut self.means {
            m.0 = m.0.saturating_mul(f as u64).min(u64::MAX >> 8);
        }
        self.scale = to;
        true
    }

    fn after(&mut self, v: f64, scaled: Option<i64>) {
        match scaled {
            Some(s) => {
                for o in 0..self.hist_len.min(ORDERS) {
                    let z = zigzag(s.wrapping_sub(self.prediction(o)));
                    self.means[o].update(z);
                }
                self.hist = [s, self.hist[0], self.hist[1]];
                self.hist_len = (self.hist_len + 1).min(ORDERS);
            }
            None => self.hist_len = 0,
        }
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
    ts_mean: Mean,
    vs: ValueState,
}

impl Default for ChunkAppender {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkAppender {
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An appender whose buffer starts at `bytes`, e.g. the size of the series' last chunk,
    /// so a chunk is allocated once instead of grown by doubling.
    pub fn with_capacity(bytes: usize) -> Self {
        let w = BitWriter { bytes: Vec::with_capacity(bytes), ..Default::default() };
        ChunkAppender { w, n: 0, min_t: 0, prev_t: 0, prev_dt: 0, ts_mean: Mean::default(), vs: ValueState::default() }
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
        self.w.len()
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
        if self.n == 1 {
            // The first delta is an interval, not a delta of delta: keep it out of the mean.
            write_long(&mut self.w, zigzag(dt));
        } else {
            let z = zigzag(dt.wrapping_sub(self.prev_dt));
            write_rice(&mut self.w, z, self.ts_mean.k());
            self.ts_mean.update(z);
        }
        self.prev_dt = dt;
        self.prev_t = t;

        let mut scaled = scaled_at(v, self.vs.scale);
        if self.vs.hist_len > 0 {
            if scaled.is_none() {
                // A finer decimal (the chunk's first value had trailing zeros): rescale.
                if let Some(k) = decimal_scale(v).filter(|&k| k > self.vs.scale) {
                    let before = self.vs.clone();
                    if self.vs.rescale(k) {
                        write_escape(&mut self.w);
                        self.w.write_bits(0b11, 2);
                        self.w.write_bits(k as u64, 3);
                        scaled = scaled_at(v, k);
                    } else {
                        self.vs = before;
                    }
                }
            }
            match scaled {
                Some(s) => {
                    let order = self.vs.best_order();
                    let z = zigzag(s.wrapping_sub(self.vs.prediction(order)));
                    write_rice(&mut self.w, z, self.vs.means[order].k());
                }
                None => {
                    write_escape(&mut self.w);
                    self.w.write_bits(0b10, 2);
                    self.write_xor(v.to_bits());
                }
            }
        } else {
            // No decimal history: the float goes XOR-coded, no marker needed.
            self.write_xor(v.to_bits());
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
        Chunk { data: Arc::from(self.w.to_bytes()), n: self.n, min_t: self.min_t, max_t: self.prev_t }
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
    ts_mean: Mean,
    vs: ValueState,
    err: Option<ChunkError>,
}

impl<'a> ChunkIter<'a> {
    fn new(bytes: &'a [u8], n: u16) -> Self {
        ChunkIter { r: BitReader { bytes, pos: 0 }, n, read: 0, prev_t: 0, prev_dt: 0, ts_mean: Mean::default(), vs: ValueState::default(), err: None }
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
        let dt = if self.read == 1 {
            unzigzag(read_long(&mut self.r)?)
        } else {
            let z = match read_rice(&mut self.r, self.ts_mean.k())? {
                RiceRead::Value(z) => z,
                RiceRead::Alternative => return None,
            };
            self.ts_mean.update(z);
            self.prev_dt.wrapping_add(unzigzag(z))
        };
        let t = self.prev_t.wrapping_add(dt);
        self.prev_dt = dt;
        self.prev_t = t;
        let v = if self.vs.hist_len > 0 {
            let order = self.vs.best_order();
            match read_rice(&mut self.r, self.vs.means[order].k())? {
                RiceRead::Value(z) => unscale(self.vs.prediction(order).wrapping_add(unzigzag(z)), self.vs.scale),
                RiceRead::Alternative if self.r.read_bit()? => {
                    let k = self.r.read_bits(3)? as u32;
                    if !self.vs.rescale(k) {
                        return None;
                    }
                    let order = self.vs.best_order();
                    match read_rice(&mut self.r, self.vs.means[order].k())? {
                        RiceRead::Value(z) => unscale(self.vs.prediction(order).wrapping_add(unzigzag(z)), self.vs.scale),
                        RiceRead::Alternative => return None,
                    }
                }
                RiceRead::Alternative => f64::from_bits(self.read_xor()?),
            }
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
    fn random_decimals_at_mixed_scales_roundtrip() {
        let mut r = Rng(99);
        for _ in 0..200 {
            let mut t = 0i64;
            let v: Vec<_> = (0..CHUNK_MAX_SAMPLES)
                .map(|_| {
                    t += 1 + (r.next() % 30_000) as i64;
                    let scale = (r.next() % 8) as i32;
                    let x = match r.next() % 20 {
                        0 => f64::NAN,
                        1 => stale_nan(),
                        2 => (r.next() % 1_000_000_000_000) as f64,
                        _ => ((r.next() % 2_000_000) as i64 - 1_000_000) as f64 / 10f64.powi(scale),
                    };
                    Sample::new(t, x)
                })
                .collect();
            roundtrip(&v);
        }
    }

    #[test]
    fn a_first_value_with_trailing_zeros_does_not_fix_the_scale() {
        // 612.310 prints as 612.31: the chunk starts at scale 2, then meets 3 decimals.
        let vals = [612.31, 612.318, 613.2, 611.999, 700.0, 0.001, 1e-6, 612.3185, 5e15, 1.5];
        let samples: Vec<_> = vals.iter().enumerate().map(|(i, &v)| Sample::new(i as i64 * 5000, v)).collect();
        roundtrip(&samples);
        let noisy: Vec<_> = (0..240).map(|i| Sample::new(i * 5000, if i == 0 { 612.31 } else { 600.0 + ((i * 7919) % 10000) as f64 / 1000.0 })).collect();
        let bytes = roundtrip(&noisy);
        assert!(bytes < 240 * 3, "rescaled chunk took {bytes} bytes");
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
