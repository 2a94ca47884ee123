//! Wire types shared by the tiers: Prometheus remote write 1.0 (`prometheus` package, as
//! Prometheus' `prompb`) and Strata's StoreAPI (`store`). The tiers talk to one another only through the
//! messages defined here and through the Prometheus HTTP API, so a change of wire format
//! is a change in this crate and nowhere else.

/// Prometheus remote-write messages (`prompb`).
pub mod prometheus {
    include!(concat!(env!("OUT_DIR"), "/prometheus.rs"));
}

/// Strata's StoreAPI (`strata.store.v1`): messages always; with the `grpc` feature, the
/// `store_client` and `store_server` modules too.
pub mod store {
    include!(concat!(env!("OUT_DIR"), "/strata.store.v1.rs"));
}
