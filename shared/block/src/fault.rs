//! Fault points for the crash-safety and failure tests, on rare paths only (block writes,
//! compaction, deletion, block opens and chunk reads), never per sample:
//!
//! * `STRATA_CRASH_AT=<name>` makes the process abort at [`point`] `name` (no unwinding,
//!   no clean-up: as SIGKILL);
//! * `STRATA_PAUSE_AT=<name>:<ms>` makes the thread that reaches [`point`] `name` sleep
//!   that long (a slow disk, a long cut: what a signal may arrive during);
//! * [`arm`] makes the next `n` calls of [`fail`] `name` on the calling thread return an
//!   I/O error (a full disk, a transient EIO). Thread-local, so a test that arms a point
//!   never disturbs the tests running beside it.
//!
//! Unset, a point costs an environment lookup and a thread-local read.

use std::cell::RefCell;
use std::time::Duration;

/// The environment variable that names the point to crash at.
pub const CRASH_AT_ENV: &str = "STRATA_CRASH_AT";
/// The environment variable that names a point to pause at, and for how long.
pub const PAUSE_AT_ENV: &str = "STRATA_PAUSE_AT";

pub fn point(name: &str) {
    if std::env::var_os(CRASH_AT_ENV).is_some_and(|v| v == name) {
        eprintln!("{CRASH_AT_ENV}={name}: aborting here, as a crash would");
        std::process::abort();
    }
    if let Some(ms) = std::env::var(PAUSE_AT_ENV).ok().and_then(|v| pause_of(&v, name)) {
        eprintln!("{PAUSE_AT_ENV}={name}: pausing {ms} ms here");
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// The pause `spec` (`name:ms`) asks at point `name`.
fn pause_of(spec: &str, name: &str) -> Option<u64> {
    let (at, ms) = spec.rsplit_once(':')?;
    (at == name).then(|| ms.parse().ok()).flatten()
}

thread_local! {
    static ARMED: RefCell<Vec<(String, u32)>> = const { RefCell::new(Vec::new()) };
}

/// Makes the next `times` calls of [`fail`] at `name` on this thread fail.
pub fn arm(name: &str, times: u32) {
    ARMED.with(|a| {
        let mut a = a.borrow_mut();
        a.retain(|(n, _)| n != name);
        if times > 0 {
            a.push((name.to_string(), times));
        }
    });
}

/// An injected I/O error when `name` is armed on this thread, else `Ok`.
pub fn fail(name: &str) -> std::io::Result<()> {
    let hit = ARMED.with(|a| {
        let mut a = a.borrow_mut();
        let Some(i) = a.iter().position(|(n, _)| n == name) else { return false };
        a[i].1 -= 1;
        if a[i].1 == 0 {
            a.remove(i);
        }
        true
    });
    if hit {
        return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, format!("injected failure at {name}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_armed_point_fails_as_often_as_asked_on_its_thread_only() {
        arm("x", 2);
        let other = std::thread::spawn(|| fail("x").is_ok()).join().unwrap();
        assert!(other, "another thread is not affected");
        assert!(fail("x").is_err() && fail("x").is_err());
        assert!(fail("x").is_ok() && fail("y").is_ok());
        assert_eq!(pause_of("cut:250", "cut"), Some(250));
        assert_eq!(pause_of("cut:250", "other"), None);
    }
}
