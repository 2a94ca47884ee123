//! A differential check against Prometheus 2.42: the same generated samples are
//! remote-written into an edge and into Prometheus (its remote-write receiver), then several
//! hundred generated queries are asked of both, as instant queries at three times and as a
//! range query, and every answer must agree.
//!
//! The data is what a GPU fleet exposes: gauges, counters with resets, and classic latency
//! histograms (`le` buckets, `_sum`, `_count`) as inference servers export them, including
//! a pod restart, `le` values spelled in other float notations and a histogram whose buckets
//! are not monotonic. Samples sit 1.5 s off the 15 s grid the queries use, so no sample lies
//! on a window boundary: there Prometheus 3 (left-open windows, which Strata follows) and
//! 2.42 (closed windows) would differ by design.
//!
//! Values are compared with a relative tolerance of 1e-9: Prometheus 3 sums with Kahan
//! compensation and 2.42 does not, which moves the last bits of some sums and averages.

use crate::common::*;
use prost::Message;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;
use strata_proto::prometheus::{Label, Sample, TimeSeries, WriteRequest};

const SCRAPE_MS: i64 = 15_000;
/// Samples are this far past the grid the queries use.
const OFFSET_MS: i64 = 1_500;
const SPAN_MS: i64 = 2 * 3600 * 1000;
const BUCKETS: [&str; 9] = ["0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"];
/// The same bounds in other spellings Go's float parser accepts.
const BUCKETS_SPELLED: [&str; 9] = ["5e-2", "0.10", "2.5e-1", "0.500", "1.0", "2.50", "5e0", "1e1", "+inf"];

/// splitmix64: a small deterministic generator, so both databases get identical data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub(crate) type Series = (Vec<(String, String)>, Vec<(i64, f64)>);

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

/// Gauges, counters and classic histograms over `SPAN_MS` ending at `end`.
fn fleet(end: i64) -> Vec<Series> {
    let mut rng = Rng(42);
    let times: Vec<i64> = (0..SPAN_MS / SCRAPE_MS).map(|k| end - SPAN_MS + k * SCRAPE_MS + OFFSET_MS).collect();
    let mut out = Vec::new();
    for node in 0..4 {
        for gpu in 0..4 {
            let (node, gpu) = (node.to_string(), gpu.to_string());
            let mut util = 50.0;
            let mut energy = 1_000.0 * rng.unit();
            let reset_at = if gpu == "1" { Some(times.len() / 2 + node.len() * 7) } else { None };
            let (mut u, mut e) = (Vec::new(), Vec::new());
            for (k, &t) in times.iter().enumerate() {
                util = (util + (rng.unit() - 0.5) * 20.0).clamp(0.0, 100.0);
                u.push((t, (util * 100.0).round() / 100.0));
                energy = if Some(k) == reset_at { 3.0 } else { energy + (200.0 + 100.0 * rng.unit()).round() };
                e.push((t, energy));
            }
            // A reading the exporter could not take now and then: NaN (Prometheus sorts NaNs
            // before every number for a quantile).
            if node == "0" {
                let g: usize = gpu.parse().unwrap_or(0);
                let power = u.iter().enumerate().map(|(k, &(t, v))| (t, if k % 5 == g { f64::NAN } else { v * 3.0 }));
                out.push((labels(&[("__name__", "gpu_power"), ("node", &node), ("gpu", &gpu)]), power.collect()));
            }
            out.push((labels(&[("__name__", "gpu_util"), ("node", &node), ("gpu", &gpu)]), u));
            out.push((labels(&[("__name__", "gpu_energy_joules_total"), ("node", &node), ("gpu", &gpu)]), e));
        }
    }
    for (model, bounds) in [("llama", BUCKETS), ("mistral", BUCKETS_SPELLED), ("broken", BUCKETS)] {
        for pod in 0..3 {
            let pod = pod.to_string();
            let mut counts = [0.0f64; 9];
            let (mut sum, mut count) = (0.0, 0.0);
            let mut series: Vec<Vec<(i64, f64)>> = vec![Vec::new(); 11];
            for (k, &t) in times.iter().enumerate() {
                if model == "llama" && pod == "2" && k == times.len() / 3 {
                    // The pod restarted: every counter starts again.
                    counts = [0.0; 9];
                    (sum, count) = (0.0, 0.0);
                }
                for _ in 0..(rng.next() % 20) {
                    // Latencies spread over the buckets, a long tail past the last bound.
                    let x = 0.02 * (rng.unit() * 7.5).exp();
                    sum += x;
                    count += 1.0;
                    let first = BUCKETS[..8].iter().position(|b| x <= b.parse::<f64>().unwrap_or(f64::INFINITY));
                    for c in counts.iter_mut().skip(first.unwrap_or(8)) {
                        *c += 1.0;
                    }
                }
                for (b, c) in counts.iter().enumerate() {
                    // The broken exporter sometimes reports a bucket below the one before it.
                    let dip = model == "broken" && b == 4 && k % 7 == 3;
                    series[b].push((t, if dip { (c - 3.0).max(0.0) } else { *c }));
                }
                series[9].push((t, (sum * 1e6).round() / 1e6));
                series[10].push((t, count));
            }
            for (b, samples) in series.into_iter().enumerate() {
                let l = match b {
                    9 => labels(&[("__name__", "request_duration_seconds_sum"), ("model", model), ("pod", &pod)]),
                    10 => labels(&[("__name__", "request_duration_seconds_count"), ("model", model), ("pod", &pod)]),
                    _ => labels(&[
                        ("__name__", "request_duration_seconds_bucket"),
                        ("model", model),
                        ("pod", &pod),
                        ("le", bounds[b]),
                    ]),
                };
                out.push((l, samples));
            }
        }
    }
    out
}

