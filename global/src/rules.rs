//! The global's `/api/v1/rules` and `/api/v1/alerts`: every regional's rules and alerts
//! (read over the rules API beside its StoreAPI) merged by [`strata_rules::merge`], with a
//! warning naming each regional that did not answer (or an error with
//! `partial_response=false`), so Grafana's alert views over the global never show a
//! region's alerts missing in silence. The rules the global runs itself (when its
//! configuration names rule files) are merged in as one more answer, and `/-/reload`
//! reloads them.

use crate::stores::StoreSet;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use strata_api::{ApiError, ErrorType};
use strata_rules::api::RulesFilter;
use strata_rules::remote::{request_from_pairs, RemoteRules, RemoteRulesError};
use strata_rules::tier::TierRules;

#[derive(Clone)]
struct RulesState {
    stores: Arc<StoreSet>,
    /// The rules this global runs itself.
    local: Option<Arc<TierRules>>,
    lifecycle: bool,
    replicas: Arc<Vec<String>>,
    timeout: Duration,
    /// Fan-outs at once: each may hold every regional's answer parsed.
    running: Arc<tokio::sync::Semaphore>,
}

/// Rules and alerts requests answered at once; more wait.
const CONCURRENT_REQUESTS: usize = 4;

/// The most of the warnings an error with `partial_response=false` carries.
const MAX_ERROR_BYTES: usize = 4096;

fn pairs(q: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(q.unwrap_or("").as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
}

/// How the global's own rules are named among the regionals' answers.
const LOCAL: &str = "this global";

/// `partial_response=false` turns a regional that did not answer into an error.
fn partial_allowed(pairs: &[(String, String)]) -> bool {
    !pairs.iter().any(|(k, v)| k == "partial_response" && matches!(v.as_str(), "false" | "0"))
}

/// Asks every regional at once; the answers, and a warning per regional that failed (and
/// per global below, whose regionals are not asked).
async fn ask<F, Fut>(s: &RulesState, call: F) -> (Vec<(String, Value)>, Vec<String>)
where
    F: Fn(RemoteRules) -> Fut,
    Fut: std::future::Future<Output = Result<Value, RemoteRulesError>> + Send + 'static,
{
    let (sources, globals) = s.stores.rule_sources();
    let mut warnings: Vec<String> = globals
        .iter()
        .map(|g| {
            format!(
                "store {g} is a global: the rules of the regionals behind it are not shown (list those regionals here)"
            )
        })
        .collect();
    let mut set = tokio::task::JoinSet::new();
    for (r, kind) in sources {
        let (name, answer, timeout) = (r.name().to_string(), call(r), s.timeout);
        set.spawn(async move {
            let got = tokio::time::timeout(timeout, answer).await.unwrap_or_else(|_| {
                Err(RemoteRulesError::Failed { store: name.clone(), message: format!("no answer within {timeout:?}") })
            });
            (name, kind, got)
        });
    }
    let mut answers = Vec::new();
    while let Some(done) = set.join_next().await {
        match done {
            Ok((name, _, Ok(v))) => answers.push((name, v)),
            // A regional without the rules API (an older version) runs rules unseen here.
            Ok((name, kind, Err(RemoteRulesError::Unimplemented { .. }))) if kind == "regional" => {
                warnings.push(format!(
                "store {name}: a regional without the rules API (an older version): its rules and alerts are not shown"
            ))
            }
            // Anything else without it (an edge) evaluates no rules: nothing is missing.
            Ok((_, _, Err(RemoteRulesError::Unimplemented { .. }))) => {}
            Ok((_, _, Err(e))) => warnings.push(e.to_string()),
            Err(e) => warnings.push(format!("a rules request failed: {e}")),
        }
    }
    // Stable output whatever order the answers came in.
    answers.sort_by(|a, b| a.0.cmp(&b.0));
    warnings.sort();
    (answers, warnings)
}

fn answer(data: Value, mut warnings: Vec<String>, more: Vec<String>, partial: bool) -> Response {
    warnings.extend(more);
    if !partial && !warnings.is_empty() {
        let mut message = warnings.join("; ");
        if message.len() > MAX_ERROR_BYTES {
            let mut end = MAX_ERROR_BYTES;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push_str(" ...");
        }
        return ApiError { kind: ErrorType::Unavailable, message }.into_response();
    }
    strata_api::success(data, warnings)
}

async fn rules_handler(State(s): State<RulesState>, RawQuery(q): RawQuery) -> Response {
    let Ok(_slot) = s.running.clone().acquire_owned().await else {
        return ApiError { kind: ErrorType::Unavailable, message: "shutting down".into() }.into_response();
    };
    let pairs = pairs(q.as_deref());
    // Checked here, so a bad filter is the client's 400 and not a warning per regional.
    if let Err(e) = RulesFilter::from_pairs(&pairs) {
        return ApiError::bad_data(e).into_response();
    }
    let req = request_from_pairs(&pairs);
    let (mut answers, failed) = ask(&s, move |r| {
        let req = req.clone();
        async move { r.rules(req).await }
    })
    .await;
    if let (Some(local), Ok(filter)) = (&s.local, RulesFilter::from_pairs(&pairs)) {
        let m = local.manager();
        answers.push((LOCAL.to_string(), strata_rules::api::rules(m, &filter, m.external_labels()).await));
    }
    let (data, malformed) = strata_rules::merge::merge_rules(answers, &s.replicas);
    answer(data, failed, malformed, partial_allowed(&pairs))
}

async fn alerts_handler(State(s): State<RulesState>, RawQuery(q): RawQuery) -> Response {
    let Ok(_slot) = s.running.clone().acquire_owned().await else {
        return ApiError { kind: ErrorType::Unavailable, message: "shutting down".into() }.into_response();
    };
    let pairs = pairs(q.as_deref());
    let (mut answers, failed) = ask(&s, |r| async move { r.alerts().await }).await;
    if let Some(local) = &s.local {
        let m = local.manager();
        answers.push((LOCAL.to_string(), strata_rules::api::alerts(m, m.external_labels()).await));
    }
    let (data, malformed) = strata_rules::merge::merge_alerts(answers, &s.replicas);
    answer(data, failed, malformed, partial_allowed(&pairs))
}

async fn reload_handler(State(s): State<RulesState>) -> Response {
    let (code, body) = strata_rules::tier::reload_answer(s.local.as_deref(), s.lifecycle, "global").await;
    (axum::http::StatusCode::from_u16(code).unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR), body)
        .into_response()
}

pub fn router(
    stores: Arc<StoreSet>,
    local: Option<Arc<TierRules>>,
    replicas: Vec<String>,
    timeout: Duration,
    lifecycle: bool,
) -> Router {
    Router::new()
        .route("/api/v1/rules", get(rules_handler))
        .route("/api/v1/alerts", get(alerts_handler))
        .route("/-/reload", axum::routing::post(reload_handler).put(reload_handler))
        .with_state(RulesState {
            stores,
            local,
            lifecycle,
            replicas: Arc::new(replicas),
            timeout,
            running: Arc::new(tokio::sync::Semaphore::new(CONCURRENT_REQUESTS)),
        })
}
