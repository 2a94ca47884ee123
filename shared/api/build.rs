//! Build information for `/api/v1/status/buildinfo`: the git revision and branch (when
//! built from a checkout) and the build date, as Prometheus reports its own.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

/// `YYYYMMDD-HH:MM:SS` (UTC), Prometheus' build date format.
fn build_date() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}-{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut watched = false;
    for f in [".git/HEAD", ".git/index"] {
        let p = root.join(f);
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
            watched = true;
        }
    }
    if !watched {
        println!("cargo:rerun-if-changed=build.rs");
    }
    let revision = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let branch = git(&["rev-parse", "--abbrev-ref", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=STRATA_GIT_REVISION={revision}");
    println!("cargo:rustc-env=STRATA_GIT_BRANCH={branch}");
    println!("cargo:rustc-env=STRATA_BUILD_DATE={}", build_date());
}