/// Remote-writes every sample of `series` to the edge at `base` in one request; the edge
/// must acknowledge it.
pub(crate) fn remote_write_all(base: &str, series: &[Series]) {
    let resp = client()
        .post(format!("{base}/api/v1/write"))
        .header("Content-Encoding", "snappy")
        .header("Content-Type", "application/x-protobuf")
        .body(write_body(series, i64::MIN, i64::MAX))
        .send()
        .unwrap_or_else(|e| panic!("remote write to {base}: {e}"));
    assert!(resp.status().is_success(), "remote write to {base}: {}", resp.text().unwrap_or_default());
}

/// Remote-write bodies holding every series' samples in `[from, to)`, so that both databases
/// receive the data in time order (Prometheus refuses samples far behind its newest).
pub(crate) fn write_body(series: &[Series], from: i64, to: i64) -> Vec<u8> {
    let timeseries = series
        .iter()
        .map(|(l, s)| TimeSeries {
            labels: l.iter().map(|(n, v)| Label { name: n.clone(), value: v.clone() }).collect(),
            samples: s
                .iter()
                .filter(|(t, _)| (from..to).contains(t))
                .map(|&(timestamp, value)| Sample { value, timestamp })
                .collect(),
            exemplars: vec![],
        })
        .collect();
    let req = WriteRequest { timeseries, ..Default::default() };
    snap::raw::Encoder::new().compress_vec(&req.encode_to_vec()).expect("snappy")
}

