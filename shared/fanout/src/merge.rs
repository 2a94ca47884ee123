//! Merging one series' chunk lists from several stores, each sample once.

use strata_chunk::Chunk;
use strata_model::Sample;

/// Two chunk lists of one series as one. Lists that do not overlap in time (or hold the
/// same chunks) are joined as they are; otherwise the samples are merged, each timestamp
/// once (the first list's value wins), and re-encoded.
pub(crate) fn merge_chunks(a: Vec<Chunk>, b: Vec<Chunk>) -> Result<Vec<Chunk>, String> {
    let mut all: Vec<Chunk> = a.into_iter().chain(b).collect();
    all.sort_by_key(|c| (c.min_t, c.max_t));
    all.dedup_by(|x, y| x.min_t == y.min_t && x.max_t == y.max_t && x.n == y.n && x.data == y.data);
    if all.windows(2).all(|w| w[0].max_t < w[1].min_t) {
        return Ok(all);
    }
    let mut samples: Vec<Sample> = Vec::new();
    for c in &all {
        samples.extend(c.decode().map_err(|e| e.to_string())?);
    }
    samples.sort_by_key(|s| s.t);
    samples.dedup_by_key(|s| s.t);
    Ok(Chunk::encode_samples(samples))
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_chunk::ChunkAppender;

    fn chunk(ts: impl IntoIterator<Item = i64>) -> Chunk {
        let mut a = ChunkAppender::new();
        for t in ts {
            a.append(t, t as f64 * 2.0);
        }
        a.seal()
    }

    #[test]
    fn overlapping_chunk_lists_merge_to_each_sample_once() {
        // One store holds 0..100, the other 50..150 and a disjoint tail.
        let a = vec![chunk(0..100)];
        let b = vec![chunk(50..150), chunk(200..210)];
        let merged = merge_chunks(a, b).unwrap();
        let mut got = Vec::new();
        Chunk::decode_range(&merged, i64::MIN, i64::MAX, &mut got).unwrap();
        let want: Vec<i64> = (0..150).chain(200..210).collect();
        assert_eq!(got.iter().map(|s| s.t).collect::<Vec<_>>(), want);
        assert!(got.iter().all(|s| s.v == s.t as f64 * 2.0));
        // Disjoint lists are joined as they are.
        let joined = merge_chunks(vec![chunk(0..10)], vec![chunk(20..30)]).unwrap();
        assert_eq!(joined.len(), 2);
    }
}
