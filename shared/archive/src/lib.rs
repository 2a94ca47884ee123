//! The Parquet archive: blocks of samples in object storage as plain Parquet, which
//! DuckDB, pyarrow and Spark read with no plugin and Strata reads back exactly.
//!
//! A block is a resolution and a time range in a folder of its own ([`layout`]):
//! `data.parquet` (one row per sample: `series_id`, `timestamp`, and the value as an exact
//! decimal or a double, [`values`]), `series.parquet` (one row per series: its id, metric
//! type, unit, and each label as a column) and `meta.json` ([`meta`]), written last so a
//! block half uploaded is never read. [`BlockWriter`] writes a block from any `Store`;
//! [`BlockReader`] reads one back. The format is documented in `docs/ARCHIVE.md`.

mod aggregates;
mod answer;
pub mod archiver;
mod block_cache;
pub mod compactor;
#[cfg(test)]
mod crash_tests;
pub mod layout;
mod merge;
pub mod meta;
mod ranged;
pub mod reader;
#[cfg(test)]
mod shard_tests;
pub mod store;
#[cfg(test)]
mod tests;
pub mod values;
pub mod writer;

pub use archiver::{Archiver, ArchiverOptions, Coverage};
pub use compactor::{Compactor, CompactorOptions};
pub use object_store::path::Path as ObjectPath;
pub use object_store::Error as ObjectStoreError;
pub use object_store::{ObjectStore, ObjectStoreExt};
pub use reader::{list_blocks, ArchivedSeries, BlockReader};
use std::sync::Arc;
pub use store::{ArchiveStore, ArchiveStoreOptions};
pub use writer::{BlockWriter, EncodedBlock, EncodedRange, WriteOptions};

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
/// created when `create`; or `s3://bucket/prefix`, `gs://bucket/prefix`,
/// `az://container/prefix` with the credentials and settings of the environment
/// (`AWS_*`, `GOOGLE_*`, `AZURE_*` as each SDK reads them, e.g. `AWS_ENDPOINT_URL` and
/// `AWS_ALLOW_HTTP` for an S3-compatible server). Requests are retried with backoff by
/// the client (object_store's defaults: up to 10 retries within 3 minutes).
pub fn archive_store(url: &str, create: bool) -> Result<Arc<dyn ObjectStore>, ArchiveError> {
    let failed = |e: &dyn std::fmt::Display| ArchiveError::Object { object: url.to_string(), reason: e.to_string() };
    let cloud = |scheme: &str| -> Option<(String, String)> {
        let rest = url.strip_prefix(scheme)?.strip_prefix("://")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        Some((format!("{scheme}://{bucket}"), prefix.trim_matches('/').to_string()))
    };
    let prefixed = |store: Arc<dyn ObjectStore>, prefix: String| -> Arc<dyn ObjectStore> {
        match prefix.is_empty() {
            true => store,
            false => Arc::new(object_store::prefix::PrefixStore::new(store, prefix)),
        }
    };
    if ["s3", "gs", "az"].iter().any(|s| cloud(s).is_some()) {
        // The HTTP client takes the process's rustls provider: ring, as everywhere in
        // Strata (an error means one is installed already).
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    if let Some((bucket, prefix)) = cloud("s3") {
        let s3 = object_store::aws::AmazonS3Builder::from_env().with_url(bucket).build().map_err(|e| failed(&e))?;
        return Ok(prefixed(Arc::new(s3), prefix));
    }
    if let Some((bucket, prefix)) = cloud("gs") {
        let gcs = object_store::gcp::GoogleCloudStorageBuilder::from_env()
            .with_url(bucket)
            .build()
            .map_err(|e| failed(&e))?;
        return Ok(prefixed(Arc::new(gcs), prefix));
    }
    if let Some((container, prefix)) = cloud("az") {
        let az = object_store::azure::MicrosoftAzureBuilder::from_env()
            .with_url(container)
            .build()
            .map_err(|e| failed(&e))?;
        return Ok(prefixed(Arc::new(az), prefix));
    }
    if let Some(scheme) = url.split_once("://").map(|(s, _)| s).filter(|s| *s != "file") {
        return Err(ArchiveError::Invalid(format!(
            "{url}: {scheme}:// is not an archive URL (a folder, file://, s3://, gs:// or az://)"
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

/// The archive of shard `name` under `root` (`shards/<name>/`): an archiver and compactor
/// of one shard work on it as on a whole archive of their own.
pub fn shard_store(root: Arc<dyn ObjectStore>, name: &str) -> Result<Arc<dyn ObjectStore>, ArchiveError> {
    if !layout::valid_shard_name(name) {
        return Err(ArchiveError::Invalid(format!(
            "shard name {name:?}: letters, digits, `_`, `-` and `.` (not first), at most 64"
        )));
    }
    Ok(Arc::new(object_store::prefix::PrefixStore::new(root, layout::shard_root(name))))
}

/// The marker at the root that says how the bucket is archived: `whole` or `shards`.
pub const SHARDING: &str = "sharding.json";
/// The marker in a shard's folder that records its selector.
pub const SHARD_MARKER: &str = "shard.json";

/// Writes `body` at `path` unless something is there; what is there (or what was written).
async fn marker(root: &dyn ObjectStore, path: &object_store::path::Path, body: String) -> Result<String, ArchiveError> {
    use object_store::{PutMode, PutOptions};
    let failed = |e: &dyn std::fmt::Display| ArchiveError::Object { object: path.to_string(), reason: e.to_string() };
    let create = PutOptions { mode: PutMode::Create, ..Default::default() };
    match root.put_opts(path, body.clone().into(), create).await {
        Ok(_) => return Ok(body),
        Err(object_store::Error::AlreadyExists { .. }) => {}
        Err(e) => return Err(failed(&e)),
    }
    let got = root.get(path).await.map_err(|e| failed(&e))?;
    if got.meta.size > 64 << 10 {
        return Err(failed(&"larger than a marker can be"));
    }
    let bytes = got.bytes().await.map_err(|e| failed(&e))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Refuses to archive a bucket both whole and in shards (either would write some series a
/// second time), and a shard under a name another archiver gave another selector (each
/// would take the other's ranges as done and leave its own series out). `shard`: the
/// name and selector this archiver writes, `None` for the whole. Told by markers created
/// only when absent (`sharding.json` at the root, `shard.json` in each shard's folder),
/// written before anything is archived, and by the progress records of buckets archived
/// before the markers.
pub async fn check_sharding(root: &dyn ObjectStore, shard: Option<(&str, &str)>) -> Result<(), ArchiveError> {
    let listing =
        |e: object_store::Error| ArchiveError::Object { object: layout::SHARDS.into(), reason: e.to_string() };
    let in_shards = |what: &str| {
        ArchiveError::Invalid(format!(
            "the archive is archived in shards ({what}): an archiver of the whole would write their series a second time (give --archive.shard)"
        ))
    };
    let whole = |what: &str, name: &str| {
        ArchiveError::Invalid(format!(
            "the archive is archived whole ({what}): an archiver of shard {name} would write its series a second time"
        ))
    };
    // Buckets archived before the markers: their progress records tell.
    match shard {
        Some((name, _)) => {
            if archiver::read_progress(root).await?.is_some() {
                return Err(whole(archiver::PROGRESS, name));
            }
        }
        None => {
            // The shards' folders, then each one's record: not every object of every shard.
            let prefix = object_store::path::Path::from(layout::SHARDS);
            let listed = root.list_with_delimiter(Some(&prefix)).await.map_err(listing)?;
            for folder in listed.common_prefixes {
                let record = folder.clone().join("progress").join("raw.json");
                match root.head(&record).await {
                    Ok(_) => return Err(in_shards(record.as_ref())),
                    Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(ArchiveError::Object { object: record.to_string(), reason: e.to_string() }),
                }
            }
        }
    }
    let mode = if shard.is_some() { "shards" } else { "whole" };
    let body = serde_json::json!({ "mode": mode }).to_string();
    let there = marker(root, &object_store::path::Path::from(SHARDING), body.clone()).await?;
    if there != body {
        return Err(match shard {
            Some((name, _)) => whole(&format!("{SHARDING}: {there}"), name),
            None => in_shards(&format!("{SHARDING}: {there}")),
        });
    }
    if let Some((name, selector)) = shard {
        let path = layout::shard_root(name).join(SHARD_MARKER);
        let body = serde_json::json!({ "selector": selector }).to_string();
        let recorded = marker(root, &path, body.clone()).await?;
        if recorded != body {
            return Err(ArchiveError::Invalid(format!(
                "shard {name} is archived with another selector ({path}: {recorded}): two selectors under one name would each take the other's ranges as done"
            )));
        }
    }
    Ok(())
}

impl ArchiveError {
    pub(crate) fn parquet(object: &object_store::path::Path, e: impl std::fmt::Display) -> Self {
        ArchiveError::Parquet { object: object.to_string(), reason: e.to_string() }
    }
}
