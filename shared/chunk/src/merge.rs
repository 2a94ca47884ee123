//! One series' chunks from several sources (overlapping blocks, stores behind a fan-out)
//! as one time-ordered list, each timestamp once.
//!
//! Lists that do not overlap in time are joined as they are, never decoded. Otherwise the
//! samples are merged and re-encoded; where two sources hold different values at one
//! timestamp, the first source's value is kept and the disagreement is counted, so the
//! caller can say so instead of choosing in silence.

use crate::{Chunk, ChunkError};
use strata_model::Sample;

/// What a merge gave: the chunks, and the timestamps whose values disagreed.
#[derive(Debug, Default)]
pub struct Merged {
    pub chunks: Vec<Chunk>,
    pub conflicts: u64,
}

/// Whether the chunks are in strictly increasing time order, none overlapping.
pub fn in_order(chunks: &[Chunk]) -> bool {
    chunks.windows(2).all(|w| w[0].max_t < w[1].min_t)
}

/// Merges the chunk lists of one series; `sources` in priority order (on a conflict the
/// earlier source's value wins).
pub fn merge_sources(sources: Vec<Vec<Chunk>>) -> Result<Merged, ChunkError> {
    merge_sources_within(sources, i64::MIN, i64::MAX)
}

/// [`merge_sources`] of what a selection of `[mint, maxt]` needs: chunks outside it are
/// dropped, and overlapping ones are merged from their samples inside it only. A short
/// selection of two stores that hold the same series in chunks cut differently (an edge's
/// block and a regional's head) then decodes and encodes its minutes, not whole chunks.
pub fn merge_sources_within(sources: Vec<Vec<Chunk>>, mint: i64, maxt: i64) -> Result<Merged, ChunkError> {
    let mut all: Vec<(usize, Chunk)> = sources
        .into_iter()
        .enumerate()
        .flat_map(|(i, cs)| cs.into_iter().filter(|c| c.overlaps(mint, maxt)).map(move |c| (i, c)))
        .collect();
    all.sort_by_key(|(i, c)| (c.min_t, c.max_t, *i));
    // The same chunk from two sources (a series two stores both hold) is one chunk.
    all.dedup_by(|x, y| x.1.min_t == y.1.min_t && x.1.max_t == y.1.max_t && x.1.n == y.1.n && x.1.data == y.1.data);
    let chunks: Vec<Chunk> = all.iter().map(|(_, c)| c.clone()).collect();
    if in_order(&chunks) {
        return Ok(Merged { chunks, conflicts: 0 });
    }
    let mut samples: Vec<(i64, usize, f64)> = Vec::new();
    let mut buf = Vec::new();
    for (i, c) in &all {
        buf.clear();
        c.decode_into(mint, maxt, &mut buf)?;
        samples.extend(buf.iter().map(|s| (s.t, *i, s.v)));
    }
    samples.sort_by_key(|&(t, i, _)| (t, i));
    let mut out: Vec<Sample> = Vec::with_capacity(samples.len());
    let mut conflicts = 0u64;
    for (t, _, v) in samples {
        match out.last() {
            Some(last) if last.t == t => {
                if last.v.to_bits() != v.to_bits() {
                    conflicts += 1;
                }
            }
            _ => out.push(Sample::new(t, v)),
        }
    }
    Ok(Merged { chunks: Chunk::encode_samples(out).into_iter().map(Chunk::compact).collect(), conflicts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ChunkAppender;

    fn chunk(ts: impl IntoIterator<Item = i64>, scale: f64) -> Chunk {
        let mut a = ChunkAppender::new();
        for t in ts {
            a.append(t, t as f64 * scale);
        }
        a.seal()
    }

    fn samples(chunks: &[Chunk]) -> Vec<Sample> {
        let mut v = Vec::new();
        Chunk::decode_range(chunks, i64::MIN, i64::MAX, &mut v).unwrap();
        v
    }

    #[test]
    fn overlapping_lists_merge_to_each_sample_once_and_disjoint_ones_join_as_they_are() {
        let m = merge_sources(vec![vec![chunk(0..100, 2.0)], vec![chunk(50..150, 2.0), chunk(200..210, 2.0)]]).unwrap();
        let got = samples(&m.chunks);
        let want: Vec<i64> = (0..150).chain(200..210).collect();
        assert_eq!(got.iter().map(|s| s.t).collect::<Vec<_>>(), want);
        assert!(got.iter().all(|s| s.v == s.t as f64 * 2.0));
        assert_eq!(m.conflicts, 0);
        assert!(in_order(&m.chunks));
        let joined = merge_sources(vec![vec![chunk(0..10, 1.0)], vec![chunk(20..30, 1.0)]]).unwrap();
        assert_eq!(joined.chunks.len(), 2);
        // Out of order as given (a later block listed first): put in order, not decoded.
        let c = merge_sources(vec![vec![chunk(20..30, 1.0), chunk(0..10, 1.0)]]).unwrap();
        assert_eq!(samples(&c.chunks).len(), 20);
        assert!(in_order(&c.chunks));
    }

    #[test]
    fn a_disagreement_keeps_the_first_sources_value_and_is_counted() {
        let m = merge_sources(vec![vec![chunk(0..10, 1.0)], vec![chunk(5..15, 3.0)]]).unwrap();
        let got = samples(&m.chunks);
        assert_eq!(got.len(), 15);
        assert_eq!(m.conflicts, 5, "5 to 9 disagree");
        assert_eq!(got[7], Sample::new(7, 7.0), "the first source wins");
        assert_eq!(got[12], Sample::new(12, 36.0));
    }

    #[test]
    fn a_merge_within_a_range_keeps_exactly_its_samples_each_once() {
        let sources = || vec![vec![chunk(0..100, 2.0), chunk(300..310, 2.0)], vec![chunk(50..150, 2.0)]];
        let m = merge_sources_within(sources(), 90, 120).unwrap();
        let got = samples(&m.chunks);
        assert_eq!(got.iter().map(|s| s.t).collect::<Vec<_>>(), (90..=120).collect::<Vec<_>>());
        assert!(got.iter().all(|s| s.v == s.t as f64 * 2.0));
        // Within the range the answer is the whole merge's.
        let whole = samples(&merge_sources(sources()).unwrap().chunks);
        assert_eq!(got, whole.into_iter().filter(|s| (90..=120).contains(&s.t)).collect::<Vec<_>>());
        // Chunks that do not overlap are neither decoded nor kept; ones in order pass whole.
        let apart = merge_sources_within(vec![vec![chunk(0..10, 1.0)], vec![chunk(20..30, 1.0)]], 25, 40).unwrap();
        assert_eq!(apart.chunks.len(), 1);
        assert_eq!(apart.chunks[0].min_t, 20);
    }
}
