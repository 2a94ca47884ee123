//! The Prometheus HTTP API v1 over any [`Store`], mountable by every tier.
//!
//! Same parameters (GET query string or POST form; RFC 3339 or Unix times; repeated
//! `match[]`), same JSON envelope (`status`, `data`, `errorType`, `error`, `warnings`) and
//! same status codes as Prometheus, so Grafana and `promtool` work unchanged.
//! Served here: `query`, `query_range`, `series`, `labels`, `label/<name>/values`,
//! `metadata`, `status/buildinfo`.

mod params;
mod query;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
pub use params::Params;
use serde_json::{json, Value};
use std::sync::Arc;
use strata_model::matcher::Matcher;
use strata_store::{QueryScope, Store, StoreError};

/// Prometheus' error types, each with its HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    BadData,
    Execution,
    Timeout,
    Canceled,
    Internal,
    Unavailable,
    NotFound,
}

impl ErrorType {
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorType::BadData => "bad_data",
            ErrorType::Execution => "execution",
            ErrorType::Timeout => "timeout",
            ErrorType::Canceled => "canceled",
            ErrorType::Internal => "internal",
            ErrorType::Unavailable => "unavailable",
            ErrorType::NotFound => "not_found",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ErrorType::BadData => StatusCode::BAD_REQUEST,
            ErrorType::Execution => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorType::Timeout | ErrorType::Canceled | ErrorType::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorType::NotFound => StatusCode::NOT_FOUND,
        }
    }
}

#[derive(Debug)]
pub struct ApiError {
    pub kind: ErrorType,
    pub message: String,
}

impl ApiError {
    pub fn bad_data(message: impl Into<String>) -> Self {
        ApiError { kind: ErrorType::BadData, message: message.into() }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let kind = match e {
            StoreError::LimitExceeded { .. } => ErrorType::Execution,
            StoreError::InvalidRequest(_) => ErrorType::BadData,
            StoreError::Unavailable(_) => ErrorType::Unavailable,
            StoreError::Corrupt { .. } => ErrorType::Internal,
        };
        ApiError { kind, message: e.to_string() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"status": "error", "errorType": self.kind.as_str(), "error": self.message});
        (self.kind.status(), axum::Json(body)).into_response()
    }
}

/// A successful answer, with optional warnings.
pub fn success(data: Value, warnings: Vec<String>) -> Response {
    success_annotated(data, &warnings, &[])
}

/// A success with Prometheus' `warnings` and `infos` annotations, each present when non-empty.
pub fn success_annotated(data: Value, warnings: &[String], infos: &[String]) -> Response {
    let (warnings, infos) = (&capped(warnings, "warning")[..], &capped(infos, "info")[..]);
    let mut body = json!({"status": "success", "data": data});
    if !warnings.is_empty() {
        body["warnings"] = json!(warnings);
    }
    if !infos.is_empty() {
        body["infos"] = json!(infos);
    }
    axum::Json(body).into_response()
}

/// `{"status":"success","data":<data>}` around data already in JSON text, with annotations.
/// At most ten annotations of a kind, then how many more were left out (Prometheus'
/// `AsStrings(query, 10, 10)`).
fn capped(list: &[String], kind: &str) -> Vec<String> {
    const MAX: usize = 10;
    let mut out: Vec<String> = list.iter().take(MAX).cloned().collect();
    if list.len() > MAX {
        out.push(format!("{} more {kind} annotations omitted", list.len() - MAX));
    }
    out
}

