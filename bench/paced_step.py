"""step_bench --paced as a child process: what runs the C++ step in turns with something else.

step_bench --paced warms up, prints "ready", then times one step per line it reads and prints its
ms, and on EOF prints its final JSON line (times_ms, median_ms, ...). Used by compare_reference.py
(in turns with the PyTorch reference) and ab_step.py (in turns with another build).
"""

from __future__ import annotations

import json
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
