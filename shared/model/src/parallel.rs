//! Spreading per-series work over the cores: a forward backlog's decode and encode, the
//! windows a query reads from aggregates. The work is independent per series, so it is
//! split into contiguous parts of about equal weight, taken by the calling thread and by
//! a pool of threads kept for the process, and the results come back in order. The threads are kept because a query calls this several times: a thread
//! started per call paid for its stack's mapping and for an allocator arena gone cold, and
//! handed the pages back at its end, which cost more than the work on fleet-sized queries.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Below this total weight the work runs on the calling thread (threads cost more).
pub const MIN_PARALLEL_WEIGHT: usize = 20_000;

/// At most this many parts.
const MAX_THREADS: usize = 4;

/// The threads that take parts beside the callers: a pool of their own, so that work
/// queued on rayon's global pool (a PromQL query's) never holds a caller up. `None` when
/// the threads could not be started (the caller then does every part).
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let threads = cores().min(MAX_THREADS).saturating_sub(1).max(1);
        rayon::ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("strata-parts-{i}")).build().ok()
    })
    .as_ref()
}

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
    // Parts are claimed in order through a cursor, by the calling thread and by as many
    // pool tasks: when the pool is busy with another caller's parts, this caller claims
    // its parts itself rather than leaving them queued.
    let n = parts.len();
    let todo: Vec<Mutex<Option<Vec<T>>>> = parts.into_iter().map(|p| Mutex::new(Some(p))).collect();
    let done: Vec<Mutex<Vec<R>>> = (0..n).map(|_| Mutex::new(Vec::new())).collect();
    let next = AtomicUsize::new(0);
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(slot) = todo.get(i) else { break };
        let part = slot.lock().unwrap_or_else(|p| p.into_inner()).take().unwrap_or_default();
        let out: Vec<R> = part.into_iter().map(&f).collect();
        *done[i].lock().unwrap_or_else(|p| p.into_inner()) = out;
    };
    // A panic in `f` is a bug; the scope passes it on to the caller, as one thread would.
    match pool() {
        Some(pool) => pool.in_place_scope(|scope| {
            for _ in 1..n {
                scope.spawn(|_| work());
            }
            work();
        }),
        None => work(),
    }
    done.into_iter().flat_map(|d| d.into_inner().unwrap_or_else(|p| p.into_inner())).collect()
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
    fn the_caller_takes_every_part_while_the_pool_is_busy() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        use std::time::{Duration, Instant};
        let (busy, started) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicUsize::new(0)));
        let threads = rayon::current_num_threads();
        for _ in 0..threads {
            let (busy, started) = (busy.clone(), started.clone());
            rayon::spawn(move || {
                started.fetch_add(1, Ordering::SeqCst);
                while busy.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
        }
        let t = Instant::now();
        while started.load(Ordering::SeqCst) < threads && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let items: Vec<usize> = (0..100_000).collect();
            let _ = tx.send(map_in_parts(items, |_| 1, |i| i + 1));
        });
        let got = rx.recv_timeout(Duration::from_secs(20));
        busy.store(false, Ordering::SeqCst);
        let got = got.expect("the work waited for a pool busy elsewhere");
        assert!(got.iter().enumerate().all(|(i, &v)| v == i + 1) && got.len() == 100_000);
    }

    #[test]
    fn a_panic_in_a_part_reaches_the_caller() {
        let items: Vec<usize> = (0..100_000).collect();
        let r = std::panic::catch_unwind(|| map_in_parts(items, |_| 1, |i| assert!(i != 99_999, "the last item")));
        assert!(r.is_err());
    }
}
