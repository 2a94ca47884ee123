//! A session's numbered batches stored in the order the sender numbered them.
//!
//! A sender that waits for each acknowledgement before it pushes the next batch leaves
//! both sides idle in turn: the regional while the edge encodes and compresses, the edge
//! while the regional stores and syncs. So a sender may push batch k+1 before batch k is
//! acknowledged (`PushRequest.seq`, up to [`MAX_IN_FLIGHT`] ahead). The receiver checks and
//! decodes both at once, but stores k+1 only after k: k+1 may name series by the numbers k
//! gave them, and its samples follow k's.
//!
//! A batch is admitted ([`BatchOrder::admit`]) before it is decoded: one that runs further
//! ahead than the sender was told it may, that repeats a number already taken, or that
//! follows a failed batch is refused at once, and at most [`MAX_WAITING`] batches wait
//! over all sessions. It then waits for its turn without holding a thread, for at most
//! [`TURN_WAIT`]. A refused batch ends its sender's session, which starts again from its
//! persisted cursor (which only ever moves past acknowledged batches).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tonic::Status;

/// Batches of one session the receiver takes in flight at once (said in `Hello`).
pub const MAX_IN_FLIGHT: u64 = 4;

/// The longest a batch waits for its predecessor to be stored. A predecessor that never
/// comes (its sender gave up on it) ends the session this long after.
pub(crate) const TURN_WAIT: Duration = Duration::from_secs(30);

/// Sessions followed at once. Past that, one with no batch in flight is forgotten (a batch
/// of it then finds its predecessors unknown and its sender starts a new session); when
/// every one has batches in flight, a new session's batch is refused.
const MAX_SESSIONS: usize = 256;

/// Batches admitted behind another of their session (that will wait for it), over all
/// sessions: each holds its decoded samples while it waits.
pub(crate) const MAX_WAITING: usize = 128;

/// Sessions forgotten to make room, remembered by name so that a batch of one is refused
/// at once rather than left waiting for predecessors that were stored before.
const MAX_FORGOTTEN: usize = 1024;

#[derive(Default)]
pub(crate) struct BatchOrder {
    sessions: parking_lot::Mutex<Sessions>,
}

#[derive(Default)]
struct Sessions {
    by_name: HashMap<String, Turns>,
    /// Batches admitted behind another and not released, over all sessions.
    waiting: usize,
    /// Sessions forgotten, oldest first.
    forgotten: std::collections::VecDeque<String>,
}

struct Turns {
    /// The last batch stored.
    stored: u64,
    /// The first batch that failed: it and every later one fail.
    failed_from: Option<u64>,
    /// Batches admitted and not released yet.
    admitted: BTreeSet<u64>,
    used: Instant,
    /// Woken when a batch of the session is stored or fails.
    changed: Arc<Notify>,
}

impl Turns {
    fn new() -> Turns {
        Turns {
            stored: 0,
            failed_from: None,
            admitted: BTreeSet::new(),
            used: Instant::now(),
            changed: Arc::new(Notify::new()),
        }
    }

    fn fails(&self, seq: u64) -> bool {
        self.failed_from.is_some_and(|f| seq >= f)
    }
}

