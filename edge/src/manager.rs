//! Keeps one [`ScrapeLoop`] per target in step with the configuration and file SD.
//!
//! On a reload or a file-SD change the manager recomputes every job's targets and diffs
//! them against the running loops: unchanged targets keep scraping without a gap, removed
//! ones are stopped (their series are marked stale), new ones start.

use crate::config::{EdgeConfig, ScrapeJob, StaticConfig};
use crate::http_client::BufferPool;
use crate::metrics::EdgeMetrics;
use crate::scrape::ScrapeLoop;
use crate::targets::{build_targets, expand_glob, read_sd_file, Target};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use strata_model::Fnv64;
use strata_tsdb::db::Tsdb;
use tokio::sync::watch;
use tokio::task::JoinHandle;

type LoopKey = (String, u64, (String, String, u64));

struct LoopHandle {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

pub struct ScrapeManager {
    db: Arc<Tsdb>,
    metrics: Arc<EdgeMetrics>,
    config: Mutex<Option<Arc<EdgeConfig>>>,
    loops: tokio::sync::Mutex<HashMap<LoopKey, LoopHandle>>,
    /// (path, modified) of every file-SD file last read, to notice changes.
    sd_state: Mutex<Vec<(PathBuf, Option<SystemTime>)>>,
    buffers: Arc<BufferPool>,
}

fn fingerprint(job: &ScrapeJob) -> u64 {
    let mut h = Fnv64::new();
    h.write(format!("{job:?}").as_bytes());
    h.finish()
}

impl ScrapeManager {
    pub fn new(db: Arc<Tsdb>, metrics: Arc<EdgeMetrics>) -> Arc<Self> {
        Arc::new(ScrapeManager {
            db,
            metrics,
            config: Mutex::new(None),
            loops: tokio::sync::Mutex::new(HashMap::new()),
            sd_state: Mutex::new(Vec::new()),
            buffers: Arc::default(),
        })
    }

    /// Installs a (validated) configuration and syncs the loops to it.
    pub async fn apply(&self, cfg: Arc<EdgeConfig>) {
        *self.config.lock() = Some(cfg);
        self.sync().await;
    }

    fn file_sd_groups(&self, job: &ScrapeJob, state: &mut Vec<(PathBuf, Option<SystemTime>)>) -> Vec<StaticConfig> {
        let mut groups = Vec::new();
        for (patterns, _) in &job.file_sd {
            for p in patterns {
                for file in expand_glob(p) {
                    let modified = std::fs::metadata(&file).and_then(|m| m.modified()).ok();
                    state.push((file.clone(), modified));
                    match read_sd_file(&file) {
                        Ok(g) => groups.extend(g),
                        Err(e) => tracing::warn!(job = %job.job_name, error = %e, "file SD: cannot read targets"),
                    }
                }
            }
        }
        groups
    }

    /// Recomputes all targets and starts/stops loops to match.
    pub async fn sync(&self) {
        let Some(cfg) = self.config.lock().clone() else { return };
        let mut desired: HashMap<LoopKey, (Target, Arc<ScrapeJob>)> = HashMap::new();
        let mut sd_state = Vec::new();
        for job in &cfg.jobs {
            let mut groups = job.static_configs.clone();
            groups.extend(self.file_sd_groups(job, &mut sd_state));
            let (targets, errors) = build_targets(job, &groups);
            for e in errors {
                tracing::warn!(error = %e, "dropping target");
            }
            let fp = fingerprint(job);
            let job = Arc::new(job.clone());
            for t in targets {
                desired.insert((job.job_name.clone(), fp, t.key()), (t, job.clone()));
            }
        }
        *self.sd_state.lock() = sd_state;
        let mut loops = self.loops.lock().await;
        let stale: Vec<LoopKey> = loops.keys().filter(|k| !desired.contains_key(*k)).cloned().collect();
        for k in stale {
            if let Some(h) = loops.remove(&k) {
                let _ = h.stop.send(true);
                let _ = h.task.await;
            }
        }
        let targets = desired.len();
        for (k, (target, job)) in desired {
            if loops.contains_key(&k) {
                continue;
            }
            let (tx, rx) = watch::channel(false);
            let lp = ScrapeLoop::new(target, job, self.db.clone(), self.metrics.clone(), self.buffers.clone());
            let task = tokio::spawn(lp.run(rx));
            loops.insert(k, LoopHandle { stop: tx, task });
        }
        tracing::info!(targets, "scrape targets synced");
    }

    fn sd_changed(&self) -> bool {
        let Some(cfg) = self.config.lock().clone() else { return false };
        let mut now = Vec::new();
        for job in &cfg.jobs {
            for (patterns, _) in &job.file_sd {
                for p in patterns {
                    for file in expand_glob(p) {
                        let m = std::fs::metadata(&file).and_then(|m| m.modified()).ok();
                        now.push((file, m));
                    }
                }
            }
        }
        *self.sd_state.lock() != now
    }

    /// Watches file-SD files every `every` and syncs when one changed, appeared or vanished.
    pub fn spawn_file_sd_watcher(self: &Arc<Self>, every: Duration) -> JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                if me.sd_changed() {
                    tracing::info!("file SD changed, re-reading targets");
                    me.sync().await;
                }
            }
        })
    }

    /// Stops every loop; each marks its series stale.
    pub async fn stop_all(&self) {
        let mut loops = self.loops.lock().await;
        for (_, h) in loops.drain() {
            let _ = h.stop.send(true);
            let _ = h.task.await;
        }
    }
}
