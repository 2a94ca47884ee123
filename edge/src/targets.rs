//! From discovered target groups to scrape targets, as Prometheus' `populateLabels`:
//! job-level labels fill in what discovery left unset, `relabel_configs` run, `instance`
//! defaults to `__address__`, and labels starting with `__` are removed after the scrape
//! URL was taken from them.

use crate::config::{ScrapeJob, StaticConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use strata_ingest::relabel;
use strata_model::duration::format_duration;
use strata_model::is_valid_label_name;
use strata_model::{Labels, LabelsBuilder};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub job: String,
    /// The labels every series of this target carries.
    pub labels: Labels,
    pub url: String,
}

impl Target {
    pub fn key(&self) -> (String, String, u64) {
        (self.job.clone(), self.url.clone(), self.labels.stable_hash())
    }
}

/// Expands a path whose file name may hold `*` wildcards, as file SD allows.
pub fn expand_glob(pattern: &Path) -> Vec<PathBuf> {
    let Some(name) = pattern.file_name().and_then(|n| n.to_str()) else { return vec![] };
    if !name.contains('*') && !name.contains('?') {
        return vec![pattern.to_path_buf()];
    }
    let dir = pattern.parent().unwrap_or(Path::new("."));
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|f| wildcard(name.as_bytes(), f.as_bytes())))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

fn wildcard(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => wildcard(&p[1..], s) || (!s.is_empty() && wildcard(p, &s[1..])),
        (Some(b'?'), Some(_)) => wildcard(&p[1..], &s[1..]),
        (Some(a), Some(b)) if a == b => wildcard(&p[1..], &s[1..]),
        _ => false,
    }
}

/// Reads one file-SD file (JSON or YAML by extension).
pub fn read_sd_file(path: &Path) -> Result<Vec<StaticConfig>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let groups: Vec<StaticConfig> = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?,
        Some("yml") | Some("yaml") => {
            if text.trim().is_empty() {
                vec![]
            } else {
                serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
            }
        }
        _ => return Err(format!("{}: file SD needs a .json, .yml or .yaml file", path.display())),
    };
    for g in &groups {
        if let Some(bad) = g.labels.keys().find(|k| !is_valid_label_name(k)) {
            return Err(format!("{}: invalid label name {bad:?}", path.display()));
        }
    }
    Ok(groups)
}

/// Builds the targets of one job from its target groups. Targets that relabeling drops
/// are left out; targets that cannot be built are reported as errors.
pub fn build_targets(job: &ScrapeJob, groups: &[StaticConfig]) -> (Vec<Target>, Vec<String>) {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for g in groups {
        for addr in &g.targets {
            let mut lb = LabelsBuilder::default();
            for (k, v) in &g.labels {
                lb.set(k, v);
            }
            lb.set("__address__", addr);
            match populate(job, lb) {
                Ok(Some(t)) => out.push(t),
                Ok(None) => {}
                Err(e) => errors.push(format!("job {:?}, target {addr:?}: {e}", job.job_name)),
            }
        }
    }
    out.sort_by(|a, b| a.labels.cmp(&b.labels));
    out.dedup();
    (out, errors)
}

