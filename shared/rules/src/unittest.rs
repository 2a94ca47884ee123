//! `strata test rules`: Prometheus' rule unit-test files (`rule_files`,
//! `evaluation_interval`, `group_eval_order`, `tests` with `input_series`,
//! `alert_rule_test`, `promql_expr_test`, `external_labels`, `external_url`), run as
//! `promtool test rules` runs them and reported in its words and exit codes: the input
//! loaded one sample per `interval` from time 0, every group evaluated at each
//! `evaluation_interval` up to the latest `eval_time`, firing alerts compared at the
//! evaluation at or before each alert test's time, expressions at their own time.

use crate::file::{load_file, GroupSpec};
use crate::group::{EvalContext, Group, RuleSink};
use async_trait::async_trait;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use strata_model::{Labels, Matcher, Metadata, MetricType, Sample};
use strata_promql::notation::{expand_values, parse_metric, split_series};
use strata_promql::{Engine, EngineOptions, QueryValue};
use strata_store::memory::MemoryStore;
use strata_store::{SelectBudget, SelectRequest, SeriesChunks, Store, StoreError};
use tokio::sync::RwLock;

/// Test files larger than this are refused.
const MAX_TEST_FILE_BYTES: u64 = 64 << 20;
/// The most evaluations one test group may ask for (its latest `eval_time` over the
/// evaluation interval): a typo of `eval_time: 10000d` must not run for hours.
const MAX_EVALUATIONS: i64 = 1_000_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TestFile {
    #[serde(default)]
    rule_files: Vec<String>,
    evaluation_interval: Option<String>,
    #[serde(default)]
    group_eval_order: Vec<String>,
    #[serde(default)]
    tests: Vec<TestGroup>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TestGroup {
    interval: Option<String>,
    #[serde(default)]
    input_series: Vec<InputSeries>,
    #[serde(default)]
    alert_rule_test: Vec<AlertTest>,
    #[serde(default)]
    promql_expr_test: Vec<ExprTest>,
    #[serde(default)]
    external_labels: BTreeMap<String, String>,
    #[serde(default)]
    external_url: String,
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InputSeries {
    series: String,
    #[serde(default)]
    values: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlertTest {
    eval_time: Option<String>,
    #[serde(default)]
    alertname: String,
    #[serde(default)]
    exp_alerts: Vec<ExpAlert>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpAlert {
    #[serde(default)]
    exp_labels: BTreeMap<String, String>,
    #[serde(default)]
    exp_annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExprTest {
    expr: String,
    eval_time: Option<String>,
    #[serde(default)]
    exp_samples: Vec<ExpSample>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpSample {
    #[serde(default)]
    labels: String,
    value: f64,
}

/// What a run printed and how it ended, as promtool's: `stdout`, `stderr`, exit code.
#[derive(Debug, Default)]
pub struct Outcome {
    pub stdout: String,
    pub stderr: String,
    pub failed: bool,
}

impl Outcome {
    pub fn exit_code(&self) -> i32 {
        i32::from(self.failed)
    }
}

/// Runs every file, printing as promtool does into the returned outcome.
pub fn run(files: &[PathBuf]) -> Outcome {
    let mut out = Outcome::default();
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            out.stderr.push_str(&format!("cannot start the runtime: {e}\n"));
            out.failed = true;
            return out;
        }
    };
    for f in files {
        out.stdout.push_str(&format!("Unit Testing:  {}\n", f.display()));
        let mut warnings = Vec::new();
        match rt.block_on(test_file(f, &mut warnings)) {
            Ok(()) => {
                for w in warnings {
                    out.stderr.push_str(&format!("  WARNING: {w}\n"));
                }
                out.stdout.push_str("  SUCCESS\n");
            }
            Err(errs) => {
                for w in warnings {
                    out.stderr.push_str(&format!("  WARNING: {w}\n"));
                }
                out.stderr.push_str("  FAILED:\n");
                for e in errs {
                    out.stderr.push_str(&e);
                    out.stderr.push('\n');
                    out.stdout.push('\n');
                }
                out.failed = true;
            }
        }
        out.stdout.push('\n');
    }
    out
}

fn duration(s: &Option<String>, default: i64) -> Result<i64, String> {
    match s.as_deref() {
        None | Some("") => Ok(default),
        Some(t) => strata_model::duration::parse_duration_ms(t)
            .ok()
            .filter(|d| *d >= 0)
            .ok_or_else(|| format!("not a valid duration string: {t:?}")),
    }
}

/// Prometheus' `model.Duration` text: `1h30m`, `10m`, `0s`.
pub fn model_duration(ms: i64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    let mut ms = ms;
    let mut r = String::new();
    for (unit, mult, exact) in [
        ("y", 365 * 86_400_000i64, true),
        ("w", 7 * 86_400_000, true),
        ("d", 86_400_000, false),
        ("h", 3_600_000, false),
        ("m", 60_000, false),
        ("s", 1000, false),
        ("ms", 1, false),
    ] {
        if exact && ms % mult != 0 {
            continue;
        }
        let v = ms / mult;
        if v > 0 {
            r.push_str(&format!("{v}{unit}"));
            ms -= v * mult;
        }
    }
    r
}

/// Go's `time.Duration.String()` for whole milliseconds: `1h0m0s`, `1m30s`, `1.5s`, `500ms`.
pub fn go_duration(ms: i64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    let (sign, ms) = if ms < 0 { ("-", ms.unsigned_abs()) } else { ("", ms as u64) };
    if ms < 1000 {
        return format!("{sign}{ms}ms");
    }
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let secs = if frac == 0 { s.to_string() } else { format!("{s}.{}", format!("{frac:03}").trim_end_matches('0')) };
    if h > 0 {
        format!("{sign}{h}h{m}m{secs}s")
    } else if m > 0 {
        format!("{sign}{m}m{secs}s")
    } else {
        format!("{sign}{secs}s")
    }
}

/// Prometheus' `labels.Labels.String()`: `{__name__="up", job="a"}`.
pub fn prom_labels(l: &Labels) -> String {
    let items: Vec<String> = l.iter().map(|x| format!("{}={:?}", x.name, x.value.as_ref())).collect();
    format!("{{{}}}", items.join(", "))
}

/// Go's `strconv.FormatFloat(v, 'E', -1, 64)`.
fn float_e(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    let s = format!("{v:E}");
    let (m, e) = s.split_once('E').unwrap_or((&s, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    format!("{m}E{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
}

/// A `MemoryStore` that rules write into while queries read it.
struct SharedStore(RwLock<MemoryStore>);

#[async_trait]
impl Store for SharedStore {
    async fn select_within(
        &self,
        req: &SelectRequest,
        budget: &mut SelectBudget,
    ) -> Result<Vec<SeriesChunks>, StoreError> {
        self.0.read().await.select_within(req, budget).await
    }
    async fn series_within(
        &self,
        m: &[Matcher],
        start: i64,
        end: i64,
        budget: &mut SelectBudget,
    ) -> Result<Vec<Labels>, StoreError> {
        self.0.read().await.series_within(m, start, end, budget).await
    }
    async fn label_names(&self, m: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        self.0.read().await.label_names(m, start, end).await
    }
    async fn label_values(&self, name: &str, m: &[Matcher], start: i64, end: i64) -> Result<Vec<String>, StoreError> {
        self.0.read().await.label_values(name, m, start, end).await
    }
    async fn metadata(&self, metric: Option<&str>) -> Result<Vec<(String, Metadata)>, StoreError> {
        self.0.read().await.metadata(metric).await
    }
}

#[async_trait]
impl RuleSink for SharedStore {
    async fn append(&self, samples: Vec<(Labels, Sample)>) -> Result<usize, String> {
        let mut w = self.0.write().await;
        for (l, s) in samples {
            w.add(l, MetricType::Unknown, [s]);
        }
        Ok(0)
    }
}

async fn test_file(path: &Path, warnings: &mut Vec<String>) -> Result<(), Vec<String>> {
    let one = |e: String| vec![e];
    let meta = std::fs::metadata(path).map_err(|e| one(format!("open {}: {e}", path.display())))?;
    if meta.len() > MAX_TEST_FILE_BYTES {
        return Err(one(format!(
            "{}: {} bytes, more than the limit of {MAX_TEST_FILE_BYTES}",
            path.display(),
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| one(format!("open {}: {e}", path.display())))?;
    let file: TestFile = serde_saphyr::from_str(&text).map_err(|e| one(e.to_string()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut rule_files = Vec::new();
    for p in &file.rule_files {
        let full =
            if p.is_empty() || Path::new(p).is_absolute() { p.clone() } else { base.join(p).display().to_string() };
        let mut found: Vec<PathBuf> = match glob::glob(&full) {
            Ok(paths) => paths.filter_map(Result::ok).collect(),
            Err(e) => return Err(one(e.to_string())),
        };
        found.sort();
        if found.is_empty() {
            warnings.push(format!("no file match pattern {full}"));
        }
        rule_files.extend(found);
    }
    let eval_interval = duration(&file.evaluation_interval, 60_000).map_err(one)?;
    if eval_interval == 0 {
        return Err(one("evaluation_interval must be greater than zero".into()));
    }
    let mut order: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, g) in file.group_eval_order.iter().enumerate() {
        if order.insert(g, i).is_some() {
            return Err(one(format!("group name repeated in evaluation order: {g}")));
        }
    }
    let mut specs: Vec<GroupSpec> = Vec::new();
    let mut load_errors = Vec::new();
    for f in &rule_files {
        match load_file(f) {
            Ok(g) => specs.extend(g),
            Err(e) => load_errors.extend(e.errors.iter().map(|x| format!("{}: {x}", e.file))),
        }
    }
    let mut errs = Vec::new();
    for tg in &file.tests {
        if !load_errors.is_empty() {
            errs.extend(load_errors.iter().cloned());
            continue;
        }
        errs.extend(test_group(tg, &specs, &order, eval_interval).await);
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

type AlertSet = Vec<(Labels, Labels)>;

fn alerts_string(v: &AlertSet) -> String {
    if v.is_empty() {
        return "[]".into();
    }
    let item = |(l, a): &(Labels, Labels)| format!("Labels:{}\nAnnotations:{}", prom_labels(l), prom_labels(a));
    let indent = |s: String, pad: &str| s.split('\n').collect::<Vec<_>>().join(&format!("\n{pad}"));
    let mut s = format!("[\n0:{}", indent(format!("\n{}", item(&v[0])), "  "));
    for (i, x) in v.iter().enumerate().skip(1) {
        s.push_str(&format!(",\n{i}:{}", indent(format!("\n{}", item(x)), "  ")));
    }
    s.push_str("\n]");
    indent(s, "            ")
}

async fn test_group(
    tg: &TestGroup,
    specs: &[GroupSpec],
    order: &BTreeMap<&str, usize>,
    eval_interval: i64,
) -> Vec<String> {
    let mut errs = Vec::new();
    let interval = match duration(&tg.interval, eval_interval) {
        Ok(0) => return vec!["interval must be greater than zero".into()],
        Ok(i) => i,
        Err(e) => return vec![e],
    };
    let mut mem = MemoryStore::default();
    for s in &tg.input_series {
        let line = format!("{} {}", s.series, s.values);
        let Some((labels, values)) = split_series(&line) else {
            return vec![format!("bad input series {:?}", s.series)];
        };
        let Some(values) = expand_values(values) else {
            return vec![format!("bad values {:?} of input series {}", s.values, s.series)];
        };
        let samples: Vec<Sample> = values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| Sample::new((i as i64).saturating_mul(interval), v)))
            .collect();
        mem.add(labels, MetricType::Unknown, samples);
    }
    let store = SharedStore(RwLock::new(mem));
    let mut groups: Vec<Group> = specs.iter().map(|g| Group::new(g.clone(), interval)).collect();
    groups.sort_by_key(|g| order.get(g.spec.name.as_str()).copied().unwrap_or(0));
    let external = Labels::from_pairs(tg.external_labels.iter());
    let engine = Engine::new(EngineOptions { pushdown: false, ..Default::default() });
    let ctx =
        EvalContext { store: &store, engine: &engine, external_labels: &external, external_url: &tg.external_url };

    let mut alert_times: Vec<i64> = Vec::new();
    let mut expr_max = 0i64;
    for a in &tg.alert_rule_test {
        if a.alertname.is_empty() {
            let name = if tg.name.is_empty() { String::new() } else { format!(" (in TestGroup {})", tg.name) };
            let at = duration(&a.eval_time, 0).unwrap_or(0);
            return vec![format!(
                "an item under alert_rule_test misses required attribute alertname at eval_time {}{name}",
                model_duration(at)
            )];
        }
        match duration(&a.eval_time, 0) {
            Ok(t) => alert_times.push(t),
            Err(e) => return vec![e],
        }
    }
    for e in &tg.promql_expr_test {
        match duration(&e.eval_time, 0) {
            Ok(t) => expr_max = expr_max.max(t),
            Err(e) => return vec![e],
        }
    }
    alert_times.sort_unstable();
    alert_times.dedup();
    let max_t = alert_times.last().copied().unwrap_or(0).max(expr_max);
    if max_t / eval_interval > MAX_EVALUATIONS {
        return vec![format!(
            "evaluating up to {} every {} takes more than {MAX_EVALUATIONS} evaluations",
            model_duration(max_t),
            model_duration(eval_interval)
        )];
    }
    let mut curr = 0usize;
    let mut ts = 0i64;
    while ts <= max_t {
        let mut eval_errs = Vec::new();
        for g in groups.iter_mut() {
            g.eval(ts, &ctx, &store).await;
            for r in &g.rules {
                if let Some(e) = &r.last_error {
                    eval_errs.push(format!("    rule: {}, time: {}, err: {e}", r.spec.name, go_duration(ts)));
                }
            }
        }
        if !eval_errs.is_empty() {
            errs.extend(eval_errs);
            return errs;
        }
        while curr < alert_times.len() && ts <= alert_times[curr] && alert_times[curr] < ts + eval_interval {
            let t = alert_times[curr];
            for case in tg.alert_rule_test.iter().filter(|a| duration(&a.eval_time, 0).ok() == Some(t)) {
                let mut got: AlertSet = groups
                    .iter()
                    .flat_map(|g| g.firing(&case.alertname))
                    .map(|a| (a.labels.clone(), Labels::from_pairs(a.annotations.iter())))
                    .collect();
                let mut exp: AlertSet = case
                    .exp_alerts
                    .iter()
                    .map(|e| {
                        let mut l = e.exp_labels.clone();
                        l.insert("alertname".into(), case.alertname.clone());
                        (Labels::from_pairs(l.iter()), Labels::from_pairs(e.exp_annotations.iter()))
                    })
                    .collect();
                got.sort();
                exp.sort();
                if got != exp {
                    let name = if tg.name.is_empty() { String::new() } else { format!("    name: {},\n", tg.name) };
                    errs.push(format!(
                        "{name}    alertname: {}, time: {}, \n        exp:{}, \n        got:{}",
                        case.alertname,
                        model_duration(t),
                        alerts_string(&exp),
                        alerts_string(&got)
                    ));
                }
            }
            curr += 1;
        }
        ts += eval_interval;
    }
    for case in &tg.promql_expr_test {
        let t = duration(&case.eval_time, 0).unwrap_or(0);
        let at = model_duration(t);
        let got = match strata_promql::parse(&case.expr) {
            Err(e) => Err(e.to_string()),
            Ok(expr) => match engine.instant(&store, &expr, t).await {
                Ok(QueryValue::Vector(v)) => Ok(v.into_iter().map(|(l, _, x)| (l, x)).collect::<Vec<_>>()),
                Ok(QueryValue::Scalar(_, x)) => Ok(vec![(Labels::default(), x)]),
                Ok(_) => Err("rule result is not a vector or scalar".to_string()),
                Err(e) => Err(e.to_string()),
            },
        };
        let mut got = match got {
            Ok(g) => g,
            Err(e) => {
                errs.push(format!("    expr: {:?}, time: {at}, err: {e}", case.expr));
                continue;
            }
        };
        let mut exp = Vec::new();
        let mut bad = None;
        for s in &case.exp_samples {
            match parse_metric(&s.labels) {
                Some(l) => exp.push((l, s.value)),
                None => {
                    bad =
                        Some(format!("    expr: {:?}, time: {at}, err: labels {:?}: parse error", case.expr, s.labels));
                    break;
                }
            }
        }
        if let Some(b) = bad {
            errs.push(b);
            continue;
        }
        exp.sort_by(|a, b| a.0.cmp(&b.0));
        got.sort_by(|a, b| a.0.cmp(&b.0));
        // Exact values, as promtool 2.42 compares them (NaN never equals NaN there).
        let same = exp.len() == got.len() && exp.iter().zip(&got).all(|(a, b)| a.0 == b.0 && a.1 == b.1);
        if !same {
            let show = |v: &[(Labels, f64)]| {
                if v.is_empty() {
                    "nil".to_string()
                } else {
                    v.iter().map(|(l, x)| format!("{} {}", prom_labels(l), float_e(*x))).collect::<Vec<_>>().join(", ")
                }
            };
            errs.push(format!(
                "    expr: {:?}, time: {at},\n        exp: {}\n        got: {}",
                case.expr,
                show(&exp),
                show(&got)
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_go_and_prometheus_print_them() {
        assert_eq!(model_duration(0), "0s");
        assert_eq!(model_duration(90 * 60_000), "1h30m");
        assert_eq!(model_duration(10 * 60_000), "10m");
        assert_eq!(model_duration(7 * 86_400_000), "1w");
        assert_eq!(go_duration(60_000), "1m0s");
        assert_eq!(go_duration(3_600_000), "1h0m0s");
        assert_eq!(go_duration(1_500), "1.5s");
        assert_eq!(go_duration(500), "500ms");
        assert_eq!(float_e(1.0), "1E+00");
        assert_eq!(float_e(0.25), "2.5E-01");
        assert_eq!(float_e(12345.0), "1.2345E+04");
    }
}
