//! The library every Strata tier builds on: the data model, the exposition parser,
//! relabeling, compressed chunks, the inverted index, the head block, the WAL, the `Tsdb`
//! that makes the head durable, and the [`store::Store`] trait where the tiers meet.
//! Tier crates hold only their wiring and loops; anything two tiers need lives here.

pub mod api;
pub mod chunk;
pub mod db;
pub mod exposition;
pub mod head;
pub mod import;
pub mod index;
pub mod matcher;
pub mod model;
pub mod promql;
pub mod relabel;
pub mod selector;
pub mod store;
pub mod wal;
