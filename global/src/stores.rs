//! [`StoreSet`]: the stores the global fans out to, found from the configuration's static
//! list, file-SD files and DNS names, each polled with `Info`.
//!
//! Every configured store stays in the fan-out whether its last `Info` succeeded or not: a
//! store that is down is still asked, so a query names it in its warnings (or fails with
//! `partial_response=false`) instead of silently missing its data. What `Info` said
//! (external label sets, time range) lets the fan-out skip stores that cannot match; a
//! store whose `Info` failed is asked for everything.

use crate::config::{check_address, GlobalConfig};
use parking_lot::{Mutex, RwLock};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use strata_fanout::{Fanout, StoreTarget};
use strata_grpc::{pb, RemoteStore, RemoteStoreOptions};
use strata_model::Labels;

/// What the global knows of one store.
#[derive(Debug, Clone)]
pub struct StoreStatus {
    pub address: String,
    pub kind: String,
    pub label_sets: Vec<Labels>,
    pub min_time: i64,
    pub max_time: i64,
    pub healthy: bool,
    pub last_error: Option<String>,
    pub last_check: Option<SystemTime>,
}

pub struct StoreSet {
    cfg: GlobalConfig,
    fanout: Arc<Fanout>,
    clients: Mutex<HashMap<String, RemoteStore>>,
    status: RwLock<Vec<StoreStatus>>,
    /// The last good contents of each file-SD file: a file being rewritten or broken keeps
    /// its stores.
    files: Mutex<HashMap<PathBuf, Vec<String>>>,
    /// TLS for every store connection, loaded from the configuration's files.
    tls: Option<strata_grpc::ClientTlsConfig>,
}

/// File-SD files larger than this are refused.
const MAX_SD_FILE_BYTES: u64 = 4 << 20;

#[derive(serde::Deserialize)]
struct SdGroup {
    targets: Vec<String>,
}

fn labels_of(set: &pb::LabelSet) -> Labels {
    Labels::from_pairs(set.labels.iter().map(|l| (l.name.as_str(), l.value.as_str())))
}

fn kind_name(k: i32) -> &'static str {
    match pb::ComponentKind::try_from(k) {
        Ok(pb::ComponentKind::Edge) => "edge",
        Ok(pb::ComponentKind::Regional) => "regional",
        Ok(pb::ComponentKind::Global) => "global",
        Ok(pb::ComponentKind::Archive) => "archive",
        _ => "unknown",
    }
}

impl StoreSet {
    pub fn new(cfg: GlobalConfig, fanout: Arc<Fanout>) -> Self {
        StoreSet {
            cfg,
            fanout,
            clients: Mutex::new(HashMap::new()),
            status: RwLock::new(Vec::new()),
            files: Mutex::new(HashMap::new()),
            tls: None,
        }
    }

    /// Connects to the stores over TLS.
    pub fn with_client_tls(mut self, tls: strata_grpc::ClientTlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    pub fn status(&self) -> Vec<StoreStatus> {
        self.status.read().clone()
    }

    /// Every store address the configuration names now, sorted.
    async fn addresses(&self) -> Vec<String> {
        let mut all: BTreeSet<String> = self.cfg.stores.iter().cloned().collect();
        for path in &self.cfg.sd_files {
            match read_sd_file(path) {
                Ok(found) => {
                    self.files.lock().insert(path.clone(), found);
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "store SD file unreadable; keeping its last stores")
                }
            }
        }
        all.extend(self.files.lock().values().flatten().cloned());
        let mut named: Vec<(String, u16)> = self.cfg.dns.clone();
        if !self.cfg.dns_srv.is_empty() {
            match self.cfg.dns_resolver.or_else(crate::dns::system_resolver) {
                Some(resolver) => {
                    for name in &self.cfg.dns_srv {
                        match crate::dns::lookup_srv(resolver, name, Duration::from_secs(5)).await {
                            Ok(found) => named.extend(found),
                            Err(e) => tracing::warn!(%name, %resolver, error = %e, "store SRV lookup failed"),
                        }
                    }
                }
                None => tracing::warn!("dnssrv+ stores configured but no resolver: set dns_resolver"),
            }
        }
        for (host, port) in &named {
            match tokio::time::timeout(Duration::from_secs(5), tokio::net::lookup_host((host.as_str(), *port))).await {
                Ok(Ok(addrs)) => all.extend(addrs.map(|a| a.to_string())),
                Ok(Err(e)) => tracing::warn!(name = %host, error = %e, "store DNS lookup failed"),
                Err(_) => tracing::warn!(name = %host, "store DNS lookup timed out"),
            }
        }
        all.into_iter().collect()
    }