impl BatchOrder {
    /// Admits batch `seq` of `session`, before it is decoded: refused when it cannot be
    /// stored (see the module's documentation). Dropped without [`Admitted::turn`], the
    /// batch failed, and so do the session's later ones.
    pub fn admit(self: &Arc<Self>, session: &str, seq: u64) -> Result<Admitted, Status> {
        let refuse = |why: String| {
            Err(Status::failed_precondition(format!("batch {seq} of session {session:?}: {why}: start a new session")))
        };
        let mut all = self.sessions.lock();
        let (stored, failed) = match all.by_name.get(session) {
            Some(t) => {
                if t.admitted.contains(&seq) {
                    return refuse("its number was taken already".into());
                }
                (t.stored, t.fails(seq))
            }
            None if all.forgotten.iter().any(|f| f == session) => {
                return refuse("the session was forgotten to make room for others".into())
            }
            None => (0, false),
        };
        if failed {
            return refuse("a batch before it failed".into());
        }
        if seq <= stored {
            return refuse("its number was taken already".into());
        }
        if seq - stored > MAX_IN_FLIGHT {
            return refuse(format!(
                "{} batches ahead of the last stored ({stored}), at most {MAX_IN_FLIGHT}",
                seq - stored
            ));
        }
        // Only a batch behind another of its session waits (and holds its samples).
        let waits = seq > stored + 1;
        if waits && all.waiting >= MAX_WAITING {
            return Err(Status::unavailable(format!(
                "{MAX_WAITING} batches are waiting for the batches before them: send this one again later"
            )));
        }
        if !all.by_name.contains_key(session) && all.by_name.len() >= MAX_SESSIONS {
            let idle = all.by_name.iter().filter(|(_, t)| t.admitted.is_empty()).min_by_key(|(_, t)| t.used);
            let Some(oldest) = idle.map(|(k, _)| k.clone()) else {
                return Err(Status::unavailable(format!(
                    "{MAX_SESSIONS} sessions have batches in flight: send this one again later"
                )));
            };
            all.by_name.remove(&oldest);
            if all.forgotten.len() >= MAX_FORGOTTEN {
                all.forgotten.pop_front();
            }
            all.forgotten.push_back(oldest);
        }
        let t = all.by_name.entry(session.to_string()).or_insert_with(Turns::new);
        t.used = Instant::now();
        t.admitted.insert(seq);
        let changed = t.changed.clone();
        if waits {
            all.waiting += 1;
        }
        Ok(Admitted { order: self.clone(), session: session.to_string(), seq, changed, waits, done: None })
    }

    /// Ends batch `seq`'s admission: stored, or failed (with every later one).
    fn release(&self, session: &str, seq: u64, waited: bool, stored: bool) {
        let mut all = self.sessions.lock();
        if waited {
            all.waiting = all.waiting.saturating_sub(1);
        }
        if let Some(t) = all.by_name.get_mut(session) {
            t.admitted.remove(&seq);
            if stored {
                t.stored = t.stored.max(seq);
            } else {
                t.failed_from = Some(t.failed_from.map_or(seq, |f| f.min(seq)));
            }
            t.changed.notify_waiters();
        }
    }

    /// Whether batch `seq` goes now (`Some(true)`), waits (`Some(false)`), or fails (`None`:
    /// a batch before it failed, or the session was forgotten).
    fn ready(&self, session: &str, seq: u64) -> Option<bool> {
        let all = self.sessions.lock();
        let t = all.by_name.get(session)?;
        if t.fails(seq) || !t.admitted.contains(&seq) {
            return None;
        }
        Some(seq == t.stored + 1)
    }
}

/// A batch admitted: it waits for its [`turn`](Admitted::turn), then is stored or fails.
pub(crate) struct Admitted {
    order: Arc<BatchOrder>,
    session: String,
    seq: u64,
    changed: Arc<Notify>,
    /// It was admitted behind another batch of its session (counted as waiting).
    waits: bool,
    /// Set once the outcome is recorded.
    done: Option<bool>,
}

impl Admitted {
    /// Waits until every batch before this one is stored.
    pub async fn turn(self) -> Result<Turn, Status> {
        self.turn_within(TURN_WAIT).await
    }

