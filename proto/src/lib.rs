//! Wire types shared by the tiers: Prometheus remote write 1.0 (`prometheus` package, as
//! Prometheus' `prompb`) and Strata's StoreAPI (`store`), forward protocol (`forward`) and rules API (`rules`). The tiers talk to one another only through the
//! messages defined here and through the Prometheus HTTP API, so a change of wire format
//! is a change in this crate and nowhere else.

/// Prometheus remote-write messages (`prompb`).
pub mod prometheus {
    include!(concat!(env!("OUT_DIR"), "/prometheus.rs"));
}

/// Strata's own packages, nested as their names are (the forward protocol's messages
/// refer to the StoreAPI's as `super::super::store::v1`).
mod strata {
    pub mod store {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/strata.store.v1.rs"));
        }
    }
    pub mod forward {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/strata.forward.v1.rs"));
        }
    }
    pub mod rules {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/strata.rules.v1.rs"));
        }
    }
}

/// Strata's StoreAPI (`strata.store.v1`): messages always; with the `grpc` feature, the
/// `store_client` and `store_server` modules too.
pub use strata::store::v1 as store;

/// Strata's forward protocol (`strata.forward.v1`): an edge's stored data streamed to a
/// regional, acknowledged once durable. With the `grpc` feature, `forward_client` and
/// `forward_server` too.
pub use strata::forward::v1 as forward;

/// Strata's rules API (`strata.rules.v1`): a regional's rules and alerts, for a global to
/// merge. With the `grpc` feature, `rules_client` and `rules_server` too.
pub use strata::rules::v1 as rules;
