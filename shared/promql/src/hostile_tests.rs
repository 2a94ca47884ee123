//! Queries a hostile client can send: each must answer or fail with a clear error within
//! the deadline, never panic, abort on allocation or hang. The issue that found them:
//! `max_over_time(vector(1)[100y:1ms])` asked for 25 TB and killed the process.

use crate::{Engine, EngineOptions, QueryError};
use std::time::{Duration, Instant};
use strata_model::{Labels, MetricType, Sample};
use strata_store::memory::MemoryStore;

fn store() -> MemoryStore {
    let mut m = MemoryStore::default();
    for gpu in 0..4 {
        let labels = Labels::from_pairs([("__name__", "up".to_string()), ("gpu", gpu.to_string())]);
        m.add(labels, MetricType::Gauge, (0..200).map(|i| Sample::new(i * 15_000, i as f64)));
    }
    m
}

fn run(q: &str, timeout: Duration) -> Result<(), QueryError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let engine = Engine::new(EngineOptions { timeout, ..Default::default() });
    let expr = crate::parse(q).map_err(|e| QueryError::BadData(e.to_string()))?;
    let s = store();
    rt.block_on(async {
        engine.range(&s, &expr, 0, 3_000_000, 15_000).await?;
        engine.instant(&s, &expr, 3_000_000).await.map(|_| ())
    })
}

#[test]
fn hostile_queries_get_an_error_not_a_crash() {
    let cases: &[(&str, &str)] = &[
        ("max_over_time(vector(1)[100y:1ms])", "too many samples"),
        ("sum_over_time(up[100y:1ms])", "too many samples"),
        ("max_over_time(max_over_time(vector(1)[1d:1ms])[1d:1ms])", "too many samples"),
        ("up[300y]", "out of range"),
        ("up offset 300y", "out of range"),
        ("up offset -300y", "out of range"),
        ("rate(up[5m] offset 290y)", ""),
        ("up @ 1e15", "out of range"),
        ("max_over_time(up[5m:300y])", "out of range"),
    ];
    for (q, want) in cases {
        let began = Instant::now();
        let r = run(q, Duration::from_secs(5));
        assert!(began.elapsed() < Duration::from_secs(10), "{q} took {:?}", began.elapsed());
        match r {
            Err(e) => assert!(e.to_string().contains(want), "{q}: {e} (wanted {want:?})"),
            Ok(()) => assert!(want.is_empty(), "{q} answered; wanted an error with {want:?}"),
        }
    }
}

#[test]
fn overflowing_durations_are_errors() {
    for q in [
        "up[1e20]",
        "up offset Inf",
        "up offset -1e300",
        "up[5m:1e20]",
        "up @ Inf",
        "up @ -1e300",
        "up[9223372036854775807ms]",
    ] {
        assert!(run(q, Duration::from_secs(5)).is_err(), "{q} was answered");
    }
}

/// Every construct that deepens a syntax tree, as a query of about `n` levels.
fn deep(construct: &str, n: usize) -> String {
    let wrap = |open: &str, close: &str| format!("{}up{}", open.repeat(n), close.repeat(n));
    let chain = |op: &str| vec!["up"; n + 1].join(op);
    match construct {
        "parentheses" => wrap("(", ")"),
        "calls" => wrap("abs(", ")"),
        "calls with arguments" => wrap("clamp(", ", 0, 1)"),
        "aggregations" => wrap("sum by (gpu) (", ")"),
        "aggregations with a parameter" => wrap("topk(2, ", ")"),
        "subqueries" => wrap("max_over_time(", "[1m:1m])"),
        "unary signs" => format!("{}up", "- ".repeat(n)),
        "sums" => chain(" + "),
        "powers" => chain(" ^ "),
        "comparisons" => chain(" > bool "),
        "or" => chain(" or "),
        "and" => chain(" and "),
        "unless" => chain(" unless "),
        "mixed" => wrap("-(abs(sum(", ") + 1))"),
        _ => unreachable!("{construct}"),
    }
}

