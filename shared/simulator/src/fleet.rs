//! The simulated fleet: every value is a pure function of (seed, node, GPU, wall time), so
//! two scrapes at the same instant see the same page and a restart changes nothing.
//!
//! Time is cut into 10-minute slots. A GPU runs one job for three slots (training,
//! inference or idle); the job drives utilisation, and power, temperatures, clocks and
//! memory follow it. Events, each decided by hashing its time window:
//! * driver reload (per node, at most once per 4 h): counters restart from zero, XID clears;
//! * XID error (per GPU and slot, rare): the XID gauge holds the code until the next reload;
//! * a GPU falls off the bus for 15 minutes (per node and 2 h window): it leaves the page;
//! * thermal episode (per GPU and hour): memory temperature climbs for 7 minutes, then the
//!   GPU throttles (SM clock down, temperature up) for 3 more.
//!
//! Two GPUs of every fourth node are MIG-partitioned into three instances; pod attribution
//! changes with the job.

use crate::fields::{Kind, DRIVER_VERSION, FIELDS, UNSUPPORTED};
use std::fmt::Write;

const SLOT_S: i64 = 600;
const JOB_SLOTS: i64 = 3;
const RELOAD_WINDOW_S: i64 = 4 * 3600;
const BUS_WINDOW_S: i64 = 2 * 3600;
const BUS_OUT_S: i64 = 900;
const THERMAL_WINDOW_S: i64 = 3600;
const THERMAL_S: i64 = 600;
const XID_CODES: [u32; 6] = [13, 31, 43, 48, 79, 94];
const MIG_PROFILES: [(&str, u32); 3] = [("1g.10gb", 9), ("2g.20gb", 5), ("3g.40gb", 2)];

#[derive(Debug, Clone)]
pub struct Fleet {
    pub seed: u64,
    pub nodes: usize,
    pub gpus_per_node: usize,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Deterministic hash of a seed and a few coordinates.
fn h(seed: u64, parts: &[i64]) -> u64 {
    parts.iter().fold(mix(seed), |acc, &p| mix(acc ^ (p as u64)))
}

/// Uniform in [0, 1).
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Job {
    Idle,
    Training { intensity: f64 },
    Inference { intensity: f64 },
}

struct Attribution {
    namespace: String,
    pod: String,
    container: &'static str,
}

impl Fleet {
    pub fn new(seed: u64, nodes: usize, gpus_per_node: usize) -> Self {
        Fleet { seed, nodes, gpus_per_node }
    }

    pub fn hostname(&self, node: usize) -> String {
        format!("gpu-node-{node:03}")
    }

    fn uuid(&self, node: usize, gpu: usize) -> String {
        let a = h(self.seed, &[1, node as i64, gpu as i64]);
        format!(
            "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xffff,
            (a >> 48) ^ 0xabcd,
            mix(a) & 0xffff_ffff_ffff
        )
    }

    pub fn is_mig(&self, node: usize, gpu: usize) -> bool {
        node % 4 == 3 && gpu + 2 >= self.gpus_per_node
    }

    fn job(&self, node: usize, gpu: usize, t: i64) -> (Job, i64) {
        // GPUs of a node share jobs in pairs, as an 8-GPU job split in tensor-parallel groups would.
        let group = (gpu / 2) as i64;
        let epoch = (t / SLOT_S + node as i64) / JOB_SLOTS;
        let x = h(self.seed, &[2, node as i64, group, epoch]);
        let intensity = 0.75 + 0.25 * unit(mix(x));
        let job = match x % 10 {
            0 | 1 => Job::Idle,
            2 | 3 => Job::Inference { intensity },
            _ => Job::Training { intensity },
        };
        (job, epoch)
    }

    fn attribution(&self, node: usize, gpu: usize, t: i64) -> Attribution {
        let (job, epoch) = self.job(node, gpu, t);
        let x = h(self.seed, &[3, node as i64, (gpu / 2) as i64, epoch]);
        let team = ["team-a", "team-b", "team-c", "research"][(x % 4) as usize];
        match job {
            Job::Idle => Attribution { namespace: String::new(), pod: String::new(), container: "" },
            Job::Training { .. } => {
                Attribution { namespace: team.into(), pod: format!("llm-pretrain-{}", x % 1000), container: "trainer" }
            }
            Job::Inference { .. } => Attribution {
                namespace: team.into(),
                pod: format!("serve-{}-{:04x}", x % 50, (x >> 20) & 0xffff),
                container: "server",
            },
        }
    }

