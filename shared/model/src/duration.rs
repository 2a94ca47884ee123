//! Durations as Prometheus writes them (`1h30m`, `5s`, `250ms`, `90d`), parsed and
//! formatted in one place for configs, the HTTP API and the test files.
//!
//! Parsing follows `model.ParseDuration`: units from largest to smallest, each at most once,
//! `0` alone allowed, and anything that would not fit in Go's `time.Duration` (about 292
//! years) refused as out of range rather than wrapped.

use serde::Deserialize;
use std::time::Duration;

/// The largest duration Prometheus accepts: `math.MaxInt64` nanoseconds, in milliseconds.
pub const MAX_DURATION_MS: i64 = i64::MAX / 1_000_000;

const UNITS: [(&str, i64); 7] = [
    ("y", 365 * 86_400_000),
    ("w", 7 * 86_400_000),
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1000),
    ("ms", 1),
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration string")]
    Empty,
    #[error("not a valid duration string: {0:?}")]
    Invalid(String),
    #[error("duration out of range: {0:?}")]
    OutOfRange(String),
}

/// Parses a Prometheus duration to milliseconds.
pub fn parse_duration_ms(s: &str) -> Result<i64, DurationError> {
    match s {
        "" => return Err(DurationError::Empty),
        "0" => return Ok(0),
        _ => {}
    }
    let invalid = || DurationError::Invalid(s.to_string());
    let b = s.as_bytes();
    let (mut i, mut total, mut next_unit) = (0usize, 0i64, 0usize);
    while i < b.len() {
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = &s[start..i];
        let ustart = i;
        while i < b.len() && b[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit = &s[ustart..i];
        // Units must come largest first, each once: `1h30m`, never `30m1h` or `1m1m`.
        let Some(k) = UNITS[next_unit..].iter().position(|(u, _)| *u == unit) else { return Err(invalid()) };
        if digits.is_empty() {
            return Err(invalid());
        }
        let mult = UNITS[next_unit + k].1;
        next_unit += k + 1;
        let out_of_range = || DurationError::OutOfRange(s.to_string());
        let n: i64 = digits.parse().map_err(|_| out_of_range())?;
        total = n
            .checked_mul(mult)
            .and_then(|x| total.checked_add(x))
            .filter(|t| *t <= MAX_DURATION_MS)
            .ok_or_else(out_of_range)?;
    }
    Ok(total)
}

/// Parses a Prometheus duration.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    // Non-negative by construction of the parser.
    parse_duration_ms(s).map(|ms| Duration::from_millis(ms.unsigned_abs()))
}

/// Formats milliseconds as Prometheus' `model.Duration` does: years and weeks only when
/// they divide the duration exactly (`90d`, not `12w6d`).
pub fn format_duration_ms(ms: i64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    if ms < 0 {
        out.push('-');
    }
    let mut rest = ms.unsigned_abs();
    for (unit, mult) in UNITS {
        let mult = mult.unsigned_abs();
        let exact_only = unit == "y" || unit == "w";
        if exact_only && !rest.is_multiple_of(mult) {
            continue;
        }
        let n = rest / mult;
        if n > 0 {
            out.push_str(&n.to_string());
            out.push_str(unit);
            rest -= n * mult;
        }
    }
    out
}

/// Formats a duration as Prometheus does, at millisecond precision.
pub fn format_duration(d: Duration) -> String {
    format_duration_ms(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A duration field of a configuration file, written as Prometheus writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromDuration(pub Duration);

impl<'de> Deserialize<'de> for PromDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(s.trim()).map(PromDuration).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_prometheus() {
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86400));
        assert_eq!(
            parse_duration_ms("1y2w3d4h5m6s7ms").unwrap(),
            31_536_000_000 + 1_209_600_000 + 259_200_000 + 14_400_000 + 300_000 + 6000 + 7
        );
        assert_eq!(parse_duration_ms("0").unwrap(), 0);
        assert_eq!(parse_duration_ms("0s").unwrap(), 0);
        for bad in ["", "1.5h", "h", "5", "1m1h", "1m1m", "-5m", "5 m", "5M"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        assert_eq!(parse_duration_ms("292y").unwrap(), 292 * 31_536_000_000);
        assert!(matches!(parse_duration_ms("293y"), Err(DurationError::OutOfRange(_))));
        assert!(matches!(parse_duration_ms("99999999999999999999s"), Err(DurationError::OutOfRange(_))));
        assert!(matches!(parse_duration_ms("9223372036854775807ms"), Err(DurationError::OutOfRange(_))));
        assert!(matches!(parse_duration_ms("106751d24h"), Err(DurationError::OutOfRange(_))));
    }

    #[test]
    fn formats_like_prometheus() {
        assert_eq!(format_duration(Duration::from_secs(5)), "5s");
        assert_eq!(format_duration(Duration::from_millis(90_500)), "1m30s500ms");
        assert_eq!(format_duration_ms(90 * 86_400_000), "90d");
        assert_eq!(format_duration_ms(14 * 86_400_000), "2w");
        assert_eq!(format_duration_ms(365 * 86_400_000), "1y");
        assert_eq!(format_duration_ms(0), "0s");
        for ms in [1, 999, 60_000, 3_723_004, 86_400_000 * 400 + 5] {
            assert_eq!(parse_duration_ms(&format_duration_ms(ms)).unwrap(), ms);
        }
    }
}
