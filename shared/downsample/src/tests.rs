//! Aggregates against the engine over the raw samples: every function the windows answer,
//! at aligned ranges, steps and offsets, over series made to break them (counter resets,
//! gaps, NaN, staleness markers, jittered and regular scrapes, values that are no short
//! decimal), through the encoding and back.

use super::*;
use strata_model::{stale_nan, Labels, MetricType, Sample};
use strata_promql::{Engine, EngineOptions, QueryValue};
use strata_store::memory::MemoryStore;
use strata_store::StepsRequest;

/// xorshift64*: reproducible without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, per_thousand: u64) -> bool {
        self.below(1000) < per_thousand
    }
}

#[derive(Clone, Copy, Debug)]
enum Shape {
    /// A counter with resets, scraped every 15 s with jitter.
    Counter,
    /// A three-decimal gauge, jittered.
    Gauge,
    /// Integers on an exact 5 s grid (samples on window boundaries).
    Regular,
    /// Gauges with NaN, infinities-free floats that are no short decimal, and markers.
    Rough,
}

fn series(shape: Shape, seed: u64, span: i64) -> Vec<Sample> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut out = Vec::new();
    let (step, jitter) = match shape {
        Shape::Regular => (5_000, 0),
        _ => (15_000, 40),
    };
    let mut t = 1_000_000_000_020 - 1_000_000_000_020 % step + step;
    let t_end = t + span;
    let mut counter = 1_000.0;
    let mut gauge = 60.0;
    while t < t_end {
        let at = t + rng.below(jitter.max(1) as u64) as i64;
        // A gap of a few minutes now and then.
        if rng.chance(8) {
            t += step * (4 + rng.below(40) as i64);
            continue;
        }
        let v = match shape {
            Shape::Counter => {
                counter = if rng.chance(15) { rng.below(50) as f64 } else { counter + rng.below(300) as f64 };
                counter
            }
            Shape::Gauge => {
                gauge += (rng.below(2001) as f64 - 1000.0) / 1000.0;
                (gauge * 1000.0f64).round() / 1000.0
            }
            Shape::Regular => (rng.below(5) * 20) as f64,
            Shape::Rough => {
                if rng.chance(30) {
                    f64::NAN
                } else {
                    gauge += (rng.below(2001) as f64 - 1000.0) / 7.0;
                    gauge
                }
            }
        };
        out.push(Sample::new(at, v));
        // A staleness marker, then a pause: the target went away for a while.
        if !matches!(shape, Shape::Counter) && rng.chance(10) {
            out.push(Sample::new(at + 1_000, stale_nan()));
            t += step * (2 + rng.below(30) as i64);
        }
        t += step;
    }
    out
}

/// Every range function a store evaluates: aggregates answer them all.
const FUNCTIONS: &[&str] = strata_promql::pushdown::RANGE_FUNCTIONS;

/// Functions whose answers must be the raw ones bit for bit.
fn bit_exact(name: &str) -> bool {
    matches!(
        name,
        "changes"
            | "resets"
            | "min_over_time"
            | "max_over_time"
            | "count_over_time"
            | "last_over_time"
            | "first_over_time"
            | "ts_of_first_over_time"
            | "ts_of_last_over_time"
            | "ts_of_min_over_time"
            | "ts_of_max_over_time"
            | "present_over_time"
            | "delta"
            | "idelta"
            | "irate"
            | "x"
    )
}

fn same(name: &str, a: f64, b: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    if bit_exact(name) {
        return a.to_bits() == b.to_bits();
    }
    if a == b {
        return true;
    }
    // Sums from windows agree to rounding; a least-squares slope loses what the raw
    // evaluation's own Σxy − ΣxΣy/n cancels, so it is held to its conditioning.
    let tolerance = if matches!(name, "deriv" | "predict_linear") { 1e-9 } else { 1e-12 };
    (a - b).abs() <= tolerance * a.abs().max(b.abs())
}

fn engine() -> Engine {
    Engine::new(EngineOptions { pushdown: false, ..EngineOptions::default() })
}

