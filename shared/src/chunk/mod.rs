//! Per-series compressed chunks, appended sample by sample.
//!
//! Every sample after a chunk's first is coded as a residual against a prediction, with an
//! adaptive Rice code whose parameter follows the running mean of recent residuals (so a
//! steady series costs about a bit per value and a noisy one about its entropy, with no
//! per-chunk tuning and no bits spent on the parameter):
//!
//! * **timestamps**: two predictors compete per sample (see `TsState`): delta of delta
//!   (regular scrapes cost 1 bit) and the offset from the grid `t₀ + i·Δ`, coded over the
//!   window of offsets seen (scrape jitter around a fixed rhythm costs about log2 of its
//!   spread, one bit less than delta of delta).
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
//! [`CHUNK_MAX_SAMPLES`] (960: 80 minutes at 5 s, 4 hours at 15 s; longer chunks amortise
//! the header and the coder's warm-up, at the price of decoding more of the open chunk for
//! a query of the last minutes); sealed chunks are immutable byte strings that travel
//! between tiers as they are.

mod block;

use crate::model::Sample;
use std::sync::Arc;

/// Samples per chunk before it is sealed (Prometheus uses 120).
pub const CHUNK_MAX_SAMPLES: u16 = 960;
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
    let x = v * POW10[k as usize];
    // Below 2^53 a float is within 0.5 of an integer that is itself below 2^53.
    if x.abs() >= MAX_EXACT {
        return None;
    }
    // Compare through the integer so that -0.0 (which would come back as +0.0) is refused.
    let i = round_half_away(x) as i64;
    (unscale(i, k).to_bits() == v.to_bits()).then_some(i)
}

/// `x.round()` for |x| < 2^53 without the libm call (every sample goes through here): the
/// truncation and the fractional part are both exact in that range.
#[inline(always)]
fn round_half_away(x: f64) -> f64 {
    let t = x as i64 as f64;
    let f = x - t;
    if f >= 0.5 {
        t + 1.0
    } else if f <= -0.5 {
        t - 1.0
    } else {
        t
    }
}

#[inline(always)]
fn unscale(s: i64, k: u32) -> f64 {
    // Integers (scale 0, most DCGM values) need no division.
    if k == 0 { s as f64 } else { s as f64 / POW10[k as usize] }
}

// ---- bit I/O ----

/// Bits are written most significant first into a 64-bit accumulator and moved to the
/// byte vector whole bytes at a time. (Flushing four bytes at a time was faster to write
/// but raised the edge's peak memory by a quarter in `bench vs-prometheus`.)
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

/// Reads bits most significant first through a 64-bit window. Reads past the end see
/// zeros instead of failing, so the hot path carries no checks: the decoder asks
/// [`overrun`](Self::overrun) once per sample and refuses the sample if it read past the data.
#[derive(Debug, Clone)]
struct BitReader<'a> {
    bytes: &'a [u8],
    pos: usize, // in bits
}

impl<'a> BitReader<'a> {
    /// The next (at least 57) bits, left-aligned, zero-padded past the end.
    #[inline(always)]
    fn peek64(&self) -> u64 {
        let byte = self.pos / 8;
        let word = match self.bytes.get(byte..byte + 8) {
            Some(b) => u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            None => {
                let mut buf = [0u8; 8];
                let tail = self.bytes.get(byte..).unwrap_or_default();
                buf[..tail.len()].copy_from_slice(tail);
                u64::from_be_bytes(buf)
            }
        };
        word << (self.pos % 8)
    }

    /// True once more bits were consumed than the data holds.
    #[inline(always)]
    fn overrun(&self) -> bool {
        self.pos > self.bytes.len() * 8
    }

    #[inline(always)]
    fn read_bit(&mut self) -> bool {
        self.read_bits(1) == 1
    }

    /// The next `n` bits (`n` ≤ 64).
    #[inline(always)]
    fn read_bits(&mut self, n: u32) -> u64 {
        if n > 56 {
            let hi = self.take(n - 32);
            return (hi << 32) | self.take(32);
        }
        self.take(n)
    }

    /// `n` ≤ 56 bits; the double shift makes `n = 0` read nothing without a branch.
    #[inline(always)]
    fn take(&mut self, n: u32) -> u64 {
        let v = (self.peek64() >> (63 - n)) >> 1;
        self.pos += n as usize;
        v
    }
}

// ---- adaptive Rice codes ----

/// Unary runs this long mean "escape": what follows is not a Rice remainder.
const ESCAPE: u64 = 24;

