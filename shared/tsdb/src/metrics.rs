//! The database's self-metrics. They belong to the [`Tsdb`](crate::Tsdb), which counts its
//! own appends and fsyncs, so every tier that holds a database reports the same series
//! under the same names; a tier registers them into its registry with
//! [`TsdbMetrics::register`] and refreshes the gauges with [`TsdbMetrics::refresh`] when
//! it is scraped.

use crate::db::Tsdb;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone)]
pub struct TsdbMetrics {
    pub samples_appended: Counter,
    /// Chunks the head took as they came (a forwarded backlog), not sample by sample.
    pub chunks_adopted: Counter,
    /// A sender's open chunks that continued the head's own (only their new bits decoded).
    pub chunks_continued: Counter,
    pub head_series: Gauge,
    pub head_chunk_bytes: Gauge,
    pub wal_bytes: Gauge,
    pub wal_fsync_seconds: Histogram,
    /// WAL segments replay found damaged, copied to `wal/quarantine/` and cut.
    pub wal_quarantined_segments: Counter,
    pub blocks_written: Counter,
    /// Samples older than the head admits, written as blocks of their own.
    pub late_samples: Counter,
    pub blocks_compacted: Counter,
    /// Samples retention deleted that a hold (a forward upstream, the archive) still needed.
    pub held_samples_dropped: Counter,
    /// Blocks found damaged (at open or by a read), kept out of queries and compaction.
    pub blocks_damaged: Gauge,
    /// Maintenance runs (block cut, compaction, retention) that failed.
    pub maintenance_failures: Counter,
    pub blocks: Gauge,
    pub block_bytes: Gauge,
    /// Memory the blocks' indexes hold.
    pub block_index_bytes: Gauge,
    /// Head memory per series: chunk, index and label bytes over the series count.
    pub head_bytes_per_series: Gauge,
    pub block_cache_bytes: Gauge,
    pub block_cache_hits: Gauge,
    pub block_cache_misses: Gauge,
}

impl Default for TsdbMetrics {
    fn default() -> Self {
        TsdbMetrics {
            samples_appended: Counter::default(),
            chunks_adopted: Counter::default(),
            chunks_continued: Counter::default(),
            head_series: Gauge::default(),
            head_chunk_bytes: Gauge::default(),
            wal_bytes: Gauge::default(),
            wal_fsync_seconds: Histogram::new([0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]),
            wal_quarantined_segments: Counter::default(),
            blocks_written: Counter::default(),
            late_samples: Counter::default(),
            blocks_compacted: Counter::default(),
            held_samples_dropped: Counter::default(),
            blocks_damaged: Gauge::default(),
            maintenance_failures: Counter::default(),
            blocks: Gauge::default(),
            block_bytes: Gauge::default(),
            block_index_bytes: Gauge::default(),
            head_bytes_per_series: Gauge::default(),
            block_cache_bytes: Gauge::default(),
            block_cache_hits: Gauge::default(),
            block_cache_misses: Gauge::default(),
        }
    }
}

