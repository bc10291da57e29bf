#!/usr/bin/env python3
"""Served step p50 / in-process step p50 (issue 13, "only what is asked for"; target <= 1.05).

    served_ratio.py [--build build] [--config tiny] [--dtype ""] [--layout small] [--threads 1]
        [--transports unary,session] [--repeats 3] [--duration 6] [--steps 30] [--json out.json]

Each repeat: praxis-server (the embedded tiny model, or configs/<config>.json with the server's
random weights; in --dtype, empty: the config's; --threads) driven by praxis-load with 1 caller
at `--layout` for `--duration` s after a 2 s warm-up, once per transport (a Step call per step, or
one Session stream for all: bench/serve_load.py's run_load; end-to-end p50 as the client sees it),
the server stopped, then bench/step_bench on the same model, dtype, layout,
thread count and a worker thread, `--steps` timed runs after a warm-up (its median). Prints the CPU
model and per repeat and transport both p50s and their ratio, then each transport's median ratio
and its spread (max / min).
A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from compare_reference import LAYOUTS, cpu_description  # noqa: E402
from serve_load import config_path, run_load, start_server  # noqa: E402


def in_process_ms(build: str, config: str, dtype: str, layout: str, threads: int,
                  steps: int) -> float:
    """step_bench's median over `steps` runs of the server's model at `layout`, 1 row."""
    mix = ",".join(str(v) for v in LAYOUTS[layout])
    out = subprocess.run([os.path.join(build, "bench", "step_bench"), f"--layout={mix}",
                          f"--config={config_path(config)}", f"--dtype={dtype}",
                          f"--threads={threads}", f"--repeats={steps}", "--worker_thread"],
                         check=True, capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])["median_ms"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--config", default="tiny", help="tiny (embedded) or a configs/ name: bench")
    p.add_argument("--dtype", default="", help="float32 | bfloat16 | float16; empty: the config's")
    p.add_argument("--layout", default="small", choices=sorted(LAYOUTS))
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of both sides")
    p.add_argument("--transports", default="unary,session",
                   help="praxis-load --transport values, each run against the same server")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--json", default="")
    a = p.parse_args()
    cpu = cpu_description()
    print(f"CPU: {cpu['model']} | cores: {cpu['cores']} | {a.config} model "
          f"{a.dtype or '(config dtype)'}, layout {a.layout} "
          f"{LAYOUTS[a.layout]}, 1 caller, {a.threads} intra-op thread(s)", flush=True)
    transports = a.transports.split(",")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            server = start_server(a.build, a.config, 8, a.threads, a.dtype)
            try:
                served = {t: run_load(a.build, server.port, a.layout, 1, a.duration, server.proc.pid, tmp, t)
                          for t in transports}
            finally:
                server.stop()
            local = in_process_ms(a.build, a.config, a.dtype, a.layout, a.threads, a.steps)
            for t, r in served.items():
                run = {"repeat": i + 1, "transport": t, "served_p50_ms": r["latency_p50_ms"],
                       "server_compute_p50_ms": r["compute_p50_ms"], "server_queue_p50_ms": r["queue_p50_ms"],
                       "in_process_p50_ms": local, "ratio": r["latency_p50_ms"] / local}
                runs.append(run)
                print(f"repeat {i + 1}, {t}: served p50 {run['served_p50_ms']:.2f} ms (server compute p50 "
                      f"{run['server_compute_p50_ms']:.2f}, queue p50 {run['server_queue_p50_ms']:.2f}), "
                      f"in-process p50 {local:.2f} ms: ratio {run['ratio']:.3f}", flush=True)
    for t in transports:
        ratios = [r["ratio"] for r in runs if r["transport"] == t]
        print(f"served / in-process p50, {t}: median {statistics.median(ratios):.3f}, spread "
              f"{max(ratios) / min(ratios):.3f} (target <= 1.05)", flush=True)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": cpu, "config": a.config, "dtype": a.dtype, "layout": a.layout, "threads": a.threads, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
