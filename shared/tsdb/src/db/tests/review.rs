//! The storage review's findings, one test each: a commit racing a cut, run-time block
//! damage and overlapping blocks, partial blocks left by a full disk, and a WAL that
//! outlived the head it covers.

use super::*;
use std::sync::mpsc;
use strata_block::fault;
use strata_store::{QueryScope, SelectRequest, Store};

fn ms(min: i64) -> i64 {
    min * 60_000
}

/// Every series' samples over all time, checked in strictly increasing time order.
async fn ordered_samples(db: &Arc<Tsdb>) -> Vec<(String, Vec<Sample>)> {
    let req = SelectRequest::new(vec![Matcher::eq("__name__", "DCGM_FI_DEV_GPU_UTIL")], i64::MIN, i64::MAX);
    let found = TsdbStore(db.clone()).select(&req).await.expect("select");
    found
        .iter()
        .map(|s| {
            assert!(
                s.chunks.windows(2).all(|w| w[0].max_t < w[1].min_t),
                "series {}: chunks overlap or are out of order",
                s.labels
            );
            let v = s.samples(i64::MIN, i64::MAX).expect("decodes");
            assert!(v.windows(2).all(|w| w[0].t < w[1].t), "series {}: samples out of order or repeated", s.labels);
            (s.labels.get("gpu").unwrap_or("").to_string(), v)
        })
        .collect()
}