fn queries() -> Vec<String> {
    let mut q: Vec<String> = Vec::new();
    let ranges = ["1m", "5m", "15m"];
    // Gauges: selectors, arithmetic, comparisons, math functions.
    for e in [
        "gpu_util",
        "gpu_util * 2 + 1",
        "-gpu_util",
        "gpu_util > 50",
        "gpu_util > bool 50",
        "gpu_util % 7",
        "gpu_util ^ 0.5",
        "abs(gpu_util - 50)",
        "ceil(gpu_util)",
        "floor(gpu_util)",
        "round(gpu_util, 5)",
        "clamp(gpu_util, 20, 80)",
        "clamp_min(gpu_util, 30)",
        "clamp_max(gpu_util, 30)",
        "sqrt(gpu_util)",
        "ln(gpu_util + 1)",
        "log2(gpu_util + 1)",
        "timestamp(gpu_util)",
        "label_replace(gpu_util, \"host\", \"node-$1\", \"node\", \"(.*)\")",
        "label_join(gpu_util, \"id\", \"/\", \"node\", \"gpu\")",
        "gpu_util{node=~\"[01]\", gpu!=\"3\"}",
        "scalar(sum(gpu_util))",
        "time() - timestamp(gpu_util)",
        "vector(1) + on() group_left sum(gpu_util)",
        "absent(nonexistent_metric)",
    ] {
        q.push(e.to_string());
    }
    // Aggregations, by and without.
    for op in ["sum", "avg", "min", "max", "count", "stddev", "stdvar", "group"] {
        for g in ["", " by (node)", " by (gpu)", " without (gpu)"] {
            q.push(format!("{op}{g} (gpu_util)"));
        }
    }
    for e in [
        "quantile(0.9, gpu_util)",
        "quantile(0, gpu_power)",
        "quantile(0.5, gpu_power)",
        "quantile(1, gpu_power)",
        "quantile_over_time(0, gpu_power[1m])",
        "quantile_over_time(0.9, gpu_power[5m])",
        "quantile by (node) (0.25, gpu_util)",
        "topk(3, gpu_util)",
        "bottomk by (node) (1, gpu_util)",
        "count_values(\"v\", ceil(gpu_util / 10))",
    ] {
        q.push(e.to_string());
    }
    // Range functions over the gauge.
    for f in [
        "avg_over_time",
        "min_over_time",
        "max_over_time",
        "sum_over_time",
        "count_over_time",
        "last_over_time",
        "stddev_over_time",
        "stdvar_over_time",
        "changes",
        "delta",
        "idelta",
        "deriv",
        "resets",
        "present_over_time",
    ] {
        for r in ranges {
            q.push(format!("{f}(gpu_util[{r}])"));
        }
    }
    for r in ranges {
        q.push(format!("quantile_over_time(0.75, gpu_util[{r}])"));
        q.push(format!("predict_linear(gpu_util[{r}], 600)"));
        q.push(format!("absent_over_time(nonexistent_metric[{r}])"));
    }
    // Counters, with resets.
    for f in ["rate", "increase", "irate", "resets"] {
        for r in ranges {
            q.push(format!("{f}(gpu_energy_joules_total[{r}])"));
            q.push(format!("sum by (node) ({f}(gpu_energy_joules_total[{r}]))"));
        }
    }
    for e in [
        "rate(gpu_energy_joules_total[5m]) / on(node, gpu) gpu_util",
        "rate(gpu_energy_joules_total[5m]) * on(node) group_left sum by (node) (gpu_util)",
        // Subquery ranges that are not a multiple of their step: a grid point on the
        // window's start is in 2.42's closed window and out of Prometheus 3's open one.
        "max_over_time(rate(gpu_energy_joules_total[1m])[10m7s:1m])",
        "avg_over_time(sum by (node) (gpu_util)[15m7s:30s])",
        "min_over_time((gpu_util > 50)[5m13s:20s])",
        "gpu_energy_joules_total offset 10m",
        "rate(gpu_energy_joules_total[5m] offset 5m)",
        "gpu_util and on(node) (gpu_util > 60)",
        "gpu_util unless on(gpu) (gpu_util > 60)",
        "gpu_util > 90 or gpu_util < 10",
        "sort(gpu_util)",
        "sort_desc(sum by (node) (gpu_util))",
        "sgn(gpu_util - 50)",
        "exp(gpu_util / 100)",
        "log10(gpu_util + 1)",
        "minute(timestamp(gpu_util))",
        "hour()",
        "day_of_week()",
        "days_in_month()",
    ] {
        q.push(e.to_string());
    }
    // Classic histograms: quantiles over rates and over raw buckets, per model and pod,
    // quantiles outside [0, 1], odd `le` spellings, buckets that are not monotonic.
    for phi in ["0", "0.5", "0.9", "0.99", "1", "-0.5", "1.5"] {
        for r in ranges {
            q.push(format!("histogram_quantile({phi}, sum by (le) (rate(request_duration_seconds_bucket[{r}])))"));
        }
        q.push(format!("histogram_quantile({phi}, sum by (le, model) (rate(request_duration_seconds_bucket[5m])))"));
        q.push(format!("histogram_quantile({phi}, rate(request_duration_seconds_bucket[5m]))"));
        q.push(format!("histogram_quantile({phi}, request_duration_seconds_bucket)"));
    }
    for model in ["llama", "mistral", "broken"] {
        q.push(format!(
            "histogram_quantile(0.9, sum by (le, pod) (increase(request_duration_seconds_bucket{{model=\"{model}\"}}[15m])))"
        ));
        q.push(format!("histogram_quantile(0.5, request_duration_seconds_bucket{{model=\"{model}\", le!=\"+Inf\"}})"));
    }
    for e in [
        "sum by (model) (rate(request_duration_seconds_sum[5m])) / sum by (model) (rate(request_duration_seconds_count[5m]))",
        "rate(request_duration_seconds_count[1m])",
        "sum by (le) (request_duration_seconds_bucket)",
        "request_duration_seconds_bucket{le=\"+Inf\"} - on(model, pod) request_duration_seconds_count",
        "histogram_quantile(0.9, sum by (le, model) (rate(request_duration_seconds_bucket[5m]))) > 1",
        "max_over_time(histogram_quantile(0.99, sum by (le) (rate(request_duration_seconds_bucket[1m])))[10m:1m])",
    ] {
        q.push(e.to_string());
    }
    q
}

