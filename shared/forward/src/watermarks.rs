//! [`Watermarks`]: per sender, the time up to which it has sent a regional everything it
//! stores (`PushRequest.complete_until`), and from them the time up to which the regional's
//! data is whole.
//!
//! A regional's own data reaches "now" as long as one edge is current, so its time range
//! says nothing of an edge that is an hour behind (an outage, a backlog sent series by
//! series). An archiver that took the range as whole would archive the regional's copy of
//! that hour short, and never write it again. The regional therefore says, in its StoreAPI
//! `Info`, the oldest watermark of its senders and which sender that is. A sender that has
//! said nothing yet (an older edge, or one known from its `Hello` alone) counts as having
//! sent nothing: it holds the archive back, which then writes its ranges after the maximum
//! wait with a gap naming it, rather than short in silence. Watermarks are kept in
//! `watermarks.json`, written at most every [`SAVE_EVERY`] (`fsync`ed, then renamed): a
//! stale file says less than was sent, never more, and a sender the file lacks but
//! `senders.json` knows starts as having sent nothing. A sender silent for
//! [`FORGET_AFTER`] is no longer waited for (logged), and stays so across restarts until
//! it is heard from again.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A sender not heard from for this long is taken as gone (an edge taken out of service
/// would otherwise hold the archive back for ever); until then it holds it back.
pub const FORGET_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// How often the watermarks are written out at most.
pub const SAVE_EVERY: Duration = Duration::from_secs(10);

/// Senders followed at most (the name comes from the peer): past it a new name is not
/// followed (logged), and none already followed is dropped for it.
const MAX_SENDERS: usize = 10_000;

/// A sender's name is cut to this many bytes.
const MAX_NAME: usize = 1024;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
struct Mark {
    /// Everything up to here (ms) was sent.
    until: i64,
    /// When it was last heard from (ms since the epoch, the regional's clock).
    heard: i64,
    /// Silent for [`FORGET_AFTER`]: not waited for (kept, so that `senders.json` does not
    /// bring it back at a restart).
    #[serde(default)]
    gone: bool,
}

pub struct Watermarks {
    path: PathBuf,
    marks: Mutex<(BTreeMap<String, Mark>, Option<Instant>)>,
    /// Held for a whole write of the file: one writer at a time, the newest last.
    saving: Mutex<()>,
}

impl Watermarks {
    /// Those saved in `data_dir`, if any (a damaged file is logged and left out), and the
    /// `known` senders (from their `Hello`) the file lacks, as having sent nothing yet.
    pub fn open(data_dir: &Path, known: impl IntoIterator<Item = String>) -> Watermarks {
        let path = data_dir.join("watermarks.json");
        let mut marks: BTreeMap<String, Mark> = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(file = %path.display(), error = %e, "forward: damaged watermarks file left out");
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        let now = strata_model::time::now_ms();
        for name in known {
            if marks.len() < MAX_SENDERS {
                marks.entry(cut(&name).to_string()).or_insert(Mark { until: i64::MIN, heard: now, gone: false });
            }
        }
        Watermarks { path, marks: Mutex::new((marks, None)), saving: Mutex::new(()) }
    }

    /// A batch of `sender`'s is durable here, saying it has sent everything up to `until`
    /// (`None`: it says nothing, and counts as having sent nothing until it does). A
    /// watermark never goes back: a sender that starts again from older data sends what
    /// is already here.
    pub fn advance(&self, sender: &str, until: Option<i64>) {
        let name = cut(if sender.is_empty() { "(unnamed)" } else { sender });
        let now = strata_model::time::now_ms();
        let forget = i64::try_from(FORGET_AFTER.as_millis()).unwrap_or(i64::MAX);
        let due = {
            let mut g = self.marks.lock();
            let (marks, saved) = &mut *g;
            if !marks.contains_key(name) {
                for (k, m) in marks.iter_mut().filter(|(_, m)| !m.gone && m.heard < now.saturating_sub(forget)) {
                    tracing::warn!(sender = %k, until_ms = m.until, "forward: a sender silent for a week is no longer waited for");
                    m.gone = true;
                }
                if marks.len() >= MAX_SENDERS {
                    // Room is made from the gone alone.
                    marks.retain(|_, m| !m.gone);
                }
                if marks.len() >= MAX_SENDERS {
                    tracing::warn!(sender = %name, "forward: too many senders to follow another's watermark");
                    return;
                }
            }
            let m = marks.entry(name.to_string()).or_insert(Mark { until: i64::MIN, heard: now, gone: false });
            m.until = m.until.max(until.unwrap_or(i64::MIN));
            m.heard = now;
            m.gone = false;
            let due = saved.is_none_or(|t| t.elapsed() >= SAVE_EVERY);
            if due {
                *saved = Some(Instant::now());
            }
            due
        };
        if due {
            // One writer at a time, each taking the marks as they are when it writes: the
            // newest is written last.
            let _writing = self.saving.lock();
            let marks = self.marks.lock().0.clone();
            if let Err(e) = save_to(&self.path, &marks) {
                tracing::warn!(file = %self.path.display(), error = %e, "forward: could not save the senders' watermarks");
            }
        }
    }

