//! Parser for the Prometheus text format 0.0.4 and OpenMetrics 1.0 text.
//!
//! The parser is zero-copy on the hot path: a sample yields the raw `name{labels}` bytes,
//! fully validated, so the scrape loop can look a series up by those bytes and only build
//! a [`Labels`] (with [`parse_series`]) the first time it sees them. Errors carry the line
//! number and the offending line so a scrape failure can be reported with its cause.
//!
//! Behaviour follows Prometheus' parsers: unknown escapes in label values are kept as
//! written; a scraped `NaN` becomes Prometheus' "normal" NaN so it can never be mistaken
//! for the staleness marker; OpenMetrics timestamps are float seconds truncated to
//! milliseconds (`int64(ts*1000)`, as Prometheus does); exemplars are skipped.

use std::borrow::Cow;
use strata_model::{Labels, LabelsBuilder, MetricType, METRIC_NAME};

/// Prometheus' `value.NormalNaN`.
pub const NORMAL_NAN_BITS: u64 = 0x7ff8_0000_0000_0001;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`
    Text,
    /// `application/openmetrics-text; version=1.0.0`
    OpenMetrics,
}

impl Format {
    /// Picks the format from a response's `Content-Type`, defaulting to text as Prometheus does.
    pub fn from_content_type(ct: Option<&str>) -> Format {
        match ct {
            Some(ct) if ct.trim_start().starts_with("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Entry<'a> {
    Help {
        family: &'a str,
        help: Cow<'a, str>,
    },
    Type {
        family: &'a str,
        metric_type: MetricType,
    },
    Unit {
        family: &'a str,
        unit: &'a str,
    },
    /// One sample. `series` is the raw `name{labels}` text; when `validated` is false the
    /// parser only located it (from the end of the line), and the consumer must check it
    /// with [`parse_series`] unless it has seen these exact bytes validated before.
    Sample {
        series: &'a [u8],
        name: &'a str,
        value: f64,
        timestamp_ms: Option<i64>,
        line: usize,
        validated: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}: {text:?}")]
pub struct ParseError {
    pub line: usize,
    pub reason: String,
    /// The offending line, cut to 200 bytes.
    pub text: String,
}

pub struct Parser<'a> {
    buf: &'a [u8],
    pos: usize,
    line: usize,
    format: Format,
    seen_eof: bool,
    failed: bool,
    /// A fragment of a larger OpenMetrics text: no `# EOF` required at its end.
    fragment: bool,
}

impl<'a> Parser<'a> {
    pub fn new(buf: &'a [u8], format: Format) -> Self {
        Parser { buf, pos: 0, line: 0, format, seen_eof: false, failed: false, fragment: false }
    }

    /// A parser for one piece of a large file read in parts; `first_line` numbers its lines.
    pub fn fragment(buf: &'a [u8], format: Format, first_line: usize) -> Self {
        Parser {
            buf,
            pos: 0,
            line: first_line.saturating_sub(1),
            format,
            seen_eof: false,
            failed: false,
            fragment: true,
        }
    }

    /// Whether `# EOF` was seen.
    pub fn saw_eof(&self) -> bool {
        self.seen_eof
    }

    fn error(&mut self, line: &[u8], reason: impl Into<String>) -> ParseError {
        self.failed = true;
        let cut = &line[..line.len().min(200)];
        ParseError { line: self.line, reason: reason.into(), text: String::from_utf8_lossy(cut).into_owned() }
    }

