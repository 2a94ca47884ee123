use super::*;
use strata_model::Labels;

fn series(r: SeriesRef, gpu: &str) -> WalRecord {
    WalRecord::Series { series_ref: r, labels: Labels::from_pairs([("__name__", "m"), ("gpu", gpu)]) }
}

fn samples(r: SeriesRef, from: i64, n: i64) -> WalRecord {
    WalRecord::Samples((0..n).map(|i| (r, Sample::new(from + i, i as f64 * 0.5))).collect())
}

fn collect(dir: &Path) -> (Vec<WalRecord>, ReplayStats) {
    let mut v = Vec::new();
    let st = replay(dir, |r| v.push(r)).expect("replay never fails on damage");
    (v, st)
}

fn write_three(dir: &Path) -> Vec<WalRecord> {
    let recs = vec![series(1, "0"), samples(1, 1000, 10), samples(1, 2000, 10)];
    let mut w = Wal::open(dir, SyncPolicy::Always).unwrap();
    w.log(&recs[..1]).unwrap();
    w.log(&recs[1..2]).unwrap();
    w.log(&recs[2..]).unwrap();
    recs
}

#[test]
fn records_roundtrip() {
    let d = tempfile::tempdir().unwrap();
    let recs = vec![
        series(7, "3"),
        samples(7, -5, 4),
        WalRecord::Metadata {
            family: "m".into(),
            meta: Metadata { metric_type: MetricType::Counter, help: "h\nx".into(), unit: "joules".into() },
        },
    ];
    let mut w = Wal::open(d.path(), SyncPolicy::Interval(Duration::from_secs(1))).unwrap();
    w.log(&recs).unwrap();
    drop(w);
    let (got, st) = collect(d.path());
    assert_eq!(got, recs);
    assert_eq!(st.damaged_segments, 0);
}

#[test]
fn truncated_last_record_replays_up_to_the_damage() {
    let d = tempfile::tempdir().unwrap();
    let recs = write_three(d.path());
    let seg = segment_path(d.path(), 0);
    let len = fs::metadata(&seg).unwrap().len();
    OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 5).unwrap();
    let (got, st) = collect(d.path());
    assert_eq!(got, recs[..2].to_vec());
    assert_eq!(st.damaged_segments, 1);
    // the torn tail was cut: a second replay is clean and identical
    let (again, st2) = collect(d.path());
    assert_eq!(again, got);
    assert_eq!(st2.damaged_segments, 0);
}

#[test]
fn flipped_byte_replays_up_to_the_damage() {
    let d = tempfile::tempdir().unwrap();
    let recs = write_three(d.path());
    let seg = segment_path(d.path(), 0);
    let mut bytes = fs::read(&seg).unwrap();
    // flip a byte inside the second record's payload
    let mut probe = Vec::new();
    recs[0].encode(&mut probe);
    let second_at = SEGMENT_MAGIC.len() + probe.len();
    bytes[second_at + 20] ^= 0x40;
    fs::write(&seg, &bytes).unwrap();
    let (got, st) = collect(d.path());
    assert_eq!(got, recs[..1].to_vec());
    assert_eq!(st.damaged_segments, 1);
    // The segment as it was is kept aside, byte for byte, before it is cut.
    let kept = d.path().join(QUARANTINE_DIR).join(format!("{:08}-at-{}", 0, second_at));
    assert_eq!(fs::read(&kept).unwrap(), bytes, "the damaged segment was not kept aside");
    assert!(fs::metadata(&seg).unwrap().len() < bytes.len() as u64);
}

#[test]
fn damage_in_one_segment_does_not_hide_the_next() {
    let d = tempfile::tempdir().unwrap();
    write_three(d.path());
    // a second writer opens segment 1
    let mut w = Wal::open(d.path(), SyncPolicy::Always).unwrap();
    w.log(&[series(1, "0"), samples(1, 5000, 3)]).unwrap();
    drop(w);
    let seg0 = segment_path(d.path(), 0);
    let mut bytes = fs::read(&seg0).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0xff;
    fs::write(&seg0, &bytes).unwrap();
    let (got, _) = collect(d.path());
    assert_eq!(got.last(), Some(&samples(1, 5000, 3)));
}

#[test]
fn garbage_file_is_not_fatal() {
    let d = tempfile::tempdir().unwrap();
    fs::write(segment_path(d.path(), 0), b"not a wal segment at all").unwrap();
    let (got, st) = collect(d.path());
    assert!(got.is_empty());
    assert_eq!(st.damaged_segments, 1);
}

