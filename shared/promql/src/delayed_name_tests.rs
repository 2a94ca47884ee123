//! Delayed name removal (Prometheus 3's `promql-delayed-name-removal`): the same queries
//! with the option off and on. The conformance file `name_label_dropping.test` covers the
//! cases Prometheus documents; these cover the paths it does not reach (subqueries,
//! comparisons, `count_values`, range queries) and work without that file.

use crate::{Engine, EngineOptions, QueryValue};
use strata_model::{Labels, MetricType, Sample};
use strata_store::memory::MemoryStore;

fn store() -> MemoryStore {
    let mut m = MemoryStore::default();
    for (name, step) in [("metric", 60.0), ("another_metric", 120.0)] {
        let labels = Labels::from_pairs([("__name__", name.to_string()), ("env", "1".to_string())]);
        m.add(labels, MetricType::Counter, (0..=10).map(|i| Sample::new(i * 60_000, i as f64 * step)));
    }
    m
}

fn engine(delayed: bool) -> Engine {
    Engine::new(EngineOptions { delayed_name_removal: delayed, ..Default::default() })
}

/// The instant result at 10m as sorted `labels value` lines, or the error.
fn instant(q: &str, delayed: bool) -> Result<Vec<String>, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().map_err(|e| e.to_string())?;
    let expr = crate::parse(q).map_err(|e| e.to_string())?;
    let v = rt.block_on(engine(delayed).instant(&store(), &expr, 600_000)).map_err(|e| e.to_string())?;
    let mut lines: Vec<String> = match v {
        QueryValue::Vector(v) => v.into_iter().map(|(l, _, x)| format!("{l} {x}")).collect(),
        QueryValue::Matrix(m) => m.into_iter().map(|s| format!("{} {}", s.labels, s.points.len())).collect(),
        other => vec![format!("{other:?}")],
    };
    lines.sort();
    Ok(lines)
}

#[test]
fn label_replace_sees_the_name_only_when_removal_is_delayed() {
    let q = r#"label_replace(rate({env="1"}[5m]), "from", "$1", "__name__", "(.+)")"#;
    // Off, rate drops both names at once and the two series collide, as in Prometheus.
    assert!(instant(q, false).unwrap_err().contains("same labelset"));
    assert_eq!(
        instant(q, true).unwrap(),
        vec![r#"{env="1", from="another_metric"} 2"#.to_string(), r#"{env="1", from="metric"} 1"#.to_string()]
    );
}

#[test]
fn writing_the_name_keeps_it() {
    let q = r#"label_replace(-metric, "__name__", "neg_$1", "__name__", "(.+)")"#;
    assert_eq!(instant(q, true).unwrap(), vec![r#"neg_metric{env="1"} -600"#.to_string()]);
    // Off, the name is gone before label_replace runs: nothing to match, the label stays unset.
    assert_eq!(instant(q, false).unwrap(), vec![r#"{env="1"} -600"#.to_string()]);
}

#[test]
fn grouping_by_a_marked_name_collides_at_the_end() {
    let q = r#"sum by (__name__) (rate({env="1"}[5m]))"#;
    let err = instant(q, true).unwrap_err();
    assert!(err.contains("same labelset"), "{err}");
    // Grouped by a label the names do not share, the marked series sum as one.
    assert_eq!(instant(r#"sum by (env) (rate({env="1"}[5m]))"#, true).unwrap(), vec![r#"{env="1"} 3"#.to_string()]);
    // By a name that is kept (a selector's), the groups keep it.
    assert_eq!(
        instant(r#"sum by (__name__) ({env="1"})"#, true).unwrap(),
        vec!["another_metric{} 1200".to_string(), "metric{} 600".to_string()]
    );
    // count_values keeps the group's mark too.
    let q = r#"count_values by (__name__) ("v", {env="1"} * 0)"#;
    assert!(instant(q, true).unwrap_err().contains("same labelset"));
}

#[test]
fn a_comparison_keeps_the_mark_of_its_operand() {
    let q = "-metric < 0";
    assert_eq!(instant(q, true).unwrap(), vec![r#"{env="1"} -600"#.to_string()]);
    assert_eq!(instant(q, false).unwrap(), vec![r#"{env="1"} -600"#.to_string()]);
    assert_eq!(instant("metric > 0", true).unwrap(), vec![r#"metric{env="1"} 600"#.to_string()]);
}

#[test]
fn subqueries_carry_the_mark_into_range_functions_and_results() {
    // The subquery's inner series are marked; the instant range-vector result drops them.
    assert_eq!(instant("(-metric)[2m:1m]", true).unwrap(), vec![r#"{env="1"} 2"#.to_string()]);
    // last_over_time keeps a name, but not one an inner operation already dropped.
    assert_eq!(instant("last_over_time((-metric)[2m:1m])", true).unwrap(), vec![r#"{env="1"} -600"#.to_string()]);
    assert_eq!(instant("last_over_time(metric[2m])", true).unwrap(), vec![r#"metric{env="1"} 600"#.to_string()]);
}

#[test]
fn a_range_query_refuses_series_that_collide_after_removal() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let expr = crate::parse(r#"{env="1"} * 1"#).unwrap();
    let run = |delayed| rt.block_on(engine(delayed).range(&store(), &expr, 0, 600_000, 60_000));
    assert!(run(false).unwrap_err().to_string().contains("same labelset"));
    assert!(run(true).unwrap_err().to_string().contains("same labelset"));
    let expr = crate::parse(r#"topk(1, {env="1"} * 1)"#).unwrap();
    let ok = rt.block_on(engine(true).range(&store(), &expr, 0, 600_000, 60_000)).unwrap();
    let QueryValue::Matrix(m) = ok else { panic!("a range query answers a matrix") };
    assert!(m.iter().all(|s| s.labels.get("__name__").is_none()), "{m:?}");
}
