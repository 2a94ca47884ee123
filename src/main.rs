//! `strata`: one binary, one subcommand per component. Each subcommand is thin wiring
//! over the tier crates; see `src/up.rs` for the whole stack on one machine.

mod archive;
mod bench;
mod up;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The global's archive (`--archive`).
#[derive(clap::Args, Debug)]
struct ArchiveFlags {
    /// Serve the Parquet archive at this folder or URL beside the stores, and write every
    /// complete range of the stores to it [default with no value: strata-data/archive].
    #[arg(long, num_args = 0..=1, default_missing_value = "strata-data/archive")]
    archive: Option<String>,
    /// Serve the archive without writing to it (another global archives).
    #[arg(long = "archive.read-only")]
    archive_read_only: bool,
    /// Width of the raw blocks the archiver writes.
    #[arg(long = "archive.block", default_value = "2h", value_parser = prom_duration)]
    archive_block: Duration,
    /// How long after a range ends it is left for late samples before it is archived.
    #[arg(long = "archive.settle", default_value = "10m", value_parser = prom_duration)]
    archive_settle: Duration,
    /// A range held back by a store that does not answer is archived anyway after this,
    /// its gaps named in the block's meta (readers then warn).
    #[arg(long = "archive.max-wait", default_value = "6h", value_parser = prom_duration)]
    archive_max_wait: Duration,
    /// How often the archiver looks for complete ranges.
    #[arg(long = "archive.interval", default_value = "30s", value_parser = prom_duration)]
    archive_interval: Duration,
    /// Data older than this is not archived (with a warning).
    #[arg(long = "archive.lookback", default_value = "35d", value_parser = prom_duration)]
    archive_lookback: Duration,
    /// Raw blocks of the archive ending longer ago than this are deleted (0s: kept for ever).
    #[arg(long = "archive.retention.raw", default_value = "0s", value_parser = prom_duration)]
    archive_retention_raw: Duration,
    /// 5 m aggregate blocks ending longer ago than this are deleted (0s: kept for ever).
    #[arg(long = "archive.retention.5m", default_value = "0s", value_parser = prom_duration)]
    archive_retention_5m: Duration,
    /// 1 h aggregate blocks ending longer ago than this are deleted (0s: kept for ever).
    #[arg(long = "archive.retention.1h", default_value = "0s", value_parser = prom_duration)]
    archive_retention_1h: Duration,
    /// MiB of series' raw chunks the reader keeps for the next query (0: none).
    #[arg(long = "archive.chunk-cache-mb", default_value_t = 256)]
    archive_chunk_cache_mb: usize,
    /// MiB of series' decoded 5 m / 1 h windows the reader keeps for the next query (0: none).
    #[arg(long = "archive.window-cache-mb", default_value_t = 256)]
    archive_window_cache_mb: usize,
    /// Archive one shard of the stores' series: `NAME={selector}` on external labels (for
    /// example `eu={region="eu"}`), written under `shards/NAME/` with its own progress, so
    /// that several globals split the work; the reader serves every shard.
    #[arg(long = "archive.shard", value_parser = parse_shard)]
    archive_shard: Option<Box<strata_global::ArchiveShard>>,
}

fn parse_shard(s: &str) -> Result<Box<strata_global::ArchiveShard>, String> {
    let (name, selector) = s.split_once('=').ok_or("NAME={selector}, for example eu={region=\"eu\"}")?;
    if !strata_archive::layout::valid_shard_name(name) {
        return Err(format!("shard name {name:?}: letters, digits, `_`, `-` and `.` (not first), at most 64"));
    }
    let matchers = strata_promql::selector::parse_selector(selector).map_err(|e| format!("{selector}: {e}"))?;
    Ok(Box::new(strata_global::ArchiveShard { name: name.to_string(), selector: selector.to_string(), matchers }))
}

