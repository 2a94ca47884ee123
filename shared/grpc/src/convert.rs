//! Conversions between the model's types and the wire's, checked on the way in: what
//! arrives from the network is validated before it becomes a `Labels` or a `Chunk`.

use crate::pb;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use strata_chunk::{Chunk, CHUNK_MAX_SAMPLES};
use strata_model::{Label, Labels, MatchOp, Matcher, Metadata, MetricType};
use strata_store::{SelectLimits, StoreError};
use tonic::{Code, Status};

/// Labels per series and bytes per label set accepted from a peer (Prometheus' own
/// defaults are unlimited; these are far above any real series).
pub const MAX_LABELS: usize = 256;
pub const MAX_LABEL_BYTES: usize = 64 << 10;
/// A chunk larger than this is damage (960 samples of 16 bytes, doubled, as blocks check).
const MAX_CHUNK_BYTES: usize = 64 << 10;

pub fn labels_to_pb(l: &Labels) -> Vec<pb::Label> {
    l.iter().map(|x| pb::Label { name: x.name.to_string(), value: x.value.to_string() }).collect()
}

/// The strings of one response, shared: a fleet's series repeat the same few names and
/// values, and a million series would otherwise allocate each of them a million times.
#[derive(Default)]
pub struct StringPool(HashSet<Arc<str>, foldhash::fast::RandomState>);

impl StringPool {
    fn get(&mut self, s: String) -> Arc<str> {
        if let Some(x) = self.0.get(s.as_str()) {
            return x.clone();
        }
        let a: Arc<str> = s.into();
        // Bounded: past this many distinct strings, new ones are not kept (still correct).
        if self.0.len() < 1 << 20 {
            self.0.insert(a.clone());
        }
        a
    }
}

/// Labels from a peer: bounded, names valid, sorted and unique (as a series' labels are).
pub fn labels_from_pb(v: Vec<pb::Label>, pool: &mut StringPool) -> Result<Labels, String> {
    let hint = v.len().min(MAX_LABELS);
    checked_labels(v.into_iter().map(|l| (pool.get(l.name), pool.get(l.value))), hint)
}

/// Labels from `(name, value)` pairs a peer sent, checked: at most [`MAX_LABELS`] and
/// [`MAX_LABEL_BYTES`], names valid, sorted and unique; empty values dropped.
fn checked_labels(pairs: impl Iterator<Item = (Arc<str>, Arc<str>)>, hint: usize) -> Result<Labels, String> {
    let (mut out, mut bytes): (Vec<Label>, usize) = (Vec::with_capacity(hint), 0);
    for (k, (name, value)) in pairs.enumerate() {
        if k >= MAX_LABELS {
            return Err(format!("a series with more than {MAX_LABELS} labels"));
        }
        bytes += name.len() + value.len();
        if bytes > MAX_LABEL_BYTES {
            return Err(format!("a label set of more than {MAX_LABEL_BYTES} bytes"));
        }
        if !strata_model::is_valid_label_name(&name) {
            return Err(format!("invalid label name {name:?}"));
        }
        if value.is_empty() {
            continue;
        }
        if out.last().is_some_and(|p| p.name >= name) {
            return Err(format!("labels not sorted or repeated at {name:?}"));
        }
        out.push(Label { name, value });
    }
    Ok(Labels::from_sorted_unchecked(out))
}

/// One frame's symbols, as the series of the frame refer to them.
pub struct FrameSymbols(Vec<Arc<str>>);

impl FrameSymbols {
    /// The frame's strings, each taken through the response's pool.
    pub fn new(symbols: Vec<String>, pool: &mut StringPool) -> Self {
        FrameSymbols(symbols.into_iter().map(|s| pool.get(s)).collect())
    }

