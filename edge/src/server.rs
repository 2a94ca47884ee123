//! Wiring of one edge: opens the database (replaying the WAL), starts the scrape manager,
//! the WAL fsync and retention loops, and the HTTP server; reloads on SIGHUP and
//! `POST /-/reload` (a bad new configuration is refused and the running one kept).

use crate::config::{ConfigError, EdgeConfig};
use crate::manager::ScrapeManager;
use crate::metrics::{EdgeMetrics, ReasonLabel};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use strata_api::ApiOptions;
use strata_grpc::{ServeOptions, StoreInfo, StoreService};
use strata_model::Labels;
use strata_receive::{RemoteWrite, WriteLimits};
use strata_server::{LiveWebConfig, ServerLimits, WebConfig, WebConfigError};
use strata_store::SelectLimits;
use strata_tsdb::db::{Tsdb, TsdbError, TsdbOptions};
use strata_tsdb::TsdbStore;
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Clone)]
pub struct EdgeOptions {
    pub config_path: PathBuf,
    pub http_listen: Option<SocketAddr>,
    /// Where the StoreAPI (gRPC) is served; not served when `None`.
    pub grpc_listen: Option<SocketAddr>,
    /// TLS for the StoreAPI (`--grpc-server-tls-*`).
    pub grpc_tls: Option<strata_grpc::ServerTlsFiles>,
    pub data_dir: Option<PathBuf>,
    /// How often file-SD files are checked for changes.
    pub file_sd_check: Duration,
    /// How the query API runs queries (concurrency, engine limits).
    pub api: ApiOptions,
    /// Connection cap and timeouts of the HTTP server.
    pub server: ServerLimits,
    /// Allow `POST /-/reload` (off by default, as in Prometheus).
    pub enable_lifecycle: bool,
    /// Prometheus' `--web.config.file`: TLS and basic auth.
    pub web_config: Option<PathBuf>,
}

impl EdgeOptions {
    pub fn new(config_path: PathBuf) -> Self {
        EdgeOptions {
            config_path,
            http_listen: None,
            grpc_listen: None,
            grpc_tls: None,
            data_dir: None,
            file_sd_check: Duration::from_secs(5),
            api: ApiOptions::default(),
            server: ServerLimits::default(),
            enable_lifecycle: false,
            web_config: None,
        }
    }
}

pub const DEFAULT_HTTP_LISTEN: &str = "127.0.0.1:9401";
pub const DEFAULT_DATA_DIR: &str = "strata-data/edge";

pub struct EdgeState {
    pub db: Arc<Tsdb>,
    pub metrics: Arc<EdgeMetrics>,
    pub manager: Arc<ScrapeManager>,
    pub config_path: PathBuf,
    pub remote_write: Arc<RemoteWrite>,
    pub api: ApiOptions,
    /// `POST /-/reload` allowed (Prometheus' `--web.enable-lifecycle`).
    pub enable_lifecycle: bool,
}

impl EdgeState {
    /// Re-reads the configuration file; on error the running configuration stays.
    pub async fn reload(&self) -> Result<(), ConfigError> {
        let result = EdgeConfig::load(&self.config_path);
        let ok = result.is_ok();
        self.metrics
            .config_reloads
            .get_or_create(&ReasonLabel { reason: if ok { "success" } else { "failure" }.into() })
            .inc();
        self.metrics.config_last_reload_success.set(ok as i64);
        match result {
            Ok(cfg) => {
                self.manager.apply(Arc::new(cfg)).await;
                tracing::info!(path = %self.config_path.display(), "configuration reloaded");
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, "configuration reload failed; keeping the running configuration");
                Err(e)
            }
        }
    }
}

pub fn router(state: Arc<EdgeState>) -> Router {
    Router::new()
        .route("/metrics", get(self_metrics))
        .route("/-/healthy", get(|| async { "Strata edge is Healthy.\n" }))
        .route("/-/ready", get(ready))
        .route("/-/reload", post(reload).put(reload))
        .with_state(state.clone())
        .merge(strata_receive::router(state.remote_write.clone()))
        .merge(strata_api::router_with(Arc::new(TsdbStore(state.db.clone())), state.api.clone()))
}

