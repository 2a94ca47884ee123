//! [`TsdbStore`]: the [`Store`] trait over a [`Tsdb`], the only way the engine and the
//! API read a tier's own database: its blocks and its head as one store.
//!
//! A series may have chunks in several blocks and in the head (a series that ends in a
//! block and continues in the head): they never overlap in time, since the head takes no
//! sample before the newest block's end, so its chunks are concatenated in time order.

use crate::db::Tsdb;
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::Arc;
use strata_block::BlockError;
use strata_chunk::Chunk;
use strata_model::matcher::matches_all;
use strata_model::{Labels, Matcher, Metadata};
use strata_store::{SelectBudget, SelectRequest, SeriesChunks, Store, StoreError};

/// [`Store`] over a tier's own database.
#[derive(Clone)]
pub struct TsdbStore(pub Arc<Tsdb>);

fn block_error(e: BlockError) -> StoreError {
    match e {
        BlockError::Corrupt { block, reason } => StoreError::Corrupt { series: format!("(block {block})"), reason },
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// Wraps a budget error so that a block's select can return it through `BlockError`.
struct Charged(StoreError);

impl From<BlockError> for Charged {
    fn from(e: BlockError) -> Self {
        Charged(block_error(e))
    }
}

#[async_trait]
impl Store for TsdbStore {
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        let db = &self.0;
        // Labels → chunks in time order: blocks oldest first, then the head. Samples are
        // charged as read; each series is charged once, when merged.
        let mut merged: BTreeMap<Labels, Vec<Chunk>> = BTreeMap::new();
        let _layout = db.read_layout();
        for block in db.blocks().overlapping(req.start, req.end) {
            let found =
                match block.select(&req.matchers, req.start, req.end, |c| budget.charge_samples(c).map_err(Charged)) {
                    Ok(found) => found,
                    // The block marked itself damaged and logged it: it is out of queries
                    // from now on, and the rest is served.
                    Err(Charged(StoreError::Corrupt { .. })) if block.is_damaged() => continue,
                    Err(Charged(e)) => return Err(e),
                };
            for s in found {
                merged.entry(s.labels).or_default().extend(s.chunks);
            }
        }
        let head = db.head().select_charged(&req.matchers, req.start, req.end, |c| budget.charge_samples(c))?;
        for (s, chunks) in head {
            merged.entry(s.labels.clone()).or_default().extend(chunks);
        }
        let mut out = Vec::with_capacity(merged.len());
        for (labels, chunks) in merged {
            budget.charge_labels()?;
            let metric_type = labels.metric_name().map(|n| db.metric_type(n)).unwrap_or_default();
            out.push(SeriesChunks { labels, metric_type, chunks });
        }
        Ok(out)
    }

    async fn series_within(
        &self,
        matchers: &[Matcher],
        start: i64,
        end: i64,
        budget: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        let _layout = self.0.read_layout();
        let mut found = self.0.head().select_labels(matchers, start, end);
        for block in self.0.blocks().overlapping(start, end) {
            found.extend(block.series_labels(matchers, start, end).map_err(block_error)?);
        }
        found.sort();
        found.dedup();
        budget.check_series_count(found.len())?;
        Ok(found)
    }

    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        if matchers.is_empty() {
            let mut names = self.0.head().label_names();
            for block in self.0.blocks().overlapping(start, end) {
                names.extend(block.label_names());
            }
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
