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
//! It downsamples what it holds (`strata_downsample`): the deduplicated view of its own
//! storage (`strata_dedup::ReplicaDedup`), in 5 m and 1 h windows, once every sender has
//! got past them or after a maximum delay, again when late data changes them; the
//! StoreAPI answers a leaf from them when a global asks for a resolution.
//!
//! It evaluates Prometheus rule files over that same deduplicated view (`strata_rules`,
//! wired in [`rules`]), stores what they record beside what it receives, and sends alerts
//! to Alertmanager. With `strata.archive` it keeps the blocks a global has not archived
//! yet past retention ([`archive_hold`]). Only the wiring and loops of the tier belong here.

pub mod archive_hold;
pub mod config;
pub mod rules;

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
use strata_downsample::{Downsampler, WithAggregates};
use strata_forward::{ForwardReceiver, StorageId};
use strata_grpc::{ServeOptions, StoreInfo, StoreService};
use strata_model::Labels;
use strata_server::{LiveWebConfig, ServerLimits, WebConfig, WebConfigError};
use strata_store::{SelectLimits, Store};
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
    /// Prometheus' `--web.enable-lifecycle`: `POST /-/quit` stops the regional and
    /// `POST /-/reload` reloads its rules.
    pub enable_lifecycle: bool,
    /// `--web.external-url`: where alerts' links point (default: the HTTP address).
    pub external_url: Option<String>,
    /// The rules' flags (`--rules.alert.*`); the rest comes from the config file.
    pub rules: strata_rules::manager::RuleOptions,
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
            external_url: None,
            rules: strata_rules::manager::RuleOptions::default(),
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
    #[error("opening the aggregates: {0}")]
    Downsample(#[from] strata_downsample::downsampler::DownsampleError),
    #[error("rules: {0}")]
    Rules(String),
    #[error("strata.archive: {0}")]
    Archive(#[from] strata_archive::ArchiveError),
}

/// How often the downsampler looks for due slices.
const DOWNSAMPLE_EVERY: Duration = Duration::from_secs(30);

struct RegionalState {
    db: Arc<Tsdb>,
    registry: Registry,
    /// The rules' metrics, under Prometheus' names (no `strata_` prefix).
    rules_registry: Registry,
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
    pub rules: Option<Arc<strata_rules::manager::RuleManager>>,
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
        let senders = Arc::new(strata_forward::Senders::open(&data_dir));
        // How far each edge has sent everything: `Info` says so, and an archiver waits.
        let known = senders.label_sets().iter().map(|l| l.to_string()).collect::<Vec<_>>();
        let watermarks = Arc::new(strata_forward::Watermarks::open(&data_dir, known));
        let mut receiver = ForwardReceiver::new(db.clone(), id.clone())
            .with_senders(senders.clone())
            .with_watermarks(watermarks.clone());
        let mut arrivals_hook = None;
        let mut rules_hook: Option<strata_rules::tier::OnStored> = None;
        let down = match cfg.downsample() {
            Some((replicas, dopts)) => {
                let dir = data_dir.join("downsample");
                let d = tokio::task::spawn_blocking(move || Downsampler::open(&dir, dopts)).await??;
                let d = Arc::new(d);
                let (progress, arrivals_db) = (d.progress(), db.clone());
                let arrivals: strata_forward::Arrivals = Arc::new(move |sender: &str, lo: i64, hi: i64| {
                    // Samples older than storage admits changed nothing to compute again.
                    let oldest = arrivals_db.min_valid_time(strata_model::time::now_ms());
                    progress.arrived(sender, lo, hi, oldest).map_err(|e| e.to_string())
                });
                receiver = receiver.with_arrivals(arrivals.clone());
                arrivals_hook = Some(arrivals);
                // Rule output stored behind computed windows has them computed again; being
                // the regional's own, it is no sender whose progress makes a slice due.
                let (progress, rules_db) = (d.progress(), db.clone());
                rules_hook = Some(Arc::new(move |_: &str, lo: i64, hi: i64| {
                    let oldest = rules_db.min_valid_time(strata_model::time::now_ms());
                    progress.changed(lo, hi, oldest).map_err(|e| e.to_string())
                }));
                Some((d, replicas))
            }
            None => None,
        };
        let received = receiver.stats();
        let mut registry = Registry::with_prefix("strata");
        db.metrics().register(&mut registry);
        received.register(&mut registry);
        // Prometheus (or anything that speaks remote write 1.0) can write here too.
        let receive = Arc::new(strata_receive::ReceiveMetrics::default());
        receive.register(&mut registry);
        let mut remote_write = strata_receive::RemoteWrite::new(db.clone(), receive.clone(), Default::default());
        if let Some(f) = arrivals_hook {
            remote_write = remote_write.with_on_stored(f);
        }
        let remote_write = Arc::new(remote_write);
        let remote_write_seen = RemoteWriteSeen::new(&data_dir, receive);

        let downsample_metrics = DownsampleMetrics::default();
        downsample_metrics.register(&mut registry);
        let (shutdown, shutdown_rx) = watch::channel(false);
        // Held before the loops start, so that no retention run deletes what the archive
        // still lacks.
        let hold = match &cfg.strata.archive {
            Some(a) => {
                let hold = Arc::new(archive_hold::ArchiveHold::open(a)?);
                hold.hold_all(&db);
                hold.register(&mut registry);
                Some(hold)
            }
            None => None,
        };
        let mut tasks = strata_tsdb::loops::spawn(&db);
        if let Some(h) = hold {
            tasks.push(tokio::spawn(h.run(db.clone(), shutdown_rx.clone())));
        }
        if let Some((d, replicas)) = &down {
            tasks.push(tokio::spawn(downsample_loop(db.clone(), d.clone(), replicas.clone(), downsample_metrics)));
        }
        let mut servers = Vec::new();

        let http = opts.http_listen.unwrap_or_else(|| parse_default(DEFAULT_HTTP_LISTEN));
        let http_listener =
            tokio::net::TcpListener::bind(http).await.map_err(|source| RegionalError::Bind { addr: http, source })?;
        let http_addr = http_listener.local_addr().map_err(|source| RegionalError::Bind { addr: http, source })?;
        let (quit, quit_rx) = watch::channel(false);
        let replicas = down.as_ref().map(|d| d.1.clone()).unwrap_or_else(|| vec!["replica".into()]);
        let mut rule_opts = opts.rules.clone();
        rule_opts.external_url = opts.external_url.clone().unwrap_or_else(|| format!("{scheme}://{http_addr}"));
        let tier_rules = rules::start(&cfg, db.clone(), replicas, rules_hook, rule_opts, shutdown_rx.clone())
            .await
            .map_err(RegionalError::Rules)?;
        let rules = tier_rules.as_ref().map(|r| r.manager().clone());

        let grpc = opts.grpc_listen.unwrap_or_else(|| parse_default(DEFAULT_GRPC_LISTEN));
        let listener = match tokio::net::TcpListener::bind(grpc).await {
            Ok(l) => l,
            Err(source) => {
                // The rules' loops are running: they hold the database.
                if let Some(r) = &rules {
                    r.stop().await;
                }
                return Err(RegionalError::Bind { addr: grpc, source });
            }
        };
        let grpc_addr = listener.local_addr().map_err(|source| RegionalError::Bind { addr: grpc, source })?;
        let info_db = db.clone();
        let info_down = down.as_ref().map(|d| d.0.clone());
        let remote_written = remote_write_seen;
        // Rule output carries the regional's external labels: a global must not prune
        // this store for a query on them.
        let own_labels = (!cfg.rule_files.is_empty()).then(|| cfg.global.external_labels()).filter(|l| !l.is_empty());
        let info = Arc::new(move || {
            let (min_time, max_time) = info_db.advertised_range();
            StoreInfo {
                min_time,
                max_time,
                kind: strata_grpc::pb::ComponentKind::Regional,
                // The edges that forward here: a global then knows whose data (and whose
                // aggregates) this holds. Unknown (asked for everything) once a sender
                // without external labels wrote here.
                label_sets: if remote_written.seen() {
                    Vec::new()
                } else {
                    let mut sets = senders.label_sets();
                    sets.extend(own_labels.clone());
                    sets
                },
                resolutions: info_down.as_ref().map(|d| d.coverage()).unwrap_or_default(),
                complete_until: watermarks.complete_until(),
            }
        });
        let raw: Arc<dyn Store> = Arc::new(TsdbStore(db.clone()));
        let served: Arc<dyn Store> = match &down {
            Some((d, _)) => {
                let held = db.clone();
                let oldest = move || held.oldest_held().unwrap_or(i64::MIN);
                Arc::new(WithAggregates::new(raw, d.clone()).with_oldest_raw(Arc::new(oldest)))
            }
            None => raw,
        };
        // No external labels of its own: every series carries its edge's.
        let store = StoreService::new(served, Labels::default(), SelectLimits::default(), info);
        let tls = opts.grpc_tls.as_ref().map(|t| t.load()).transpose()?;
        let others = tonic::service::Routes::new(receiver.with_connections(store.connections()).into_server())
            .add_service(strata_rules::remote::RulesService::new(rules.clone()).into_server());
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

        let mut rules_registry = Registry::default();
        if let Some(m) = &rules {
            m.metrics().register(&mut rules_registry);
        }
        let state = Arc::new(RegionalState {
            db: db.clone(),
            registry,
            rules_registry,
            enable_lifecycle: opts.enable_lifecycle,
            quit,
        });
        let app = Router::new()
            .route("/metrics", get(self_metrics))
            .route("/-/quit", axum::routing::post(quit_handler).put(quit_handler))
            .route("/-/healthy", get(|| async { "Strata regional is Healthy.\n" }))
            .route("/-/ready", get(ready))
            .with_state(state)
            .merge(rules::router(tier_rules, opts.enable_lifecycle))
            .merge(strata_receive::router(remote_write))
            .merge(strata_api::router_with(Arc::new(TsdbStore(db.clone())), opts.api.clone()));
        let mut rx = shutdown_rx.clone();
        let limits = opts.server;
        servers.push(tokio::spawn(async move {
            let stop = async move {
                let _ = rx.changed().await;
            };
            if let Err(e) = strata_server::serve(http_listener, app, limits, web, stop).await {
                tracing::error!(error = %e, "regional HTTP server failed");
            }
        }));
        tracing::info!(http = %http_addr, grpc = %grpc_addr, storage_id = %id.0, data = %data_dir.display(), "regional started");
        Ok(Regional { http_addr, grpc_addr, scheme, db, received, rules, shutdown, quit: quit_rx, tasks, servers })
    }

    /// Resolves once `POST /-/quit` asked the regional to stop (with the lifecycle API on).
    pub async fn quit_requested(&self) {
        let mut rx = self.quit.clone();
        let _ = rx.wait_for(|q| *q).await;
    }

    /// Stops the servers (a batch being stored finishes or is not acknowledged), then the
    /// database, writing a head checkpoint.
    pub async fn stop(self) {
        if let Some(r) = &self.rules {
            r.stop().await;
        }
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
    if prometheus_client::encoding::text::encode_registry(&mut text, &s.registry).is_err()
        || prometheus_client::encoding::text::encode_registry(&mut text, &s.rules_registry).is_err()
        || prometheus_client::encoding::text::encode_eof(&mut text).is_err()
    {
        text.push_str("# encoding self-metrics failed\n");
    }
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// The downsampler's figures in `/metrics`.
#[derive(Clone, Default)]
struct DownsampleMetrics {
    slices: prometheus_client::metrics::counter::Counter,
    failures: prometheus_client::metrics::counter::Counter,
    bytes: prometheus_client::metrics::family::Family<ResolutionLabel, prometheus_client::metrics::gauge::Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ResolutionLabel {
    resolution: String,
}

impl DownsampleMetrics {
    fn register(&self, r: &mut Registry) {
        r.register(
            "downsample_slices",
            "Slices of windows computed and written (again after late data)",
            self.slices.clone(),
        );
        r.register("downsample_failures", "Downsampling runs that failed (see the log)", self.failures.clone());
        r.register("downsample_bytes", "Bytes on disk of the aggregates, per resolution", self.bytes.clone());
    }
}

/// Computes due slices every [`DOWNSAMPLE_EVERY`] from the deduplicated view of `db`.
async fn downsample_loop(db: Arc<Tsdb>, down: Arc<Downsampler>, replicas: Vec<String>, m: DownsampleMetrics) {
    let source = strata_dedup::ReplicaDedup::new(Arc::new(TsdbStore(db.clone())), replicas);
    let mut tick = tokio::time::interval(DOWNSAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let oldest = Some(db.min_time()).filter(|&t| t != i64::MAX);
        match down.run(&source, oldest, strata_model::time::now_ms()).await {
            Ok(out) if !out.written.is_empty() => {
                m.slices.inc_by(out.written.len() as u64);
                tracing::info!(slices = out.written.len(), series = out.series, windows = out.windows, "downsampled");
            }
            Ok(_) => {}
            Err(e) => {
                m.failures.inc();
                tracing::error!(error = %e, "downsampling failed; retried at the next run");
            }
        }
        for (name, width) in [("5m", strata_downsample::FIVE_MINUTES), ("1h", strata_downsample::ONE_HOUR)] {
            if let Some(b) = down.blocks(width) {
                m.bytes.get_or_create(&ResolutionLabel { resolution: name.into() }).set(b.disk_bytes() as i64);
            }
        }
    }
}

/// Whether a remote-write sender (one without external labels) ever stored samples here,
/// remembered by a marker file: its series cannot be told apart by label set, so the
/// regional then lists none and is asked for everything.
struct RemoteWriteSeen {
    marker: PathBuf,
    receive: Arc<strata_receive::ReceiveMetrics>,
    seen: std::sync::atomic::AtomicBool,
}

impl RemoteWriteSeen {
    fn new(data_dir: &std::path::Path, receive: Arc<strata_receive::ReceiveMetrics>) -> Self {
        let marker = data_dir.join("remote-write-received");
        let seen = std::sync::atomic::AtomicBool::new(marker.exists());
        RemoteWriteSeen { marker, receive, seen }
    }

    fn seen(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.seen.load(Relaxed) && self.receive.remote_write_samples.get() > 0 {
            if let Err(e) = std::fs::write(&self.marker, b"") {
                tracing::warn!(file = %self.marker.display(), error = %e, "could not record that remote write was received");
            }
            self.seen.store(true, Relaxed);
        }
        self.seen.load(Relaxed)
    }
}
