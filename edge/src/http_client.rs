//! A small HTTP/1.1 client for scrapes: one kept-alive connection per target, the request
//! bytes built once, the response read into buffers reused from scrape to scrape, and gzip
//! bodies inflated in one pass under the size limit.
//!
//! Scrapes are plain `GET`s of one URL, again and again; a general client spends more on
//! URL parsing, header maps, pool bookkeeping and task hand-offs than on the bytes. What it
//! supports: `http://` and `https://` targets (TLS by rustls, with the job's CA, client
//! certificate, server name or `insecure_skip_verify`), an `Authorization` header (basic
//! auth or a bearer token), `Content-Length`, `chunked` and read-to-close bodies,
//! `Content-Encoding: gzip`, keep-alive with one retry when a reused connection turns out to
//! be closed. Not supported (an error naming it): redirects.

use flate2::{Decompress, FlushDecompress, Status};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// A connection to a target, plain or TLS.
trait Conn: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Conn for T {}

/// What a scrape connection needs beyond the URL: TLS settings and an `Authorization`
/// header value, built once per job from its configuration.
#[derive(Clone, Default)]
pub struct ClientSecurity {
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The name the server's certificate must carry; the URL's host when unset.
    pub server_name: Option<String>,
    /// The full header value: `Basic …` or `Bearer …`.
    pub authorization: Option<String>,
    /// A digest of the secrets and certificate files as read, so a reload notices rotated
    /// contents behind unchanged paths. Never printed.
    pub digest: u64,
}

impl std::fmt::Debug for ClientSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the credentials.
        f.debug_struct("ClientSecurity")
            .field("tls", &self.tls.is_some())
            .field("server_name", &self.server_name)
            .field("authorization", &self.authorization.as_ref().map(|_| "<secret>"))
            .finish()
    }
}

const MAX_HEAD: usize = 64 << 10;

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum HttpError {
    #[error("unsupported URL {0:?}: only http:// and https:// targets are supported")]
    UnsupportedUrl(String),
    #[error("invalid URL \"{url}\": byte 0x{byte:02x} is not allowed in a target address or path")]
    InvalidUrl { url: String, byte: u8 },
    #[error("connecting to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("{0}")]
    Io(String),
    #[error("invalid HTTP response: {0}")]
    Protocol(String),
    #[error("server returned HTTP status {0}")]
    Status(u16),
    #[error("body size limit of {0} bytes exceeded")]
    BodyTooLarge(u64),
    #[error("context deadline exceeded after {0:?}")]
    Timeout(Duration),
}

/// `http://host:port/path?query` split once.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub host_port: String,
    pub path: String,
    pub https: bool,
}

impl Endpoint {
    pub fn parse(url: &str) -> Result<Endpoint, HttpError> {
        let (rest, https) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(r), _) => (r, false),
            (_, Some(r)) => (r, true),
            _ => return Err(HttpError::UnsupportedUrl(url.to_string())),
        };
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if host.is_empty() || host.contains('@') {
            return Err(HttpError::UnsupportedUrl(url.to_string()));
        }
        // The address and path go into the request line and the Host header as they are:
        // CR, LF, spaces or other control bytes would split or forge the request.
        if let Some(b) = rest.bytes().find(|b| !(0x21..=0x7e).contains(b)) {
            return Err(HttpError::InvalidUrl { url: url.escape_debug().to_string(), byte: b });
        }
        let host_port = if host.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
            host.to_string()
        } else {
            format!("{host}:{}", if https { 443 } else { 80 })
        };
        Ok(Endpoint { host_port, path: path.to_string(), https })
    }

    /// The host without the port, for the TLS server name.
    fn host(&self) -> &str {
        let h = self.host_port.rsplit_once(':').map_or(self.host_port.as_str(), |(h, _)| h);
        h.trim_start_matches('[').trim_end_matches(']')
    }
}

#[derive(Debug, Default, Clone, PartialEq)]
struct Head {
    status: u16,
    content_length: Option<usize>,
    chunked: bool,
    gzip: bool,
    close: bool,
    content_type: Option<String>,
}