#[test]
fn rotation_and_deletion_before_a_segment_spare_the_current_and_the_held() {
    let d = tempfile::tempdir().unwrap();
    let mut w = Wal::open(d.path(), SyncPolicy::Interval(Duration::from_secs(1))).unwrap().with_segment_bytes(1024);
    for i in 0..20 {
        w.rotate_if_full().unwrap();
        w.log(&[series(1, "0"), samples(1, i * 100, 50)]).unwrap();
    }
    let before = list_segments(d.path()).unwrap();
    assert!(before.len() > 3, "rotated into {} segments", before.len());
    w.hold_from(Some(before[1]));
    assert_eq!(w.delete_before(before[3]).unwrap(), 1, "the hold keeps the second segment on");
    w.hold_from(None);
    assert_eq!(w.delete_before(before[3]).unwrap(), 2);
    assert_eq!(list_segments(d.path()).unwrap(), before[3..]);
    // Never the current segment, whatever is asked.
    let current = w.current_segment();
    w.delete_before(u32::MAX).unwrap();
    assert_eq!(list_segments(d.path()).unwrap(), [current]);
}

#[test]
fn decimal_readings_take_their_scaled_integer_and_every_value_replays_bit_for_bit() {
    let d = tempfile::tempdir().unwrap();
    let mut w = Wal::open(d.path(), SyncPolicy::Always).unwrap();
    // A scrape of 1000 power readings with three decimals.
    let power: Vec<(SeriesRef, Sample)> = (0..1000u64)
        .map(|r| (r + 1, Sample::new(1_700_000_000_000, 250.0 + (r * 7919 % 100_000) as f64 / 1000.0)))
        .collect();
    let odd = vec![
        (1u64, Sample::new(1, f64::from_bits(0x7ff0_0000_0000_0002))), // a staleness-like NaN
        (2, Sample::new(2, -0.0)),
        (3, Sample::new(3, 0.1 + 0.2)),
        (4, Sample::new(4, f64::INFINITY)),
        (5, Sample::new(5, 1e300)),
        (6, Sample::new(6, -123_456.789_012)),
        (7, Sample::new(7, 9_007_199_254_740_993.0)),
    ];
    w.log(&[WalRecord::Samples(power.clone())]).unwrap();
    let on_disk = fs::metadata(segment_path(d.path(), 0)).unwrap().len() as usize;
    // Reference and time deltas take a byte each, the scaled value four: not the 11 of raw bits.
    assert!(on_disk < 1000 * 7 + 64, "{on_disk} bytes on disk for 1000 three-decimal readings");
    w.log(&[WalRecord::Samples(odd.clone())]).unwrap();
    let (got, st) = collect(d.path());
    assert_eq!(st.damaged_segments, 0);
    let bits = |v: &[(SeriesRef, Sample)]| v.iter().map(|(r, s)| (*r, s.t, s.v.to_bits())).collect::<Vec<_>>();
    match (&got[0], &got[1]) {
        (WalRecord::Samples(a), WalRecord::Samples(b)) => {
            assert_eq!(bits(a), bits(&power));
            assert_eq!(bits(b), bits(&odd));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn reader_resumes_from_a_cursor_across_segments() {
    let d = tempfile::tempdir().unwrap();
    let mut w = Wal::open(d.path(), SyncPolicy::Always).unwrap().with_segment_bytes(1024);
    let mut all = Vec::new();
    for i in 0..10 {
        w.rotate_if_full().unwrap();
        let r = samples(1, i * 100, 40);
        w.log(std::slice::from_ref(&r)).unwrap();
        all.push(r);
    }
    let mut reader = WalReader::new(d.path(), WalCursor { segment: 0, offset: 0 });
    let mut first_three = Vec::new();
    let mut cursor = reader.cursor();
    for _ in 0..3 {
        let (rec, c) = reader.next_record().unwrap().unwrap();
        first_three.push(rec);
        cursor = c;
    }
    assert_eq!(first_three, all[..3].to_vec());
    // a new reader from the saved cursor sees exactly the rest
    let mut resumed = WalReader::new(d.path(), cursor);
    let mut rest = Vec::new();
    while let Some((rec, _)) = resumed.next_record().unwrap() {
        rest.push(rec);
    }
    assert_eq!(rest, all[3..].to_vec());
    // and picks up what is appended later
    let extra = samples(1, 99_999, 2);
    w.log(std::slice::from_ref(&extra)).unwrap();
    assert_eq!(resumed.next_record().unwrap().map(|x| x.0), Some(extra));
}

#[test]
fn random_segments_replay_without_panicking() {
    let d = tempfile::tempdir().unwrap();
    let mut x = 12345u64;
    for n in 0..50u32 {
        let mut bytes = SEGMENT_MAGIC.to_vec();
        let len = 16 + (n as usize * 37) % 400;
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bytes.push(x as u8);
        }
        // a few plausible headers among the noise
        if n % 3 == 0 {
            bytes[8..12].copy_from_slice(&20u32.to_le_bytes());
        }
        fs::write(segment_path(d.path(), n), &bytes).unwrap();
    }
    let (_, st) = collect(d.path());
    assert_eq!(st.segments, 50);
}

#[test]
fn a_record_over_the_replay_limit_is_never_written() {
    let d = tempfile::tempdir().unwrap();
    let mut w = Wal::open(d.path(), SyncPolicy::Always).unwrap();
    w.log(&[series(1, "0")]).unwrap();
    let before = fs::metadata(segment_path(d.path(), 0)).unwrap().len();
    let huge = "x".repeat(MAX_RECORD_BYTES as usize + 1);
    let rec =
        WalRecord::Series { series_ref: 2, labels: Labels::from_pairs([("__name__", "m"), ("big", huge.as_str())]) };
    assert!(matches!(w.log(&[series(3, "1"), rec]), Err(WalError::RecordTooLarge { .. })));
    assert_eq!(fs::metadata(segment_path(d.path(), 0)).unwrap().len(), before, "part of a refused batch was written");
    w.log(&[samples(1, 0, 3)]).unwrap();
    drop(w);
    let (got, st) = collect(d.path());
    assert_eq!(got, vec![series(1, "0"), samples(1, 0, 3)]);
    assert_eq!(st.damaged_segments, 0);
}

/// Frames `payload` as a record whose checksum is right, whatever the payload holds.
fn framed(ty: u8, payload: &[u8]) -> Vec<u8> {
    let mut body = vec![ty];
    body.extend_from_slice(payload);
    let mut out = (body.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

#[test]
fn records_with_a_valid_checksum_and_garbage_inside_replay_without_panicking() {
    let d = tempfile::tempdir().unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for n in 0..40u32 {
        let mut bytes = SEGMENT_MAGIC.to_vec();
        for _ in 0..20 {
            let ty = (next() % 4) as u8;
            let len = (next() % 64) as usize;
            let mut payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Now and then extreme varints: huge counts, references and lengths.
            if next() % 4 == 0 {
                payload.splice(0..0, [0xff; 9].iter().copied().chain([0x01]));
            }
            bytes.extend(framed(ty, &payload));
        }
        fs::create_dir_all(d.path().join("wal")).unwrap();
        fs::write(segment_path(&d.path().join("wal"), n), &bytes).unwrap();
    }
    // The database replays the garbage without panicking, and takes writes after it.
    let db = crate::Tsdb::open(d.path(), crate::TsdbOptions::default()).expect("opens");
    let s = db.series(&Labels::from_pairs([("__name__", "after")])).unwrap();
    let now = strata_model::time::now_ms();
    assert_eq!(db.commit(&[(s, Sample::new(now, 1.0))]).unwrap().appended, 1);
    drop(db);
    let (_, st) = collect(&d.path().join("wal"));
    assert!(st.segments >= 40);
}

#[test]
fn a_well_formed_record_with_extreme_values_replays() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    let mut w = Wal::open(&wal, SyncPolicy::Always).unwrap();
    w.log(&[series(u64::MAX, "0"), samples(u64::MAX, i64::MAX - 5, 3), samples(u64::MAX - 1, i64::MIN, 2)]).unwrap();
    drop(w);
    let db = crate::Tsdb::open(d.path(), crate::TsdbOptions::default()).expect("opens");
    // The far-future samples are skipped; the series exists and new series still get refs.
    assert_eq!(db.head().max_time(), i64::MIN);
    let s = db.series(&Labels::from_pairs([("__name__", "new")])).unwrap();
    assert_eq!(db.commit(&[(s, Sample::new(strata_model::time::now_ms(), 1.0))]).unwrap().appended, 1);
}

#[test]
fn the_compact_samples_record_keeps_every_value_bit_for_bit() {
    let values = [
        0.0,
        -0.0,
        1.0,
        -7.0,
        42.5,
        1e15,
        9_007_199_254_740_993.0,
        -9_007_199_254_740_992.0,
        f64::NAN,
        strata_model::stale_nan(),
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MIN_POSITIVE,
        123_456_789_012.0,
    ];
    let samples: Vec<(u64, Sample)> = values
        .iter()
        .enumerate()
        .map(|(i, &v)| ((1000 - i as u64 * 37) % 977, Sample::new(1_700_000_000_000 + (i as i64 % 3) * 5000 - 7, v)))
        .collect();
    let mut buf = Vec::new();
    WalRecord::Samples(samples.clone()).encode(&mut buf);
    let ty = buf[8];
    let back = WalRecord::decode(ty, &buf[9..]).expect("decodes");
    let WalRecord::Samples(got) = back else { panic!("a samples record") };
    assert_eq!(got.len(), samples.len());
    for ((r1, s1), (r2, s2)) in samples.iter().zip(&got) {
        assert_eq!((r1, s1.t, s1.v.to_bits()), (r2, s2.t, s2.v.to_bits()));
    }
    // A scrape of whole numbers takes a few bytes a sample, not 13.
    let scrape: Vec<(u64, Sample)> = (0..1000).map(|r| (r, Sample::new(1_700_000_000_000, (r % 90) as f64))).collect();
    let mut buf = Vec::new();
    WalRecord::Samples(scrape).encode(&mut buf);
    assert!(buf.len() < 4 * 1000, "{} bytes for 1000 samples", buf.len());
}
