//! `meta.json`: what a block holds, written last, so that a block directory with a
//! readable meta is complete.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// The block format this code writes; it reads this one and the ones before it.
pub const FORMAT_VERSION: u32 = 2;
/// Version 1: the same, with the index stored as it is rather than deflated.
pub const FIRST_VERSION: u32 = 1;
pub const META_FILE: &str = "meta.json";
pub const INDEX_FILE: &str = "index";
pub const CHUNKS_FILE: &str = "chunks";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockMeta {
    pub version: u32,
    pub id: String,
    /// The time range the block covers, `[min_time, max_time)` in ms: aligned to the block
    /// range, so that blocks of one level never overlap. Samples lie within it.
    pub min_time: i64,
    pub max_time: i64,
    pub stats: BlockStats,
    /// 1 for a block cut from the head, one more for each compaction.
    pub level: u32,
    /// The blocks this one replaces (compaction). A block listed here by another complete
    /// block is deleted on open: the compaction finished, its clean-up did not.
    #[serde(default)]
    pub sources: Vec<String>,
    pub files: Vec<FileMeta>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockStats {
    pub series: u64,
    pub samples: u64,
    pub chunks: u64,
    /// Oldest and newest sample held.
    pub min_sample_time: i64,
    pub max_sample_time: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMeta {
    pub name: String,
    /// Bytes on disk, and their CRC-32.
    pub bytes: u64,
    pub crc32: u32,
    /// Set when the file is deflated: the bytes it inflates to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_bytes: Option<u64>,
}

impl BlockMeta {
    pub fn file(&self, name: &str) -> Option<&FileMeta> {
        self.files.iter().find(|f| f.name == name)
    }

    pub fn overlaps(&self, mint: i64, maxt: i64) -> bool {
        self.min_time <= maxt && mint < self.max_time
    }

    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    pub fn read(dir: &Path) -> Result<BlockMeta, String> {
        let path = dir.join(META_FILE);
        let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if text.len() > 1 << 20 {
            return Err(format!("{}: {} bytes, larger than any meta", path.display(), text.len()));
        }
        let meta: BlockMeta = serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if !(FIRST_VERSION..=FORMAT_VERSION).contains(&meta.version) {
            return Err(format!(
                "{}: format version {} (this build reads {FIRST_VERSION} to {FORMAT_VERSION})",
                path.display(),
                meta.version
            ));
        }
        if meta.min_time >= meta.max_time {
            return Err(format!("{}: empty time range", path.display()));
        }
        Ok(meta)
    }
}
