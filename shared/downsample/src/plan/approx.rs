//! The answer for steps that raw data no longer reaches, when no resolution is exact for
//! the leaf (a range such as Grafana's `$__rate_interval` of 5m15s, steps off the window
//! ends). Thanos' auto-downsampling answers those steps empty (thanos-io/thanos#4634);
//! answering them from aggregates as if exact would be a silent approximation. Here they
//! come from the finest aggregates that cover them, the leaf made exact for them: its range
//! (or lookback) the nearest whole number of windows, each step read at the window end at
//! or before it. An info annotation names the resolution and why. The other steps stay raw.
//! Where nothing can stand in (a function the aggregates cannot give, a store not covered),
//! a warning says which steps lack data.

use super::{holder_of, leaf_of, leaf_text, stitch, ResolutionPlanner, Segment};
use crate::downsampler::SLICINGS;
use crate::leaf::{check, Grid, Leaf};
use crate::range::RangeFn;
use crate::{Kept, FIVE_MINUTES, ONE_HOUR};
use strata_fanout::StoreTarget;
use strata_model::duration::format_duration_ms;
use strata_store::{QueryScope, SelectRequest, StepValues, Steps, StepsRequest, StoreError};

/// The most steps of the aligned leaf asked for (one window apart over the approximated
/// steps: 50,000 is 173 days of 5 m windows).
const MAX_ALIGNED_STEPS: usize = 50_000;