/// Ready while the database can write its WAL and its last storage maintenance (block cut,
/// compaction, retention) succeeded: after a failed WAL write the edge takes nothing it
/// could lose, and says so here until a write succeeds again.
async fn ready(State(s): State<Arc<EdgeState>>) -> Response {
    if !s.db.is_writable() {
        (StatusCode::SERVICE_UNAVAILABLE, "Strata edge is not ready: the WAL cannot be written.\n").into_response()
    } else if !s.db.is_healthy() {
        let msg =
            "Strata edge is not ready: storage maintenance (block cut, compaction or retention) failed; see the log.\n";
        (StatusCode::SERVICE_UNAVAILABLE, msg).into_response()
    } else {
        "Strata edge is Ready.\n".into_response()
    }
}

async fn self_metrics(State(s): State<Arc<EdgeState>>) -> Response {
    s.db.metrics().refresh(&s.db);
    let newest = s.db.max_time();
    if newest > i64::MIN {
        s.metrics.remote_write.highest_timestamp.set(newest as f64 / 1000.0);
    }
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], s.metrics.encode())
        .into_response()
}

async fn reload(State(s): State<Arc<EdgeState>>) -> Response {
    if !s.enable_lifecycle {
        // Prometheus' answer: reloading over HTTP is opt-in.
        return (StatusCode::FORBIDDEN, "Lifecycle API is not enabled.\n").into_response();
    }
    match s.reload().await {
        Ok(()) => (StatusCode::OK, "configuration reloaded\n").into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("failed to reload config: {e}\n")).into_response(),
    }
}

/// Why an edge could not start.
#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("opening the database in {dir}: {source}")]
    Open {
        dir: PathBuf,
        #[source]
        source: TsdbError,
    },
    #[error("binding the HTTP listener {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("a startup task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    WebConfig(#[from] WebConfigError),
    #[error("StoreAPI: {0}")]
    Grpc(#[from] strata_grpc::GrpcError),
    #[error(transparent)]
    RemoteWrite(strata_remote_write::RemoteWriteError),
    #[error("strata.forward upstream {upstream}: {source}")]
    Forward {
        upstream: String,
        #[source]
        source: strata_grpc::GrpcError,
    },
}

/// The data directory: the flag's, else the configuration's, else the default.
pub(crate) fn data_dir_of(opts: &EdgeOptions, cfg: &EdgeConfig) -> PathBuf {
    opts.data_dir.clone().or_else(|| cfg.strata.data_dir.clone()).unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
}

/// A running edge.
pub struct Edge {
    pub http_addr: SocketAddr,
    /// The StoreAPI's address, when served.
    pub grpc_addr: Option<SocketAddr>,
    /// `https` with a web config that sets up TLS, else `http`.
    pub scheme: &'static str,
    pub state: Arc<EdgeState>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// Forwarders and remote writes: given [`SHUTDOWN_GRACE`] to finish a round at stop.
    forwarders: Vec<JoinHandle<()>>,
    server: JoinHandle<()>,
}

pub(crate) fn tsdb_options(cfg: &EdgeConfig) -> TsdbOptions {
    // `wal_fsync` was checked when the configuration loaded.
    let mut o = cfg.storage_settings().apply(TsdbOptions::default()).unwrap_or_default();
    // Forwarders read the WAL from any segment: each names its series' labels.
    o.wal_labels_per_segment = !cfg.strata.forward.is_empty() || !cfg.remote_write.is_empty();
    o
}

/// Serves the StoreAPI over the database on `addr`, with the configuration's external
/// labels (read at start: changing them takes a restart, as a store's identity should).
async fn spawn_store_api(
    addr: SocketAddr,
    db: &Arc<Tsdb>,
    cfg: &EdgeConfig,
    tls: Option<strata_grpc::ServerTlsConfig>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<SocketAddr, EdgeError> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| EdgeError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(|source| EdgeError::Bind { addr, source })?;
    let external = Labels::from_pairs(cfg.external_labels.iter());
    let info_db = db.clone();
    let info = Arc::new(move || {
        let (min_time, max_time) = info_db.advertised_range();
        StoreInfo {
            min_time,
            max_time,
            kind: strata_grpc::pb::ComponentKind::Edge,
            label_sets: Vec::new(),
            resolutions: Vec::new(),
            complete_until: None,
        }
    });
    let service = StoreService::new(Arc::new(TsdbStore(db.clone())), external, SelectLimits::default(), info);
    tokio::spawn(async move {
        let stop = async move {
            let _ = shutdown.changed().await;
        };
        if let Err(e) =
            strata_grpc::serve(listener, service, ServeOptions::new(GRPC_MAX_REQUEST).with_tls(tls), stop).await
        {
            tracing::error!(error = %e, "edge gRPC server failed");
        }
    });
    Ok(bound)
}

