#!/usr/bin/env bash
# The test command: formatting, lints, then every test of the workspace. Installs what the
# tests need when it is missing (Debian's `prometheus` and `prometheus-alertmanager` for the
# end-to-end tests), so this alone passes on a fresh machine. `.ci/run` runs it with CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/strata-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

if ! command -v prometheus >/dev/null 2>&1; then
  echo "== installing Debian's prometheus (Prometheus 2.42, for the end-to-end tests)"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq prometheus >/dev/null
fi

if ! command -v prometheus-alertmanager >/dev/null 2>&1; then
  echo "== installing Debian's prometheus-alertmanager (Alertmanager 0.25, for the alerting tests)"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq prometheus-alertmanager >/dev/null
fi

if ! python3 -c "import botocore" >/dev/null 2>&1; then
  echo "== installing botocore (PyPI: the AWS SDK's signer, to verify the edge's SigV4 remote writes)"
  python3 -m pip install -q botocore
fi

if ! python3 -c "import duckdb, pyarrow" >/dev/null 2>&1; then
  echo "== installing duckdb and pyarrow (PyPI: they read the Parquet archive with no plugin)"
  python3 -m pip install -q duckdb pyarrow
fi

if ! python3 -c "import moto.server" >/dev/null 2>&1; then
  echo "== installing moto[server] (PyPI: an S3-protocol server for the archive's S3 tests)"
  python3 -m pip install -q "moto[server]"
fi

if [ -z "${PROMQL_TESTDATA:-}" ] && [ ! -d ../shared/promql-testdata ]; then
  echo "== NOTE: the PromQL conformance files are absent (../shared/promql-testdata, or set PROMQL_TESTDATA): that suite will not run (and fails under CI=true)"
fi

echo "== cargo fmt --check"
cargo fmt --all --check

echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test (target dir: $CARGO_TARGET_DIR)"
# Suites that cannot run here (their data or program absent) say so in this directory.
export STRATA_NOT_RUN_DIR="$CARGO_TARGET_DIR/strata-not-run"
rm -rf "$STRATA_NOT_RUN_DIR"
status=0
cargo test --workspace --all-targets --locked || status=$?
echo "== suites that did not run"
if [ -d "$STRATA_NOT_RUN_DIR" ] && [ -n "$(ls -A "$STRATA_NOT_RUN_DIR")" ]; then
  cat "$STRATA_NOT_RUN_DIR"/*
else
  echo "none: every suite ran"
fi
exit $status
