//! An open chunk continued by another copy of it.
//!
//! The streaming coder is deterministic: two heads that appended the same samples to a
//! chunk begun at the same sample hold the same bits, up to where the shorter one ends. An
//! edge and the regional it forwards to are such heads, so after an outage that began
//! inside an open chunk the edge can send that chunk as it holds it (no decoding of what
//! came before the outage, no encoding), and the regional checks that the chunk's first
//! bits are its own open chunk's, decodes only the bits after them, and takes the chunk's
//! bytes as its open chunk from then on. The decoder's state after a sample is the
//! encoder's (both derive it from the samples alone), so appends go on from there exactly
//! as if the samples had been appended one by one.

use crate::appender::ChunkAppender;
use crate::bits::{low_mask, BitWriter};
use crate::iter::ChunkIter;
use crate::sealed::Chunk;
use crate::timestamp::TsState;
use crate::value::ValueState;
use crate::ChunkError;
use strata_model::Sample;

/// What [`ChunkAppender::continued_by`] took from a chunk.
#[derive(Debug)]
pub struct Continued {
    /// The appender after the samples taken.
    pub appender: ChunkAppender,
    /// The samples taken (those the chunk holds after the appender's own, up to the bound).
    pub samples: Vec<Sample>,
}

impl ChunkAppender {
    /// Whether `c` starts with this appender's bits: a streaming-encoded chunk begun at the
    /// same sample, holding more samples. An empty appender is continued by any streaming
    /// chunk.
    pub fn is_continued_by(&self, c: &Chunk) -> bool {
        if c.is_block() || c.n <= self.n {
            return false;
        }
        if self.n == 0 {
            return true;
        }
        let full = self.w.bytes.len();
        if c.min_t != self.min_t() || c.data.len() < self.w.len() || c.data[..full] != self.w.bytes[..] {
            return false;
        }
        let rest = self.w.nacc;
        rest == 0 || (u64::from(c.data[full]) >> (8 - rest)) & low_mask(rest) == self.w.acc
    }