    fn next_line(&mut self) -> Option<&'a [u8]> {
        if self.pos >= self.buf.len() {
            return None;
        }
        let rest = &self.buf[self.pos..];
        let (line, adv) = match memchr(b'\n', rest) {
            Some(i) => (&rest[..i], i + 1),
            None => (rest, rest.len()),
        };
        self.pos += adv;
        self.line += 1;
        Some(line.strip_suffix(b"\r").unwrap_or(line))
    }

    fn comment(&mut self, line: &'a [u8]) -> Option<Result<Entry<'a>, ParseError>> {
        let om = self.format == Format::OpenMetrics;
        let body = &line[1..];
        if om && body == b" EOF" {
            self.seen_eof = true;
            return None;
        }
        let body = if om {
            match body.strip_prefix(b" ") {
                Some(b) => b,
                None => return Some(Err(self.error(line, "comment must start with \"# \""))),
            }
        } else {
            trim_start(body)
        };
        let (kw, rest) = split_token(body);
        let kind = match kw {
            b"HELP" => 0,
            b"TYPE" => 1,
            b"UNIT" if om => 2,
            _ if om => return Some(Err(self.error(line, "unknown comment; OpenMetrics allows HELP, TYPE, UNIT, EOF"))),
            _ => return None, // free-form comment in the text format
        };
        let rest = if om { rest.strip_prefix(b" ").unwrap_or(rest) } else { trim_start(rest) };
        let (family, rest) = split_token(rest);
        let family = match std::str::from_utf8(family) {
            Ok(f) if is_metric_name(f) => f,
            _ => return Some(Err(self.error(line, "invalid metric name in comment"))),
        };
        let rest = if om { rest.strip_prefix(b" ").unwrap_or(rest) } else { trim_start(rest) };
        let Ok(rest) = std::str::from_utf8(rest) else {
            return Some(Err(self.error(line, "comment is not valid UTF-8")));
        };
        Some(Ok(match kind {
            0 => Entry::Help { family, help: unescape_help(rest) },
            1 => match MetricType::parse(rest.trim_end()) {
                Some(metric_type) if !(om && rest.trim_end() == "untyped") => Entry::Type { family, metric_type },
                _ => return Some(Err(self.error(line, format!("invalid metric type {:?}", rest.trim_end())))),
            },
            _ => Entry::Unit { family, unit: rest.trim_end() },
        }))
    }

    /// The text format's fast path: split the value (and timestamp) off the end of the line
    /// without lexing the labels. `None` when the line does not have that shape.
    fn sample_from_tail(&mut self, line: &'a [u8]) -> Option<Result<Entry<'a>, ParseError>> {
        let l = trim_end(line);
        let p1 = l.iter().rposition(|&c| c == b' ' || c == b'\t')?;
        let t1 = &l[p1 + 1..];
        let rest1 = trim_end(&l[..p1]);
        let (series, value_tok, ts_tok) = if looks_like_series(rest1) {
            (rest1, t1, None)
        } else {
            let p2 = rest1.iter().rposition(|&c| c == b' ' || c == b'\t')?;
            let rest2 = trim_end(&rest1[..p2]);
            if !looks_like_series(rest2) {
                return None;
            }
            (rest2, &rest1[p2 + 1..], Some(t1))
        };
        let name_end = scan_metric_name(series);
        if name_end == 0 || !(name_end == series.len() || series[name_end] == b'{') {
            return None;
        }
        let name = std::str::from_utf8(&series[..name_end]).unwrap_or_default();
        let Some(value) = parse_value(value_tok) else {
            return Some(Err(self.error(line, format!("invalid value {:?}", String::from_utf8_lossy(value_tok)))));
        };
        let timestamp_ms = match ts_tok {
            None => None,
            Some(tok) => match parse_timestamp(tok, self.format) {
                Some(t) => Some(t),
                None => {
                    return Some(Err(self.error(line, format!("invalid timestamp {:?}", String::from_utf8_lossy(tok)))))
                }
            },
        };
        Some(Ok(Entry::Sample { series, name, value, timestamp_ms, line: self.line, validated: false }))
    }

    fn sample(&mut self, line: &'a [u8]) -> Result<Entry<'a>, ParseError> {
        // OpenMetrics lines with a `#` may carry an exemplar: those take the full path.
        if self.format == Format::Text || memchr(b'#', line).is_none() {
            if let Some(r) = self.sample_from_tail(line) {
                return r;
            }
        }
        let name_end = scan_metric_name(line);
        if name_end == 0 {
            return Err(self.error(line, "expected a metric name"));
        }
        // SAFETY of from_utf8: scan_metric_name accepts ASCII only.
        let name = std::str::from_utf8(&line[..name_end]).unwrap_or_default();
        let mut i = name_end;
        // The text format allows blanks between the name and '{'.
        let brace = if self.format == Format::Text { skip_blank(line, i) } else { i };
        let series_end;
        if line.get(brace) == Some(&b'{') {
            i = brace;
            match scan_labels(line, i + 1) {
                Ok(end) => {
                    series_end = end;
                    i = end;
                }
                Err(reason) => return Err(self.error(line, reason)),
            }
        } else {
            series_end = name_end;
        }
        let series = &line[..series_end];
        if !series.is_ascii() && std::str::from_utf8(series).is_err() {
            return Err(self.error(line, "label value is not valid UTF-8"));
        }
        if !line.get(i).is_some_and(|&c| c == b' ' || c == b'\t') {
            return Err(self.error(line, "expected a space before the value"));
        }
        i = skip_blank(line, i);
        let (tok, _) = split_token(&line[i..]);
        let value = match parse_value(tok) {
            Some(v) => v,
            None => return Err(self.error(line, format!("invalid value {:?}", String::from_utf8_lossy(tok)))),
        };
        i += tok.len();
        i = skip_blank(line, i);
        let mut timestamp_ms = None;
        if i < line.len() && line[i] != b'#' {
            let (tok, _) = split_token(&line[i..]);
            match parse_timestamp(tok, self.format) {
                Some(ts) => timestamp_ms = Some(ts),
                None => return Err(self.error(line, format!("invalid timestamp {:?}", String::from_utf8_lossy(tok)))),
            }
            i = skip_blank(line, i + tok.len());
        }
        if i < line.len() {
            // Only an OpenMetrics exemplar may follow; it is validated loosely and ignored.
            if !(self.format == Format::OpenMetrics && line[i..].starts_with(b"# {")) {
                return Err(self.error(line, "unexpected text after the sample"));
            }
        }
        Ok(Entry::Sample { series, name, value, timestamp_ms, line: self.line, validated: true })
    }
}

/// Text format: integer milliseconds. OpenMetrics: float seconds, truncated to milliseconds
/// as Prometheus does (`int64(ts*1000)`).
fn parse_timestamp(tok: &[u8], format: Format) -> Option<i64> {
    let s = std::str::from_utf8(tok).ok()?;
    match format {
        Format::Text => s.parse::<i64>().ok(),
        Format::OpenMetrics => s.parse::<f64>().ok().filter(|f| f.is_finite()).map(|f| (f * 1000.0) as i64),
    }
}

/// Could this be a whole series text: ends with `}`, or is a bare metric name?
fn looks_like_series(s: &[u8]) -> bool {
    match s.last() {
        Some(b'}') => true,
        Some(_) => scan_metric_name(s) == s.len(),
        None => false,
    }
}

fn trim_end(s: &[u8]) -> &[u8] {
    let mut e = s.len();
    while e > 0 && (s[e - 1] == b' ' || s[e - 1] == b'\t') {
        e -= 1;
    }
    &s[..e]
}

/// [`parse_series`] with the error reported against its line, as the parser would.
pub fn parse_series_at(raw: &[u8], line: usize) -> Result<Labels, ParseError> {
    parse_series(raw).map_err(|reason| ParseError {
        line,
        reason,
        text: String::from_utf8_lossy(&raw[..raw.len().min(200)]).into_owned(),
    })
}

impl<'a> Iterator for Parser<'a> {
    type Item = Result<Entry<'a>, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        loop {
            let Some(line) = self.next_line() else {
                if self.format == Format::OpenMetrics && !self.seen_eof && !self.fragment {
                    let e = self.error(b"", "OpenMetrics page does not end with \"# EOF\"");
                    return Some(Err(e));
                }
                return None;
            };
            if self.seen_eof {
                return Some(Err(self.error(line, "content after \"# EOF\"")));
            }
            let trimmed = if self.format == Format::Text { trim_start(line) } else { line };
            if trimmed.is_empty() {
                if self.format == Format::OpenMetrics {
                    return Some(Err(self.error(line, "empty line in OpenMetrics page")));
                }
                continue;
            }
            if trimmed[0] == b'#' {
                match self.comment(trimmed) {
                    Some(r) => return Some(r),
                    None => continue,
                }
            }
            return Some(self.sample(trimmed));
        }
    }
}

