//! The rules manager: the loaded groups, one evaluation loop per group at its phase of its
//! interval, reloads that keep the old rules when a file is bad and carry alert state
//! over to the rules that stay, staleness markers for what a reload removed, `for` state
//! restored after a restart, and the alerts handed to the notifier.

use crate::file::{load_globs, GroupSpec, RuleFileError};
use crate::group::{EvalContext, Group, RuleSink};
use crate::metrics::RuleMetrics;
use crate::notifier::{AlertPayload, Notifier};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use strata_model::Labels;
use strata_promql::{Engine, EngineOptions};
use strata_store::Store;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Prometheus' rule flags and the global config the rules see.
#[derive(Clone, Debug)]
pub struct RuleOptions {
    /// `global.evaluation_interval` (default 1m).
    pub default_interval: Duration,
    /// `global.rule_query_offset` (default 0): for groups that set no `query_offset`.
    pub default_query_offset: Duration,
    /// Added to what rules write and shown to templates as `$externalLabels`.
    pub external_labels: Labels,
    pub external_url: String,
    /// `--rules.alert.resend-delay` (default 1m).
    pub resend_delay: Duration,
    /// `--rules.alert.for-outage-tolerance` (default 1h).
    pub outage_tolerance: Duration,
    /// `--rules.alert.for-grace-period` (default 10m).
    pub for_grace_period: Duration,
    pub engine: EngineOptions,
}

impl Default for RuleOptions {
    fn default() -> Self {
        RuleOptions {
            default_interval: Duration::from_secs(60),
            default_query_offset: Duration::ZERO,
            external_labels: Labels::default(),
            external_url: String::new(),
            resend_delay: Duration::from_secs(60),
            outage_tolerance: Duration::from_secs(3600),
            for_grace_period: Duration::from_secs(600),
            engine: EngineOptions { timeout: Duration::from_secs(60), ..Default::default() },
        }
    }
}

/// The outcome of the last (re)load, for `/api/v1/status` and logs.
#[derive(Debug, Clone, Default)]
pub struct ReloadStatus {
    pub success: bool,
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
}

struct Running {
    group: Arc<tokio::sync::Mutex<Group>>,
    /// (file, name) of the group, for the API's order and reloads.
    key: (String, String),
    stop: watch::Sender<bool>,
    /// Taken when the loop is being stopped.
    task: Option<JoinHandle<()>>,
}

