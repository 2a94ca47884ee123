//! The receiver's counters, registered into a tier's `/metrics` as
//! `strata_remote_write_*`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Debug, Default, Clone)]
pub struct ReceiveMetrics {
    pub remote_write_requests: Family<CodeLabel, Counter>,
    pub remote_write_samples: Counter,
    pub remote_write_rejected: Family<ReasonLabel, Counter>,
    pub remote_write_rejected_metadata: Counter,
}

impl ReceiveMetrics {
    /// Registers the counters (sharing them: later updates show), with `204` listed from
    /// the start.
    pub fn register(&self, registry: &mut Registry) {
        let _ = self.remote_write_requests.get_or_create(&CodeLabel { code: "204".into() });
        registry.register(
            "remote_write_requests",
            "Remote-write requests by HTTP status code",
            self.remote_write_requests.clone(),
        );
        registry.register(
            "remote_write_samples",
            "Samples received by remote write and stored",
            self.remote_write_samples.clone(),
        );
        registry.register(
            "remote_write_rejected_samples",
            "Remote-write samples refused, by reason",
            self.remote_write_rejected.clone(),
        );
        registry.register(
            "remote_write_rejected_metadata",
            "Remote-write metadata entries skipped (a name, help or unit that is not UTF-8)",
            self.remote_write_rejected_metadata.clone(),
        );
    }

    /// The counters as `/metrics` shows them (tests).
    pub fn encode(&self) -> String {
        let mut registry = Registry::with_prefix("strata");
        self.register(&mut registry);
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &registry);
        s
    }
}
