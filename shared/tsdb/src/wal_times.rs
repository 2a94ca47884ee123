//! [`WalTimes`]: the oldest sample time of what the WAL holds past a position, for a
//! reader of the WAL (a forwarder) that must say up to when it has sent everything.
//!
//! The WAL holds samples about in time order, but not exactly: a slow scrape, a remote
//! write or a scrape that honours its targets' timestamps stores older samples after newer
//! ones. So each commit's WAL span is kept with its oldest sample, the last
//! [`MAX_COMMITS`] of them. What was written before the oldest kept (or before the database
//! was opened, the WAL replayed) is not known: asked from there, the answer is `None`.

use crate::wal::WalCursor;
use std::collections::VecDeque;

/// Commits whose oldest sample is kept (about 2.4 MB).
pub const MAX_COMMITS: usize = 100_000;

#[derive(Debug)]
pub(crate) struct WalTimes {
    /// Per commit, in WAL order: where its records start and end, and its oldest sample.
    commits: VecDeque<(WalCursor, WalCursor, i64)>,
    /// Everything written from here on is in `commits`.
    known_from: WalCursor,
}

impl WalTimes {
    /// Knows nothing written before `at` (the WAL's end when the database opened).
    pub(crate) fn new(at: WalCursor) -> WalTimes {
        WalTimes { commits: VecDeque::new(), known_from: at }
    }

    /// Records `[start, end)` were written, their oldest sample at `oldest`.
    pub(crate) fn note(&mut self, start: WalCursor, end: WalCursor, oldest: i64) {
        if self.commits.len() >= MAX_COMMITS {
            if let Some((_, end, _)) = self.commits.pop_front() {
                self.known_from = end;
            }
        }
        self.commits.push_back((start, end, oldest));
    }

    /// The oldest sample time of every record that ends past `at` (`i64::MAX`: none);
    /// `None` when records past `at` were written before what is kept.
    pub(crate) fn oldest_after(&self, at: WalCursor) -> Option<i64> {
        if at < self.known_from {
            return None;
        }
        Some(self.commits.iter().rev().take_while(|(_, end, _)| *end > at).map(|c| c.2).min().unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(segment: u32, offset: u64) -> WalCursor {
        WalCursor { segment, offset }
    }

    #[test]
    fn the_oldest_past_a_position_counts_late_samples_and_nothing_unknown() {
        let mut w = WalTimes::new(at(3, 100));
        assert_eq!(w.oldest_after(at(3, 50)), None, "written before the database opened");
        assert_eq!(w.oldest_after(at(3, 100)), Some(i64::MAX));
        w.note(at(3, 100), at(3, 200), 5_000);
        // A slow scrape's older samples, stored after newer ones.
        w.note(at(3, 200), at(4, 0), 4_000);
        w.note(at(4, 0), at(4, 80), 6_000);
        assert_eq!(w.oldest_after(at(3, 100)), Some(4_000));
        assert_eq!(w.oldest_after(at(3, 150)), Some(4_000), "a commit partly read counts");
        assert_eq!(w.oldest_after(at(4, 0)), Some(6_000));
        assert_eq!(w.oldest_after(at(4, 80)), Some(i64::MAX));
        for k in 0..MAX_COMMITS as u64 {
            w.note(at(5, k), at(5, k + 1), 7_000);
        }
        assert_eq!(w.oldest_after(at(4, 0)), None, "forgotten commits are not known");
        assert_eq!(w.oldest_after(at(5, 3)), Some(7_000));
    }
}
