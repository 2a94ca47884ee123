//! `/api/v1/rules` and `/api/v1/alerts` in Prometheus' JSON shape (what Grafana's alert
//! list and rule views read), with its filters: `type`, `rule_name[]`, `rule_group[]`,
//! `file[]`, `match[]` (on the rules' labels) and `exclude_alerts`.

use crate::alert::{Alert, AlertState};
use crate::file::RuleKind;
use crate::group::Group;
use crate::manager::RuleManager;
use crate::notifier::rfc3339;
use crate::with_external;
use serde_json::{json, Value};
use strata_model::matcher::matches_all;
use strata_model::{Labels, Matcher};

/// The filters of `/api/v1/rules`.
#[derive(Debug, Default, Clone)]
pub struct RulesFilter {
    /// `alert` or `record`; empty for both.
    pub kind: Option<RuleKind>,
    pub rule_names: Vec<String>,
    pub rule_groups: Vec<String>,
    pub files: Vec<String>,
    /// Alternatives (`match[]` repeated): a rule is kept when its labels match any.
    pub matchers: Vec<Vec<Matcher>>,
    pub exclude_alerts: bool,
}

impl RulesFilter {
    /// From the query's pairs; `Err` is a 400's message.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<RulesFilter, String> {
        let mut f = RulesFilter::default();
        for (k, v) in pairs {
            match k.as_str() {
                "type" => {
                    f.kind = match v.as_str() {
                        "alert" => Some(RuleKind::Alerting),
                        "record" => Some(RuleKind::Recording),
                        "" => None,
                        _ => return Err(format!("invalid type {v:?}: expected alert or record")),
                    }
                }
                "rule_name[]" => f.rule_names.push(v.clone()),
                "rule_group[]" => f.rule_groups.push(v.clone()),
                "file[]" => f.files.push(v.clone()),
                "match[]" => f.matchers.push(
                    strata_promql::selector::parse_selector(v).map_err(|e| format!("invalid match[] {v:?}: {e}"))?,
                ),
                "exclude_alerts" => {
                    f.exclude_alerts = match v.as_str() {
                        "true" | "1" => true,
                        "false" | "0" | "" => false,
                        _ => return Err(format!("invalid exclude_alerts {v:?}")),
                    }
                }
                _ => {}
            }
        }
        Ok(f)
    }
}

fn labels_json(l: &Labels) -> Value {
    Value::Object(l.iter().map(|x| (x.name.to_string(), Value::String(x.value.to_string()))).collect())
}

fn pairs_json(p: &[(String, String)]) -> Value {
    Value::Object(p.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect())
}

/// Go's `strconv.FormatFloat(v, 'e', -1, 64)`, how Prometheus prints an alert's value.
fn value_e(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    let s = format!("{v:e}");
    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
}

/// An alert as Prometheus shows it, its labels with `external`'s added (empty for the
/// tier's own HTTP API, as Prometheus' own; a regional's external labels for a global).
pub fn alert_json(a: &Alert, external: &Labels) -> Value {
    let mut v = json!({
        "labels": labels_json(&with_external(&a.labels, external)),
        "annotations": a.annotations,
        "state": a.state.as_str(),
        "activeAt": rfc3339(a.active_at),
        "value": value_e(a.value),
    });
    if let Some(k) = a.keep_firing_since {
        v["keepFiringSince"] = Value::String(rfc3339(k));
    }
    v
}

pub(crate) fn group_json(g: &Group, f: &RulesFilter, external: &Labels) -> Option<Value> {
    if !f.rule_groups.is_empty() && !f.rule_groups.contains(&g.spec.name) {
        return None;
    }
    if !f.files.is_empty() && !f.files.contains(&g.spec.file) {
        return None;
    }
    let mut rules = Vec::new();
    for r in &g.rules {
        if f.kind.is_some_and(|k| k != r.spec.kind) {
            continue;
        }
        if !f.rule_names.is_empty() && !f.rule_names.contains(&r.spec.name) {
            continue;
        }
        let labels = with_external(&crate::file::labels_of(&r.spec.labels), external);
        if !f.matchers.is_empty() && !f.matchers.iter().any(|m| matches_all(m, &labels)) {
            continue;
        }
        let last = r.last_evaluation.map(rfc3339).unwrap_or_else(|| "0001-01-01T00:00:00Z".into());
        let mut v = json!({
            "name": r.spec.name,
            "query": r.spec.expr_text,
            "labels": labels_json(&labels),
            "health": r.health.as_str(),
            "lastError": r.last_error.clone().unwrap_or_default(),
            "evaluationTime": r.evaluation_time.as_secs_f64(),
            "lastEvaluation": last,
        });
        match r.spec.kind {
            RuleKind::Recording => v["type"] = json!("recording"),
            RuleKind::Alerting => {
                let alerts: Vec<&Alert> = r.alerts.as_ref().map(|a| a.active_alerts()).unwrap_or_default();
                let state = if alerts.iter().any(|a| a.state == AlertState::Firing) {
                    "firing"
                } else if alerts.iter().any(|a| a.state == AlertState::Pending) {
                    "pending"
                } else {
                    "inactive"
                };
                v["type"] = json!("alerting");
                v["state"] = json!(state);
                v["duration"] = json!(r.spec.for_ms as f64 / 1000.0);
                v["keepFiringFor"] = json!(r.spec.keep_firing_for_ms as f64 / 1000.0);
                v["annotations"] = pairs_json(&r.spec.annotations);
                if !f.exclude_alerts {
                    v["alerts"] = Value::Array(alerts.into_iter().map(|a| alert_json(a, external)).collect());
                }
            }
        }
        rules.push(v);
    }
    if rules.is_empty() && (f.kind.is_some() || !f.rule_names.is_empty() || !f.matchers.is_empty()) {
        return None;
    }
    Some(json!({
        "name": g.spec.name,
        "file": g.spec.file,
        "interval": g.interval_ms as f64 / 1000.0,
        "limit": g.spec.limit,
        "rules": rules,
        "evaluationTime": g.evaluation_time.as_secs_f64(),
        "lastEvaluation": g.last_evaluation.map(rfc3339).unwrap_or_else(|| "0001-01-01T00:00:00Z".into()),
    }))
}

/// The `data` of `/api/v1/rules`; rules' and alerts' labels with `external`'s added (see
/// [`alert_json`]), `match[]` applied to them.
pub async fn rules(m: &RuleManager, f: &RulesFilter, external: &Labels) -> Value {
    let mut groups = Vec::new();
    for g in m.groups() {
        let g = g.lock().await;
        if let Some(v) = group_json(&g, f, external) {
            groups.push(v);
        }
    }
    json!({ "groups": groups })
}

/// The `data` of `/api/v1/alerts`: every pending or firing alert.
pub async fn alerts(m: &RuleManager, external: &Labels) -> Value {
    let mut out = Vec::new();
    for g in m.groups() {
        let g = g.lock().await;
        for r in &g.rules {
            if let Some(a) = &r.alerts {
                out.extend(a.active_alerts().into_iter().map(|a| alert_json(a, external)));
            }
        }
    }
    json!({ "alerts": out })
}