    /// The oldest watermark of the senders heard from within [`FORGET_AFTER`] (a silent
    /// one included: its data is on the way, or lost), and whose it is; `None` when there
    /// is no sender.
    pub fn complete_until(&self) -> Option<(i64, String)> {
        let forget = i64::try_from(FORGET_AFTER.as_millis()).unwrap_or(i64::MAX);
        let since = strata_model::time::now_ms().saturating_sub(forget);
        let g = self.marks.lock();
        g.0.iter()
            .filter(|(_, m)| !m.gone && m.heard >= since)
            .min_by_key(|(_, m)| m.until)
            .map(|(k, m)| (m.until, k.clone()))
    }
}

/// `name` cut to [`MAX_NAME`] bytes.
fn cut(name: &str) -> &str {
    let mut at = name.len().min(MAX_NAME);
    while !name.is_char_boundary(at) {
        at -= 1;
    }
    &name[..at]
}

fn save_to(path: &Path, marks: &BTreeMap<String, Mark>) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(marks).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sender_furthest_behind_holds_the_regional_back_and_a_restart_remembers_it() {
        let dir = tempfile::tempdir().unwrap();
        let w = Watermarks::open(dir.path(), []);
        assert_eq!(w.complete_until(), None);
        w.advance("{cluster=\"a\"}", Some(5_000));
        w.advance("{cluster=\"b\"}", Some(2_000));
        w.advance("{cluster=\"a\"}", Some(9_000));
        // Never back: b sending older data again keeps where it got to.
        w.advance("{cluster=\"b\"}", Some(3_000));
        w.advance("{cluster=\"b\"}", Some(1_000));
        assert_eq!(w.complete_until(), Some((3_000, "{cluster=\"b\"}".to_string())));
        // A batch that says nothing keeps what was said.
        w.advance("{cluster=\"b\"}", None);
        assert_eq!(w.complete_until(), Some((3_000, "{cluster=\"b\"}".to_string())));
        // Saved with the first advance only (later ones wait for SAVE_EVERY): a restart
        // knows a from the file and b from its hello, as having sent nothing yet.
        let again = Watermarks::open(dir.path(), ["{cluster=\"b\"}".to_string()]);
        assert_eq!(again.complete_until(), Some((i64::MIN, "{cluster=\"b\"}".to_string())));
        // A damaged file is left out, not a failure; the hello registry still holds.
        std::fs::write(dir.path().join("watermarks.json"), b"{not json").unwrap();
        assert_eq!(Watermarks::open(dir.path(), []).complete_until(), None);
        let seeded = Watermarks::open(dir.path(), ["{cluster=\"a\"}".to_string()]);
        assert_eq!(seeded.complete_until().map(|c| c.0), Some(i64::MIN));
    }

    #[test]
    fn a_sender_that_says_nothing_holds_back_and_one_gone_a_week_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let w = Watermarks::open(dir.path(), []);
        w.advance("current", Some(10_000));
        w.advance("older version", None);
        assert_eq!(w.complete_until(), Some((i64::MIN, "older version".to_string())));
        w.advance("", Some(5));
        assert!(w.marks.lock().0.contains_key("(unnamed)"));
        let week_ago = strata_model::time::now_ms() - FORGET_AFTER.as_millis() as i64 - 1;
        for m in w.marks.lock().0.values_mut().filter(|m| m.until < 10_000) {
            m.heard = week_ago;
        }
        assert_eq!(w.complete_until(), Some((10_000, "current".to_string())));
        let long = "x".repeat(5000);
        w.advance(&long, Some(0));
        assert_eq!(w.complete_until().unwrap().1.len(), MAX_NAME);
        // The gone are marked when a new sender comes, and stay gone across a restart
        // that knows them from their hello.
        assert!(w.marks.lock().0.get("older version").is_some_and(|m| m.gone));
        w.marks.lock().1 = None; // the next advance saves
        w.advance("current", Some(10_002));
        let again = Watermarks::open(dir.path(), ["older version".to_string()]);
        assert_eq!(again.complete_until().map(|c| c.0), Some(0), "{:?}", again.complete_until());
        // Heard from again: waited for again.
        w.advance("older version", None);
        assert_eq!(w.complete_until().map(|c| c.0), Some(i64::MIN));
        w.advance("older version", Some(30_000));
        // A full list takes no more, and drops none it follows for a new name.
        for i in 0..MAX_SENDERS + 5 {
            w.advance(&format!("s{i}"), Some(20_000));
        }
        assert_eq!(w.marks.lock().0.len(), MAX_SENDERS);
        assert!(w.marks.lock().0.contains_key(&long[..MAX_NAME]), "a sender followed was dropped for a new name");
    }
}
