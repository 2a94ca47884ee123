//! Runs Prometheus' PromQL test files (`promql/promqltest` format): `load`, `clear`,
//! `eval instant|range`, `eval_fail`, `eval_warn`, `eval_ordered`, against the engine over
//! a [`MemoryStore`]. Cases that need native histograms or features outside Prometheus'
//! stable set are skipped with their reason; everything else passes or fails.

use super::notation::{expand_values, parse_number, split_series};
use super::{Engine, EngineOptions, QueryValue};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use strata_model::duration::parse_duration_ms;
use strata_model::{Labels, MetricType, Sample};
use strata_store::memory::MemoryStore;

#[derive(Debug, Default)]
pub struct Report {
    /// How many `.test` files were read.
    pub files: usize,
    pub passed: usize,
    pub failed: Vec<String>,
    pub skipped: Vec<String>,
}

/// Where the test files are by default: `$PROMQL_TESTDATA`, else `../shared/promql-testdata`
/// from `base` (the project root).
pub fn default_dir(base: &Path) -> PathBuf {
    std::env::var_os("PROMQL_TESTDATA").map(PathBuf::from).unwrap_or_else(|| base.join("../shared/promql-testdata"))
}

/// Runs every `.test` file of `dir`, in name order.
pub fn run_dir(dir: &Path) -> std::io::Result<Report> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "test"))
        .collect();
    files.sort();
    let mut report = Report::default();
    for f in &files {
        let text = std::fs::read_to_string(f)?;
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        run_file(&name, &text, &mut report);
        report.files += 1;
    }
    Ok(report)
}

fn almost_equal(a: f64, b: f64) -> bool {
    if a.is_nan() && b.is_nan() {
        return true;
    }
    if a == b {
        return true;
    }
    let diff = (a - b).abs();
    let eps = 1e-6;
    if a == 0.0 || b == 0.0 || diff < f64::MIN_POSITIVE {
        return diff < eps * f64::MIN_POSITIVE;
    }
    diff / (a.abs() + b.abs()).min(f64::MAX) < eps
}

struct Eval {
    line_no: usize,
    expr: String,
    range: Option<(i64, i64, i64)>,
    at: i64,
    fail: bool,
    ordered: bool,
    /// `eval_warn`: the query must return at least one warning annotation.
    warn: bool,
    expected: Vec<String>,
    expected_fail_message: Option<String>,
    expected_fail_regexp: Option<String>,
    /// `eval_info`: the query must return at least one info annotation.
    info: bool,
    /// Evaluated with Prometheus 3's delayed name removal on.
    delayed_name_removal: bool,
}

fn engine_at(store: &MemoryStore, e: &Eval, rt: &tokio::runtime::Runtime) -> Result<QueryValue, String> {
    let expr = crate::parse(&e.expr).map_err(|m| format!("parse: {m}"))?;
    let engine =
        Engine::new(EngineOptions { delayed_name_removal: e.delayed_name_removal, ..EngineOptions::default() });
    let (value, stats) = rt
        .block_on(async {
            match e.range {
                Some((s, end, step)) => engine.range_with_stats(store, &expr, s, end, step, false).await,
                None => engine.instant_with_stats(store, &expr, e.at, false).await,
            }
        })
        .map_err(|err| err.to_string())?;
    if e.warn && stats.warnings.is_empty() {
        return Err(format!("eval_warn: no warning annotation (infos: {:?})", stats.infos));
    }
    if e.info && stats.infos.is_empty() {
        return Err(format!("eval_info: no info annotation (warnings: {:?})", stats.warnings));
    }
    Ok(value)
}

