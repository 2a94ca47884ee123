//! Where a forwarder's batches come from: a [`Backlog`] in storage first, if the cursor
//! replays one, then the WAL from the cursor, record by record. Each series is named with
//! its labels once per session and by number after; a batch stays under the sample, series
//! and byte bounds the receiver enforces.

use crate::backlog::{labels_before, Backlog, BacklogError, BacklogReader};
use crate::cursor::ReplayAt;
use crate::FastMap as HashMap;
use crate::{pb, Cursor, ForwardError, MAX_BATCH_METADATA, MAX_BATCH_SERIES};
use std::sync::Arc;
use strata_chunk::Chunk;
use strata_grpc::{attach_external, chunk_to_pb, labels_to_pb, metadata_to_pb, MAX_LABELS, MAX_LABEL_BYTES};
use strata_model::{Labels, Sample};
use strata_tsdb::db::Tsdb;
use strata_tsdb::index::SeriesRef;
use strata_tsdb::wal::{self, WalCursor, WalReader, WalRecord};

/// A session's series table may hold this many more than the segments being read name.
const SESSION_SLACK: usize = 10_000;

/// `labels` with each external label it lacks (Prometheus' remote write: the series' own
/// value wins).
fn add_missing(labels: &Labels, external: &Labels) -> Labels {
    if external.iter().all(|l| labels.get(&l.name).is_some()) {
        return labels.clone();
    }
    let mut b = labels.to_builder();
    for l in external.iter() {
        if labels.get(&l.name).is_none() {
            b.set(&l.name, &l.value);
        }
    }
    b.build()
}

/// A position a batch ends at: [`Cursor`] without the storage identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct At {
    pub(crate) wal: WalCursor,
    pub(crate) skip: u64,
    pub(crate) replay: Option<ReplayAt>,
}

impl At {
    pub(crate) fn of(c: &Cursor) -> At {
        At { wal: c.wal, skip: c.skip, replay: c.replay }
    }
}

/// A batch read from the WAL or a backlog, and the position after it.
pub(crate) struct Batch {
    pub(crate) request: pb::PushRequest,
    pub(crate) next: At,
    pub(crate) samples: u64,
    pub(crate) oldest: i64,
    pub(crate) newest: i64,
    pub(crate) unknown: u64,
    /// Samples of a backlog storage no longer held, and their entries' range.
    pub(crate) lost: u64,
    pub(crate) lost_range: (i64, i64),
    /// The samples went as chunks.
    pub(crate) chunks: bool,
    /// Everything the edge stores up to here has been sent once this batch is
    /// (`PushRequest.complete_until`); `None`: the batch carries no samples to say it by.
    pub(crate) complete_until: Option<i64>,
}

/// Why a batch could not be read.
pub(crate) enum ReadError {
    Wal(wal::WalError),
    Storage(strata_store::StoreError),
}

impl From<wal::WalError> for ReadError {
    fn from(e: wal::WalError) -> Self {
        ReadError::Wal(e)
    }
}

impl ReadError {
    pub(crate) fn into_forward(self, upstream: &str) -> ForwardError {
        match self {
            ReadError::Wal(source) => ForwardError::Wal { upstream: upstream.to_string(), source },
            ReadError::Storage(e) => ForwardError::Backlog { upstream: upstream.to_string(), reason: e.to_string() },
        }
    }
}

/// A samples record partly sent: it starts at `start`, ends at `end`.
struct Partial {
    start: WalCursor,
    end: WalCursor,
    samples: Vec<(SeriesRef, Sample)>,
    taken: usize,
}

/// A batch's encoded size is kept under this (the gRPC limit is twice it), counting labels
/// and metadata as well as samples.
const MAX_BATCH_BYTES: usize = 8 << 20;

/// The block range a backlog's chunks are cut for: the default, two hours.
const CHUNK_WINDOW_MS: i64 = 2 * 3600 * 1000;

