//! What enters Strata: the Prometheus and OpenMetrics text [`exposition`] parser,
//! [`relabel`]ing with Prometheus' rules, and [`import`] (backfill of an OpenMetrics file
//! into a database). The scrape loop and the remote-write receiver of the edge are wiring
//! around these.

pub mod exposition;
pub mod import;
pub mod relabel;
