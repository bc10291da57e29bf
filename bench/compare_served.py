#!/usr/bin/env python3
"""Served throughput of praxis-server beside a plain Python server, same weights, load and threads.

    compare_served.py [--build build] [--configs tiny[,bench]] [--layouts small,medium]
        [--callers 1,8] [--threads 2] [--transport unary] [--repeats 3] [--duration 6]
        [--cpp_flags "--max_batch_size=1"] [--py_flags "--max_batch_size=8"] [--json out.json]

The served check of issue 13: praxis-server against bench/python_server.py (grpcio's thread-pool
server around the PyTorch reference model), both driven by the unchanged praxis-load. For each
config one checkpoint of deterministic random weights (tests/reference/make_tiny.py) that BOTH
servers load with --checkpoint (praxis-server's embedded or --config weights come from another
generator and would not match). For each side in turn (never both at once) a fresh server with
`--threads` intra-op threads; first one identical step (praxis_client, the first layout, all
outputs in float32) whose answers are compared across the two sides (float32 models: max |d| <=
--parity_tol; bfloat16 / float16 ones: relative RMS <= --parity_rel_rms), then for each (layout,
callers) `--repeats` praxis-load closed-loop runs of `--duration` seconds after a 2 s warm-up
(bench/serve_load.py's run_load, which also takes the server's CPU % of one core over the run).

Each side runs as its server defaults unless told otherwise: praxis-server batches up to 8 rows,
the Python server runs one forward per call, as many at once as calls are in flight; add flags to
either with --cpp_flags / --py_flags (e.g. --cpp_flags=--max_batch_size=1 for no batching, or
--py_flags=--max_batch_size=8 for the Python server's simple batching). Prints the CPU model and,
per cell, the median steps/s of each side, each side's spread (max / min over the repeats) and CPU
%, and the ratio C++ / Python (the issue asks for >= 2). Exits 1 if the parity step differs beyond
its limit or any praxis-load run saw errors; nothing else is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "client"))  # server_process: the one harness
from compare_reference import LAYOUTS, cpu_description  # noqa: E402  (puts tests/reference on the path)
from make_tiny import write_checkpoint  # noqa: E402
from serve_load import run_load  # noqa: E402
from server_process import DEFAULT_FLAGS, Server  # noqa: E402

import numpy as np  # noqa: E402

SIDES = ("C++", "Python")


def parity_inputs(cfg: dict, layout: str, seed: int) -> dict:
    """Random float32 inputs of one row of `layout` for a model of config section `cfg`."""
    text, h, w, k, f = LAYOUTS[layout]
    c = cfg["encoder"]["video_in"]["c_in"]
    rng = np.random.default_rng(seed)
    x = {"text": rng.standard_normal((1, text, cfg["text_dim"]), dtype=np.float32),
         "anchor": rng.standard_normal((1, c, 1, h, w), dtype=np.float32),
         "noised": rng.standard_normal((1, c, k * f, h, w), dtype=np.float32),
         "timesteps": rng.random((1, k), dtype=np.float32), "frames_per_chunk": f}
    if k > 1:
        x["clean"] = rng.standard_normal((1, c, (k - 1) * f, h, w), dtype=np.float32)
    return x


def parity_step(port: int, inputs: dict) -> dict:
    """Every output of one step of `inputs` on the server at `port`, its layout key, model dtype."""
    from praxis_client import Client
    with Client(f"127.0.0.1:{port}", timeout=120.0) as client:
        r = client.step(**inputs, outputs=["velocity", "cond", "taps", "embeddings", "positions"])
        dtype = client.info().dtype
    return {"layout_key": r.layout_key, "tensors": r.tensors, "dtype": dtype}


def compare(a: dict, b: dict) -> tuple[float, float, str]:
    """(largest |a - b|, largest rms(a - b) / rms(a), what else differs or "") over both answers."""
    problems = []
    for what in ("layout_key", "dtype"):
        if a[what] != b[what]:
            problems.append(f"{what} {a[what]!r} vs {b[what]!r}")
    if set(a["tensors"]) != set(b["tensors"]):
        problems.append(f"outputs {sorted(a['tensors'])} vs {sorted(b['tensors'])}")
    worst_abs = worst_rel = 0.0
    for name in sorted(set(a["tensors"]) & set(b["tensors"])):
        x, y = a["tensors"][name].astype(np.float64), b["tensors"][name].astype(np.float64)
        if x.shape != y.shape:
            problems.append(f"{name}: shape {list(x.shape)} vs {list(y.shape)}")
            continue
        if x.size:
            d = x - y
            worst_abs = max(worst_abs, float(np.max(np.abs(d))))
            worst_rel = max(worst_rel, float(np.sqrt(np.mean(d * d) / max(np.mean(x * x), 1e-30))))
    return worst_abs, worst_rel, "; ".join(problems)


def start_side(side: str, a: argparse.Namespace, checkpoint: str) -> Server:
    """The server of `side` serving `checkpoint` with `--threads` intra-op threads, on loopback port
    0 and serving; exits the program, with the server's output, if it does not come up."""
    if side == "C++":
        binary, flags = os.path.join(a.build, "server", "praxis-server"), a.cpp_flags
        default_flags = DEFAULT_FLAGS
    else:
        binary, flags = [a.python, os.path.join(HERE, "python_server.py")], a.py_flags
        default_flags = ("--host=127.0.0.1", "--port=0")
    try:
        return Server(f"--checkpoint={checkpoint}", f"--threads={a.threads}", *shlex.split(flags),
                      binary=binary, default_flags=default_flags)
    except RuntimeError as e:
        sys.exit(f"the {side} server: {e}")


