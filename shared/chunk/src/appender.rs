//! The open chunk: samples appended one at a time in the streaming encoding.

use crate::bits::BitWriter;
use crate::rice::{write_escape, write_long, write_rice, zigzag};
use crate::scale::{decimal_scale, scaled_at};
use crate::sealed::Chunk;
use crate::timestamp::TsState;
use crate::value::ValueState;
use crate::CHUNK_MAX_SAMPLES;
use std::sync::Arc;

/// An open chunk that accepts samples in time order.
#[derive(Debug, Clone)]
pub struct ChunkAppender {
    pub(crate) w: BitWriter,
    pub(crate) ts: TsState,
    pub(crate) vs: ValueState,
    pub(crate) n: u16,
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
        ChunkAppender { w, ts: TsState::new(0), vs: ValueState::default(), n: 0 }
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
        self.ts.t0
    }

    pub fn max_t(&self) -> i64 {
        self.ts.prev_t
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
            write_long(&mut self.w, zigzag(t));
            write_first_value(&mut self.w, &mut self.vs, v, scale);
            self.ts = TsState::new(t);
            self.n = 1;
            return;
        }
        self.ts.encode(&mut self.w, t);
        write_value(&mut self.w, &mut self.vs, v);
        self.n += 1;
    }

    /// Freezes the data written so far into an immutable chunk.
    pub fn seal(&self) -> Chunk {
        Chunk { data: Arc::from(self.w.to_bytes()), n: self.n, min_t: self.ts.t0, max_t: self.ts.prev_t }
    }
}

/// A chunk's first value after its scale: a scaled decimal when exact, else the float's
/// bits. Sets the value state's scale and history.
pub(crate) fn write_first_value(w: &mut BitWriter, vs: &mut ValueState, v: f64, scale: u32) {
    match scaled_at(v, scale) {
        Some(s) => {
            w.write_bit(true);
            write_long(w, zigzag(s));
        }
        None => {
            w.write_bit(false);
            w.write_bits(v.to_bits(), 64);
        }
    }
    vs.scale = scale;
    vs.after(v, scaled_at(v, scale));
}

/// Every later value: a Rice-coded residual of the best decimal predictor, or (escaped)
/// Gorilla's XOR against the previous value.
#[inline(always)]
pub(crate) fn write_value(w: &mut BitWriter, vs: &mut ValueState, v: f64) {
    let mut scaled = scaled_at(v, vs.scale);
    if vs.hist_len > 0 {
        if scaled.is_none() {
            // A finer decimal (the chunk's first value had trailing zeros): rescale.
            if let Some(k) = decimal_scale(v).filter(|&k| k > vs.scale) {
                let before = vs.clone();
                if vs.rescale(k) {
                    write_escape(w);
                    w.write_bits(0b11, 2);
                    w.write_bits(k as u64, 3);
                    scaled = scaled_at(v, k);
                } else {
                    *vs = before;
                }
            }
        }
        match scaled {
            Some(s) => {
                let order = vs.best_order();
                let z = zigzag(s.wrapping_sub(vs.prediction(order)));
                write_rice(w, z, vs.means[order].k());
            }
            None => {
                write_escape(w);
                w.write_bits(0b10, 2);
                write_xor(w, vs, v.to_bits());
            }
        }
    } else {
        // No decimal history: the float goes XOR-coded, no marker needed.
        write_xor(w, vs, v.to_bits());
    }
    vs.after(v, scaled);
}

fn write_xor(w: &mut BitWriter, vs: &mut ValueState, bits: u64) {
    let x = bits ^ vs.prev_bits;
    if x == 0 {
        w.write_bit(false);
        return;
    }
    w.write_bit(true);
    let leading = x.leading_zeros().min(31);
    let trailing = x.trailing_zeros();
    let (wl, wt) = (vs.leading as u32, vs.trailing as u32);
    if vs.xor_window_set && leading >= wl && trailing >= wt {
        w.write_bit(false);
        w.write_bits(x >> wt, 64 - wl - wt);
    } else {
        w.write_bit(true);
        let sig = 64 - leading - trailing;
        w.write_bits(leading as u64, 5);
        // 64 significant bits are written as 0: sig is never 0 here.
        w.write_bits((sig % 64) as u64, 6);
        w.write_bits(x >> trailing, sig);
        vs.leading = leading as u8;
        vs.trailing = trailing as u8;
        vs.xor_window_set = true;
    }
}
