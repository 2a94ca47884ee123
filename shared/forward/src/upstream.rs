//! Where a [`Forwarder`](crate::Forwarder)'s batches go. The forwarder owns the cursor,
//! the WAL holds, the disk budget and the retries; an [`Upstream`] only opens sessions and
//! delivers batches, so the regional's gRPC service ([`GrpcUpstream`]) and Prometheus
//! remote write (crate `strata-remote-write`) share one store-and-forward mechanism.

use crate::pb;
use pb::forward_client::ForwardClient;
use std::future::Future;
use std::time::Duration;
use strata_grpc::{labels_to_pb, ClientTlsConfig, MAX_MESSAGE_BYTES};
use strata_model::Labels;
use tonic::codec::CompressionEncoding;
use tonic::transport::{Channel, Endpoint};

/// What an upstream says when a session opens.
#[derive(Debug, Clone)]
pub struct Greeting {
    /// The upstream's storage identity: a different one than the cursor's means it lost
    /// what it had, and everything is sent again. Empty: the upstream has none (a remote
    /// write endpoint), and the cursor is kept whatever it says.
    pub storage_id: String,
    /// The most samples it takes in one batch.
    pub max_batch_samples: u64,
    /// It decodes `ForwardSeries.chunks` (a backlog from storage is sent as chunks).
    pub takes_chunks: bool,
    /// It takes `ForwardSeries.open_chunk`.
    pub takes_open_chunks: bool,
    /// Numbered batches of a session it takes in flight at once, storing them in order
    /// (`PushRequest.seq`); 0 or 1: one at a time.
    pub max_in_flight: u64,
}

/// How a batch failed.
#[derive(Debug)]
pub enum PushError {
    /// The upstream will never take this batch as it is (invalid): after
    /// `ForwarderOptions::refusals_before_drop` tries it is dropped, counted and logged.
    Refused(String),
    /// Anything else (connection, overload, the upstream's own failure): the session ends
    /// and the batch is sent again after a backoff.
    Failed(String),
}

/// What the upstream did with a batch it acknowledged.
#[derive(Debug, Clone, Copy, Default)]
pub struct PushAck {
    /// Samples it held with another value at the same timestamp (kept its own).
    pub conflicts: u64,
    pub out_of_order: u64,
    pub out_of_bounds: u64,
}

/// A destination of batches.
pub trait Upstream: Send + Sync + 'static {
    type Session: UpstreamSession;

    /// Opens a session; the forwarder names every series again with its labels in each.
    fn open(&self) -> impl Future<Output = Result<(Self::Session, Greeting), String>> + Send;
}

/// One session with an upstream. A batch names a series with its labels the first time
/// the session sends it (`ForwardSeries.labels`), and by its number (`ref`) alone after.
pub trait UpstreamSession: Send {
    /// Delivers the batch; `Ok` only once the upstream holds it durably. The future owns
    /// what it needs, so that, with an upstream whose [`Greeting::max_in_flight`] allows
    /// it, the next batch is pushed while this one is in flight.
    fn push(&mut self, batch: pb::PushRequest) -> impl Future<Output = Result<PushAck, PushError>> + Send + 'static;
}

/// How forwarded batches are compressed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchCompression {
    /// zstd where the regional says it takes it, gzip otherwise: zstd compresses a batch
    /// several times faster than gzip, to fewer bytes.
    #[default]
    Zstd,
    Gzip,
    /// For a link faster than the CPU.
    None,
}

/// A regional's `Forward` gRPC service.
pub struct GrpcUpstream {
    /// `http://host:port`, or `https://` with `tls`.
    pub endpoint: String,
    pub tls: Option<ClientTlsConfig>,
    /// How batches are compressed (the receiver takes each).
    pub compression: BatchCompression,
    /// For each call; a push also waits for the batches in flight before it.
    pub timeout: Duration,
    /// Sent in `Hello`.
    pub external_labels: Labels,
    /// Batches pushed before the first is acknowledged, at most (the regional may take fewer).
    pub max_in_flight: usize,
}

impl GrpcUpstream {
    async fn connect(&self) -> Result<ForwardClient<Channel>, String> {
        let mut ep = Endpoint::from_shared(self.endpoint.clone())
            .map_err(|e| format!("invalid address: {e}"))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            ep = ep.tls_config(tls.clone()).map_err(|e| format!("TLS: {e}"))?;
        }
        let ch = ep.connect().await.map_err(|e| format!("connecting: {e}"))?;
        let client = ForwardClient::new(ch).accept_compressed(CompressionEncoding::Gzip);
        // `Hello` goes as gzip, which every regional takes; its answer says whether zstd is.
        let client = match self.compression {
            BatchCompression::None => client,
            BatchCompression::Gzip | BatchCompression::Zstd => client.send_compressed(CompressionEncoding::Gzip),
        };
        Ok(client.max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES))
    }
}

impl Upstream for GrpcUpstream {
    type Session = GrpcSession;

    async fn open(&self) -> Result<(GrpcSession, Greeting), String> {
        let mut client = self.connect().await?;
        let hello = pb::HelloRequest { external_labels: labels_to_pb(&self.external_labels) };
        let hello = tokio::time::timeout(self.timeout, client.hello(with_deadline(hello, self.timeout)))
            .await
            .map_err(|_| format!("hello: no answer in {:?}", self.timeout))?
            .map_err(|s| format!("hello: {}", s.message()))?
            .into_inner();
        if self.compression == BatchCompression::Zstd && hello.takes_zstd {
            client = client.send_compressed(CompressionEncoding::Zstd);
        }
        // An older regional says 0: one at a time.
        let in_flight = u64::from(hello.max_in_flight).min(self.max_in_flight as u64).max(1);
        let greeting = Greeting {
            storage_id: hello.storage_id,
            max_batch_samples: hello.max_batch_samples,
            takes_chunks: hello.takes_chunks,
            takes_open_chunks: hello.takes_open_chunks,
            max_in_flight: in_flight,
        };
        // A batch waits at the regional for those in flight before it: the timeout is for
        // each of them.
        let deadline = self.timeout.saturating_mul(u32::try_from(in_flight).unwrap_or(u32::MAX));
        Ok((GrpcSession { client, deadline }, greeting))
    }
}

/// `message` with a deadline the server sees (`grpc-timeout`); the client bounds its own
/// wait separately.
fn with_deadline<T>(message: T, deadline: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.set_timeout(deadline);
    r
}

pub struct GrpcSession {
    client: ForwardClient<Channel>,
    /// How long a push may take, its wait for the batches before it included.
    deadline: Duration,
}

impl UpstreamSession for GrpcSession {
    fn push(&mut self, batch: pb::PushRequest) -> impl Future<Output = Result<PushAck, PushError>> + Send + 'static {
        // A clone shares the connection: batches in flight at once are streams of it.
        let (mut client, deadline) = (self.client.clone(), self.deadline);
        async move {
            let pushed = tokio::time::timeout(deadline, client.push(with_deadline(batch, deadline))).await;
            let Ok(pushed) = pushed else {
                return Err(PushError::Failed(format!("push: no acknowledgement in {deadline:?}")));
            };
            match pushed {
                Ok(a) => {
                    let a = a.into_inner();
                    Ok(PushAck { conflicts: a.conflicts, out_of_order: a.out_of_order, out_of_bounds: a.out_of_bounds })
                }
                Err(s) if s.code() == tonic::Code::InvalidArgument => Err(PushError::Refused(s.message().to_string())),
                Err(s) => Err(PushError::Failed(format!("push: {:?}: {}", s.code(), s.message()))),
            }
        }
    }
}
