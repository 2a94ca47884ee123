//! `meta.json`: what a block holds, written after its data files, so a block whose upload
//! stopped half-way has none and is never read. Readers refuse a format version they do
//! not know, and a block whose files are not the sizes and checksums the meta records.

use serde::{Deserialize, Serialize};

/// The format's name in every meta, and its version.
pub const FORMAT: &str = "strata-archive";
pub const VERSION: u32 = 1;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockMeta {
    pub format: String,
    pub version: u32,
    /// Window width of the aggregates in ms; 0: raw samples.
    pub resolution_ms: i64,
    /// The block's time range, ms, `[min_time, max_time)`.
    pub min_time: i64,
    pub max_time: i64,
    pub series: u64,
    pub samples: u64,
    /// Rows whose value is in the DOUBLE column (not a decimal).
    pub double_values: u64,
    /// An aggregate block: the raw samples its windows summarise (its `samples` are its
    /// rows, a window each).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub raw_samples: u64,
    /// A raw block: its oldest sample's time. A planner learns from it that nothing in the
    /// block is older (the range's start says only that nothing is before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_sample: Option<i64>,
    /// What the source could not give when the block was written (a store that did not
    /// answer): readers warn that answers over this block may be incomplete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gaps: Vec<String>,
    /// A block written by compaction: the folders of the blocks it replaces, each with its
    /// sample count. Only these are let go once it is there (a day block from an import is
    /// no reason to delete what the archiver wrote).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compacted_from: Vec<Source>,
    pub files: Vec<FileMeta>,
}

/// A block that a compacted block replaces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Source {
    /// Its folder, from the bucket's root.
    pub dir: String,
    pub samples: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileMeta {
    /// Relative to the block's folder.
    pub path: String,
    pub bytes: u64,
    /// CRC-32 (IEEE) of the whole file: Parquet's own page checksums are optional, and
    /// the Rust writer writes none.
    pub crc32: u32,
    /// A data file's tail (page indexes and footer) and row groups, each with its own
    /// checksum, so a reader fetches and checks only what a query needs ([`crate::ranged`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<Segment>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub row_groups: Vec<Segment>,
}

/// A byte range of a file and the CRC-32 of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub offset: u64,
    pub bytes: u64,
    pub crc32: u32,
}

impl Segment {
    /// The range, if it lies inside a file of `len` bytes.
    pub fn range(&self, len: u64) -> Option<std::ops::Range<u64>> {
        let end = self.offset.checked_add(self.bytes)?;
        (end <= len).then_some(self.offset..end)
    }
}

impl BlockMeta {
    /// Parses and checks a meta; the error says what is wrong with it.
    pub fn parse(bytes: &[u8]) -> Result<BlockMeta, String> {
        let m: BlockMeta = serde_json::from_slice(bytes).map_err(|e| format!("not a block meta: {e}"))?;
        if m.format != FORMAT {
            return Err(format!("format {:?}, not {FORMAT:?}", m.format));
        }
        if m.version != VERSION {
            return Err(format!("format version {} (this reader knows {VERSION})", m.version));
        }
        if m.min_time >= m.max_time || m.resolution_ms < 0 {
            return Err(format!("empty or inverted range [{}, {})", m.min_time, m.max_time));
        }
        if m.first_sample.is_some_and(|t| t < m.min_time || t >= m.max_time) {
            return Err(format!("a first sample outside its range [{}, {})", m.min_time, m.max_time));
        }
        Ok(m)
    }

    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}
