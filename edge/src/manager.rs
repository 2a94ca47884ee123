//! Keeps one [`ScrapeLoop`] per target in step with the configuration and file SD.
//!
//! On a reload or a file-SD change the manager recomputes every job's targets and diffs
//! them against the running loops: a target that stays keeps its loop, which takes the
//! job's new settings without a gap; removed ones are stopped (their series are marked
//! stale one interval later, as in Prometheus); new ones start. A file-SD file that fails
//! to parse keeps its last good targets.

use crate::config::{EdgeConfig, ScrapeJob, StaticConfig};
use crate::http_client::BufferPool;
use crate::metrics::EdgeMetrics;
use crate::scrape::{LoopState, ScrapeLoop};
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

/// A loop per (job, target); the job's settings may change under it.
type LoopKey = (String, (String, String, u64));

struct LoopHandle {
    state: watch::Sender<LoopState>,
    job: watch::Sender<Arc<ScrapeJob>>,
    /// The job's fingerprint the loop runs with.
    fingerprint: u64,
    task: JoinHandle<()>,
}

struct Loops {
    running: HashMap<LoopKey, LoopHandle>,
    /// Removed loops waiting to write their staleness markers.
    ending: Vec<LoopHandle>,
}

pub struct ScrapeManager {
    db: Arc<Tsdb>,
    metrics: Arc<EdgeMetrics>,
    config: Mutex<Option<Arc<EdgeConfig>>>,
    /// Held for a whole sync, configuration read included, so a file-SD sync racing a
    /// reload cannot install the targets of the configuration it replaced.
    loops: tokio::sync::Mutex<Loops>,
    /// (path, modified) of every file-SD file last read, to notice changes.
    sd_state: Mutex<Vec<(PathBuf, Option<SystemTime>)>>,
    /// The groups of every file-SD file last read well: a file that fails to parse (an
    /// editor rewriting it in place) keeps them, as Prometheus does.
    sd_last_good: Mutex<HashMap<PathBuf, Vec<StaticConfig>>>,
    buffers: Arc<BufferPool>,
}

/// Everything about a job that a loop runs with, rotated secrets and certificates included
/// (`Debug` hides them, so their digest is added).
fn fingerprint(job: &ScrapeJob) -> u64 {
    let mut h = Fnv64::new();
    h.write(format!("{job:?}").as_bytes());
    h.write(&job.security.digest.to_le_bytes());
    h.finish()
}

impl ScrapeManager {
    pub fn new(db: Arc<Tsdb>, metrics: Arc<EdgeMetrics>) -> Arc<Self> {
        Arc::new(ScrapeManager {
            db,
            metrics,
            config: Mutex::new(None),
            loops: tokio::sync::Mutex::new(Loops { running: HashMap::new(), ending: Vec::new() }),
            sd_state: Mutex::new(Vec::new()),
            sd_last_good: Mutex::new(HashMap::new()),
            buffers: Arc::default(),
        })
    }

    /// Installs a (validated) configuration and syncs the loops to it.
    pub async fn apply(&self, cfg: Arc<EdgeConfig>) {
        let mut loops = self.loops.lock().await;
        *self.config.lock() = Some(cfg);
        self.sync_locked(&mut loops).await;
    }

    fn file_sd_groups(&self, job: &ScrapeJob, state: &mut Vec<(PathBuf, Option<SystemTime>)>) -> Vec<StaticConfig> {
        let mut groups = Vec::new();
        let mut last_good = self.sd_last_good.lock();
        for (patterns, _) in &job.file_sd {
            for p in patterns {
                for file in expand_glob(p) {
                    let modified = std::fs::metadata(&file).and_then(|m| m.modified()).ok();
                    state.push((file.clone(), modified));
                    match read_sd_file(&file) {
                        Ok(g) => {
                            last_good.insert(file.clone(), g.clone());
                            groups.extend(g);
                        }
                        Err(e) => {
                            self.metrics.sd_file_read_errors.inc();
                            let kept = last_good.get(&file);
                            tracing::warn!(
                                job = %job.job_name,
                                file = %file.display(),
                                error = %e,
                                kept_groups = kept.map_or(0, Vec::len),
                                "file SD: cannot read targets; keeping the file's last good targets"
                            );
                            groups.extend(kept.cloned().unwrap_or_default());
                        }
                    }
                }
            }
        }
        groups
    }

    /// Recomputes all targets and starts, updates and stops loops to match.
    pub async fn sync(&self) {
        let mut loops = self.loops.lock().await;
        self.sync_locked(&mut loops).await;
    }

