//! Prometheus' own PromQL test files, run against Strata's engine. They are not part of the
//! repository: the runner reads `$PROMQL_TESTDATA`, else `../shared/promql-testdata` (which
//! CI always has), and says plainly when neither exists.
//!
//! A wrong answer fails the test. Skipped cases, printed with their reasons, are those that
//! need native histograms or a feature flag experimental in Prometheus 3.0; the list is in
//! `docs/promql-conformance.md`.

use std::path::PathBuf;

#[test]
fn prometheus_promql_conformance_files() {
    let dir = std::env::var_os("PROMQL_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/promql-testdata"));
    if !dir.is_dir() {
        println!("THE PROMQL CONFORMANCE SUITE DID NOT RUN: {} does not exist; set PROMQL_TESTDATA", dir.display());
        return;
    }
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "test")).collect();
    files.sort();
    let mut report = strata_shared::promql::testfile::Report::default();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        strata_shared::promql::testfile::run_file(&name, &text, &mut report);
    }
    for s in &report.skipped {
        println!("skipped: {s}");
    }
    for f in &report.failed {
        println!("FAILED: {f}");
    }
    println!("promql conformance: {} passed, {} failed, {} skipped ({} files)", report.passed, report.failed.len(), report.skipped.len(), files.len());
    assert!(files.len() >= 10, "only {} test files in {}", files.len(), dir.display());
    assert!(report.failed.is_empty(), "{} conformance cases gave wrong answers", report.failed.len());
    assert!(report.passed >= 600, "only {} cases passed", report.passed);
}
