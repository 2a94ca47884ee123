//! Rules as a tier runs them (feature `tsdb`): the regional over the deduplicated view of
//! its storage, a global over everything it sees (Thanos' ruler). Both read the same
//! sections of a Prometheus configuration file ([`RulesConfig`]), write what rules record
//! into a database of their own with their external labels ([`TsdbSink`]), and reload
//! the same way ([`TierRules`]): the configuration file read again for its `rule_files`,
//! then the rule files; anything broken keeps the rules that run.

use crate::group::RuleSink;
use crate::manager::{RuleManager, RuleOptions};
use crate::metrics::RuleMetrics;
use crate::notifier::{AlertingConfig, Notifier};
use async_trait::async_trait;
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use strata_model::duration::PromDuration;
use strata_model::{Labels, Sample};
use strata_store::Store;
use strata_tsdb::db::Tsdb;
use strata_tsdb::TsdbStore;

/// Prometheus' `global` section, the keys rules use; the others are kept by name so the
/// tier can say it ignores them.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct GlobalSection {
    pub evaluation_interval: Option<PromDuration>,
    /// Prometheus 3's `rule_query_offset`: how far behind now rule queries look, for
    /// groups without their own `query_offset` (data forwarded late is then seen).
    pub rule_query_offset: Option<PromDuration>,
    #[serde(default)]
    pub external_labels: BTreeMap<String, String>,
    #[serde(flatten)]
    unknown: BTreeMap<String, IgnoredAny>,
}

impl GlobalSection {
    /// The keys no tier reads (`scrape_interval`, ...), as `global.<key>`.
    pub fn ignored_keys(&self) -> Vec<String> {
        self.unknown.keys().map(|k| format!("global.{k}")).collect()
    }

    /// Refuses an external label name Prometheus would refuse.
    pub fn validate(&self) -> Result<(), String> {
        for k in self.external_labels.keys() {
            if !strata_model::labels::is_valid_label_name(k) || k == "__name__" {
                return Err(format!("global.external_labels: invalid label name {k:?}"));
            }
        }
        Ok(())
    }

    pub fn external_labels(&self) -> Labels {
        Labels::from_pairs(self.external_labels.iter())
    }
}

/// What a tier's rules read from its configuration file.
#[derive(Debug, Clone, Default)]
pub struct RulesConfig {
    /// The file itself: `rule_files` and the `alerting` section's files are relative to
    /// its folder, and a reload reads it again.
    pub path: PathBuf,
    pub global: GlobalSection,
    /// Globs of rule files.
    pub rule_files: Vec<String>,
    pub alerting: AlertingConfig,
}

impl RulesConfig {
    fn base(&self) -> PathBuf {
        self.path.parent().map(|p| p.to_path_buf()).unwrap_or_default()
    }
}

/// Reads the tier's configuration file again (its own format) for a reload.
pub type ReadConfig = Arc<dyn Fn(&Path) -> Result<RulesConfig, String> + Send + Sync>;

/// Told what a write stored: by whom (`rules`) and over which times (`min_t`, `max_t`).
/// A regional's downsampler marks the windows already computed there to compute again,
/// since a rule's output may land behind them (`query_offset`, a group evaluated late).
pub type OnStored = Arc<dyn Fn(&str, i64, i64) -> Result<(), String> + Send + Sync>;

/// Rule output into a database, the external labels added where a result lacks them.
pub struct TsdbSink {
    db: Arc<Tsdb>,
    external: Labels,
    on_stored: Option<OnStored>,
}

impl TsdbSink {
    pub fn new(db: Arc<Tsdb>, external: Labels) -> Self {
        TsdbSink { db, external, on_stored: None }
    }

    pub fn with_on_stored(mut self, f: Option<OnStored>) -> Self {
        self.on_stored = f;
        self
    }
}

