//! Whether an answer is whole although a store failed: with `partial_response=false` (and
//! dedup on) a store that fails fails the request, unless an HA replica of it answered: a
//! store whose external label sets are the failed one's with other values of the replica
//! labels, and nothing else (edge `replica="b"` for edge `replica="a"`). Then the dedup
//! would have read that replica anyway; the failure is a warning and the answer stands.
//!
//! A store with the same labels is not a replica (shards may share labels, and a regional
//! lists the label sets of the edges that forward to it, forwarding maybe behind), nor one
//! with more or fewer label sets, nor any set without a replica label. Advertised times
//! prove little (an edge's oldest is "now − retention", its newest open), so they only
//! rule out a replica whose data starts after the request's.

use crate::StoreTarget;
use std::collections::BTreeSet;
use strata_model::Labels;

/// A store's label sets without their replica labels, and their replica values; `None`
/// when a set lacks a replica label or keeps no other label.
fn replica_key(t: &StoreTarget, replicas: &[String]) -> Option<(BTreeSet<Labels>, BTreeSet<Labels>)> {
    if t.label_sets.is_empty() {
        return None;
    }
    let (mut rest, mut values) = (BTreeSet::new(), BTreeSet::new());
    for set in &t.label_sets {
        let (mut kept, mut replica) = (set.to_builder(), Labels::default().to_builder());
        for r in replicas {
            if let Some(v) = set.get(r) {
                replica.set(r, v);
                kept.del(r);
            }
        }
        let (kept, replica) = (kept.build(), replica.build());
        if replica.is_empty() || kept.is_empty() {
            return None;
        }
        rest.insert(kept);
        values.insert(replica);
    }
    Some((rest, values))
}

/// Whether one of `alive` (stores that answered) is an HA replica of `failed` whose data
/// reaches back to `start`.
pub(crate) fn covered(failed: &StoreTarget, alive: &[&StoreTarget], replicas: &[String], start: i64) -> bool {
    let Some((rest, values)) = replica_key(failed, replicas) else { return false };
    alive.iter().any(|a| {
        let reaches = a.min_time <= a.max_time && (a.min_time <= start || a.min_time <= failed.min_time);
        reaches && replica_key(a, replicas).is_some_and(|(r, v)| r == rest && v.is_disjoint(&values))
    })
}

/// With `partial_response=false`: the failures that fail the request, named ("store X:
/// reason"), of `failed` (this call's, and those of earlier calls of the request, which
/// are not asked again). A replica among `alive` covers one only with `dedup` on: with
/// `dedup=false` every replica's series are part of the answer.
pub(crate) fn uncovered<'a>(
    failed: impl Iterator<Item = (&'a StoreTarget, &'a str)>,
    alive: &[&StoreTarget],
    replicas: &[String],
    dedup: bool,
    start: i64,
) -> Vec<String> {
    failed
        .filter(|(t, _)| !(dedup && covered(t, alive, replicas, start)))
        .map(|(t, reason)| format!("store {}: {reason}", t.name))
        .collect()
}

/// Why a store that failed earlier in a request is not asked again.
pub(crate) const FAILED_EARLIER: &str = "failed earlier in this request";

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn target(sets: &[&[(&str, &str)]], min_time: i64, max_time: i64) -> StoreTarget {
        let store: Arc<dyn strata_store::Store> = Arc::new(strata_store::memory::MemoryStore::default());
        StoreTarget {
            label_sets: sets.iter().map(|s| Labels::from_pairs(s.iter().copied())).collect(),
            min_time,
            max_time,
            ..StoreTarget::new("t", store)
        }
    }

    #[test]
    fn only_a_replica_whose_data_reaches_the_request_covers_a_failed_store() {
        let r = ["replica".to_string()];
        let edge = |replica: &'static str| target(&[&[("cluster", "c0"), ("replica", replica)]], 0, i64::MAX);
        let (a, b) = (edge("a"), edge("b"));
        assert!(covered(&a, &[&b], &r, 100));
        // Without replica labels configured they are different data.
        assert!(!covered(&a, &[&b], &[], 100));
        // Another cluster is no replica; nor the same labels (a shard, a copy).
        assert!(!covered(&a, &[&target(&[&[("cluster", "c1"), ("replica", "b")]], 0, i64::MAX)], &r, 100));
        assert!(!covered(&a, &[&edge("a")], &r, 100));
        // A regional listing the edges that forward to it is no replica of an edge.
        let regional =
            target(&[&[("cluster", "c0"), ("replica", "a")], &[("cluster", "c0"), ("replica", "b")]], 0, i64::MAX);
        assert!(!covered(&a, &[&regional], &r, 100));
        // Sets without a replica label, or with nothing but one, cover nothing.
        let bare = target(&[&[("replica", "a")]], 0, i64::MAX);
        assert!(!covered(&bare, &[&target(&[&[("replica", "b")]], 0, i64::MAX)], &r, 100));
        assert!(!covered(&target(&[&[("cluster", "c0")]], 0, i64::MAX), &[&b], &r, 100));
        // Unknown labels: never covered.
        assert!(!covered(&target(&[], 0, i64::MAX), &[&b], &r, 100));
        // A replica whose data starts after the request's start does not cover it.
        let young = target(&[&[("cluster", "c0"), ("replica", "b")]], 500, i64::MAX);
        assert!(!covered(&a, &[&young], &r, 100));
        assert!(covered(&a, &[&young], &r, 600));
        // Replicas' oldest times seconds apart (each "now − retention" at its last Info).
        let later = target(&[&[("cluster", "c0"), ("replica", "b")]], 5, i64::MAX);
        assert!(covered(&a, &[&later], &r, 100));
        // A store that holds nothing yet covers nothing.
        assert!(!covered(&a, &[&target(&[&[("cluster", "c0"), ("replica", "b")]], 1, 0)], &r, 100));
        // Two label sets: a replica must hold both.
        let two = |v: &'static str| {
            target(&[&[("cluster", "c0"), ("replica", v)], &[("cluster", "c1"), ("replica", v)]], 0, i64::MAX)
        };
        assert!(covered(&two("a"), &[&two("b")], &r, 100));
        assert!(!covered(&two("a"), &[&b], &r, 100));
    }
}
