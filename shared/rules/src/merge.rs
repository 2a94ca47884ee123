//! The global's `/api/v1/rules` and `/api/v1/alerts`: the answers of every regional merged
//! into one, as Thanos' querier merges its rulers'.
//!
//! Each regional labels its rules and alerts with its external labels, so two regions
//! running the same rule file show as two rules (and their alerts apart). HA replicas of
//! one regional differ only in their replica labels: with those removed their groups,
//! rules and alerts coincide, and one of each is kept, the one that tells the most (a
//! firing alert over a pending one over none, then the latest evaluation; of two copies
//! of an alert, the one active the longest). An answer is a peer's JSON, so it is read
//! defensively: what is not Prometheus' shape is skipped and named in a warning, never
//! passed on.

use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};

/// One regional's answer: its name (the store address) and the `data` it returned.
pub type Answer = (String, Value);

/// Removes the replica labels from a `labels` object; its canonical text, a merge key.
fn strip_replicas(v: &mut Value, replicas: &[String]) -> String {
    if let Some(labels) = v.get_mut("labels").and_then(Value::as_object_mut) {
        for r in replicas {
            labels.remove(r);
        }
        return Value::Object(labels.clone()).to_string();
    }
    String::new()
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// Firing over pending over inactive.
fn state_rank(v: &Value) -> u8 {
    match text(v, "state") {
        "firing" => 2,
        "pending" => 1,
        _ => 0,
    }
}

/// Prometheus' RFC 3339 times in UTC with a four-digit year compare as text.
fn newer(a: &Value, b: &Value) -> bool {
    text(a, "lastEvaluation") > text(b, "lastEvaluation")
}

/// A rule with its alerts' replica labels removed; its merge key.
fn clean_rule(mut rule: Value, replicas: &[String]) -> (String, Value) {
    let labels = strip_replicas(&mut rule, replicas);
    if let Some(alerts) = rule.get_mut("alerts").and_then(Value::as_array_mut) {
        for a in alerts.iter_mut() {
            strip_replicas(a, replicas);
        }
        dedup_alerts(alerts);
    }
    let key = format!("{}\u{0}{}\u{0}{}\u{0}{labels}", text(&rule, "type"), text(&rule, "name"), text(&rule, "query"));
    (key, rule)
}

/// Keeps one alert per label set: firing over pending, then the earliest `activeAt`.
fn dedup_alerts(alerts: &mut Vec<Value>) {
    let mut index: HashMap<String, usize> = HashMap::with_capacity(alerts.len());
    let mut kept: Vec<Value> = Vec::with_capacity(alerts.len());
    for a in alerts.drain(..) {
        let key = a.get("labels").map(Value::to_string).unwrap_or_default();
        match index.get(&key) {
            Some(&i) => {
                let b = &mut kept[i];
                let better = state_rank(&a) > state_rank(b)
                    || (state_rank(&a) == state_rank(b) && text(&a, "activeAt") < text(b, "activeAt"));
                if better {
                    *b = a;
                }
            }
            None => {
                index.insert(key, kept.len());
                kept.push(a);
            }
        }
    }
    *alerts = kept;
}

struct MergedGroup {
    /// The group's fields from its most recently evaluated copy.
    head: Map<String, Value>,
    rules: Vec<Value>,
    /// Rule key → position in `rules`.
    index: HashMap<String, usize>,
}

/// The `data` of the global's `/api/v1/rules`, and warnings for what was not understood.
pub fn merge_rules(answers: Vec<Answer>, replicas: &[String]) -> (Value, Vec<String>) {
    let mut warnings = Vec::new();
    let mut groups: BTreeMap<(String, String), MergedGroup> = BTreeMap::new();
    for (store, data) in answers {
        let Some(list) = data.get("groups").and_then(Value::as_array) else {
            warnings.push(format!("store {store}: rules answer without a groups list, ignored"));
            continue;
        };
        for g in list {
            let Some(obj) = g.as_object() else {
                warnings.push(format!("store {store}: a rule group that is not an object, ignored"));
                continue;
            };
            let (Some(name), Some(file)) =
                (obj.get("name").and_then(Value::as_str), obj.get("file").and_then(Value::as_str))
            else {
                warnings.push(format!("store {store}: a rule group without a name or file, ignored"));
                continue;
            };
            let mut head = obj.clone();
            let rules = match head.remove("rules") {
                Some(Value::Array(r)) => r,
                _ => Vec::new(),
            };
            let merged = groups.entry((file.to_string(), name.to_string())).or_insert_with(|| MergedGroup {
                head: head.clone(),
                rules: Vec::new(),
                index: HashMap::new(),
            });
            if text(g, "lastEvaluation") > merged.head.get("lastEvaluation").and_then(Value::as_str).unwrap_or("") {
                merged.head = head;
            }
            for rule in rules {
                if !rule.is_object() {
                    warnings.push(format!("store {store}: group {name:?} has a rule that is not an object, ignored"));
                    continue;
                }
                let (key, rule) = clean_rule(rule, replicas);
                match merged.index.get(&key) {
                    Some(&i) => {
                        let kept = &mut merged.rules[i];
                        let better = state_rank(&rule) > state_rank(kept)
                            || (state_rank(&rule) == state_rank(kept) && newer(&rule, kept));
                        if better {
                            *kept = rule;
                        }
                    }
                    None => {
                        merged.index.insert(key, merged.rules.len());
                        merged.rules.push(rule);
                    }
                }
            }
        }
    }
    let groups: Vec<Value> = groups
        .into_values()
        .map(|g| {
            let mut head = g.head;
            head.insert("rules".into(), Value::Array(g.rules));
            Value::Object(head)
        })
        .collect();
    (serde_json::json!({ "groups": groups }), warnings)
}

/// The `data` of the global's `/api/v1/alerts`, and warnings for what was not understood.
pub fn merge_alerts(answers: Vec<Answer>, replicas: &[String]) -> (Value, Vec<String>) {
    let mut warnings = Vec::new();
    let mut all = Vec::new();
    for (store, data) in answers {
        let Some(list) = data.get("alerts").and_then(Value::as_array) else {
            warnings.push(format!("store {store}: alerts answer without an alerts list, ignored"));
            continue;
        };
        for a in list {
            if !a.get("labels").is_some_and(Value::is_object) {
                warnings.push(format!("store {store}: an alert without labels, ignored"));
                continue;
            }
            let mut a = a.clone();
            strip_replicas(&mut a, replicas);
            all.push(a);
        }
    }
    dedup_alerts(&mut all);
    (serde_json::json!({ "alerts": all }), warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn alert(labels: Value, state: &str, active: &str) -> Value {
        json!({"labels": labels, "annotations": {}, "state": state, "activeAt": active, "value": "1e+00"})
    }

    fn group(file: &str, rules: Value, last: &str) -> Value {
        json!({"groups": [{"name": "gpu", "file": file, "interval": 15.0, "limit": 0, "rules": rules,
            "evaluationTime": 0.001, "lastEvaluation": last}]})
    }

    fn rule(labels: Value, state: &str, alerts: Value, last: &str) -> Value {
        json!({"type": "alerting", "name": "GpuHot", "query": "x > 1", "labels": labels, "state": state,
            "alerts": alerts, "health": "ok", "lastEvaluation": last})
    }

    #[test]
    fn replicas_of_one_region_merge_and_regions_stay_apart() {
        let eu_a = group(
            "gpu.yml",
            json!([rule(
                json!({"region": "eu", "replica": "a"}),
                "pending",
                json!([alert(
                    json!({"gpu": "0", "region": "eu", "replica": "a"}),
                    "pending",
                    "2026-12-01T00:01:00.000Z"
                )]),
                "2026-12-01T00:02:00.000Z"
            )]),
            "2026-12-01T00:02:00.000Z",
        );
        let eu_b = group(
            "gpu.yml",
            json!([rule(
                json!({"region": "eu", "replica": "b"}),
                "firing",
                json!([alert(
                    json!({"gpu": "0", "region": "eu", "replica": "b"}),
                    "firing",
                    "2026-12-01T00:00:00.000Z"
                )]),
                "2026-12-01T00:01:30.000Z"
            )]),
            "2026-12-01T00:01:30.000Z",
        );
        let us = group(
            "gpu.yml",
            json!([rule(json!({"region": "us"}), "inactive", json!([]), "2026-12-01T00:02:00.000Z")]),
            "2026-12-01T00:02:00.000Z",
        );
        let replicas = vec!["replica".to_string()];
        let (data, warnings) = merge_rules(vec![("a".into(), eu_a), ("b".into(), eu_b), ("c".into(), us)], &replicas);
        assert!(warnings.is_empty(), "{warnings:?}");
        let groups = data["groups"].as_array().unwrap();
        assert_eq!(groups.len(), 1, "one group per file and name: {data}");
        let rules = groups[0]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 2, "one rule per region: {data}");
        let eu = rules.iter().find(|r| r["labels"]["region"] == "eu").unwrap();
        assert_eq!(eu["state"], "firing", "the copy that fires wins");
        assert_eq!(eu["labels"], json!({"region": "eu"}), "replica label removed");
        assert_eq!(eu["alerts"][0]["labels"], json!({"gpu": "0", "region": "eu"}));
        assert_eq!(groups[0]["lastEvaluation"], "2026-12-01T00:02:00.000Z", "the newest evaluation");
    }

    #[test]
    fn alerts_merge_by_labels_without_replicas_keeping_the_oldest_firing() {
        let a = json!({"alerts": [
            alert(json!({"gpu": "0", "replica": "a"}), "firing", "2026-12-01T00:05:00.000Z"),
            alert(json!({"gpu": "1", "replica": "a"}), "pending", "2026-12-01T00:05:00.000Z"),
        ]});
        let b = json!({"alerts": [
            alert(json!({"gpu": "0", "replica": "b"}), "firing", "2026-12-01T00:04:00.000Z"),
            alert(json!({"gpu": "1", "replica": "b"}), "firing", "2026-12-01T00:06:00.000Z"),
        ]});
        let (data, warnings) = merge_alerts(vec![("a".into(), a), ("b".into(), b)], &["replica".to_string()]);
        assert!(warnings.is_empty());
        let alerts = data["alerts"].as_array().unwrap();
        assert_eq!(alerts.len(), 2, "{data}");
        assert_eq!(alerts[0]["activeAt"], "2026-12-01T00:04:00.000Z");
        assert_eq!(alerts[1]["state"], "firing");
    }

    #[test]
    fn a_malformed_answer_is_named_in_a_warning_not_passed_on() {
        let bad = json!({"groups": [7, {"name": "x"}, {"name": "g", "file": "f", "rules": [3]}]});
        let (data, warnings) = merge_rules(vec![("evil:1".into(), bad), ("evil:2".into(), json!("no"))], &[]);
        assert_eq!(warnings.len(), 4, "{warnings:?}");
        assert!(warnings.iter().all(|w| w.contains("store evil:")));
        assert_eq!(data["groups"][0]["rules"], json!([]));
        let (data, warnings) = merge_alerts(vec![("evil".into(), json!({"alerts": [1, {"labels": 2}]}))], &[]);
        assert_eq!((data["alerts"].as_array().unwrap().len(), warnings.len()), (0, 2));
    }
}