/// The raw answer of `query` on the grid, one value per step.
fn raw_answer(store: &MemoryStore, query: &str, grid: &Grid) -> Vec<Option<f64>> {
    let expr = strata_promql::parse(query).expect("parses");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let v = rt.block_on(engine().range(store, &expr, grid.start, grid.end, grid.step)).expect("evaluates");
    let mut out = vec![None; grid.steps().expect("steps")];
    let QueryValue::Matrix(m) = v else { panic!("a range query gives a matrix") };
    for s in m {
        for (t, v) in s.points {
            out[((t - grid.start) / grid.step) as usize] = Some(v);
        }
    }
    out
}

/// How many steps of every function, range and grid the windows answer differently from
/// the raw samples (listing the first few).
fn mismatches(raw: &[Sample], windows: &[Window], width: i64, kept: Kept) -> usize {
    mismatches_counted(raw, windows, None, width, kept, &mut 0)
}

/// With `encoded`, each leaf reads the windows decoded with only the columns it wants.
fn mismatches_counted(
    raw: &[Sample],
    windows: &[Window],
    encoded: Option<&[u8]>,
    width: i64,
    kept: Kept,
    compared: &mut usize,
) -> usize {
    let mut store = MemoryStore::default();
    store.add(Labels::from_pairs([("__name__", "x")]), MetricType::Unknown, raw.iter().copied());
    let first = window_end(raw[0].t, width);
    let last = window_end(raw[raw.len() - 1].t, width);
    let mut wrong = 0;
    for (step, offset, ranges) in [(width, 0, vec![1, 2, 3]), (2 * width, width, vec![1, 4])] {
        let grid = Grid { start: first + width, end: last + 2 * width, step, offset };
        let off = if offset == 0 { String::new() } else { format!(" offset {offset}ms") };
        let mut leaves: Vec<(String, String, Leaf)> =
            vec![("x".into(), format!("x{off}"), Leaf::Selector { lookback: 300_000 })];
        for name in FUNCTIONS {
            for r in &ranges {
                let range = r * width;
                let function = RangeFn::parse(name, None).expect("a function aggregates answer");
                leaves.push((name.to_string(), format!("{name}(x[{range}ms]{off})"), Leaf::Range { function, range }));
            }
        }
        let ahead = Leaf::Range { function: RangeFn::PredictLinear(600.0), range: 2 * width };
        leaves.push(("predict_linear".into(), format!("predict_linear(x[{}ms]{off}, 600)", 2 * width), ahead));
        for (name, query, leaf) in leaves {
            let want = raw_answer(&store, &query, &grid);
            let decoded =
                encoded.map(|b| encoding::decode_wanted(b, encoding::Wanted::for_leaf(&leaf)).expect("decodes").0);
            let got =
                evaluate(decoded.as_deref().unwrap_or(windows), kept, width, &leaf, &grid).expect("exact on this grid");
            // The columns a cache keeps answer as the windows do, bit for bit, whole and
            // as a part of them.
            let run: &[Window] = decoded.as_deref().unwrap_or(windows);
            let columns = WindowColumns::new(run);
            assert!((0..run.len()).all(|i| columns.window(i).same_bits(&run[i])), "{query}: columns lose a field");
            let bits = |v: &[Option<f64>]| v.iter().map(|x| x.map(f64::to_bits)).collect::<Vec<_>>();
            let by_columns = evaluate(&columns, kept, width, &leaf, &grid).expect("exact on this grid");
            assert_eq!(bits(&got), bits(&by_columns), "{query}: from columns");
            let part = columns::Part { of: &columns, range: 1.min(run.len())..run.len() };
            let by_part = evaluate(&part, kept, width, &leaf, &grid).expect("exact on this grid");
            let by_slice = evaluate(&run[1.min(run.len())..], kept, width, &leaf, &grid).expect("exact on this grid");
            assert_eq!(bits(&by_slice), bits(&by_part), "{query}: from a part of the columns");
            // What the regional's cache keeps of a chunk (only the fields the leaf's
            // columns fill), whole and as two blocks' runs put end to end, answers the same.
            if let Some(b) = encoded {
                let wanted = encoding::Wanted::for_leaf(&leaf);
                let (sparse, ..) = encoding::decode_columns(b, wanted).expect("decodes");
                let by_sparse = evaluate(&sparse, kept, width, &leaf, &grid).expect("exact on this grid");
                assert_eq!(bits(&got), bits(&by_sparse), "{query}: from the fields its columns fill");
                let half = sparse.ends().len() / 2;
                let joined = WindowColumns::concat(&[(&sparse, 0..half), (&sparse, half..sparse.ends().len())]);
                let by_joined = evaluate(&joined, kept, width, &leaf, &grid).expect("exact on this grid");
                assert_eq!(bits(&got), bits(&by_joined), "{query}: from two runs joined");
            }
            for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                let ok = match (w, g) {
                    (Some(a), Some(b)) => {
                        *compared += 1;
                        same(&name, *a, *b)
                    }
                    (None, None) => true,
                    _ => false,
                };
                if !ok {
                    if wrong < 5 {
                        eprintln!(
                            "{query} at step {i} (t={}): raw {w:?}, aggregates {g:?}",
                            grid.start + i as i64 * step
                        );
                    }
                    wrong += 1;
                }
            }
        }
    }
    wrong
}