#[inline(always)]
fn zigzag(x: i64) -> u64 {
    ((x << 1) ^ (x >> 63)) as u64
}

#[inline(always)]
fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Running mean of zigzagged residuals, as 16×mean, from which the Rice parameter follows.
/// Encoder and decoder update it identically, so `k` needs no bits.
/// For its first 16 residuals it is their exact average, so a chunk learns its series'
/// scale at once; then an exponential average with weight 1/16.
/// The count of residuals seen (up to 16) lives with the owner, packed with other small
/// fields, to keep per-series state small.
#[derive(Debug, Clone, Copy)]
struct Mean(u64);

impl Default for Mean {
    fn default() -> Self {
        Mean(16 * 8)
    }
}

impl Mean {
    #[inline(always)]
    fn update(&mut self, z: u64, seen: &mut u8) {
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
    fn k(&self) -> u32 {
        let half_mean = self.0 >> 5;
        (64 - half_mean.leading_zeros()).min(62)
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
    let len = r.read_bits(7) as u32;
    if len > 64 {
        return None;
    }
    Some(r.read_bits(len))
}

enum RiceRead {
    Value(u64),
    /// The escape was followed by a 1: the caller's alternative encoding follows.
    Alternative,
}

#[inline(always)]
fn read_rice(r: &mut BitReader, k: u32) -> Option<RiceRead> {
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

// ---- appender ----

/// Prediction orders of the decimal path: previous value, linear, quadratic extrapolation
/// (FLAC's fixed predictors 1–3). The order with the smallest running residual is used.
const ORDERS: usize = 3;

/// State shared by the encoder and the decoder: both derive it from the values they see,
/// so the decoder replays exactly the encoder's choices.
#[derive(Debug, Clone, Default)]
struct ValueState {
    prev_bits: u64,
    /// Last scaled values, newest first; `hist_len` of them are valid.
    hist: [i64; ORDERS],
    means: [Mean; ORDERS],
    seen: [u8; ORDERS],
    scale: u32,
    hist_len: u8,
    leading: u8,
    trailing: u8,
    xor_window_set: bool,
}

impl ValueState {
    /// The predictions of every order (those at or above `hist_len` are meaningless).
    #[inline(always)]
    fn predictions(&self) -> [i64; ORDERS] {
        let h = &self.hist;
        [
            h[0],
            h[0].wrapping_mul(2).wrapping_sub(h[1]),
            h[0].wrapping_mul(3).wrapping_sub(h[1].wrapping_mul(3)).wrapping_add(h[2]),
        ]
    }

    #[inline(always)]
    fn prediction(&self, order: usize) -> i64 {
        self.predictions()[order.min(ORDERS - 1)]
    }

    /// The order to use next: the available one with the smallest running residual (the
    /// lowest order on a tie).
    #[inline(always)]
    fn best_order(&self) -> usize {
        let avail = (self.hist_len as usize).min(ORDERS);
        let mut best = 0;
        for o in 1..ORDERS {
            if o < avail && self.means[o].0 < self.means[best].0 {
                best = o;
            }
        }
        best
    }

    /// Moves the decimal path to a finer scale, multiplying the history exactly. False
    /// (and nothing changed) when the history would no longer be exact.
    fn rescale(&mut self, to: u32) -> bool {
        if to <= self.scale || to > MAX_SCALE {
            return false;
        }
        let f = 10i64.pow(to - self.scale);
        let mut hist = self.hist;
        for h in hist.iter_mut().take(self.hist_len as usize) {
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

    #[inline(always)]
    fn after(&mut self, v: f64, scaled: Option<i64>) {
        match scaled {
            Some(s) => {
                let p = self.predictions();
                #[allow(clippy::needless_range_loop)]
                for o in 0..(self.hist_len as usize).min(ORDERS) {
                    let z = zigzag(s.wrapping_sub(p[o]));
                    self.means[o].update(z, &mut self.seen[o]);
                }
                self.hist = [s, self.hist[0], self.hist[1]];
                self.hist_len = (self.hist_len + 1).min(ORDERS as u8);
            }
            None => self.hist_len = 0,
        }
        self.prev_bits = v.to_bits();
    }
}

/// Timestamp coding state, the same on both sides. Two predictors compete, each sample
/// coded by the one that cost fewer bits recently:
/// * **dod**: delta of delta, Rice-coded (regular intervals cost 1 bit);
/// * **grid**: the offset from `t₀ + i·Δ` (Δ the first interval rounded to a whole second),
///   coded in truncated binary over the window of offsets seen so far, with one escape
///   symbol below and one above it. Scrape timestamps jitter within a few milliseconds of a
///   fixed grid: this costs log2(window) bits where delta of delta costs about one more.
#[derive(Debug, Clone)]
struct TsState {
    t0: i64,
    prev_t: i64,
    prev_dt: i64,
    dod_mean: Mean,
    step: i64,
    /// `t0 + n·step`: where the grid puts the next sample.
    grid_t: i64,
    lo: i64,
    hi: i64,
    n: u32,
    cost_dod: u32,
    cost_grid: u32,
    /// The grid code's alphabet, derived from `lo`, `hi` and `n` and cached because it
    /// changes rarely: `m` symbols (0 when the grid code is unusable), coded in truncated
    /// binary with `tb_k` bits below `tb_u` and one more above.
    m: u16,
    tb_u: u16,
    tb_k: u8,
    dod_seen: u8,
}

const GRID_MAX_WINDOW: i64 = 1 << 12;
const ESCAPE_K: u32 = 2;

#[inline(always)]
fn rice_len(z: u64, k: u32) -> u64 {
    let q = z >> k;
    if q < ESCAPE { q + 1 + k as u64 } else { ESCAPE + 1 + 7 + (64 - z.leading_zeros()) as u64 }
}

/// Truncated binary code of `x` in `[0, m)`: `floor(log2 m)` or one more bit.
#[inline(always)]
fn tb_params(m: u64) -> (u32, u64) {
    let k = 63 - m.leading_zeros();
    (k, (1u64 << (k + 1)) - m)
}

fn write_tb(w: &mut BitWriter, x: u64, m: u64) {
    let (k, u) = tb_params(m);
    if x < u {
        w.write_bits(x, k);
    } else {
        w.write_bits(x + u, k + 1);
    }
}

impl TsState {
    fn new(t0: i64) -> Self {
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
    fn refresh_grid(&mut self, n: u32) {
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
    fn use_grid(&self) -> bool {
        self.m != 0 && self.cost_grid < self.cost_dod
    }

    /// (symbol, escape distance) of offset `g` in the grid code.
    #[inline(always)]
    fn grid_symbol(&self, g: i64) -> (u64, Option<u64>) {
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
    fn grid_len(&self, sym: u64, escape: Option<u64>) -> u64 {
        let base = self.tb_k as u64 + (sym >= self.tb_u as u64) as u64;
        base + escape.map(|d| rice_len(d, ESCAPE_K)).unwrap_or(0)
    }

    fn encode(&mut self, w: &mut BitWriter, t: i64) {
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
    fn decode(&mut self, r: &mut BitReader) -> Option<i64> {
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
    fn observe(&mut self, t: i64, grid_bits: Option<u64>) {
        let dt = t.wrapping_sub(self.prev_t);
        if self.n == 1 {
            self.step = if dt >= 1000 && (dt % 1000 <= 100 || dt % 1000 >= 900) { (dt + 500) / 1000 * 1000 } else { dt };
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

    /// Whether the chunk is in the block encoding (see [`block`]).
    pub fn is_block(&self) -> bool {
        block::is_block(&self.data)
    }

    /// The same samples in the block encoding when that is no larger, else the chunk as
    /// it is. Done once, when a chunk is sealed: queries decode block chunks several times
    /// faster than they replay the streaming coder.
    pub fn compact(self) -> Chunk {
        if self.is_block() {
            return self;
        }
        let Ok(samples) = self.decode() else { return self };
        match block::encode(&samples) {
            Some(bytes) if bytes.len() <= self.data.len() + self.data.len() / 32 => Chunk { data: Arc::from(bytes), ..self },
            _ => self,
        }
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

    /// Appends the samples within `[mint, maxt]` to `out`; stops decoding past `maxt`.
    pub fn decode_into(&self, mint: i64, maxt: i64, out: &mut Vec<Sample>) -> Result<(), ChunkError> {
        if self.is_block() {
            let base = out.len();
            block::decode(&self.data, self.n as usize, out)?;
            if self.min_t < mint || self.max_t > maxt {
                let keep_from = base + out[base..].partition_point(|s| s.t < mint);
                let keep_to = base + out[base..].partition_point(|s| s.t <= maxt);
                out.truncate(keep_to);
                out.drain(base..keep_from);
            }
            return Ok(());
        }
        let mut it = self.iter();
        out.reserve(self.n as usize);
        while let Some(s) = it.step() {
            if s.t > maxt {
                break;
            }
            if s.t >= mint {
                out.push(s);
            }
        }
        match it.err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// About how many samples fall in `[mint, maxt]`, without decoding: all of them when
    /// the chunk lies inside, else its sample count in proportion to the time covered
    /// (rounded up). For limits, which must not count a whole chunk when a query needs a
    /// minute of it.
    pub fn samples_within(&self, mint: i64, maxt: i64) -> u64 {
        if !self.overlaps(mint, maxt) {
            return 0;
        }
        if self.min_t >= mint && self.max_t <= maxt {
            return self.n as u64;
        }
        let span = (self.max_t as i128 - self.min_t as i128).max(1);
        let covered = (maxt.min(self.max_t) as i128 - mint.max(self.min_t) as i128 + 1).clamp(1, span);
        ((self.n as i128 * covered + span - 1) / span) as u64
    }

    /// Appends the samples within `[mint, maxt]` of a series' time-ordered chunks to `out`.
    pub fn decode_range(chunks: &[Chunk], mint: i64, maxt: i64, out: &mut Vec<Sample>) -> Result<(), ChunkError> {
        for c in chunks.iter().filter(|c| c.overlaps(mint, maxt)) {
            c.decode_into(mint, maxt, out)?;
        }
        Ok(())
    }

    pub fn overlaps(&self, mint: i64, maxt: i64) -> bool {
        self.min_t <= maxt && self.max_t >= mint
    }
}

/// Decodes a chunk's samples in order. Damaged data ends the iteration; `error()` tells.
pub struct ChunkIter<'a> {
    /// A block-encoded chunk, decoded whole up front.
    block: Option<std::vec::IntoIter<Sample>>,
    r: BitReader<'a>,
    n: u16,
    read: u16,
    ts: TsState,
    vs: ValueState,
    err: Option<ChunkError>,
}

impl<'a> ChunkIter<'a> {
    fn new(bytes: &'a [u8], n: u16) -> Self {
        let mut it = ChunkIter { block: None, r: BitReader { bytes, pos: 0 }, n, read: 0, ts: TsState::new(0), vs: ValueState::default(), err: None };
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
        let v = if self.r.read_bit() { unscale(unzigzag(read_long(&mut self.r)?), scale) } else { f64::from_bits(self.r.read_bits(64)) };
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
    fn step(&mut self) -> Option<Sample> {
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
        let bits = bytes as f64 * 8.0 / CHUNK_MAX_SAMPLES as f64;
        assert!(bits < 2.8, "steady counter took {bits} bits per sample");
    }

    #[test]
    fn jittered_timestamps_on_a_grid_use_the_grid_code() {
        // 15 s scrapes with 0-39 ms of independent jitter, a constant value: the cost is
        // almost all timestamp. Delta of delta needs ~7.3 bits here, the grid code ~6.
        let mut r = Rng(5);
        let samples: Vec<_> = (0..CHUNK_MAX_SAMPLES as i64).map(|i| Sample::new(1_700_000_000_000 + i * 15_000 + (r.next() % 40) as i64, 0.0)).collect();
        let bytes = roundtrip(&samples);
        let bits = bytes as f64 * 8.0 / samples.len() as f64;
        assert!(bits < 7.4, "jittered grid took {bits} bits per sample");
        // and irregular timestamps still round-trip
        let mut t = 0i64;
        let irregular: Vec<_> = (0..CHUNK_MAX_SAMPLES as i64).map(|i| { t += 1 + (r.next() % 100_000) as i64 * (i % 3); Sample::new(t, 1.0) }).collect();
        roundtrip(&irregular);
    }

    #[test]
    fn random_bytes_decode_to_an_error_or_samples_never_a_panic() {
        let mut r = Rng(77);
        for _ in 0..2000 {
            let len = (r.next() % 200) as usize;
            let data: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
            let c = Chunk { data: Arc::from(data), n: (r.next() % 1000) as u16, min_t: 0, max_t: 0 };
            let _ = c.decode();
        }
    }

    #[test]
    fn samples_within_a_range_are_estimated_without_decoding() {
        let mut a = ChunkAppender::new();
        for i in 0..100 {
            a.append(i * 1000, 1.0);
        }
        let c = a.seal();
        assert_eq!(c.samples_within(0, 99_000), 100);
        assert_eq!(c.samples_within(-5, 200_000), 100);
        assert_eq!(c.samples_within(100_000, 200_000), 0);
        let half = c.samples_within(50_000, 200_000);
        assert!((49..=52).contains(&half), "{half}");
        assert_eq!(c.samples_within(99_000, 99_000), 1, "rounded up, never zero when overlapping");
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
