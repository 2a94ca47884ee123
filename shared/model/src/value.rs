//! Sample values as text, the way Prometheus' API writes them.

/// Formats a value as Prometheus' API does (Go's `strconv.FormatFloat(v, 'f', -1, 64)`,
/// with `+Inf`, `-Inf`, `NaN`). Rust's shortest round-trip `Display` prints no exponent,
/// as Go's `'f'` format does (`1e21` is `1000000000000000000000`).
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_go() {
        assert_eq!(format_value(1e21), "1000000000000000000000");
        assert_eq!(format_value(0.1), "0.1");
        assert_eq!(format_value(-0.0), "-0");
        assert_eq!(format_value(1e-7), "0.0000001");
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
    }
}
