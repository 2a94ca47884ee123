//! `/api/v1/query` and `/api/v1/query_range`: PromQL over the store, Prometheus' JSON.

use super::{labels_json, ApiError, ApiState, ErrorType, Params};
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use strata_model::duration::{format_duration_ms, parse_duration_ms};
use strata_model::time::{now_ms, parse_time};
use strata_model::value::{push_api_time, push_api_value};
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

/// A timestamp as a JSON number, whole seconds without a fraction (for `stats`).
fn time_json(t: i64) -> Value {
    if t % 1000 == 0 {
        json!(t / 1000)
    } else {
        json!(t as f64 / 1000.0)
    }
}

/// `[<time>,"<value>"]` as Prometheus writes a point, byte for byte.
fn push_point(out: &mut String, t: i64, v: f64) {
    out.push('[');
    push_api_time(out, t);
    out.push_str(",\"");
    push_api_value(out, v);
    out.push_str("\"]");
}

/// The `data` of a query answer as JSON text (`{"resultType":...,"result":...}` plus
/// `stats`), written directly: numbers as Prometheus writes them, which a JSON tree cannot
/// (`1796150016`, `1.500`), and a day of points for many series without building a tree.
fn result_text(v: &QueryValue, stats: Option<&Value>) -> String {
    let points: usize = match v {
        QueryValue::Matrix(m) => m.iter().map(|s| s.points.len()).sum(),
        QueryValue::Vector(x) => x.len(),
        _ => 1,
    };
    let mut out = String::with_capacity(64 + points * 40);
    match v {
        QueryValue::Scalar(t, x) => {
            out.push_str(r#"{"resultType":"scalar","result":"#);
            push_point(&mut out, *t, *x);
        }
        QueryValue::String(t, text) => {
            out.push_str(r#"{"resultType":"string","result":["#);
            push_api_time(&mut out, *t);
            out.push(',');
            out.push_str(&Value::String(text.clone()).to_string());
            out.push(']');
        }
        QueryValue::Vector(x) => {
            out.push_str(r#"{"resultType":"vector","result":["#);
            for (i, (labels, t, v)) in x.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(r#"{"metric":"#);
                out.push_str(&labels_json(labels).to_string());
                out.push_str(r#","value":"#);
                push_point(&mut out, *t, *v);
                out.push('}');
            }
            out.push(']');
        }
        QueryValue::Matrix(m) => {
            out.push_str(r#"{"resultType":"matrix","result":["#);
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
                    push_point(&mut out, t, v);
                }
                out.push_str("]}");
            }
            out.push(']');
        }
    }
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

/// Prometheus' `stats` object, when the `stats` parameter asks for it.
fn stats_json(p: &Params, st: &QueryStats, scope: &strata_store::QueryScope) -> Option<Value> {
    if p.get("stats").is_none_or(str::is_empty) {
        return None;
    }
    let secs = |d: Duration| d.as_secs_f64();
    let mut samples = json!({"totalQueryableSamples": st.total_queryable_samples, "peakSamples": st.peak_samples});
    if let Some(steps) = &st.per_step {
        samples["totalQueryableSamplesPerStep"] = steps.iter().map(|(t, n)| json!([time_json(*t), n])).collect();
    }
    let mut out = json!({
        "timings": {
            "evalTotalTime": secs(st.total),
            "resultSortTime": 0.0,
            "queryPreparationTime": secs(st.preparation),
            "innerEvalTime": secs(st.inner_eval),
            "execQueueTime": 0.0,
            "execTotalTime": secs(st.total),
        },
        "samples": samples,
    });
    // Strata's addition: which resolution answered which steps of which leaf.
    let used = scope.resolutions();
    if !used.is_empty() {
        out["resolutions"] = used
            .iter()
            .map(|r| {
                let res = if r.resolution == 0 { "raw".to_string() } else { format_duration_ms(r.resolution) };
                json!({"leaf": r.leaf, "resolution": res, "start": time_json(r.start), "end": time_json(r.end)})
            })
            .collect();
    }
    Some(out)
}

/// A duration parameter: float seconds or a Prometheus duration (`5m`).
fn duration_param(p: &Params, name: &str) -> Result<Option<i64>, ApiError> {
    let Some(s) = p.get(name).filter(|s| !s.is_empty()) else { return Ok(None) };
    if let Ok(f) = s.parse::<f64>() {
        // Prometheus' bound: a Go duration, nanoseconds in an int64 (about 292 years).
        let ns = f * 1e9;
        if !f.is_finite() || ns >= i64::MAX as f64 || ns <= i64::MIN as f64 {
            return Err(ApiError::bad_data(format!(
                "invalid parameter \"{name}\": cannot parse {s:?} to a valid duration. It overflows int64"
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
            // Prometheus' answer for a deadline that passed before the query started.
            return Err(ApiError { kind: crate::ErrorType::Timeout, message: "query timed out in query queue".into() });
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
        // Prometheus' wording for the parameters it reads with `parseTimeParam`.
        Some(t) => parse_time(t).map_err(|e| {
            ApiError::bad_data(format!("invalid parameter \"time\": Invalid time value for 'time': {e}"))
        })?,
        None => now_ms(),
    };
    let engine = engine_for(&s, &p)?.with_source(p.get("query").unwrap_or(""));
    let limit = super::limit_of(&p)?;
    let _slot = s.query_slot(engine.options.timeout).await?;
    let scope = super::scope_of(&p)?;
    let run = engine.instant_with_stats(s.store.as_ref(), &expr, time, wants_step_stats(&p));
    let (mut v, mut stats) = scope.clone().run(run).await?;
    stats.warnings.extend(scope.warnings());
    stats.infos.extend(scope.infos());
    truncate(&mut v, limit, &mut stats.warnings);
    let st = stats_json(&p, &stats, &scope);
    Ok(super::success_raw(&result_text(&v, st.as_ref()), &stats.warnings, &stats.infos))
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
    // Prometheus refuses only above 11,000 points. A span past ±292 million years
    // (client_golang's boundary times at both ends) cannot be stepped through.
    let Some(span) = end.checked_sub(start) else {
        return Err(ApiError::bad_data("invalid parameter \"end\": the range from start to end is out of bounds"));
    };
    if span / step > MAX_POINTS {
        return Err(ApiError::bad_data("exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)"));
    }
    let expr = parse_query(&p)?;
    let engine = engine_for(&s, &p)?.with_source(p.get("query").unwrap_or(""));
    let limit = super::limit_of(&p)?;
    let _slot = s.query_slot(engine.options.timeout).await?;
    let scope = super::scope_of(&p)?;
    let run = engine.range_with_stats(s.store.as_ref(), &expr, start, end, step, wants_step_stats(&p));
    let (mut v, mut stats) = scope.clone().run(run).await?;
    stats.warnings.extend(scope.warnings());
    stats.infos.extend(scope.infos());
    truncate(&mut v, limit, &mut stats.warnings);
    let st = stats_json(&p, &stats, &scope);
    Ok(super::success_raw(&result_text(&v, st.as_ref()), &stats.warnings, &stats.infos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_model::Labels;
    use strata_promql::SeriesPoints;

    /// The text is valid JSON and writes numbers as Prometheus does, byte for byte (edge
    /// review, issue 20, item 24).
    #[test]
    fn results_are_written_as_prometheus_writes_them() {
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
                points: vec![(-1500, f64::NEG_INFINITY), (0, 1.2345678901234569e23)],
            },
        ];
        let text = result_text(&QueryValue::Matrix(m), None);
        let parsed: Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(parsed["result"][0]["metric"]["job"], "a \"quoted\" \\ job\n");
        assert!(
            text.contains(r#"[1700000000,"1"],[1700000000.500,"NaN"],[1700000001,"+Inf"],[1700000002,"-1e-07"]"#),
            "{text}"
        );
        assert!(text.contains(r#"[-1.500,"-Inf"],[0,"1.2345678901234569e+23"]"#), "{text}");
        let v = result_text(&QueryValue::Vector(vec![(Labels::default(), 1_796_150_016_000, 5e-324)]), None);
        assert_eq!(v, r#"{"resultType":"vector","result":[{"metric":{},"value":[1796150016,"5e-324"]}]}"#);
        let sc = result_text(&QueryValue::Scalar(1000, 2.0), Some(&json!({"samples": {}})));
        assert_eq!(sc, r#"{"resultType":"scalar","result":[1,"2"],"stats":{"samples":{}}}"#);
        let st = result_text(&QueryValue::String(1000, "a\"b".into()), None);
        assert_eq!(st, r#"{"resultType":"string","result":[1,"a\"b"]}"#);
    }
}