    /// Utilisation in percent at second `t`: training runs hot with dips at checkpoints,
    /// inference follows a diurnal-ish wave, idle is zero.
    fn util(&self, node: usize, gpu: usize, t: i64) -> f64 {
        let (job, _) = self.job(node, gpu, t);
        let noise = unit(h(self.seed, &[4, node as i64, gpu as i64, t / 5])) * 6.0 - 3.0;
        let u = match job {
            Job::Idle => return 0.0,
            Job::Training { intensity } => {
                let in_slot = t.rem_euclid(SLOT_S);
                if in_slot < 20 {
                    15.0
                } else {
                    100.0 * intensity + noise
                }
            }
            Job::Inference { intensity } => {
                let phase = (t as f64 / 900.0 + gpu as f64).sin();
                (45.0 + 30.0 * phase) * intensity + noise
            }
        };
        u.clamp(0.0, 100.0).round()
    }

    /// Reload instant of the node's driver in the 4 h window holding `t`, if any.
    fn reload_in_window(&self, node: usize, window: i64) -> Option<i64> {
        let x = h(self.seed, &[5, node as i64, window]);
        // Random reloads, plus one guaranteed every 12 windows (48 h) so uptime is bounded.
        let forced = window.rem_euclid(12) == (node % 12) as i64;
        (x.is_multiple_of(6) || forced).then(|| window * RELOAD_WINDOW_S + (mix(x) % RELOAD_WINDOW_S as u64) as i64)
    }

    /// Start of the current driver epoch (last reload at or before `t`).
    fn boot_time(&self, node: usize, t: i64) -> i64 {
        let w = t.div_euclid(RELOAD_WINDOW_S);
        for back in 0..=13 {
            if let Some(r) = self.reload_in_window(node, w - back) {
                if r <= t {
                    return r;
                }
            }
        }
        unreachable_boot(w)
    }

    /// GPU that is off the bus at `t`, if any.
    pub fn gpu_off_bus(&self, node: usize, t: i64) -> Option<usize> {
        let w = t.div_euclid(BUS_WINDOW_S);
        let x = h(self.seed, &[6, node as i64, w]);
        if !x.is_multiple_of(10) {
            return None;
        }
        let start = w * BUS_WINDOW_S + (mix(x) % (BUS_WINDOW_S - BUS_OUT_S) as u64) as i64;
        (t >= start && t < start + BUS_OUT_S).then(|| (x >> 32) as usize % self.gpus_per_node)
    }

    /// The first whole minute at or after `from_s` (seconds) that starts `span_s` seconds in
    /// which no node has a GPU off the bus or reloads its driver: tests that count GPUs or
    /// compare counters start the simulated clock there (`simulate --start-at`), so what
    /// they see does not depend on the hour they run. None when no such span begins within
    /// a week.
    pub fn quiet_from(&self, from_s: i64, span_s: i64) -> Option<i64> {
        let quiet = |node: usize, t: i64| {
            let end = t.saturating_add(span_s);
            // A bus outage lasts 15 minutes: probes 5 minutes apart see every one.
            let probes = (0..=span_s / 300).map(|k| t.saturating_add(k * 300)).chain([end]);
            self.boot_time(node, end) <= t && probes.into_iter().all(|p| self.gpu_off_bus(node, p).is_none())
        };
        let first = from_s.div_euclid(60).saturating_add(1).saturating_mul(60);
        (0..7 * 24 * 60).map(|m| first.saturating_add(m * 60)).find(|&t| (0..self.nodes).all(|n| quiet(n, t)))
    }

