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
    w: BitWriter,
    ts: TsState,
    vs: ValueState,
    n: u16,
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
            // The first value: a scaled decimal when exact, else the float's bits.
            match scaled_at(v, scale) {
                Some(s) => {
                    self.w.write_bit(true);
                    write_long(&mut self.w, zigzag(s));
                }
                None => {
                    self.w.write_bit(false);
                    self.w.write_bits(v.to_bits(), 64);
                }
            }
            self.ts = TsState::new(t);
            self.vs.scale = scale;
            let scaled = scaled_at(v, scale);
            self.vs.after(v, scaled);
            self.n = 1;
            return;
        }
        self.ts.encode(&mut self.w, t);

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
        let (wl, wt) = (self.vs.leading as u32, self.vs.trailing as u32);
        if self.vs.xor_window_set && leading >= wl && trailing >= wt {
            self.w.write_bit(false);
            self.w.write_bits(x >> wt, 64 - wl - wt);
        } else {
            self.w.write_bit(true);
            let sig = 64 - leading - trailing;
            self.w.write_bits(leading as u64, 5);
            // 64 significant bits are written as 0: sig is never 0 here.
            self.w.write_bits((sig % 64) as u64, 6);
            self.w.write_bits(x >> trailing, sig);
            self.vs.leading = leading as u8;
            self.vs.trailing = trailing as u8;
            self.vs.xor_window_set = true;
        }
    }

    /// Freezes the data written so far into an immutable chunk.
    pub fn seal(&self) -> Chunk {
        Chunk { data: Arc::from(self.w.to_bytes()), n: self.n, min_t: self.ts.t0, max_t: self.ts.prev_t }
    }
}
