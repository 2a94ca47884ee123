//! Prometheus' own remote-write metric names (`prometheus_remote_storage_*`, labelled
//! `remote_name` and `url`), so dashboards and alerts written for Prometheus' queues work.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub remote_name: String,
    pub url: String,
}

type F64Gauge = Gauge<f64, AtomicU64>;

fn batch_duration() -> Histogram {
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0])
}

/// Every remote write's families; register once in a registry without a prefix.
#[derive(Debug, Clone)]
pub struct RemoteWriteMetrics {
    samples: Family<QueueLabels, Counter>,
    samples_failed: Family<QueueLabels, Counter>,
    samples_retried: Family<QueueLabels, Counter>,
    samples_dropped: Family<QueueLabels, Counter>,
    samples_pending: Family<QueueLabels, Gauge>,
    bytes: Family<QueueLabels, Counter>,
    metadata: Family<QueueLabels, Counter>,
    metadata_failed: Family<QueueLabels, Counter>,
    metadata_retried: Family<QueueLabels, Counter>,
    metadata_bytes: Family<QueueLabels, Counter>,
    shards: Family<QueueLabels, Gauge>,
    shards_max: Family<QueueLabels, Gauge>,
    shards_min: Family<QueueLabels, Gauge>,
    shards_desired: Family<QueueLabels, F64Gauge>,
    highest_sent: Family<QueueLabels, F64Gauge>,
    batch_duration: Family<QueueLabels, Histogram, fn() -> Histogram>,
    /// The newest sample stored, in seconds (no labels, as Prometheus has it): with
    /// `queue_highest_sent_timestamp_seconds`, how far a queue is behind.
    pub highest_timestamp: F64Gauge,
}

impl Default for RemoteWriteMetrics {
    fn default() -> Self {
        RemoteWriteMetrics {
            samples: Family::default(),
            samples_failed: Family::default(),
            samples_retried: Family::default(),
            samples_dropped: Family::default(),
            samples_pending: Family::default(),
            bytes: Family::default(),
            metadata: Family::default(),
            metadata_failed: Family::default(),
            metadata_retried: Family::default(),
            metadata_bytes: Family::default(),
            shards: Family::default(),
            shards_max: Family::default(),
            shards_min: Family::default(),
            shards_desired: Family::default(),
            highest_sent: Family::default(),
            batch_duration: Family::new_with_constructor(batch_duration),
            highest_timestamp: F64Gauge::default(),
        }
    }
}

impl RemoteWriteMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("prometheus_remote_storage");
        r.register("samples", "Samples sent to remote storage", self.samples.clone());
        r.register(
            "samples_failed",
            "Samples that failed on send for good (a 4xx other than a retried 429): dropped, logged with their range",
            self.samples_failed.clone(),
        );
        r.register("samples_retried", "Samples sent again after a recoverable error", self.samples_retried.clone());
        r.register(
            "samples_dropped",
            "Samples read from the WAL and not sent: dropped by write_relabel_configs or past sample_age_limit",
            self.samples_dropped.clone(),
        );
        r.register(
            "samples_pending",
            "Samples read from the WAL and not yet acknowledged",
            self.samples_pending.clone(),
        );
        r.register("bytes", "Bytes of samples sent, after compression", self.bytes.clone());
        r.register("metadata", "Metadata entries sent to remote storage", self.metadata.clone());
        r.register("metadata_failed", "Metadata entries that failed on send for good", self.metadata_failed.clone());
        r.register(
            "metadata_retried",
            "Metadata entries sent again after a recoverable error",
            self.metadata_retried.clone(),
        );
        r.register("metadata_bytes", "Bytes of metadata sent, after compression", self.metadata_bytes.clone());
        r.register("shards", "Shards sending in parallel in the last round", self.shards.clone());
        r.register("shards_max", "The most shards the queue may use", self.shards_max.clone());
        r.register("shards_min", "The fewest shards the queue uses", self.shards_min.clone());
        r.register("shards_desired", "Shards the last round's backlog would use", self.shards_desired.clone());
        r.register(
            "queue_highest_sent_timestamp_seconds",
            "The newest timestamp acknowledged by the remote storage, in seconds",
            self.highest_sent.clone(),
        );
        r.register(
            "sent_batch_duration_seconds",
            "Duration of send calls to the remote storage",
            self.batch_duration.clone(),
        );
        r.register(
            "highest_timestamp_in_seconds",
            "The newest timestamp stored in the WAL, in seconds",
            self.highest_timestamp.clone(),
        );
    }

    /// The handles of one queue.
    pub fn queue(&self, remote_name: &str, url: &str) -> QueueStats {
        let l = QueueLabels { remote_name: remote_name.to_string(), url: url.to_string() };
        QueueStats {
            samples: self.samples.get_or_create(&l).clone(),
            samples_failed: self.samples_failed.get_or_create(&l).clone(),
            samples_retried: self.samples_retried.get_or_create(&l).clone(),
            samples_dropped: self.samples_dropped.get_or_create(&l).clone(),
            samples_pending: self.samples_pending.get_or_create(&l).clone(),
            bytes: self.bytes.get_or_create(&l).clone(),
            metadata: self.metadata.get_or_create(&l).clone(),
            metadata_failed: self.metadata_failed.get_or_create(&l).clone(),
            metadata_retried: self.metadata_retried.get_or_create(&l).clone(),
            metadata_bytes: self.metadata_bytes.get_or_create(&l).clone(),
            shards: self.shards.get_or_create(&l).clone(),
            shards_max: self.shards_max.get_or_create(&l).clone(),
            shards_min: self.shards_min.get_or_create(&l).clone(),
            shards_desired: self.shards_desired.get_or_create(&l).clone(),
            highest_sent: self.highest_sent.get_or_create(&l).clone(),
            batch_duration: self.batch_duration.get_or_create(&l).clone(),
        }
    }
}

/// One queue's handles.
#[derive(Debug, Clone)]
pub struct QueueStats {
    pub samples: Counter,
    pub samples_failed: Counter,
    pub samples_retried: Counter,
    pub samples_dropped: Counter,
    pub samples_pending: Gauge,
    pub bytes: Counter,
    pub metadata: Counter,
    pub metadata_failed: Counter,
    pub metadata_retried: Counter,
    pub metadata_bytes: Counter,
    pub shards: Gauge,
    pub shards_max: Gauge,
    pub shards_min: Gauge,
    pub shards_desired: F64Gauge,
    pub highest_sent: F64Gauge,
    pub batch_duration: Histogram,
}

impl Default for QueueStats {
    fn default() -> Self {
        RemoteWriteMetrics::default().queue("", "")
    }
}
