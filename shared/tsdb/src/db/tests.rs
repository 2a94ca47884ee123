use super::*;
use crate::TsdbStore;
use std::time::Duration;
use strata_model::matcher::Matcher;
use strata_model::MetricType;
use strata_store::conformance;

fn labels(gpu: &str) -> Labels {
    Labels::from_pairs([("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", gpu)])
}

fn open(dir: &Path) -> Tsdb {
    Tsdb::open(dir, TsdbOptions::default()).expect("open")
}

fn read_all(db: &Tsdb, gpu: &str) -> Vec<Sample> {
    let found = db.head().select(&[Matcher::eq("gpu", gpu)], i64::MIN, i64::MAX);
    found.iter().flat_map(|(_, cs)| cs.iter().flat_map(|c| c.decode().unwrap())).collect()
}

#[test]
fn appended_samples_survive_a_restart() {
    let d = tempfile::tempdir().unwrap();
    {
        let db = open(d.path());
        let s = db.series(&labels("0")).unwrap();
        let batch: Vec<_> = (0..1000).map(|i| (s.clone(), Sample::new(i * 1000, i as f64))).collect();
        assert_eq!(db.commit(&batch).unwrap().appended, 1000);
        db.set_metadata("DCGM_FI_DEV_GPU_UTIL", Metadata { metric_type: MetricType::Gauge, ..Default::default() })
            .unwrap();
        // dropped without a sync: the records are in the OS, as after SIGKILL
    }
    let db = open(d.path());
    let got = read_all(&db, "0");
    assert_eq!(got.len(), 1000);
    assert_eq!(got[999], Sample::new(999_000, 999.0));
    assert_eq!(db.head().metric_type("DCGM_FI_DEV_GPU_UTIL"), MetricType::Gauge);
    // and new appends continue after the replayed ones
    let s = db.series(&labels("0")).unwrap();
    assert_eq!(db.commit(&[(s, Sample::new(1_000_000, 1.0))]).unwrap().appended, 1);
}

#[test]
fn out_of_order_and_duplicates_follow_the_policy() {
    let d = tempfile::tempdir().unwrap();
    let db = open(d.path());
    let s = db.series(&labels("0")).unwrap();
    db.commit(&[(s.clone(), Sample::new(5_000, 7.0)), (s.clone(), Sample::new(10_000, 1.0))]).unwrap();
    let out = db
        .commit(&[
            (s.clone(), Sample::new(9_000, 1.0)),  // out of order
            (s.clone(), Sample::new(5_000, 7.0)),  // a retry of a stored sample: ignored
            (s.clone(), Sample::new(10_000, 2.0)), // duplicate timestamp, other value
            (s.clone(), Sample::new(10_000, 1.0)), // exact duplicate: ignored
            (s.clone(), Sample::new(11_000, 3.0)), // fine
            (s.clone(), Sample::new(11_000, 4.0)), // conflicts within the batch
        ])
        .unwrap();
    assert_eq!(out.appended, 1);
    assert_eq!(out.ignored_duplicates, 2);
    // Older samples are classified after the rest of the batch: the order of the refusals
    // is not the batch's.
    let count = |e: SampleError| out.rejected.iter().filter(|r| r.2 == e).count();
    assert_eq!((count(SampleError::OutOfOrder), count(SampleError::DuplicateTimestamp)), (1, 2));
    assert_eq!(out.rejected.len(), 3);
    assert_eq!(read_all(&db, "0"), [Sample::new(5_000, 7.0), Sample::new(10_000, 1.0), Sample::new(11_000, 3.0)]);
}

#[test]
fn backfill_into_an_empty_db_then_retention_counts_from_the_newest_sample() {
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions { retention: Duration::from_secs(3600), ..Default::default() };
    let db = Tsdb::open(d.path(), opts.clone()).unwrap();
    let old = db.series(&labels("old")).unwrap();
    let new = db.series(&labels("new")).unwrap();
    // a day ago, then now: both accepted in time order
    let day = 86_400_000i64;
    db.commit(&[(old.clone(), Sample::new(1_000, 1.0))]).unwrap();
    db.commit(&[(new.clone(), Sample::new(day, 2.0))]).unwrap();
    // older than newest − retention is out of bounds now
    let out = db.commit(&[(old.clone(), Sample::new(2_000, 1.0))]).unwrap();
    assert_eq!(out.rejected[0].2, SampleError::OutOfBounds);
    let (series, _) = db.apply_retention().unwrap();
    assert_eq!(series, 1);
    assert!(read_all(&db, "old").is_empty());
    assert_eq!(read_all(&db, "new").len(), 1);
}

#[test]
fn series_limit_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let db = Tsdb::open(d.path(), TsdbOptions { max_series: 2, ..Default::default() }).unwrap();
    db.series(&labels("0")).unwrap();
    db.series(&labels("1")).unwrap();
    let e = db.series(&labels("2")).err().expect("limit");
    assert!(e.to_string().contains("series limit of 2"), "{e}");
    db.series(&labels("1")).expect("existing series still usable");
}

#[test]
fn replay_skips_damage_and_keeps_what_came_before() {
    let d = tempfile::tempdir().unwrap();
    {
        let db = open(d.path());
        let s = db.series(&labels("0")).unwrap();
        for i in 0..10 {
            db.commit(&[(s.clone(), Sample::new(i * 1000, i as f64))]).unwrap();
        }
    }
    let seg = d.path().join("wal").join("00000000");
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 3).unwrap();
    let db = open(d.path());
    assert_eq!(read_all(&db, "0").len(), 9);
}