def parse_args() -> argparse.Namespace:
    """The command line, checked: known layouts, the build's praxis-server and praxis-load."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="holds server/praxis-server "
                   "and client/praxis-load")
    p.add_argument("--python", default=sys.executable, help="interpreter of python_server.py "
                   "(needs torch, grpcio, grpcio-tools, protobuf, numpy, safetensors)")
    p.add_argument("--configs", default="tiny", help="configs/NAME.json, comma-separated")
    p.add_argument("--layouts", default="small,medium", help=f"of {', '.join(LAYOUTS)}")
    p.add_argument("--callers", default="1,8")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of both servers")
    p.add_argument("--transport", default="unary", choices=["unary", "session"],
                   help="praxis-load's: a Step call per step, or one Session stream per caller")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--duration", type=float, default=6.0, help="seconds measured per run")
    p.add_argument("--seed", type=int, default=0, help="weight seed of the checkpoints")
    p.add_argument("--cpp_flags", default="", help="more praxis-server flags, one shell string")
    p.add_argument("--py_flags", default="", help="more python_server.py flags, one shell string")
    p.add_argument("--parity_tol", type=float, default=1e-4,
                   help="float32 models: largest |C++ - Python| of the parity step's outputs")
    p.add_argument("--parity_rel_rms", type=float, default=0.05,
                   help="bfloat16 / float16 models, whose rounding differs with the order of "
                        "operations: largest rms(C++ - Python) / rms(C++) of any output")
    p.add_argument("--json", default="", help="also write every run here")
    a = p.parse_args()
    for layout in a.layouts.split(","):
        if layout not in LAYOUTS:
            p.error(f"--layouts: expected names among {', '.join(LAYOUTS)}, got {layout!r}")
    for tool in ("server/praxis-server", "client/praxis-load"):
        if not os.access(os.path.join(a.build, tool), os.X_OK):
            p.error(f"--build: no executable {tool} under {a.build}")
    return a


def measure(a: argparse.Namespace, config: str, layouts: list[str], callers: list[int],
            tmp: str) -> tuple[dict, dict]:
    """For each side in turn, on one checkpoint of `config`: the parity step's answers {side: ...}
    and the praxis-load runs {(side, layout, callers): [run, ...]}."""
    config_path = os.path.join(ROOT, "configs", f"{config}.json")
    checkpoint = os.path.join(tmp, config)
    write_checkpoint(checkpoint, config_path, a.seed)
    with open(config_path, encoding="utf-8") as f:
        inputs = parity_inputs(json.load(f)["backbone"], layouts[0], a.seed + 1)
    runs: dict = {}
    answers = {}
    for side in SIDES:
        server = start_side(side, a, checkpoint)
        try:
            answers[side] = parity_step(server.port, inputs)
            for layout in layouts:
                for n in callers:
                    runs[side, layout, n] = [
                        run_load(a.build, server.port, layout, n, a.duration, server.proc.pid, tmp,
                                 a.transport)
                        for _ in range(a.repeats)]
        finally:
            server.stop()
    return answers, runs


def parity(a: argparse.Namespace, config: str, layout: str, answers: dict) -> dict:
    """The parity step's verdict within the dtype's limit, printed; the fields every cell carries."""
    worst, rel, problems = compare(answers["C++"], answers["Python"])
    dtype = answers["C++"]["dtype"]
    if dtype == "float32":
        ok, limit = worst <= a.parity_tol, f"max |d| <= {a.parity_tol:g}"
    else:
        ok, limit = rel <= a.parity_rel_rms, f"relative RMS <= {a.parity_rel_rms:g}"
    ok &= not problems
    print(f"\n{config} ({dtype}): parity step ({layout}, every output): max |C++ - Python| "
          f"{worst:.2e}, relative RMS {rel:.2e} ({limit}): {'ok' if ok else 'MISMATCH'}"
          f"{'; ' + problems if problems else ''}")
    return {"dtype": dtype, "parity_max_abs": worst, "parity_rel_rms": rel, "parity_ok": ok}


def cell_of(fields: dict, runs: dict, layout: str, n: int) -> dict:
    """One (layout, callers) cell: each side's runs and medians, and the ratio C++ / Python."""
    cell = {"config": fields["config"], "layout": layout, "callers": n, "dtype": fields["dtype"],
            "parity_max_abs": fields["parity_max_abs"], "parity_rel_rms": fields["parity_rel_rms"],
            "parity_ok": fields["parity_ok"]}
    for side in SIDES:
        r = runs[side, layout, n]
        rps = [x["rps"] for x in r]
        cell[side] = {"runs": r, "rps_median": statistics.median(rps),
                      "rps_spread": max(rps) / min(rps) if min(rps) > 0 else float("inf"),
                      "cpu_pct_median": statistics.median(x["cpu_pct"] for x in r),
                      "errors": sum(x["errors"] for x in r)}
    c, py = cell["C++"], cell["Python"]
    cell["ratio"] = c["rps_median"] / py["rps_median"] if py["rps_median"] else float("inf")
    return cell


