//! The block encoding of a sealed chunk: the same samples as the streaming encoding, laid
//! out so that a query decodes them in tight loops instead of replaying an adaptive coder.
//!
//! A chunk is written sample by sample in the streaming encoding (see the crate's `appender` and `iter`)
//! while it is open; when it fills, it is transcoded once into this form if that is no
//! larger, which on scraped data it nearly always is. Every choice the streaming coder
//! adapts per sample is made here once per chunk, with the whole chunk in view:
//!
//! * **timestamps**: `tᵢ = t₀ + i·Δ + lo + offᵢ`, where `Δ` is the grid step that makes the
//!   offsets' range `m` smallest. Regular scrapes have `m = 1` and cost nothing per sample;
//!   jittered ones pack their offsets in mixed radix, `j` offsets per group of `b ≤ 32`
//!   bits with `b/j` as close to `log2 m` as groups allow (40 values of jitter: 6 per 32
//!   bits, 5.33 bits each). Groups are independent, and a digit costs a multiply.
//! * **values**: every value is an exact decimal at one scale; the first three scaled
//!   integers are written whole, the rest in partitions of 64, each with the predictor and
//!   the Rice parameter that code it in the fewest bits; an all-zero partition costs only
//!   its 8 bits of parameters. The predictors are FLAC's fixed ones of order 1 to 3 (the
//!   last value, linear, quadratic: trends and counters) and the mean of the last eight
//!   values (noise around a level, as a gauge's readings are: the residual's spread is that
//!   of one reading, not of the difference of two, about 0.4 bits a sample less on DCGM's
//!   utilisation, temperature and power).
//!
//! Chunks whose values are not all decimals at one scale (NaN, staleness markers, floats
//! with long mantissas) or whose timestamps do not sit on any grid stay in the streaming
//! encoding. The block form starts with the 3-bit scale code `0b111`, which the streaming
//! encoding never writes, so a chunk's bytes say which encoding they hold.

use crate::bits::{BitReader, BitWriter};
use crate::rice::{read_long, read_rice, unzigzag, write_long, write_rice, zigzag, RiceRead, ESCAPE};
use crate::scale::{decimal_scale, scaled_at, unscale, MAX_SCALE};
use crate::timestamp::rice_len;
use crate::ChunkError;
use strata_model::Sample;

/// The first three bits of a block-encoded chunk.
pub(super) const BLOCK_TAG: u64 = 0b111;
/// Residuals per Rice partition.
const PARTITION: usize = 64;
/// Values written whole before the first partition: enough history for every order.
const WARM_UP: usize = 3;
/// The partition parameter that means "every residual is zero, no bits follow".
const ZERO_PARTITION: u32 = 63;
/// Below this many samples the header outweighs what the block form saves.
const MIN_SAMPLES: usize = 16;

/// Encodes `samples` (time-ordered, at least [`MIN_SAMPLES`]) in the block form, or `None`
/// when they do not qualify.
pub(super) fn encode(samples: &[Sample]) -> Option<Vec<u8>> {
    if samples.len() < MIN_SAMPLES {
        return None;
    }
    let (scale, scaled) = scaled_values(samples)?;
    let grid = Grid::fit(samples)?;

    let mut w = BitWriter::default();
    w.write_bits(BLOCK_TAG, 3);
    w.write_bits(scale as u64, 3);
    write_long(&mut w, zigzag(grid.t0));
    write_long(&mut w, zigzag(grid.step));
    write_long(&mut w, zigzag(grid.lo));
    write_long(&mut w, grid.m - 1);
    if grid.m > 1 {
        let radix = Radix::for_alphabet(grid.m);
        for group in grid.offsets.chunks(radix.digits as usize) {
            // The first offset is the least significant digit.
            let x = group.iter().rev().fold(0u64, |x, &d| x * grid.m + d);
            w.write_bits(x, radix.bits);
        }
    }
    for &s in &scaled[..WARM_UP] {
        write_long(&mut w, zigzag(s));
    }
    let mut start = WARM_UP;
    while start < scaled.len() {
        let end = (start + PARTITION).min(scaled.len());
        let (order, k, residuals) = plan_partition(&scaled, start, end);
        w.write_bits(order as u64 - 1, 2);
        w.write_bits(k as u64, 6);
        if k != ZERO_PARTITION {
            for &z in &residuals[..end - start] {
                write_rice(&mut w, z, k);
            }
        }
        start = end;
    }
    Some(w.to_bytes())
}

