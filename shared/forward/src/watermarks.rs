//! [`Watermarks`]: per sender, the time up to which it has sent a regional everything it
//! stores (`PushRequest.complete_until`), and from them the time up to which the regional's
//! data is whole.
//!
//! A regional's own data reaches "now" as long as one edge is current, so its time range
//! says nothing of an edge that is an hour behind (an outage, a backlog sent series by
//! series). An archiver that took the range as whole would archive the regional's copy of
//! that hour short, and never write it again. The regional therefore says, in its StoreAPI
//! `Info`, the oldest watermark of the senders it has heard from within [`FORGET_AFTER`]
//! and which sender that is. Watermarks are kept in `watermarks.json` (written when a
//! sender is new, otherwise at most every [`SAVE_EVERY`]: a stale file says less than was
//! sent, never more), so a restart still waits for an edge that was behind before it.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A sender not heard from for this long is taken as gone (an edge taken out of service
/// would otherwise hold the archive back for ever).
pub const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

/// How often the watermarks are written out at most.
pub const SAVE_EVERY: Duration = Duration::from_secs(10);

/// Senders followed at most (the name comes from the peer); the one heard from longest
/// ago goes first.
const MAX_SENDERS: usize = 10_000;

/// A sender's name is cut to this many bytes.
const MAX_NAME: usize = 1024;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
struct Mark {
    /// Everything up to here (ms) was sent.
    until: i64,
    /// When it was last heard from (ms since the epoch, the regional's clock).
    heard: i64,
}

pub struct Watermarks {
    path: PathBuf,
    marks: Mutex<(BTreeMap<String, Mark>, Option<Instant>)>,
}

impl Watermarks {
    /// Those saved in `data_dir`, if any (a damaged file is logged and left out: the
    /// senders report again with their next batch).
    pub fn open(data_dir: &Path) -> Watermarks {
        let path = data_dir.join("watermarks.json");
        let marks = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(file = %path.display(), error = %e, "forward: damaged watermarks file left out");
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        Watermarks { path, marks: Mutex::new((marks, None)) }
    }

    /// `sender`'s batch up to `until` is durable here. A watermark never goes back: a
    /// sender that starts again from older data sends what is already here.
    pub fn advance(&self, sender: &str, until: i64) {
        if sender.is_empty() {
            return;
        }
        let mut name = sender;
        if name.len() > MAX_NAME {
            let mut cut = MAX_NAME;
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            name = &name[..cut];
        }
        let now = strata_model::time::now_ms();
        let save = {
            let mut g = self.marks.lock();
            let (marks, saved) = &mut *g;
            if !marks.contains_key(name) && marks.len() >= MAX_SENDERS {
                if let Some(k) = marks.iter().min_by_key(|(_, m)| m.heard).map(|(k, _)| k.clone()) {
                    marks.remove(&k);
                }
            }
            let new = !marks.contains_key(name);
            let m = marks.entry(name.to_string()).or_insert(Mark { until, heard: now });
            m.until = m.until.max(until);
            m.heard = now;
            // A sender missing from the file would count for nothing after a restart:
            // a new one is written at once.
            let due = new || saved.is_none_or(|t| t.elapsed() >= SAVE_EVERY);
            if due {
                *saved = Some(Instant::now());
            }
            due.then(|| marks.clone())
        };
        if let Some(marks) = save {
            if let Err(e) = save_to(&self.path, &marks) {
                tracing::warn!(file = %self.path.display(), error = %e, "forward: could not save the senders' watermarks");
            }
        }
    }

    /// The oldest watermark of the senders heard from within [`FORGET_AFTER`], and whose
    /// it is; `None` when no sender has reported one.
    pub fn complete_until(&self) -> Option<(i64, String)> {
        let forget = i64::try_from(FORGET_AFTER.as_millis()).unwrap_or(i64::MAX);
        let since = strata_model::time::now_ms().saturating_sub(forget);
        let g = self.marks.lock();
        g.0.iter().filter(|(_, m)| m.heard >= since).min_by_key(|(_, m)| m.until).map(|(k, m)| (m.until, k.clone()))
    }
}

fn save_to(path: &Path, marks: &BTreeMap<String, Mark>) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(marks).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sender_furthest_behind_holds_the_regional_back_and_a_restart_remembers_it() {
        let dir = tempfile::tempdir().unwrap();
        let w = Watermarks::open(dir.path());
        assert_eq!(w.complete_until(), None);
        w.advance("{cluster=\"a\"}", 5_000);
        w.advance("{cluster=\"b\"}", 2_000);
        w.advance("{cluster=\"a\"}", 9_000);
        // Never back: b sending older data again keeps where it got to.
        w.advance("{cluster=\"b\"}", 3_000);
        w.advance("{cluster=\"b\"}", 1_000);
        w.advance("", 0);
        assert_eq!(w.complete_until(), Some((3_000, "{cluster=\"b\"}".to_string())));
        // Saved when each sender was new; later advances wait for SAVE_EVERY, so what a
        // restart reads says no more than was sent.
        let again = Watermarks::open(dir.path());
        let (until, _) = again.complete_until().unwrap();
        assert!(until <= 3_000, "{until}");
        // A damaged file is left out, not a failure.
        std::fs::write(dir.path().join("watermarks.json"), b"{not json").unwrap();
        assert_eq!(Watermarks::open(dir.path()).complete_until(), None);
    }

    #[test]
    fn a_sender_gone_for_a_day_no_longer_counts_and_names_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let w = Watermarks::open(dir.path());
        w.advance("current", 10_000);
        w.advance("gone", 1_000);
        let day_ago = strata_model::time::now_ms() - FORGET_AFTER.as_millis() as i64 - 1;
        w.marks.lock().0.get_mut("gone").unwrap().heard = day_ago;
        assert_eq!(w.complete_until(), Some((10_000, "current".to_string())));
        let long = "x".repeat(5000);
        w.advance(&long, 0);
        assert_eq!(w.complete_until().unwrap().1.len(), MAX_NAME);
    }
}
