//! The StoreAPI's connections, bounded as the HTTP server's are: at most
//! [`ConnectionLimits::max_connections`] at once (the rest wait in the kernel's backlog,
//! holding none of our memory or file descriptors), and a connection that sends nothing
//! within [`ConnectionLimits::first_byte_timeout`] is closed. Idle or slow peers therefore
//! cannot keep the slots, and a flood of connections cannot use up the process' file
//! descriptors, which the edge needs for its WAL and its scrapes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
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
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits { max_connections: 256, first_byte_timeout: Duration::from_secs(10) }
    }
}

/// Connections from `listener` as they are accepted within the limits, until the
/// receiving side is dropped.
pub(crate) fn accept(
    listener: TcpListener,
    limits: ConnectionLimits,
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
            if tx.send(Ok(Bounded { stream, _slot: permit, deadline })).await.is_err() {
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
