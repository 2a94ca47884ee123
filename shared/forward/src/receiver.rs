//! The regional's side: batches appended to its database and acknowledged once durable.

use crate::order::{BatchOrder, MAX_IN_FLIGHT};
use crate::{pb, ForwardError, MAX_BATCH_METADATA, MAX_BATCH_OPEN_SAMPLES, MAX_BATCH_SAMPLES, MAX_BATCH_SERIES};
use pb::forward_server::{Forward, ForwardServer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use strata_chunk::Chunk;
use strata_grpc::{labels_from_pb, metadata_from_pb, StringPool, MAX_MESSAGE_BYTES};
use strata_model::Labels;
use strata_model::{Sample, METRIC_NAME};
use strata_tsdb::db::{LateOutcome, OpenChunk, Tsdb, WholeChunks};
use strata_tsdb::head::{MemSeries, SampleError};
use strata_tsdb::index::SeriesRef;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

/// A regional's storage identity: random, created with its data directory, so an edge can
/// tell a regional that lost its data from one that kept it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageId(pub String);

impl StorageId {
    const FILE: &'static str = "storage-id";

    /// The identity of the database in `data_dir`, created on first use.
    pub fn load_or_create(data_dir: &Path) -> Result<StorageId, ForwardError> {
        let path = data_dir.join(Self::FILE);
        let bad = |reason: String| ForwardError::StorageId { file: path.clone(), reason };
        match std::fs::read_to_string(&path) {
            Ok(s) => {
                let id = s.trim();
                if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(bad(format!("not an identity: {id:?} (delete the file to start a new one)")));
                }
                Ok(StorageId(id.to_string()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let id = random_hex()?;
                let tmp = path.with_extension("tmp");
                let write = || -> std::io::Result<()> {
                    let mut f = std::fs::File::create(&tmp)?;
                    f.write_all(id.as_bytes())?;
                    f.sync_data()?;
                    std::fs::rename(&tmp, &path)?;
                    std::fs::File::open(data_dir)?.sync_all()
                };
                write().map_err(|e| bad(e.to_string()))?;
                Ok(StorageId(id))
            }
            Err(e) => Err(bad(e.to_string())),
        }
    }
}

fn random_hex() -> Result<String, ForwardError> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| ForwardError::StorageId { file: PathBuf::from("/dev/urandom"), reason: e.to_string() })?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// What the receiver did, for `/metrics`.
#[derive(Debug, Default, Clone)]
pub struct ReceiverStats {
    pub batches: Counter,
    pub batches_refused: Counter,
    /// Received samples by what became of them: `appended`, `duplicate`, `conflict`,
    /// `out_of_order`, `out_of_bounds`.
    pub samples: Family<ResultLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

impl ReceiverStats {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("forward_received");
        r.register("batches", "Forwarded batches stored and acknowledged", self.batches.clone());
        r.register("batches_refused", "Forwarded batches refused (not acknowledged)", self.batches_refused.clone());
        r.register("samples", "Forwarded samples by what became of them", self.samples.clone());
    }

    fn count(&self, result: &str, n: u64) {
        self.samples.get_or_create(&ResultLabel { result: result.to_string() }).inc_by(n);
    }

    /// Samples counted under `result`.
    pub fn samples(&self, result: &str) -> u64 {
        self.samples.get_or_create(&ResultLabel { result: result.to_string() }).get()
    }
}

/// The `Forward` service over a database.
#[derive(Clone)]
pub struct ForwardReceiver {
    db: Arc<Tsdb>,
    id: StorageId,
    stats: ReceiverStats,
    /// Set for good once storing failed (see [`broken`](Self::broken)).
    failed: Arc<std::sync::atomic::AtomicBool>,
    /// The gRPC server's connections, when served beside a StoreAPI: each call holds its
    /// connection open (see `strata_grpc::Connections`).
    connections: Option<Arc<strata_grpc::Connections>>,
    /// The series each sender session has numbered.
    sessions: Arc<Sessions>,
    /// Told of each batch before it is acknowledged (see [`Arrivals`]).
    arrivals: Option<Arrivals>,
    /// The edges that said hello, by their external labels.
    senders: Option<Arc<crate::senders::Senders>>,
    /// How far each sender has sent everything.
    watermarks: Option<Arc<crate::watermarks::Watermarks>>,
    /// Each session's numbered batches, stored in order.
    order: Arc<BatchOrder>,
}

/// Told, before a batch is acknowledged, which sender (`PushRequest.upstream`) sent samples
/// over which times (`min_t`, `max_t`): a regional's downsampling follows each sender's
/// progress, and recomputes the windows a late batch falls in. An error fails the batch
/// (unacknowledged, so it comes again): what it would have had done must not be lost.
pub type Arrivals = Arc<dyn Fn(&str, i64, i64) -> Result<(), String> + Send + Sync>;

/// Senders' sessions: the series each numbered, so later batches send a number instead of
/// the labels. Bounded: [`MAX_SESSIONS`] sessions, and references over all of them at
/// twice the series the database may hold; the least recently used session goes first
/// (its sender is refused a number it no longer knows and starts a new session).
#[derive(Default)]
struct Sessions(parking_lot::Mutex<HashMap<String, Session>>);

struct Session {
    refs: HashMap<u64, Arc<MemSeries>>,
    used: std::time::Instant,
}

const MAX_SESSIONS: usize = 256;

/// The longest session name taken (a sender's are about 20 bytes).
const MAX_SESSION_NAME: usize = 64;

impl Sessions {
    /// Remembers the numbers a batch named. Never refuses (the batch is stored by then):
    /// past the bounds, other sessions are forgotten first, and numbers that still do not
    /// fit are not kept, so their sender is refused them later and starts a new session.
    fn remember(&self, session: &str, named: Vec<(u64, Arc<MemSeries>)>, max_refs: usize) {
        let mut all = self.0.lock();
        if !all.contains_key(session) && all.len() >= MAX_SESSIONS {
            evict_oldest(&mut all, session);
        }
        let mut total: usize = all.values().map(|s| s.refs.len()).sum();
        while total.saturating_add(named.len()) > max_refs && all.keys().any(|k| k != session) {
            evict_oldest(&mut all, session);
            total = all.values().map(|s| s.refs.len()).sum();
        }
        let s = all
            .entry(session.to_string())
            .or_insert_with(|| Session { refs: HashMap::new(), used: std::time::Instant::now() });
        s.used = std::time::Instant::now();
        let room = max_refs.saturating_sub(s.refs.len());
        if named.len() > room {
            tracing::warn!(session, numbers = named.len(), room, "forward: a session numbers more series than kept");
        }
        s.refs.extend(named.into_iter().take(room));
    }
}

/// Forgets the least recently used session other than `keep` (the caller's).
fn evict_oldest(all: &mut HashMap<String, Session>, keep: &str) {
    if let Some(oldest) = all.iter().filter(|(k, _)| *k != keep).min_by_key(|(_, s)| s.used).map(|(k, _)| k.clone()) {
        all.remove(&oldest);
    }
}

impl ForwardReceiver {
    pub fn new(db: Arc<Tsdb>, id: StorageId) -> ForwardReceiver {
        ForwardReceiver {
            db,
            id,
            stats: ReceiverStats::default(),
            failed: Arc::default(),
            connections: None,
            sessions: Arc::default(),
            arrivals: None,
            senders: None,
            watermarks: None,
            order: Arc::default(),
        }
    }

    /// Follows each sender's `complete_until` in `watermarks`, once its batch is durable.
    pub fn with_watermarks(mut self, watermarks: Arc<crate::watermarks::Watermarks>) -> Self {
        self.watermarks = Some(watermarks);
        self
    }

    /// Records each sender's external labels in `senders`.
    pub fn with_senders(mut self, senders: Arc<crate::senders::Senders>) -> Self {
        self.senders = Some(senders);
        self
    }

    /// Tells `arrivals` of every batch before it is acknowledged.
    pub fn with_arrivals(mut self, arrivals: Arrivals) -> Self {
        self.arrivals = Some(arrivals);
        self
    }

    /// Counts this service's calls as activity on the connections `serve_with` tracks.
    pub fn with_connections(mut self, c: Arc<strata_grpc::Connections>) -> Self {
        self.connections = Some(c);
        self
    }

    pub fn stats(&self) -> ReceiverStats {
        self.stats.clone()
    }

    /// The tonic service, with the StoreAPI's message bound, gzip both ways and zstd taken.
    pub fn into_server(self) -> ForwardServer<ForwardReceiver> {
        ForwardServer::new(self)
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Zstd)
            .send_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Storage failed: nothing more is acknowledged until a restart. After a failed
    /// `fsync` the kernel may have dropped pages a later `fsync` would not write again, and
    /// a resent batch would read as duplicates of samples the head holds but the disk may
    /// not, so no later success may vouch for it.
    fn broken(&self, reason: String) -> Status {
        if !self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tracing::error!(error = %reason, "forward receiver: storage failed; refusing every batch until the regional restarts");
        }
        Status::unavailable(format!("the regional's storage failed ({reason}): it takes no batch until restarted"))
    }

    /// Writes the samples the head refused as too old into blocks (those retention still
    /// keeps). When the head would take some after all (its floor moved back after a
    /// failed cut), the batch is not acknowledged: the sender's retry appends them.
    fn late(
        &self,
        batch: &[(Arc<MemSeries>, Sample)],
        rejected: &[(SeriesRef, Sample, SampleError)],
    ) -> Result<LateOutcome, Status> {
        if !rejected.iter().any(|x| x.2 == SampleError::OutOfBounds) {
            return Ok(LateOutcome::default());
        }
        let labels: HashMap<SeriesRef, &Labels> = batch.iter().map(|(m, _)| (m.series_ref, &m.labels)).collect();
        let mut by_series: HashMap<SeriesRef, (Labels, Vec<Sample>)> = HashMap::new();
        let mut unnamed = 0;
        for (r, s, _) in rejected.iter().filter(|x| x.2 == SampleError::OutOfBounds) {
            match by_series.get_mut(r) {
                Some(e) => e.1.push(*s),
                None => {
                    // A series retention removed meanwhile is committed under a live
                    // replacement that the batch does not name: its labels are the same.
                    let l = match labels.get(r) {
                        Some(l) => (*l).clone(),
                        None => match self.db.head().series(*r) {
                            Some(m) => m.labels.clone(),
                            None => {
                                unnamed += 1;
                                continue;
                            }
                        },
                    };
                    by_series.insert(*r, (l, vec![*s]));
                }
            }
        }
        let series: Vec<(Labels, Vec<Sample>)> = by_series.into_values().collect();
        let mut late = self.db.commit_late(&series).map_err(|e| self.broken(format!("writing late samples: {e}")))?;
        // Refused and counted with the out-of-bounds samples.
        late.too_old += unnamed;
        if late.not_late > 0 {
            return Err(Status::unavailable(format!(
                "{} samples of the batch became admissible while it was stored: send it again",
                late.not_late
            )));
        }
        Ok(late)
    }

    /// Refuses every batch once storing failed (see [`broken`](Self::broken)).
    fn storage_failed(&self) -> Result<(), Status> {
        if self.failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Status::unavailable(
                "the regional's storage failed earlier: it takes no batch until restarted",
            ));
        }
        Ok(())
    }

    /// Checks a batch and decodes its chunks: nothing is looked up or stored yet, so two
    /// batches of one session are prepared at once (see [`crate::order`]).
    fn prepare(&self, mut req: pb::PushRequest) -> Result<Prepared, Status> {
        self.storage_failed()?;
        if req.storage_id != self.id.0 {
            return Err(Status::failed_precondition(format!(
                "batch for storage {:?}, this regional's storage is {:?} (its data directory was replaced): \
                 say Hello again and send from the oldest data",
                req.storage_id, self.id.0
            )));
        }
        if req.series.len() > MAX_BATCH_SERIES {
            return Err(Status::invalid_argument(format!(
                "{} series in one batch, at most {MAX_BATCH_SERIES}",
                req.series.len()
            )));
        }
        // Chunks count by what they declare, before anything is decoded.
        let total = req
            .series
            .iter()
            .flat_map(|s| {
                std::iter::once(s.timestamps.len() as u64).chain(s.chunks.iter().map(|c| u64::from(c.samples)))
            })
            .fold(0u64, u64::saturating_add);
        if total > MAX_BATCH_SAMPLES as u64 {
            return Err(Status::invalid_argument(format!("{total} samples in one batch, at most {MAX_BATCH_SAMPLES}")));
        }
        let open_total = req
            .series
            .iter()
            .flat_map(|s| s.open_chunk.as_ref())
            .map(|c| u64::from(c.samples))
            .fold(0u64, u64::saturating_add);
        if open_total > MAX_BATCH_OPEN_SAMPLES as u64 {
            return Err(Status::invalid_argument(format!(
                "open chunks of {open_total} samples in one batch, at most {MAX_BATCH_OPEN_SAMPLES}"
            )));
        }
        if req.metadata.len() > MAX_BATCH_METADATA {
            return Err(Status::invalid_argument(format!(
                "{} metadata entries in one batch, at most {MAX_BATCH_METADATA}",
                req.metadata.len()
            )));
        }
        // Everything is checked before anything is created: a refused batch leaves no
        // series behind. Labels are read and chunks decoded before the sessions' lock is
        // taken (other edges' batches wait for it), and before the batch's turn.
        let mut pool = StringPool::default();
        let mut decoded = Vec::with_capacity(req.series.len());
        for (i, mut s) in std::mem::take(&mut req.series).into_iter().enumerate() {
            let bad = |reason: String| Status::invalid_argument(format!("series {i} of the batch: {reason}"));
            let whole = s.timestamps.is_empty();
            let (samples, chunks, open) = samples_and_chunks_of(&mut s, whole).map_err(bad)?;
            // Chunks alone may be stored as they came (see `Tsdb::commit_chunks`).
            let parts = (samples, if whole { chunks } else { Vec::new() }, open);
            if s.labels.is_empty() {
                // A series the session named before, by its number.
                if s.r#ref == 0 || req.session.is_empty() {
                    return Err(bad("no labels, and no session reference".into()));
                }
                decoded.push((Named::Before(s.r#ref), parts));
                continue;
            }
            let labels = labels_from_pb(std::mem::take(&mut s.labels), &mut pool).map_err(bad)?;
            if labels.get(METRIC_NAME).is_none() {
                return Err(bad(format!("no metric name in {labels}")));
            }
            decoded.push((Named::Here(labels, s.r#ref), parts));
        }
        Ok(Prepared { req, decoded, total })
    }

    /// Stores a prepared batch and syncs it (blocking: the WAL write and its `fsync`).
    fn apply(&self, prepared: Prepared) -> Result<pb::PushResponse, Status> {
        self.storage_failed()?;
        let Prepared { req, decoded, total } = prepared;
        let mut checked = Vec::with_capacity(decoded.len());
        let mut known = Vec::new();
        // One lock for the batch's lookups of numbered series.
        let mut sessions = self.sessions.0.lock();
        let mut session = sessions.get_mut(&req.session);
        if let Some(s) = session.as_mut() {
            s.used = std::time::Instant::now();
        }
        for (named, samples) in decoded {
            match named {
                Named::Before(r) => {
                    let Some(series) = session.as_ref().and_then(|x| x.refs.get(&r)).cloned() else {
                        return Err(Status::failed_precondition(format!(
                            "series reference {r} of session {:?} is not known here (a restart forgets sessions): start a new session",
                            req.session
                        )));
                    };
                    known.push((series, samples));
                }
                Named::Here(labels, r) => checked.push((labels, r, samples)),
            }
        }
        drop(sessions);
        // A batch that would pass the series limit creates none of its series: the sender
        // retries it (its lag shows) until the limit is raised or series go.
        // One lookup per series: those the head holds are resolved here, the others are
        // created below once the limit has room for all of them.
        let head = self.db.head();
        let held: Vec<Option<Arc<MemSeries>>> = checked.iter().map(|(l, _, _)| head.get(l)).collect();
        let missing = held.iter().filter(|s| s.is_none()).count();
        let max = self.db.options().max_series;
        if head.num_series().saturating_add(missing) > max {
            return Err(Status::resource_exhausted(format!(
                "the batch has {missing} new series and the regional holds {} of at most {max}",
                head.num_series()
            )));
        }
        let mut named = Vec::new();
        let mut resolved = Vec::with_capacity(checked.len() + known.len());
        for ((labels, r, samples), held) in checked.into_iter().zip(held) {
            let series = match held {
                Some(s) => s,
                None => self.db.series(&labels).map_err(|e| Status::resource_exhausted(e.to_string()))?,
            };
            if r != 0 && !req.session.is_empty() {
                named.push((r, series.clone()));
            }
            resolved.push((series, samples));
        }
        resolved.extend(known);
        // (Open chunks' samples are added once decoded: `commit_chunks` says what it took.)
        let mut span = resolved
            .iter()
            .flat_map(|(_, (samples, _, _))| samples.first().zip(samples.last()).map(|(a, z)| (a.t, z.t)))
            .fold(None, widen);
        // A series named twice in one batch (the protocol sends each once) goes in as
        // samples, in the batch's order.
        let mut seen: HashMap<SeriesRef, usize> = HashMap::with_capacity(resolved.len());
        for (series, _) in &resolved {
            *seen.entry(series.series_ref).or_default() += 1;
        }
        let mut batch = Vec::with_capacity(total as usize);
        let mut whole = Vec::new();
        for (series, (samples, chunks, open)) in resolved {
            if (!chunks.is_empty() || open.is_some()) && seen.get(&series.series_ref) == Some(&1) {
                whole.push(WholeChunks { series, chunks, samples, open });
            } else {
                batch.extend(samples.into_iter().map(|s| (series.clone(), s)));
                if let Some(o) = open {
                    let mut rest = Vec::new();
                    o.chunk
                        .decode_bounded(o.from, o.through, &mut rest)
                        .map_err(|e| Status::invalid_argument(format!("{}: its open chunk: {e}", series.labels)))?;
                    if let (Some(a), Some(z)) = (rest.first(), rest.last()) {
                        span = widen(span, (a.t, z.t));
                    }
                    batch.extend(rest.into_iter().map(|s| (series.clone(), s)));
                }
            }
        }
        if !named.is_empty() {
            self.sessions.remember(&req.session, named, 2 * self.db.options().max_series);
        }
        for m in req.metadata {
            let (family, meta) = metadata_from_pb(m);
            if !family.is_empty() {
                self.db
                    .set_metadata(&family, meta)
                    .map_err(|e| self.broken(format!("writing metadata to the WAL: {e}")))?;
            }
        }
        let adopted = if whole.is_empty() {
            Default::default()
        } else {
            self.db.commit_chunks(whole).map_err(|e| self.broken(format!("writing the WAL: {e}")))?
        };
        if let Some(open) = adopted.open_span {
            span = widen(span, open);
        }
        if let Some((series, why)) = adopted.damaged.first() {
            return Err(Status::invalid_argument(format!(
                "{} series with damaged chunks, the first {}: {why}",
                adopted.damaged.len(),
                series.labels
            )));
        }
        batch.extend(adopted.rest);
        let mut out = self.db.commit(&batch).map_err(|e| self.broken(format!("writing the WAL: {e}")))?;
        out.appended += adopted.adopted;
        // Samples older than the head admits (a backlog that arrived after other edges
        // moved the head on) go into blocks of their own rather than being refused.
        let late = self.late(&batch, &out.rejected)?;
        // Acknowledged means durable: the batch is in the WAL and on disk.
        self.db.sync_wal().map_err(|e| self.broken(format!("syncing the WAL: {e}")))?;
        if let (Some(arrived), Some((lo, hi))) = (&self.arrivals, span) {
            arrived(&req.upstream, lo, hi)
                .map_err(|e| Status::unavailable(format!("recording the batch's arrival: {e}: send it again")))?;
        }
        if let Some(w) = &self.watermarks {
            w.advance(&req.upstream, req.complete_until);
        }
        let mut resp = pb::PushResponse {
            appended: (out.appended + late.written) as u64,
            duplicates: out.ignored_duplicates as u64,
            out_of_bounds: late.too_old as u64,
            ..Default::default()
        };
        let mut first_conflict = None;
        for (r, s, e) in &out.rejected {
            match e {
                SampleError::DuplicateTimestamp => {
                    resp.conflicts += 1;
                    first_conflict.get_or_insert((*r, *s));
                }
                SampleError::OutOfOrder => resp.out_of_order += 1,
                SampleError::OutOfBounds => {}
                _ => resp.out_of_bounds += 1,
            }
        }
        if let Some((r, s)) = first_conflict {
            let series = self.db.head().series(r).map(|x| x.labels.to_string()).unwrap_or_default();
            tracing::warn!(
                conflicts = resp.conflicts,
                first_series = %series,
                timestamp = s.t,
                sent = s.v,
                "forward: samples whose timestamp is stored with another value; the stored values are kept"
            );
        }
        if resp.out_of_order + resp.out_of_bounds > 0 {
            tracing::warn!(
                out_of_order = resp.out_of_order,
                out_of_bounds = resp.out_of_bounds,
                "forward: samples refused"
            );
        }
        let st = &self.stats;
        st.batches.inc();
        st.count("appended", resp.appended);
        st.count("duplicate", resp.duplicates);
        st.count("conflict", resp.conflicts);
        st.count("out_of_order", resp.out_of_order);
        st.count("out_of_bounds", resp.out_of_bounds);
        Ok(resp)
    }
}

/// A series' samples as sent, checked: timestamps and values paired, then the chunks
/// decoded (each must hold the samples and range it declares), every timestamp after the
/// one before. The batch's total was bounded by what the chunks declare before this runs.
pub fn samples_of(s: &mut pb::ForwardSeries) -> Result<Vec<Sample>, String> {
    samples_and_chunks_of(s, false).map(|(samples, _, _)| samples)
}

/// `acc` widened to take in `(a, z)`.
fn widen(acc: Option<(i64, i64)>, (a, z): (i64, i64)) -> Option<(i64, i64)> {
    Some(acc.map_or((a, z), |(lo, hi)| (lo.min(a), hi.max(z))))
}

/// A series' samples as sent, the chunks they came in, and its open chunk (not decoded).
type SeriesParts = (Vec<Sample>, Vec<Chunk>, Option<OpenChunk>);

/// How a batch names a series.
enum Named {
    /// With its labels, and the number the session gives it (0: none).
    Here(Labels, u64),
    /// By the number an earlier batch of the session gave it.
    Before(u64),
}

/// A batch checked and decoded, not stored yet.
struct Prepared {
    /// The request, its series taken out.
    req: pb::PushRequest,
    decoded: Vec<(Named, SeriesParts)>,
    /// The samples it carries (chunks by what they declare).
    total: u64,
}

/// [`samples_of`], and the chunks they came in (checked): all of the samples when the
/// series came as chunks alone. With `keep_open`, an open chunk comes back as it came (its
/// samples are not among those returned), else decoded up to its bound with the rest.
fn samples_and_chunks_of(s: &mut pb::ForwardSeries, keep_open: bool) -> Result<SeriesParts, String> {
    if s.timestamps.len() != s.values.len() {
        return Err(format!("{} timestamps, {} values", s.timestamps.len(), s.values.len()));
    }
    let mut out: Vec<Sample> =
        s.timestamps.iter().zip(&s.values).map(|(&t, &v)| Sample::new(t, f64::from_bits(v))).collect();
    let mut chunks = Vec::with_capacity(s.chunks.len());
    for (k, c) in std::mem::take(&mut s.chunks).into_iter().enumerate() {
        let c = strata_grpc::chunk_from_pb(c).map_err(|e| format!("chunk {k}: {e}"))?;
        c.decode_checked(&mut out).map_err(|e| format!("chunk {k}: {e}"))?;
        chunks.push(c);
    }
    let mut open = None;
    if let Some(c) = s.open_chunk.take() {
        let c = strata_grpc::chunk_from_pb(c).map_err(|e| format!("its open chunk: {e}"))?;
        if c.n > strata_chunk::CHUNK_MAX_SAMPLES {
            return Err(format!("an open chunk of {} samples, at most {}", c.n, strata_chunk::CHUNK_MAX_SAMPLES));
        }
        // It must follow what came before it in the series.
        let from = out.last().map_or(s.open_from, |l| s.open_from.max(l.t.saturating_add(1)));
        if s.open_through < from {
            return Err("an open chunk that sends nothing after the series' other samples".into());
        }
        if keep_open {
            open = Some(OpenChunk { chunk: c, from, through: s.open_through });
        } else {
            c.decode_bounded(from, s.open_through, &mut out).map_err(|e| format!("its open chunk: {e}"))?;
        }
    }
    if out.is_empty() && open.is_none() {
        return Err("no samples".into());
    }
    if out.windows(2).any(|w| w[0].t >= w[1].t) {
        return Err("timestamps not increasing".into());
    }
    Ok((out, chunks, open))
}

#[tonic::async_trait]
impl Forward for ForwardReceiver {
    async fn hello(&self, req: Request<pb::HelloRequest>) -> Result<Response<pb::HelloResponse>, Status> {
        let _call = self.connections.as_ref().and_then(|c| c.call(req.remote_addr()));
        if let Some(senders) = self.senders.clone() {
            let labels = labels_from_pb(req.into_inner().external_labels, &mut StringPool::default())
                .map_err(|e| Status::invalid_argument(format!("external labels: {e}")))?;
            // A new sender is written down (and synced): off the async threads.
            let kept = tokio::task::spawn_blocking(move || (senders.saw(&labels), labels)).await;
            if let Ok((false, labels)) = kept {
                tracing::warn!(%labels, "forward: too many senders to remember another");
            }
        }
        Ok(Response::new(pb::HelloResponse {
            storage_id: self.id.0.clone(),
            max_batch_samples: MAX_BATCH_SAMPLES as u64,
            takes_chunks: true,
            takes_open_chunks: true,
            max_in_flight: MAX_IN_FLIGHT as u32,
            takes_zstd: true,
        }))
    }

    async fn push(&self, req: Request<pb::PushRequest>) -> Result<Response<pb::PushResponse>, Status> {
        let _call = self.connections.as_ref().and_then(|c| c.call(req.remote_addr()));
        let out = self.receive(req.into_inner()).await;
        if out.is_err() {
            self.stats.batches_refused.inc();
        }
        out.map(Response::new)
    }
}

impl ForwardReceiver {
    /// Prepares a batch, waits for its turn when it is numbered, and stores it.
    async fn receive(&self, req: pb::PushRequest) -> Result<pb::PushResponse, Status> {
        if req.session.len() > MAX_SESSION_NAME {
            return Err(Status::invalid_argument(format!(
                "a session name of {} bytes, at most {MAX_SESSION_NAME}",
                req.session.len()
            )));
        }
        // Admitted before anything is decoded (see `crate::order`); dropped unstored, the
        // admission fails the session's later batches.
        let admitted = match (req.seq, req.session.is_empty()) {
            (0, _) | (_, true) => None,
            (seq, false) => Some(self.order.admit(&req.session, seq)?),
        };
        let me = self.clone();
        let prepared = tokio::task::spawn_blocking(move || me.prepare(req))
            .await
            .map_err(|e| Status::internal(format!("decoding the batch: {e}")))??;
        let turn = match admitted {
            Some(a) => Some(a.turn().await?),
            None => None,
        };
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let out = me.apply(prepared);
            // Dropped unstored, the turn fails the session's later batches.
            if let (Ok(_), Some(turn)) = (&out, turn) {
                turn.stored();
            }
            out
        })
        .await
        .map_err(|e| Status::internal(format!("storing the batch: {e}")))?
    }
}
