//! Samples and Prometheus' staleness marker.

/// Prometheus' staleness marker: a NaN with this exact bit pattern means "the series ended here".
pub const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// The staleness marker as a float.
pub fn stale_nan() -> f64 {
    f64::from_bits(STALE_NAN_BITS)
}

/// True when `v` is the staleness marker (an ordinary NaN is not).
pub fn is_stale(v: f64) -> bool {
    v.to_bits() == STALE_NAN_BITS
}

/// One sample: a millisecond timestamp and a value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub t: i64,
    pub v: f64,
}

impl Sample {
    pub fn new(t: i64, v: f64) -> Self {
        Sample { t, v }
    }

    /// Equal timestamps and bit-identical values (so NaN equals NaN, stale equals stale).
    pub fn bit_eq(&self, other: &Sample) -> bool {
        self.t == other.t && self.v.to_bits() == other.v.to_bits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_marker_is_distinct_from_nan() {
        assert!(is_stale(stale_nan()));
        assert!(!is_stale(f64::NAN));
        assert!(stale_nan().is_nan());
    }
}