fn check(store: &MemoryStore, e: &Eval, rt: &tokio::runtime::Runtime) -> Result<(), String> {
    let got = engine_at(store, e, rt);
    if e.fail {
        return match got {
            Err(m) => {
                if let Some(want) = &e.expected_fail_message {
                    if !m.contains(want.as_str()) {
                        return Err(format!("failed with {m:?}, expected message {want:?}"));
                    }
                }
                if let Some(pattern) = &e.expected_fail_regexp {
                    let re =
                        regex::Regex::new(pattern).map_err(|x| format!("expected_fail_regexp {pattern:?}: {x}"))?;
                    if !re.is_match(&m) {
                        return Err(format!("failed with {m:?}, expected an error matching {pattern:?}"));
                    }
                }
                Ok(())
            }
            Ok(v) => Err(format!("expected an error, got {v:?}")),
        };
    }
    let got = got?;
    // expected: series → values (instant: one; range: many)
    let mut want: Vec<(Labels, Vec<Option<f64>>)> = Vec::new();
    let mut want_scalar: Option<f64> = None;
    for l in &e.expected {
        let l = l.trim();
        if l.starts_with('"') {
            return Err("string results are not compared yet".into());
        }
        if let Some(v) = parse_number(l) {
            want_scalar = Some(v);
            continue;
        }
        let (labels, vals) = split_series(l).ok_or_else(|| format!("bad expected line {l:?}"))?;
        want.push((labels, expand_values(vals).ok_or_else(|| format!("bad expected values {vals:?}"))?));
    }
    match got {
        QueryValue::Scalar(_, v) => match want_scalar {
            Some(w) if almost_equal(w, v) => Ok(()),
            w => Err(format!("scalar {v}, expected {w:?}")),
        },
        QueryValue::String(..) => Err("string result".into()),
        QueryValue::Vector(v) => {
            if let Some(w) = want_scalar {
                return Err(format!("got a vector, expected scalar {w}"));
            }
            if v.len() != want.len() {
                return Err(format!(
                    "got {} series, expected {}: {:?}",
                    v.len(),
                    want.len(),
                    v.iter().map(|x| x.0.to_string()).collect::<Vec<_>>()
                ));
            }
            for (i, (l, _, x)) in v.iter().enumerate() {
                let pos = if e.ordered { (want[i].0 == *l).then_some(i) } else { want.iter().position(|w| w.0 == *l) };
                let Some(p) = pos else { return Err(format!("unexpected series {l}")) };
                match want[p].1.first() {
                    Some(Some(w)) if almost_equal(*w, *x) => {}
                    w => return Err(format!("{l}: got {x}, expected {w:?}")),
                }
            }
            Ok(())
        }
        QueryValue::Matrix(m) => {
            let step_times: Option<Vec<i64>> =
                e.range.map(|(s, end, st)| (0..=((end - s) / st)).map(|i| s + i * st).collect());
            let nonempty = want.iter().filter(|w| w.1.iter().any(Option::is_some)).count();
            if m.len() != nonempty {
                return Err(format!(
                    "got {} series, expected {}: {:?}",
                    m.len(),
                    nonempty,
                    m.iter().map(|x| x.labels.to_string()).collect::<Vec<_>>()
                ));
            }
            for s in &m {
                let Some(w) = want.iter().find(|w| w.0 == s.labels) else {
                    return Err(format!("unexpected series {}", s.labels));
                };
                let Some(times) = &step_times else {
                    return Err("range vector result of an instant query is not compared yet".into());
                };
                let expect: Vec<(i64, f64)> = times.iter().zip(&w.1).filter_map(|(t, v)| v.map(|v| (*t, v))).collect();
                if expect.len() != s.points.len()
                    || expect.iter().zip(&s.points).any(|(a, b)| a.0 != b.0 || !almost_equal(a.1, b.1))
                {
                    return Err(format!("{}: got {:?}, expected {:?}", s.labels, s.points, expect));
                }
            }
            Ok(())
        }
    }
}

/// Functions defined only over native histograms.
const NATIVE_FUNCTIONS: [&str; 6] =
    ["histogram_count", "histogram_sum", "histogram_avg", "histogram_fraction", "histogram_stddev", "histogram_stdvar"];

