//! The edge's self-monitoring, served at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabel {
    pub job: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

pub struct EdgeMetrics {
    pub registry: Registry,
    pub samples_appended: Counter,
    pub active_series: Gauge,
    pub head_chunk_bytes: Gauge,
    pub wal_bytes: Gauge,
    pub wal_fsync_seconds: Histogram,
    pub scrapes: Family<JobLabel, Counter>,
    pub scrape_failures: Family<JobLabel, Counter>,
    pub remote_write_requests: Family<CodeLabel, Counter>,
    pub remote_write_samples: Counter,
    pub remote_write_rejected: Family<ReasonLabel, Counter>,
    pub config_reloads: Family<ReasonLabel, Counter>,
    pub config_last_reload_success: Gauge,
}

impl EdgeMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("strata");
        let samples_appended = Counter::default();
        registry.register("head_samples_appended", "Samples appended to the head (after WAL logging)", samples_appended.clone());
        let active_series = Gauge::default();
        registry.register("head_series", "Series held in the head", active_series.clone());
        let head_chunk_bytes = Gauge::default();
        registry.register("head_chunk_bytes", "Bytes of compressed chunk data in the head", head_chunk_bytes.clone());
        let wal_bytes = Gauge::default();
        registry.register("wal_bytes", "Bytes of WAL segments on disk", wal_bytes.clone());
        let wal_fsync_seconds = Histogram::new([0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]);
        registry.register("wal_fsync_duration_seconds", "Duration of WAL fsync calls", wal_fsync_seconds.clone());
        let scrapes = Family::default();
        registry.register("scrapes", "Scrapes attempted, by job", scrapes.clone());
        let scrape_failures = Family::default();
        registry.register("scrape_failures", "Scrapes that failed (up = 0), by job", scrape_failures.clone());
        let remote_write_requests = Family::default();
        registry.register("remote_write_requests", "Remote-write requests by HTTP status code", remote_write_requests.clone());
        let remote_write_samples = Counter::default();
        registry.register("remote_write_samples", "Samples received by remote write and stored", remote_write_samples.clone());
        let remote_write_rejected = Family::default();
        registry.register("remote_write_rejected_samples", "Remote-write samples refused, by reason", remote_write_rejected.clone());
        let config_reloads = Family::default();
        registry.register("config_reloads", "Configuration reloads by result", config_reloads.clone());
        let config_last_reload_success = Gauge::default();
        registry.register("config_last_reload_successful", "Whether the last configuration reload succeeded", config_last_reload_success.clone());
        EdgeMetrics {
            registry,
            samples_appended,
            active_series,
            head_chunk_bytes,
            wal_bytes,
            wal_fsync_seconds,
            scrapes,
            scrape_failures,
            remote_write_requests,
            remote_write_samples,
            remote_write_rejected,
            config_reloads,
            config_last_reload_success,
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

impl Default for EdgeMetrics {
    fn default() -> Self {
        Self::new()
    }
}
