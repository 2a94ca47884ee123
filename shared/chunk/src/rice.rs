//! Adaptive Rice codes: zigzagged residuals, a running mean that sets the parameter on
//! both sides without spending bits on it, and an escape for what does not fit.

use crate::bits::{BitReader, BitWriter};

/// Unary runs this long mean "escape": what follows is not a Rice remainder.
pub(crate) const ESCAPE: u64 = 24;

#[inline(always)]
pub(crate) fn zigzag(x: i64) -> u64 {
    ((x << 1) ^ (x >> 63)) as u64
}

#[inline(always)]
pub(crate) fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Running mean of zigzagged residuals, as 16×mean, from which the Rice parameter follows.
/// Encoder and decoder update it identically, so `k` needs no bits.
/// For its first 16 residuals it is their exact average, so a chunk learns its series'
/// scale at once; then an exponential average with weight 1/16.
/// The count of residuals seen (up to 16) lives with the owner, packed with other small
/// fields, to keep per-series state small.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mean(pub(crate) u64);

impl Default for Mean {
    fn default() -> Self {
        Mean(16 * 8)
    }
}

impl Mean {
    #[inline(always)]
    pub(crate) fn update(&mut self, z: u64, seen: &mut u8) {
        // Capped so that 16·z and the accumulator stay far below i64::MAX.
        let z = z.min(1 << 56);
        if *seen < 16 {
            *seen += 1;
            let acc = self.0 as i64;
            self.0 = (acc + (z as i64 * 16 - acc) / *seen as i64) as u64;
        } else {
            self.0 = self.0 - (self.0 >> 4) + z;
        }
    }
    /// Rice parameter ⌊log2(mean)⌋ (measured best on DCGM data among nearby rules).
    #[inline(always)]
    pub(crate) fn k(&self) -> u32 {
        let half_mean = self.0 >> 5;
        (64 - half_mean.leading_zeros()).min(62)
    }
}

/// Writes `z` with Rice parameter `k`, or an escape when the quotient is too long.
pub(crate) fn write_rice(w: &mut BitWriter, z: u64, k: u32) {
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

pub(crate) fn write_escape(w: &mut BitWriter) {
    w.write_bits((1u64 << ESCAPE) - 1, ESCAPE as u32);
}

/// A value of any size: its bit length in 7 bits, then the bits.
pub(crate) fn write_long(w: &mut BitWriter, z: u64) {
    let len = 64 - z.leading_zeros();
    w.write_bits(len as u64, 7);
    w.write_bits(z, len);
}

pub(crate) fn read_long(r: &mut BitReader) -> Option<u64> {
    let len = r.read_bits(7) as u32;
    if len > 64 {
        return None;
    }
    Some(r.read_bits(len))
}

pub(crate) enum RiceRead {
    Value(u64),
    /// The escape was followed by a 1: the caller's alternative encoding follows.
    Alternative,
}

#[inline(always)]
pub(crate) fn read_rice(r: &mut BitReader, k: u32) -> Option<RiceRead> {
    let p = r.peek64();
    let q = p.leading_ones();
    if q < ESCAPE as u32 {
        // q ones, the terminating zero, k bits of remainder: usually all in one window.
        let len = q + 1 + k;
        let rem = if len <= 57 {
            r.pos += len as usize;
            ((p << (q + 1)) >> (63 - k)) >> 1
        } else {
            r.pos += q as usize + 1;
            r.read_bits(k)
        };
        return Some(RiceRead::Value(((q as u64) << k) | rem));
    }
    r.pos += ESCAPE as usize;
    if r.read_bit() {
        return Some(RiceRead::Alternative);
    }
    read_long(r).map(RiceRead::Value)
}
