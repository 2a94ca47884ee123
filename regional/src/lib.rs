//! The regional tier's wiring. Edges forward everything they store to a regional (both
//! replicas of each HA pair to the same one): its `Forward` receiver
//! ([`strata_forward::ForwardReceiver`]) appends each batch to the regional's own database
//! and acknowledges it once it is `fsync`ed, so an edge can let go of nothing it has not
//! seen acknowledged. Series keep their edge's external labels exactly (the regional adds
//! none), so a series reaches the global with the same labels from either tier. The
//! regional serves the Prometheus HTTP API over that database and the StoreAPI (kind
//! `REGIONAL`) on the same gRPC port as the receiver, and takes Prometheus remote write
//! on `/api/v1/write` (`strata_receive`) from senders that are not edges.
//!
//! Downsampling and rules build on this in their own crates; only the wiring and loops of
//! the tier belong here.

pub mod config;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use config::{ConfigError, RegionalConfig};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use strata_api::ApiOptions;
use strata_forward::{ForwardReceiver, StorageId};
use strata_grpc::{ServeOptions, StoreInfo, StoreService};
use strata_model::Labels;
use strata_server::{LiveWebConfig, ServerLimits, WebConfig, WebConfigError};
use strata_store::SelectLimits;
use strata_tsdb::db::{Tsdb, TsdbError, TsdbOptions};
use strata_tsdb::TsdbStore;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub const DEFAULT_HTTP_LISTEN: &str = "127.0.0.1:9491";
pub const DEFAULT_GRPC_LISTEN: &str = "127.0.0.1:9492";
pub const DEFAULT_DATA_DIR: &str = "strata-data/regional";

/// The longest a StoreAPI call or a forwarded batch may take.
const GRPC_MAX_REQUEST: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
pub struct RegionalOptions {
    pub config_path: PathBuf,
    pub http_listen: Option<SocketAddr>,
    /// Where edges forward to and globals read the StoreAPI.
    pub grpc_listen: Option<SocketAddr>,
    pub grpc_tls: Option<strata_grpc::ServerTlsFiles>,
    pub data_dir: Option<PathBuf>,
    pub api: ApiOptions,
    pub server: ServerLimits,
    /// Prometheus' `--web.config.file`: TLS and basic auth of the HTTP API.
    pub web_config: Option<PathBuf>,
    /// Prometheus' `--web.enable-lifecycle`: `POST /-/quit` stops the regional.
    pub enable_lifecycle: bool,
}

