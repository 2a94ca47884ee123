//! The functions a template can call: Go's builtins (`and`, `or`, `not`, `len`, `index`,
//! `print*`, comparisons, escapers) and Prometheus' (`query`, `first`, `label`, `value`,
//! `humanize*`, `reReplaceAll`, `match`, `title`, `toUpper`, links, ...), with Prometheus'
//! output and errors.

use super::format::{format_g, sprintf};
use super::{Env, QuerySample, TemplateError, Value};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

fn err(msg: impl Into<String>) -> TemplateError {
    TemplateError::Exec(msg.into())
}

fn arity(name: &str, args: &[Value], n: usize) -> Result<(), TemplateError> {
    if args.len() != n {
        return Err(err(format!("wrong number of args for {name}: want {n} got {}", args.len())));
    }
    Ok(())
}

fn string_arg(name: &str, v: &Value) -> Result<String, TemplateError> {
    match v {
        Value::Str(s) => Ok(s.clone()),
        other => Err(err(format!("wrong type for value; expected string; got {} (in {name})", other.type_name()))),
    }
}

/// Prometheus' `convertToFloat`: numbers and numeric strings.
fn float_arg(v: &Value) -> Result<f64, TemplateError> {
    match v {
        Value::Float(f) => Ok(*f),
        Value::Int(i) => Ok(*i as f64),
        Value::Str(s) => s.trim().parse::<f64>().or_else(|_| match s.trim() {
            "+Inf" | "Inf" => Ok(f64::INFINITY),
            "-Inf" => Ok(f64::NEG_INFINITY),
            _ => Err(err(format!("strconv.ParseFloat: parsing {s:?}: invalid syntax"))),
        }),
        other => Err(err(format!("can't convert {} to float", other.type_name()))),
    }
}

fn sample_arg(v: &Value) -> Result<Arc<QuerySample>, TemplateError> {
    match v {
        Value::Sample(s) => Ok(s.clone()),
        other => Err(err(format!("wrong type for value; expected *template.sample; got {}", other.type_name()))),
    }
}

fn g4(v: f64) -> String {
    format_g(v, Some(4), false)
}

fn compare(a: &Value, b: &Value) -> Result<Ordering, TemplateError> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Ok(x.cmp(y)),
        (Value::Float(x), Value::Float(y)) => Ok(x.partial_cmp(y).unwrap_or(Ordering::Less)),
        (Value::Str(x), Value::Str(y)) => Ok(x.cmp(y)),
        (Value::Int(_) | Value::Float(_) | Value::Str(_), Value::Int(_) | Value::Float(_) | Value::Str(_)) => {
            Err(err("incompatible types for comparison"))
        }
        _ => Err(err("invalid type for comparison")),
    }
}

fn equal(a: &Value, b: &Value) -> Result<bool, TemplateError> {
    match (a, b) {
        (Value::Bool(x), Value::Bool(y)) => Ok(x == y),
        (Value::Float(x), Value::Float(y)) => Ok(x == y),
        (Value::Nil, Value::Nil) => Ok(true),
        _ => compare(a, b).map(|o| o == Ordering::Equal),
    }
}

/// `humanize`: SI prefixes, four significant digits.
pub fn humanize(mut v: f64) -> String {
    if v == 0.0 || v.is_nan() || v.is_infinite() {
        return g4(v);
    }
    let mut prefix = "";
    if v.abs() >= 1.0 {
        for p in ["k", "M", "G", "T", "P", "E", "Z", "Y"] {
            if v.abs() < 1000.0 {
                break;
            }
            prefix = p;
            v /= 1000.0;
        }
    } else {
        for p in ["m", "u", "n", "p", "f", "a", "z", "y"] {
            if v.abs() >= 1.0 {
                break;
            }
            prefix = p;
            v *= 1000.0;
        }
    }
    format!("{}{prefix}", g4(v))
}

pub fn humanize_1024(mut v: f64) -> String {
    if v.abs() <= 1.0 || v.is_nan() || v.is_infinite() {
        return g4(v);
    }
    let mut prefix = "";
    for p in ["ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"] {
        if v.abs() < 1024.0 {
            break;
        }
        prefix = p;
        v /= 1024.0;
    }
    format!("{}{prefix}", g4(v))
}