    fn client(&self, addr: &str) -> Result<RemoteStore, String> {
        let mut clients = self.clients.lock();
        if let Some(c) = clients.get(addr) {
            return Ok(c.clone());
        }
        let opts = RemoteStoreOptions {
            timeout: self.cfg.store_timeout,
            connect_timeout: Duration::from_secs(5),
            gzip: false,
            tls: self.tls.clone(),
        };
        let c = RemoteStore::new(addr, opts).map_err(|e| e.to_string())?;
        clients.insert(addr.to_string(), c.clone());
        Ok(c)
    }

    /// Resolves the addresses, reads every store's `Info` at once and updates the
    /// fan-out's targets.
    pub async fn refresh(&self) {
        let addresses = self.addresses().await;
        self.clients.lock().retain(|a, _| addresses.contains(a));
        let mut set = tokio::task::JoinSet::new();
        for (i, addr) in addresses.iter().enumerate() {
            let client = self.client(addr);
            let timeout = self.cfg.store_timeout.min(Duration::from_secs(10));
            set.spawn(async move {
                let info = match client {
                    Ok(c) => match tokio::time::timeout(timeout, c.info()).await {
                        Ok(Ok(info)) => Ok((c, info)),
                        Ok(Err(e)) => Err((Some(c), e.to_string())),
                        Err(_) => Err((Some(c), format!("no Info within {timeout:?}"))),
                    },
                    Err(e) => Err((None, e)),
                };
                (i, info)
            });
        }
        let mut results = Vec::new();
        while let Some(Ok(r)) = set.join_next().await {
            results.push(r);
        }
        results.sort_by_key(|r| r.0);
        let previous = self.status();
        let now = SystemTime::now();
        let (mut status, mut targets) = (Vec::new(), Vec::new());
        for (i, r) in results {
            let address = addresses[i].clone();
            match r {
                Ok((client, info)) => {
                    let label_sets: Vec<Labels> = info.label_sets.iter().map(labels_of).collect();
                    targets.push(StoreTarget {
                        name: address.clone(),
                        store: Arc::new(client),
                        label_sets: label_sets.clone(),
                        min_time: info.min_time,
                        max_time: info.max_time,
                    });
                    status.push(StoreStatus {
                        address,
                        kind: kind_name(info.kind).to_string(),
                        label_sets,
                        min_time: info.min_time,
                        max_time: info.max_time,
                        healthy: true,
                        last_error: None,
                        last_check: Some(now),
                    });
                }
                Err((client, error)) => {
                    if previous.iter().find(|p| p.address == address).is_none_or(|p| p.healthy) {
                        tracing::warn!(store = %address, %error, "store unhealthy");
                    }
                    if let Some(c) = client {
                        targets.push(StoreTarget::new(address.clone(), Arc::new(c)));
                    }
                    let old = previous.iter().find(|p| p.address == address);
                    status.push(StoreStatus {
                        address,
                        kind: old.map(|o| o.kind.clone()).unwrap_or_else(|| "unknown".into()),
                        label_sets: old.map(|o| o.label_sets.clone()).unwrap_or_default(),
                        min_time: old.map(|o| o.min_time).unwrap_or(i64::MAX),
                        max_time: old.map(|o| o.max_time).unwrap_or(i64::MIN),
                        healthy: false,
                        last_error: Some(error),
                        last_check: Some(now),
                    });
                }
            }
        }
        self.fanout.set_targets(targets);
        *self.status.write() = status;
    }

