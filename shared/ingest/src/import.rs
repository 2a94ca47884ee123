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
}

#[derive(Debug, Default, Clone, Copy)]
pub struct ImportStats {
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
    mut input: impl Read,
    mut progress: impl FnMut(&ImportStats),
) -> Result<ImportStats, ImportError> {
    let mut stats = ImportStats::default();
    let mut cache: HashMap<Box<[u8]>, Arc<MemSeries>, foldhash::fast::RandomState> = HashMap::default();
    let mut meta: HashMap<String, Metadata> = HashMap::new();
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
        if saw_eof {
            break;
        }
        if eof {
            flush(db, &mut batch, &mut stats)?;
            return Err(ImportError::NoEof { line: line_no, samples: stats.samples });
        }
    }
    flush(db, &mut batch, &mut stats)?;
    for (family, m) in meta {
        db.set_metadata(&family, m)?;
    }
    progress(&stats);
    Ok(stats)
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
