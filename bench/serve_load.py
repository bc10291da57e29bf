#!/usr/bin/env python3
"""Served throughput under closed-loop load: praxis-server and praxis-load on loopback.

    serve_load.py [--build build] [--configs tiny,bench] [--layouts small,medium] [--callers 1,8]
        [--batching on,off[,fixed][,alone]] [--repeats 3] [--duration 6] [--threads 0] [--transport unary] [--server_flags='...']
        [--json out.json]

For each config one server process per batching value, all started together (the embedded tiny
model, or configs/bench.json with deterministic random weights; on: up to --max_batch_size=8 rows,
each layout's batch size learned by the server (--batch_probe_every); fixed: full batches of up to
8 rows whatever they cost (--batch_probe_every=0); alone: as on, one batch at a time
(--concurrent_batches=1); off: --max_batch_size=1); for each layout
`--repeats` rounds, each round one praxis-load run of `--duration` seconds (after a 2 s warm-up)
per (batching, callers), taken in turns on the idle servers, in an order reversed every other
round. Prints the CPU model, and per cell the median steps/s, the spread (max / min over the
repeats), the median server CPU % (of one core, from /proc over the measured window) and the
server's compute and queue p50; then per layout the ratios of runs in the same round: batching on
/ off (and on / fixed, on / alone) at each callers count and the largest callers count / the smallest at each
batching value (median, and min-max over the rounds), which this host's slow swings move far less
than cells measured minutes apart. A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "client"))  # server_process: the one harness
from compare_reference import LAYOUTS, cpu_description  # noqa: E402
from server_process import Server  # noqa: E402


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def config_path(config: str) -> str:
    """configs/<config>.json; "" for tiny, the binaries' embedded model."""
    return "" if config == "tiny" else os.path.join(ROOT, "configs", config + ".json")


def start_server(build: str, config: str, batch: int, threads: int, dtype: str = "",
                 extra: tuple[str, ...] = ()) -> Server:
    """The build's praxis-server on loopback port 0 serving `config` (tiny: the embedded model) in
    `dtype` (empty: the config's), batching up to `batch` rows with `threads` intra-op threads, and
    `extra` flags after those; exits the program if it does not come up within 60 s."""
    flags = [f"--max_batch_size={batch}", f"--threads={threads}"]
    if config_path(config):
        flags.append(f"--config={config_path(config)}")
    if dtype:
        flags.append(f"--dtype={dtype}")
    flags.extend(extra)
    try:
        return Server(*flags, binary=os.path.join(build, "server", "praxis-server"), timeout=60)
    except RuntimeError as e:
        sys.exit(str(e))


