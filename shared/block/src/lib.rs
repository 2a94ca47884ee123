//! Immutable blocks on disk: a time range of series with their chunks, which the head cuts
//! off when its data ages and which compaction merges into larger ones.
//!
//! A block is a directory `<id>/` with three files:
//! * `chunks`: the chunks' bytes back to back, exactly as the head sealed them (Strata's
//!   chunk encodings, never re-encoded on the way to disk);
//! * `index`: a symbol table (every label name and value once), one entry per series in
//!   label order (label pairs as symbol numbers; per chunk its time range, sample count,
//!   length and CRC-32), a table of the entries' offsets, the postings (series numbers per
//!   label pair, delta-coded) with a table sorted by name and value, the metric metadata,
//!   and a fixed footer with the sections' offsets and the file's CRC-32;
//! * `meta.json`: range, counts, level, the blocks it replaces, and each file's size and
//!   CRC-32; written last.
//!
//! [`BlockReader`] keeps the index in memory (it is per series, not per sample) and reads
//! chunks with positioned reads, one per series, checking every chunk's CRC: a damaged
//! block is an error naming it, never wrong samples. Series that queries read stay in a
//! [`cache::ChunkCache`] bounded in bytes and shared by a database's blocks. [`merge`] is
//! compaction's mechanism.

pub mod cache;
pub mod encoding;
pub mod fault;
pub mod merge;
pub mod meta;
pub mod postings;
mod reader;
mod writer;

#[cfg(test)]
mod tests;

pub use meta::{BlockMeta, BlockStats};
pub use reader::{BlockReader, BlockSeries};
pub use writer::{new_block_id, BlockWriter};

use std::path::{Path, PathBuf};

pub const INDEX_MAGIC: &[u8; 8] = b"STRIDX01";
pub const CHUNKS_MAGIC: &[u8; 8] = b"STRCHK01";

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("block {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("block {block} is damaged: {reason}")]
    Corrupt { block: String, reason: String },
    #[error("{0}")]
    Invalid(String),
}

impl BlockError {
    pub fn io(path: &Path, source: std::io::Error) -> BlockError {
        BlockError::Io { path: path.to_path_buf(), source }
    }
}
