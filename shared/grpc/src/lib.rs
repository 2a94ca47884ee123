//! The StoreAPI over gRPC (`proto/strata/store.proto`), the only way tiers read one
//! another's data.
//!
//! * [`StoreService`] exposes any [`Store`](strata_store::Store) as the gRPC `Store`
//!   service. It advertises the tier's external labels in `Info` and attaches them to every
//!   series it returns (as a Thanos sidecar does), answers matchers on them itself, and
//!   streams series in frames bounded in series and bytes. Chunks go out as stored.
//! * [`RemoteStore`] is a `Store` over a gRPC client: the engine, the HTTP API and the
//!   fan-out read a remote tier exactly as they read the local head. It checks what it
//!   receives (labels, chunk headers, sizes) and charges it to the select's budget frame by
//!   frame, so a hostile or broken peer produces an error, not a panic or an unbounded
//!   allocation.
//!
//! Both sides use gzip, cap message sizes ([`MAX_MESSAGE_BYTES`]) and carry deadlines;
//! errors travel as gRPC status codes with a message (see [`status_from_store_error`]).

mod client;
mod convert;
mod frames;
mod listener;
mod server;
mod steps;
mod stream;
#[cfg(test)]
mod tests;
mod tls;

pub use client::{RemoteStore, RemoteStoreOptions};
pub use convert::{
    chunk_from_pb, chunk_to_pb, labels_from_pb, labels_to_pb, metadata_from_pb, metadata_to_pb,
    status_from_store_error, store_error_from_status, StringPool, MAX_LABELS, MAX_LABEL_BYTES,
};
pub use listener::{CallGuard, ConnectionLimits, Connections};
pub use server::{attach_external, selection_wire_bytes, serve, serve_with, ServeOptions, StoreInfo, StoreService};
pub use strata_proto::store as pb;
pub use stream::StreamBounds;
pub use tls::{ClientTlsFiles, ServerTlsFiles};
pub use tonic::transport::{ClientTlsConfig, ServerTlsConfig};

/// The largest message either side sends or accepts. A frame is cut well below it
/// ([`FRAME_BYTES`]); this bounds what a hostile peer can make the other allocate.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// HTTP/2 flow-control window per stream (the connection's is twice it).
pub const WINDOW_BYTES: u32 = 8 << 20;

/// The largest HTTP/2 frame either side accepts (the protocol's default is 16 KiB): a
/// selection of megabytes then crosses in a few frames, not hundreds.
pub const H2_FRAME_BYTES: u32 = 1 << 20;

/// A `Series` frame is sent once it holds this many bytes of chunks and labels (small
/// enough that the client decodes one frame while the server encodes the next)...
pub const FRAME_BYTES: usize = 256 << 10;
/// ... or this many series.
pub const FRAME_SERIES: usize = 1000;

#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error("store {store}: invalid address: {reason}")]
    Address { store: String, reason: String },
    #[error("gRPC server on {addr}: {source}")]
    Serve { addr: std::net::SocketAddr, source: tonic::transport::Error },
    #[error("TLS file {file}: {reason}")]
    Tls { file: std::path::PathBuf, reason: String },
    #[error("TLS: {0}")]
    TlsConfig(String),
}
