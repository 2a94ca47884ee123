//! Inverted index from label pairs to series references, and the string interner that
//! lets millions of series share the few distinct label names and values a fleet has.
//!
//! Selection follows Prometheus' postings algebra: positive matchers (`="x"`, `=~` that
//! cannot match "") intersect postings lists; negative ones subtract; a matcher that
//! accepts the empty value also accepts series without the label. Regexes are run over the
//! distinct values of one label name, never over every series.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use strata_block::postings::{self, PostingsSource};
use strata_model::matcher::Matcher;
use strata_model::{Label, Labels};

pub type SeriesRef = u64;

#[derive(Default)]
pub struct Interner {
    set: HashSet<Arc<str>>,
}

impl Interner {
    pub fn intern(&mut self, s: &Arc<str>) -> Arc<str> {
        if let Some(x) = self.set.get(s) {
            return x.clone();
        }
        self.set.insert(s.clone());
        s.clone()
    }

    pub fn intern_labels(&mut self, l: &Labels) -> Labels {
        Labels::from_sorted_unchecked(
            l.iter().map(|x| Label { name: self.intern(&x.name), value: self.intern(&x.value) }).collect(),
        )
    }

    /// Drops strings nobody but the interner holds any more.
    pub fn gc(&mut self) {
        self.set.retain(|s| Arc::strong_count(s) > 1);
    }

    pub fn byte_size(&self) -> usize {
        self.set.iter().map(|s| s.len() + 16 + 16).sum::<usize>() + self.set.capacity() * 16
    }
}

#[derive(Default)]
pub struct PostingsIndex {
    postings: HashMap<Arc<str>, HashMap<Arc<str>, Vec<SeriesRef>>>,
    all: Vec<SeriesRef>,
}

fn insert_sorted(v: &mut Vec<SeriesRef>, r: SeriesRef) {
    match v.last() {
        Some(&last) if last < r => v.push(r),
        None => v.push(r),
        _ => {
            if let Err(i) = v.binary_search(&r) {
                v.insert(i, r);
            }
        }
    }
}

impl PostingsIndex {
    pub fn add(&mut self, r: SeriesRef, labels: &Labels) {
        for l in labels.iter() {
            let by_value = self.postings.entry(l.name.clone()).or_default();
            insert_sorted(by_value.entry(l.value.clone()).or_default(), r);
        }
        insert_sorted(&mut self.all, r);
    }

    /// Removes many series at once: each posting list they appear in is rewritten once,
    /// so removing k series is linear in the postings touched, not k times their length.
    pub fn remove_all<'l>(&mut self, series: impl IntoIterator<Item = (SeriesRef, &'l Labels)>) {
        let mut dead: HashSet<SeriesRef> = HashSet::new();
        let mut touched: HashSet<(Arc<str>, Arc<str>)> = HashSet::new();
        for (r, labels) in series {
            dead.insert(r);
            for l in labels.iter() {
                touched.insert((l.name.clone(), l.value.clone()));
            }
        }
        if dead.is_empty() {
            return;
        }
        for (name, value) in touched {
            if let Some(by_value) = self.postings.get_mut(name.as_ref()) {
                if let Some(list) = by_value.get_mut(value.as_ref()) {
                    list.retain(|r| !dead.contains(r));
                    if list.is_empty() {
                        by_value.remove(value.as_ref());
                    }
                }
                if by_value.is_empty() {
                    self.postings.remove(name.as_ref());
                }
            }
        }
        self.all.retain(|r| !dead.contains(r));
    }

    pub fn len(&self) -> usize {
        self.all.len()
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Series matching every matcher, sorted by reference (the algorithm every index shares).
    pub fn select(&self, matchers: &[Matcher]) -> Vec<SeriesRef> {
        postings::select(self, matchers)
    }

    pub fn label_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.postings.keys().map(|k| k.to_string()).collect();
        v.sort();
        v
    }

    pub fn label_values(&self, name: &str) -> Vec<String> {
        let mut v: Vec<String> =
            self.postings.get(name).map(|bv| bv.keys().map(|k| k.to_string()).collect()).unwrap_or_default();
        v.sort();
        v
    }

    /// Approximate bytes held by the postings (lists and map entries, not the shared strings).
    pub fn byte_size(&self) -> usize {
        let lists: usize = self
            .postings
            .values()
            .map(|bv| bv.values().map(|l| l.capacity() * 8 + 24 + 16 + 8).sum::<usize>() + 48)
            .sum();
        lists + self.all.capacity() * 8
    }
}

impl PostingsSource for PostingsIndex {
    fn postings(&self, name: &str, value: &str) -> Vec<SeriesRef> {
        self.postings.get(name).and_then(|bv| bv.get(value)).cloned().unwrap_or_default()
    }

    fn matching(&self, name: &str, accept: &dyn Fn(&str) -> bool) -> Vec<SeriesRef> {
        match self.postings.get(name) {
            None => Vec::new(),
            Some(by_value) => {
                postings::union_all(by_value.iter().filter(|(v, _)| accept(v)).map(|(_, l)| l.as_slice()))
            }
        }
    }

    fn all(&self) -> Vec<SeriesRef> {
        self.all.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_model::matcher::MatchOp;

    fn idx() -> PostingsIndex {
        let mut i = PostingsIndex::default();
        i.add(1, &Labels::from_pairs([("__name__", "a"), ("job", "x"), ("gpu", "0")]));
        i.add(2, &Labels::from_pairs([("__name__", "a"), ("job", "y"), ("gpu", "1")]));
        i.add(3, &Labels::from_pairs([("__name__", "b"), ("job", "x")]));
        i
    }

    fn sel(i: &PostingsIndex, ms: &[(MatchOp, &str, &str)]) -> Vec<SeriesRef> {
        let ms: Vec<_> = ms.iter().map(|(o, n, v)| Matcher::new(*o, n, v).unwrap()).collect();
        i.select(&ms)
    }

    #[test]
    fn every_matcher_kind() {
        let i = idx();
        use MatchOp::*;
        assert_eq!(sel(&i, &[(Equal, "__name__", "a")]), [1, 2]);
        assert_eq!(sel(&i, &[(Equal, "__name__", "a"), (NotEqual, "job", "x")]), [2]);
        assert_eq!(sel(&i, &[(Regex, "job", "x|y"), (Equal, "gpu", "")]), [3]);
        assert_eq!(sel(&i, &[(NotRegex, "gpu", "1")]), [1, 3]);
        assert_eq!(sel(&i, &[(Regex, "gpu", ".+")]), [1, 2]);
        assert_eq!(sel(&i, &[(Regex, "gpu", ".*")]), [1, 2, 3]);
        assert_eq!(sel(&i, &[(Equal, "__name__", "nope")]), Vec::<u64>::new());
        assert_eq!(sel(&i, &[(NotEqual, "job", "")]), [1, 2, 3]);
    }

    #[test]
    fn remove_cleans_up() {
        let mut i = idx();
        i.remove_all([(3, &Labels::from_pairs([("__name__", "b"), ("job", "x")]))]);
        assert_eq!(i.label_values("__name__"), ["a"]);
        assert_eq!(i.len(), 2);
    }
}
