//! A series' windows as bytes: a short header, then one column per quantity in the chunk
//! crate's value coding (`strata_chunk::column`), each a run of numbers its predictor
//! follows well (window indexes, counts, offsets of samples inside their window, values).
//! A column may instead hold its difference from an earlier one (a counter's `min` from
//! its `first`: zero but at a reset) when that is smaller and adds back bit for bit. Only
//! the columns [`Kept`] asks for are written. Decoding checks every column against the
//! others, so a damaged or hostile chunk is an error, never a window that lies about its
//! times, and nothing is allocated that the bytes cannot fill.

use crate::columns::{Fields, WindowColumns};
use crate::leaf::Leaf;
use crate::range::RangeFn;
use crate::window::Window;
use crate::Kept;
use strata_chunk::column::{decode_values, encode_values};
use strata_model::Sample;

/// Version 2 chunks may hold columns in the block coding (`strata_chunk::column`), which a
/// reader of version 1 would misread as the streaming coding: it refuses them instead.
const VERSION: u8 = 2;
/// Chunks whose columns are all in the streaming coding keep the version that reads them.
const STREAMING_ONLY: u8 = 1;
/// Windows per chunk at most (a year of 5 m windows is 105,120).
pub const MAX_WINDOWS: usize = 1 << 17;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("aggregate chunk: {0}")]
    Invalid(String),
}

fn invalid<T>(what: impl Into<String>) -> Result<T, DecodeError> {
    Err(DecodeError::Invalid(what.into()))
}

/// The columns, in the order written; a column's `base` is one written before it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Col {
    Window,
    Count,
    FirstOffset,
    First,
    LastOffset,
    Last,
    GapBeforeLast,
    BeforeLast,
    MarkerOffset,
    Sum,
    Min,
    Max,
    Nan,
    Changes,
    Resets,
    Correction,
    M2n,
    Sx,
    Sxx,
    Sxy,
    MinOffset,
    MaxOffset,
}

/// Written in this order; the last two came later, and a chunk without them (its `Kept`
/// says so) still reads.
const ALL: [Col; 22] = [
    Col::Window,
    Col::Count,
    Col::FirstOffset,
    Col::First,
    Col::LastOffset,
    Col::Last,
    Col::GapBeforeLast,
    Col::BeforeLast,
    Col::MarkerOffset,
    Col::Sum,
    Col::Min,
    Col::Max,
    Col::Nan,
    Col::Changes,
    Col::Resets,
    Col::Correction,
    Col::M2n,
    Col::Sx,
    Col::Sxx,
    Col::Sxy,
    Col::MinOffset,
    Col::MaxOffset,
];

