//! `strata bench ...`: the benchmarks that print the figures quoted in the README and the
//! issues. Each compares against its anchor in the same run where one exists.

mod alert_latency;
mod archive_month;
mod attack;
mod downsample;
mod fleet_day;
mod forward;
mod forward_wire;
mod global_pair;
mod ingest;
mod rules;
mod scale;
mod seed_scale;
mod through_stack;
mod vs_prometheus;
mod vs_prometheus_write;
mod wal_day;

use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Parse + relabel + append + WAL of simulated DCGM pages on one core.
    Ingest {
        /// Simulated nodes, one page each.
        #[arg(long, default_value_t = 64)]
        nodes: usize,
        /// GPUs on each node.
        #[arg(long, default_value_t = 8)]
        gpus_per_node: usize,
        /// Scrapes per node (5 s apart in simulated time).
        #[arg(long, default_value_t = 120)]
        scrapes: usize,
        /// Repetitions on fresh databases (the machine is noisy: best and median are printed).
        #[arg(long, default_value_t = 5)]
        reps: usize,
    },
    /// Load the fleet-day OpenMetrics file into an empty head: import rate, head bytes per
    /// sample, index bytes per series.
    FleetDay {
        /// The file `../shared/bench/fleet_day.py path` names.
        #[arg(long)]
        file: Option<PathBuf>,
        /// After loading, serve the Prometheus API here until Ctrl-C (for `fleet_day.py run --other`).
        #[arg(long)]
        serve: Option<std::net::SocketAddr>,
        /// Serve through a global querier instead: the day as an HA pair (replicas `a` and
        /// `b`, each a StoreAPI on loopback), fanned out and deduplicated.
        #[arg(long)]
        via_global: bool,
        /// Through the global, select samples instead of letting the edges evaluate
        /// (pushdown off), to measure what pushdown saves.
        #[arg(long)]
        no_pushdown: bool,
        /// With `--via-global`: a regional beside the pair holds the day's 5 m and 1 h
        /// aggregates, and the global plans each leaf's resolution.
        #[arg(long)]
        downsample: bool,
        /// Serve through the tiers as users run them instead: two edges (an HA pair)
        /// forward the day to a `strata regional` process, which downsamples it, and a
        /// `strata global` process over the three serves the API (prints forwarding and
        /// downsampling times).
        #[arg(long, requires = "serve", conflicts_with_all = ["via_global", "no_pushdown", "downsample"])]
        through_stack: bool,
    },
    /// The storage at scale: simulated DCGM series at 5 s appended directly (no HTTP) for
    /// simulated hours, blocks cut and compacted beside it; ingest rate, peak RSS, bytes on
    /// disk per sample, restart time.
    Scale {
        /// Series appended.
        #[arg(long, default_value_t = 100_000)]
        series: usize,
        /// Simulated hours of samples.
        #[arg(long, default_value_t = 2.0)]
        hours: f64,
        /// Seconds between samples.
        #[arg(long, default_value_t = 5)]
        interval: u64,
        /// Keep the data here instead of a temporary directory.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Also time a start after a crash (the whole head window replayed from the WAL).
        #[arg(long)]
        crash_restart: bool,
        /// Then feed the same fleet to this Prometheus (2.42) and compare peak memory.
        #[arg(long)]
        vs_prometheus: Option<String>,
    },
    /// The global's fan-out at scale: N series served by an HA pair over gRPC, selected
    /// through the fan-out and the dedup; time and peak memory of the select.
    Global {
        /// Series each replica serves.
        #[arg(long, default_value_t = 1_000_000)]
        series: usize,
    },
    /// `bench global`'s child: serves the simulated series as an HA pair.
    #[command(hide = true)]
    GlobalServers {
        /// Series each replica serves.
        #[arg(long)]
        series: usize,
        /// Where to write the servers' addresses once they listen.
        #[arg(long)]
        addr_file: PathBuf,
    },
    /// The attacks of issue 8, together, against an edge that scrapes and receives remote
    /// write: what each gets, and the edge's peak memory.
    Attack {
        /// Simulated nodes the edge scrapes meanwhile.
        #[arg(long, default_value_t = 32)]
        nodes: usize,
        /// Seconds of normal load before the attacks.
        #[arg(long, default_value_t = 15)]
        seconds: u64,
    },
    /// The fleet day remote-written into an empty edge: ingest rate and CPU, bytes per
    /// sample of the whole data directory for two minutes after the last write, restart
    /// times; VictoriaMetrics given the same requests in the same run.
    WalDay {
        /// The file `../shared/bench/fleet_day.py path` names.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Run this `strata` binary as the edge (another build, to compare).
        #[arg(long)]
        edge_binary: Option<PathBuf>,
        /// Also VictoriaMetrics (Debian's `victoria-metrics`).
        #[arg(long)]
        vm: bool,
        /// Keep the edge's data directory under this folder, to look into (skips VictoriaMetrics).
        #[arg(long)]
        keep: Option<PathBuf>,
        /// Only the writes: no two minutes of watching, no restarts.
        #[arg(long)]
        ingest_only: bool,
    },
    /// An edge's backlog after an outage forwarded to a regional process: catch-up time
    /// against the outage, samples per second, CPU per million samples on each side.
    Forward {
        /// Series of the simulated fleet (470 k samples/s is 2.35 M series at 5 s).
        #[arg(long, default_value_t = 100_000)]
        series: usize,
        /// Length of the outage, in seconds of data.
        #[arg(long, default_value_t = 600)]
        seconds: u64,
        /// Seconds of data forwarded and acknowledged before the outage, so that it starts
        /// inside the head's open chunks as a real outage does.
        #[arg(long, default_value_t = 900)]
        before: u64,
        /// Seconds between samples of a series.
        #[arg(long, default_value_t = 5)]
        interval: u64,
        /// Samples per forwarded batch (the edge's default).
        #[arg(long, default_value_t = 200_000)]
        batch: usize,
        /// How batches are compressed: zstd (the edge's default), gzip (earlier versions'),
        /// none.
        #[arg(long, default_value = "zstd")]
        compression: String,
        /// Read the backlog from the WAL, record by record, as for an upstream only a
        /// little behind (the anchor for the backlog from storage).
        #[arg(long)]
        from_wal: bool,
        /// Batches pushed before the first is acknowledged (the edge's default; 1 is how
        /// earlier versions sent, one at a time).
        #[arg(long, default_value_t = 2)]
        in_flight: usize,
    },
    /// From a simulated GPU's memory overheating to its alert in Alertmanager, through an
    /// HA pair of edges and a regional running the GPU pack, against Prometheus 2.42 with
    /// the same rule file scraping the same fleet, one real Alertmanager for both.
    AlertLatency {
        /// Simulated nodes (8 GPUs each).
        #[arg(long, default_value_t = 8)]
        nodes: usize,
        /// The Prometheus binary.
        #[arg(long, default_value = "prometheus")]
        prometheus: String,
        /// The Alertmanager binary.
        #[arg(long, default_value = "prometheus-alertmanager")]
        alertmanager: String,
    },
    /// One evaluation round of a rule pack (the GPU pack of `deploy/rules` by default)
    /// over the fleet-day data, Strata against Prometheus 2.42 on the same data in the same
    /// run: every rule's expression at the same times through each one's HTTP API, the
    /// answers compared.
    Rules {
        /// The file `../shared/bench/fleet_day.py path` names (Prometheus reads the blocks
        /// `fleet_day.py prepare` backfilled beside it).
        #[arg(long)]
        file: Option<PathBuf>,
        /// Rule files [default: deploy/rules' pack].
        #[arg(long = "rules")]
        rules: Vec<PathBuf>,
        /// Evaluation rounds, spread over the day's second half.
        #[arg(long, default_value_t = 20)]
        rounds: usize,
        /// The Prometheus binary.
        #[arg(long, default_value = "prometheus")]
        prometheus: String,
    },
    /// Forwarding at steady state against Prometheus' remote write in one run: an edge
    /// forwarding the scraped fleet to a regional, Prometheus remote-writing the same fleet
    /// to a second Prometheus; samples per second, bytes per sample on the wire (through
    /// counting proxies), CPU per million samples of each sender and receiver.
    ForwardVsPrometheus {
        /// Simulated nodes both scrape.
        #[arg(long, default_value_t = 64)]
        nodes: usize,
        /// Seconds between scrapes.
        #[arg(long, default_value_t = 1)]
        interval: u64,
        /// Seconds measured, after 15 s of warm-up.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// The Prometheus binary (the sender and the receivers).
        #[arg(long, default_value = "prometheus")]
        prometheus: String,
        /// The edge remote-writes to a second receiving Prometheus instead of forwarding.
        #[arg(long)]
        edge_remote_write: bool,
    },
    /// The edge and Prometheus scraping the same simulated fleet: CPU seconds and peak
    /// resident memory per million samples ingested.
    VsPrometheus {
        /// Simulated nodes both scrape.
        #[arg(long, default_value_t = 256)]
        nodes: usize,
        /// Seconds of scraping measured.
        #[arg(long, default_value_t = 120)]
        seconds: u64,
        /// Seconds between scrapes (with --remote-write: between the instants sent).
        #[arg(long, default_value_t = 5)]
        interval: u64,
        /// The Prometheus binary to run beside the edge.
        #[arg(long, default_value = "prometheus")]
        prometheus: String,
        /// Instead of scraping, both receive the same remote-write requests: the fleet's
        /// pages at this many instants.
        #[arg(long, value_name = "INSTANTS")]
        remote_write: Option<usize>,
    },
    /// The seed's scale: GPUs × the six fleet-day fields over a day, downsampled by a
    /// regional (its peak memory), the twelve fleet-day queries over the day through a
    /// global, each timed.
    SeedScale {
        /// GPUs simulated (eight a node, 250 nodes a cluster).
        #[arg(long, default_value_t = 16_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        gpus: u32,
        /// Hours of data, ending at the last midnight (UTC); the queries cover them.
        #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u64).range(1..=24 * 30))]
        hours: u64,
        /// Seconds between samples.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
        interval: u64,
        /// Times each query is asked (the median is printed).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
        reps: u32,
        /// Load the data through the tiers as processes instead (`bench fleet-day
        /// --through-stack`): two edges forward it to a regional process, which downsamples
        /// it; a global process answers.
        #[arg(long)]
        through_stack: bool,
    },
    /// The archive reader's peak memory over a month of the fleet (simulated day by day and
    /// written by the import's block writer), against the same reader over its first day.
    ArchiveMonth {
        /// GPUs simulated, the six fleet-day fields each (512: the fleet-day set's series).
        #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        gpus: u32,
        /// Days of history, ending at the last midnight (UTC).
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=400))]
        days: u32,
        /// Seconds between samples.
        #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
        interval: u64,
        /// Keep the archive under this folder instead of a temporary one.
        #[arg(long)]
        keep: Option<PathBuf>,
    },
    /// The fleet-day set's 5 m and 1 h window aggregates: bytes per raw sample per metric
    /// and per column, build and encode speed.
    Downsample {
        /// The file `../shared/bench/fleet_day.py path` names.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Keep the least-squares sums of `deriv` and `predict_linear` for gauges too.
        #[arg(long)]
        least_squares: bool,
        /// Keep when each window's extremes were taken (`ts_of_min/max_over_time`).
        #[arg(long)]
        extreme_times: bool,
    },
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Attack { nodes, seconds } => attack::run(nodes, seconds).await,
        BenchCommand::Ingest { nodes, gpus_per_node, scrapes, reps } => {
            tokio::task::spawn_blocking(move || ingest::run(nodes, gpus_per_node, scrapes, reps)).await?
        }
        BenchCommand::Scale { series, hours, interval, dir, crash_restart, vs_prometheus } => {
            tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                let strata = scale::run(series, hours, interval, dir, crash_restart)?;
                if let Some(prometheus) = vs_prometheus {
                    let prom = scale::run_prometheus(series, hours, interval, &prometheus)?;
                    println!(
                        "  peak RSS, strata / prometheus: {strata:.0} / {prom:.0} MB = {:.2} (goal <= 0.5 at 500 k series)",
                        strata / prom.max(1.0)
                    );
                }
                Ok(())
            })
            .await?
        }
        BenchCommand::FleetDay { file, serve, via_global, no_pushdown, downsample, through_stack } => {
            let fleet_day::Loaded(db, _dir) = tokio::task::spawn_blocking(move || fleet_day::run(file)).await??;
            if let (true, Some(addr)) = (through_stack, serve) {
                let _stack = through_stack::start(db, addr).await?;
                println!("serving the fleet-day data through edges, a regional and a global at http://{addr} (Ctrl-C stops)");
                crate::shutdown_signal().await;
                return Ok(());
            }
            let local: std::sync::Arc<dyn strata_store::Store> =
                std::sync::Arc::new(strata_tsdb::TsdbStore(std::sync::Arc::new(db)));
            if let Some(addr) = serve {
                let store = match (via_global, downsample) {
                    (true, true) => global_pair::serve_pair_with_aggregates(local).await?,
                    (true, false) => global_pair::serve_pair(local).await?,
                    (false, _) => local,
                };
                let listener = tokio::net::TcpListener::bind(addr).await?;
                let what = if via_global { "through a global over an HA pair" } else { "from one store" };
                println!("serving the fleet-day data {what} at http://{} (Ctrl-C stops)", listener.local_addr()?);
                let mut opts = strata_api::ApiOptions::default();
                opts.engine.pushdown = !no_pushdown;
                // The limits `fleet_day.py` gives Prometheus: Strata's counts samples touched
                // over all steps, which `[1h]` ranges at step 60 over a day exceed at 50 M.
                opts.engine.max_samples = 1_000_000_000;
                opts.engine.timeout = std::time::Duration::from_secs(300);
                let app = strata_api::router_with(store, opts);
                axum::serve(listener, app).with_graceful_shutdown(crate::shutdown_signal()).await?;
            }
            Ok(())
        }
        BenchCommand::Downsample { file, least_squares, extreme_times } => {
            downsample::run(file, strata_downsample::Asked { least_squares, extreme_times })
        }
        BenchCommand::SeedScale { gpus, hours, interval, reps, through_stack } => {
            seed_scale::run(gpus as usize, hours, interval, reps as usize, through_stack).await
        }
        BenchCommand::ArchiveMonth { gpus, days, interval, keep } => {
            archive_month::run(gpus as usize, days, interval, keep.as_deref()).await
        }
        BenchCommand::Global { series } => global_pair::fanout_memory(series).await,
        BenchCommand::GlobalServers { series, addr_file } => global_pair::serve_simulated_pair(series, &addr_file).await,
        BenchCommand::WalDay { file, edge_binary, vm, keep, ingest_only } => {
            wal_day::run(file, edge_binary, vm, keep, ingest_only).await
        }
        BenchCommand::Forward { series, seconds, before, interval, batch, compression, from_wal, in_flight } => {
            let compression = match compression.as_str() {
                "zstd" => strata_forward::BatchCompression::Zstd,
                "gzip" => strata_forward::BatchCompression::Gzip,
                "none" => strata_forward::BatchCompression::None,
                other => anyhow::bail!("--compression {other}: zstd, gzip or none"),
            };
            forward::run(series, seconds, before, interval, batch, compression, from_wal, in_flight).await
        }
        BenchCommand::AlertLatency { nodes, prometheus, alertmanager } => {
            alert_latency::run(nodes, &prometheus, &alertmanager).await
        }
        BenchCommand::Rules { file, rules, rounds, prometheus } => rules::run(file, rules, rounds, &prometheus).await,
        BenchCommand::ForwardVsPrometheus { nodes, interval, seconds, prometheus, edge_remote_write } => {
            forward_wire::run(nodes, interval, seconds, &prometheus, edge_remote_write).await
        }
        BenchCommand::VsPrometheus { nodes, seconds, interval, prometheus, remote_write } => match remote_write {
            Some(instants) => vs_prometheus_write::run(nodes, interval, instants, &prometheus).await,
            None => vs_prometheus::run(nodes, interval, seconds, &prometheus).await,
        },
    }
}

pub fn print_head_stats(db: &strata_tsdb::db::Tsdb) {
    let st = db.stats();
    println!("  head: {} series, {} samples", st.series, st.samples);
    println!(
        "  head chunk bytes per sample: {:.3}  (goal <= 1.3; VictoriaMetrics keeps the fleet-day set in 1.7 on disk)",
        st.chunk_bytes as f64 / st.samples.max(1) as f64
    );
    println!(
        "  index bytes per series:      {:.0}  (goal <= 1024; postings, interned strings, label vectors, series table)",
        st.index_bytes as f64 / st.series.max(1) as f64
    );
}
