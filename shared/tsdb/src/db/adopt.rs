//! Whole chunks: a backlog forwarded from another tier arrives as sealed chunks, and
//! appending their samples one by one (a WAL entry and a chunk append per sample) would
//! cost the receiver most of what catching up costs. A chunk that starts after its
//! series' newest sample, inside the admissible time range and one block-range window, is
//! logged as one WAL record and taken by the head as it came; a series' first chunk with
//! too few samples to be worth that (cut by its sender at a block boundary) is appended
//! in its place, so the chunks after it are still taken. Everything else (a chunk that
//! overlaps what is stored, one older than the head admits) goes through
//! [`Tsdb::commit`] sample by sample, so duplicates, conflicts and late samples are
//! judged exactly as for samples.

use super::{Tsdb, TsdbError};
use crate::head::{MemSeries, OpenContinuation, SeriesSamples};
use crate::wal::WalRecord;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use strata_chunk::Chunk;
use strata_model::time::now_ms;
use strata_model::Sample;

/// Fewer samples than this are appended one by one: a chunk's header and the coder's
/// warm-up would cost more than its samples.
const MIN_SAMPLES: usize = 16;

/// Bytes a chunk may take per sample to be kept as it came: far above what any sample
/// costs in either encoding (about 20 bytes at worst), so a chunk padded with bytes its
/// decoder never reads is appended sample by sample (re-encoded) instead of filling the
/// head, the WAL and the blocks with them.
const MAX_BYTES_PER_SAMPLE: usize = 32;

/// Whether a chunk is kept as it came rather than appended sample by sample (see the
/// constants above; every reader of a WAL chunk record takes what this lets through).
fn worth_keeping(c: &Chunk) -> bool {
    let n = usize::from(c.n);
    (MIN_SAMPLES..=usize::from(strata_chunk::CHUNK_MAX_SAMPLES)).contains(&n)
        && c.data.len() <= 64 + MAX_BYTES_PER_SAMPLE * n
}

/// One series' chunks, in time order and apart, with their samples decoded and checked
/// against each chunk's header ([`Chunk::decode_checked`]), in the same order.
pub struct WholeChunks {
    pub series: Arc<MemSeries>,
    pub chunks: Vec<Chunk>,
    pub samples: Vec<Sample>,
    /// After the chunks: the sender's open chunk as it holds it (see
    /// [`SeriesSamples::continuation`]); not decoded yet.
    ///
    /// [`SeriesSamples::continuation`]: crate::head::SeriesSamples::continuation
    pub open: Option<OpenChunk>,
}

/// A sender's open chunk, of which the samples within `[from, through]` are sent: those
/// before `from` its receiver holds already.
pub struct OpenChunk {
    pub chunk: Chunk,
    pub from: i64,
    pub through: i64,
}

/// What becomes of a series' open chunk.
enum OpenOutcome {
    Continue(Box<OpenContinuation>),
    /// Its samples, judged one by one.
    Samples(Vec<Sample>),
    /// It holds nothing new up to its bound.
    Nothing,
}

/// What [`Tsdb::commit_chunks`] did.
#[derive(Default)]
pub struct AdoptOutcome {
    /// Samples stored within the chunks taken whole, or appended in a small chunk's place.
    pub adopted: usize,
    /// Chunks taken whole.
    pub chunks: usize,
    /// The samples of the chunks not taken, for [`Tsdb::commit`].
    pub rest: Vec<(Arc<MemSeries>, Sample)>,
    /// Open chunks that continued a series' open chunk (or began a new one).
    pub continued: usize,
    /// The first and last timestamps of the open chunks' samples taken or handed back.
    pub open_span: Option<(i64, i64)>,
    /// Open chunks whose bits do not decode: the series and why. Nothing of them is
    /// stored.
    pub damaged: Vec<(Arc<MemSeries>, String)>,
}

impl AdoptOutcome {
    fn widen_open_span(&mut self, first: i64, last: i64) {
        self.open_span = Some(self.open_span.map_or((first, last), |(a, z)| (a.min(first), z.max(last))));
    }
}

