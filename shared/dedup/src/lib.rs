//! [`ReplicaDedup`]: HA deduplication as a [`Store`] wrapper, the way a global querier sees
//! an HA pair as one source.
//!
//! Series that differ only in a replica label (`--query.replica-label`, `replica` by
//! default) are one series: the replica labels are dropped and their samples merged by
//! `samples::merge_replicas`. The merge knows the series' metric type from scrape metadata
//! (the store trait carries it), not from the function a query applies: a counter is
//! merged with the counter rule whether it is read by `rate`, `resets` or a plain
//! selector, and a gauge is never averaged. Histogram and summary series (`_bucket`,
//! `_count`, `_sum`) are counters; a summary's quantiles are gauges. A series of unknown
//! type (a page without `# TYPE`, remote write before its metadata) whose name ends in
//! `_total`, `_count`, `_sum` or `_bucket` is merged as a counter (the suffixes Prometheus'
//! "might not be a counter" annotation checks); replicas that disagree on a type are named
//! in the answer's warnings. Which replica is whole is decided once, by
//! `strata_store::whole_replica`, for the merge and for pushdown alike.
//!
//! Dedup is on unless the request's scope says `dedup=false`, which shows every replica.
//! Series with a single replica pass through with their chunks as stored; merged series
//! are re-encoded.

mod pushdown;
pub mod samples;

use async_trait::async_trait;
use std::sync::Arc;
use strata_chunk::Chunk;
use strata_model::{Label, Labels, Matcher, Metadata, MetricType};
use strata_store::{
    collect_batches, collect_within, whole_replica, BoxBatches, OneBatch, QueryScope, SelectBudget, SelectRequest,
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

/// Name suffixes of counter series (Prometheus' "might not be a counter" annotation checks
/// the same), for series whose type is unknown.
const COUNTER_SUFFIXES: [&str; 4] = ["_total", "_count", "_sum", "_bucket"];

/// Whether a series is merged as a counter.
pub fn is_counter(t: MetricType, labels: &Labels) -> bool {
    match t {
        MetricType::Counter | MetricType::Histogram => true,
        MetricType::Summary => labels.get("quantile").is_none(),
        MetricType::Unknown => labels.metric_name().is_some_and(|n| COUNTER_SUFFIXES.iter().any(|s| n.ends_with(s))),
        _ => false,
    }
}

/// [`samples::covers`] from chunk headers alone, for block-encoded chunks (`false` means
/// "decode and look", not "has a gap").
#[cfg(test)]
fn covers_by_headers(chunks: &[Chunk], first: i64, last: i64) -> bool {
    strata_store::Coverage::of_headers(chunks).is_some_and(|c| c.covers(first, last, c.own_gap()))
}

/// The type a group of replicas is merged as: the one they state; when they disagree, the
/// counter rule if any says counter (it never shows a false reset), and a warning names
/// the series and the types.
fn group_type(labels: &Labels, group: &[SeriesChunks]) -> MetricType {
    let mut known = group.iter().map(|s| s.metric_type).filter(|t| *t != MetricType::Unknown);
    let Some(first) = known.next() else { return MetricType::Unknown };
    let Some(other) = known.find(|t| *t != first) else { return first };
    let chosen = group.iter().map(|s| s.metric_type).find(|t| is_counter(*t, labels)).unwrap_or(first);
    QueryScope::current().warn(format!(
        "series {labels}: HA replicas disagree on the metric type ({} and {}); merged as {}",
        first.as_str(),
        other.as_str(),
        chosen.as_str()
    ));
    chosen
}

/// One series from the replicas of a group (`labels`: theirs without the replica labels):
/// the replica [`whole_replica`] names, as stored, or the samples merged. Both weigh only
/// what lies in the request's range `[start, end]`, as pushdown's summaries do.
fn merge_group(labels: Labels, group: Vec<SeriesChunks>, (start, end): (i64, i64)) -> Result<SeriesChunks, StoreError> {
    let metric_type = group_type(&labels, &group);
    let mut group = group;
    if group.len() == 1 {
        let chunks = group.pop().map(|s| s.chunks).unwrap_or_default();
        return Ok(SeriesChunks { labels, metric_type, chunks });
    }
    let corrupt = |s: &SeriesChunks, e: strata_chunk::ChunkError| StoreError::Corrupt {
        series: s.labels.to_string(),
        reason: e.to_string(),
    };
    // The summaries the stores compute for pushdown, from the same chunks: one decision.
    let mut summaries = Vec::with_capacity(group.len());
    let mut decoded = Vec::with_capacity(group.len());
    for s in &group {
        let (summary, samples) = SeriesSummary::of_range(&s.chunks, start, end, true).map_err(|e| corrupt(s, e))?;
        summaries.push(summary);
        decoded.push(samples);
    }
    if let Some(k) = whole_replica(&summaries.iter().collect::<Vec<_>>()) {
        let chunks = std::mem::take(&mut group[k].chunks);
        return Ok(SeriesChunks { labels, metric_type, chunks });
    }
    let replicas = group
        .iter()
        .zip(decoded)
        .map(|(s, d)| match d {
            Some(v) => Ok(v),
            None => {
                let mut v = Vec::new();
                Chunk::decode_range(&s.chunks, start, end, &mut v).map_err(|e| corrupt(s, e))?;
                Ok(v)
            }
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let merged = samples::merge_replicas(&replicas, is_counter(metric_type, &labels));
    Ok(SeriesChunks { labels, metric_type, chunks: Chunk::encode_samples(merged) })
}

/// The inner store's batches, ordered without the replica labels so that the replicas of
/// a series come one after the other; each group is merged once it is whole (the next
/// series has other labels, or the stream ends).
struct DedupBatches {
    inner: BoxBatches,
    replica_labels: Vec<String>,
    group: Vec<SeriesChunks>,
    key: Option<Labels>,
    /// The request's range: what the merge weighs.
    range: (i64, i64),
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
                    out.push(merge_group(key, std::mem::take(&mut self.group), self.range)?);
                }
                break;
            };
            for s in batch {
                // Compared in place: only a series that starts a group needs its own copy.
                let kept = s.labels.iter().filter(|l| !is_replica_label(l, &self.replica_labels));
                if !self.key.as_ref().is_some_and(|k| k.iter().eq(kept)) {
                    if let Some(k) = self.key.take() {
                        out.push(merge_group(k, std::mem::take(&mut self.group), self.range)?);
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
        let range = (req.start, req.end);
        Ok(Box::new(DedupBatches { inner, replica_labels, group: Vec::new(), key: None, range, done: false }))
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
