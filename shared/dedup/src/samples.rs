//! The sample-level merge of one series' replicas.
//!
//! The output follows one replica and switches only where it has a gap (no sample within
//! 1.5 scrape intervals, or a staleness marker the other replicas do not show), taking the
//! first acceptable sample another replica has in the gap, and then stays on that replica:
//! fewer switches, fewer chances to mix two views of one counter. Values are never
//! averaged or interpolated; every output sample is a sample some replica stored.
//!
//! Counters get one more rule, because replicas scrape at different instants and see a
//! reset at different times (thanos-io/thanos 1326, 2401, 7623): **a drop in the output is
//! only ever a drop the replica it came from shows in its own series, and each reset is
//! emitted once.** At a switch, a sample lower than the last one emitted is skipped unless
//! its replica itself reset just before it (and the output has not already shown that
//! reset); a sample from a replica that has not yet seen a reset the output already shows
//! is skipped until it has. So `rate`, `increase`, `irate` and `resets` see neither false
//! resets nor the jump from a post-reset value back to a pre-reset one.

use strata_model::{is_stale, Sample};
use strata_store::steps::{sample_gap, Coverage};

/// What a merge produced: one replica whole (its chunks can go on as stored), or samples.
#[derive(Debug, PartialEq)]
pub enum Merged {
    Replica(usize),
    Samples(Vec<Sample>),
}

/// Merges the replicas of one series. A replica that covers the others' whole span with no
/// gap (and no staleness marker) is the answer as it is: the common case, found from
/// timestamps in one pass, and then nothing is merged. `counter`: apply the counter rule.
pub fn merge(replicas: &[Vec<Sample>], counter: bool) -> Merged {
    let present: Vec<usize> = (0..replicas.len()).filter(|&r| !replicas[r].is_empty()).collect();
    if present.len() == 1 {
        return Merged::Replica(present[0]);
    }
    let reps: Vec<&[Sample]> = present.iter().map(|&r| replicas[r].as_slice()).collect();
    if reps.is_empty() {
        return Merged::Samples(Vec::new());
    }
    let gap = gap_limit(&reps);
    let first = reps.iter().map(|r| r[0].t).min().unwrap_or(0);
    let last = reps.iter().map(|r| r[r.len() - 1].t).max().unwrap_or(0);
    let complete = |r: &[Sample]| {
        r[0].t <= first.saturating_add(gap)
            && r[r.len() - 1].t >= last.saturating_sub(gap)
            && r.windows(2).all(|w| w[1].t - w[0].t <= gap)
            && !r.iter().any(|s| is_stale(s.v))
    };
    let best = (0..reps.len()).filter(|&i| complete(reps[i])).max_by_key(|&i| reps[i].len());
    match best {
        Some(i) => Merged::Replica(present[i]),
        None => Merged::Samples(merge_replicas(replicas, counter)),
    }
}

/// Whether one replica's samples cover `[first, last]` (the span of all replicas, from
/// chunk headers) with no gap over 1.5 of its own scrape interval and no staleness marker:
/// then it is the answer as it is, and the other replicas need not be decoded.
pub fn covers(r: &[Sample], first: i64, last: i64) -> bool {
    Coverage::of_samples(r).is_some_and(|c| c.covers(first, last))
}