/// Each series' samples as chunks, spread over the cores (see [`crate::parallel`]).
fn encode_chunks(series: &mut [pb::ForwardSeries], samples: Vec<Vec<Sample>>) {
    // Cut at the default block range's boundaries (two hours), so no chunk straddles a
    // receiver's block windows and it can keep them whole (a receiver with another range
    // stores a straddling chunk sample by sample).
    let window = |t: i64| t.div_euclid(CHUNK_WINDOW_MS);
    let chunks = strata_model::parallel::map_in_parts(samples, Vec::len, |s| {
        s.chunk_by(|a, b| window(a.t) == window(b.t))
            .flat_map(Chunk::encode_sealed)
            .map(|c| chunk_to_pb(&c))
            .collect::<Vec<_>>()
    });
    for (fs, c) in series.iter_mut().zip(chunks) {
        fs.chunks = c;
    }
}

/// The backlog a session replays: just stored, or in its file.
pub(crate) enum BacklogAt {
    /// As listed, with the labels the cursor's segment named before it if known.
    Here(Backlog, Option<(WalCursor, HashMap<SeriesRef, Labels>)>),
    File(std::path::PathBuf),
}

/// Reads batches from a backlog in storage, if there is one, then from the WAL. Every segment names each reference its samples use before
/// them (see `Tsdb::commit`), so labels are resolved from the segment being read, never
/// from the head, which may have dropped the series or, after a restart, given its
/// reference to another.
pub(crate) struct WalSource {
    reader: WalReader,
    /// What the WAL holds past the batch read, for the batch's watermark.
    db: Arc<Tsdb>,
    /// The labels the current segment named, and that segment.
    labels: HashMap<SeriesRef, Labels>,
    /// How many series the previous segment named (the current one is still being read).
    previous_segment_series: usize,
    /// The session number of each of the segment's references (`None`: the upstream
    /// would refuse the series), so a reference is resolved once per segment.
    resolved: HashMap<SeriesRef, Option<u64>>,
    /// The session's series: their numbers by labels (as sent), and whether each was sent
    /// with its labels yet (by number - 1).
    session: HashMap<Labels, u64>,
    named: Vec<(Labels, bool)>,
    segment: u32,
    partial: Option<Partial>,
    /// Samples of the record at `resume` sent before (a record larger than a batch).
    skip: u64,
    resume: WalCursor,
    at: At,
    /// The backlog sent before the WAL.
    replay: Option<BacklogReader>,
    /// The session number of each of its entries (0: not resolved yet, `u64::MAX`: refused).
    backlog_ids: Vec<u64>,
    /// The upstream takes chunks: the backlog goes as chunks.
    pub(crate) chunks: bool,
    /// The upstream takes open chunks: a backlog's samples that one streaming chunk holds
    /// go as that chunk (see `BacklogReader::open_chunk_of`).
    pub(crate) open_chunks: bool,
    /// The backlog's oldest sample: until it is all sent, nothing later is known sent.
    backlog_oldest: i64,
    /// The metric families' metadata, sent with the backlog's first batches: the WAL
    /// records that carried it are not read again.
    backlog_metadata: Vec<(String, strata_model::Metadata)>,
}

impl WalSource {
    pub(crate) fn new(db: Arc<Tsdb>, c: &Cursor, backlog: Option<BacklogAt>) -> Result<WalSource, ReadError> {
        // Resuming mid-segment: the labels named before the cursor (found by the listing
        // that just read up to it, or read again).
        let (backlog, known) = match backlog {
            Some(BacklogAt::Here(b, known)) => (Some(Ok(b)), known),
            Some(BacklogAt::File(path)) => (Some(Backlog::load(&path)), None),
            None => (None, None),
        };
        let labels = match known {
            Some((at, labels)) if at == c.wal => labels,
            _ => labels_before(&db, c.wal)?,
        };
        let mut at = At::of(c);
        let loaded = backlog;
        let mut backlog_oldest = i64::MAX;
        let replay = match (c.replay, loaded) {
            (Some(r), Some(loaded)) => match loaded {
                Ok(b) => {
                    backlog_oldest = b.summary().1;
                    Some(BacklogReader::new(db.clone(), b, r))
                }
                Err(BacklogError::Io(e)) => return Err(ReadError::Storage(strata_store::StoreError::Unavailable(e))),
                Err(BacklogError::Damaged(e)) => {
                    tracing::error!(error = %e, "forward: a backlog file is damaged: what it listed is not sent");
                    at.replay = None;
                    None
                }
            },
            _ => {
                at.replay = None;
                None
            }
        };
        Ok(WalSource {
            reader: WalReader::new(&db.wal_dir(), c.wal),
            db: db.clone(),
            labels,
            previous_segment_series: 0,
            resolved: HashMap::default(),
            session: HashMap::default(),
            named: Vec::new(),
            segment: c.wal.segment,
            partial: None,
            skip: c.skip,
            resume: c.wal,
            backlog_metadata: if replay.is_some() { db.head().all_metadata() } else { Vec::new() },
            at,
            replay,
            backlog_ids: Vec::new(),
            chunks: false,
            open_chunks: false,
            backlog_oldest,
        })
    }

