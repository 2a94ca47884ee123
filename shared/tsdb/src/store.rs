//! [`TsdbStore`]: the [`Store`] trait over a [`Tsdb`], the only way the engine and the
//! API read a tier's own database.

use crate::db::Tsdb;
use async_trait::async_trait;
use std::sync::Arc;
use strata_model::matcher::matches_all;
use strata_model::{Labels, Matcher, Metadata};
use strata_store::{SelectBudget, SelectRequest, SeriesChunks, Store, StoreError};

/// [`Store`] over a tier's own database.
#[derive(Clone)]
pub struct TsdbStore(pub Arc<Tsdb>);

#[async_trait]
impl Store for TsdbStore {
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        let head = self.0.head();
        let found = head.select_charged(&req.matchers, req.start, req.end, |chunks| budget.charge_series(chunks))?;
        let mut out = Vec::with_capacity(found.len());
        for (s, chunks) in found {
            let metric_type = s.labels.metric_name().map(|n| head.metric_type(n)).unwrap_or_default();
            out.push(SeriesChunks { labels: s.labels.clone(), metric_type, chunks });
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
        let found = self.0.head().select_labels(matchers, start, end);
        budget.check_series_count(found.len())?;
        Ok(found)
    }

    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        let head = self.0.head();
        if matchers.is_empty() {
            return Ok(head.label_names());
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
        let head = self.0.head();
        if matchers.is_empty() {
            return Ok(head.label_values(name));
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
        let all = self.0.head().all_metadata();
        Ok(match metric {
            Some(m) => all.into_iter().filter(|(f, _)| f == m).collect(),
            None => all,
        })
    }
}
