//! Prometheus relabeling (`relabel_configs`, `metric_relabel_configs`), every action of
//! Prometheus 2.42 with its validation rules and template semantics (`$1`, `${name}`).

use regex::Regex;
use serde::Deserialize;
use strata_model::matcher::compile_anchored;
use strata_model::{is_valid_label_name, Labels, LabelsBuilder};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Action {
    #[default]
    Replace,
    Keep,
    Drop,
    KeepEqual,
    DropEqual,
    HashMod,
    LabelMap,
    LabelDrop,
    LabelKeep,
    Lowercase,
    Uppercase,
}

impl<'de> Deserialize<'de> for Action {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.to_ascii_lowercase().as_str() {
            "replace" => Action::Replace,
            "keep" => Action::Keep,
            "drop" => Action::Drop,
            "keepequal" => Action::KeepEqual,
            "dropequal" => Action::DropEqual,
            "hashmod" => Action::HashMod,
            "labelmap" => Action::LabelMap,
            "labeldrop" => Action::LabelDrop,
            "labelkeep" => Action::LabelKeep,
            "lowercase" => Action::Lowercase,
            "uppercase" => Action::Uppercase,
            other => return Err(serde::de::Error::custom(format!("unknown relabel action {other:?}"))),
        })
    }
}

/// One `relabel_configs` entry as written in YAML.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RelabelConfig {
    #[serde(default)]
    pub source_labels: Vec<String>,
    pub separator: Option<String>,
    pub regex: Option<String>,
    pub modulus: Option<u64>,
    pub target_label: Option<String>,
    pub replacement: Option<String>,
    #[serde(default)]
    pub action: Action,
}

#[derive(Debug, thiserror::Error)]
pub enum RelabelError {
    #[error("relabel action {action:?}: {reason}")]
    Invalid { action: Action, reason: String },
    #[error("relabel regex {pattern:?}: {source}")]
    Regex {
        pattern: String,
        #[source]
        source: regex::Error,
    },
}

/// A validated, compiled relabel rule.
#[derive(Debug, Clone)]
pub struct RelabelRule {
    source_labels: Vec<String>,
    separator: String,
    regex: Regex,
    modulus: u64,
    target_label: String,
    replacement: String,
    action: Action,
}

impl RelabelRule {
    pub fn compile(cfg: &RelabelConfig) -> Result<Self, RelabelError> {
        let action = cfg.action;
        let invalid = |reason: &str| RelabelError::Invalid { action, reason: reason.to_string() };
        let pattern = cfg.regex.clone().unwrap_or_else(|| "(.*)".to_string());
        let regex =
            compile_anchored(&pattern).map_err(|source| RelabelError::Regex { pattern: pattern.clone(), source })?;
        let target_label = cfg.target_label.clone().unwrap_or_default();
        let replacement = cfg.replacement.clone().unwrap_or_else(|| "$1".to_string());
        let needs_target = matches!(
            action,
            Action::Replace
                | Action::HashMod
                | Action::Lowercase
                | Action::Uppercase
                | Action::KeepEqual
                | Action::DropEqual
        );
        if needs_target && target_label.is_empty() {
            return Err(invalid("requires target_label"));
        }
        if matches!(
            action,
            Action::Lowercase | Action::Uppercase | Action::HashMod | Action::KeepEqual | Action::DropEqual
        ) && !is_valid_label_name(&target_label)
        {
            return Err(invalid(&format!("{target_label:?} is an invalid target_label")));
        }
        if action == Action::Replace && !target_label.contains('$') && !is_valid_label_name(&target_label) {
            return Err(invalid(&format!("{target_label:?} is an invalid target_label")));
        }
        if action == Action::HashMod && cfg.modulus.unwrap_or(0) == 0 {
            return Err(invalid("requires a non-zero modulus"));
        }
        if matches!(action, Action::KeepEqual | Action::DropEqual) && cfg.regex.is_some() {
            return Err(invalid("does not take a regex"));
        }
        // As Prometheus: no field other than the regex, unless it is written with its
        // default value (`separator: ;`, `replacement: $1` are accepted).
        if matches!(action, Action::LabelDrop | Action::LabelKeep)
            && (!cfg.source_labels.is_empty()
                || cfg.target_label.as_deref().is_some_and(|t| !t.is_empty())
                || cfg.modulus.is_some_and(|m| m != 0)
                || cfg.separator.as_deref().is_some_and(|s| s != ";")
                || cfg.replacement.as_deref().is_some_and(|r| r != "$1"))
        {
            return Err(invalid("takes only a regex"));
        }
        if action == Action::LabelMap && !replacement.contains('$') && !is_valid_label_name(&replacement) {
            return Err(invalid(&format!("{replacement:?} is an invalid replacement")));
        }
        Ok(RelabelRule {
            source_labels: cfg.source_labels.clone(),
            separator: cfg.separator.clone().unwrap_or_else(|| ";".to_string()),
            regex,
            modulus: cfg.modulus.unwrap_or(0),
            target_label,
            replacement,
            action,
        })
    }

