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
    pub(crate) r: BitReader<'a>,
    n: u16,
    pub(crate) read: u16,
    pub(crate) ts: TsState,
    pub(crate) vs: ValueState,
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

    /// A streaming-encoded chunk's decoder positioned after its first `read` samples: at
    /// bit `pos`, in the state an appender had there (see [`crate::resume`]).
    pub(crate) fn resumed(bytes: &'a [u8], n: u16, read: u16, pos: usize, ts: TsState, vs: ValueState) -> Self {
        ChunkIter { block: None, r: BitReader { bytes, pos }, n, read, ts, vs, err: None }
    }

    pub fn error(&self) -> Option<ChunkError> {
        self.err.clone()
    }

    fn read_first(&mut self) -> Option<Sample> {
        let scale = (self.r.read_bits(3) as u32).min(MAX_SCALE);
        let t = unzigzag(read_long(&mut self.r)?);
        let v = read_first_value(&mut self.r, &mut self.vs, scale)?;
        self.ts = TsState::new(t);
        Some(Sample { t, v })
    }

    #[inline(always)]
    fn read_next(&mut self) -> Option<Sample> {
        let t = self.ts.decode(&mut self.r)?;
        let v = read_value(&mut self.r, &mut self.vs)?;
        Some(Sample { t, v })
    }
}

/// The counterpart of `appender::write_first_value`.
pub(crate) fn read_first_value(r: &mut BitReader, vs: &mut ValueState, scale: u32) -> Option<f64> {
    let v = if r.read_bit() { unscale(unzigzag(read_long(r)?), scale) } else { f64::from_bits(r.read_bits(64)) };
    vs.scale = scale.min(MAX_SCALE);
    let scaled = scaled_at(v, vs.scale);
    vs.after(v, scaled);
    Some(v)
}

/// The counterpart of `appender::write_value`.
#[inline(always)]
pub(crate) fn read_value(r: &mut BitReader, vs: &mut ValueState) -> Option<f64> {
    // The decimal path yields the scaled integer itself: no need to derive it again.
    let (v, scaled) = if vs.hist_len > 0 {
        let order = vs.best_order();
        match read_rice(r, vs.means[order].k())? {
            RiceRead::Value(z) => {
                let s = vs.prediction(order).wrapping_add(unzigzag(z));
                (unscale(s, vs.scale), Some(s))
            }
            RiceRead::Alternative if r.read_bit() => {
                let k = r.read_bits(3) as u32;
                if !vs.rescale(k) {
                    return None;
                }
                let order = vs.best_order();
                match read_rice(r, vs.means[order].k())? {
                    RiceRead::Value(z) => {
                        let s = vs.prediction(order).wrapping_add(unzigzag(z));
                        (unscale(s, vs.scale), Some(s))
                    }
                    RiceRead::Alternative => return None,
                }
            }
            RiceRead::Alternative => {
                let v = f64::from_bits(read_xor(r, vs)?);
                (v, scaled_at(v, vs.scale))
            }
        }
    } else {
        let v = f64::from_bits(read_xor(r, vs)?);
        (v, scaled_at(v, vs.scale))
    };
    // A decoded scaled integer is exact only if it maps back to the same float: damaged
    // data must not poison the history the next predictions use.
    let scaled = scaled.filter(|s| s.unsigned_abs() < MAX_EXACT as u64);
    vs.after(v, scaled);
    Some(v)
}

fn read_xor(r: &mut BitReader, vs: &mut ValueState) -> Option<u64> {
    if !r.read_bit() {
        return Some(vs.prev_bits);
    }
    if r.read_bit() {
        let leading = r.read_bits(5) as u32;
        let mut sig = r.read_bits(6) as u32;
        if sig == 0 {
            sig = 64;
        }
        if leading + sig > 64 {
            return None;
        }
        vs.leading = leading as u8;
        vs.trailing = (64 - leading - sig) as u8;
        vs.xor_window_set = true;
    } else if !vs.xor_window_set {
        return None;
    }
    let (wl, wt) = (vs.leading as u32, vs.trailing as u32);
    let bits = r.read_bits(64 - wl - wt);
    Some(vs.prev_bits ^ (bits << wt))
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

impl ChunkIter<'_> {
    /// Like [`step`](Self::step) on a streaming-encoded chunk, but stops before the first
    /// sample later than `through` (the position and timestamp state left as they were
    /// before it), and takes a timestamp that does not increase as damage.
    pub(crate) fn step_through(&mut self, through: i64) -> Option<Sample> {
        if self.read >= self.n || self.err.is_some() {
            return None;
        }
        if self.read == 0 {
            let s = self.read_first().filter(|_| !self.r.overrun());
            return match s {
                Some(s) if s.t <= through => {
                    self.read = 1;
                    Some(s)
                }
                Some(_) => None,
                None => {
                    self.err = Some(ChunkError::Truncated(0));
                    None
                }
            };
        }
        let (pos, ts) = (self.r.pos, self.ts.clone());
        let prev = self.ts.prev_t;
        let t = match self.ts.decode(&mut self.r) {
            Some(t) if t > prev && !self.r.overrun() => t,
            _ => {
                self.err = Some(ChunkError::Truncated(self.read));
                return None;
            }
        };
        if t > through {
            (self.r.pos, self.ts) = (pos, ts);
            return None;
        }
        match read_value(&mut self.r, &mut self.vs) {
            Some(v) if !self.r.overrun() => {
                self.read += 1;
                Some(Sample { t, v })
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