    /// The thermal episodes that begin in `[from_s, to_s)` (seconds), earliest first:
    /// `(node, gpu, start)`. An episode lasts ten minutes: memory temperature climbs 28 °C
    /// over its first seven, then the GPU throttles. For benchmarks that time alerts.
    pub fn thermal_episodes(&self, from_s: i64, to_s: i64) -> Vec<(usize, usize, i64)> {
        let mut out = Vec::new();
        for node in 0..self.nodes {
            for gpu in 0..self.gpus_per_node {
                let mut w = from_s.div_euclid(THERMAL_WINDOW_S);
                while w.saturating_mul(THERMAL_WINDOW_S) < to_s {
                    if let Some(start) = self.thermal_start(node, gpu, w) {
                        if (from_s..to_s).contains(&start) {
                            out.push((node, gpu, start));
                        }
                    }
                    w += 1;
                }
            }
        }
        out.sort_by_key(|e| e.2);
        out
    }

    /// When the thermal episode of window `w` begins, if it has one.
    fn thermal_start(&self, node: usize, gpu: usize, w: i64) -> Option<i64> {
        let x = h(self.seed, &[7, node as i64, gpu as i64, w]);
        x.is_multiple_of(12).then(|| w * THERMAL_WINDOW_S + (mix(x) % (THERMAL_WINDOW_S - THERMAL_S) as u64) as i64)
    }

    /// Seconds into a thermal episode, if one is running.
    fn thermal(&self, node: usize, gpu: usize, t: i64) -> Option<i64> {
        let start = self.thermal_start(node, gpu, t.div_euclid(THERMAL_WINDOW_S))?;
        (t >= start && t < start + THERMAL_S).then_some(t - start)
    }

    fn mean_power(&self, node: usize, gpu: usize, slot: i64) -> f64 {
        // Mean draw over a slot, from the mean utilisation of its job.
        let t = slot * SLOT_S + SLOT_S / 2;
        let (job, _) = self.job(node, gpu, t);
        let u = match job {
            Job::Idle => 0.0,
            Job::Training { intensity } => 100.0 * intensity,
            Job::Inference { intensity } => 45.0 * intensity,
        };
        70.0 + 6.3 * u
    }

    /// Energy in mJ since the driver epoch began: the integral of the slot mean power.
    fn energy_mj(&self, node: usize, gpu: usize, t: i64) -> u64 {
        let boot = self.boot_time(node, t);
        let mut e = 0.0;
        let mut s = boot;
        while s < t {
            let slot = s.div_euclid(SLOT_S);
            let end = ((slot + 1) * SLOT_S).min(t);
            e += self.mean_power(node, gpu, slot) * (end - s) as f64;
            s = end;
        }
        (e * 1000.0) as u64
    }

    fn last_xid(&self, node: usize, gpu: usize, t: i64) -> u32 {
        let boot = self.boot_time(node, t);
        let mut slot = t.div_euclid(SLOT_S);
        while slot * SLOT_S + SLOT_S > boot && slot * SLOT_S + SLOT_S > t - 48 * 3600 {
            let x = h(self.seed, &[8, node as i64, gpu as i64, slot]);
            if x.is_multiple_of(150) {
                let at = slot * SLOT_S + (mix(x) % SLOT_S as u64) as i64;
                if at <= t && at >= boot {
                    return XID_CODES[(x >> 40) as usize % XID_CODES.len()];
                }
            }
            slot -= 1;
        }
        0
    }

