//! A web configuration that follows its file, as the exporter toolkit's does (it reads the
//! file on every handshake and request): [`LiveWebConfig`] re-reads the file and the
//! certificates it names when any of their bytes change (polled, and on demand for
//! SIGHUP). A removed user loses access and a renewed certificate is served without a
//! restart; a new file that does not load is refused with its reason and the last good
//! configuration stays.

use crate::web_config::{WebConfig, WebConfigError};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub struct LiveWebConfig {
    path: Option<PathBuf>,
    current: RwLock<(Arc<WebConfig>, u64)>,
}

/// No TLS, no users.
impl Default for LiveWebConfig {
    fn default() -> Self {
        LiveWebConfig { path: None, current: RwLock::new((Arc::new(WebConfig::default()), 0)) }
    }
}

impl LiveWebConfig {
    /// A configuration with no file behind it (none, or one built by the caller).
    pub fn fixed(web: WebConfig) -> Arc<Self> {
        Arc::new(LiveWebConfig { path: None, current: RwLock::new((Arc::new(web), 0)) })
    }

    /// Loads `path`; the first load must succeed.
    pub fn load(path: PathBuf) -> Result<Arc<Self>, WebConfigError> {
        let text = std::fs::read(&path).map_err(|source| WebConfigError::Read { path: path.clone(), source })?;
        let web = WebConfig::parse(&String::from_utf8_lossy(&text), &path)?;
        let digest = digest_of(&text, &web);
        Ok(Arc::new(LiveWebConfig { path: Some(path), current: RwLock::new((Arc::new(web), digest)) }))
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<WebConfig> {
        match self.current.read() {
            Ok(c) => c.0.clone(),
            Err(poisoned) => poisoned.into_inner().0.clone(),
        }
    }

    /// Re-reads the file if it or a file it names changed: `Ok(true)` when a new
    /// configuration is in force, `Err` (and the running one kept) when it does not load.
    pub fn reload(&self) -> Result<bool, WebConfigError> {
        let Some(path) = &self.path else { return Ok(false) };
        let seen = match self.current.read() {
            Ok(c) => c.1,
            Err(p) => p.into_inner().1,
        };
        let old = self.current();
        // The digest of the bytes that are parsed, so a file written between two reads is
        // never taken as seen.
        let text = std::fs::read(path).map_err(|source| WebConfigError::Read { path: path.clone(), source })?;
        let d = digest_of(&text, &old);
        if d == seen {
            return Ok(false);
        }
        let web = WebConfig::parse(&String::from_utf8_lossy(&text), path)?;
        // Fail closed: a reload never turns TLS or basic auth off (an editor's truncated
        // file loads as "no TLS, no users"); that needs a restart.
        let weakened = match (old.tls.is_some() && web.tls.is_none(), old.auth.is_some() && web.auth.is_none()) {
            (true, _) => Some("TLS"),
            (_, true) => Some("basic auth"),
            _ => None,
        };
        if let Some(what) = weakened {
            return Err(WebConfigError::Invalid {
                path: path.clone(),
                message: format!("the new file turns {what} off; refused while running (restart to do that)"),
            });
        }
        let d = digest_of(&text, &web);
        let mut cur = match self.current.write() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        *cur = (Arc::new(web), d);
        Ok(true)
    }

    /// Checks for changes every `every`, logging each reload or refusal once.
    pub fn spawn_watcher(self: &Arc<Self>, every: Duration) -> Option<tokio::task::JoinHandle<()>> {
        self.path.as_ref()?;
        let me = self.clone();
        Some(tokio::spawn(async move {
            let mut last_error: Option<String> = None;
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                // A reload reads files and may hash a bcrypt stand-in: off the runtime.
                let (m, mut e) = (me.clone(), last_error.take());
                last_error = tokio::task::spawn_blocking(move || {
                    m.reload_and_log(&mut e);
                    e
                })
                .await
                .unwrap_or(None);
            }
        }))
    }

    /// [`reload`](Self::reload), logged: for SIGHUP and the watcher.
    pub fn reload_and_log(&self, last_error: &mut Option<String>) {
        let path = self.path.as_deref().unwrap_or(std::path::Path::new(""));
        match self.reload() {
            Ok(true) => {
                tracing::info!(path = %path.display(), "web configuration reloaded");
                *last_error = None;
            }
            Ok(false) => {}
            Err(e) => {
                let e = e.to_string();
                if last_error.as_deref() != Some(&e) {
                    tracing::error!(error = %e, "web configuration reload failed; keeping the running one");
                    *last_error = Some(e);
                }
            }
        }
    }
}

/// The file's bytes and those of every file its configuration read.
fn digest_of(text: &[u8], web: &WebConfig) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // Fixed keys: digests are compared across reads.
    let mut h = std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().build_hasher();
    h.write(text);
    for f in &web.files {
        h.write_u8(0xff);
        h.write(&std::fs::read(f).unwrap_or_default());
    }
    h.finish()
}
