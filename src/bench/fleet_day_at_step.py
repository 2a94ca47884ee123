#!/usr/bin/env python3
"""The fleet-day benchmark's twelve queries, all at one step (300 s: 5 m aggregates; 3600 s:
1 h aggregates; 60 s: raw data), against Prometheus 2.42, VictoriaMetrics and Strata in one
run. It drives `fleet_day.py` from the shared benchmark folder (which this repository does not
hold) and only changes the step of each query; timing, comparison and the summary are that
script's.

  python3 src/bench/fleet_day_at_step.py --bench ../shared/bench --step 300 --other http://127.0.0.1:9800 --vm

Start Strata first with `strata bench fleet-day --serve 127.0.0.1:9800 --via-global --downsample`.
"""
import argparse
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=os.path.join(os.path.dirname(__file__), "../../../shared/bench"),
                    help="the folder holding fleet_day.py and queries.tsv")
    ap.add_argument("--step", type=int, required=True, help="seconds between steps, for every query")
    ap.add_argument("--other", required=True, help="Strata's Prometheus API, e.g. http://127.0.0.1:9800")
    ap.add_argument("--vm", action="store_true", help="also VictoriaMetrics, as fleet_day.py run --vm")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--scale", default="small")
    ap.add_argument("--max-source-resolution", help="sent to Strata only (raw, 5m, 1h; default: auto)")
    a = ap.parse_args()
    script = os.path.join(a.bench, "fleet_day.py")
    if not os.path.exists(script):
        sys.exit(f"{script} is absent: this benchmark needs the shared fleet-day folder (pass --bench)")
    sys.path.insert(0, os.path.abspath(a.bench))
    import fleet_day  # noqa: E402  (found through --bench)

    queries = fleet_day.load_queries()
    fleet_day.load_queries = lambda: [(a.step, q) for _, q in queries]
    if a.max_source_resolution:
        import urllib.request
        opened = urllib.request.urlopen

        def urlopen(url, data=None, timeout=300):
            # Strata's queries only: the parameter joins fleet_day.py's own form body.
            if isinstance(url, str) and url.startswith(a.other) and data is not None:
                data += f"&max_source_resolution={a.max_source_resolution}".encode()
            return opened(url, data=data, timeout=timeout)

        urllib.request.urlopen = urlopen
    print(f"{len(queries)} queries, each at step {a.step} s", flush=True)
    fleet_day.run(a.scale, a.other, a.reps, a.vm)


if __name__ == "__main__":
    main()
