//! Per-series compressed chunks, appended sample by sample.
//!
//! Every sample after a chunk's first is coded as a residual against a prediction, with an
//! adaptive Rice code whose parameter follows the running mean of recent residuals (so a
//! steady series costs about a bit per value and a noisy one about its entropy, with no
//! per-chunk tuning and no bits spent on the parameter):
//!
//! * **timestamps**: two predictors compete per sample (see `timestamp::TsState`): delta of delta
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
//!
//! Modules, one mechanism each: [`scale`] (exact decimals), [`bits`] (bit I/O), [`rice`]
//! (adaptive Rice codes), [`value`] and [`timestamp`] (the predictors both sides share),
//! [`appender`] (the open chunk), [`sealed`] and [`iter`] (the sealed chunk and its
//! decoder), [`block`] (the batch encoding sealed chunks are transcoded into), [`column`]
//! (the value coding alone, for columns whose times are implied), [`resume`] (an open chunk
//! continued by a longer copy of itself, decoding only what it lacks).

mod appender;
mod bits;
mod block;
pub mod column;
mod iter;
pub mod merge;
pub mod resume;
mod rice;
mod scale;
mod sealed;
pub mod split;
mod timestamp;
mod value;

pub use appender::ChunkAppender;
pub use iter::ChunkIter;
pub use resume::Continued;
pub use scale::{from_decimal, to_decimal};
pub use sealed::Chunk;

/// Samples per chunk before it is sealed (Prometheus uses 120).
pub const CHUNK_MAX_SAMPLES: u16 = 960;

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ChunkError {
    #[error("chunk data ends early after {0} samples")]
    Truncated(u16),
    #[error("the chunk's data does not match its header: {0}")]
    Header(&'static str),
}

#[cfg(test)]
mod tests;