const CONSTRUCTS: [&str; 14] = [
    "parentheses",
    "calls",
    "calls with arguments",
    "aggregations",
    "aggregations with a parameter",
    "subqueries",
    "unary signs",
    "sums",
    "powers",
    "comparisons",
    "or",
    "and",
    "unless",
    "mixed",
];

/// `f` on a thread with the stack of the binary's runtime threads, where the API parses,
/// checks, clones, plans and drops a query; a stack overflow there aborts the test binary.
fn on_worker_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let stack = crate::limits::CALLER_STACK;
    std::thread::Builder::new().stack_size(stack).spawn(f).expect("thread").join().expect("no panic")
}

#[test]
fn deep_nesting_is_refused_before_parsing() {
    for c in CONSTRUCTS {
        let q = deep(c, 100_000);
        let began = Instant::now();
        let r = on_worker_stack(move || run(&q, Duration::from_secs(5)).map_err(|e| e.to_string()));
        let e = r.expect_err(c);
        assert!(e.contains("levels deep") || e.contains("bytes long"), "{c}: {e}");
        assert!(began.elapsed() < Duration::from_secs(2), "{c}: refused after {:?}", began.elapsed());
    }
}

#[test]
fn the_deepest_accepted_query_of_every_construct_is_answered() {
    for c in CONSTRUCTS {
        // The deepest query of this construct the bound lets through.
        let (mut lo, mut hi) = (1, crate::limits::MAX_DEPTH);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            let q = deep(c, mid);
            let admitted = crate::nesting::bound(&q).is_some_and(|s| {
                s.depth <= crate::limits::MAX_DEPTH && s.tokens * s.depth <= crate::limits::MAX_PARSE_WORK
            });
            if admitted {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let q = deep(c, lo);
        let r = on_worker_stack(move || {
            let expr = crate::parse(&q).map_err(|e| e.to_string())?;
            let copy = expr.clone();
            drop(copy);
            run(&q, Duration::from_secs(30)).map_err(|e| e.to_string())
        });
        assert!(r.is_ok(), "{c} at {lo} levels: {r:?}");
    }
}

#[test]
fn a_thousand_term_or_chain_is_answered() {
    let q = (0..1000).map(|i| format!("up{{gpu=\"{}\"}}", i % 4)).collect::<Vec<_>>().join(" or ");
    on_worker_stack(move || run(&q, Duration::from_secs(30))).expect("answered");
}

/// A small deterministic generator of PromQL text, valid and not, for the property test.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[(self.next() % xs.len() as u64) as usize]
    }

    fn duration(&mut self) -> String {
        let n = match self.next() % 6 {
            0 => 0,
            1 => 1,
            2 => self.next() % 100,
            3 => self.next() % 100_000,
            4 => self.next(),
            _ => u64::MAX,
        };
        format!("{n}{}", self.pick(&["ms", "s", "m", "h", "d", "w", "y"]))
    }

    fn expr(&mut self, depth: u32) -> String {
        if depth == 0 {
            return match self.next() % 4 {
                0 => format!("{}", (self.next() % 1000) as f64 / 7.0),
                1 => self.pick(&["up", "up{gpu=\"1\"}", "up{gpu=~\".+\"}", "nosuch", "vector(1)"]).to_string(),
                2 => format!("up offset {}", self.duration()),
                _ => format!("up @ {}", (self.next() % 10_000) as i64 - 5000),
            };
        }
        let inner = self.expr(depth - 1);
        match self.next() % 10 {
            0 => format!(
                "{}({inner}[{}])",
                self.pick(&["rate", "increase", "max_over_time", "quantile_over_time(0.5,", "changes", "deriv"]),
                self.duration()
            )
            .replace(",(", ","),
            1 => format!(
                "{}_over_time(({inner})[{}:{}])",
                self.pick(&["avg", "sum", "count", "stddev", "last"]),
                self.duration(),
                self.duration()
            ),
            2 => format!("{} by (gpu) ({inner})", self.pick(&["sum", "max", "count", "stddev", "group"])),
            3 => format!("{}({}, {inner})", self.pick(&["topk", "bottomk", "quantile", "limitk"]), self.next() % 5),
            4 => format!(
                "({inner}) {} ({})",
                self.pick(&["+", "/", "%", "^", "and", "or", "unless", "> bool", "== on(gpu)"]),
                self.expr(depth - 1)
            ),
            5 => format!(
                "{}({inner})",
                self.pick(&["abs", "ln", "sqrt", "timestamp", "absent", "sort", "round", "clamp_min"])
            ),
            6 => format!("label_replace({inner}, \"x\", \"$1\", \"gpu\", \"(.*)\")"),
            7 => format!("-({inner})"),
            8 => format!("histogram_quantile(0.9, {inner})"),
            _ => format!("({inner})"),
        }
    }
}

