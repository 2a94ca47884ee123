//! HTTP server for the simulated pages: `/node/<i>/metrics`, gzip when asked for.

use crate::fleet::Fleet;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::io::Write;
use std::sync::Arc;
use strata_model::time::now_ms;

/// The fleet and the offset of its clock from wall time (0: pages show the present).
pub struct SimState {
    pub fleet: Fleet,
    pub clock_offset_ms: i64,
}

pub fn router(state: Arc<SimState>) -> Router {
    Router::new().route("/node/{i}/metrics", get(node_page)).route("/", get(index)).with_state(state)
}

async fn index(State(st): State<Arc<SimState>>) -> String {
    let f = &st.fleet;
    let mut s = format!("strata simulate: {} nodes x {} GPUs (seed {})\n", f.nodes, f.gpus_per_node, f.seed);
    for i in 0..f.nodes {
        s.push_str(&format!("/node/{i}/metrics\n"));
    }
    s
}

async fn node_page(State(st): State<Arc<SimState>>, Path(i): Path<String>, headers: HeaderMap) -> Response {
    let f = &st.fleet;
    let Some(page) = i.parse::<usize>().ok().and_then(|i| f.render_node(i, now_ms() + st.clock_offset_ms)) else {
        return (StatusCode::NOT_FOUND, format!("no node {i:?}: nodes are 0..{}\n", f.nodes)).into_response();
    };
    let ct = (header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
    let gzip = headers.get(header::ACCEPT_ENCODING).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("gzip"));
    if gzip {
        let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(page.len() / 4), flate2::Compression::fast());
        if enc.write_all(page.as_bytes()).is_ok() {
            if let Ok(body) = enc.finish() {
                return ([ct, (header::CONTENT_ENCODING, "gzip")], body).into_response();
            }
        }
    }
    ([ct], page).into_response()
}
