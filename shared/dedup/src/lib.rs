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

mod pushdown;
pub mod samples;

use async_trait::async_trait;
use std::sync::Arc;
use strata_chunk::Chunk;
use strata_model::{Label, Labels, Matcher, Metadata, MetricType, Sample};
use strata_store::{
    collect_batches, collect_within, BoxBatches, Coverage, OneBatch, QueryScope, SelectBudget, SelectRequest,
    SeriesBatches, SeriesChunks, SeriesSummary, Steps, StepsRequest, Store, StoreError,
};

pub struct ReplicaDedup {
    inner: Arc<dyn Store>,
    replica_labels: Vec<String>,
    /// The replica most series came from in the last pushdown (see [`pushdown`]).
    guess: pushdown::Guess,
}

impl ReplicaDedup {
    pub fn new(inner: Arc<dyn Store>, replica_labels: Vec<String>) -> Self {
        ReplicaDedup { inner, replica_labels, guess: Default::default() }
    }

    fn strip(&self, l: &Labels) -> Labels {
        strip(l, &self.replica_labels)
    }
}

/// `l` without the replica labels.
fn strip(l: &Labels, replica_labels: &[String]) -> Labels {
    let kept: Vec<Label> = l.iter().filter(|x| !is_replica_label(x, replica_labels)).cloned().collect();
    Labels::from_sorted_unchecked(kept)
}

fn is_replica_label(l: &Label, replica_labels: &[String]) -> bool {
    replica_labels.iter().any(|r| r.as_str() == l.name.as_ref())
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
    Coverage::of_headers(chunks).is_some_and(|c| c.covers(first, last))
}

/// The replica of a group that [`merge_group`] passes through whole, decided from
/// summaries alone; `None` when the summaries do not show one (the merge may still find
/// one, or merge samples). Replicas in the order the merge sees them.
pub fn whole_replica(group: &[&SeriesSummary]) -> Option<usize> {
    if group.len() == 1 {
        return Some(0);
    }
    let first = group.iter().filter_map(|g| g.span).map(|s| s.0).min().unwrap_or(0);
    let last = group.iter().filter_map(|g| g.span).map(|s| s.1).max().unwrap_or(0);
    let fullest = (0..group.len()).max_by_key(|&k| group[k].samples)?;
    group[fullest].surely_covers(first, last).then_some(fullest)
}

/// One series from the replicas of a group (`labels`: theirs without the replica labels).
fn merge_group(labels: Labels, group: Vec<SeriesChunks>) -> Result<SeriesChunks, StoreError> {
    let metric_type = group.iter().map(|s| s.metric_type).find(|t| *t != MetricType::Unknown).unwrap_or_default();
    let mut group = group;
    if group.len() == 1 {
        let chunks = group.pop().map(|s| s.chunks).unwrap_or_default();
        return Ok(SeriesChunks { labels, metric_type, chunks });
    }
    let decode = |s: &SeriesChunks| -> Result<Vec<Sample>, StoreError> {
        let mut v = Vec::new();
        Chunk::decode_range(&s.chunks, i64::MIN, i64::MAX, &mut v)
            .map_err(|e| StoreError::Corrupt { series: s.labels.to_string(), reason: e.to_string() })?;
        Ok(v)
    };
    // The fullest replica first (counts and span from chunk headers): if it covers the
    // span without a gap, it is the answer and the others stay encoded.
    let first = group.iter().filter_map(|g| g.chunks.first()).map(|c| c.min_t).min().unwrap_or(0);
    let last = group.iter().filter_map(|g| g.chunks.last()).map(|c| c.max_t).max().unwrap_or(0);
    let count = |g: &SeriesChunks| g.chunks.iter().map(|c| c.n as u64).sum::<u64>();
    let fullest = (0..group.len()).max_by_key(|&k| count(&group[k])).unwrap_or(0);
    let fullest_samples =
        if covers_by_headers(&group[fullest].chunks, first, last) { None } else { Some(decode(&group[fullest])?) };
    let chunks = match fullest_samples {
        Some(f) if !samples::covers(&f, first, last) => {
            // The fullest replica is decoded already; the others now.
            let mut f = Some(f);
            let replicas = (0..group.len())
                .map(|k| if k == fullest { Ok(f.take().unwrap_or_default()) } else { decode(&group[k]) })
                .collect::<Result<Vec<_>, _>>()?;
            match samples::merge(&replicas, is_counter(metric_type, &labels)) {
                // One replica covers the span without a gap: its chunks go on as stored.
                samples::Merged::Replica(k) => std::mem::take(&mut group[k].chunks),
                samples::Merged::Samples(merged) => Chunk::encode_samples(merged),
            }
        }
        // The fullest replica covers the span without a gap: it is the answer.
        _ => std::mem::take(&mut group[fullest].chunks),
    };
    Ok(SeriesChunks { labels, metric_type, chunks })
}