/// One answer, comparable: each series' labels with its (time, value) points, sorted.
type Answer = BTreeMap<BTreeMap<String, String>, Vec<(i64, f64)>>;

fn ask(c: &reqwest::blocking::Client, base: &str, path: &str, form: &[(&str, String)]) -> Result<Answer, String> {
    let resp = c.post(format!("{base}{path}")).form(form).send().map_err(|e| e.to_string())?;
    let text = resp.text().map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
    if v["status"] != "success" {
        return Err(format!("{}: {}", v["errorType"], v["error"]));
    }
    let point = |p: &Value| -> (i64, f64) {
        let t = (p[0].as_f64().unwrap_or(f64::NAN) * 1000.0).round() as i64;
        let x = p[1].as_str().and_then(|s| s.parse::<f64>().ok()).unwrap_or(f64::NAN);
        (t, x)
    };
    let data = &v["data"];
    let mut out = Answer::new();
    match data["resultType"].as_str() {
        Some("scalar") => {
            out.insert(BTreeMap::new(), vec![point(&data["result"])]);
        }
        _ => {
            for s in data["result"].as_array().cloned().unwrap_or_default() {
                let l = s["metric"]
                    .as_object()
                    .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
                    .unwrap_or_default();
                let pts = match s.get("values") {
                    Some(vs) => vs.as_array().map(|a| a.iter().map(point).collect()).unwrap_or_default(),
                    None => vec![point(&s["value"])],
                };
                out.insert(l, pts);
            }
        }
    }
    Ok(out)
}