    /// One node's page at wall time `t_ms`, or `None` for a node that does not exist.
    pub fn render_node(&self, node: usize, t_ms: i64) -> Option<String> {
        if node >= self.nodes {
            return None;
        }
        let t = t_ms.div_euclid(1000);
        let host = self.hostname(node);
        // Quirks that differ between exporter releases, one per node class.
        let sep = if node % 3 == 1 { ", " } else { "," };
        let meta_first = node % 3 == 2;
        let off_bus = self.gpu_off_bus(node, t);

        struct Instance {
            gpu: usize,
            mig: Option<(&'static str, u32, usize)>,
        }
        let mut instances = Vec::new();
        for gpu in 0..self.gpus_per_node {
            if Some(gpu) == off_bus {
                continue;
            }
            if self.is_mig(node, gpu) {
                for (i, (p, _)) in MIG_PROFILES.iter().enumerate() {
                    instances.push(Instance { gpu, mig: Some((p, MIG_PROFILES[i].1, i)) });
                }
            } else {
                instances.push(Instance { gpu, mig: None });
            }
        }

        let mut label_sets = Vec::with_capacity(instances.len());
        for inst in &instances {
            let g = inst.gpu;
            let a = self.attribution(node, g, t);
            let mut l = String::with_capacity(256);
            let _ = write!(
                l,
                "gpu=\"{g}\"{sep}UUID=\"{}\"{sep}pci_bus_id=\"00000000:{:02X}:00.0\"{sep}device=\"nvidia{g}\"{sep}modelName=\"NVIDIA H100 80GB HBM3\"{sep}Hostname=\"{host}\"",
                self.uuid(node, g),
                0x0d + g * 0x10,
            );
            if let Some((profile, _, id)) = inst.mig {
                let _ = write!(l, "{sep}GPU_I_PROFILE=\"{profile}\"{sep}GPU_I_ID=\"{}\"", id + 1);
            }
            let _ = write!(
                l,
                "{sep}container=\"{}\"{sep}namespace=\"{}\"{sep}pod=\"{}\"{sep}DCGM_FI_DRIVER_VERSION=\"{DRIVER_VERSION}\"",
                a.container, a.namespace, a.pod
            );
            label_sets.push(l);
        }

        let mut out = String::with_capacity(FIELDS.len() * (80 + instances.len() * 300));
        if meta_first {
            for f in FIELDS {
                let _ = writeln!(out, "# HELP {} {}\n# TYPE {} {}", f.name, f.help, f.name, kind_str(f.kind));
            }
        }
        for f in FIELDS {
            if !meta_first {
                let _ = writeln!(out, "# HELP {} {}\n# TYPE {} {}", f.name, f.help, f.name, kind_str(f.kind));
            }
            for (inst, labels) in instances.iter().zip(&label_sets) {
                let _ = write!(out, "{}{{{}}} ", f.name, labels);
                self.write_value(&mut out, f.name, node, inst.gpu, inst.mig.map(|m| (m.1, m.2)), t);
                out.push('\n');
            }
        }
        Some(out)
    }

    fn write_value(&self, out: &mut String, field: &str, node: usize, gpu: usize, mig: Option<(u32, usize)>, t: i64) {
        let n = node as i64;
        let g = gpu as i64;
        let noise = |k: i64| unit(h(self.seed, &[9, n, g, k, t / 5]));
        let share = mig.map(|(slices, _)| 7.0 / slices as f64).map(|d| 1.0 / d).unwrap_or(1.0);
        let thermal = self.thermal(node, gpu, t);
        let throttling = thermal.is_some_and(|s| s >= 420);
        let mut util = self.util(node, gpu, t);
        if throttling {
            util = (util * 0.7).round();
        }
        let power = 70.0 + 6.3 * util * share + noise(1) * 8.0 - 4.0;
        let base_temp = 32.0 + 0.45 * util + noise(2) * 2.0;
        let _ = match field {
            "DCGM_FI_DEV_SM_CLOCK" => write!(
                out,
                "{}",
                if throttling {
                    1410
                } else if util > 0.0 {
                    1980
                } else {
                    345
                }
            ),
            "DCGM_FI_DEV_MEM_CLOCK" => write!(out, "2619"),
            "DCGM_FI_DEV_GPU_TEMP" => write!(out, "{}", (base_temp + if throttling { 12.0 } else { 0.0 }).round()),
            "DCGM_FI_DEV_MEMORY_TEMP" => {
                let climb = thermal.map(|s| (s.min(420) as f64 / 420.0) * 28.0).unwrap_or(0.0);
                write!(out, "{}", (base_temp + 6.0 + climb).round())
            }
            "DCGM_FI_DEV_POWER_USAGE" => write!(out, "{:.6}", (power * 1000.0).round() / 1000.0),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" => {
                write!(out, "{}", (self.energy_mj(node, gpu, t) as f64 * share) as u64)
            }
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" => write!(out, "{}", (t - self.boot_time(node, t)) / 7200),
            "DCGM_FI_DEV_GPU_UTIL" => write!(out, "{}", util),
            "DCGM_FI_DEV_MEM_COPY_UTIL" => write!(out, "{}", (util * 0.6 + noise(3) * 4.0).round().clamp(0.0, 100.0)),
            "DCGM_FI_DEV_ENC_UTIL" if mig.is_some() => write!(out, "{UNSUPPORTED}"),
            "DCGM_FI_DEV_ENC_UTIL" => write!(out, "0"),
            "DCGM_FI_DEV_DEC_UTIL" => {
                write!(out, "{}", if util > 0.0 && gpu % 4 == 3 { (noise(4) * 10.0).round() } else { 0.0 })
            }
            "DCGM_FI_DEV_XID_ERRORS" => write!(out, "{}", self.last_xid(node, gpu, t)),
            "DCGM_FI_DEV_FB_USED" | "DCGM_FI_DEV_FB_FREE" => {
                let total = (81559.0 * share).round();
                let used = if util > 0.0 { (total * (0.55 + 0.4 * noise(5))).round() } else { 0.0 };
                write!(out, "{}", if field == "DCGM_FI_DEV_FB_USED" { used } else { total - used })
            }
            "DCGM_FI_DEV_FB_RESERVED" => write!(out, "{}", if mig.is_some() { 0 } else { 522 }),
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" => {
                write!(out, "{}", (self.energy_mj(node, gpu, t) / 1000) * if mig.is_some() { 0 } else { 37 })
            }
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS" => write!(out, "0"),
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS" => write!(out, "0"),
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS" => {
                write!(out, "{}", if (node + gpu).is_multiple_of(11) { 2 } else { 0 })
            }
            "DCGM_FI_DEV_ROW_REMAP_FAILURE" => write!(out, "0"),
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => write!(out, "{:.6}", (util / 100.0 * 0.98).min(1.0)),
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" => {
                write!(out, "{:.6}", (util / 100.0 * (0.35 + 0.2 * noise(6))).min(1.0))
            }
            "DCGM_FI_PROF_DRAM_ACTIVE" => write!(out, "{:.6}", (util / 100.0 * (0.5 + 0.2 * noise(7))).min(1.0)),
            "DCGM_FI_PROF_PCIE_TX_BYTES" => write!(out, "{}", ((util * 2.0e7) * (0.5 + noise(8))) as u64),
            "DCGM_FI_PROF_PCIE_RX_BYTES" => write!(out, "{}", ((util * 6.0e7) * (0.5 + noise(9))) as u64),
            _ => write!(out, "0"),
        };
    }
}

