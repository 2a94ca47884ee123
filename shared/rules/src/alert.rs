//! An alerting rule's alerts through their states, as Prometheus' rules manager moves them:
//! a new result is pending, firing once it has been active for `for`, kept firing for
//! `keep_firing_for` after its expression stops returning it, then resolved and kept 15
//! minutes so that Alertmanager hears it resolved. Each evaluation yields the `ALERTS`
//! and `ALERTS_FOR_STATE` samples of what is active.

use crate::file::RuleSpec;
use crate::template::{alert_data, Env};
use std::collections::{BTreeMap, HashMap};

/// An alert's annotations, by name.
pub type Annotations = BTreeMap<String, String>;
use strata_model::{Labels, Sample};

/// How long a resolved alert is kept (and re-sent as resolved).
pub const RESOLVED_RETENTION_MS: i64 = 15 * 60 * 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertState {
    Inactive,
    Pending,
    Firing,
}

impl AlertState {
    pub fn as_str(self) -> &'static str {
        match self {
            AlertState::Inactive => "inactive",
            AlertState::Pending => "pending",
            AlertState::Firing => "firing",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Alert {
    pub labels: Labels,
    /// Expanded annotations by name. Not a label set: an annotation that expands to
    /// nothing is kept, empty, as Prometheus keeps it.
    pub annotations: Annotations,
    pub value: f64,
    pub state: AlertState,
    pub active_at: i64,
    pub fired_at: Option<i64>,
    pub resolved_at: Option<i64>,
    pub last_sent_at: Option<i64>,
    pub valid_until: i64,
    pub keep_firing_since: Option<i64>,
}

impl Alert {
    /// Prometheus' `needsSending`: firing or resolved, and not sent within `resend_delay`
    /// (a resolution since the last send goes at once).
    pub fn needs_sending(&self, ts: i64, resend_delay_ms: i64) -> bool {
        if self.state == AlertState::Pending {
            return false;
        }
        match (self.resolved_at, self.last_sent_at) {
            (Some(r), Some(s)) if r > s => true,
            (_, None) => true,
            (_, Some(s)) => s.saturating_add(resend_delay_ms) < ts,
        }
    }
}

/// The alerts of one alerting rule, by label set.
#[derive(Debug, Default)]
pub struct AlertingState {
    pub active: HashMap<Labels, Alert>,
    /// `ALERTS` and `ALERTS_FOR_STATE` are written only once `for` state was restored
    /// (or there was nothing to restore).
    pub restored: bool,
}

/// Expands a template, as Prometheus does: an error becomes the text of the result.
fn expand(t: &crate::template::Template, env: &Env, data: &crate::template::Value, errors: &mut Vec<String>) -> String {
    match t.render(env, data) {
        Ok(s) => s,
        Err(e) => {
            errors.push(e.to_string());
            format!("<error expanding template: {e}>")
        }
    }
}

/// The label set of an `ALERTS`-like series: the rule's labels under the alert's, then the
/// name and alert name.
fn series_labels(rule: &RuleSpec, alert: &Alert, metric: &str, state: Option<AlertState>) -> Labels {
    let mut b = crate::file::labels_of(&rule.labels).to_builder();
    for l in alert.labels.iter() {
        b.set_shared(l.name.clone(), l.value.clone());
    }
    b.set("__name__", metric);
    b.set("alertname", &rule.name);
    if let Some(s) = state {
        b.set("alertstate", s.as_str());
    }
    b.build()
}

pub struct Evaluated {
    /// `ALERTS` and `ALERTS_FOR_STATE` at `ts`.
    pub samples: Vec<(Labels, Sample)>,
    /// Template errors (the alert still goes out, with the error as its text).
    pub template_errors: Vec<String>,
}

impl AlertingState {
    /// Applies one evaluation's result (`(labels, value)` of the expression). `ts` is the
    /// evaluation's time, which alert states keep; `sample_ts` is `ts − query_offset`, where
    /// `ALERTS` and `ALERTS_FOR_STATE` are written (Prometheus 3 keeps the two apart).
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        rule: &RuleSpec,
        result: Vec<(Labels, f64)>,
        ts: i64,
        sample_ts: i64,
        external: &Labels,
        env: &Env,
        limit: usize,
    ) -> Result<Evaluated, String> {
        let mut template_errors = Vec::new();
        let mut fresh: HashMap<Labels, Alert> = HashMap::with_capacity(result.len());
        for (metric, value) in result {
            let data = alert_data(&metric, external, env.external_url, value);
            let mut b = metric.to_builder();
            b.del("__name__");
            for (name, t) in &rule.label_templates {
                b.set(name, &expand(t, env, &data, &mut template_errors));
            }
            b.set("alertname", &rule.name);
            let annotations: Annotations = rule
                .annotation_templates
                .iter()
                .map(|(name, t)| (name.clone(), expand(t, env, &data, &mut template_errors)))
                .collect();
            let labels = b.build();
            if fresh.contains_key(&labels) {
                return Err("vector contains metrics with the same labelset after applying alert labels".into());
            }
            fresh.insert(
                labels.clone(),
                Alert {
                    labels,
                    annotations,
                    value,
                    state: AlertState::Pending,
                    active_at: ts,
                    fired_at: None,
                    resolved_at: None,
                    last_sent_at: None,
                    valid_until: 0,
                    keep_firing_since: None,
                },
            );
        }
        let returned: std::collections::HashSet<Labels> = fresh.keys().cloned().collect();
        for (k, a) in fresh {
            match self.active.get_mut(&k) {
                Some(old) if old.state != AlertState::Inactive => {
                    old.value = a.value;
                    old.annotations = a.annotations;
                }
                _ => {
                    self.active.insert(k, a);
                }
            }
        }
        let mut samples = Vec::new();
        let mut active_or_pending = 0usize;
        let mut gone = Vec::new();
        for (k, a) in self.active.iter_mut() {
            if !returned.contains(k) {
                let mut keep_firing = false;
                if a.state == AlertState::Firing && rule.keep_firing_for_ms > 0 {
                    let since = *a.keep_firing_since.get_or_insert(ts);
                    keep_firing = ts - since < rule.keep_firing_for_ms;
                }
                if a.state == AlertState::Pending
                    || a.resolved_at.is_some_and(|r| ts.saturating_sub(r) > RESOLVED_RETENTION_MS)
                {
                    gone.push(k.clone());
                }
                if a.state != AlertState::Inactive && !keep_firing {
                    a.state = AlertState::Inactive;
                    a.resolved_at = Some(ts);
                }
                if !keep_firing {
                    continue;
                }
            } else {
                a.keep_firing_since = None;
            }
            active_or_pending += 1;
            if a.state == AlertState::Pending && ts - a.active_at >= rule.for_ms {
                a.state = AlertState::Firing;
                a.fired_at = Some(ts);
            }
            if self.restored {
                samples.push((series_labels(rule, a, "ALERTS", Some(a.state)), Sample::new(sample_ts, 1.0)));
                let since = a.active_at.div_euclid(1000) as f64;
                samples.push((series_labels(rule, a, "ALERTS_FOR_STATE", None), Sample::new(sample_ts, since)));
            }
        }
        for k in gone {
            self.active.remove(&k);
        }
        if limit > 0 && active_or_pending > limit {
            self.active.clear();
            return Err(format!("exceeded limit of {limit} with {active_or_pending} alerts"));
        }
        samples.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Evaluated { samples, template_errors })
    }

    /// The alerts not inactive, sorted by labels.
    pub fn active_alerts(&self) -> Vec<&Alert> {
        let mut v: Vec<&Alert> = self.active.values().filter(|a| a.state != AlertState::Inactive).collect();
        v.sort_by(|a, b| a.labels.cmp(&b.labels));
        v
    }
}
