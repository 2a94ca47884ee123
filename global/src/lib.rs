//! The global tier's querier: `strata global --config FILE`.
//!
//! It reads the StoreAPI of edges and regionals (found by [`stores::StoreSet`] from a
//! static list, file SD and DNS), fans out over them ([`strata_fanout::Fanout`], partial
//! response by default), merges HA replicas ([`strata_dedup::ReplicaDedup`], on by
//! default) and answers the Prometheus HTTP API through the same engine and API code as
//! an edge. It serves the StoreAPI itself, without dedup and with its stores' label
//! sets, so globals can be stacked. `/api/v1/stores` lists the stores and their health;
//! `/api/v1/rules` and `/api/v1/alerts` merge every regional's ([`rules`]).
//! With `rule_files` configured it runs rules itself over everything it sees, as Thanos'
//! ruler does ([`strata_rules::tier`]): what they record goes into a database of its own
//! under `--data`, which queries, the StoreAPI and the rules themselves read beside the
//! stores, and its alerts go to the configured Alertmanagers.
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
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use stores::StoreSet;
use strata_api::ApiOptions;
use strata_archive::{ArchiveStore, Archiver, Compactor};
use strata_dedup::ReplicaDedup;
use strata_fanout::{Fanout, StoreTarget};
use strata_grpc::{pb, ServeOptions, StoreInfo, StoreService};
use strata_model::Labels;
use strata_rules::tier::TierRules;
use strata_server::{LiveWebConfig, ServerLimits, WebConfig};
use strata_store::{SelectLimits, Store};
use strata_tsdb::db::{Tsdb, TsdbOptions};
use strata_tsdb::TsdbStore;
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Clone)]
pub struct GlobalOptions {
    /// `None`: no stores (an archive served alone), no rules.
    pub config_path: Option<PathBuf>,
    pub http_listen: SocketAddr,
    pub grpc_listen: Option<SocketAddr>,
    /// TLS for the StoreAPI served on `grpc_listen` (`--grpc-server-tls-*`).
    pub grpc_tls: Option<strata_grpc::ServerTlsFiles>,
    /// `--query.replica-label`; when empty, the configuration's (default `replica`).
    pub replica_labels: Vec<String>,
    pub api: ApiOptions,
    pub server: ServerLimits,
    /// Where the rules' database lives (`--data`; default [`DEFAULT_DATA_DIR`]); opened
    /// only when the configuration names rule files.
    pub data_dir: Option<PathBuf>,
    /// The rules' flags (`--rules.alert.*`); the rest comes from the config file.
    pub rules: strata_rules::manager::RuleOptions,
    /// `POST /-/reload` reloads the rules.
    pub enable_lifecycle: bool,
    /// The URL users reach the global at, for alerts' generator links.
    pub external_url: Option<String>,
    /// `--archive`: the Parquet archive served beside the stores, and written to.
    pub archive: Option<ArchiveOptions>,
}

/// The archive a global serves and, unless `read_only`, writes.
#[derive(Debug, Clone)]
pub struct ArchiveOptions {
    /// A folder, `file://`, `s3://`, `gs://` or `az://` URL.
    pub url: String,
    pub read_only: bool,
    pub archiver: strata_archive::ArchiverOptions,
    pub compactor: strata_archive::CompactorOptions,
    pub reader: strata_archive::ArchiveStoreOptions,
    /// The one shard of the stores' series this global archives (several archivers split
    /// the work by external labels); `None`: all of them.
    pub shard: Option<ArchiveShard>,
}

/// A shard of the archive: the series matching `matchers` (on external labels), archived
/// under `shards/<name>/`.
#[derive(Debug, Clone)]
pub struct ArchiveShard {
    pub name: String,
    /// As given: recorded in the shard's folder, so that another archiver of the name with
    /// another selector is refused.
    pub selector: String,
    pub matchers: Vec<strata_model::Matcher>,
}

