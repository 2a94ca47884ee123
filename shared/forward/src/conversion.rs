//! Moving what an upstream still needs out of the WAL: the WAL the head checkpoint lets go,
//! the WAL of an upstream met again far behind, or everything stored for one met for the
//! first time becomes a [`Backlog`] file beside the cursor, and the cursor moves past that
//! stretch of the WAL. The backlog file is written whole and `fsync`ed before the cursor
//! that names its generation, so a crash between the two keeps the old pair.

use crate::backlog::{Backlog, BacklogError};
use crate::cursor::ReplayAt;
use crate::sender::oldest;
use crate::FastMap as HashMap;
use crate::{Cursor, CursorFile, ForwardError};
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use strata_model::Labels;
use strata_tsdb::db::Tsdb;
use strata_tsdb::index::SeriesRef;
use strata_tsdb::wal::WalCursor;

/// How much of the WAL a conversion to a storage backlog takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Until {
    /// The segments the head checkpoint covers, which are to go.
    Checkpoint,
    /// Everything written so far (an upstream far behind).
    Now,
}

/// Notes what the WAL holds for the upstream behind `file` after its cursor (up to the
/// checkpoint, or as far as it is written) as a backlog read from storage, merged with the
/// rest of any backlog it had, and moves the persisted cursor past it; an upstream never
/// reached gets everything stored (with `history`). `None` when nothing needed moving.
pub(crate) fn backlog_from_storage(
    db: &Arc<Tsdb>,
    file: &CursorFile,
    upstream: &str,
    unsendable: &Counter,
    until: Until,
    history: bool,
) -> Result<Option<Stored>, ForwardError> {
    let Some(cursor) = file.load() else {
        // An upstream never reached has no cursor yet: it needs everything from the oldest
        // WAL segment on, or (with `history`) everything stored, blocks older than the WAL too.
        let start = Cursor { storage_id: String::new(), wal: oldest(db), skip: 0, replay: None };
        if !history {
            return backlog_from_wal(db, file, upstream, unsendable, until, start);
        }
        if until == Until::Checkpoint && db.wal_needed_from().is_none_or(|n| start.wal.segment >= n) {
            return Ok(None);
        }
        return everything_backlog(db, file, upstream, unsendable, start);
    };
    backlog_from_wal(db, file, upstream, unsendable, until, cursor)
}

/// Everything stored as the backlog of `start`'s upstream, then the WAL from where the
/// listing scanned it to.
pub(crate) fn everything_backlog(
    db: &Arc<Tsdb>,
    file: &CursorFile,
    upstream: &str,
    unsendable: &Counter,
    start: Cursor,
) -> Result<Option<Stored>, ForwardError> {
    let (backlog, scanned) = Backlog::everything(db, start.wal)
        .map_err(|reason| ForwardError::Backlog { upstream: upstream.to_string(), reason })?;
    note_unnamed(upstream, unsendable, scanned.unnamed);
    store_backlog(file, upstream, backlog, Cursor { wal: scanned.reached, ..start }, EVERYTHING)
}

fn note_unnamed(upstream: &str, unsendable: &Counter, unnamed: u64) {
    if unnamed > 0 {
        unsendable.inc_by(unnamed);
        tracing::warn!(upstream, samples = unnamed, "forward: samples of series the WAL does not name: not sent");
    }
}

