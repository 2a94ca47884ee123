//! A `Store` over series held in memory, for the PromQL conformance runner and tests.

use super::{SelectRequest, SeriesChunks, Store, StoreError};
use crate::chunk::ChunkAppender;
use crate::matcher::{matches_all, Matcher};
use crate::model::{Labels, Metadata, MetricType, Sample};
use async_trait::async_trait;

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
        let mut v: Vec<_> = self.series.iter().filter(|s| matches_all(ms, &s.0) && s.2.iter().any(|x| x.t >= start && x.t <= end)).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

fn require_matchers(ms: &[Matcher]) -> Result<(), StoreError> {
    if ms.iter().all(|m| m.matches("")) {
        return Err(StoreError::InvalidRequest("match[] must contain at least one matcher that does not match the empty string".into()));
    }
    Ok(())
}

#[async_trait]
impl Store for MemoryStore {
    async fn select(&self, req: &SelectRequest) -> Result<Vec<SeriesChunks>, StoreError> {
        require_matchers(&req.matchers)?;
        let found = self.matching(&req.matchers, req.start, req.end);
        if found.len() > req.limits.max_series {
            return Err(StoreError::LimitExceeded { what: "series", limit: req.limits.max_series as u64 });
        }
        let mut total = 0u64;
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
                total += 1;
            }
            if total > req.limits.max_samples {
                return Err(StoreError::LimitExceeded { what: "samples", limit: req.limits.max_samples });
            }
            if !a.is_empty() {
                chunks.push(a.seal());
            }
            out.push(SeriesChunks { labels: labels.clone(), metric_type: *ty, chunks });
        }
        Ok(out)
    }

    async fn series(&self, ms: &[Matcher], start: i64, end: i64) -> Result<Vec<Labels>, StoreError> {
        require_matchers(ms)?;
        Ok(self.matching(ms, start, end).into_iter().map(|s| s.0.clone()).collect())
    }

    async fn label_names(&self, ms: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        let mut v: Vec<String> = self.series.iter().filter(|s| matches_all(ms, &s.0) && s.2.iter().any(|x| x.t >= start && x.t <= end)).flat_map(|s| s.0.iter().map(|l| l.name.to_string()).collect::<Vec<_>>()).collect();
        v.sort();
        v.dedup();
        Ok(v)
    }

    async fn label_values(&self, name: &str, ms: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        let mut v: Vec<String> = self.series.iter().filter(|s| matches_all(ms, &s.0) && s.2.iter().any(|x| x.t >= start && x.t <= end)).filter_map(|s| s.0.get(name).map(str::to_string)).collect();
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
    use crate::store::conformance;

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
