//! [`ResolutionPlanner`]: the global's choice, per leaf of a query and per slice of its
//! grid, of the coarsest aggregates that give exactly the raw answer and that its stores
//! hold for that slice, raw data for the rest, the slices stitched per series.
//!
//! Aggregates are used for a leaf only when every store that may hold its series either
//! holds them itself or forwards to one that does (its external label sets are among the
//! senders an aggregate holder lists): otherwise the aggregates would miss that store's
//! series. The steps before and after what the aggregates cover (the newest hours, which
//! are not downsampled yet) come from the raw path, deduplicated as always. A holder that
//! cannot answer (a series that keeps no aggregate the function needs, a store down) sends
//! the whole leaf back to the raw path. By default ([`Prefer::Coarsest`]) aggregates answer
//! every step they cover exactly (`RawWhereHeld`: only those older than the raw data their
//! holders keep). Steps raw data no longer reaches, for a leaf no resolution is exact for,
//! are answered approximately and said to be (`plan/approx.rs`). Each slice's resolution is
//! recorded in the request's scope for `stats`.

mod approx;

use crate::leaf::{check, Grid, Leaf};
use crate::range::RangeFn;
use crate::{Kept, FIVE_MINUTES, ONE_HOUR};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use strata_fanout::{Fanout, StoreTarget};
use strata_model::{Labels, Matcher, Metadata, MetricType};
use strata_store::{
    QueryScope, ResolutionUsed, SelectBudget, SelectRequest, SeriesChunks, SeriesSummary, StepValues, Steps,
    StepsRequest, StepsSeries, Store, StoreError,
};

pub struct ResolutionPlanner {
    raw: Arc<dyn Store>,
    fanout: Arc<Fanout>,
    timeout: Duration,
    prefer: Prefer,
    /// The dedup's replica labels: aggregates hold series without them.
    replica_labels: Vec<String>,
    /// Evaluates the raw steps between aggregate segments in process when no store does
    /// (the dedup over an HA pair needs samples): without it such a query is answered from
    /// raw data alone.
    raw_evaluator: Option<Arc<dyn Store>>,
}

/// Where aggregates answer when both they and raw data could.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Prefer {
    /// Raw data wherever a holder of the aggregates still keeps it; aggregates for older
    /// steps (keeps recent ranges off the regionals).
    RawWhereHeld,
    /// The coarsest exact aggregates wherever they cover the steps: the default, since
    /// aggregates answer faster than raw data (docs/downsample.md).
    #[default]
    Coarsest,
}

/// Steps `first..=last` of a leaf's grid from windows `width` wide held by `holders`.
pub(crate) struct Segment {
    width: i64,
    pub(crate) first: usize,
    last: usize,
    holders: Vec<StoreTarget>,
}

impl ResolutionPlanner {
    /// `raw`: the deduplicated view over `fanout`'s stores, by `replica_labels`.
    pub fn new(raw: Arc<dyn Store>, fanout: Arc<Fanout>, replica_labels: Vec<String>, timeout: Duration) -> Self {
        ResolutionPlanner { raw, fanout, timeout, prefer: Prefer::default(), replica_labels, raw_evaluator: None }
    }

    /// `evaluator`: a store whose [`Store::steps`] evaluates over the same raw data in
    /// process (the engine's `Evaluating` over the dedup), for the raw parts of a grid that
    /// aggregates answer elsewhere.
    pub fn with_raw_evaluator(mut self, evaluator: Arc<dyn Store>) -> Self {
        self.raw_evaluator = Some(evaluator);
        self
    }

    /// A raw part's steps: from the stores where they evaluate; an aggregation the stores
    /// cannot compute (each holds some of a group's series, or copies of them) over its
    /// leaf evaluated there; else in process from samples.
    async fn raw_part(&self, req: &StepsRequest) -> Result<Option<Steps>, StoreError> {
        if let Some(answered) = self.raw.steps(req).await? {
            return Ok(Some(answered));
        }
        if req.aggregate.is_some() {
            let leaf = StepsRequest { aggregate: None, ..req.clone() };
            if let Some(answer) = self.raw.steps(&leaf).await? {
                return strata_promql::pushdown::aggregate_here(req, answer).await.map(Some);
            }
        }
        match &self.raw_evaluator {
            Some(e) => e.steps(req).await,
            None => Ok(None),
        }
    }

    pub fn with_preference(mut self, prefer: Prefer) -> Self {
        self.prefer = prefer;
        self
    }