/// Every value as an integer at one decimal scale, the smallest that holds them all, or
/// `None`. The scale only grows; when it does, the earlier values are scaled again at the
/// finer scale from their floats (not multiplied up: near 2^53 the two can differ by one),
/// so that every integer is the one `scaled_at` gives for its value at the final scale.
fn scaled_values(samples: &[Sample]) -> Option<(u32, Vec<i64>)> {
    let mut scale = 0;
    let mut out: Vec<i64> = Vec::with_capacity(samples.len());
    for s in samples {
        let x = match scaled_at(s.v, scale) {
            Some(x) => x,
            None => {
                let finer = decimal_scale(s.v).filter(|&k| k > scale)?;
                for (o, earlier) in out.iter_mut().zip(samples) {
                    *o = scaled_at(earlier.v, finer)?;
                }
                scale = finer;
                scaled_at(s.v, scale)?
            }
        };
        out.push(x);
    }
    Some((scale, out))
}

/// Whether `bytes` hold a block-encoded chunk.
pub(super) fn is_block(bytes: &[u8]) -> bool {
    bytes.first().is_some_and(|b| (b >> 5) as u64 == BLOCK_TAG)
}

/// Decodes the `n` samples of a block-encoded chunk onto the end of `out`; on damaged
/// data, an error and `out` as it was.
pub(super) fn decode(bytes: &[u8], n: usize, out: &mut Vec<Sample>) -> Result<(), ChunkError> {
    let base = out.len();
    let r = decode_onto(bytes, n, out);
    if r.is_err() {
        out.truncate(base);
    }
    r
}

/// A block-encoded chunk's grid step `Δ` and the largest step between consecutive samples it
/// can hold, `Δ + m − 1` (offsets lie in `[0, m)`), read from the header alone. `None` for
/// bytes that are not the block form or a header that does not parse to a positive grid.
pub(super) fn step_bounds(bytes: &[u8]) -> Option<(i64, i64)> {
    if !is_block(bytes) {
        return None;
    }
    let mut r = BitReader { bytes, pos: 6 };
    let _t0 = read_long(&mut r)?;
    let step = unzigzag(read_long(&mut r)?);
    let _lo = read_long(&mut r)?;
    // The header holds m − 1, the offsets' spread.
    let spread = read_long(&mut r)?;
    if r.overrun() || step <= 0 || spread >= 1 << 32 {
        return None;
    }
    Some((step, step.checked_add(spread as i64)?))
}

/// Where a block-encoded chunk of `n` samples keeps its timestamps: the bits from 6 (after
/// the tag and the scale) to the returned end. Samples scraped together (every series of a
/// target shares the scrape's time) have the same timestamp bits, which a container can
/// then store once (see `split`). `None` when the header does not parse.
pub(super) fn timestamp_bits_end(bytes: &[u8], n: usize) -> Option<usize> {
    if !is_block(bytes) {
        return None;
    }
    let mut r = BitReader { bytes, pos: 6 };
    for _ in 0..3 {
        read_long(&mut r)?;
    }
    let m = read_long(&mut r)?.checked_add(1)?;
    if r.overrun() || m == 0 || m > 1 << 32 {
        return None;
    }
    let mut end = r.pos;
    if m > 1 {
        let radix = Radix::for_alphabet(m);
        let groups = n.div_ceil(radix.digits as usize);
        end = end.checked_add(groups.checked_mul(radix.bits as usize)?)?;
    }
    (end <= bytes.len() * 8).then_some(end)
}

