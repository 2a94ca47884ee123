//! A group's evaluations over a memory store, after the cases of Prometheus' rules tests:
//! alert states through `for`, `keep_firing_for` and the resolved retention; `ALERTS` and
//! its staleness; recording rules' names, labels, duplicate and limit errors; template
//! errors that leave the alert with the error as its text; `query` in a template.

use crate::alert::AlertState;
use crate::file::parse_groups;
use crate::group::{EvalContext, Group, Health, RuleSink};
use async_trait::async_trait;
use parking_lot::Mutex;
use strata_model::{is_stale, Labels, MetricType, Sample};
use strata_promql::{Engine, EngineOptions};
use strata_store::memory::MemoryStore;

const MIN: i64 = 60_000;

#[derive(Default)]
struct Recorder(Mutex<Vec<(Labels, Sample)>>);

#[async_trait]
impl RuleSink for Recorder {
    async fn append(&self, samples: Vec<(Labels, Sample)>) -> Result<usize, String> {
        self.0.lock().extend(samples);
        Ok(0)
    }
}

impl Recorder {
    fn at(&self, t: i64) -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> =
            self.0.lock().iter().filter(|(_, s)| s.t == t).map(|(l, s)| (l.to_string(), s.v)).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// A series: its labels and one value a minute from 0 (`None`: no sample).
type Input<'a> = (&'a [(&'a str, &'a str)], &'a [Option<f64>]);

fn store(series: &[Input]) -> MemoryStore {
    let mut m = MemoryStore::default();
    for (labels, values) in series {
        let samples = values.iter().enumerate().filter_map(|(i, v)| v.map(|v| Sample::new(i as i64 * MIN, v)));
        m.add(Labels::from_pairs(labels.iter().copied()), MetricType::Gauge, samples);
    }
    m
}

fn group(rules: &str) -> Group {
    let text = format!("groups:\n- name: g\n  rules:\n{rules}");
    Group::new(parse_groups("r.yml", &text).unwrap().remove(0), MIN)
}

#[tokio::test]
async fn an_alert_goes_pending_firing_resolved_and_is_forgotten_after_fifteen_minutes() {
    let up = [Some(90.0), Some(90.0), Some(90.0), Some(90.0), Some(50.0)];
    let m = store(&[(&[("__name__", "temp"), ("gpu", "0")], &up)]);
    let mut g = group("  - alert: Hot\n    expr: temp > 80\n    for: 2m\n    labels: {severity: page}\n");
    let engine = Engine::new(EngineOptions::default());
    let ctx = EvalContext { store: &m, engine: &engine, external_labels: &Labels::default(), external_url: "" };
    let sink = Recorder::default();
    let state = |g: &Group| g.rules[0].alerts.as_ref().unwrap().active.values().next().map(|a| a.state);
    for (t, want) in [
        (0, Some(AlertState::Pending)),
        (MIN, Some(AlertState::Pending)),
        (2 * MIN, Some(AlertState::Firing)),
        (3 * MIN, Some(AlertState::Firing)),
        (4 * MIN, Some(AlertState::Inactive)),
    ] {
        g.eval(t, &ctx, &sink).await;
        assert_eq!(state(&g), want, "at {t}");
    }
    // Firing: `ALERTS` of the new state, `ALERTS_FOR_STATE` with its start (seconds), and
    // the pending state's series marked stale.
    let at2 = sink.at(2 * MIN);
    assert_eq!(at2.len(), 3, "{at2:?}");
    assert_eq!(at2[0], ("ALERTS_FOR_STATE{alertname=\"Hot\", gpu=\"0\", severity=\"page\"}".to_string(), 0.0));
    assert_eq!(
        at2[1],
        ("ALERTS{alertname=\"Hot\", alertstate=\"firing\", gpu=\"0\", severity=\"page\"}".to_string(), 1.0)
    );
    assert!(at2[2].0.contains("alertstate=\"pending\"") && is_stale(at2[2].1), "{at2:?}");
    // Resolved: its series go stale, and it is no longer returned by the API's view.
    let at4 = sink.at(4 * MIN);
    assert_eq!(at4.len(), 2);
    assert!(at4.iter().all(|(_, v)| is_stale(*v)), "{at4:?}");
    assert!(g.rules[0].alerts.as_ref().unwrap().active_alerts().is_empty());
    // Kept 15 minutes for Alertmanager to hear it resolved, then forgotten.
    g.eval(4 * MIN + 15 * MIN, &ctx, &sink).await;
    assert!(state(&g).is_some());
    g.eval(4 * MIN + 16 * MIN, &ctx, &sink).await;
    assert!(state(&g).is_none());
}

#[tokio::test]
async fn keep_firing_for_holds_a_firing_alert_after_its_expression_stops() {
    let v = [Some(90.0), Some(90.0), Some(50.0), Some(50.0), Some(50.0)];
    let m = store(&[(&[("__name__", "temp")], &v)]);
    let mut g = group("  - alert: Hot\n    expr: temp > 80\n    keep_firing_for: 2m\n");
    let engine = Engine::new(EngineOptions::default());
    let ctx = EvalContext { store: &m, engine: &engine, external_labels: &Labels::default(), external_url: "" };
    let sink = Recorder::default();
    let mut states = Vec::new();
    for t in 0..5 {
        g.eval(t * MIN, &ctx, &sink).await;
        states.push(g.rules[0].alerts.as_ref().unwrap().active.values().next().map(|a| a.state));
    }
    use AlertState::*;
    assert_eq!(states, vec![Some(Firing), Some(Firing), Some(Firing), Some(Firing), Some(Inactive)]);
}

#[tokio::test]
async fn recording_rules_rename_relabel_and_refuse_duplicates_and_limits() {
    let m = store(&[
        (&[("__name__", "temp"), ("gpu", "0"), ("node", "a")], &[Some(1.0)]),
        (&[("__name__", "temp"), ("gpu", "1"), ("node", "a")], &[Some(3.0)]),
    ]);
    let engine = Engine::new(EngineOptions::default());
    let ctx = EvalContext { store: &m, engine: &engine, external_labels: &Labels::default(), external_url: "" };
    let sink = Recorder::default();
    let mut g = group("  - record: node:temp:sum\n    expr: sum by (node) (temp)\n    labels: {node: b, team: ml}\n  - record: scalar_rule\n    expr: '2'\n");
    let out = g.eval(0, &ctx, &sink).await;
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    assert_eq!(
        sink.at(0),
        vec![("node:temp:sum{node=\"b\", team=\"ml\"}".to_string(), 4.0), ("scalar_rule{}".to_string(), 2.0),]
    );
    // The rule's label overwrites what told the results apart: an error, not a silent merge.
    let mut g = group("  - record: t\n    expr: temp\n    labels: {gpu: x}\n");
    let out = g.eval(0, &ctx, &sink).await;
    assert_eq!(out.failures.len(), 1);
    assert!(out.failures[0].1.contains("same labelset"), "{:?}", out.failures);
    assert_eq!(g.rules[0].health, Health::Err);
    let text = "groups:\n- name: g\n  limit: 1\n  rules:\n  - record: t\n    expr: temp\n";
    let mut g = Group::new(parse_groups("r.yml", text).unwrap().remove(0), MIN);
    let out = g.eval(0, &ctx, &sink).await;
    assert!(out.failures[0].1.contains("exceeded limit 1 with 2 series"), "{:?}", out.failures);
}

#[tokio::test]
async fn a_series_a_rule_stops_returning_gets_a_staleness_marker() {
    let m = store(&[
        (&[("__name__", "temp"), ("gpu", "0")], &[Some(1.0), Some(1.0)]),
        (&[("__name__", "temp"), ("gpu", "1")], &[Some(1.0)]),
    ]);
    let engine = Engine::new(EngineOptions { lookback: std::time::Duration::from_secs(30), ..Default::default() });
    let ctx = EvalContext { store: &m, engine: &engine, external_labels: &Labels::default(), external_url: "" };
    let sink = Recorder::default();
    let mut g = group("  - record: t\n    expr: temp\n");
    g.eval(0, &ctx, &sink).await;
    g.eval(MIN, &ctx, &sink).await;
    let at = sink.at(MIN);
    assert_eq!(at.len(), 2, "{at:?}");
    assert_eq!(at[0], ("t{gpu=\"0\"}".to_string(), 1.0));
    assert!(at[1].0 == "t{gpu=\"1\"}" && is_stale(at[1].1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn templates_expand_with_query_and_a_failing_one_says_so_in_its_text() {
    let m = store(&[(&[("__name__", "temp"), ("gpu", "0")], &[Some(90.0)]), (&[("__name__", "limit")], &[Some(85.0)])]);
    let engine = Engine::new(EngineOptions::default());
    let ext = Labels::from_pairs([("region", "eu")]);
    let ctx = EvalContext { store: &m, engine: &engine, external_labels: &ext, external_url: "http://r" };
    let sink = Recorder::default();
    let mut g = group(
        "  - alert: Hot\n    expr: temp > 80\n    annotations:\n      ok: '{{ $labels.gpu }} over {{ with query \"limit\" }}{{ . | first | value }}{{ end }} in {{ $externalLabels.region }}'\n      bad: '{{ index $labels }}{{ humanize \"x\" }}'\n",
    );
    let out = g.eval(0, &ctx, &sink).await;
    assert_eq!(out.template_errors.len(), 1, "{:?}", out.template_errors);
    let a = g.rules[0].alerts.as_ref().unwrap().active_alerts()[0].clone();
    assert_eq!(a.annotations.get("ok").map(String::as_str), Some("0 over 85 in eu"));
    assert!(
        a.annotations.get("bad").map(String::as_str).unwrap_or_default().starts_with("<error expanding template: "),
        "{:?}",
        a.annotations
    );
}

#[tokio::test]
async fn a_failing_rule_is_named_in_the_api_and_the_others_still_run() {
    let temps: Vec<Option<f64>> = (0..=60).map(|_| Some(90.0)).collect();
    let m =
        store(&[(&[("__name__", "temp_a"), ("gpu", "0")], &temps), (&[("__name__", "temp_b"), ("gpu", "0")], &temps)]);
    // A limit on samples stands for any query error (a timeout takes the same path).
    let engine = Engine::new(EngineOptions { max_samples: 30, ..Default::default() });
    let ctx = EvalContext { store: &m, engine: &engine, external_labels: &Labels::default(), external_url: "" };
    let sink = Recorder::default();
    let mut g = group(
        "  - record: collides\n    expr: '{__name__=~\"temp_.\"}'\n  - record: too_much\n    expr: count_over_time(temp_a[1h])\n  - record: fine\n    expr: temp_a\n",
    );
    let out = g.eval(60 * MIN, &ctx, &sink).await;
    assert_eq!(out.failures.len(), 2, "{:?}", out.failures);
    let json = crate::api::group_json(&g, &crate::api::RulesFilter::default(), &Labels::default()).unwrap();
    let rules = json["rules"].as_array().unwrap();
    let health: Vec<(&str, &str)> =
        rules.iter().map(|r| (r["health"].as_str().unwrap(), r["lastError"].as_str().unwrap())).collect();
    assert_eq!(health[0].0, "err");
    assert!(health[0].1.contains("same labelset"), "{health:?}");
    assert_eq!(health[1].0, "err");
    assert!(health[1].1.contains("samples"), "{health:?}");
    assert_eq!(health[2], ("ok", ""));
    assert_eq!(sink.at(60 * MIN), vec![("fine{gpu=\"0\"}".to_string(), 90.0)]);
}

/// Prometheus' `TestCopyState` and `TestDeletedRuleMarkedStale`: a reload keeps the alerts
/// of a rule that stays (matched by kind, name and labels) and marks the series of a rule
/// it removed stale at the next evaluation, after their last sample.
#[tokio::test]
async fn a_reload_keeps_the_alerts_that_stay_and_marks_a_removed_rule_stale() {
    let temps = [Some(90.0), Some(90.0), Some(90.0)];
    let m = store(&[(&[("__name__", "temp"), ("gpu", "0")], &temps)]);
    let engine = Engine::new(EngineOptions::default());
    let ctx = EvalContext { store: &m, engine: &engine, external_labels: &Labels::default(), external_url: "" };
    let sink = Recorder::default();
    let mut old = group("  - record: gone\n    expr: temp\n  - alert: Hot\n    expr: temp > 80\n    for: 5m\n");
    old.eval(0, &ctx, &sink).await;
    let active_at = old.rules[1].alerts.as_ref().unwrap().active_alerts()[0].active_at;
    // The expression changed, not the name or labels: the alert is the same one.
    let mut new = group("  - alert: Hot\n    expr: temp > 85\n    for: 5m\n");
    new.take_state_from(&mut old);
    new.eval(MIN, &ctx, &sink).await;
    let alerts = new.rules[0].alerts.as_ref().unwrap().active_alerts();
    assert_eq!((alerts.len(), alerts[0].active_at), (1, active_at), "the pending alert kept its start");
    let at = sink.at(MIN);
    assert!(at.iter().any(|(l, v)| l == "gone{gpu=\"0\"}" && is_stale(*v)), "{at:?}");
}

/// Prometheus' `TestAlertingRuleEmptyLabelFromTemplate`: a label whose value is empty is
/// not on the alert; an empty annotation is.
#[tokio::test]
async fn a_label_whose_template_is_empty_is_dropped() {
    let m = store(&[(&[("__name__", "temp"), ("gpu", "0")], &[Some(90.0)])]);
    let engine = Engine::new(EngineOptions::default());
    let ctx = EvalContext { store: &m, engine: &engine, external_labels: &Labels::default(), external_url: "" };
    let mut g =
        group("  - alert: Hot\n    expr: temp > 80\n    labels:\n      empty: ''\n      gpu: '{{ $labels.gpu }}'\n");
    g.eval(0, &ctx, &Recorder::default()).await;
    let a = g.rules[0].alerts.as_ref().unwrap().active_alerts()[0].clone();
    assert_eq!(a.labels.get("empty"), None, "{}", a.labels);
    assert_eq!(a.labels.get("gpu"), Some("0"));
}
