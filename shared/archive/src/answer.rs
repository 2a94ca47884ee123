//! `Steps` from the archive's aggregate blocks: a query's leaf answered from 5 m or 1 h
//! windows when the global's planner asks for a resolution, with the downsampling crate's
//! arithmetic ([`strata_downsample::answer`]), so the archive answers exactly as a
//! regional's aggregates do. A block that cannot be read fails the request rather than
//! leaving windows out: the planner then reads raw data, which says what it lacks.

use crate::aggregates::ReadWindows;
use crate::store::{ArchiveStore, OPEN_AT_ONCE};
use crate::ArchiveError;
use std::collections::{BTreeMap, BTreeSet};
use strata_downsample::answer::{prepare, AnswerError};
use strata_downsample::blocks::SeriesWindows;
use strata_downsample::Kept;
use strata_model::matcher::matches_all;
use strata_model::{Labels, MetricType};
use strata_store::{Steps, StepsRequest, StoreError};

fn store_error(e: AnswerError) -> StoreError {
    match e {
        AnswerError::TooMany(n) => StoreError::LimitExceeded { what: "step values", limit: n },
        // The caller asked for what the aggregates cannot give exactly: it reads raw data.
        e => StoreError::InvalidRequest(format!("from aggregates: {e}")),
    }
}

/// A series' windows gathered from block after block.
struct Gathered {
    metric_type: MetricType,
    kept: Kept,
    windows: Vec<strata_downsample::Window>,
}

impl Gathered {
    /// Adds a block's windows. Blocks overlap only for a moment after a compaction, and
    /// then a window is kept once; two blocks that disagree about a window (ranges cut on
    /// different grids, written from different data) are an error, and raw data answers.
    fn add(&mut self, more: ReadWindows) -> Result<(), String> {
        self.kept = self.kept.and(more.kept);
        let Some(first) = more.windows.first() else { return Ok(()) };
        if self.windows.last().is_none_or(|l| l.end < first.end) {
            self.windows.extend(more.windows);
            return Ok(());
        }
        self.windows.extend(more.windows);
        self.windows.sort_by_key(|w| w.end);
        let mut kept: Vec<strata_downsample::Window> = Vec::with_capacity(self.windows.len());
        for w in self.windows.drain(..) {
            match kept.last() {
                Some(l) if l.end == w.end && !l.same_bits(&w) => {
                    return Err(format!("two blocks hold different windows ending at {} ms", w.end))
                }
                Some(l) if l.end == w.end => {}
                _ => kept.push(w),
            }
        }
        self.windows = kept;
        Ok(())
    }
}

impl ArchiveStore {
    pub(crate) async fn steps_from_aggregates(&self, req: &StepsRequest) -> Result<Steps, StoreError> {
        let width = req.resolution;
        let p = prepare(req, width).map_err(store_error)?;
        let candidates = self.candidates(width, p.from, p.last).await?;
        // The blocks must cover every window the grid reads, without a break: a block
        // missing in the middle (a range archived before aggregates were, one being
        // written again) would leave its windows out in silence. Then raw data answers.
        let mut covered = p.from;
        for b in &candidates {
            let Ok(m) = &b.meta else { continue };
            if m.min_time > covered {
                break;
            }
            covered = covered.max(m.max_time);
        }
        if covered < p.last {
            return Err(StoreError::InvalidRequest(format!(
                "from aggregates: no {} ms aggregate block holds the windows ending after {covered} ms",
                width
            )));
        }
        let mut found: BTreeMap<Labels, Gathered> = BTreeMap::new();
        let mut read = 0u64;
        for some in candidates.chunks(OPEN_AT_ONCE) {
            for listed in some {
                let unreadable = |e: &dyn std::fmt::Display| {
                    StoreError::Unavailable(format!("archive: aggregate block {}: {e}", listed.dir))
                };
                let meta = listed.meta.as_ref().map_err(|e| unreadable(e))?;
                if !meta.gaps.is_empty() {
                    // Windows computed from incomplete data would be answered as exact.
                    return Err(StoreError::InvalidRequest(format!(
                        "from aggregates: block {} may be incomplete: {}",
                        listed.dir,
                        meta.gaps.join("; ")
                    )));
                }
                let b = self.open(&listed.dir, meta).await.map_err(|e| unreadable(&e))?;
                let ids: BTreeSet<i64> = b
                    .series()
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| {
                        s.samples > 0
                            && s.max_time > p.from
                            && s.min_time <= p.last
                            && matches_all(&req.matchers, &s.labels)
                            && req.wants(&s.labels)
                    })
                    .map(|(i, _)| i as i64)
                    .collect();
                let new = ids.iter().filter(|&&i| !found.contains_key(&b.series()[i as usize].labels)).count();
                p.check_limits(req, found.len().saturating_add(new)).map_err(store_error)?;
                let left = req.limits.max_samples.saturating_sub(read);
                let got = match b.windows(&ids, (p.from, p.last), left).await {
                    Ok(got) => got,
                    Err(ArchiveError::Limit { limit }) => {
                        return Err(StoreError::LimitExceeded { what: "samples", limit: limit.saturating_add(read) })
                    }
                    Err(e) => return Err(unreadable(&e)),
                };
                for (id, windows) in got {
                    read = read.saturating_add(windows.windows.len() as u64);
                    let s = &b.series()[id as usize];
                    found
                        .entry(s.labels.clone())
                        .or_insert_with(|| Gathered {
                            metric_type: s.metric_type,
                            kept: Kept::ALL,
                            windows: Vec::new(),
                        })
                        .add(windows)
                        .map_err(|e| StoreError::InvalidRequest(format!("from aggregates: {}: {e}", listed.dir)))?;
                }
            }
        }
        p.check_limits(req, found.len()).map_err(store_error)?;
        let points = (found.len() as u64).saturating_mul(p.steps as u64);
        if points > req.limits.max_samples {
            return Err(StoreError::LimitExceeded { what: "step values", limit: req.limits.max_samples });
        }
        let req = req.clone();
        let evaluated = tokio::task::spawn_blocking(move || {
            found
                .into_iter()
                .map(|(labels, g)| {
                    p.evaluate(
                        &req,
                        SeriesWindows { labels, metric_type: g.metric_type, kept: g.kept, windows: g.windows },
                    )
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|series| p.finish(series))
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("answering from aggregates: {e}")))?;
        evaluated.map_err(store_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_downsample::windows_of;
    use strata_model::Sample;

    #[test]
    fn overlapping_blocks_agree_or_the_answer_is_refused() {
        let raw: Vec<Sample> = (1..=240).map(|k| Sample::new(k * 15_000, (k % 9) as f64)).collect();
        let windows = windows_of(&raw, 300_000);
        let read = |w: &[strata_downsample::Window]| ReadWindows { kept: Kept::ALL, windows: w.to_vec() };
        let mut g = Gathered { metric_type: MetricType::Gauge, kept: Kept::ALL, windows: Vec::new() };
        g.add(read(&windows[..8])).unwrap();
        // A compacted block beside the blocks it replaces: the same windows, kept once.
        g.add(read(&windows[4..])).unwrap();
        assert_eq!(g.windows.len(), windows.len());
        assert!(g.windows.iter().zip(&windows).all(|(a, b)| a.same_bits(b)));
        // A block from other data over the same windows.
        let mut other = windows[5];
        other.sum += 1.0;
        let err = g.add(read(&[other])).unwrap_err();
        assert!(err.contains("different windows"), "{err}");
    }
}