impl TsdbMetrics {
    /// Registers every metric (sharing the counters, so later updates show).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "head_samples_appended",
            "Samples appended to the head (after WAL logging)",
            self.samples_appended.clone(),
        );
        registry.register(
            "head_chunks_adopted",
            "Chunks the head took whole as they came (a forwarded backlog; their samples count as appended)",
            self.chunks_adopted.clone(),
        );
        registry.register(
            "head_chunks_continued",
            "A sender's open chunks that continued a series' open chunk as they came (their new samples count as appended)",
            self.chunks_continued.clone(),
        );
        registry.register("head_series", "Series held in the head", self.head_series.clone());
        registry.register(
            "head_chunk_bytes",
            "Bytes of compressed chunk data in the head",
            self.head_chunk_bytes.clone(),
        );
        registry.register("wal_bytes", "Bytes of WAL segments on disk", self.wal_bytes.clone());
        registry.register("wal_fsync_duration_seconds", "Duration of WAL fsync calls", self.wal_fsync_seconds.clone());
        registry.register(
            "wal_quarantined_segments",
            "WAL segments found damaged at replay, copied to wal/quarantine/ and cut",
            self.wal_quarantined_segments.clone(),
        );
        registry.register("blocks_written", "Blocks cut from the head", self.blocks_written.clone());
        registry.register(
            "late_samples",
            "Samples older than the head admits (its newest cut block's end), written as blocks of their own",
            self.late_samples.clone(),
        );
        registry.register("blocks_compacted", "Blocks written by compaction", self.blocks_compacted.clone());
        registry.register(
            "held_samples_dropped",
            "Samples retention deleted past the hold's budget that a forward upstream or the archive still needed",
            self.held_samples_dropped.clone(),
        );
        registry.register(
            "blocks_damaged",
            "Blocks found damaged (at open or by a read), kept out of queries and compaction",
            self.blocks_damaged.clone(),
        );
        registry.register(
            "storage_maintenance_failures",
            "Block cuts, compactions or retention runs that failed",
            self.maintenance_failures.clone(),
        );
        registry.register("blocks", "Blocks on disk serving queries", self.blocks.clone());
        registry.register("block_bytes", "Bytes of blocks on disk", self.block_bytes.clone());
        registry.register("block_index_bytes", "Memory held by the blocks' indexes", self.block_index_bytes.clone());
        registry.register(
            "head_bytes_per_series",
            "Head memory per series: chunks, index, labels and series table",
            self.head_bytes_per_series.clone(),
        );
        registry.register(
            "block_cache_bytes",
            "Bytes of block chunks cached for queries",
            self.block_cache_bytes.clone(),
        );
        registry.register("block_cache_hits", "Series reads the block cache answered", self.block_cache_hits.clone());
        registry.register("block_cache_misses", "Series reads that went to disk", self.block_cache_misses.clone());
    }

    /// Sets the gauges from the database's current state.
    pub fn refresh(&self, db: &Tsdb) {
        let st = db.stats();
        self.head_series.set(i64::try_from(st.series).unwrap_or(i64::MAX));
        self.head_chunk_bytes.set(i64::try_from(st.chunk_bytes).unwrap_or(i64::MAX));
        self.wal_bytes.set(i64::try_from(db.wal_disk_bytes()).unwrap_or(i64::MAX));
        let blocks = db.blocks();
        self.blocks.set(i64::try_from(blocks.len()).unwrap_or(i64::MAX));
        self.blocks_damaged.set(i64::try_from(blocks.damaged().len()).unwrap_or(i64::MAX));
        self.block_bytes.set(i64::try_from(blocks.disk_bytes()).unwrap_or(i64::MAX));
        self.block_index_bytes.set(i64::try_from(blocks.memory_bytes()).unwrap_or(i64::MAX));
        self.block_cache_bytes.set(i64::try_from(blocks.cache().bytes()).unwrap_or(i64::MAX));
        let (hits, misses) = blocks.cache().stats();
        self.block_cache_hits.set(i64::try_from(hits).unwrap_or(i64::MAX));
        self.block_cache_misses.set(i64::try_from(misses).unwrap_or(i64::MAX));
        let per_series = (st.chunk_bytes + st.index_bytes).checked_div(st.series).unwrap_or(0);
        self.head_bytes_per_series.set(i64::try_from(per_series).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use crate::{Tsdb, TsdbOptions};
    use prometheus_client::registry::Registry;
    use strata_model::{Labels, Sample};

    #[test]
    fn the_database_counts_its_own_appends_and_reports_its_state() {
        let d = tempfile::tempdir().unwrap();
        let db = Tsdb::open(d.path(), TsdbOptions::default()).unwrap();
        let mut registry = Registry::with_prefix("strata");
        db.metrics().register(&mut registry);
        let s = db.series(&Labels::from_pairs([("__name__", "up"), ("job", "x")])).unwrap();
        let batch: Vec<_> = (0..10).map(|i| (s.clone(), Sample::new(i * 1000, 1.0))).collect();
        db.commit(&batch).unwrap();
        // An exact retry is accepted and ignored: it is not counted again.
        db.commit(&batch).unwrap();
        db.metrics().refresh(&db);
        let mut page = String::new();
        prometheus_client::encoding::text::encode(&mut page, &registry).unwrap();
        assert!(page.contains("strata_head_samples_appended_total 10\n"), "{page}");
        assert!(page.contains("strata_head_series 1\n"), "{page}");
        assert!(!page.contains("strata_wal_bytes 0\n"), "{page}");
    }
}
