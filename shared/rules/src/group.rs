//! One rule group's evaluation at one timestamp, as Prometheus' `Group.Eval`: its rules in
//! order, each query at `ts − query_offset`, each rule's output appended before the next
//! rule runs (so a rule can read what an earlier one recorded), a series a rule returned
//! last time and not now marked stale, and a failed rule leaving its series as they were
//! and its error in its health.

use crate::alert::{AlertState, AlertingState};
use crate::file::{labels_of, GroupSpec, RuleKind, RuleSpec};
use crate::template::{Env, QuerySample};
use async_trait::async_trait;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use strata_model::{stale_nan, Labels, Sample};
use strata_promql::{Engine, QueryValue};
use strata_store::Store;

/// Where a group's output goes: the storage its later rules and queries read.
#[async_trait]
pub trait RuleSink: Send + Sync {
    /// Appends samples; returns how many were refused (out of order, duplicates), which
    /// the caller counts and logs.
    async fn append(&self, samples: Vec<(Labels, Sample)>) -> Result<usize, String>;
}

/// What a group evaluation reads besides its rules.
pub struct EvalContext<'a> {
    pub store: &'a dyn Store,
    pub engine: &'a Engine,
    pub external_labels: &'a Labels,
    pub external_url: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Unknown,
    Ok,
    Err,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Unknown => "unknown",
            Health::Ok => "ok",
            Health::Err => "err",
        }
    }
}

/// A rule and what its evaluations left.
pub struct RuleState {
    pub spec: RuleSpec,
    pub alerts: Option<AlertingState>,
    pub health: Health,
    pub last_error: Option<String>,
    pub last_evaluation: Option<i64>,
    pub evaluation_time: Duration,
    /// The last evaluation's query failed (or its result was refused: duplicates, limit):
    /// its alerts are not sent, as Prometheus sends none for a failed evaluation.
    pub query_failed: bool,
    /// The series written at the last successful evaluation, for staleness markers.
    returned: HashSet<Labels>,
}

pub struct Group {
    pub spec: GroupSpec,
    pub interval_ms: i64,
    pub rules: Vec<RuleState>,
    pub last_evaluation: Option<i64>,
    pub evaluation_time: Duration,
    /// Series of rules a reload removed from this group, marked stale at its next
    /// evaluation (Prometheus' `staleSeries`): after their last sample, never on it.
    pending_stale: Vec<Labels>,
}

/// One evaluation's account.
#[derive(Debug, Default)]
pub struct GroupOutcome {
    pub samples_written: usize,
    pub samples_refused: usize,
    /// `(rule name, error)` for each rule that failed.
    pub failures: Vec<(String, String)>,
    pub template_errors: Vec<(String, String)>,
}

impl Group {
    pub fn new(spec: GroupSpec, default_interval_ms: i64) -> Group {
        let interval_ms = spec.interval_ms.unwrap_or(default_interval_ms).max(1);
        let rules = spec
            .rules
            .iter()
            .map(|r| RuleState {
                spec: r.clone(),
                alerts: (r.kind == RuleKind::Alerting).then(|| AlertingState { restored: true, ..Default::default() }),
                health: Health::Unknown,
                last_error: None,
                last_evaluation: None,
                evaluation_time: Duration::ZERO,
                query_failed: false,
                returned: HashSet::new(),
            })
            .collect();
        Group {
            spec,
            interval_ms,
            rules,
            last_evaluation: None,
            evaluation_time: Duration::ZERO,
            pending_stale: Vec::new(),
        }
    }

    /// As Prometheus' `evalTimestamp`: groups spread over their interval by a hash of
    /// their file and name, so the same group always evaluates at the same phase. (The
    /// hash is FNV, not Prometheus' xxhash of a label set: the phases differ from a
    /// Prometheus running the same file, which nothing depends on.)
    pub fn offset_ms(&self) -> i64 {
        let mut h = strata_model::labels::Fnv64::new();
        h.write(self.spec.name.as_bytes());
        h.write(&[0xff]);
        h.write(self.spec.file.as_bytes());
        (h.finish() % self.interval_ms as u64) as i64
    }

    /// The newest evaluation time at or before `now`.
    pub fn eval_timestamp(&self, now: i64) -> i64 {
        let offset = self.offset_ms();
        let adjusted = now - offset;
        adjusted - adjusted.rem_euclid(self.interval_ms) + offset
    }

