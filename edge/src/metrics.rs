//! The edge's self-metrics, served at `/metrics`: its scrape, remote-write and reload
//! counters, plus the database's own ([`TsdbMetrics`]), registered into the same registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use strata_tsdb::metrics::TsdbMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabel {
    pub job: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

pub struct EdgeMetrics {
    pub registry: Registry,
    pub scrapes: Family<JobLabel, Counter>,
    pub scrape_failures: Family<JobLabel, Counter>,
    pub scrape_series_limit_dropped: Family<JobLabel, Counter>,
    /// Scraped samples the database refused, as Prometheus' `prometheus_target_scrapes_sample_*`.
    pub scrape_out_of_order: Counter,
    pub scrape_duplicate_timestamp: Counter,
    pub scrape_out_of_bounds: Counter,
    /// The remote-write receiver's (`strata_remote_write_*`).
    pub receive: Arc<strata_receive::ReceiveMetrics>,
    pub config_reloads: Family<ReasonLabel, Counter>,
    /// File-SD files that could not be read or parsed (Prometheus' `prometheus_sd_file_read_errors_total`).
    pub sd_file_read_errors: Counter,
    pub config_last_reload_success: Gauge,
    /// Each `strata.forward` upstream's progress (`strata_forward_*{upstream}`).
    pub forward: strata_forward::ForwardMetrics,
    /// Prometheus' `prometheus_remote_storage_*` families, by queue.
    pub remote_write: strata_remote_write::RemoteWriteMetrics,
    /// Each remote write's cursor, lag and backlog, as `strata_remote_write_queue_*` (the
    /// forward mechanism's families, keyed by `upstream="remote-write/<name>"`).
    pub remote_write_queues: strata_forward::ForwardMetrics,
}

impl EdgeMetrics {
    /// The edge's metrics, with the database's registered beside them.
    pub fn new(db: &TsdbMetrics) -> Self {
        // Strata's own families under `strata_`; Prometheus' remote-write names at the root.
        let mut root = Registry::default();
        let remote_write = strata_remote_write::RemoteWriteMetrics::default();
        remote_write.register(&mut root);
        let registry = root.sub_registry_with_prefix("strata");
        db.register(registry);
        let scrapes = Family::default();
        registry.register("scrapes", "Scrapes attempted, by job", scrapes.clone());
        let scrape_failures = Family::default();
        registry.register("scrape_failures", "Scrapes that failed (up = 0), by job", scrape_failures.clone());
        let scrape_series_limit_dropped = Family::default();
        registry.register(
            "scrape_series_limit_dropped_samples",
            "Scraped samples of new series dropped because the database is at its series limit, by job",
            scrape_series_limit_dropped.clone(),
        );
        let scrape_out_of_order = Counter::default();
        registry.register(
            "target_scrapes_sample_out_of_order",
            "Scraped samples refused as out of order",
            scrape_out_of_order.clone(),
        );
        let scrape_duplicate_timestamp = Counter::default();
        registry.register(
            "target_scrapes_sample_duplicate_timestamp",
            "Scraped samples refused for a different value at a stored timestamp",
            scrape_duplicate_timestamp.clone(),
        );
        let scrape_out_of_bounds = Counter::default();
        registry.register(
            "target_scrapes_sample_out_of_bounds",
            "Scraped samples refused as older than retention or too far in the future",
            scrape_out_of_bounds.clone(),
        );
        let receive = Arc::new(strata_receive::ReceiveMetrics::default());
        receive.register(registry);
        let sd_file_read_errors = Counter::default();
        registry.register(
            "sd_file_read_errors",
            "File-SD files that could not be read or parsed (their last good targets are kept)",
            sd_file_read_errors.clone(),
        );
        let config_reloads = Family::default();
        registry.register("config_reloads", "Configuration reloads by result", config_reloads.clone());
        let config_last_reload_success = Gauge::default();
        registry.register(
            "config_last_reload_successful",
            "Whether the last configuration reload succeeded",
            config_last_reload_success.clone(),
        );
        let forward = strata_forward::ForwardMetrics::default();
        forward.register(registry);
        let remote_write_queues = strata_forward::ForwardMetrics::default();
        remote_write_queues.register_as(registry, "remote_write_queue");
        EdgeMetrics {
            registry: root,
            remote_write,
            remote_write_queues,
            scrapes,
            scrape_failures,
            scrape_series_limit_dropped,
            scrape_out_of_order,
            scrape_duplicate_timestamp,
            scrape_out_of_bounds,
            receive,
            config_reloads,
            sd_file_read_errors,
            config_last_reload_success,
            forward,
        }
    }

    pub fn encode(&self) -> String {
        let mut s = String::new();
        if prometheus_client::encoding::text::encode(&mut s, &self.registry).is_err() {
            s.push_str("# encoding self-metrics failed\n");
        }
        s
    }
}
