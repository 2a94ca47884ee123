//! Exact decimals: the scale at which a value is a whole number, and the way back.

/// The largest decimal scale: values with up to six decimals take the decimal path.
pub(crate) const MAX_SCALE: u32 = 6;
pub(crate) const POW10: [f64; 7] = [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6];
/// Largest scaled integer that still maps back to an exact float.
pub(crate) const MAX_EXACT: f64 = 9_007_199_254_740_992.0; // 2^53

/// Smallest scale `k` at which `v` is an exact decimal, if any.
pub(crate) fn decimal_scale(v: f64) -> Option<u32> {
    if !v.is_finite() {
        return None;
    }
    (0..=MAX_SCALE).find(|&k| scaled_at(v, k).is_some())
}

/// `v·10^k` as an integer when that round-trips exactly.
pub(crate) fn scaled_at(v: f64, k: u32) -> Option<i64> {
    if !v.is_finite() {
        return None;
    }
    let x = v * POW10[k as usize];
    // Below 2^53 a float is within 0.5 of an integer that is itself below 2^53.
    if x.abs() >= MAX_EXACT {
        return None;
    }
    // Compare through the integer so that -0.0 (which would come back as +0.0) is refused.
    let i = round_half_away(x) as i64;
    (unscale(i, k).to_bits() == v.to_bits()).then_some(i)
}

/// `x.round()` for |x| < 2^53 without the libm call (every sample goes through here): the
/// truncation and the fractional part are both exact in that range.
#[inline(always)]
pub(crate) fn round_half_away(x: f64) -> f64 {
    let t = x as i64 as f64;
    let f = x - t;
    if f >= 0.5 {
        t + 1.0
    } else if f <= -0.5 {
        t - 1.0
    } else {
        t
    }
}

#[inline(always)]
pub(crate) fn unscale(s: i64, k: u32) -> f64 {
    // Integers (scale 0, most DCGM values) need no division.
    if k == 0 {
        s as f64
    } else {
        s as f64 / POW10[k as usize]
    }
}

/// `v` as an exact decimal: the smallest scale `k` (0 to 6) and the integer `v·10^k`,
/// which [`from_decimal`] turns back into `v` bit for bit; `None` for values that are no
/// exact decimal at any scale (NaN, infinities, -0.0, long mantissas).
pub fn to_decimal(v: f64) -> Option<(u32, i64)> {
    let k = decimal_scale(v)?;
    Some((k, scaled_at(v, k)?))
}

/// The value [`to_decimal`] gave `(k, s)` for; `None` for a scale past 6.
pub fn from_decimal(k: u32, s: i64) -> Option<f64> {
    (k <= MAX_SCALE).then(|| unscale(s, k))
}
