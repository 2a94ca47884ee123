//! Prometheus' own PromQL test files, run against Strata's engine. They are not part of the
//! repository: the runner reads `$PROMQL_TESTDATA`, else `../shared/promql-testdata`, and
//! says plainly when neither exists; under `CI=true` (where they are always laid out) a
//! missing directory fails the test instead of passing quietly.
//!
//! A wrong answer fails the test. Skipped cases, printed with their reasons, are those that
//! need native histograms; the list is in `docs/promql-conformance.md`. As Prometheus' test
//! engine, the runner turns delayed name removal on; every case outside the file that needs
//! it also runs with it off (Strata's default) and must pass both ways.

use std::path::Path;
use strata_promql::testfile;

#[test]
fn prometheus_promql_conformance_files() {
    // The clone being tested, read when the test runs: a test binary reused from a shared
    // target directory would otherwise look beside whichever clone compiled it.
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let dir = testfile::default_dir(Path::new(&root));
    if !dir.is_dir() {
        let msg =
            format!("THE PROMQL CONFORMANCE SUITE DID NOT RUN: {} does not exist; set PROMQL_TESTDATA", dir.display());
        // Reported either way, so the test command's summary never says it ran.
        crate::common::report_not_run(
            "PromQL conformance",
            &format!("{} does not exist; set PROMQL_TESTDATA", dir.display()),
        );
        assert!(std::env::var("CI").map_or(true, |v| v != "true"), "{msg}");
        return;
    }
    let report = testfile::run_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    // Every skip has a documented reason (docs/promql-conformance.md) and no count may grow:
    // a skip list once hid a core function here.
    let allowed: [(&str, usize); 2] =
        [("native histograms (series loaded or converted as native histograms)", 58), ("native histograms", 7)];
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for s in &report.skipped {
        println!("skipped: {s}");
        let reason = allowed.iter().map(|a| a.0).find(|r| s.ends_with(r));
        assert!(reason.is_some(), "a skip with an undocumented reason: {s}");
        *counts.entry(reason.unwrap_or_default()).or_default() += 1;
    }
    for (reason, max) in allowed {
        let n = counts.get(reason).copied().unwrap_or(0);
        println!("skipped for {reason:?}: {n}");
        assert!(n <= max, "{n} cases skipped for {reason:?}, at most {max} documented");
    }
    for f in &report.failed {
        println!("FAILED: {f}");
    }
    println!(
        "promql conformance: {} passed, {} failed, {} skipped ({} files)",
        report.passed,
        report.failed.len(),
        report.skipped.len(),
        report.files
    );
    assert!(report.files >= 10, "only {} test files in {}", report.files, dir.display());
    assert!(report.failed.is_empty(), "{} conformance cases gave wrong answers", report.failed.len());
    assert!(report.passed >= 708, "only {} cases passed", report.passed);
}
