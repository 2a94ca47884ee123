//! The sealed chunk: immutable bytes plus the count and time range a reader needs to
//! skip it without decoding.

use crate::block;
use crate::iter::ChunkIter;
use crate::ChunkError;
use std::sync::Arc;
use strata_model::Sample;

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

    /// Samples (time-ordered) as chunks in the streaming encoding, each full at
    /// [`CHUNK_MAX_SAMPLES`](crate::CHUNK_MAX_SAMPLES) but the last: for merges that produce
    /// new samples (replica dedup, overlapping stores).
    pub fn encode_samples(samples: impl IntoIterator<Item = Sample>) -> Vec<Chunk> {
        let mut out = Vec::new();
        let mut app = crate::ChunkAppender::new();
        for s in samples {
            app.append(s.t, s.v);
            if app.is_full() {
                out.push(app.seal());
                app = crate::ChunkAppender::new();
            }
        }
        if !app.is_empty() {
            out.push(app.seal());
        }
        out
    }

    /// Samples (time-ordered) as sealed chunks of at most
    /// [`CHUNK_MAX_SAMPLES`](crate::CHUNK_MAX_SAMPLES), each in the block encoding when its
    /// samples qualify, else in the streaming one: what a head would hold once they were
    /// sealed, without replaying the streaming coder first (a backlog sent between tiers).
    pub fn encode_sealed(samples: &[Sample]) -> Vec<Chunk> {
        samples
            .chunks(crate::CHUNK_MAX_SAMPLES as usize)
            .filter(|piece| !piece.is_empty())
            .map(|piece| {
                let (min_t, max_t) = (piece[0].t, piece[piece.len() - 1].t);
                match block::encode(piece) {
                    Some(bytes) => Chunk { data: Arc::from(bytes), n: piece.len() as u16, min_t, max_t },
                    None => {
                        let mut app = crate::ChunkAppender::with_capacity(piece.len() * 2);
                        for s in piece {
                            app.append(s.t, s.v);
                        }
                        app.seal()
                    }
                }
            })
            .collect()
    }

    /// For a block-encoded chunk, its grid step and an upper bound of the step between any
    /// two consecutive samples, from the header without decoding (HA dedup tells a gap-free
    /// replica by it). `None` for the streaming encoding.
    pub fn step_bounds(&self) -> Option<(i64, i64)> {
        block::step_bounds(&self.data)
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
            Some(bytes) if bytes.len() <= self.data.len() + self.data.len() / 32 => {
                Chunk { data: Arc::from(bytes), ..self }
            }
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

    /// Appends every sample to `out` and checks that they are what the header declares:
    /// `n` samples from `min_t` to `max_t`, each later than the one before. A chunk from a
    /// peer or a file is taken whole (stored as it came) only after this passed, so a
    /// header that lies never orders or counts a series' chunks wrongly.
    pub fn decode_checked(&self, out: &mut Vec<Sample>) -> Result<(), String> {
        let from = out.len();
        self.decode_into(i64::MIN, i64::MAX, out).map_err(|e| e.to_string())?;
        let got = &out[from..];
        if got.len() != self.n as usize
            || got.first().map(|x| x.t) != Some(self.min_t)
            || got.last().map(|x| x.t) != Some(self.max_t)
        {
            return Err(format!(
                "the chunk does not hold the {} samples over [{}, {}] it declares",
                self.n, self.min_t, self.max_t
            ));
        }
        if got.windows(2).any(|w| w[0].t >= w[1].t) {
            return Err("the chunk's timestamps do not increase".into());
        }
        Ok(())
    }

    /// Appends the samples within `[mint, maxt]` to `out`; stops decoding past `maxt`.
    pub fn decode_into(&self, mint: i64, maxt: i64, out: &mut Vec<Sample>) -> Result<(), ChunkError> {
        if mint > maxt {
            return Ok(());
        }
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

    /// Appends the samples within `[from, through]` to `out`, after checking that they lie
    /// where the header says the chunk does (a header that lies would place the chunk
    /// wrongly) and increase; decodes nothing past `through`.
    pub fn decode_bounded(&self, from: i64, through: i64, out: &mut Vec<Sample>) -> Result<(), ChunkError> {
        let mut all = Vec::new();
        self.decode_into(i64::MIN, through, &mut all)?;
        if all.first().is_some_and(|f| f.t != self.min_t) {
            return Err(ChunkError::Header("its first timestamp"));
        }
        if all.last().is_some_and(|l| l.t > self.max_t) {
            return Err(ChunkError::Header("its last timestamp"));
        }
        if all.windows(2).any(|w| w[0].t >= w[1].t) {
            return Err(ChunkError::Header("timestamps that do not increase"));
        }
        out.extend(all.into_iter().filter(|s| s.t >= from));
        Ok(())
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