fn close(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// `None` when the answers agree, else what differs.
fn differ(prom: &Answer, strata: &Answer) -> Option<String> {
    if prom.keys().ne(strata.keys()) {
        let only_p: Vec<_> = prom.keys().filter(|k| !strata.contains_key(*k)).take(2).collect();
        let only_s: Vec<_> = strata.keys().filter(|k| !prom.contains_key(*k)).take(2).collect();
        return Some(format!("series differ: only Prometheus {only_p:?}, only Strata {only_s:?}"));
    }
    for (l, p) in prom {
        let s = &strata[l];
        if p.len() != s.len() || p.iter().zip(s).any(|(a, b)| a.0 != b.0 || !close(a.1, b.1)) {
            let first = p.iter().zip(s).find(|(a, b)| a.0 != b.0 || !close(a.1, b.1));
            return Some(format!("{l:?}: {} vs {} points, first difference {first:?}", p.len(), s.len()));
        }
    }
    None
}

/// An edge and Prometheus 2.42, each given the same fleet by remote write.
struct Pair {
    _dir: tempfile::TempDir,
    edge: Proc,
    prom: Proc,
    edge_base: String,
    prom_base: String,
    /// The data's last sample time (ms).
    end: i64,
}

fn pair_with_fleet() -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let (edge_port, prom_port) = (free_port(), free_port());
    let cfg = dir.path().join("edge.yml");
    std::fs::write(&cfg, "scrape_configs: []\n").unwrap();
    let (cfg, data) = (cfg.display().to_string(), dir.path().join("edge-data").display().to_string());
    let listen = format!("127.0.0.1:{edge_port}");
    let mut edge =
        Proc::strata(&["edge", "--config", &cfg, "--data", &data, "--http-listen", &listen], dir.path(), "edge");
    let prom_cfg = dir.path().join("prometheus.yml");
    std::fs::write(&prom_cfg, "global: {}\n").unwrap();
    let prom_args: Vec<String> = vec![
        format!("--config.file={}", prom_cfg.display()),
        format!("--storage.tsdb.path={}", dir.path().join("prom-data").display()),
        format!("--web.listen-address=127.0.0.1:{prom_port}"),
        "--web.enable-remote-write-receiver".to_string(),
    ];
    let mut prom = Proc::start("prometheus", &prom_args, dir.path(), "prometheus");
    let (edge_base, prom_base) = (format!("http://127.0.0.1:{edge_port}"), format!("http://127.0.0.1:{prom_port}"));
    wait_ready(&format!("{edge_base}/-/ready"), &mut edge, Duration::from_secs(30));
    wait_ready(&format!("{prom_base}/-/ready"), &mut prom, Duration::from_secs(60));

    // The data ends two minutes before a whole minute, well inside both databases' head.
    let end = (now_ms() / 60_000) * 60_000 - 120_000;
    let series = fleet(end);
    let c = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let slice = 10 * 60_000;
    let mut from = end - SPAN_MS;
    while from < end + OFFSET_MS {
        let body = write_body(&series, from, from + slice);
        for base in [&edge_base, &prom_base] {
            let resp = c
                .post(format!("{base}/api/v1/write"))
                .header("Content-Encoding", "snappy")
                .header("Content-Type", "application/x-protobuf")
                .header("X-Prometheus-Remote-Write-Version", "0.1.0")
                .body(body.clone())
                .send()
                .unwrap_or_else(|e| panic!("remote write to {base}: {e}"));
            assert!(resp.status().is_success(), "remote write to {base}: {}", resp.text().unwrap_or_default());
        }
        from += slice;
    }
    Pair { _dir: dir, edge, prom, edge_base, prom_base, end }
}

#[test]
fn strata_answers_generated_queries_as_prometheus_2_42() {
    if !require_prometheus() {
        return;
    }
    let Pair { _dir, mut edge, mut prom, edge_base, prom_base, end } = pair_with_fleet();
    let c = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let secs = |ms: i64| format!("{:.3}", ms as f64 / 1000.0);
    let instants = [end - 45 * 60_000, end - 20 * 60_000, end];
    let (mut asked, mut differing, mut both_failed) = (0, Vec::new(), 0);
    // Answers with no series, and histogram_quantile answers with a number: agreeing on
    // nothing would prove nothing.
    let (mut empty, mut quantiles) = (0, 0);
    let queries = queries();
    for q in &queries {
        let mut forms: Vec<(&str, Vec<(&str, String)>)> =
            instants.iter().map(|&t| ("/api/v1/query", vec![("query", q.clone()), ("time", secs(t))])).collect();
        forms.push((
            "/api/v1/query_range",
            vec![
                ("query", q.clone()),
                ("start", secs(end - 60 * 60_000)),
                ("end", secs(end)),
                ("step", "60".to_string()),
            ],
        ));
        for (path, form) in forms {
            asked += 1;
            match (ask(&c, &prom_base, path, &form), ask(&c, &edge_base, path, &form)) {
                (Ok(p), Ok(s)) => {
                    empty += usize::from(p.is_empty());
                    if q.starts_with("histogram_quantile") && p.values().flatten().any(|x| x.1.is_finite()) {
                        quantiles += 1;
                    }
                    if let Some(d) = differ(&p, &s) {
                        differing.push(format!("{path} {form:?}: {d}"));
                    }
                }
                (Err(_), Err(_)) => both_failed += 1,
                (p, s) => differing.push(format!("{path} {form:?}: Prometheus {:?}, Strata {:?}", p.err(), s.err())),
            }
        }
    }
    println!(
        "differential check: {} queries, {asked} answers compared, {} differ, {both_failed} failed on both, \
         {empty} empty, {quantiles} histogram_quantile answers with finite quantiles",
        queries.len(),
        differing.len()
    );
    for d in differing.iter().take(10) {
        println!("DIFFERS: {d}");
    }
    assert!(queries.len() >= 200, "only {} queries generated", queries.len());
    assert_eq!(both_failed, 0, "queries meant to answer failed on both sides");
    assert!(empty * 20 <= asked, "{empty} of {asked} answers are empty");
    assert!(quantiles >= 100, "only {quantiles} histogram_quantile answers hold a finite quantile");
    assert!(differing.is_empty(), "{} of {asked} answers differ from Prometheus 2.42", differing.len());
    edge.terminate();
    prom.terminate();
}

