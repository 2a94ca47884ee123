//! DNS SRV lookups for `dnssrv+` store names: a minimal client (one UDP question, the
//! answer section parsed with name compression), since the standard library resolves only
//! addresses. The hosts an SRV answer names are then resolved as any `dns+` name is. An
//! answer too large for UDP comes truncated (the TC bit: about seven Kubernetes names fit
//! in 512 bytes); it is never taken as the whole list, but asked again over TCP, as
//! resolvers do.
//! Everything read from the wire is bounds-checked: a broken or hostile answer is an
//! error, never a panic.

use std::net::SocketAddr;
use std::time::Duration;

const TYPE_SRV: u16 = 33;
const CLASS_IN: u16 = 1;

/// The first `nameserver` of `/etc/resolv.conf`, at port 53.
pub fn system_resolver() -> Option<SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    text.lines().filter_map(|l| l.trim().strip_prefix("nameserver")).find_map(|ip| {
        let ip: std::net::IpAddr = ip.trim().parse().ok()?;
        Some(SocketAddr::new(ip, 53))
    })
}

/// The question for `name`'s SRV records, with transaction `id`.
pub fn srv_query(id: u16, name: &str) -> Result<Vec<u8>, String> {
    let mut q = Vec::with_capacity(name.len() + 18);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]); // RD; one question
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!("{name:?} is not a DNS name"));
        }
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&TYPE_SRV.to_be_bytes());
    q.extend_from_slice(&CLASS_IN.to_be_bytes());
    if q.len() > 512 {
        return Err(format!("{name:?} is too long"));
    }
    Ok(q)
}

fn u16_at(b: &[u8], i: usize) -> Result<u16, String> {
    b.get(i..i + 2).map(|x| u16::from_be_bytes([x[0], x[1]])).ok_or_else(|| "answer cut short".to_string())
}

/// Reads a (possibly compressed) name at `i`; returns it and the offset after it.
fn read_name(b: &[u8], mut i: usize) -> Result<(String, usize), String> {
    let mut labels: Vec<String> = Vec::new();
    let mut end = None;
    for _ in 0..64 {
        let len = *b.get(i).ok_or("answer cut short")? as usize;
        if len == 0 {
            return Ok((labels.join("."), end.unwrap_or(i + 1)));
        }
        if len & 0xC0 == 0xC0 {
            let ptr = (u16_at(b, i)? & 0x3FFF) as usize;
            end.get_or_insert(i + 2);
            i = ptr;
            continue;
        }
        let label = b.get(i + 1..i + 1 + len).ok_or("answer cut short")?;
        labels.push(String::from_utf8_lossy(label).into_owned());
        i += 1 + len;
    }
    Err("a name with too many labels or a pointer loop".into())
}

/// The SRV records (target host, port) of an answer to the question with `id`. A
/// truncated answer is [`Truncated`](SrvAnswer::Truncated), never a short list.
pub fn parse_srv_answer(b: &[u8], id: u16) -> Result<Vec<(String, u16)>, String> {
    match parse_srv(b, id)? {
        SrvAnswer::Records(r) => Ok(r),
        SrvAnswer::Truncated => Err("the answer was truncated".into()),
    }
}

/// An answer: its records, or word that they did not fit.
pub enum SrvAnswer {
    Records(Vec<(String, u16)>),
    Truncated,
}

fn parse_srv(b: &[u8], id: u16) -> Result<SrvAnswer, String> {
    if u16_at(b, 0)? != id {
        return Err("an answer to another question".into());
    }
    let flags = u16_at(b, 2)?;
    if flags & 0x8000 == 0 {
        return Err("not an answer".into());
    }
    if flags & 0x0200 != 0 {
        return Ok(SrvAnswer::Truncated);
    }
    match flags & 0x000F {
        0 => {}
        3 => return Err("no such name".into()),
        rcode => return Err(format!("the resolver answered with error code {rcode}")),
    }
    let (qd, an) = (u16_at(b, 4)?, u16_at(b, 6)?);
    let mut i = 12;
    for _ in 0..qd {
        i = read_name(b, i)?.1 + 4;
    }
    let mut out = Vec::new();
    for _ in 0..an {
        let (_, after) = read_name(b, i)?;
        let (ty, len) = (u16_at(b, after)?, u16_at(b, after + 8)? as usize);
        let rdata = after + 10;
        if rdata + len > b.len() {
            return Err("answer cut short".into());
        }
        if ty == TYPE_SRV {
            let port = u16_at(b, rdata + 4)?;
            let (target, _) = read_name(b, rdata + 6)?;
            if !target.is_empty() {
                out.push((target, port));
            }
        }
        i = rdata + len;
    }
    Ok(SrvAnswer::Records(out))
}

/// Asks `resolver` for `name`'s SRV records over UDP, and again over TCP when the answer
/// is truncated.
pub async fn lookup_srv(resolver: SocketAddr, name: &str, timeout: Duration) -> Result<Vec<(String, u16)>, String> {
    let id = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(7)
        & 0xFFFF) as u16;
    let q = srv_query(id, name)?;
    let bind: SocketAddr =
        if resolver.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { "[::]:0".parse().map_err(|_| "")? };
    let sock = tokio::net::UdpSocket::bind(bind).await.map_err(|e| e.to_string())?;
    sock.connect(resolver).await.map_err(|e| e.to_string())?;
    sock.send(&q).await.map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(timeout, sock.recv(&mut buf))
        .await
        .map_err(|_| format!("no answer from {resolver} within {timeout:?}"))?
        .map_err(|e| e.to_string())?;
    match parse_srv(&buf[..n], id)? {
        SrvAnswer::Records(r) => Ok(r),
        SrvAnswer::Truncated => {
            let tcp = lookup_srv_tcp(resolver, &q, id);
            tokio::time::timeout(timeout, tcp)
                .await
                .map_err(|_| format!("the answer over UDP was truncated, and none came over TCP within {timeout:?}"))?
        }
    }
}

