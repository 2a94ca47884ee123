//! Rule files as Prometheus 3 reads them (`groups` with `name`, `interval`, `query_offset`,
//! `limit`, `labels`, `rules`), validated as its `rulefmt` validates them: exactly one of
//! `record`/`alert`, an expression that parses, no `for`, `keep_firing_for` or annotations
//! on a recording rule, valid names, group names unique per file, templates that parse.
//! Unknown keys are errors. Every error names the file, and for a rule its line, column,
//! group, position and name, as Prometheus' messages do.

use crate::template::{parse_alert_template, Template};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use strata_model::labels::is_valid_label_name;
use strata_model::Labels;
use strata_promql::Expr;

/// Rule files larger than this are refused before they are parsed.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("{file}: {}", .errors.join("; "))]
pub struct RuleFileError {
    pub file: String,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    Recording,
    Alerting,
}

/// One rule, validated, its expression parsed and (for alerts) its templates too.
#[derive(Clone)]
pub struct RuleSpec {
    pub kind: RuleKind,
    pub name: String,
    pub expr_text: String,
    pub expr: Arc<Expr>,
    pub for_ms: i64,
    pub keep_firing_for_ms: i64,
    /// The rule's labels over the group's (the rule's win), unexpanded.
    pub labels: Vec<(String, String)>,
    pub annotations: Vec<(String, String)>,
    /// For alerts: the label and annotation templates, parsed.
    pub label_templates: Vec<(String, Arc<Template>)>,
    pub annotation_templates: Vec<(String, Arc<Template>)>,
    /// Where the rule is in its file (1-based), for errors and the API.
    pub line: u64,
}

impl std::fmt::Debug for RuleSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleSpec").field("name", &self.name).field("expr", &self.expr_text).finish()
    }
}

/// One group of a file.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    pub file: String,
    pub name: String,
    /// `None`: the global evaluation interval.
    pub interval_ms: Option<i64>,
    pub query_offset_ms: Option<i64>,
    /// 0: no limit.
    pub limit: usize,
    pub rules: Vec<RuleSpec>,
}

/// A YAML scalar read as the text Prometheus would see (`priority: 1` is the label "1").
#[derive(Debug, Clone)]
struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_unit<E>(self) -> Result<Scalar, E> {
                Ok(Scalar(String::new()))
            }
        }
        // As a string: a plain scalar's text as written (`yes`, `1.10`, `0x1F`), as
        // Prometheus' YAML reads it into a string, not a value printed again.
        d.deserialize_str(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    groups: Vec<Spanned<RawGroup>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    #[serde(default)]
    name: String,
    interval: Option<Scalar>,
    query_offset: Option<Scalar>,
    #[serde(default)]
    limit: usize,
    #[serde(default)]
    labels: BTreeMap<String, Option<Scalar>>,
    #[serde(default)]
    rules: Vec<Spanned<RawRule>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    record: Option<Scalar>,
    alert: Option<Scalar>,
    expr: Option<Scalar>,
    #[serde(rename = "for")]
    for_: Option<Scalar>,
    keep_firing_for: Option<Scalar>,
    #[serde(default)]
    labels: BTreeMap<String, Option<Scalar>>,
    #[serde(default)]
    annotations: BTreeMap<String, Option<Scalar>>,
}

fn duration(what: &str, s: &Option<Scalar>) -> Result<Option<i64>, String> {
    match s {
        None => Ok(None),
        Some(Scalar(t)) if t.is_empty() => Ok(None),
        Some(Scalar(t)) => strata_model::duration::parse_duration_ms(t)
            .ok()
            .filter(|d| *d >= 0)
            .map(Some)
            .ok_or_else(|| format!("{what}: not a valid duration string: {t:?}")),
    }
}

/// A valid metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn is_valid_metric_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_' || b[0] == b':')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b':')
}

/// Reads and validates a rule file.
pub fn load_file(path: &Path) -> Result<Vec<GroupSpec>, RuleFileError> {
    let name = path.display().to_string();
    let fail = |e: String| RuleFileError { file: name.clone(), errors: vec![e] };
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(fail(format!("{} bytes, more than the limit of {MAX_FILE_BYTES}", meta.len())));
    }
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    parse_groups(&name, &text)
}

