//! The HTTP server every tier runs, bounded against slow and greedy clients: at most
//! `max_connections` connections are accepted at once (the rest wait in the kernel's
//! backlog, holding none of our memory); a connection that does not deliver a request's
//! headers within `header_read_timeout` (a slowloris, or a keep-alive connection left idle)
//! is closed; and every request must finish within `request_timeout`, body reads included,
//! or it is answered 503 and its work dropped. Body sizes are capped per route by the
//! routes themselves (`DefaultBodyLimit`). A [`WebConfig`] adds TLS (the handshake is
//! bounded by the header timeout too) and basic auth on every route.

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::live::LiveWebConfig;

#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub request_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 512,
            header_read_timeout: Duration::from_secs(10),
            // Above the query timeout (2 minutes), so a query ends with its own error.
            request_timeout: Duration::from_secs(150),
        }
    }
}

/// Serves `app` on `listener` until `shutdown` completes; then stops accepting, lets the
/// open connections finish their requests (at most `request_timeout`) and returns.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    web: Arc<LiveWebConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let timeout = limits.request_timeout;
    let app = app.layer(axum::middleware::from_fn(move |req: Request, next: Next| within(timeout, req, next)));
    // The users in force when each request comes (the web config may be reloaded).
    let live = web.clone();
    let app = app.layer(axum::middleware::from_fn(move |req: Request, next: Next| {
        let auth = live.current().auth.clone();
        async move {
            match auth {
                Some(auth) => crate::web_config::require_basic_auth(auth, req, next).await,
                None => next.run(req).await,
            }
        }
    }));
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let app = app.clone();
        let stop = stop_rx.clone();
        let tls = web.current().tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                None => connection(stream, app, limits, stop, peer).await,
                Some(acceptor) => match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await
                {
                    Ok(Ok(tls_stream)) => connection(tls_stream, app, limits, stop, peer).await,
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                },
            }
        });
    }
    let _ = stop_tx.send(true);
    // Every connection holds a permit until it ends: having them all back means all ended.
    let all = u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(limits.request_timeout, slots.acquire_many(all)).await;
    Ok(())
}

/// Serves one connection's requests until it closes or the server stops.
async fn connection<S>(stream: S, app: Router, limits: ServerLimits, mut stop: watch::Receiver<bool>, peer: SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
    }
}

async fn within(timeout: Duration, req: Request, next: Next) -> Response {
    match tokio::time::timeout(timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("request did not complete within {timeout:?}\n")).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn start(limits: ServerLimits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let app = Router::new().route("/", get(|| async { "ok" })).route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(serve(listener, app, limits, LiveWebConfig::fixed(Default::default()), async move {
            let _ = rx.await;
        }));
        (addr, tx)
    }

    /// Sends `req` and reads until the server closes or answers; returns what came back.
    async fn exchange(addr: std::net::SocketAddr, req: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(req).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await.unwrap().unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn idle_and_slow_header_connections_are_closed() {
        let limits = ServerLimits { header_read_timeout: Duration::from_millis(300), ..Default::default() };
        let (addr, _stop) = start(limits).await;
        for partial in [&b""[..], b"GET / HTTP/1.1\r\nHost: x\r\n"] {
            let began = Instant::now();
            let got = exchange(addr, partial).await;
            assert!(!got.contains("200 OK"), "{got}");
            assert!(began.elapsed() < Duration::from_secs(3), "held for {:?}", began.elapsed());
        }
        assert!(exchange(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.contains("200 OK"));
    }

    #[tokio::test]
    async fn connections_past_the_cap_wait_for_a_free_one() {
        let limits =
            ServerLimits { max_connections: 2, header_read_timeout: Duration::from_secs(2), ..Default::default() };
        let (addr, _stop) = start(limits).await;
        let _idle: Vec<TcpStream> =
            vec![TcpStream::connect(addr).await.unwrap(), TcpStream::connect(addr).await.unwrap()];
        tokio::time::sleep(Duration::from_millis(100)).await;
        let began = Instant::now();
        let got = exchange(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(got.contains("200 OK"), "{got}");
        // Served only once the idle connections timed out and freed their slots.
        assert!(began.elapsed() >= Duration::from_millis(1500), "served after {:?}", began.elapsed());
    }

    #[tokio::test]
    async fn a_request_past_its_timeout_is_answered_503() {
        let limits = ServerLimits { request_timeout: Duration::from_millis(300), ..Default::default() };
        let (addr, _stop) = start(limits).await;
        let began = Instant::now();
        let got = exchange(addr, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(got.starts_with("HTTP/1.1 503"), "{got}");
        assert!(began.elapsed() < Duration::from_secs(3));
    }
}
