//! The head checkpoint: the head (every series with its chunks, the open one sealed in the
//! block encoding, and the metadata) written to `<data>/head.checkpoint` with the WAL
//! cursor it covers, so that the WAL segments before that cursor can go and a start loads
//! the checkpoint and replays only the WAL after it (Prometheus' checkpoint plus its
//! `memory-snapshot-on-shutdown`, in one file).
//!
//! It is written by maintenance once a block was cut since the last checkpoint and the WAL
//! since outgrew the head's chunks (about once a block range; `checkpoint_due` in
//! `compact.rs` has the other cases), and at every clean shutdown. The
//! cursor is taken at a fresh segment, under the WAL lock, so everything before it is in
//! memory; the series are then written one at a time without holding the WAL, so commits go
//! on. A series may hold samples from after the cursor: replay skips what a series already
//! holds (per series, samples are appended in time order, so anything not newer than its
//! last sample is there). The floor recorded is the durable one (`floor`): a cut that is
//! still writing its block never makes its window look stored.
//!
//! The file's format is [`format`]'s.
//!
//! Safety: the file is written under a temporary name, `fsync`ed, read back through the
//! same parser a start uses, renamed (the directory `fsync`ed), and only then are the
//! segments it covers deleted. At start, a checkpoint that fails a check is moved aside to
//! `head.checkpoint.damaged-<ms>` (never deleted) and the start goes on with the WAL that
//! is left, saying loudly what it could not restore; one that cannot be read for an I/O
//! error fails the start instead (the next may read it).

mod format;

use super::{Tsdb, TsdbError};
use crate::head::HeadBlock;
use crate::wal::WalCursor;
use format::{Crc, Dictionary, Header, ReadError};
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;
use strata_chunk::Chunk;

pub const CHECKPOINT_FILE: &str = "head.checkpoint";
/// What earlier versions wrote at shutdown, with the whole WAL beside it: ignored and
/// removed (the WAL it came with is replayed).
pub const LEGACY_SNAPSHOT_FILE: &str = "head.snapshot";

/// What a loaded checkpoint says beside the head.
pub(crate) struct Loaded {
    pub head: HeadBlock,
    pub cursor: WalCursor,
    /// The durable floor when it was written.
    pub floor: i64,
}

/// What writing a checkpoint did.
#[derive(Debug, Clone, Copy, Default)]
pub struct CheckpointStats {
    pub series: usize,
    pub bytes: u64,
    pub segments_deleted: usize,
}

impl Tsdb {
    /// Writes a head checkpoint and deletes the WAL segments it covers (the caller holds
    /// the maintenance lock, so no cut is half done).
    pub(crate) fn write_checkpoint_locked(&self) -> Result<CheckpointStats, TsdbError> {
        let started = std::time::Instant::now();
        let path = self.dir.join(CHECKPOINT_FILE);
        let tmp = self.dir.join(format!("{CHECKPOINT_FILE}.tmp"));
        let io = |e: std::io::Error| TsdbError::Internal(format!("head checkpoint {}: {e}", tmp.display()));
        // A fresh segment: every record before it has been applied to the head.
        let cursor = {
            let mut w = self.wal.lock();
            w.wal.rotate()?;
            w.wal.cursor()
        };
        let range = self.block_range_ms();
        let floor = self.floor.durable();
        let write = || -> std::io::Result<(usize, u64)> {
            strata_block::fault::fail("checkpoint-write")?;
            let mut file = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
            file.write_all(format::MAGIC)?;
            let deflated = flate2::write::DeflateEncoder::new(file, flate2::Compression::new(format::DEFLATE_LEVEL));
            let mut out = Crc::after_magic(deflated);
            let mut all = self.head.all_series();
            // In reference order: loading then appends to the postings lists, never inserts.
            all.sort_unstable_by_key(|s| s.series_ref);
            let header = Header { cursor, floor, metadata: self.head.all_metadata(), series: all.len() };
            let mut b = Vec::with_capacity(1 << 16);
            format::encode_header(&mut b, &header);
            out.put(&b)?;
            let mut dict = Dictionary::default();
            for s in &all {
                b.clear();
                let (last, chunks) = {
                    let g = s.samples.lock();
                    (g.last(), g.all_chunks())
                };
                let chunks: Vec<Chunk> = chunks.into_iter().map(Chunk::compact).collect();
                dict.encode_series(&mut b, s.series_ref, &s.labels, last, &chunks);
                out.put(&b)?;
            }
            out.end()?;
            let file = out.w.finish()?;
            let f = file.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
            let bytes = f.metadata()?.len();
            Ok((all.len(), bytes))
        };
        let written = write().and_then(|n| verify(&tmp, range).map(|()| n));
        let (series, bytes) = match written {
            Ok(n) => n,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(io(e));
            }
        };
        std::fs::rename(&tmp, &path).map_err(io)?;
        // The rename must be on disk before the segments it replaces go.
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io)?;
        strata_block::fault::point("checkpoint-before-wal-delete");
        let segments_deleted = {
            let mut w = self.wal.lock();
            w.wal.delete_before(cursor.segment)?
        };
        *self.checkpoint_at.lock() = Some(cursor);
        self.checkpoint_floor.store(floor, std::sync::atomic::Ordering::Relaxed);
        // What earlier versions left is superseded now; failing to remove it costs space, not data.
        if let Err(e) = crate::wal::remove_label_checkpoints(&self.wal_dir()) {
            tracing::warn!(error = %e, "could not remove an old label checkpoint");
        }
        let legacy = self.dir.join(LEGACY_SNAPSHOT_FILE);
        if legacy.exists() {
            if let Err(e) = std::fs::remove_file(&legacy) {
                tracing::warn!(path = %legacy.display(), error = %e, "could not remove an old head snapshot");
            }
        }
        tracing::info!(
            series,
            bytes,
            segments_deleted,
            secs = started.elapsed().as_secs_f64(),
            path = %path.display(),
            "head checkpoint written"
        );
        Ok(CheckpointStats { series, bytes, segments_deleted })
    }
}

