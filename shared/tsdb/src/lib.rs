//! Strata's local storage, used by every tier that holds samples: the inverted
//! [`index`], the in-memory [`head`] of compressed chunks, the [`wal`] that makes it
//! durable, and [`db::Tsdb`], which ties them together with the append policy, retention,
//! and the background loops (WAL fsync, retention) in [`loops`].
//!
//! Appends go WAL first, then memory, and a refused sample touches neither. Readers see the
//! database only through [`TsdbStore`], the [`strata_store::Store`] implementation, so the
//! engine and the API never reach into the head.

pub mod blocks;
pub mod db;
pub mod head;
pub mod index;
pub mod loops;
pub mod metrics;
pub mod settings;
mod store;
pub mod wal;
pub mod wal_times;

pub use db::{MaintenanceOutcome, Tsdb, TsdbError, TsdbOptions};
pub use store::TsdbStore;