/// A series idle for longer than a block range gets a sample while a cut removes it from
/// the head: the commit checked the series was live before the cut removed it and appended
/// after. The sample must be served, not written into a series no query can see.
#[tokio::test]
async fn a_commit_racing_a_cut_that_removes_its_idle_series_keeps_the_sample() {
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions {
        block_range: Duration::from_secs(1200),
        retention: Duration::from_secs(100 * 86400),
        ..Default::default()
    };
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    let idle = db.series(&labels("idle")).unwrap();
    db.commit(&[(idle.clone(), Sample::new(0, 1.0))]).unwrap();
    let busy = db.series(&labels("busy")).unwrap();
    for i in 0..2 * 240 {
        db.commit(&[(busy.clone(), Sample::new(i * 15_000, 1.0))]).unwrap();
    }
    let late = Sample::new(2 * 240 * 15_000, 2.0);
    let (start_tx, start_rx) = mpsc::channel::<()>();
    let (paused_tx, paused_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let racer = {
        let (db, idle) = (db.clone(), idle.clone());
        std::thread::Builder::new()
            .name("racer".into())
            .spawn(move || {
                start_rx.recv().unwrap();
                db.commit(&[(idle, late)]).unwrap().appended
            })
            .unwrap()
    };
    let fired = AtomicBool::new(false);
    let (start_tx, paused_tx, go_tx) = (Mutex::new(start_tx), Mutex::new(paused_tx), Mutex::new(go_tx));
    let (paused_rx, go_rx) = (Mutex::new(paused_rx), Mutex::new(go_rx));
    *db.hook.lock() = Some(Arc::new(move |point: &str| match point {
        // The first cut's block is written: the racer commits now and stops after its checks.
        "cut-block-written" if !fired.swap(true, Ordering::SeqCst) => {
            let _ = start_tx.lock().send(());
            let _ = paused_rx.lock().recv_timeout(Duration::from_secs(5));
        }
        "commit-checked" if std::thread::current().name() == Some("racer") => {
            let _ = paused_tx.lock().send(());
            // Until the cut has dropped the idle series, or (when the cut waits for this
            // commit, as it must) a while.
            let _ = go_rx.lock().recv_timeout(Duration::from_secs(2));
        }
        "cut-truncated" => {
            let _ = go_tx.lock().send(());
        }
        _ => {}
    }));
    let out = db.maintain().unwrap();
    assert!(out.blocks_cut > 0, "{out:?}");
    assert_eq!(racer.join().unwrap(), 1, "the racing sample was not acknowledged");
    *db.hook.lock() = None;
    let got = ordered_samples(&db).await;
    let idle_samples = got.iter().find(|(g, _)| g == "idle").map(|(_, v)| v.clone()).unwrap_or_default();
    assert_eq!(idle_samples, [Sample::new(0, 1.0), late], "the sample committed during the cut is not served");
}

/// A transient read error (EIO once) is retried, not taken for damage; a block that keeps
/// failing is skipped, and the answer says so in its warnings.
#[tokio::test]
async fn a_transient_read_error_is_retried_and_a_skipped_block_is_a_warning() {
    let d = tempfile::tempdir().unwrap();
    let db = Arc::new(blocky(d.path(), 3, None));
    db.maintain().unwrap();
    assert!(db.blocks().len() >= 3);
    fault::arm("block-read", 1);
    let scope = QueryScope::default();
    let n: usize = scope.clone().run(ordered_samples(&db)).await.iter().map(|s| s.1.len()).sum();
    fault::arm("block-read", 0);
    assert_eq!(n, 4 * 3 * 240, "a transient read error lost samples");
    assert!(db.blocks().damaged().is_empty(), "a transient read error marked a block damaged");
    assert!(scope.warnings().is_empty(), "{:?}", scope.warnings());

    // Reopened, so that nothing comes from the cache: every read now fails.
    drop(db);
    let db = Arc::new(Tsdb::open(d.path(), blocky_options(None)).unwrap());
    fault::arm("block-read", 1000);
    let scope = QueryScope::default();
    let n: usize = scope.clone().run(ordered_samples(&db)).await.iter().map(|s| s.1.len()).sum();
    fault::arm("block-read", 0);
    assert!(n < 4 * 3 * 240, "every block was read");
    assert!(!db.blocks().damaged().is_empty(), "a block that keeps failing is not reported");
    let w = scope.warnings();
    assert!(
        w.iter().any(|w| w.contains("damaged") && w.contains("skipped")),
        "no warning names the skipped block: {w:?}"
    );
    // A later query that skips the same block says so too.
    let scope = QueryScope::default();
    scope.clone().run(ordered_samples(&db)).await;
    assert!(!scope.warnings().is_empty(), "a skipped block gave no warning the second time");
}

/// A block found damaged while running (its reads failed for a while) keeps compaction out
/// of its window: merging its neighbours across it would, after a restart that reads it
/// again, leave two blocks over one range. Overlapping blocks, however they come about,
/// are merged on read and on compaction: every sample once, in order.
#[tokio::test]
async fn a_block_damaged_at_run_time_is_not_compacted_over_and_overlaps_merge() {
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions {
        block_range: Duration::from_secs(1200),
        retention: Duration::from_secs(100 * 86400),
        wal_segment_bytes: 8 << 10,
        ..Default::default()
    };
    {
        let db = Arc::new(blocky(d.path(), 6, None));
        db.cut_head_blocks().unwrap();
        // The first block's reads fail while one query runs.
        fault::arm("block-read", 1000);
        let req = SelectRequest::new(vec![Matcher::eq("__name__", "DCGM_FI_DEV_GPU_UTIL")], 0, ms(19));
        let _ = TsdbStore(db.clone()).select(&req).await;
        fault::arm("block-read", 0);
        assert_eq!(db.blocks().damaged().len(), 1, "the failing block is not marked damaged");
        db.compact().unwrap();
        let bad = &db.blocks().damaged()[0];
        let (lo, hi) = bad.range.expect("its range is known");
        for b in db.blocks().healthy() {
            let m = b.meta();
            assert!(
                m.max_time <= lo || m.min_time >= hi,
                "block {} [{}, {}) covers the damaged block's range",
                m.id,
                m.min_time,
                m.max_time
            );
        }
    }
    // After a restart the block reads again; nothing overlaps, every sample once.
    let db = Arc::new(Tsdb::open(d.path(), opts.clone()).unwrap());
    let n: usize = ordered_samples(&db).await.iter().map(|s| s.1.len()).sum();
    assert_eq!(n, 4 * 6 * 240);
    db.maintain().unwrap();
    let n: usize = ordered_samples(&db).await.iter().map(|s| s.1.len()).sum();
    assert_eq!(n, 4 * 6 * 240, "after compaction");
    drop(db);

    // Two blocks over one range (a cut written twice), with a sample each one lacks.
    let d = tempfile::tempdir().unwrap();
    let blocks = d.path().join("blocks");
    std::fs::create_dir_all(&blocks).unwrap();
    let l = labels("0");
    for (from, extra) in [(0i64, 1_000i64), (60_000, 2_000)] {
        let mut all: Vec<Sample> =
            (0..50).map(|i| from + i * 15_000).map(|t| Sample::new(t, (t / 15_000) as f64)).collect();
        all.push(Sample::new(extra, -1.0));
        all.sort_by_key(|s| s.t);
        let mut w = strata_block::BlockWriter::create(&blocks, 0, ms(20), 1, Vec::new()).unwrap();
        w.add_series(&l, &Chunk::encode_samples(all)).unwrap();
        w.finish().unwrap();
    }
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    assert_eq!(db.blocks().len(), 2);
    // 0 to 53 scrapes of 15 s (the second block starts 4 scrapes in), and one extra each.
    let want = 54 + 2;
    let n: usize = ordered_samples(&db).await.iter().map(|s| s.1.len()).sum();
    assert_eq!(n, want, "overlapping blocks read");
    // Once the head has moved past their compaction window, they are merged with it.
    let s = db.series(&l).unwrap();
    for i in 0..12 * 80 {
        db.commit(&[(s.clone(), Sample::new(ms(20) + i * 15_000, 1.0))]).unwrap();
    }
    db.maintain().unwrap();
    assert!(
        db.blocks().healthy().iter().all(|b| b.meta().min_time != 0 || b.meta().max_time > ms(20)),
        "not compacted"
    );
    let first: usize = ordered_samples(&db).await.iter().map(|s| s.1.iter().filter(|x| x.t < ms(20)).count()).sum();
    assert_eq!(first, want, "overlapping blocks compacted");
}

use strata_chunk::Chunk;

/// A cut whose block is renamed into place but cannot be opened afterwards (EMFILE, EIO)
/// leaves no second copy behind: the window is cut again later, and after a restart each
/// sample is there once.
#[tokio::test]
async fn a_block_that_cannot_be_opened_after_its_rename_is_not_left_to_overlap() {
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions {
        block_range: Duration::from_secs(1200),
        retention: Duration::from_secs(100 * 86400),
        ..Default::default()
    };
    {
        let db = Arc::new(blocky(d.path(), 2, None));
        // Every try to open it fails.
        fault::arm("block-open", 10);
        assert!(db.maintain().is_err(), "the cut's block could not be opened");
        fault::arm("block-open", 0);
        db.maintain().unwrap();
        let n: usize = ordered_samples(&db).await.iter().map(|s| s.1.len()).sum();
        assert_eq!(n, 4 * 2 * 240);
    }
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    let n: usize = ordered_samples(&db).await.iter().map(|s| s.1.len()).sum();
    assert_eq!(n, 4 * 2 * 240, "after a restart");
}

/// A block write that fails (a full disk) leaves no `<id>.tmp` behind, however often
/// maintenance retries; and retention's size counts whatever else fills the blocks
/// directory.
#[test]
fn a_failed_block_write_leaves_no_partial_block_and_the_size_counts_leftovers() {
    let d = tempfile::tempdir().unwrap();
    let db = blocky(d.path(), 3, None);
    fault::arm("block-write", 3);
    for _ in 0..3 {
        assert!(db.maintain().is_err());
    }
    fault::arm("block-write", 0);
    let blocks = d.path().join("blocks");
    let tmp: Vec<String> = std::fs::read_dir(&blocks)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(tmp.is_empty(), "failed block writes left {tmp:?}");
    db.maintain().unwrap();
    let blocks_only = db.blocks().disk_bytes();
    // Something the maintenance cannot remove (another user's file) takes space too.
    std::fs::write(blocks.join("junk"), vec![0u8; 100_000]).unwrap();
    assert!(
        db.blocks().disk_bytes() >= blocks_only + 100_000,
        "retention's size ignores {} bytes in the blocks directory",
        100_000
    );
}

/// Bytes of the data directory outside the blocks.
fn bytes_beside_blocks(dir: &Path) -> u64 {
    fn walk(p: &Path) -> u64 {
        let Ok(rd) = std::fs::read_dir(p) else { return 0 };
        rd.flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => walk(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            })
            .sum()
    }
    walk(dir) - walk(&dir.join("blocks"))
}

