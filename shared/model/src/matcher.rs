//! Label matchers (`=`, `!=`, `=~`, `!~`) with Prometheus' semantics: a missing label
//! has the empty value, and regexes are fully anchored RE2 syntax.

use crate::labels::Labels;
use regex::Regex;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    Equal,
    NotEqual,
    Regex,
    NotRegex,
}

#[derive(Debug, Clone)]
pub struct Matcher {
    pub name: String,
    pub op: MatchOp,
    pub value: String,
    re: Option<Regex>,
}

#[derive(Debug, thiserror::Error)]
#[error("invalid regular expression {pattern:?} for label {label}: {source}")]
pub struct MatcherError {
    pub label: String,
    pub pattern: String,
    #[source]
    pub source: regex::Error,
}

/// Compiles a Prometheus regex as Prometheus does, `^(?s:…)$`, with Go's ASCII meaning of
/// `\d`, `\s`, `\w` (and their negations); Rust's shorthand classes are Unicode-aware.
pub fn compile_anchored(pattern: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!("^(?s:{})$", go_shorthand_classes(pattern)))
}

fn go_shorthand_classes(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str("[0-9]"),
            Some('D') => out.push_str("[^0-9]"),
            Some('s') => out.push_str("[\\t\\n\\f\\r ]"),
            Some('S') => out.push_str("[^\\t\\n\\f\\r ]"),
            Some('w') => out.push_str("[0-9A-Za-z_]"),
            Some('W') => out.push_str("[^0-9A-Za-z_]"),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

impl Matcher {
    pub fn new(op: MatchOp, name: &str, value: &str) -> Result<Self, MatcherError> {
        let re = match op {
            MatchOp::Regex | MatchOp::NotRegex => Some(compile_anchored(value).map_err(|source| MatcherError {
                label: name.to_string(),
                pattern: value.to_string(),
                source,
            })?),
            _ => None,
        };
        Ok(Matcher { name: name.to_string(), op, value: value.to_string(), re })
    }

    /// Shorthand for an equality matcher, which cannot fail.
    pub fn eq(name: &str, value: &str) -> Self {
        Matcher { name: name.to_string(), op: MatchOp::Equal, value: value.to_string(), re: None }
    }

    /// Does this matcher accept the label value `v` (`""` for a missing label)?
    pub fn matches(&self, v: &str) -> bool {
        match self.op {
            MatchOp::Equal => v == self.value,
            MatchOp::NotEqual => v != self.value,
            MatchOp::Regex => self.re.as_ref().is_some_and(|r| r.is_match(v)),
            MatchOp::NotRegex => !self.re.as_ref().is_some_and(|r| r.is_match(v)),
        }
    }

    pub fn matches_labels(&self, labels: &Labels) -> bool {
        self.matches(labels.get(&self.name).unwrap_or(""))
    }
}

/// True when every matcher accepts the label set.
pub fn matches_all(matchers: &[Matcher], labels: &Labels) -> bool {
    matchers.iter().all(|m| m.matches_labels(labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_label_is_empty() {
        let l = Labels::from_pairs([("a", "1")]);
        assert!(Matcher::eq("b", "").matches_labels(&l));
        assert!(!Matcher::eq("a", "").matches_labels(&l));
        assert!(Matcher::new(MatchOp::NotEqual, "b", "x").unwrap().matches_labels(&l));
    }

    #[test]
    fn regex_is_anchored_and_ascii_digits() {
        let m = Matcher::new(MatchOp::Regex, "a", "1|2").unwrap();
        assert!(m.matches("1"));
        assert!(!m.matches("12"));
        let d = Matcher::new(MatchOp::Regex, "a", r"\d+").unwrap();
        assert!(d.matches("42"));
        assert!(!d.matches("٤٢"), "Go's \\d is ASCII only");
        assert!(Matcher::new(MatchOp::Regex, "a", "(").is_err());
    }
}