/// Merges the replicas of one series sample by sample. `counter`: apply the counter rule.
pub fn merge_replicas(replicas: &[Vec<Sample>], counter: bool) -> Vec<Sample> {
    let reps: Vec<&[Sample]> = replicas.iter().map(Vec::as_slice).filter(|r| !r.is_empty()).collect();
    match reps.len() {
        0 => return Vec::new(),
        1 => return reps[0].to_vec(),
        _ => {}
    }
    let gap = gap_limit(&reps);
    // Start on the replica with the earliest sample; on a tie, the fullest.
    let mut cur = (0..reps.len()).min_by_key(|&r| (reps[r][0].t, usize::MAX - reps[r].len())).unwrap_or(0);
    let mut pos = vec![0usize; reps.len()];
    let mut out: Vec<Sample> = Vec::with_capacity(reps.iter().map(|r| r.len()).max().unwrap_or(0));
    // Time of the latest drop the output shows (a reset), for the counter rule.
    let mut last_drop = i64::MIN;
    loop {
        let last = out.last().copied();
        if let Some(l) = last {
            for (r, p) in pos.iter_mut().enumerate() {
                while *p < reps[r].len() && reps[r][*p].t <= l.t {
                    *p += 1;
                }
            }
        }
        let next_cur = reps[cur].get(pos[cur]).copied();
        let in_step = |n: &Sample| last.is_none_or(|l| n.t.saturating_sub(l.t) <= gap);
        // A marker every replica shows (the target really went away) is kept; one only
        // this replica shows (it stopped) is a gap the others fill.
        let agreed_stale = |n: &Sample| {
            is_stale(n.v)
                && (0..reps.len())
                    .filter(|&r| r != cur)
                    .all(|r| reps[r].iter().any(|x| is_stale(x.v) && x.t.abs_diff(n.t) <= gap.unsigned_abs()))
        };
        let chosen = match next_cur {
            Some(n) if (!is_stale(n.v) || agreed_stale(&n)) && in_step(&n) => Some((cur, pos[cur])),
            _ => {
                // A gap, a staleness marker or the end: another replica's first acceptable
                // sample before the current replica's next one (or shortly after a marker).
                let bound = match next_cur {
                    Some(n) if is_stale(n.v) => n.t.saturating_add(gap),
                    Some(n) => n.t.saturating_sub(1),
                    None => i64::MAX,
                };
                let found = best_other(&reps, &pos, cur, bound, last, counter, last_drop);
                match (found, next_cur) {
                    (Some(f), _) => Some(f),
                    (None, Some(_)) => Some((cur, pos[cur])),
                    // The current replica is done and nothing else is acceptable as is: go on
                    // with the earliest sample left anywhere rather than lose the rest.
                    (None, None) => (0..reps.len())
                        .filter(|&r| pos[r] < reps[r].len())
                        .min_by_key(|&r| reps[r][pos[r]].t)
                        .map(|r| (r, pos[r])),
                }
            }
        };
        let Some((r, i)) = chosen else { break };
        let s = reps[r][i];
        if let Some(l) = last {
            if !is_stale(s.v) && !is_stale(l.v) && s.v < l.v {
                last_drop = s.t;
            }
        }
        cur = r;
        out.push(s);
    }
    out
}

/// 1.5 times the scrape interval: the smallest replica's median step between samples.
fn gap_limit(reps: &[&[Sample]]) -> i64 {
    sample_gap(reps)
}

/// The earliest acceptable sample of a replica other than `cur`, no later than `bound`.
fn best_other(
    reps: &[&[Sample]],
    pos: &[usize],
    cur: usize,
    bound: i64,
    last: Option<Sample>,
    counter: bool,
    last_drop: i64,
) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    for r in (0..reps.len()).filter(|&r| r != cur) {
        let mut i = pos[r];
        while i < reps[r].len() && reps[r][i].t <= bound {
            if best.is_some_and(|(br, bi)| reps[br][bi].t <= reps[r][i].t) {
                break;
            }
            if acceptable(reps[r], i, last, counter, last_drop) {
                best = Some((r, i));
                break;
            }
            i += 1;
        }
    }
    best
}

/// Whether sample `i` of replica `rep` may follow `last` in the output.
fn acceptable(rep: &[Sample], i: usize, last: Option<Sample>, counter: bool, last_drop: i64) -> bool {
    let s = rep[i];
    if is_stale(s.v) {
        return false;
    }
    let (true, Some(l)) = (counter, last) else { return true };
    if is_stale(l.v) {
        return true;
    }
    // This replica's own previous sample: its own view of the counter.
    let prev = rep[..i].iter().rev().find(|p| !is_stale(p.v)).copied();
    match prev {
        Some(p) if s.v < p.v => {
            // The replica reset between p and s: a reset the output has not shown since p
            // is a real one; one it has already shown makes s the same reset seen late.
            if last_drop > p.t {
                s.v >= l.v
            } else {
                true
            }
        }
        Some(p) => {
            // No reset in this replica: a value below the output's is a lagging view, and
            // if the output reset after p, this replica has not seen that reset yet.
            s.v >= l.v && last_drop <= p.t
        }
        // No history: a dip below the output is only a reset if the replica stays below.
        None => s.v >= l.v || rep.get(i + 1).is_some_and(|n| !is_stale(n.v) && n.v < l.v),
    }
}
