#!/usr/bin/env python3
"""The Parquet archive's figures (issue 24), each beside its anchor in the same run:

1. `strata archive import` of the fleet-day file against VictoriaMetrics' import of the same
   file (its /api/v1/import/prometheus, as the shared benchmark feeds it, then a flush):
   wall time, peak memory, and the archive's bytes per sample.
2. A per-series daily average: DuckDB over the archive's Parquet files (the view of
   docs/ARCHIVE.md) against the same question as a PromQL query at `strata global
   --archive` (avg_over_time over the day, one step); the answers are compared.
3. The shared benchmark's twelve queries through `strata global --archive` against
   Prometheus 2.42 and VictoriaMetrics, at each `--steps` step (fleet_day_at_step.py).

  python3 src/bench/archive_vs_vm.py --bench ../shared/bench --strata $CARGO_TARGET_DIR/release/strata

It needs the shared fleet-day folder (not part of this repository), victoria-metrics, and
duckdb (PyPI).
"""
import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_ready(url, proc=None):
    for _ in range(600):
        if proc is not None and proc.poll() is not None:
            sys.exit(f"exited before it was ready: {url}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except Exception:
            time.sleep(0.2)
    sys.exit(f"not ready: {url}")


def timed_child(args):
    """Runs `args`; returns (seconds, peak RSS of the child in MB, stdout)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out, _ = p.communicate()
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{args[0]} failed: {out}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return seconds, rss, out


def vm_import(om, workdir):
    """VictoriaMetrics' import of the file: posted in 100,000-line chunks, then flushed."""
    vmdir = os.path.join(workdir, "vm")
    port = free_port()
    vm = subprocess.Popen(["victoria-metrics", f"-storageDataPath={vmdir}", f"-httpListenAddr=127.0.0.1:{port}",
                           "-retentionPeriod=100y"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", vm)
        t0 = time.perf_counter()
        buf = []

        def post(lines):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/import/prometheus",
                                         data="".join(lines).encode(), method="POST")
            urllib.request.urlopen(req, timeout=600).read()

        with open(om) as f:
            for line in f:
                if line.startswith("#"):
                    continue
                head, ts = line.rstrip("\n").rsplit(" ", 1)
                buf.append(head + " " + ts.replace(".", "") + "\n")
                if len(buf) >= 100000:
                    post(buf)
                    buf = []
        if buf:
            post(buf)
        urllib.request.urlopen(f"http://127.0.0.1:{port}/internal/force_flush", timeout=600).read()
        seconds = time.perf_counter() - t0
        with open(f"/proc/{vm.pid}/status") as st:
            hwm = next(int(l.split()[1]) for l in st if l.startswith("VmHWM:")) / 1024
        return seconds, hwm
    finally:
        vm.terminate()
        vm.wait()


DUCKDB_VIEW = """CREATE VIEW samples AS
SELECT s.*, d.timestamp,
       coalesce(d.value_float, d.value_mantissa / 10 ** d.value_scale) AS value
FROM read_parquet('{root}/raw/*/*/data.parquet', filename = true) d
JOIN read_parquet('{root}/raw/*/*/series.parquet', filename = true, union_by_name = true) s
  ON d.series_id = s.series_id
 AND parse_dirpath(d.filename) = parse_dirpath(s.filename)
WHERE parse_dirpath(d.filename) NOT IN
      (SELECT parse_dirpath(file) FROM glob('{root}/raw/*/*/deletion-mark.json'))"""


def daily_average(archive, base, end, reps):
    import duckdb
    c = duckdb.connect()
    c.execute(DUCKDB_VIEW.format(root=archive))
    labels = [r[0] for r in c.execute(
        "SELECT column_name FROM (DESCRIBE SELECT * FROM read_parquet('%s/raw/*/*/series.parquet', union_by_name = true))"
        % archive).fetchall()
        if r[0] not in ("series_id", "metric_type", "unit", "help", "min_time", "max_time", "samples")]
    cols = ", ".join(f'"{l}"' for l in labels)
    # PromQL's range is left-open: (end - 1d, end]; staleness markers are skipped by
    # avg_over_time, NaNs are not (there are none in the fleet day).
    sql = (f"SELECT {cols}, avg(value) FROM samples WHERE timestamp > to_timestamp({end - 86400}) "
           f"AND timestamp <= to_timestamp({end}) GROUP BY ALL")
    duck_times, rows = [], None
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        rows = c.execute(sql).fetchall()
        duck_times.append(time.perf_counter() - t0)
    duck = {tuple(sorted((l, v) for l, v in zip(labels, r[:-1]) if v is not None)): r[-1] for r in rows}
    # avg_over_time drops the metric name, so one query over every metric would put two
    # metrics' series with the same other labels in one vector (an error in Prometheus):
    # PromQL is asked metric by metric, and its time is the sum.
    with urllib.request.urlopen(base + "/api/v1/label/__name__/values", timeout=60) as r:
        names = json.loads(r.read())["data"]
    prom_times, prom = [], {}
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        for name in names:
            q = 'avg_over_time({__name__="%s"}[1d])' % name
            body = urllib.parse.urlencode({"query": q, "start": end, "end": end, "step": 86400}).encode()
            with urllib.request.urlopen(base + "/api/v1/query_range", data=body, timeout=600) as r:
                resp = json.loads(r.read())
            for s in resp["data"]["result"]:
                prom[tuple(sorted([("__name__", name)] + list(s["metric"].items())))] = float(s["values"][-1][1])
        prom_times.append(time.perf_counter() - t0)
    equal = len(prom) == len(duck) and all(
        k in duck and abs(p - duck[k]) <= 1e-9 * max(1.0, abs(p)) for k, p in prom.items())
    return statistics.median(duck_times[1:]), statistics.median(prom_times[1:]), len(duck), len(prom), equal


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=os.path.join(HERE, "../../../shared/bench"))
    ap.add_argument("--strata", default="strata")
    ap.add_argument("--steps", default="300,60")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.bench))
    try:
        import fleet_day  # noqa: E402
    except ImportError:
        sys.exit(f"{a.bench}/fleet_day.py is absent: this benchmark needs the shared fleet-day folder (pass --bench)")
    om, _ = fleet_day.prepare("small")
    work = tempfile.mkdtemp(prefix="strata-archive-bench-")
    try:
        archive = os.path.join(work, "archive")
        seconds, rss, out = timed_child([a.strata, "archive", "import", "--openmetrics", om, "--archive", archive])
        print(out.strip())
        vm_seconds, vm_rss = vm_import(om, work)
        print(f"import: strata {seconds:.1f} s ({rss:.0f} MB peak), VictoriaMetrics {vm_seconds:.1f} s "
              f"({vm_rss:.0f} MB peak): {vm_seconds / seconds:.2f}x faster (goal: 2x)")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        g = subprocess.Popen([a.strata, "global", "--http-listen", f"127.0.0.1:{port}", "--archive", archive,
                              "--archive.read-only"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(base + "/-/ready", g)
            duck, prom, nd, np, equal = daily_average(archive, base, fleet_day.END, a.reps)
            print(f"per-series daily average: DuckDB {duck * 1000:.0f} ms ({nd} series), PromQL at the global "
                  f"{prom * 1000:.0f} ms ({np} series, a query per metric), answers equal: {equal}")
            for step in [int(s) for s in a.steps.split(",") if s]:
                print(f"the twelve queries at step {step} through strata global --archive:", flush=True)
                subprocess.run([sys.executable, os.path.join(HERE, "fleet_day_at_step.py"), "--bench", a.bench,
                                "--step", str(step), "--other", base, "--vm", "--reps", str(a.reps)], check=True)
            with open(f"/proc/{g.pid}/status") as st:
                hwm = next(int(l.split()[1]) for l in st if l.startswith("VmHWM:")) / 1024
            print(f"the global on the archive: {hwm:.0f} MB peak")
        finally:
            g.terminate()
            g.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