/// Never reached: a reload is forced every 12 windows and the search covers 13.
fn unreachable_boot(w: i64) -> i64 {
    (w - 13) * RELOAD_WINDOW_S
}

fn kind_str(k: Kind) -> &'static str {
    match k {
        Kind::Gauge => "gauge",
        Kind::Counter => "counter",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_span_has_every_gpu_and_no_reload() {
        let f = Fleet::new(1, 4, 8);
        // From the start of a day, every hour for a month: what it finds is quiet to the
        // second, and a loud instant is never chosen.
        for k in 0..24 * 30 {
            let from = 1_790_000_000 + k * 3600;
            let t = f.quiet_from(from, 3600).expect("a quiet hour within a week");
            assert!(t > from && t - from < 7 * 86_400);
            for node in 0..4 {
                let boot = f.boot_time(node, t);
                for s in (t..=t + 3600).step_by(7) {
                    assert_eq!(f.gpu_off_bus(node, s), None, "node {node} at {s}");
                    assert_eq!(f.boot_time(node, s), boot, "node {node} reloads at {s}");
                }
            }
        }
    }

    const T: i64 = 1_764_460_800_000;

    #[test]
    fn same_instant_same_page_and_seed_matters() {
        let f = Fleet::new(1, 4, 8);
        assert_eq!(f.render_node(0, T), f.render_node(0, T + 999));
        assert_ne!(f.render_node(0, T), Fleet::new(2, 4, 8).render_node(0, T));
        assert!(f.render_node(4, T).is_none());
    }

    #[test]
    fn page_has_every_field_with_help_and_type() {
        let f = Fleet::new(1, 4, 8);
        let page = f.render_node(0, T).unwrap();
        for field in FIELDS {
            assert!(page.contains(&format!("# TYPE {} ", field.name)), "{}", field.name);
            assert!(page.contains(&format!("# HELP {} {}", field.name, field.help)));
        }
        assert!(page.contains("DCGM_FI_DRIVER_VERSION=\"550.54.15\""));
        assert!(!page.contains("_total{"), "DCGM counters have no _total suffix");
    }

    #[test]
    fn quirks_spread_over_nodes() {
        let f = Fleet::new(1, 4, 8);
        assert!(f.render_node(1, T).unwrap().contains("\", UUID="));
        let meta_first = f.render_node(2, T).unwrap();
        let last_type = meta_first.rfind("# TYPE").unwrap();
        let first_sample = meta_first.find("DCGM_FI_DEV_SM_CLOCK{").unwrap();
        assert!(last_type < first_sample, "node 2 prints all metadata first");
        let mig = f.render_node(3, T).unwrap();
        assert!(mig.contains("GPU_I_PROFILE=\"1g.10gb\""));
        assert!(mig.contains(UNSUPPORTED));
    }

    #[test]
    fn energy_counter_is_monotonic_between_reloads_and_resets_on_reload() {
        let f = Fleet::new(3, 8, 8);
        let mut resets = 0;
        for node in 0..8 {
            let mut prev = 0u64;
            for step in 0..(24 * 720) {
                let t = T / 1000 + step * 5;
                let e = f.energy_mj(node, 0, t);
                if e < prev {
                    resets += 1;
                    assert_eq!(f.boot_time(node, t), f.boot_time(node, t), "deterministic");
                    assert!(f.boot_time(node, t) > t - 5, "a decrease happens only at a reload");
                }
                prev = e;
            }
        }
        assert!(resets > 0, "a day of 8 nodes sees at least one driver reload");
    }

    #[test]
    fn rare_events_happen_over_a_day() {
        let f = Fleet::new(5, 16, 8);
        let (mut off, mut xid, mut thermal, mut pods) = (false, false, false, std::collections::HashSet::new());
        for step in 0..(24 * 60) {
            let t = T / 1000 + step * 60;
            for node in 0..16 {
                off |= f.gpu_off_bus(node, t).is_some();
                for gpu in 0..8 {
                    xid |= f.last_xid(node, gpu, t) != 0;
                    thermal |= f.thermal(node, gpu, t).is_some();
                }
                pods.insert(f.attribution(node, 0, t).pod);
            }
        }
        assert!(off && xid && thermal, "off={off} xid={xid} thermal={thermal}");
        assert!(pods.len() > 20, "pod attribution changes with jobs");
    }

    #[test]
    fn a_gpu_off_the_bus_leaves_the_page() {
        let f = Fleet::new(5, 16, 8);
        let (node, t) = (0..16)
            .flat_map(|n| (0..1440).map(move |m| (n, T / 1000 + m * 60)))
            .find(|&(n, t)| f.gpu_off_bus(n, t).is_some())
            .expect("some GPU falls off within a day");
        let gpu = f.gpu_off_bus(node, t).unwrap();
        let page = f.render_node(node, t * 1000).unwrap();
        assert!(!page.contains(&format!("device=\"nvidia{gpu}\"")));
    }

    #[test]
    fn thermal_episode_memory_climbs_before_throttle() {
        let f = Fleet::new(5, 16, 8);
        let (node, gpu, start) = (0..16)
            .flat_map(|n| (0..8).flat_map(move |g| (0..1440).map(move |m| (n, g, T / 1000 + m * 60))))
            .find(|&(n, g, t)| f.thermal(n, g, t) == Some(0) || f.thermal(n, g, t).is_some_and(|s| s < 60))
            .expect("an episode starts within a day");
        let s0 = f.thermal(node, gpu, start).unwrap();
        let begin = start - s0;
        let mem = |t: i64| {
            let page = f.render_node(node, t * 1000).unwrap();
            let line = page
                .lines()
                .find(|l| l.starts_with("DCGM_FI_DEV_MEMORY_TEMP{") && l.contains(&format!("device=\"nvidia{gpu}\"")))
                .unwrap()
                .to_string();
            line
        };
        let clock = |t: i64| {
            f.render_node(node, t * 1000).unwrap().lines().any(|l| {
                l.starts_with("DCGM_FI_DEV_SM_CLOCK{")
                    && l.contains(&format!("device=\"nvidia{gpu}\""))
                    && l.ends_with(" 1410")
            })
        };
        assert!(!clock(begin + 60), "no throttle in the first minutes");
        assert!(clock(begin + 500), "throttles after memory temperature climbed");
        let _ = mem(begin);
    }
}