/// Parses and validates rule-file text; `file` names it in errors.
pub fn parse_groups(file: &str, text: &str) -> Result<Vec<GroupSpec>, RuleFileError> {
    let fail = |errors: Vec<String>| RuleFileError { file: file.to_string(), errors };
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let raw: RawFile = serde_saphyr::from_str(text).map_err(|e| fail(vec![e.to_string()]))?;
    let mut errors = Vec::new();
    let mut groups = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for g in raw.groups {
        let (g, at) = (g.value, g.referenced);
        if g.name.is_empty() {
            errors.push(format!("{}:{}: Groupname must not be empty", at.line(), at.column()));
            continue;
        }
        if !seen.insert(g.name.clone()) {
            errors.push(format!("{}:{}: groupname: {:?} is repeated in the same file", at.line(), at.column(), g.name));
            continue;
        }
        let interval = duration("interval", &g.interval);
        let offset = duration("query_offset", &g.query_offset);
        let (interval, offset) = match (interval, offset) {
            (Ok(i), Ok(o)) => (i, o),
            (Err(e), _) | (_, Err(e)) => {
                errors.push(format!("{}:{}: group {:?}: {e}", at.line(), at.column(), g.name));
                continue;
            }
        };
        if interval == Some(0) {
            errors.push(format!(
                "{}:{}: group {:?}: interval must be greater than zero",
                at.line(),
                at.column(),
                g.name
            ));
            continue;
        }
        let mut group_labels = Vec::new();
        for (k, v) in &g.labels {
            if !is_valid_label_name(k) || k == "__name__" {
                errors.push(format!("{}:{}: group {:?}: invalid label name: {k}", at.line(), at.column(), g.name));
            }
            group_labels.push((k.clone(), v.as_ref().map(|s| s.0.clone()).unwrap_or_default()));
        }
        let mut rules = Vec::new();
        for (i, r) in g.rules.into_iter().enumerate() {
            let (r, at) = (r.value, r.referenced);
            let rule_name = r.record.as_ref().or(r.alert.as_ref()).map(|s| s.0.clone()).unwrap_or_default();
            match rule(r, &group_labels) {
                Ok(mut spec) => {
                    spec.line = at.line();
                    rules.push(spec);
                }
                Err(es) => {
                    for e in es {
                        errors.push(format!(
                            "{}:{}: group {:?}, rule {}, {:?}: {e}",
                            at.line(),
                            at.column(),
                            g.name,
                            i + 1,
                            rule_name
                        ));
                    }
                }
            }
        }
        groups.push(GroupSpec {
            file: file.to_string(),
            name: g.name,
            interval_ms: interval,
            query_offset_ms: offset,
            limit: g.limit,
            rules,
        });
    }
    if errors.is_empty() {
        Ok(groups)
    } else {
        Err(fail(errors))
    }
}

