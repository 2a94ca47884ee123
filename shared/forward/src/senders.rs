//! [`Senders`]: the external label sets of the edges that forward to a regional, as their
//! `Hello` says, kept in `senders.json` so a restart remembers them. The regional lists
//! them in its StoreAPI `Info`: a global then knows whose data (and whose aggregates) the
//! regional holds.

use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use strata_model::Labels;

/// At most this many senders are remembered (a flood of made-up label sets is not kept).
const MAX_SENDERS: usize = 10_000;

pub struct Senders {
    path: PathBuf,
    known: Mutex<BTreeSet<Vec<(String, String)>>>,
}

impl Senders {
    pub fn open(data_dir: &Path) -> Senders {
        let path = data_dir.join("senders.json");
        let known = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<BTreeSet<Vec<(String, String)>>>(&b).ok())
            .unwrap_or_default();
        Senders { path, known: Mutex::new(known) }
    }

    /// A sender said hello with these external labels; `false` when they could not be kept.
    pub fn saw(&self, labels: &Labels) -> bool {
        if labels.is_empty() {
            return true;
        }
        let key: Vec<(String, String)> = labels.iter().map(|l| (l.name.to_string(), l.value.to_string())).collect();
        let mut known = self.known.lock();
        if known.contains(&key) {
            return true;
        }
        if known.len() >= MAX_SENDERS {
            return false;
        }
        known.insert(key);
        if let Err(e) = save(&self.path, &known) {
            tracing::warn!(file = %self.path.display(), error = %e, "could not record a new sender");
        }
        true
    }

    pub fn label_sets(&self) -> Vec<Labels> {
        self.known.lock().iter().map(|k| Labels::from_pairs(k.iter().map(|(n, v)| (n, v)))).collect()
    }
}

fn save(path: &Path, known: &BTreeSet<Vec<(String, String)>>) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(known).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn senders_are_remembered_across_a_restart_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let s = Senders::open(dir.path());
        let a = Labels::from_pairs([("cluster", "c0"), ("replica", "a")]);
        assert!(s.saw(&a) && s.saw(&a) && s.saw(&Labels::default()));
        assert_eq!(s.label_sets(), vec![a.clone()]);
        assert_eq!(Senders::open(dir.path()).label_sets(), vec![a]);
        for i in 0..MAX_SENDERS {
            s.known.lock().insert(vec![("n".into(), i.to_string())]);
        }
        assert!(!s.saw(&Labels::from_pairs([("n", "new")])), "past the bound");
        // A damaged file is an empty list, not a failed start.
        std::fs::write(dir.path().join("senders.json"), b"{not json").unwrap();
        assert!(Senders::open(dir.path()).label_sets().is_empty());
    }
}
