//! What the downsampler has done and must do again, kept in `progress.json` beside the
//! aggregate blocks: per resolution, the frontier below which every slice was computed
//! and the slices late data changed since. Which senders have been heard from, and how
//! far they got, is kept in memory only: after a restart, a slice waits for them to come
//! back or for the maximum delay, as for any sender that went silent.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
struct Saved {
    /// Per resolution (window width, ms): every slice ending at or before this is done.
    frontier: BTreeMap<i64, i64>,
    /// Per resolution: the starts of slices to compute again.
    dirty: BTreeMap<i64, BTreeSet<i64>>,
}

/// One resolution's slicing: windows of `width` computed `slice` ms at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slicing {
    pub width: i64,
    pub slice: i64,
}

impl Slicing {
    /// The slice `(a, a + slice]` that holds sample time `t`: its `a`.
    pub fn slice_of(&self, t: i64) -> i64 {
        t.saturating_sub(1).div_euclid(self.slice).saturating_mul(self.slice)
    }
}

pub struct Progress {
    path: PathBuf,
    slicings: Vec<Slicing>,
    /// What is saved, and the slice being computed per resolution (with whether data
    /// arrived for it since it began: the computation may have missed it), under one lock
    /// so that an arrival is never between the two.
    state: Mutex<State>,
    /// Held while `progress.json` is written, not the state's lock: readers (the StoreAPI's
    /// `Info`) never wait for an fsync. The newest state is written last.
    save_lock: Mutex<()>,
    /// Each sender's newest sample time and when it was last heard from.
    senders: Mutex<HashMap<String, (i64, Instant)>>,
}

#[derive(Default)]
struct State {
    saved: Saved,
    computing: HashMap<i64, (i64, i64, bool)>,
}

const FILE: &str = "progress.json";

/// Senders followed at most (the name comes from the peer).
const MAX_SENDERS: usize = 10_000;

/// Slices waiting to be computed again, per resolution, at most: past it, the oldest
/// marks are dropped (logged), as data that old is past any raw retention.
const MAX_DIRTY: usize = 20_000;

impl Progress {
    pub fn open(dir: &Path, slicings: Vec<Slicing>) -> std::io::Result<Progress> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(FILE);
        let saved = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", path.display()))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Saved::default(),
            Err(e) => return Err(e),
        };
        Ok(Progress {
            path,
            slicings,
            state: Mutex::new(State { saved, computing: HashMap::new() }),
            save_lock: Mutex::new(()),
            senders: Mutex::default(),
        })
    }

    /// Every slice ending at or before this was computed (unless dirty); `None` before the
    /// first.
    pub fn frontier(&self, width: i64) -> Option<i64> {
        self.state.lock().saved.frontier.get(&width).copied()
    }

    pub fn dirty(&self, width: i64) -> Vec<i64> {
        self.state.lock().saved.dirty.get(&width).map(|d| d.iter().copied().collect()).unwrap_or_default()
    }

    /// Up to where the aggregates of `width` are complete and current: the frontier, but
    /// not past a slice waiting to be computed again, nor past the progress of a sender
    /// heard from within `max_delay_ms` (its data there is still on the way).
    pub fn complete_until(&self, width: i64, max_delay_ms: u64) -> Option<i64> {
        let (frontier, dirty) = {
            let st = self.state.lock();
            let f = *st.saved.frontier.get(&width)?;
            (f, st.saved.dirty.get(&width).and_then(|d| d.first().copied()))
        };
        let recent = std::time::Duration::from_millis(max_delay_ms);
        let behind = self
            .senders
            .lock()
            .values()
            .filter(|(_, heard)| heard.elapsed() <= recent)
            .map(|(newest, _)| *newest)
            .min()
            .unwrap_or(i64::MAX);
        Some(frontier.min(dirty.unwrap_or(i64::MAX)).min(behind))
    }

    /// A sender stored samples over `[min_t, max_t]` (called before it is acknowledged):
    /// its progress moves, and slices already computed (or being computed) over those
    /// times are marked for computing again, durably. Times before `oldest` (what storage
    /// still admits) mark nothing.
    pub fn arrived(&self, sender: &str, min_t: i64, max_t: i64, oldest: i64) -> std::io::Result<()> {
        {
            let mut s = self.senders.lock();
            if !s.contains_key(sender) && s.len() >= MAX_SENDERS {
                // The one heard from longest ago goes.
                if let Some(k) = s.iter().min_by_key(|(_, v)| v.1).map(|(k, _)| k.clone()) {
                    s.remove(&k);
                }
            }
            let e = s.entry(sender.to_string()).or_insert((i64::MIN, Instant::now()));
            e.0 = e.0.max(max_t);
            e.1 = Instant::now();
        }
        self.changed(min_t, max_t, oldest)
    }

    /// Samples over `[min_t, max_t]` were stored by the tier itself (its recording rules):
    /// slices already computed over them are marked for computing again, durably, as for
    /// [`arrived`](Self::arrived), but no sender's progress moves. The tier's own output,
    /// written at about the present, must never make a slice due on its own (after a
    /// restart, before the edges are back with their backlogs).
    pub fn changed(&self, min_t: i64, max_t: i64, oldest: i64) -> std::io::Result<()> {
        let min_t = min_t.max(oldest);
        if min_t > max_t {
            return Ok(());
        }
        let changed = {
            let mut st = self.state.lock();
            for (a, b, hit) in st.computing.values_mut() {
                *hit |= min_t <= *b && max_t > *a;
            }
            let mut changed = false;
            for sl in &self.slicings {
                let reach = st.saved.frontier.get(&sl.width).copied().unwrap_or(i64::MIN);
                if min_t > reach {
                    continue;
                }
                let last = sl.slice_of(max_t.min(reach));
                // At most the newest MAX_DIRTY slices: a timestamp from long ago (or a
                // hostile one) costs no more than that.
                let floor = last.saturating_sub((MAX_DIRTY as i64).saturating_mul(sl.slice));
                let mut a = sl.slice_of(min_t).max(floor);
                let dirty = st.saved.dirty.entry(sl.width).or_default();
                while a <= last {
                    changed |= dirty.insert(a);
                    a = a.saturating_add(sl.slice);
                    if a == i64::MAX {
                        break;
                    }
                }
                while dirty.len() > MAX_DIRTY {
                    if let Some(first) = dirty.pop_first() {
                        tracing::warn!(
                            width = sl.width,
                            slice = first,
                            "too many slices to compute again: the oldest mark dropped"
                        );
                    }
                }
            }
            changed
        };
        if changed {
            self.save()?;
        }
        Ok(())
    }

    /// Whether some sender was heard from within `max_delay_ms` and every one that was got
    /// past `t` (none heard, as after a restart: not known).
    pub fn senders_past(&self, t: i64, max_delay_ms: u64) -> bool {
        let recent = std::time::Duration::from_millis(max_delay_ms);
        let senders = self.senders.lock();
        let mut lately = senders.values().filter(|(_, heard)| heard.elapsed() <= recent).peekable();
        lately.peek().is_some() && lately.all(|(newest, _)| *newest >= t)
    }

    /// The slice `(a, b]` of `width` is being computed from now on (before its data is
    /// read).
    pub fn begin(&self, width: i64, a: i64, b: i64) {
        self.state.lock().computing.insert(width, (a, b, false));
    }

    /// The slice `(a, a + slice]` was written: off the dirty list unless data arrived for
    /// it while it was computed, and the frontier moved over it when it was next.
    pub fn done(&self, sl: Slicing, a: i64) -> std::io::Result<()> {
        {
            let mut st = self.state.lock();
            let hit = st.computing.remove(&sl.width).is_some_and(|c| c.2);
            let dirty = st.saved.dirty.entry(sl.width).or_default();
            if hit {
                dirty.insert(a);
            } else {
                dirty.remove(&a);
            }
            let f = st.saved.frontier.entry(sl.width).or_insert(a);
            if *f == a {
                *f = a + sl.slice;
            }
        }
        self.save()
    }

    /// Starts the frontier at `a` when it has none (the oldest data there is).
    pub fn start_at(&self, width: i64, a: i64) {
        self.state.lock().saved.frontier.entry(width).or_insert(a);
    }

    /// The slice being computed stopped without being written.
    pub fn abandon(&self, width: i64) {
        self.state.lock().computing.remove(&width);
    }

    /// Writes the state as it is now; two writers write in turn, the later one the newer
    /// state.
    fn save(&self) -> std::io::Result<()> {
        let _turn = self.save_lock.lock();
        let saved = self.state.lock().saved.clone();
        save(&self.path, &saved)
    }
}