/// An open chunk that is not continued: its samples within its bounds, decoded whole and
/// judged one by one; a chunk that does not decode is noted as damaged.
fn one_by_one(o: &OpenChunk, series: &Arc<MemSeries>, damaged: &mut Vec<(Arc<MemSeries>, String)>) -> OpenOutcome {
    let mut v = Vec::new();
    match o.chunk.decode_bounded(o.from, o.through, &mut v) {
        Ok(()) => OpenOutcome::Samples(v),
        Err(e) => {
            damaged.push((series.clone(), format!("its open chunk: {e}")));
            OpenOutcome::Nothing
        }
    }
}

impl Tsdb {
    /// Stores each chunk it can take whole (see the module) and hands back the samples of
    /// the others. A series' chunks are taken in order up to the first that cannot be;
    /// that one and the ones after it go back as samples, so their order is kept. A chunk
    /// in order but not worth keeping as it came (a few samples its sender cut at a block
    /// boundary) has its samples appended in its place, so the chunks after it are still
    /// taken whole.
    pub fn commit_chunks(&self, batch: Vec<WholeChunks>) -> Result<AdoptOutcome, TsdbError> {
        let mut out = AdoptOutcome::default();
        let mut writer = self.wal.lock();
        let wal = &mut writer.wal;
        let rotated = wal.rotate_if_full()?;
        let segment = wal.current_segment();
        let now = now_ms();
        let (min_valid, max_valid) = (self.min_valid_time(now), self.max_valid_time(now));
        let range = self.block_range_ms();
        let mut records = self.segment_start_records(rotated);
        // Per series: how many of its chunks are taken, their newest samples, and whether
        // each is kept whole (else its samples are appended).
        let mut taken: Vec<Vec<(Sample, bool)>> = Vec::with_capacity(batch.len());
        // Per series: what becomes of its open chunk (decided, and decoded, before anything
        // is written).
        let mut opens: Vec<OpenOutcome> = Vec::with_capacity(batch.len());
        for w in &batch {
            let mut lasts = Vec::new();
            let mut open = OpenOutcome::Nothing;
            if !w.series.is_removed() {
                let mut g = w.series.samples.lock();
                // The WAL lock is held: nothing appends to the series until this is done,
                // so each chunk is judged against the newest sample before it.
                let mut newest = g.last();
                let mut end = 0;
                for c in &w.chunks {
                    let start = end;
                    end += usize::from(c.n);
                    let Some(&last) = w.samples.get(end.wrapping_sub(1)) else { break };
                    let fits = newest.is_none_or(|l| c.min_t > l.t)
                        && last.t == c.max_t
                        && c.min_t >= min_valid
                        && c.max_t <= max_valid
                        && g.can_adopt(c, range);
                    let whole = worth_keeping(c);
                    // In its place only as a series' first chunk (the few samples its sender
                    // cut at a block boundary), and in order: at most one per series, so a
                    // batch's appends stay within its samples (the receiver's bound).
                    let in_place = !whole
                        && lasts.is_empty()
                        && w.samples.get(start..end).is_some_and(|s| {
                            s.first().is_some_and(|f| f.t == c.min_t) && s.windows(2).all(|p| p[0].t < p[1].t)
                        });
                    if !fits || !(whole || in_place) {
                        break;
                    }
                    newest = Some(last);
                    lasts.push((last, whole));
                }
                if !lasts.is_empty() {
                    if self.labels_due(&w.series, segment) {
                        records.push(WalRecord::Series {
                            series_ref: w.series.series_ref,
                            labels: w.series.labels.clone(),
                        });
                    }
                    let mut start = 0;
                    for (c, &(last, whole)) in w.chunks.iter().zip(&lasts) {
                        let end = start + usize::from(c.n);
                        let series_ref = w.series.series_ref;
                        records.push(if whole {
                            WalRecord::Chunk { series_ref, chunk: c.clone(), last }
                        } else {
                            WalRecord::Samples(w.samples[start..end].iter().map(|&s| (series_ref, s)).collect())
                        });
                        start = end;
                    }
                }
                if let Some(o) = w.open.as_ref().filter(|_| lasts.len() == w.chunks.len()) {
                    // After chunks taken in this batch the open chunk can only begin anew.
                    let after_taken = lasts.last().is_none_or(|l| o.chunk.min_t > l.0.t);
                    let k = match lasts.last() {
                        _ if !after_taken => Ok(None),
                        None => g.continuation(&o.chunk, o.through, range),
                        // Begun anew after them (what the series holds now is not before it).
                        Some(&(after, _)) => SeriesSamples::begun_anew(&o.chunk, o.through, range, after),
                    };
                    open = match k {
                        Ok(Some(k)) if k.samples.is_empty() => OpenOutcome::Nothing,
                        Ok(Some(k))
                            if (lasts.is_empty() || k.fresh)
                                && k.samples.first().is_some_and(|f| f.t >= min_valid)
                                && k.samples.last().is_some_and(|l| l.t <= max_valid) =>
                        {
                            if let Some(&last) = k.samples.last() {
                                if lasts.is_empty() && self.labels_due(&w.series, segment) {
                                    records.push(WalRecord::Series {
                                        series_ref: w.series.series_ref,
                                        labels: w.series.labels.clone(),
                                    });
                                }
                                let chunk = k.appender.seal();
                                records.push(WalRecord::Chunk { series_ref: w.series.series_ref, chunk, last });
                            }
                            OpenOutcome::Continue(Box::new(k))
                        }
                        // Too old or too new for the head: judged one by one (so counted),
                        // from the sender's bound on.
                        Ok(Some(k)) => OpenOutcome::Samples(k.samples.into_iter().filter(|s| s.t >= o.from).collect()),
                        Ok(None) => one_by_one(o, &w.series, &mut out.damaged),
                        Err(e) => {
                            out.damaged.push((w.series.clone(), format!("its open chunk: {e}")));
                            OpenOutcome::Nothing
                        }
                    };
                } else if let Some(o) = &w.open {
                    // Its chunks were not all taken: its samples follow theirs, one by one.
                    open = one_by_one(o, &w.series, &mut out.damaged);
                }
            } else if let Some(o) = &w.open {
                // Gone from the head meanwhile: its samples revive it in `commit`.
                open = one_by_one(o, &w.series, &mut out.damaged);
            }
            taken.push(lasts);
            opens.push(open);
        }
        if !out.damaged.is_empty() {
            return Ok(out);
        }
        if !records.is_empty() {
            let start = wal.cursor();
            let logged = wal.log(&records);
            let oldest = records
                .iter()
                .filter_map(|r| match r {
                    WalRecord::Chunk { chunk, .. } => Some(chunk.min_t),
                    WalRecord::Samples(s) => s.iter().map(|x| x.1.t).min(),
                    _ => None,
                })
                .min()
                .unwrap_or(i64::MAX);
            // Written but not synced, the records are in the file: noted all the same.
            let end = wal.cursor();
            if end != start {
                writer.times.note(start, end, oldest);
            }
            if let Err(e) = logged {
                self.wal_failed.store(true, Ordering::Relaxed);
                return Err(e.into());
            }
            self.wal_failed.store(false, Ordering::Relaxed);
        }
        for ((w, lasts), open) in batch.into_iter().zip(taken).zip(opens) {
            let (mut stored, chunks_taken) = (0, lasts.len());
            let continued = matches!(open, OpenOutcome::Continue(_));
            // Only a series something is applied to is locked.
            let mut g = (!lasts.is_empty() || continued).then(|| {
                w.series.logged_segment.store(segment, Ordering::Relaxed);
                w.series.samples.lock()
            });
            let mut whole_taken = 0;
            if let Some(g) = g.as_mut() {
                for (c, (last, whole)) in w.chunks.into_iter().zip(lasts) {
                    let n = usize::from(c.n);
                    self.head.note_time(c.min_t);
                    self.head.note_time(c.max_t);
                    if whole {
                        g.adopt(c, last);
                        whole_taken += 1;
                    } else {
                        // (In bounds: the decision read the chunk's last sample there.)
                        let samples = w.samples.get(stored..stored + n).unwrap_or_default();
                        debug_assert_eq!(samples.len(), n);
                        for &s in samples {
                            g.append(s, range);
                        }
                    }
                    stored += n;
                }
            }
            debug_assert!(whole_taken <= chunks_taken);
            out.adopted += stored;
            out.chunks += whole_taken;
            out.rest.extend(w.samples.into_iter().skip(stored).map(|s| (w.series.clone(), s)));
            match open {
                OpenOutcome::Continue(k) => {
                    if let (Some(f), Some(l)) = (k.samples.first(), k.samples.last()) {
                        self.head.note_time(f.t);
                        self.head.note_time(l.t);
                        out.widen_open_span(f.t, l.t);
                    }
                    out.adopted += k.samples.len();
                    out.continued += 1;
                    if let Some(g) = g.as_mut() {
                        g.continue_open(*k);
                    }
                }
                OpenOutcome::Samples(v) => {
                    if let (Some(f), Some(l)) = (v.first(), v.last()) {
                        out.widen_open_span(f.t, l.t);
                    }
                    out.rest.extend(v.into_iter().map(|s| (w.series.clone(), s)));
                }
                OpenOutcome::Nothing => {}
            }
        }
        drop(writer);
        self.metrics.samples_appended.inc_by(out.adopted as u64);
        self.metrics.chunks_adopted.inc_by(out.chunks as u64);
        self.metrics.chunks_continued.inc_by(out.continued as u64);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::TsdbOptions;
    use strata_model::matcher::Matcher;
    use strata_model::Labels;

    fn whole(series: &Arc<MemSeries>, samples: &[Sample]) -> WholeChunks {
        let chunks = Chunk::encode_sealed(samples);
        let mut decoded = Vec::new();
        for c in &chunks {
            c.decode_checked(&mut decoded).unwrap();
        }
        WholeChunks { series: series.clone(), chunks, samples: decoded, open: None }
    }

    fn stored(db: &Tsdb) -> (Vec<Sample>, usize) {
        let found = db.head().select(&[Matcher::eq("gpu", "0")], i64::MIN, i64::MAX);
        let chunks: Vec<_> = found.iter().flat_map(|(_, cs)| cs.iter().cloned()).collect();
        (chunks.iter().flat_map(|c| c.decode().unwrap()).collect(), chunks.len())
    }

    /// A database that keeps everything (the tests' timestamps are from 1970).
    fn open(dir: &std::path::Path) -> Tsdb {
        Tsdb::open(
            dir,
            TsdbOptions { retention: std::time::Duration::from_secs(10 * 365 * 86400), ..Default::default() },
        )
        .unwrap()
    }

    fn gpu0() -> Labels {
        Labels::from_pairs([("__name__", "m"), ("gpu", "0")])
    }

    fn at(from: i64, to: i64, v: impl Fn(i64) -> f64) -> Vec<Sample> {
        (from..to).map(|i| Sample::new(1_000_000 + i * 5000, v(i))).collect()
    }

    /// A chunk after the series' newest sample is stored as it came and replays so after a
    /// crash; one that overlaps what is stored comes back as samples, and what it repeats
    /// or contradicts is judged as any sample is.
    #[test]
    fn a_chunk_after_the_newest_sample_is_taken_whole_and_an_overlapping_one_as_samples() {
        let d = tempfile::tempdir().unwrap();
        let labels = gpu0();
        let value = |i: i64| (i % 7) as f64;
        {
            let db = open(d.path());
            let s = db.series(&labels).unwrap();
            let first: Vec<_> = at(0, 100, value).into_iter().map(|x| (s.clone(), x)).collect();
            assert_eq!(db.commit(&first).unwrap().appended, 100);
            let out = db.commit_chunks(vec![whole(&s, &at(100, 200, value))]).unwrap();
            assert_eq!((out.adopted, out.rest.len()), (100, 0));
            // Taken whole: the open chunk was sealed before it, and it follows as it came.
            assert_eq!(stored(&db), (at(0, 200, value), 2));
            // Overlapping: 50 already stored (one with another value), 50 new.
            let mut again = at(150, 250, value);
            again[10].v += 1.0;
            let out = db.commit_chunks(vec![whole(&s, &again)]).unwrap();
            assert_eq!((out.adopted, out.rest.len()), (0, 100));
            let c = db.commit(&out.rest).unwrap();
            assert_eq!((c.appended, c.ignored_duplicates, c.rejected.len()), (50, 49, 1));
            // Older than the newest stored sample and not stored as it is: refused, as
            // `commit` refuses any such sample.
            assert_eq!(c.rejected[0].2, crate::head::SampleError::OutOfOrder);
            assert_eq!(stored(&db).0, at(0, 250, value));
            // Dropped without a sync, as after SIGKILL.
        }
        let db = open(d.path());
        assert_eq!(stored(&db).0, at(0, 250, value));
        let s = db.series(&labels).unwrap();
        // The chunk record replayed whole: appends and chunks continue after it.
        assert_eq!(db.commit_chunks(vec![whole(&s, &at(250, 300, value))]).unwrap().adopted, 50);
        assert_eq!(db.commit(&[(s.clone(), Sample::new(1_000_000 + 300 * 5000, 1.0))]).unwrap().appended, 1);
        let mut want = at(0, 300, value);
        want.push(Sample::new(1_000_000 + 300 * 5000, 1.0));
        assert_eq!(stored(&db).0, want);
    }

    /// A handful of samples its sender cut at a block boundary, then full chunks: the few
    /// are appended in their place (not worth a chunk of their own), and the chunks after
    /// them are still taken whole; a crash replays both.
    #[test]
    fn a_small_first_chunk_is_appended_and_the_chunks_after_it_taken_whole() {
        let d = tempfile::tempdir().unwrap();
        let labels = gpu0();
        let value = |i: i64| (i % 11) as f64;
        let samples = at(0, 250, value);
        let mut chunks = Chunk::encode_sealed(&samples[..6]);
        chunks.extend(Chunk::encode_sealed(&samples[6..]));
        assert_eq!(chunks.len(), 2, "six samples, then a chunk of the rest");
        assert!(!worth_keeping(&chunks[0]));
        {
            let db = open(d.path());
            let s = db.series(&labels).unwrap();
            let mut decoded = Vec::new();
            for c in &chunks {
                c.decode_checked(&mut decoded).unwrap();
            }
            let w = WholeChunks { series: s.clone(), chunks: chunks.clone(), samples: decoded, open: None };
            let out = db.commit_chunks(vec![w]).unwrap();
            assert_eq!((out.adopted, out.chunks, out.rest.len()), (250, 1, 0));
            assert_eq!(stored(&db).0, samples);
            // A small chunk out of order (before what is stored) still goes back as samples.
            let late = Chunk::encode_sealed(&at(-10, -4, value));
            let mut decoded = Vec::new();
            late[0].decode_checked(&mut decoded).unwrap();
            let w = WholeChunks { series: s.clone(), chunks: late, samples: decoded, open: None };
            let out = db.commit_chunks(vec![w]).unwrap();
            assert_eq!((out.adopted, out.chunks, out.rest.len()), (0, 0, 6));
        }
        let db = open(d.path());
        assert_eq!(stored(&db).0, samples, "replayed after a crash");
        // Only a series' first chunk goes in its place: a small one after it stops the
        // taking, as before (it and what follows judged as samples).
        let s = db.series(&labels).unwrap();
        let more = at(250, 300, value);
        let mut chunks = Chunk::encode_sealed(&more[..30]);
        chunks.extend(Chunk::encode_sealed(&more[30..33]));
        chunks.extend(Chunk::encode_sealed(&more[33..]));
        let mut decoded = Vec::new();
        for c in &chunks {
            c.decode_checked(&mut decoded).unwrap();
        }
        let out = db.commit_chunks(vec![WholeChunks { series: s, chunks, samples: decoded, open: None }]).unwrap();
        assert_eq!((out.adopted, out.chunks, out.rest.len()), (30, 1, 20));
    }

    /// A series with samples in its open chunk gets a small first chunk (appended after
    /// them), a chunk taken whole and the sender's open chunk: every sample stored once, in
    /// order, and replayed so.
    #[test]
    fn a_small_chunk_a_whole_one_and_an_open_one_follow_what_the_series_holds() {
        let d = tempfile::tempdir().unwrap();
        let labels = gpu0();
        let value = |i: i64| (i % 17) as f64 * 0.5;
        let mut sender = strata_chunk::ChunkAppender::new();
        for s in at(100, 160, value) {
            sender.append(s.t, s.v);
        }
        let open_chunk = sender.seal();
        {
            let db = open(d.path());
            let s = db.series(&labels).unwrap();
            let held: Vec<_> = at(0, 10, value).into_iter().map(|x| (s.clone(), x)).collect();
            assert_eq!(db.commit(&held).unwrap().appended, 10);
            let all = at(10, 100, value);
            let mut chunks = Chunk::encode_sealed(&all[..6]);
            chunks.extend(Chunk::encode_sealed(&all[6..]));
            let mut decoded = Vec::new();
            for c in &chunks {
                c.decode_checked(&mut decoded).unwrap();
            }
            let open = Some(OpenChunk { chunk: open_chunk.clone(), from: i64::MIN, through: open_chunk.max_t });
            let out = db.commit_chunks(vec![WholeChunks { series: s, chunks, samples: decoded, open }]).unwrap();
            assert_eq!((out.adopted, out.chunks, out.continued, out.rest.len()), (150, 1, 1, 0));
            assert_eq!(stored(&db).0, at(0, 160, value));
        }
        let db = open(d.path());
        assert_eq!(stored(&db).0, at(0, 160, value), "replayed after a crash");
    }

    /// Chunks taken whole, then the sender's open chunk beginning after them: it is taken
    /// as the series' open chunk (not sample by sample), and replays so.
    #[test]
    fn an_open_chunk_after_chunks_taken_in_the_same_batch_begins_anew() {
        let d = tempfile::tempdir().unwrap();
        let labels = gpu0();
        let value = |i: i64| (i % 13) as f64;
        let mut sender = strata_chunk::ChunkAppender::new();
        for s in at(200, 260, value) {
            sender.append(s.t, s.v);
        }
        let open_chunk = sender.seal();
        {
            let db = open(d.path());
            let s = db.series(&labels).unwrap();
            let mut w = whole(&s, &at(0, 200, value));
            w.open = Some(OpenChunk { chunk: open_chunk.clone(), from: i64::MIN, through: open_chunk.max_t });
            let out = db.commit_chunks(vec![w]).unwrap();
            assert_eq!((out.adopted, out.chunks, out.continued, out.rest.len()), (260, 1, 1, 0));
            assert_eq!(stored(&db).0, at(0, 260, value));
            // An open chunk whose header lies about where it begins, after chunks taken:
            // refused as damaged, and nothing of the batch stored.
            let mut sender = strata_chunk::ChunkAppender::new();
            for s in at(400, 420, value) {
                sender.append(s.t, s.v);
            }
            let theirs = sender.seal();
            let liar = Chunk { min_t: theirs.min_t + 1, ..theirs.clone() };
            let mut w = whole(&s, &at(300, 400, value));
            w.open = Some(OpenChunk { chunk: liar, from: i64::MIN, through: theirs.max_t });
            let out = db.commit_chunks(vec![w]).unwrap();
            assert_eq!((out.damaged.len(), out.adopted), (1, 0));
            assert_eq!(stored(&db).0, at(0, 260, value));
        }
        let db = open(d.path());
        assert_eq!(stored(&db).0, at(0, 260, value), "replayed after a crash");
    }

    /// The open chunk of a head that appended what this one did, and more: only its new
    /// bits are decoded, and this head's open chunk goes on from it as if it had appended
    /// those samples itself, after a restart too (from the WAL, and from a checkpoint).
    #[test]
    fn an_open_chunk_continues_the_one_this_head_holds() {
        let d = tempfile::tempdir().unwrap();
        let labels = gpu0();
        let value = |i: i64| ((i * 37) % 101) as f64 / 10.0;
        let mut sender = strata_chunk::ChunkAppender::new();
        for s in at(0, 400, value) {
            sender.append(s.t, s.v);
        }
        let theirs = sender.seal();
        let through = |i: i64| 1_000_000 + i * 5000;
        let open_chunk = |s: &Arc<MemSeries>, upto: i64| WholeChunks {
            series: s.clone(),
            chunks: Vec::new(),
            samples: Vec::new(),
            open: Some(OpenChunk { chunk: theirs.clone(), from: i64::MIN, through: through(upto) }),
        };
        {
            let db = open(d.path());
            let s = db.series(&labels).unwrap();
            let first: Vec<_> = at(0, 100, value).into_iter().map(|x| (s.clone(), x)).collect();
            db.commit(&first).unwrap();
            let out = db.commit_chunks(vec![open_chunk(&s, 199)]).unwrap();
            assert_eq!((out.adopted, out.continued, out.rest.len()), (100, 1, 0));
            assert_eq!(stored(&db), (at(0, 200, value), 1));
            // Sent again: nothing new, nothing counted.
            let out = db.commit_chunks(vec![open_chunk(&s, 199)]).unwrap();
            assert_eq!((out.adopted, out.rest.len()), (0, 0));
        }
        // Replayed from the WAL: the open chunk continues.
        let db = open(d.path());
        assert_eq!(stored(&db), (at(0, 200, value), 1));
        let s = db.series(&labels).unwrap();
        assert_eq!(db.commit_chunks(vec![open_chunk(&s, 299)]).unwrap().continued, 1);
        db.checkpoint().unwrap();
        drop(db);
        // From a checkpoint, which holds the open chunk sealed: reopened.
        let db = open(d.path());
        assert!(db.restored_from_checkpoint());
        let s = db.series(&labels).unwrap();
        let out = db.commit_chunks(vec![open_chunk(&s, 349)]).unwrap();
        assert_eq!((out.adopted, out.continued), (50, 1));
        let last: Vec<_> = at(350, 400, value).into_iter().map(|x| (s.clone(), x)).collect();
        assert_eq!(db.commit(&last).unwrap().appended, 50);
        // The head holds the sender's chunk bit for bit.
        let found = db.head().select(&[Matcher::eq("gpu", "0")], i64::MIN, i64::MAX);
        assert_eq!(found[0].1, vec![theirs.clone()]);
    }

    /// An open chunk that does not continue this head's (another value inside, another
    /// start) comes back as its samples up to the bound, judged one by one; one whose bits
    /// after the shared ones do not decode is refused, nothing of it stored.
    #[test]
    fn an_open_chunk_that_does_not_continue_comes_back_as_samples_and_damage_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let db = open(d.path());
        let s = db.series(&gpu0()).unwrap();
        let value = |i: i64| (i % 13) as f64;
        let mut other = at(0, 200, value);
        other[50].v = 99.0;
        let mut sender = strata_chunk::ChunkAppender::new();
        for x in &other {
            sender.append(x.t, x.v);
        }
        let theirs = sender.seal();
        db.commit(&at(0, 100, value).into_iter().map(|x| (s.clone(), x)).collect::<Vec<_>>()).unwrap();
        let w = WholeChunks {
            series: s.clone(),
            chunks: Vec::new(),
            samples: Vec::new(),
            open: Some(OpenChunk { chunk: theirs.clone(), from: i64::MIN, through: i64::MAX }),
        };
        let out = db.commit_chunks(vec![w]).unwrap();
        assert_eq!((out.adopted, out.continued, out.rest.len()), (0, 0, 200));
        let c = db.commit(&out.rest).unwrap();
        assert_eq!((c.appended, c.ignored_duplicates, c.rejected.len()), (100, 99, 1));
        // Its samples before `from` the sender knows are held: they do not come back.
        let open = Some(OpenChunk { chunk: theirs.clone(), from: other[150].t, through: other[179].t });
        let w = WholeChunks { series: s.clone(), chunks: Vec::new(), samples: Vec::new(), open };
        let out = db.commit_chunks(vec![w]).unwrap();
        assert_eq!(out.rest.iter().map(|r| r.1).collect::<Vec<_>>(), other[150..180].to_vec());
        // A header that misplaces the chunk (its first timestamp not the data's) is refused.
        let liar = strata_chunk::Chunk { min_t: theirs.max_t + 1, ..theirs.clone() };
        let open = Some(OpenChunk { chunk: liar, from: i64::MIN, through: theirs.max_t });
        let fresh = db.series(&Labels::from_pairs([("__name__", "m"), ("gpu", "1")])).unwrap();
        let out = db
            .commit_chunks(vec![WholeChunks { series: fresh, chunks: Vec::new(), samples: Vec::new(), open }])
            .unwrap();
        assert_eq!(out.damaged.len(), 1);
        let cut = strata_chunk::Chunk { data: theirs.data[..theirs.data.len() / 2].into(), n: 300, ..theirs.clone() };
        let mut longer = at(0, 300, value);
        longer[50].v = 99.0;
        let _ = longer;
        let open = Some(OpenChunk { chunk: cut, from: i64::MIN, through: i64::MAX });
        let w = WholeChunks { series: s.clone(), chunks: Vec::new(), samples: Vec::new(), open };
        let out = db.commit_chunks(vec![w]).unwrap();
        assert_eq!(out.damaged.len(), 1, "{:?}", out.damaged.iter().map(|d| &d.1).collect::<Vec<_>>());
        assert_eq!(stored(&db).0.len(), 200);
    }