/// Once the head's aged windows are in blocks, the data directory holds the blocks and
/// about one head window beside them, not every sample twice: a quiet edge (whose WAL
/// never fills a segment) included.
#[tokio::test]
async fn once_blocks_are_cut_the_wal_holds_about_the_head_only() {
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions {
        block_range: Duration::from_secs(1200),
        retention: Duration::from_secs(100 * 86400),
        ..Default::default()
    };
    let db = Tsdb::open(d.path(), opts.clone()).unwrap();
    let series: Vec<_> = (0..16).map(|g| db.series(&labels(&g.to_string())).unwrap()).collect();
    let hours = 6;
    for i in 0..hours * 240 {
        // Power-like readings with three decimals: the WAL's worst case.
        let batch: Vec<_> = series
            .iter()
            .enumerate()
            .map(|(k, s)| {
                (
                    s.clone(),
                    Sample::new(
                        i * 15_000 + k as i64,
                        300.0 + ((i * 7919 + k as i64 * 104_729) % 100_000) as f64 / 1000.0,
                    ),
                )
            })
            .collect();
        db.commit(&batch).unwrap();
    }
    let before = bytes_beside_blocks(d.path());
    let out = db.maintain().unwrap();
    assert!(out.blocks_cut > 10, "{out:?}");
    let head_share = db.stats().samples as f64 / (16 * hours * 240) as f64;
    let after = bytes_beside_blocks(d.path());
    let bound = (before as f64 * head_share * 1.5) as u64 + (64 << 10);
    assert!(
        after <= bound,
        "{after} bytes beside the blocks after the cuts ({before} before; the head holds {:.0}% of the samples, so at most {bound})",
        head_share * 100.0
    );
    // And a restart still serves everything.
    drop(db);
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    let n: usize = ordered_samples_of(&db, "DCGM_FI_DEV_GPU_UTIL").await;
    assert_eq!(n, 16 * 6 * 240);
}

