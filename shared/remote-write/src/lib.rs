//! Prometheus remote write (1.0) from the edge's WAL, to any receiver that takes it:
//! Prometheus, Mimir, Thanos Receive, Amazon Managed Service for Prometheus (SigV4).
//!
//! There is no queue of its own to lose: a [`RemoteWriteUpstream`] is an
//! [`Upstream`](strata_forward::Upstream) of the forward mechanism, so a remote write reads
//! the WAL at a persisted cursor, holds the WAL it still needs, obeys `forward_max_disk`,
//! and resumes after a restart or an outage from the last acknowledged sample, as a
//! forward to a regional does. What it adds is Prometheus' wire and behaviour: each round
//! read from the WAL is split by series over up to `max_shards` shards that send in
//! parallel (one series always in one shard, so its samples arrive in order), in requests
//! of `max_samples_per_send`; 5xx, 429 and connection errors are retried with backoff
//! until they succeed (the cursor moves only once every shard's part is acknowledged),
//! as are redirects (not followed: the URL needs fixing, the data is kept); any other 4xx
//! drops that request's samples, counted and logged with their range.

mod config;
mod metrics;
mod send;
mod sigv4;
#[cfg(test)]
mod tests;
mod wire;

pub use config::{MetadataConfig, MetadataSend, Queue, QueueConfig, SigV4Config, MAX_SHARDS};
pub use metrics::{QueueLabels, QueueStats, RemoteWriteMetrics};
pub use send::RemoteWriteSession;
pub use sigv4::Signer;

use std::sync::Arc;
use std::time::Duration;
use strata_forward::{ForwarderOptions, Greeting, Upstream};
use strata_ingest::relabel::RelabelRule;
use tokio::sync::watch;

/// Headers a configuration may not set: the protocol's own, and what the HTTP client or
/// the authorization settings own (Prometheus refuses the same).
pub const RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "host",
    "content-encoding",
    "content-length",
    "content-type",
    "user-agent",
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "www-authenticate",
    "x-prometheus-remote-write-version",
    "x-amz-date",
    "x-amz-security-token",
    "x-amz-content-sha256",
];

#[derive(Debug, thiserror::Error)]
pub enum RemoteWriteError {
    #[error("remote_write {name}: {reason}")]
    Config { name: String, reason: String },
}

/// Checks a remote-write URL as the HTTP client will use it: `http://` or `https://`, a
/// host, no credentials (they go in `basic_auth`, never in logs and metric labels).
pub fn check_url(url: &str) -> Result<bool, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("invalid url: {e}"))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err("url must be an http:// or https:// URL".into()),
    };
    let Some(authority) = uri.authority() else { return Err("url has no host".into()) };
    if authority.as_str().contains('@') {
        return Err("url carries credentials: put them in basic_auth".into());
    }
    if authority.host().is_empty() {
        return Err("url has no host".into());
    }
    // `http` leaves a port past 65535 out of `port()` rather than refusing it.
    if let Some((_, port)) = authority.as_str().rsplit_once(':').filter(|_| !authority.as_str().ends_with(']')) {
        if port.parse::<u16>().is_err() {
            return Err(format!("invalid url: port {port:?}"));
        }
    }
    Ok(https)
}

/// One `remote_write` entry, resolved.
#[derive(Clone)]
pub struct RemoteWriteOptions {
    /// `remote_name` in metrics and logs: the entry's `name`, or a digest of its URL.
    pub name: String,
    pub url: String,
    pub timeout: Duration,
    /// The entry's `headers` and the `Authorization` its `basic_auth` or `authorization`
    /// makes, sent (and signed, with SigV4) with every request.
    pub headers: Vec<(String, String)>,
    /// TLS for `https://` URLs (CAs, client certificate, server name).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub sigv4: Option<SigV4Config>,
    pub queue: Queue,
    pub metadata: MetadataSend,
    pub relabel: Vec<RelabelRule>,
    /// Every family's metadata as the edge knows it now, sent every `send_interval` (as
    /// Prometheus sends its scrape caches'); without it, the families the session met.
    pub metadata_source: Option<MetadataSource>,
}