/// Loads the conformance fixture into `db`.
fn load_fixture(db: &Tsdb) {
    for f in conformance::fixture() {
        let s = db.series(&f.labels).unwrap();
        let batch: Vec<_> = f.samples.iter().map(|x| (s.clone(), *x)).collect();
        let out = db.commit(&batch).unwrap();
        assert!(out.rejected.is_empty());
        let name = f.labels.metric_name().unwrap().to_string();
        db.set_metadata(&name, Metadata { metric_type: f.metric_type, ..Default::default() }).unwrap();
    }
}

#[tokio::test]
async fn tsdb_store_passes_the_store_conformance_suite() {
    let d = tempfile::tempdir().unwrap();
    // A block range longer than the data: everything stays in the head.
    let opts = TsdbOptions { block_range: Duration::from_secs(1000 * 86400), ..Default::default() };
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    load_fixture(&db);
    // The head seals full chunks into the block encoding, except one holding a staleness
    // marker; the last chunk is still open. The suite below reads all three kinds.
    let all = strata_model::matcher::Matcher::new(
        strata_model::matcher::MatchOp::Equal,
        "__name__",
        "DCGM_FI_DEV_POWER_USAGE",
    )
    .unwrap();
    let found = db.head().select(&[all], i64::MIN, i64::MAX);
    let kinds: Vec<bool> = found[0].1.iter().map(|c| c.is_block()).collect();
    assert_eq!(kinds, [true, false, false], "a block, a sealed stream chunk, the open chunk");
    conformance::run_all(&TsdbStore(db)).await;
}

#[tokio::test]
async fn tsdb_store_over_blocks_and_head_passes_the_conformance_suite() {
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions {
        block_range: Duration::from_secs(1800),
        retention: Duration::from_secs(100 * 86400),
        ..Default::default()
    };
    {
        let db = Arc::new(Tsdb::open(d.path(), opts.clone()).unwrap());
        load_fixture(&db);
        let out = db.maintain().unwrap();
        assert!(out.blocks_cut >= 10, "{out:?}");
        assert!(out.blocks_compacted >= 2, "{out:?}");
        // The long series ends in the head and starts in blocks.
        let long = Matcher::eq("__name__", "DCGM_FI_DEV_POWER_USAGE");
        assert!(!db.head().select(std::slice::from_ref(&long), i64::MIN, i64::MAX).is_empty());
        let in_blocks: usize = db
            .blocks()
            .healthy()
            .iter()
            .map(|b| {
                b.select::<strata_block::BlockError>(std::slice::from_ref(&long), i64::MIN, i64::MAX, |_| Ok(()))
                    .unwrap()
                    .len()
            })
            .sum();
        assert!(in_blocks >= 2, "the long series is in {in_blocks} blocks");
        assert!(db.blocks().healthy().iter().any(|b| b.meta().level >= 2), "compaction merged some blocks");
        conformance::run_all(&TsdbStore(db.clone())).await;
    }
    // And again after a restart: blocks read from disk, the head from the WAL.
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    assert!(!db.blocks().is_empty());
    conformance::run_all(&TsdbStore(db)).await;
}

const MINUTE: i64 = 60_000;

#[test]
fn a_sample_from_the_future_is_refused_and_moves_nothing() {
    let d = tempfile::tempdir().unwrap();
    let db = open(d.path());
    let now = strata_model::time::now_ms();
    let s = db.series(&labels("0")).unwrap();
    db.commit(&[(s.clone(), Sample::new(now - MINUTE, 1.0))]).unwrap();
    let year_2100 = 4_102_444_800_000;
    let out = db.commit(&[(s.clone(), Sample::new(year_2100, 2.0))]).unwrap();
    assert_eq!(out.appended, 0);
    assert_eq!(out.rejected.len(), 1);
    assert_eq!(out.rejected[0].2, SampleError::TooFarInFuture);
    assert_eq!(db.head().max_time(), now - MINUTE, "a refused sample moved the head's time");
    // Later normal samples still go in, and retention keeps what was there.
    assert_eq!(db.commit(&[(s.clone(), Sample::new(now, 3.0))]).unwrap().appended, 1);
    db.apply_retention().unwrap();
    assert_eq!(read_all(&db, "0").len(), 2);
    // Within the grace period is fine.
    assert_eq!(db.commit(&[(s, Sample::new(now + 5 * MINUTE, 4.0))]).unwrap().appended, 1);
}

#[test]
fn retention_counts_from_the_wall_clock_at_most() {
    let d = tempfile::tempdir().unwrap();
    let db = Tsdb::open(d.path(), TsdbOptions { retention: Duration::from_secs(3600), ..Default::default() }).unwrap();
    let now = strata_model::time::now_ms();
    let s = db.series(&labels("0")).unwrap();
    db.commit(&[(s, Sample::new(now + 9 * MINUTE, 2.0))]).unwrap();
    // Counted from the sample 9 minutes ahead, the window would start 51 minutes ago and
    // refuse this one as out of bounds.
    let other = db.series(&labels("1")).unwrap();
    assert_eq!(db.commit(&[(other, Sample::new(now - 55 * MINUTE, 1.0))]).unwrap().appended, 1);
    db.apply_retention().unwrap();
    assert_eq!(read_all(&db, "1").len(), 1);
}