pub fn success_raw(data: &str, warnings: &[String], infos: &[String]) -> Response {
    let (warnings, infos) = (&capped(warnings, "warning")[..], &capped(infos, "info")[..]);
    let mut body = String::with_capacity(data.len() + 32);
    body.push_str(r#"{"status":"success","data":"#);
    body.push_str(data);
    for (key, list) in [("warnings", warnings), ("infos", infos)] {
        if !list.is_empty() {
            body.push_str(&format!(",\"{key}\":{}", json!(list)));
        }
    }
    body.push('}');
    ([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// How the API runs queries.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    pub engine: strata_promql::EngineOptions,
    /// Queries evaluated at once (Prometheus' `--query.max-concurrency`); the rest wait for
    /// a slot within their timeout.
    pub max_concurrency: usize,
}

/// Prometheus' default for `--query.max-concurrency`.
pub const DEFAULT_MAX_CONCURRENCY: usize = 20;

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions { engine: Default::default(), max_concurrency: DEFAULT_MAX_CONCURRENCY }
    }
}

pub struct ApiState {
    pub store: Arc<dyn Store>,
    pub engine: strata_promql::EngineOptions,
    queries: Arc<tokio::sync::Semaphore>,
    max_concurrency: usize,
}

impl ApiState {
    /// Waits for one of the query slots, at most `timeout`.
    async fn query_slot(&self, timeout: std::time::Duration) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        let waited = tokio::time::timeout(timeout, self.queries.clone().acquire_owned()).await;
        match waited {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(ApiError { kind: ErrorType::Unavailable, message: "the query queue is closed".into() }),
            Err(_) => Err(ApiError {
                kind: ErrorType::Timeout,
                message: format!("query timed out waiting for one of the {} query slots", self.max_concurrency),
            }),
        }
    }
}

/// The API routes for a store; merge into a tier's router.
pub fn router(store: Arc<dyn Store>) -> Router {
    router_with(store, ApiOptions::default())
}

pub fn router_with(store: Arc<dyn Store>, opts: ApiOptions) -> Router {
    let slots = opts.max_concurrency.max(1);
    let state = Arc::new(ApiState {
        store,
        engine: opts.engine,
        queries: Arc::new(tokio::sync::Semaphore::new(slots)),
        max_concurrency: slots,
    });
    api_routes(state).layer(axum::middleware::from_fn(gzip_when_asked))
}

/// Compresses a response with gzip when the request accepts it, as Prometheus does.
async fn gzip_when_asked(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use std::io::Write;
    let wants = req
        .headers()
        .get(axum::http::header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|e| e.trim().starts_with("gzip")));
    let resp = next.run(req).await;
    if !wants {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return ApiError { kind: ErrorType::Internal, message: "reading the response body failed".into() }
            .into_response();
    };
    let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(bytes.len() / 4), flate2::Compression::fast());
    let Ok(gz) = enc.write_all(&bytes).and_then(|_| enc.finish()) else {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    };
    parts.headers.insert(axum::http::header::CONTENT_ENCODING, axum::http::HeaderValue::from_static("gzip"));
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(gz))
}

fn api_routes(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/api/v1/query", get(query::instant).post(query::instant))
        .route("/api/v1/query_range", get(query::range).post(query::range))
        .route("/api/v1/series", get(series).post(series))
        .route("/api/v1/labels", get(labels).post(labels))
        .route("/api/v1/label/{name}/values", get(label_values))
        .route("/api/v1/metadata", get(metadata))
        .route("/api/v1/status/buildinfo", get(buildinfo))
        .route("/api/v1/query_exemplars", get(no_exemplars).post(no_exemplars))
        .fallback(|| async { (StatusCode::NOT_FOUND, "404 page not found\n") })
        .layer(axum::middleware::from_fn(cors))
        .with_state(state)
}

/// Prometheus' CORS headers (its default `--web.cors.origin=.*`) on every API answer to a
/// request that names an origin, so in-browser clients (Grafana in browser mode) can read it.
async fn cors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let has_origin = req.headers().contains_key(axum::http::header::ORIGIN);
    // A preflight on any API path: 204, as Prometheus' `OPTIONS /api/v1/*path`.
    let mut resp = if req.method() == Method::OPTIONS && req.uri().path().starts_with("/api/v1/") {
        StatusCode::NO_CONTENT.into_response()
    } else {
        next.run(req).await
    };
    if has_origin {
        let h = resp.headers_mut();
        for (k, v) in [
            ("access-control-allow-headers", "Accept, Authorization, Content-Type, Origin"),
            ("access-control-allow-methods", "GET, POST, OPTIONS"),
            ("access-control-expose-headers", "Date"),
            ("vary", "Origin"),
            ("access-control-allow-origin", "*"),
        ] {
            h.insert(k, axum::http::HeaderValue::from_static(v));
        }
    }
    resp
}

