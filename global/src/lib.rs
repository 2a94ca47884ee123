//! The global tier's querier: `strata global --config FILE`.
//!
//! It reads the StoreAPI of edges and regionals (found by [`stores::StoreSet`] from a
//! static list, file SD and DNS), fans out over them ([`strata_fanout::Fanout`], partial
//! response by default), merges HA replicas ([`strata_dedup::ReplicaDedup`], on by
//! default) and answers the Prometheus HTTP API through the same engine and API code as
//! an edge. It serves the StoreAPI itself, without dedup and with its stores' label
//! sets, so globals can be stacked. `/api/v1/stores` lists the stores and their health;
//! `/api/v1/rules` and `/api/v1/alerts` merge every regional's ([`rules`]).
//! This crate is wiring only; every mechanism lives in a `shared/` crate.

pub mod config;
pub mod dns;
pub mod metrics;
pub mod rules;
pub mod stores;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use config::GlobalConfig;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use stores::StoreSet;
use strata_api::ApiOptions;
use strata_dedup::ReplicaDedup;
use strata_fanout::Fanout;
use strata_grpc::{pb, ServeOptions, StoreInfo, StoreService};
use strata_model::Labels;
use strata_server::{LiveWebConfig, ServerLimits, WebConfig};
use strata_store::{SelectLimits, Store};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Clone)]
pub struct GlobalOptions {
    pub config_path: PathBuf,
    pub http_listen: SocketAddr,
    pub grpc_listen: Option<SocketAddr>,
    /// TLS for the StoreAPI served on `grpc_listen` (`--grpc-server-tls-*`).
    pub grpc_tls: Option<strata_grpc::ServerTlsFiles>,
    /// `--query.replica-label`; when empty, the configuration's (default `replica`).
    pub replica_labels: Vec<String>,
    pub api: ApiOptions,
    pub server: ServerLimits,
}

impl GlobalOptions {
    pub fn new(config_path: PathBuf) -> Self {
        GlobalOptions {
            config_path,
            http_listen: ([127, 0, 0, 1], DEFAULT_HTTP_PORT).into(),
            grpc_listen: None,
            grpc_tls: None,
            replica_labels: Vec::new(),
            api: ApiOptions::default(),
            server: ServerLimits::default(),
        }
    }
}

pub const DEFAULT_HTTP_PORT: u16 = 9490;

#[derive(Debug, thiserror::Error)]
pub enum GlobalError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] strata_grpc::GrpcError),
}

pub struct Global {
    pub http_addr: SocketAddr,
    pub grpc_addr: Option<SocketAddr>,
    pub stores: Arc<StoreSet>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

struct GlobalState {
    stores: Arc<StoreSet>,
    metrics: Arc<metrics::GlobalMetrics>,
}

async fn self_metrics(State(s): State<Arc<GlobalState>>) -> Response {
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], s.metrics.encode(&s.stores))
        .into_response()
}

async fn stores_page(State(s): State<Arc<GlobalState>>) -> Response {
    axum::Json(serde_json::json!({"status": "success", "data": s.stores.status_json()})).into_response()
}