#[test]
fn a_wal_that_holds_future_samples_replays_without_poisoning() {
    let d = tempfile::tempdir().unwrap();
    let now = strata_model::time::now_ms();
    let year_2100 = 4_102_444_800_000;
    {
        // A WAL written without the guard, as before it existed.
        let lax = TsdbOptions { future_grace_period: Duration::from_secs(200 * 365 * 86_400), ..Default::default() };
        let db = Tsdb::open(d.path(), lax).unwrap();
        let s = db.series(&labels("0")).unwrap();
        db.commit(&[(s.clone(), Sample::new(now - MINUTE, 1.0)), (s, Sample::new(year_2100, 2.0))]).unwrap();
    }
    let db = open(d.path());
    assert_eq!(read_all(&db, "0"), vec![Sample::new(now - MINUTE, 1.0)]);
    assert_eq!(db.head().max_time(), now - MINUTE);
    let s = db.series(&labels("0")).unwrap();
    assert_eq!(db.commit(&[(s, Sample::new(now, 3.0))]).unwrap().appended, 1);
    db.apply_retention().unwrap();
    assert_eq!(read_all(&db, "0").len(), 2);
}

#[test]
fn a_selection_stops_at_the_first_series_over_the_limit() {
    let d = tempfile::tempdir().unwrap();
    let db = open(d.path());
    for gpu in 0..100 {
        let s = db.series(&labels(&gpu.to_string())).unwrap();
        db.commit(&[(s, Sample::new(1000, 1.0))]).unwrap();
    }
    let mut seen = 0;
    let r = db.head().select_charged(&[Matcher::eq("__name__", "DCGM_FI_DEV_GPU_UTIL")], 0, 2000, |_| {
        seen += 1;
        if seen > 3 {
            Err("over")
        } else {
            Ok(())
        }
    });
    assert!(matches!(r, Err("over")));
    assert_eq!(seen, 4, "the selection went on past the limit");
}

#[test]
fn metadata_survives_the_deletion_of_the_segment_it_was_first_logged_in() {
    let d = tempfile::tempdir().unwrap();
    let meta = Metadata { metric_type: MetricType::Counter, help: "energy".into(), unit: String::new() };
    {
        let db = open(d.path());
        db.set_metadata("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", meta.clone()).unwrap();
    }
    drop(open(d.path()));
    // Retention deletes every segment but the newest.
    let segs = crate::wal::list_segments(&d.path().join("wal")).unwrap();
    for n in &segs[..segs.len() - 1] {
        std::fs::remove_file(d.path().join("wal").join(format!("{n:08}"))).unwrap();
    }
    let db = open(d.path());
    assert_eq!(db.head().all_metadata(), vec![("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION".to_string(), meta)]);
}

#[test]
fn an_append_through_a_handle_retention_removed_lands_in_a_live_series() {
    let d = tempfile::tempdir().unwrap();
    let db = Tsdb::open(d.path(), TsdbOptions { retention: Duration::from_secs(3600), ..Default::default() }).unwrap();
    let now = strata_model::time::now_ms();
    let old = db.series(&labels("0")).unwrap();
    db.commit(&[(old.clone(), Sample::new(now - 3 * 3600 * 1000, 1.0))]).unwrap();
    let other = db.series(&labels("1")).unwrap();
    db.commit(&[(other, Sample::new(now, 1.0))]).unwrap();
    db.apply_retention().unwrap();
    assert!(old.is_removed(), "retention kept a series with nothing in the window");
    // A scrape's cache still holds `old`: its next sample must be visible to queries.
    assert_eq!(db.commit(&[(old, Sample::new(now, 2.0))]).unwrap().appended, 1);
    assert_eq!(read_all(&db, "0"), vec![Sample::new(now, 2.0)]);
    drop(db);
    // After a restart, one series with that label set, holding the new sample (retention
    // cuts whole chunks, so the old one may still be there too).
    let db = open(d.path());
    assert_eq!(db.head().select(&[Matcher::eq("gpu", "0")], i64::MIN, i64::MAX).len(), 1);
    assert_eq!(read_all(&db, "0").last(), Some(&Sample::new(now, 2.0)), "lost at restart");
}

/// A scrape committed from an async worker never waits: `try_commit_distinct` declines
/// while the WAL lock is held, when the write would rotate a full segment (an `fsync`), and
/// under `wal_sync: always`; otherwise it stores the batch as `commit_distinct` does.
#[test]
fn try_commit_declines_whatever_would_block() {
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions { wal_segment_bytes: 4096, ..Default::default() };
    let db = Tsdb::open(d.path(), opts).unwrap();
    let now = strata_model::time::now_ms();
    let s = db.series(&labels("0")).unwrap();
    let held = db.wal.lock();
    assert!(db.try_commit_distinct(&[(s.clone(), Sample::new(now - 9000, 1.0))]).is_none(), "waited for the lock");
    drop(held);
    let mut t = now - 9000;
    while !db.wal.lock().wal.is_full() {
        let out = db.try_commit_distinct(&[(s.clone(), Sample::new(t, 1.0))]).expect("declined a free WAL");
        assert_eq!(out.unwrap().appended, 1);
        t += 1;
    }
    assert!(db.try_commit_distinct(&[(s.clone(), Sample::new(t, 1.0))]).is_none(), "rotated (fsync) inline");
    assert_eq!(db.commit_distinct(&[(s, Sample::new(t, 1.0))]).unwrap().appended, 1);
    drop(db);
    let d = tempfile::tempdir().unwrap();
    let db = Tsdb::open(d.path(), TsdbOptions { wal_sync: wal::SyncPolicy::Always, ..Default::default() }).unwrap();
    let s = db.series(&labels("0")).unwrap();
    assert!(db.try_commit_distinct(&[(s, Sample::new(now, 1.0))]).is_none(), "fsynced inline");
}

