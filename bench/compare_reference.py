#!/usr/bin/env python3
"""The C++ StepRunner beside the PyTorch reference forward, on the same checkpoint and inputs.

    compare_reference.py --step_bench build/bench/step_bench [--configs tiny,bench]
        [--layouts small,medium,bench] [--dtypes float32,bfloat16] [--batches 1,8]
        [--threads 2] [--repeats 5] [--gap 0.05] [--no_turns] [--gemm_bound] [--json out.json]

For each config: one checkpoint of deterministic random weights (tests/reference/make_tiny.py).
For each (layout, batch): one step file of random float32 inputs. Each cell times the reference's
forward in this process (inference mode, `--threads` intra-op threads, one untimed warm-up) and
step_bench (the server's StepRunner::Run, same threads and warm-up; its text cache off, as the
reference projects every step's text) in a child process, in turns: `--repeats` pairs of one run
each, which goes first alternating, each run after `--gap` idle seconds (both sides' OpenMP threads
spin a while after their last region), so that they never share the cores and a host's slow swings
hit both sides of a pair alike. Prints the CPU model and ISA flags and a table of medians, and the
ratio C++ / reference as the median of the pairs' ratios (< 0.5 is the issue's target), with those
ratios' spread. With float32 and bfloat16 both asked for, each config's cells then time
the two C++ steps in turns as well (`--repeats` pairs): the bf16 / float32 ratio as the median of
the pairs' ratios. `--reuse_reference` (or `--no_turns`) times all of one side's repeats, then all of
the other's, as before this mode existed. With --gemm_bound
each side's GEMM calls (aten mm, addmm, bmm, baddbmm; ours also the brgemm and sgemm products of
model/cpu_kernels.h, replayed as aten mm) in one forward are recorded and timed alone in the same run (the reference's
here, the C++ side's by step_bench --gemm_bound), and the table adds both GEMM times, C++ / its
GEMMs, and C++ / its GEMMs and its attention's products over the allowed pairs as bmm (step_bench's
attention_products_ms; "C++/+att"): the issue's bound for a GEMM-bound cell is <= 1.15 x the GEMMs
the step must do. A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from make_tiny import Case, case_inputs, random_model, run_case, save_file  # noqa: E402
from paced_step import PacedStep, b_over_a_in_turns, describe_ratios  # noqa: E402
from praxis_ref.backbone import torch_dtype  # noqa: E402

# name -> (text L, h, w, K, F); the anchor grid is h x w (SPEC §2 layouts as praxis-load names them).
LAYOUTS = {"small": (32, 6, 8, 2, 1), "medium": (48, 12, 16, 2, 2), "bench": (256, 30, 40, 4, 2)}


def cpu_description() -> dict[str, object]:
    """The CPU model and the ISA flags that decide bf16's speed (AMX tiles, AVX512-BF16)."""
    model, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and not model.strip():
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ["amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2"]
    return {"model": model, "isa": [f for f in wanted if f in flags], "cores": os.cpu_count()}