    /// The `/api/v1/stores` body's `data`.
    pub fn status_json(&self) -> Value {
        let ts = |t: Option<SystemTime>| {
            t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map(|d| d.as_secs_f64())
        };
        let stores: Vec<Value> = self
            .status()
            .iter()
            .map(|s| {
                let sets: Vec<Value> = s.label_sets.iter().map(strata_api::labels_json).collect();
                json!({
                    "address": s.address,
                    "kind": s.kind,
                    "labelSets": sets,
                    "minTime": s.min_time,
                    "maxTime": s.max_time,
                    "health": if s.healthy { "up" } else { "down" },
                    "lastError": s.last_error,
                    "lastCheck": ts(s.last_check),
                })
            })
            .collect();
        Value::Array(stores)
    }
}

/// A file-SD file: JSON or YAML, a list of `{targets: [host:port, ...]}`.
fn read_sd_file(path: &PathBuf) -> Result<Vec<String>, String> {
    let len = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    if len > MAX_SD_FILE_BYTES {
        return Err(format!("{len} bytes (at most {MAX_SD_FILE_BYTES})"));
    }
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let groups: Vec<SdGroup> = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| e.to_string())?
    } else {
        serde_saphyr::from_str(&text).map_err(|e| e.to_string())?
    };
    let mut out = Vec::new();
    for t in groups.into_iter().flat_map(|g| g.targets) {
        check_address(&t)?;
        out.push(t);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_grpc::{StoreInfo, StoreService};
    use strata_store::memory::MemoryStore;
    use strata_store::SelectLimits;

    #[tokio::test]
    async fn stores_from_a_list_a_file_and_srv_records_are_polled_with_their_health() {
        // One real store, found through an SRV record as localhost:<port>.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let info =
            Arc::new(|| StoreInfo { min_time: 5, max_time: 9, kind: pb::ComponentKind::Edge, label_sets: vec![] });
        let external = Labels::from_pairs([("cluster", "c0")]);
        let svc = StoreService::new(Arc::new(MemoryStore::default()), external, SelectLimits::default(), info);
        tokio::spawn(strata_grpc::serve(
            listener,
            svc,
            strata_grpc::ServeOptions::new(Duration::from_secs(5)),
            std::future::pending(),
        ));
        let dns = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let resolver = dns.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = dns.recv_from(&mut buf).await {
                let mut a = buf[..n].to_vec();
                a[2] = 0x81;
                a[3] = 0x80;
                a[7] = 1;
                a.extend_from_slice(&[0xC0, 12, 0, 33, 0, 1, 0, 0, 0, 30]);
                let mut rdata = vec![0, 1, 0, 1];
                rdata.extend_from_slice(&port.to_be_bytes());
                rdata.extend_from_slice(b"\x09localhost\x00");
                a.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
                a.extend_from_slice(&rdata);
                let _ = dns.send_to(&a, from).await;
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let down = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        std::fs::write(dir.path().join("sd.json"), format!("[{{\"targets\": [\"{down}\"]}}]")).unwrap();
        let text = format!(
            "file_sd_configs:\n  - files: [sd.json]\ndns_sd: ['dnssrv+_grpc._tcp.edges.test']\ndns_resolver: '{resolver}'\nstore_timeout: 2s\n"
        );
        let cfg = GlobalConfig::parse(&text, dir.path()).unwrap();
        let fanout = Arc::new(Fanout::new(Vec::new(), Duration::from_secs(2)));
        let set = StoreSet::new(cfg, fanout.clone());
        set.refresh().await;
        let st = set.status();
        let up: Vec<&StoreStatus> = st.iter().filter(|s| s.healthy).collect();
        assert_eq!(up.len(), 1, "{st:?}");
        assert!(up[0].address.ends_with(&format!(":{port}")), "{st:?}");
        assert_eq!(up[0].label_sets, [Labels::from_pairs([("cluster", "c0")])]);
        assert_eq!((up[0].min_time, up[0].max_time), (5, 9));
        let bad = st.iter().find(|s| s.address == down).expect("the file's store is listed");
        assert!(!bad.healthy && bad.last_error.is_some(), "{bad:?}");
        // Every store is in the fan-out, the one that is down included.
        assert_eq!(fanout.targets().len(), st.len());
        let page = set.status_json();
        assert_eq!(page.as_array().unwrap().len(), st.len());
    }
}