    /// Evaluates every rule at `ts` (ms) in order, appending each one's output to `sink`.
    pub async fn eval(&mut self, ts: i64, ctx: &EvalContext<'_>, sink: &dyn RuleSink) -> GroupOutcome {
        let started = Instant::now();
        let mut out = GroupOutcome::default();
        let at = ts - self.spec.query_offset_ms.unwrap_or(0);
        let limit = self.spec.limit;
        if !self.pending_stale.is_empty() {
            let stale: Vec<(Labels, Sample)> =
                self.pending_stale.drain(..).map(|l| (l, Sample::new(at, stale_nan()))).collect();
            append_markers(sink, stale, &self.spec.name).await;
        }
        for rule in &mut self.rules {
            let t0 = Instant::now();
            rule.last_evaluation = Some(ts);
            let result = eval_rule(rule, ts, at, ctx, limit).await;
            rule.evaluation_time = t0.elapsed();
            rule.query_failed = result.is_err();
            let (samples, template_errors) = match result {
                Ok(v) => v,
                Err(e) => {
                    rule.health = Health::Err;
                    rule.last_error = Some(e.clone());
                    out.failures.push((rule.spec.name.clone(), e));
                    continue;
                }
            };
            for e in template_errors {
                out.template_errors.push((rule.spec.name.clone(), e));
            }
            let now: HashSet<Labels> = samples.iter().map(|s| s.0.clone()).collect();
            let stale: Vec<(Labels, Sample)> =
                rule.returned.difference(&now).map(|l| (l.clone(), Sample::new(at, stale_nan()))).collect();
            let n = samples.len();
            match sink.append(samples).await {
                Ok(refused) => {
                    out.samples_written += n - refused.min(n);
                    out.samples_refused += refused;
                }
                Err(e) => {
                    rule.health = Health::Err;
                    rule.last_error = Some(format!("storing the rule's output: {e}"));
                    out.failures.push((rule.spec.name.clone(), e));
                    continue;
                }
            }
            if !stale.is_empty() {
                append_markers(sink, stale, &self.spec.name).await;
            }
            rule.returned = now;
            rule.health = Health::Ok;
            rule.last_error = None;
        }
        self.last_evaluation = Some(ts);
        self.evaluation_time = started.elapsed();
        out
    }

    /// Marks every series the group's rules last wrote stale at `ts` (a group removed on
    /// reload, or a rule gone from it).
    pub async fn mark_stale(&mut self, ts: i64, sink: &dyn RuleSink) {
        // After the last samples written, or storage refuses the markers.
        let ts = self.last_evaluation.map_or(ts, |l| ts.max(l.saturating_add(1)));
        let mut stale: Vec<(Labels, Sample)> =
            self.pending_stale.drain(..).map(|l| (l, Sample::new(ts, stale_nan()))).collect();
        for r in &mut self.rules {
            stale.extend(r.returned.drain().map(|l| (l, Sample::new(ts, stale_nan()))));
        }
        if !stale.is_empty() {
            append_markers(sink, stale, &self.spec.name).await;
        }
    }

    /// Takes over what `prev` (the same group before a reload) knew of the rules that stay
    /// (same kind, name and labels, as Prometheus matches them: a changed expression keeps
    /// its alerts, so they resolve and Alertmanager hears it): their alerts and the series
    /// they wrote. The series of the rules that are gone are marked stale at the next
    /// evaluation.
    pub fn take_state_from(&mut self, prev: &mut Group) {
        let key = |r: &RuleSpec| (r.kind == RuleKind::Alerting, r.name.clone(), r.labels.clone());
        let mut stale = std::mem::take(&mut prev.pending_stale);
        for old in prev.rules.iter_mut() {
            match self.rules.iter_mut().find(|r| key(&r.spec) == key(&old.spec) && r.returned.is_empty()) {
                Some(new) => {
                    new.returned = std::mem::take(&mut old.returned);
                    // `restored` is not carried: a rule loaded by a reload writes `ALERTS`
                    // at once (as Prometheus' `CopyState`), even when the reload came
                    // before the start's restore.
                    if let (Some(n), Some(o)) = (new.alerts.as_mut(), old.alerts.take()) {
                        n.active = o.active;
                    }
                    new.health = old.health;
                    new.last_error = old.last_error.take();
                    new.last_evaluation = old.last_evaluation;
                }
                None => stale.extend(old.returned.drain()),
            }
        }
        self.last_evaluation = prev.last_evaluation;
        self.pending_stale = stale;
    }

    /// Whether alerting rules write `ALERTS` (false until their `for` state is restored).
    pub fn set_restored(&mut self, restored: bool) {
        for r in &mut self.rules {
            if let Some(a) = r.alerts.as_mut() {
                a.restored = restored;
            }
        }
    }