    async fn turn_within(self, wait: Duration) -> Result<Turn, Status> {
        let deadline = tokio::time::Instant::now() + wait;
        let notify = self.changed.clone();
        loop {
            // Registered before the state is read, so a change in between is not missed.
            let changed = notify.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.order.ready(&self.session, self.seq) {
                Some(true) => return Ok(Turn(self)),
                Some(false) => {}
                None => {
                    return Err(Status::failed_precondition(format!(
                        "batch {} of session {:?}: a batch before it failed: start a new session",
                        self.seq, self.session
                    )))
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(Status::unavailable(format!(
                    "batch {} of session {:?} waited {wait:?} for the batch before it: start a new session",
                    self.seq, self.session
                )));
            }
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.order.release(&self.session, self.seq, self.waits, self.done == Some(true));
    }
}

/// A batch's turn to be stored. Dropped without [`stored`](Turn::stored), the batch
/// failed, and so do the session's later ones.
pub(crate) struct Turn(Admitted);

impl Turn {
    pub fn stored(mut self) {
        self.0.done = Some(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code<T>(r: Result<T, Status>) -> Result<(), tonic::Code> {
        r.map(|_| ()).map_err(|e| e.code())
    }

    #[tokio::test]
    async fn batches_go_in_order_and_a_failure_fails_the_rest() {
        let order = Arc::new(BatchOrder::default());
        // Batch 2 waits for batch 1.
        let second = order.admit("s", 2).unwrap();
        let waiting = tokio::spawn(async move { second.turn().await.map(|t| t.0.seq) });
        let first = order.admit("s", 1).unwrap().turn().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "batch 2 went before batch 1 was stored");
        first.stored();
        let t2 = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
        assert_eq!(t2.map_err(|e| e.to_string()), Ok(2));
        // (batch 2's turn was dropped unstored: it failed, and so does what follows.)
        assert_eq!(code(order.admit("s", 3)), Err(tonic::Code::FailedPrecondition));
        // Another session is not held up by it.
        order.admit("t", 1).unwrap().turn().await.unwrap().stored();
        // Too far ahead, or a number taken already: refused at once.
        assert_eq!(code(order.admit("t", 2 + MAX_IN_FLIGHT)), Err(tonic::Code::FailedPrecondition));
        assert_eq!(code(order.admit("t", 1)), Err(tonic::Code::FailedPrecondition));
        let held = order.admit("t", 3).unwrap();
        assert_eq!(code(order.admit("t", 3)), Err(tonic::Code::FailedPrecondition), "batch 3 admitted twice");
        drop(held);
    }

    /// A later batch that fails (say, refused while being decoded) fails those after it,
    /// never one before it: that one is stored, and the sender moves past it.
    #[tokio::test]
    async fn a_failed_batch_fails_only_the_batches_after_it() {
        let order = Arc::new(BatchOrder::default());
        let first = order.admit("s", 1).unwrap();
        let second = order.admit("s", 2).unwrap();
        let third = order.admit("s", 3).unwrap();
        let waiting = tokio::spawn(async move { code(third.turn().await) });
        drop(second);
        let r = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
        assert_eq!(r, Err(tonic::Code::FailedPrecondition), "batch 3 waited for a batch that failed");
        first.turn().await.unwrap().stored();
        assert_eq!(code(order.admit("s", 2)), Err(tonic::Code::FailedPrecondition));
    }

    #[tokio::test]
    async fn a_predecessor_that_never_comes_ends_the_wait() {
        let order = Arc::new(BatchOrder::default());
        let r = order.admit("s", 2).unwrap().turn_within(Duration::from_millis(50)).await;
        assert_eq!(code(r), Err(tonic::Code::Unavailable));
        // What waits is bounded over all sessions, and released when done; a batch next in
        // its session's order never waits, and is not counted.
        let held: Vec<_> = (0..MAX_WAITING).map(|i| order.admit(&format!("w{i}"), 2).unwrap()).collect();
        assert_eq!(code(order.admit("one-more", 2)), Err(tonic::Code::Unavailable));
        order.admit("one-more", 1).unwrap().turn().await.unwrap().stored();
        drop(held);
        order.admit("one-more", 2).unwrap().turn().await.unwrap().stored();
    }

    /// A session with a batch in flight is never forgotten to make room for another.
    #[tokio::test]
    async fn a_session_with_a_batch_in_flight_is_kept() {
        let order = Arc::new(BatchOrder::default());
        let held = order.admit("busy", 1).unwrap();
        for i in 0..MAX_SESSIONS {
            order.admit(&format!("idle{i}"), 1).unwrap().turn().await.unwrap().stored();
        }
        // Room was made by forgetting idle sessions, not the busy one.
        held.turn().await.unwrap().stored();
        order.admit("busy", 2).unwrap().turn().await.unwrap().stored();
        // A forgotten session's next batch is refused at once, not left waiting for
        // predecessors stored before it was forgotten.
        let r = tokio::time::timeout(Duration::from_secs(5), async { code(order.admit("idle0", 2)) }).await;
        assert_eq!(r, Ok(Err(tonic::Code::FailedPrecondition)));
        // A refused batch makes no entry: a name that is never admitted forgets nobody.
        for i in 0..2 * MAX_SESSIONS {
            assert!(order.admit(&format!("junk{i}"), 1 + MAX_IN_FLIGHT + 1).is_err());
        }
        order.admit("busy", 3).unwrap().turn().await.unwrap().stored();
    }
}