impl Global {
    pub async fn start(opts: GlobalOptions) -> Result<Global, GlobalError> {
        let mut cfg = GlobalConfig::load(&opts.config_path)?;
        if !opts.replica_labels.is_empty() {
            cfg.replica_labels = opts.replica_labels.clone();
        }
        let (interval, replica_labels, store_timeout, prefer) =
            (cfg.info_interval, cfg.replica_labels.clone(), cfg.store_timeout, cfg.aggregates);
        let fanout = Arc::new(Fanout::new(Vec::new(), cfg.store_timeout));
        // TLS files are read now: a missing or broken one stops the start, naming it.
        let client_tls = cfg.client_tls.as_ref().map(|t| t.load()).transpose()?;
        let server_tls = opts.grpc_tls.as_ref().map(|t| t.load()).transpose()?;
        let mut store_set = StoreSet::new(cfg, fanout.clone());
        if let Some(tls) = client_tls {
            store_set = store_set.with_client_tls(tls);
        }
        let stores = Arc::new(store_set);
        // The first round before serving, so the first queries know the stores' labels.
        stores.refresh().await;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        {
            let (stores, mut stop) = (stores.clone(), shutdown_rx.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(interval) => stores.refresh().await,
                        _ = stop.changed() => return,
                    }
                }
            }));
        }

        // Deduplicated raw data, and aggregates where they answer exactly.
        let dedup: Arc<dyn Store> = Arc::new(ReplicaDedup::new(fanout.clone(), replica_labels.clone()));
        // The raw steps between aggregate segments (the newest hours, usually) are evaluated
        // here from the deduplicated samples when no store can evaluate them.
        let same_dedup = ReplicaDedup::new(fanout.clone(), replica_labels.clone());
        let evaluator: Arc<dyn Store> = Arc::new(strata_promql::pushdown::Evaluating::new(same_dedup));
        let rules_replicas = replica_labels.clone();
        let planner = strata_downsample::ResolutionPlanner::new(dedup, fanout.clone(), replica_labels, store_timeout)
            .with_preference(prefer)
            .with_raw_evaluator(evaluator);
        let query_store: Arc<dyn Store> = Arc::new(planner);
        let global_metrics = metrics::GlobalMetrics::new();
        let tracked = global_metrics.clone();
        let app = Router::new()
            .route("/api/v1/stores", get(stores_page))
            .route("/metrics", get(self_metrics))
            .route("/-/healthy", get(|| async { "Strata global is Healthy.\n" }))
            .route("/-/ready", get(|| async { "Strata global is Ready.\n" }))
            .with_state(Arc::new(GlobalState { stores: stores.clone(), metrics: global_metrics }))
            .merge(rules::router(stores.clone(), rules_replicas, store_timeout))
            .merge(strata_api::router_with(query_store, opts.api.clone()))
            .layer(axum::middleware::from_fn(move |req, next| metrics::track(tracked.clone(), req, next)));
        let bind = |addr| async move {
            tokio::net::TcpListener::bind(addr).await.map_err(|source| GlobalError::Bind { addr, source })
        };
        let listener = bind(opts.http_listen).await?;
        let http_addr = listener.local_addr().map_err(|source| GlobalError::Bind { addr: opts.http_listen, source })?;
        {
            let (mut stop, limits) = (shutdown_rx.clone(), opts.server);
            tasks.push(tokio::spawn(async move {
                let stopped = async move {
                    let _ = stop.changed().await;
                };
                if let Err(e) =
                    strata_server::serve(listener, app, limits, LiveWebConfig::fixed(WebConfig::default()), stopped)
                        .await
                {
                    tracing::error!(error = %e, "global HTTP server failed");
                }
            }));
        }
        let grpc_addr = match opts.grpc_listen {
            Some(addr) => {
                let listener = bind(addr).await?;
                let bound = listener.local_addr().map_err(|source| GlobalError::Bind { addr, source })?;
                let info_stores = stores.clone();
                let info = Arc::new(move || {
                    // What every store below confirmed, or nothing: a global above must not
                    // skip this one for labels or times a store that did not answer holds.
                    let st = info_stores.status();
                    let confirmed = !st.is_empty() && st.iter().all(|s| s.healthy && !s.label_sets.is_empty());
                    if !confirmed {
                        return StoreInfo {
                            min_time: i64::MIN,
                            max_time: i64::MAX,
                            kind: pb::ComponentKind::Global,
                            label_sets: Vec::new(),
                            resolutions: Vec::new(),
                        };
                    }
                    StoreInfo {
                        min_time: st.iter().map(|s| s.min_time).min().unwrap_or(i64::MIN),
                        max_time: st.iter().map(|s| s.max_time).max().unwrap_or(i64::MAX),
                        kind: pb::ComponentKind::Global,
                        label_sets: st.iter().flat_map(|s| s.label_sets.clone()).collect(),
                        resolutions: Vec::new(),
                    }
                });
                let service = StoreService::new(fanout.clone(), Labels::default(), SelectLimits::default(), info);
                let mut stop = shutdown_rx.clone();
                tasks.push(tokio::spawn(async move {
                    let stopped = async move {
                        let _ = stop.changed().await;
                    };
                    let served = strata_grpc::serve(
                        listener,
                        service,
                        ServeOptions::new(Duration::from_secs(120)).with_tls(server_tls),
                        stopped,
                    );
                    if let Err(e) = served.await {
                        tracing::error!(error = %e, "global gRPC server failed");
                    }
                }));
                Some(bound)
            }
            None => None,
        };
        tracing::info!(http = %http_addr, grpc = ?grpc_addr, stores = stores.status().len(), "global started");
        Ok(Global { http_addr, grpc_addr, stores, shutdown, tasks })
    }

    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }
}
