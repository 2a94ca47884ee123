//! Timestamp prediction shared by the encoder and the decoder: delta of delta against
//! the offset from a fixed grid, whichever cost less recently.

use crate::bits::{BitReader, BitWriter};
use crate::rice::{read_long, read_rice, unzigzag, write_long, write_rice, zigzag, Mean, RiceRead, ESCAPE};

/// Timestamp coding state, the same on both sides. Two predictors compete, each sample
/// coded by the one that cost fewer bits recently:
/// * **dod**: delta of delta, Rice-coded (regular intervals cost 1 bit);
/// * **grid**: the offset from `t₀ + i·Δ` (Δ the first interval rounded to a whole second),
///   coded in truncated binary over the window of offsets seen so far, with one escape
///   symbol below and one above it. Scrape timestamps jitter within a few milliseconds of a
///   fixed grid: this costs log2(window) bits where delta of delta costs about one more.
#[derive(Debug, Clone)]
pub(crate) struct TsState {
    pub(crate) t0: i64,
    pub(crate) prev_t: i64,
    pub(crate) prev_dt: i64,
    pub(crate) dod_mean: Mean,
    pub(crate) step: i64,
    /// `t0 + n·step`: where the grid puts the next sample.
    pub(crate) grid_t: i64,
    pub(crate) lo: i64,
    pub(crate) hi: i64,
    pub(crate) n: u32,
    pub(crate) cost_dod: u32,
    pub(crate) cost_grid: u32,
    /// The grid code's alphabet, derived from `lo`, `hi` and `n` and cached because it
    /// changes rarely: `m` symbols (0 when the grid code is unusable), coded in truncated
    /// binary with `tb_k` bits below `tb_u` and one more above.
    pub(crate) m: u16,
    pub(crate) tb_u: u16,
    pub(crate) tb_k: u8,
    pub(crate) dod_seen: u8,
}

pub(crate) const GRID_MAX_WINDOW: i64 = 1 << 12;
pub(crate) const ESCAPE_K: u32 = 2;

#[inline(always)]
pub(crate) fn rice_len(z: u64, k: u32) -> u64 {
    let q = z >> k;
    if q < ESCAPE {
        q + 1 + k as u64
    } else {
        ESCAPE + 1 + 7 + (64 - z.leading_zeros()) as u64
    }
}

/// Truncated binary code of `x` in `[0, m)`: `floor(log2 m)` or one more bit.
#[inline(always)]
pub(crate) fn tb_params(m: u64) -> (u32, u64) {
    let k = 63 - m.leading_zeros();
    (k, (1u64 << (k + 1)) - m)
}

pub(crate) fn write_tb(w: &mut BitWriter, x: u64, m: u64) {
    let (k, u) = tb_params(m);
    if x < u {
        w.write_bits(x, k);
    } else {
        w.write_bits(x + u, k + 1);
    }
}

impl TsState {
    pub(crate) fn new(t0: i64) -> Self {
        TsState {
            t0,
            prev_t: t0,
            prev_dt: 0,
            dod_mean: Mean::default(),
            step: 0,
            grid_t: t0,
            lo: 0,
            hi: 0,
            n: 1,
            cost_dod: 16 * 8,
            cost_grid: 16 * 8,
            m: 0,
            tb_u: 0,
            tb_k: 0,
            dod_seen: 0,
        }
    }

    /// Recomputes the cached alphabet for the window `lo..=hi` once `n` samples are coded.
    pub(crate) fn refresh_grid(&mut self, n: u32) {
        // hi ≥ lo, so the wrapping difference read as u64 is exact.
        let w = self.hi.wrapping_sub(self.lo) as u64;
        if n >= 2 && w < GRID_MAX_WINDOW as u64 {
            let m = w + 3;
            let (k, u) = tb_params(m);
            (self.m, self.tb_k, self.tb_u) = (m as u16, k as u8, u as u16);
        } else {
            self.m = 0;
        }
    }

    #[inline(always)]
    pub(crate) fn use_grid(&self) -> bool {
        self.m != 0 && self.cost_grid < self.cost_dod
    }

    /// (symbol, escape distance) of offset `g` in the grid code.
    #[inline(always)]
    pub(crate) fn grid_symbol(&self, g: i64) -> (u64, Option<u64>) {
        // The true distances are below 2^64, so wrapping differences read as u64 are exact.
        if g < self.lo {
            (0, Some(self.lo.wrapping_sub(g).wrapping_sub(1) as u64))
        } else if g > self.hi {
            (self.m as u64 - 1, Some(g.wrapping_sub(self.hi).wrapping_sub(1) as u64))
        } else {
            (g.wrapping_sub(self.lo) as u64 + 1, None)
        }
    }