/// Builds the label set (with `__name__`) of a raw `name{labels}` as returned by the parser.
pub fn parse_series(raw: &[u8]) -> Result<Labels, String> {
    let name_end = scan_metric_name(raw);
    if name_end == 0 {
        return Err("expected a metric name".into());
    }
    let mut b = LabelsBuilder::default();
    b.set(METRIC_NAME, std::str::from_utf8(&raw[..name_end]).map_err(|e| e.to_string())?);
    let mut i = skip_blank(raw, name_end);
    if i == raw.len() {
        return Ok(b.build());
    }
    if raw[i] != b'{' {
        return Err("expected '{' or the end of the series after the metric name".into());
    }
    i += 1;
    let mut pairs = Vec::new();
    loop {
        i = skip_blank(raw, i);
        match raw.get(i) {
            Some(b'}') => break,
            None => return Err("unterminated label set".into()),
            _ => {}
        }
        let n = scan_label_name(&raw[i..]);
        if n == 0 {
            return Err("invalid label name".into());
        }
        let n_end = i + n;
        let lname = std::str::from_utf8(&raw[i..n_end]).map_err(|e| e.to_string())?;
        i = skip_blank(raw, n_end);
        if raw.get(i) != Some(&b'=') {
            return Err(format!("expected '=' after label {lname}"));
        }
        i = skip_blank(raw, i + 1);
        if raw.get(i) != Some(&b'"') {
            return Err(format!("expected '\"' for label {lname}"));
        }
        let (value, next) = read_quoted(raw, i + 1)?;
        if lname == METRIC_NAME {
            return Err(format!("duplicate label {lname}"));
        }
        pairs.push((lname, value));
        i = skip_blank(raw, next);
        match raw.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => {}
            _ => return Err("expected ',' or '}' after label value".into()),
        }
    }
    if skip_blank(raw, i + 1) != raw.len() {
        return Err("unexpected text after the label set".into());
    }
    // Sorted once rather than inserted in order one by one: a line of many labels in
    // descending order would otherwise cost quadratic time.
    pairs.sort_by(|a, b| a.0.cmp(b.0));
    if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
        // Any repeated name, whatever its values, as Prometheus refuses it.
        return Err(format!("duplicate label {}", w[0].0));
    }
    for (name, value) in &pairs {
        b.set(name, value);
    }
    Ok(b.build())
}