def write_checkpoint(model, config_path: str, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(config_path, "rb") as f, open(os.path.join(out, "config.json"), "wb") as g:
        g.write(f.read())
    tensors = {k: v.contiguous() for k, v in sorted(model.checkpoint_state_dict().items())}
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def reference_ms(model, x: dict[str, torch.Tensor]) -> float:
    """One reference forward's time in ms (the caller holds inference mode)."""
    start = time.perf_counter()
    run_case(model, x)
    return (time.perf_counter() - start) * 1e3


def time_reference(model, x: dict[str, torch.Tensor], repeats: int) -> list[float]:
    with torch.inference_mode():
        run_case(model, x)
        return [reference_ms(model, x) for _ in range(repeats)]


GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm")


class _RecordGemms(TorchDispatchMode):
    """Records each GEMM call's op and its operands' sizes, strides and dtype (what step_bench
    --gemm_bound records on the C++ side)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[tuple]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("linear", "matmul"):
            # Under inference mode these reach the mode whole; their decomposition (into t, mm,
            # addmm, bmm, views) re-enters it (once pushed again), as LibTorch runs them.
            with self:
                return func.decompose(*args, **(kwargs or {}))
        if name in GEMM_OPS:
            n = 2 if name in ("mm", "bmm") else 3
            self.calls.append((name, [(tuple(t.shape), t.stride(), t.dtype) for t in args[:n]]))
        return func(*args, **(kwargs or {}))


def reference_gemm_ms(model, x: dict[str, torch.Tensor], repeats: int) -> tuple[float, int]:
    """The reference forward's GEMM calls timed alone (operands of equal layout shared, as
    step_bench does): the median of their total over `repeats` runs, and the number of calls."""
    rec = _RecordGemms()
    with torch.inference_mode():
        with rec:
            run_case(model, x)
        made: dict[tuple, torch.Tensor] = {}

        def operand(o: tuple) -> torch.Tensor:
            if o not in made:
                shape, stride, dtype = o
                extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
                made[o] = torch.randn(extent, dtype=dtype).as_strided(shape, stride)
            return made[o]

        calls = [(getattr(torch, name), [operand(o) for o in ops]) for name, ops in rec.calls]
        times = []
        for i in range(repeats + 1):  # the first a warm-up
            start = time.perf_counter()
            for f, a in calls:
                f(*a)
            if i:
                times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), len(calls)


def step_bench_command(step_bench: str, checkpoint: str, dtype: str, inputs: str, threads: int,
                       repeats: int, gemm_bound: bool) -> list[str]:
    return [step_bench, f"--checkpoint={checkpoint}", f"--dtype={dtype}", f"--inputs={inputs}",
            f"--threads={threads}", f"--repeats={repeats}", f"--gemm_bound={str(gemm_bound).lower()}",
            # Like for like: the reference projects every row's text every step.
            "--text_cache_entries=0"]


def time_cpp(command: list[str]) -> dict:
    """step_bench's JSON line: times_ms, median_ms (and gemm_ms, gemm_calls with gemm_bound)."""
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_in_turns(model, x: dict[str, torch.Tensor], command: list[str], repeats: int,
                  gap: float) -> tuple[list[float], dict]:
    """The reference's times and step_bench's JSON line, `repeats` runs each taken in turns (see
    the module's doc): step_bench --paced runs one step per line it reads."""
    cpp = PacedStep(command)
    try:
        ref = []
        with torch.inference_mode():
            run_case(model, x)  # the warm-up
            for i in range(repeats):
                for side in ("ref", "cpp") if i % 2 == 0 else ("cpp", "ref"):
                    if side == "ref":
                        time.sleep(gap)
                        ref.append(reference_ms(model, x))
                    else:
                        cpp.step_ms(gap)  # its time, also in the final line
        return ref, cpp.finish()
    finally:
        cpp.kill()


def inputs_path(tmp: str, config: str, layout: str, batch: int, dtype: str) -> str:
    """Where a cell's step file lies (step_bench --inputs)."""
    return os.path.join(tmp, f"{config}_{layout}_{batch}_{dtype}.safetensors")