def run_load(build: str, port: int, layout: str, callers: int, duration: float, pid: int,
             tmp: str, transport: str = "unary") -> dict:
    report = os.path.join(tmp, "load.json")
    text, h, w, k, f = LAYOUTS[layout]
    load = subprocess.Popen(
        [os.path.join(build, "client", "praxis-load"), f"--address=127.0.0.1:{port}",
         f"--concurrency={callers}", f"--mix={text},{h},{w},{k},{f}", "--warmup=2s",
         f"--duration={duration}s", f"--json={report}", f"--transport={transport}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(2.2)  # the warm-up
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(duration * 0.9)
    c1, t1 = cpu_seconds(pid), time.monotonic()
    _, err = load.communicate(timeout=duration * 10 + 120)
    if load.returncode != 0:
        sys.exit(f"praxis-load failed: {err.strip()}")
    with open(report, encoding="utf-8") as f:
        r = json.load(f)
    return {"rps": r["throughput_rps"], "cpu_pct": 100 * (c1 - c0) / (t1 - t0),
            "latency_p50_ms": r["latency_ms"]["p50"], "compute_p50_ms": r["server_compute_ms"]["p50"], "queue_p50_ms": r["server_queue_ms"]["p50"],
            "errors": r["errors"]}


def round_ratios(config: str, layout: str, runs: dict[tuple[str, int], list[dict]]) -> list[dict]:
    """Printed and returned: steps/s ratios of runs in the same round, batching on / off per
    callers count and most / fewest callers per batching value."""
    out = []
    batchings = sorted({b for b, _ in runs})
    callers = sorted({c for _, c in runs})
    comparisons = []
    for other in ("off", "fixed", "alone"):
        if {"on", other} <= set(batchings):
            comparisons += [(f"on/{other} {c} callers", ("on", c), (other, c)) for c in callers]
    if len(callers) > 1:
        comparisons += [(f"{callers[-1]}/{callers[0]} callers batching {b}", (b, callers[-1]), (b, callers[0]))
                        for b in batchings]
    for name, top, bottom in comparisons:
        r = [t["rps"] / b["rps"] for t, b in zip(runs[top], runs[bottom])]
        out.append({"config": config, "layout": layout, "ratio": name, "rounds": r,
                    "median": statistics.median(r)})
        print(f"  {config} {layout} {name}: {statistics.median(r):.2f} "
              f"({min(r):.2f}-{max(r):.2f} over {len(r)} rounds)", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--configs", default="tiny,bench")
    p.add_argument("--layouts", default="small,medium")
    p.add_argument("--callers", default="1,8")
    p.add_argument("--batching", default="on,off",
                   help="on: up to 8 rows, each layout's batch size learned (--batch_probe_every); "
                        "fixed: up to 8 rows always (--batch_probe_every=0); alone: as on, one "
                        "batch at a time (--concurrent_batches=1); off: 1 row")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--threads", type=int, default=0, help="server --threads (0: the cores)")
    p.add_argument("--transport", default="unary", choices=["unary", "session"],
                   help="praxis-load's: a Step call per step, or one Session stream per caller")
    p.add_argument("--server_flags", default="",
                   help="more praxis-server flags, space-separated, given with '=' (e.g. "
                        "--server_flags=--answer_pipeline=false)")
    p.add_argument("--json", default="")
    a = p.parse_args()
    cpu = cpu_description()
    print(f"CPU: {cpu['model']} | ISA: {' '.join(cpu['isa'])} | cores: {cpu['cores']} | "
          f"repeats: {a.repeats} x {a.duration:g} s", flush=True)
    print(f"{'config':6} {'layout':6} {'batch':5} {'callers':>7} {'steps/s':>8} {'spread':>6} "
          f"{'CPU%':>5} {'compute':>8} {'queue':>7}  (medians; compute/queue: server p50 ms)", flush=True)
    cells, pairs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for config in a.configs.split(","):
            batchings = a.batching.split(",")
            servers: dict[str, Server] = {}
            try:
                for batching in batchings:
                    # fixed: full batches whatever they cost (the sizer off), as before stop 40;
                    # alone: no batch beside another, as before stop 55.
                    own = {"fixed": ("--batch_probe_every=0",), "alone": ("--concurrent_batches=1",)}
                    extra = own.get(batching, ()) + tuple(a.server_flags.split())
                    servers[batching] = start_server(a.build, config, 1 if batching == "off" else 8,
                                                     a.threads, extra=extra)
                for layout in a.layouts.split(","):
                    order = [(b, int(c)) for b in batchings for c in a.callers.split(",")]
                    runs: dict[tuple[str, int], list[dict]] = {k: [] for k in order}
                    for i in range(a.repeats):
                        for batching, callers in order if i % 2 == 0 else order[::-1]:
                            server = servers[batching]
                            runs[(batching, callers)].append(
                                run_load(a.build, server.port, layout, callers, a.duration,
                                         server.proc.pid, tmp, a.transport))
                    for (batching, callers), cell_runs in runs.items():
                        rps = [r["rps"] for r in cell_runs]
                        cell = {"config": config, "layout": layout, "batching": batching,
                                "callers": callers, "runs": cell_runs, "rps_median": statistics.median(rps),
                                "rps_spread": max(rps) / min(rps),
                                "cpu_pct_median": statistics.median(r["cpu_pct"] for r in cell_runs)}
                        cells.append(cell)
                        print(f"{config:6} {layout:6} {batching:5} {callers:>7} {cell['rps_median']:>8.1f} "
                              f"{cell['rps_spread']:>6.2f} {cell['cpu_pct_median']:>5.0f} "
                              f"{statistics.median(r['compute_p50_ms'] for r in cell_runs):>8.1f} "
                              f"{statistics.median(r['queue_p50_ms'] for r in cell_runs):>7.1f}", flush=True)
                    pairs.extend(round_ratios(config, layout, runs))
            finally:
                for server in servers.values():
                    server.stop()
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": cpu, "threads": a.threads, "server_flags": a.server_flags,
                       "cells": cells, "round_ratios": pairs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
