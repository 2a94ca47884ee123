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
        (t - 1).div_euclid(self.slice) * self.slice
    }
}

pub struct Progress {
    path: PathBuf,
    slicings: Vec<Slicing>,
    saved: Mutex<Saved>,
    /// Each sender's newest sample time and when it was last heard from.
    senders: Mutex<HashMap<String, (i64, Instant)>>,
    /// The slice being computed, per resolution, and whether data arrived for it since it
    /// began (the computation may have missed it).
    computing: Mutex<HashMap<i64, (i64, i64, bool)>>,
}

const FILE: &str = "progress.json";

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
            saved: Mutex::new(saved),
            senders: Mutex::default(),
            computing: Mutex::default(),
        })
    }

    /// Every slice ending at or before this was computed (unless dirty); `None` before the
    /// first.
    pub fn frontier(&self, width: i64) -> Option<i64> {
        self.saved.lock().frontier.get(&width).copied()
    }

    pub fn dirty(&self, width: i64) -> Vec<i64> {
        self.saved.lock().dirty.get(&width).map(|d| d.iter().copied().collect()).unwrap_or_default()
    }

    /// A sender stored samples over `[min_t, max_t]` (called before it is acknowledged):
    /// its progress moves, and slices already computed (or being computed) over those
    /// times are marked for computing again, durably.
    pub fn arrived(&self, sender: &str, min_t: i64, max_t: i64) -> std::io::Result<()> {
        {
            let mut s = self.senders.lock();
            let e = s.entry(sender.to_string()).or_insert((i64::MIN, Instant::now()));
            e.0 = e.0.max(max_t);
            e.1 = Instant::now();
        }
        let mut computing = self.computing.lock();
        for (a, b, hit) in computing.values_mut() {
            *hit |= min_t <= *b && max_t > *a;
        }
        drop(computing);
        let mut saved = self.saved.lock();
        let before = saved.clone();
        for sl in &self.slicings {
            let reach = saved.frontier.get(&sl.width).copied().unwrap_or(i64::MIN);
            if min_t > reach {
                continue;
            }
            let mut a = sl.slice_of(min_t);
            let last = sl.slice_of(max_t.min(reach));
            let dirty = saved.dirty.entry(sl.width).or_default();
            while a <= last {
                dirty.insert(a);
                a += sl.slice;
            }
        }
        if *saved != before {
            save(&self.path, &saved)?;
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
        self.computing.lock().insert(width, (a, b, false));
    }

    /// The slice `(a, a + slice]` was written: off the dirty list unless data arrived for
    /// it while it was computed, and the frontier moved over it when it was next.
    pub fn done(&self, sl: Slicing, a: i64) -> std::io::Result<()> {
        let hit = self.computing.lock().remove(&sl.width).is_some_and(|c| c.2);
        let mut saved = self.saved.lock();
        let dirty = saved.dirty.entry(sl.width).or_default();
        if hit {
            dirty.insert(a);
        } else {
            dirty.remove(&a);
        }
        let f = saved.frontier.entry(sl.width).or_insert(a);
        if *f == a {
            *f = a + sl.slice;
        }
        save(&self.path, &saved)
    }

    /// Starts the frontier at `a` when it has none (the oldest data there is).
    pub fn start_at(&self, width: i64, a: i64) {
        self.saved.lock().frontier.entry(width).or_insert(a);
    }

    /// The slice being computed stopped without being written.
    pub fn abandon(&self, width: i64) {
        self.computing.lock().remove(&width);
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