/// One raw request: method, path with query string, form body.
struct Req {
    method: &'static str,
    target: String,
    body: Option<String>,
    origin: bool,
}

fn get(target: String) -> Req {
    Req { method: "GET", target, body: None, origin: false }
}

/// What a client sees of an answer: the status, the CORS headers, and the body (JSON
/// results sorted by their labels, so evaluation order does not count).
fn fetch(c: &reqwest::blocking::Client, base: &str, r: &Req) -> (u16, Option<String>, Value) {
    let url = format!("{base}{}", r.target);
    let mut b = match r.method {
        "POST" => c.post(&url),
        "OPTIONS" => c.request(reqwest::Method::OPTIONS, &url),
        _ => c.get(&url),
    };
    if let Some(body) = &r.body {
        b = b.header("Content-Type", "application/x-www-form-urlencoded").body(body.clone());
    }
    if r.origin {
        b = b.header("Origin", "http://grafana.example");
    }
    let resp = b.send().unwrap_or_else(|e| panic!("{url}: {e}"));
    let code = resp.status().as_u16();
    let cors = resp.headers().get("access-control-allow-origin").map(|v| v.to_str().unwrap_or("").to_string());
    let text = resp.text().unwrap_or_default();
    let mut v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if let Some(result) = v.pointer_mut("/data/result").and_then(Value::as_array_mut) {
        result.sort_by_key(|s| s["metric"].to_string());
    }
    if let Some(list) = v.pointer_mut("/data").and_then(Value::as_array_mut) {
        list.sort_by_key(|x| x.to_string());
    }
    (code, cors, v)
}