#[test]
fn random_expressions_answer_or_fail_within_the_deadline() {
    let mut g = Gen(0x9e37_79b9_7f4a_7c15);
    let began = Instant::now();
    let (mut answered, mut refused) = (0, 0);
    for i in 0..2000 {
        if began.elapsed() > Duration::from_secs(60) {
            break;
        }
        let q = g.expr((i % 4) as u32);
        let t = Instant::now();
        match run(&q, Duration::from_secs(2)) {
            Ok(()) => answered += 1,
            Err(QueryError::Internal(e)) => panic!("{q}: evaluation panicked: {e}"),
            Err(_) => refused += 1,
        }
        assert!(t.elapsed() < Duration::from_secs(6), "{q} took {:?}", t.elapsed());
    }
    // The generator must exercise both paths, or the test proves nothing.
    assert!(answered > 20 && refused > 20, "answered {answered}, refused {refused}");
}

/// The review's quadratic parse: a thousand groups of 500 scalars summed passes the depth
/// bound but would cost the parser's type checks billions of steps; it is refused at once.
#[test]
fn a_wide_scalar_sum_is_refused_before_the_parser_walks_it() {
    let group = format!("({})", vec!["1"; 500].join("+"));
    let q = vec![group.as_str(); 900].join("+");
    let began = Instant::now();
    let e = crate::parse(&q).expect_err("refused");
    assert!(e.0.contains("too large to parse"), "{e}");
    assert!(began.elapsed() < Duration::from_secs(5), "{:?}", began.elapsed());
}

/// The sample limit is on what a query holds, as Prometheus' `--query.max-samples`: a range
/// function whose windows overlap reads each sample many times without holding more, and
/// is answered; a query that holds more is refused.
#[test]
fn the_sample_limit_counts_samples_held_not_samples_touched() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let engine = Engine::new(EngineOptions { max_samples: 2_000, ..Default::default() });
    let s = store();
    let query = |q: &str, step: i64| {
        let expr = crate::parse(q).expect("parses");
        rt.block_on(engine.range(&s, &expr, 0, 3_000_000, step))
    };
    // 800 samples fetched, 201 steps, each window 120 samples of 4 series: ~90,000 touched.
    match query("sum_over_time(up[30m])", 15_000).expect("answered") {
        crate::QueryValue::Matrix(m) => assert_eq!(m.len(), 4),
        other => panic!("not a matrix: {other:?}"),
    }
    // Every step held as points: 4 series × 3,001 steps is over 2,000.
    let err = query("up", 1_000).expect_err("refused");
    assert!(matches!(err, QueryError::TooManySamples(2_000)), "{err}");
}

/// The deadline is read after a call that touches many samples, not only every 256 calls:
/// a query whose windows are each a million samples long stops at its timeout.
#[test]
fn a_call_over_a_long_window_reads_the_clock() {
    let data = crate::fetch::Fetched::default();
    let past = Instant::now();
    let ev = crate::eval::Evaluator::new(&data, 0, 0, 0, 300_000, u64::MAX).with_deadline(past, Duration::from_secs(1));
    std::thread::sleep(Duration::from_millis(2));
    assert!(ev.charge(10).is_ok(), "a small call is not worth the clock");
    let err = ev.charge(2_000_000).expect_err("past the deadline");
    assert!(matches!(err, QueryError::Timeout(_)), "{err}");
}