pub struct RuleManager {
    opts: RuleOptions,
    /// The `rule_files` globs; a reload of the configuration may change them.
    patterns: Mutex<Vec<String>>,
    base: PathBuf,
    store: Arc<dyn Store>,
    sink: Arc<dyn RuleSink>,
    notifier: Option<Arc<Notifier>>,
    metrics: RuleMetrics,
    running: Mutex<Vec<Running>>,
    status: Mutex<ReloadStatus>,
    /// Serialises reloads (a SIGHUP and a `/-/reload` at once).
    reloading: tokio::sync::Mutex<()>,
    /// Set by the first load: only the groups it starts restore `for` state (Prometheus'
    /// `shouldRestore`); a reload keeps the state it carries over, and a group added by
    /// a reload starts afresh.
    loaded_once: std::sync::atomic::AtomicBool,
    /// Set by [`stop`](Self::stop): reloads do nothing after it.
    stopped: std::sync::atomic::AtomicBool,
    /// Where `ALERTS_FOR_STATE` is read back after a restart: the storage the sink writes
    /// (a regional's raw database), not a deduplicated view that drops replica labels.
    state_store: Mutex<Option<Arc<dyn Store>>>,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl RuleManager {
    /// A manager over `store` writing to `sink`; `patterns` are the `rule_files` globs,
    /// relative to `base` (the config file's directory). Nothing runs until [`reload`].
    pub fn new(
        opts: RuleOptions,
        patterns: Vec<String>,
        base: PathBuf,
        store: Arc<dyn Store>,
        sink: Arc<dyn RuleSink>,
        notifier: Option<Arc<Notifier>>,
        metrics: RuleMetrics,
    ) -> Arc<RuleManager> {
        Arc::new(RuleManager {
            opts,
            patterns: Mutex::new(patterns),
            base,
            store,
            sink,
            notifier,
            metrics,
            running: Mutex::new(Vec::new()),
            status: Mutex::new(ReloadStatus::default()),
            reloading: tokio::sync::Mutex::new(()),
            loaded_once: std::sync::atomic::AtomicBool::new(false),
            stopped: std::sync::atomic::AtomicBool::new(false),
            state_store: Mutex::new(None),
        })
    }

    pub fn status(&self) -> ReloadStatus {
        self.status.lock().clone()
    }

    /// A reload that failed before the rule files were read (the configuration file is
    /// broken): shown as Prometheus shows a failed reload; the rules stay as they are.
    pub fn reload_failed(&self, error: String) {
        tracing::error!(error = %error, "reload failed: the rules loaded before stay");
        self.metrics.config_success.set(0);
        let mut s = self.status.lock();
        s.success = false;
        s.errors = vec![error];
    }

    /// Reads `ALERTS_FOR_STATE` back from `store` after a restart instead of the store
    /// rules query (see the field).
    pub fn set_state_store(&self, store: Arc<dyn Store>) {
        *self.state_store.lock() = Some(store);
    }

    /// Replaces the `rule_files` globs (the configuration file was read again); the next
    /// [`reload`](Self::reload) reads them.
    pub fn set_patterns(&self, patterns: Vec<String>) {
        *self.patterns.lock() = patterns;
    }

    /// The external labels alerts are sent with.
    pub fn external_labels(&self) -> &Labels {
        &self.opts.external_labels
    }

    pub fn metrics(&self) -> &RuleMetrics {
        &self.metrics
    }

    /// Reads the rule files again and applies them. A file that fails keeps every group
    /// as it was (Prometheus does the same), and the error is returned, logged and shown.
    pub async fn reload(self: &Arc<Self>) -> Result<(), Vec<RuleFileError>> {
        let _one = self.reloading.lock().await;
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        let (patterns, base) = (self.patterns.lock().clone(), self.base.clone());
        let loaded = tokio::task::spawn_blocking(move || load_globs(&patterns, &base))
            .await
            .unwrap_or_else(|e| Err(vec![RuleFileError { file: String::new(), errors: vec![e.to_string()] }]));
        match loaded {
            Ok((specs, warnings)) => {
                for w in &warnings {
                    tracing::warn!(warning = %w, "rule files");
                }
                self.apply(specs).await;
                self.metrics.config_success.set(1);
                *self.status.lock() = ReloadStatus { success: true, errors: Vec::new(), warnings };
                Ok(())
            }
            Err(errors) => {
                for e in &errors {
                    tracing::error!(error = %e, "rule files not loaded: the rules loaded before stay");
                }
                self.metrics.config_success.set(0);
                let mut s = self.status.lock();
                s.success = false;
                s.errors = errors.iter().map(|e| e.to_string()).collect();
                Err(errors)
            }
        }
    }

    /// Replaces the running groups by `specs`: a group that stays keeps its rules' state
    /// (alerts, the series they wrote); what is gone is marked stale. The old groups stay
    /// in the API's view until the new ones replace them, so a reload never shows a
    /// region without rules or alerts.
    async fn apply(self: &Arc<Self>, specs: Vec<GroupSpec>) {
        // The old loops stop first (each finishes the evaluation it is in).
        self.stop_loops().await;
        let mut old_by_key: HashMap<(String, String), Arc<tokio::sync::Mutex<Group>>> =
            self.running.lock().iter().map(|r| (r.key.clone(), r.group.clone())).collect();
        let now = strata_model::time::now_ms();
        let restore = !self.loaded_once.swap(true, std::sync::atomic::Ordering::SeqCst);
        let mut running = Vec::new();
        for mut spec in specs {
            let key = (spec.file.clone(), spec.name.clone());
            if spec.query_offset_ms.is_none() && !self.opts.default_query_offset.is_zero() {
                spec.query_offset_ms = Some(ms(self.opts.default_query_offset));
            }
            let mut g = Group::new(spec, ms(self.opts.default_interval));
            if let Some(prev) = old_by_key.remove(&key) {
                // The series of rules gone from it are marked stale at its next evaluation.
                g.take_state_from(&mut *prev.lock().await);
            }
            let group = Arc::new(tokio::sync::Mutex::new(g));
            let (stop, stop_rx) = watch::channel(false);
            let task = tokio::spawn(self.clone().group_loop(group.clone(), stop_rx, restore));
            running.push(Running { group, key, stop, task: Some(task) });
        }
        self.metrics.groups.set(running.len() as i64);
        *self.running.lock() = running;
        for (_, g) in old_by_key {
            g.lock().await.mark_stale(now, self.sink.as_ref()).await;
        }
    }

    /// Stops every group's loop for good (the regional is shutting down): a reload under
    /// way finishes first, and none starts loops again after.
    pub async fn stop(&self) {
        let _one = self.reloading.lock().await;
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        self.stop_loops().await;
    }

    /// Tells every group's loop to stop and waits for each (an evaluation under way
    /// finishes); the groups stay in `running`, so the API still shows them.
    async fn stop_loops(&self) {
        let stopping: Vec<JoinHandle<()>> = {
            let mut running = self.running.lock();
            running
                .iter_mut()
                .filter_map(|r| {
                    let _ = r.stop.send(true);
                    r.task.take()
                })
                .collect()
        };
        for t in stopping {
            let _ = t.await;
        }
    }

    /// The groups, in file and name order, for the API.
    pub fn groups(&self) -> Vec<Arc<tokio::sync::Mutex<Group>>> {
        let running = self.running.lock();
        let mut v: Vec<_> = running.iter().map(|r| (r.key.clone(), r.group.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.into_iter().map(|x| x.1).collect()
    }

    async fn group_loop(
        self: Arc<Self>,
        group: Arc<tokio::sync::Mutex<Group>>,
        mut stop: watch::Receiver<bool>,
        restore: bool,
    ) {
        let (interval, label) = {
            let g = group.lock().await;
            (g.interval_ms, format!("{};{}", g.spec.file, g.spec.name))
        };
        let m = self.metrics.group(&label);
        m.interval.set(interval as f64 / 1000.0);
        let engine = Engine::new(self.opts.engine.clone());
        // Evaluations until the `for` state is restored: after the second, as Prometheus
        // does, so that forwarded data and recording rules have caught up.
        let mut restore_in: u8 = if restore { 2 } else { 0 };
        let mut next = {
            let g = group.lock().await;
            g.eval_timestamp(strata_model::time::now_ms()) + interval
        };
        loop {
            let wait = next - strata_model::time::now_ms();
            if wait > 0 {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(wait as u64)) => {}
                    _ = stop.changed() => return,
                }
            }
            if *stop.borrow() {
                return;
            }
            let ts = next;
            let ctx = EvalContext {
                store: self.store.as_ref(),
                engine: &engine,
                external_labels: &self.opts.external_labels,
                external_url: &self.opts.external_url,
            };
            let mut g = group.lock().await;
            if restore_in == 2 {
                // `ALERTS` waits until the `for` state is restored (Prometheus' order:
                // evaluate twice, restore, then write).
                g.set_restored(false);
            }
            let started = std::time::Instant::now();
            let outcome = g.eval(ts, &ctx, self.sink.as_ref()).await;
            if restore_in > 0 {
                restore_in -= 1;
                if restore_in == 0 {
                    let state_store = self.state_store.lock().clone().unwrap_or_else(|| self.store.clone());
                    crate::restore::restore_for_state(
                        &mut g,
                        strata_model::time::now_ms(),
                        state_store.as_ref(),
                        &self.opts.external_labels,
                        ms(self.opts.outage_tolerance),
                        ms(self.opts.for_grace_period),
                    )
                    .await;
                }
            }
            let took = started.elapsed();
            m.record(&g, &outcome, took, ts);
            for (rule, e) in &outcome.failures {
                tracing::warn!(group = %g.spec.name, file = %g.spec.file, rule = %rule, error = %e, "rule evaluation failed");
            }
            for (rule, e) in &outcome.template_errors {
                tracing::warn!(group = %g.spec.name, rule = %rule, error = %e, "expanding an alert template failed");
            }
            if outcome.samples_refused > 0 {
                tracing::warn!(group = %g.spec.name, refused = outcome.samples_refused, "rule output refused by storage (out of order or duplicate)");
            }
            if let Some(n) = &self.notifier {
                // Rules that failed this time send nothing (their alerts expire in
                // Alertmanager if they keep failing, as with Prometheus).
                let alerts = g.alerts_to_send(ts, ms(self.opts.resend_delay), &self.opts.external_url);
                if !alerts.is_empty() {
                    n.send(alerts);
                }
            }
            drop(g);
            // The next slot. An evaluation that overran it runs late, at once, for that
            // slot (Prometheus' ticker does the same); slots wholly passed are skipped
            // and counted.
            next += interval;
            let now = strata_model::time::now_ms();
            let missed = if now > next { (now - next) / interval } else { 0 };
            if missed > 0 {
                m.missed.inc_by(missed as u64);
                next += missed * interval;
                tracing::warn!(group = %label, missed, "rule group evaluation took longer than its interval: iterations missed");
            }
        }
    }
}

/// The alerts of a group to send now, in Alertmanager's shape.
impl Group {
    pub fn alerts_to_send(&mut self, ts: i64, resend_delay_ms: i64, external_url: &str) -> Vec<AlertPayload> {
        let interval = self.interval_ms;
        let mut out = Vec::new();
        for r in self.rules.iter_mut() {
            // A rule whose query failed sends nothing (Prometheus' order); one whose output
            // storage refused still does.
            if r.query_failed {
                continue;
            }
            let expr = r.spec.expr_text.clone();
            let Some(state) = r.alerts.as_mut() else { continue };
            for a in state.active.values_mut() {
                if !a.needs_sending(ts, resend_delay_ms) {
                    continue;
                }
                a.last_sent_at = Some(ts);
                // Two evaluations or sends may fail before Alertmanager resolves it itself.
                a.valid_until = ts + 4 * resend_delay_ms.max(interval);
                out.push(AlertPayload {
                    labels: a.labels.clone(),
                    annotations: a.annotations.clone(),
                    starts_at: a.fired_at.unwrap_or(a.active_at),
                    ends_at: a.resolved_at.unwrap_or(a.valid_until),
                    generator_url: format!(
                        "{}/graph?g0.expr={}&g0.tab=1",
                        external_url,
                        crate::notifier::query_escape(&expr)
                    ),
                });
            }
        }
        out
    }
}