async fn ordered_samples_of(db: &Arc<Tsdb>, name: &str) -> usize {
    let req = SelectRequest::new(vec![Matcher::eq("__name__", name)], i64::MIN, i64::MAX);
    let found = TsdbStore(db.clone()).select(&req).await.expect("select");
    found.iter().map(|s| s.samples(i64::MIN, i64::MAX).unwrap().len()).sum()
}

/// A series the checkpoint holds, removed by retention and brought back under a new
/// reference, then a crash; after the restart a new series takes the next reference, and
/// a second crash replays both: each series' samples stay its own.
#[tokio::test]
async fn a_series_revived_under_a_new_reference_keeps_its_samples_apart_across_two_crashes() {
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions { retention: Duration::from_secs(3600), ..Default::default() };
    let now = strata_model::time::now_ms();
    let (old, newer) = (labels("old"), labels("newer"));
    {
        let db = Tsdb::open(d.path(), opts.clone()).unwrap();
        let s = db.series(&old).unwrap();
        db.commit(&[(s.clone(), Sample::new(now - 3 * 3_600_000, 1.0))]).unwrap();
        let other = db.series(&labels("other")).unwrap();
        db.commit(&[(other, Sample::new(now - 60_000, 1.0))]).unwrap();
        db.checkpoint().unwrap();
        db.apply_retention().unwrap();
        assert!(s.is_removed());
        // Brought back through the stale handle: a new reference.
        db.commit(&[(s, Sample::new(now - 30_000, 2.0))]).unwrap();
    }
    {
        let db = Tsdb::open(d.path(), opts.clone()).unwrap();
        let s = db.series(&newer).unwrap();
        db.commit(&[(s, Sample::new(now - 20_000, 7.0))]).unwrap();
    }
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    let got = ordered_samples(&db).await;
    let of = |g: &str| got.iter().find(|(x, _)| x == g).map(|(_, v)| v.clone()).unwrap_or_default();
    assert_eq!(of("newer"), [Sample::new(now - 20_000, 7.0)], "{got:?}");
    assert_eq!(of("old").last(), Some(&Sample::new(now - 30_000, 2.0)), "{got:?}");
}