/// Whether `expr` names the metric `name` (as a whole identifier, not a prefix of another).
fn mentions(expr: &str, name: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    expr.match_indices(name).any(|(at, _)| {
        let before = expr[..at].chars().next_back();
        let after = expr[at + name.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

/// Reasons to skip a case without running it.
fn skip_reason(text: &str) -> Option<&'static str> {
    if text.contains("{{") {
        return Some("native histograms");
    }
    None
}

pub fn run_file(name: &str, text: &str, report: &mut Report) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_time().build() {
        Ok(rt) => rt,
        Err(e) => {
            report.failed.push(format!("{name}: cannot start a runtime: {e}"));
            return;
        }
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut store = MemoryStore::default();
    let mut i = 0;
    // Metric names that exist only as native histograms here: loaded in `{{...}}` notation,
    // or the converted form of classic buckets that `load_with_nhcb` adds.
    let mut native: HashSet<String> = HashSet::new();
    while i < lines.len() {
        let line = lines[i].trim();
        i += 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line == "clear" {
            store = MemoryStore::default();
            native.clear();
            continue;
        }
        // `load_with_nhcb` loads the classic series as `load` does and additionally converts
        // them to native histograms, which Strata does not have: those names are noted.
        let load =
            line.strip_prefix("load_with_nhcb ").map(|r| (r, true)).or(line.strip_prefix("load ").map(|r| (r, false)));
        if let Some((rest, nhcb)) = load {
            let interval = parse_duration_ms(rest.trim()).unwrap_or(0);
            while i < lines.len() && lines[i].starts_with(char::is_whitespace) && !lines[i].trim().is_empty() {
                let l = lines[i].trim();
                i += 1;
                if skip_reason(l).is_some() {
                    // The metric name leads the line (`name{labels} {{...}} ...`).
                    let name: String =
                        l.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
                    if !name.is_empty() {
                        native.insert(name);
                    }
                    continue;
                }
                let Some((labels, vals)) = split_series(l) else {
                    report.failed.push(format!("{name}:{i}: cannot parse load line {l:?}"));
                    continue;
                };
                let Some(vals) = expand_values(vals) else {
                    report.failed.push(format!("{name}:{i}: cannot parse values {l:?}"));
                    continue;
                };
                if nhcb {
                    if let Some(base) = labels.metric_name().and_then(|n| n.strip_suffix("_bucket")) {
                        native.insert(base.to_string());
                    }
                }
                let samples =
                    vals.iter().enumerate().filter_map(|(k, v)| v.map(|v| Sample::new(k as i64 * interval, v)));
                store.add(labels, MetricType::Unknown, samples.collect::<Vec<_>>());
            }
            continue;
        }
        if line.starts_with("eval") {
            let start_line = i;
            let (cmd, rest) = line.split_once(' ').unwrap_or((line, ""));
            let mut e = Eval {
                line_no: start_line,
                expr: String::new(),
                range: None,
                at: 0,
                fail: cmd == "eval_fail",
                ordered: cmd == "eval_ordered",
                warn: cmd == "eval_warn",
                info: cmd == "eval_info",
                expected: vec![],
                expected_fail_message: None,
                expected_fail_regexp: None,
                delayed_name_removal: true,
            };
            let parsed = if let Some(r) = rest.strip_prefix("instant at ") {
                r.split_once(' ').and_then(|(t, x)| parse_duration_ms(t).ok().map(|t| (t, x))).map(|(t, x)| {
                    e.at = t;
                    x.to_string()
                })
            } else if let Some(r) = rest.strip_prefix("range from ") {
                // range from <start> to <end> step <step> <expr>
                let parts: Vec<&str> = r.splitn(6, ' ').collect();
                match (parts.first(), parts.get(2), parts.get(4), parts.get(5)) {
                    (Some(s), Some(en), Some(st), Some(x)) => {
                        match (parse_duration_ms(s).ok(), parse_duration_ms(en).ok(), parse_duration_ms(st).ok()) {
                            (Some(s), Some(en), Some(st)) => {
                                e.range = Some((s, en, st));
                                Some(x.to_string())
                            }
                            _ => None,
                        }
                    }
                    _ => None,
                }
            } else {
                None
            };
            while i < lines.len() && lines[i].starts_with(char::is_whitespace) && !lines[i].trim().is_empty() {
                let l = lines[i].trim();
                if let Some(m) = l.strip_prefix("expected_fail_message ") {
                    e.expected_fail_message = Some(m.to_string());
                } else if let Some(r) = l.strip_prefix("expected_fail_regexp ") {
                    e.expected_fail_regexp = Some(r.to_string());
                } else if !l.starts_with("expected_warn") && !l.starts_with("expected_info") {
                    e.expected.push(l.to_string());
                }
                i += 1;
            }
            let id = format!("{name}:{start_line}: {}", line.chars().take(120).collect::<String>());
            let Some(expr) = parsed else {
                report.failed.push(format!("{id}: cannot parse the eval line"));
                continue;
            };
            e.expr = expr;
            if skip_reason(&e.expr).is_some() || e.expected.iter().any(|x| skip_reason(x).is_some()) {
                report.skipped.push(format!("{id}: native histograms"));
                continue;
            }
            if native.iter().any(|n| mentions(&e.expr, n)) {
                report
                    .skipped
                    .push(format!("{id}: native histograms (series loaded or converted as native histograms)"));
                continue;
            }
            if NATIVE_FUNCTIONS.iter().any(|f| e.expr.contains(&format!("{f}("))) {
                report.skipped.push(format!("{id}: native histograms (a function only native histograms have)"));
                continue;
            }
            // Prometheus' test engine runs every file with delayed name removal on; Strata's
            // default is off, so each case outside the file that needs it runs both ways.
            let mut result = check(&store, &e, &rt);
            if result.is_ok() && name != "name_label_dropping.test" {
                e.delayed_name_removal = false;
                result = check(&store, &e, &rt).map_err(|m| format!("{m} (delayed name removal off)"));
            }
            match result {
                Ok(()) => report.passed += 1,
                Err(m) if m.contains("is not supported yet") => report.skipped.push(format!("{id}: {m}")),
                Err(m) => report.failed.push(format!("{id}: {m} (line {})", e.line_no)),
            }
            continue;
        }
        report.failed.push(format!("{name}:{i}: unknown command {line:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_expansion() {
        let v = expand_values("0+10x3 _ stale 1x2 -2-1x2 Inf").unwrap();
        assert_eq!(v[..4], [Some(0.0), Some(10.0), Some(20.0), Some(30.0)]);
        assert_eq!(v[4], None);
        assert!(strata_model::is_stale(v[5].unwrap()));
        assert_eq!(v[6..9], [Some(1.0), Some(1.0), Some(1.0)]);
        assert_eq!(v[9..12], [Some(-2.0), Some(-3.0), Some(-4.0)]);
        assert_eq!(v[12], Some(f64::INFINITY));
    }

    #[test]
    fn a_small_test_file_runs() {
        let text = r#"
load 5m
  http_requests{job="api", instance="0"} 0+10x10
  http_requests{job="api", instance="1"} 0+20x10

eval instant at 50m sum(http_requests)
  {} 300

eval instant at 50m http_requests{instance="1"} * 2
  {job="api", instance="1"} 400

eval range from 0 to 10m step 5m sum by (job) (http_requests)
  {job="api"} 0 30 60

eval instant at 50m rate(http_requests[50m])
  {job="api", instance="0"} 0.03333333333333333
  {job="api", instance="1"} 0.06666666666666667

eval_fail instant at 50m sum(
"#;
        let mut r = Report::default();
        run_file("inline", text, &mut r);
        assert!(r.failed.is_empty(), "{:#?}", r.failed);
        assert_eq!(r.passed, 5);
    }

    #[test]
    fn an_eval_fail_with_the_wrong_error_fails() {
        let text = "load 5m\n  m 1\n\neval_fail instant at 0m label_replace(m, \"bad-name\", \"\", \"src\", \"\")\n  expected_fail_message invalid destination label name\n\neval_fail instant at 0m label_replace(m, \"bad-name\", \"\", \"src\", \"\")\n  expected_fail_message something else entirely\n\neval_fail instant at 0m label_replace(m, \"bad-name\", \"\", \"src\", \"\")\n  expected_fail_regexp invalid .* label name\n\neval_fail instant at 0m label_replace(m, \"bad-name\", \"\", \"src\", \"\")\n  expected_fail_regexp ^no such thing$\n";
        let mut r = Report::default();
        run_file("inline", text, &mut r);
        assert_eq!(r.passed, 2, "{:#?}", r.failed);
        assert_eq!(r.failed.len(), 2, "a wrong error message passed: {:#?}", r.failed);
    }

    #[test]
    fn an_eval_warn_without_a_warning_fails() {
        let text = "load 5m\n  m 1\n\neval_warn instant at 0m quantile_over_time(2, m[5m])\n  {} +Inf\n\neval_warn instant at 0m m\n  m 1\n";
        let mut r = Report::default();
        run_file("inline", text, &mut r);
        assert_eq!(r.passed, 1, "{:#?}", r.failed);
        assert_eq!(r.failed.len(), 1, "an eval_warn without a warning passed");
    }
}
