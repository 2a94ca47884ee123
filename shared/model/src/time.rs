//! Time: the wall clock in milliseconds, and timestamps as Prometheus' API reads them.

/// Prometheus' `minTime`/`maxTime` defaults for an open range, in ms.
/// Prometheus' (and client_golang's) smallest API time, `time.Unix(math.MinInt64/1000 +
/// 62135596801, 0)`, in milliseconds: clients send it as the "no start" default.
pub const MIN_TIME: i64 = -9_223_309_901_257_974_000;
/// The largest, `time.Unix(math.MaxInt64/1000 - 62135596801, 999999999)`, in milliseconds.
pub const MAX_TIME: i64 = 9_223_309_901_257_974_999;
/// How Go writes them in RFC 3339 (its parser takes only four-digit years, so Prometheus
/// matches these two strings by name).
const MIN_TIME_FORMATTED: &str = "-292273086-05-16T16:47:06Z";
const MAX_TIME_FORMATTED: &str = "292277025-08-18T07:12:54.999999999Z";

/// Milliseconds since the Unix epoch by the wall clock (0 if the clock is before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A timestamp that is neither Unix seconds nor RFC 3339, or lies outside Prometheus' range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse {0:?} to a valid timestamp")]
pub struct TimeError(pub String);

/// Parses a Prometheus API time: Unix seconds (with a fraction) or RFC 3339. Returns ms.
pub fn parse_time(s: &str) -> Result<i64, TimeError> {
    // Whole seconds exactly (a float loses the last digits of the boundary times).
    if let Ok(secs) = s.parse::<i64>() {
        return secs
            .checked_mul(1000)
            .filter(|ms| (MIN_TIME..=MAX_TIME).contains(ms))
            .ok_or_else(|| TimeError(s.to_string()));
    }
    match s {
        MIN_TIME_FORMATTED => return Ok(MIN_TIME),
        MAX_TIME_FORMATTED => return Ok(MAX_TIME),
        _ => {}
    }
    if let Ok(f) = s.parse::<f64>() {
        if !f.is_finite() {
            return Err(TimeError(s.to_string()));
        }
        // As Prometheus: split off the fraction and round it to milliseconds.
        let secs = f.trunc();
        let ms = secs * 1000.0 + ((f - secs) * 1000.0).round();
        if !(MIN_TIME as f64..=MAX_TIME as f64).contains(&ms) {
            return Err(TimeError(s.to_string()));
        }
        return Ok(ms as i64);
    }
    parse_rfc3339(s).ok_or_else(|| TimeError(s.to_string()))
}

fn parse_rfc3339(s: &str) -> Option<i64> {
    // YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !(b[10] == b'T' || b[10] == b't' || b[10] == b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> { s.get(r)?.parse::<i64>().ok() };
    let (y, mo, d, h, mi, sec) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut ms = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let frac = s.get(start..i)?;
        if frac.is_empty() {
            return None;
        }
        let padded: String = frac.chars().chain(std::iter::repeat('0')).take(3).collect();
        ms = padded.parse().ok()?;
    }
    let offset_min = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        c @ (b'+' | b'-') if b.len() == i + 6 && b[i + 3] == b':' => {
            let oh = num(i + 1..i + 3)?;
            let om = num(i + 4..i + 6)?;
            let o = oh * 60 + om;
            if *c == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo, d);
    Some(((days * 86_400 + h * 3600 + mi * 60 + sec - offset_min * 60) * 1000) + ms)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A UTC date and time: (year, month, day, hour, minute, second, millisecond) of `ms`
/// since the epoch (Howard Hinnant's algorithm, the inverse of `days_from_civil`).
pub fn civil_from_ms(ms: i64) -> (i64, u32, u32, u32, u32, u32, u32) {
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let z = days + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    let secs = in_day / 1000;
    (y, m, d, (secs / 3600) as u32, (secs / 60 % 60) as u32, (secs % 60) as u32, (in_day % 1000) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(parse_time("1764460800").unwrap(), 1_764_460_800_000);
        assert_eq!(civil_from_ms(1_764_460_800_123), (2025, 11, 30, 0, 0, 0, 123));
        assert_eq!(civil_from_ms(-1), (1969, 12, 31, 23, 59, 59, 999));
        assert_eq!(civil_from_ms(951_782_400_000 + 3_723_000), (2000, 2, 29, 1, 2, 3, 0));
        assert_eq!(parse_time("1764460800.123").unwrap(), 1_764_460_800_123);
        assert_eq!(parse_time("2025-11-30T00:00:00Z").unwrap(), 1_764_460_800_000);
        assert_eq!(parse_time("2025-11-30T01:00:00.5+01:00").unwrap(), 1_764_460_800_500);
        assert_eq!(parse_time("1970-01-01T00:00:00Z").unwrap(), 0);
        assert!(parse_time("yesterday").is_err());
        assert!(parse_time("NaN").is_err());
        assert!(parse_time("2025-13-30T00:00:00Z").is_err());
    }
}