    /// Samples past what the head admits in the future are not taken with the chunk: they
    /// come back to be refused, and counted, one by one.
    #[test]
    fn an_open_chunk_reaching_into_the_future_comes_back_as_samples() {
        let d = tempfile::tempdir().unwrap();
        let db = open(d.path());
        let s = db.series(&gpu0()).unwrap();
        let now = now_ms();
        let samples: Vec<_> = (0..100).map(|i| Sample::new(now - 10 * 60_000 + i * 60_000, i as f64)).collect();
        let mut sender = strata_chunk::ChunkAppender::new();
        for x in &samples {
            sender.append(x.t, x.v);
        }
        let open = Some(OpenChunk { chunk: sender.seal(), from: i64::MIN, through: i64::MAX });
        let out =
            db.commit_chunks(vec![WholeChunks { series: s, chunks: Vec::new(), samples: Vec::new(), open }]).unwrap();
        assert_eq!((out.continued, out.rest.len()), (0, 100));
        let c = db.commit(&out.rest).unwrap();
        assert!(!c.rejected.is_empty(), "samples far in the future were stored");
        assert_eq!(c.appended + c.rejected.len(), 100);
    }

    /// A chunk across a block-range boundary, or older than the head admits, is not taken
    /// whole: the head's chunks each belong to one block.
    #[test]
    fn a_chunk_across_a_block_boundary_comes_back_as_samples() {
        let d = tempfile::tempdir().unwrap();
        let db = open(d.path());
        let s = db.series(&gpu0()).unwrap();
        let range = db.block_range_ms();
        let across: Vec<_> = (-5..5).map(|i| Sample::new(range + i * 1000, 1.0)).collect();
        let out = db.commit_chunks(vec![whole(&s, &across)]).unwrap();
        assert_eq!((out.adopted, out.rest.len()), (0, 10));
        assert_eq!(db.commit(&out.rest).unwrap().appended, 10);
        assert_eq!(stored(&db).0, across);
    }