    /// The segments of the grid aggregates answer, coarsest first where several could,
    /// in step order; empty when none can.
    pub(crate) fn plan(&self, req: &StepsRequest, cap: Option<i64>, before_data: bool) -> Vec<Segment> {
        let Some(leaf) = leaf_of(req) else { return Vec::new() };
        // Aggregates hold series without their replica labels: a selection by one cannot
        // be answered from them.
        if req.matchers.iter().any(|m| self.replica_labels.contains(&m.name)) {
            return Vec::new();
        }
        let grid = Grid { start: req.start, end: req.end, step: req.step, offset: req.offset };
        let Some(n) = grid.steps() else { return Vec::new() };
        let sel = req.selection();
        let targets = self.fanout.targets();
        let mut taken = vec![false; n];
        let mut out: Vec<Segment> = Vec::new();
        for width in [ONE_HOUR, FIVE_MINUTES] {
            if cap.is_some_and(|c| c < width) || check(&leaf, &grid, width, Kept::ALL).is_err() {
                continue;
            }
            let Some((relevant, lo, hi)) = holder_of(width, &sel, &targets) else { continue };
            // Before the oldest data any store holds, raw or aggregated, every window is
            // empty everywhere: the aggregates answer the steps that reach back there as
            // raw data would (the first hour of an archive, a `[1h]` range at its start).
            let lo = match oldest_held(&targets) {
                Some(oldest) if before_data && lo <= oldest => i64::MIN,
                _ => lo,
            };
            if lo > hi {
                continue;
            }
            // Raw data is there from the newest of the holders' oldest samples (a holder
            // keeps the raw data of everything it aggregates). A holder asked for no raw
            // time range (`(MIN, MIN)`: an archive with aggregates only, or whose raw data
            // the live stores hold too) has none to prefer.
            let raw_from = match self.prefer {
                Prefer::Coarsest => i64::MAX,
                Prefer::RawWhereHeld => relevant
                    .iter()
                    .filter(|t| t.min_time <= t.max_time && t.max_time > i64::MIN)
                    .map(|t| t.min_time)
                    .max()
                    .unwrap_or(i64::MAX),
            };
            // Step i reads the windows ending in (from_i, E_i]: all must be covered.
            let reach = leaf.reach();
            let e = |i: usize| req.start + i as i64 * req.step - req.offset;
            let fits: Vec<bool> = (0..n)
                .map(|i| {
                    let from = (e(i) - reach).div_euclid(width) * width;
                    !taken[i] && from >= lo.saturating_sub(1) && e(i) <= hi && from < raw_from
                })
                .collect();
            let mut i = 0;
            while i < n {
                if !fits[i] {
                    i += 1;
                    continue;
                }
                let first = i;
                while i < n && fits[i] {
                    taken[i] = true;
                    i += 1;
                }
                out.push(Segment { width, first, last: i - 1, holders: relevant.clone() });
            }
        }
        out.sort_by_key(|s| s.first);
        out
    }

    /// The leaf goes to raw data after all: if aggregates were to answer steps older than
    /// the raw data their holders keep, those steps may come back empty, and the answer
    /// says so.
    fn warn_if_past_raw(&self, req: &StepsRequest, segments: &[Segment], scope: &QueryScope) {
        let oldest_raw = segments.iter().flat_map(|s| &s.holders).map(|t| t.min_time).max();
        let Some(oldest_raw) = oldest_raw else { return };
        let first = segments.iter().map(|s| s.first).min().unwrap_or(0);
        let t = req.start + first as i64 * req.step;
        if t.saturating_sub(req.offset) < oldest_raw {
            scope.warn(format!(
                "{}: the aggregates could not answer, and raw data before {oldest_raw} ms is no longer kept: steps from {t} ms on may be missing",
                leaf_text(req)
            ));
        }
    }

