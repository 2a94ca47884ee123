//! [`StoreSet`]: the stores the global fans out to, found from the configuration's static
//! list, file-SD files and DNS names, each polled with `Info`.
//!
//! Every configured store stays in the fan-out whether its last `Info` succeeded or not: a
//! store that is down is still asked, so a query names it in its warnings (or fails with
//! `partial_response=false`) instead of silently missing its data. What `Info` said
//! (external label sets, time range) lets the fan-out skip stores that cannot match; a
//! store whose `Info` failed is asked for everything.
//!
//! Discovery never drops a store in silence either: a file-SD file that cannot be read
//! keeps its last stores, and a DNS name whose lookup fails keeps the stores of its last
//! answer, each shown in `/api/v1/stores` with the lookup's error until a lookup succeeds.

use crate::config::{check_address, GlobalConfig};
use parking_lot::{Mutex, RwLock};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use strata_archive::{ArchiveStore, Coverage};
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
    /// Aggregates it holds: (window width, first and last sample time covered), ms.
    pub resolutions: Vec<(i64, i64, i64)>,
    pub last_error: Option<String>,
    pub last_check: Option<SystemTime>,
    /// The store was found by a DNS name whose last lookup failed: this is why.
    pub discovery_error: Option<String>,
    /// A store fed by senders (a regional): up to when every sender has sent everything,
    /// and the one furthest behind (`InfoResponse.complete_until`).
    pub complete_until: Option<(i64, String)>,
}

pub struct StoreSet {
    cfg: GlobalConfig,
    fanout: Arc<Fanout>,
    clients: Mutex<HashMap<String, RemoteStore>>,
    status: RwLock<Vec<StoreStatus>>,
    /// The last good contents of each file-SD file: a file being rewritten or broken keeps
    /// its stores.
    files: Mutex<HashMap<PathBuf, Vec<String>>>,
    /// The last good answer for each DNS name looked up (an SRV name's targets, a host's
    /// addresses), and the error of its last lookup if that failed.
    names: Mutex<HashMap<String, Looked>>,
    /// TLS for every store connection, loaded from the configuration's files.
    tls: Option<strata_grpc::ClientTlsConfig>,
    /// The archive served beside the stores (`--archive`), and the fan-out over the
    /// stores alone, which the archiver reads.
    archive: Option<ArchiveBeside>,
}

struct ArchiveBeside {
    name: String,
    store: Arc<ArchiveStore>,
    live: Arc<Fanout>,
}

/// The kind `/api/v1/stores` shows for the archive.
pub const ARCHIVE_KIND: &str = "archive";

/// The archive as a target, with the time range of its raw blocks and its aggregates;
/// asked for everything when its blocks cannot be listed.
async fn archive_target(a: &ArchiveBeside, now: SystemTime) -> (StoreTarget, StoreStatus) {
    // The reader answers leaves from aggregates; an aggregation over one is the engine's.
    let grouping = strata_promql::pushdown::GroupingAggregates::new(a.store.clone());
    let mut target = StoreTarget::new(a.name.clone(), Arc::new(grouping));
    let mut status = StoreStatus {
        address: a.name.clone(),
        kind: ARCHIVE_KIND.into(),
        label_sets: Vec::new(),
        min_time: i64::MAX,
        max_time: i64::MIN,
        healthy: true,
        resolutions: Vec::new(),
        last_error: None,
        last_check: Some(now),
        discovery_error: None,
        complete_until: None,
    };
    match a.store.time_ranges().await {
        Ok(ranges) => {
            if let Some(&(lo, hi)) = ranges.get(&0) {
                // Blocks are `[min, max)`; a target's range is inclusive.
                (target.min_time, target.max_time) = (lo, hi.saturating_sub(1));
                (status.min_time, status.max_time) = (lo, hi.saturating_sub(1));
            } else {
                // Nothing raw yet: asked for no time range until the next listing.
                (target.min_time, target.max_time) = (i64::MIN, i64::MIN);
            }
            // An aggregate block over `[lo, hi)` holds the windows ending in `(lo, hi]`:
            // the sample times it covers, inclusive, are `lo + 1 ..= hi`.
            let res: Vec<(i64, i64, i64)> =
                ranges.iter().filter(|(r, _)| **r > 0).map(|(r, (lo, hi))| (*r, lo.saturating_add(1), *hi)).collect();
            target.resolutions = res.clone();
            status.resolutions = res;
        }
        Err(e) => {
            tracing::warn!(archive = %a.name, error = %e, "listing the archive's blocks failed");
            status.healthy = false;
            status.last_error = Some(e.to_string());
        }
    }
    (target, status)
}