/// Parses a response head (status line and headers, without the blank line).
fn parse_head(raw: &[u8]) -> Result<Head, HttpError> {
    let text = std::str::from_utf8(raw).map_err(|_| HttpError::Protocol("response head is not UTF-8".into()))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError::Protocol(format!("bad status line {status_line:?}")));
    }
    let status = parts
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| HttpError::Protocol(format!("bad status line {status_line:?}")))?;
    let mut h = Head { status, close: version == "HTTP/1.0", ..Default::default() };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => {
                h.content_length =
                    Some(value.parse().map_err(|_| HttpError::Protocol(format!("bad Content-Length {value:?}")))?);
            }
            "transfer-encoding" => h.chunked = value.to_ascii_lowercase().contains("chunked"),
            "content-encoding" => h.gzip = value.eq_ignore_ascii_case("gzip"),
            "connection" => h.close = value.eq_ignore_ascii_case("close"),
            "content-type" => h.content_type = Some(value.to_string()),
            _ => {}
        }
    }
    Ok(h)
}

/// Longest chunk-size line or trailer section accepted: each read re-scans at most this
/// much, so decoding stays linear however the server slices its bytes.
const MAX_CHUNK_LINE: usize = 4096;

/// Decodes a chunked body from `data` as it arrives: `pos` is where the next chunk
/// starts (0 at first), kept between calls so that every byte is decoded once; decoded
/// bytes are appended to `out`. Returns the body's end once complete, `None` when more
/// bytes are needed.
fn dechunk(data: &[u8], pos: &mut usize, out: &mut Vec<u8>, limit: u64) -> Result<Option<usize>, HttpError> {
    loop {
        let i = *pos;
        let Some(eol) = data[i..].windows(2).take(MAX_CHUNK_LINE).position(|w| w == b"\r\n") else {
            if data.len() - i > MAX_CHUNK_LINE {
                return Err(HttpError::Protocol("chunk size line too long".into()));
            }
            return Ok(None);
        };
        let size_line =
            std::str::from_utf8(&data[i..i + eol]).map_err(|_| HttpError::Protocol("bad chunk size".into()))?;
        let size_hex = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| HttpError::Protocol(format!("bad chunk size {size_hex:?}")))?;
        let i = i + eol + 2;
        if size == 0 {
            // trailers end with an empty line
            let trailers = &data[i..data.len().min(i + MAX_CHUNK_LINE)];
            return match trailers.windows(2).position(|w| w == b"\r\n") {
                Some(0) => Ok(Some(i + 2)),
                Some(_) => match trailers.windows(4).position(|w| w == b"\r\n\r\n") {
                    Some(p) => Ok(Some(i + p + 4)),
                    None if trailers.len() >= MAX_CHUNK_LINE => {
                        Err(HttpError::Protocol("chunked trailers too long".into()))
                    }
                    None => Ok(None),
                },
                None if trailers.len() >= MAX_CHUNK_LINE => {
                    Err(HttpError::Protocol("chunked trailers too long".into()))
                }
                None => Ok(None),
            };
        }
        let end = i
            .checked_add(size)
            .and_then(|e| e.checked_add(2))
            .ok_or_else(|| HttpError::Protocol(format!("chunk size {size_hex:?} too large")))?;
        if limit > 0 && size as u64 > limit {
            return Err(HttpError::BodyTooLarge(limit));
        }
        if data.len() < end {
            return Ok(None);
        }
        if &data[i + size..end] != b"\r\n" {
            return Err(HttpError::Protocol("chunk not followed by CRLF".into()));
        }
        out.extend_from_slice(&data[i..i + size]);
        if limit > 0 && out.len() as u64 > limit {
            return Err(HttpError::BodyTooLarge(limit));
        }
        *pos = end;
    }
}

/// What [`ScrapeClient::fetch`] learnt from the response head; the body is in the buffers.
pub struct Fetched {
    pub gzip: bool,
    pub content_type: Option<String>,
}

impl Buffers {
    /// Bytes of the fetched body as it came (gzipped or not).
    pub fn fetched_bytes(&self) -> usize {
        self.body.len()
    }

    /// The fetched page, inflated when it came gzipped, with the size limit (0: none)
    /// enforced on the inflated bytes while inflating.
    pub fn page(&mut self, gzip: bool, limit: u64) -> Result<&[u8], HttpError> {
        if gzip {
            gunzip(&self.body, &mut self.inflated, &mut self.inflater, limit)?;
            Ok(&self.inflated)
        } else {
            Ok(&self.body)
        }
    }
}

