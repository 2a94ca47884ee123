//! Per-series precomputations that make overlapping range windows cheap. A range query
//! with a 1 h window and a 5 m step visits every sample twelve times; these let a window
//! be answered from its ends instead, and each gives bit for bit the result of the direct
//! computation, so they are an optimisation and never a different answer.

use strata_model::Sample;

/// 2⁵³: integers below it, and their sums below it, are exact in an f64.
const EXACT: u64 = 1 << 53;

/// Prefix sums of a series whose values are all integers (and none is -0.0) with an
/// absolute sum below 2⁵³. Then every partial sum of any window is an exact f64, Kahan's
/// compensation stays zero, and the window's sum is the difference of two prefix sums.
/// DCGM reports most gauges and every counter as integers.
pub struct IntegerPrefix(Vec<i64>);

impl IntegerPrefix {
    pub fn new(samples: &[Sample]) -> Option<IntegerPrefix> {
        let mut sums = Vec::with_capacity(samples.len() + 1);
        let (mut acc, mut abs) = (0i64, 0u64);
        sums.push(0);
        for s in samples {
            // The cast saturates (NaN gives 0), so a value that is not an integer, or is
            // -0.0, NaN or ±Inf, does not come back as the same bits.
            let i = s.v as i64;
            if (i as f64).to_bits() != s.v.to_bits() || i.unsigned_abs() >= EXACT {
                return None;
            }
            abs += i.unsigned_abs();
            if abs >= EXACT {
                return None;
            }
            acc += i;
            sums.push(acc);
        }
        Some(IntegerPrefix(sums))
    }

    /// The sum of the values `a..b`.
    pub fn sum(&self, a: usize, b: usize) -> f64 {
        (self.0[b] - self.0[a]) as f64
    }
}

/// Where a counter drops (`v[i] < v[i-1]`, a reset), so that a window's reset correction
/// walks only its resets, adding them in the order the direct loop would.
pub struct Resets(Vec<usize>);

impl Resets {
    pub fn new(samples: &[Sample]) -> Resets {
        Resets((1..samples.len()).filter(|&i| samples[i].v < samples[i - 1].v).collect())
    }

    /// Resets after the first sample of the window `a..b`, as the positions that dropped.
    pub fn within(&self, a: usize, b: usize) -> &[usize] {
        let from = self.0.partition_point(|&i| i <= a);
        let to = self.0.partition_point(|&i| i < b);
        &self.0[from..to.max(from)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{kahan_sum, mean};

    fn series(vals: &[f64]) -> Vec<Sample> {
        vals.iter().enumerate().map(|(i, &v)| Sample { t: i as i64 * 1000, v }).collect()
    }

    #[test]
    fn prefix_sums_equal_the_direct_kahan_sum_and_mean_bit_for_bit() {
        let vals: Vec<f64> = (0..500).map(|i| ((i * 7919) % 1000) as f64 - 300.0).collect();
        let s = series(&vals);
        let p = IntegerPrefix::new(&s).expect("integers");
        for (a, b) in [(0, 500), (3, 4), (10, 250), (499, 500), (100, 100)] {
            let direct = kahan_sum(vals[a..b].iter().copied());
            assert_eq!(p.sum(a, b).to_bits(), direct.to_bits(), "{a}..{b}");
            if b > a {
                assert_eq!((p.sum(a, b) / (b - a) as f64).to_bits(), mean(vals[a..b].iter().copied()).to_bits());
            }
        }
    }

    #[test]
    fn prefix_sums_refuse_what_would_not_be_exact() {
        assert!(IntegerPrefix::new(&series(&[1.0, 2.5])).is_none());
        assert!(IntegerPrefix::new(&series(&[1.0, f64::NAN])).is_none());
        assert!(IntegerPrefix::new(&series(&[f64::INFINITY])).is_none());
        assert!(IntegerPrefix::new(&series(&[-0.0, 1.0])).is_none());
        assert!(IntegerPrefix::new(&series(&[4e15, 4e15, 4e15])).is_none());
        assert!(IntegerPrefix::new(&series(&[4e15, -4e15])).is_some());
    }

    #[test]
    fn resets_within_a_window_skip_its_first_sample() {
        let s = series(&[5.0, 1.0, 2.0, 0.0, 3.0, 1.0]);
        let r = Resets::new(&s);
        assert_eq!(r.within(0, 6), &[1, 3, 5]);
        assert_eq!(r.within(1, 6), &[3, 5]);
        assert_eq!(r.within(1, 3), &[] as &[usize]);
        assert_eq!(r.within(4, 4), &[] as &[usize]);
    }
}
