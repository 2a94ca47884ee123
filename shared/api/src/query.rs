//! `/api/v1/query` and `/api/v1/query_range`: PromQL over the store, Prometheus' JSON.

use super::{labels_json, ApiError, ApiState, ErrorType, Params};
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use strata_model::duration::parse_duration_ms;
use strata_model::time::{now_ms, parse_time};
use strata_model::value::format_value;
use strata_promql::{Engine, QueryError, QueryStats, QueryValue};

/// Prometheus refuses range queries above this many points per series.
const MAX_POINTS: i64 = 11_000;

impl From<QueryError> for ApiError {
    fn from(e: QueryError) -> Self {
        let kind = match &e {
            QueryError::BadData(_) | QueryError::Unsupported(_) => ErrorType::BadData,
            QueryError::Execution(_) | QueryError::TooManySamples(_) => ErrorType::Execution,
            QueryError::Timeout(_) => ErrorType::Timeout,
            QueryError::Canceled => ErrorType::Canceled,
            QueryError::Internal(_) => ErrorType::Internal,
            QueryError::Store(s) => return ApiError::from(strata_store::StoreError::from_ref(s)),
        };
        ApiError { kind, message: e.to_string() }
    }
}

fn time_json(t: i64) -> Value {
    json!(t as f64 / 1000.0)
}

fn value_json(v: f64) -> Value {
    Value::String(format_value(v))
}

