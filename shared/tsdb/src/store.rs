//! [`TsdbStore`]: the [`Store`] trait over a [`Tsdb`], the only way the engine and the
//! API read a tier's own database: its blocks and its head as one store.
//!
//! A series may have chunks in several blocks and in the head (a series that ends in a
//! block and continues in the head). They are joined in time order; where blocks overlap
//! (however that came about), the overlap is merged sample by sample, each timestamp once,
//! never concatenated out of order. A block that is damaged (or becomes so while it is
//! read) is skipped and the answer says so in its warnings, naming the block and its range.

use crate::db::Tsdb;
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::Arc;
use strata_block::BlockError;
use strata_chunk::merge::{in_order, merge_sources};
use strata_chunk::Chunk;
use strata_model::matcher::matches_all;
use strata_model::{Labels, Matcher, Metadata};
use strata_store::{QueryScope, SelectBudget, SelectRequest, SeriesChunks, Store, StoreError};

/// [`Store`] over a tier's own database.
#[derive(Clone)]
pub struct TsdbStore(pub Arc<Tsdb>);

fn block_error(e: BlockError) -> StoreError {
    match e {
        BlockError::Corrupt { block, reason } => StoreError::Corrupt { series: format!("(block {block})"), reason },
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// What stops a block's select: the budget, or the block.
enum ReadError {
    Budget(StoreError),
    Block(BlockError),
}

impl From<BlockError> for ReadError {
    fn from(e: BlockError) -> Self {
        ReadError::Block(e)
    }
}

/// Says in the request's warnings which damaged blocks a read of `[start, end]` skipped.
fn warn_damaged(db: &Tsdb, start: i64, end: i64) {
    let damaged = db.blocks().damaged_overlapping(start, end);
    if damaged.is_empty() {
        return;
    }
    let scope = QueryScope::current();
    for d in damaged {
        let range = d.range.map(|(lo, hi)| format!(" [{lo}, {hi})")).unwrap_or_default();
        scope.warn(format!("block {}{range} is damaged and was skipped: {}", d.id, d.reason));
    }
}

/// One series' chunks from each place that holds it (blocks oldest first, then the head),
/// in time order.
fn join(labels: &Labels, mut sources: Vec<Vec<Chunk>>) -> Result<Vec<Chunk>, StoreError> {
    if sources.len() == 1 {
        return Ok(sources.pop().unwrap_or_default());
    }
    let all: Vec<Chunk> = sources.concat();
    if in_order(&all) {
        return Ok(all);
    }
    let merged = merge_sources(sources)
        .map_err(|e| StoreError::Corrupt { series: labels.to_string(), reason: e.to_string() })?;
    if merged.conflicts > 0 {
        QueryScope::current().warn(format!(
            "series {labels}: overlapping blocks hold different values at {} timestamps; the older block's are used",
            merged.conflicts
        ));
    }
    Ok(merged.chunks)
}

impl TsdbStore {
    /// [`Store::select_within`] without a runtime: nothing in it waits (a forwarder reads
    /// its backlog this way on a blocking thread).
    pub fn select_now(&self, req: &SelectRequest, budget: &mut SelectBudget) -> Result<Vec<SeriesChunks>, StoreError> {
        let db = &self.0;
        // Labels → each place's chunks: blocks oldest first, then the head. Samples are
        // charged as read; each series is charged once, when joined.
        let mut merged: BTreeMap<Labels, Vec<Vec<Chunk>>> = BTreeMap::new();
        let _layout = db.read_layout();
        for block in db.blocks().overlapping(req.start, req.end) {
            let charge = |c: &[Chunk]| budget.charge_samples(c).map_err(ReadError::Budget);
            let found = match block.select(&req.matchers, req.start, req.end, charge) {
                Ok(found) => found,
                Err(ReadError::Budget(e)) => return Err(e),
                // The block marked itself damaged and logged it: the rest is served, and
                // the warnings below name it.
                Err(ReadError::Block(_)) if block.is_damaged() => continue,
                Err(ReadError::Block(e)) => return Err(block_error(e)),
            };
            for s in found {
                merged.entry(s.labels).or_default().push(s.chunks);
            }
        }
        let head = db.head().select_charged(&req.matchers, req.start, req.end, |c| budget.charge_samples(c))?;
        for (s, chunks) in head {
            merged.entry(s.labels.clone()).or_default().push(chunks);
        }
        warn_damaged(db, req.start, req.end);
        let mut out = Vec::with_capacity(merged.len());
        for (labels, sources) in merged {
            budget.charge_labels()?;
            let chunks = join(&labels, sources)?;
            let metric_type = labels.metric_name().map(|n| db.metric_type(n)).unwrap_or_default();
            out.push(SeriesChunks { labels, metric_type, chunks });
        }
        Ok(out)
    }

    /// [`Store::series_within`] without a runtime.
    pub fn series_now(
        &self,
        matchers: &[Matcher],
        start: i64,
        end: i64,
        budget: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        let _layout = self.0.read_layout();
        let mut found = self.0.head().select_labels(matchers, start, end);
        for block in self.0.blocks().overlapping(start, end) {
            match block.series_labels(matchers, start, end) {
                Ok(labels) => found.extend(labels),
                Err(_) if block.is_damaged() => continue,
                Err(e) => return Err(block_error(e)),
            }
        }
        warn_damaged(&self.0, start, end);
        found.sort();
        found.dedup();
        budget.check_series_count(found.len())?;
        Ok(found)
    }
}

#[async_trait]
impl Store for TsdbStore {
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        self.select_now(req, budget)
    }

    async fn series_within(
        &self,
        matchers: &[Matcher],
        start: i64,
        end: i64,
        budget: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        self.series_now(matchers, start, end, budget)
    }

    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        if matchers.is_empty() {
            let mut names = self.0.head().label_names();
            for block in self.0.blocks().overlapping(start, end) {
                names.extend(block.label_names());
            }
            warn_damaged(&self.0, start, end);
            names.sort();
            names.dedup();
            return Ok(names);
        }
        let mut names: Vec<String> = self
            .series(matchers, start, end)
            .await?
            .iter()
            .flat_map(|l| l.iter().map(|x| x.name.to_string()).collect::<Vec<_>>())
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    async fn label_values(
        &self,
        name: &str,
        matchers: &[Matcher],
        start: i64,
        end: i64,
    ) -> Result<Vec<String>, StoreError> {
        if matchers.is_empty() {
            let mut vals = self.0.head().label_values(name);
            for block in self.0.blocks().overlapping(start, end) {
                vals.extend(block.label_values(name));
            }
            warn_damaged(&self.0, start, end);
            vals.sort();
            vals.dedup();
            return Ok(vals);
        }
        let mut vals: Vec<String> = self
            .series(matchers, start, end)
            .await?
            .iter()
            .filter(|l| matches_all(matchers, l))
            .filter_map(|l| l.get(name).map(str::to_string))
            .collect();
        vals.sort();
        vals.dedup();
        Ok(vals)
    }

    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        // The head's metadata, then what only blocks remember.
        let mut all: BTreeMap<String, Metadata> = BTreeMap::new();
        for block in self.0.blocks().healthy() {
            all.extend(block.metadata().iter().cloned());
        }
        all.extend(self.0.head().all_metadata());
        Ok(all.into_iter().filter(|(f, _)| metric.is_none_or(|m| f == m)).collect())
    }
}