    /// The session number of the segment's reference `r` (assigned the first time its
    /// labels are met in the session); `None` when the segment does not name it, or the
    /// upstream would refuse its labels (logged).
    fn resolve(&mut self, r: SeriesRef, external: &(Labels, bool)) -> Option<u64> {
        let labels = self.labels.get(&r)?.clone();
        self.resolve_labels(&labels, external)
    }

    /// The session number of a series with these labels (as stored, before external labels).
    fn resolve_labels(&mut self, labels: &Labels, external: &(Labels, bool)) -> Option<u64> {
        let labels = if external.1 {
            add_missing(labels, &external.0)
        } else {
            // Labelled as the edge's StoreAPI serves the series, so the global merges the
            // edge's copy and the regional's as one.
            attach_external(labels, &external.0)
        };
        if let Some(&id) = self.session.get(&labels) {
            return Some(id);
        }
        let label_bytes: usize = labels.iter().map(|l| l.name.len() + l.value.len()).sum();
        if labels.len() > MAX_LABELS || label_bytes > MAX_LABEL_BYTES {
            tracing::warn!(
                series = %labels,
                "forward: a series with more labels or label bytes than the upstream takes: its samples are not sent"
            );
            return None;
        }
        let id = self.named.len() as u64 + 1;
        self.named.push((labels.clone(), false));
        self.session.insert(labels, id);
        Some(id)
    }

    /// The session number of the backlog's entry `i`, resolved once per entry (a series
    /// comes in a piece per slice and batch).
    fn backlog_id(&mut self, i: usize, external: &(Labels, bool)) -> Option<u64> {
        const UNKNOWN: u64 = 0;
        const REFUSED: u64 = u64::MAX;
        let reader = self.replay.as_ref()?;
        if self.backlog_ids.len() != reader.len() {
            self.backlog_ids = vec![UNKNOWN; reader.len()];
        }
        match self.backlog_ids.get(i).copied() {
            Some(REFUSED) => None,
            Some(UNKNOWN) | None => {
                let labels = reader.labels(i)?.clone();
                let id = self.resolve_labels(&labels, external);
                if let Some(slot) = self.backlog_ids.get_mut(i) {
                    *slot = id.unwrap_or(REFUSED);
                }
                id
            }
            Some(id) => Some(id),
        }
    }

    /// Whether the session's series outnumber twice what the segment being read or the one
    /// before named (plus slack): series that churned away still hold their numbers and
    /// labels. (The segment being read may have named only a few so far.)
    pub(crate) fn outgrown(&self) -> bool {
        if self.replay.is_some() {
            // A backlog names the series it sends, none of which the WAL names yet.
            return false;
        }
        let live = self.labels.len().max(self.previous_segment_series);
        self.named.len() > live.saturating_mul(2).saturating_add(SESSION_SLACK)
    }