/// Strata stores no exemplars: the answer is an empty list, as from a Prometheus without them.
async fn no_exemplars() -> Response {
    success(json!([]), vec![])
}

fn matchers_of(p: &Params) -> Result<Vec<Vec<Matcher>>, ApiError> {
    p.all("match[]")
        .iter()
        .map(|s| {
            strata_promql::selector::parse_selector(s)
                .map_err(|e| ApiError::bad_data(format!("invalid parameter \"match[]\": {e}")))
        })
        .collect()
}

/// The stores' part of a request: Thanos' `partial_response` and `dedup` parameters, both
/// on unless set false. Stores that neither fan out nor dedup ignore them.
fn scope_of(p: &Params) -> Result<QueryScope, ApiError> {
    let flag = |k: &str| match p.get(k) {
        None | Some("") | Some("true") | Some("1") => Ok(true),
        Some("false") | Some("0") => Ok(false),
        Some(v) => Err(ApiError::bad_data(format!("invalid parameter {k:?}: cannot parse {v:?} to a boolean"))),
    };
    let mut scope = QueryScope::new(flag("partial_response")?, flag("dedup")?);
    scope.max_source_resolution = max_source_resolution(p)?;
    Ok(scope)
}

/// Thanos' `max_source_resolution`: `auto` (or absent) lets the querier choose; `raw` or
/// `0s` reads raw data only; `5m`, `1h` (or any duration) caps the aggregates used.
fn max_source_resolution(p: &Params) -> Result<Option<i64>, ApiError> {
    match p.get("max_source_resolution") {
        None | Some("") | Some("auto") => Ok(None),
        Some("raw") => Ok(Some(0)),
        Some(s) => strata_model::duration::parse_duration_ms(s).map(Some).map_err(|e| {
            ApiError::bad_data(format!("invalid parameter \"max_source_resolution\": cannot parse {s:?}: {e}"))
        }),
    }
}

fn limit_of(p: &Params) -> Result<usize, ApiError> {
    match p.get("limit") {
        None | Some("") => Ok(0),
        Some(s) => s.parse::<usize>().map_err(|_| {
            ApiError::bad_data(format!("invalid parameter \"limit\": cannot parse {s:?} to a valid limit"))
        }),
    }
}

/// The `match[]` sets to query, or one empty set (no restriction) when none were given.
fn with_empty_set(sets: &[Vec<Matcher>]) -> Vec<&[Matcher]> {
    if sets.is_empty() {
        vec![&[]]
    } else {
        sets.iter().map(Vec::as_slice).collect()
    }
}

fn sort_dedup<T: Ord>(v: &mut Vec<T>) {
    v.sort();
    v.dedup();
}

fn truncate<T>(mut v: Vec<T>, limit: usize, warnings: &mut Vec<String>) -> Vec<T> {
    if limit > 0 && v.len() > limit {
        v.truncate(limit);
        warnings.push("results truncated due to limit".into());
    }
    v
}

async fn series(
    State(s): State<Arc<ApiState>>,
    method: Method,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = Params::from_request(&method, &headers, q.as_deref(), &body)?;
    let sets = matchers_of(&p)?;
    if sets.is_empty() {
        return Err(ApiError::bad_data("no match[] parameter provided"));
    }
    let (start, end) = p.range()?;
    if end < start {
        return Ok(success(json!([]), vec![]));
    }
    let scope = scope_of(&p)?;
    let mut all = Vec::new();
    for ms in &sets {
        all.extend(scope.clone().run(s.store.series(ms, start, end)).await?);
    }
    sort_dedup(&mut all);
    let mut warnings = scope.warnings();
    let all = truncate(all, limit_of(&p)?, &mut warnings);
    let data: Vec<Value> = all.iter().map(labels_json).collect();
    Ok(success(Value::Array(data), warnings))
}

