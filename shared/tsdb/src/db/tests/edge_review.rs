//! Storage findings of the edge review: one large write must not hold the commit path for
//! everyone, and duplicate checks must not decode a chunk per sample.

use super::*;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;

/// 950 stored samples of one series, then a write of 1.5 M samples inside their range (a
/// sender replaying old data, or a hostile one): they are out of order, apart from exact
/// copies, which are ignored duplicates. Meanwhile another writer (a scrape) commits: it
/// must get in while the large write is still going, not after it.
#[test]
fn a_large_out_of_order_write_does_not_hold_the_commit_path_for_others() {
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions { retention: Duration::from_secs(100 * 86400), ..Default::default() };
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    let now = strata_model::time::now_ms();
    let t0 = now - 2 * 3_600_000;
    let old = db.series(&labels("0")).unwrap();
    let stored: Vec<(Arc<MemSeries>, Sample)> =
        (0..950).map(|i| (old.clone(), Sample::new(t0 + i * 1_000, i as f64))).collect();
    assert_eq!(db.commit(&stored).unwrap().appended, 950);

    // Every thousandth sample is an exact copy of a stored one; the rest fall between.
    let n = 1_500_000i64;
    let big: Vec<(Arc<MemSeries>, Sample)> = (0..n)
        .map(|k| {
            let t = t0 + (k % 949_000);
            let v = if (t - t0) % 1_000 == 0 { ((t - t0) / 1_000) as f64 } else { -1.0 };
            (old.clone(), Sample::new(t, v))
        })
        .collect();
    let copies = (0..n).filter(|k| (k % 949_000) % 1_000 == 0).count();

    let (started_tx, started_rx) = mpsc::channel::<()>();
    let started_tx = Mutex::new(Some(started_tx));
    *db.hook.lock() = Some(Arc::new(move |point: &str| {
        if point == "commit-checked" && std::thread::current().name() == Some("large") {
            if let Some(tx) = started_tx.lock().take() {
                let _ = tx.send(());
            }
        }
    }));
    let done = Arc::new(AtomicBool::new(false));
    let large = {
        let (db, done) = (db.clone(), done.clone());
        std::thread::Builder::new()
            .name("large".into())
            .spawn(move || {
                let out = db.commit(&big).unwrap();
                done.store(true, Ordering::SeqCst);
                out
            })
            .unwrap()
    };
    started_rx.recv_timeout(Duration::from_secs(120)).expect("the large write began");
    let scrape = db.series(&labels("1")).unwrap();
    assert_eq!(db.commit(&[(scrape, Sample::new(now, 1.0))]).unwrap().appended, 1);
    let waited_for_all = done.load(Ordering::SeqCst);
    let out = large.join().unwrap();
    assert!(!waited_for_all, "the small commit waited for the whole 1.5 M-sample write");
    assert_eq!(out.appended, 0);
    assert_eq!(out.ignored_duplicates, copies, "exact copies of stored samples are ignored duplicates");
    assert_eq!(out.rejected.len(), n as usize - copies);
    assert!(out.rejected.iter().all(|r| r.2 == SampleError::OutOfOrder));
}

/// Slices of a large batch are committed in order: the series' samples come back whole and
/// in order, and samples repeated across a slice boundary are duplicates, not errors.
#[test]
fn a_batch_larger_than_a_slice_commits_whole() {
    let d = tempfile::tempdir().unwrap();
    let db = Tsdb::open(d.path(), TsdbOptions::default()).unwrap();
    let now = strata_model::time::now_ms();
    let s = db.series(&labels("0")).unwrap();
    let n = 3 * COMMIT_SLICE as i64 + 7;
    let mut batch: Vec<(Arc<MemSeries>, Sample)> =
        (0..n).map(|i| (s.clone(), Sample::new(now - 3_600_000 + i * 10, i as f64))).collect();
    // The last sample of the first slice again, as the first of the second.
    batch.insert(COMMIT_SLICE, batch[COMMIT_SLICE - 1].clone());
    let out = db.commit(&batch).unwrap();
    assert_eq!((out.appended, out.ignored_duplicates, out.rejected.len()), (n as usize, 1, 0));
    let got = s.samples.lock().holds_each(&batch.iter().map(|x| x.1).collect::<Vec<_>>());
    assert!(got.iter().all(|&h| h), "every committed sample is stored");
}
