//! Query strings a hostile client sends to live processes: every construct that deepens a
//! syntax tree, 100,000 levels deep, by GET and by POST, to an edge and to a global in
//! front of it. Each gets an answer or a 4xx and both processes stay up; a generated
//! 1,000-term `or` chain, as dashboards write, is answered by both.

use crate::common::*;
use crate::differential::{remote_write_all, Series};
use crate::global::{edge, start_global};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn deep(construct: &str, n: usize) -> String {
    let wrap = |open: &str, close: &str| format!("{}gpu_temp{}", open.repeat(n), close.repeat(n));
    let chain = |op: &str| vec!["gpu_temp"; n + 1].join(op);
    match construct {
        "parentheses" => wrap("(", ")"),
        "calls" => wrap("abs(", ")"),
        "aggregations" => wrap("sum by (gpu) (", ")"),
        "subqueries" => wrap("max_over_time(", "[1m:1m])"),
        "unary signs" => format!("{}gpu_temp", "-".repeat(n)),
        "sums" => chain("+"),
        "or" => chain(" or "),
        "unless" => chain(" unless "),
        "comparisons" => chain(">bool "),
        "unclosed" => "(".repeat(n),
        _ => unreachable!("{construct}"),
    }
}

const CONSTRUCTS: [&str; 10] = [
    "parentheses",
    "calls",
    "aggregations",
    "subqueries",
    "unary signs",
    "sums",
    "or",
    "unless",
    "comparisons",
    "unclosed",
];

/// Percent-encodes a query parameter.
pub(crate) fn encode(q: &str) -> String {
    q.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// The status of a raw HTTP/1.1 request to `addr` (HTTP clients refuse URLs this long).
fn raw_status(addr: &str, request: &[u8]) -> Result<u16, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
    // The server may answer (and close) before it has read everything.
    let _ = s.write_all(request);
    let mut head = Vec::new();
    let _ = s.read_to_end(&mut head);
    let text = String::from_utf8_lossy(&head[..head.len().min(64)]).into_owned();
    text.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| format!("no status line: {text:?}"))
}

/// Asks `base` for `q` by GET and by POST; each must answer 200 or a 4xx.
fn ask_both_ways(base: &str, q: &str, what: &str) {
    let addr = base.trim_start_matches("http://");
    let form = format!("query={}", encode(q));
    let get = format!("GET /api/v1/query?{form} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let post = format!(
        "POST /api/v1/query HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
        form.len()
    );
    for (how, request) in [("GET", get), ("POST", post)] {
        let code = raw_status(addr, request.as_bytes()).unwrap_or_else(|e| panic!("{base}: {what} by {how}: {e}"));
        assert!(code == 200 || (400..500).contains(&code), "{base}: {what} by {how}: status {code}");
    }
}

fn alive(base: &str, p: &mut Proc) {
    assert!(p.wait_exit(Duration::ZERO).is_none(), "{base} exited");
    let r = client().get(format!("{base}/api/v1/query?query=1")).send().expect("still serving");
    assert_eq!(r.status().as_u16(), 200);
}

#[test]
fn deep_queries_get_an_answer_or_a_4xx_and_a_long_or_chain_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let (mut e, edge_base, grpc) = edge(dir.path(), "a");
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let series: Vec<Series> = (0..3)
        .map(|g| {
            let labels = vec![("__name__".to_string(), "gpu_temp".to_string()), ("gpu".to_string(), g.to_string())];
            (labels, (0..20).map(|i| (now - 100_000 + i * 5_000, (40 + g) as f64)).collect())
        })
        .collect();
    remote_write_all(&edge_base, &series);
    let (mut g, global_base) =
        start_global(dir.path(), "global", &format!("stores: ['{grpc}']\nstore_timeout: 10s\n"), &[]);

    for (base, p) in [(&edge_base, &mut e), (&global_base, &mut g)] {
        for c in CONSTRUCTS {
            ask_both_ways(base, &deep(c, 100_000), &format!("{c} at depth 100000"));
            alive(base, p);
        }
        let chain = (0..1000).map(|i| format!("gpu_temp{{gpu=\"{}\"}}", i % 3)).collect::<Vec<_>>().join(" or ");
        // The global may not have heard from its store yet: asked again for a while.
        let mut v = serde_json::Value::Null;
        for _ in 0..40 {
            let r = client().post(format!("{base}/api/v1/query")).form(&[("query", chain.as_str())]).send().unwrap();
            assert_eq!(r.status().as_u16(), 200, "{base}: the 1000-term or chain");
            v = serde_json::from_str(&r.text().unwrap()).unwrap();
            if v["data"]["result"].as_array().map(|a| a.len()) == Some(3) {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        assert_eq!(v["data"]["result"].as_array().map(|a| a.len()), Some(3), "{base}: {v}");
    }
}