pub struct Response<'a> {
    pub body: &'a [u8],
    pub content_type: Option<String>,
}

/// The buffers one scrape needs. Only scrapes in flight hold them: loops take them from a
/// [`BufferPool`] and give them back, so memory follows concurrency, not the target count.
pub struct Buffers {
    buf: Vec<u8>,
    body: Vec<u8>,
    inflated: Vec<u8>,
    /// Raw-deflate state, reset between bodies instead of rebuilt.
    inflater: Decompress,
}

impl Default for Buffers {
    fn default() -> Self {
        Buffers { buf: Vec::new(), body: Vec::new(), inflated: Vec::new(), inflater: Decompress::new(false) }
    }
}

/// Inflates a gzip stream (RFC 1952) into `out`: every member in turn, as Go's reader
/// does (a stream may be several members concatenated), each checked against its CRC and
/// length, and the size limit (0: none) as it goes.
fn gunzip(input: &[u8], out: &mut Vec<u8>, inflater: &mut Decompress, limit: u64) -> Result<(), HttpError> {
    out.clear();
    // A guess at the inflated size, never past the limit.
    let guess = input.len().saturating_mul(4);
    out.reserve(if limit > 0 { guess.min(usize::try_from(limit).unwrap_or(usize::MAX)) } else { guess });
    let mut rest = input;
    loop {
        rest = gunzip_member(rest, out, inflater, limit)?;
        if rest.is_empty() {
            return Ok(());
        }
    }
}

/// Inflates the gzip member at the start of `input`, appending to `out`; returns the
/// bytes after it.
fn gunzip_member<'a>(
    input: &'a [u8],
    out: &mut Vec<u8>,
    inflater: &mut Decompress,
    limit: u64,
) -> Result<&'a [u8], HttpError> {
    let bad = |m: &str| HttpError::Protocol(format!("gzip body: {m}"));
    if input.len() < 18 || input[0] != 0x1f || input[1] != 0x8b || input[2] != 8 {
        return Err(bad("not a gzip stream"));
    }
    let flags = input[3];
    let mut pos = 10;
    if flags & 4 != 0 {
        let xlen = u16::from_le_bytes([
            *input.get(pos).ok_or_else(|| bad("truncated header"))?,
            *input.get(pos + 1).ok_or_else(|| bad("truncated header"))?,
        ]);
        pos += 2 + xlen as usize;
    }
    for flag in [8u8, 16] {
        if flags & flag != 0 {
            let end =
                input.get(pos..).and_then(|r| r.iter().position(|&b| b == 0)).ok_or_else(|| bad("truncated header"))?;
            pos += end + 1;
        }
    }
    if flags & 2 != 0 {
        pos += 2;
    }
    let data = input.get(pos..).ok_or_else(|| bad("truncated header"))?;
    inflater.reset(false);
    let start = out.len();
    loop {
        let before = inflater.total_in() as usize;
        let status =
            inflater.decompress_vec(&data[before..], out, FlushDecompress::Finish).map_err(|e| bad(&e.to_string()))?;
        if limit > 0 && out.len() as u64 > limit {
            return Err(HttpError::BodyTooLarge(limit));
        }
        match status {
            Status::StreamEnd => break,
            _ if out.len() == out.capacity() => out.reserve(out.capacity().max(4096)),
            _ if inflater.total_in() as usize == before => return Err(bad("truncated stream")),
            _ => {}
        }
    }
    let end = inflater.total_in() as usize;
    let trailer = data.get(end..end + 8).ok_or_else(|| bad("missing trailer"))?;
    let crc = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    let size = u32::from_le_bytes([trailer[4], trailer[5], trailer[6], trailer[7]]);
    let member = &out[start..];
    if crc32fast::hash(member) != crc || size != member.len() as u32 {
        return Err(bad("checksum mismatch"));
    }
    Ok(&data[end + 8..])
}

/// Buffers shared by all scrape loops.
#[derive(Default)]
pub struct BufferPool(parking_lot::Mutex<Vec<Buffers>>);

/// Buffers that grew past this are dropped rather than kept in the pool.
const KEEP_BYTES: usize = 8 << 20;

