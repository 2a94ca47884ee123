//! The global's self-metrics, served at `/metrics`: its HTTP requests by handler and
//! status with their latency (the queries' fan-out time included), and each store's health
//! as of its last Info call.

use crate::stores::StoreSet;
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub handler: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandlerLabel {
    pub handler: String,
}

pub struct GlobalMetrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<HandlerLabel, Histogram>,
}

impl GlobalMetrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("strata_global");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("http_requests", "HTTP requests by handler and status code", requests.clone());
        let durations = Family::<HandlerLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 4.0, 10))
        });
        registry.register(
            "http_request_duration_seconds",
            "Time to answer an HTTP request, by handler (a query's includes its fan-out to the stores)",
            durations.clone(),
        );
        // The query endpoints are listed from the start, so a dashboard sees them at 0.
        for handler in ["/api/v1/query", "/api/v1/query_range"] {
            let _ = requests.get_or_create(&RequestLabels { handler: handler.into(), code: "200".into() });
        }
        Arc::new(GlobalMetrics { registry, requests, durations })
    }

    /// The text exposition: the registry, each store's health, then `extra` (the rules'
    /// metrics and their database's, when the global runs rules).
    pub fn encode(&self, stores: &StoreSet, extra: &[Registry]) -> String {
        let mut s = String::new();
        if prometheus_client::encoding::text::encode_registry(&mut s, &self.registry).is_err() {
            s.push_str("# encoding self-metrics failed\n");
        }
        let status = stores.status();
        s.push_str("# HELP strata_global_store_up Whether the store answered its last Info call.\n");
        s.push_str("# TYPE strata_global_store_up gauge\n");
        for st in &status {
            s.push_str(&format!("strata_global_store_up{{store=\"{}\"}} {}\n", escape(&st.address), st.healthy as u8));
        }
        s.push_str("# HELP strata_global_stores Stores known, by discovery and configuration.\n");
        s.push_str("# TYPE strata_global_stores gauge\n");
        s.push_str(&format!("strata_global_stores {}\n", status.len()));
        for r in extra {
            if prometheus_client::encoding::text::encode_registry(&mut s, r).is_err() {
                s.push_str("# encoding the rules' metrics failed\n");
            }
        }
        s.push_str("# EOF\n");
        s
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Middleware: counts and times every request under its route's pattern.
pub async fn track(metrics: Arc<GlobalMetrics>, req: Request, next: Next) -> Response {
    let handler = req.extensions().get::<MatchedPath>().map_or_else(|| "other".to_string(), |p| p.as_str().to_string());
    let began = Instant::now();
    let resp = next.run(req).await;
    let code = resp.status().as_u16().to_string();
    metrics.requests.get_or_create(&RequestLabels { handler: handler.clone(), code }).inc();
    metrics.durations.get_or_create(&HandlerLabel { handler }).observe(began.elapsed().as_secs_f64());
    resp
}