/// The inner store's batches, ordered without the replica labels so that the replicas of
/// a series come one after the other; each group is merged once it is whole (the next
/// series has other labels, or the stream ends).
struct DedupBatches {
    inner: BoxBatches,
    replica_labels: Vec<String>,
    group: Vec<SeriesChunks>,
    key: Option<Labels>,
    done: bool,
}

#[async_trait]
impl SeriesBatches for DedupBatches {
    async fn next_batch(&mut self) -> Result<Option<Vec<SeriesChunks>>, StoreError> {
        let mut out = Vec::new();
        while out.is_empty() && !self.done {
            let Some(batch) = self.inner.next_batch().await? else {
                self.done = true;
                if let Some(key) = self.key.take() {
                    out.push(merge_group(key, std::mem::take(&mut self.group))?);
                }
                break;
            };
            for s in batch {
                // Compared in place: only a series that starts a group needs its own copy.
                let kept = s.labels.iter().filter(|l| !is_replica_label(l, &self.replica_labels));
                if !self.key.as_ref().is_some_and(|k| k.iter().eq(kept)) {
                    if let Some(k) = self.key.take() {
                        out.push(merge_group(k, std::mem::take(&mut self.group))?);
                    }
                    self.key = Some(strip(&s.labels, &self.replica_labels));
                }
                self.group.push(s);
            }
        }
        Ok(if out.is_empty() { None } else { Some(out) })
    }
}

#[async_trait]
impl Store for ReplicaDedup {
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        collect_within(self.select_batches(req).await?, budget).await
    }

    async fn select_batches(&self, req: &SelectRequest) -> Result<BoxBatches, StoreError> {
        if !QueryScope::current().dedup || self.replica_labels.is_empty() {
            return self.inner.select_batches(req).await;
        }
        if !req.order_without.is_empty() {
            // An order of the caller's own over merged series: gathered, then sorted.
            let mut whole = req.clone();
            whole.order_without.clear();
            let found = collect_batches(self.select_batches(&whole).await?).await?;
            return Ok(Box::new(OneBatch::new(found, req)));
        }
        let mut inner_req = req.clone();
        inner_req.order_without = self.replica_labels.clone();
        let inner = self.inner.select_batches(&inner_req).await?;
        let replica_labels = self.replica_labels.clone();
        Ok(Box::new(DedupBatches { inner, replica_labels, group: Vec::new(), key: None, done: false }))
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

    /// Pushdown over replicas ([`pushdown`] explains it): the leaf is evaluated on the
    /// replica of each series that the merge would pass through whole, decided from every
    /// replica's summary; a series no summary decides sends the whole leaf back to the
    /// engine, which selects samples.
    async fn steps(&self, req: &StepsRequest) -> Result<Option<Steps>, StoreError> {
        if !QueryScope::current().dedup || self.replica_labels.is_empty() {
            return self.inner.steps(req).await;
        }
        if !req.values || req.only.is_some() {
            // Summaries of merged series would need their samples.
            return Ok(None);
        }
        pushdown::steps(&*self.inner, req, &self.replica_labels, &self.guess).await
    }
}

#[cfg(test)]
mod pushdown_tests;
#[cfg(test)]
mod tests;