def with_dtype(model, dtype: str):
    """The reference model with its parameters (not its float32 buffers) in `dtype`."""
    for p in model.parameters():
        p.data = p.data.to(torch_dtype(dtype))
    return model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--step_bench", default=os.path.join(ROOT, "build", "bench", "step_bench"))
    p.add_argument("--configs", default="tiny,bench")
    p.add_argument("--layouts", default="small,medium,bench")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gap", type=float, default=0.05,
                   help="idle seconds before each timed run in turns")
    p.add_argument("--no_turns", action="store_true",
                   help="time each side's repeats all together, one side after the other")
    p.add_argument("--gemm_bound", action="store_true",
                   help="also time each side's GEMM calls alone (see above)")
    p.add_argument("--json", default="", help="also write the cells here")
    p.add_argument("--reuse_reference", default="",
                   help="take the reference's times from this earlier --json (same CPU model, "
                        "threads and seed) instead of timing it again: the reference does not "
                        "change, and at the bench layout it takes ~30 s a forward")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    cpu = cpu_description()
    print(f"CPU: {cpu['model']} | ISA: {' '.join(cpu['isa'])} | cores: {cpu['cores']} | "
          f"threads: {a.threads} | repeats: {a.repeats} | torch {torch.__version__}", flush=True)
    gemm_head = (f" {'ref GEMM':>9} {'C++ GEMM':>9} {'C++/GEMM':>8} {'C++/+att':>8}"
                 if a.gemm_bound else "")
    print(f"{'config':6} {'layout':6} {'dtype':8} {'B':>2} {'ref ms':>10} {'C++ ms':>10} "
          f"{'C++/ref':>8}{gemm_head}  (medians; C++/ref: of the pairs' ratios in turns; spread = max/min)", flush=True)
    cells = []
    dtype_turns = []  # C++ bfloat16 against float32, in turns
    reused = {}
    if a.reuse_reference:
        with open(a.reuse_reference, encoding="utf-8") as f:
            earlier = json.load(f)
        if earlier["cpu"]["model"] != cpu["model"] or earlier["threads"] != a.threads:
            sys.exit(f"--reuse_reference: expected a run on {cpu['model']} with {a.threads} threads")
        reused = {(c["config"], c["layout"], c["dtype"], c["batch"]): c["ref_ms"] for c in earlier["cells"]}
    turns = not (a.no_turns or reused)
    with tempfile.TemporaryDirectory() as tmp:
        for config in a.configs.split(","):
            config_path = os.path.join(ROOT, "configs", f"{config}.json")
            checkpoint = os.path.join(tmp, config)
            write_checkpoint(random_model(config_path, a.seed), config_path, checkpoint)
            for dtype in a.dtypes.split(","):
                model = with_dtype(random_model(config_path, a.seed), dtype)
                for layout in a.layouts.split(","):
                    text, h, w, k, f = LAYOUTS[layout]
                    for batch in (int(b) for b in a.batches.split(",")):
                        case = Case(layout, batch=batch, chunks=k, frames=f, h=h, w=w, text=text)
                        x = case_inputs(model, case, a.seed)
                        inputs = inputs_path(tmp, config, layout, batch, dtype)
                        save_file(x, inputs)
                        command = step_bench_command(a.step_bench, checkpoint, dtype, inputs,
                                                     a.threads, a.repeats, a.gemm_bound)
                        if turns:
                            ref, bench = time_in_turns(model, x, command, a.repeats, a.gap)
                        else:
                            ref = reused.get((config, layout, dtype, batch)) or time_reference(model, x, a.repeats)
                            bench = time_cpp(command)
                        cpp = bench["times_ms"]
                        cell = {"config": config, "layout": layout, "dtype": dtype, "batch": batch,
                                "ref_reused": (config, layout, dtype, batch) in reused,
                                "in_turns": turns, "ref_ms": ref, "cpp_ms": cpp,
                                "ref_median_ms": statistics.median(ref),
                                "cpp_median_ms": statistics.median(cpp)}
                        if turns:
                            pairs = [c / r for c, r in zip(cpp, ref)]
                            cell["pair_ratios"] = pairs
                            cell["ratio"] = statistics.median(pairs)
                        else:
                            cell["ratio"] = cell["cpp_median_ms"] / cell["ref_median_ms"]
                        gemm_cols = ""
                        if a.gemm_bound:
                            cell["ref_gemm_ms"], cell["ref_gemm_calls"] = reference_gemm_ms(model, x, a.repeats)
                            cell["cpp_gemm_ms"], cell["cpp_gemm_calls"] = bench["gemm_ms"], bench["gemm_calls"]
                            cell["cpp_over_gemm"] = cell["cpp_median_ms"] / max(cell["cpp_gemm_ms"], 1e-9)
                            cell["cpp_attention_products_ms"] = bench["attention_products_ms"]
                            cell["cpp_over_gemm_and_attention"] = cell["cpp_median_ms"] / max(
                                cell["cpp_gemm_ms"] + cell["cpp_attention_products_ms"], 1e-9)
                            gemm_cols = (f" {cell['ref_gemm_ms']:>9.1f} {cell['cpp_gemm_ms']:>9.1f} "
                                         f"{cell['cpp_over_gemm']:>8.2f} "
                                         f"{cell['cpp_over_gemm_and_attention']:>8.2f}")
                        cells.append(cell)
                        print(f"{config:6} {layout:6} {dtype:8} {batch:>2} "
                              f"{cell['ref_median_ms']:>10.1f} {cell['cpp_median_ms']:>10.1f} "
                              f"{cell['ratio']:>8.2f}{gemm_cols}  (spread ref {max(ref) / min(ref):.2f}, "
                              f"C++ {max(cpp) / min(cpp):.2f}"
                              + (f"; pairs' C++/ref {min(pairs):.2f}-{max(pairs):.2f})" if turns else ")")
                              + (" ref from --reuse_reference" if cell["ref_reused"] else ""), flush=True)
            if turns and {"float32", "bfloat16"} <= set(a.dtypes.split(",")):
                # The bf16 / float32: both C++ steps in turns, not two medians timed
                # minutes apart, which move with the host.
                for layout in a.layouts.split(","):
                    for batch in (int(b) for b in a.batches.split(",")):
                        sides = tuple(step_bench_command(a.step_bench, checkpoint, d,
                                                         inputs_path(tmp, config, layout, batch, d),
                                                         a.threads, a.repeats, False)
                                      for d in ("float32", "bfloat16"))
                        f32, bf16, ratios = b_over_a_in_turns(sides, a.repeats, a.gap)
                        dtype_turns.append({"config": config, "layout": layout, "batch": batch,
                                            "float32_ms": f32, "bfloat16_ms": bf16,
                                            "pair_ratios": ratios,
                                            "ratio": statistics.median(ratios)})
                        print(f"{config:6} {layout:6} C++ bf16/float32 in turns, B {batch}: "
                              f"{describe_ratios(ratios)}, {statistics.median(bf16):.1f} / "
                              f"{statistics.median(f32):.1f} ms", flush=True)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": cpu, "threads": a.threads, "repeats": a.repeats, "cells": cells,
                       "dtype_turns": dtype_turns}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