/// Edge review (issue 20): a large batch whose second slice cannot be logged. The first
/// slice's samples are stored and its refusals reported with the failure, so the caller
/// counts them (they were lost with the error before).
#[test]
fn a_wal_failure_in_a_later_slice_keeps_the_earlier_slices_outcome() {
    let d = tempfile::tempdir().unwrap();
    let db = open(d.path());
    let now = strata_model::time::now_ms();
    let s = db.series(&labels("0")).unwrap();
    db.commit(&[(s.clone(), Sample::new(now, 1.0))]).unwrap();
    // One sample out of order, then more than a slice of new series' samples.
    let mut batch = vec![(s.clone(), Sample::new(now - 1000, 2.0))];
    for i in 0..COMMIT_SLICE + 10 {
        batch.push((db.series(&labels(&format!("n{i}"))).unwrap(), Sample::new(now, 1.0)));
    }
    // A refusal in the failed slice is not reported: nothing of that slice happened.
    batch.push((s.clone(), Sample::new(now - 500, 3.0)));
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        panic!("/dev/full is needed for this test");
    };
    *db.wal_file_after_first_slice.lock() = Some(Arc::new(full));
    let (out, done) = db.commit_partial(&batch);
    assert!(done.is_err(), "the second slice was logged to a full disk");
    assert_eq!(out.appended, COMMIT_SLICE - 1, "the first slice's stored samples");
    assert_eq!(out.rejected.len(), 1, "the first slice's refusal was lost with the error");
    assert_eq!(out.rejected[0].2, SampleError::OutOfOrder);
}

#[test]
fn a_failed_wal_write_stores_nothing_and_marks_the_database_unwritable_until_one_succeeds() {
    let d = tempfile::tempdir().unwrap();
    let db = open(d.path());
    let now = strata_model::time::now_ms();
    let s = db.series(&labels("0")).unwrap();
    db.commit(&[(s.clone(), Sample::new(now - 2000, 1.0))]).unwrap();
    // A disk that is full: every write fails.
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        panic!("/dev/full is needed for this test");
    };
    let real = db.swap_wal_file(Arc::new(full));
    assert!(db.commit(&[(s.clone(), Sample::new(now - 1000, 2.0))]).is_err());
    assert!(!db.is_writable());
    assert_eq!(read_all(&db, "0").len(), 1, "a sample that was not logged was applied");
    db.swap_wal_file(real);
    assert_eq!(db.commit(&[(s, Sample::new(now, 3.0))]).unwrap().appended, 1);
    assert!(db.is_writable());
    drop(db);
    let got = read_all(&open(d.path()), "0");
    assert_eq!(got, vec![Sample::new(now - 2000, 1.0), Sample::new(now, 3.0)]);
}

#[test]
fn metadata_is_bounded_and_forgotten_with_its_series() {
    let d = tempfile::tempdir().unwrap();
    let db = Tsdb::open(d.path(), TsdbOptions { retention: Duration::from_secs(3600), ..Default::default() }).unwrap();
    let huge = Metadata { metric_type: MetricType::Gauge, help: "é".repeat(10_000), unit: String::new() };
    db.set_metadata("DCGM_FI_DEV_GPU_UTIL", huge).unwrap();
    db.set_metadata(&"x".repeat(5000), Metadata::default()).unwrap();
    let all = db.head().all_metadata();
    assert_eq!(all.len(), 1, "an oversize family name was kept");
    assert!(all[0].1.help.len() <= crate::head::MAX_METADATA_BYTES);
    // Retention removes the family's only series: its metadata goes too.
    let now = strata_model::time::now_ms();
    let s = db.series(&labels("0")).unwrap();
    db.commit(&[(s, Sample::new(now - 3 * 3600 * 1000, 1.0))]).unwrap();
    let other = db.series(&Labels::from_pairs([("__name__", "other_total")])).unwrap();
    db.commit(&[(other, Sample::new(now, 1.0))]).unwrap();
    db.set_metadata("other", Metadata { metric_type: MetricType::Counter, ..Default::default() }).unwrap();
    db.apply_retention().unwrap();
    let names: Vec<String> = db.head().all_metadata().into_iter().map(|(f, _)| f).collect();
    assert_eq!(names, ["other"], "metadata of a family without series was kept, or of one with series dropped");
}

/// 20-minute blocks, 8 KiB WAL segments, retention of 100 days.
fn blocky_options(size: Option<u64>) -> TsdbOptions {
    TsdbOptions {
        block_range: Duration::from_secs(1200),
        retention: Duration::from_secs(100 * 86400),
        wal_segment_bytes: 8 << 10,
        retention_size: size,
        ..Default::default()
    }
}

/// A database with [`blocky_options`], loaded with `hours` of four series at 15 s, in time
/// order.
fn blocky(dir: &Path, hours: i64, size: Option<u64>) -> Tsdb {
    let db = Tsdb::open(dir, blocky_options(size)).unwrap();
    let series: Vec<_> = (0..4).map(|g| db.series(&labels(&g.to_string())).unwrap()).collect();
    for i in 0..hours * 240 {
        let batch: Vec<_> = series.iter().map(|s| (s.clone(), Sample::new(i * 15_000, (i % 97) as f64))).collect();
        db.commit(&batch).unwrap();
    }
    db
}

async fn count_samples(db: &Arc<Tsdb>) -> usize {
    let req = strata_store::SelectRequest::new(vec![Matcher::eq("__name__", "DCGM_FI_DEV_GPU_UTIL")], 0, i64::MAX);
    let found = strata_store::Store::select(&TsdbStore(db.clone()), &req).await.unwrap();
    found.iter().map(|s| s.samples(0, i64::MAX).unwrap().len()).sum()
}