impl Col {
    fn name(self) -> &'static str {
        match self {
            Col::Window => "window",
            Col::Count => "count",
            Col::FirstOffset => "first offset",
            Col::First => "first",
            Col::LastOffset => "last offset",
            Col::Last => "last",
            Col::GapBeforeLast => "gap before last",
            Col::BeforeLast => "before last",
            Col::MarkerOffset => "marker offset",
            Col::Sum => "sum",
            Col::Min => "min",
            Col::Max => "max",
            Col::Nan => "NaN",
            Col::Changes => "changes",
            Col::Resets => "resets",
            Col::Correction => "reset correction",
            Col::M2n => "count × M2",
            Col::Sx => "Σx",
            Col::Sxx => "Σx²",
            Col::Sxy => "Σxy",
            Col::MinOffset => "min offset",
            Col::MaxOffset => "max offset",
        }
    }

    fn kept(self, k: Kept) -> bool {
        match self {
            Col::Correction => k.correction,
            Col::M2n => k.moments,
            Col::Sx | Col::Sxx | Col::Sxy => k.least_squares,
            Col::MinOffset | Col::MaxOffset => k.extreme_times,
            _ => true,
        }
    }

    /// The column this one may be stored as a difference from. The extremes' times are
    /// measured as the first's and last's are, so a counter's (its first and last sample,
    /// but when it resets or stands still) differ from them by nothing.
    fn base(self) -> Option<Col> {
        match self {
            Col::Min => Some(Col::First),
            Col::Max => Some(Col::Last),
            Col::BeforeLast => Some(Col::Last),
            Col::MinOffset => Some(Col::FirstOffset),
            Col::MaxOffset => Some(Col::LastOffset),
            _ => None,
        }
    }

    /// The window's number in this column. A window with no values (only a staleness
    /// marker) writes zeros where it has nothing, which costs a bit or two.
    fn of(self, w: &Window, width: i64) -> f64 {
        let has = |v: f64| if w.count > 0 { v } else { 0.0 };
        match self {
            Col::Window => (w.end / width) as f64,
            Col::Count => f64::from(w.count),
            Col::FirstOffset => has((w.first.t - (w.end - width)) as f64),
            Col::First => has(w.first.v),
            Col::LastOffset => has((w.end - w.last.t) as f64),
            Col::Last => has(w.last.v),
            Col::GapBeforeLast => w.penult.map_or(0.0, |p| (w.last.t - p.t) as f64),
            Col::BeforeLast => w.penult.map_or(has(w.last.v), |p| p.v),
            Col::MarkerOffset => w.stale.map_or(0.0, |t| (w.end - t + 1) as f64),
            Col::Sum => has(w.sum),
            Col::Min => has(w.min),
            Col::Max => has(w.max),
            Col::Nan => f64::from(u8::from(w.nan)),
            Col::Changes => f64::from(w.changes),
            Col::Resets => f64::from(w.resets),
            Col::Correction => w.correction,
            Col::M2n => w.m2n,
            Col::Sx => w.sx,
            Col::Sxx => w.sxx,
            Col::Sxy => w.sxy,
            Col::MinOffset => has((w.min_t - (w.end - width)) as f64),
            Col::MaxOffset => has((w.end - w.max_t) as f64),
        }
    }
}

/// How a column is stored.
const RAW: u8 = 0;
const DIFFERENCE: u8 = 1;

/// `windows` (time-ordered, aligned to `width` ms), keeping what `kept` asks for.
pub fn encode(windows: &[Window], width: i64, kept: Kept) -> Vec<u8> {
    let cols = columns(windows, width, kept);
    let block_coded = cols.iter().any(|(_, _, c)| strata_chunk::column::is_block_coded(c));
    let mut out = vec![if block_coded { VERSION } else { STREAMING_ONLY }, kept.byte()];
    put_varint(&mut out, width as u64);
    put_varint(&mut out, windows.len() as u64);
    for (_, mode, c) in cols {
        out.push(mode);
        put_varint(&mut out, c.len() as u64);
        out.extend_from_slice(&c);
    }
    out
}

/// Each column's name and encoded size: where an aggregate chunk's bytes go.
pub fn column_sizes(windows: &[Window], width: i64, kept: Kept) -> Vec<(&'static str, usize)> {
    columns(windows, width, kept).into_iter().map(|(c, _, bytes)| (c.name(), bytes.len())).collect()
}

fn columns(windows: &[Window], width: i64, kept: Kept) -> Vec<(Col, u8, Vec<u8>)> {
    let values = |c: Col| windows.iter().map(|w| c.of(w, width)).collect::<Vec<f64>>();
    ALL.iter()
        .filter(|c| c.kept(kept))
        .map(|&c| {
            let v = values(c);
            let raw = encode_values(&v);
            let Some(base) = c.base() else { return (c, RAW, raw) };
            let b = values(base);
            let d: Vec<f64> = v.iter().zip(&b).map(|(v, b)| v - b).collect();
            let exact = v.iter().zip(&b).zip(&d).all(|((v, b), d)| (b + d).to_bits() == v.to_bits());
            match exact.then(|| encode_values(&d)) {
                Some(diff) if diff.len() < raw.len() => (c, DIFFERENCE, diff),
                _ => (c, RAW, raw),
            }
        })
        .collect()
}

/// Which columns to decode: a leaf reads a few of them, and decoding is most of what
/// answering from aggregates costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted(u32);

impl Wanted {
    pub const ALL: Wanted = Wanted(u32::MAX);

