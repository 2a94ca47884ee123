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

/// A sample value as Prometheus' HTTP API writes it (`jsonutil.MarshalFloat`): the
/// shortest digits, in plain notation unless `|v|` is under 1e-6 or at least 1e21, where
/// Go's exponent form is used (`1e-07`, `1e+21`, `1.2345678901234569e+23`).
pub fn format_api_value(v: f64) -> String {
    let mut s = String::new();
    push_api_value(&mut s, v);
    s
}

/// [`format_api_value`], appended to `out` (the API writes many points into one buffer).
pub fn push_api_value(out: &mut String, v: f64) {
    use std::fmt::Write;
    let abs = v.abs();
    if !v.is_finite() {
        out.push_str(&format_value(v));
        return;
    }
    if abs == 0.0 || (1e-6..1e21).contains(&abs) {
        let _ = write!(out, "{v}");
        return;
    }
    // Rust writes `1.2345678901234569e23` / `1e-7`; Go signs the exponent and gives it
    // at least two digits.
    let e = format!("{v:e}");
    let Some((mantissa, exp)) = e.split_once('e') else {
        out.push_str(&e);
        return;
    };
    let (sign, digits) = match exp.strip_prefix('-') {
        Some(d) => ('-', d),
        None => ('+', exp),
    };
    let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
}

/// A timestamp in ms as Prometheus' HTTP API writes it (`jsonutil.MarshalTimestamp`):
/// seconds, and a three-digit fraction only when there is one (`1796150016`, `1.500`).
pub fn format_api_time(t: i64) -> String {
    let mut s = String::new();
    push_api_time(&mut s, t);
    s
}

/// [`format_api_time`], appended to `out`.
pub fn push_api_time(out: &mut String, t: i64) {
    use std::fmt::Write;
    let sign = if t < 0 { "-" } else { "" };
    let abs = t.unsigned_abs();
    let _ = match abs % 1000 {
        0 => write!(out, "{sign}{}", abs / 1000),
        frac => write!(out, "{sign}{}.{frac:03}", abs / 1000),
    };
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

    #[test]
    fn api_numbers_as_prometheus_writes_them() {
        for (v, want) in [
            (1e-7, "1e-07"),
            (1e21, "1e+21"),
            (1.2345678901234569e23, "1.2345678901234569e+23"),
            (5e-324, "5e-324"),
            (-2.5e-9, "-2.5e-09"),
            (1e-6, "0.000001"),
            (123456789.0, "123456789"),
            (0.1, "0.1"),
            (-0.0, "-0"),
            (f64::INFINITY, "+Inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(format_api_value(v), want, "{v:e}");
        }
        for (t, want) in
            [(1_796_150_016_000, "1796150016"), (1500, "1.500"), (1_005, "1.005"), (-1500, "-1.500"), (0, "0")]
        {
            assert_eq!(format_api_time(t), want);
        }
    }
}