/// A checkpoint costs a pass over the head: a head that only grows (no cut) does not get
/// one each time its WAL passes its chunks, as it did (every sample was written about four
/// times over); the first cut makes one due.
#[test]
fn a_growing_head_is_checkpointed_after_a_cut_not_every_time_its_wal_passes_it() {
    let d = tempfile::tempdir().unwrap();
    let db = Tsdb::open(d.path(), blocky_options(None)).unwrap();
    let series: Vec<_> = (0..64).map(|g| db.series(&labels(&g.to_string())).unwrap()).collect();
    let mut i = 0i64;
    let mut write = |until_min: i64| {
        while i * 15_000 < until_min * 60_000 {
            let batch: Vec<_> = series.iter().map(|s| (s.clone(), Sample::new(i * 15_000, (i % 97) as f64))).collect();
            db.commit(&batch).unwrap();
            i += 1;
        }
    };
    for minutes in [5, 10, 15, 20, 25] {
        write(minutes);
        let wal = db.wal.lock().wal.bytes_from(0);
        let chunks = db.head().stats().chunk_bytes as u64;
        assert!(wal > chunks, "the test needs a WAL larger than the head ({wal} <= {chunks})");
        let out = db.maintain().unwrap();
        assert!(!out.checkpointed && out.blocks_cut == 0, "after {minutes} min: {out:?}");
    }
    // 20-minute blocks: the first is cut once the head is 30 minutes past its start.
    write(31);
    let out = db.maintain().unwrap();
    assert!(out.blocks_cut == 1 && out.checkpointed, "{out:?}");
    // The checkpoint covers the cut: the next run, with little new WAL, writes none.
    write(32);
    assert!(!db.maintain().unwrap().checkpointed);
}

#[tokio::test]
async fn the_wal_covers_only_the_head_once_blocks_are_cut() {
    let d = tempfile::tempdir().unwrap();
    let db = blocky(d.path(), 6, None);
    let before = crate::wal::list_segments(&d.path().join("wal")).unwrap().len();
    let out = db.maintain().unwrap();
    assert!(out.blocks_cut >= 14 && out.wal_segments_deleted > 0, "{out:?}");
    let after = crate::wal::list_segments(&d.path().join("wal")).unwrap().len();
    assert!(after * 2 < before, "{before} WAL segments before the cut, {after} after");
    // The labels of the series logged in deleted segments are in the head checkpoint.
    assert!(out.checkpointed && d.path().join(CHECKPOINT_FILE).exists());
    assert!(db.head().min_time() >= 6 * 3_600_000 - 3 * 1_200_000, "the head keeps at most 1.5 ranges and the current");
    let db = Arc::new(db);
    assert_eq!(count_samples(&db).await, 4 * 6 * 240);
    drop(db);
    // A restart replays only the head's window and serves the rest from blocks.
    let db = Arc::new(
        Tsdb::open(d.path(), TsdbOptions { block_range: Duration::from_secs(1200), ..Default::default() }).unwrap(),
    );
    assert_eq!(count_samples(&db).await, 4 * 6 * 240);
    assert!(db.stats().samples < 4 * 240, "{} samples replayed into the head", db.stats().samples);
    // A sample inside a block's range is refused: blocks are immutable.
    let s = db.series(&labels("0")).unwrap();
    let out = db.commit(&[(s, Sample::new(3_600_000, 1.0))]).unwrap();
    assert_eq!(out.rejected[0].2, SampleError::OutOfBounds);
}

#[test]
fn a_held_wal_segment_survives_block_cuts_until_released() {
    let d = tempfile::tempdir().unwrap();
    let db = Tsdb::open(
        d.path(),
        TsdbOptions { block_range: Duration::from_secs(1200), wal_segment_bytes: 8 << 10, ..Default::default() },
    )
    .unwrap();
    let start = db.wal_cursor();
    db.hold_wal(Some(start));
    let s = db.series(&labels("0")).unwrap();
    for i in 0..4 * 240 {
        db.commit(&[(s.clone(), Sample::new(i * 15_000, 1.0))]).unwrap();
    }
    db.maintain().unwrap();
    // Every record from the cursor is still there for the reader.
    let mut r = crate::wal::WalReader::new(&db.wal_dir(), start);
    let mut samples = 0;
    while let Some((rec, _)) = r.next_record().unwrap() {
        if let crate::wal::WalRecord::Samples(v) = rec {
            samples += v.len();
        }
    }
    assert_eq!(samples, 4 * 240);
    db.hold_wal(None);
    assert!(db.maintain().unwrap().wal_segments_deleted > 0);
}

#[tokio::test]
async fn retention_by_size_deletes_the_oldest_blocks_first() {
    let d = tempfile::tempdir().unwrap();
    let db = blocky(d.path(), 6, None);
    db.maintain().unwrap();
    // The WAL counts too (as Prometheus' retention.size): leave room for it and 2/3 of the blocks.
    let limit = db.wal_disk_bytes() + db.blocks().disk_bytes() * 2 / 3;
    let oldest = db.blocks().healthy()[0].meta().min_time;
    drop(db);
    let opts =
        TsdbOptions { block_range: Duration::from_secs(1200), retention_size: Some(limit), ..Default::default() };
    // Opening applies retention; so does every maintenance run.
    let blocks_before = {
        let db = Tsdb::open(d.path(), TsdbOptions { block_range: Duration::from_secs(1200), ..Default::default() });
        db.unwrap().blocks().len()
    };
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    db.maintain().unwrap();
    assert!(db.blocks().len() < blocks_before);
    assert!(!db.blocks().is_empty() && db.blocks().disk_bytes() + db.wal_disk_bytes() <= limit);
    assert!(db.blocks().healthy()[0].meta().min_time > oldest);
    assert!(count_samples(&db).await < 4 * 6 * 240);
}