def print_cell(cell: dict) -> None:
    """One row of the table."""
    c, py = cell["C++"], cell["Python"]
    errors = "".join(f"  {s} errors: {cell[s]['errors']}" for s in SIDES if cell[s]["errors"])
    print(f"{cell['config']:6} {cell['layout']:6} {cell['callers']:>7} | {c['rps_median']:>8.1f} "
          f"{c['rps_spread']:>6.2f} {c['cpu_pct_median']:>5.0f} | {py['rps_median']:>8.1f} "
          f"{py['rps_spread']:>6.2f} {py['cpu_pct_median']:>5.0f} | {cell['ratio']:>6.2f}{errors}",
          flush=True)


def main() -> int:
    """Runs the comparison and prints the table."""
    a = parse_args()
    layouts, callers = a.layouts.split(","), [int(c) for c in a.callers.split(",")]
    cpu = cpu_description()
    print(f"CPU: {cpu['model']} | ISA: {' '.join(cpu['isa'])} | cores: {cpu['cores']} | threads: "
          f"{a.threads} | repeats: {a.repeats} x {a.duration:g} s after 2 s warm-up", flush=True)
    print(f"C++: praxis-server {a.cpp_flags or '(defaults: batches up to 8 rows)'} | Python: "
          f"python_server.py {a.py_flags or '(defaults: one forward per call, no batching)'}", flush=True)
    cells, failed = [], False
    with tempfile.TemporaryDirectory(prefix="compare-served-") as tmp:
        for config in a.configs.split(","):
            answers, runs = measure(a, config, layouts, callers, tmp)
            fields = dict(parity(a, config, layouts[0], answers), config=config)
            failed |= not fields["parity_ok"]
            print(f"{'config':6} {'layout':6} {'callers':>7} | {'C++ st/s':>8} {'spread':>6} {'CPU%':>5} | "
                  f"{'Py st/s':>8} {'spread':>6} {'CPU%':>5} | {'C++/Py':>6}  (medians)", flush=True)
            for layout in layouts:
                for n in callers:
                    cells.append(cell_of(fields, runs, layout, n))
                    failed |= any(cells[-1][side]["errors"] > 0 for side in SIDES)
                    print_cell(cells[-1])
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": cpu, "threads": a.threads, "repeats": a.repeats, "duration_s": a.duration,
                       "cpp_flags": a.cpp_flags, "py_flags": a.py_flags, "cells": cells}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
