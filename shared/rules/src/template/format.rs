//! Go's number formatting (`%v`, `%g`, `%e`, `%f`) and `fmt.Sprintf`, so that a template's
//! output is the text Prometheus gives for the same alert: `1e+06`, not `1000000`.

use super::Value;

/// The decimal digits of `v` (no trailing zeros) and the decimal point's position:
/// `v = 0.d1d2... × 10^dp`. `precision` significant digits, or the shortest that reads back.
fn digits(v: f64, precision: Option<usize>) -> (Vec<u8>, i32) {
    if v == 0.0 {
        return (Vec::new(), 0);
    }
    let s = match precision {
        Some(p) => format!("{:.*e}", p.saturating_sub(1), v.abs()),
        None => format!("{:e}", v.abs()),
    };
    let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let mut d: Vec<u8> = mant.bytes().filter(u8::is_ascii_digit).collect();
    while d.last() == Some(&b'0') {
        d.pop();
    }
    (d, exp + 1)
}

fn fmt_e(neg: bool, d: &[u8], dp: i32, prec: usize, upper: bool) -> String {
    let mut s = String::new();
    if neg {
        s.push('-');
    }
    s.push(*d.first().unwrap_or(&b'0') as char);
    if prec > 0 {
        s.push('.');
        for i in 1..=prec {
            s.push(*d.get(i).unwrap_or(&b'0') as char);
        }
    }
    let exp = if d.is_empty() { 0 } else { dp - 1 };
    s.push(if upper { 'E' } else { 'e' });
    s.push(if exp < 0 { '-' } else { '+' });
    let e = exp.unsigned_abs();
    if e < 10 {
        s.push('0');
    }
    s.push_str(&e.to_string());
    s
}

fn fmt_f(neg: bool, d: &[u8], dp: i32, prec: usize) -> String {
    let mut s = String::new();
    if neg {
        s.push('-');
    }
    if dp > 0 {
        for i in 0..dp as usize {
            s.push(*d.get(i).unwrap_or(&b'0') as char);
        }
    } else {
        s.push('0');
    }
    if prec > 0 {
        s.push('.');
        for i in 0..prec as i64 {
            let at = dp as i64 + i;
            let c = if at >= 0 { *d.get(at as usize).unwrap_or(&b'0') } else { b'0' };
            s.push(c as char);
        }
    }
    s
}

fn special(v: f64) -> Option<String> {
    if v.is_nan() {
        Some("NaN".into())
    } else if v.is_infinite() {
        Some(if v > 0.0 { "+Inf".into() } else { "-Inf".into() })
    } else {
        None
    }
}

/// `strconv.FormatFloat(v, 'g', precision, 64)`; `None` is the shortest (`%v`).
pub fn format_g(v: f64, precision: Option<usize>, upper: bool) -> String {
    if let Some(s) = special(v) {
        return s;
    }
    let neg = v.is_sign_negative() && v != 0.0;
    let prec = precision.map(|p| p.max(1));
    let (d, dp) = digits(v, prec);
    let nd = d.len() as i32;
    // Go's rule: the exponent form when the exponent is below -4 or at least the precision
    // (6 for the shortest form).
    let eprec = match prec {
        Some(p) if p as i32 > nd && nd >= dp => nd,
        Some(p) => p as i32,
        None => 6,
    };
    let exp = dp - 1;
    if !d.is_empty() && (exp < -4 || exp >= eprec) {
        let p = match prec {
            Some(p) if (p as i32) <= nd => p,
            _ => d.len(),
        };
        return fmt_e(neg, &d, dp, p.saturating_sub(1), upper);
    }
    let p = match prec {
        Some(p) if (p as i32) <= dp => p as i32,
        _ => nd,
    };
    fmt_f(neg, &d, dp, (p - dp).max(0) as usize)
}

/// `%e` with `prec` digits after the point.
pub fn format_e(v: f64, prec: usize, upper: bool) -> String {
    if let Some(s) = special(v) {
        return s;
    }
    let neg = v.is_sign_negative() && v != 0.0;
    let (d, dp) = digits(v, Some(prec + 1));
    fmt_e(neg, &d, dp, prec, upper)
}

/// `%f` with `prec` digits after the point.
pub fn format_f(v: f64, prec: usize) -> String {
    if let Some(s) = special(v) {
        return s;
    }
    format!("{:.*}", prec, v)
}

struct Spec {
    minus: bool,
    plus: bool,
    space: bool,
    zero: bool,
    sharp: bool,
    width: Option<usize>,
    prec: Option<usize>,
}

impl Spec {
    fn pad(&self, s: String) -> String {
        let Some(w) = self.width else { return s };
        let n = s.chars().count();
        if n >= w {
            return s;
        }
        let fill = w - n;
        if self.minus {
            format!("{s}{}", " ".repeat(fill))
        } else if self.zero && s.starts_with(['-', '+']) {
            format!("{}{}{}", &s[..1], "0".repeat(fill), &s[1..])
        } else if self.zero {
            format!("{}{s}", "0".repeat(fill))
        } else {
            format!("{}{s}", " ".repeat(fill))
        }
    }

    fn sign(&self, s: String) -> String {
        if s.starts_with('-') || s == "NaN" || s.starts_with('+') {
            return s;
        }
        if self.plus {
            format!("+{s}")
        } else if self.space {
            format!(" {s}")
        } else {
            s
        }
    }
}

fn bad(verb: char, v: &Value) -> String {
    format!("%!{verb}({}={})", v.type_name(), v.print())
}

fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn one(verb: char, spec: &Spec, v: &Value) -> String {
    let s = match (verb, v) {
        ('v', _) => v.print(),
        ('s', Value::Str(s)) => s.clone(),
        ('s', _) if !matches!(v, Value::Int(_) | Value::Float(_) | Value::Bool(_)) => v.print(),
        ('q', Value::Str(s)) => quote(s),
        ('t', Value::Bool(b)) => b.to_string(),
        ('d', Value::Int(i)) => spec.sign(i.to_string()),
        ('x', Value::Int(i)) => format!("{}{:x}", if *i < 0 { "-" } else { "" }, i.unsigned_abs()),
        ('X', Value::Int(i)) => format!("{}{:X}", if *i < 0 { "-" } else { "" }, i.unsigned_abs()),
        ('o', Value::Int(i)) => format!("{}{:o}", if *i < 0 { "-" } else { "" }, i.unsigned_abs()),
        ('b', Value::Int(i)) => format!("{}{:b}", if *i < 0 { "-" } else { "" }, i.unsigned_abs()),
        ('c', Value::Int(i)) => char::from_u32(*i as u32).map(String::from).unwrap_or_else(|| "\u{fffd}".into()),
        ('x', Value::Str(s)) => s.bytes().map(|b| format!("{b:02x}")).collect(),
        ('X', Value::Str(s)) => s.bytes().map(|b| format!("{b:02X}")).collect(),
        ('f' | 'F', Value::Float(f)) => spec.sign(format_f(*f, spec.prec.unwrap_or(6))),
        ('e' | 'E', Value::Float(f)) => spec.sign(format_e(*f, spec.prec.unwrap_or(6), verb == 'E')),
        ('g' | 'G', Value::Float(f)) => spec.sign(format_g(*f, spec.prec, verb == 'G')),
        _ => return bad(verb, v),
    };
    let s = match (verb, spec.prec, v) {
        ('s' | 'v', Some(p), Value::Str(_)) => s.chars().take(p).collect(),
        _ => s,
    };
    let _ = spec.sharp;
    spec.pad(s)
}

/// `fmt.Sprintf(format, args...)`, Go's verbs and its `%!verb(type=value)` for a mismatch.
pub fn sprintf(format: &str, args: &[Value]) -> String {
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    let mut next = 0usize;
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec =
            Spec { minus: false, plus: false, space: false, zero: false, sharp: false, width: None, prec: None };
        while let Some(&f) = chars.peek() {
            match f {
                '-' => spec.minus = true,
                '+' => spec.plus = true,
                ' ' => spec.space = true,
                '0' => spec.zero = true,
                '#' => spec.sharp = true,
                _ => break,
            }
            chars.next();
        }
        let mut number = |chars: &mut std::iter::Peekable<std::str::Chars>| -> Option<usize> {
            if chars.peek() == Some(&'*') {
                chars.next();
                let v = match args.get(next) {
                    Some(Value::Int(i)) => usize::try_from(*i).ok(),
                    _ => None,
                };
                next += 1;
                return v.map(|v| v.min(1 << 16));
            }
            let mut n: Option<usize> = None;
            while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
                n = Some(n.unwrap_or(0).saturating_mul(10).saturating_add(d as usize).min(1 << 16));
                chars.next();
            }
            n
        };
        spec.width = number(&mut chars);
        if chars.peek() == Some(&'.') {
            chars.next();
            spec.prec = Some(number(&mut chars).unwrap_or(0));
        }
        let Some(verb) = chars.next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        if verb == '%' {
            out.push('%');
            continue;
        }
        match args.get(next) {
            Some(v) => out.push_str(&one(verb, &spec, v)),
            None => out.push_str(&format!("%!{verb}(MISSING)")),
        }
        next += 1;
    }
    if next < args.len() {
        out.push_str("%!(EXTRA ");
        let extra: Vec<String> = args[next..].iter().map(|v| format!("{}={}", v.type_name(), v.print())).collect();
        out.push_str(&extra.join(", "));
        out.push(')');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_go_prints_them() {
        for (v, want) in [
            (1e6, "1e+06"),
            (100000.0, "100000"),
            (0.1, "0.1"),
            (1.5e-7, "1.5e-07"),
            (3.0, "3"),
            (-2.5, "-2.5"),
            (123456789.0, "1.23456789e+08"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.0, "0"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "+Inf"),
        ] {
            assert_eq!(format_g(v, None, false), want, "{v}");
        }
        for (v, want) in [
            (1234.5, "1234"),
            (12345.0, "1.234e+04"),
            (2.5, "2.5"),
            (100.0, "100"),
            (0.000123456, "0.0001235"),
            (1.0, "1"),
            (999.99, "1000"),
            (99999.0, "1e+05"),
        ] {
            assert_eq!(format_g(v, Some(4), false), want, "{v}");
        }
        assert_eq!(format_e(1234.5678, 2, false), "1.23e+03");
        assert_eq!(format_f(2.0 / 3.0, 2), "0.67");
    }

    #[test]
    fn sprintf_follows_go() {
        let f = Value::Float(42.123);
        assert_eq!(sprintf("%.2f", std::slice::from_ref(&f)), "42.12");
        assert_eq!(sprintf("%v and %s", &[Value::Int(3), Value::Str("x".into())]), "3 and x");
        assert_eq!(sprintf("%d", std::slice::from_ref(&f)), "%!d(float64=42.123)");
        assert_eq!(sprintf("%d %d", &[Value::Int(1)]), "1 %!d(MISSING)");
        assert_eq!(sprintf("%5.1f|%-4d|%05d", &[f, Value::Int(7), Value::Int(-3)]), " 42.1|7   |-0003");
        assert_eq!(sprintf("%q 100%%", &[Value::Str("a\"b".into())]), "\"a\\\"b\" 100%");
        assert_eq!(sprintf("x", &[Value::Int(1)]), "x%!(EXTRA int=1)");
    }
}