#[tokio::test]
async fn a_damaged_block_is_reported_and_the_rest_is_served() {
    let d = tempfile::tempdir().unwrap();
    let db = blocky(d.path(), 6, None);
    db.maintain().unwrap();
    let victim = db.blocks().healthy()[0].clone();
    let (victim_id, victim_samples) = (victim.id().to_string(), victim.meta().stats.samples as usize);
    drop((db, victim));
    let idx = d.path().join("blocks").join(&victim_id).join("index");
    let mut bytes = std::fs::read(&idx).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(&idx, bytes).unwrap();
    let opts = TsdbOptions { block_range: Duration::from_secs(1200), ..Default::default() };
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    let damaged = db.blocks().damaged();
    assert_eq!(damaged.len(), 1);
    assert_eq!(damaged[0].id, victim_id);
    assert_eq!(count_samples(&db).await, 4 * 6 * 240 - victim_samples);
    // Compaction leaves it alone, and its range stays closed to the head.
    db.maintain().unwrap();
    assert!(d.path().join("blocks").join(&victim_id).exists());
    let s = db.series(&labels("0")).unwrap();
    assert_eq!(db.commit(&[(s, Sample::new(1, 1.0))]).unwrap().rejected.len(), 1);
}

#[tokio::test]
async fn a_head_checkpoint_restores_the_head_and_the_wal_after_it_replays() {
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions { block_range: Duration::from_secs(1200), wal_segment_bytes: 8 << 10, ..Default::default() };
    let in_blocks = {
        let db = blocky(d.path(), 2, None);
        db.maintain().unwrap();
        let stats = db.checkpoint().unwrap();
        assert!(stats.series > 0 && stats.segments_deleted > 0, "{stats:?}");
        // Written after the checkpoint: in the WAL only.
        let s = db.series(&labels("9")).unwrap();
        db.commit(&[(s, Sample::new(2 * 3600 * 1000, 5.0))]).unwrap();
        db.blocks().healthy().iter().map(|b| b.meta().stats.samples as usize).sum::<usize>()
        // dropped without a shutdown: as a crash
    };
    let db = Arc::new(Tsdb::open(d.path(), opts.clone()).unwrap());
    assert!(db.restored_from_checkpoint());
    assert!(d.path().join(CHECKPOINT_FILE).exists(), "a checkpoint stays until a newer one replaces it");
    assert_eq!(count_samples(&db).await, 4 * 2 * 240 + 1);
    assert_eq!(db.metric_type("DCGM_FI_DEV_GPU_UTIL"), MetricType::Unknown);
    // Appends continue where the checkpoint left off.
    let s = db.series(&labels("0")).unwrap();
    let out = db.commit(&[(s.clone(), Sample::new(2 * 3600 * 1000 + 15_000, 1.0))]).unwrap();
    assert_eq!(out.appended, 1);
    let out = db.commit(&[(s, Sample::new(2 * 3600 * 1000 - 30_000, 1.0))]).unwrap();
    assert_eq!(out.rejected.len(), 1, "older than the restored newest sample");
    drop(db);

    // A damaged checkpoint is moved aside, loudly; the blocks and the WAL after it are served.
    let cp = d.path().join(CHECKPOINT_FILE);
    let mut b = std::fs::read(&cp).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x10;
    std::fs::write(&cp, b).unwrap();
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    assert!(!db.restored_from_checkpoint());
    let aside = std::fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with(&format!("{CHECKPOINT_FILE}.damaged-")));
    assert!(aside, "the damaged checkpoint was not kept aside");
    let n = count_samples(&db).await;
    assert!(n >= in_blocks + 2 && n < 4 * 2 * 240, "{n} samples served, {in_blocks} in blocks");
}

#[tokio::test]
async fn labels_are_logged_once_and_a_checkpoint_keeps_them_past_truncation() {
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions {
        block_range: Duration::from_secs(1200),
        wal_segment_bytes: 8 << 10,
        retention: Duration::from_secs(100 * 86400),
        wal_labels_per_segment: true,
        ..Default::default()
    };
    {
        let db = Tsdb::open(d.path(), opts.clone()).unwrap();
        // Many series with long labels, few samples each, over many small segments.
        let series: Vec<_> = (0..200)
            .map(|i| {
                let l = Labels::from_pairs([
                    ("__name__", "DCGM_FI_DEV_GPU_UTIL".to_string()),
                    ("gpu", i.to_string()),
                    ("UUID", format!("GPU-{i:08}-aaaa-bbbb-cccc-dddddddddddd")),
                ]);
                db.series(&l).unwrap()
            })
            .collect();
        for k in 0..4 * 80 {
            let batch: Vec<_> = series.iter().map(|s| (s.clone(), Sample::new(k * 15_000, k as f64))).collect();
            db.commit(&batch).unwrap();
        }
        // Each segment names every reference its samples use, before them, once: a reader
        // that starts in any segment resolves them from the segment alone.
        let wal_dir = d.path().join("wal");
        let segments = crate::wal::list_segments(&wal_dir).unwrap();
        assert!(segments.len() > 4, "{} segments", segments.len());
        for n in segments {
            let mut named = std::collections::HashSet::new();
            let mut r = crate::wal::SegmentReader::open(&crate::wal::segment_path(&wal_dir, n), 0).unwrap();
            while let crate::wal::ReadOutcome::Record(rec) = r.next_record() {
                match rec {
                    WalRecord::Series { series_ref, .. } => {
                        assert!(named.insert(series_ref), "labels twice in segment {n}")
                    }
                    WalRecord::Samples(v) => {
                        assert!(
                            v.iter().all(|(r, _)| named.contains(r)),
                            "segment {n} uses a reference it does not name"
                        )
                    }
                    WalRecord::Chunk { series_ref, .. } => {
                        assert!(named.contains(&series_ref), "segment {n} uses a reference it does not name")
                    }
                    WalRecord::Metadata { .. } => {}
                }
            }
        }
        let out = db.maintain().unwrap();
        assert!(out.blocks_cut > 0 && out.wal_segments_deleted > 0, "{out:?}");
        // A series seen again after the truncation appends under its reference.
        let batch: Vec<_> = series.iter().map(|s| (s.clone(), Sample::new(320 * 15_000, 1.0))).collect();
        db.commit(&batch).unwrap();
    }
    // After a crash (no snapshot): checkpoint, then segments; every series resolves.
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    let req = strata_store::SelectRequest::new(vec![Matcher::eq("__name__", "DCGM_FI_DEV_GPU_UTIL")], 0, i64::MAX);
    let found = strata_store::Store::select(&TsdbStore(db.clone()), &req).await.unwrap();
    assert_eq!(found.len(), 200);
    let n: usize = found.iter().map(|s| s.samples(0, i64::MAX).unwrap().len()).sum();
    assert_eq!(n, 200 * 321);
}