impl BufferPool {
    pub fn take(&self) -> Buffers {
        self.0.lock().pop().unwrap_or_default()
    }

    pub fn put(&self, b: Buffers) {
        if b.buf.capacity() + b.body.capacity() + b.inflated.capacity() <= KEEP_BYTES {
            self.0.lock().push(b);
        }
    }
}

/// One target's connection and request.
pub struct ScrapeClient {
    /// An unsupported URL is reported by every `get`, so the target shows `up` = 0 and why.
    endpoint: Result<Endpoint, HttpError>,
    request: Vec<u8>,
    conn: Option<Box<dyn Conn>>,
    security: ClientSecurity,
}

impl ScrapeClient {
    pub fn new(url: &str, accept: &str, timeout: Duration) -> ScrapeClient {
        Self::with_security(url, accept, timeout, ClientSecurity::default())
    }

    pub fn with_security(url: &str, accept: &str, timeout: Duration, security: ClientSecurity) -> ScrapeClient {
        let mut endpoint = Endpoint::parse(url);
        if let Ok(e) = &endpoint {
            if e.https && security.tls.is_none() {
                endpoint = Err(HttpError::UnsupportedUrl(format!("{url} (https without a TLS configuration)")));
            }
        }
        // Header values go into the request as they are: no CR or LF may split it.
        if security.authorization.as_deref().is_some_and(|a| a.bytes().any(|b| b == b'\r' || b == b'\n')) {
            endpoint = Err(HttpError::Protocol("credentials contain a line break".into()));
        }
        let request = match &endpoint {
            Ok(e) => {
                let default_port = if e.https { ":443" } else { ":80" };
                let auth =
                    security.authorization.as_ref().map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
                format!(
                    "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: Strata/{}\r\nAccept: {accept}\r\nAccept-Encoding: gzip\r\n{auth}X-Prometheus-Scrape-Timeout-Seconds: {}\r\n\r\n",
                    e.path,
                    e.host_port.strip_suffix(default_port).unwrap_or(&e.host_port),
                    env!("CARGO_PKG_VERSION"),
                    timeout.as_secs_f64()
                )
                .into_bytes()
            }
            Err(_) => Vec::new(),
        };
        ScrapeClient { endpoint, request, conn: None, security }
    }