    fn of(cols: &[Col]) -> Wanted {
        Wanted(cols.iter().fold((1 << Col::Window as u32) | (1 << Col::Count as u32), |m, c| m | 1 << *c as u32))
    }

    fn has(self, c: Col) -> bool {
        self.0 & (1 << c as u32) != 0
    }

    /// The columns either wants.
    pub fn and(self, o: Wanted) -> Wanted {
        Wanted(self.0 | o.0)
    }

    /// Whether every column `o` wants is among these.
    pub fn covers(self, o: Wanted) -> bool {
        o.0 & !self.0 == 0
    }

    /// The fields of [`WindowColumns`] these columns fill.
    pub fn fields(self) -> Fields {
        use Col::*;
        let any = |cs: &[Col]| cs.iter().any(|c| self.has(*c));
        Fields {
            first: any(&[FirstOffset, First]),
            last: any(&[LastOffset, Last]),
            penult: any(&[GapBeforeLast, BeforeLast]),
            stale: any(&[MarkerOffset]),
            sum: any(&[Sum]),
            min: any(&[Min]),
            max: any(&[Max]),
            nan: any(&[Nan]),
            m2n: any(&[M2n]),
            changes: any(&[Changes]),
            resets: any(&[Resets]),
            correction: any(&[Correction]),
            least_squares: any(&[Sx, Sxx, Sxy]),
            extreme_times: any(&[MinOffset, MaxOffset]),
        }
    }

    /// The columns a leaf reads.
    pub fn for_leaf(leaf: &Leaf) -> Wanted {
        use Col::*;
        let Leaf::Range { function, .. } = leaf else { return Wanted::of(&[LastOffset, Last, MarkerOffset]) };
        Wanted::of(match function {
            RangeFn::CountOverTime | RangeFn::PresentOverTime => &[],
            RangeFn::SumOverTime | RangeFn::AvgOverTime => &[Sum],
            RangeFn::MinOverTime | RangeFn::MaxOverTime => &[First, Last, Min, Max],
            RangeFn::TsOfMinOverTime | RangeFn::TsOfMaxOverTime => &[Last, Min, Max, MinOffset, MaxOffset],
            RangeFn::LastOverTime | RangeFn::TsOfLastOverTime => &[LastOffset, Last],
            RangeFn::FirstOverTime | RangeFn::TsOfFirstOverTime => &[FirstOffset, First],
            RangeFn::Rate | RangeFn::Increase => &[FirstOffset, First, LastOffset, Last, Correction],
            RangeFn::Delta => &[FirstOffset, First, LastOffset, Last],
            RangeFn::Irate | RangeFn::Idelta => &[LastOffset, Last, GapBeforeLast, BeforeLast],
            RangeFn::Changes | RangeFn::Resets => &[First, Last, Changes, Resets],
            RangeFn::StddevOverTime | RangeFn::StdvarOverTime => &[Sum, M2n],
            RangeFn::Deriv | RangeFn::PredictLinear(_) => &[First, Last, Min, Max, Nan, Sum, Sx, Sxx, Sxy],
        })
    }
}

/// A chunk's width, window count and kept aggregates, from its header alone.
pub fn header(bytes: &[u8]) -> Result<(i64, u64, Kept), DecodeError> {
    read_header(&mut Reader { bytes, pos: 0 })
}

fn read_header(r: &mut Reader) -> Result<(i64, u64, Kept), DecodeError> {
    if !matches!(r.byte()?, STREAMING_ONLY | VERSION) {
        return invalid("unknown version");
    }
    let b = r.byte()?;
    let Some(kept) = Kept::from_byte(b) else { return invalid(format!("unknown columns {b:#x}")) };
    let width = i64::try_from(r.varint()?).ok().filter(|&w| w > 0 && w <= 1 << 40);
    let Some(width) = width else { return invalid("a window width out of range") };
    let n = r.varint()?;
    if n > MAX_WINDOWS as u64 {
        return invalid(format!("{n} windows, more than {MAX_WINDOWS}"));
    }
    Ok((width, n, kept))
}