    /// A chunk padded with bytes its decoder never reads, or too short to be worth its
    /// header, is appended sample by sample (in its place, being in order): what a peer
    /// sends cannot fill the head and the WAL with more than its samples cost.
    #[test]
    fn a_padded_or_tiny_chunk_is_appended_sample_by_sample() {
        let d = tempfile::tempdir().unwrap();
        let db = open(d.path());
        let s = db.series(&gpu0()).unwrap();
        let mut padded = whole(&s, &at(0, 100, |i| i as f64));
        let c = &mut padded.chunks[0];
        let mut bytes = c.data.to_vec();
        bytes.extend(std::iter::repeat_n(0xA5, 60_000));
        c.data = bytes.into();
        let tiny = whole(&s, &at(100, 105, |i| i as f64));
        for w in [padded, tiny] {
            let n = w.samples.len();
            let out = db.commit_chunks(vec![w]).unwrap();
            assert_eq!((out.adopted, out.chunks, out.rest.len()), (n, 0, 0));
        }
        assert_eq!(stored(&db).0, at(0, 105, |i| i as f64));
        assert!(db.stats().chunk_bytes < 10_000, "{} bytes in the head", db.stats().chunk_bytes);
    }

    /// A chunk record whose checksum holds but whose chunk does not decode to what it
    /// declares is skipped on replay; the records after it in the segment are still read.
    #[test]
    fn a_chunk_record_that_does_not_check_is_skipped_and_the_segment_read_on() {
        let d = tempfile::tempdir().unwrap();
        let labels = gpu0();
        {
            let db = open(d.path());
            let s = db.series(&labels).unwrap();
            db.commit(&[(s.clone(), Sample::new(1_000_000, 1.0))]).unwrap();
            let liar = Chunk { data: Arc::from(&[0xFFu8; 40][..]), n: 50, min_t: 2_000_000, max_t: 3_000_000 };
            let rec = WalRecord::Chunk { series_ref: s.series_ref, chunk: liar, last: Sample::new(3_000_000, 0.0) };
            db.wal.lock().wal.log(&[rec]).unwrap();
            db.commit(&[(s, Sample::new(4_000_000, 4.0))]).unwrap();
        }
        let db = open(d.path());
        assert_eq!(stored(&db).0, vec![Sample::new(1_000_000, 1.0), Sample::new(4_000_000, 4.0)]);
    }
}
