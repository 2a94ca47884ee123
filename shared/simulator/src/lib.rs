//! `strata simulate`: a stand-in for NVIDIA's dcgm-exporter, serving one page per simulated
//! node at `/node/<i>/metrics`. Pages follow dcgm-exporter's format with its quirks (label
//! order, fixed decimals, sentinels for unsupported fields, separators and metadata order
//! that differ by release) so that the edge is tested against what it will really ingest.

pub mod fields;
pub mod fleet;
pub mod server;

pub use fleet::Fleet;

/// Serves the fleet on `listener` until `shutdown` completes. `clock_offset_ms` shifts the
/// simulated clock from wall time (tests use it to start at a chosen instant); `web`
/// makes it an https target that demands credentials, like dcgm-exporter behind an auth
/// proxy.
pub async fn serve(
    listener: tokio::net::TcpListener,
    fleet: Fleet,
    clock_offset_ms: i64,
    web: std::sync::Arc<strata_server::LiveWebConfig>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), SimulatorError> {
    let state = std::sync::Arc::new(server::SimState { fleet, clock_offset_ms });
    strata_server::serve(listener, server::router(state), Default::default(), web, shutdown)
        .await
        .map_err(SimulatorError::Serve)
}

#[derive(Debug, thiserror::Error)]
pub enum SimulatorError {
    #[error("serving simulated pages: {0}")]
    Serve(#[source] std::io::Error),
}