fn populate(job: &ScrapeJob, mut lb: LabelsBuilder) -> Result<Option<Target>, String> {
    let defaults: [(&str, String); 5] = [
        ("job", job.job_name.clone()),
        ("__scrape_interval__", format_duration(job.interval)),
        ("__scrape_timeout__", format_duration(job.timeout)),
        ("__metrics_path__", job.metrics_path.clone()),
        ("__scheme__", job.scheme.clone()),
    ];
    for (k, v) in defaults {
        if lb.get(k).is_none() {
            lb.set(k, &v);
        }
    }
    for (k, vs) in &job.params {
        let name = format!("__param_{k}");
        if lb.get(&name).is_none() {
            if let Some(v) = vs.first() {
                lb.set(&name, v);
            }
        }
    }
    let Some(labels) = relabel::process(&job.relabel, lb) else { return Ok(None) };
    let addr = labels.get("__address__").ok_or("no address")?.to_string();
    if addr.contains('/') {
        return Err(format!("{addr:?} is not a valid hostname"));
    }
    let scheme = labels.get("__scheme__").unwrap_or("http");
    let path = labels.get("__metrics_path__").unwrap_or("/metrics");
    let mut query: BTreeMap<String, Vec<String>> = job.params.clone();
    for l in labels.iter() {
        if let Some(p) = l.name.strip_prefix("__param_") {
            // A relabeled parameter replaces the first configured value.
            let e = query.entry(p.to_string()).or_default();
            if e.is_empty() {
                e.push(l.value.to_string());
            } else {
                e[0] = l.value.to_string();
            }
        }
    }
    let mut url = format!("{scheme}://{addr}{path}");
    let mut sep = if path.contains('?') { '&' } else { '?' };
    for (k, vs) in &query {
        for v in vs {
            url.push(sep);
            url.push_str(&form_encode(k));
            url.push('=');
            url.push_str(&form_encode(v));
            sep = '&';
        }
    }
    let mut final_lb = labels.to_builder();
    if final_lb.get("instance").is_none() {
        final_lb.set("instance", &addr);
    }
    final_lb.retain(|l| !l.name.starts_with("__"));
    Ok(Some(Target { job: job.job_name.clone(), labels: final_lb.build(), url }))
}

fn form_encode(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => o.push(b as char),
            b' ' => o.push('+'),
            _ => o.push_str(&format!("%{b:02X}")),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EdgeConfig;

    fn job(yaml: &str) -> ScrapeJob {
        EdgeConfig::parse(yaml, Path::new("x.yml")).unwrap().jobs.remove(0)
    }

    #[test]
    fn target_labels_and_url_like_prometheus() {
        let j = job("scrape_configs:\n  - job_name: dcgm\n    metrics_path: /node/1/metrics\n    params: {a: [x y]}\n    static_configs:\n      - targets: ['127.0.0.1:9400']\n        labels: {rack: r1}\n");
        let (t, errs) = build_targets(&j, &j.static_configs);
        assert!(errs.is_empty());
        assert_eq!(t[0].url, "http://127.0.0.1:9400/node/1/metrics?a=x+y");
        assert_eq!(t[0].labels, Labels::from_pairs([("instance", "127.0.0.1:9400"), ("job", "dcgm"), ("rack", "r1")]));
    }

    #[test]
    fn relabeling_sets_path_and_drops_targets() {
        let j = job(concat!(
            "scrape_configs:\n  - job_name: sim\n    static_configs:\n      - targets: ['h:1/0', 'h:1/1', 'h:1/2']\n",
            "    relabel_configs:\n",
            "      - source_labels: [__address__]\n        regex: '.*/(\\d+)'\n        target_label: __metrics_path__\n        replacement: /node/$1/metrics\n",
            "      - source_labels: [__address__]\n        regex: '.*/(\\d+)'\n        target_label: node\n",
            "      - source_labels: [__address__]\n        regex: '(.*)/.*'\n        target_label: __address__\n",
            "      - source_labels: [node]\n        regex: '2'\n        action: drop\n",
        ));
        let (t, errs) = build_targets(&j, &j.static_configs);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].url, "http://h:1/node/0/metrics");
        assert_eq!(t[1].labels.get("node"), Some("1"));
        assert_eq!(t[1].labels.get("instance"), Some("h:1"));
    }

    #[test]
    fn file_sd_json_and_yaml_with_globs() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.json"), r#"[{"targets": ["x:1"], "labels": {"zone": "z"}}]"#).unwrap();
        std::fs::write(d.path().join("b.yml"), "- targets: ['y:2']\n").unwrap();
        std::fs::write(d.path().join("bad.json"), "[{").unwrap();
        let files = expand_glob(&d.path().join("*.json"));
        assert_eq!(files.len(), 2);
        assert!(read_sd_file(&d.path().join("a.json")).unwrap()[0].labels.contains_key("zone"));
        assert_eq!(read_sd_file(&d.path().join("b.yml")).unwrap()[0].targets, ["y:2"]);
        assert!(read_sd_file(&d.path().join("bad.json")).is_err());
    }
}