    /// A segment's steps from its holders' aggregates, merged by labels; `None` when one
    /// of them could not answer.
    async fn ask_holders(&self, req: &StepsRequest, plan: &Segment) -> Option<Steps> {
        let mut sub = req.clone();
        sub.start = req.start + plan.first as i64 * req.step;
        sub.end = req.start + plan.last as i64 * req.step;
        sub.resolution = plan.width;
        let sub = Arc::new(sub);
        let timeout = self.timeout;
        let calls = plan.holders.iter().map(|t| {
            let (store, sub, name) = (t.store.clone(), sub.clone(), t.name.clone());
            async move { (name, tokio::time::timeout(timeout, store.steps(&sub)).await) }
        });
        let mut out = Steps::default();
        for (name, answer) in futures_join(calls).await? {
            match answer {
                Ok(Ok(Some(s))) => merge_into(&mut out, s),
                Ok(Ok(None)) => return None,
                Ok(Err(e)) => {
                    tracing::debug!(store = %name, error = %e, "aggregates not used for a leaf");
                    return None;
                }
                Err(_) => return None,
            }
        }
        out.series.sort_by(|a, b| a.labels.cmp(&b.labels));
        out.series.dedup_by(|a, b| a.labels == b.labels);
        out.groups.sort_by(|a, b| a.labels.cmp(&b.labels));
        // One holder per segment (the plan's rule): its groups are whole, each once.
        if out.groups.windows(2).any(|w| w[0].labels == w[1].labels) {
            return None;
        }
        Some(out)
    }
}

/// The store holding the aggregates of `width` for the series `sel` selects, and the
/// span they cover (their first window's start, their last's end; `lo > hi`: none), when it covers every
/// store that may hold those series: it holds their aggregates itself, or they forward to
/// it (their label sets are among its senders'). One holder only: two (HA regionals) could
/// each hold part of a series' windows, which the stitching does not merge.
pub(crate) fn holder_of(
    width: i64,
    sel: &SelectRequest,
    targets: &[StoreTarget],
) -> Option<(Vec<StoreTarget>, i64, i64)> {
    let holds = |t: &StoreTarget| t.resolutions.iter().find(|r| r.0 == width).copied();
    let holders: Vec<&StoreTarget> = targets.iter().filter(|t| holds(t).is_some()).collect();
    let covered = |t: &StoreTarget| {
        holds(t).is_some()
            || (!t.label_sets.is_empty()
                && t.label_sets.iter().all(|l| holders.iter().any(|h| h.label_sets.contains(l))))
    };
    if !targets.iter().filter(|t| t.may_match(&sel.matchers, sel.start, sel.end)).all(covered) {
        return None;
    }
    // A holder is weighed by the times its aggregates cover, not its raw data's: a range
    // older than the raw data it keeps is what its aggregates are for.
    let relevant: Vec<StoreTarget> = holders
        .iter()
        .filter(|t| {
            let Some((_, lo, hi)) = holds(t) else { return false };
            StoreTarget { min_time: lo, max_time: hi, ..StoreTarget::clone(t) }.may_match(
                &sel.matchers,
                sel.start,
                sel.end,
            )
        })
        .map(|t| (*t).clone())
        .collect();
    let (lo, hi) =
        relevant.iter().filter_map(holds).fold((i64::MIN, i64::MAX), |(lo, hi), r| (lo.max(r.1), hi.min(r.2)));
    (relevant.len() == 1).then_some((relevant, lo, hi))
}

/// Runs the futures at once and gathers their outputs in order; `None` if one failed to
/// finish (a holder's part missing must not pass for a whole answer).
async fn futures_join<F>(fs: impl Iterator<Item = F>) -> Option<Vec<F::Output>>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(|f| tokio::spawn(QueryScope::current().run(f))).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.ok()?);
    }
    Some(out)
}

fn merge_into(out: &mut Steps, s: Steps) {
    out.series.extend(s.series);
    out.groups.extend(s.groups);
    out.samples += s.samples;
    out.warnings.extend(s.warnings);
    for i in s.infos {
        if !out.infos.contains(&i) {
            out.infos.push(i);
        }
    }
}

/// The leaf a request evaluates, when aggregates could answer it.
fn leaf_of(req: &StepsRequest) -> Option<Leaf> {
    Some(match &req.function {
        None => Leaf::Selector { lookback: req.lookback },
        Some((name, range)) => Leaf::Range { function: RangeFn::parse(name, None)?, range: *range },
    })
}

/// The leaf as PromQL, for `stats`.
fn leaf_text(req: &StepsRequest) -> String {
    let op = |o: &strata_model::MatchOp| match o {
        strata_model::MatchOp::Equal => "=",
        strata_model::MatchOp::NotEqual => "!=",
        strata_model::MatchOp::Regex => "=~",
        strata_model::MatchOp::NotRegex => "!~",
    };
    let ms: Vec<String> = req.matchers.iter().map(|m| format!("{}{}{:?}", m.name, op(&m.op), m.value)).collect();
    let sel = format!("{{{}}}", ms.join(", "));
    match &req.function {
        Some((f, r)) => format!("{f}({sel}[{}])", strata_model::duration::format_duration_ms(*r)),
        None => sel,
    }
}

