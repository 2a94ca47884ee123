//! What forwarding reports in `/metrics`: the families every upstream shares, keyed by its
//! name (`<prefix>_forward_*`), and the handles one [`Forwarder`](crate::Forwarder) counts into.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Every upstream's progress, for `/metrics` (families keyed by `upstream`).
#[derive(Debug, Default, Clone)]
pub struct ForwardMetrics {
    batches_sent: Family<UpstreamLabel, Counter>,
    batches_acked: Family<UpstreamLabel, Counter>,
    samples_acked: Family<UpstreamLabel, Counter>,
    retries: Family<UpstreamLabel, Counter>,
    restarts_from_oldest: Family<UpstreamLabel, Counter>,
    unsendable_samples: Family<UpstreamLabel, Counter>,
    dropped_samples: Family<UpstreamLabel, Counter>,
    budget_dropped_samples: Family<UpstreamLabel, Counter>,
    sent_bytes: Family<UpstreamLabel, Counter>,
    pending_bytes: Family<UpstreamLabel, Gauge>,
    lag_seconds: Family<UpstreamLabel, Gauge<f64, AtomicU64>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabel {
    pub upstream: String,
}

impl ForwardMetrics {
    /// Registers the families (`<prefix>_forward_*`).
    pub fn register(&self, registry: &mut Registry) {
        self.register_as(registry, "forward");
    }

    /// Registers the families as `<prefix>_<name>_*`.
    pub fn register_as(&self, registry: &mut Registry, name: &str) {
        let r = registry.sub_registry_with_prefix(name);
        r.register("batches_sent", "Batches sent to the upstream", self.batches_sent.clone());
        r.register("batches_acked", "Batches the upstream acknowledged as durable", self.batches_acked.clone());
        r.register("samples_acked", "Samples the upstream acknowledged as durable", self.samples_acked.clone());
        r.register("retries", "Failed sessions and batches, each retried after a backoff", self.retries.clone());
        r.register(
            "restarts_from_oldest",
            "Times the upstream came back with new storage and was sent everything again",
            self.restarts_from_oldest.clone(),
        );
        r.register(
            "unsendable_samples",
            "Samples of references their WAL segment does not name (damage): not sent (logged)",
            self.unsendable_samples.clone(),
        );
        r.register(
            "dropped_samples",
            "Samples of batches the upstream refused as invalid again and again: dropped for it (logged with their range)",
            self.dropped_samples.clone(),
        );
        r.register(
            "budget_dropped_samples",
            "Samples the upstream still needed that the edge no longer held when they were due (deleted past retention and forward_max_disk, or in a damaged block): dropped for it, oldest first, logged with their range",
            self.budget_dropped_samples.clone(),
        );
        r.register("sent_bytes", "Bytes of batches sent, as protobuf before compression", self.sent_bytes.clone());
        r.register(
            "pending_bytes",
            "WAL bytes after the upstream's cursor, and about 2 bytes for each sample of a backlog from storage not yet acknowledged",
            self.pending_bytes.clone(),
        );
        r.register(
            "lag_seconds",
            "How far the newest acknowledged sample is behind the wall clock while data is pending (0: caught up)",
            self.lag_seconds.clone(),
        );
    }

    /// The handles of one upstream.
    pub fn upstream(&self, name: &str) -> ForwarderStats {
        let l = UpstreamLabel { upstream: name.to_string() };
        ForwarderStats {
            batches_sent: self.batches_sent.get_or_create(&l).clone(),
            batches_acked: self.batches_acked.get_or_create(&l).clone(),
            samples_acked: self.samples_acked.get_or_create(&l).clone(),
            retries: self.retries.get_or_create(&l).clone(),
            restarts_from_oldest: self.restarts_from_oldest.get_or_create(&l).clone(),
            unsendable_samples: self.unsendable_samples.get_or_create(&l).clone(),
            dropped_samples: self.dropped_samples.get_or_create(&l).clone(),
            budget_dropped_samples: self.budget_dropped_samples.get_or_create(&l).clone(),
            sent_bytes: self.sent_bytes.get_or_create(&l).clone(),
            pending_bytes: self.pending_bytes.get_or_create(&l).clone(),
            lag_seconds: self.lag_seconds.get_or_create(&l).clone(),
        }
    }
}

/// One upstream's progress (handles into [`ForwardMetrics`]).
#[derive(Debug, Clone, Default)]
pub struct ForwarderStats {
    pub batches_sent: Counter,
    pub batches_acked: Counter,
    pub samples_acked: Counter,
    /// Failed sessions and refused batches, each followed by a backoff.
    pub retries: Counter,
    /// Times the upstream came back with another storage identity.
    pub restarts_from_oldest: Counter,
    /// Samples of references their WAL segment does not name (damage): not sendable (logged).
    pub unsendable_samples: Counter,
    /// Samples of batches the upstream refused as invalid, dropped after retries (logged).
    pub dropped_samples: Counter,
    /// Samples of a backlog storage no longer held when due (logged with their range).
    pub budget_dropped_samples: Counter,
    /// Bytes of batches sent, as protobuf before compression.
    pub sent_bytes: Counter,
    /// WAL bytes after the cursor, and what is left of a backlog from storage.
    pub pending_bytes: Gauge,
    pub lag_seconds: Gauge<f64, AtomicU64>,
}