    /// The firing alerts of the rule named `name`, for tests and the API.
    pub fn firing(&self, name: &str) -> Vec<&crate::alert::Alert> {
        self.rules
            .iter()
            .filter(|r| r.spec.name == name)
            .filter_map(|r| r.alerts.as_ref())
            .flat_map(|a| a.active_alerts())
            .filter(|a| a.state == AlertState::Firing)
            .collect()
    }
}

/// Appends staleness markers. A refused marker (its series already has a newer sample) is
/// fine; a failed append is logged, as the series will read as present until it ages out.
async fn append_markers(sink: &dyn RuleSink, stale: Vec<(Labels, Sample)>, group: &str) {
    let n = stale.len();
    if let Err(e) = sink.append(stale).await {
        tracing::warn!(group, markers = n, error = %e, "staleness markers not stored: the series stay visible until the lookback passes");
    }
}

/// A rule's query sees every store or fails: a store that does not answer (rules on a
/// global) fails the evaluation, named in its `lastError`, instead of recording a partial
/// sum as if it were whole (Thanos' `abort`; a rule result has no `warnings` to say so).
fn whole_answers() -> strata_store::QueryScope {
    strata_store::QueryScope::new(false, true)
}

/// Runs `expr` at `at` as a rule query: a vector, or a scalar as one sample without labels.
/// A rule result has no `warnings`: the query's (a replica that stood in for another, a
/// damaged block skipped) go to the log.
async fn query(ctx: &EvalContext<'_>, rule: &RuleSpec, at: i64) -> Result<Vec<(Labels, f64)>, String> {
    let scope = whole_answers();
    let answer = scope.clone().run(ctx.engine.instant(ctx.store, &rule.expr, at)).await;
    let warnings = scope.warnings();
    if !warnings.is_empty() {
        tracing::warn!(rule = %rule.name, ?warnings, "rule query answered with warnings");
    }
    match answer {
        Ok(QueryValue::Vector(v)) => Ok(v.into_iter().map(|(l, _, x)| (l, x)).collect()),
        Ok(QueryValue::Scalar(_, x)) => Ok(vec![(Labels::default(), x)]),
        Ok(_) => Err("rule result is not a vector or scalar".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// `rule` at `ts`, its query (and its samples) at `at`, `ts − query_offset`.
async fn eval_rule(
    rule: &mut RuleState,
    ts: i64,
    at: i64,
    ctx: &EvalContext<'_>,
    limit: usize,
) -> Result<(Vec<(Labels, Sample)>, Vec<String>), String> {
    let result = query(ctx, &rule.spec, at).await?;
    match rule.spec.kind {
        RuleKind::Recording => {
            let extra = labels_of(&rule.spec.labels);
            let mut out = Vec::with_capacity(result.len());
            let mut seen = HashSet::with_capacity(result.len());
            for (l, v) in result {
                let mut b = l.to_builder();
                b.set("__name__", &rule.spec.name);
                for x in extra.iter() {
                    b.set_shared(x.name.clone(), x.value.clone());
                }
                let l = b.build();
                if !seen.insert(l.clone()) {
                    return Err("vector contains metrics with the same labelset after applying rule labels".into());
                }
                out.push((l, Sample::new(at, v)));
            }
            if limit > 0 && out.len() > limit {
                return Err(format!("exceeded limit {limit} with {} series", out.len()));
            }
            Ok((out, Vec::new()))
        }
        RuleKind::Alerting => {
            let store = ctx.store;
            let engine = ctx.engine;
            let templates_query = move |q: &str| -> Result<Vec<QuerySample>, String> {
                let expr = strata_promql::parse(q).map_err(|e| e.to_string())?;
                let handle = tokio::runtime::Handle::current();
                if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
                    return Err("query in a template needs a multi-threaded runtime".into());
                }
                // Templates query at the evaluation's time, not `ts − query_offset` (as Prometheus).
                let v = tokio::task::block_in_place(|| {
                    handle.block_on(whole_answers().run(engine.instant(store, &expr, ts)))
                })
                .map_err(|e| e.to_string())?;
                match v {
                    QueryValue::Vector(v) => Ok(v.iter().map(|(l, _, x)| crate::template::sample(l, *x)).collect()),
                    QueryValue::Scalar(_, x) => Ok(vec![crate::template::sample(&Labels::default(), x)]),
                    _ => Err("query result is not a vector or scalar".into()),
                }
            };
            let needs_query = rule.spec.annotations.iter().chain(&rule.spec.labels).any(|(_, t)| t.contains("query"));
            let env =
                Env { query: if needs_query { Some(&templates_query) } else { None }, external_url: ctx.external_url };
            let state = rule.alerts.get_or_insert_with(Default::default);
            let e = state.update(&rule.spec, result, ts, at, ctx.external_labels, &env, limit)?;
            Ok((e.samples, e.template_errors))
        }
    }
}