    /// A series' labels from its `label_refs`: pairs of indexes, each within the frame.
    pub fn labels(&self, refs: &[u32]) -> Result<Labels, String> {
        if !refs.len().is_multiple_of(2) {
            return Err(format!("{} label references: not (name, value) pairs", refs.len()));
        }
        if let Some(i) = refs.iter().find(|&&i| i as usize >= self.0.len()) {
            return Err(format!("label reference {i} past the frame's {} symbols", self.0.len()));
        }
        let sym = |i: u32| self.0[i as usize].clone();
        checked_labels(refs.chunks_exact(2).map(|p| (sym(p[0]), sym(p[1]))), refs.len() / 2)
    }
}

/// Builds a frame's symbol table as its series are added.
#[derive(Default)]
pub struct SymbolTable {
    index: HashMap<Arc<str>, u32, foldhash::fast::RandomState>,
    symbols: Vec<String>,
}

impl SymbolTable {
    /// `labels` as `label_refs`, adding the strings the table lacks.
    pub fn refs(&mut self, labels: &Labels) -> Vec<u32> {
        let mut out = Vec::with_capacity(labels.len() * 2);
        for l in labels.iter() {
            for s in [&l.name, &l.value] {
                let next = self.symbols.len() as u32;
                let i = *self.index.entry(s.clone()).or_insert(next);
                if i == next {
                    self.symbols.push(s.to_string());
                }
                out.push(i);
            }
        }
        out
    }

    /// The symbols so far (the table starts afresh: each frame stands alone).
    pub fn take(&mut self) -> Vec<String> {
        self.index.clear();
        std::mem::take(&mut self.symbols)
    }

    /// Bytes the symbols take in the frame.
    pub fn bytes(&self) -> usize {
        self.symbols.iter().map(|s| s.len() + 2).sum()
    }
}