#[tokio::test]
async fn a_crash_between_checkpoint_and_segment_deletion_replays_each_sample_once() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    let want = {
        let db = blocky(d.path(), 6, None);
        // The segments as they are before maintenance deletes some.
        let saved: Vec<(std::path::PathBuf, Vec<u8>)> = crate::wal::list_segments(&wal)
            .unwrap()
            .iter()
            .map(|n| {
                let p = wal.join(format!("{n:08}"));
                let b = std::fs::read(&p).unwrap();
                (p, b)
            })
            .collect();
        let out = db.maintain().unwrap();
        assert!(out.wal_segments_deleted > 0);
        let db = Arc::new(db);
        let want = count_samples(&db).await;
        drop(db);
        // As if the process died after the checkpoint, before deleting what it replaces.
        for (p, b) in saved {
            if !p.exists() {
                std::fs::write(p, b).unwrap();
            }
        }
        want
    };
    let db = Arc::new(
        Tsdb::open(d.path(), TsdbOptions { block_range: Duration::from_secs(1200), ..Default::default() }).unwrap(),
    );
    assert_eq!(count_samples(&db).await, want);
    // The next checkpoint deletes the segments the first one covered.
    let first = db.wal.lock().wal.segments()[0];
    db.checkpoint().unwrap();
    assert!(crate::wal::list_segments(&wal).unwrap().iter().all(|&n| n > first), "covered segments were kept");
}

/// Queries racing cuts and compactions: a range already written is read over and over
/// while later data arrives and maintenance moves the range from head to blocks and merges
/// the blocks. Every read must see each sample once: a read that listed the blocks before a
/// cut and the head after it would miss a window, one across a compaction would double it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_racing_cuts_and_compactions_sees_every_sample_once() {
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions {
        block_range: Duration::from_secs(1200),
        retention: Duration::from_secs(100 * 86400),
        wal_segment_bytes: 64 << 10,
        ..Default::default()
    };
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    let series: Vec<_> = (0..4).map(|g| db.series(&labels(&g.to_string())).unwrap()).collect();
    let append = |from: i64, to: i64| {
        for i in from..to {
            let batch: Vec<_> = series.iter().map(|s| (s.clone(), Sample::new(i * 15_000, 1.0))).collect();
            db.commit(&batch).unwrap();
        }
    };
    // Two hours written before the reads start; the reads ask for exactly those.
    append(0, 480);
    let want = 4 * 480;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (db, done) = (db.clone(), done.clone());
        let series = series.clone();
        std::thread::spawn(move || {
            let mut outcomes = MaintenanceOutcome::default();
            // Ten more hours, maintenance after every simulated minute.
            for i in 480..480 + 2400 {
                let batch: Vec<_> = series.iter().map(|s| (s.clone(), Sample::new(i * 15_000, 1.0))).collect();
                db.commit(&batch).unwrap();
                if i % 4 == 0 {
                    let out = db.maintain().unwrap();
                    outcomes.blocks_cut += out.blocks_cut;
                    outcomes.blocks_compacted += out.blocks_compacted;
                }
            }
            done.store(true, Ordering::Relaxed);
            outcomes
        })
    };
    let store = TsdbStore(db.clone());
    let req =
        strata_store::SelectRequest::new(vec![Matcher::eq("__name__", "DCGM_FI_DEV_GPU_UTIL")], 0, 480 * 15_000 - 1);
    let mut reads = 0;
    while !done.load(Ordering::Relaxed) {
        let found = strata_store::Store::select(&store, &req).await.unwrap();
        let n: usize = found.iter().map(|s| s.samples(0, 480 * 15_000 - 1).unwrap().len()).sum();
        assert_eq!(n, want, "read {reads} saw {n} samples of the first two hours");
        reads += 1;
    }
    let outcomes = writer.join().unwrap();
    assert!(outcomes.blocks_cut >= 20 && outcomes.blocks_compacted >= 4, "{outcomes:?}");
    assert!(reads >= 50, "only {reads} reads raced the maintenance");
}