/// One [`Forwarder`](strata_forward::Forwarder) per `strata.forward` upstream, each from
/// its own cursor; together they hold the WAL the slowest still needs.
async fn spawn_forwarders(
    db: &Arc<Tsdb>,
    cfg: &EdgeConfig,
    metrics: &EdgeMetrics,
    shutdown: &watch::Receiver<bool>,
) -> Result<Vec<JoinHandle<()>>, EdgeError> {
    if cfg.strata.forward.is_empty() && cfg.remote_write.is_empty() {
        return Ok(Vec::new());
    }
    let external = Labels::from_pairs(cfg.external_labels.iter());
    // Every upstream's options first (TLS files read), so a bad one starts none.
    let mut all = Vec::new();
    for f in &cfg.strata.forward {
        let mut o = strata_forward::ForwarderOptions::new(&f.address);
        o.endpoint = f.endpoint.clone();
        o.external_labels = external.clone();
        o.max_disk = Some(cfg.strata.forward_max_disk.map_or(crate::config::DEFAULT_FORWARD_MAX_DISK, |b| b.0));
        if let Some(n) = f.batch_samples {
            o.batch_samples = n;
        }
        o.compression = f.batch_compression();
        if let Some(t) = &f.tls_config {
            let files = strata_grpc::ClientTlsFiles {
                ca: t.ca_file.clone(),
                cert: t.cert_file.clone(),
                key: t.key_file.clone(),
                server_name: t.server_name.clone(),
            };
            let tls = files.load().map_err(|source| EdgeError::Forward { upstream: f.address.clone(), source })?;
            o.tls = Some(tls);
        }
        all.push((f, o));
    }
    let holds = strata_forward::WalHolds::new(db.clone());
    let mut tasks = Vec::new();
    for (f, o) in all {
        let stats = metrics.forward.upstream(&f.address);
        let forwarder = strata_forward::Forwarder::new(db.clone(), holds.clone(), o, stats);
        tracing::info!(upstream = %f.address, "forwarding everything stored to the upstream");
        tasks.push(tokio::spawn(forwarder.run(shutdown.clone())));
    }
    // Remote writes read the WAL the same way, each from its own cursor.
    let max_disk = cfg.strata.forward_max_disk.map_or(crate::config::DEFAULT_FORWARD_MAX_DISK, |b| b.0);
    for rw in &cfg.remote_write {
        let stats = metrics.remote_write.queue(&rw.name, &rw.url);
        let mut rw = rw.clone();
        let head = db.clone();
        rw.metadata_source = Some(Arc::new(move || head.head().all_metadata()));
        let upstream = strata_remote_write::RemoteWriteUpstream::new(rw.clone(), stats, shutdown.clone())
            .await
            .map_err(EdgeError::RemoteWrite)?;
        let mut o = upstream.forwarder_options();
        o.external_labels = external.clone();
        o.max_disk = Some(max_disk);
        let fstats = metrics.remote_write_queues.upstream(&o.upstream);
        let forwarder = strata_forward::Forwarder::with_upstream(db.clone(), holds.clone(), o, fstats, upstream);
        tracing::info!(remote_name = %rw.name, url = %rw.url, "remote-writing everything stored");
        tasks.push(tokio::spawn(forwarder.run(shutdown.clone())));
    }
    Ok(tasks)
}

/// How long background tasks get to finish what is in flight at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The longest a StoreAPI call may run, whatever deadline the caller sent.
const GRPC_MAX_REQUEST: Duration = Duration::from_secs(120);