    /// Labels the first time the session sends series `id`, then its number alone; adds
    /// their size to `bytes`.
    fn series_entry(&mut self, id: u64, bytes: &mut usize) -> pb::ForwardSeries {
        let slot = usize::try_from(id - 1).unwrap_or(usize::MAX);
        let labels = match self.named.get_mut(slot) {
            Some((l, sent)) if !*sent => {
                *sent = true;
                *bytes += l.iter().map(|x| x.name.len() + x.value.len() + 8).sum::<usize>();
                labels_to_pb(l)
            }
            _ => Vec::new(),
        };
        *bytes += 12;
        pb::ForwardSeries { labels, r#ref: id, ..Default::default() }
    }

    /// Series `id`'s place in a batch being built (its request, its samples, the places
    /// by id), added the first time: a series once per batch, as a receiver resolves its
    /// number once.
    fn batch_slot(
        &mut self,
        id: u64,
        (req, samples, index): (&mut pb::PushRequest, &mut Vec<Vec<Sample>>, &mut HashMap<u64, usize>),
        bytes: &mut usize,
    ) -> usize {
        if let Some(&i) = index.get(&id) {
            return i;
        }
        let fs = self.series_entry(id, bytes);
        req.series.push(fs);
        samples.push(Vec::new());
        index.insert(id, req.series.len() - 1);
        req.series.len() - 1
    }

    /// A batch of the backlog; once it is read, the position moves on to the WAL.
    fn backlog_batch(&mut self, limit: usize, external: &(Labels, bool)) -> Result<Batch, ReadError> {
        let mut req = pb::PushRequest::default();
        let mut index: HashMap<u64, usize> = HashMap::default();
        // Each series' samples, encoded as chunks once the batch is complete.
        let mut samples: Vec<Vec<Sample>> = Vec::new();
        // Chunks take about 2 bytes a sample on scraped data, samples 17.
        let per_sample = if self.chunks { 4 } else { 17 };
        let (mut n, mut bytes, mut oldest, mut newest, mut unknown) = (0usize, 0usize, i64::MAX, i64::MIN, 0u64);
        let (mut lost, mut lost_range) = (0u64, (i64::MAX, i64::MIN));
        self.take_backlog_metadata(&mut req, &mut bytes);
        // Samples the batch's open chunks declare (most of them the upstream holds).
        let mut open_declared = 0usize;
        let open_max = crate::MAX_BATCH_OPEN_SAMPLES - usize::from(strata_chunk::CHUNK_MAX_SAMPLES);
        while n < limit && bytes < MAX_BATCH_BYTES && req.series.len() < MAX_BATCH_SERIES {
            let Some(reader) = self.replay.as_mut() else { break };
            reader.open_chunks = self.chunks && self.open_chunks && open_declared <= open_max;
            let Some(piece) = reader.next_piece(limit - n).map_err(ReadError::Storage)? else { break };
            if piece.lost > 0 {
                lost += piece.lost;
                lost_range = (lost_range.0.min(piece.range.0), lost_range.1.max(piece.range.1));
            }
            if let Some(crate::backlog::OpenPiece { chunk, from, through, count }) = piece.open {
                let Some(id) = self.backlog_id(piece.entry, external) else {
                    unknown += count;
                    continue;
                };
                // The entry's last piece, after any of its earlier ones.
                let i = self.batch_slot(id, (&mut req, &mut samples, &mut index), &mut bytes);
                let count = usize::try_from(count).unwrap_or(usize::MAX);
                n = n.saturating_add(count);
                bytes += chunk.data.len() + 24;
                open_declared += usize::from(chunk.n);
                oldest = oldest.min(from.max(chunk.min_t));
                newest = newest.max(through);
                if let Some(fs) = req.series.get_mut(i) {
                    fs.open_chunk = Some(chunk_to_pb(&chunk));
                    fs.open_from = from;
                    fs.open_through = through;
                }
                continue;
            }
            if piece.samples.is_empty() {
                continue;
            }
            let Some(id) = self.backlog_id(piece.entry, external) else {
                unknown += piece.samples.len() as u64;
                continue;
            };
            // Its pieces of later slices join the earlier ones, in time order.
            let i = self.batch_slot(id, (&mut req, &mut samples, &mut index), &mut bytes);
            n += piece.samples.len();
            bytes += per_sample * piece.samples.len();
            oldest = oldest.min(piece.samples[0].t);
            newest = newest.max(piece.samples[piece.samples.len() - 1].t);
            if samples[i].is_empty() {
                samples[i] = piece.samples;
            } else {
                samples[i].extend(piece.samples);
            }
        }
        if self.chunks {
            encode_chunks(&mut req.series, samples);
        } else {
            for (fs, s) in req.series.iter_mut().zip(samples) {
                fs.timestamps = s.iter().map(|x| x.t).collect();
                fs.values = s.iter().map(|x| x.v.to_bits()).collect();
            }
        }
        match &self.replay {
            Some(r) if !r.is_done() => self.at.replay = Some(r.at()),
            _ => {
                self.replay = None;
                self.at.replay = None;
            }
        }
        let chunks = self.chunks && n > 0;
        // A backlog goes series by series: its oldest time stands until it is all sent.
        let complete_until = (n > 0).then(|| self.backlog_oldest.saturating_sub(1));
        Ok(Batch {
            request: req,
            next: self.at,
            samples: n as u64,
            oldest,
            newest,
            unknown,
            lost,
            lost_range,
            chunks,
            complete_until,
        })
    }

    /// The backlog's metadata not sent yet, as much as a batch takes.
    fn take_backlog_metadata(&mut self, req: &mut pb::PushRequest, bytes: &mut usize) {
        let mut take = 0;
        for (family, meta) in &self.backlog_metadata {
            if take >= MAX_BATCH_METADATA || *bytes >= MAX_BATCH_BYTES / 2 {
                break;
            }
            *bytes += family.len() + meta.help.len() + meta.unit.len() + 8;
            req.metadata.push(metadata_to_pb(family, meta));
            take += 1;
        }
        self.backlog_metadata.drain(..take);
    }

    pub(crate) fn next_batch(&mut self, limit: usize, external: &(Labels, bool)) -> Result<Batch, ReadError> {
        if self.replay.is_some() {
            return self.backlog_batch(limit, external);
        }
        let mut req = pb::PushRequest::default();
        // A session number's series in the batch: references with the same labels (a
        // series restored under another reference after a restart) share one.
        let mut index: HashMap<u64, usize> = HashMap::default();
        let (mut n, mut bytes, mut oldest, mut newest, mut unknown) = (0usize, 0usize, i64::MAX, i64::MIN, 0u64);
        self.take_backlog_metadata(&mut req, &mut bytes);
        loop {
            if let Some(mut p) = self.partial.take() {
                while p.taken < p.samples.len() && n < limit && bytes < MAX_BATCH_BYTES {
                    let (r, s) = p.samples[p.taken];
                    let id = match self.resolved.get(&r) {
                        Some(&id) => id,
                        None => {
                            let id = self.resolve(r, external);
                            self.resolved.insert(r, id);
                            id
                        }
                    };
                    let Some(id) = id else {
                        unknown += 1;
                        p.taken += 1;
                        continue;
                    };
                    let i = match index.get(&id) {
                        Some(&i) => i,
                        None if req.series.len() >= MAX_BATCH_SERIES => break,
                        None => {
                            let fs = self.series_entry(id, &mut bytes);
                            req.series.push(fs);
                            index.insert(id, req.series.len() - 1);
                            req.series.len() - 1
                        }
                    };
                    p.taken += 1;
                    let fs = &mut req.series[i];
                    // The WAL holds each series' samples in time order; a repeat (a segment
                    // rewritten after a crash) is not sent twice in one batch.
                    if fs.timestamps.last().is_some_and(|&t| t >= s.t) {
                        continue;
                    }
                    fs.timestamps.push(s.t);
                    fs.values.push(s.v.to_bits());
                    n += 1;
                    bytes += 17;
                    oldest = oldest.min(s.t);
                    newest = newest.max(s.t);
                }
                if p.taken < p.samples.len() {
                    self.at = At { wal: p.start, skip: p.taken as u64, replay: None };
                    self.partial = Some(p);
                    break;
                }
                self.at = At { wal: p.end, skip: 0, replay: None };
                continue;
            }
            if n >= limit || bytes >= MAX_BATCH_BYTES || req.metadata.len() >= MAX_BATCH_METADATA {
                break;
            }
            let before = self.reader.cursor();
            let Some((rec, after)) = self.reader.next_record()? else { break };
            if after.segment != self.segment {
                // A new segment names its references anew (after a restart they may mean
                // other series).
                self.previous_segment_series = self.labels.len();
                self.labels.clear();
                self.resolved.clear();
                self.segment = after.segment;
            }
            match rec.chunk_as_samples() {
                WalRecord::Series { series_ref, labels } => {
                    self.labels.insert(series_ref, labels);
                    self.at = At { wal: after, skip: 0, replay: None };
                }
                WalRecord::Metadata { family, meta } => {
                    bytes += family.len() + meta.help.len() + meta.unit.len() + 16;
                    req.metadata.push(metadata_to_pb(&family, &meta));
                    self.at = At { wal: after, skip: 0, replay: None };
                }
                WalRecord::Samples(samples) => {
                    let start = if before.segment == after.segment {
                        before
                    } else {
                        WalCursor { segment: after.segment, offset: 0 }
                    };
                    // Only the record the cursor names was partly sent before.
                    let skip = if start == self.resume { std::mem::take(&mut self.skip) } else { 0 };
                    let taken = usize::try_from(skip).unwrap_or(usize::MAX).min(samples.len());
                    self.partial = Some(Partial { start, end: after, samples, taken });
                }
                // Made samples above.
                WalRecord::Chunk { .. } => {}
            }
        }
        Ok(Batch {
            request: req,
            next: self.at,
            samples: n as u64,
            oldest,
            newest,
            unknown,
            lost: 0,
            lost_range: (i64::MAX, i64::MIN),
            chunks: false,
            // Everything older than both this batch's oldest and the oldest of what the WAL
            // holds past it (a slow scrape or a remote write stores older samples after
            // newer ones) has gone; not known (the WAL past it was written before the
            // database opened, or long ago): no claim.
            complete_until: if n > 0 {
                self.db.wal_oldest_after(self.at.wal).map(|later| later.min(oldest).saturating_sub(1))
            } else {
                None
            },
        })
    }
}

#[cfg(test)]
mod session_tests {
    use super::*;

