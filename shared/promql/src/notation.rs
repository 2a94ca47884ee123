//! Prometheus' series notation, as its PromQL test files and rule unit tests write input:
//! `metric{a="b"} 1 2 _ stale 0+10x3 -2-1x3`. Bad input is `None`, never a panic, and an
//! expansion is bounded ([`MAX_VALUES`]).

use strata_model::{stale_nan, Labels};

/// The most values one series line may expand to.
pub const MAX_VALUES: usize = 10_000_000;

/// Splits `{labels} values...` or `metric{labels} values...`.
pub fn split_series(line: &str) -> Option<(Labels, &str)> {
    let line = line.trim();
    let (series, rest) =
        if let Some(close) = find_series_end(line) { (&line[..close], &line[close..]) } else { return None };
    let labels = strata_ingest::exposition::parse_series(series.as_bytes()).ok().or_else(|| {
        // `{a="b"}` without a metric name, or with `__name__` inside the braces
        let with_name = format!("x{}", series.replace("__name__=", "__strata_name__="));
        strata_ingest::exposition::parse_series(with_name.as_bytes()).ok().map(|l| {
            let mut b = l.to_builder();
            b.del("__name__");
            if let Some(n) = l.get("__strata_name__") {
                b.set("__name__", n);
                b.del("__strata_name__");
            }
            b.build()
        })
    })?;
    Some((labels, rest.trim()))
}

fn find_series_end(line: &str) -> Option<usize> {
    if let Some(open) = line.find('{') {
        let mut in_quotes = false;
        let mut esc = false;
        for (i, c) in line.char_indices().skip(open) {
            match c {
                '\\' if in_quotes && !esc => {
                    esc = true;
                    continue;
                }
                '"' if !esc => in_quotes = !in_quotes,
                '}' if !in_quotes => return Some(i + 1),
                _ => {}
            }
            esc = false;
        }
        None
    } else {
        line.find(char::is_whitespace)
    }
}

pub fn parse_number(s: &str) -> Option<f64> {
    match s {
        "Inf" | "+Inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok().or_else(|| {
            i64::from_str_radix(s.trim_start_matches("0x"), 16).ok().filter(|_| s.starts_with("0x")).map(|v| v as f64)
        }),
    }
}

/// Expands `1 2 _ stale 0+10x3 1x2 -2-1x3` into values (None = missing).
pub fn expand_values(s: &str) -> Option<Vec<Option<f64>>> {
    let mut out = Vec::new();
    for tok in s.split_whitespace() {
        if tok == "_" {
            out.push(None);
            continue;
        }
        if tok == "stale" {
            out.push(Some(stale_nan()));
            continue;
        }
        if let Some((head, times)) = tok.split_once('x') {
            let n: usize = times.parse().ok()?;
            if n >= MAX_VALUES || out.len() + n >= MAX_VALUES {
                return None;
            }
            if head == "_" {
                out.extend(std::iter::repeat_n(None, n));
                continue;
            }
            // head: start or start+step or start-step
            let (start, step) = match head.get(1..)?.find(['+', '-']) {
                Some(p) => {
                    let p = p + 1;
                    let step: f64 = parse_number(&head[p + 1..])?;
                    (parse_number(&head[..p])?, if &head[p..p + 1] == "-" { -step } else { step })
                }
                None => (parse_number(head)?, 0.0),
            };
            for i in 0..=n {
                out.push(Some(start + step * i as f64));
            }
            continue;
        }
        out.push(Some(parse_number(tok)?));
        if out.len() >= MAX_VALUES {
            return None;
        }
    }
    Some(out)
}

/// A series alone, as `metric{a="b"}`, `{__name__="m"}` or `{}` (Prometheus'
/// `parser.ParseMetric`).
pub fn parse_metric(s: &str) -> Option<Labels> {
    let s = s.trim();
    if s == "{}" {
        return Some(Labels::default());
    }
    let line = format!("{s} _");
    match split_series(&line) {
        Some((labels, "_")) => Some(labels),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_notation_is_refused_not_a_panic() {
        assert_eq!(expand_values("1+1x2 _x2 3").unwrap(), vec![Some(1.0), Some(2.0), Some(3.0), None, None, Some(3.0)]);
        for bad in ["x5", "éx3", "1x99999999999", "1+x3", "abc", "1x"] {
            assert!(expand_values(bad).is_none(), "{bad}");
        }
        assert!(split_series("{").is_none());
        assert_eq!(parse_metric("up{job=\"a\"}").unwrap(), Labels::from_pairs([("__name__", "up"), ("job", "a")]));
        assert_eq!(parse_metric("{job=\"a\"}").unwrap(), Labels::from_pairs([("job", "a")]));
        assert!(parse_metric("up{job=\"a\"} 1").is_none());
    }
}