fn decode_onto(bytes: &[u8], n: usize, out: &mut Vec<Sample>) -> Result<(), ChunkError> {
    let truncated = || ChunkError::Truncated(0);
    let mut r = BitReader { bytes, pos: 3 };
    let scale = (r.read_bits(3) as u32).min(MAX_SCALE);
    let t0 = unzigzag(read_long(&mut r).ok_or_else(truncated)?);
    let step = unzigzag(read_long(&mut r).ok_or_else(truncated)?);
    let lo = unzigzag(read_long(&mut r).ok_or_else(truncated)?);
    let m = read_long(&mut r).ok_or_else(truncated)?.wrapping_add(1);
    if m == 0 || m > 1 << 32 || r.overrun() {
        return Err(truncated());
    }
    let base = out.len();
    out.reserve(n);
    // Timestamps first, into the samples' `t`; values are filled in below.
    let first = t0.wrapping_add(lo);
    if m == 1 {
        out.extend((0..n as i64).map(|i| Sample { t: first.wrapping_add(i.wrapping_mul(step)), v: 0.0 }));
    } else {
        let radix = Radix::for_alphabet(m);
        let div = FastDiv::new(m);
        let mut bits = BitBuf::at(bytes, r.pos);
        let mut grid_t = first;
        let mut left = n;
        while left > 0 {
            let mut x = bits.read(radix.bits);
            for _ in 0..(radix.digits as usize).min(left) {
                let q = div.div(x);
                let off = x - q * m;
                x = q;
                out.push(Sample { t: grid_t.wrapping_add(off as i64), v: 0.0 });
                grid_t = grid_t.wrapping_add(step);
            }
            left = left.saturating_sub(radix.digits as usize);
        }
        r.pos = bits.position();
    }
    decode_values_into(bytes, r, scale, &mut out[base..])
}

/// Where decoded values go: a sample's value, or a bare value (a column).
pub(super) trait ValueSlot {
    fn set(&mut self, v: f64);
}

impl ValueSlot for Sample {
    #[inline(always)]
    fn set(&mut self, v: f64) {
        self.v = v;
    }
}

impl ValueSlot for f64 {
    #[inline(always)]
    fn set(&mut self, v: f64) {
        *self = v;
    }
}

/// The `n` values of a block-encoded chunk onto the end of `out`, its timestamps skipped
/// (a column's are only the grid); on damaged data, an error and `out` as it was.
pub(super) fn decode_values(bytes: &[u8], n: usize, out: &mut Vec<f64>) -> Result<(), ChunkError> {
    let truncated = || ChunkError::Truncated(0);
    let mut r = BitReader { bytes, pos: 3 };
    let scale = (r.read_bits(3) as u32).min(MAX_SCALE);
    let end = timestamp_bits_end(bytes, n).ok_or_else(truncated)?;
    r.pos = end;
    let base = out.len();
    out.resize(base + n, 0.0);
    let done = decode_values_into(bytes, r, scale, &mut out[base..]);
    if done.is_err() {
        out.truncate(base);
    }
    done
}

/// The values of a block-encoded chunk, read from `r` (just past the timestamps), into
/// `samples`.
fn decode_values_into<S: ValueSlot>(
    bytes: &[u8],
    mut r: BitReader,
    scale: u32,
    samples: &mut [S],
) -> Result<(), ChunkError> {
    let truncated = || ChunkError::Truncated(0);
    // The last three values, newest first.
    let mut hist = [0i64; 3];
    // The last eight values, the value at index `i` in slot `i % 8`; the mean predictor reads
    // them, the others only store into it (off their dependency chain). The first value
    // stands in for those before it.
    let mut ring = [0i64; MEAN_OF];
    for (i, slot) in samples.iter_mut().take(WARM_UP).enumerate() {
        let s = unzigzag(read_long(&mut r).ok_or(ChunkError::Truncated(i as u16))?);
        if i == 0 {
            ring = [s; MEAN_OF];
        }
        ring[i % MEAN_OF] = s;
        hist = [s, hist[0], hist[1]];
        slot.set(unscale(s, scale));
    }
    let mut bits = BitBuf::at(bytes, r.pos);
    let mut start = WARM_UP.min(samples.len());
    while start < samples.len() {
        let end = (start + PARTITION).min(samples.len());
        // The order less one in two bits, then the Rice parameter in six.
        let header = bits.read(8) as u32;
        let part = Partition { samples: &mut samples[start..end], start, k: header & 63 };
        // One loop per predictor, so that the prediction is straight-line code.
        match (header >> 6) + 1 {
            1 => part.decode::<1>(&mut bits, &mut hist, &mut ring, scale)?,
            2 => part.decode::<2>(&mut bits, &mut hist, &mut ring, scale)?,
            3 => part.decode::<3>(&mut bits, &mut hist, &mut ring, scale)?,
            _ => part.decode_mean(&mut bits, &mut hist, &mut ring, scale)?,
        }
        start = end;
    }
    if bits.overrun() {
        return Err(truncated());
    }
    Ok(())
}