impl GlobalOptions {
    pub fn new(config_path: Option<PathBuf>) -> Self {
        GlobalOptions {
            config_path,
            http_listen: ([127, 0, 0, 1], DEFAULT_HTTP_PORT).into(),
            grpc_listen: None,
            grpc_tls: None,
            replica_labels: Vec::new(),
            api: ApiOptions::default(),
            server: ServerLimits::default(),
            data_dir: None,
            rules: strata_rules::manager::RuleOptions::default(),
            enable_lifecycle: false,
            external_url: None,
            archive: None,
        }
    }
}

pub const DEFAULT_HTTP_PORT: u16 = 9490;
pub const DEFAULT_DATA_DIR: &str = "strata-data/global";

#[derive(Debug, thiserror::Error)]
pub enum GlobalError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] strata_grpc::GrpcError),
    #[error("opening the rules' database in {dir}: {source}")]
    Open { dir: PathBuf, source: strata_tsdb::TsdbError },
    #[error("rules: {0}")]
    Rules(String),
    #[error("the archive: {0}")]
    Archive(#[from] strata_archive::ArchiveError),
}

pub struct Global {
    pub http_addr: SocketAddr,
    pub grpc_addr: Option<SocketAddr>,
    pub stores: Arc<StoreSet>,
    /// The rules it runs itself, and their database.
    pub rules: Option<Arc<TierRules>>,
    rules_db: Option<Arc<Tsdb>>,
    /// The database's own loops (fsync, maintenance): aborted before it closes.
    db_tasks: Vec<JoinHandle<()>>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// Writes complete ranges to the archive (`--archive`, unless read-only), and
    /// compacts and retains what is there.
    pub archiver: Option<Arc<Archiver>>,
    pub compactor: Option<Arc<Compactor>>,
}

struct GlobalState {
    stores: Arc<StoreSet>,
    metrics: Arc<metrics::GlobalMetrics>,
    /// The rules' metrics under Prometheus' names, and their database's.
    rules_registries: Vec<Registry>,
    rules_db: Option<Arc<Tsdb>>,
    archiver: Option<Arc<Archiver>>,
    compactor: Option<Arc<Compactor>>,
}

/// Ready unless the archiver has failed `unready_after` rounds in a row.
async fn ready(State(s): State<Arc<GlobalState>>) -> Response {
    let unready =
        |why: &str| (axum::http::StatusCode::SERVICE_UNAVAILABLE, format!("Strata global is not ready: {why}\n"));
    if s.archiver.as_ref().is_some_and(|a| !a.ready()) {
        return unready("archiving keeps failing (see strata_archive_failures_total and the log).").into_response();
    }
    if s.compactor.as_ref().is_some_and(|c| !c.ready()) {
        return unready(
            "compaction halted on a day of the archive (see strata_archive_compaction_halted_days and the log).",
        )
        .into_response();
    }
    "Strata global is Ready.\n".into_response()
}

