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
            // A series storage will not create (its series limit reached) refuses its
            // sample alone, counted and logged, not the rule's whole output.
            let mut refused = 0usize;
            for (l, s) in samples {
                let l = if external.is_empty() { l } else { strata_rules::with_external(&l, &external) };
                match db.series(&l) {
                    Ok(id) => batch.push((id, s)),
                    Err(e) => {
                        if refused == 0 {
                            tracing::warn!(series = %l, error = %e, "rule output refused by storage");
                        }
                        refused += 1;
                    }
                }
            }
            let out = db.commit(&batch).map_err(|e| e.to_string())?;
            Ok(out.rejected.len() + refused)
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
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> Result<Option<Arc<RuleManager>>, String> {
    if cfg.rule_files.is_empty() {
        return Ok(None);
    }
    let external = external_labels(cfg);
    let metrics = RuleMetrics::default();
    let notifier = if cfg.alerting.alertmanagers.is_empty() {
        None
    } else {
        let base = cfg.path.parent().map(|p| p.to_path_buf()).unwrap_or_default();
        Some(Notifier::new(&cfg.alerting, &base, external.clone(), metrics.clone())?)
    };
    opts.external_labels = external.clone();
    // Zero is Prometheus' "not set": its default of one minute stands.
    if let Some(i) = cfg.global.evaluation_interval.filter(|i| !i.0.is_zero()) {
        opts.default_interval = i.0;
    }
    if let Some(o) = cfg.global.rule_query_offset {
        opts.default_query_offset = o.0;
    }
    // One alert per GPU, not per replica: rules read what the dedup merges.
    let raw: Arc<dyn strata_store::Store> = Arc::new(TsdbStore(db.clone()));
    let store = Arc::new(strata_dedup::ReplicaDedup::new(raw.clone(), replicas));
    let sink = Arc::new(TsdbSink { db, external });
    let base = cfg.path.parent().map(|p| p.to_path_buf()).unwrap_or_default();
    let m = RuleManager::new(opts, cfg.rule_files.clone(), base, store, sink, notifier, metrics);
    // `for` state is read back as stored, with every external label (a replica label
    // included), not through the dedup that drops replica labels.
    m.set_state_store(raw);
    m.reload().await.map_err(|errs| errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))?;
    let (hup, started) = (m.clone(), Arc::new(cfg.clone()));
    tokio::spawn(async move {
        let Ok(mut signal) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP: rules reload only through /-/reload");
            return;
        };
        // Ends with the regional: it holds the manager, and through it the database.
        loop {
            tokio::select! {
                got = signal.recv() => {
                    if got.is_none() {
                        return;
                    }
                    tracing::info!("SIGHUP: reloading the configuration's rule files");
                    let _ = reload(&hup, &started).await;
                }
                _ = stopped.changed() => return,
            }
        }
    });
    Ok(Some(m))
}

/// A reload (SIGHUP, `/-/reload`): the configuration file read again for its
/// `rule_files`, then the rule files. A broken file, configuration or rules, keeps the
/// rules as they are. Changes to `global` or `alerting` take a restart, and the log says so.
pub async fn reload(m: &Arc<RuleManager>, started: &RegionalConfig) -> Result<(), String> {
    let path = started.path.clone();
    let read = tokio::task::spawn_blocking(move || RegionalConfig::load(&path)).await.map_err(|e| e.to_string())?;
    match read {
        Ok(new) => {
            if format!("{:?}", (&new.global, &new.alerting)) != format!("{:?}", (&started.global, &started.alerting)) {
                tracing::warn!(config = %started.path.display(), "the `global` or `alerting` section changed: that takes a restart of the regional; rule files reload now");
            }
            m.set_patterns(new.rule_files);
        }
        Err(e) => {
            let msg = format!("reading {}: {e}", started.path.display());
            m.reload_failed(msg.clone());
            return Err(msg);
        }
    }
    m.reload().await.map_err(|errs| errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))
}

#[derive(Clone)]
struct RulesState {
    manager: Option<Arc<RuleManager>>,
    /// The configuration as the regional started with it.
    config: Arc<RegionalConfig>,
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
        Some(m) => success(strata_rules::api::rules(m, &filter, &Labels::default()).await),
        None => success(serde_json::json!({ "groups": [] })),
    }
}

async fn alerts_handler(State(s): State<RulesState>) -> Response {
    match &s.manager {
        Some(m) => success(strata_rules::api::alerts(m, &Labels::default()).await),
        None => success(serde_json::json!({ "alerts": [] })),
    }
}

async fn reload_handler(State(s): State<RulesState>) -> Response {
    if !s.lifecycle {
        return (StatusCode::FORBIDDEN, "Lifecycle API is not enabled.\n").into_response();
    }
    match &s.manager {
        None => "no rule files configured at start: rules take a restart of the regional\n".into_response(),
        Some(m) => match reload(m, &s.config).await {
            Ok(()) => "rules reloaded\n".into_response(),
            Err(msg) => {
                (StatusCode::INTERNAL_SERVER_ERROR, format!("failed to reload rules, the previous rules stay: {msg}\n"))
                    .into_response()
            }
        },
    }
}

/// `a=b&c=d` decoded.
fn form_pairs(q: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(q.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
}

pub fn router(manager: Option<Arc<RuleManager>>, config: &RegionalConfig, lifecycle: bool) -> Router {
    Router::new()
        .route("/api/v1/rules", get(rules_handler))
        .route("/api/v1/alerts", get(alerts_handler))
        .route("/-/reload", post(reload_handler).put(reload_handler))
        .with_state(RulesState { manager, config: Arc::new(config.clone()), lifecycle })
}
