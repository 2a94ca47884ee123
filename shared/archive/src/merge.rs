//! Aggregate blocks merged into one (an archived day's hourly 5 m and 1 h blocks into a
//! day block): every series' windows copied as they are, bit for bit, so a reader that
//! sees the day block beside the blocks it replaces finds the same windows in both. The
//! windows cannot be computed again from the day's raw block: the window ending at the
//! day's end reads the sample there, which is the next day's.

use crate::aggregates::ReadWindows;
use crate::reader::BlockReader;
use crate::writer::{EncodedBlock, FileBuilder, WriteOptions};
use crate::ArchiveError;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use strata_downsample::Kept;
use strata_model::{Labels, Metadata, MetricType};

/// A series (by metric name, then labels) with its metric type and its id in each block.
type Listed = BTreeMap<(String, Labels), (MetricType, Vec<Option<i64>>)>;

/// Series read together: their windows of a day are held at once.
const BATCH: usize = 1024;

/// The day block of `blocks` (aggregate blocks of one resolution inside `[start, end)`,
/// oldest first, not overlapping); `None` when they hold no window.
pub(crate) async fn merge_aggregate_blocks(
    blocks: &[BlockReader],
    (start, end): (i64, i64),
    gaps: Vec<String>,
    families: &HashMap<String, Metadata>,
    opts: &WriteOptions,
) -> Result<Option<EncodedBlock>, ArchiveError> {
    let Some(resolution) = blocks.first().map(|b| b.meta.resolution_ms) else { return Ok(None) };
    if resolution <= 0 || blocks.iter().any(|b| b.meta.resolution_ms != resolution) {
        return Err(ArchiveError::Invalid("merging blocks of different or raw resolutions".into()));
    }
    // Every series of any block, metric by metric (a metric's series neighbours in the
    // file, as the writer keeps them), with its id in each block.
    let mut all: Listed = BTreeMap::new();
    for (bi, b) in blocks.iter().enumerate() {
        for (i, s) in b.series().iter().enumerate().filter(|(_, s)| s.samples > 0) {
            let name = s.labels.metric_name().unwrap_or_default().to_string();
            let entry = all.entry((name, s.labels.clone())).or_insert((s.metric_type, vec![None; blocks.len()]));
            entry.1[bi] = Some(i as i64);
        }
    }
    let all: Vec<_> = all.into_iter().collect();
    let mut file = FileBuilder::new(resolution, start, end, opts)?;
    let mut metric: Option<&str> = None;
    for batch in all.chunks(BATCH) {
        let mut read: Vec<BTreeMap<i64, ReadWindows>> = Vec::with_capacity(blocks.len());
        for (bi, b) in blocks.iter().enumerate() {
            let ids: BTreeSet<i64> = batch.iter().filter_map(|(_, (_, ids))| ids[bi]).collect();
            read.push(b.windows(&ids, (b.meta.min_time, b.meta.max_time), u64::MAX).await?);
        }
        for ((name, labels), (metric_type, ids)) in batch {
            if metric.is_some_and(|m| m != name) {
                file.metric_done()?;
            }
            metric = Some(name);
            let (mut windows, mut kept) = (Vec::new(), Kept::ALL);
            for (bi, id) in ids.iter().enumerate() {
                let Some(got) = id.and_then(|id| read[bi].remove(&id)) else { continue };
                kept = kept.and(got.kept);
                windows.extend(got.windows);
            }
            if windows.windows(2).any(|w| w[0].end >= w[1].end) {
                return Err(ArchiveError::Invalid(format!("series {labels}: windows of its blocks overlap")));
            }
            file.add_read_windows(labels, *metric_type, &windows, kept, opts)?;
        }
    }
    file.raw_samples = blocks.iter().fold(0u64, |n, b| n.saturating_add(b.meta.raw_samples));
    file.finish(gaps, families, opts)
}
