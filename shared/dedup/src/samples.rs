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
//! is skipped until it has. A replica has seen the output's latest reset once it shows,
//! after the output's last sample before the reset, a value below that sample's (a counter
//! that has not reset never reads lower later), or once its samples are well past the
//! reset. So `rate`, `increase`, `irate` and `resets` see neither false resets nor the jump
//! from a post-reset value back to a pre-reset one.
//!
//! The work is linear in the samples: markers are matched against the other replicas by
//! binary search, and what the counter rule asks of a replica's history is kept as the
//! merge moves on, so a flapping target or a hostile series cannot make it quadratic.

use strata_model::{is_stale, Sample};
use strata_store::steps::{sample_gap, Coverage, SeriesSummary};
use strata_store::whole_replica;

/// What a merge produced: one replica whole (its chunks can go on as stored), or samples.
#[derive(Debug, PartialEq)]
pub enum Merged {
    Replica(usize),
    Samples(Vec<Sample>),
}

/// Merges the replicas of one series: the replica [`whole_replica`] names, as it is, or
/// the samples merged. `counter`: apply the counter rule.
pub fn merge(replicas: &[Vec<Sample>], counter: bool) -> Merged {
    let summaries: Vec<SeriesSummary> = replicas.iter().map(|r| SeriesSummary::of_samples(r)).collect();
    match whole_replica(&summaries.iter().collect::<Vec<_>>()) {
        Some(k) => Merged::Replica(k),
        None => Merged::Samples(merge_replicas(replicas, counter)),
    }
}

/// Whether one replica's samples cover `[first, last]` with no gap over 1.5 of its own
/// scrape interval and no staleness marker.
pub fn covers(r: &[Sample], first: i64, last: i64) -> bool {
    Coverage::of_samples(r).is_some_and(|c| c.covers(first, last, c.own_gap()))
}

/// The output's latest drop (a counter reset it shows).
#[derive(Debug, Clone, Copy)]
struct Reset {
    /// The output's last sample before the drop.
    before: Sample,
    /// When the output dropped.
    at: i64,
}

/// Per replica, what the counter rule has found of its history since the output's latest
/// reset: the first sample that shows the reset, searched up to `scanned`.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    reset_at: Option<i64>,
    scanned: usize,
    first: Option<usize>,
}

/// The state of one merge: the replicas, their positions, and the counter rule's memory.
struct Merge<'a> {
    reps: Vec<&'a [Sample]>,
    gap: i64,
    counter: bool,
    /// Per replica and sample, the index of its last sample before that is not a marker.
    prev_real: Vec<Vec<usize>>,
    reset: Option<Reset>,
    seen: Vec<Seen>,
}

/// Merges the replicas of one series sample by sample. `counter`: apply the counter rule.
pub fn merge_replicas(replicas: &[Vec<Sample>], counter: bool) -> Vec<Sample> {
    let reps: Vec<&[Sample]> = replicas.iter().map(Vec::as_slice).filter(|r| !r.is_empty()).collect();
    match reps.len() {
        0 => return Vec::new(),
        1 => return reps[0].to_vec(),
        _ => {}
    }
    let gap = sample_gap(&reps);
    let prev_real = if counter { reps.iter().map(|r| prev_real_of(r)).collect() } else { Vec::new() };
    let mut m = Merge { seen: vec![Seen::default(); reps.len()], reps, gap, counter, prev_real, reset: None };
    m.run()
}

/// For each sample, the index of the replica's last earlier sample that is not a marker
/// (`usize::MAX`: none).
fn prev_real_of(r: &[Sample]) -> Vec<usize> {
    let mut out = Vec::with_capacity(r.len());
    let mut last = usize::MAX;
    for (i, s) in r.iter().enumerate() {
        out.push(last);
        if !is_stale(s.v) {
            last = i;
        }
    }
    out
}

/// Whether `rep` holds a staleness marker within `gap` of `t`.
fn stale_near(rep: &[Sample], t: i64, gap: i64) -> bool {
    let from = rep.partition_point(|x| x.t < t.saturating_sub(gap));
    rep[from..].iter().take_while(|x| x.t <= t.saturating_add(gap)).any(|x| is_stale(x.v))
}

