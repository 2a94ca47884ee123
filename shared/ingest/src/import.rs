//! Backfill from an OpenMetrics file (as `promtool tsdb create-blocks-from openmetrics`
//! reads): samples with timestamps, in time order per series, into a [`Tsdb`].
//!
//! The file is read in pieces cut at line ends, so a multi-gigabyte file never sits in
//! memory; series are resolved through a cache keyed by their raw text, as the scrape path
//! does, and appended in batches.

use crate::exposition::{self, Entry, Format, ParseError};
use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use strata_model::{Metadata, Sample};
use strata_tsdb::db::{Tsdb, TsdbError};
use strata_tsdb::head::{HeadError, MemSeries};

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("reading the input: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Parse(#[from] ParseError),
    #[error("sample without a timestamp at line {0}: an import needs timestamps")]
    NoTimestamp(usize),
    #[error(transparent)]
    Head(#[from] HeadError),
    #[error(transparent)]
    Store(#[from] TsdbError),
    #[error("line {0} is longer than {PIECE} bytes")]
    LineTooLong(usize),
    #[error("the input ends without \"# EOF\" (cut off?): {samples} samples before line {line} were imported, the rest was not")]
    NoEof { line: usize, samples: u64 },
    #[error("\"# EOF\" before the end of the input")]
    EofInside,
    /// The file cannot be imported in parts as it is (see [`import_openmetrics_file`]).
    #[error("importing in parts: {0}")]
    Parallel(String),
}

#[derive(Debug, Default, Clone, Copy)]
pub struct ImportStats {
    /// Parts of the file read side by side (1: one pass).
    pub parts: u64,
    pub samples: u64,
    pub rejected: u64,
    pub series: u64,
    pub bytes: u64,
}

const PIECE: usize = 16 << 20;
const BATCH: usize = 200_000;

/// Imports everything `input` holds; `progress` is called with running totals.
pub fn import_openmetrics(
    db: &Tsdb,
    input: impl Read,
    mut progress: impl FnMut(&ImportStats),
) -> Result<ImportStats, ImportError> {
    let (stats, meta, _) = import_part(db, input, &mut progress, Part::Whole)?;
    for (family, m) in meta {
        db.set_metadata(&family, m)?;
    }
    progress(&stats);
    Ok(stats)
}

/// Which part of a file [`import_part`] reads.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    /// The whole file: it ends with `# EOF`.
    Whole,
    /// A part before the last: it ends where the next begins, and holds no `# EOF`.
    Leading,
    /// The last part: from a family's start to the end, `# EOF` included.
    Trailing,
}

type Families = HashMap<String, Metadata>;

/// What a part read: its totals, its families' metadata, and the series it appended to
/// (by address, to tell whether two parts shared one).
type PartRead = (ImportStats, Families, Vec<usize>);

fn import_part(
    db: &Tsdb,
    mut input: impl Read,
    progress: &mut impl FnMut(&ImportStats),
    part: Part,
) -> Result<PartRead, ImportError> {
    let mut stats = ImportStats::default();
    let mut cache: HashMap<Box<[u8]>, Arc<MemSeries>, foldhash::fast::RandomState> = HashMap::default();
    let mut meta: Families = HashMap::new();
    let mut batch: Vec<(Arc<MemSeries>, Sample)> = Vec::with_capacity(BATCH);
    let mut buf: Vec<u8> = Vec::with_capacity(PIECE * 2);
    let mut scratch = vec![0u8; 1 << 20];
    let mut line_no = 1usize;
    let mut eof = false;
    while !eof {
        let n = input.read(&mut scratch)?;
        buf.extend_from_slice(&scratch[..n]);
        eof = n == 0;
        if !eof && buf.len() < PIECE {
            continue;
        }
        // Parse up to the last complete line; keep the rest for the next piece. At the end
        // a last line without its newline is parsed only if it is `# EOF`: anything else
        // may be cut off, and is not imported.
        let mut cut = buf.iter().rposition(|&b| b == b'\n').map(|i| i + 1).unwrap_or(0);
        if eof && buf[cut..].trim_ascii() == b"# EOF" {
            cut = buf.len();
        }
        if cut == 0 && !eof {
            if buf.len() > PIECE {
                return Err(ImportError::LineTooLong(line_no));
            }
            continue;
        }
        let lines = buf[..cut].iter().filter(|&&b| b == b'\n').count();
        let mut parser = exposition::Parser::fragment(&buf[..cut], Format::OpenMetrics, line_no);
        for entry in parser.by_ref() {
            match entry? {
                Entry::Sample { series, value, timestamp_ms, line, .. } => {
                    let t = timestamp_ms.ok_or(ImportError::NoTimestamp(line))?;
                    let s = match cache.get(series) {
                        Some(s) => s.clone(),
                        None => {
                            let labels = exposition::parse_series_at(series, line)?;
                            let s = db.series(&labels)?;
                            cache.insert(series.into(), s.clone());
                            stats.series += 1;
                            s
                        }
                    };
                    batch.push((s, Sample::new(t, value)));
                    if batch.len() >= BATCH {
                        flush(db, &mut batch, &mut stats)?;
                        progress(&stats);
                    }
                }
                Entry::Type { family, metric_type } => {
                    meta.entry(family.to_string()).or_default().metric_type = metric_type
                }
                Entry::Help { family, help } => meta.entry(family.to_string()).or_default().help = help.into_owned(),
                Entry::Unit { family, unit } => meta.entry(family.to_string()).or_default().unit = unit.to_string(),
            }
        }
        let saw_eof = parser.saw_eof();
        line_no += lines;
        stats.bytes += cut as u64;
        buf.drain(..cut);
        if saw_eof && part == Part::Leading {
            flush(db, &mut batch, &mut stats)?;
            return Err(ImportError::EofInside);
        }
        if saw_eof {
            break;
        }
        if eof && part != Part::Leading {
            flush(db, &mut batch, &mut stats)?;
            return Err(ImportError::NoEof { line: line_no, samples: stats.samples });
        }
    }
    flush(db, &mut batch, &mut stats)?;
    let series = cache.values().map(|s| Arc::as_ptr(s) as usize).collect();
    Ok((stats, meta, series))
}

/// The lines that open a metric family, with the newline before them.
const MARKS: [&[u8]; 3] = [b"\n# HELP ", b"\n# TYPE ", b"\n# UNIT "];

/// Where a part of `file` after `from` may begin: the start of the first metric family's
/// `# HELP`, `# TYPE` or `# UNIT` line before `until`. Families are not interleaved
/// (OpenMetrics requires it), so every series lies in one part.
fn family_start(file: &mut std::fs::File, from: u64, until: u64) -> std::io::Result<Option<u64>> {
    use std::io::{Seek, SeekFrom};
    let mut at = from;
    let mut window = vec![0u8; 1 << 20];
    while at < until {
        file.seek(SeekFrom::Start(at))?;
        let n = file.read(&mut window)?;
        if n == 0 {
            break;
        }
        let found = MARKS.iter().filter_map(|m| window[..n].windows(m.len()).position(|w| w == *m)).min();
        if let Some(i) = found {
            return Ok(Some(at + i as u64 + 1));
        }
        // The next window overlaps this one by a mark's length, so none is cut in two.
        at += n.saturating_sub(MARKS[0].len()).max(1) as u64;
    }
    Ok(None)
}

/// The start of the last family (as [`family_start`]) that begins after `floor` and at or
/// before `to`, searched backwards from `to`.
fn family_start_before(file: &mut std::fs::File, floor: u64, to: u64) -> std::io::Result<Option<u64>> {
    use std::io::{Seek, SeekFrom};
    const WINDOW: u64 = 1 << 20;
    let mut end = to.saturating_add(MARKS[0].len() as u64);
    let mut window = vec![0u8; WINDOW as usize];
    while end > floor {
        let start = end.saturating_sub(WINDOW).max(floor);
        file.seek(SeekFrom::Start(start))?;
        let want = (end - start) as usize;
        let mut got = 0;
        while got < want {
            match file.read(&mut window[got..want])? {
                0 => break,
                n => got += n,
            }
        }
        let found = MARKS.iter().filter_map(|m| window[..got].windows(m.len()).rposition(|w| w == *m)).max();
        if let Some(i) = found {
            let at = start + i as u64 + 1;
            if at > floor && at <= to {
                return Ok(Some(at));
            }
        }
        if start == floor {
            break;
        }
        // Overlapping by a mark's length, so none is cut in two.
        end = start.saturating_add(MARKS[0].len() as u64).min(end.saturating_sub(1));
    }
    Ok(None)
}

/// [`import_openmetrics`] of a file on `threads` threads, each a part of it cut at a metric
/// family's start. Every series is then appended by one thread, in the file's order, so
/// the result is the one-thread import's, but for what the file gets wrong: samples the
/// database refuses (out of order), a `# EOF` before the end, a bad line (whose number a
/// part after the first cannot tell). For any of those the caller imports the file again
/// in one pass ([`import_openmetrics`]), which answers as before: `Err` with
/// [`ImportError::Parallel`] asks for that, the database then holding a partial import.
pub fn import_openmetrics_file(
    db: &Tsdb,
    path: &std::path::Path,
    threads: usize,
    progress: impl Fn(&ImportStats) + Sync,
) -> Result<ImportStats, ImportError> {
    // Parts of at least 64 MiB: smaller files are not worth a thread.
    import_in_parts(db, path, threads, 64 << 20, progress)
}

fn import_in_parts(
    db: &Tsdb,
    path: &std::path::Path,
    threads: usize,
    min_part: u64,
    progress: impl Fn(&ImportStats) + Sync,
) -> Result<ImportStats, ImportError> {
    use std::io::{Seek, SeekFrom};
    use std::sync::atomic::{AtomicU64, Ordering};
    let mut file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    let mut starts = vec![0u64];
    let parts = threads.clamp(1, 16).min((size / min_part.max(1)).max(1) as usize);
    for k in 1..parts {
        let at = (size / parts as u64 * k as u64).max(*starts.last().unwrap_or(&0));
        let until = size / parts as u64 * (k as u64 + 1);
        // The family start nearest the even cut, after it or before it.
        let previous = *starts.last().unwrap_or(&0);
        let after = family_start(&mut file, at, until)?;
        let before = family_start_before(&mut file, previous, at)?;
        let nearest = match (before, after) {
            (Some(b), Some(a)) => Some(if at - b <= a - at { b } else { a }),
            (b, a) => b.or(a),
        };
        if let Some(start) = nearest.filter(|&s| s > previous && s < size) {
            starts.push(start);
        }
    }
    if starts.len() < 2 {
        file.seek(SeekFrom::Start(0))?;
        return import_openmetrics(db, std::io::BufReader::with_capacity(1 << 20, file), |s| progress(s));
    }
    let (samples, series, bytes) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let ranges: Vec<(u64, u64)> =
        starts.iter().zip(starts.iter().skip(1).chain(std::iter::once(&size))).map(|(&a, &b)| (a, b)).collect();
    let last = ranges.len() - 1;
    let results: Vec<Result<PartRead, ImportError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ranges
            .iter()
            .enumerate()
            .map(|(i, &(from, to))| {
                let (samples, series, bytes) = (&samples, &series, &bytes);
                let progress = &progress;
                scope.spawn(move || {
                    let mut f = std::fs::File::open(path)?;
                    f.seek(SeekFrom::Start(from))?;
                    let input = std::io::BufReader::with_capacity(1 << 20, f.take(to - from));
                    let part = if i == last { Part::Trailing } else { Part::Leading };
                    let mut seen = ImportStats::default();
                    let mut report = |st: &ImportStats| {
                        samples.fetch_add(st.samples - seen.samples, Ordering::Relaxed);
                        series.fetch_add(st.series - seen.series, Ordering::Relaxed);
                        bytes.fetch_add(st.bytes - seen.bytes, Ordering::Relaxed);
                        seen = *st;
                        if i == 0 {
                            let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
                            let all = ImportStats {
                                parts: (last + 1) as u64,
                                samples: load(samples),
                                series: load(series),
                                bytes: load(bytes),
                                rejected: 0,
                            };
                            progress(&all);
                        }
                    };
                    import_part(db, input, &mut report, part)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(ImportError::Parallel("a part's thread failed".into()))))
            .collect()
    });
    let mut total = ImportStats { parts: ranges.len() as u64, ..Default::default() };
    let mut families: Families = HashMap::new();
    let mut appended: std::collections::HashSet<usize> = std::collections::HashSet::new();
    for (i, r) in results.into_iter().enumerate() {
        let (st, meta, series) =
            r.map_err(|e| ImportError::Parallel(format!("part {} of {}: {e}", i + 1, last + 1)))?;
        // A series in two parts (a family that comes back later in the file) was appended
        // by two threads in no set order: only one pass appends it as the file has it.
        if series.into_iter().any(|s| !appended.insert(s)) {
            return Err(ImportError::Parallel(format!("a series of part {} is in an earlier part too", i + 1)));
        }
        total.samples += st.samples;
        total.series += st.series;
        total.bytes += st.bytes;
        total.rejected += st.rejected;
        // A family's `# HELP` and `# TYPE` may fall on both sides of a cut.
        for (family, m) in meta {
            let held = families.entry(family).or_default();
            if m.metric_type != Default::default() {
                held.metric_type = m.metric_type;
            }
            if !m.help.is_empty() {
                held.help = m.help;
            }
            if !m.unit.is_empty() {
                held.unit = m.unit;
            }
        }
    }
    if total.rejected > 0 {
        return Err(ImportError::Parallel(format!("{} samples refused (out of order?)", total.rejected)));
    }
    for (family, m) in families {
        db.set_metadata(&family, m)?;
    }
    progress(&total);
    Ok(total)
}

fn flush(db: &Tsdb, batch: &mut Vec<(Arc<MemSeries>, Sample)>, stats: &mut ImportStats) -> Result<(), ImportError> {
    let out = db.commit(batch)?;
    stats.samples += (out.appended + out.ignored_duplicates) as u64;
    stats.rejected += out.rejected.len() as u64;
    batch.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_model::matcher::Matcher;
    use strata_model::MetricType;
    use strata_tsdb::db::TsdbOptions;

    /// Edge review (issue 20, item 13): a file cut off mid-line imports nothing of its
    /// last line and says so; a file with no newline is refused before it fills memory.
    #[test]
    fn a_cut_off_file_keeps_its_last_line_out_and_says_so() {
        let d = tempfile::tempdir().unwrap();
        let db = Tsdb::open(d.path(), TsdbOptions::default()).unwrap();
        let e = import_openmetrics(&db, "a 1 1\nb 2 2\nc 3".as_bytes(), |_| {}).unwrap_err();
        assert!(matches!(e, ImportError::NoEof { samples: 2, .. }), "{e}");
        let c = db.head().select(&[Matcher::eq("__name__", "c")], i64::MIN, i64::MAX);
        assert!(c.is_empty(), "the cut-off line was imported");
        // `# EOF` without its newline is a complete file.
        let d2 = tempfile::tempdir().unwrap();
        let db2 = Tsdb::open(d2.path(), TsdbOptions::default()).unwrap();
        assert_eq!(import_openmetrics(&db2, "a 1 1\n# EOF".as_bytes(), |_| {}).unwrap().samples, 1);
        let endless = std::io::repeat(b'x').take(3 * PIECE as u64);
        let e = import_openmetrics(&db2, endless, |_| {}).unwrap_err();
        assert!(matches!(e, ImportError::LineTooLong(1)), "{e}");
    }

    #[test]
    fn imports_a_file_in_pieces() {
        let mut text = String::from("# TYPE e counter\n# HELP e energy\n");
        for s in 0..3 {
            for i in 0..5000 {
                text.push_str(&format!("e{{gpu=\"{s}\"}} {} {}.{:03}\n", i * 10, 1_700_000_000 + i * 15, i % 1000));
            }
        }
        text.push_str("# EOF\n");
        let d = tempfile::tempdir().unwrap();
        let db = Tsdb::open(d.path(), TsdbOptions::default()).unwrap();
        // a reader that returns small pieces, to cut lines across reads
        struct Slow<'a>(&'a [u8]);
        impl Read for Slow<'_> {
            fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.len().min(b.len()).min(777);
                b[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let st = import_openmetrics(&db, Slow(text.as_bytes()), |_| {}).unwrap();
        assert_eq!((st.samples, st.series, st.rejected), (15_000, 3, 0));
        assert_eq!(db.head().metric_type("e"), MetricType::Counter);
        let got = db.head().select(&[Matcher::eq("gpu", "1")], i64::MIN, i64::MAX);
        let s: Vec<_> = got[0].1.iter().flat_map(|c| c.decode().unwrap()).collect();
        assert_eq!(s[4999], Sample::new((1_700_000_000 + 4999 * 15) * 1000 + 999, 49990.0));
    }

    /// `families` families of `series` series each, `per` samples a series.
    fn families_file(dir: &std::path::Path, families: usize, series: usize, per: usize) -> std::path::PathBuf {
        let mut text = String::new();
        for f in 0..families {
            text.push_str(&format!("# TYPE m{f} gauge\n# HELP m{f} metric {f}\n"));
            for s in 0..series {
                for i in 0..per {
                    text.push_str(&format!("m{f}{{s=\"{s}\"}} {} {}\n", i * f, 1_700_000_000 + i * 15));
                }
            }
        }
        text.push_str("# EOF\n");
        let path = dir.join("in.om");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn everything(db: &Tsdb) -> Vec<(String, Vec<Sample>)> {
        let any = Matcher::new(strata_model::MatchOp::Regex, "__name__", ".+").unwrap();
        let got = db.head().select(&[any], i64::MIN, i64::MAX);
        let mut out: Vec<(String, Vec<Sample>)> = got
            .into_iter()
            .map(|(s, c)| (format!("{:?}", s.labels), c.iter().flat_map(|c| c.decode().unwrap()).collect()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    #[test]
    fn a_file_read_in_parts_imports_what_one_pass_does() {
        let d = tempfile::tempdir().unwrap();
        let path = families_file(d.path(), 7, 5, 300);
        let size = std::fs::metadata(&path).unwrap().len();
        let one = Tsdb::open(&d.path().join("one"), TsdbOptions::default()).unwrap();
        let want = import_openmetrics(&one, std::fs::File::open(&path).unwrap(), |_| {}).unwrap();
        let parts = Tsdb::open(&d.path().join("parts"), TsdbOptions::default()).unwrap();
        let got = import_in_parts(&parts, &path, 3, size / 4, |_| {}).unwrap();
        assert_eq!(got.parts, 3, "the file was not cut");
        assert_eq!((got.samples, got.series, got.rejected), (want.samples, want.series, 0));
        assert_eq!(everything(&parts), everything(&one));
        for f in 0..7 {
            assert_eq!(parts.head().metric_type(&format!("m{f}")), MetricType::Gauge);
        }
    }

    /// What a part cannot judge alone asks for one pass: a family that comes back later
    /// (samples out of order across parts), `# EOF` inside, a bad line after the first part.
    #[test]
    fn what_parts_cannot_import_asks_for_one_pass() {
        let d = tempfile::tempdir().unwrap();
        let path = families_file(d.path(), 6, 4, 300);
        let text = std::fs::read_to_string(&path).unwrap();
        let cases = [
            ("a family back at the end", text.replace("# EOF\n", "m0{s=\"0\"} 1 1600000000\n# EOF\n")),
            ("a series back in order", text.replace("# EOF\n", "m0{s=\"0\"} 1 1800000000\n# EOF\n")),
            ("# EOF inside", text.replacen("# TYPE m4", "# EOF\n# TYPE m4", 1)),
            ("a bad line", text.replacen("# TYPE m5 gauge\n", "# TYPE m5 gauge\ngarbage\n", 1)),
        ];
        for (what, body) in cases {
            std::fs::write(&path, &body).unwrap();
            let size = body.len() as u64;
            let db = Tsdb::open(&d.path().join(what.replace(' ', "-")), TsdbOptions::default()).unwrap();
            let e = import_in_parts(&db, &path, 2, size / 3, |_| {}).unwrap_err();
            assert!(matches!(e, ImportError::Parallel(_)), "{what}: {e}");
        }
    }

    #[test]
    fn a_bad_line_is_an_error_with_its_number() {
        let d = tempfile::tempdir().unwrap();
        let db = Tsdb::open(d.path(), TsdbOptions::default()).unwrap();
        let e = import_openmetrics(&db, "a 1 1\nb 2 2\ngarbage\n# EOF\n".as_bytes(), |_| {}).unwrap_err();
        assert!(e.to_string().contains("line 3"), "{e}");
        let e = import_openmetrics(&db, "a 1\n# EOF\n".as_bytes(), |_| {}).unwrap_err();
        assert!(e.to_string().contains("timestamp"), "{e}");
    }
}