/// Reads a written checkpoint through the parser a start uses (what was written loads).
fn verify(path: &Path, block_range: i64) -> std::io::Result<()> {
    let r = BufReader::with_capacity(1 << 20, File::open(path)?);
    match format::parse(r, block_range, |_| {}, |_| {}) {
        Ok((_, 0)) => Ok(()),
        Ok((_, skipped)) => Err(std::io::Error::other(format!("{skipped} chunks do not read back"))),
        Err(ReadError::Io(e)) => Err(e),
        Err(ReadError::Damaged(reason)) => Err(std::io::Error::other(format!("does not read back: {reason}"))),
    }
}

/// Loads the checkpoint in `dir`, if there is one, into a new head. A damaged one is moved
/// aside (what it held is lost unless the WAL before its cursor is still there, which the
/// caller replays) and `Ok(None)` returned; one that cannot be read for an I/O error is an
/// error.
pub(crate) fn load(dir: &Path, max_series: usize, block_range: i64) -> Result<Option<Loaded>, TsdbError> {
    let path = dir.join(CHECKPOINT_FILE);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(TsdbError::Internal(format!("{}: {e}", path.display()))),
    };
    let started = std::time::Instant::now();
    let head = HeadBlock::new(max_series);
    let parsed = format::parse(
        BufReader::with_capacity(1 << 20, file),
        block_range,
        |h| {
            for (family, m) in &h.metadata {
                head.set_metadata(family, m.clone());
            }
        },
        |s| {
            for c in &s.chunks {
                head.note_time(c.min_t);
                head.note_time(c.max_t);
            }
            let series = head.restore(s.series_ref, &s.labels);
            series.samples.lock().restore(s.chunks, s.last);
        },
    );
    match parsed {
        Ok((h, skipped)) => {
            if skipped > 0 {
                tracing::error!(path = %path.display(), chunks = skipped, "head checkpoint: chunks that do not read were left out");
            }
            tracing::info!(
                series = h.series,
                secs = started.elapsed().as_secs_f64(),
                "head checkpoint loaded; the WAL replays from its cursor"
            );
            Ok(Some(Loaded { head, cursor: h.cursor, floor: h.floor }))
        }
        Err(ReadError::Io(e)) => Err(TsdbError::Internal(format!("reading {}: {e}", path.display()))),
        Err(ReadError::Damaged(reason)) => {
            let aside = dir.join(format!("{CHECKPOINT_FILE}.damaged-{}", strata_model::time::now_ms()));
            let moved = std::fs::rename(&path, &aside);
            tracing::error!(
                path = %path.display(),
                reason,
                moved_to = %aside.display(),
                moved = moved.is_ok(),
                "head checkpoint damaged: the head's samples before its WAL cursor cannot be restored; replaying the WAL that is left"
            );
            Ok(None)
        }
    }
}