impl ResolutionPlanner {
    /// `None`: raw data reaches every step of `req` (or nothing older is known lost), so
    /// the raw answer stands (with a warning when it lacks steps nothing could stand in
    /// for). `Some(None)`: the engine is to select raw samples itself (an aggregation over
    /// the leaf a part cannot group: its leaf is asked next, and approximated then).
    pub(crate) async fn approximate(
        &self,
        req: &StepsRequest,
        cap: Option<i64>,
        scope: &QueryScope,
    ) -> Result<Option<Option<Steps>>, StoreError> {
        let Some(n) = req.steps() else { return Ok(None) };
        let targets = self.fanout.targets();
        let sel = req.selection();
        let Some(raw_from) = oldest_raw(&targets, &sel) else { return Ok(None) };
        // Raw data was lost only where aggregates reach back a whole slice before it (the
        // first slice starts before the first sample: a young installation lost nothing).
        let lost = targets.iter().filter(|t| t.may_match(&sel.matchers, i64::MIN, i64::MAX)).any(|t| {
            t.resolutions.iter().any(|r| {
                let slice = SLICINGS.iter().find(|s| s.width == r.0).map_or(r.0, |s| s.slice);
                r.1 <= r.2 && r.1.saturating_add(slice) <= raw_from
            })
        });
        if !lost {
            return Ok(None);
        }
        let reach = match &req.function {
            Some((_, range)) => *range,
            None => req.lookback,
        };
        let e = |i: usize| step_time(req.start, i, req.step).saturating_sub(req.offset);
        // Steps reading from before the raw data kept: a prefix of the grid.
        let short = (0..n).take_while(|&i| e(i).saturating_sub(reach) < raw_from.saturating_sub(1)).count();
        if short == 0 {
            return Ok(None);
        }
        let gone = match raw_from {
            i64::MAX => "no store keeps raw data of these series".to_string(),
            t => format!("raw data before {t} ms is no longer kept"),
        };
        let grouped = req.aggregate.is_some();
        let why_not = match leaf_of(req) {
            _ if req.matchers.iter().any(|m| self.replica_labels.contains(&m.name)) => {
                "a selection by a replica label, which the aggregates drop, cannot be answered from them".to_string()
            }
            None => "the aggregates cannot give this function".to_string(),
            // A sample's time read from wider windows could lie outside the range asked for.
            Some(Leaf::Range {
                function:
                    RangeFn::TsOfFirstOverTime
                    | RangeFn::TsOfLastOverTime
                    | RangeFn::TsOfMinOverTime
                    | RangeFn::TsOfMaxOverTime,
                ..
            }) => "a sample's time cannot be approximated from wider windows".to_string(),
            Some(leaf) => {
                let grid = Grid { start: req.start, end: req.end, step: req.step, offset: req.offset };
                // The finest resolution for the newest of these steps, coarser ones for what
                // it does not reach back to (5 m windows are kept for less time than 1 h).
                let (mut parts, mut end, mut why_not) = (Vec::new(), short, String::new());
                // Said once the answer is sure to be made from them.
                let mut infos = Vec::new();
                for width in [FIVE_MINUTES, ONE_HOUR] {
                    if end == 0 || cap.is_some_and(|c| c < width) {
                        continue;
                    }
                    let Some((holders, lo, hi)) = holder_of(width, &sel, &targets) else {
                        why_not =
                            format!("no single store holds {} aggregates of every series", format_duration_ms(width));
                        continue;
                    };
                    if lo > hi {
                        why_not = format!("the {} aggregates hold nothing", format_duration_ms(width));
                        continue;
                    }
                    let aligned = match Aligned::new(req, &leaf, width, end, (lo, hi)) {
                        Ok(a) => a,
                        Err(why) => {
                            why_not = format!("the {} aggregates {why}", format_duration_ms(width));
                            continue;
                        }
                    };
                    let exact = check(&leaf, &grid, width, Kept::ALL).err().map(|e| e.to_string());
                    let mut sub = req.clone();
                    (sub.start, sub.end, sub.step) = (aligned.grid.start, aligned.grid.end, aligned.grid.step);
                    match aligned.leaf {
                        Leaf::Range { range, .. } => sub.function = req.function.clone().map(|(f, _)| (f, range)),
                        Leaf::Selector { lookback } => sub.lookback = lookback,
                    }
                    let segment = Segment { width, first: 0, last: aligned.steps - 1, holders };
                    let Some(mut part) = self.ask_holders(&sub, &segment).await else {
                        why_not =
                            format!("the store holding the {} aggregates did not answer", format_duration_ms(width));
                        continue;
                    };
                    if grouped && part.groups.is_empty() && !part.series.is_empty() {
                        return Ok(Some(None));
                    }
                    for s in part.series.iter_mut().chain(part.groups.iter_mut()) {
                        let values = s.values.to_options();
                        let at = |i: usize| aligned.index(i).and_then(|j| values.get(j).copied().flatten());
                        s.values = StepValues::from_options(&(aligned.first..end).map(at).collect::<Vec<_>>());
                    }
                    let (from, to) =
                        (req.start + aligned.first as i64 * req.step, req.start + (end as i64 - 1) * req.step);
                    infos.push(format!(
                        "PromQL info: {} answered approximately from {} aggregates for the steps from {from} to {to} ms: {gone}, and no resolution is exact ({}); the range read is {}, each step at the window end at or before it",
                        leaf_text(req),
                        format_duration_ms(width),
                        exact.unwrap_or_else(|| "the aggregates do not cover every step".into()),
                        format_duration_ms(aligned.leaf.reach()),
                    ));
                    parts.push((aligned.first, end - aligned.first, part, width));
                    end = aligned.first;
                }
                if !parts.is_empty() {
                    if short < n {
                        let mut rest = req.clone();
                        rest.start = req.start + short as i64 * req.step;
                        match self.raw_part(&rest).await? {
                            Some(s) if !grouped || !s.groups.is_empty() || s.series.is_empty() => {
                                parts.push((short, n - short, s, 0))
                            }
                            // The newer steps cannot be grouped or evaluated by a store: the
                            // engine selects them itself (its leaf is asked next).
                            _ if grouped => return Ok(Some(None)),
                            _ => {
                                scope.warn(format!(
                                    "{}: no store evaluates the steps after {raw_from} ms beside the aggregates' approximation: raw data only, which lacks the steps before",
                                    leaf_text(req)
                                ));
                                return Ok(None);
                            }
                        }
                    }
                    for i in infos {
                        scope.info(i);
                    }
                    if end > 0 {
                        let last = step_time(req.start, end - 1, req.step);
                        scope.warn(format!(
                            "{}: {gone} and no aggregates reach back that far: the steps up to {last} ms lack data",
                            leaf_text(req)
                        ));
                    }
                    return Ok(Some(Some(stitch(req, n, parts, scope))));
                }
                if why_not.is_empty() {
                    "raw data only was asked for (max_source_resolution)".into()
                } else {
                    why_not
                }
            }
        };
        let last = req.start + (short as i64 - 1) * req.step;
        scope.warn(format!("{}: {gone} and {why_not}: the steps up to {last} ms may lack data", leaf_text(req)));
        Ok(None)
    }
}