fn rule(r: RawRule, group_labels: &[(String, String)]) -> Result<RuleSpec, Vec<String>> {
    let mut errs = Vec::new();
    let record = r.record.map(|s| s.0).filter(|s| !s.is_empty());
    let alert = r.alert.map(|s| s.0).filter(|s| !s.is_empty());
    let (kind, name) = match (record, alert) {
        (Some(_), Some(_)) => return Err(vec!["only one of 'record' and 'alert' must be set".into()]),
        (None, None) => return Err(vec!["one of 'record' or 'alert' must be set".into()]),
        (Some(n), None) => (RuleKind::Recording, n),
        (None, Some(n)) => (RuleKind::Alerting, n),
    };
    let expr_text = r.expr.map(|s| s.0).unwrap_or_default();
    let expr = if expr_text.trim().is_empty() {
        errs.push("field 'expr' must be set in rule".to_string());
        None
    } else {
        match strata_promql::parse(&expr_text) {
            Ok(e) => Some(e),
            Err(e) => {
                errs.push(format!("could not parse expression: {e}"));
                None
            }
        }
    };
    let for_ms = duration("for", &r.for_).unwrap_or_else(|e| {
        errs.push(e);
        None
    });
    let keep_ms = duration("keep_firing_for", &r.keep_firing_for).unwrap_or_else(|e| {
        errs.push(e);
        None
    });
    if kind == RuleKind::Recording {
        if !r.annotations.is_empty() {
            errs.push("invalid field 'annotations' in recording rule".into());
        }
        if r.for_.is_some() {
            errs.push("invalid field 'for' in recording rule".into());
        }
        if r.keep_firing_for.is_some() {
            errs.push("invalid field 'keep_firing_for' in recording rule".into());
        }
        if !is_valid_metric_name(&name) {
            errs.push(format!("invalid recording rule name: {name}"));
        }
    }
    let mut labels: BTreeMap<String, String> = group_labels.iter().cloned().collect();
    for (k, v) in r.labels {
        if !is_valid_label_name(&k) || k == "__name__" {
            errs.push(format!("invalid label name: {k}"));
        }
        labels.insert(k, v.map(|s| s.0).unwrap_or_default());
    }
    let mut annotations = Vec::new();
    for (k, v) in r.annotations {
        if !is_valid_label_name(&k) {
            errs.push(format!("invalid annotation name: {k}"));
        }
        annotations.push((k, v.map(|s| s.0).unwrap_or_default()));
    }
    let labels: Vec<(String, String)> = labels.into_iter().collect();
    let (mut label_templates, mut annotation_templates) = (Vec::new(), Vec::new());
    if kind == RuleKind::Alerting {
        for (k, v) in &labels {
            match parse_alert_template(v) {
                Ok(t) => label_templates.push((k.clone(), Arc::new(t))),
                Err(e) => errs.push(format!("label {k:?}: {e}")),
            }
        }
        for (k, v) in &annotations {
            match parse_alert_template(v) {
                Ok(t) => annotation_templates.push((k.clone(), Arc::new(t))),
                Err(e) => errs.push(format!("annotation {k:?}: {e}")),
            }
        }
    }
    match expr {
        Some(expr) if errs.is_empty() => Ok(RuleSpec {
            kind,
            name,
            expr_text,
            expr: Arc::new(expr),
            for_ms: for_ms.unwrap_or(0),
            keep_firing_for_ms: keep_ms.unwrap_or(0),
            labels,
            annotations,
            label_templates,
            annotation_templates,
            line: 0,
        }),
        _ => Err(errs),
    }
}

/// Loads every file that `patterns` (globs) match, in order; a pattern that matches
/// nothing is not an error (Prometheus warns), a file that fails is.
pub fn load_globs(patterns: &[String], base: &Path) -> Result<(Vec<GroupSpec>, Vec<String>), Vec<RuleFileError>> {
    let mut groups = Vec::new();
    let mut warnings = Vec::new();
    let mut errors = Vec::new();
    for p in patterns {
        let full = if Path::new(p).is_absolute() { p.clone() } else { base.join(p).display().to_string() };
        let mut files: Vec<_> = match glob::glob(&full) {
            Ok(paths) => paths.filter_map(Result::ok).collect(),
            Err(e) => {
                errors.push(RuleFileError { file: p.clone(), errors: vec![format!("bad pattern: {e}")] });
                continue;
            }
        };
        files.sort();
        if files.is_empty() {
            warnings.push(format!("no file match pattern {full}"));
        }
        for f in files {
            match load_file(&f) {
                Ok(g) => groups.extend(g),
                Err(e) => errors.push(e),
            }
        }
    }
    if errors.is_empty() {
        Ok((groups, warnings))
    } else {
        Err(errors)
    }
}

