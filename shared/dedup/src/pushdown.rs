//! Pushdown through the dedup: a query's leaf evaluated where each series is stored, on
//! the replica the merge would pass through whole, so that step values cross the wire
//! instead of every replica's samples, and the answer is the merge's.
//!
//! The choice needs every replica's summary ([`SeriesSummary`]: counts, span, gaps), and
//! the values only the chosen replica's. Asking for summaries first and values after
//! costs two round trips; so once a pushdown has shown which replica most series come from
//! (the [`Guess`], per replica label values: `replica="b"`), the next one asks that replica
//! for values and the others for summaries at once. Series the guess does not cover are
//! evaluated in a second call; a group no summary decides (replicas with gaps, merged
//! sample by sample) sends the leaf back to the engine, which selects samples.

use super::{is_replica_label, strip, whole_replica};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use strata_model::{Labels, MatchOp, Matcher};
use strata_store::steps::hash_labels;
use strata_store::{labels_hash, SeriesSummary, Steps, StepsRequest, StepsSeries, Store, StoreError};

/// The replica labels (name, value) of the replica most series came from last time.
#[derive(Default)]
pub(crate) struct Guess(Mutex<Option<Vec<(String, String)>>>);

impl Guess {
    fn get(&self) -> Option<Vec<(String, String)>> {
        self.0.lock().ok().and_then(|g| g.clone())
    }

    fn set(&self, g: Option<Vec<(String, String)>>) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = g;
        }
    }
}

pub(crate) async fn steps(
    inner: &dyn Store,
    req: &StepsRequest,
    replica_labels: &[String],
    guess: &Guess,
) -> Result<Option<Steps>, StoreError> {
    if let Some(spec) = &req.aggregate {
        return aggregate(inner, req, spec, replica_labels, guess).await;
    }
    let from_guess = match guess.get() {
        Some(g) => guessed_or_forget(inner, req, &g, guess).await?,
        None => None,
    };
    let (mut evaluated, summaries) = match from_guess {
        Some(Some(both)) => both,
        Some(None) => return Ok(None),
        None => {
            let mut look = req.clone();
            look.values = false;
            match inner.steps(&look).await? {
                Some(s) => (Steps::default(), s),
                None => return Ok(None),
            }
        }
    };
    let Some(chosen) = decide(&evaluated, &summaries, replica_labels, guess) else { return Ok(None) };
    evaluated.series.retain(|s| chosen.get(&labels_hash(&s.labels)).is_some_and(|l| *l == s.labels));
    let got: HashSet<u64> = evaluated.series.iter().map(|s| labels_hash(&s.labels)).collect();
    let missing: HashSet<u64> = chosen.keys().filter(|h| !got.contains(h)).copied().collect();
    if !missing.is_empty() {
        let mut rest = req.clone();
        rest.only = Some(Arc::new(missing));
        let Some(more) = inner.steps(&rest).await? else { return Ok(None) };
        // A hash only narrows what the stores evaluate: the labels decide what is kept.
        let wanted = |s: &StepsSeries| chosen.get(&labels_hash(&s.labels)).is_some_and(|l| *l == s.labels);
        evaluated.series.extend(more.series.into_iter().filter(|s| wanted(s)));
        evaluated.samples = evaluated.samples.saturating_add(more.samples);
        evaluated.warnings.extend(more.warnings);
        evaluated.infos.extend(more.infos);
    }
    for s in &mut evaluated.series {
        s.labels = strip(&s.labels, replica_labels);
    }
    evaluated.series.sort_by(|a, b| a.labels.cmp(&b.labels));
    Ok(Some(evaluated))
}

/// The leaf evaluated on the guessed replica, and the other replicas' summaries, at once.
async fn guessed(
    inner: &dyn Store,
    req: &StepsRequest,
    guess: &[(String, String)],
) -> Result<Option<(Steps, Steps)>, StoreError> {
    let mut values = req.clone();
    values.matchers.extend(guess.iter().map(|(n, v)| Matcher::eq(n, v)));
    let mut look = req.clone();
    look.values = false;
    look.aggregate = None;
    if let [(n, v)] = guess {
        let not = Matcher::new(MatchOp::NotEqual, n, v).map_err(|e| StoreError::InvalidRequest(e.to_string()))?;
        look.matchers.push(not);
    }
    let (values, summaries) = tokio::join!(inner.steps(&values), inner.steps(&look));
    Ok(match (values?, summaries?) {
        (Some(v), Some(s)) => Some((v, s)),
        _ => None,
    })
}