#[async_trait]
impl RuleSink for TsdbSink {
    async fn append(&self, samples: Vec<(Labels, Sample)>) -> Result<usize, String> {
        let (db, external, on_stored) = (self.db.clone(), self.external.clone(), self.on_stored.clone());
        tokio::task::spawn_blocking(move || {
            let mut batch = Vec::with_capacity(samples.len());
            // A series storage will not create (its series limit reached) refuses its
            // sample alone, counted and logged, not the rule's whole output.
            let mut refused = 0usize;
            for (l, s) in samples {
                let l = crate::with_external(&l, &external);
                match db.series(&l) {
                    Ok(id) => batch.push((id, s)),
                    Err(e) => {
                        if refused == 0 {
                            tracing::warn!(series = %l, error = %e, "rule output refused by storage");
                        }
                        refused += 1;
                    }
                }
            }
            let out = db.commit(&batch).map_err(|e| e.to_string())?;
            let times = batch.iter().map(|(_, s)| s.t);
            if let (Some(f), Some(lo), Some(hi)) = (&on_stored, times.clone().min(), times.max()) {
                // The samples are stored; windows computed over them must be told, or
                // they would answer without them.
                f("rules", lo, hi).map_err(|e| format!("rule output stored, but recording it failed: {e}"))?;
            }
            Ok(out.rejected.len() + refused)
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

/// A tier's running rules, and how to reload them.
pub struct TierRules {
    manager: Arc<RuleManager>,
    /// The configuration as the tier started with it: `global` and `alerting` changes take
    /// a restart.
    started: RulesConfig,
    read: ReadConfig,
    /// `regional` or `global`, for messages.
    tier: &'static str,
}

fn joined(errs: Vec<crate::file::RuleFileError>) -> String {
    errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ")
}

impl TierRules {
    /// Starts the rules when the configuration names rule files (`None` when it names
    /// none): loads them (an error at start is fatal, as in Prometheus) and runs their
    /// groups over `query`, writing into `db`, whose raw series are where `for` state is
    /// read back after a restart (with every external label, a replica label included).
    /// SIGHUP reloads until `stopped` changes. `on_stored` is told what each write of
    /// rule output stored.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        cfg: RulesConfig,
        read: ReadConfig,
        tier: &'static str,
        query: Arc<dyn Store>,
        db: Arc<Tsdb>,
        on_stored: Option<OnStored>,
        mut opts: RuleOptions,
        stopped: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Option<Arc<TierRules>>, String> {
        if cfg.rule_files.is_empty() {
            return Ok(None);
        }
        let external = cfg.global.external_labels();
        let metrics = RuleMetrics::default();
        let notifier = if cfg.alerting.alertmanagers.is_empty() {
            None
        } else {
            Some(Notifier::new(&cfg.alerting, &cfg.base(), external.clone(), metrics.clone())?)
        };
        opts.external_labels = external.clone();
        // Zero is Prometheus' "not set": its default of one minute stands.
        if let Some(i) = cfg.global.evaluation_interval.filter(|i| !i.0.is_zero()) {
            opts.default_interval = i.0;
        }
        if let Some(o) = cfg.global.rule_query_offset {
            opts.default_query_offset = o.0;
        }
        let sink = Arc::new(TsdbSink::new(db.clone(), external).with_on_stored(on_stored));
        let m = RuleManager::new(opts, cfg.rule_files.clone(), cfg.base(), query, sink, notifier, metrics);
        m.set_state_store(Arc::new(TsdbStore(db)));
        m.reload().await.map_err(joined)?;
        let rules = Arc::new(TierRules { manager: m, started: cfg, read, tier });
        rules.clone().spawn_sighup(stopped);
        Ok(Some(rules))
    }

    fn spawn_sighup(self: Arc<Self>, mut stopped: tokio::sync::watch::Receiver<bool>) {
        tokio::spawn(async move {
            let Ok(mut signal) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
                tracing::warn!("cannot listen for SIGHUP: rules reload only through /-/reload");
                return;
            };
            // Ends with the tier: it holds the manager, and through it the database.
            loop {
                tokio::select! {
                    got = signal.recv() => {
                        if got.is_none() {
                            return;
                        }
                        tracing::info!(config = %self.started.path.display(), "SIGHUP: reloading the configuration's rule files");
                        let _ = self.reload().await;
                    }
                    _ = stopped.changed() => return,
                }
            }
        });
    }

    pub fn manager(&self) -> &Arc<RuleManager> {
        &self.manager
    }

    /// A reload (SIGHUP, `/-/reload`): the configuration file read again for its
    /// `rule_files`, then the rule files. A broken file, configuration or rules, keeps the
    /// rules as they are. Changes to `global` or `alerting` take a restart, and the log
    /// says so.
    pub async fn reload(&self) -> Result<(), String> {
        let (path, read) = (self.started.path.clone(), self.read.clone());
        let got = tokio::task::spawn_blocking(move || read(&path)).await.map_err(|e| e.to_string())?;
        match got {
            Ok(new) => {
                let restart_only = |c: &RulesConfig| format!("{:?}", (&c.global, &c.alerting));
                if restart_only(&new) != restart_only(&self.started) {
                    tracing::warn!(config = %self.started.path.display(), tier = self.tier, "the `global` or `alerting` section changed: that takes a restart; rule files reload now");
                }
                self.manager.set_patterns(new.rule_files);
            }
            Err(e) => {
                let msg = format!("reading {}: {e}", self.started.path.display());
                self.manager.reload_failed(msg.clone());
                return Err(msg);
            }
        }
        self.manager.reload().await.map_err(joined)
    }
}

/// The answer to `POST /-/reload` (status code, body): 403 without
/// `--web.enable-lifecycle`, 500 with the reason when the rules could not be reloaded.
pub async fn reload_answer(rules: Option<&TierRules>, lifecycle: bool, tier: &str) -> (u16, String) {
    if !lifecycle {
        return (403, "Lifecycle API is not enabled.\n".into());
    }
    match rules {
        None => (200, format!("no rule files configured at start: rules take a restart of the {tier}\n")),
        Some(r) => match r.reload().await {
            Ok(()) => (200, "rules reloaded\n".into()),
            Err(msg) => (500, format!("failed to reload rules, the previous rules stay: {msg}\n")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_tsdb::db::TsdbOptions;

    /// Rule output tells who stored what over which times, after it is stored (a
    /// regional's downsampler computes those windows again); when that cannot be recorded,
    /// the write fails loudly rather than leaving windows that lack it.
    #[tokio::test]
    async fn rule_output_says_what_it_stored_and_fails_when_that_cannot_be_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Tsdb::open(dir.path(), TsdbOptions::default()).unwrap());
        let told: Arc<parking_lot::Mutex<Vec<(String, i64, i64)>>> = Arc::default();
        let record = told.clone();
        let on_stored: OnStored = Arc::new(move |who: &str, lo: i64, hi: i64| {
            record.lock().push((who.to_string(), lo, hi));
            Ok(())
        });
        let now = strata_model::time::now_ms();
        let sink = TsdbSink::new(db.clone(), Labels::from_pairs([("region", "eu")])).with_on_stored(Some(on_stored));
        let out = vec![
            (Labels::from_pairs([("__name__", "job:up:sum"), ("job", "a")]), Sample::new(now - 60_000, 1.0)),
            (Labels::from_pairs([("__name__", "job:up:sum"), ("job", "b")]), Sample::new(now - 180_000, 2.0)),
        ];
        assert_eq!(sink.append(out.clone()).await.unwrap(), 0);
        assert_eq!(*told.lock(), vec![("rules".to_string(), now - 180_000, now - 60_000)]);
        assert_eq!(db.head().num_series(), 2, "the output was not stored");

        let failing: OnStored = Arc::new(|_: &str, _: i64, _: i64| Err("disk full".to_string()));
        let sink = TsdbSink::new(db.clone(), Labels::default()).with_on_stored(Some(failing));
        let later = vec![(out[0].0.clone(), Sample::new(now - 30_000, 3.0))];
        let err = sink.append(later).await.unwrap_err();
        assert!(err.contains("disk full"), "{err}");
        // Nothing to record: not called.
        let silent = TsdbSink::new(db, Labels::default())
            .with_on_stored(Some(Arc::new(|_: &str, _: i64, _: i64| Err("called for nothing".to_string()))));
        assert_eq!(silent.append(Vec::new()).await.unwrap(), 0);
    }
}