pub fn labels_json(l: &strata_model::Labels) -> Value {
    let mut m = serde_json::Map::new();
    for x in l.iter() {
        m.insert(x.name.to_string(), Value::String(x.value.to_string()));
    }
    Value::Object(m)
}

async fn labels(
    State(s): State<Arc<ApiState>>,
    method: Method,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = Params::from_request(&method, &headers, q.as_deref(), &body)?;
    let sets = matchers_of(&p)?;
    let (start, end) = p.range()?;
    if end < start {
        return Ok(success(json!([]), vec![]));
    }
    let scope = scope_of(&p)?;
    let mut names = Vec::new();
    for ms in with_empty_set(&sets) {
        names.extend(scope.clone().run(s.store.label_names(ms, start, end)).await?);
    }
    sort_dedup(&mut names);
    let mut warnings = scope.warnings();
    let names = truncate(names, limit_of(&p)?, &mut warnings);
    Ok(success(json!(names), warnings))
}

async fn label_values(
    State(s): State<Arc<ApiState>>,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::from_request(&Method::GET, &HeaderMap::new(), q.as_deref(), &Bytes::new())?;
    if !strata_model::is_valid_label_name(&name) {
        return Err(ApiError::bad_data(format!("invalid label name: {name:?}")));
    }
    let sets = matchers_of(&p)?;
    let (start, end) = p.range()?;
    if end < start {
        return Ok(success(json!([]), vec![]));
    }
    let scope = scope_of(&p)?;
    let mut vals = Vec::new();
    for ms in with_empty_set(&sets) {
        vals.extend(scope.clone().run(s.store.label_values(&name, ms, start, end)).await?);
    }
    sort_dedup(&mut vals);
    let mut warnings = scope.warnings();
    let vals = truncate(vals, limit_of(&p)?, &mut warnings);
    Ok(success(json!(vals), warnings))
}

async fn metadata(State(s): State<Arc<ApiState>>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::from_request(&Method::GET, &HeaderMap::new(), q.as_deref(), &Bytes::new())?;
    // As Prometheus 3: `limit` absent or negative is no limit, 0 is an empty answer;
    // `limit_per_metric` must be a number (a family has one metadata entry here).
    let int = |k: &str| -> Result<i64, ApiError> {
        match p.get(k).filter(|s| !s.is_empty()) {
            None => Ok(-1),
            Some(s) => s.parse::<i64>().map_err(|_| ApiError::bad_data(format!("{k} must be a number"))),
        }
    };
    let limit = int("limit")?;
    int("limit_per_metric")?;
    let md = s.store.metadata(p.get("metric").filter(|m| !m.is_empty())).await?;
    let mut out = serde_json::Map::new();
    for (family, m) in md {
        if limit >= 0 && out.len() as i64 >= limit {
            break;
        }
        out.insert(family, json!([{"type": m.metric_type.as_str(), "help": m.help, "unit": m.unit}]));
    }
    Ok(success(Value::Object(out), vec![]))
}

/// The Prometheus release whose HTTP API Strata answers as: clients (Grafana) turn their
/// features on by this version.
pub const PROMETHEUS_API_VERSION: &str = "3.5.0";

async fn buildinfo() -> Response {
    success(
        json!({
            "version": PROMETHEUS_API_VERSION,
            "revision": env!("STRATA_GIT_REVISION"),
            "branch": env!("STRATA_GIT_BRANCH"),
            "buildUser": "strata",
            "buildDate": env!("STRATA_BUILD_DATE"),
            "goVersion": "none (Strata is written in Rust)",
            "strataVersion": env!("CARGO_PKG_VERSION"),
        }),
        vec![],
    )
}

#[cfg(test)]
mod tests;
