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

/// What a peer sent that is not Prometheus' shape, counted per store and kind, so a
/// hostile answer of millions of bad elements costs one warning, not millions.
#[derive(Default)]
struct Problems(BTreeMap<(String, &'static str), usize>);

impl Problems {
    fn add(&mut self, store: &str, what: &'static str) {
        *self.0.entry((store.to_string(), what)).or_default() += 1;
    }

    fn warnings(self) -> Vec<String> {
        self.0.into_iter().map(|((store, what), n)| format!("store {store}: {n} {what}, ignored")).collect()
    }
}

/// Removes the replica labels from a `labels` object; its canonical text, a merge key.
/// `None` when there is no `labels` object.
fn strip_replicas(v: &mut Value, replicas: &[String]) -> Option<String> {
    let labels = v.get_mut("labels")?.as_object_mut()?;
    for r in replicas {
        labels.remove(r);
    }
    Some(Value::Object(labels.clone()).to_string())
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

/// An alert as Prometheus shapes it: an object with `labels`, and `state` and `activeAt`
/// as text. Its replica labels removed.
fn clean_alert(mut a: Value, replicas: &[String]) -> Option<Value> {
    let shaped = a.is_object()
        && a.get("state").is_some_and(Value::is_string)
        && a.get("activeAt").is_some_and(Value::is_string);
    if !shaped {
        return None;
    }
    strip_replicas(&mut a, replicas)?;
    Some(a)
}

/// A rule with its own and its alerts' replica labels removed (alerts not in Prometheus'
/// shape dropped and counted); its merge key. `None` when it is not a rule.
fn clean_rule(mut rule: Value, replicas: &[String], store: &str, problems: &mut Problems) -> Option<(String, Value)> {
    let labels = strip_replicas(&mut rule, replicas)?;
    if let Some(slot) = rule.get_mut("alerts") {
        let list = match slot.take() {
            Value::Array(list) => list,
            _ => {
                problems.add(store, "rules whose alerts are not a list");
                Vec::new()
            }
        };
        let mut alerts = Vec::with_capacity(list.len());
        for a in list {
            match clean_alert(a, replicas) {
                Some(a) => alerts.push(a),
                None => problems.add(store, "alerts not in Prometheus' shape"),
            }
        }
        dedup_alerts(&mut alerts);
        *slot = Value::Array(alerts);
    }
    let key = format!("{}\u{0}{}\u{0}{}\u{0}{labels}", text(&rule, "type"), text(&rule, "name"), text(&rule, "query"));
    Some((key, rule))
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

/// Two copies of one rule (HA replicas, or regionals without external labels): the
/// fields of the one that says the most, and the alerts of both, so no instance one copy
/// holds is hidden by the other.
fn combine(kept: &mut Value, other: Value) {
    let better =
        state_rank(&other) > state_rank(kept) || (state_rank(&other) == state_rank(kept) && newer(&other, kept));
    let (mut winner, loser) = if better { (other, std::mem::take(kept)) } else { (std::mem::take(kept), other) };
    if let (Some(Value::Array(a)), Some(Value::Array(b))) = (winner.get_mut("alerts"), loser.get("alerts")) {
        a.extend(b.iter().cloned());
        dedup_alerts(a);
        // The rule's state is its alerts' highest.
        let state = a.iter().map(state_rank).max().unwrap_or(0);
        if state > state_rank(&winner) {
            winner["state"] = Value::String(if state == 2 { "firing" } else { "pending" }.into());
        }
    }
    *kept = winner;
}

/// The list under `key` in an answer's `data`; `None`, counted as `missing`, when the
/// answer has none.
fn list_of(data: Value, key: &str, store: &str, problems: &mut Problems, missing: &'static str) -> Option<Vec<Value>> {
    if let Value::Object(mut m) = data {
        if let Some(Value::Array(list)) = m.remove(key) {
            return Some(list);
        }
    }
    problems.add(store, missing);
    None
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
    let mut problems = Problems::default();
    let mut groups: BTreeMap<(String, String), MergedGroup> = BTreeMap::new();
    for (store, data) in answers {
        let Some(list) = list_of(data, "groups", &store, &mut problems, "rules answers without a groups list") else {
            continue;
        };
        for g in list {
            let Value::Object(mut head) = g else {
                problems.add(&store, "rule groups that are not an object");
                continue;
            };
            let (Some(name), Some(file)) =
                (head.get("name").and_then(Value::as_str), head.get("file").and_then(Value::as_str))
            else {
                problems.add(&store, "rule groups without a name or file");
                continue;
            };
            let key = (file.to_string(), name.to_string());
            let rules = match head.remove("rules") {
                Some(Value::Array(r)) => r,
                _ => Vec::new(),
            };
            let merged = match groups.entry(key) {
                std::collections::btree_map::Entry::Occupied(e) => {
                    let merged = e.into_mut();
                    let last = |m: &Map<String, Value>| {
                        m.get("lastEvaluation").and_then(Value::as_str).unwrap_or("").to_string()
                    };
                    if last(&head) > last(&merged.head) {
                        merged.head = head;
                    }
                    merged
                }
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(MergedGroup { head, rules: Vec::new(), index: HashMap::new() })
                }
            };
            for rule in rules {
                let Some((key, rule)) = clean_rule(rule, replicas, &store, &mut problems) else {
                    problems.add(&store, "rules not in Prometheus' shape");
                    continue;
                };
                match merged.index.get(&key) {
                    Some(&i) => combine(&mut merged.rules[i], rule),
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
    (serde_json::json!({ "groups": groups }), problems.warnings())
}

/// The `data` of the global's `/api/v1/alerts`, and warnings for what was not understood.
pub fn merge_alerts(answers: Vec<Answer>, replicas: &[String]) -> (Value, Vec<String>) {
    let mut problems = Problems::default();
    let mut all = Vec::new();
    for (store, data) in answers {
        let Some(list) = list_of(data, "alerts", &store, &mut problems, "alerts answers without an alerts list") else {
            continue;
        };
        for a in list {
            match clean_alert(a, replicas) {
                Some(a) => all.push(a),
                None => problems.add(&store, "alerts not in Prometheus' shape"),
            }
        }
    }
    dedup_alerts(&mut all);
    (serde_json::json!({ "alerts": all }), problems.warnings())
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
        let bad = json!({"groups": [7, {"name": "x"}, {"name": "g", "file": "f", "rules": [3, 4, {"labels": {}, "alerts": [1, {"labels": 5}]}]}]});
        let (data, warnings) = merge_rules(vec![("evil:1".into(), bad), ("evil:2".into(), json!("no"))], &[]);
        assert_eq!(warnings.len(), 5, "one per store and kind: {warnings:?}");
        assert!(warnings.iter().all(|w| w.contains("store evil:")));
        assert!(warnings.iter().any(|w| w.contains(": 2 rules not in")), "{warnings:?}");
        assert_eq!(data["groups"][0]["rules"][0]["alerts"], json!([]), "{data}");
        let (data, warnings) = merge_alerts(vec![("evil".into(), json!({"alerts": [1, {"labels": 2}]}))], &[]);
        assert_eq!((data["alerts"].as_array().unwrap().len(), warnings.len()), (0, 1), "{warnings:?}");
    }

    #[test]
    fn diverging_replicas_keep_every_alert_in_the_rule_view() {
        let a = group(
            "gpu.yml",
            json!([rule(
                json!({"replica": "a"}),
                "firing",
                json!([alert(json!({"gpu": "0", "replica": "a"}), "firing", "2026-12-01T00:00:00.000Z")]),
                "2026-12-01T00:02:00.000Z"
            )]),
            "2026-12-01T00:02:00.000Z",
        );
        let b = group(
            "gpu.yml",
            json!([rule(
                json!({"replica": "b"}),
                "firing",
                json!([
                    alert(json!({"gpu": "0", "replica": "b"}), "firing", "2026-12-01T00:00:00.000Z"),
                    alert(json!({"gpu": "1", "replica": "b"}), "pending", "2026-12-01T00:01:00.000Z")
                ]),
                "2026-12-01T00:01:00.000Z"
            )]),
            "2026-12-01T00:01:00.000Z",
        );
        let (data, _) = merge_rules(vec![("a".into(), a), ("b".into(), b)], &["replica".to_string()]);
        let alerts = data["groups"][0]["rules"][0]["alerts"].as_array().unwrap();
        let gpus: Vec<&str> = alerts.iter().map(|a| a["labels"]["gpu"].as_str().unwrap()).collect();
        assert_eq!(gpus, ["0", "1"], "{data}");
    }
}