    /// This appender continued by `c` (see the module) up to its last sample at or before
    /// `through`; `Ok(None)` when `c` does not continue it ([`is_continued_by`]). Only the
    /// bits after this appender's are decoded; damage there (bits that run out, a timestamp
    /// that does not increase) is an error and nothing is taken.
    ///
    /// [`is_continued_by`]: Self::is_continued_by
    pub fn continued_by(&self, c: &Chunk, through: i64) -> Result<Option<Continued>, ChunkError> {
        if !self.is_continued_by(c) {
            return Ok(None);
        }
        let (pos, ts, vs) = if self.n == 0 {
            (0, TsState::new(0), ValueState::default())
        } else {
            (self.w.bytes.len() * 8 + self.w.nacc as usize, self.ts.clone(), self.vs.clone())
        };
        let mut it = ChunkIter::resumed(&c.data, c.n, self.n, pos, ts, vs);
        let mut samples = Vec::with_capacity(usize::from(c.n - self.n));
        while let Some(s) = it.step_through(through) {
            samples.push(s);
        }
        if let Some(e) = it.error() {
            return Err(e);
        }
        // The header's first timestamp places the chunk (its block window, whether it
        // starts after what is stored): it must be the data's.
        if self.n == 0 && samples.first().is_some_and(|f| f.t != c.min_t) {
            return Err(ChunkError::Header("its first timestamp"));
        }
        if samples.last().is_some_and(|l| l.t > c.max_t) {
            return Err(ChunkError::Header("its last timestamp"));
        }
        let end = it.r.pos;
        let (full, rest) = (end / 8, (end % 8) as u32);
        // Room for what was decoded and some appends, not for bytes after them.
        let mut w = BitWriter { bytes: Vec::with_capacity(full + 1 + full / 8), acc: 0, nacc: 0 };
        w.bytes.extend_from_slice(&c.data[..full]);
        if rest > 0 {
            w.acc = (u64::from(c.data[full]) >> (8 - rest)) & low_mask(rest);
            w.nacc = rest;
        }
        let appender =
            if it.read == 0 { ChunkAppender::new() } else { ChunkAppender { w, ts: it.ts, vs: it.vs, n: it.read } };
        Ok(Some(Continued { appender, samples }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_model::stale_nan;

    fn appended(samples: &[Sample]) -> ChunkAppender {
        let mut a = ChunkAppender::new();
        for s in samples {
            a.append(s.t, s.v);
        }
        a
    }

    /// Jittered scrapes; values that take every path of the coder: decimals, a finer
    /// decimal (rescale), counters, NaN, a staleness marker, a non-decimal float.
    fn series(n: usize, seed: u64) -> Vec<Sample> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut t = 1_700_000_000_000i64;
        let mut counter = 0.0;
        (0..n)
            .map(|i| {
                t += 5000 + (next() % 40) as i64;
                counter += (next() % 1000) as f64;
                let v = match (seed % 3, i % 97) {
                    (_, 13) => f64::NAN,
                    (_, 41) => stale_nan(),
                    (_, 77) => std::f64::consts::PI * i as f64,
                    (0, _) => counter,
                    (1, 50) => 1.234,
                    (1, _) => (next() % 10_000) as f64 / 10.0,
                    _ => f64::from_bits(next()),
                };
                Sample::new(t, v)
            })
            .collect()
    }

    fn same(a: &[Sample], b: &[Sample]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.bit_eq(y))
    }

    /// Continued from any point by a longer copy, up to any bound, the appender holds what
    /// appending those samples one by one would have given: the same bytes, and appends
    /// after it give the same bytes too (so its coder's state is the same).
    #[test]
    fn a_continued_appender_is_the_one_that_appended_every_sample() {
        for seed in 0..6 {
            let all = series(400, seed);
            let whole = appended(&all).seal();
            for have in [0, 1, 2, 3, 17, 150, 399] {
                for take in [have + 1, have + 2, have + 60, 400] {
                    if take > 400 {
                        continue;
                    }
                    let mine = appended(&all[..have]);
                    let through = all[take - 1].t;
                    let c = mine.continued_by(&whole, through).unwrap().expect("continues");
                    assert!(same(&c.samples, &all[have..take]), "seed {seed} have {have} take {take}");
                    let mut got = c.appender;
                    let want = appended(&all[..take]);
                    assert_eq!(got.seal(), want.seal(), "seed {seed} have {have} take {take}");
                    for s in &all[take..] {
                        got.append(s.t, s.v);
                    }
                    assert_eq!(got.seal(), whole, "seed {seed} have {have} take {take}");
                }
            }
        }
    }

    /// A bound between two samples takes those before it; one before the first new sample
    /// takes nothing and leaves the appender as it was.
    #[test]
    fn the_bound_is_inclusive_and_may_take_nothing() {
        let all = series(100, 1);
        let whole = appended(&all).seal();
        let mine = appended(&all[..40]);
        let c = mine.continued_by(&whole, all[60].t - 1).unwrap().unwrap();
        assert!(same(&c.samples, &all[40..60]));
        let c = mine.continued_by(&whole, all[40].t - 1).unwrap().unwrap();
        assert!(c.samples.is_empty());
        assert_eq!(c.appender.seal(), mine.seal());
        let c = ChunkAppender::new().continued_by(&whole, all[0].t - 1).unwrap().unwrap();
        assert!(c.samples.is_empty() && c.appender.is_empty());
    }

    /// A chunk that is not a longer copy of the appender is not taken: another first sample,
    /// one differing value, fewer samples, the block encoding.
    #[test]
    fn a_chunk_that_does_not_start_with_the_appenders_bits_is_not_taken() {
        let all = series(200, 0);
        let mine = appended(&all[..100]);
        let mut other = all.clone();
        other[50].v += 1.0;
        let later = appended(&all[1..]).seal();
        let shorter = appended(&all[..100]).seal();
        let gauge: Vec<_> = (0..200).map(|i| Sample::new(i * 5000, (i % 7) as f64)).collect();
        let block = Chunk::encode_sealed(&gauge).remove(0);
        assert!(block.is_block());
        assert!(!ChunkAppender::new().is_continued_by(&block));
        for c in [appended(&other).seal(), later, shorter, block] {
            assert!(!mine.is_continued_by(&c));
            assert!(mine.continued_by(&c, i64::MAX).unwrap().is_none());
        }
    }

    /// Bits after the appender's that do not decode (cut short, or garbage), or a count
    /// that claims more samples than the bits hold: an error, nothing taken, no panic.
    #[test]
    fn damage_after_the_shared_bits_is_an_error() {
        let all = series(300, 1);
        let whole = appended(&all).seal();
        let mine = appended(&all[..100]);
        let cut = Chunk { data: whole.data[..whole.data.len() / 2].into(), ..whole.clone() };
        assert!(mine.continued_by(&cut, i64::MAX).is_err());
        let liar = Chunk { n: 960, ..whole.clone() };
        assert!(mine.continued_by(&liar, i64::MAX).is_err());
        // A header whose first or last timestamp is not the data's would misplace the chunk.
        let moved = Chunk { min_t: whole.min_t + 1, ..whole.clone() };
        assert!(ChunkAppender::new().continued_by(&moved, i64::MAX).is_err());
        let short = Chunk { max_t: whole.max_t - 1, ..whole.clone() };
        assert!(mine.continued_by(&short, i64::MAX).is_err());
        let mut x = 7u64;
        for _ in 0..200 {
            let mut bytes = whole.data.to_vec();
            for b in bytes.iter_mut().skip(mine.byte_len()) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                *b = (x >> 56) as u8;
            }
            let garbage = Chunk { data: bytes.into(), ..whole.clone() };
            // Garbage may decode to samples (any bits are some samples), never to a
            // timestamp that goes back, and never panics.
            if let Ok(Some(c)) = mine.continued_by(&garbage, i64::MAX) {
                assert!(c.samples.windows(2).all(|w| w[0].t < w[1].t));
                assert!(c.samples.first().is_none_or(|s| s.t > all[99].t));
            }
        }
    }
}
