//! [`Fanout`]: one [`Store`] over many, the global querier's view of its stores.
//!
//! A selection asks only the stores that can hold an answer: those whose time range
//! overlaps the request and one of whose external label sets agrees with every matcher on
//! those labels (`cluster="c1"` never reaches the stores of `c0`). The calls run at once,
//! each under the fan-out's timeout. A store that fails or is too slow is named with the
//! reason: as a warning in the request's [`QueryScope`] (partial response, the default),
//! or, with `partial_response=false`, as the request's error. Only the request's own errors
//! fail it either way: its limit reached (by the fan-out's own count, or by one store's part
//! alone). A store that refuses what the others answer (a request its version does not
//! take, a limit of its own below the request's) fails alone. The timeout counts the
//! store's own time, never the time the consumer takes to read what it sent. A store that
//! failed is not asked again within the same request (the scope remembers it), so a
//! hanging store costs one timeout per request, not one per selection. Every call runs in
//! the request's scope, so a store's own warnings (a stacked global's) reach the answer.
//!
//! With `partial_response=false`, a store that fails while an HA replica of it answered
//! (`replicas`: the same external labels but for the replica labels, data over the times
//! read) leaves the answer whole: a warning, not an error.
//!
//! A selection streams (`stream`): each store's batches come through a small channel and
//! a k-way merge hands them on in order, so the fan-out holds a few batches per store,
//! not every store's answer. Series with the same labels from several stores (a global
//! stacked over globals that share a store) are merged into one, each sample once. Replicas that differ only in a
//! replica label are not merged here: that is `ReplicaDedup`'s job, over this store.

mod replicas;
mod stream;
#[cfg(test)]
mod tests;

use async_trait::async_trait;
use parking_lot::RwLock;
use std::sync::Arc;
use std::time::Duration;
use strata_model::{Labels, Matcher, Metadata};
use strata_store::{
    collect_within, require_matchers, BoxBatches, QueryScope, SelectBudget, SelectLimits, SelectRequest, SeriesChunks,
    Steps, StepsRequest, StepsSeries, Store, StoreError,
};

/// One store behind the fan-out, with what its `Info` said.
#[derive(Clone)]
pub struct StoreTarget {
    /// Its address or name, as warnings and errors name it.
    pub name: String,
    pub store: Arc<dyn Store>,
    /// External label sets of the data behind it (empty: unknown, always asked).
    pub label_sets: Vec<Labels>,
    /// Milliseconds, inclusive; `min_time > max_time` when it holds nothing yet, which
    /// is not used to skip it (a fresh store may have data by the time it is asked).
    pub min_time: i64,
    pub max_time: i64,
    /// Aggregates it holds: (window width, first and last sample time covered), ms.
    pub resolutions: Vec<(i64, i64, i64)>,
}

impl StoreTarget {
    /// A store asked for everything (no labels or time range known).
    pub fn new(name: impl Into<String>, store: Arc<dyn Store>) -> Self {
        StoreTarget {
            name: name.into(),
            store,
            label_sets: Vec::new(),
            min_time: i64::MIN,
            max_time: i64::MAX,
            resolutions: Vec::new(),
        }
    }

    /// Whether this store can hold series matching `matchers` in `[start, end]`.
    pub fn may_match(&self, matchers: &[Matcher], start: i64, end: i64) -> bool {
        let in_time = self.min_time > self.max_time || (self.min_time <= end && self.max_time >= start);
        let labels_agree = |set: &Labels| {
            matchers.iter().all(|m| match set.get(&m.name) {
                Some(v) => m.matches(v),
                None => true,
            })
        };
        in_time && (self.label_sets.is_empty() || self.label_sets.iter().any(labels_agree))
    }
}

pub struct Fanout {
    targets: RwLock<Arc<Vec<StoreTarget>>>,
    timeout: Duration,
    /// The labels that tell HA replicas apart (see [`Fanout::with_replica_labels`]).
    replica_labels: Arc<Vec<String>>,
}

/// What a store's failure means for the request.
pub(crate) enum Failure {
    /// The request's own error: fails it whatever partial response says.
    Request(StoreError),
    /// The store's: a warning under partial response.
    Store(String),
    /// The store refused the request as invalid: its failure alone, unless every store
    /// refuses it (then the request is at fault).
    Refused(String, StoreError),
}