impl RegionalOptions {
    pub fn new(config_path: PathBuf) -> Self {
        RegionalOptions {
            config_path,
            http_listen: None,
            grpc_listen: None,
            grpc_tls: None,
            data_dir: None,
            api: ApiOptions::default(),
            server: ServerLimits::default(),
            web_config: None,
            enable_lifecycle: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RegionalError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("opening the database in {dir}: {source}")]
    Open {
        dir: PathBuf,
        #[source]
        source: TsdbError,
    },
    #[error(transparent)]
    StorageId(#[from] strata_forward::ForwardError),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("a startup task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    WebConfig(#[from] WebConfigError),
    #[error("gRPC: {0}")]
    Grpc(#[from] strata_grpc::GrpcError),
}

struct RegionalState {
    db: Arc<Tsdb>,
    registry: Registry,
    enable_lifecycle: bool,
    quit: watch::Sender<bool>,
}

/// A running regional.
pub struct Regional {
    pub http_addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    pub scheme: &'static str,
    pub db: Arc<Tsdb>,
    pub received: strata_forward::ReceiverStats,
    shutdown: watch::Sender<bool>,
    quit: watch::Receiver<bool>,
    tasks: Vec<JoinHandle<()>>,
    servers: Vec<JoinHandle<()>>,
}

fn parse_default(addr: &str) -> SocketAddr {
    addr.parse().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
}

impl Regional {
    pub async fn start(opts: RegionalOptions) -> Result<Regional, RegionalError> {
        let cfg = RegionalConfig::load(&opts.config_path)?;
        let web = match &opts.web_config {
            Some(p) => LiveWebConfig::load(p.clone())?,
            None => LiveWebConfig::fixed(WebConfig::default()),
        };
        let scheme = if web.current().tls.is_some() { "https" } else { "http" };
        let data_dir = opts
            .data_dir
            .clone()
            .or_else(|| cfg.strata.data_dir.clone())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        // Checked when the file loaded.
        let tsdb_opts = cfg.storage_settings().apply(TsdbOptions::default()).unwrap_or_default();
        tracing::info!(data = %data_dir.display(), "opening the regional database and replaying its WAL");
        let dir = data_dir.clone();
        let opened = tokio::task::spawn_blocking(move || Tsdb::open(&dir, tsdb_opts)).await?;
        let db = Arc::new(opened.map_err(|source| RegionalError::Open { dir: data_dir.clone(), source })?);
        let id = StorageId::load_or_create(&data_dir)?;
        let receiver = ForwardReceiver::new(db.clone(), id.clone());
        let received = receiver.stats();
        let mut registry = Registry::with_prefix("strata");
        db.metrics().register(&mut registry);
        received.register(&mut registry);
        // Prometheus (or anything that speaks remote write 1.0) can write here too.
        let receive = Arc::new(strata_receive::ReceiveMetrics::default());
        receive.register(&mut registry);
        let remote_write = Arc::new(strata_receive::RemoteWrite::new(db.clone(), receive, Default::default()));

        let (shutdown, shutdown_rx) = watch::channel(false);
        let tasks = strata_tsdb::loops::spawn(&db);
        let mut servers = Vec::new();

        let grpc = opts.grpc_listen.unwrap_or_else(|| parse_default(DEFAULT_GRPC_LISTEN));
        let listener =
            tokio::net::TcpListener::bind(grpc).await.map_err(|source| RegionalError::Bind { addr: grpc, source })?;
        let grpc_addr = listener.local_addr().map_err(|source| RegionalError::Bind { addr: grpc, source })?;
        let info_db = db.clone();
        let info = Arc::new(move || {
            let (min_time, max_time) = info_db.advertised_range();
            StoreInfo { min_time, max_time, kind: strata_grpc::pb::ComponentKind::Regional, label_sets: Vec::new(), resolutions: Vec::new() }
        });
        // No external labels of its own: every series carries its edge's.
        let store =
            StoreService::new(Arc::new(TsdbStore(db.clone())), Labels::default(), SelectLimits::default(), info);
        let tls = opts.grpc_tls.as_ref().map(|t| t.load()).transpose()?;
        let others = tonic::service::Routes::new(receiver.with_connections(store.connections()).into_server());
        let mut rx = shutdown_rx.clone();
        servers.push(tokio::spawn(async move {
            let stop = async move {
                let _ = rx.changed().await;
            };
            let opts = ServeOptions::new(GRPC_MAX_REQUEST).with_tls(tls);
            if let Err(e) = strata_grpc::serve_with(listener, store, others, opts, stop).await {
                tracing::error!(error = %e, "regional gRPC server failed");
            }
        }));

        let http = opts.http_listen.unwrap_or_else(|| parse_default(DEFAULT_HTTP_LISTEN));
        let listener =
            tokio::net::TcpListener::bind(http).await.map_err(|source| RegionalError::Bind { addr: http, source })?;
        let http_addr = listener.local_addr().map_err(|source| RegionalError::Bind { addr: http, source })?;
        let (quit, quit_rx) = watch::channel(false);
        let state = Arc::new(RegionalState { db: db.clone(), registry, enable_lifecycle: opts.enable_lifecycle, quit });
        let app = Router::new()
            .route("/metrics", get(self_metrics))
            .route("/-/quit", axum::routing::post(quit_handler).put(quit_handler))
            .route("/-/healthy", get(|| async { "Strata regional is Healthy.\n" }))
            .route("/-/ready", get(ready))
            .with_state(state)
            .merge(strata_receive::router(remote_write))
            .merge(strata_api::router_with(Arc::new(TsdbStore(db.clone())), opts.api.clone()));
        let mut rx = shutdown_rx.clone();
        let limits = opts.server;
        servers.push(tokio::spawn(async move {
            let stop = async move {
                let _ = rx.changed().await;
            };
            if let Err(e) = strata_server::serve(listener, app, limits, web, stop).await {
                tracing::error!(error = %e, "regional HTTP server failed");
            }
        }));
        tracing::info!(http = %http_addr, grpc = %grpc_addr, storage_id = %id.0, data = %data_dir.display(), "regional started");
        Ok(Regional { http_addr, grpc_addr, scheme, db, received, shutdown, quit: quit_rx, tasks, servers })
    }

    /// Resolves once `POST /-/quit` asked the regional to stop (with the lifecycle API on).
    pub async fn quit_requested(&self) {
        let mut rx = self.quit.clone();
        let _ = rx.wait_for(|q| *q).await;
    }

    /// Stops the servers (a batch being stored finishes or is not acknowledged), then the
    /// database, writing a head checkpoint.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for s in self.servers {
            let _ = s.await;
        }
        for t in &self.tasks {
            t.abort();
        }
        let db = self.db.clone();
        match tokio::task::spawn_blocking(move || db.shutdown()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "head checkpoint at shutdown failed: the next start replays the WAL")
            }
            Err(e) => tracing::error!(error = %e, "database shutdown task failed"),
        }
    }
}

/// Prometheus' `/-/quit`: opt-in, as there.
async fn quit_handler(State(s): State<Arc<RegionalState>>) -> Response {
    if !s.enable_lifecycle {
        return (axum::http::StatusCode::FORBIDDEN, "Lifecycle API is not enabled.\n").into_response();
    }
    let _ = s.quit.send(true);
    (axum::http::StatusCode::OK, "Requesting termination... Goodbye!\n").into_response()
}

/// Ready while the WAL can be written and storage maintenance succeeds: a regional that
/// cannot store what it receives says so (and acknowledges nothing).
async fn ready(State(s): State<Arc<RegionalState>>) -> Response {
    if !s.db.is_writable() {
        (StatusCode::SERVICE_UNAVAILABLE, "Strata regional is not ready: the WAL cannot be written.\n").into_response()
    } else if !s.db.is_healthy() {
        (StatusCode::SERVICE_UNAVAILABLE, "Strata regional is not ready: storage maintenance failed; see the log.\n")
            .into_response()
    } else {
        "Strata regional is Ready.\n".into_response()
    }
}

async fn self_metrics(State(s): State<Arc<RegionalState>>) -> Response {
    s.db.metrics().refresh(&s.db);
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &s.registry).is_err() {
        text.push_str("# encoding self-metrics failed\n");
    }
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}