/// The windows of a chunk a store served at `resolution`, checked against what its header
/// and the chunk's description claim (width, count, first and last ends) before anything
/// is decoded past the header.
pub fn decode_served(c: &strata_store::AggregateChunk, resolution: i64) -> Result<(Vec<Window>, Kept), DecodeError> {
    let (width, n, _) = header(&c.data)?;
    if width != resolution || n != u64::from(c.windows) {
        return invalid(format!("a chunk of {n} windows of {width} ms described as {} of {resolution} ms", c.windows));
    }
    let (windows, _, kept) = decode(&c.data)?;
    if windows.first().map(|w| w.end) != Some(c.first_end) || windows.last().map(|w| w.end) != Some(c.last_end) {
        return invalid(format!("windows that do not span [{}, {}] as described", c.first_end, c.last_end));
    }
    Ok((windows, kept))
}

/// The windows, width and kept aggregates [`encode`] wrote.
pub fn decode(bytes: &[u8]) -> Result<(Vec<Window>, i64, Kept), DecodeError> {
    decode_wanted(bytes, Wanted::ALL)
}

/// [`decode_wanted`] kept as columns, the fields the `wanted` columns fill and no others:
/// what a cache holds of a chunk for the queries to come.
pub fn decode_columns(bytes: &[u8], wanted: Wanted) -> Result<(WindowColumns, i64, Kept), DecodeError> {
    let (windows, width, kept) = decode_wanted(bytes, wanted)?;
    Ok((WindowColumns::with_fields(&windows, wanted.fields()), width, kept))
}

/// [`decode`] of the `wanted` columns only (and those they are stored relative to); the
/// others are left NaN, zero or absent in the windows.
pub fn decode_wanted(bytes: &[u8], wanted: Wanted) -> Result<(Vec<Window>, i64, Kept), DecodeError> {
    let mut r = Reader { bytes, pos: 0 };
    let (width, n, kept) = read_header(&mut r)?;
    let n = n as usize;
    let mut cols: Vec<Option<Vec<f64>>> = vec![None; ALL.len()];
    for c in ALL.iter().filter(|c| c.kept(kept)) {
        let mode = r.byte()?;
        let len = usize::try_from(r.varint()?).map_err(|_| DecodeError::Invalid("a column length".into()))?;
        let data = r.take(len)?;
        let base_of_wanted = ALL.iter().any(|w| wanted.has(*w) && w.base() == Some(*c));
        if !wanted.has(*c) && !base_of_wanted {
            continue;
        }
        // A value takes at least a bit, or an eighth of one in the block coding's zero
        // partitions (64 values in 8 bits): a count the bytes cannot hold is refused before
        // anything is allocated for it.
        if n > data.len().saturating_mul(64) {
            return invalid(format!("{}: {n} values in {} bytes", c.name(), data.len()));
        }
        let mut v = Vec::with_capacity(n);
        decode_values(data, n, &mut v).map_err(|e| DecodeError::Invalid(format!("{}: {e}", c.name())))?;
        match (mode, c.base()) {
            (RAW, _) => {}
            (DIFFERENCE, Some(base)) => {
                let b = cols[base as usize].as_ref().ok_or_else(|| DecodeError::Invalid("a missing base".into()))?;
                v.iter_mut().zip(b).for_each(|(d, b)| *d += b);
            }
            _ => return invalid(format!("{}: unknown mode {mode}", c.name())),
        }
        cols[*c as usize] = Some(v);
    }
    if r.pos != bytes.len() {
        return invalid("bytes after the last column");
    }
    let mut out: Vec<Window> = Vec::with_capacity(n);
    for i in 0..n {
        out.push(window(&cols, i, width, out.last())?);
    }
    Ok((out, width, kept))
}