/// One partition's samples, the index of its first in the chunk, and its Rice parameter.
struct Partition<'a, S> {
    samples: &'a mut [S],
    start: usize,
    k: u32,
}

impl<S: ValueSlot> Partition<'_, S> {
    /// Residuals with predictor order `ORDER` into the samples' values.
    #[inline(always)]
    fn decode<const ORDER: usize>(
        self,
        bits: &mut BitBuf,
        hist: &mut [i64; 3],
        ring: &mut [i64; MEAN_OF],
        scale: u32,
    ) -> Result<(), ChunkError> {
        let k = self.k;
        for (i, slot) in (self.start..).zip(self.samples) {
            let z = if k == ZERO_PARTITION { 0 } else { bits.rice(k).ok_or(ChunkError::Truncated(0))? };
            let s = predict::<ORDER>(hist).wrapping_add(unzigzag(z));
            *hist = [s, hist[0], hist[1]];
            ring[i % MEAN_OF] = s;
            slot.set(unscale(s, scale));
        }
        Ok(())
    }

    /// Residuals predicted by the mean of the last eight values into the samples' values.
    fn decode_mean(
        self,
        bits: &mut BitBuf,
        hist: &mut [i64; 3],
        ring: &mut [i64; MEAN_OF],
        scale: u32,
    ) -> Result<(), ChunkError> {
        let k = self.k;
        // The sum plus half the divisor, so the mean is one shift on the chain.
        let mut sum4 = ring.iter().fold(MEAN_OF as i64 / 2, |a, &x| a.wrapping_add(x));
        for (i, slot) in (self.start..).zip(self.samples) {
            let z = if k == ZERO_PARTITION { 0 } else { bits.rice(k).ok_or(ChunkError::Truncated(0))? };
            let s = (sum4 >> 3).wrapping_add(unzigzag(z));
            let oldest = &mut ring[i % MEAN_OF];
            sum4 = sum4.wrapping_sub(*oldest).wrapping_add(s);
            *oldest = s;
            *hist = [s, hist[0], hist[1]];
            slot.set(unscale(s, scale));
        }
        Ok(())
    }
}

/// Values the mean predictor averages.
const MEAN_OF: usize = 8;

/// The mean of eight values from their sum, rounded half up (arithmetic shift: floor).
#[inline(always)]
fn mean_of(sum: i64) -> i64 {
    sum.wrapping_add(MEAN_OF as i64 / 2) >> 3
}

/// FLAC's fixed predictor of order 1 (the last value), 2 (linear) or 3 (quadratic) from
/// the history, newest first.
#[inline(always)]
fn predict<const ORDER: usize>(h: &[i64; 3]) -> i64 {
    match ORDER {
        1 => h[0],
        2 => h[0].wrapping_mul(2).wrapping_sub(h[1]),
        _ => h[0].wrapping_mul(3).wrapping_sub(h[1].wrapping_mul(3)).wrapping_add(h[2]),
    }
}

/// Timestamps as a grid plus small offsets: `tᵢ = t₀ + i·step + lo + offsets[i]`.
struct Grid {
    t0: i64,
    step: i64,
    lo: i64,
    /// Offsets span `[0, m)`.
    m: u64,
    offsets: Vec<u64>,
}

impl Grid {
    /// The grid, among the average interval and the whole second nearest it, whose offsets
    /// span least; `None` when none spans under 2³² (a long gap in the scrapes).
    fn fit(samples: &[Sample]) -> Option<Grid> {
        let (t0, last) = (samples.first()?.t, samples.last()?.t);
        let span = (last as i128 - t0 as i128) / (samples.len() as i128 - 1);
        let avg = i64::try_from(span).ok()?;
        let second = (avg + 500).div_euclid(1000) * 1000;
        [avg, second].into_iter().filter_map(|step| Grid::with_step(samples, step)).min_by_key(|g| g.m)
    }

