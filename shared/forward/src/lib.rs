//! Forwarding (`proto/strata/forward.proto`): an edge streams what it stores to one or more
//! upstream regionals, and nothing is lost across outages and restarts of either side.
//!
//! The edge does not keep a queue of its own: its WAL already holds every sample it
//! stored, in the order it stored them, so a [`Forwarder`] reads the WAL at a [`Cursor`]
//! and sends what follows in batches. A regional ([`ForwardReceiver`]) answers a batch only
//! once it is in its own WAL and `fsync`ed; only then does the edge persist the cursor
//! after it ([`CursorFile`]), so a crash of either side at any moment resends at most the
//! batches not yet acknowledged. Resending is harmless: an identical sample is ignored,
//! and a different value at a stored timestamp is a conflict the receiver counts and logs,
//! keeping the stored one. While an upstream is behind, the WAL segments it still needs
//! are held ([`WalHolds`]) until the head checkpoint covers them; then what they hold for
//! it becomes a [`Backlog`] read from blocks (three times smaller than the WAL), and the
//! segments go as they would without forwarding.
//!
//! A regional's storage identity ([`StorageId`]) is created with its data directory. The
//! edge learns it in `Hello`, keeps it with the cursor and sends it with every batch: a
//! regional that comes back with another (its disk replaced) refuses batches meant for the
//! old one, and the edge starts again from the oldest data its WAL holds.

mod backlog;
mod conversion;
mod cursor;
mod holds;
mod metrics;
mod order;
mod receiver;
mod sender;
mod senders;
mod source;
#[cfg(test)]
mod tests;
mod upstream;
mod watermarks;

pub use backlog::{Backlog, BacklogEntry};
pub use cursor::{Cursor, CursorFile, ReplayAt};
pub use holds::WalHolds;
pub use metrics::{ForwardMetrics, ForwarderStats, UpstreamLabel};
pub use receiver::{samples_of, Arrivals, ForwardReceiver, ReceiverStats, ResultLabel, StorageId};
pub use sender::{Forwarder, ForwarderOptions};
pub use senders::Senders;
pub use strata_proto::forward as pb;
pub use upstream::{
    BatchCompression, Greeting, GrpcSession, GrpcUpstream, PushAck, PushError, Upstream, UpstreamSession,
};
pub use watermarks::Watermarks;

/// The maps on the forwarding paths, keyed by labels and references from the edge's own
/// storage: hashed without SipHash's cost.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The most samples one batch may carry; the receiver refuses more. About 17 bytes a
/// sample on the wire keeps a batch well under the gRPC message limit.
pub const MAX_BATCH_SAMPLES: usize = 200_000;

/// The most samples a batch's open chunks may declare (`ForwardSeries.open_chunk`): most
/// of them the receiver holds already and does not decode.
pub const MAX_BATCH_OPEN_SAMPLES: usize = 4 * MAX_BATCH_SAMPLES;

/// The most series one batch may carry.
pub const MAX_BATCH_SERIES: usize = 50_000;

/// The most metadata entries one batch may carry.
pub const MAX_BATCH_METADATA: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("forward cursor {file}: {source}")]
    Cursor { file: std::path::PathBuf, source: std::io::Error },
    #[error("storage identity {file}: {reason}")]
    StorageId { file: std::path::PathBuf, reason: String },
    #[error("upstream {upstream}: {reason}")]
    Upstream { upstream: String, reason: String },
    #[error("reading the backlog for upstream {upstream} from storage: {reason}")]
    Backlog { upstream: String, reason: String },
    #[error("reading the WAL for upstream {upstream}: {source}")]
    Wal { upstream: String, source: strata_tsdb::wal::WalError },
}
