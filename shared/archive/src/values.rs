//! Sample values as columns Parquet compresses well and any reader understands: most
//! values a GPU fleet reports are short decimals (`45`, `0.75`, `231.625`), stored exactly
//! as an integer `mantissa` and a power of ten `scale` shared by a series
//! (`value = mantissa / 10^scale`), which DELTA_BINARY_PACKED packs into a few bits a
//! sample. What is not such a decimal (NaN, the staleness marker, infinities, `-0`,
//! `0.1 + 0.2`, magnitudes past 2^53) goes to a DOUBLE column instead, bit for bit. Every
//! decimal is checked to decode to the very bits it came from, so a reader that computes
//! `mantissa / 10^scale` in IEEE doubles (DuckDB, pyarrow, Spark) gets the value itself.

/// The largest power of ten tried: `10^15` and below are exact doubles.
pub const MAX_SCALE: i32 = 15;

/// `10^scale` as an exact double.
fn power(scale: i32) -> f64 {
    10f64.powi(scale)
}

/// The value `mantissa / 10^scale` stands for.
pub fn decimal_value(mantissa: i64, scale: i32) -> f64 {
    mantissa as f64 / power(scale)
}

/// `v` as `mantissa / 10^scale` exactly (same bits), if it is one with `|mantissa| < 2^53`.
pub fn as_decimal(v: f64, scale: i32) -> Option<i64> {
    if !v.is_finite() || !(0..=MAX_SCALE).contains(&scale) {
        return None;
    }
    let scaled = (v * power(scale)).round();
    if scaled.abs() >= 9_007_199_254_740_992.0 {
        return None;
    }
    let m = scaled as i64;
    (decimal_value(m, scale).to_bits() == v.to_bits()).then_some(m)
}

/// The smallest scale at which `v` is an exact decimal.
pub fn least_scale(v: f64) -> Option<i32> {
    (0..=MAX_SCALE).find(|&s| as_decimal(v, s).is_some())
}

/// One scale for a series: the largest any of its values needs (so most of them decode
/// at it), or 0 when none is a decimal.
pub fn series_scale(values: impl Iterator<Item = f64>) -> i32 {
    values.filter_map(least_scale).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_round_trip_bit_for_bit_and_the_rest_is_refused() {
        for (v, scale) in [(45.0, 0), (0.75, 2), (231.625, 3), (-12.5, 1), (1e15, 0), (0.001, 3), (1234567.891, 3)] {
            assert_eq!(least_scale(v), Some(scale), "{v}");
            let m = as_decimal(v, scale).unwrap();
            assert_eq!(decimal_value(m, scale).to_bits(), v.to_bits());
        }
        // A series scale also encodes values that need less.
        let m = as_decimal(46.0, 3).unwrap();
        assert_eq!((m, decimal_value(m, 3)), (46_000, 46.0));
        for v in [
            f64::NAN,
            strata_model::stale_nan(),
            f64::INFINITY,
            -0.0,
            0.1 + 0.2,
            1e300,
            5e-324,
            9_007_199_254_740_993.0,
        ] {
            assert_eq!(least_scale(v), None, "{v:e} must go to the double column");
        }
        // π has 16 significant digits: a decimal at scale 15.
        assert_eq!(least_scale(std::f64::consts::PI), Some(15));
        assert_eq!(series_scale([1.0, 2.5, 0.125, f64::NAN].into_iter()), 3);
        assert_eq!(series_scale([f64::NAN].into_iter()), 0);
    }
}