pub fn humanize_duration(mut v: f64) -> String {
    if v.is_nan() || v.is_infinite() {
        return g4(v);
    }
    if v == 0.0 {
        return format!("{}s", g4(v));
    }
    if v.abs() >= 1.0 {
        let sign = if v < 0.0 { "-" } else { "" };
        v = v.abs();
        let d = v as i64;
        let (s, m, h, days) = (d % 60, d / 60 % 60, d / 3600 % 24, d / 86_400);
        return if days != 0 {
            format!("{sign}{days}d {h}h {m}m {s}s")
        } else if h != 0 {
            format!("{sign}{h}h {m}m {s}s")
        } else if m != 0 {
            format!("{sign}{m}m {s}s")
        } else {
            format!("{sign}{}s", g4(v))
        };
    }
    let mut prefix = "";
    for p in ["m", "u", "n", "p", "f", "a", "z", "y"] {
        if v.abs() >= 1.0 {
            break;
        }
        prefix = p;
        v *= 1000.0;
    }
    format!("{}{prefix}s", g4(v))
}

/// Go's `time.Time.String()` in UTC: `2006-01-02 15:04:05.999 +0000 UTC`.
fn time_string(ms: i64) -> String {
    let (y, mo, d, h, mi, s, frac) = strata_model::time::civil_from_ms(ms);
    let mut out = format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}");
    if frac != 0 {
        let f = format!("{frac:03}");
        out.push('.');
        out.push_str(f.trim_end_matches('0'));
    }
    out.push_str(" +0000 UTC");
    out
}

fn to_ms(v: f64) -> Result<i64, TemplateError> {
    let ns = v * 1e9;
    if !(ns > i64::MIN as f64 && ns < i64::MAX as f64) {
        return Err(err(format!(
            "{} cannot be represented as a nanoseconds timestamp since it overflows int64",
            g4(v)
        )));
    }
    Ok((ns as i64).div_euclid(1_000_000))
}

fn query_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn html_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\'' => out.push_str("&#39;"),
            '"' => out.push_str("&#34;"),
            '\0' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

fn js_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '"' => out.push_str("\\\""),
            '<' => out.push_str("\\u003C"),
            '>' => out.push_str("\\u003E"),
            '&' => out.push_str("\\u0026"),
            '=' => out.push_str("\\u003D"),
            '\n' => out.push_str("\\u000A"),
            '\r' => out.push_str("\\u000D"),
            '\t' => out.push_str("\\u0009"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Go's `strings.Title`: the first letter of each word upper-cased.
fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_letter = false;
    for c in s.chars() {
        let letter = c.is_alphanumeric() || c == '_' || c == '\'';
        if letter && !prev_letter {
            out.extend(c.to_uppercase());
        } else {
            out.push(c);
        }
        prev_letter = letter;
    }
    out
}

fn regex(pattern: &str) -> Result<regex::Regex, TemplateError> {
    regex::RegexBuilder::new(pattern).size_limit(1 << 20).build().map_err(|e| err(format!("error parsing regexp: {e}")))
}

/// Go's `$1`/`${name}` expansion: Rust's regex reads the same syntax.
fn re_replace_all(pattern: &str, repl: &str, text: &str) -> Result<String, TemplateError> {
    Ok(regex(pattern)?.replace_all(text, repl).into_owned())
}

fn sprint(args: &[Value], spaces_always: bool) -> String {
    let mut out = String::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            let both_non_strings = !matches!(a, Value::Str(_)) && !matches!(args[i - 1], Value::Str(_));
            if spaces_always || both_non_strings {
                out.push(' ');
            }
        }
        out.push_str(&a.print());
    }
    out
}

