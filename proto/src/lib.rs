//! Wire types shared by the tiers. Today: Prometheus remote write 1.0 (`prometheus`
//! package, as Prometheus' `prompb`). The tiers talk to one another only through the
//! messages defined here and through the Prometheus HTTP API, so a change of wire format
//! is a change in this crate and nowhere else.

/// Prometheus remote-write messages (`prompb`).
pub mod prometheus {
    include!(concat!(env!("OUT_DIR"), "/prometheus.rs"));
}