    /// Applies the rule; false means the target or series is dropped.
    pub fn apply(&self, lb: &mut LabelsBuilder) -> bool {
        let val = self.source_labels.iter().map(|n| lb.get(n).unwrap_or("")).collect::<Vec<_>>().join(&self.separator);
        match self.action {
            Action::Drop => return !self.regex.is_match(&val),
            Action::Keep => return self.regex.is_match(&val),
            Action::DropEqual => return lb.get(&self.target_label).unwrap_or("") != val,
            Action::KeepEqual => return lb.get(&self.target_label).unwrap_or("") == val,
            Action::Replace => {
                let Some(caps) = self.regex.captures(&val) else { return true };
                let mut target = String::new();
                caps.expand(&self.target_label, &mut target);
                if !is_valid_label_name(&target) {
                    return true;
                }
                let mut res = String::new();
                caps.expand(&self.replacement, &mut res);
                if res.is_empty() {
                    lb.del(&target);
                } else {
                    lb.set(&target, &res);
                }
            }
            Action::Lowercase => lb.set(&self.target_label, &val.to_lowercase()),
            Action::Uppercase => lb.set(&self.target_label, &val.to_uppercase()),
            Action::HashMod => {
                let digest = md5::compute(val.as_bytes());
                let mut tail = [0u8; 8];
                tail.copy_from_slice(&digest.0[8..16]);
                let m = u64::from_be_bytes(tail) % self.modulus;
                lb.set(&self.target_label, &m.to_string());
            }
            Action::LabelMap => {
                let snapshot: Vec<_> = lb.iter().cloned().collect();
                for l in snapshot {
                    if self.regex.is_match(&l.name) {
                        let new_name = self.regex.replace_all(&l.name, self.replacement.as_str()).into_owned();
                        // A name that is not a valid label name is not created (as `replace`
                        // skips an invalid target), rather than failing the series later.
                        if is_valid_label_name(&new_name) {
                            lb.set_shared(new_name.into(), l.value.clone());
                        }
                    }
                }
            }
            Action::LabelDrop => lb.retain(|l| !self.regex.is_match(&l.name)),
            Action::LabelKeep => lb.retain(|l| self.regex.is_match(&l.name)),
        }
        true
    }
}

/// Compiles a list of rules, naming the failing entry.
pub fn compile_all(cfgs: &[RelabelConfig]) -> Result<Vec<RelabelRule>, RelabelError> {
    cfgs.iter().map(RelabelRule::compile).collect()
}