async fn self_metrics(State(s): State<Arc<GlobalState>>) -> Response {
    if let Some(db) = &s.rules_db {
        db.metrics().refresh(db);
    }
    let text = s.metrics.encode(&s.stores, &s.rules_registries);
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// The rules' database: what they record, kept `retention`.
async fn open_rules_db(dir: PathBuf, retention: Duration) -> Result<Arc<Tsdb>, GlobalError> {
    let settings = strata_tsdb::settings::StorageSettings { retention: Some(retention), ..Default::default() };
    let opts = settings.apply(TsdbOptions::default()).map_err(GlobalError::Rules)?;
    tracing::info!(data = %dir.display(), "opening the rules' database and replaying its WAL");
    let at = dir.clone();
    let opened = tokio::task::spawn_blocking(move || Tsdb::open(&at, opts))
        .await
        .map_err(|e| GlobalError::Rules(format!("opening the rules' database: {e}")))?;
    Ok(Arc::new(opened.map_err(|source| GlobalError::Open { dir, source })?))
}

/// `stores` and the rules' database side by side: each series lives in one of them.
/// `timeout` bounds a whole call of `stores` (which times its own stores out).
fn beside_rules(stores: Arc<dyn Store>, db: &Arc<Tsdb>, timeout: Duration) -> Arc<dyn Store> {
    let recorded = Arc::new(strata_promql::pushdown::Evaluating::new(TsdbStore(db.clone())));
    Arc::new(Fanout::new(vec![StoreTarget::new("stores", stores), StoreTarget::new("rules", recorded)], timeout))
}

async fn stores_page(State(s): State<Arc<GlobalState>>) -> Response {
    axum::Json(serde_json::json!({"status": "success", "data": s.stores.status_json()})).into_response()
}

impl Global {
    pub async fn start(opts: GlobalOptions) -> Result<Global, GlobalError> {
        let mut cfg = match &opts.config_path {
            Some(path) => GlobalConfig::load(path)?,
            None => GlobalConfig::parse("{}", std::path::Path::new(".")).map_err(GlobalError::Rules)?,
        };
        if !opts.replica_labels.is_empty() {
            cfg.replica_labels = opts.replica_labels.clone();
        }
        if opts.archive.as_ref().is_some_and(|a| a.read_only && a.shard.is_some()) {
            return Err(GlobalError::Archive(strata_archive::ArchiveError::Invalid(
                "--archive.shard with --archive.read-only: a reader serves every shard; the flag names the shard a global writes".into(),
            )));
        }
        // The dedup takes the replica labels off before a shard's matchers are applied.
        if let Some(m) = opts
            .archive
            .as_ref()
            .and_then(|a| a.shard.as_ref())
            .and_then(|s| s.matchers.iter().find(|m| cfg.replica_labels.contains(&m.name)))
        {
            return Err(GlobalError::Archive(strata_archive::ArchiveError::Invalid(format!(
                "--archive.shard: {} is a replica label, which deduplicated series do not carry",
                m.name
            ))));
        }
        let (rules_cfg, rules_retention) = (cfg.rules.clone(), cfg.rules_retention);
        let (interval, replica_labels, store_timeout, prefer) =
            (cfg.info_interval, cfg.replica_labels.clone(), cfg.store_timeout, cfg.aggregates);
        // A replica that answers keeps a `partial_response=false` answer whole when its
        // twin fails.
        let fanout =
            Arc::new(Fanout::new(Vec::new(), cfg.store_timeout).with_replica_labels(cfg.replica_labels.clone()));
        // TLS files are read now: a missing or broken one stops the start, naming it.
        let client_tls = cfg.client_tls.as_ref().map(|t| t.load()).transpose()?;
        let server_tls = opts.grpc_tls.as_ref().map(|t| t.load()).transpose()?;
        let mut store_set = StoreSet::new(cfg, fanout.clone());
        if let Some(tls) = client_tls {
            store_set = store_set.with_client_tls(tls);
        }
        // The archive is one more store of the fan-out; the archiver reads the stores alone.
        let live = Arc::new(Fanout::new(Vec::new(), store_timeout).with_replica_labels(replica_labels.clone()));
        let archive_objects = match &opts.archive {
            Some(a) => {
                let objects = strata_archive::archive_store(&a.url, !a.read_only)?;
                let reader = Arc::new(ArchiveStore::new(objects.clone(), a.url.clone(), a.reader.clone()));
                store_set = store_set.with_archive(a.url.clone(), reader, live.clone());
                Some((objects, a))
            }
            None => None,
        };
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
        let bind = |addr| async move {
            tokio::net::TcpListener::bind(addr).await.map_err(|source| GlobalError::Bind { addr, source })
        };
        let listener = bind(opts.http_listen).await?;
        let http_addr = listener.local_addr().map_err(|source| GlobalError::Bind { addr: opts.http_listen, source })?;
        // Both ports taken before the rules start, so that nothing after them can fail.
        let grpc_listener = match opts.grpc_listen {
            Some(addr) => {
                let listener = bind(addr).await?;
                let bound = listener.local_addr().map_err(|source| GlobalError::Bind { addr, source })?;
                Some((listener, bound))
            }
            None => None,
        };
        if rules_cfg.rule_files.is_empty()
            && (!rules_cfg.alerting.alertmanagers.is_empty() || !rules_cfg.global.external_labels.is_empty())
        {
            tracing::warn!(config = ?opts.config_path, "`alerting` or `global.external_labels` without `rule_files`: no rules run, so they are unused");
        }

        let rules_db = match rules_cfg.rule_files.is_empty() {
            true => None,
            false => {
                let dir = opts.data_dir.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
                Some(open_rules_db(dir, rules_retention).await?)
            }
        };
        // A call on the stores may take a query's whole time (they time out one by one).
        let whole_call = opts.api.engine.timeout.max(store_timeout);
        let query_store: Arc<dyn Store> = match &rules_db {
            None => Arc::new(planner),
            Some(db) => beside_rules(Arc::new(planner), db, whole_call),
        };
        let (mut rules_registries, mut db_tasks) = (Vec::new(), Vec::new());
        let rules = match &rules_db {
            None => None,
            Some(db) => {
                db_tasks = strata_tsdb::loops::spawn(db);
                let mut rule_opts = opts.rules.clone();
                rule_opts.engine.pushdown = opts.api.engine.pushdown;
                rule_opts.external_url = opts.external_url.clone().unwrap_or_else(|| format!("http://{http_addr}"));
                let read: strata_rules::tier::ReadConfig =
                    Arc::new(|p| GlobalConfig::load(p).map(|c| c.rules).map_err(|e| e.to_string()));
                let started = TierRules::start(
                    rules_cfg.clone(),
                    read,
                    "global",
                    query_store.clone(),
                    db.clone(),
                    None,
                    rule_opts,
                    shutdown_rx.clone(),
                )
                .await;
                let rules = match started {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = shutdown.send(true);
                        db_tasks.iter().for_each(|t| t.abort());
                        close_db(db.clone()).await;
                        return Err(GlobalError::Rules(e));
                    }
                };
                let (mut own, mut stored) = (Registry::default(), Registry::with_prefix("strata"));
                if let Some(r) = &rules {
                    r.manager().metrics().register(&mut own);
                }
                db.metrics().register(&mut stored);
                rules_registries.extend([own, stored]);
                rules
            }
        };
        let (archiver, compactor) = match archive_objects {
            Some((root, a)) if !a.read_only => {
                let mut source: Arc<dyn Store> = Arc::new(ReplicaDedup::new(live.clone(), rules_replicas.clone()));
                let coverage_of = stores.clone();
                // A shard's archiver reads its series alone, waits for its stores alone, and
                // writes an archive of its own under the root.
                let scope = a.shard.as_ref().map_or_else(Vec::new, |s| s.matchers.clone());
                let settle_ms = i64::try_from(a.archiver.settle.as_millis()).unwrap_or(i64::MAX);
                let coverage: strata_archive::archiver::CoverageFn =
                    Arc::new(move || coverage_of.coverage_within(&scope, settle_ms));
                let objects = match &a.shard {
                    Some(shard) => {
                        source = Arc::new(strata_store::Scoped::new(source, shard.matchers.clone()));
                        strata_archive::shard_store(root.clone(), &shard.name)?
                    }
                    None => root.clone(),
                };
                let shard = a.shard.as_ref().map(|s| (s.name.as_str(), s.selector.as_str()));
                strata_archive::check_sharding(root.as_ref(), shard).await?;
                let mut archiver_opts = a.archiver.clone();
                archiver_opts.owner = format!("{}:{}:{}", host_name(), http_addr, std::process::id());
                let writer = strata_archive::BlockWriter::new(objects.clone(), strata_archive::WriteOptions::default());
                let owner = archiver_opts.owner.clone();
                let archiver = Arc::new(Archiver::new(objects.clone(), writer, source, coverage, archiver_opts));
                let compactor_opts = strata_archive::CompactorOptions { owner, ..a.compactor.clone() };
                let writer = strata_archive::BlockWriter::new(objects.clone(), strata_archive::WriteOptions::default());
                let compactor = Arc::new(Compactor::new(objects, writer, compactor_opts));
                let mut registry = Registry::with_prefix("strata");
                archiver.metrics().register(&mut registry);
                compactor.metrics().register(&mut registry);
                rules_registries.push(registry);
                tasks.push(tokio::spawn(archiver.clone().run(shutdown_rx.clone())));
                tasks.push(tokio::spawn(compactor.clone().run(shutdown_rx.clone())));
                tracing::info!(archive = %a.url, "archiving complete ranges of the stores, compacting the archive");
                (Some(archiver), Some(compactor))
            }
            _ => (None, None),
        };
        let global_metrics = metrics::GlobalMetrics::new();
        let tracked = global_metrics.clone();
        let app = Router::new()
            .route("/api/v1/stores", get(stores_page))
            .route("/metrics", get(self_metrics))
            .route("/-/healthy", get(|| async { "Strata global is Healthy.\n" }))
            .route("/-/ready", get(ready))
            .with_state(Arc::new(GlobalState {
                stores: stores.clone(),
                metrics: global_metrics,
                rules_registries,
                rules_db: rules_db.clone(),
                archiver: archiver.clone(),
                compactor: compactor.clone(),
            }))
            .merge(rules::router(stores.clone(), rules.clone(), rules_replicas, store_timeout, opts.enable_lifecycle))
            .merge(strata_api::router_with(query_store, opts.api.clone()))
            .layer(axum::middleware::from_fn(move |req, next| metrics::track(tracked.clone(), req, next)));
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
        let grpc_addr = match grpc_listener {
            Some((listener, bound)) => {
                let info_stores = stores.clone();
                // What rules record carries the rules' external labels, and is kept longer
                // than the stores may keep theirs.
                let recorded = rules_db.as_ref().map(|_| rules_cfg.global.external_labels());
                let recorded_range = rules_db.clone();
                let info = Arc::new(move || {
                    // What every store below confirmed, or nothing: a global above must not
                    // skip this one for labels or times a store that did not answer holds.
                    let st = info_stores.status();
                    // The archive has no label sets of its own: its series carry the
                    // stores' external labels.
                    let confirmed = !st.is_empty()
                        && st.iter().all(|s| s.healthy && (!s.label_sets.is_empty() || s.kind == stores::ARCHIVE_KIND))
                        && recorded.as_ref().is_none_or(|l| !l.is_empty());
                    if !confirmed {
                        return StoreInfo {
                            min_time: i64::MIN,
                            max_time: i64::MAX,
                            kind: pb::ComponentKind::Global,
                            label_sets: Vec::new(),
                            resolutions: Vec::new(),
                            complete_until: None,
                        };
                    }
                    let (lo, hi) = recorded_range.as_ref().map_or((i64::MAX, i64::MIN), |db| db.advertised_range());
                    StoreInfo {
                        min_time: st.iter().map(|s| s.min_time).min().unwrap_or(i64::MIN).min(lo),
                        max_time: st.iter().map(|s| s.max_time).max().unwrap_or(i64::MAX).max(hi),
                        kind: pb::ComponentKind::Global,
                        label_sets: st.iter().flat_map(|s| s.label_sets.clone()).chain(recorded.clone()).collect(),
                        resolutions: Vec::new(),
                        complete_until: None,
                    }
                });
                let served: Arc<dyn Store> = match &rules_db {
                    None => fanout.clone(),
                    Some(db) => beside_rules(fanout.clone(), db, whole_call),
                };
                let service = StoreService::new(served, Labels::default(), SelectLimits::default(), info);
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
        Ok(Global { http_addr, grpc_addr, stores, rules, rules_db, db_tasks, shutdown, tasks, archiver, compactor })
    }

    /// Stops the rules (a group evaluating finishes), the servers, then the rules'
    /// database, writing a head checkpoint.
    pub async fn stop(self) {
        if let Some(r) = &self.rules {
            r.manager().stop().await;
        }
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
        self.db_tasks.iter().for_each(|t| t.abort());
        if let Some(db) = self.rules_db {
            close_db(db).await;
        }
    }
}

/// Shuts the rules' database down, or says why it could not.
async fn close_db(db: Arc<Tsdb>) {
    match tokio::task::spawn_blocking(move || db.shutdown()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "closing the rules' database"),
        Err(e) => tracing::error!(error = %e, "closing the rules' database"),
    }
}

/// This machine's name, for the archiver's claims (`HOSTNAME`, else `/etc/hostname`).
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