// ---- lexing helpers ----

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    memchr::memchr(needle, hay)
}

fn trim_start(s: &[u8]) -> &[u8] {
    let i = skip_blank(s, 0);
    &s[i..]
}

fn skip_blank(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && (s[i] == b' ' || s[i] == b'\t') {
        i += 1;
    }
    i
}

/// The token up to the next blank, and the rest (starting at that blank).
fn split_token(s: &[u8]) -> (&[u8], &[u8]) {
    let end = s.iter().position(|&c| c == b' ' || c == b'\t').unwrap_or(s.len());
    (&s[..end], &s[end..])
}

fn is_metric_name(s: &str) -> bool {
    !s.is_empty() && scan_metric_name(s.as_bytes()) == s.len()
}

fn scan_metric_name(s: &[u8]) -> usize {
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let ok = c.is_ascii_alphabetic() || c == b'_' || c == b':' || (i > 0 && c.is_ascii_digit());
        if !ok {
            break;
        }
        i += 1;
    }
    i
}

fn scan_label_name(s: &[u8]) -> usize {
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if !(c.is_ascii_alphabetic() || c == b'_' || (i > 0 && c.is_ascii_digit())) {
            break;
        }
        i += 1;
    }
    i
}

/// Validates `name="value", ...}` starting after `{`; returns the index after `}`.
fn scan_labels(s: &[u8], mut i: usize) -> Result<usize, String> {
    loop {
        i = skip_blank(s, i);
        match s.get(i) {
            Some(b'}') => return Ok(i + 1),
            None => return Err("label set is not closed with '}'".into()),
            _ => {}
        }
        let n = scan_label_name(&s[i..]);
        if n == 0 {
            return Err("invalid label name".into());
        }
        i = skip_blank(s, i + n);
        if s.get(i) != Some(&b'=') {
            return Err("expected '=' after label name".into());
        }
        i = skip_blank(s, i + 1);
        if s.get(i) != Some(&b'"') {
            return Err("expected '\"' to open the label value".into());
        }
        i += 1;
        loop {
            match memchr::memchr2(b'"', b'\\', s.get(i..).unwrap_or_default()) {
                None => return Err("unterminated label value".into()),
                Some(k) if s[i + k] == b'\\' => i += k + 2,
                Some(k) => {
                    i += k;
                    break;
                }
            }
        }
        i = skip_blank(s, i + 1);
        match s.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => return Ok(i + 1),
            _ => return Err("expected ',' or '}' after label value".into()),
        }
    }
}

/// Reads a quoted label value starting after the opening quote; returns it unescaped and
/// the index after the closing quote.
fn read_quoted(s: &[u8], mut i: usize) -> Result<(Cow<'_, str>, usize), String> {
    let start = i;
    let mut has_escape = false;
    loop {
        match s.get(i) {
            None => return Err("unterminated label value".into()),
            Some(b'\\') => {
                has_escape = true;
                i += 2;
            }
            Some(b'"') => break,
            Some(_) => i += 1,
        }
    }
    let raw = std::str::from_utf8(&s[start..i]).map_err(|e| e.to_string())?;
    let v = if has_escape { Cow::Owned(unescape_label_value(raw)) } else { Cow::Borrowed(raw) };
    Ok((v, i + 1))
}

fn unescape_label_value(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('"') => out.push('"'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn unescape_help(raw: &str) -> Cow<'_, str> {
    if !raw.contains('\\') {
        return Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    Cow::Owned(out)
}

/// Parses a sample value like Go's `strconv.ParseFloat`, normalising NaN.
pub fn parse_value(tok: &[u8]) -> Option<f64> {
    if tok.is_empty() {
        return None;
    }
    // Fast path for plain integers, the most common DCGM value.
    if tok.len() <= 15 && tok.iter().all(|c| c.is_ascii_digit()) {
        let mut v: u64 = 0;
        for &c in tok {
            v = v * 10 + (c - b'0') as u64;
        }
        return Some(v as f64);
    }
    let s = std::str::from_utf8(tok).ok()?;
    let v: f64 = s.parse().ok()?;
    Some(if v.is_nan() { f64::from_bits(NORMAL_NAN_BITS) } else { v })
}

#[cfg(test)]
mod tests;