    /// A session whose series table holds many more series than the segment being read
    /// names (series that churned away) is due for a new session, which forgets them.
    #[test]
    fn a_session_outgrown_by_churned_series_is_due_for_rotation() {
        let d = tempfile::tempdir().unwrap();
        let db = Tsdb::open(d.path(), Default::default()).unwrap();
        let c = Cursor { storage_id: String::new(), wal: WalCursor { segment: 0, offset: 0 }, skip: 0, replay: None };
        let Ok(mut src) = WalSource::new(Arc::new(db), &c, None) else { panic!("opening the WAL") };
        let external = Labels::default();
        for i in 0..6_000u64 {
            let l = Labels::from_pairs([("__name__", "x"), ("i", &i.to_string())]);
            src.labels.insert(i, l);
            assert!(src.resolve(i, &(external.clone(), false)).is_some());
        }
        assert!(!src.outgrown(), "live series alone never rotate a session");
        // A new segment has named only a few so far: the previous one's count stands.
        src.previous_segment_series = src.labels.len();
        src.labels.retain(|r, _| *r < 10);
        assert!(!src.outgrown(), "a segment switch alone rotates the session");
        // The segment moves on and names only 100 of them; the rest churned away.
        src.previous_segment_series = 100;
        src.labels.retain(|r, _| *r < 100);
        for i in 6_000..20_000u64 {
            src.labels.insert(i, Labels::from_pairs([("__name__", "y"), ("i", &i.to_string())]));
            src.resolve(i, &(external.clone(), false));
            src.labels.remove(&i);
        }
        assert!(src.outgrown());
    }
}

#[cfg(test)]
mod encode_tests {
    use super::*;

    /// Spread over threads or not, each series gets exactly its own samples as chunks.
    #[test]
    fn a_large_batch_encoded_in_parts_gives_each_series_its_own_chunks() {
        let samples: Vec<Vec<Sample>> = (0..500)
            .map(|i| (0..(i % 90 + 1)).map(|k| Sample::new(k as i64 * 5000 + i as i64, (k * i) as f64)).collect())
            .collect();
        assert!(samples.iter().map(Vec::len).sum::<usize>() > strata_model::parallel::MIN_PARALLEL_WEIGHT);
        let mut series = vec![pb::ForwardSeries::default(); samples.len()];
        encode_chunks(&mut series, samples.clone());
        for (fs, s) in series.iter().zip(&samples) {
            let mut got = Vec::new();
            for c in &fs.chunks {
                let c = strata_grpc::chunk_from_pb(c.clone()).unwrap();
                c.decode_checked(&mut got).unwrap();
            }
            assert_eq!(&got, s);
        }
    }
}