fn round_trip(windows: &[Window], width: i64, kept: Kept) -> Vec<Window> {
    let bytes = encode(windows, width, kept);
    let (back, w, k) = decode(&bytes).expect("decodes");
    assert_eq!((w, k), (width, kept));
    back
}

#[test]
fn every_function_from_aggregates_equals_the_raw_answer() {
    let shapes = [Shape::Counter, Shape::Gauge, Shape::Regular, Shape::Rough];
    for (width, span) in [(FIVE_MINUTES, 4 * 3_600_000), (ONE_HOUR, 30 * 3_600_000)] {
        for (i, shape) in shapes.iter().enumerate() {
            for seed in 0..3 {
                let raw = series(*shape, seed * 10 + i as u64, span);
                let windows = round_trip(&windows_of(&raw, width), width, Kept::ALL);
                let bytes = encode(&windows, width, Kept::ALL);
                let mut compared = 0;
                let wrong = mismatches_counted(&raw, &windows, Some(&bytes), width, Kept::ALL, &mut compared);
                assert_eq!(wrong, 0, "{shape:?} seed {seed}, {width} ms windows: {wrong} steps differ");
                assert!(compared > 1_000, "{shape:?} seed {seed}: only {compared} values compared");
            }
        }
    }
}

#[test]
fn a_window_boundary_moved_by_a_millisecond_is_caught() {
    for (width, span) in [(FIVE_MINUTES, 3 * 3_600_000), (ONE_HOUR, 30 * 3_600_000)] {
        window_boundary_moved_is_caught(width, span);
    }
}

fn window_boundary_moved_is_caught(width: i64, span: i64) {
    // Samples on the exact 5 s grid fall on window ends: moving the boundary moves them.
    let raw = series(Shape::Regular, 7, span);
    let shifted: Vec<Window> = windows_of(&raw.iter().map(|s| Sample::new(s.t + 1, s.v)).collect::<Vec<_>>(), width)
        .into_iter()
        .map(|mut w| {
            // Stamped as if the windows were (kW, (k+1)W]: really they are one ms early.
            for s in [&mut w.first, &mut w.last] {
                s.t -= 1;
            }
            if let Some(p) = &mut w.penult {
                p.t -= 1;
            }
            w
        })
        .collect();
    assert!(mismatches(&raw, &shifted, width, Kept::ALL) > 0, "{width} ms windows");
}

#[test]
fn an_aggregate_dropped_is_caught() {
    let raw = series(Shape::Counter, 3, 4 * 3_600_000);
    let width = FIVE_MINUTES;
    let windows = windows_of(&raw, width);
    assert!(windows.iter().any(|w| w.correction > 0.0), "the test needs resets inside windows");
    let drop = |f: fn(&mut Window)| {
        let mut ws = windows.clone();
        ws.iter_mut().for_each(f);
        mismatches(&raw, &ws, width, Kept::ALL)
    };
    assert!(drop(|w| w.correction = 0.0) > 0, "the reset correction");
    assert!(drop(|w| w.penult = None) > 0, "the sample before the last");
    assert!(drop(|w| w.changes = 0) > 0, "changes");
    assert!(drop(|w| w.m2n = 0.0) > 0, "the moments");
    assert!(drop(|w| w.sxy = 0.0) > 0, "the least-squares sums");
}