/// The question over TCP (each message framed by its length); the answer read up to its
/// length, at most 64 KiB as the protocol allows.
async fn lookup_srv_tcp(resolver: SocketAddr, q: &[u8], id: u16) -> Result<Vec<(String, u16)>, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(resolver).await.map_err(|e| format!("TCP to {resolver}: {e}"))?;
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(q);
    c.write_all(&framed).await.map_err(|e| e.to_string())?;
    let mut len = [0u8; 2];
    c.read_exact(&mut len).await.map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    c.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
    match parse_srv(&buf, id)? {
        SrvAnswer::Records(r) => Ok(r),
        SrvAnswer::Truncated => Err("the answer was truncated over TCP too".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer to `query` with SRV records, the targets compressed against the question.
    fn answer(query: &[u8], records: &[(u16, &str)]) -> Vec<u8> {
        let mut a = query.to_vec();
        a[2] = 0x81;
        a[3] = 0x80;
        a[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
        for (port, host) in records {
            a.extend_from_slice(&[0xC0, 12]); // the question's name
            a.extend_from_slice(&TYPE_SRV.to_be_bytes());
            a.extend_from_slice(&CLASS_IN.to_be_bytes());
            a.extend_from_slice(&30u32.to_be_bytes());
            let mut rdata = vec![0, 10, 0, 5];
            rdata.extend_from_slice(&port.to_be_bytes());
            for l in host.split('.') {
                rdata.push(l.len() as u8);
                rdata.extend_from_slice(l.as_bytes());
            }
            rdata.push(0);
            a.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            a.extend_from_slice(&rdata);
        }
        a
    }

    #[tokio::test]
    async fn srv_records_come_back_from_a_resolver_on_loopback() {
        let server = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            let (n, from) = server.recv_from(&mut buf).await.unwrap();
            let a = answer(&buf[..n], &[(10901, "edge-0.local"), (10902, "edge-1.local")]);
            server.send_to(&a, from).await.unwrap();
        });
        let got = lookup_srv(addr, "_grpc._tcp.edges.local", Duration::from_secs(2)).await.unwrap();
        assert_eq!(got, [("edge-0.local".to_string(), 10901), ("edge-1.local".to_string(), 10902)]);
    }

    /// More records than fit in UDP: the truncated UDP answer (with the few that fit) is not
    /// taken; the whole list comes over TCP.
    #[tokio::test]
    async fn a_truncated_answer_is_asked_again_over_tcp() {
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = udp.local_addr().unwrap();
        let tcp = tokio::net::TcpListener::bind(addr).await.unwrap();
        let names: Vec<String> = (0..20).map(|i| format!("edge-{i}.edges.monitoring.svc.cluster.local")).collect();
        let (first, all2) = (names[..3].to_vec(), names.clone());
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            let (n, from) = udp.recv_from(&mut buf).await.unwrap();
            let records: Vec<(u16, &str)> = first.iter().map(|n| (10901, n.as_str())).collect();
            let mut a = answer(&buf[..n], &records);
            a[2] |= 0x02; // TC
            udp.send_to(&a, from).await.unwrap();
        });
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut c, _) = tcp.accept().await.unwrap();
            let mut len = [0u8; 2];
            c.read_exact(&mut len).await.unwrap();
            let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
            c.read_exact(&mut q).await.unwrap();
            let records: Vec<(u16, &str)> = all2.iter().map(|n| (10901, n.as_str())).collect();
            let a = answer(&q, &records);
            let mut framed = (a.len() as u16).to_be_bytes().to_vec();
            framed.extend_from_slice(&a);
            c.write_all(&framed).await.unwrap();
        });
        let got = lookup_srv(addr, "_grpc._tcp.edges.local", Duration::from_secs(2)).await.unwrap();
        assert_eq!(got.len(), 20, "{got:?}");
    }

    #[test]
    fn broken_answers_are_errors() {
        let q = srv_query(7, "_grpc._tcp.x").unwrap();
        let good = answer(&q, &[(1, "a.b")]);
        assert_eq!(parse_srv_answer(&good, 7).unwrap(), [("a.b".to_string(), 1)]);
        assert!(parse_srv_answer(&good, 8).is_err(), "another id");
        for cut in 0..good.len() {
            let _ = parse_srv_answer(&good[..cut], 7);
        }
        let mut looped = good.clone();
        let at = q.len();
        looped[at] = 0xC0;
        looped[at + 1] = at as u8; // a pointer to itself
        assert!(parse_srv_answer(&looped, 7).is_err());
        assert!(srv_query(1, "a..b").is_err());
        let mut truncated = good.clone();
        truncated[2] |= 0x02;
        assert!(parse_srv_answer(&truncated, 7).is_err(), "a truncated answer is not the list");
    }
}