    fn with_step(samples: &[Sample], step: i64) -> Option<Grid> {
        let t0 = samples.first()?.t;
        let raw: Vec<i64> = samples
            .iter()
            .enumerate()
            .map(|(i, s)| i64::try_from(s.t as i128 - t0 as i128 - i as i128 * step as i128).ok())
            .collect::<Option<_>>()?;
        let lo = *raw.iter().min()?;
        let hi = *raw.iter().max()?;
        let m = u64::try_from(hi as i128 - lo as i128 + 1).ok().filter(|&m| m <= 1 << 32)?;
        let offsets = raw.iter().map(|&g| g.wrapping_sub(lo) as u64).collect();
        Some(Grid { t0, step, lo, m, offsets })
    }
}

/// How offsets of an `m`-symbol alphabet are packed: `digits` per group of `bits`.
struct Radix {
    digits: u32,
    bits: u32,
}

impl Radix {
    /// The packing that spends the fewest bits per offset with groups of at most 32 bits
    /// (fewer digits on a tie). Both sides derive it from `m`, so it costs no bits.
    fn for_alphabet(m: u64) -> Radix {
        let mut best = Radix { digits: 1, bits: 64 - (m - 1).leading_zeros() };
        let mut span = m as u128; // m^digits
        for digits in 2..=32u32 {
            span *= m as u128;
            if span > 1 << 32 {
                break;
            }
            let bits = 128 - (span - 1).leading_zeros();
            if bits * best.digits < best.bits * digits {
                best = Radix { digits, bits };
            }
        }
        best
    }
}

/// Division of values below 2³² by a fixed divisor below or at 2³², as a multiply (Lemire,
/// Kaser and Kurz, "Faster remainder by direct computation", 2019).
struct FastDiv {
    magic: u64,
}

impl FastDiv {
    fn new(d: u64) -> FastDiv {
        FastDiv { magic: (u64::MAX / d).wrapping_add(1) }
    }

    #[inline(always)]
    fn div(&self, x: u64) -> u64 {
        ((self.magic as u128 * x as u128) >> 64) as u64
    }
}

/// The order, Rice parameter and zigzagged residuals (the first `end - start`) that code
/// `scaled[start..end]` in the fewest bits (the lowest order on a tie).
fn plan_partition(scaled: &[i64], start: usize, end: usize) -> (usize, u32, [u64; PARTITION]) {
    let mut best = (u64::MAX, 1, ZERO_PARTITION, [0u64; PARTITION]);
    // The value `b` places before `i`; the first value stands in for those before it.
    let back = |i: usize, b: usize| if i >= b { scaled[i - b] } else { scaled[0] };
    for order in 1..=4 {
        let mut residuals = [0u64; PARTITION];
        for (z, i) in residuals.iter_mut().zip(start..end) {
            let h = [scaled[i - 1], scaled[i - 2], scaled[i - 3]];
            let prediction = match order {
                1 => predict::<1>(&h),
                2 => predict::<2>(&h),
                3 => predict::<3>(&h),
                _ => mean_of((1..=MEAN_OF).fold(0i64, |a, b| a.wrapping_add(back(i, b)))),
            };
            *z = zigzag(scaled[i].wrapping_sub(prediction));
        }
        let (k, cost) = best_param(&residuals[..end - start]);
        if cost < best.0 {
            best = (cost, order, k, residuals);
        }
    }
    (best.1, best.2, best.3)
}