/// [`guessed`], except that with `partial_response=false` a guessed replica that fails
/// makes the guess forgotten (`None`), not the request failed: asked alone, a replica
/// cannot be stood in for by its twin, which the fan-out allows when every replica is
/// asked at once (the unguessed way, which the caller takes next).
#[allow(clippy::type_complexity)]
async fn guessed_or_forget(
    inner: &dyn Store,
    req: &StepsRequest,
    g: &[(String, String)],
    guess: &Guess,
) -> Result<Option<Option<(Steps, Steps)>>, StoreError> {
    match guessed(inner, req, g).await {
        Ok(both) => Ok(Some(both)),
        Err(StoreError::Unavailable(_)) if !strata_store::QueryScope::current().partial_response => {
            guess.set(None);
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The replica of each series the merge passes whole, from every replica's summary (the
/// evaluated ones carry theirs); remembers the replica most came from as the next guess.
fn decide(
    evaluated: &Steps,
    summaries: &Steps,
    replica_labels: &[String],
    guess: &Guess,
) -> Option<HashMap<u64, Labels>> {
    let have: HashSet<&Labels> = evaluated.series.iter().map(|s| &s.labels).collect();
    let all: Vec<&StepsSeries> =
        evaluated.series.iter().chain(summaries.series.iter().filter(|s| !have.contains(&s.labels))).collect();
    let chosen = choose_replicas(&all, replica_labels);
    guess.set(chosen.as_ref().and_then(|c| most_chosen(c.values(), replica_labels)));
    chosen
}

/// An aggregation pushed through the dedup: valid when the guessed replicas evaluated
/// exactly the series the merge would pass whole, and no group was split between stores.
/// Otherwise `None`, and the engine pushes the leaf alone.
async fn aggregate(
    inner: &dyn Store,
    req: &StepsRequest,
    spec: &strata_store::AggregateSpec,
    replica_labels: &[String],
    guess: &Guess,
) -> Result<Option<Steps>, StoreError> {
    // Grouped by a replica label, the stores' groups are not the merged series' groups.
    let by_replica = !spec.without && spec.labels.iter().any(|l| replica_labels.contains(l));
    let Some(g) = guess.get().filter(|_| !by_replica) else { return Ok(None) };
    let Some(Some((mut evaluated, summaries))) = guessed_or_forget(inner, req, &g, guess).await? else {
        return Ok(None);
    };
    let Some(chosen) = decide(&evaluated, &summaries, replica_labels, guess) else { return Ok(None) };
    let whole = evaluated.series.len() == chosen.len()
        && evaluated.series.iter().all(|s| chosen.get(&labels_hash(&s.labels)).is_some_and(|l| *l == s.labels));
    if !whole {
        return Ok(None);
    }
    for g in &mut evaluated.groups {
        g.labels = strip(&g.labels, replica_labels);
    }
    evaluated.groups.sort_by(|a, b| a.labels.cmp(&b.labels));
    if evaluated.groups.windows(2).any(|w| w[0].labels == w[1].labels) {
        return Ok(None);
    }
    evaluated.series.clear();
    Ok(Some(evaluated))
}

/// The replica [`merge_group`](super::merge_group) passes whole for each group of
/// `found`, by the hash of its labels; `None` if a group has none the summaries show, or
/// two series with the same labels (which the fan-out merges).
fn choose_replicas(found: &[&StepsSeries], replica_labels: &[String]) -> Option<HashMap<u64, Labels>> {
    let kept = |l: &&strata_model::Label| !is_replica_label(l, replica_labels);
    // Groups by a hash of the labels without the replica labels; within a group, the
    // merge's order (all labels). Equal hashes are checked for equal labels in place.
    let keys: Vec<u64> = found.iter().map(|s| hash_labels(s.labels.iter().filter(kept))).collect();
    let mut order: Vec<usize> = (0..found.len()).collect();
    order.sort_by(|&a, &b| keys[a].cmp(&keys[b]).then_with(|| found[a].labels.cmp(&found[b].labels)));
    let mut chosen = HashMap::with_capacity(order.len() / 2 + 1);
    for group in order.chunk_by(|&a, &b| keys[a] == keys[b]) {
        let same = |a: usize, b: usize| found[a].labels.iter().filter(kept).eq(found[b].labels.iter().filter(kept));
        // Two groups under one hash, or one series twice (the fan-out merges those).
        if group.windows(2).any(|w| !same(w[0], w[1]) || found[w[0]].labels == found[w[1]].labels) {
            return None;
        }
        let summaries: Vec<&SeriesSummary> = group.iter().map(|&i| &found[i].summary).collect();
        let labels = &found[group[whole_replica(&summaries)?]].labels;
        if chosen.insert(labels_hash(labels), labels.clone()).is_some() {
            return None; // two chosen series share a hash: not worth a second protocol
        }
    }
    Some(chosen)
}

/// The replica label values most of the chosen series carry (counted in place: there are
/// a few distinct ones among many series).
fn most_chosen<'a>(
    chosen: impl Iterator<Item = &'a Labels>,
    replica_labels: &[String],
) -> Option<Vec<(String, String)>> {
    let values = |l: &'a Labels| replica_labels.iter().map(move |n| l.get(n));
    let mut counts: Vec<(&'a Labels, usize)> = Vec::new();
    for l in chosen {
        match counts.iter_mut().find(|(k, _)| values(k).eq(values(l))) {
            Some(c) => c.1 += 1,
            None => counts.push((l, 1)),
        }
    }
    let (best, _) = counts.into_iter().max_by_key(|c| c.1)?;
    let key: Vec<(String, String)> =
        replica_labels.iter().filter_map(|n| best.get(n).map(|v| (n.clone(), v.to_string()))).collect();
    (!key.is_empty()).then_some(key)
}