/// One part's series placed at their steps in the whole grid.
struct Stitched {
    metric_type: MetricType,
    name_dropped: bool,
    values: Vec<Option<f64>>,
    samples: u64,
}

#[async_trait]
impl Store for ResolutionPlanner {
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        self.raw.select_within(req, budget).await
    }

    async fn select_batches(&self, req: &SelectRequest) -> Result<strata_store::BoxBatches, StoreError> {
        self.raw.select_batches(req).await
    }

    async fn series_within(
        &self,
        matchers: &[Matcher],
        start: i64,
        end: i64,
        budget: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        self.raw.series_within(matchers, start, end, budget).await
    }

    async fn label_names(&self, matchers: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        self.raw.label_names(matchers, start, end).await
    }

    async fn label_values(
        &self,
        name: &str,
        matchers: &[Matcher],
        start: i64,
        end: i64,
    ) -> Result<Vec<String>, StoreError> {
        self.raw.label_values(name, matchers, start, end).await
    }

    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        self.raw.metadata(metric).await
    }

    async fn steps(&self, req: &StepsRequest) -> Result<Option<Steps>, StoreError> {
        let scope = QueryScope::current();
        // `dedup=false` shows each replica: aggregates hold the merged series only.
        if req.resolution != 0 || !req.values || scope.max_source_resolution == Some(0) || !scope.dedup {
            return self.raw.steps(req).await;
        }
        let cap = scope.max_source_resolution;
        // Steps reaching back before any store's data planned from aggregates first; a
        // holder that does not answer those (a regional) refuses, and the plan without
        // them is asked instead.
        let (extended, plain) = (self.plan(req, cap, true), self.plan(req, cap, false));
        let spans = |s: &[Segment]| s.iter().map(|g| (g.width, g.first, g.last)).collect::<Vec<_>>();
        if spans(&extended) != spans(&plain) {
            if let Some(answer) = self.answer_planned(req, extended, true, &scope).await? {
                return Ok(answer);
            }
        }
        if plain.is_empty() {
            // Steps raw data no longer reaches: from the closest aggregates, said so.
            if let Some(answer) = self.approximate(req, cap, &scope).await? {
                return Ok(answer);
            }
            return self.raw.steps(req).await;
        }
        Ok(self.answer_planned(req, plain, false, &scope).await?.flatten())
    }
}

impl ResolutionPlanner {
    /// The leaf's steps from `segments` of aggregates and raw data between them; `None`
    /// when a holder refuses and `retry` (another plan is tried), `Some(None)` when the
    /// engine is to select raw samples itself.
    async fn answer_planned(
        &self,
        req: &StepsRequest,
        segments: Vec<Segment>,
        retry: bool,
        scope: &QueryScope,
    ) -> Result<Option<Option<Steps>>, StoreError> {
        let Some(n) = req.steps() else { return self.raw.steps(req).await.map(Some) };
        // An aggregation over the leaf: each part's groups (a holder has every series of
        // each, the plan made sure), or, if a part cannot give them, none here and the
        // engine asks for the leaf next, which is planned the same way.
        let grouped = req.aggregate.is_some();
        // (first step, steps, answer, resolution): raw data between the segments first
        // (the newest hours, usually: little work, and the part most likely to be unable
        // to group), then the segments.
        let mut parts = Vec::new();
        let mut raw_spans = Vec::new();
        let mut next = 0;
        for seg in &segments {
            if seg.first > next {
                raw_spans.push((next, seg.first));
            }
            next = seg.last + 1;
        }
        if next < n {
            raw_spans.push((next, n));
        }
        for (a, b) in raw_spans {
            let mut sub = req.clone();
            sub.start = req.start + a as i64 * req.step;
            sub.end = req.start + (b - 1) as i64 * req.step;
            match self.raw_part(&sub).await? {
                Some(s) if !grouped || !s.groups.is_empty() || s.series.is_empty() => parts.push((a, b - a, s, 0)),
                // The raw part does not group: when its leaf has no value there (steps
                // before any data), it adds no group and the holders' groups stand.
                _ if grouped => {
                    let leaf = StepsRequest { aggregate: None, ..sub };
                    match self.raw_part(&leaf).await? {
                        Some(s) if s.series.iter().all(|x| x.values.is_empty()) => {
                            parts.push((a, b - a, Steps { series: Vec::new(), ..s }, 0))
                        }
                        _ => return Ok(Some(None)),
                    }
                }
                // No store evaluates the raw part: the engine selects samples for the leaf.
                _ => {
                    self.warn_if_past_raw(req, &segments, scope);
                    return Ok(Some(None));
                }
            }
        }
        for seg in &segments {
            let started = std::time::Instant::now();
            let Some(agg) = self.ask_holders(req, seg).await else {
                if retry {
                    return Ok(None);
                }
                if grouped {
                    return Ok(Some(None));
                }
                self.warn_if_past_raw(req, &segments, scope);
                return self.raw.steps(req).await.map(Some);
            };
            tracing::debug!(ms = started.elapsed().as_secs_f64() * 1e3, "holders answered");
            parts.push((seg.first, seg.last + 1 - seg.first, agg, seg.width));
        }
        Ok(Some(Some(stitch(req, n, parts, scope))))
    }
}