/// Where a queue reads every family's metadata (the edge: its head).
pub type MetadataSource = Arc<dyn Fn() -> Vec<(String, strata_model::Metadata)> + Send + Sync>;

impl std::fmt::Debug for RemoteWriteOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values may be credentials: names only.
        let headers: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("RemoteWriteOptions")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .field("headers", &headers)
            .field("tls", &self.tls.is_some())
            .field("sigv4", &self.sigv4)
            .field("queue", &self.queue)
            .field("metadata", &self.metadata)
            .finish_non_exhaustive()
    }
}

/// The name of an unnamed queue: six hex digits of a digest of its URL, like Prometheus'
/// (which digests the whole entry with MD5). CRC-32 is stable across builds: the name
/// also names the queue's cursor.
pub fn default_name(url: &str) -> String {
    format!("{:06x}", crc32fast::hash(url.as_bytes()) & 0xff_ffff)
}

/// A remote-write endpoint as an upstream of the forward mechanism.
pub struct RemoteWriteUpstream {
    shared: Arc<send::Shared>,
}

impl RemoteWriteUpstream {
    /// Builds the HTTP client and the signer; `stop` ends retries when the edge shuts down.
    pub async fn new(
        opts: RemoteWriteOptions,
        stats: QueueStats,
        stop: watch::Receiver<bool>,
    ) -> Result<RemoteWriteUpstream, RemoteWriteError> {
        let fail = |reason: String| RemoteWriteError::Config { name: opts.name.clone(), reason };
        let signer = match &opts.sigv4 {
            Some(cfg) => Some(Signer::new(cfg).await.map_err(fail)?),
            None => None,
        };
        let client = send::http_client(&opts).map_err(fail)?;
        stats.shards_max.set(i64::try_from(opts.queue.max_shards).unwrap_or(i64::MAX));
        stats.shards_min.set(1);
        let highest_sent = std::sync::atomic::AtomicI64::new(i64::MIN);
        Ok(RemoteWriteUpstream { shared: Arc::new(send::Shared { opts, client, signer, stats, stop, highest_sent }) })
    }

    /// The forwarder options that read the WAL for this queue: its own cursor
    /// (`remote-write/<name>`), rounds of every shard's capacity, and the queue's backoff.
    pub fn forwarder_options(&self) -> ForwarderOptions {
        let q = &self.shared.opts.queue;
        // `/` keeps the name apart from every forward upstream's (an address has no path).
        let mut o = ForwarderOptions::new(&format!("remote-write/{}", self.shared.opts.name));
        // Prometheus' rule: a series' own label wins over an external label of its name.
        o.series_labels_win = true;
        // As Prometheus: from the WAL's start, not the history in blocks.
        o.history_on_first_contact = false;
        o.batch_samples = QueueConfig::round_samples(q);
        // Fresh data waits at most this long for a round (the batch send deadline).
        o.poll = q.batch_send_deadline.min(Duration::from_millis(200));
        o.min_backoff = q.min_backoff;
        o.max_backoff = q.max_backoff;
        o.timeout = self.shared.opts.timeout;
        o
    }
}

impl Upstream for RemoteWriteUpstream {
    type Session = RemoteWriteSession;

    async fn open(&self) -> Result<(RemoteWriteSession, Greeting), String> {
        // Remote write has no handshake and no storage identity: the cursor is kept.
        let greeting = Greeting {
            storage_id: String::new(),
            max_batch_samples: strata_forward::MAX_BATCH_SAMPLES as u64,
            takes_chunks: false,
            takes_open_chunks: false,
            // Prometheus' receiver appends as requests come: one at a time keeps each
            // series' samples in order.
            max_in_flight: 1,
        };
        Ok((RemoteWriteSession::new(self.shared.clone()), greeting))
    }
}