/// A checkpoint written under one block range, loaded under a smaller one (the user
/// changed `block_range`): its chunks cross the new range's boundaries, and every sample
/// still reaches a block, none dropped by the cuts.
#[tokio::test]
async fn a_checkpoint_from_another_block_range_loses_nothing_to_the_cuts() {
    let d = tempfile::tempdir().unwrap();
    let opts = |secs| TsdbOptions {
        block_range: Duration::from_secs(secs),
        retention: Duration::from_secs(100 * 86400),
        ..Default::default()
    };
    {
        let db = Tsdb::open(d.path(), opts(1200)).unwrap();
        let series: Vec<_> = (0..4).map(|g| db.series(&labels(&g.to_string())).unwrap()).collect();
        for i in 0..120 {
            let batch: Vec<_> = series.iter().map(|s| (s.clone(), Sample::new(i * 15_000, i as f64))).collect();
            db.commit(&batch).unwrap();
        }
        db.shutdown().unwrap();
    }
    let db = Arc::new(Tsdb::open(d.path(), opts(600)).unwrap());
    assert!(db.restored_from_checkpoint());
    let out = db.maintain().unwrap();
    assert!(out.blocks_cut >= 1, "{out:?}");
    let n: usize = ordered_samples(&db).await.iter().map(|s| s.1.len()).sum();
    assert_eq!(n, 4 * 120, "after the cuts under the new range");
    drop(db);
    let db = Arc::new(Tsdb::open(d.path(), opts(600)).unwrap());
    let n: usize = ordered_samples(&db).await.iter().map(|s| s.1.len()).sum();
    assert_eq!(n, 4 * 120, "after a restart");
}

/// `retention_size` smaller than what deleting blocks can free (a damaged block kept for
/// inspection, the WAL, the checkpoint): no healthy block is deleted for it, in vain.
#[tokio::test]
async fn size_retention_never_deletes_blocks_for_bytes_it_cannot_free() {
    let d = tempfile::tempdir().unwrap();
    let db = blocky(d.path(), 6, None);
    db.maintain().unwrap();
    let victim = db.blocks().healthy()[0].id().to_string();
    let healthy = db.blocks().len();
    drop(db);
    let idx = d.path().join("blocks").join(&victim).join("index");
    let mut bytes = std::fs::read(&idx).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(&idx, bytes).unwrap();
    let damaged = {
        let db = Tsdb::open(d.path(), blocky_options(None)).unwrap();
        db.blocks().damaged_bytes()
    };
    assert!(damaged > 0);
    let db = Tsdb::open(d.path(), blocky_options(Some(damaged / 2))).unwrap();
    db.maintain().unwrap();
    assert_eq!(db.blocks().len(), healthy - 1, "healthy blocks were deleted for a damaged block's bytes");
}

/// Two processes on one data directory would delete each other's block writes as
/// leftovers: the second open is refused while the first holds it.
#[test]
fn a_data_directory_is_opened_once() {
    let d = tempfile::tempdir().unwrap();
    let db = Tsdb::open(d.path(), TsdbOptions::default()).unwrap();
    let second = Tsdb::open(d.path(), TsdbOptions::default());
    assert!(matches!(second, Err(TsdbError::Locked { .. })), "{:?}", second.err());
    drop(db);
    Tsdb::open(d.path(), TsdbOptions::default()).expect("free again once closed");
}