/// The API itself, beside the queries: the requests of the edge review (issue 20, items
/// 17-25) and ordinary ones, sent to an edge and to Prometheus 2.42 over the same data,
/// the answers compared field by field. Where Strata follows Prometheus 3 and 2.42 answers
/// otherwise, the difference is listed with its reason; any other difference fails.
#[test]
fn the_api_answers_as_prometheus_2_42_apart_from_its_3_x_changes() {
    if !require_prometheus() {
        return;
    }
    let Pair { _dir, mut edge, mut prom, edge_base, prom_base, end } = pair_with_fleet();
    let c = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let t = |ms: i64| format!("{}.{:03}", ms / 1000, ms % 1000);
    let sel = "gpu_util%7Bnode%3D%220%22%7D";
    let (min, max) = ("-9223309901257974", "9223309901257974");
    let reqs: Vec<(&str, Req)> = vec![
        ("a tiny value", get(format!("/api/v1/query?query=vector(1e-7)&time={}", t(end)))),
        ("a huge value", get(format!("/api/v1/query?query=vector(1e21)&time={}", t(end)))),
        ("a long value", get(format!("/api/v1/query?query=vector(1.2345678901234569e23)&time={}", t(end)))),
        ("the smallest value", get(format!("/api/v1/query?query=vector(5e-324)&time={}", t(end)))),
        ("a scalar NaN", get(format!("/api/v1/query?query=NaN&time={}", t(end)))),
        ("a whole-second time", get(format!("/api/v1/query?query={sel}&time={}", end / 1000))),
        ("a fractional time", get(format!("/api/v1/query?query={sel}&time={}", t(end - 500)))),
        ("a range", get(format!("/api/v1/query_range?query={sel}&start={}&end={}&step=60", t(end - 600_000), t(end)))),
        ("11,000 points", get("/api/v1/query_range?query=1&start=0&end=11000&step=1".into())),
        ("11,001 points", get("/api/v1/query_range?query=1&start=0&end=11001&step=1".into())),
        ("series at the boundary times", get(format!("/api/v1/series?match[]={sel}&start={min}&end={max}"))),
        ("labels at the boundary times", get(format!("/api/v1/labels?start={min}&end={max}"))),
        ("values at the boundary times", get(format!("/api/v1/label/gpu/values?start={min}&end={max}"))),
        ("series with end before start", get(format!("/api/v1/series?match[]={sel}&start=200&end=100"))),
        ("labels with end before start", get("/api/v1/labels?start=200&end=100".into())),
        ("metadata limit=0", get("/api/v1/metadata?limit=0".into())),
        ("metadata limit=-1", get("/api/v1/metadata?limit=-1".into())),
        ("metadata limit_per_metric", get("/api/v1/metadata?limit_per_metric=1".into())),
        (
            "a POST with the parameter in the body and the URL",
            Req {
                method: "POST",
                target: format!("/api/v1/query?query=1&time={}", end / 1000),
                body: Some("query=2".into()),
                origin: false,
            },
        ),
        ("a preflight", Req { method: "OPTIONS", target: "/api/v1/query".into(), body: None, origin: true }),
        (
            "a query from a browser",
            Req {
                method: "GET",
                target: format!("/api/v1/query?query=1&time={}", end / 1000),
                body: None,
                origin: true,
            },
        ),
        ("an unknown path", get("/api/v1/nope".into())),
        ("exemplars", get(format!("/api/v1/query_exemplars?query={sel}&start={}&end={}", end / 1000 - 60, end / 1000))),
        ("an expired timeout", get(format!("/api/v1/query?query=1&time={}&timeout=0.0001", end / 1000))),
        ("a negative timeout", get(format!("/api/v1/query?query=1&time={}&timeout=-1", end / 1000))),
        ("a bad parameter", get("/api/v1/query?query=1&time=yesterday".into())),
        ("a bad query", get("/api/v1/query?query=sum(".into())),
        ("limit on a query", get(format!("/api/v1/query?query=gpu_util&time={}&limit=2", end / 1000))),
        ("lookback_delta", get(format!("/api/v1/query?query={sel}&time={}&lookback_delta=1s", end / 1000 + 10))),
        ("build information", get("/api/v1/status/buildinfo".into())),
    ];
    // Where 2.42 and 3.x differ and Strata answers as 3.x does, and the one limitation.
    let known: BTreeMap<&str, &str> = BTreeMap::from([
        ("limit on a query", "Prometheus 3.2 added `limit` on queries; 2.42 ignores it"),
        ("lookback_delta", "Prometheus 3 added `lookback_delta`; 2.42 ignores it"),
        ("build information", "Strata reports the Prometheus 3 API it implements, and its own version and build"),
        ("an unknown path", "2.42 redirects or serves its UI; 3.x and Strata answer 404 page not found"),
        (
            "an expired timeout",
            "2.42 runs the query when it fits in 100 µs; 3.x (as the edge review measured it) and Strata \
             answer 503 for a timeout under half a millisecond",
        ),
        (
            "a bad query",
            "not 3.x: the parser Strata uses reports no position, so the message lacks Prometheus' `1:5: parse error: `",
        ),
    ]);
    let (mut same, mut listed, mut unexpected) = (0, Vec::new(), Vec::new());
    for (what, r) in &reqs {
        let (mut p, mut s) = (fetch(&c, &prom_base, r), fetch(&c, &edge_base, r));
        if *what == "a negative timeout" {
            // Prometheus names whichever stage noticed the deadline (queue or execution).
            for v in [&mut p.2, &mut s.2] {
                if let Some(m) = v.as_object_mut() {
                    m.remove("error");
                }
            }
        }
        if p == s {
            same += 1;
            continue;
        }
        let d = format!("{what} ({} {}): Prometheus {p:?}\n    Strata {s:?}", r.method, r.target);
        match known.get(what) {
            Some(why) => listed.push(format!("{what}: {why}")),
            None => unexpected.push(d),
        }
    }
    println!("API differential: {} requests, {same} answered alike, {} known differences", reqs.len(), listed.len());
    for l in &listed {
        println!("KNOWN: {l}");
    }
    for d in &unexpected {
        println!("DIFFERS: {d}");
    }
    assert!(
        unexpected.is_empty(),
        "{} answers differ from Prometheus 2.42:\n{}",
        unexpected.len(),
        unexpected.join("\n")
    );
    edge.terminate();
    prom.terminate();
}