    /// Bits the grid code spends on symbol `sym` (plus its escape distance).
    #[inline(always)]
    pub(crate) fn grid_len(&self, sym: u64, escape: Option<u64>) -> u64 {
        let base = self.tb_k as u64 + (sym >= self.tb_u as u64) as u64;
        base + escape.map(|d| rice_len(d, ESCAPE_K)).unwrap_or(0)
    }

    pub(crate) fn encode(&mut self, w: &mut BitWriter, t: i64) {
        let dt = t.wrapping_sub(self.prev_t);
        if self.n == 1 {
            // The first delta is an interval, not a delta of delta: it sets the grid step.
            write_long(w, zigzag(dt));
        } else if self.use_grid() {
            let (sym, escape) = self.grid_symbol(t.wrapping_sub(self.grid_t));
            write_tb(w, sym, self.m as u64);
            if let Some(d) = escape {
                write_rice(w, d, ESCAPE_K);
            }
        } else {
            write_rice(w, zigzag(dt.wrapping_sub(self.prev_dt)), self.dod_mean.k());
        }
        self.observe(t, None);
    }

    #[inline(always)]
    pub(crate) fn decode(&mut self, r: &mut BitReader) -> Option<i64> {
        if self.n == 1 {
            let t = self.prev_t.wrapping_add(unzigzag(read_long(r)?));
            self.observe(t, None);
            return Some(t);
        }
        if self.use_grid() {
            // Truncated binary without a branch on the data: k+1 bits, of which the
            // first k decide whether the last belongs to the symbol.
            let (k, u) = (self.tb_k as u32, self.tb_u as u64);
            let v = (r.peek64() >> (62 - k)) >> 1; // k + 1 bits
            let short = (v >> 1) < u;
            let sym = if short { v >> 1 } else { v - u };
            r.pos += k as usize + (!short) as usize;
            if sym >= self.m as u64 {
                return None;
            }
            let escape = |r: &mut BitReader| match read_rice(r, ESCAPE_K)? {
                RiceRead::Value(d) => Some(d),
                RiceRead::Alternative => None,
            };
            // Mirrors grid_symbol's wrapping arithmetic.
            let (g, esc) = if sym == 0 {
                let d = escape(r)?;
                (self.lo.wrapping_sub(d as i64).wrapping_sub(1), Some(d))
            } else if sym == self.m as u64 - 1 {
                let d = escape(r)?;
                (self.hi.wrapping_add(d as i64).wrapping_add(1), Some(d))
            } else {
                (self.lo.wrapping_add(sym as i64 - 1), None)
            };
            let t = self.grid_t.wrapping_add(g);
            self.observe(t, Some(self.grid_len(sym, esc)));
            return Some(t);
        }
        let z = match read_rice(r, self.dod_mean.k())? {
            RiceRead::Value(z) => z,
            RiceRead::Alternative => return None,
        };
        let t = self.prev_t.wrapping_add(self.prev_dt.wrapping_add(unzigzag(z)));
        self.observe(t, None);
        Some(t)
    }

    /// Updates both predictors with the timestamp just coded; `grid_bits` is what the grid
    /// code spent on it when the caller already knows.
    #[inline(always)]
    pub(crate) fn observe(&mut self, t: i64, grid_bits: Option<u64>) {
        let dt = t.wrapping_sub(self.prev_t);
        if self.n == 1 {
            self.step =
                if dt >= 1000 && (dt % 1000 <= 100 || dt % 1000 >= 900) { (dt + 500) / 1000 * 1000 } else { dt };
            self.grid_t = self.t0.wrapping_add(self.step);
            let g = t.wrapping_sub(self.grid_t);
            self.lo = g.min(0);
            self.hi = g.max(0);
        } else {
            let z = zigzag(dt.wrapping_sub(self.prev_dt));
            let dod_bits = rice_len(z, self.dod_mean.k()).min(255) as u32;
            self.dod_mean.update(z, &mut self.dod_seen);
            let g = t.wrapping_sub(self.grid_t);
            // Regular intervals (under 1.5 bits of delta of delta on average): the grid code,
            // at 1.6 bits or more, cannot win, so it is not priced.
            if self.cost_dod >= 24 {
                let bits = match (self.m, grid_bits) {
                    (0, _) => 64,
                    (_, Some(b)) => b,
                    _ => {
                        let (sym, escape) = self.grid_symbol(g);
                        self.grid_len(sym, escape)
                    }
                };
                self.cost_grid = self.cost_grid - (self.cost_grid >> 4) + bits.min(255) as u32;
            }
            self.cost_dod = self.cost_dod - (self.cost_dod >> 4) + dod_bits;
            if g < self.lo || g > self.hi {
                self.lo = self.lo.min(g);
                self.hi = self.hi.max(g);
                self.refresh_grid(self.n + 1);
            }
        }
        self.prev_dt = dt;
        self.prev_t = t;
        self.n += 1;
        self.grid_t = self.grid_t.wrapping_add(self.step);
        if self.n == 2 {
            self.refresh_grid(2);
        }
    }
}