/// A cut that fails (the blocks directory cannot be written) leaves its window in the head
/// and the next cuts start from it again: once the cause is gone every sample is served,
/// none dropped by a later cut's truncation.
#[tokio::test]
async fn a_failed_cut_loses_nothing_when_maintenance_recovers() {
    let d = tempfile::tempdir().unwrap();
    let db = Arc::new(blocky(d.path(), 3, None));
    let blocks = d.path().join("blocks");
    std::fs::remove_dir_all(&blocks).unwrap();
    std::fs::write(&blocks, b"not a directory").unwrap();
    assert!(db.maintain().is_err());
    assert!(!db.is_healthy());
    assert_eq!(count_samples(&db).await, 4 * 3 * 240, "while cuts fail");
    // More data arrives, and maintenance fails again.
    let series: Vec<_> = (0..4).map(|g| db.series(&labels(&g.to_string())).unwrap()).collect();
    for i in 3 * 240..4 * 240 {
        let batch: Vec<_> = series.iter().map(|s| (s.clone(), Sample::new(i * 15_000, 1.0))).collect();
        db.commit(&batch).unwrap();
    }
    assert!(db.maintain().is_err());
    std::fs::remove_file(&blocks).unwrap();
    std::fs::create_dir(&blocks).unwrap();
    let out = db.maintain().unwrap();
    assert!(out.blocks_cut > 0 && db.is_healthy(), "{out:?}");
    assert_eq!(count_samples(&db).await, 4 * 4 * 240, "after maintenance recovered");
}

#[test]
fn a_block_cut_takes_the_open_chunk_in_the_block_encoding_too() {
    // A flush (or a cut before any sample crossed the boundary) takes the open chunk.
    let d = tempfile::tempdir().unwrap();
    let db = blocky(d.path(), 0, None);
    let s = db.series(&labels("0")).unwrap();
    for i in 0..40 {
        db.commit(&[(s.clone(), Sample::new(i * 15_000, (i % 7) as f64))]).unwrap();
    }
    let chunks = s.chunks_within(0, 1_200_000);
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].n, 40);
    assert!(chunks[0].is_block(), "the open chunk went out in the streaming encoding");
    assert_eq!(chunks[0].decode().unwrap().len(), 40);
}

/// Findings of the storage review: each test reproduces one (see its doc).
mod review;

/// Findings of the edge review (issue 20) that live in storage.
mod edge_review;

/// Samples older than the head admits (its newest cut block's end) but within retention
/// go into blocks of their own with `commit_late`: read back as a query reads, a repeat
/// adds nothing, samples past retention are counted and left out, and compaction folds
/// the late blocks into their window.
#[tokio::test]
async fn late_samples_become_blocks_that_queries_and_compaction_merge() {
    use strata_store::Store;
    let d = tempfile::tempdir().unwrap();
    let opts = TsdbOptions {
        block_range: Duration::from_secs(600),
        retention: Duration::from_secs(86400),
        ..Default::default()
    };
    let db = Arc::new(Tsdb::open(d.path(), opts).unwrap());
    let now = strata_model::time::now_ms();
    let t0 = now - 3 * 3600 * 1000;
    let a = db.series(&labels("a")).unwrap();
    // Series a spans three hours: blocks are cut, the floor moves up.
    for k in 0..=720 {
        db.commit(&[(a.clone(), Sample::new(t0 + k * 15_000, k as f64))]).unwrap();
    }
    assert!(db.maintain().unwrap().blocks_cut > 0);
    // Series b's backlog from the first hour comes now: the head refuses it.
    let b = db.series(&labels("b")).unwrap();
    let backlog: Vec<Sample> = (0..240).map(|k| Sample::new(t0 + k * 15_000 + 7, 0.5 + k as f64)).collect();
    let out = db.commit(&backlog.iter().map(|s| (b.clone(), *s)).collect::<Vec<_>>()).unwrap();
    assert_eq!(out.rejected.len(), 240, "the head took samples below its floor");
    let too_old = Sample::new(now - 2 * 86400 * 1000, 1.0);
    let mut late_input = vec![(labels("b"), backlog.clone())];
    late_input.push((labels("c"), vec![too_old]));
    let late = db.commit_late(&late_input).unwrap();
    assert_eq!((late.written, late.too_old, late.not_late), (240, 1, 0), "{late:?}");
    assert!(late.blocks >= 6, "one block per 10-minute window: {late:?}");
    // Sent again (an acknowledgement lost): nothing changes for a reader.
    db.commit_late(&late_input[..1]).unwrap();
    let read = |db: &Arc<Tsdb>| {
        let store = TsdbStore(db.clone());
        let req = strata_store::SelectRequest::new(vec![Matcher::eq("gpu", "b")], i64::MIN, i64::MAX);
        async move { store.select(&req).await.unwrap() }
    };
    let got = read(&db).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].samples(i64::MIN, i64::MAX).unwrap(), backlog);
    // Compaction folds the small blocks; the data reads the same.
    let before = db.blocks().len();
    db.compact().unwrap();
    assert!(db.blocks().len() < before, "{} blocks before, {} after", before, db.blocks().len());
    assert_eq!(read(&db).await[0].samples(i64::MIN, i64::MAX).unwrap(), backlog);
    // A late block for a window compaction already filled is folded into it too.
    let compacted = db.blocks().len();
    let more = vec![(labels("b"), vec![Sample::new(t0 + 3, 9.0)])];
    assert_eq!(db.commit_late(&more).unwrap().written, 1);
    assert_eq!(db.blocks().len(), compacted + 1);
    db.compact().unwrap();
    assert_eq!(db.blocks().len(), compacted, "the late block stayed apart from its compacted window");
    let mut with_more = backlog.clone();
    with_more.insert(0, Sample::new(t0 + 3, 9.0));
    assert_eq!(read(&db).await[0].samples(i64::MIN, i64::MAX).unwrap(), with_more);
    let backlog = with_more;
    // And after a restart.
    drop(db);
    let db = Arc::new(open(d.path()));
    assert_eq!(read(&db).await[0].samples(i64::MIN, i64::MAX).unwrap(), backlog);
}
