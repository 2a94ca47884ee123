//! `strata simulate`: a stand-in for NVIDIA's dcgm-exporter, serving one page per simulated
//! node at `/node/<i>/metrics`. Pages follow dcgm-exporter's format with its quirks (label
//! order, fixed decimals, sentinels for unsupported fields, separators and metadata order
//! that differ by release) so that the edge is tested against what it will really ingest.

pub mod fields;
pub mod fleet;
pub mod server;

pub use fleet::Fleet;

/// Serves the fleet on `listener` until the future is dropped.
pub async fn serve(listener: tokio::net::TcpListener, fleet: Fleet) -> anyhow::Result<()> {
    axum::serve(listener, server::router(std::sync::Arc::new(fleet))).await?;
    Ok(())
}
