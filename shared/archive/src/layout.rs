//! Where a block's objects live: `<resolution>/<YYYY-MM-DD>/<start>-<end>/` with the
//! resolution `raw`, `5m` or `1h`, the UTC day the block starts in, and its range in ms.
//! Paths sort by resolution, then time, so DuckDB's globs (`raw/2026-12-01/*/data.parquet`)
//! and any pruning by path work, and a block's name is its range: written twice, a range
//! lands on the same objects.
//!
//! Archivers that split the work by external labels each write a shard, a whole archive of
//! its own under `shards/<name>/` (its blocks, progress record, claims and compaction
//! lease); a reader of the root reads every shard beside the root's own blocks.

use object_store::path::Path;

pub const DATA: &str = "data.parquet";
pub const SERIES: &str = "series.parquet";
pub const META: &str = "meta.json";

/// `raw`, `5m`, `1h` (other widths by their minutes).
pub fn resolution_dir(resolution_ms: i64) -> String {
    match resolution_ms {
        0 => "raw".into(),
        3_600_000 => "1h".into(),
        ms => format!("{}m", ms / 60_000),
    }
}

/// The UTC calendar day of `ms` as `YYYY-MM-DD`.
pub fn day(ms: i64) -> String {
    let (y, m, d, ..) = strata_model::time::civil_from_ms(ms);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The folder of the block of `resolution_ms` over `[start, end)`.
pub fn block_dir(resolution_ms: i64, start: i64, end: i64) -> Path {
    Path::from(format!("{}/{}/{start}-{end}", resolution_dir(resolution_ms), day(start)))
}

/// The folder of the shards.
pub const SHARDS: &str = "shards";

/// Whether `name` may name a shard: its folder's name, so letters, digits, `_`, `-` and
/// `.` (not first), at most 64.
pub fn valid_shard_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Where shard `name` keeps its archive.
pub fn shard_root(name: &str) -> Path {
    Path::from(format!("{SHARDS}/{name}"))
}

/// The shard a path is in (`shards/<name>/...`); `None` for the root's own objects.
pub fn shard_of(path: &Path) -> Option<String> {
    let mut parts = path.parts();
    match (parts.next(), parts.next()) {
        (Some(first), Some(name)) if first.as_ref() == SHARDS && valid_shard_name(name.as_ref()) => {
            Some(name.as_ref().to_string())
        }
        _ => None,
    }
}

/// `(resolution, start, end)` from a block folder `[shards/<name>/]<resolution>/<day>/<start>-<end>`:
/// what a block holds when its meta cannot be read.
pub fn parse_block_dir(dir: &Path) -> Option<(String, i64, i64)> {
    let mut parts: Vec<_> = dir.parts().collect();
    if parts.len() == 5 && parts[0].as_ref() == SHARDS && valid_shard_name(parts[1].as_ref()) {
        parts.drain(..2);
    }
    let [res, _, name] = parts.as_slice() else { return None };
    let (lo, hi) = name.as_ref().split_once('-')?;
    Some((res.as_ref().to_string(), lo.parse().ok()?, hi.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_sit_under_their_resolution_and_day() {
        assert_eq!(day(0), "1970-01-01");
        assert_eq!(day(1_796_342_400_000), "2026-12-04");
        assert_eq!(day(951_782_400_000), "2000-02-29");
        assert_eq!(day(-1), "1969-12-31");
        let p = block_dir(0, 1_796_342_400_000, 1_796_349_600_000);
        assert_eq!(p.as_ref(), "raw/2026-12-04/1796342400000-1796349600000");
        assert_eq!(resolution_dir(300_000), "5m");
        assert_eq!(resolution_dir(3_600_000), "1h");
        assert_eq!(parse_block_dir(&p), Some(("raw".into(), 1_796_342_400_000, 1_796_349_600_000)));
        assert_eq!(parse_block_dir(&Path::from("raw/x")), None);
        let sharded = shard_root("c0").join("raw").join("2026-12-04").join("1-2");
        assert_eq!(parse_block_dir(&sharded), Some(("raw".into(), 1, 2)));
        assert_eq!(shard_of(&sharded).as_deref(), Some("c0"));
        assert_eq!(shard_of(&p), None);
        assert_eq!(parse_block_dir(&Path::from("other/c0/raw/2026-12-04/1-2")), None);
        assert!(valid_shard_name("eu-west.1") && !valid_shard_name(".x") && !valid_shard_name("a/b"));
        assert!(!valid_shard_name("") && !valid_shard_name(&"x".repeat(65)));
    }
}
