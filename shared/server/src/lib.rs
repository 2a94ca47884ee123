//! The HTTP server every Strata process runs (the tiers and the simulator): bounded
//! against slow and greedy clients ([`serve`], [`ServerLimits`]) and, with Prometheus' web
//! configuration file ([`WebConfig`]), TLS, client certificates and basic auth. The routes
//! are the caller's; this crate only serves them.

mod live;
mod serve;
#[cfg(any(test, feature = "test-certs"))]
pub mod test_certs;
pub mod web_config;

pub use live::LiveWebConfig;
pub use serve::{serve, ServerLimits};
pub use web_config::{WebConfig, WebConfigError};
