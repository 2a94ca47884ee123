//! The regional's rules: `strata_rules` over the deduplicated view of its own storage,
//! writing into that storage (with the regional's external labels, so a rule's series
//! reaches the global as any other does), alerts to the configured Alertmanagers, and the
//! HTTP routes (`/api/v1/rules`, `/api/v1/alerts`, `/-/reload`) and SIGHUP reloads.

use crate::config::RegionalConfig;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;
use strata_model::Labels;
use strata_rules::manager::RuleOptions;
use strata_rules::tier::TierRules;
use strata_tsdb::db::Tsdb;
use strata_tsdb::TsdbStore;

/// Starts the rules when the file names rule files: loads them (an error at start is
/// fatal, as in Prometheus) and runs their groups.
pub async fn start(
    cfg: &RegionalConfig,
    db: Arc<Tsdb>,
    replicas: Vec<String>,
    on_stored: Option<strata_rules::tier::OnStored>,
    opts: RuleOptions,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> Result<Option<Arc<TierRules>>, String> {
    // One alert per GPU, not per replica: rules read what the dedup merges.
    let raw: Arc<dyn strata_store::Store> = Arc::new(TsdbStore(db.clone()));
    let store = Arc::new(strata_dedup::ReplicaDedup::new(raw, replicas));
    let read: strata_rules::tier::ReadConfig =
        Arc::new(|p| RegionalConfig::load(p).map(|c| c.rules_config()).map_err(|e| e.to_string()));
    TierRules::start(cfg.rules_config(), read, "regional", store, db, on_stored, opts, stopped).await
}

#[derive(Clone)]
struct RulesState {
    rules: Option<Arc<TierRules>>,
    lifecycle: bool,
}

fn success(data: serde_json::Value) -> Response {
    axum::Json(serde_json::json!({ "status": "success", "data": data })).into_response()
}

fn bad_request(msg: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(serde_json::json!({ "status": "error", "errorType": "bad_data", "error": msg })),
    )
        .into_response()
}

async fn rules_handler(State(s): State<RulesState>, RawQuery(q): RawQuery) -> Response {
    let pairs: Vec<(String, String)> = form_pairs(q.as_deref().unwrap_or(""));
    let filter = match strata_rules::api::RulesFilter::from_pairs(&pairs) {
        Ok(f) => f,
        Err(e) => return bad_request(e),
    };
    match &s.rules {
        Some(r) => success(strata_rules::api::rules(r.manager(), &filter, &Labels::default()).await),
        None => success(serde_json::json!({ "groups": [] })),
    }
}

async fn alerts_handler(State(s): State<RulesState>) -> Response {
    match &s.rules {
        Some(r) => success(strata_rules::api::alerts(r.manager(), &Labels::default()).await),
        None => success(serde_json::json!({ "alerts": [] })),
    }
}

async fn reload_handler(State(s): State<RulesState>) -> Response {
    let (code, body) = strata_rules::tier::reload_answer(s.rules.as_deref(), s.lifecycle, "regional").await;
    (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body).into_response()
}

/// `a=b&c=d` decoded.
fn form_pairs(q: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(q.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
}

pub fn router(rules: Option<Arc<TierRules>>, lifecycle: bool) -> Router {
    Router::new()
        .route("/api/v1/rules", get(rules_handler))
        .route("/api/v1/alerts", get(alerts_handler))
        .route("/-/reload", post(reload_handler).put(reload_handler))
        .with_state(RulesState { rules, lifecycle })
}