/// File-SD files larger than this are refused.
const MAX_SD_FILE_BYTES: u64 = 4 << 20;

/// A DNS name's last good answer.
#[derive(Debug, Clone, Default)]
struct Looked {
    answer: Vec<String>,
    error: Option<String>,
}

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
            names: Mutex::new(HashMap::new()),
            tls: None,
            archive: None,
        }
    }

    /// Serves `store` (named `name`, the archive's URL) as one more store of the fan-out,
    /// and keeps `live` on the stores alone.
    pub fn with_archive(mut self, name: String, store: Arc<ArchiveStore>, live: Arc<Fanout>) -> Self {
        self.archive = Some(ArchiveBeside { name, store, live });
        self
    }

    /// What the stores (not the archive) hold, for the archiver: a range is complete once
    /// every store answers and has data past its end.
    pub fn coverage(&self) -> Coverage {
        self.coverage_within(&[], 0)
    }

    /// [`coverage`](Self::coverage) over the stores whose label sets may hold series
    /// matching `matchers` (a shard's), and those whose label sets are not known.
    ///
    /// A regional's data counts as whole up to `settle_ms` before its edges' oldest
    /// watermark: a sample stored at an edge after it with an older time (a slow scrape,
    /// a remote write) still reaches the regional within that.
    pub fn coverage_within(&self, matchers: &[strata_model::Matcher], settle_ms: i64) -> Coverage {
        let status = self.status();
        let may_hold = |s: &&StoreStatus| {
            s.label_sets.is_empty()
                || s.label_sets.iter().any(|set| matchers.iter().all(|m| set.get(&m.name).is_none_or(|v| m.matches(v))))
        };
        let live: Vec<&StoreStatus> = status.iter().filter(|s| s.kind != ARCHIVE_KIND).filter(may_hold).collect();
        // An empty store says `i64::MIN`: it holds nothing to start from. A store that is
        // down counts with the range it last said it held, so its oldest data is visited.
        let holds = |s: &&&StoreStatus| s.min_time > i64::MIN && s.min_time <= s.max_time;
        let holding: Vec<&&StoreStatus> = live.iter().filter(holds).collect();
        // A regional's data reaches as far as its most current edge; an edge behind it
        // (an outage, a backlog on the way) holds it back at its watermark.
        let whole_until = |s: &StoreStatus| {
            s.complete_until.as_ref().map_or(s.max_time, |c| c.0.saturating_sub(settle_ms).min(s.max_time))
        };
        let furthest_behind = holding.iter().filter(|s| s.healthy).min_by_key(|s| whole_until(s));
        Coverage {
            min_time: holding.iter().map(|s| s.min_time).min(),
            complete_until: furthest_behind.map_or(i64::MIN, |s| whole_until(s)),
            missing: live.iter().filter(|s| !s.healthy).map(|s| s.address.clone()).collect(),
            behind: furthest_behind.and_then(|s| {
                let (until, sender) = s.complete_until.as_ref()?;
                // (Behind the regional's own data by more than the settle time.)
                (*until < s.max_time.saturating_sub(settle_ms))
                    .then(|| format!("store {}: sender {sender} had sent everything only up to {until} ms", s.address))
            }),
        }
    }

    /// A lookup's answer, or on failure the last good one with the error kept beside it.
    fn settle(&self, name: &str, looked: Result<Vec<String>, String>) -> Looked {
        let mut names = self.names.lock();
        let entry = names.entry(name.to_string()).or_default();
        match looked {
            Ok(answer) => *entry = Looked { answer, error: None },
            Err(e) => {
                if entry.error.is_none() {
                    tracing::warn!(%name, error = %e, stores = entry.answer.len(), "store DNS lookup failed: keeping the stores of its last answer");
                }
                entry.error = Some(format!("lookup of {name} failed: {e}"));
            }
        }
        entry.clone()
    }

    /// Connects to the stores over TLS.
    pub fn with_client_tls(mut self, tls: strata_grpc::ClientTlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    pub fn status(&self) -> Vec<StoreStatus> {
        self.status.read().clone()
    }

    /// The rules API of every store that may evaluate rules, with the kind its last `Info`
    /// said: the regionals, and the stores that never answered `Info` (one may be a
    /// regional that is down, which the answer must name). Also the globals below this
    /// one, whose regionals' rules this global cannot show.
    pub fn rule_sources(&self) -> (Vec<(strata_rules::remote::RemoteRules, String)>, Vec<String>) {
        let status = self.status();
        let globals = status.iter().filter(|s| s.kind == "global").map(|s| s.address.clone()).collect();
        let sources = status
            .into_iter()
            .filter(|s| s.kind == "regional" || s.kind == "unknown")
            .filter_map(|s| {
                let c = self.client(&s.address).ok()?;
                Some((strata_rules::remote::RemoteRules::new(c.name(), c.channel()), s.kind))
            })
            .collect();
        (sources, globals)
    }

    /// Every store address the configuration names now, sorted, each with the error of
    /// the failed lookup it comes from (its last good answer), if one failed.
    async fn addresses(&self) -> Vec<(String, Option<String>)> {
        let mut all: BTreeMap<String, Option<String>> = self.cfg.stores.iter().map(|a| (a.clone(), None)).collect();
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
        for a in self.files.lock().values().flatten() {
            all.entry(a.clone()).or_insert(None);
        }
        // Hosts to resolve, with the error of the SRV lookup that named them, if it failed.
        let mut hosts: Vec<((String, u16), Option<String>)> = self.cfg.dns.iter().map(|h| (h.clone(), None)).collect();
        if !self.cfg.dns_srv.is_empty() {
            let resolver = self.cfg.dns_resolver.or_else(crate::dns::system_resolver);
            for name in &self.cfg.dns_srv {
                let key = format!("dnssrv+{name}");
                let looked = match resolver {
                    Some(r) => crate::dns::lookup_srv(r, name, Duration::from_secs(5))
                        .await
                        .map(|found| found.into_iter().map(|(h, p)| format!("{h}:{p}")).collect()),
                    None => Err("no resolver: set dns_resolver".to_string()),
                };
                let looked = self.settle(&key, looked);
                for target in looked.answer {
                    if let Some((h, p)) =
                        target.rsplit_once(':').and_then(|(h, p)| Some((h.to_string(), p.parse().ok()?)))
                    {
                        hosts.push(((h, p), looked.error.clone()));
                    }
                }
            }
        }
        for ((host, port), srv_error) in hosts {
            let key = format!("dns+{host}:{port}");
            let looked = match tokio::time::timeout(
                Duration::from_secs(5),
                tokio::net::lookup_host((host.as_str(), port)),
            )
            .await
            {
                Ok(Ok(addrs)) => Ok(addrs.map(|a| a.to_string()).collect()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("timed out".to_string()),
            };
            let looked = self.settle(&key, looked);
            let error = srv_error.or(looked.error);
            for a in looked.answer {
                let slot = all.entry(a).or_insert(None);
                if slot.is_none() {
                    *slot = error.clone();
                }
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
        let found = self.addresses().await;
        let addresses: Vec<String> = found.iter().map(|(a, _)| a.clone()).collect();
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
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok(r) => results.push(r),
                Err(e) => tracing::error!(error = %e, "a store Info task failed"),
            }
        }
        // A store whose Info task itself failed is still a store: asked, and shown down.
        for (i, addr) in addresses.iter().enumerate() {
            if !results.iter().any(|r| r.0 == i) {
                let client = self.client(addr).ok();
                results.push((i, Err((client, "the Info call failed".to_string()))));
            }
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
                    let resolutions: Vec<(i64, i64, i64)> = info
                        .resolution_ranges
                        .iter()
                        .filter(|r| r.resolution_ms > 0 && r.min_time <= r.max_time)
                        .map(|r| (r.resolution_ms, r.min_time, r.max_time))
                        .collect();
                    targets.push(StoreTarget {
                        name: address.clone(),
                        store: Arc::new(client),
                        label_sets: label_sets.clone(),
                        min_time: info.min_time,
                        max_time: info.max_time,
                        resolutions: resolutions.clone(),
                    });
                    status.push(StoreStatus {
                        address,
                        kind: kind_name(info.kind).to_string(),
                        label_sets,
                        min_time: info.min_time,
                        max_time: info.max_time,
                        healthy: true,
                        resolutions,
                        last_error: None,
                        last_check: Some(now),
                        discovery_error: found[i].1.clone(),
                        // (The sender's name is the peer's: cut for logs and messages.)
                        complete_until: info.complete_until.map(|t| (t, info.behind.chars().take(256).collect())),
                    });
                }
                Err((client, error)) => {
                    if previous.iter().find(|p| p.address == address).is_none_or(|p| p.healthy) {
                        tracing::warn!(store = %address, %error, "store unhealthy");
                    }
                    let old = previous.iter().find(|p| p.address == address);
                    if let Some(c) = client {
                        // The labels it had when it last answered, so that a replica of it
                        // that answers can stand in for it (`partial_response=false`); its
                        // times unknown, so no query skips it for them. A store never heard
                        // from is asked for everything and covered by none.
                        let mut t = StoreTarget::new(address.clone(), Arc::new(c));
                        if let Some(o) = old {
                            t.label_sets = o.label_sets.clone();
                        }
                        targets.push(t);
                    }
                    status.push(StoreStatus {
                        address,
                        kind: old.map(|o| o.kind.clone()).unwrap_or_else(|| "unknown".into()),
                        label_sets: old.map(|o| o.label_sets.clone()).unwrap_or_default(),
                        min_time: old.map(|o| o.min_time).unwrap_or(i64::MAX),
                        max_time: old.map(|o| o.max_time).unwrap_or(i64::MIN),
                        healthy: false,
                        resolutions: Vec::new(),
                        last_error: Some(error),
                        last_check: Some(now),
                        discovery_error: found[i].1.clone(),
                        complete_until: old.and_then(|o| o.complete_until.clone()),
                    });
                }
            }
        }
        if let Some(a) = &self.archive {
            a.live.set_targets(targets.clone());
            let (mut target, st) = archive_target(a, now).await;
            // The archive answers for what the stores no longer hold: where they do, they
            // answer with their aggregates and pushdown, and the archive is not read twice.
            let live_from = status
                .iter()
                .filter(|s| s.healthy && s.min_time > i64::MIN && s.min_time <= s.max_time)
                .map(|s| s.min_time)
                .min();
            // What the archive alone answers for ends where the stores' data begins: a
            // shard behind past there is not missing from answers (the stores hold it).
            a.store.set_served_until(live_from.map_or(i64::MAX, |from| from.saturating_sub(1)));
            if let Some(from) = live_from {
                target.max_time = target.max_time.min(from.saturating_sub(1));
                if target.min_time > target.max_time {
                    // Nothing only the archive holds: asked for no time range (a target
                    // whose range is empty would be asked for every one).
                    (target.min_time, target.max_time) = (i64::MIN, i64::MIN);
                }
            }
            targets.push(target);
            status.push(st);
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
                    "resolutions": s.resolutions.iter().map(|r| json!({
                        "resolution": strata_model::duration::format_duration_ms(r.0),
                        "minTime": r.1,
                        "maxTime": r.2,
                    })).collect::<Vec<_>>(),
                    "lastError": s.last_error,
                    "lastCheck": ts(s.last_check),
                    "discoveryError": s.discovery_error,
                    "completeUntil": s.complete_until.as_ref().map(|c| c.0),
                    "behind": s.complete_until.as_ref().map(|c| c.1.clone()),
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
        let info = Arc::new(|| StoreInfo {
            min_time: 5,
            max_time: 9,
            kind: pb::ComponentKind::Edge,
            label_sets: vec![],
            resolutions: vec![],
            complete_until: None,
        });
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

    /// A name that resolved once and then fails to (the DNS server is down, the record
    /// vanished in a rollout): its stores stay in the fan-out from the last answer, marked
    /// with the lookup error in `/api/v1/stores`, never dropped in silence.
    #[tokio::test]
    async fn a_failed_lookup_keeps_the_last_answers_stores_and_says_so() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let info = Arc::new(|| StoreInfo {
            min_time: 5,
            max_time: 9,
            kind: pb::ComponentKind::Edge,
            label_sets: vec![],
            resolutions: vec![],
            complete_until: None,
        });
        let svc = StoreService::new(Arc::new(MemoryStore::default()), Labels::default(), SelectLimits::default(), info);
        tokio::spawn(strata_grpc::serve(
            listener,
            svc,
            strata_grpc::ServeOptions::new(Duration::from_secs(5)),
            std::future::pending(),
        ));
        let dns = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let resolver = dns.local_addr().unwrap();
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let failing = fail.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = dns.recv_from(&mut buf).await {
                let mut a = buf[..n].to_vec();
                a[2] = 0x81;
                if failing.load(std::sync::atomic::Ordering::Relaxed) {
                    a[3] = 0x82; // SERVFAIL, no answers
                    let _ = dns.send_to(&a, from).await;
                    continue;
                }
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
        let text = format!("dns_sd: ['dnssrv+_grpc._tcp.edges.test']\ndns_resolver: '{resolver}'\nstore_timeout: 2s\n");
        let cfg = GlobalConfig::parse(&text, dir.path()).unwrap();
        let fanout = Arc::new(Fanout::new(Vec::new(), Duration::from_secs(2)));
        let set = StoreSet::new(cfg, fanout.clone());
        set.refresh().await;
        assert_eq!(set.status().len(), 1, "{:?}", set.status());
        fail.store(true, std::sync::atomic::Ordering::Relaxed);
        set.refresh().await;
        let st = set.status();
        assert_eq!(st.len(), 1, "the store found by the last good lookup was dropped: {st:?}");
        assert!(st[0].healthy, "the store itself still answers: {st:?}");
        assert!(st[0].discovery_error.as_deref().is_some_and(|e| e.contains("edges.test")), "{st:?}");
        assert_eq!(fanout.targets().len(), 1);
        let page = set.status_json().to_string();
        assert!(page.contains("discoveryError") && page.contains("edges.test"), "{page}");
    }

    /// A regional whose data reaches further than one of its edges has sent everything
    /// (an outage, a backlog on the way): the archiver's coverage stops at that edge's
    /// watermark and names it; a regional whose edges are all current counts to its data.
    #[tokio::test]
    async fn a_regional_edge_behind_holds_the_archive_coverage_at_its_watermark() {
        async fn serve(max_time: i64, complete_until: Option<(i64, String)>) -> String {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let info = Arc::new(move || StoreInfo {
                min_time: 1_000,
                max_time,
                kind: pb::ComponentKind::Regional,
                label_sets: vec![],
                resolutions: vec![],
                complete_until: complete_until.clone(),
            });
            let svc =
                StoreService::new(Arc::new(MemoryStore::default()), Labels::default(), SelectLimits::default(), info);
            tokio::spawn(strata_grpc::serve(
                listener,
                svc,
                strata_grpc::ServeOptions::new(Duration::from_secs(5)),
                std::future::pending(),
            ));
            addr
        }
        let current = serve(9_000, Some((12_000, "{cluster=\"a\"}".into()))).await;
        let behind = serve(10_000, Some((4_000, "{cluster=\"b\"}".into()))).await;
        let dir = tempfile::tempdir().unwrap();
        let set_of = |stores: &[&String]| {
            let text = format!(
                "stores: [{}]\nstore_timeout: 2s\n",
                stores.iter().map(|s| format!("'{s}'")).collect::<Vec<_>>().join(", ")
            );
            StoreSet::new(
                GlobalConfig::parse(&text, dir.path()).unwrap(),
                Arc::new(Fanout::new(Vec::new(), Duration::from_secs(2))),
            )
        };
        let set = set_of(&[&current, &behind]);
        set.refresh().await;
        // An archiver waits a settle time past the watermark too.
        assert_eq!(set.coverage_within(&[], 1_000).complete_until, 3_000);
        let cov = set.coverage();
        assert_eq!(cov.complete_until, 4_000, "{cov:?}");
        let why = cov.behind.unwrap_or_default();
        assert!(why.contains(&behind) && why.contains("cluster=\"b\"") && why.contains("4000"), "{why}");
        let page = set.status_json().to_string();
        assert!(page.contains("\"completeUntil\":4000"), "{page}");
        // Its edges all current: the regional's own data sets the end.
        let set = set_of(&[&current]);
        set.refresh().await;
        let cov = set.coverage();
        assert_eq!((cov.complete_until, cov.behind), (9_000, None));
    }

    /// A fast store over gRPC whose answer the querier reads slowly (150 ms a batch, more
    /// than the store's 300 ms timeout in all): neither the fan-out's timeout nor the
    /// server's stream limits cut it off.
    #[tokio::test]
    async fn a_fast_remote_store_read_slowly_is_not_cut_off() {
        let mut m = MemoryStore::default();
        for i in 0..5000 {
            let labels = Labels::from_pairs([("__name__", "x".to_string()), ("i", format!("{i:05}"))]);
            m.add(labels, strata_model::MetricType::Gauge, [strata_model::Sample::new(1_000, i as f64)]);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let info = Arc::new(|| StoreInfo {
            min_time: 0,
            max_time: 1,
            kind: pb::ComponentKind::Edge,
            label_sets: vec![],
            resolutions: vec![],
            complete_until: None,
        });
        let svc = StoreService::new(Arc::new(m), Labels::default(), SelectLimits::default(), info);
        tokio::spawn(strata_grpc::serve(
            listener,
            svc,
            strata_grpc::ServeOptions::new(Duration::from_secs(120)),
            std::future::pending(),
        ));
        let remote = RemoteStore::new(&addr, RemoteStoreOptions::default()).unwrap();
        let fanout = Fanout::new(vec![StoreTarget::new(addr, Arc::new(remote))], Duration::from_millis(300));
        let scope = strata_store::QueryScope::default();
        let req = strata_store::SelectRequest::new(vec![strata_model::Matcher::eq("__name__", "x")], 0, 10_000);
        let n = scope
            .clone()
            .run(async {
                let mut batches = strata_store::Store::select_batches(&fanout, &req).await.unwrap();
                let mut n = 0;
                while let Some(b) = batches.next_batch().await.unwrap() {
                    n += b.len();
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
                n
            })
            .await;
        assert!(scope.warnings().is_empty(), "{:?}", scope.warnings());
        assert_eq!(n, 5000);
    }
}