/// A rule's static labels as a label set (recording rules add them to every result).
pub fn labels_of(pairs: &[(String, String)]) -> Labels {
    Labels::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_file_loads_with_group_labels_under_the_rules() {
        let g = parse_groups(
            "r.yml",
            "groups:\n  - name: gpu\n    interval: 30s\n    query_offset: 10s\n    limit: 5\n    labels:\n      team: ml\n      tier: a\n    rules:\n      - record: job:up:sum\n        expr: sum by (job) (up)\n        labels:\n          tier: b\n          priority: 1\n      - alert: Hot\n        expr: gpu_temp > 80\n        for: 5m\n        keep_firing_for: 1m\n        annotations:\n          summary: \"{{ $labels.gpu }} at {{ $value }}\"\n",
        )
        .unwrap();
        assert_eq!(g.len(), 1);
        let g = &g[0];
        assert_eq!((g.interval_ms, g.query_offset_ms, g.limit), (Some(30_000), Some(10_000), 5));
        assert_eq!(
            g.rules[0].labels,
            vec![("priority".into(), "1".into()), ("team".into(), "ml".into()), ("tier".into(), "b".into())]
        );
        assert_eq!(g.rules[0].line, 10);
        assert_eq!(g.rules[1].kind, RuleKind::Alerting);
        assert_eq!((g.rules[1].for_ms, g.rules[1].keep_firing_for_ms), (300_000, 60_000));
        assert_eq!(g.rules[1].annotation_templates.len(), 1);
    }

    #[test]
    fn label_values_keep_their_text_as_yaml_wrote_it() {
        let g = parse_groups(
            "r.yml",
            "groups:\n- name: a\n  rules:\n  - alert: A\n    expr: up\n    labels:\n      paging: yes\n      version: 1.10\n      hex: 0x1F\n      n: 007\n      t: true\n      empty:\n    annotations:\n      summary:\n      tilde: ~\n",
        )
        .unwrap();
        let labels: BTreeMap<String, String> = g[0].rules[0].labels.iter().cloned().collect();
        let want =
            [("empty", ""), ("hex", "0x1F"), ("n", "007"), ("paging", "yes"), ("t", "true"), ("version", "1.10")];
        assert_eq!(labels, want.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        // Empty values, as Prometheus reads them.
        let annotations: BTreeMap<String, String> = g[0].rules[0].annotations.iter().cloned().collect();
        assert_eq!(annotations.get("summary").map(String::as_str), Some(""));
        assert_eq!(annotations.get("tilde").map(String::as_str), Some(""));
    }

    #[test]
    fn invalid_rules_are_named_with_their_line() {
        for (text, want) in [
            (
                "groups:\n- name: a\n  rules:\n  - record: x\n    alert: y\n    expr: up\n",
                "4:5: group \"a\", rule 1, \"x\": only one of 'record' and 'alert' must be set",
            ),
            ("groups:\n- name: a\n  rules:\n  - expr: up\n", "one of 'record' or 'alert' must be set"),
            ("groups:\n- name: a\n  rules:\n  - record: x\n", "field 'expr' must be set in rule"),
            ("groups:\n- name: a\n  rules:\n  - record: x\n    expr: sum(\n", "could not parse expression"),
            (
                "groups:\n- name: a\n  rules:\n  - record: x\n    expr: up\n    for: 1m\n",
                "invalid field 'for' in recording rule",
            ),
            (
                "groups:\n- name: a\n  rules:\n  - record: x\n    expr: up\n    annotations: {a: b}\n",
                "invalid field 'annotations'",
            ),
            ("groups:\n- name: a\n  rules:\n  - record: 1x\n    expr: up\n", "invalid recording rule name: 1x"),
            (
                "groups:\n- name: a\n  rules:\n  - alert: x\n    expr: up\n    labels: {\"a-b\": c}\n",
                "invalid label name: a-b",
            ),
            (
                "groups:\n- name: a\n  rules:\n  - alert: x\n    expr: up\n    annotations: {s: \"{{ if }}\"}\n",
                "annotation \"s\"",
            ),
            ("groups:\n- name: a\n  rules:\n  - alert: x\n    expr: up\n    for: soon\n", "not a valid duration"),
            ("groups:\n- name: a\n  rules: []\n- name: a\n  rules: []\n", "\"a\" is repeated in the same file"),
            ("groups:\n- rules: []\n", "Groupname must not be empty"),
            ("groups:\n- name: a\n  rulez: []\n", "rulez"),
            ("groups:\n- name: a\n  interval: 0s\n  rules: []\n", "greater than zero"),
        ] {
            let e = parse_groups("bad.yml", text).unwrap_err();
            assert!(e.to_string().starts_with("bad.yml: "), "{e}");
            assert!(e.to_string().contains(want), "{text}: {e}");
        }
    }
}
