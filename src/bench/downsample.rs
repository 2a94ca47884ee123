//! `strata bench downsample`: the fleet-day set's window aggregates, 5 m and 1 h, as the
//! regional would store them: bytes per raw sample per metric (its type decides the
//! columns), where the bytes go, and how fast windows are built and encoded.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;
use strata_downsample::{column_sizes, encode, windows_of, Asked, Kept, Window, FIVE_MINUTES, ONE_HOUR};
use strata_model::matcher::{MatchOp, Matcher};

/// Windows per stored chunk: a day of 5 m windows, ten days of 1 h ones (the fleet day
/// fills a tenth of that: the 1 h figure carries ten times the per-chunk overhead).
fn per_chunk(width: i64) -> usize {
    if width == FIVE_MINUTES {
        288
    } else {
        240
    }
}

#[derive(Default)]
struct Tally {
    raw: u64,
    bytes: usize,
    windows: usize,
    columns: BTreeMap<&'static str, usize>,
}

pub fn run(file: Option<PathBuf>, asked: Asked) -> anyhow::Result<()> {
    let (db, _dir, _opts, _) = super::fleet_day::import(file)?;
    let all = Matcher::new(MatchOp::Regex, "__name__", ".+")?;
    let selected = db.head().select(&[all], i64::MIN, i64::MAX);
    for width in [FIVE_MINUTES, ONE_HOUR] {
        let mut per: BTreeMap<String, (Kept, Tally)> = BTreeMap::new();
        let (mut build, mut enc) = (0.0, 0.0);
        for (s, chunks) in &selected {
            let name = s.labels.metric_name().unwrap_or_default().to_string();
            let kind = Kept::of(db.metric_type(&name), asked);
            let mut raw = Vec::new();
            strata_chunk::Chunk::decode_range(chunks, i64::MIN, i64::MAX, &mut raw)?;
            let started = Instant::now();
            let windows: Vec<Window> = windows_of(&raw, width);
            build += started.elapsed().as_secs_f64();
            let t = &mut per.entry(name).or_insert_with(|| (kind, Tally::default())).1;
            t.raw += raw.len() as u64;
            t.windows += windows.len();
            for piece in windows.chunks(per_chunk(width)) {
                let started = Instant::now();
                t.bytes += encode(piece, width, kind).len();
                enc += started.elapsed().as_secs_f64();
                for (col, n) in column_sizes(piece, width, kind) {
                    *t.columns.entry(col).or_default() += n;
                }
            }
        }
        let raw: u64 = per.values().map(|p| p.1.raw).sum();
        let bytes: usize = per.values().map(|p| p.1.bytes).sum();
        let windows: usize = per.values().map(|p| p.1.windows).sum();
        println!(
            "{} aggregates: {:.3} bytes per raw sample ({bytes} bytes, {windows} windows, {:.1} bytes a window); \
             built at {:.1} M raw samples/s, encoded at {:.2} M windows/s (one thread)",
            if width == FIVE_MINUTES { "5 m" } else { "1 h" },
            bytes as f64 / raw.max(1) as f64,
            bytes as f64 / windows.max(1) as f64,
            raw as f64 / build / 1e6,
            windows as f64 / enc / 1e6,
        );
        for (name, (kind, t)) in &per {
            let top: Vec<String> = {
                let mut c: Vec<_> = t.columns.iter().collect();
                c.sort_by(|a, b| b.1.cmp(a.1));
                c.iter().take(5).map(|(k, v)| format!("{k} {:.2}", **v as f64 / t.windows.max(1) as f64)).collect()
            };
            let kind = if !kind.correction {
                "gauge"
            } else if !kind.moments {
                "counter"
            } else {
                "other"
            };
            println!(
                "    {name:<40} {kind:<7} {:.3} bytes per raw sample; bytes a window, largest columns: {}",
                t.bytes as f64 / t.raw.max(1) as f64,
                top.join(", ")
            );
        }
    }
    Ok(())
}