    /// Fetches and decodes the page within `timeout`; `limit` (0: none) caps the decoded body.
    pub async fn get<'b>(
        &mut self,
        bufs: &'b mut Buffers,
        timeout: Duration,
        limit: u64,
    ) -> Result<Response<'b>, HttpError> {
        let f = self.fetch(bufs, timeout, limit).await?;
        Ok(Response { body: bufs.page(f.gzip, limit)?, content_type: f.content_type })
    }

    /// Fetches the page's bytes into `bufs` within `timeout`, as they came (gzip
    /// undecoded: [`Buffers::page`] inflates it, CPU work that belongs off the async
    /// workers); `limit` (0: none) caps the body.
    pub async fn fetch(&mut self, bufs: &mut Buffers, timeout: Duration, limit: u64) -> Result<Fetched, HttpError> {
        let result = match tokio::time::timeout(timeout, self.exchange(bufs, limit)).await {
            Ok(r) => r,
            Err(_) => Err(HttpError::Timeout(timeout)),
        };
        let head = match result {
            Ok(h) => h,
            Err(e) => {
                self.conn = None;
                return Err(e);
            }
        };
        if head.close {
            self.conn = None;
        }
        if head.status != 200 {
            self.conn = None;
            return Err(HttpError::Status(head.status));
        }
        Ok(Fetched { gzip: head.gzip, content_type: head.content_type })
    }

    async fn exchange(&mut self, bufs: &mut Buffers, limit: u64) -> Result<Head, HttpError> {
        let reused = self.conn.is_some();
        match self.try_exchange(bufs, limit).await {
            // A kept-alive connection the server closed meanwhile: one fresh try.
            Err(HttpError::Io(_)) if reused => {
                self.conn = None;
                self.try_exchange(bufs, limit).await
            }
            r => r,
        }
    }

    async fn try_exchange(&mut self, bufs: &mut Buffers, limit: u64) -> Result<Head, HttpError> {
        let Buffers { buf, body, .. } = bufs;
        if self.conn.is_none() {
            let endpoint = self.endpoint.as_ref().map_err(Clone::clone)?;
            let addr = endpoint.host_port.as_str();
            let s = TcpStream::connect(addr)
                .await
                .map_err(|e| HttpError::Connect { addr: addr.to_string(), reason: e.to_string() })?;
            let _ = s.set_nodelay(true);
            self.conn = Some(match (&self.security.tls, endpoint.https) {
                (Some(tls), true) => {
                    let name = self.security.server_name.as_deref().unwrap_or(endpoint.host());
                    let name = rustls::pki_types::ServerName::try_from(name.to_string()).map_err(|e| {
                        HttpError::Connect { addr: addr.to_string(), reason: format!("TLS server name: {e}") }
                    })?;
                    let tls = tokio_rustls::TlsConnector::from(tls.clone())
                        .connect(name, s)
                        .await
                        .map_err(|e| HttpError::Connect { addr: addr.to_string(), reason: format!("TLS: {e}") })?;
                    Box::new(tls)
                }
                _ => Box::new(s),
            });
        }
        let Some(conn) = self.conn.as_mut() else { return Err(HttpError::Io("no connection".into())) };
        conn.write_all(&self.request).await.map_err(|e| HttpError::Io(e.to_string()))?;
        buf.clear();
        // Response head, searched only where new bytes could complete the blank line.
        let mut searched = 0;
        let head_end = loop {
            if let Some(p) = buf[searched..].windows(4).position(|w| w == b"\r\n\r\n") {
                break searched + p;
            }
            searched = buf.len().saturating_sub(3);
            if buf.len() > MAX_HEAD {
                return Err(HttpError::Protocol("response head over 64 KiB".into()));
            }
            if read_more(conn, buf).await? == 0 {
                return Err(HttpError::Io("connection closed before the response head".into()));
            }
        };
        let head = parse_head(&buf[..head_end])?;
        let start = head_end + 4;
        // A compressed body may be at most as large as the limit, too.
        let over = |n: usize| limit > 0 && n as u64 > limit;
        body.clear();
        if head.chunked {
            let mut pos = 0;
            loop {
                if let Some(_end) = dechunk(&buf[start..], &mut pos, body, limit)? {
                    break;
                }
                if over(buf.len() - start) {
                    return Err(HttpError::BodyTooLarge(limit));
                }
                if read_more(conn, buf).await? == 0 {
                    return Err(HttpError::Io("connection closed inside a chunked body".into()));
                }
            }
        } else if let Some(len) = head.content_length {
            if over(len) {
                return Err(HttpError::BodyTooLarge(limit));
            }
            buf.reserve((start + len).saturating_sub(buf.len()));
            while buf.len() < start + len {
                if read_more(conn, buf).await? == 0 {
                    return Err(HttpError::Io("connection closed inside the body".into()));
                }
            }
            body.extend_from_slice(&buf[start..start + len]);
        } else {
            // No length: the body ends when the server closes the connection.
            loop {
                if over(buf.len() - start) {
                    return Err(HttpError::BodyTooLarge(limit));
                }
                if read_more(conn, buf).await? == 0 {
                    break;
                }
            }
            body.extend_from_slice(&buf[start..]);
            return Ok(Head { close: true, ..head });
        }
        Ok(head)
    }
}