impl Fanout {
    pub fn new(targets: Vec<StoreTarget>, timeout: Duration) -> Self {
        Fanout { targets: RwLock::new(Arc::new(targets)), timeout, replica_labels: Arc::default() }
    }

    /// The labels that tell HA replicas apart: a failed store one of whose replicas
    /// answered does not fail a `partial_response=false` request.
    pub fn with_replica_labels(mut self, labels: Vec<String>) -> Self {
        self.replica_labels = Arc::new(labels);
        self
    }

    /// Replaces the stores (discovery found others); requests in flight keep the old set.
    pub fn set_targets(&self, targets: Vec<StoreTarget>) {
        *self.targets.write() = Arc::new(targets);
    }

    pub fn targets(&self) -> Arc<Vec<StoreTarget>> {
        self.targets.read().clone()
    }

    /// Runs `call` on every store that may match, at once, each within the timeout.
    /// Returns the answers in store order; failures are settled per the request's scope.
    async fn ask<T: Send + 'static, F>(
        &self,
        range: (&[Matcher], i64, i64),
        limits: SelectLimits,
        call: impl Fn(Arc<dyn Store>) -> F,
    ) -> Result<Vec<T>, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (_, answers) = self.ask_indexed(range, limits, call).await?;
        Ok(answers.into_iter().map(|a| a.1).collect())
    }

    /// [`ask`](Self::ask), each answer with its store's index in the targets returned.
    async fn ask_indexed<T: Send + 'static, F>(
        &self,
        (matchers, start, end): (&[Matcher], i64, i64),
        limits: SelectLimits,
        call: impl Fn(Arc<dyn Store>) -> F,
    ) -> Result<(Arc<Vec<StoreTarget>>, Vec<(usize, T)>), StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let scope = QueryScope::current();
        let targets = self.targets();
        let mut set = tokio::task::JoinSet::new();
        let asked = targets.iter().enumerate().filter(|(_, t)| t.may_match(matchers, start, end));
        for (i, t) in asked.filter(|(_, t)| !scope.has_failed(&t.name)) {
            let (fut, timeout) = (call(t.store.clone()), self.timeout);
            set.spawn(scope.clone().run(async move { (i, tokio::time::timeout(timeout, fut).await) }));
        }
        let mut answers: Vec<(usize, T)> = Vec::new();
        let mut failed: Vec<(usize, String)> = Vec::new();
        let mut refused: Vec<StoreError> = Vec::new();
        while let Some(joined) = set.join_next().await {
            let (i, out) = match joined {
                Ok(x) => x,
                Err(e) => return Err(StoreError::Unavailable(format!("a store call failed: {e}"))),
            };
            let failure = match out {
                Ok(Ok(v)) => {
                    answers.push((i, v));
                    continue;
                }
                Ok(Err(e)) => classify(e, &limits),
                Err(_) => Failure::Store(format!("no answer within {:?}", self.timeout)),
            };
            match failure {
                Failure::Request(e) => return Err(e),
                Failure::Store(reason) => failed.push((i, reason)),
                Failure::Refused(reason, e) => {
                    failed.push((i, reason));
                    refused.push(e);
                }
            }
        }
        if answers.is_empty() && !refused.is_empty() && refused.len() == failed.len() {
            // Every store that was asked refused it: the request is what is wrong.
            return Err(refused.swap_remove(0));
        }
        failed.sort_by_key(|f| f.0);
        if !scope.partial_response {
            let alive: Vec<&StoreTarget> = answers.iter().map(|(i, _)| &targets[*i]).collect();
            let earlier = targets
                .iter()
                .filter(|t| t.may_match(matchers, start, end) && scope.has_failed(&t.name))
                .map(|t| (t, replicas::FAILED_EARLIER));
            let all = failed.iter().map(|(i, r)| (&targets[*i], r.as_str())).chain(earlier);
            let named = replicas::uncovered(all, &alive, &self.replica_labels, scope.dedup, start);
            if !named.is_empty() {
                return Err(StoreError::Unavailable(format!("{} (partial_response=false)", named.join("; "))));
            }
        }
        if !failed.is_empty() {
            let named: Vec<String> = failed.iter().map(|(i, r)| format!("store {}: {r}", targets[*i].name)).collect();
            for (i, _) in &failed {
                scope.store_failed(&targets[*i].name);
            }
            for w in named {
                tracing::debug!(warning = %w, "partial response");
                scope.warn(w);
            }
        }
        answers.sort_by_key(|a| a.0);
        Ok((targets, answers))
    }
}

