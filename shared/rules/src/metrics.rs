//! The rules engine's metrics under Prometheus' own names (`prometheus_rule_*`,
//! `prometheus_notifications_*`), so dashboards and alerts written for Prometheus' rules
//! work over Strata's.

use crate::group::{Group, GroupOutcome};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabel {
    pub rule_group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AlertmanagerLabel {
    pub alertmanager: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

fn duration_histogram() -> Histogram {
    Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0])
}

#[derive(Clone)]
pub struct RuleMetrics {
    pub evaluations: Family<GroupLabel, Counter>,
    pub failures: Family<GroupLabel, Counter>,
    pub missed: Family<GroupLabel, Counter>,
    pub iterations: Family<GroupLabel, Counter>,
    pub interval: Family<GroupLabel, FloatGauge>,
    pub last_duration: Family<GroupLabel, FloatGauge>,
    pub last_evaluation: Family<GroupLabel, FloatGauge>,
    pub last_samples: Family<GroupLabel, Gauge>,
    pub rules: Family<GroupLabel, Gauge>,
    pub template_errors: Family<GroupLabel, Counter>,
    pub samples_refused: Family<GroupLabel, Counter>,
    pub evaluation_duration: Histogram,
    pub group_duration: Histogram,
    pub config_success: Gauge,
    pub groups: Gauge,
    pub notifications_sent: Family<AlertmanagerLabel, Counter>,
    pub notifications_errors: Family<AlertmanagerLabel, Counter>,
    pub notifications_latency: Family<AlertmanagerLabel, Histogram>,
    pub notifications_dropped: Counter,
    pub queue_length: Gauge,
    pub queue_capacity: Gauge,
    pub alertmanagers: Gauge,
}

impl Default for RuleMetrics {
    fn default() -> Self {
        RuleMetrics {
            evaluations: Family::default(),
            failures: Family::default(),
            missed: Family::default(),
            iterations: Family::default(),
            interval: Family::default(),
            last_duration: Family::default(),
            last_evaluation: Family::default(),
            last_samples: Family::default(),
            rules: Family::default(),
            template_errors: Family::default(),
            samples_refused: Family::default(),
            evaluation_duration: duration_histogram(),
            group_duration: duration_histogram(),
            config_success: Gauge::default(),
            groups: Gauge::default(),
            notifications_sent: Family::default(),
            notifications_errors: Family::default(),
            notifications_latency: Family::new_with_constructor(duration_histogram),
            notifications_dropped: Counter::default(),
            queue_length: Gauge::default(),
            queue_capacity: Gauge::default(),
            alertmanagers: Gauge::default(),
        }
    }
}

/// One group's series.
pub struct GroupMetrics {
    m: RuleMetrics,
    l: GroupLabel,
    pub interval: FloatGauge,
    pub missed: Counter,
}

impl GroupMetrics {
    pub fn record(&self, g: &Group, out: &GroupOutcome, took: Duration, ts: i64) {
        let m = &self.m;
        m.iterations.get_or_create(&self.l).inc();
        m.evaluations.get_or_create(&self.l).inc_by(g.rules.len() as u64);
        m.failures.get_or_create(&self.l).inc_by(out.failures.len() as u64);
        m.template_errors.get_or_create(&self.l).inc_by(out.template_errors.len() as u64);
        m.samples_refused.get_or_create(&self.l).inc_by(out.samples_refused as u64);
        m.last_duration.get_or_create(&self.l).set(took.as_secs_f64());
        m.last_evaluation.get_or_create(&self.l).set(ts as f64 / 1000.0);
        m.last_samples.get_or_create(&self.l).set(out.samples_written as i64);
        m.rules.get_or_create(&self.l).set(g.rules.len() as i64);
        m.group_duration.observe(took.as_secs_f64());
        for r in &g.rules {
            m.evaluation_duration.observe(r.evaluation_time.as_secs_f64());
        }
    }
}

impl RuleMetrics {
    pub fn group(&self, label: &str) -> GroupMetrics {
        let l = GroupLabel { rule_group: label.to_string() };
        GroupMetrics {
            interval: self.interval.get_or_create(&l).clone(),
            missed: self.missed.get_or_create(&l).clone(),
            m: self.clone(),
            l,
        }
    }

    /// Registers under Prometheus' names: give it a registry without a prefix.
    pub fn register(&self, r: &mut Registry) {
        r.register("prometheus_rule_evaluations", "Rule evaluations", self.evaluations.clone());
        r.register("prometheus_rule_evaluation_failures", "Rule evaluations that failed", self.failures.clone());
        r.register(
            "prometheus_rule_group_iterations_missed",
            "Group evaluations missed (too slow)",
            self.missed.clone(),
        );
        r.register("prometheus_rule_group_iterations", "Group evaluations run", self.iterations.clone());
        r.register("prometheus_rule_group_interval_seconds", "The group's interval", self.interval.clone());
        r.register(
            "prometheus_rule_group_last_duration_seconds",
            "The group's last evaluation's duration",
            self.last_duration.clone(),
        );
        r.register(
            "prometheus_rule_group_last_evaluation_timestamp_seconds",
            "The group's last evaluation time",
            self.last_evaluation.clone(),
        );
        r.register(
            "prometheus_rule_group_last_evaluation_samples",
            "Samples the group's last evaluation wrote",
            self.last_samples.clone(),
        );
        r.register("prometheus_rule_group_rules", "Rules in the group", self.rules.clone());
        r.register(
            "prometheus_rule_evaluation_duration_seconds",
            "Rule evaluation durations",
            self.evaluation_duration.clone(),
        );
        r.register("prometheus_rule_group_duration_seconds", "Group evaluation durations", self.group_duration.clone());
        r.register(
            "prometheus_config_last_reload_successful",
            "Whether the last rule reload succeeded",
            self.config_success.clone(),
        );
        r.register("strata_rule_groups", "Rule groups loaded", self.groups.clone());
        r.register(
            "strata_rule_template_errors",
            "Alert templates that failed to expand",
            self.template_errors.clone(),
        );
        r.register(
            "strata_rule_samples_refused",
            "Rule output refused by storage (out of order, duplicate)",
            self.samples_refused.clone(),
        );
        r.register("prometheus_notifications_sent", "Alerts sent, per Alertmanager", self.notifications_sent.clone());
        r.register(
            "prometheus_notifications_errors",
            "Alerts whose sending failed, per Alertmanager",
            self.notifications_errors.clone(),
        );
        r.register(
            "prometheus_notifications_latency_seconds",
            "Sending latency, per Alertmanager",
            self.notifications_latency.clone(),
        );
        r.register(
            "prometheus_notifications_dropped",
            "Alerts dropped: the queue was full, or every retry failed",
            self.notifications_dropped.clone(),
        );
        r.register("prometheus_notifications_queue_length", "Alerts waiting to be sent", self.queue_length.clone());
        r.register("prometheus_notifications_queue_capacity", "The queue's capacity", self.queue_capacity.clone());
        r.register(
            "prometheus_notifications_alertmanagers_discovered",
            "Alertmanagers configured",
            self.alertmanagers.clone(),
        );
    }
}
