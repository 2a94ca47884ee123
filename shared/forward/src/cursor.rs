//! Where an upstream's acknowledged data ends in the edge's WAL, persisted atomically.

use crate::ForwardError;
use std::io::Write;
use std::path::{Path, PathBuf};
use strata_tsdb::wal::WalCursor;

/// A position in the WAL that every sample before was acknowledged by the upstream whose
/// storage identity it carries: the record at `wal`, of whose samples the first `skip`
/// were acknowledged already (a record larger than a batch goes in parts). With `replay`,
/// a backlog read from storage comes first ([`Backlog`](crate::Backlog), in the file
/// beside the cursor), acknowledged up to that point; the WAL follows from `wal`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub storage_id: String,
    pub wal: WalCursor,
    pub skip: u64,
    pub replay: Option<ReplayAt>,
}

/// How far a backlog has been acknowledged. The backlog is its file of `generation`
/// ([`CursorFile::backlog_path`]); it is read in time slices (`slice`: the start of the
/// current one, `i64::MIN` before the first), each slice over every entry in order: of the
/// current slice, the entries before `entry` whole, and of that entry the samples up to
/// `after` (ms; `i64::MIN`: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayAt {
    pub generation: u64,
    pub slice: i64,
    pub entry: u64,
    pub after: i64,
}

impl ReplayAt {
    /// The start of the backlog of `generation`.
    pub fn start(generation: u64) -> ReplayAt {
        ReplayAt { generation, slice: i64::MIN, entry: 0, after: i64::MIN }
    }
}

/// One upstream's cursor file (`<data>/forward/<upstream>.cursor`), replaced whole (write,
/// `fsync`, rename, `fsync` of the directory), so a crash leaves the old or the new one.
pub struct CursorFile {
    path: PathBuf,
}

const HEADER: &str = "strata forward cursor v1";

impl CursorFile {
    /// The cursor file of `upstream` (any text: it is encoded into a file name, one name
    /// per upstream: every byte but letters, digits, `-` and `.` as `_` and two hex digits).
    pub fn new(data_dir: &Path, upstream: &str) -> CursorFile {
        let mut name = String::with_capacity(upstream.len());
        for b in upstream.bytes() {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'.' {
                name.push(char::from(b));
            } else {
                name.push_str(&format!("_{b:02x}"));
            }
        }
        let dir = data_dir.join("forward");
        let path = dir.join(format!("{name}.cursor"));
        // A cursor written under the earlier encoding (every other byte as `_`) is taken
        // over once.
        let legacy: String =
            upstream.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
        let legacy = dir.join(format!("{legacy}.cursor"));
        if legacy != path && !path.exists() && legacy.exists() {
            let _ = std::fs::rename(&legacy, &path);
        }
        CursorFile { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file of the upstream's backlog of `generation`, beside its cursor. A new
    /// backlog takes the next generation, so the cursor names the file its position is in.
    pub fn backlog_path(&self, generation: u64) -> PathBuf {
        self.path.with_extension(format!("backlog.{generation}"))
    }

    /// The persisted cursor; `None` when there is none or it cannot be read (logged: the
    /// upstream then gets everything again, which it ignores where it holds it).
    pub fn load(&self) -> Option<Cursor> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(file = %self.path.display(), error = %e, "forward cursor unreadable: sending from the oldest data");
                return None;
            }
        };
        let parsed = parse(&text);
        if parsed.is_none() {
            tracing::warn!(file = %self.path.display(), "forward cursor damaged: sending from the oldest data");
        }
        parsed
    }

    pub fn store(&self, c: &Cursor) -> Result<(), ForwardError> {
        let err = |source| ForwardError::Cursor { file: self.path.clone(), source };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(err)?;
        let tmp = self.path.with_extension("cursor.tmp");
        let mut text = format!(
            "{HEADER}\nstorage_id {}\nsegment {}\noffset {}\nskip {}\n",
            c.storage_id, c.wal.segment, c.wal.offset, c.skip
        );
        if let Some(r) = c.replay {
            text.push_str(&format!("replay {} {} {} {}\n", r.generation, r.slice, r.entry, r.after));
        }
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(text.as_bytes()).map_err(err)?;
        f.sync_data().map_err(err)?;
        std::fs::rename(&tmp, &self.path).map_err(err)?;
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(err)?;
        Ok(())
    }
}

fn parse(text: &str) -> Option<Cursor> {
    let mut lines = text.lines();
    if lines.next()? != HEADER {
        return None;
    }
    let mut field = |name: &str| lines.next()?.strip_prefix(name)?.strip_prefix(' ').map(str::to_string);
    let storage_id = field("storage_id")?;
    let segment = field("segment")?.parse().ok()?;
    let offset = field("offset")?.parse().ok()?;
    let skip = field("skip")?.parse().ok()?;
    let replay = match lines.next() {
        None => None,
        Some(line) => {
            let mut f = line.strip_prefix("replay ")?.split(' ');
            let at = ReplayAt {
                generation: f.next()?.parse().ok()?,
                slice: f.next()?.parse().ok()?,
                entry: f.next()?.parse().ok()?,
                after: f.next()?.parse().ok()?,
            };
            if f.next().is_some() {
                return None;
            }
            Some(at)
        }
    };
    if lines.next().is_some() {
        return None;
    }
    Some(Cursor { storage_id, wal: WalCursor { segment, offset }, skip, replay })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_survives_a_round_trip_and_damage_reads_as_none() {
        let d = tempfile::tempdir().unwrap();
        let f = CursorFile::new(d.path(), "regional-a:19091");
        assert_eq!(f.path().file_name().unwrap(), "regional-a_3a19091.cursor");
        // Names that used to share a file no longer do.
        assert_ne!(CursorFile::new(d.path(), "a b").path(), CursorFile::new(d.path(), "a_b").path());
        assert_eq!(f.load(), None);
        let c = Cursor { storage_id: "abc".into(), wal: WalCursor { segment: 3, offset: 4096 }, skip: 7, replay: None };
        f.store(&c).unwrap();
        assert_eq!(f.load(), Some(c.clone()));
        let c = Cursor { replay: Some(ReplayAt { generation: 3, slice: -7, entry: 12, after: -5 }), ..c };
        f.store(&c).unwrap();
        assert_eq!(f.load(), Some(c));
        std::fs::write(f.path(), "strata forward cursor v1\nstorage_id abc\nsegment 1\noffset 0\nskip 0\nreplay 1\n")
            .unwrap();
        assert_eq!(f.load(), None);
        std::fs::write(f.path(), "strata forward cursor v1\nstorage_id abc\nsegment x\n").unwrap();
        assert_eq!(f.load(), None);
    }
}