pub fn matcher_to_pb(m: &Matcher) -> pb::LabelMatcher {
    let t = match m.op {
        MatchOp::Equal => pb::label_matcher::Type::Eq,
        MatchOp::NotEqual => pb::label_matcher::Type::Neq,
        MatchOp::Regex => pb::label_matcher::Type::Re,
        MatchOp::NotRegex => pb::label_matcher::Type::Nre,
    };
    pb::LabelMatcher { r#type: t as i32, name: m.name.clone(), value: m.value.clone() }
}

pub fn matchers_from_pb(v: &[pb::LabelMatcher]) -> Result<Vec<Matcher>, Status> {
    if v.len() > MAX_LABELS {
        return Err(Status::invalid_argument(format!("{} matchers (at most {MAX_LABELS})", v.len())));
    }
    v.iter()
        .map(|m| {
            let op = match pb::label_matcher::Type::try_from(m.r#type) {
                Ok(pb::label_matcher::Type::Eq) => MatchOp::Equal,
                Ok(pb::label_matcher::Type::Neq) => MatchOp::NotEqual,
                Ok(pb::label_matcher::Type::Re) => MatchOp::Regex,
                Ok(pb::label_matcher::Type::Nre) => MatchOp::NotRegex,
                Err(_) => return Err(Status::invalid_argument(format!("unknown matcher type {}", m.r#type))),
            };
            Matcher::new(op, &m.name, &m.value).map_err(|e| Status::invalid_argument(e.to_string()))
        })
        .collect()
}

pub fn metric_type_to_pb(t: MetricType) -> pb::MetricType {
    match t {
        MetricType::Counter => pb::MetricType::Counter,
        MetricType::Gauge => pb::MetricType::Gauge,
        MetricType::Histogram => pb::MetricType::Histogram,
        MetricType::GaugeHistogram => pb::MetricType::GaugeHistogram,
        MetricType::Summary => pb::MetricType::Summary,
        MetricType::Info => pb::MetricType::Info,
        MetricType::StateSet => pb::MetricType::Stateset,
        MetricType::Unknown => pb::MetricType::Unknown,
    }
}

/// An unknown number (a newer peer) is `Unknown`, which dedup treats conservatively.
pub fn metric_type_from_pb(v: i32) -> MetricType {
    match pb::MetricType::try_from(v) {
        Ok(pb::MetricType::Counter) => MetricType::Counter,
        Ok(pb::MetricType::Gauge) => MetricType::Gauge,
        Ok(pb::MetricType::Histogram) => MetricType::Histogram,
        Ok(pb::MetricType::GaugeHistogram) => MetricType::GaugeHistogram,
        Ok(pb::MetricType::Summary) => MetricType::Summary,
        Ok(pb::MetricType::Info) => MetricType::Info,
        Ok(pb::MetricType::Stateset) => MetricType::StateSet,
        _ => MetricType::Unknown,
    }
}

pub fn metadata_to_pb(family: &str, m: &Metadata) -> pb::FamilyMetadata {
    pb::FamilyMetadata {
        family: family.to_string(),
        r#type: metric_type_to_pb(m.metric_type) as i32,
        help: m.help.clone(),
        unit: m.unit.clone(),
    }
}

pub fn metadata_from_pb(f: pb::FamilyMetadata) -> (String, Metadata) {
    (f.family, Metadata { metric_type: metric_type_from_pb(f.r#type), help: f.help, unit: f.unit })
}

pub fn chunk_to_pb(c: &Chunk) -> pb::Chunk {
    pb::Chunk {
        min_time: c.min_t,
        max_time: c.max_t,
        samples: c.n as u32,
        // Shares the chunk's bytes: the frame copies them once, as it is encoded.
        data: bytes::Bytes::from_owner(c.data.clone()),
        aggregate: pb::Aggregate::Raw as i32,
        resolution_ms: 0,
    }
}

/// A run of a series' windows as a chunk of its resolution.
pub fn aggregate_chunk_to_pb(c: &strata_store::AggregateChunk, resolution: i64) -> pb::Chunk {
    pb::Chunk {
        min_time: c.first_end,
        max_time: c.last_end,
        samples: c.windows,
        data: bytes::Bytes::copy_from_slice(&c.data),
        aggregate: pb::Aggregate::Windows as i32,
        resolution_ms: resolution,
    }
}

/// A chunk of windows from a peer, asked at `resolution` for window ends in `[start, end]`:
/// what it says of itself must fit (its ends on the resolution's grid and inside the range,
/// no more windows than fit between them); its bytes are checked against that as they are
/// decoded (`strata_downsample::decode_served`).
pub fn aggregate_chunk_from_pb(
    c: pb::Chunk,
    resolution: i64,
    (start, end): (i64, i64),
) -> Result<strata_store::AggregateChunk, String> {
    if c.aggregate != pb::Aggregate::Windows as i32 || c.resolution_ms != resolution {
        return Err(format!(
            "a chunk of aggregate {} at {} ms where windows of {resolution} ms were asked",
            c.aggregate, c.resolution_ms
        ));
    }
    if resolution <= 0 {
        return Err(format!("windows of {resolution} ms"));
    }
    let on_grid = |t: i64| t.rem_euclid(resolution) == 0 && t >= start && t <= end;
    let fit = (i128::from(c.max_time) - i128::from(c.min_time)) / i128::from(resolution) + 1;
    if !on_grid(c.min_time) || !on_grid(c.max_time) || i128::from(c.samples) > fit {
        return Err(format!(
            "a chunk of {} windows over [{}, {}]: off the {resolution} ms grid, outside [{start}, {end}] or overfull",
            c.samples, c.min_time, c.max_time
        ));
    }
    if c.samples == 0
        || c.min_time > c.max_time
        || c.data.is_empty()
        || c.data.len() > strata_store::MAX_AGGREGATE_CHUNK_BYTES
    {
        return Err(format!(
            "a chunk of {} windows in {} bytes over [{}, {}]: empty, oversized or reversed",
            c.samples,
            c.data.len(),
            c.min_time,
            c.max_time
        ));
    }
    Ok(strata_store::AggregateChunk {
        first_end: c.min_time,
        last_end: c.max_time,
        windows: c.samples,
        data: c.data.to_vec(),
    })
}

/// A chunk from a peer: its header must be plausible; its samples are checked as they are
/// decoded (the decoder refuses data that runs out or overruns).
pub fn chunk_from_pb(c: pb::Chunk) -> Result<Chunk, String> {
    let n = u16::try_from(c.samples).ok().filter(|&n| n > 0 && n <= CHUNK_MAX_SAMPLES);
    let Some(n) = n else {
        return Err(format!("a chunk of {} samples (1 to {CHUNK_MAX_SAMPLES})", c.samples));
    };
    if c.min_time > c.max_time || c.data.is_empty() || c.data.len() > MAX_CHUNK_BYTES {
        return Err(format!(
            "a chunk of {} bytes over [{}, {}]: empty, oversized or reversed",
            c.data.len(),
            c.min_time,
            c.max_time
        ));
    }
    if c.aggregate != pb::Aggregate::Raw as i32 || c.resolution_ms != 0 {
        return Err("a downsampled chunk where raw data was asked".into());
    }
    Ok(Chunk { data: Arc::from(&c.data[..]), n, min_t: c.min_time, max_t: c.max_time })
}

/// A store's error as a gRPC status: limits are `RESOURCE_EXHAUSTED`, bad requests
/// `INVALID_ARGUMENT`, damage `DATA_LOSS`.
pub fn status_from_store_error(e: StoreError) -> Status {
    let code = match e {
        StoreError::LimitExceeded { .. } => Code::ResourceExhausted,
        StoreError::InvalidRequest(_) => Code::InvalidArgument,
        StoreError::Unavailable(_) => Code::Unavailable,
        StoreError::Corrupt { .. } => Code::DataLoss,
    };
    Status::new(code, e.to_string())
}

/// A status from a peer as the store error the engine reports, naming the store. A limit
/// the peer enforced is the same limit error the local store gives (`limits` are those
/// the request carried), so callers see one error whichever side stopped first.
pub fn store_error_from_status(store: &str, s: &Status, limits: SelectLimits) -> StoreError {
    // A status made on this side (a connection or TLS failure) keeps its cause in its
    // source chain; the message alone says only "transport error".
    let mut msg = format!("store {store}: {}", s.message());
    let (mut cause, mut last) = (std::error::Error::source(s), s.message().to_string());
    while let Some(c) = cause {
        let text = c.to_string();
        if text != last {
            msg.push_str(&format!(": {text}"));
        }
        (cause, last) = (c.source(), text);
    }
    // The limit the peer applied, as its message spells it ("samples limit of N exceeded"),
    // else the request's: the fan-out tells the request's own limit from a store's lower one.
    let limit_in = |what: &str, requested: u64| {
        s.message()
            .strip_prefix(what)
            .and_then(|m| m.strip_prefix(" limit of "))
            .and_then(|m| m.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(requested)
    };
    match s.code() {
        Code::InvalidArgument => StoreError::InvalidRequest(msg),
        Code::ResourceExhausted if s.message().starts_with("samples limit") => {
            StoreError::LimitExceeded { what: "samples", limit: limit_in("samples", limits.max_samples) }
        }
        Code::ResourceExhausted if s.message().starts_with("series limit") => {
            let requested = u64::try_from(limits.max_series).unwrap_or(u64::MAX);
            StoreError::LimitExceeded { what: "series", limit: limit_in("series", requested) }
        }
        Code::ResourceExhausted => StoreError::Unavailable(format!("{msg} (a limit)")),
        Code::DataLoss => StoreError::Corrupt { series: String::new(), reason: msg },
        Code::DeadlineExceeded => StoreError::Unavailable(format!("store {store}: deadline exceeded")),
        code => StoreError::Unavailable(format!("{msg} ({code:?})")),
    }
}
