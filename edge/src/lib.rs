//! The edge tier: scrapes dcgm-exporter (or any `/metrics`) and accepts Prometheus remote
//! write, storing both in a compressed, WAL-backed head; serves self-monitoring and the
//! Prometheus query API. This crate is wiring and loops: the parser and relabeling live in
//! `strata-ingest`, the storage in `strata-tsdb`, the query API in `strata-api`.

pub mod backfill;
pub mod config;
pub mod http_client;
pub mod manager;
pub mod metrics;
pub mod scrape;
pub mod security;
pub mod server;
pub mod targets;

pub use server::{Edge, EdgeError, EdgeOptions};
