//! [`ReplicaDedup`]: HA deduplication as a [`Store`] wrapper, the way a global querier sees
//! an HA pair as one source.
//!
//! Series that differ only in a replica label (`--query.replica-label`, `replica` by
//! default) are one series: the replica labels are dropped and their samples merged by
//! `samples::merge_replicas`. The merge knows the series' metric type from scrape metadata
//! (the store trait carries it), not from the function a query applies: a counter is
//! merged with the counter rule whether it is read by `rate`, `resets` or a plain
//! selector, and a gauge is never averaged. Histogram and summary series (`_bucket`,
//! `_count`, `_sum`) are counters; a summary's quantiles are gauges.
//!
//! Dedup is on unless the request's scope says `dedup=false`, which shows every replica.
//! Series with a single replica pass through with their chunks as stored; merged series
//! are re-encoded.

pub mod samples;

use async_trait::async_trait;
use std::sync::Arc;
use strata_chunk::Chunk;
use strata_model::{Label, Labels, Matcher, Metadata, MetricType, Sample};
use strata_store::{QueryScope, SelectBudget, SelectRequest, SeriesChunks, Store, StoreError};

pub struct ReplicaDedup {
    inner: Arc<dyn Store>,
    replica_labels: Vec<String>,
}

impl ReplicaDedup {
    pub fn new(inner: Arc<dyn Store>, replica_labels: Vec<String>) -> Self {
        ReplicaDedup { inner, replica_labels }
    }

    fn strip(&self, l: &Labels) -> Labels {
        let kept: Vec<Label> =
            l.iter().filter(|x| !self.replica_labels.iter().any(|r| r.as_str() == x.name.as_ref())).cloned().collect();
        Labels::from_sorted_unchecked(kept)
    }
}

/// Whether a series is merged as a counter.
pub fn is_counter(t: MetricType, labels: &Labels) -> bool {
    match t {
        MetricType::Counter | MetricType::Histogram => true,
        MetricType::Summary => labels.get("quantile").is_none(),
        _ => false,
    }
}

/// [`samples::covers`] from chunk headers alone, for block-encoded chunks: each chunk's
/// largest possible step, and the steps between chunks, within 1.5 grid steps, and the span
/// reached at both ends. (Block chunks hold no staleness markers.) `false` means "decode
/// and look", not "has a gap".
fn covers_by_headers(chunks: &[Chunk], first: i64, last: i64) -> bool {
    let Some(bounds) = chunks.iter().map(Chunk::step_bounds).collect::<Option<Vec<_>>>() else { return false };
    let Some(step) = bounds.iter().map(|b| b.0).min() else { return false };
    let gap = step.saturating_add(step / 2);
    let (Some(a), Some(z)) = (chunks.first(), chunks.last()) else { return false };
    a.min_t <= first.saturating_add(gap)
        && z.max_t >= last.saturating_sub(gap)
        && bounds.iter().all(|b| b.1 <= gap)
        && chunks.windows(2).all(|w| w[1].min_t > w[0].max_t && w[1].min_t - w[0].max_t <= gap)
}

#[async_trait]
impl Store for ReplicaDedup {
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        let found = self.inner.select_within(req, budget).await?;
        if !QueryScope::current().dedup || self.replica_labels.is_empty() {
            return Ok(found);
        }
        let mut keyed: Vec<(Labels, SeriesChunks)> = found.into_iter().map(|s| (self.strip(&s.labels), s)).collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<SeriesChunks> = Vec::with_capacity(keyed.len());
        let mut i = 0;
        while i < keyed.len() {
            let j = (i..keyed.len()).find(|&j| keyed[j].0 != keyed[i].0).unwrap_or(keyed.len());
            let labels = keyed[i].0.clone();
            let metric_type =
                keyed[i..j].iter().map(|k| k.1.metric_type).find(|t| *t != MetricType::Unknown).unwrap_or_default();
            if j - i == 1 {
                let s = keyed[i].1.clone();
                out.push(SeriesChunks { labels, metric_type, chunks: s.chunks });
            } else {
                let group = &keyed[i..j];
                let decode = |s: &SeriesChunks| -> Result<Vec<Sample>, StoreError> {
                    let mut v = Vec::new();
                    Chunk::decode_range(&s.chunks, i64::MIN, i64::MAX, &mut v)
                        .map_err(|e| StoreError::Corrupt { series: s.labels.to_string(), reason: e.to_string() })?;
                    Ok(v)
                };
                // The fullest replica first (counts and span from chunk headers): if it covers
                // the span without a gap, it is the answer and the others stay encoded.
                let first = group.iter().filter_map(|g| g.1.chunks.first()).map(|c| c.min_t).min().unwrap_or(0);
                let last = group.iter().filter_map(|g| g.1.chunks.last()).map(|c| c.max_t).max().unwrap_or(0);
                let count = |g: &(Labels, SeriesChunks)| g.1.chunks.iter().map(|c| c.n as u64).sum::<u64>();
                let fullest = (0..group.len()).max_by_key(|&k| count(&group[k])).unwrap_or(0);
                let candidate = &group[fullest].1.chunks;
                let fullest_samples =
                    if covers_by_headers(candidate, first, last) { None } else { Some(decode(&group[fullest].1)?) };
                let chunks = match fullest_samples {
                    Some(f) if !samples::covers(&f, first, last) => {
                        // The fullest replica is decoded already; the others now.
                        let mut f = Some(f);
                        let replicas = (0..group.len())
                            .map(|k| if k == fullest { Ok(f.take().unwrap_or_default()) } else { decode(&group[k].1) })
                            .collect::<Result<Vec<_>, _>>()?;
                        match samples::merge(&replicas, is_counter(metric_type, &labels)) {
                            // One replica covers the span without a gap: its chunks go on as stored.
                            samples::Merged::Replica(k) => group[k].1.chunks.clone(),
                            samples::Merged::Samples(merged) => Chunk::encode_samples(merged),
                        }
                    }
                    // The fullest replica covers the span without a gap: it is the answer.
                    _ => group[fullest].1.chunks.clone(),
                };
                out.push(SeriesChunks { labels, metric_type, chunks });
            }
            i = j;
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
        let found = self.inner.series_within(matchers, start, end, budget).await?;
        if !QueryScope::current().dedup {
            return Ok(found);
        }
        let mut out: Vec<Labels> = found.iter().map(|l| self.strip(l)).collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        let names = self.inner.label_names(matchers, start, end).await?;
        if !QueryScope::current().dedup {
            return Ok(names);
        }
        Ok(names.into_iter().filter(|n| !self.replica_labels.contains(n)).collect())
    }

    async fn label_values(
        &self,
        name: &str,
        matchers: &[Matcher],
        start: i64,
        end: i64,
    ) -> Result<Vec<String>, StoreError> {
        if QueryScope::current().dedup && self.replica_labels.iter().any(|r| r == name) {
            return Ok(Vec::new());
        }
        self.inner.label_values(name, matchers, start, end).await
    }

    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        self.inner.metadata(metric).await
    }
}

#[cfg(test)]
mod tests;
