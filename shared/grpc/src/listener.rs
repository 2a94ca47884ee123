//! The StoreAPI's connections, bounded as the HTTP server's are: at most
//! [`ConnectionLimits::max_connections`] at once (the rest wait in the kernel's backlog,
//! holding none of our memory or file descriptors), a connection that sends nothing
//! within [`ConnectionLimits::first_byte_timeout`] is closed, and so is one with no call
//! open for [`ConnectionLimits::idle_timeout`]: HTTP/2 pings keep a connection alive for
//! the protocol, not its slot. (Connection age is bounded by the server, see `serve`.)
//! Idle or slow peers therefore cannot keep the slots, and a flood of connections cannot
//! use up the process' file descriptors, which the edge needs for its WAL and its scrapes.
//!
//! Which connection a call belongs to is known by its peer address: [`Connections`] keeps
//! each open connection's count of open calls, which the service raises and lowers with a
//! [`CallGuard`] held for as long as the call's answer streams.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    /// From accepting a connection to its first byte (the HTTP/2 preface or a TLS hello).
    pub first_byte_timeout: Duration,
    /// A connection with no call open for this long is closed (pings do not count).
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 256,
            first_byte_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// One connection's open calls, and when its last call ended.
#[derive(Debug)]
pub(crate) struct Activity {
    calls: AtomicUsize,
    since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Self {
        Activity { calls: AtomicUsize::new(0), since: Mutex::new(Instant::now()) }
    }

    /// How long the connection has had no call open (`None`: one is open).
    fn idle_for(&self) -> Option<Duration> {
        (self.calls.load(Ordering::Acquire) == 0).then(|| self.since.lock().elapsed())
    }
}

/// The open connections by peer address.
#[derive(Debug, Default)]
pub struct Connections(Mutex<HashMap<SocketAddr, Arc<Activity>>>);

/// A call in progress on its connection; dropping it ends the call.
#[derive(Debug)]
pub struct CallGuard(Arc<Activity>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        *self.0.since.lock() = Instant::now();
        self.0.calls.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Connections {
    fn open(&self, peer: SocketAddr) -> Arc<Activity> {
        let a = Arc::new(Activity::new());
        self.0.lock().insert(peer, a.clone());
        a
    }

    /// Forgets a closed connection; only its own entry (a new connection from the same
    /// address may have taken the slot already).
    fn close(&self, peer: SocketAddr, activity: &Arc<Activity>) {
        let mut m = self.0.lock();
        if m.get(&peer).is_some_and(|a| Arc::ptr_eq(a, activity)) {
            m.remove(&peer);
        }
    }

    /// Marks a call open on the connection from `peer` (unknown peers: nothing to mark).
    pub fn call(&self, peer: Option<SocketAddr>) -> Option<CallGuard> {
        let a = self.0.lock().get(&peer?)?.clone();
        a.calls.fetch_add(1, Ordering::AcqRel);
        Some(CallGuard(a))
    }
}

/// Connections from `listener` as they are accepted within the limits, until the
/// receiving side is dropped.
pub(crate) fn accept(
    listener: TcpListener,
    limits: ConnectionLimits,
    connections: Arc<Connections>,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<Bounded>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
                _ = tx.closed() => return,
            };
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = tx.closed() => return,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: not fatal.
                    tracing::warn!(error = %e, "StoreAPI accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let deadline = Some(Box::pin(tokio::time::sleep(limits.first_byte_timeout)));
            let peer = stream.peer_addr().ok();
            let activity = peer.map(|p| (p, connections.open(p), connections.clone()));
            let idle = Box::pin(tokio::time::sleep(limits.idle_timeout));
            let bounded =
                Bounded { stream, _slot: permit, deadline, idle, idle_timeout: limits.idle_timeout, activity };
            if tx.send(Ok(bounded)).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// An accepted connection holding its slot until it closes.
pub(crate) struct Bounded {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    /// Until the first byte arrives.
    deadline: Option<Pin<Box<Sleep>>>,
    /// When to look again whether the connection has been idle for `idle_timeout`.
    idle: Pin<Box<Sleep>>,
    idle_timeout: Duration,
    /// Its peer, its calls, and the registry to leave when it closes.
    activity: Option<(SocketAddr, Arc<Activity>, Arc<Connections>)>,
}

impl Drop for Bounded {
    fn drop(&mut self) {
        if let Some((peer, activity, connections)) = &self.activity {
            connections.close(*peer, activity);
        }
    }
}

impl Bounded {
    /// Whether the connection has had no call open for the idle timeout; re-arms the timer
    /// for the next look otherwise.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.idle.as_mut().poll(cx).is_pending() {
                return false;
            }
            let Some((_, activity, _)) = &self.activity else { return false };
            let wait = match activity.idle_for() {
                Some(idle) if idle >= self.idle_timeout => return true,
                Some(idle) => self.idle_timeout - idle,
                None => self.idle_timeout,
            };
            self.idle.as_mut().reset(tokio::time::Instant::now() + wait);
        }
    }
}

impl Connected for Bounded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Bounded {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        if let Some(deadline) = self.deadline.as_mut() {
            match &read {
                Poll::Ready(Ok(())) if buf.filled().len() > before => self.deadline = None,
                Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "no request in time")));
                }
                _ => {}
            }
        }
        if read.is_pending() && self.idle_expired(cx) {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "no call open: idle connection closed")));
        }
        read
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