pub(crate) fn call(env: &Env, name: &str, args: Vec<Value>) -> Result<Value, TemplateError> {
    let s = |i: usize| string_arg(name, &args[i]);
    Ok(match name {
        "and" => {
            if args.is_empty() {
                return Err(err("wrong number of args for and: want at least 1 got 0"));
            }
            args.iter().find(|a| !a.truthy()).cloned().unwrap_or_else(|| args[args.len() - 1].clone())
        }
        "or" => {
            if args.is_empty() {
                return Err(err("wrong number of args for or: want at least 1 got 0"));
            }
            args.iter().find(|a| a.truthy()).cloned().unwrap_or_else(|| args[args.len() - 1].clone())
        }
        "not" => {
            arity(name, &args, 1)?;
            Value::Bool(!args[0].truthy())
        }
        "len" => {
            arity(name, &args, 1)?;
            Value::Int(match &args[0] {
                Value::Str(s) => s.len(),
                Value::List(l) => l.len(),
                Value::Map(m) => m.len(),
                other => return Err(err(format!("len of type {}", other.type_name()))),
            } as i64)
        }
        "index" => {
            if args.is_empty() {
                return Err(err("wrong number of args for index: want at least 1 got 0"));
            }
            let mut v = args[0].clone();
            for k in &args[1..] {
                v = match (v, k) {
                    (Value::Map(m), Value::Str(k)) => m.get(k).cloned().unwrap_or(Value::Str(String::new())),
                    (Value::List(l), Value::Int(i)) => usize::try_from(*i)
                        .ok()
                        .and_then(|i| l.get(i).cloned())
                        .ok_or_else(|| err(format!("error calling index: index out of range: {i}")))?,
                    (x, _) => {
                        return Err(err(format!("error calling index: can't index item of type {}", x.type_name())))
                    }
                };
            }
            v
        }
        "print" => Value::Str(sprint(&args, false)),
        "println" => Value::Str(sprint(&args, true) + "\n"),
        "printf" => {
            if args.is_empty() {
                return Err(err("wrong number of args for printf: want at least 1 got 0"));
            }
            Value::Str(sprintf(&s(0)?, &args[1..]))
        }
        "eq" => {
            if args.len() < 2 {
                return Err(err("missing argument for comparison"));
            }
            let mut any = false;
            for b in &args[1..] {
                any |= equal(&args[0], b)?;
            }
            Value::Bool(any)
        }
        "ne" | "lt" | "le" | "gt" | "ge" => {
            arity(name, &args, 2)?;
            let (a, b) = (&args[0], &args[1]);
            Value::Bool(match name {
                "ne" => !equal(a, b)?,
                "lt" => compare(a, b)? == Ordering::Less,
                "le" => compare(a, b)? != Ordering::Greater,
                "gt" => compare(a, b)? == Ordering::Greater,
                _ => compare(a, b)? != Ordering::Less,
            })
        }
        "html" => Value::Str(html_escape(&sprint(&args, false))),
        "js" => Value::Str(js_escape(&sprint(&args, false))),
        "urlquery" => Value::Str(query_escape(&sprint(&args, false))),
        "query" => {
            arity(name, &args, 1)?;
            let q = s(0)?;
            let run = env.query.ok_or_else(|| err("query is not available here"))?;
            let found = run(&q).map_err(|e| err(format!("error executing query: {e}")))?;
            Value::List(found.into_iter().map(|x| Value::Sample(Arc::new(x))).collect())
        }
        "first" => {
            arity(name, &args, 1)?;
            match &args[0] {
                Value::List(l) if !l.is_empty() => l[0].clone(),
                Value::List(_) => return Err(err("first() called on vector with no elements")),
                other => {
                    return Err(err(format!("wrong type for value; expected queryResult; got {}", other.type_name())))
                }
            }
        }
        "label" => {
            arity(name, &args, 2)?;
            let l = s(0)?;
            Value::Str(sample_arg(&args[1])?.labels.get(&l).cloned().unwrap_or_default())
        }
        "value" => {
            arity(name, &args, 1)?;
            Value::Float(sample_arg(&args[0])?.value)
        }
        "strvalue" => {
            arity(name, &args, 1)?;
            Value::Str(sample_arg(&args[0])?.labels.get("__value__").cloned().unwrap_or_default())
        }
        "args" => Value::Map(args.into_iter().enumerate().map(|(i, v)| (format!("arg{i}"), v)).collect()),
        "reReplaceAll" => {
            arity(name, &args, 3)?;
            Value::Str(re_replace_all(&s(0)?, &s(1)?, &s(2)?)?)
        }
        "match" => {
            arity(name, &args, 2)?;
            Value::Bool(regex(&s(0)?)?.is_match(&s(1)?))
        }
        "safeHtml" => {
            arity(name, &args, 1)?;
            Value::Str(s(0)?)
        }
        "title" => {
            arity(name, &args, 1)?;
            Value::Str(title(&s(0)?))
        }
        "toUpper" => {
            arity(name, &args, 1)?;
            Value::Str(s(0)?.to_uppercase())
        }
        "toLower" => {
            arity(name, &args, 1)?;
            Value::Str(s(0)?.to_lowercase())
        }
        "graphLink" | "tableLink" => {
            arity(name, &args, 1)?;
            let tab = if name == "graphLink" { 0 } else { 1 };
            Value::Str(format!("/graph?g0.expr={}&g0.tab={tab}", query_escape(&s(0)?)))
        }
        "sortByLabel" => {
            arity(name, &args, 2)?;
            let l = s(0)?;
            let Value::List(mut v) = args[1].clone() else {
                return Err(err(format!("wrong type for value; expected queryResult; got {}", args[1].type_name())));
            };
            let key = |x: &Value| match x {
                Value::Sample(s) => s.labels.get(&l).cloned().unwrap_or_default(),
                _ => String::new(),
            };
            v.sort_by_key(key);
            Value::List(v)
        }
        "humanize" | "humanize1024" | "humanizeDuration" | "humanizePercentage" | "humanizeTimestamp" => {
            arity(name, &args, 1)?;
            let v = float_arg(&args[0])?;
            Value::Str(match name {
                "humanize" => humanize(v),
                "humanize1024" => humanize_1024(v),
                "humanizeDuration" => humanize_duration(v),
                "humanizePercentage" => format!("{}%", g4(v * 100.0)),
                _ if v.is_nan() || v.is_infinite() => g4(v),
                _ => time_string(to_ms(v)?),
            })
        }
        "toTime" => {
            arity(name, &args, 1)?;
            Value::Str(time_string(to_ms(float_arg(&args[0])?)?))
        }
        "parseDuration" => {
            arity(name, &args, 1)?;
            let d = strata_model::duration::parse_duration_ms(&s(0)?).map_err(|e| err(e.to_string()))?;
            Value::Float(d as f64 / 1000.0)
        }
        "externalURL" => Value::Str(env.external_url.to_string()),
        "pathPrefix" => {
            let u = env.external_url;
            let path = u.find("://").map(|i| &u[i + 3..]).and_then(|r| r.find('/').map(|j| &r[j..])).unwrap_or("");
            Value::Str(path.trim_end_matches('/').to_string())
        }
        "stripPort" => {
            arity(name, &args, 1)?;
            let h = s(0)?;
            Value::Str(match h.rsplit_once(':') {
                Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => {
                    host.trim_start_matches('[').trim_end_matches(']').to_string()
                }
                _ => h,
            })
        }
        "stripDomain" => {
            arity(name, &args, 1)?;
            let h = s(0)?;
            let (host, port) = match h.rsplit_once(':') {
                Some((a, p)) if p.bytes().all(|b| b.is_ascii_digit()) && !a.contains(':') => {
                    (a.to_string(), format!(":{p}"))
                }
                _ => (h.clone(), String::new()),
            };
            let is_ip = host.parse::<std::net::IpAddr>().is_ok();
            Value::Str(if is_ip { h } else { format!("{}{port}", host.split('.').next().unwrap_or("")) })
        }
        _ => return Err(err(format!("function {name:?} not defined"))),
    })
}

