//! A `Store` over series held in memory, for the PromQL conformance runner and tests.

use crate::{SelectBudget, SelectRequest, SeriesChunks, Store, StoreError};
use async_trait::async_trait;
use strata_chunk::ChunkAppender;
use strata_model::matcher::matches_all;
use strata_model::{Labels, Matcher, Metadata, MetricType, Sample};

#[derive(Default)]
pub struct MemoryStore {
    series: Vec<(Labels, MetricType, Vec<Sample>)>,
    metadata: Vec<(String, Metadata)>,
}

impl MemoryStore {
    /// Adds samples to a series (created if new), sorted by time; a later sample for the
    /// same timestamp replaces the earlier one, as Prometheus' test loader does.
    pub fn add(&mut self, labels: Labels, metric_type: MetricType, samples: impl IntoIterator<Item = Sample>) {
        let i = match self.series.iter().position(|s| s.0 == labels) {
            Some(i) => i,
            None => {
                self.series.push((labels, metric_type, Vec::new()));
                self.series.len() - 1
            }
        };
        let s = &mut self.series[i].2;
        s.extend(samples);
        s.sort_by_key(|x| x.t);
        s.reverse();
        s.dedup_by_key(|x| x.t);
        s.reverse();
    }

    pub fn set_metadata(&mut self, family: &str, m: Metadata) {
        self.metadata.retain(|x| x.0 != family);
        self.metadata.push((family.to_string(), m));
        self.metadata.sort_by(|a, b| a.0.cmp(&b.0));
    }

    fn matching(&self, ms: &[Matcher], start: i64, end: i64) -> Vec<&(Labels, MetricType, Vec<Sample>)> {
        let mut v: Vec<_> = self
            .series
            .iter()
            .filter(|s| matches_all(ms, &s.0) && s.2.iter().any(|x| x.t >= start && x.t <= end))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        let found = self.matching(&req.matchers, req.start, req.end);
        budget.check_series_count(found.len())?;
        let mut out = Vec::new();
        for (labels, ty, samples) in found {
            let mut chunks = Vec::new();
            let mut a = ChunkAppender::new();
            for s in samples.iter().filter(|x| x.t >= req.start && x.t <= req.end) {
                if a.is_full() {
                    // Sealed as the head seals them, so engine tests meet both encodings.
                    chunks.push(a.seal().compact());
                    a = ChunkAppender::new();
                }
                a.append(s.t, s.v);
            }
            if !a.is_empty() {
                chunks.push(a.seal());
            }
            budget.charge_series(&chunks)?;
            out.push(SeriesChunks { labels: labels.clone(), metric_type: *ty, chunks });
        }
        Ok(out)
    }

    async fn series_within(
        &self,
        ms: &[Matcher],
        start: i64,
        end: i64,
        budget: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        let found = self.matching(ms, start, end);
        let mut out = Vec::with_capacity(found.len());
        for s in found {
            budget.charge_labels()?;
            out.push(s.0.clone());
        }
        Ok(out)
    }

    async fn label_names(&self, ms: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        let mut v: Vec<String> = self
            .series
            .iter()
            .filter(|s| matches_all(ms, &s.0) && s.2.iter().any(|x| x.t >= start && x.t <= end))
            .flat_map(|s| s.0.iter().map(|l| l.name.to_string()).collect::<Vec<_>>())
            .collect();
        v.sort();
        v.dedup();
        Ok(v)
    }

    async fn label_values(&self, name: &str, ms: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        let mut v: Vec<String> = self
            .series
            .iter()
            .filter(|s| matches_all(ms, &s.0) && s.2.iter().any(|x| x.t >= start && x.t <= end))
            .filter_map(|s| s.0.get(name).map(str::to_string))
            .collect();
        v.sort();
        v.dedup();
        Ok(v)
    }

    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        Ok(self.metadata.iter().filter(|(f, _)| metric.is_none_or(|m| m == f)).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance;

    #[tokio::test]
    async fn memory_store_passes_the_store_conformance_suite() {
        let mut m = MemoryStore::default();
        for f in conformance::fixture() {
            let name = f.labels.metric_name().unwrap_or_default().to_string();
            m.set_metadata(&name, Metadata { metric_type: f.metric_type, ..Default::default() });
            m.add(f.labels, f.metric_type, f.samples);
        }
        conformance::run_all(&m).await;
    }
}
