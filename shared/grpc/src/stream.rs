//! The server's streamed answers, bounded for a client that stops reading.
//!
//! Frames are encoded as the client takes them, through a channel of two. HTTP/2 flow
//! control stops a client that does not read from receiving more, so the frame task then
//! waits on the channel, holding what it is sending (a store's batch, or a selection
//! gathered to attach external labels: up to a million series). tonic's request timeout
//! ends with the handler, not with the body, so nothing else would ever end that wait.
//! Here the whole stream lasts at most `max_request`: past it, the task ends and frees what
//! it held, and the stream ends with an error status after the frames already queued, never
//! with a clean end that would read as a complete answer. (A shorter wait per frame would
//! cut off a healthy store whose client reads slowly on purpose: a fan-out's merge reads
//! each store only as fast as the slowest one and the consumer let it.) A frame task that
//! ends without finishing (a panic) ends the stream with an error too.

use parking_lot::Mutex;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::Stream;
use tonic::Status;

/// How long a stream may wait for its client.
#[derive(Debug, Clone, Copy)]
pub struct StreamBounds {
    /// The whole stream at most this long.
    pub max_request: Duration,
}

/// The task's end of a stream.
pub struct FrameSender<T> {
    tx: mpsc::Sender<Result<T, Status>>,
    failed: Arc<Mutex<Option<Status>>>,
    bounds: StreamBounds,
    deadline: Instant,
    finished: bool,
}

/// The client's end: the frames, then the error that ended the stream, if one did.
pub struct FrameStream<T> {
    rx: mpsc::Receiver<Result<T, Status>>,
    failed: Arc<Mutex<Option<Status>>>,
    done: bool,
}

/// A bounded stream of frames: give the sender to the task that encodes them.
pub fn channel<T>(bounds: StreamBounds) -> (FrameSender<T>, FrameStream<T>) {
    let (tx, rx) = mpsc::channel(2);
    let failed = Arc::new(Mutex::new(None));
    let deadline = Instant::now() + bounds.max_request;
    let sender = FrameSender { tx, failed: failed.clone(), bounds, deadline, finished: false };
    (sender, FrameStream { rx, failed, done: false })
}

impl<T> FrameSender<T> {
    /// Sends a frame; `false` when the stream is over (the client went, or did not read
    /// in time: the stream then ends with an error).
    pub async fn send(&self, frame: T) -> bool {
        self.send_item(Ok(frame)).await
    }

    /// Ends the stream with `status` after what is queued.
    pub async fn fail(mut self, status: Status) {
        self.send_item(Err(status)).await;
        self.finished = true;
    }

    /// The stream is complete: it ends cleanly after what is queued.
    pub fn finish(mut self) {
        self.finished = true;
    }

    async fn send_item(&self, item: Result<T, Status>) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            self.end(Status::deadline_exceeded(format!("the stream took longer than {:?}", self.bounds.max_request)));
            return false;
        }
        match tokio::time::timeout_at(self.deadline, self.tx.send(item)).await {
            Ok(Ok(())) => true,
            Ok(Err(_)) => false, // the client went
            Err(_) => {
                tracing::debug!(max = ?self.bounds.max_request, "a StoreAPI client did not read its stream in time: ended");
                self.end(Status::deadline_exceeded(format!(
                    "the client did not take the stream within {:?}: ended",
                    self.bounds.max_request
                )));
                false
            }
        }
    }

    fn end(&self, status: Status) {
        let mut f = self.failed.lock();
        if f.is_none() {
            *f = Some(status);
        }
    }
}

impl<T> Drop for FrameSender<T> {
    fn drop(&mut self) {
        if !self.finished {
            self.end(Status::internal("the store's answer ended early"));
        }
    }
}

impl<T> Stream for FrameStream<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(item)) => Poll::Ready(Some(item)),
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(self.failed.lock().take().map(Err))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn a_stream_nobody_reads_ends_with_an_error_after_what_was_queued() {
        let bounds = StreamBounds { max_request: Duration::from_millis(100) };
        let (tx, mut rx) = channel::<u32>(bounds);
        let task = tokio::spawn(async move {
            let mut sent = 0;
            for i in 0..10 {
                if !tx.send(i).await {
                    break;
                }
                sent += 1;
            }
            sent
        });
        assert_eq!(task.await.unwrap(), 2, "two frames fit in the channel, then the stream ran out of time");
        assert_eq!(rx.next().await.map(|r| r.ok()), Some(Some(0)));
        assert_eq!(rx.next().await.map(|r| r.ok()), Some(Some(1)));
        assert!(matches!(rx.next().await, Some(Err(s)) if s.code() == tonic::Code::DeadlineExceeded));
        assert!(rx.next().await.is_none());
    }

    #[tokio::test]
    async fn a_task_that_ends_without_finishing_ends_the_stream_with_an_error() {
        let (tx, mut rx) = channel::<u32>(StreamBounds { max_request: Duration::from_secs(10) });
        let task = tokio::spawn(async move {
            tx.send(1).await;
            panic!("a bug in the frame task");
        });
        assert!(task.await.is_err());
        assert_eq!(rx.next().await.map(|r| r.ok()), Some(Some(1)));
        assert!(
            matches!(rx.next().await, Some(Err(s)) if s.code() == tonic::Code::Internal),
            "a truncated answer looked complete"
        );
        let (tx, mut rx) = channel::<u32>(StreamBounds { max_request: Duration::from_secs(10) });
        tx.send(1).await;
        tx.finish();
        assert_eq!(rx.next().await.map(|r| r.ok()), Some(Some(1)));
        assert!(rx.next().await.is_none(), "a finished stream ends cleanly");
    }
}