/// The labels of a query result as a template sees them.
pub fn sample(labels: &strata_model::Labels, value: f64) -> QuerySample {
    QuerySample {
        labels: labels.iter().map(|l| (l.name.to_string(), l.value.to_string())).collect::<BTreeMap<_, _>>(),
        value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humanizers_match_prometheus() {
        assert_eq!(humanize(1234567.0), "1.235M");
        assert_eq!(humanize(0.001234), "1.234m");
        assert_eq!(humanize(0.0), "0");
        assert_eq!(humanize(12.0), "12");
        assert_eq!(humanize_1024(1048576.0), "1Mi");
        assert_eq!(humanize_1024(0.5), "0.5");
        assert_eq!(humanize_duration(3661.0), "1h 1m 1s");
        assert_eq!(humanize_duration(90061.0), "1d 1h 1m 1s");
        assert_eq!(humanize_duration(1.5), "1.5s");
        assert_eq!(humanize_duration(0.0015), "1.5ms");
        assert_eq!(humanize_duration(0.0), "0s");
        assert_eq!(time_string(1_435_065_584_128), "2015-06-23 13:19:44.128 +0000 UTC");
        assert_eq!(time_string(0), "1970-01-01 00:00:00 +0000 UTC");
        assert_eq!(title("aa bb-cc"), "Aa Bb-Cc");
    }
}