/// Parts of a leaf's grid, each `(first step, steps, answer, resolution)`, as one answer
/// over the whole grid, series (or groups) merged by labels; each part's resolution noted
/// in `scope` for `stats`.
pub(crate) fn stitch(
    req: &StepsRequest,
    n: usize,
    mut parts: Vec<(usize, usize, Steps, i64)>,
    scope: &QueryScope,
) -> Steps {
    let grouped = req.aggregate.is_some();
    let leaf = leaf_text(req);
    // One part for the whole grid (the usual case over older data): its answer as it is.
    if let [(0, len, _, width)] = parts.as_slice() {
        if *len == n {
            let (width, end) = (*width, req.start + (n as i64 - 1) * req.step);
            scope.used_resolution(ResolutionUsed { leaf: leaf.clone(), resolution: width, start: req.start, end });
            if let Some((_, _, mut whole, _)) = parts.pop() {
                for list in [&mut whole.series, &mut whole.groups] {
                    if !list.is_sorted_by(|a, b| a.labels < b.labels) {
                        list.sort_by(|a, b| a.labels.cmp(&b.labels));
                    }
                }
                return whole;
            }
        }
    }
    let mut by: BTreeMap<Labels, Stitched> = BTreeMap::new();
    let mut out = Steps::default();
    for (offset, len, part, width) in parts {
        let first = req.start + offset as i64 * req.step;
        let end = first + (len as i64 - 1) * req.step;
        scope.used_resolution(ResolutionUsed { leaf: leaf.clone(), resolution: width, start: first, end });
        out.samples += part.samples;
        out.warnings.extend(part.warnings);
        for i in part.infos {
            if !out.infos.contains(&i) {
                out.infos.push(i);
            }
        }
        for s in if grouped { part.groups } else { part.series } {
            let e = by.entry(s.labels).or_insert_with(|| Stitched {
                metric_type: s.metric_type,
                name_dropped: s.name_dropped,
                values: vec![None; n],
                samples: 0,
            });
            e.samples += s.summary.samples;
            for (i, v) in s.values.iter().enumerate() {
                if let Some(slot) = e.values.get_mut(offset + i) {
                    if v.is_some() {
                        *slot = v;
                    }
                }
            }
        }
    }
    let stitched: Vec<StepsSeries> = by
        .into_iter()
        .map(|(labels, s)| StepsSeries {
            labels,
            metric_type: s.metric_type,
            summary: SeriesSummary { samples: s.samples, ..SeriesSummary::default() },
            values: StepValues::from_options(&s.values),
            name_dropped: s.name_dropped,
        })
        .collect();
    if grouped {
        out.groups = stitched;
    } else {
        out.series = stitched;
    }
    out
}

/// The oldest sample time any of `targets` holds, raw or aggregated; `None` when one of
/// them does not say (its range unknown), so nothing can be claimed empty.
fn oldest_held(targets: &[StoreTarget]) -> Option<i64> {
    let mut oldest = i64::MAX;
    for t in targets {
        let no_raw = t.min_time == i64::MIN && t.max_time == i64::MIN;
        if !no_raw {
            if t.min_time > t.max_time {
                return None;
            }
            oldest = oldest.min(t.min_time);
        }
        oldest = t.resolutions.iter().map(|r| r.1).fold(oldest, i64::min);
    }
    Some(oldest)
}