impl Edge {
    pub async fn start(opts: EdgeOptions) -> Result<Edge, EdgeError> {
        let cfg = EdgeConfig::load(&opts.config_path)?;
        let web = match &opts.web_config {
            Some(p) => {
                let w = LiveWebConfig::load(p.clone())?;
                for key in &w.current().ignored {
                    tracing::warn!(path = %p.display(), key = %key, "web configuration key not implemented by Strata: ignored");
                }
                w
            }
            None => LiveWebConfig::fixed(WebConfig::default()),
        };
        let scheme = if web.current().tls.is_some() { "https" } else { "http" };
        let data_dir = data_dir_of(&opts, &cfg);
        let tsdb_opts = tsdb_options(&cfg);
        tracing::info!(data = %data_dir.display(), "opening the edge database and replaying its WAL");
        let dir = data_dir.clone();
        let opened = tokio::task::spawn_blocking(move || Tsdb::open(&dir, tsdb_opts)).await?;
        let db = Arc::new(opened.map_err(|source| EdgeError::Open { dir: data_dir.clone(), source })?);
        let metrics = Arc::new(EdgeMetrics::new(db.metrics()));
        // The configuration loaded at start is a successful load, as Prometheus reports it
        // (a "reload failed" alert must not fire on a clean start); the families the README
        // names are listed from the start, at 0.
        metrics.config_last_reload_success.set(1);
        for reason in ["success", "failure"] {
            let _ = metrics.config_reloads.get_or_create(&ReasonLabel { reason: reason.into() });
        }
        for job in &cfg.jobs {
            let label = crate::metrics::JobLabel { job: job.job_name.clone() };
            let _ = metrics.scrapes.get_or_create(&label);
            let _ = metrics.scrape_failures.get_or_create(&label);
        }
        let manager = ScrapeManager::new(db.clone(), metrics.clone());
        let mut limits = WriteLimits::default();
        if let Some(b) = cfg.strata.remote_write_max_bytes {
            limits.max_body_bytes = b.0 as usize;
        }
        if let Some(n) = cfg.strata.remote_write_max_samples {
            limits.max_samples = n;
        }
        let state = Arc::new(EdgeState {
            db: db.clone(),
            metrics: metrics.clone(),
            manager: manager.clone(),
            config_path: opts.config_path.clone(),
            remote_write: Arc::new(RemoteWrite::new(db.clone(), metrics.receive.clone(), limits)),
            api: opts.api.clone(),
            enable_lifecycle: opts.enable_lifecycle,
        });
        let addr = opts.http_listen.unwrap_or_else(|| DEFAULT_HTTP_LISTEN.parse().expect("constant address parses"));
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| EdgeError::Bind { addr, source })?;
        let http_addr = listener.local_addr().map_err(|source| EdgeError::Bind { addr, source })?;
        let (shutdown, shutdown_rx) = watch::channel(false);

        // The forwarders hold the WAL they still need before maintenance may delete it.
        let forwarders = spawn_forwarders(&db, &cfg, &metrics, &shutdown_rx).await?;
        let mut tasks = strata_tsdb::loops::spawn(&db);
        tasks.push(manager.spawn_file_sd_watcher(opts.file_sd_check));
        tasks.extend(web.spawn_watcher(opts.file_sd_check));
        #[cfg(unix)]
        {
            let (st, web) = (state.clone(), web.clone());
            tasks.push(tokio::spawn(async move {
                let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
                    return;
                };
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP: reloading configuration");
                    let _ = st.reload().await;
                    web.reload_and_log(&mut None);
                }
            }));
        }

        let grpc_addr = match opts.grpc_listen {
            Some(addr) => {
                let tls = opts.grpc_tls.as_ref().map(|t| t.load()).transpose()?;
                Some(spawn_store_api(addr, &db, &cfg, tls, shutdown_rx.clone()).await?)
            }
            None => None,
        };
        manager.apply(Arc::new(cfg)).await;
        let app = router(state.clone());
        let mut rx = shutdown_rx.clone();
        let server_limits = opts.server;
        let server = tokio::spawn(async move {
            let res = strata_server::serve(listener, app, server_limits, web, async move {
                let _ = rx.changed().await;
            })
            .await;
            if let Err(e) = res {
                tracing::error!(error = %e, "edge HTTP server failed");
            }
        });
        tracing::info!(http = %http_addr, grpc = ?grpc_addr, data = %data_dir.display(), "edge started");
        Ok(Edge { http_addr, grpc_addr, scheme, state, shutdown, tasks, forwarders, server })
    }

    /// Stops scraping (marking series stale), the server and the loops, then the database:
    /// a block cut that is writing gives up (its window stays in the head and the WAL),
    /// and a head checkpoint is written, so that the next start replays only what follows.
    pub async fn stop(mut self) {
        self.state.manager.stop_all().await;
        let _ = self.shutdown.send(true);
        let _ = self.server.await;
        // Forwarders and remote writes finish the round in flight when their upstream
        // answers (a round cut short is sent again after the restart, and a Prometheus
        // receiver refuses a request that mixes stored samples with new ones); the rest
        // is cut after a grace period.
        let grace = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        for t in &mut self.forwarders {
            if tokio::time::timeout_at(grace, &mut *t).await.is_err() {
                t.abort();
            }
        }
        for t in &self.tasks {
            t.abort();
        }
        let db = self.state.db.clone();
        match tokio::task::spawn_blocking(move || db.shutdown()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "head checkpoint at shutdown failed: the next start replays the WAL")
            }
            Err(e) => tracing::error!(error = %e, "database shutdown task failed"),
        }
    }
}