fn result_json(v: QueryValue) -> Value {
    match v {
        QueryValue::Scalar(t, x) => json!({"resultType": "scalar", "result": [time_json(t), value_json(x)]}),
        QueryValue::String(t, s) => json!({"resultType": "string", "result": [time_json(t), s]}),
        QueryValue::Vector(v) => json!({
            "resultType": "vector",
            "result": v.iter().map(|(l, t, x)| json!({"metric": labels_json(l), "value": [time_json(*t), value_json(*x)]})).collect::<Vec<_>>(),
        }),
        QueryValue::Matrix(m) => json!({
            "resultType": "matrix",
            "result": m.iter().map(|s| json!({
                "metric": labels_json(&s.labels),
                "values": s.points.iter().map(|(t, x)| json!([time_json(*t), value_json(*x)])).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }),
    }
}

/// `{"resultType":"matrix","result":[...]}` (plus `stats`), written directly; the same
/// text `result_json` would give.
fn matrix_json(m: &[strata_promql::SeriesPoints], stats: Option<&Value>) -> String {
    use std::fmt::Write;
    let points: usize = m.iter().map(|s| s.points.len()).sum();
    let mut out = String::with_capacity(64 + m.len() * 256 + points * 32);
    out.push_str(r#"{"resultType":"matrix","result":["#);
    let mut ryu = ryu::Buffer::new();
    for (i, s) in m.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(r#"{"metric":"#);
        out.push_str(&labels_json(&s.labels).to_string());
        out.push_str(r#","values":["#);
        for (j, &(t, v)) in s.points.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            out.push('[');
            out.push_str(ryu.format_finite(t as f64 / 1000.0));
            out.push_str(",\"");
            if v.is_finite() {
                let _ = write!(out, "{v}");
            } else {
                out.push_str(&format_value(v));
            }
            out.push_str("\"]");
        }
        out.push_str("]}");
    }
    out.push(']');
    if let Some(st) = stats {
        out.push_str(r#","stats":"#);
        out.push_str(&st.to_string());
    }
    out.push('}');
    out
}

/// `stats=all` asks for samples per step as well.
fn wants_step_stats(p: &Params) -> bool {
    p.get("stats") == Some("all")
}

/// Adds Prometheus' `stats` object to the data when the `stats` parameter is set.
fn with_stats(mut data: Value, p: &Params, st: &QueryStats) -> Value {
    if let Some(stats) = stats_json(p, st) {
        data["stats"] = stats;
    }
    data
}

/// Prometheus' `stats` object, when the `stats` parameter asks for it.
fn stats_json(p: &Params, st: &QueryStats) -> Option<Value> {
    if p.get("stats").is_none_or(str::is_empty) {
        return None;
    }
    let secs = |d: Duration| d.as_secs_f64();
    let mut samples = json!({"totalQueryableSamples": st.total_queryable_samples, "peakSamples": st.peak_samples});
    if let Some(steps) = &st.per_step {
        samples["totalQueryableSamplesPerStep"] = steps.iter().map(|(t, n)| json!([time_json(*t), n])).collect();
    }
    Some(json!({
        "timings": {
            "evalTotalTime": secs(st.total),
            "resultSortTime": 0.0,
            "queryPreparationTime": secs(st.preparation),
            "innerEvalTime": secs(st.inner_eval),
            "execQueueTime": 0.0,
            "execTotalTime": secs(st.total),
        },
        "samples": samples,
    }))
}

/// A duration parameter: float seconds or a Prometheus duration (`5m`).
fn duration_param(p: &Params, name: &str) -> Result<Option<i64>, ApiError> {
    let Some(s) = p.get(name).filter(|s| !s.is_empty()) else { return Ok(None) };
    if let Ok(f) = s.parse::<f64>() {
        if !f.is_finite() || f * 1000.0 > i64::MAX as f64 || f * 1000.0 < i64::MIN as f64 {
            return Err(ApiError::bad_data(format!(
                "invalid parameter \"{name}\": cannot parse {s:?} to a valid duration"
            )));
        }
        return Ok(Some((f * 1000.0).round() as i64));
    }
    parse_duration_ms(s).map(Some).map_err(|e| {
        ApiError::bad_data(format!("invalid parameter \"{name}\": cannot parse {s:?} to a valid duration: {e}"))
    })
}

/// The engine for one request: `timeout` shortens the configured one (a timeout that is
/// not positive, or under half a millisecond, has expired before the query starts: a 503
/// timeout, as Prometheus answers), `lookback_delta` (Prometheus 3) replaces the lookback
/// when positive.
fn engine_for(state: &ApiState, p: &Params) -> Result<Engine, ApiError> {
    let mut opts = state.engine.clone();
    if let Some(t) = duration_param(p, "timeout")? {
        if t <= 0 {
            return Err(QueryError::Timeout(Duration::ZERO).into());
        }
        opts.timeout = opts.timeout.min(Duration::from_millis(t as u64));
    }
    if let Some(l) = duration_param(p, "lookback_delta")? {
        if l > 0 {
            opts.lookback = Duration::from_millis(l as u64);
        }
    }
    Ok(Engine::new(opts))
}

/// `limit` (Prometheus 3.2): at most this many series in the result, with a warning when
/// some were cut; 0 or absent is no limit.
fn limit_param(p: &Params) -> Result<usize, ApiError> {
    match p.get("limit").filter(|s| !s.is_empty()) {
        None => Ok(0),
        Some(s) => s.parse::<usize>().map_err(|_| {
            ApiError::bad_data(format!("invalid parameter \"limit\": cannot parse {s:?} to a non-negative integer"))
        }),
    }
}

/// Cuts a result to `limit` series, saying so in the warnings.
fn truncate(v: &mut QueryValue, limit: usize, warnings: &mut Vec<String>) {
    let cut = match v {
        QueryValue::Vector(x) if limit > 0 && x.len() > limit => {
            x.truncate(limit);
            true
        }
        QueryValue::Matrix(x) if limit > 0 && x.len() > limit => {
            x.truncate(limit);
            true
        }
        _ => false,
    };
    if cut {
        warnings.push("results truncated due to limit".into());
    }
}

fn parse_query(p: &Params) -> Result<strata_promql::Expr, ApiError> {
    let q = p.get("query").unwrap_or("");
    strata_promql::parse(q).map_err(|e| ApiError::bad_data(format!("invalid parameter \"query\": {e}")))
}

pub async fn instant(
    State(s): State<Arc<ApiState>>,
    method: Method,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = Params::from_request(&method, &headers, q.as_deref(), &body)?;
    let expr = parse_query(&p)?;
    let time = match p.get("time").filter(|t| !t.is_empty()) {
        Some(t) => parse_time(t).map_err(|e| ApiError::bad_data(format!("invalid parameter \"time\": {e}")))?,
        None => now_ms(),
    };
    let engine = engine_for(&s, &p)?;
    let limit = limit_param(&p)?;
    let _slot = s.query_slot(engine.options.timeout).await?;
    let scope = super::scope_of(&p)?;
    let run = engine.instant_with_stats(s.store.as_ref(), &expr, time, wants_step_stats(&p));
    let (mut v, mut stats) = scope.clone().run(run).await?;
    stats.warnings.extend(scope.warnings());
    truncate(&mut v, limit, &mut stats.warnings);
    Ok(super::success_annotated(with_stats(result_json(v), &p, &stats), &stats.warnings, &stats.infos))
}

pub async fn range(
    State(s): State<Arc<ApiState>>,
    method: Method,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = Params::from_request(&method, &headers, q.as_deref(), &body)?;
    let start = match p.get("start") {
        Some(t) => parse_time(t).map_err(|e| ApiError::bad_data(format!("invalid parameter \"start\": {e}")))?,
        None => return Err(ApiError::bad_data("invalid parameter \"start\": cannot parse \"\" to a valid timestamp")),
    };
    let end = match p.get("end") {
        Some(t) => parse_time(t).map_err(|e| ApiError::bad_data(format!("invalid parameter \"end\": {e}")))?,
        None => return Err(ApiError::bad_data("invalid parameter \"end\": cannot parse \"\" to a valid timestamp")),
    };
    if end < start {
        return Err(ApiError::bad_data("invalid parameter \"end\": end timestamp must not be before start time"));
    }
    let step = duration_param(&p, "step")?
        .ok_or_else(|| ApiError::bad_data("invalid parameter \"step\": cannot parse \"\" to a valid duration"))?;
    if step <= 0 {
        return Err(ApiError::bad_data("invalid parameter \"step\": zero or negative query resolution step widths are not accepted. Try a positive integer"));
    }
    // Prometheus refuses only above 11,000 points.
    if (end - start) / step > MAX_POINTS {
        return Err(ApiError::bad_data("exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)"));
    }
    let expr = parse_query(&p)?;
    let engine = engine_for(&s, &p)?;
    let limit = limit_param(&p)?;
    let _slot = s.query_slot(engine.options.timeout).await?;
    let scope = super::scope_of(&p)?;
    let run = engine.range_with_stats(s.store.as_ref(), &expr, start, end, step, wants_step_stats(&p));
    let (mut v, mut stats) = scope.clone().run(run).await?;
    stats.warnings.extend(scope.warnings());
    truncate(&mut v, limit, &mut stats.warnings);
    match v {
        // A day of points for many series: written as text, not built as a JSON tree.
        QueryValue::Matrix(m) => {
            Ok(super::success_raw(&matrix_json(&m, stats_json(&p, &stats).as_ref()), &stats.warnings, &stats.infos))
        }
        v => Ok(super::success_annotated(with_stats(result_json(v), &p, &stats), &stats.warnings, &stats.infos)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_model::Labels;
    use strata_promql::SeriesPoints;

    #[test]
    fn matrix_text_is_the_json_tree_written_out() {
        let m = vec![
            SeriesPoints {
                labels: Labels::from_pairs([
                    ("__name__", "up".to_string()),
                    ("job", "a \"quoted\" \\ job\n".to_string()),
                ]),
                points: vec![
                    (1_700_000_000_000, 1.0),
                    (1_700_000_000_500, f64::NAN),
                    (1_700_000_001_000, f64::INFINITY),
                    (1_700_000_002_000, -1e-7),
                ],
            },
            SeriesPoints {
                labels: Labels::default(),
                points: vec![(-1500, f64::NEG_INFINITY), (0, 123456789012345680000.0)],
            },
        ];
        let text: Value = serde_json::from_str(&matrix_json(&m, None)).expect("valid JSON");
        assert_eq!(text, result_json(QueryValue::Matrix(m.clone())));
        let stats = json!({"samples": {"totalQueryableSamples": 3}});
        let with: Value = serde_json::from_str(&matrix_json(&m, Some(&stats))).expect("valid JSON");
        assert_eq!(with["stats"], stats);
        assert_eq!(with["result"], text["result"]);
    }
}
