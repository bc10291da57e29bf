#!/usr/bin/env python3
"""Two step_bench binaries (two builds of the server's StepRunner) on the same step, in turns.

    ab_step.py --a /tmp/step_bench.before --b build/bench/step_bench [--pairs 30] [--gap 0.05]
        -- --config configs/bench.json --dtype float32 --layout 32,6,8,2,1 --rows 8 --worker_thread

What a change to the model did, on a host whose speed moves 1.5-2x within minutes
(docs/benchmarks.md, stop 40): both binaries start with the same step_bench arguments (those after
`--`) and `--paced`, warm up, then run one step each per pair, which goes first alternating, each
after `--gap` idle seconds (the other's OpenMP threads stop spinning). Prints both sides' median
ms and B / A as the median of the pairs' ratios with their range. A benchmark, not a test: nothing
is asserted. Copy the first build's binary aside before rebuilding (cp build/bench/step_bench
/tmp/step_bench.before).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from paced_step import b_over_a_in_turns, describe_ratios


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="step_bench of the baseline build")
    p.add_argument("--b", required=True, help="step_bench of the build under test")
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--gap", type=float, default=0.05, help="idle seconds before each step")
    p.add_argument("step_bench_args", nargs="*", help="after --: both binaries' arguments")
    a = p.parse_args()
    if a.pairs < 1:
        p.error("--pairs: expected at least 1")
    a_ms, b_ms, ratios = b_over_a_in_turns(
        ([a.a, *a.step_bench_args], [a.b, *a.step_bench_args]), a.pairs, a.gap)
    print(f"A {statistics.median(a_ms):.2f} ms  B {statistics.median(b_ms):.2f} ms  "
          f"B/A {describe_ratios(ratios)}, {a.pairs} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