/// Window `i` from the decoded columns, checked against itself and the one before (as
/// far as the columns decoded tell).
fn window(cols: &[Option<Vec<f64>>], i: usize, width: i64, prev: Option<&Window>) -> Result<Window, DecodeError> {
    let c = |k: Col| cols[k as usize].as_ref().map_or(f64::NAN, |v| v[i]);
    let int = |k: Col, lo: i64, hi: i64| -> Result<Option<i64>, DecodeError> {
        let Some(x) = cols[k as usize].as_ref().map(|v| v[i]) else { return Ok(None) };
        let i = x as i64;
        if i as f64 != x || i < lo || i > hi {
            return invalid(format!("{} {x} out of range", k.name()));
        }
        Ok(Some(i))
    };
    let must =
        |k: Col, lo: i64, hi: i64| int(k, lo, hi)?.ok_or_else(|| DecodeError::Invalid(format!("no {}", k.name())));
    let end = must(Col::Window, i64::MIN / width + 1, i64::MAX / width)? * width;
    if prev.is_some_and(|p| p.end >= end) {
        return invalid("window ends that do not increase");
    }
    let count = must(Col::Count, 0, i64::from(u32::MAX))? as u32;
    let start = end - width;
    let first_t = int(Col::FirstOffset, 0, width)?.map(|o| start + o);
    let last_t = int(Col::LastOffset, 0, width)?.map(|o| end - o);
    let marker = int(Col::MarkerOffset, 0, width)?;
    let stale = marker.filter(|&o| o > 0).map(|o| end - o + 1);
    let gap = int(Col::GapBeforeLast, 0, width)?;
    let penult = gap.filter(|&g| g > 0).map(|g| Sample { t: last_t.unwrap_or(end) - g, v: c(Col::BeforeLast) });
    let consistent = match count {
        0 => marker.is_none_or(|_| stale.is_some()) && gap.is_none_or(|_| penult.is_none()),
        1 => first_t.zip(last_t).is_none_or(|(f, l)| f > start && f == l) && gap.is_none_or(|_| penult.is_none()),
        _ => {
            first_t.zip(last_t).is_none_or(|(f, l)| f > start && f < l)
                && gap.is_none_or(|_| penult.is_some_and(|p| first_t.is_none_or(|f| p.t >= f)))
        }
    };
    if !consistent {
        return invalid(format!("window ending at {end}: samples that do not fit its count {count}"));
    }
    // An extreme is one of the window's samples: within it, between its first and last.
    let min_t = int(Col::MinOffset, 0, width)?.map(|o| start + o);
    let max_t = int(Col::MaxOffset, 0, width)?.map(|o| end - o);
    let within = |t: Option<i64>| {
        count == 0 || t.is_none_or(|t| t > start && first_t.is_none_or(|f| t >= f) && last_t.is_none_or(|l| t <= l))
    };
    if !within(min_t) || !within(max_t) {
        return invalid(format!("window ending at {end}: an extreme's time outside its samples"));
    }
    let small = |k: Col| int(k, 0, i64::from(count)).map(|x| x.unwrap_or(0) as u32);
    let nothing = Sample { t: end, v: f64::NAN };
    let (first, last) = match count {
        0 => (nothing, nothing),
        _ => (
            Sample { t: first_t.unwrap_or(start + 1), v: c(Col::First) },
            Sample { t: last_t.unwrap_or(end), v: c(Col::Last) },
        ),
    };
    let (min, max) = if count == 0 { (f64::NAN, f64::NAN) } else { (c(Col::Min), c(Col::Max)) };
    let (min_t, max_t) = if count == 0 { (end, end) } else { (min_t.unwrap_or(end), max_t.unwrap_or(end)) };
    Ok(Window {
        end,
        count,
        first,
        last,
        penult,
        stale,
        sum: c(Col::Sum),
        min,
        max,
        min_t,
        max_t,
        nan: int(Col::Nan, 0, 1)? == Some(1),
        m2n: c(Col::M2n),
        changes: small(Col::Changes)?,
        resets: small(Col::Resets)?,
        correction: c(Col::Correction),
        sx: c(Col::Sx),
        sxx: c(Col::Sxx),
        sxy: c(Col::Sxy),
    })
}

fn put_varint(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = *self.bytes.get(self.pos).ok_or_else(|| DecodeError::Invalid("ends early".into()))?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut x = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            x |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(x);
            }
        }
        invalid("a varint longer than ten bytes")
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(len).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else { return invalid("a column longer than the chunk") };
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }
}
