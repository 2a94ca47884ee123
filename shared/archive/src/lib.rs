//! The Parquet archive: blocks of samples in object storage as plain Parquet, which
//! DuckDB, pyarrow and Spark read with no plugin and Strata reads back exactly.
//!
//! A block is a resolution and a time range in a folder of its own ([`layout`]):
//! `data.parquet` (one row per sample: `series_id`, `timestamp`, and the value as an exact
//! decimal or a double, [`values`]), `series.parquet` (one row per series: its id, metric
//! type, unit, and each label as a column) and `meta.json` ([`meta`]), written last so a
//! block half uploaded is never read. [`BlockWriter`] writes a block from any `Store`;
//! [`BlockReader`] reads one back. The format is documented in `docs/ARCHIVE.md`.

pub mod layout;
pub mod meta;
mod ranged;
pub mod reader;
pub mod store;
#[cfg(test)]
mod tests;
pub mod values;
pub mod writer;

pub use object_store::ObjectStore;
pub use reader::{list_blocks, ArchivedSeries, BlockReader};
use std::sync::Arc;
pub use store::{ArchiveStore, ArchiveStoreOptions};
pub use writer::{BlockWriter, WriteOptions};

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("reading the source: {0}")]
    Store(#[from] strata_store::StoreError),
    #[error("source series {series}: {reason}")]
    Source { series: String, reason: String },
    #[error("{object}: {reason}")]
    Object { object: String, reason: String },
    #[error("{object}: damaged: {reason}")]
    Corrupt { object: String, reason: String },
    #[error("{object}: writing Parquet: {reason}")]
    Parquet { object: String, reason: String },
    #[error("{0}")]
    Invalid(String),
    #[error("samples limit of {limit} exceeded")]
    Limit { limit: u64 },
}

/// The object store an archive URL names: a local folder (`file:///path`, or a path),
/// created when `create`. Cloud URLs (`s3://`, `gs://`, `az://`) come with the archiver.
pub fn archive_store(url: &str, create: bool) -> Result<Arc<dyn ObjectStore>, ArchiveError> {
    if let Some(scheme) = ["s3://", "gs://", "az://"].iter().find(|s| url.starts_with(*s)) {
        return Err(ArchiveError::Invalid(format!(
            "{url}: {scheme} archives are not supported by this version yet: use a local folder"
        )));
    }
    let path = std::path::PathBuf::from(url.strip_prefix("file://").unwrap_or(url));
    let failed =
        |e: &dyn std::fmt::Display| ArchiveError::Object { object: path.display().to_string(), reason: e.to_string() };
    if create {
        std::fs::create_dir_all(&path).map_err(|e| failed(&e))?;
    }
    let store = object_store::local::LocalFileSystem::new_with_prefix(&path).map_err(|e| failed(&e))?;
    Ok(Arc::new(store))
}

impl ArchiveError {
    pub(crate) fn parquet(object: &object_store::path::Path, e: impl std::fmt::Display) -> Self {
        ArchiveError::Parquet { object: object.to_string(), reason: e.to_string() }
    }
}
