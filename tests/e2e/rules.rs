//! The GPU rule pack and `strata test rules` against Prometheus' own promtool: every rule
//! file passes `promtool check rules`, every test file passes both `promtool test rules`
//! and `strata test rules` with the same output, and each mutated expectation makes both
//! fail with the same report.

use crate::common::require_prometheus;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn pack() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/rules")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yml"))
        .collect();
    v.sort();
    v
}

fn run(program: &str, args: &[&str], dir: &Path) -> Output {
    Command::new(program).args(args).current_dir(dir).output().unwrap_or_else(|e| panic!("running {program}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs one test file through both; returns (promtool, strata).
fn both(dir: &Path, file: &str) -> (Output, Output) {
    let p = run("promtool", &["test", "rules", file], dir);
    let s = run(env!("CARGO_BIN_EXE_strata"), &["test", "rules", file], dir);
    (p, s)
}

#[test]
fn the_gpu_rule_pack_passes_promtool_check_and_both_test_runners_alike() {
    if !require_prometheus() {
        return;
    }
    let rules = files(&pack());
    assert!(rules.len() >= 3, "the pack's rule files: {rules:?}");
    for r in &rules {
        let out = run("promtool", &["check", "rules", &r.display().to_string()], &pack());
        assert!(
            out.status.success(),
            "promtool check rules {}: {}{}",
            r.display(),
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    let tests = files(&pack().join("tests"));
    assert_eq!(tests.len(), rules.len(), "one test file per rule file: {tests:?}");
    for t in &tests {
        let name = format!("tests/{}", t.file_name().unwrap().to_string_lossy());
        let (p, s) = both(&pack(), &name);
        assert!(p.status.success(), "promtool fails {name}: {}{}", text(&p.stdout), text(&p.stderr));
        assert!(s.status.success(), "strata fails {name}: {}{}", text(&s.stdout), text(&s.stderr));
        assert_eq!(text(&p.stdout), text(&s.stdout), "{name}");
    }
}

/// Each expectation of the pack's tests changed, one at a time: a value moved by one, a
/// summary with a letter added. Both runners must fail, with promtool's words.
#[test]
fn a_mutated_expectation_fails_both_runners_with_the_same_report() {
    if !require_prometheus() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    for r in files(&pack()) {
        std::fs::copy(&r, work.path().join(r.file_name().unwrap())).unwrap();
    }
    std::fs::create_dir(work.path().join("tests")).unwrap();
    let mut mutants = 0;
    for t in files(&pack().join("tests")) {
        let original = std::fs::read_to_string(&t).unwrap();
        let lines: Vec<&str> = original.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            let mutated = if let Some(v) = trimmed.strip_prefix("value: ") {
                let v: f64 = v.parse().unwrap_or_else(|_| panic!("value on line {}: {v}", i + 1));
                format!("{}value: {}", &line[..line.len() - trimmed.len()], v + 1.0)
            } else if trimmed.starts_with("summary: \"") && line.ends_with('"') {
                format!("{}x\"", &line[..line.len() - 1])
            } else {
                continue;
            };
            let mut changed = lines.clone();
            changed[i] = &mutated;
            let name = format!("tests/{}", t.file_name().unwrap().to_string_lossy());
            std::fs::write(work.path().join(&name), changed.join("\n")).unwrap();
            let (p, s) = both(work.path(), &name);
            let at = format!("{name} line {}: {mutated:?}", i + 1);
            assert_eq!(p.status.code(), Some(1), "promtool passes {at}");
            assert_eq!(s.status.code(), Some(1), "strata passes {at}: {}", text(&s.stdout));
            assert_eq!(text(&p.stdout), text(&s.stdout), "stdout of {at}");
            assert_eq!(text(&p.stderr), text(&s.stderr), "report of {at}");
            mutants += 1;
        }
    }
    assert!(mutants >= 20, "only {mutants} expectations mutated");
}