/// The leaf made exact at `width` for steps `first..short` of a request's grid.
struct Aligned {
    leaf: Leaf,
    grid: Grid,
    /// Steps of `grid`.
    steps: usize,
    /// The first step of the request answered (before it, no window is held).
    first: usize,
    /// The request's grid: its start less offset, step.
    at: (i64, i64),
    width: i64,
}

impl Aligned {
    /// `Err`: why the aggregates of `width` cannot stand in for those steps.
    fn new(
        req: &StepsRequest,
        leaf: &Leaf,
        width: i64,
        short: usize,
        (lo, hi): (i64, i64),
    ) -> Result<Aligned, &'static str> {
        const NOT_YET: &str = "do not cover those steps yet";
        const BAD: &str = "cannot place steps that far apart or that far out";
        let round = |r: i64| (r.saturating_add(width / 2) / width).max(1).saturating_mul(width);
        let leaf = match *leaf {
            Leaf::Range { function, range } => Leaf::Range { function, range: round(range) },
            Leaf::Selector { lookback } => Leaf::Selector { lookback: round(lookback) },
        };
        let reach = leaf.reach();
        let first_t = req.start.checked_sub(req.offset).ok_or(BAD)?;
        // (Saturating: a query's times and ranges are bounded far inside i64, see the
        // engine's limits; at the bounds a step lands on no window rather than wrapping.)
        let end_of = |i: usize| step_time(first_t, i, req.step).div_euclid(width).saturating_mul(width);
        // Steps whose windows all lie where the aggregates are.
        let first = (0..short).find(|&i| end_of(i).saturating_sub(reach) >= lo.saturating_sub(1)).ok_or(NOT_YET)?;
        let last = (first..short).rev().find(|&i| end_of(i) <= hi).ok_or(NOT_YET)?;
        if last + 1 != short {
            // The newest of these steps past the aggregates: not this resolution.
            return Err(NOT_YET);
        }
        let step = if req.step % width == 0 { req.step } else { width };
        let (a, b) = (end_of(first), end_of(last));
        let steps = usize::try_from(b.saturating_sub(a) / step).ok().and_then(|n| n.checked_add(1)).ok_or(BAD)?;
        // Never many more steps than were asked for (two steps half a year apart, a step
        // off the windows, would be 50,000 of them).
        if steps > MAX_ALIGNED_STEPS || steps > (short - first).saturating_mul(2).saturating_add(2) {
            return Err(BAD);
        }
        let (start, end) = (a.checked_add(req.offset).ok_or(BAD)?, b.checked_add(req.offset).ok_or(BAD)?);
        let grid = Grid { start, end, step, offset: req.offset };
        Ok(Aligned { leaf, grid, steps, first, at: (first_t, req.step), width })
    }

    /// The aligned step that request step `i` reads.
    fn index(&self, i: usize) -> Option<usize> {
        let t = step_time(self.at.0, i, self.at.1).div_euclid(self.width).saturating_mul(self.width);
        let from = self.grid.start.checked_sub(self.grid.offset)?;
        usize::try_from(t.checked_sub(from)? / self.grid.step).ok()
    }
}

/// Step `i`'s time of a grid from `t0`, `step` apart (saturating).
fn step_time(t0: i64, i: usize, step: i64) -> i64 {
    t0.saturating_add(i64::try_from(i).unwrap_or(i64::MAX).saturating_mul(step))
}

/// The oldest raw sample kept by any store that may hold the selection's series (by
/// their labels, whatever their times): `i64::MAX` when none keeps raw data (aggregates
/// alone, a cluster long gone); stores holding nothing yet do not count. `None` when one
/// of them does not say when its data starts (its range unknown): raw data may reach back
/// anywhere.
fn oldest_raw(targets: &[StoreTarget], sel: &SelectRequest) -> Option<i64> {
    let mut oldest = i64::MAX;
    for t in targets.iter().filter(|t| t.may_match(&sel.matchers, i64::MIN, i64::MAX)) {
        let no_raw = t.min_time == i64::MIN && t.max_time == i64::MIN;
        if no_raw || t.min_time > t.max_time {
            continue;
        }
        if t.min_time == i64::MIN {
            return None;
        }
        oldest = oldest.min(t.min_time);
    }
    Some(oldest)
}
