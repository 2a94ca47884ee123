//! The reader's caches: what it built from one block's rows for one series, kept for the
//! next query ([`strata_downsample::cache::BlockCache`]): a series' chunks
//! ([`ChunkCache`]) or its windows ([`WindowCache`]). Decoding Parquet rows is most of
//! what a query of the archive costs. An entry is keyed by the block's folder and its
//! data file's checksum, so a block written again is never answered from what the cache
//! held of the old one.

use object_store::path::Path;
use std::sync::Arc;
use strata_chunk::Chunk;
use strata_downsample::cache::{BlockCache, Weighed};
use strata_downsample::{Kept, WindowColumns};

/// A block: its folder and its data file's checksum.
pub(crate) type BlockKey = (Path, u32);

/// A series' windows in one aggregate block, field by field (a query reads only the
/// fields it needs), with what its rows kept.
#[derive(Debug, Clone)]
pub(crate) struct BlockWindows {
    pub kept: Kept,
    pub columns: Arc<WindowColumns>,
}

impl Weighed for BlockWindows {
    fn cost(&self) -> usize {
        self.columns.bytes() + 96
    }
}

pub(crate) type ChunkCache = BlockCache<BlockKey, Arc<[Chunk]>>;
pub(crate) type WindowCache = BlockCache<BlockKey, BlockWindows>;