impl Merge<'_> {
    fn run(&mut self) -> Vec<Sample> {
        let reps = self.reps.clone();
        let gap = self.gap;
        // Start on the replica with the earliest sample; on a tie, the fullest.
        let mut cur = (0..reps.len()).min_by_key(|&r| (reps[r][0].t, usize::MAX - reps[r].len())).unwrap_or(0);
        let mut pos = vec![0usize; reps.len()];
        let mut out: Vec<Sample> = Vec::with_capacity(reps.iter().map(|r| r.len()).max().unwrap_or(0));
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
                is_stale(n.v) && (0..reps.len()).filter(|&r| r != cur).all(|r| stale_near(reps[r], n.t, gap))
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
                    let found = self.best_other(&pos, cur, bound, last);
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
                    self.reset = Some(Reset { before: l, at: s.t });
                }
            }
            cur = r;
            out.push(s);
        }
        out
    }

    /// The earliest acceptable sample of a replica other than `cur`, no later than `bound`.
    fn best_other(&mut self, pos: &[usize], cur: usize, bound: i64, last: Option<Sample>) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize)> = None;
        for r in (0..self.reps.len()).filter(|&r| r != cur) {
            let mut i = pos[r];
            while i < self.reps[r].len() && self.reps[r][i].t <= bound {
                if best.is_some_and(|(br, bi)| self.reps[br][bi].t <= self.reps[r][i].t) {
                    break;
                }
                if self.acceptable(r, i, last) {
                    best = Some((r, i));
                    break;
                }
                i += 1;
            }
        }
        best
    }

    /// Whether sample `i` of replica `r` may follow `last` in the output.
    fn acceptable(&mut self, r: usize, i: usize, last: Option<Sample>) -> bool {
        let s = self.reps[r][i];
        if is_stale(s.v) {
            return false;
        }
        let (true, Some(l)) = (self.counter, last) else { return true };
        if is_stale(l.v) {
            return true;
        }
        // This replica's own previous sample: its own view of the counter.
        let prev = self.prev_real[r][i];
        let prev = (prev != usize::MAX).then(|| self.reps[r][prev]);
        match prev {
            Some(p) if s.v < p.v => {
                // The replica reset between p and s: a reset the output has not shown since p
                // is a real one; one it has already shown makes s the same reset seen late.
                if self.reset.is_some_and(|x| x.at > p.t) {
                    s.v >= l.v
                } else {
                    true
                }
            }
            // No reset in this replica: a value below the output's is a lagging view, and
            // a replica that has not seen the output's latest reset is a pre-reset view.
            Some(p) => s.v >= l.v && self.has_seen_reset(r, i, p),
            // No history: a dip below the output is only a reset if the replica stays below.
            None => s.v >= l.v || self.reps[r].get(i + 1).is_some_and(|n| !is_stale(n.v) && n.v < l.v),
        }
    }

    /// Whether replica `r`, before sample `i` (its previous real sample `p`), has shown the
    /// output's latest reset: a value below the output's last pre-reset value after it, or
    /// samples well past the reset.
    fn has_seen_reset(&mut self, r: usize, i: usize, p: Sample) -> bool {
        let Some(reset) = self.reset else { return true };
        if p.t >= reset.at.saturating_add(self.gap) {
            return true;
        }
        let rep = self.reps[r];
        let seen = &mut self.seen[r];
        if seen.reset_at != Some(reset.at) {
            *seen =
                Seen { reset_at: Some(reset.at), scanned: rep.partition_point(|x| x.t <= reset.before.t), first: None };
        }
        while seen.first.is_none() && seen.scanned < i {
            let x = rep[seen.scanned];
            if !is_stale(x.v) && x.v < reset.before.v {
                seen.first = Some(seen.scanned);
            }
            seen.scanned += 1;
        }
        seen.first.is_some_and(|j| j < i)
    }
}
