//! Label sets.
//!
//! Label names and values are `Arc<str>` so that a label set can be cloned into query
//! results, WAL records and indexes without copying the bytes, and so that the head can
//! intern the few thousand distinct values a GPU fleet has across millions of series.

use std::fmt;
use std::sync::Arc;

/// The metric-name label.
pub const METRIC_NAME: &str = "__name__";

/// A valid Prometheus label name: `[a-zA-Z_][a-zA-Z0-9_]*`.
pub fn is_valid_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// One label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label {
    pub name: Arc<str>,
    pub value: Arc<str>,
}

/// A label set, sorted by name, without empty values and without duplicate names.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Labels(Vec<Label>);

impl Labels {
    /// Builds a label set from pairs in any order; empty values are dropped (an empty
    /// value means "no such label" in Prometheus), and for duplicate names the last wins.
    pub fn from_pairs<N: AsRef<str>, V: AsRef<str>>(pairs: impl IntoIterator<Item = (N, V)>) -> Self {
        let mut b = LabelsBuilder::default();
        for (n, v) in pairs {
            b.set(n.as_ref(), v.as_ref());
        }
        b.build()
    }

    /// Wraps labels that the caller guarantees are sorted, unique and non-empty.
    pub fn from_sorted_unchecked(v: Vec<Label>) -> Self {
        Labels(v)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.binary_search_by(|l| l.name.as_ref().cmp(name)).ok().map(|i| self.0[i].value.as_ref())
    }

    pub fn metric_name(&self) -> Option<&str> {
        self.get(METRIC_NAME)
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Label> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_slice(&self) -> &[Label] {
        &self.0
    }

    /// A builder that starts from this label set.
    pub fn to_builder(&self) -> LabelsBuilder {
        LabelsBuilder { labels: self.0.clone() }
    }

    /// A stable 64-bit hash (FNV-1a over names and values with separators), used to find a
    /// series by its labels and to spread scrape offsets; stable across processes and versions.
    pub fn stable_hash(&self) -> u64 {
        let mut h = Fnv64::new();
        for l in &self.0 {
            h.write(l.name.as_bytes());
            h.write(&[0xff]);
            h.write(l.value.as_bytes());
            h.write(&[0xff]);
        }
        h.finish()
    }

    /// Approximate heap bytes held by this label set if nothing were shared.
    pub fn byte_size(&self) -> usize {
        self.0.iter().map(|l| l.name.len() + l.value.len()).sum()
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Prints like Prometheus: `name{a="1", b="2"}`.
impl fmt::Display for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(n) = self.metric_name() {
            f.write_str(n)?;
        }
        f.write_str("{")?;
        let mut first = true;
        for l in self.0.iter().filter(|l| l.name.as_ref() != METRIC_NAME) {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{}={:?}", l.name, l.value.as_ref())?;
        }
        f.write_str("}")
    }
}

/// Mutable label set used by relabeling and the scrape path.
#[derive(Debug, Clone, Default)]
pub struct LabelsBuilder {
    labels: Vec<Label>,
}

impl LabelsBuilder {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.find(name).ok().map(|i| self.labels[i].value.as_ref())
    }

    fn find(&self, name: &str) -> Result<usize, usize> {
        self.labels.binary_search_by(|l| l.name.as_ref().cmp(name))
    }

    /// Sets a label; an empty value deletes it.
    pub fn set(&mut self, name: &str, value: &str) {
        if value.is_empty() {
            self.del(name);
            return;
        }
        match self.find(name) {
            Ok(i) => {
                if self.labels[i].value.as_ref() != value {
                    self.labels[i].value = Arc::from(value);
                }
            }
            Err(i) => self.labels.insert(i, Label { name: Arc::from(name), value: Arc::from(value) }),
        }
    }

    /// Sets a label from shared strings without copying them.
    pub fn set_shared(&mut self, name: Arc<str>, value: Arc<str>) {
        if value.is_empty() {
            self.del(&name);
            return;
        }
        match self.find(&name) {
            Ok(i) => self.labels[i].value = value,
            Err(i) => self.labels.insert(i, Label { name, value }),
        }
    }

    pub fn del(&mut self, name: &str) {
        if let Ok(i) = self.find(name) {
            self.labels.remove(i);
        }
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&Label) -> bool) {
        self.labels.retain(|l| keep(l));
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Label> {
        self.labels.iter()
    }

    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    pub fn build(self) -> Labels {
        Labels(self.labels)
    }
}

/// 64-bit FNV-1a: small, stable, good enough to bucket label sets.
#[derive(Clone, Copy)]
pub struct Fnv64(u64);

impl Fnv64 {
    pub fn new() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    pub fn finish(&self) -> u64 {
        self.0
    }
}

impl Default for Fnv64 {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_names_follow_prometheus() {
        assert!(is_valid_label_name("_a1"));
        assert!(!is_valid_label_name("1a"));
        assert!(!is_valid_label_name("a-b"));
        assert!(!is_valid_label_name(""));
    }

    #[test]
    fn labels_are_sorted_and_drop_empty_values() {
        let l = Labels::from_pairs([("b", "2"), ("a", "1"), ("c", ""), ("__name__", "up")]);
        let names: Vec<_> = l.iter().map(|l| l.name.to_string()).collect();
        assert_eq!(names, ["__name__", "a", "b"]);
        assert_eq!(l.get("a"), Some("1"));
        assert_eq!(l.get("c"), None);
        assert_eq!(l.to_string(), r#"up{a="1", b="2"}"#);
    }

    #[test]
    fn hash_differs_when_a_value_moves_between_labels() {
        let a = Labels::from_pairs([("a", "xy"), ("b", "z")]);
        let b = Labels::from_pairs([("a", "x"), ("b", "yz")]);
        assert_ne!(a.stable_hash(), b.stable_hash());
    }
}
