//! Helpers for end-to-end tests: start `strata` processes on loopback with free ports,
//! wait for them, stop them. Every process is killed when its guard drops.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port below the kernel's ephemeral range, never the same twice in this
/// run: a port the kernel picks (`:0`) is in that range, which every outgoing connection
/// draws from too, so a test that stops a server and starts it again on its port could
/// find it taken by some other test's client in between.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    static SEED: AtomicU64 = AtomicU64::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (lo, hi) = (10_000u16, ephemeral.max(10_001));
    let mut x = SEED.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        ^ u64::from(std::process::id())
        ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    for _ in 0..500 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = lo + (x % u64::from(hi - lo)) as u16;
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free loopback port")
}

pub struct Proc {
    pub name: String,
    pub child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    /// Starts a program with its output in `<dir>/<name>.log`.
    pub fn start(program: &str, args: &[String], dir: &Path, name: &str) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let f = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("log file");
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("log file"))
            .stderr(f)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {program}: {e}"));
        Proc { name: name.to_string(), child: Some(child), log }
    }

    pub fn strata(args: &[&str], dir: &Path, name: &str) -> Proc {
        Self::strata_with_env(args, &[], dir, name)
    }

    /// [`strata`](Self::strata) with extra environment variables.
    pub fn strata_with_env(args: &[&str], env: &[(&str, &str)], dir: &Path, name: &str) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let f = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("log file"))
            .stderr(f)
            .spawn()
            .unwrap_or_else(|e| panic!("starting strata: {e}"));
        Proc { name: name.to_string(), child: Some(child), log }
    }

    /// Waits up to `within` for the process to exit; returns how it ended.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    self.child = None;
                    return Some(st);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, as a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends SIGTERM and returns at once (the process may still be stopping).
    pub fn signal_term(&self) {
        if let Some(c) = self.child.as_ref() {
            let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
        }
    }

    /// SIGTERM, then wait up to 30 s.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
            panic!("{} did not stop within 30 s of SIGTERM", self.name);
        }
    }

    pub fn assert_running(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(st)) = c.try_wait() {
                panic!("{} exited early ({st}):\n{}", self.name, self.log_text());
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build().expect("http client")
}

/// Polls `url` until it answers 200, failing with the process log after `within`.
pub fn wait_ready(url: &str, p: &mut Proc, within: Duration) {
    let c = client();
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        p.assert_running();
        if c.get(url).send().map(|r| r.status().is_success()).unwrap_or(false) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{url} not ready within {within:?}; log of {}:\n{}", p.name, p.log_text());
}

/// Reads one unlabelled sample value from a /metrics page.
pub fn metric_value(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l[name.len() + 1..].trim().parse().ok())
}

pub use strata_model::time::now_ms;

/// The `data` of a Prometheus API answer. Anything but HTTP 200 with `"status":"success"`
/// fails the test: an API error must never read as an empty answer.
pub fn api_data(url: &str) -> serde_json::Value {
    let resp = client().get(url).send().unwrap_or_else(|e| panic!("{url}: {e}"));
    let code = resp.status().as_u16();
    let text = resp.text().unwrap_or_else(|e| panic!("{url}: {e}"));
    assert_eq!(code, 200, "{url} answered {code}: {text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: {e}: {text}"));
    assert_eq!(v["status"], "success", "{url}: {text}");
    v["data"].clone()
}

/// The number of series `match[]` selects (URL-encoded as needed).
pub fn series_count(base: &str, selector: &str) -> usize {
    let enc = selector.replace('{', "%7B").replace('}', "%7D").replace('"', "%22").replace('=', "%3D");
    let data = api_data(&format!("{base}/api/v1/series?match[]={enc}"));
    data.as_array().unwrap_or_else(|| panic!("series data is not an array: {data}")).len()
}

/// Whether the test may use Debian's `prometheus` and `promtool`. Without them the test
/// fails and says so, unless STRATA_SKIP_PROMETHEUS=1 is set on purpose (never under CI=true),
/// in which case it says it skipped.
/// Records that a suite did not run and why: printed (visible with `--nocapture`) and, when
/// the test command set `STRATA_NOT_RUN_DIR`, written there for its closing summary, so a
/// suite that did not run never reads as passed.
pub fn report_not_run(suite: &str, reason: &str) {
    println!("NOT RUN: {suite}: {reason}");
    if let Ok(dir) = std::env::var("STRATA_NOT_RUN_DIR") {
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(Path::new(&dir).join(suite.replace(['/', ' '], "_")), format!("{suite}: {reason}\n"));
    }
}

pub fn require_prometheus() -> bool {
    let installed = Command::new("prometheus").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    if installed {
        return true;
    }
    let in_ci = std::env::var("CI").as_deref() == Ok("true");
    if !in_ci && std::env::var("STRATA_SKIP_PROMETHEUS").as_deref() == Ok("1") {
        report_not_run("tests needing Prometheus", "prometheus not installed and STRATA_SKIP_PROMETHEUS=1");
        return false;
    }
    panic!("the `prometheus` binary is needed (apt-get install -y prometheus); the README's test command installs it");
}

/// A labelled sample of `/metrics` (`name{upstream="..."} value`).
pub fn labelled_value(page: &str, name: &str) -> Option<f64> {
    page.lines().find(|l| l.starts_with(&format!("{name}{{"))).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The `simulate --start-at` value for a simulator of `nodes` nodes (default seed): the
/// next hour of simulated time in which every GPU stays on the bus and no driver reloads,
/// so a test that counts eight GPUs passes whatever the hour it runs.
pub fn quiet_start(nodes: usize) -> String {
    let now = strata_model::time::now_ms() / 1000;
    let quiet = strata_simulator::Fleet::new(1, nodes, 8).quiet_from(now, 3600);
    quiet.expect("the simulated fleet has a quiet hour within a week").to_string()
}

/// The simulator with `nodes` nodes on a free port, ready; its port. Its clock starts in
/// a quiet hour ([`quiet_start`]).
pub fn start_sim(dir: &Path, nodes: usize) -> (Proc, u16) {
    let port = free_port();
    let start = quiet_start(nodes);
    let mut sim = Proc::strata(
        &["simulate", "--nodes", &nodes.to_string(), "--listen", &format!("127.0.0.1:{port}"), "--start-at", &start],
        dir,
        "sim",
    );
    wait_ready(&format!("http://127.0.0.1:{port}/node/0/metrics"), &mut sim, Duration::from_secs(30));
    (sim, port)
}

/// `strata edge` with this configuration and data on a free port, ready; its base URL.
pub fn start_edge(dir: &Path, cfg: &Path, data: &Path, name: &str) -> (Proc, String) {
    let port = free_port();
    let (cfg, data, http) = (cfg.display().to_string(), data.display().to_string(), format!("127.0.0.1:{port}"));
    let mut p = Proc::strata(&["edge", "--config", &cfg, "--data", &data, "--http-listen", &http], dir, name);
    wait_ready(&format!("http://{http}/-/ready"), &mut p, Duration::from_secs(60));
    (p, format!("http://{http}"))
}