/// Runs every rule in order; `None` when a rule dropped the label set.
pub fn process(rules: &[RelabelRule], labels: LabelsBuilder) -> Option<Labels> {
    let mut lb = labels;
    for r in rules {
        if !r.apply(&mut lb) {
            return None;
        }
    }
    Some(lb.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(yaml_like: RelabelConfig) -> RelabelRule {
        RelabelRule::compile(&yaml_like).expect("valid rule")
    }

    fn cfg(action: Action) -> RelabelConfig {
        RelabelConfig { action, ..Default::default() }
    }

    fn ls(pairs: &[(&str, &str)]) -> Labels {
        Labels::from_pairs(pairs.iter().copied())
    }

    /// (input, rules, expected output or None for dropped)
    #[test]
    fn table_of_actions() {
        let base = [("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "3"), ("Hostname", "node-7"), ("pod", "Train-A")];
        // (what the case shows, rules, expected labels: None when the series is dropped)
        type Case<'a> = (&'a str, Vec<RelabelConfig>, Option<Vec<(&'a str, &'a str)>>);
        let cases: Vec<Case> = vec![
            (
                "replace with capture groups and a separator",
                vec![RelabelConfig {
                    source_labels: vec!["Hostname".into(), "gpu".into()],
                    regex: Some("node-(\\d+);(.*)".into()),
                    target_label: Some("slot".into()),
                    replacement: Some("${1}-$2".into()),
                    ..cfg(Action::Replace)
                }],
                Some(vec![
                    ("__name__", "DCGM_FI_DEV_GPU_UTIL"),
                    ("gpu", "3"),
                    ("Hostname", "node-7"),
                    ("pod", "Train-A"),
                    ("slot", "7-3"),
                ]),
            ),
            (
                "replace that does not match changes nothing",
                vec![RelabelConfig {
                    source_labels: vec!["gpu".into()],
                    regex: Some("9".into()),
                    target_label: Some("x".into()),
                    ..cfg(Action::Replace)
                }],
                Some(base.to_vec()),
            ),
            (
                "replace is anchored: a partial match is no match",
                vec![RelabelConfig {
                    source_labels: vec!["Hostname".into()],
                    regex: Some("node".into()),
                    target_label: Some("x".into()),
                    replacement: Some("y".into()),
                    ..cfg(Action::Replace)
                }],
                Some(base.to_vec()),
            ),
            (
                "replace with an empty result deletes the target",
                vec![RelabelConfig {
                    source_labels: vec!["nope".into()],
                    target_label: Some("pod".into()),
                    ..cfg(Action::Replace)
                }],
                Some(vec![("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "3"), ("Hostname", "node-7")]),
            ),
            (
                "replace with a templated target label",
                vec![RelabelConfig {
                    source_labels: vec!["gpu".into()],
                    regex: Some("(.*)".into()),
                    target_label: Some("gpu_$1".into()),
                    replacement: Some("yes".into()),
                    ..cfg(Action::Replace)
                }],
                Some(vec![
                    ("__name__", "DCGM_FI_DEV_GPU_UTIL"),
                    ("gpu", "3"),
                    ("Hostname", "node-7"),
                    ("pod", "Train-A"),
                    ("gpu_3", "yes"),
                ]),
            ),
            (
                "keep on a match",
                vec![RelabelConfig {
                    source_labels: vec!["gpu".into()],
                    regex: Some("[0-3]".into()),
                    ..cfg(Action::Keep)
                }],
                Some(base.to_vec()),
            ),
            (
                "keep drops on no match",
                vec![RelabelConfig {
                    source_labels: vec!["gpu".into()],
                    regex: Some("[4-7]".into()),
                    ..cfg(Action::Keep)
                }],
                None,
            ),
            (
                "drop on a match",
                vec![RelabelConfig {
                    source_labels: vec!["__name__".into()],
                    regex: Some("DCGM_.*".into()),
                    ..cfg(Action::Drop)
                }],
                None,
            ),
            (
                "drop keeps on no match",
                vec![RelabelConfig {
                    source_labels: vec!["__name__".into()],
                    regex: Some("up".into()),
                    ..cfg(Action::Drop)
                }],
                Some(base.to_vec()),
            ),
            (
                "keepequal keeps when equal",
                vec![RelabelConfig {
                    source_labels: vec!["gpu".into()],
                    target_label: Some("gpu".into()),
                    ..cfg(Action::KeepEqual)
                }],
                Some(base.to_vec()),
            ),
            (
                "keepequal drops when different",
                vec![RelabelConfig {
                    source_labels: vec!["gpu".into()],
                    target_label: Some("pod".into()),
                    ..cfg(Action::KeepEqual)
                }],
                None,
            ),
            (
                "dropequal drops when equal",
                vec![RelabelConfig {
                    source_labels: vec!["gpu".into()],
                    target_label: Some("gpu".into()),
                    ..cfg(Action::DropEqual)
                }],
                None,
            ),
            (
                "hashmod",
                vec![RelabelConfig {
                    source_labels: vec!["Hostname".into()],
                    modulus: Some(8),
                    target_label: Some("shard".into()),
                    ..cfg(Action::HashMod)
                }],
                Some(vec![
                    ("__name__", "DCGM_FI_DEV_GPU_UTIL"),
                    ("gpu", "3"),
                    ("Hostname", "node-7"),
                    ("pod", "Train-A"),
                    ("shard", "HASH"),
                ]),
            ),
            (
                "labelmap copies matching names",
                vec![RelabelConfig {
                    regex: Some("(Host)name".into()),
                    replacement: Some("${1}_name".into()),
                    ..cfg(Action::LabelMap)
                }],
                Some(vec![
                    ("__name__", "DCGM_FI_DEV_GPU_UTIL"),
                    ("gpu", "3"),
                    ("Hostname", "node-7"),
                    ("pod", "Train-A"),
                    ("Host_name", "node-7"),
                ]),
            ),
            (
                "labeldrop",
                vec![RelabelConfig { regex: Some("pod|gpu".into()), ..cfg(Action::LabelDrop) }],
                Some(vec![("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("Hostname", "node-7")]),
            ),
            (
                "labelkeep",
                vec![RelabelConfig { regex: Some("__name__|gpu".into()), ..cfg(Action::LabelKeep) }],
                Some(vec![("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "3")]),
            ),
            (
                "lowercase",
                vec![RelabelConfig {
                    source_labels: vec!["pod".into()],
                    target_label: Some("pod_lc".into()),
                    ..cfg(Action::Lowercase)
                }],
                Some(vec![
                    ("__name__", "DCGM_FI_DEV_GPU_UTIL"),
                    ("gpu", "3"),
                    ("Hostname", "node-7"),
                    ("pod", "Train-A"),
                    ("pod_lc", "train-a"),
                ]),
            ),
            (
                "uppercase",
                vec![RelabelConfig {
                    source_labels: vec!["pod".into()],
                    target_label: Some("pod".into()),
                    ..cfg(Action::Uppercase)
                }],
                Some(vec![
                    ("__name__", "DCGM_FI_DEV_GPU_UTIL"),
                    ("gpu", "3"),
                    ("Hostname", "node-7"),
                    ("pod", "TRAIN-A"),
                ]),
            ),
        ];
        // hashmod expectation computed independently: md5, low 8 bytes big-endian, mod 8
        let d = md5::compute(b"node-7").0;
        let expected_shard =
            (u64::from_be_bytes([d[8], d[9], d[10], d[11], d[12], d[13], d[14], d[15]]) % 8).to_string();
        for (name, cfgs, want) in cases {
            let rules: Vec<_> = cfgs.iter().map(|c| rule(c.clone())).collect();
            let got = process(&rules, ls(&base).to_builder());
            let want = want.map(|w| {
                let w: Vec<(&str, String)> = w
                    .into_iter()
                    .map(|(k, v)| (k, if v == "HASH" { expected_shard.clone() } else { v.to_string() }))
                    .collect();
                Labels::from_pairs(w)
            });
            assert_eq!(got, want, "case: {name}");
        }
    }

    #[test]
    fn invalid_rules_are_rejected() {
        assert!(RelabelRule::compile(&cfg(Action::HashMod)).is_err(), "hashmod without target/modulus");
        assert!(
            RelabelRule::compile(&RelabelConfig { target_label: Some("x".into()), ..cfg(Action::HashMod) }).is_err()
        );
        assert!(RelabelRule::compile(&RelabelConfig { regex: Some("(".into()), ..cfg(Action::Keep) }).is_err());
        assert!(
            RelabelRule::compile(&RelabelConfig { source_labels: vec!["a".into()], ..cfg(Action::LabelDrop) }).is_err()
        );
        assert!(RelabelRule::compile(&RelabelConfig { target_label: Some("1bad".into()), ..cfg(Action::Lowercase) })
            .is_err());
        assert!(RelabelRule::compile(&cfg(Action::Replace)).is_err(), "replace needs a target");
    }

    /// Edge review (issue 20, item 13): `labeldrop` with its defaults written out is what
    /// Prometheus accepts; `labelmap` creates only valid label names.
    #[test]
    fn labeldrop_takes_explicit_defaults_and_labelmap_checks_its_names() {
        let explicit = RelabelConfig {
            regex: Some("pod".into()),
            separator: Some(";".into()),
            replacement: Some("$1".into()),
            ..cfg(Action::LabelDrop)
        };
        assert!(RelabelRule::compile(&explicit).is_ok());
        let other = RelabelConfig { separator: Some(",".into()), ..explicit };
        assert!(RelabelRule::compile(&other).is_err());
        let r = rule(RelabelConfig {
            regex: Some("__meta_(.*)".into()),
            replacement: Some("1$1".into()),
            ..cfg(Action::LabelMap)
        });
        let mut lb = ls(&[("__meta_zone", "z1"), ("a", "b")]).to_builder();
        assert!(r.apply(&mut lb));
        assert_eq!(lb.get("1zone"), None, "an invalid label name was created");
    }

    #[test]
    fn ascii_digit_class_like_go() {
        let r =
            rule(RelabelConfig { source_labels: vec!["gpu".into()], regex: Some("\\d".into()), ..cfg(Action::Keep) });
        assert!(!r.apply(&mut ls(&[("gpu", "٣")]).to_builder()));
        assert!(r.apply(&mut ls(&[("gpu", "3")]).to_builder()));
    }
}
