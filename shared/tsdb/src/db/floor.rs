//! [`HeadFloor`]: where the head's range ends and the blocks' begins, the one invariant a
//! block cut, a checkpoint, a restart and retention must agree on to lose nothing.
//!
//! Two times, both only ever raised:
//! * **admit**: the oldest timestamp a commit may append. A cut raises it to the end of the
//!   window it is about to write, under the WAL lock, so that no sample enters the range
//!   being written; if the block is not written, the cut lowers it back.
//! * **durable**: the end of the newest range the blocks on disk hold. Raised only once the
//!   block is renamed into place and opened, in the same step (layout and WAL locks held)
//!   that drops the range from the head. A checkpoint records this one, never `admit`, so
//!   a restart never takes a window whose block does not exist for one that does.
//!
//! Between the two lies a window that is being written: its samples are in the head and in
//! the WAL, the block is not yet there. `durable <= admit` always.

use std::sync::atomic::{AtomicI64, Ordering};

#[derive(Debug)]
pub(crate) struct HeadFloor {
    admit: AtomicI64,
    durable: AtomicI64,
}

impl HeadFloor {
    /// Both at `t` (a start: the end of the newest block on disk).
    pub fn new(t: i64) -> Self {
        HeadFloor { admit: AtomicI64::new(t), durable: AtomicI64::new(t) }
    }

    /// The oldest timestamp a commit may append (read under the WAL lock).
    pub fn admit(&self) -> i64 {
        self.admit.load(Ordering::Acquire)
    }

    /// The end of the newest range the blocks on disk hold.
    pub fn durable(&self) -> i64 {
        self.durable.load(Ordering::Acquire)
    }

    /// Closes everything before `end` to commits (the caller holds the WAL lock); returns
    /// what to [`reopen`](Self::reopen) to if the block is not written.
    pub fn close_before(&self, end: i64) -> i64 {
        self.admit.fetch_max(end, Ordering::AcqRel)
    }

    /// The block for the range before `end` is on disk and in the block set (the caller
    /// holds the WAL lock and drops the range from the head in the same step).
    pub fn mark_durable(&self, end: i64) {
        self.durable.fetch_max(end, Ordering::AcqRel);
        self.admit.fetch_max(end, Ordering::AcqRel);
    }

    /// Undoes [`close_before`](Self::close_before): the window's block was not written, so
    /// the head keeps taking samples there (never below what is durable).
    pub fn reopen(&self, previous: i64) {
        let durable = self.durable();
        self.admit.store(previous.max(durable), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_closes_then_either_makes_durable_or_reopens() {
        let f = HeadFloor::new(100);
        let prev = f.close_before(200);
        assert_eq!((f.admit(), f.durable()), (200, 100), "closed, not yet durable");
        f.reopen(prev);
        assert_eq!((f.admit(), f.durable()), (100, 100));
        f.close_before(200);
        f.mark_durable(200);
        assert_eq!((f.admit(), f.durable()), (200, 200));
        f.reopen(50);
        assert_eq!(f.admit(), 200, "never below what is durable");
    }
}
