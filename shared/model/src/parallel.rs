//! Spreading per-series work over the cores: a forward backlog's decode and encode, the
//! windows a query reads from aggregates. The work is independent per series, so it is
//! split into contiguous parts of about equal weight, one task each on a pool of threads
//! kept for the process (rayon's), and the results come back in order. The threads are
//! kept because a query calls this several times: a thread started per call paid for its
//! stack's mapping and for an allocator arena gone cold, and handed the pages back at its
//! end, which cost more than the work on fleet-sized queries.

/// Below this total weight the work runs on the calling thread (threads cost more).
pub const MIN_PARALLEL_WEIGHT: usize = 20_000;

/// At most this many parts.
const MAX_THREADS: usize = 4;

/// The cores this process may use, asked once: the answer reads the cgroup's files, which
/// costs more than a small part of the work.
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `f` of every item, in order; `weight` (samples, say) decides the parts.
pub fn map_in_parts<T: Send, R: Send>(
    items: Vec<T>,
    weight: impl Fn(&T) -> usize,
    f: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    let total: usize = items.iter().map(&weight).sum();
    let threads = cores().min(MAX_THREADS);
    if threads < 2 || total < MIN_PARALLEL_WEIGHT || items.len() < threads {
        return items.into_iter().map(f).collect();
    }
    let per_part = total.div_ceil(threads);
    let mut parts: Vec<Vec<T>> = vec![Vec::new()];
    let mut acc = 0;
    for item in items {
        let w = weight(&item);
        if acc >= per_part && parts.len() < threads {
            parts.push(Vec::new());
            acc = 0;
        }
        acc += w;
        if let Some(last) = parts.last_mut() {
            last.push(item);
        }
    }
    let f = &f;
    let mut parts = parts.into_iter();
    // The calling thread takes the first part itself: the work moves on even while the
    // pool is busy with other callers' parts.
    let first = parts.next().unwrap_or_default();
    let mut rest: Vec<Vec<R>> = (0..parts.len()).map(|_| Vec::new()).collect();
    let mut out: Vec<R> = Vec::new();
    // A panic in `f` is a bug; the scope passes it on to the caller, as one thread would.
    rayon::in_place_scope(|scope| {
        for (part, done) in parts.zip(rest.iter_mut()) {
            scope.spawn(move |_| *done = part.into_iter().map(f).collect());
        }
        out = first.into_iter().map(f).collect();
    });
    out.extend(rest.into_iter().flatten());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_order_whatever_the_parts() {
        for n in [0usize, 1, 3, 50, 5000] {
            let items: Vec<usize> = (0..n).collect();
            let got = map_in_parts(items.clone(), |&i| i % 17 * 100, |i| i * 2);
            assert_eq!(got, items.iter().map(|i| i * 2).collect::<Vec<_>>(), "{n} items");
        }
    }

    #[test]
    fn a_panic_in_a_part_reaches_the_caller() {
        let items: Vec<usize> = (0..100_000).collect();
        let r = std::panic::catch_unwind(|| map_in_parts(items, |_| 1, |i| assert!(i != 99_999, "the last item")));
        assert!(r.is_err());
    }
}