    async fn sync_locked(&self, loops: &mut Loops) {
        let Some(cfg) = self.config.lock().clone() else { return };
        let mut desired: HashMap<LoopKey, (Target, Arc<ScrapeJob>, u64)> = HashMap::new();
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
                desired.insert((job.job_name.clone(), t.key()), (t, job.clone(), fp));
            }
        }
        // Files no longer matched by any job forget their last good groups.
        self.sd_last_good.lock().retain(|f, _| sd_state.iter().any(|(p, _)| p == f));
        *self.sd_state.lock() = sd_state;
        loops.ending.retain(|h| !h.task.is_finished());
        let gone: Vec<LoopKey> = loops.running.keys().filter(|k| !desired.contains_key(*k)).cloned().collect();
        for k in gone {
            if let Some(h) = loops.running.remove(&k) {
                let _ = h.state.send(LoopState::Removed);
                loops.ending.push(h);
            }
        }
        let targets = desired.len();
        for (k, (target, job, fp)) in desired {
            if let Some(h) = loops.running.get_mut(&k) {
                if h.fingerprint != fp {
                    // A reload changed the job: the loop takes it without a gap.
                    h.fingerprint = fp;
                    let _ = h.job.send(job);
                }
                continue;
            }
            let (state, state_rx) = watch::channel(LoopState::Run);
            let (job_tx, job_rx) = watch::channel(job.clone());
            let lp = ScrapeLoop::new(target, job, self.db.clone(), self.metrics.clone(), self.buffers.clone());
            let task = tokio::spawn(lp.run(state_rx, job_rx));
            loops.running.insert(k, LoopHandle { state, job: job_tx, fingerprint: fp, task });
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

    /// Stops every loop at shutdown: no staleness markers (as Prometheus), so a restart
    /// carries on the series.
    pub async fn stop_all(&self) {
        let mut loops = self.loops.lock().await;
        let Loops { running, ending } = &mut *loops;
        let all: Vec<LoopHandle> = running.drain().map(|(_, h)| h).chain(ending.drain(..)).collect();
        for h in &all {
            let _ = h.state.send(LoopState::Shutdown);
        }
        for h in all {
            let _ = h.task.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Edge review (issue 20): the file-SD watcher's sync racing a reload. A sync that read
    /// the old configuration and installed its targets after the reload's would leave the
    /// old file's targets running until the next change. Syncs and reloads run
    /// concurrently on a multi-threaded runtime; after the last reload, whatever the
    /// interleaving, the loops are exactly the new configuration's targets.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_file_sd_sync_racing_a_reload_never_installs_the_old_targets() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Tsdb::open(&dir.path().join("data"), Default::default()).unwrap());
        let manager = ScrapeManager::new(db.clone(), Arc::new(EdgeMetrics::new(db.metrics())));
        // Two configurations, each reading its own file-SD file; port 1 refuses, so the
        // loops only fail their scrapes.
        let config = |name: &str, port_base: u16| {
            let sd = dir.path().join(format!("{name}.json"));
            let targets: Vec<String> = (0..20).map(|i| format!("\"127.0.0.{}:1\"", port_base + i)).collect();
            std::fs::write(&sd, format!("[{{\"targets\": [{}]}}]", targets.join(","))).unwrap();
            let text = format!(
                "scrape_configs:\n  - job_name: {name}\n    scrape_interval: 1h\n    file_sd_configs:\n      - files: ['{}']\n",
                sd.display()
            );
            Arc::new(EdgeConfig::parse(&text, &dir.path().join("edge.yml")).unwrap())
        };
        let (old, new) = (config("old", 1), config("new", 101));
        let running = |loops: &Loops| {
            let mut jobs: Vec<String> = loops.running.keys().map(|k| k.0.clone()).collect();
            jobs.sort();
            jobs.dedup();
            (jobs, loops.running.len())
        };
        for _ in 0..50 {
            manager.apply(old.clone()).await;
            let syncs: Vec<_> = (0..4)
                .map(|_| {
                    let m = manager.clone();
                    tokio::spawn(async move { m.sync().await })
                })
                .collect();
            tokio::task::yield_now().await;
            manager.apply(new.clone()).await;
            for s in syncs {
                s.await.unwrap();
            }
            let loops = manager.loops.lock().await;
            assert_eq!(running(&loops), (vec!["new".to_string()], 20), "the old configuration's targets came back");
        }
        manager.stop_all().await;
    }

    /// Edge review (issue 20, item 7): rotated contents of a `password_file` or a
    /// certificate file change the job's fingerprint, so a reload hands the loop the new
    /// credentials (`Debug` hides secrets, so it alone saw no change).
    #[test]
    fn rotated_secret_files_change_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("edge.yml");
        let text = "scrape_configs:\n  - job_name: j\n    basic_auth:\n      username: u\n      password_file: pw\n    static_configs:\n      - targets: ['127.0.0.1:1']\n";
        std::fs::write(&cfg, text).unwrap();
        let fp = |secret: &str| {
            std::fs::write(dir.path().join("pw"), secret).unwrap();
            fingerprint(&EdgeConfig::load(&cfg).unwrap().jobs[0])
        };
        let (a, b, a_again) = (fp("first"), fp("second"), fp("first"));
        assert_ne!(a, b, "a rotated password left the fingerprint unchanged");
        assert_eq!(a, a_again);
    }
}