/// The Rice parameter that codes `part` in the fewest bits, and that number.
fn best_param(part: &[u64]) -> (u32, u64) {
    if part.iter().all(|&z| z == 0) {
        return (ZERO_PARTITION, 0);
    }
    let cost = |k: u32| part.iter().map(|&z| rice_len(z, k)).sum::<u64>();
    // The optimum sits near log2 of the mean; the cost is convex in k, so walk downhill.
    let mean = part.iter().map(|&z| z as u128).sum::<u128>() / part.len() as u128;
    let mut k = (128 - mean.leading_zeros()).min(ZERO_PARTITION - 1);
    let mut best = cost(k);
    while k > 0 {
        let c = cost(k - 1);
        if c > best {
            break;
        }
        (k, best) = (k - 1, c);
    }
    while k + 1 < ZERO_PARTITION {
        let c = cost(k + 1);
        if c >= best {
            break;
        }
        (k, best) = (k + 1, c);
    }
    (k, best)
}

/// A bit reader for the decoding loops: up to 63 bits kept in a register and refilled a
/// word at a time, so consecutive reads depend on a shift, not a load. Zeros past the end;
/// [`overrun`](Self::overrun) tells.
struct BitBuf<'a> {
    bytes: &'a [u8],
    /// Next byte to load.
    next: usize,
    /// Valid bits, left-aligned; the rest are zero.
    buf: u64,
    count: u32,
}

impl<'a> BitBuf<'a> {
    fn at(bytes: &'a [u8], pos: usize) -> Self {
        let mut b = BitBuf { bytes, next: pos / 8, buf: 0, count: 0 };
        b.refill();
        b.consume((pos % 8) as u32);
        b
    }

    #[inline(always)]
    fn load(&self) -> u64 {
        match self.bytes.get(self.next..self.next + 8) {
            Some(b) => u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            None => {
                let mut buf = [0u8; 8];
                let tail = self.bytes.get(self.next..).unwrap_or_default();
                buf[..tail.len()].copy_from_slice(tail);
                u64::from_be_bytes(buf)
            }
        }
    }

    /// Tops the buffer up to at least 56 bits.
    #[inline(always)]
    fn refill(&mut self) {
        self.buf |= self.load() >> self.count;
        self.next += ((63 - self.count) >> 3) as usize;
        self.count |= 56;
    }

    #[inline(always)]
    fn consume(&mut self, n: u32) {
        self.buf <<= n;
        self.count -= n;
    }

    /// The next `n` ≤ 56 bits.
    #[inline(always)]
    fn read(&mut self, n: u32) -> u64 {
        self.refill();
        let v = (self.buf >> (63 - n)) >> 1;
        self.consume(n);
        v
    }

    /// A Rice-coded value with parameter `k`, as [`write_rice`] writes it.
    #[inline(always)]
    fn rice(&mut self, k: u32) -> Option<u64> {
        self.refill();
        let q = self.buf.leading_ones();
        if q < ESCAPE as u32 && q + 1 + k <= 56 {
            let rem = ((self.buf << (q + 1)) >> (63 - k)) >> 1;
            self.consume(q + 1 + k);
            return Some(((q as u64) << k) | rem);
        }
        // Long remainders and escapes: through the general reader.
        let mut r = BitReader { bytes: self.bytes, pos: self.position() };
        let z = match read_rice(&mut r, k)? {
            RiceRead::Value(z) => z,
            RiceRead::Alternative => return None,
        };
        *self = BitBuf::at(self.bytes, r.pos);
        Some(z)
    }

    /// The bit position of the next unread bit.
    fn position(&self) -> usize {
        self.next * 8 - self.count as usize
    }

