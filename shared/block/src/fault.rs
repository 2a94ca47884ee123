//! Crash points for the crash-safety tests: `STRATA_CRASH_AT=<name>` makes the process abort
//! (no unwinding, no clean-up: as SIGKILL) when it reaches the point of that name. Unset,
//! a point costs one environment lookup, and points sit only on rare paths (block writes,
//! compaction, deletion), never per sample.

/// The environment variable that names the point to crash at.
pub const CRASH_AT_ENV: &str = "STRATA_CRASH_AT";

pub fn point(name: &str) {
    if std::env::var_os(CRASH_AT_ENV).is_some_and(|v| v == name) {
        eprintln!("{CRASH_AT_ENV}={name}: aborting here, as a crash would");
        std::process::abort();
    }
}
