//! The HTTP side: `POST /api/v1/write` with its bounds (the body's bytes reserved from a
//! shared budget before it is read, a processing slot taken only once it has arrived).

use crate::{CodeLabel, RemoteWrite};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use std::sync::Arc;
use std::time::Duration;

/// `POST /api/v1/write` into `rw`'s database, for a tier to merge into its router.
pub fn router(rw: Arc<RemoteWrite>) -> Router {
    let limit = rw.limits.max_body_bytes;
    Router::new().route("/api/v1/write", post(write).layer(DefaultBodyLimit::max(limit))).with_state(rw)
}

/// How long a write waits for its turn, and then for its body, before it is refused.
const WRITE_WAIT: Duration = Duration::from_secs(30);

async fn write(State(rw): State<Arc<RemoteWrite>>, req: axum::extract::Request) -> Response {
    let answer = |code: StatusCode, msg: String| {
        rw.metrics.remote_write_requests.get_or_create(&CodeLabel { code: code.as_u16().to_string() }).inc();
        (code, msg).into_response()
    };
    if let Err(why) = crate::protocol(req.headers()) {
        return answer(StatusCode::UNSUPPORTED_MEDIA_TYPE, why + "\n");
    }
    // The body's bytes are reserved before it is read (its declared length, or the limit
    // when it declares none), from a budget shared by every upload: slow uploads hold only
    // their bytes, never the processing slots, and all of them together stay bounded.
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .unwrap_or(rw.limits.max_body_bytes);
    if declared > rw.limits.max_body_bytes {
        return answer(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body of {declared} bytes is over the limit of {} bytes\n", rw.limits.max_body_bytes),
        );
    }
    let reserve = u32::try_from(declared.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
    let Ok(_bytes) = rw.upload_kib.clone().try_acquire_many_owned(reserve) else {
        let msg = format!(
            "too many remote-write bytes in flight (limit {} MiB): retry later\n",
            rw.limits.max_buffered_bytes >> 20
        );
        return answer(StatusCode::SERVICE_UNAVAILABLE, msg);
    };
    let body =
        match tokio::time::timeout(WRITE_WAIT, axum::body::to_bytes(req.into_body(), rw.limits.max_body_bytes)).await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                let msg = format!("reading the body (limit {} bytes): {e}\n", rw.limits.max_body_bytes);
                return answer(StatusCode::PAYLOAD_TOO_LARGE, msg);
            }
            Err(_) => return answer(StatusCode::REQUEST_TIMEOUT, "the body did not arrive in time\n".into()),
        };
    let Ok(Ok(_slot)) = tokio::time::timeout(WRITE_WAIT, rw.slots.clone().acquire_owned()).await else {
        let msg = format!("too many remote writes at once (limit {}): retry later\n", rw.limits.max_concurrent);
        return answer(StatusCode::SERVICE_UNAVAILABLE, msg);
    };
    let out = tokio::task::spawn_blocking(move || {
        let mut out = crate::handle(&rw.db, &rw.metrics, &body, &rw.limits);
        if let (Some(f), Some((lo, hi))) = (&rw.on_stored, out.span) {
            if let Err(e) = f("remote-write", lo, hi) {
                out.status = 503;
                out.message = format!("recording what was stored: {e}: send it again");
            }
        }
        out
    })
    .await;
    match out {
        Ok(o) => {
            let code = StatusCode::from_u16(o.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            if o.message.is_empty() {
                code.into_response()
            } else {
                (code, o.message + "\n").into_response()
            }
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("remote write failed: {e}\n")).into_response(),
    }
}
