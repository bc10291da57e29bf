"""step_bench --paced as a child process: what runs the C++ step in turns with something else.

step_bench --paced warms up, prints "ready", then times one step per line it reads and prints its
ms, and on EOF prints its final JSON line (times_ms, median_ms, ...). Used by compare_reference.py
(in turns with the PyTorch reference, and its two dtypes in turns) and ab_step.py (in turns with
another build).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time


class PacedStep:
    """One step_bench --paced child, past its warm-up. Not thread-safe."""

    def __init__(self, command: list[str]):
        self.name = command[0]
        self.proc = subprocess.Popen(command + ["--paced"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            self.kill()
            raise RuntimeError(f"{self.name} --paced: no warm-up (exit {self.proc.returncode})")

    def step_ms(self, gap: float = 0.0) -> float:
        """One step's ms, after `gap` idle seconds (the other side's OpenMP threads stop spinning)."""
        time.sleep(gap)
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def finish(self) -> dict:
        """Ends the child; its final JSON line."""
        out, _ = self.proc.communicate(timeout=3600)
        if self.proc.returncode != 0:
            raise RuntimeError(f"{self.name} --paced exited {self.proc.returncode}")
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        """Stops the child if it still runs (after an error)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def b_over_a_in_turns(commands: tuple[list[str], list[str]], pairs: int,
                      gap: float) -> tuple[list[float], list[float], list[float]]:
    """Two step_bench children, A and B, one step each per pair, which goes first alternating, each
    after `gap` idle seconds: A's ms, B's ms and each pair's B / A."""
    sides = [PacedStep(commands[0])]
    try:
        sides.append(PacedStep(commands[1]))
        times: list[list[float]] = [[], []]
        for i in range(pairs):
            for side in (0, 1) if i % 2 == 0 else (1, 0):
                times[side].append(sides[side].step_ms(gap))
        for side in sides:
            side.finish()
    finally:
        for side in sides:
            side.kill()
    return times[0], times[1], [b / x for x, b in zip(*times)]


def describe_ratios(ratios: list[float]) -> str:
    """A list of pair ratios as its median with its range."""
    return f"{statistics.median(ratios):.3f} (pairs {min(ratios):.3f}-{max(ratios):.3f})"