impl ArchiveFlags {
    fn options(self) -> Option<strata_global::ArchiveOptions> {
        let url = self.archive?;
        let archiver = strata_archive::ArchiverOptions {
            block: self.archive_block,
            settle: self.archive_settle,
            max_wait: self.archive_max_wait,
            interval: self.archive_interval,
            lookback: self.archive_lookback,
            ..Default::default()
        };
        let compactor = strata_archive::CompactorOptions {
            retention_raw: Some(self.archive_retention_raw).filter(|d| !d.is_zero()),
            retention_5m: Some(self.archive_retention_5m).filter(|d| !d.is_zero()),
            retention_1h: Some(self.archive_retention_1h).filter(|d| !d.is_zero()),
            ..Default::default()
        };
        Some(strata_global::ArchiveOptions {
            url,
            read_only: self.archive_read_only,
            archiver,
            compactor,
            reader: strata_archive::ArchiveStoreOptions {
                cache_chunk_bytes: self.archive_chunk_cache_mb.saturating_mul(1 << 20),
                cache_window_bytes: self.archive_window_cache_mb.saturating_mul(1 << 20),
                ..Default::default()
            },
            shard: self.archive_shard.map(|s| *s),
        })
    }
}

#[derive(Parser)]
#[command(name = "strata", version, about = "Federation and aggregation tier for GPU-fleet metrics")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Prometheus' `--rules.alert.*` flags.
#[derive(clap::Args, Clone)]
struct AlertFlags {
    /// How long an outage may last for an alert's `for` state to be restored after it.
    #[arg(long = "rules.alert.for-outage-tolerance", default_value = "1h", value_parser = prom_duration)]
    for_outage_tolerance: Duration,
    /// The least time between a restart and a restored alert firing.
    #[arg(long = "rules.alert.for-grace-period", default_value = "10m", value_parser = prom_duration)]
    for_grace_period: Duration,
    /// How long before an alert still firing is sent to Alertmanager again.
    #[arg(long = "rules.alert.resend-delay", default_value = "1m", value_parser = prom_duration)]
    resend_delay: Duration,
}

impl AlertFlags {
    fn apply(&self, o: &mut strata_rules::manager::RuleOptions) {
        o.outage_tolerance = self.for_outage_tolerance;
        o.for_grace_period = self.for_grace_period;
        o.resend_delay = self.resend_delay;
    }
}

fn prom_duration(s: &str) -> Result<Duration, String> {
    strata_model::duration::parse_duration_ms(s)
        .ok()
        .filter(|ms| *ms >= 0)
        .map(|ms| Duration::from_millis(ms as u64))
        .ok_or_else(|| format!("not a valid duration: {s:?}"))
}

#[derive(Subcommand)]
enum ArchiveCommand {
    /// Backfill: an OpenMetrics file (with timestamps, `# EOF` at the end) into raw blocks
    /// of the archive.
    Import {
        /// The OpenMetrics file to read.
        #[arg(long)]
        openmetrics: PathBuf,
        /// The archive: a folder (`file:///path` or a path).
        #[arg(long)]
        archive: String,
        /// The time range of each block, aligned to UTC: a day, as compaction leaves blocks.
        #[arg(long, default_value = "1d", value_parser = prom_duration)]
        block: Duration,
    },
    /// Lists the archive's blocks: resolution, time range, series, samples, bytes, bytes per
    /// sample, and what is damaged (then the exit code is 1).
    Inspect {
        /// The archive: a folder (`file:///path` or a path).
        archive: String,
    },
}

