//! Downsampling: per-series window aggregates from which PromQL answers as it would from
//! the raw samples.
//!
//! A window is `(k·W, (k+1)·W]`, left-open like Prometheus 3's ranges and stamped at its
//! end, so a range `(E − R, E]` with `E` on a window end and `R` a whole number of windows
//! is exactly a run of windows. Per window ([`Window`]) we keep what makes each range
//! function decompose: count, Kahan sum, min and max, first, last and the sample before
//! it, changes and resets with their boundary values, a counter's reset correction, and
//! for gauges the exact moments (count × M2) and least-squares sums. Runs of windows
//! combine ([`range`]) with the same arithmetic the engine uses on samples
//! (`strata_model::arith`), so counts, extremes, first, last, changes and resets are bit
//! for bit the raw answer and sums agree to rounding. [`leaf`] says when a query's leaf
//! may be answered this way and answers it; [`encoding`] stores a series' windows as
//! columns in the chunk crate's value coding, the columns a metric type needs and no more;
//! [`window_cache`] keeps what queries decoded of them for the queries to come.
//! `quantile_over_time` and the like do not decompose: [`RangeFn::parse`] refuses them and
//! the caller reads finer data.

pub mod answer;
pub mod blocks;
pub mod cache;
pub mod columns;
pub mod counter_index;
pub mod downsampler;
pub mod encoding;
pub mod leaf;
pub mod plan;
pub mod progress;
pub mod range;
pub mod store;
pub mod window;
pub mod window_cache;

pub use columns::{WindowColumns, WindowRun};
pub use downsampler::{DownsampleOptions, Downsampler};
pub use encoding::{column_sizes, decode, decode_columns, decode_served, encode, header, DecodeError, Wanted};
pub use leaf::{check, evaluate, Grid, Leaf, NotExact};
pub use plan::{Prefer, ResolutionPlanner};
pub use range::RangeFn;
pub use store::WithAggregates;
pub use window::{window_end, windows_of, Window};

use strata_model::MetricType;

/// The two resolutions, in ms.
pub const FIVE_MINUTES: i64 = 300_000;
pub const ONE_HOUR: i64 = 3_600_000;

/// The aggregates kept only when asked for (both cost more than they are used).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Asked {
    /// `deriv`'s and `predict_linear`'s sums, for gauges too.
    pub least_squares: bool,
    /// When the extremes were taken.
    pub extreme_times: bool,
}

/// Which optional aggregates a series keeps. Its metric type decides the first two: a
/// counter needs its reset correction and no moments, a gauge the moments and no
/// correction, a series of another or unknown type both. The least-squares sums of
/// `deriv` and `predict_linear` cost more than everything else together (the scrape
/// jitter of every sample is in them), so they are kept only when asked for. So are the
/// times of the extremes (`ts_of_min_over_time`, `ts_of_max_over_time`, experimental in
/// Prometheus): a jittered scrape's time costs about 19 bits a window, a third more bytes
/// for a noisy gauge. Without them those functions read finer data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    pub correction: bool,
    pub moments: bool,
    pub least_squares: bool,
    pub extreme_times: bool,
}

impl Kept {
    /// Everything: what tests and backfills that want every function use.
    pub const ALL: Kept = Kept { correction: true, moments: true, least_squares: true, extreme_times: true };

    pub fn of(t: MetricType, asked: Asked) -> Kept {
        let Asked { least_squares, extreme_times } = asked;
        match t {
            MetricType::Counter => Kept { correction: true, moments: false, least_squares: false, extreme_times },
            MetricType::Gauge => Kept { correction: false, moments: true, least_squares, extreme_times },
            _ => Kept { correction: true, moments: true, least_squares, extreme_times },
        }
    }

    /// What both keep.
    pub fn and(self, o: Kept) -> Kept {
        Kept {
            correction: self.correction && o.correction,
            moments: self.moments && o.moments,
            least_squares: self.least_squares && o.least_squares,
            extreme_times: self.extreme_times && o.extreme_times,
        }
    }

    pub(crate) fn byte(self) -> u8 {
        u8::from(self.correction)
            | u8::from(self.moments) << 1
            | u8::from(self.least_squares) << 2
            | u8::from(self.extreme_times) << 3
    }

    fn from_byte(b: u8) -> Option<Kept> {
        (b < 16).then_some(Kept {
            correction: b & 1 != 0,
            moments: b & 2 != 0,
            least_squares: b & 4 != 0,
            extreme_times: b & 8 != 0,
        })
    }
}

#[cfg(test)]
mod downsampler_tests;
#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod store_tests;
#[cfg(test)]
mod tests;