/// Whose failure a store's error is. `limits`: the request's.
pub(crate) fn classify(e: StoreError, limits: &SelectLimits) -> Failure {
    let requested = |what: &str| match what {
        "series" => u64::try_from(limits.max_series).unwrap_or(u64::MAX),
        _ => limits.max_samples,
    };
    match e {
        // One store's part alone reached the request's limit (the store applies the limit
        // the request carries): the whole answer would too.
        StoreError::LimitExceeded { what, limit } if limit == requested(what) => Failure::Request(e),
        StoreError::LimitExceeded { what, limit } => {
            Failure::Store(format!("refused at a {what} limit of {limit}, not the request's {}", requested(what)))
        }
        // The fan-out validated the request before it asked: a store that refuses it (a
        // version that does not take it) fails alone.
        StoreError::InvalidRequest(ref m) => Failure::Refused(format!("refused the request: {m}"), e),
        StoreError::Unavailable(m) => Failure::Store(m),
        StoreError::Corrupt { series, reason } if series.is_empty() => Failure::Store(reason),
        StoreError::Corrupt { series, reason } => Failure::Store(format!("series {series}: {reason}")),
    }
}

#[async_trait]
impl Store for Fanout {
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        collect_within(self.select_batches(req).await?, budget).await
    }

    async fn select_batches(&self, req: &SelectRequest) -> Result<BoxBatches, StoreError> {
        require_matchers(&req.matchers)?;
        let (targets, scope) = (self.targets(), QueryScope::current());
        let (asked, earlier): (Vec<&StoreTarget>, Vec<&StoreTarget>) = targets
            .iter()
            .filter(|t| t.may_match(&req.matchers, req.start, req.end))
            .partition(|t| !scope.has_failed(&t.name));
        let earlier = earlier.into_iter().cloned().collect();
        Ok(Box::new(stream::MergedBatches::start(&asked, earlier, req, self.timeout, self.replica_labels.clone())))
    }

    async fn series_within(
        &self,
        matchers: &[Matcher],
        start: i64,
        end: i64,
        budget: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        let ms = matchers.to_vec();
        let answers = self
            .ask((matchers, start, end), SelectLimits::default(), move |s| {
                let ms = ms.clone();
                async move { s.series(&ms, start, end).await }
            })
            .await?;
        let mut all: Vec<Labels> = answers.into_iter().flatten().collect();
        all.sort();
        all.dedup();
        for _ in &all {
            budget.charge_labels()?;
        }
        Ok(all)
    }

    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        let ms = matchers.to_vec();
        let answers = self
            .ask((matchers, start, end), SelectLimits::default(), move |s| {
                let ms = ms.clone();
                async move { s.label_names(&ms, start, end).await }
            })
            .await?;
        Ok(sorted_union(answers))
    }

    async fn label_values(
        &self,
        name: &str,
        matchers: &[Matcher],
        start: i64,
        end: i64,
    ) -> Result<Vec<String>, StoreError> {
        let (ms, name) = (matchers.to_vec(), name.to_string());
        let answers = self
            .ask((matchers, start, end), SelectLimits::default(), move |s| {
                let (ms, name) = (ms.clone(), name.clone());
                async move { s.label_values(&name, &ms, start, end).await }
            })
            .await?;
        Ok(sorted_union(answers))
    }

    /// Asks the stores that may hold the leaf's series to evaluate it, at once, with the
    /// selections' timeouts and partial response.
    async fn steps(&self, req: &StepsRequest) -> Result<Option<Steps>, StoreError> {
        require_matchers(&req.matchers)?;
        let sel = req.selection();
        let shared = Arc::new(req.clone());
        let (targets, answers) = self
            .ask_indexed((&sel.matchers, sel.start, sel.end), req.limits, move |s| {
                let r = shared.clone();
                async move { s.steps(&r).await }
            })
            .await?;
        let answers = answers.into_iter().map(|(i, a)| a.map(|a| (targets[i].label_sets.clone(), a))).collect();
        merged_steps(answers, req.limits)
    }

    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        let metric = metric.map(str::to_string);
        let answers = self
            .ask((&[], i64::MIN, i64::MAX), SelectLimits::default(), move |s| {
                let metric = metric.clone();
                async move { s.metadata(metric.as_deref()).await }
            })
            .await?;
        // The first store's word for a family wins; families sorted.
        let mut out: Vec<(String, Metadata)> = Vec::new();
        for (family, m) in answers.into_iter().flatten() {
            if !out.iter().any(|(f, _)| *f == family) {
                out.push((family, m));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// Every store's evaluation of a leaf (with the store's label sets), as one answer sorted
/// by labels; `None` if one of them does not evaluate leaves, if two computed the same
/// group of an aggregation (each saw only its part), or if two hold the same series and
/// neither is known to hold all the other does (the select path merges those sample by
/// sample, which step values cannot be).
///
/// A series two stores hold is, by design, an edge's and the copy the regional it forwards
/// to received: the regional lists the edge's label set among its own ([`feeds`]). The
/// edge's copy then holds every sample of the regional's when it spans it, has at least as
/// many samples, runs without a gap of its own, and the regional's holds no staleness
/// marker the edge's lacks ([`holds`]). Only then are its step values the merged series',
/// and a regional's answer every series of which edges hold so is dropped whole (its groups
/// too, under an aggregation). Anything else, including copies from stores that do not
/// feed one another, is merged from samples as before.
fn merged_steps(answers: Vec<Option<(Vec<Labels>, Steps)>>, limits: SelectLimits) -> Result<Option<Steps>, StoreError> {
    let Some(mut answers) = answers.into_iter().collect::<Option<Vec<(Vec<Labels>, Steps)>>>() else {
        return Ok(None);
    };
    drop_fed(&mut answers);
    let mut out = Steps::default();
    // The query's budget holds for all stores together, not for each.
    let mut values = 0u64;
    // The store each series came from, by its place in `out.series`.
    let mut sources: Vec<usize> = Vec::new();
    let mut stores: Vec<Vec<Labels>> = Vec::with_capacity(answers.len());
    for (k, (sets, a)) in answers.into_iter().enumerate() {
        values = a.series.iter().chain(&a.groups).fold(values, |v, s| v.saturating_add(s.values.present() as u64));
        if values > limits.max_samples {
            return Err(StoreError::LimitExceeded { what: "samples", limit: limits.max_samples });
        }
        sources.extend(std::iter::repeat_n(k, a.series.len()));
        out.series.extend(a.series);
        out.groups.extend(a.groups);
        if out.series.len().max(out.groups.len()) > limits.max_series {
            return Err(StoreError::LimitExceeded { what: "series", limit: limits.max_series as u64 });
        }
        out.samples = out.samples.saturating_add(a.samples);
        out.warnings.extend(a.warnings.into_iter().filter(|w| !out.warnings.contains(w)).collect::<Vec<_>>());
        out.infos.extend(a.infos.into_iter().filter(|i| !out.infos.contains(i)).collect::<Vec<_>>());
        stores.push(sets);
    }
    // Which store each series came from, in the order the series are sorted into.
    let mut order: Vec<usize> = (0..out.series.len()).collect();
    order.sort_by(|&a, &b| out.series[a].labels.cmp(&out.series[b].labels));
    let mut series: Vec<Option<StepsSeries>> = std::mem::take(&mut out.series).into_iter().map(Some).collect();
    let mut sorted: Vec<(usize, StepsSeries)> = Vec::with_capacity(series.len());
    for i in order {
        if let Some(s) = series[i].take() {
            sorted.push((sources[i], s));
        }
    }
    out.groups.sort_by(|a, b| a.labels.cmp(&b.labels));
    // A group two stores each computed a part of.
    if out.groups.windows(2).any(|w| w[0].labels == w[1].labels) {
        return Ok(None);
    }
    if sorted.windows(2).any(|w| w[0].1.labels == w[1].1.labels) {
        if !out.groups.is_empty() {
            return Ok(None);
        }
        let Some(kept) = source_copies(sorted, &stores) else { return Ok(None) };
        out.series = kept;
    } else {
        out.series = sorted.into_iter().map(|(_, s)| s).collect();
    }
    Ok(Some(out))
}

/// Whether the store listing `a` forwards its data to the store listing `b`: every set of
/// `a` is one of `b`'s, and `b` lists more (a regional lists the edges that forward to it).
/// A store that lists none (unknown, or written to by remote write) is nobody's source,
/// and neither of two stores listing the same sets is the other's.
fn feeds(a: &[Labels], b: &[Labels]) -> bool {
    // As sets: a global lists its stores' sets, some of them twice.
    let (a, b): (std::collections::BTreeSet<&Labels>, std::collections::BTreeSet<&Labels>) =
        (a.iter().collect(), b.iter().collect());
    !a.is_empty() && b.len() > a.len() && a.is_subset(&b)
}

/// Whether `source`, a series' copy at the store that feeds the other, holds every sample
/// of `copy`: it spans it, has at least as many samples, runs without a gap (no step
/// longer than 1.5 of the smallest scrape step either copy shows: a sample it lost would be
/// one), and `copy` has no staleness marker it lacks. A few samples prove no regularity
/// (the middle step of two or three is the one a lost sample made): under
/// [`MIN_SAMPLES_HELD`] the copies are merged instead, which costs nothing at that size.
fn holds(source: &strata_store::SeriesSummary, copy: &strata_store::SeriesSummary) -> bool {
    let Some(c) = copy.span else { return true };
    let Some(s) = source.span else { return false };
    let Some(step) = [source.step(), copy.step()].into_iter().flatten().min() else { return false };
    let gap = step.saturating_add(step / 2);
    let stale = |x: &strata_store::SeriesSummary| [x.by_headers, x.by_samples].iter().flatten().any(|c| c.stale);
    let gap_free = [source.by_headers, source.by_samples].iter().flatten().any(|c| c.max_step <= gap);
    source.samples >= MIN_SAMPLES_HELD
        && s.0 <= c.0
        && s.1 >= c.1
        && source.samples >= copy.samples
        && gap_free
        && (stale(source) || !stale(copy))
}

/// The fewest samples in range a copy must have to stand for another's.
const MIN_SAMPLES_HELD: u64 = 4;

/// Drops each answer every series of which an answer from a store feeding it [`holds`]: a
/// regional's part beside the edges whose data it copies. Those answers' step values and
/// groups are then the merged series', and no group is counted twice. An answer dropped
/// holds nothing for another.
fn drop_fed(answers: &mut Vec<(Vec<Labels>, Steps)>) {
    let mut i = 0;
    while i < answers.len() {
        let (sets, steps) = &answers[i];
        let held = !steps.series.is_empty()
            && steps.series.iter().all(|s| {
                answers.iter().enumerate().any(|(j, (by, other))| {
                    // Sorted by labels, as every store answers.
                    j != i
                        && feeds(by, sets)
                        && other
                            .series
                            .binary_search_by(|o| o.labels.cmp(&s.labels))
                            .is_ok_and(|k| holds(&other.series[k].summary, &s.summary))
                })
            });
        if held {
            answers.remove(i);
        } else {
            i += 1;
        }
    }
}

/// Of each run of series with the same labels (sorted, each with its store's index into
/// `stores`), the copy of the store that feeds every other's and [`holds`] theirs; `None`
/// when a run has none.
fn source_copies(series: Vec<(usize, StepsSeries)>, stores: &[Vec<Labels>]) -> Option<Vec<StepsSeries>> {
    let mut out: Vec<StepsSeries> = Vec::with_capacity(series.len());
    let mut run: Vec<(usize, StepsSeries)> = Vec::new();
    let settle = |run: &mut Vec<(usize, StepsSeries)>, out: &mut Vec<StepsSeries>| -> Option<()> {
        let source = (0..run.len()).find(|&k| {
            run.iter().enumerate().all(|(j, (store, s))| {
                j == k || (feeds(&stores[run[k].0], &stores[*store]) && holds(&run[k].1.summary, &s.summary))
            })
        })?;
        out.push(run.swap_remove(source).1);
        run.clear();
        Some(())
    };
    for s in series {
        if run.last().is_some_and(|l| l.1.labels != s.1.labels) {
            settle(&mut run, &mut out)?;
        }
        run.push(s);
    }
    if !run.is_empty() {
        settle(&mut run, &mut out)?;
    }
    Some(out)
}

fn sorted_union(answers: Vec<Vec<String>>) -> Vec<String> {
    let mut all: Vec<String> = answers.into_iter().flatten().collect();
    all.sort();
    all.dedup();
    all
}
