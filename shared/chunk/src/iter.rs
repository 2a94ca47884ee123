//! Decoding a chunk's samples in order, from either encoding.

use crate::bits::BitReader;
use crate::block;
use crate::rice::{read_long, read_rice, unzigzag, RiceRead};
use crate::scale::{scaled_at, unscale, MAX_EXACT, MAX_SCALE};
use crate::timestamp::TsState;
use crate::value::ValueState;
use crate::ChunkError;
use strata_model::Sample;

/// Decodes a chunk's samples in order. Damaged data ends the iteration; `error()` tells.
pub struct ChunkIter<'a> {
    /// A block-encoded chunk, decoded whole up front.
    block: Option<std::vec::IntoIter<Sample>>,
    r: BitReader<'a>,
    n: u16,
    read: u16,
    ts: TsState,
    vs: ValueState,
    pub(crate) err: Option<ChunkError>,
}

impl<'a> ChunkIter<'a> {
    pub(crate) fn new(bytes: &'a [u8], n: u16) -> Self {
        let mut it = ChunkIter {
            block: None,
            r: BitReader { bytes, pos: 0 },
            n,
            read: 0,
            ts: TsState::new(0),
            vs: ValueState::default(),
            err: None,
        };
        if block::is_block(bytes) {
            let mut samples = Vec::new();
            it.err = block::decode(bytes, n as usize, &mut samples).err();
            it.block = Some(samples.into_iter());
        }
        it
    }

    pub fn error(&self) -> Option<ChunkError> {
        self.err.clone()
    }

    fn read_first(&mut self) -> Option<Sample> {
        let scale = (self.r.read_bits(3) as u32).min(MAX_SCALE);
        let t = unzigzag(read_long(&mut self.r)?);
        let v = if self.r.read_bit() {
            unscale(unzigzag(read_long(&mut self.r)?), scale)
        } else {
            f64::from_bits(self.r.read_bits(64))
        };
        self.vs.scale = scale.min(MAX_SCALE);
        self.ts = TsState::new(t);
        let scaled = scaled_at(v, self.vs.scale);
        self.vs.after(v, scaled);
        Some(Sample { t, v })
    }

    #[inline(always)]
    fn read_next(&mut self) -> Option<Sample> {
        let t = self.ts.decode(&mut self.r)?;
        // The decimal path yields the scaled integer itself: no need to derive it again.
        let (v, scaled) = if self.vs.hist_len > 0 {
            let order = self.vs.best_order();
            match read_rice(&mut self.r, self.vs.means[order].k())? {
                RiceRead::Value(z) => {
                    let s = self.vs.prediction(order).wrapping_add(unzigzag(z));
                    (unscale(s, self.vs.scale), Some(s))
                }
                RiceRead::Alternative if self.r.read_bit() => {
                    let k = self.r.read_bits(3) as u32;
                    if !self.vs.rescale(k) {
                        return None;
                    }
                    let order = self.vs.best_order();
                    match read_rice(&mut self.r, self.vs.means[order].k())? {
                        RiceRead::Value(z) => {
                            let s = self.vs.prediction(order).wrapping_add(unzigzag(z));
                            (unscale(s, self.vs.scale), Some(s))
                        }
                        RiceRead::Alternative => return None,
                    }
                }
                RiceRead::Alternative => {
                    let v = f64::from_bits(self.read_xor()?);
                    (v, scaled_at(v, self.vs.scale))
                }
            }
        } else {
            let v = f64::from_bits(self.read_xor()?);
            (v, scaled_at(v, self.vs.scale))
        };
        // A decoded scaled integer is exact only if it maps back to the same float: damaged
        // data must not poison the history the next predictions use.
        let scaled = scaled.filter(|s| s.unsigned_abs() < MAX_EXACT as u64);
        self.vs.after(v, scaled);
        Some(Sample { t, v })
    }

    fn read_xor(&mut self) -> Option<u64> {
        if !self.r.read_bit() {
            return Some(self.vs.prev_bits);
        }
        if self.r.read_bit() {
            let leading = self.r.read_bits(5) as u32;
            let mut sig = self.r.read_bits(6) as u32;
            if sig == 0 {
                sig = 64;
            }
            if leading + sig > 64 {
                return None;
            }
            self.vs.leading = leading as u8;
            self.vs.trailing = (64 - leading - sig) as u8;
            self.vs.xor_window_set = true;
        } else if !self.vs.xor_window_set {
            return None;
        }
        let (wl, wt) = (self.vs.leading as u32, self.vs.trailing as u32);
        let bits = self.r.read_bits(64 - wl - wt);
        Some(self.vs.prev_bits ^ (bits << wt))
    }
}

impl ChunkIter<'_> {
    /// The next sample, or `None` at the end or on damage (recorded in `err`).
    #[inline(always)]
    pub(crate) fn step(&mut self) -> Option<Sample> {
        if let Some(b) = &mut self.block {
            return b.next();
        }
        if self.read >= self.n || self.err.is_some() {
            return None;
        }
        let s = if self.read == 0 { self.read_first() } else { self.read_next() };
        match s {
            Some(s) if !self.r.overrun() => {
                self.read += 1;
                Some(s)
            }
            _ => {
                self.err = Some(ChunkError::Truncated(self.read));
                None
            }
        }
    }
}

impl Iterator for ChunkIter<'_> {
    type Item = Sample;

    fn next(&mut self) -> Option<Sample> {
        self.step()
    }
}
