//! End-to-end tests: real `strata` processes (and Prometheus where a comparison needs it)
//! on loopback with free ports, bounded in time, killed when a test ends. They are modules
//! of one test binary, since every test binary links the whole dependency graph.

mod alerting;
mod archive;
mod common;
mod differential;
mod edge_crash;
mod edge_scrape;
mod forward;
mod global;
mod global_rules;
mod grpc_store;
mod hostile_queries;
mod prometheus;
mod promql_conformance;
mod remote_write;
mod rules;
mod s3;
mod security;
mod storage_crash;
mod strata_up;