    fn overrun(&self) -> bool {
        self.position() > self.bytes.len() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(samples: &[Sample]) -> Vec<u8> {
        let bytes = encode(samples).expect("qualifies");
        assert!(is_block(&bytes));
        let mut out = Vec::new();
        decode(&bytes, samples.len(), &mut out).expect("decodes");
        assert_eq!(out.len(), samples.len());
        for (a, b) in out.iter().zip(samples) {
            assert!(a.bit_eq(b), "{a:?} != {b:?}");
        }
        bytes
    }

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn step_bounds_hold_every_step_of_a_jittered_chunk() {
        let mut seed = 11;
        for jitter in [1u64, 40, 900] {
            let samples: Vec<Sample> = (0..500)
                .map(|i| Sample::new(1_700_000_000_000 + i * 5_000 + (lcg(&mut seed) % jitter) as i64, (i % 7) as f64))
                .collect();
            let bytes = roundtrip(&samples);
            let (step, max) = step_bounds(&bytes).expect("a block chunk's header");
            assert_eq!(step, 5_000);
            let worst = samples.windows(2).map(|w| w[1].t - w[0].t).max().unwrap();
            assert!(worst <= max && max < step + jitter as i64, "jitter {jitter}: worst {worst}, bound {max}");
        }
        assert_eq!(step_bounds(&[0u8; 4]), None, "not the block form");
    }

    #[test]
    fn jittered_decimal_gauges_roundtrip_and_pack_offsets_in_mixed_radix() {
        let mut seed = 7;
        let samples: Vec<Sample> = (0..960)
            .map(|i| Sample {
                t: 1_700_000_000_000 + i * 15_000 + (lcg(&mut seed) % 40) as i64,
                v: (300_000 + (lcg(&mut seed) % 10_000) as i64) as f64 / 1000.0,
            })
            .collect();
        let bytes = roundtrip(&samples);
        // 40 jitter values pack 6 to 32 bits: under 5.4 bits per timestamp.
        let ts_bits = 959.0 * 32.0 / 6.0;
        assert!((bytes.len() as f64) * 8.0 < ts_bits + 960.0 * 16.0, "{} bytes", bytes.len());
    }

    #[test]
    fn regular_counters_and_constants_cost_almost_nothing() {
        let counter: Vec<Sample> = (0..960).map(|i| Sample { t: i * 5000, v: (1_000_000 + i * 250) as f64 }).collect();
        assert!(roundtrip(&counter).len() < 40);
        let flat: Vec<Sample> = (0..960).map(|i| Sample { t: 1000 + i * 5000, v: 0.0 }).collect();
        assert!(roundtrip(&flat).len() < 40);
    }

    #[test]
    fn resets_negative_values_and_odd_alphabets_roundtrip() {
        let mut seed = 3;
        for m in [2u64, 3, 7, 41, 255, 256, 257, 65_537, 1 << 20] {
            let samples: Vec<Sample> = (0..500)
                .map(|i| {
                    let v = if i % 97 == 0 { -1e12 } else { (lcg(&mut seed) % 1000) as f64 - 500.0 };
                    Sample { t: i * 10_000 + (lcg(&mut seed) % m) as i64, v }
                })
                .collect();
            roundtrip(&samples);
        }
    }

    #[test]
    fn what_does_not_fit_stays_in_the_stream_encoding() {
        let base: Vec<Sample> = (0..100).map(|i| Sample { t: i * 1000, v: i as f64 }).collect();
        let mut nan = base.clone();
        nan[50].v = f64::NAN;
        assert!(encode(&nan).is_none());
        let mut long = base.clone();
        long[3].v = std::f64::consts::PI;
        assert!(encode(&long).is_none());
        let mut gap = base.clone();
        gap[99].t = i64::MAX / 2;
        assert!(encode(&gap).is_none());
        assert!(encode(&base[..8]).is_none());
    }

    #[test]
    fn damaged_blocks_are_errors_or_samples_never_a_panic() {
        let samples: Vec<Sample> =
            (0..300).map(|i| Sample { t: i * 15_000 + (i * 7 % 23), v: (i * i % 101) as f64 }).collect();
        let bytes = encode(&samples).expect("qualifies");
        let mut out = vec![Sample { t: 1, v: 1.0 }];
        assert!(decode(&bytes[..bytes.len() / 2], samples.len(), &mut out).is_err());
        assert_eq!(out.len(), 1, "a failed decode leaves the buffer as it was");
        let mut seed = 11;
        for _ in 0..2000 {
            let mut b = bytes.clone();
            let i = (lcg(&mut seed) as usize) % b.len();
            b[i] ^= 1 << (lcg(&mut seed) % 8);
            let before = out.len();
            if decode(&b, samples.len(), &mut out).is_ok() {
                assert_eq!(out.len(), before + samples.len());
            } else {
                assert_eq!(out.len(), before);
            }
            let junk: Vec<u8> = (0..(lcg(&mut seed) % 64)).map(|_| lcg(&mut seed) as u8).collect();
            let _ = decode(&junk, (lcg(&mut seed) % 2000) as usize, &mut out);
        }
    }
}