#[derive(Subcommand)]
enum TestCommand {
    /// Rule unit tests in Prometheus' format, with promtool's output and exit codes.
    Rules {
        /// Test files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks that print the figures the README quotes.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// The whole stack on one machine: a simulated GPU fleet scraped by an HA pair of edges.
    Up(up::UpArgs),
    /// Serve simulated dcgm-exporter pages at /node/<i>/metrics.
    Simulate {
        /// Simulated nodes, one page each.
        #[arg(long, default_value_t = 4)]
        nodes: usize,
        /// GPUs on each node.
        #[arg(long, default_value_t = 8)]
        gpus_per_node: usize,
        /// Address to serve the pages on.
        #[arg(long, default_value = "127.0.0.1:9400")]
        listen: SocketAddr,
        /// Seed of the fleet's random behaviour: the same seed gives the same fleet.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Start the simulated clock at this Unix time (seconds) instead of now.
        #[arg(long)]
        start_at: Option<i64>,
        /// Prometheus' web configuration file: serve https and demand credentials.
        #[arg(long = "web.config.file")]
        web_config_file: Option<PathBuf>,
    },
    /// Tests, as `promtool test ...` runs them.
    #[command(subcommand)]
    Test(TestCommand),
    /// The Parquet archive: backfill it from an OpenMetrics file, or inspect it.
    #[command(subcommand)]
    Archive(ArchiveCommand),
    /// Run Prometheus' PromQL conformance files ($PROMQL_TESTDATA, else ../shared/promql-testdata).
    PromqlTest {
        /// The directory of `.test` files.
        dir: Option<PathBuf>,
        /// Print every failure and skip, not just the counts and the first failures.
        #[arg(long)]
        verbose: bool,
    },
    /// The global querier: fans out over the StoreAPI of edges and regionals, merges HA
    /// replicas, answers the Prometheus HTTP API.
    Global {
        /// The global's configuration file (stores, file SD, DNS, timeouts); without it,
        /// no stores (an `--archive` served alone).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address of the Prometheus HTTP API, `/api/v1/stores` and `/metrics`.
        #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], strata_global::DEFAULT_HTTP_PORT)))]
        http_listen: SocketAddr,
        /// Serve the StoreAPI here too, so that globals can be stacked.
        #[arg(long)]
        grpc_listen: Option<SocketAddr>,
        #[command(flatten)]
        grpc_tls: GrpcServerTls,
        /// A label that tells HA replicas apart (repeatable; default from the file, else `replica`).
        #[arg(long = "query.replica-label")]
        replica_labels: Vec<String>,
        /// Queries evaluated at once; the rest wait (Prometheus' flag of the same name).
        #[arg(long = "query.max-concurrency", default_value_t = strata_api::DEFAULT_MAX_CONCURRENCY)]
        query_max_concurrency: usize,
        /// Samples a query may touch (Prometheus' flag of the same name).
        #[arg(long = "query.max-samples", default_value_t = 50_000_000)]
        query_max_samples: u64,
        /// Let the stores evaluate a query's leaves and aggregations where the data is
        /// (`--query.pushdown=false`: select samples and evaluate here, as before).
        #[arg(long = "query.pushdown", default_value_t = true, action = clap::ArgAction::Set)]
        query_pushdown: bool,
        /// Where the series recorded by the global's own rules are kept (only with
        /// `rule_files` in the configuration) [default: strata-data/global].
        #[arg(long)]
        data: Option<PathBuf>,
        /// Prometheus' `--web.enable-lifecycle`: `POST /-/reload` reloads the global's rule files.
        #[arg(long = "web.enable-lifecycle")]
        web_enable_lifecycle: bool,
        /// The URL users reach the global at, for alerts' generator links [default: its
        /// HTTP address].
        #[arg(long = "web.external-url")]
        web_external_url: Option<String>,
        #[command(flatten)]
        alert_flags: AlertFlags,
        #[command(flatten)]
        archive: ArchiveFlags,
    },
    /// The regional tier: receives what edges forward (acknowledged once durable), stores
    /// it and serves the Prometheus HTTP API and the StoreAPI.
    Regional {
        /// The regional's configuration file (Strata's keys under `strata:`).
        #[arg(long)]
        config: PathBuf,
        /// Address of the Prometheus HTTP API and `/metrics` [default: 127.0.0.1:9491].
        #[arg(long)]
        http_listen: Option<SocketAddr>,
        /// Where edges forward to and globals read the StoreAPI (gRPC) [default: 127.0.0.1:9492].
        #[arg(long)]
        grpc_listen: Option<SocketAddr>,
        #[command(flatten)]
        grpc_tls: GrpcServerTls,
        /// Data directory [default: strata-data/regional, or `strata.data_dir` in the file].
        #[arg(long)]
        data: Option<PathBuf>,
        /// Queries evaluated at once; the rest wait (Prometheus' flag of the same name).
        #[arg(long = "query.max-concurrency", default_value_t = strata_api::DEFAULT_MAX_CONCURRENCY)]
        query_max_concurrency: usize,
        /// Prometheus' web configuration file: TLS (`tls_server_config`) and basic auth.
        #[arg(long = "web.config.file")]
        web_config_file: Option<PathBuf>,
        /// Prometheus' `--web.enable-lifecycle`: `POST /-/quit` stops the regional and
        /// `POST /-/reload` reloads its rule files.
        #[arg(long = "web.enable-lifecycle")]
        web_enable_lifecycle: bool,
        /// The URL users reach the regional at, for alerts' generator links [default: its
        /// HTTP address].
        #[arg(long = "web.external-url")]
        web_external_url: Option<String>,
        #[command(flatten)]
        alert_flags: AlertFlags,
    },
    /// The edge tier: scrape + remote-write receiver + WAL-backed head.
    Edge {
        /// A Prometheus configuration file (Strata's own keys under `strata:`).
        #[arg(long)]
        config: PathBuf,
        /// Address of the Prometheus HTTP API, remote write, `/metrics` and the lifecycle
        /// endpoints [default: 127.0.0.1:9401, or `strata.http_listen` in the file].
        #[arg(long)]
        http_listen: Option<SocketAddr>,
        /// Serve the StoreAPI (gRPC) here, for a global querier.
        #[arg(long)]
        grpc_listen: Option<SocketAddr>,
        #[command(flatten)]
        grpc_tls: GrpcServerTls,
        /// Data directory: WAL, head checkpoint and blocks [default: strata-data/edge, or
        /// `strata.data_dir` in the file]. One process per directory.
        #[arg(long)]
        data: Option<PathBuf>,
        /// Queries evaluated at once; the rest wait (Prometheus' flag of the same name).
        #[arg(long = "query.max-concurrency", default_value_t = strata_api::DEFAULT_MAX_CONCURRENCY)]
        query_max_concurrency: usize,
        /// Samples a query may touch (Prometheus' flag of the same name).
        #[arg(long = "query.max-samples", default_value_t = 50_000_000)]
        query_max_samples: u64,
        /// Allow reloading the configuration with `POST /-/reload` (SIGHUP always works).
        #[arg(long = "web.enable-lifecycle")]
        web_enable_lifecycle: bool,
        /// Prometheus' web configuration file: TLS (`tls_server_config`) and basic auth.
        #[arg(long = "web.config.file")]
        web_config_file: Option<PathBuf>,
        /// Prometheus' feature flags, comma-separated; Strata knows `promql-delayed-name-removal`.
        #[arg(long = "enable-feature", value_delimiter = ',')]
        enable_feature: Vec<String>,
    },
}

/// TLS for a StoreAPI server (Thanos' flags): a certificate and key turn it on; a client
/// CA makes clients present a certificate that chains to it.
#[derive(clap::Args)]
struct GrpcServerTls {
    /// TLS certificate of the StoreAPI server (PEM); with the key, turns TLS on.
    #[arg(long = "grpc-server-tls-cert", requires = "grpc_server_tls_key")]
    grpc_server_tls_cert: Option<PathBuf>,
    /// TLS private key of the StoreAPI server (PEM).
    #[arg(long = "grpc-server-tls-key", requires = "grpc_server_tls_cert")]
    grpc_server_tls_key: Option<PathBuf>,
    /// CA that clients' certificates must chain to; set, a client certificate is required.
    #[arg(long = "grpc-server-tls-client-ca", requires = "grpc_server_tls_cert")]
    grpc_server_tls_client_ca: Option<PathBuf>,
}

impl GrpcServerTls {
    fn files(self) -> Option<strata_grpc::ServerTlsFiles> {
        let (cert, key) = (self.grpc_server_tls_cert?, self.grpc_server_tls_key?);
        Some(strata_grpc::ServerTlsFiles { cert, key, client_ca: self.grpc_server_tls_client_ca })
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

#[cfg(feature = "promql-test")]
fn promql_test(dir: Option<PathBuf>, verbose: bool) -> anyhow::Result<()> {
    use strata_promql::testfile;
    let dir = dir.unwrap_or_else(|| testfile::default_dir(std::path::Path::new(".")));
    if !dir.is_dir() {
        anyhow::bail!(
            "the PromQL conformance suite did not run: {} does not exist (set PROMQL_TESTDATA)",
            dir.display()
        );
    }
    let report = testfile::run_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
    let shown = if verbose { usize::MAX } else { 20 };
    for f in report.failed.iter().take(shown) {
        println!("FAIL {f}");
    }
    if verbose {
        for s in &report.skipped {
            println!("SKIP {s}");
        }
    }
    println!(
        "promql conformance ({} files from {}): {} passed, {} failed, {} skipped",
        report.files,
        dir.display(),
        report.passed,
        report.failed.len(),
        report.skipped.len()
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // Request handlers parse, check and plan queries as deep as the engine accepts: their
    // threads get the stack that depth needs (address space; only what is used is memory).
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(strata_promql::limits::CALLER_STACK)
        .build()?
        .block_on(run())
}

async fn run() -> anyhow::Result<()> {
    init_logging();
    let cli = Cli::parse();
    match cli.command {
        Command::Up(args) => up::run(args).await,
        Command::Bench(cmd) => bench::run(cmd).await,
        Command::Archive(ArchiveCommand::Import { openmetrics, archive, block }) => {
            archive::import(&openmetrics, &archive, block).await
        }
        Command::Archive(ArchiveCommand::Inspect { archive }) => {
            if !archive::inspect(&archive).await? {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Test(TestCommand::Rules { files }) => {
            let out = tokio::task::spawn_blocking(move || strata_rules::unittest::run(&files)).await?;
            print!("{}", out.stdout);
            eprint!("{}", out.stderr);
            std::process::exit(out.exit_code());
        }
        #[cfg(feature = "promql-test")]
        Command::PromqlTest { dir, verbose } => tokio::task::spawn_blocking(move || promql_test(dir, verbose)).await?,
        #[cfg(not(feature = "promql-test"))]
        Command::PromqlTest { .. } => anyhow::bail!("this strata was built without the promql-test feature"),
        Command::Simulate { nodes, gpus_per_node, listen, seed, start_at, web_config_file } => {
            let web = match &web_config_file {
                Some(p) => strata_server::LiveWebConfig::load(p.clone())?,
                None => strata_server::LiveWebConfig::fixed(Default::default()),
            };
            let _watch = web.spawn_watcher(std::time::Duration::from_secs(5));
            let scheme = if web.current().tls.is_some() { "https" } else { "http" };
            let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
            let addr = listener.local_addr()?;
            let offset =
                start_at.map(|s| s.saturating_mul(1000).saturating_sub(strata_model::time::now_ms())).unwrap_or(0);
            println!("simulator listening on {scheme}://{addr} ({nodes} nodes x {gpus_per_node} GPUs: {scheme}://{addr}/node/0/metrics ...)");
            strata_simulator::serve(
                listener,
                strata_simulator::Fleet::new(seed, nodes, gpus_per_node),
                offset,
                web,
                shutdown_signal(),
            )
            .await?;
            Ok(())
        }
        Command::Global {
            config,
            http_listen,
            grpc_listen,
            grpc_tls,
            replica_labels,
            query_max_concurrency,
            query_max_samples,
            query_pushdown,
            data,
            web_enable_lifecycle,
            web_external_url,
            alert_flags,
            archive,
        } => {
            let mut opts = strata_global::GlobalOptions::new(config);
            opts.archive = archive.options();
            opts.data_dir = data;
            opts.enable_lifecycle = web_enable_lifecycle;
            opts.external_url = web_external_url;
            alert_flags.apply(&mut opts.rules);
            opts.http_listen = http_listen;
            opts.grpc_listen = grpc_listen;
            opts.grpc_tls = grpc_tls.files();
            opts.replica_labels = replica_labels;
            opts.api.max_concurrency = query_max_concurrency;
            opts.api.engine.max_samples = query_max_samples;
            opts.api.engine.pushdown = query_pushdown;
            let global = strata_global::Global::start(opts).await?;
            println!("global listening on http://{}", global.http_addr);
            if let Some(g) = global.grpc_addr {
                println!("global StoreAPI (gRPC) on {g}");
            }
            shutdown_signal().await;
            tracing::info!("shutting down");
            global.stop().await;
            Ok(())
        }
        Command::Regional {
            config,
            http_listen,
            grpc_listen,
            grpc_tls,
            data,
            query_max_concurrency,
            web_config_file,
            web_enable_lifecycle,
            web_external_url,
            alert_flags,
        } => {
            let mut opts = strata_regional::RegionalOptions::new(config);
            opts.external_url = web_external_url;
            alert_flags.apply(&mut opts.rules);
            opts.enable_lifecycle = web_enable_lifecycle;
            opts.http_listen = http_listen;
            opts.grpc_listen = grpc_listen;
            opts.grpc_tls = grpc_tls.files();
            opts.data_dir = data;
            opts.api.max_concurrency = query_max_concurrency;
            opts.web_config = web_config_file;
            let regional = strata_regional::Regional::start(opts).await?;
            println!("regional listening on {}://{}", regional.scheme, regional.http_addr);
            println!("regional StoreAPI and forward receiver (gRPC) on {}", regional.grpc_addr);
            tokio::select! {
                _ = shutdown_signal() => {}
                _ = regional.quit_requested() => tracing::info!("POST /-/quit"),
            }
            tracing::info!("shutting down");
            tokio::time::timeout(Duration::from_secs(30), regional.stop()).await.context("shutdown took over 30 s")?;
            Ok(())
        }
        Command::Edge {
            config,
            http_listen,
            grpc_listen,
            grpc_tls,
            data,
            query_max_concurrency,
            query_max_samples,
            web_enable_lifecycle,
            web_config_file,
            enable_feature,
        } => {
            let mut opts = strata_edge::EdgeOptions::new(config);
            for feature in enable_feature.iter().map(|f| f.trim()).filter(|f| !f.is_empty()) {
                match feature {
                    "promql-delayed-name-removal" => opts.api.engine.delayed_name_removal = true,
                    // As Prometheus: an unknown flag is logged, not fatal.
                    other => tracing::warn!(feature = other, "unknown option for --enable-feature, ignored"),
                }
            }
            opts.http_listen = http_listen;
            opts.grpc_listen = grpc_listen;
            opts.grpc_tls = grpc_tls.files();
            opts.data_dir = data;
            opts.api.max_concurrency = query_max_concurrency;
            opts.api.engine.max_samples = query_max_samples;
            opts.enable_lifecycle = web_enable_lifecycle;
            opts.web_config = web_config_file;
            let edge = strata_edge::Edge::start(opts).await?;
            println!("edge listening on {}://{}", edge.scheme, edge.http_addr);
            if let Some(g) = edge.grpc_addr {
                println!("edge StoreAPI (gRPC) on {g}");
            }
            shutdown_signal().await;
            tracing::info!("shutting down");
            tokio::time::timeout(Duration::from_secs(30), edge.stop()).await.context("shutdown took over 30 s")?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every flag and argument of every command says what it is (`--help` is the manual).
    #[test]
    fn every_flag_of_every_command_is_described() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    missing.push(format!("{path} {} (no description)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "strata", &mut missing);
        assert!(missing.is_empty(), "undescribed: {missing:#?}");
    }
}
