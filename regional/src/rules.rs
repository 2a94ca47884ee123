//! The regional's rules: `strata_rules` over the deduplicated view of its own storage,
//! writing into that storage (with the regional's external labels, so a rule's series
//! reaches the global as any other does), alerts to the configured Alertmanagers, and the
//! HTTP routes (`/api/v1/rules`, `/api/v1/alerts`, `/-/reload`) and SIGHUP reloads.

use crate::config::RegionalConfig;
use async_trait::async_trait;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;
use strata_model::{Labels, Sample};
use strata_rules::group::RuleSink;
use strata_rules::manager::{RuleManager, RuleOptions};
use strata_rules::metrics::RuleMetrics;
use strata_rules::notifier::Notifier;
use strata_tsdb::db::Tsdb;
use strata_tsdb::TsdbStore;

/// Rule output into the regional's database, the external labels added where a result
/// lacks them.
struct TsdbSink {
    db: Arc<Tsdb>,
    external: Labels,
}

#[async_trait]
impl RuleSink for TsdbSink {
    async fn append(&self, samples: Vec<(Labels, Sample)>) -> Result<usize, String> {
        let (db, external) = (self.db.clone(), self.external.clone());
        tokio::task::spawn_blocking(move || {
            let mut batch = Vec::with_capacity(samples.len());
            for (l, s) in samples {
                let l = if external.is_empty() {
                    l
                } else {
                    let mut b = l.to_builder();
                    for x in external.iter() {
                        if b.get(&x.name).is_none() {
                            b.set_shared(x.name.clone(), x.value.clone());
                        }
                    }
                    b.build()
                };
                batch.push((db.series(&l).map_err(|e| format!("series {l}: {e}"))?, s));
            }
            let out = db.commit(&batch).map_err(|e| e.to_string())?;
            Ok(out.rejected.len())
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

/// The external labels of the `global` section.
pub fn external_labels(cfg: &RegionalConfig) -> Labels {
    Labels::from_pairs(cfg.global.external_labels.iter())
}

/// Starts the rules when the file names rule files: loads them (an error at start is
/// fatal, as in Prometheus) and runs their groups.
pub async fn start(
    cfg: &RegionalConfig,
    db: Arc<Tsdb>,
    replicas: Vec<String>,
    mut opts: RuleOptions,
) -> Result<Option<Arc<RuleManager>>, String> {
    if cfg.rule_files.is_empty() {
        return Ok(None);
    }
    let external = external_labels(cfg);
    let metrics = RuleMetrics::default();
    let notifier = if cfg.alerting.alertmanagers.is_empty() {
        None
    } else {
        Some(Notifier::new(&cfg.alerting, external.clone(), metrics.clone())?)
    };
    opts.external_labels = external.clone();
    if let Some(i) = cfg.global.evaluation_interval {
        opts.default_interval = i.0;
    }
    // One alert per GPU, not per replica: rules read what the dedup merges.
    let store = Arc::new(strata_dedup::ReplicaDedup::new(Arc::new(TsdbStore(db.clone())), replicas));
    let sink = Arc::new(TsdbSink { db, external });
    let base = cfg.path.parent().map(|p| p.to_path_buf()).unwrap_or_default();
    let m = RuleManager::new(opts, cfg.rule_files.clone(), base, store, sink, notifier, metrics);
    m.reload().await.map_err(|errs| errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))?;
    let hup = m.clone();
    tokio::spawn(async move {
        let Ok(mut signal) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP: rules reload only through /-/reload");
            return;
        };
        while signal.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading rule files");
            let _ = hup.reload().await;
        }
    });
    Ok(Some(m))
}

#[derive(Clone)]
struct RulesState {
    manager: Option<Arc<RuleManager>>,
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
    match &s.manager {
        Some(m) => success(strata_rules::api::rules(m, &filter).await),
        None => success(serde_json::json!({ "groups": [] })),
    }
}

async fn alerts_handler(State(s): State<RulesState>) -> Response {
    match &s.manager {
        Some(m) => success(strata_rules::api::alerts(m).await),
        None => success(serde_json::json!({ "alerts": [] })),
    }
}

async fn reload_handler(State(s): State<RulesState>) -> Response {
    if !s.lifecycle {
        return (StatusCode::FORBIDDEN, "Lifecycle API is not enabled.\n").into_response();
    }
    match &s.manager {
        None => "no rule files configured: nothing to reload\n".into_response(),
        Some(m) => match m.reload().await {
            Ok(()) => "rules reloaded\n".into_response(),
            Err(errs) => {
                let msg: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("failed to reload rules, the previous rules stay: {}\n", msg.join("; ")),
                )
                    .into_response()
            }
        },
    }
}

/// `a=b&c=d` decoded.
fn form_pairs(q: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(q.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
}

pub fn router(manager: Option<Arc<RuleManager>>, lifecycle: bool) -> Router {
    Router::new()
        .route("/api/v1/rules", get(rules_handler))
        .route("/api/v1/alerts", get(alerts_handler))
        .route("/-/reload", post(reload_handler).put(reload_handler))
        .with_state(RulesState { manager, lifecycle })
}
