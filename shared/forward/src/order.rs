//! A session's numbered batches stored in the order the sender numbered them.
//!
//! A sender that waits for each acknowledgement before it pushes the next batch leaves
//! both sides idle in turn: the regional while the edge encodes and compresses, the edge
//! while the regional stores and syncs. So a sender may push batch k+1 before batch k is
//! acknowledged (`PushRequest.seq`, up to [`MAX_IN_FLIGHT`] ahead). The receiver checks and
//! decodes both at once, but stores k+1 only after k: k+1 may name series by the numbers k
//! gave them, and its samples follow k's. A batch waits for its turn without holding a
//! thread, for at most [`TURN_WAIT`]; one that runs further ahead than the sender was
//! told it may, or whose predecessor failed, is refused, and the sender starts a new
//! session from its persisted cursor (which only ever moves past acknowledged batches).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::Status;

/// Batches of one session the receiver takes in flight at once (said in `Hello`).
pub const MAX_IN_FLIGHT: u64 = 4;

/// The longest a batch waits for its predecessor to be stored. A predecessor that never
/// comes (its sender gave up on it) ends the session this long after.
pub(crate) const TURN_WAIT: Duration = Duration::from_secs(30);

/// Sessions followed at once; past that the least recently used one is forgotten (a batch
/// of it then waits for a predecessor that counts from 0 again, and its sender starts a
/// new session).
const MAX_SESSIONS: usize = 256;

#[derive(Default)]
pub(crate) struct BatchOrder {
    sessions: parking_lot::Mutex<HashMap<String, Turns>>,
    changed: tokio::sync::Notify,
}

struct Turns {
    /// The last batch stored.
    stored: u64,
    /// A batch of the session failed: every later one fails too.
    failed: bool,
    used: Instant,
}

/// What becomes of a waiting batch.
enum Wait {
    Go,
    Later,
}

impl BatchOrder {
    /// Waits until batch `seq` of `session` is next to be stored. The returned [`Turn`]
    /// lets the next batch go once dropped: stored ([`Turn::stored`]) or failed.
    pub async fn turn(self: &Arc<Self>, session: &str, seq: u64) -> Result<Turn, Status> {
        self.turn_within(session, seq, TURN_WAIT).await
    }

    async fn turn_within(self: &Arc<Self>, session: &str, seq: u64, wait: Duration) -> Result<Turn, Status> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before the state is read, so a change in between is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.check(session, seq)? {
                Wait::Go => return Ok(Turn { order: self.clone(), session: session.to_string(), seq, stored: false }),
                Wait::Later => {}
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(Status::unavailable(format!(
                    "batch {seq} of session {session:?} waited {wait:?} for the batch before it: start a new session"
                )));
            }
        }
    }

    fn check(&self, session: &str, seq: u64) -> Result<Wait, Status> {
        let mut all = self.sessions.lock();
        if !all.contains_key(session) && all.len() >= MAX_SESSIONS {
            let oldest = all.iter().min_by_key(|(_, t)| t.used).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                all.remove(&k);
            }
        }
        let t = all.entry(session.to_string()).or_insert(Turns { stored: 0, failed: false, used: Instant::now() });
        t.used = Instant::now();
        let refuse = |why: String| {
            Err(Status::failed_precondition(format!("batch {seq} of session {session:?}: {why}: start a new session")))
        };
        if t.failed {
            return refuse("a batch before it failed".into());
        }
        if seq <= t.stored {
            return refuse(format!("batch {} was stored already", t.stored));
        }
        if seq - t.stored > MAX_IN_FLIGHT {
            return refuse(format!(
                "{} batches ahead of the last stored ({}), at most {MAX_IN_FLIGHT}",
                seq - t.stored,
                t.stored
            ));
        }
        Ok(if seq == t.stored + 1 { Wait::Go } else { Wait::Later })
    }

    /// Batch `seq` of `session` failed before its turn: the batches after it fail too.
    pub fn failed(&self, session: &str, seq: u64) {
        if let Some(t) = self.sessions.lock().get_mut(session) {
            if seq > t.stored {
                t.failed = true;
            }
        }
        self.changed.notify_waiters();
    }
}

/// A batch's turn to be stored. Dropped without [`stored`](Turn::stored), the batch
/// failed, and so do the session's later ones.
pub(crate) struct Turn {
    order: Arc<BatchOrder>,
    session: String,
    seq: u64,
    stored: bool,
}

impl Turn {
    pub fn stored(mut self) {
        self.stored = true;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        {
            let mut all = self.order.sessions.lock();
            if let Some(t) = all.get_mut(&self.session) {
                if self.stored {
                    t.stored = t.stored.max(self.seq);
                } else {
                    t.failed = true;
                }
            }
        }
        self.order.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn batches_go_in_order_and_a_failure_fails_the_rest() {
        let order = Arc::new(BatchOrder::default());
        // Batch 2 waits for batch 1.
        let o = order.clone();
        let second = tokio::spawn(async move { o.turn("s", 2).await.map(|t| t.seq) });
        tokio::task::yield_now().await;
        assert!(!second.is_finished());
        let first = order.turn("s", 1).await.map_err(|e| e.to_string()).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!second.is_finished(), "batch 2 went before batch 1 was stored");
        first.stored();
        let t2 = tokio::time::timeout(Duration::from_secs(5), second).await.unwrap().unwrap();
        assert_eq!(t2.map_err(|e| e.to_string()), Ok(2));
        // (batch 2's turn was dropped unstored: it failed.)
        let after = order.turn("s", 3).await.map(|_| ()).map_err(|e| e.code());
        assert_eq!(after, Err(tonic::Code::FailedPrecondition));
        // Another session is not held up by it.
        order.turn("t", 1).await.map_err(|e| e.to_string()).unwrap().stored();
        // Too far ahead, or again: refused at once.
        assert_eq!(
            order.turn("t", 2 + MAX_IN_FLIGHT).await.map(|_| ()).map_err(|e| e.code()),
            Err(tonic::Code::FailedPrecondition)
        );
        assert_eq!(order.turn("t", 1).await.map(|_| ()).map_err(|e| e.code()), Err(tonic::Code::FailedPrecondition));
        order.turn("t", 2).await.map_err(|e| e.to_string()).unwrap().stored();
    }

    #[tokio::test]
    async fn a_batch_whose_predecessor_fails_before_its_turn_fails() {
        let order = Arc::new(BatchOrder::default());
        let o = order.clone();
        let second = tokio::spawn(async move { o.turn("s", 2).await.map(|_| ()).map_err(|e| e.code()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        order.failed("s", 1);
        let r = tokio::time::timeout(Duration::from_secs(5), second).await.unwrap().unwrap();
        assert_eq!(r, Err(tonic::Code::FailedPrecondition));
    }

    #[tokio::test]
    async fn a_predecessor_that_never_comes_ends_the_wait() {
        let order = Arc::new(BatchOrder::default());
        let r = order.turn_within("s", 2, Duration::from_millis(50)).await.map(|_| ()).map_err(|e| e.code());
        assert_eq!(r, Err(tonic::Code::Unavailable));
    }
}