/// Written whole to a temporary file, synced, renamed over the old one.
fn save(path: &Path, saved: &Saved) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(saved).map_err(std::io::Error::other)?)?;
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

    /// A progress of 5 m windows in two-hour slices whose first slice is computed.
    fn first_slice_computed() -> (tempfile::TempDir, Slicing, Progress) {
        let dir = tempfile::tempdir().unwrap();
        let sl = Slicing { width: 300_000, slice: 7_200_000 };
        let p = Progress::open(dir.path(), vec![sl]).unwrap();
        p.start_at(sl.width, 0);
        p.begin(sl.width, 0, sl.slice);
        p.done(sl, 0).unwrap();
        (dir, sl, p)
    }

    #[test]
    fn hostile_spans_mark_a_bounded_number_of_slices_and_old_ones_nothing() {
        let (dir, sl, p) = first_slice_computed();
        // Before what storage admits: nothing to compute again.
        p.arrived("a", 10, 20, 1_000).unwrap();
        assert!(p.dirty(sl.width).is_empty());
        // From the beginning of time: bounded, and no overflow.
        p.arrived("a", i64::MIN, i64::MAX, i64::MIN).unwrap();
        let d = p.dirty(sl.width);
        assert!(!d.is_empty() && d.len() <= MAX_DIRTY + 1, "{}", d.len());
        for i in 0..(MAX_SENDERS + 10) {
            p.arrived(&format!("s{i}"), 1, 2, 0).unwrap();
        }
        assert!(p.senders.lock().len() <= MAX_SENDERS);
        // Marked durably: a reopened progress knows.
        let again = Progress::open(dir.path(), vec![sl]).unwrap();
        assert_eq!(again.dirty(sl.width), d);
    }

    /// The tier's own output (its rules) marks computed slices like a sender's late
    /// samples, durably, but moves no sender: alone, as after a restart before the edges
    /// are back, it never makes a slice due.
    #[test]
    fn the_tiers_own_output_marks_slices_but_makes_none_due() {
        let (dir, sl, p) = first_slice_computed();
        p.changed(7_000_000, 30_000_000, 0).unwrap();
        assert_eq!(p.dirty(sl.width), vec![0]);
        assert!(!p.senders_past(2 * sl.slice, 60_000), "the tier's own output counted as a sender");
        assert_eq!(Progress::open(dir.path(), vec![sl]).unwrap().dirty(sl.width), vec![0]);
        p.arrived("edge", 7_000_000, 30_000_000, 0).unwrap();
        assert!(p.senders_past(2 * sl.slice, 60_000));
    }
}
