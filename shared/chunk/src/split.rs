//! A block-encoded chunk split into its timestamp bits and the rest, and joined back:
//! every series a target exposes is scraped at the same instants, so their chunks hold the
//! same timestamp bits, and a container that stores many chunks (the head checkpoint)
//! keeps each distinct run of timestamp bits once. Joining gives back the chunk's bytes
//! exactly.

use crate::bits::{BitReader, BitWriter};
use crate::{block, Chunk};
use std::sync::Arc;

/// Bits before the timestamps: the block tag and the value scale.
const HEAD_BITS: usize = 6;

/// A chunk's bytes without their timestamps, and the timestamps on their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The timestamp bits, packed from the first bit, and how many there are.
    pub times: Vec<u8>,
    pub time_bits: u32,
    /// The head bits and the value bits, packed from the first bit, and how many.
    pub rest: Vec<u8>,
    pub rest_bits: u32,
}

/// Copies bits `[from, to)` of `src` onto the end of `w`.
fn copy_bits(src: &[u8], from: usize, to: usize, w: &mut BitWriter) {
    let mut r = BitReader { bytes: src, pos: from };
    let mut left = to - from;
    while left > 0 {
        let n = left.min(32) as u32;
        w.write_bits(r.read_bits(n), n);
        left -= n as usize;
    }
}

fn packed(w: &BitWriter) -> (Vec<u8>, u32) {
    (w.to_bytes(), (w.bytes.len() * 8 + w.nacc as usize) as u32)
}

impl Chunk {
    /// The chunk split at its timestamps; `None` unless it is block-encoded.
    pub fn split_times(&self) -> Option<Split> {
        let end = block::timestamp_bits_end(&self.data, self.n as usize)?;
        let total = self.data.len() * 8;
        let (mut t, mut r) = (BitWriter::default(), BitWriter::default());
        copy_bits(&self.data, HEAD_BITS, end, &mut t);
        copy_bits(&self.data, 0, HEAD_BITS, &mut r);
        copy_bits(&self.data, end, total, &mut r);
        let ((times, time_bits), (rest, rest_bits)) = (packed(&t), packed(&r));
        Some(Split { times, time_bits, rest, rest_bits })
    }

    /// The chunk a [`split_times`](Self::split_times) came from, given its count and range;
    /// `None` when the parts do not hold the bits they say.
    pub fn join_times(s: &Split, n: u16, min_t: i64, max_t: i64) -> Option<Chunk> {
        let (tb, rb) = (s.time_bits as usize, s.rest_bits as usize);
        if rb < HEAD_BITS || s.times.len() * 8 < tb || s.rest.len() * 8 < rb {
            return None;
        }
        let mut w = BitWriter::default();
        copy_bits(&s.rest, 0, HEAD_BITS, &mut w);
        copy_bits(&s.times, 0, tb, &mut w);
        // The rest ends with the original's padding bits: the join has its length.
        copy_bits(&s.rest, HEAD_BITS, rb, &mut w);
        let data: Arc<[u8]> = Arc::from(w.to_bytes());
        Some(Chunk { data, n, min_t, max_t })
    }
}

#[cfg(test)]
mod tests {
    use crate::{Chunk, ChunkAppender};

    fn block(offset: i64, scale: f64) -> Chunk {
        let mut a = ChunkAppender::new();
        for i in 0..200i64 {
            a.append(offset + i * 15_000 + (i * 7) % 23, (300_000 + i * 104_729 % 9_973) as f64 / scale);
        }
        let c = a.seal().compact();
        assert!(c.is_block());
        c
    }

    #[test]
    fn a_split_joins_back_to_the_same_bytes_and_shares_timestamps() {
        let (a, b) = (block(0, 1000.0), block(0, 100.0));
        let (sa, sb) = (a.split_times().unwrap(), b.split_times().unwrap());
        assert_eq!((&sa.times, sa.time_bits), (&sb.times, sb.time_bits), "same scrapes, same timestamp bits");
        assert_ne!(sa.rest, sb.rest);
        for (c, s) in [(&a, &sa), (&b, &sb)] {
            let back = Chunk::join_times(s, c.n, c.min_t, c.max_t).unwrap();
            assert_eq!(back, *c);
            assert_eq!(back.decode().unwrap(), c.decode().unwrap());
        }
        assert_ne!(block(5_001, 1000.0).split_times().unwrap().times, sa.times);
        // The streaming encoding has no separate timestamps.
        let mut app = ChunkAppender::new();
        app.append(0, f64::NAN);
        app.append(1, 1.0);
        assert!(app.seal().split_times().is_none());
        // Parts that do not hold what they claim are refused, not read past.
        let mut bad = sa.clone();
        bad.time_bits += 64;
        assert!(Chunk::join_times(&bad, a.n, a.min_t, a.max_t).is_none());
    }
}