/// The WAL from `cursor` on (to the checkpoint, or as far as it is written) as a backlog
/// read from storage, merged with the one the cursor is replaying.
fn backlog_from_wal(
    db: &Tsdb,
    file: &CursorFile,
    upstream: &str,
    unsendable: &Counter,
    until: Until,
    cursor: Cursor,
) -> Result<Option<Stored>, ForwardError> {
    let end = match until {
        Until::Checkpoint => {
            let Some(needed) = db.wal_needed_from() else { return Ok(None) };
            if cursor.wal.segment >= needed {
                return Ok(None);
            }
            WalCursor { segment: needed, offset: 0 }
        }
        // A record boundary: every record before it is in the head.
        Until::Now => db.wal_cursor(),
    };
    let (newer, scanned) = Backlog::scan_wal(db, cursor.wal, cursor.skip, end)
        .map_err(|source| ForwardError::Wal { upstream: upstream.to_string(), source })?;
    // Checkpointed segments are complete; the WAL being written is read as far as it is
    // on disk, and the cursor goes no further.
    let next_wal = if until == Until::Checkpoint { end } else { scanned.reached };
    note_unnamed(upstream, unsendable, scanned.unnamed);
    if newer.entries.is_empty() && cursor.replay.is_none() {
        // Nothing to send in those segments (labels only): the next batch moves past them.
        return Ok(None);
    }
    let backlog = match cursor.replay {
        None => newer,
        Some(at) => match Backlog::load(&file.backlog_path(at.generation)) {
            Ok(older) => older.rest_then(at, newer),
            Err(BacklogError::Io(e)) => {
                return Err(ForwardError::Backlog { upstream: upstream.to_string(), reason: e });
            }
            Err(BacklogError::Damaged(e)) => {
                tracing::error!(upstream, error = %e, "forward: the upstream's backlog file is damaged: what it listed is not sent");
                newer
            }
        },
    };
    let why = match until {
        Until::Checkpoint => {
            "forward: the WAL the upstream still needs was checkpointed: its backlog is sent from storage instead"
        }
        Until::Now => "forward: the upstream is far behind: its backlog is sent from storage, series by series",
    };
    let mut stored = store_backlog(file, upstream, backlog, Cursor { wal: next_wal, skip: 0, ..cursor }, why)?;
    if let Some(s) = stored.as_mut().filter(|_| next_wal == scanned.reached) {
        s.labels_before = Some((next_wal, scanned.labels_before));
    }
    Ok(stored)
}

const EVERYTHING: &str = "forward: sending the upstream everything the edge holds, from storage, then the WAL";

/// Saves `backlog` and the cursor that replays it, then the WAL from `at.wal`.
fn store_backlog(
    file: &CursorFile,
    upstream: &str,
    backlog: Backlog,
    at: Cursor,
    why: &str,
) -> Result<Option<Stored>, ForwardError> {
    // A new file for the merged backlog: the cursor names the file its position is in,
    // so a crash before the cursor is stored leaves the old pair whole.
    let replay = ReplayAt::start(new_generation(at.replay));
    let path = file.backlog_path(replay.generation);
    backlog.save(&path).map_err(|source| ForwardError::Cursor { file: path.clone(), source })?;
    let next = Cursor { replay: Some(replay), ..at };
    file.store(&next)?;
    remove_backlogs_but(file, Some(replay.generation));
    let (samples, oldest, newest) = backlog.summary();
    tracing::info!(upstream, series = backlog.entries.len(), samples, from_ms = oldest, to_ms = newest, "{why}");
    Ok(Some(Stored { cursor: next, oldest, backlog, labels_before: None }))
}

/// A backlog just stored, and the cursor that replays it: the session that reads it next
/// takes it as it is rather than reading the file back.
pub(crate) struct Stored {
    pub(crate) cursor: Cursor,
    pub(crate) oldest: i64,
    pub(crate) backlog: Backlog,
    /// The labels the cursor's WAL segment named before it, when the listing found them.
    pub(crate) labels_before: Option<(WalCursor, HashMap<SeriesRef, Labels>)>,
}

/// A backlog generation after `previous`'s (the clock, so one never meets an old file).
fn new_generation(previous: Option<ReplayAt>) -> u64 {
    let now = u64::try_from(strata_model::time::now_ms()).unwrap_or(0);
    now.max(previous.map_or(0, |p| p.generation.saturating_add(1)))
}

/// Removes the upstream's backlog files but the one of `keep`.
pub(crate) fn remove_backlogs_but(file: &CursorFile, keep: Option<u64>) {
    let Some(dir) = file.path().parent() else { return };
    let Some(stem) = file.path().file_name().and_then(|n| n.to_str()) else { return };
    let prefix = format!("{}.backlog.", stem.trim_end_matches(".cursor"));
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else { continue };
        if keep.is_some_and(|k| rest == k.to_string()) {
            continue;
        }
        if let Err(err) = std::fs::remove_file(e.path()) {
            tracing::warn!(file = %e.path().display(), error = %err, "forward: removing an old backlog file failed");
        }
    }
}