/// Every aggregate a window keeps answers some function: losing any one of them (set to
/// what it would read as had it not been kept) changes an answer for some series shape.
#[test]
fn every_aggregate_dropped_is_caught() {
    let shapes = [Shape::Counter, Shape::Gauge, Shape::Regular, Shape::Rough];
    let width = FIVE_MINUTES;
    let mut raws: Vec<Vec<Sample>> =
        shapes.iter().enumerate().map(|(i, s)| series(*s, 40 + i as u64, 4 * 3_600_000)).collect();
    // A flat gauge with a NaN now and then: its windows' values are all equal but for the
    // NaN, which only `nan` tells (a constant's `deriv` is 0, with a NaN it is NaN).
    raws.push((1..960).map(|i| Sample::new(i * 15_000, if i % 13 == 0 { f64::NAN } else { 5.0 })).collect());
    let caught = |f: fn(&mut Window)| {
        raws.iter().any(|raw| {
            let mut ws = windows_of(raw, width);
            ws.iter_mut().for_each(f);
            mismatches(raw, &ws, width, Kept::ALL) > 0
        })
    };
    type Drop = (&'static str, fn(&mut Window));
    let drops: [Drop; 18] = [
        ("count", |w| w.count = 1),
        ("sum", |w| w.sum = 0.0),
        ("min", |w| w.min = w.max),
        ("max", |w| w.max = w.min),
        ("first", |w| w.first = w.last),
        ("last", |w| w.last = w.first),
        ("penult", |w| w.penult = None),
        ("stale", |w| w.stale = None),
        ("nan", |w| w.nan = false),
        ("m2n", |w| w.m2n = 0.0),
        ("changes", |w| w.changes = 0),
        ("resets", |w| w.resets = 0),
        ("correction", |w| w.correction = 0.0),
        ("sx", |w| w.sx = 0.0),
        ("sxx", |w| w.sxx = 0.0),
        ("sxy", |w| w.sxy = 0.0),
        ("min_t", |w| w.min_t = w.end),
        ("max_t", |w| w.max_t = w.end),
    ];
    for (name, f) in drops {
        assert!(caught(f), "dropping {name} changed no answer");
    }
}

#[test]
fn what_a_kind_does_not_keep_is_not_exact_and_alignment_is_required() {
    let grid = Grid { start: 600_000, end: 1_200_000, step: 300_000, offset: 0 };
    let rate = Leaf::Range { function: RangeFn::Rate, range: 300_000 };
    let stddev = Leaf::Range { function: RangeFn::StddevOverTime, range: 300_000 };
    let (gauge, counter) =
        (Kept::of(MetricType::Gauge, Asked::default()), Kept::of(MetricType::Counter, Asked::default()));
    assert!(matches!(check(&rate, &grid, FIVE_MINUTES, gauge), Err(NotExact::Missing(_))));
    assert!(matches!(check(&stddev, &grid, FIVE_MINUTES, counter), Err(NotExact::Missing(_))));
    // A chunk without the extremes' times (as every chunk written before they were kept)
    // reads, and says it has none.
    let raw: Vec<Sample> = (1..200).map(|k| Sample::new(k * 15_000, (k % 7) as f64)).collect();
    let without = round_trip(&windows_of(&raw, FIVE_MINUTES), FIVE_MINUTES, gauge);
    assert!(without.iter().all(|w| w.min_t == w.end && w.max_t == w.end));
    let deriv = Leaf::Range { function: RangeFn::Deriv, range: 300_000 };
    assert!(matches!(check(&deriv, &grid, FIVE_MINUTES, gauge), Err(NotExact::Missing(_))));
    assert!(check(
        &deriv,
        &grid,
        FIVE_MINUTES,
        Kept::of(MetricType::Gauge, Asked { least_squares: true, extreme_times: false })
    )
    .is_ok());
    assert!(check(&rate, &grid, FIVE_MINUTES, counter).is_ok());
    // The extremes' times only when asked for, for any type.
    let when_max = Leaf::Range { function: RangeFn::TsOfMaxOverTime, range: 300_000 };
    for t in [MetricType::Gauge, MetricType::Counter, MetricType::Unknown] {
        assert!(matches!(
            check(&when_max, &grid, FIVE_MINUTES, Kept::of(t, Asked::default())),
            Err(NotExact::Missing(_))
        ));
        let asked = Asked { least_squares: false, extreme_times: true };
        assert!(check(&when_max, &grid, FIVE_MINUTES, Kept::of(t, asked)).is_ok());
    }
    let unaligned = Grid { start: 600_001, ..grid };
    assert!(matches!(check(&rate, &unaligned, FIVE_MINUTES, Kept::ALL), Err(NotExact::Unaligned { .. })));
    let offset = Grid { offset: 60_000, ..grid };
    assert!(matches!(check(&rate, &offset, FIVE_MINUTES, Kept::ALL), Err(NotExact::Unaligned { .. })));
    // Grafana's $__rate_interval of 5m15s.
    let odd = Leaf::Range { function: RangeFn::Rate, range: 315_000 };
    assert!(matches!(check(&odd, &grid, FIVE_MINUTES, Kept::ALL), Err(NotExact::PartialWindows { .. })));
    assert!(matches!(check(&rate, &grid, ONE_HOUR, Kept::ALL), Err(NotExact::Unaligned { .. })));
    assert!(RangeFn::parse("quantile_over_time", None).is_none());
    assert!(RangeFn::parse("mad_over_time", None).is_none());
}

#[test]
fn damaged_chunks_are_errors_never_a_panic() {
    let raw = series(Shape::Rough, 1, 4 * 3_600_000);
    let bytes = encode(&windows_of(&raw, FIVE_MINUTES), FIVE_MINUTES, Kept::ALL);
    let mut rng = Rng(99);
    let mut refused = 0;
    for i in 0..2_000 {
        let mut b = bytes.clone();
        match i % 3 {
            0 => {
                let at = rng.below(b.len() as u64) as usize;
                b[at] ^= 1 << rng.below(8);
            }
            1 => b.truncate(rng.below(b.len() as u64) as usize),
            _ => {
                let at = rng.below(b.len() as u64) as usize;
                b[at] = rng.next() as u8;
            }
        }
        match decode(&b) {
            Err(_) => refused += 1,
            // A flipped bit may still decode: then the windows must still be well formed.
            Ok((ws, _, _)) => assert!(ws.windows(2).all(|p| p[0].end < p[1].end)),
        }
    }
    assert!(refused > 1_000, "only {refused} of 2000 damaged chunks refused");
    assert!(decode(&[VERSION_FOR_TESTS, 2, 0x80]).is_err());
    assert!(decode(&[]).is_err());
}

const VERSION_FOR_TESTS: u8 = 1;

#[test]
fn chunks_with_block_coded_columns_say_so_in_their_version() {
    // A day of 5 m windows of short decimals: the block coding for some columns, so
    // version 2, which a reader of version 1 refuses instead of misreading.
    let regular: Vec<Sample> = (1..=24 * 240).map(|i| Sample { t: i * 15_000, v: (i % 7) as f64 }).collect();
    let ws = windows_of(&regular, FIVE_MINUTES);
    let bytes = encode(&ws, FIVE_MINUTES, Kept::ALL);
    assert_eq!(bytes[0], 2);
    assert_eq!(decode(&bytes).unwrap().0, ws);
    // Too few windows for the block coding: every column streaming, version 1, as before.
    let few = encode(&ws[..4], FIVE_MINUTES, Kept::ALL);
    assert_eq!(few[0], 1);
    assert_eq!(decode(&few).unwrap().0, ws[..4].to_vec());
    let mut unknown = bytes.clone();
    unknown[0] = 3;
    assert!(decode(&unknown).is_err());
}

/// A grid whose step is longer than its range reads a few windows of each step's: the
/// answer from those alone ([`answer::Prepared::reads`]) is the answer from them all, bit
/// for bit, and leaving out one window it reads changes some answer.
#[test]
fn the_windows_a_sparse_grid_reads_answer_as_all_of_them() {
    let matchers = vec![strata_model::Matcher::new(strata_model::MatchOp::Equal, "__name__", "x").unwrap()];
    let mut sparse_seen = 0;
    for (width, span) in [(FIVE_MINUTES, 8 * 3_600_000), (ONE_HOUR, 72 * 3_600_000)] {
        for (i, shape) in [Shape::Counter, Shape::Gauge, Shape::Rough].iter().enumerate() {
            let raw = series(*shape, 7 + i as u64, span);
            let windows = windows_of(&raw, width);
            let first = window_end(raw[0].t, width);
            for (steps_of, offset) in [(3, 0), (12, 0), (4, width)] {
                let step = steps_of * width;
                let grid = (first + 2 * width, first + span, step);
                let mut leaves: Vec<StepsRequest> = vec![StepsRequest::new(matchers.clone(), grid, 300_000)];
                for name in FUNCTIONS {
                    for r in [1, 2] {
                        let mut req = StepsRequest::new(matchers.clone(), grid, 300_000);
                        req.function = Some((name.to_string(), r * width));
                        leaves.push(req);
                    }
                }
                for mut req in leaves {
                    req.offset = offset;
                    let p = answer::prepare(&req, width).expect("an exact grid");
                    let all: Vec<Window> =
                        windows.iter().filter(|w| w.end > p.from && w.end <= p.last).copied().collect();
                    let some: Vec<Window> = all.iter().filter(|w| p.reads(w.end)).copied().collect();
                    assert!(some.len() < all.len(), "{req:?}: every window read");
                    let s = || (Labels::from_pairs([("__name__", "x")]), MetricType::Counter, Kept::ALL);
                    let want = p.evaluate_windows(&req, s(), &all[..]).expect("evaluates").values;
                    let got = p.evaluate_windows(&req, s(), &some[..]).expect("evaluates").values;
                    let bits = |v: &strata_store::StepValues| -> Vec<Option<u64>> {
                        v.iter().map(|x| x.map(f64::to_bits)).collect()
                    };
                    assert_eq!(bits(&want), bits(&got), "{req:?}: sparse windows answer differently");
                    // One read window fewer: some step answers otherwise.
                    let missing: Vec<Window> = some.iter().skip(1).copied().collect();
                    let short = p.evaluate_windows(&req, s(), &missing[..]).expect("evaluates").values;
                    if bits(&short) != bits(&want) {
                        sparse_seen += 1;
                    }
                }
            }
        }
    }
    assert!(sparse_seen > 100, "leaving out a window that is read changed only {sparse_seen} answers");
}

/// [`answer::Prepared::reads_every_window`] holds exactly when no window between the
/// grid's first range and its last step is left unread, over steps and ranges of one to four windows.
#[test]
fn a_grid_reads_every_window_when_its_step_is_within_its_reach() {
    let matchers = vec![strata_model::Matcher::new(strata_model::MatchOp::Equal, "__name__", "x").unwrap()];
    let (mut dense, mut sparse) = (0, 0);
    for width in [FIVE_MINUTES, ONE_HOUR] {
        let first = 1_700_000_000_000i64.div_euclid(ONE_HOUR) * ONE_HOUR;
        for steps_of in 1..=4 {
            for ranges_of in 1..=4 {
                for offset in [0, width] {
                    let grid = (first + 8 * width, first + 40 * width, steps_of * width);
                    let mut req = StepsRequest::new(matchers.clone(), grid, 300_000);
                    req.function = Some(("sum_over_time".to_string(), ranges_of * width));
                    req.offset = offset;
                    let p = answer::prepare(&req, width).expect("an exact grid");
                    // Up to the last step: windows after it are never read.
                    let last_step = req.start + (p.steps as i64 - 1) * req.step - offset;
                    let every = (p.from / width + 1..=last_step / width).all(|k| p.reads(k * width));
                    assert_eq!(p.reads_every_window(), every, "{req:?}");
                    if every {
                        dense += 1;
                    } else {
                        sparse += 1;
                    }
                }
            }
        }
    }
    assert!(dense > 10 && sparse > 10, "{dense} dense grids, {sparse} sparse");
}
