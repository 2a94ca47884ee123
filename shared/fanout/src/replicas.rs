//! Whether an answer is whole although a store failed: with `partial_response=false` a
//! store that fails fails the request, unless another store that answered holds the same
//! data, an HA replica of it (the same external labels but for the replica labels) or a
//! copy (the same labels), over the times the request reads. Then the failure is a warning
//! and the answer stands, as the dedup would have read that replica anyway.

use crate::StoreTarget;
use strata_model::Labels;

/// `l` without the replica labels.
fn without(l: &Labels, replicas: &[String]) -> Labels {
    let mut b = l.to_builder();
    for r in replicas {
        b.del(r);
    }
    b.build()
}

/// Whether `alive` (stores that answered) hold what `failed` holds in `[start, end]`:
/// each of its label sets, replica labels aside, at one of them whose data reaches as far
/// back and forward. Not when `failed`'s label sets are unknown.
pub(crate) fn covered(failed: &StoreTarget, alive: &[&StoreTarget], replicas: &[String], start: i64, end: i64) -> bool {
    // Each bound compared with the request's first: advertised times are bounds computed
    // at each store's last `Info` (an edge's oldest is "now − retention"), so two replicas'
    // differ by the seconds between their calls.
    let reaches = |a: &StoreTarget| {
        a.min_time <= a.max_time
            && (a.min_time <= start || a.min_time <= failed.min_time)
            && (a.max_time >= end || a.max_time >= failed.max_time)
    };
    !failed.label_sets.is_empty()
        && failed.label_sets.iter().all(|set| {
            let key = without(set, replicas);
            alive.iter().any(|a| reaches(a) && a.label_sets.iter().any(|s| without(s, replicas) == key))
        })
}

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
    fn a_replica_that_answered_over_the_times_read_covers_a_failed_one() {
        let r = ["replica".to_string()];
        let a = target(&[&[("cluster", "c0"), ("replica", "a")]], 0, 1000);
        let b = target(&[&[("cluster", "c0"), ("replica", "b")]], 0, 1000);
        assert!(covered(&a, &[&b], &r, 100, 900));
        // Without replica labels configured they are different data.
        assert!(!covered(&a, &[&b], &[], 100, 900));
        // Another cluster is no replica.
        let other = target(&[&[("cluster", "c1"), ("replica", "b")]], 0, 1000);
        assert!(!covered(&a, &[&other], &r, 100, 900));
        // A replica that holds only the last part (an edge beside a regional) does not
        // cover a request for older data.
        let recent = target(&[&[("cluster", "c0"), ("replica", "b")]], 500, 1000);
        assert!(!covered(&a, &[&recent], &r, 100, 900));
        assert!(covered(&a, &[&recent], &r, 600, 900));
        // Two replicas' oldest times a few seconds apart (each "now − retention" at its
        // last Info) both reach a request that starts later.
        let later = target(&[&[("cluster", "c0"), ("replica", "b")]], 5, 1000);
        assert!(covered(&a, &[&later], &r, 100, 900));
        // A store whose labels are unknown is never covered; one holding two sets needs both.
        assert!(!covered(&target(&[], 0, 1000), &[&b], &r, 100, 900));
        let two = target(&[&[("cluster", "c0"), ("replica", "a")], &[("cluster", "c1"), ("replica", "a")]], 0, 1000);
        assert!(!covered(&two, &[&b], &r, 100, 900));
        assert!(covered(&two, &[&b, &other], &r, 100, 900));
        // A store that holds nothing yet covers nothing.
        assert!(!covered(&a, &[&target(&[&[("cluster", "c0"), ("replica", "b")]], 1, 0)], &r, 100, 900));
    }
}
