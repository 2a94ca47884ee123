//! Selecting series by label matchers over an inverted index, once for every index: the
//! head's in-memory postings and a block's on-disk ones implement [`PostingsSource`].
//!
//! The algorithm is Prometheus': matchers that reject the empty string select (their
//! postings are intersected); matchers that accept it subtract the series whose value they
//! reject, so `{gpu!="0"}` also keeps series without a `gpu` label.

use strata_model::matcher::{MatchOp, Matcher};

/// A series' number within one index: the head's reference, or a block's position.
pub type SeriesId = u64;

pub trait PostingsSource {
    /// Sorted ids of the series with `name="value"`.
    fn postings(&self, name: &str, value: &str) -> Vec<SeriesId>;
    /// The sorted union of the postings of every value of `name` that `accept` takes.
    fn matching(&self, name: &str, accept: &dyn Fn(&str) -> bool) -> Vec<SeriesId>;
    /// Every series, sorted.
    fn all(&self) -> Vec<SeriesId>;
}

pub fn intersect(a: &[SeriesId], b: &[SeriesId]) -> Vec<SeriesId> {
    let (mut i, mut j, mut out) = (0, 0, Vec::with_capacity(a.len().min(b.len())));
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                out.push(a[i]);
                i += 1;
                j += 1;
            }
        }
    }
    out
}

pub fn subtract(a: &[SeriesId], b: &[SeriesId]) -> Vec<SeriesId> {
    let (mut j, mut out) = (0, Vec::with_capacity(a.len()));
    for &x in a {
        while j < b.len() && b[j] < x {
            j += 1;
        }
        if j >= b.len() || b[j] != x {
            out.push(x);
        }
    }
    out
}

/// Sorted, deduplicated union.
pub fn union_all<'a>(lists: impl IntoIterator<Item = &'a [SeriesId]>) -> Vec<SeriesId> {
    let mut out: Vec<SeriesId> = lists.into_iter().flatten().copied().collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The series that match every matcher, sorted by id.
pub fn select(src: &dyn PostingsSource, matchers: &[Matcher]) -> Vec<SeriesId> {
    let mut result: Option<Vec<SeriesId>> = None;
    let mut subtractions: Vec<Vec<SeriesId>> = Vec::new();
    for m in matchers {
        if m.matches("") {
            subtractions.push(src.matching(&m.name, &|v| !m.matches(v)));
            continue;
        }
        let list = match m.op {
            MatchOp::Equal => src.postings(&m.name, &m.value),
            _ => src.matching(&m.name, &|v| m.matches(v)),
        };
        let r = match result {
            None => list,
            Some(r) => intersect(&r, &list),
        };
        if r.is_empty() {
            return r;
        }
        result = Some(r);
    }
    let mut r = result.unwrap_or_else(|| src.all());
    for s in subtractions {
        r = subtract(&r, &s);
    }
    r
}