async fn read_more(conn: &mut Box<dyn Conn>, buf: &mut Vec<u8>) -> Result<usize, HttpError> {
    if buf.capacity() - buf.len() < 16 << 10 {
        buf.reserve(64 << 10);
    }
    conn.read_buf(buf).await.map_err(|e| HttpError::Io(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use tokio::net::TcpListener;

    #[test]
    fn endpoints() {
        assert_eq!(
            Endpoint::parse("http://h:9400/node/1/metrics?a=b").unwrap(),
            Endpoint { host_port: "h:9400".into(), path: "/node/1/metrics?a=b".into(), https: false }
        );
        assert_eq!(
            Endpoint::parse("http://h").unwrap(),
            Endpoint { host_port: "h:80".into(), path: "/".into(), https: false }
        );
        assert_eq!(
            Endpoint::parse("https://h/m").unwrap(),
            Endpoint { host_port: "h:443".into(), path: "/m".into(), https: true }
        );
        assert!(matches!(Endpoint::parse("ftp://h/metrics"), Err(HttpError::UnsupportedUrl(_))));
        for evil in [
            "http://h:1/metrics\r\nX-Injected: 1",
            "http://h:1/metrics HTTP/1.0\r\n\r\nGET /",
            "http://h\n:1/metrics",
            "http://h:1/a\x00b",
            "http://h:1/caf\u{e9}",
        ] {
            assert!(matches!(Endpoint::parse(evil), Err(HttpError::InvalidUrl { .. })), "{evil:?}");
            let c = ScrapeClient::new(evil, "text/plain", Duration::from_secs(1));
            assert!(c.request.is_empty(), "a request was built for {evil:?}");
        }
    }

    #[test]
    fn heads_and_chunks() {
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\ncontent-encoding: gzip\r\nConnection: close\r\nContent-Type: text/plain").unwrap();
        assert_eq!((h.status, h.content_length, h.gzip, h.close), (200, Some(12), true, true));
        assert!(parse_head(b"SPDY/9 200 OK").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: x").is_err());
        let dc = |data: &[u8], limit: u64| {
            let mut out = Vec::new();
            dechunk(data, &mut 0, &mut out, limit).map(|end| (end, out))
        };
        let (end, out) = dc(b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n", 0).unwrap();
        assert_eq!((end, out.as_slice()), (Some(32), &b"hello world"[..]));
        assert_eq!(dc(b"5\r\nhel", 0).unwrap().0, None);
        assert_eq!(dc(b"5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n", 0).unwrap().0, Some(29));
        assert!(dc(b"zz\r\n", 0).is_err());
        assert!(dc(b"ffffffffffffffff\r\nx", 0).is_err(), "a huge chunk size is an error, not an overflow");
        assert_eq!(dc(b"ffffff\r\nx", 100), Err(HttpError::BodyTooLarge(100)));
        assert_eq!(dc(b"5\r\nhello\r\n0\r\n\r\n", 3), Err(HttpError::BodyTooLarge(3)));
        assert!(dc(b"5\r\nhelloXX0\r\n\r\n", 0).is_err(), "a chunk must end with CRLF");
        assert!(dc(&b"1".repeat(MAX_CHUNK_LINE + 10), 0).is_err(), "an endless size line is an error");
    }

    #[test]
    fn chunks_arriving_a_byte_at_a_time_are_decoded_once() {
        let mut body = Vec::new();
        for i in 0..2000 {
            body.extend_from_slice(format!("3\r\n{:03}\r\n", i % 1000).as_bytes());
        }
        body.extend_from_slice(b"0\r\n\r\n");
        let (mut pos, mut out) = (0, Vec::new());
        let mut end = None;
        for n in 1..=body.len() {
            end = dechunk(&body[..n], &mut pos, &mut out, 0).unwrap();
            assert!(end.is_none() || n == body.len());
        }
        assert_eq!(end, Some(body.len()));
        assert_eq!(out.len(), 6000, "every chunk appended exactly once");
    }

    /// Serves the given raw responses, one per accepted request, closing after `close_after`.
    async fn server(responses: Vec<Vec<u8>>, close_after_each: bool) -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let mut responses = responses.into_iter();
            'outer: loop {
                let Ok((mut s, _)) = l.accept().await else { return };
                loop {
                    let mut buf = vec![0u8; 4096];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => continue 'outer,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let Some(r) = responses.next() else { return };
                    let _ = s.write_all(&r).await;
                    if close_after_each {
                        continue 'outer;
                    }
                }
            }
        });
        format!("http://{addr}/metrics")
    }

    fn gz(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn gzip_members_with_header_fields_crc_and_limits() {
        let page = b"DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} 61\n".repeat(1000);
        let mut z = flate2::GzBuilder::new()
            .filename("page.txt")
            .comment("c")
            .extra(vec![1, 2, 3])
            .write(Vec::new(), flate2::Compression::fast());
        z.write_all(&page).unwrap();
        let z = z.finish().unwrap();
        let (mut out, mut inf) = (Vec::new(), Decompress::new(false));
        gunzip(&z, &mut out, &mut inf, 0).unwrap();
        assert_eq!(out, page);
        // the state is reused for the next body
        gunzip(&gz(b"m 1\n"), &mut out, &mut inf, 0).unwrap();
        assert_eq!(out, b"m 1\n");
        assert_eq!(gunzip(&z, &mut out, &mut inf, 1000), Err(HttpError::BodyTooLarge(1000)));
        let mut corrupt = z.clone();
        let n = corrupt.len();
        corrupt[n - 6] ^= 1; // CRC
        assert!(gunzip(&corrupt, &mut out, &mut inf, 0).is_err());
        assert!(gunzip(&z[..z.len() / 2], &mut out, &mut inf, 0).is_err());
        assert!(gunzip(b"not gzip at all, not at all", &mut out, &mut inf, 0).is_err());
        // Several members concatenated (issue 20, item 13): all of them, in order.
        let mut multi = gz(b"a 1\n");
        multi.extend_from_slice(&gz(b"b 2\n"));
        multi.extend_from_slice(&gz(b"c 3\n"));
        gunzip(&multi, &mut out, &mut inf, 0).unwrap();
        assert_eq!(out, b"a 1\nb 2\nc 3\n");
        multi.extend_from_slice(b"trailing garbage");
        assert!(gunzip(&multi, &mut out, &mut inf, 0).is_err());
    }

    #[tokio::test]
    async fn keep_alive_chunked_gzip_and_errors() {
        let page = b"m 1\n".repeat(100);
        let z = gz(&page);
        let mut gz_resp =
            format!("HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n", z.len()).into_bytes();
        gz_resp.extend_from_slice(&z);
        let responses = vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Type: text/plain\r\n\r\nm 1\n".to_vec(),
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nm \r\n2\r\n2\n\r\n0\r\n\r\n".to_vec(),
            gz_resp,
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n".to_vec(),
        ];
        let url = server(responses, false).await;
        let mut c = ScrapeClient::new(&url, "text/plain", Duration::from_secs(5));
        let t = Duration::from_secs(5);
        let b = &mut Buffers::default();
        let r = c.get(b, t, 0).await.unwrap();
        assert_eq!((r.body, r.content_type.as_deref()), (&b"m 1\n"[..], Some("text/plain")));
        assert_eq!(c.get(b, t, 0).await.unwrap().body, b"m 2\n");
        assert_eq!(c.get(b, t, 0).await.unwrap().body, page.as_slice());
        assert_eq!(c.get(b, t, 0).await.err(), Some(HttpError::Status(503)));
    }

    #[tokio::test]
    async fn closed_connections_read_to_close_limits_and_timeouts() {
        let responses = vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nm 1\n".to_vec(),
            b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nm 2\n".to_vec(),
            b"HTTP/1.0 200 OK\r\n\r\nm 3\nm 4\n".to_vec(),
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n".to_vec(),
        ];
        // the server closes after each response although the client keeps the connection
        let url = server(responses, true).await;
        let mut c = ScrapeClient::new(&url, "text/plain", Duration::from_secs(5));
        let t = Duration::from_secs(5);
        let b = &mut Buffers::default();
        assert_eq!(c.get(b, t, 0).await.unwrap().body, b"m 1\n");
        assert_eq!(c.get(b, t, 0).await.unwrap().body, b"m 2\n", "a closed kept-alive connection is retried");
        assert_eq!(c.get(b, t, 0).await.unwrap().body, b"m 3\nm 4\n");
        assert_eq!(c.get(b, t, 10).await.err(), Some(HttpError::BodyTooLarge(10)));
        // nothing listening any more for a body that never comes: a timeout
        let url = server(vec![b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial".to_vec()], false).await;
        let mut c = ScrapeClient::new(&url, "text/plain", Duration::from_millis(200));
        assert!(matches!(c.get(b, Duration::from_millis(200), 0).await, Err(HttpError::Timeout(_))));
        // nobody listening at all
        let mut c = ScrapeClient::new("http://127.0.0.1:1/metrics", "text/plain", t);
        assert!(matches!(c.get(b, t, 0).await, Err(HttpError::Connect { .. })));
        let mut c = ScrapeClient::new("https://127.0.0.1:1/metrics", "text/plain", t);
        assert!(matches!(c.get(b, t, 0).await, Err(HttpError::UnsupportedUrl(_))));
    }
}