/// A stop while a cut writes its block: the cut gives up between series, its window stays
/// in the head (not closed to commits, not recorded as on disk), the stop's checkpoint
/// holds it, and the next start serves every sample and cuts the window then.
#[tokio::test]
async fn a_stop_makes_a_running_cut_give_up_and_keep_its_window() {
    let d = tempfile::tempdir().unwrap();
    let db = Arc::new(Tsdb::open(d.path(), blocky_options(None)).unwrap());
    let series: Vec<_> = (0..600).map(|g| db.series(&labels(&g.to_string())).unwrap()).collect();
    for i in 0..2 * 240 {
        let batch: Vec<_> = series.iter().map(|s| (s.clone(), Sample::new(i * 15_000, 1.0))).collect();
        db.commit(&batch).unwrap();
    }
    let stopper: Mutex<Option<std::thread::JoinHandle<()>>> = Mutex::new(None);
    let weak = Arc::downgrade(&db);
    *db.hook.lock() = Some(Arc::new(move |point: &str| {
        if point != "cut-series" || stopper.lock().is_some() {
            return;
        }
        let Some(db) = weak.upgrade() else { return };
        let stopping = db.clone();
        *stopper.lock() = Some(std::thread::spawn(move || {
            stopping.shutdown().unwrap();
        }));
        while !db.is_stopping() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }));
    let out = db.maintain().unwrap();
    assert_eq!(out, MaintenanceOutcome::default(), "the cut did not give up");
    assert!(db.blocks().is_empty(), "a block was written");
    let s = db.series(&labels("new")).unwrap();
    assert_eq!(
        db.commit(&[(s, Sample::new(1, 1.0))]).unwrap().rejected.len(),
        0,
        "the window stayed closed to commits"
    );
    *db.hook.lock() = None;
    // The stop (its checkpoint) finishes once the cut is out of the way.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !d.path().join(CHECKPOINT_FILE).exists() {
        assert!(std::time::Instant::now() < deadline, "the stop never wrote its checkpoint");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    drop(db);
    let db = Arc::new(Tsdb::open(d.path(), blocky_options(None)).unwrap());
    assert!(db.restored_from_checkpoint());
    let n: usize = ordered_samples(&db).await.iter().map(|s| s.1.len()).sum();
    assert_eq!(n, 600 * 480 + 1);
    assert!(db.maintain().unwrap().blocks_cut > 0, "the window is cut after the restart");
}

/// Checkpoints written while commits go on (new series among them), then a crash: every
/// acknowledged sample is back, once, whether the checkpoint or the WAL after it held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_racing_commits_lose_and_repeat_nothing() {
    let d = tempfile::tempdir().unwrap();
    let opts = blocky_options(None);
    let db = Arc::new(Tsdb::open(d.path(), opts.clone()).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (db, done) = (db.clone(), done.clone());
        std::thread::spawn(move || {
            let mut acked = 0usize;
            let mut i = 0i64;
            while !done.load(Ordering::Relaxed) {
                // Four old series and, every tenth round, a new one.
                let mut names: Vec<String> = (0..4).map(|g| g.to_string()).collect();
                if i % 10 == 0 {
                    names.push(format!("new-{i}"));
                }
                let batch: Vec<_> =
                    names.iter().map(|n| (db.series(&labels(n)).unwrap(), Sample::new(i * 1_000, i as f64))).collect();
                acked += db.commit(&batch).unwrap().appended;
                i += 1;
            }
            acked
        })
    };
    for _ in 0..20 {
        db.checkpoint().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    done.store(true, Ordering::Relaxed);
    let acked = writer.join().unwrap();
    drop(db);
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    assert!(db.restored_from_checkpoint());
    let n: usize = ordered_samples(&db).await.iter().map(|s| s.1.len()).sum();
    assert_eq!(n, acked, "{acked} samples acknowledged");
}

/// A series with more labels than any reader limit used to allow, and with labels and
/// values of every length: what a checkpoint writes, it loads.
#[tokio::test]
async fn a_checkpoint_loads_whatever_the_head_held() {
    let d = tempfile::tempdir().unwrap();
    {
        let db = Tsdb::open(d.path(), TsdbOptions::default()).unwrap();
        let mut pairs: Vec<(String, String)> = (0..300).map(|i| (format!("l{i:03}"), "x".repeat(i))).collect();
        pairs.push(("__name__".into(), "DCGM_FI_DEV_GPU_UTIL".into()));
        let s = db.series(&Labels::from_pairs(pairs)).unwrap();
        db.commit(&[(s, Sample::new(1_000, 1.0))]).unwrap();
        db.shutdown().unwrap();
    }
    let db = Arc::new(Tsdb::open(d.path(), TsdbOptions::default()).unwrap());
    assert!(db.restored_from_checkpoint(), "the checkpoint did not load");
    let got = ordered_samples(&db).await;
    assert_eq!(got.len(), 1);
}
