//! Alerts to Alertmanager: Prometheus' `alerting.alertmanagers` section (static targets,
//! scheme, path prefix, timeout, basic auth, `api_version: v2`), each alert POSTed to
//! `/api/v2/alerts` of every Alertmanager with the external labels it lacks. Each
//! Alertmanager has its own bounded queue and sender, so one that is down neither stops
//! nor delays the others; a failed batch is retried with backoff (Prometheus drops it),
//! and what a full queue or exhausted retries drop is counted and logged.

use crate::metrics::{AlertmanagerLabel, RuleMetrics};
use parking_lot::Mutex;
use serde::Deserialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use strata_model::Labels;
use tokio::sync::Notify;

/// Prometheus' default `--alertmanager.notification-queue-capacity`.
pub const QUEUE_CAPACITY: usize = 10_000;
const MAX_BATCH: usize = 64;
const MAX_ATTEMPTS: u32 = 6;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AlertingConfig {
    #[serde(default)]
    pub alertmanagers: Vec<AlertmanagerConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertmanagerConfig {
    #[serde(default)]
    pub static_configs: Vec<StaticConfig>,
    #[serde(default = "default_scheme")]
    pub scheme: String,
    #[serde(default)]
    pub path_prefix: String,
    pub timeout: Option<String>,
    #[serde(default = "default_api")]
    pub api_version: String,
    pub basic_auth: Option<BasicAuth>,
    /// Prometheus' `tls_config`, used with `scheme: https` (as in Prometheus, the scheme
    /// decides: with `http` it is read and checked but the connection is plain, and the
    /// log says so).
    pub tls_config: Option<strata_tls::TlsConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticConfig {
    #[serde(default)]
    pub targets: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
    pub password: Option<String>,
    pub password_file: Option<String>,
}

fn default_scheme() -> String {
    "http".into()
}

fn default_api() -> String {
    "v2".into()
}

/// One alert as Alertmanager's v2 API takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertPayload {
    pub labels: Labels,
    pub annotations: crate::alert::Annotations,
    pub starts_at: i64,
    pub ends_at: i64,
    pub generator_url: String,
}

/// `url.QueryEscape`.
pub fn query_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// RFC 3339 in UTC with milliseconds, as Alertmanager reads it.
pub fn rfc3339(ms: i64) -> String {
    let (y, mo, d, h, mi, s, frac) = strata_model::time::civil_from_ms(ms);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{frac:03}Z")
}

fn labels_json(l: &Labels) -> serde_json::Value {
    serde_json::Value::Object(
        l.iter().map(|x| (x.name.to_string(), serde_json::Value::String(x.value.to_string()))).collect(),
    )
}

struct Target {
    url: String,
    /// Its Alertmanager section's client (its TLS).
    client: reqwest::Client,
    auth: Option<(String, String)>,
    timeout: Duration,
    queue: Mutex<VecDeque<AlertPayload>>,
    wake: Notify,
}

pub struct Notifier {
    targets: Vec<Arc<Target>>,
    external: Labels,
    metrics: RuleMetrics,
}

impl Notifier {
    /// Checks the section; `Err` names what is wrong. Files (`password_file`, TLS) are
    /// read now, relative to `base`, the configuration file's directory.
    pub fn new(
        cfg: &AlertingConfig,
        base: &std::path::Path,
        external: Labels,
        metrics: RuleMetrics,
    ) -> Result<Arc<Notifier>, String> {
        let mut targets = Vec::new();
        for (i, am) in cfg.alertmanagers.iter().enumerate() {
            let at = |m: String| format!("alerting.alertmanagers[{i}]: {m}");
            if am.api_version != "v2" {
                return Err(at(format!(
                    "api_version {:?}: only v2 is supported (Alertmanager removed v1)",
                    am.api_version
                )));
            }
            if am.scheme != "http" && am.scheme != "https" {
                return Err(at(format!("scheme {:?}: expected http or https", am.scheme)));
            }
            if am.tls_config.as_ref().is_some_and(|t| t.server_name.is_some()) {
                // The HTTP client checks the certificate against the target's host.
                return Err(at("tls_config.server_name is not supported for Alertmanagers: name the target by the host its certificate is for".into()));
            }
            if am.scheme == "http" && am.tls_config.is_some() {
                tracing::warn!(
                    alertmanagers = i,
                    "tls_config is set but scheme is http: alerts go unencrypted (set scheme: https)"
                );
            }
            let mut builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(5));
            if am.scheme == "https" || am.tls_config.is_some() {
                let tls = strata_tls::client_config(base, &am.tls_config.clone().unwrap_or_default()).map_err(at)?;
                builder = builder.use_preconfigured_tls(tls);
            }
            let client = builder.build().map_err(|e| at(format!("HTTP client: {e}")))?;
            let timeout = match &am.timeout {
                None => Duration::from_secs(10),
                Some(t) => strata_model::duration::parse_duration_ms(t)
                    .ok()
                    .filter(|d| *d > 0)
                    .map(|d| Duration::from_millis(d as u64))
                    .ok_or_else(|| at(format!("timeout: not a valid duration: {t:?}")))?,
            };
            let auth = match &am.basic_auth {
                None => None,
                Some(b) => {
                    let password = match (&b.password, &b.password_file) {
                        (Some(p), None) => p.clone(),
                        (None, Some(f)) => std::fs::read_to_string(strata_tls::resolve(base, std::path::Path::new(f)))
                            .map_err(|e| at(format!("basic_auth.password_file {f}: {e}")))?
                            .trim_end_matches(['\n', '\r'])
                            .to_string(),
                        (None, None) => String::new(),
                        (Some(_), Some(_)) => return Err(at("basic_auth: password and password_file both set".into())),
                    };
                    Some((b.username.clone(), password))
                }
            };
            let prefix = am.path_prefix.trim_end_matches('/');
            for sc in &am.static_configs {
                for t in &sc.targets {
                    if t.is_empty() || t.contains('/') || t.contains('@') {
                        return Err(at(format!("target {t:?}: expected host:port")));
                    }
                    targets.push(Arc::new(Target {
                        url: format!("{}://{t}{prefix}/api/v2/alerts", am.scheme),
                        client: client.clone(),
                        auth: auth.clone(),
                        timeout,
                        queue: Mutex::new(VecDeque::new()),
                        wake: Notify::new(),
                    }));
                }
            }
        }
        metrics.alertmanagers.set(targets.len() as i64);
        metrics.queue_capacity.set(QUEUE_CAPACITY as i64);
        let n = Arc::new(Notifier { targets, external, metrics });
        for t in &n.targets {
            tokio::spawn(n.clone().sender(t.clone()));
        }
        Ok(n)
    }

    /// The Alertmanagers' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.targets.iter().map(|t| t.url.clone()).collect()
    }

    /// Queues alerts for every Alertmanager; a full queue drops its oldest.
    pub fn send(&self, alerts: Vec<AlertPayload>) {
        let alerts: Vec<AlertPayload> = alerts
            .into_iter()
            .map(|mut a| {
                a.labels = crate::with_external(&a.labels, &self.external);
                a
            })
            .collect();
        let mut longest = 0;
        for t in &self.targets {
            let mut q = t.queue.lock();
            q.extend(alerts.iter().cloned());
            let over = q.len().saturating_sub(QUEUE_CAPACITY);
            if over > 0 {
                q.drain(..over);
                self.metrics.notifications_dropped.inc_by(over as u64);
                tracing::warn!(alertmanager = %t.url, dropped = over, "alert queue full: the oldest alerts dropped");
            }
            longest = longest.max(q.len());
            drop(q);
            t.wake.notify_one();
        }
        self.metrics.queue_length.set(longest as i64);
    }

    fn body(&self, batch: &[AlertPayload]) -> Vec<u8> {
        let v: Vec<serde_json::Value> = batch
            .iter()
            .map(|a| {
                serde_json::json!({
                    "labels": labels_json(&a.labels),
                    "annotations": a.annotations,
                    "startsAt": rfc3339(a.starts_at),
                    "endsAt": rfc3339(a.ends_at),
                    "generatorURL": a.generator_url,
                })
            })
            .collect();
        serde_json::to_vec(&v).unwrap_or_default()
    }

    async fn post(&self, t: &Target, body: Vec<u8>) -> Result<(), String> {
        let mut req = t
            .client
            .post(&t.url)
            .timeout(t.timeout)
            .header("Content-Type", "application/json")
            .header("User-Agent", "Strata")
            .body(body);
        if let Some((u, p)) = &t.auth {
            req = req.basic_auth(u, Some(p));
        }
        let resp = req.send().await.map_err(|e| e.to_string())?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!("HTTP {}", resp.status()))
        }
    }

    async fn sender(self: Arc<Self>, t: Arc<Target>) {
        let label = AlertmanagerLabel { alertmanager: t.url.clone() };
        loop {
            let batch: Vec<AlertPayload> = {
                let mut q = t.queue.lock();
                let n = q.len().min(MAX_BATCH);
                q.drain(..n).collect()
            };
            if batch.is_empty() {
                t.wake.notified().await;
                continue;
            }
            let body = self.body(&batch);
            let mut attempt = 0;
            loop {
                let started = std::time::Instant::now();
                let r = self.post(&t, body.clone()).await;
                self.metrics.notifications_latency.get_or_create(&label).observe(started.elapsed().as_secs_f64());
                match r {
                    Ok(()) => {
                        self.metrics.notifications_sent.get_or_create(&label).inc_by(batch.len() as u64);
                        break;
                    }
                    Err(e) => {
                        self.metrics.notifications_errors.get_or_create(&label).inc_by(batch.len() as u64);
                        attempt += 1;
                        if attempt >= MAX_ATTEMPTS {
                            self.metrics.notifications_dropped.inc_by(batch.len() as u64);
                            tracing::error!(alertmanager = %t.url, alerts = batch.len(), error = %e, "sending alerts failed after retries: dropped (they are sent again at the next resend)");
                            break;
                        }
                        tracing::warn!(alertmanager = %t.url, alerts = batch.len(), attempt, error = %e, "sending alerts failed: retrying");
                        tokio::time::sleep(Duration::from_millis(250u64 << attempt.min(6))).await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_sections_are_refused_by_name() {
        let m = RuleMetrics::default();
        let parse = |t: &str| serde_saphyr::from_str::<AlertingConfig>(t).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let _g = rt.enter();
        for (text, want) in [
            ("alertmanagers:\n- api_version: v1\n  static_configs: [{targets: [a:1]}]\n", "only v2"),
            ("alertmanagers:\n- scheme: ftp\n  static_configs: [{targets: [a:1]}]\n", "expected http or https"),
            (
                "alertmanagers:\n- scheme: https\n  tls_config: {ca_file: missing.pem}\n  static_configs: [{targets: [a:1]}]\n",
                "tls_config.ca_file",
            ),
            (
                "alertmanagers:\n- scheme: https\n  tls_config: {server_name: am}\n  static_configs: [{targets: [a:1]}]\n",
                "server_name is not supported",
            ),
            ("alertmanagers:\n- timeout: soon\n  static_configs: [{targets: [a:1]}]\n", "timeout"),
            ("alertmanagers:\n- static_configs: [{targets: [\"http://a:1/x\"]}]\n", "host:port"),
        ] {
            let e = Notifier::new(&parse(text), std::path::Path::new("/nonexistent"), Labels::default(), m.clone())
                .err()
                .unwrap();
            assert!(e.contains(want) && e.starts_with("alerting.alertmanagers[0]"), "{e}");
        }
        assert!(serde_saphyr::from_str::<AlertingConfig>("alertmanagers:\n- relabel: 1\n").is_err());
        assert_eq!(rfc3339(1_764_460_800_123), "2025-11-30T00:00:00.123Z");
    }
}
