"""The model half of bench/python_server.py: the reference VideoBackbone loaded, one forward of
checked steps stacked by rows, and the optional batcher (--max_batch_size > 1) whose worker thread
runs the queued steps of one layout together."""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time
from concurrent import futures

import grpc
import torch

from python_server_codec import Result, Step, StepFailure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from praxis_ref.backbone import VideoBackbone, torch_dtype  # noqa: E402


def use_threads(n: int) -> None:
    """Gives the calling thread n intra-op threads (0: leave torch's default)."""
    if n > 0:
        torch.set_num_threads(n)


def load_model(a: argparse.Namespace):
    """(model, config.json text, model name) for the command line's --checkpoint or --config."""
    if a.checkpoint:
        model = VideoBackbone.from_checkpoint(a.checkpoint)
        config_path, name = os.path.join(a.checkpoint, "config.json"), a.checkpoint
    else:
        from make_tiny import random_model
        model = random_model(a.config, a.seed)
        config_path, name = a.config, f"random:{a.config}:seed={a.seed}"
    with open(config_path, encoding="utf-8") as f:
        config_json = f.read()
    if a.dtype:
        for p in model.parameters():  # buffers (freqs, phases, expert_bias) stay float32
            p.data = p.data.to(torch_dtype(a.dtype))
    return model.eval(), config_json, name


def forward(model, steps: list[Step]) -> tuple[dict[str, torch.Tensor], object]:
    """Every output by name and the encoder features of one forward of the steps' rows stacked."""
    def cat(name):
        """The steps' `name` inputs stacked by rows (they share a layout), or None if absent."""
        parts = [s.inputs[name] for s in steps]
        return None if parts[0] is None else parts[0] if len(parts) == 1 else torch.cat(parts)
    first = steps[0]
    with torch.inference_mode():
        out = model(cat("text"), cat("anchor"), cat("clean"), cat("noised"), cat("timesteps"),
                    frames_per_chunk=first.frames_per_chunk, decode=first.decode,
                    rope_shifts=first.rope_shifts)
    ft = out.features
    tensors = {"cond": out.cond, "embeddings": ft.embeddings, "positions": ft.positions}
    if out.velocity is not None:
        tensors["velocity"] = out.velocity
    for i, tap in enumerate(ft.taps):
        tensors[f"tap.{i}"] = tap
    return tensors, ft


class Batcher:
    """--max_batch_size > 1: one worker thread runs queued steps of one layout as one forward."""

    def __init__(self, model, max_rows: int, threads: int):
        self.model, self.max_rows, self.threads = model, max_rows, threads
        self.cv = threading.Condition()
        self.queue: collections.deque = collections.deque()  # (step, queued time, future)
        threading.Thread(target=self._work, name="batcher", daemon=True).start()

    def submit(self, step: Step, queued: float) -> futures.Future:
        """Queues `step` (decoded at `queued`); its Future gets the Result."""
        fut: futures.Future = futures.Future()
        with self.cv:
            self.queue.append((step, queued, fut))
            self.cv.notify()
        return fut

    def _take(self) -> list:
        """The oldest queued step and the later ones of its layout, up to max_rows rows in all."""
        with self.cv:
            while not self.queue:
                self.cv.wait()
            first = self.queue.popleft()
            batch, rows, rest = [first], first[0].rows, collections.deque()
            while self.queue:
                item = self.queue.popleft()
                if item[0].key == first[0].key and rows + item[0].rows <= self.max_rows:
                    batch.append(item)
                    rows += item[0].rows
                else:
                    rest.append(item)
            self.queue = rest
            return batch

    def _work(self) -> None:
        """The worker: forwards batch after batch, forever."""
        use_threads(self.threads)
        while True:
            batch = self._take()
            start = time.perf_counter()
            try:
                tensors, ft = forward(self.model, [s for s, _, _ in batch])
            except Exception as e:  # noqa: BLE001 — every waiting call must get an answer
                for _, _, fut in batch:
                    fut.set_exception(StepFailure(grpc.StatusCode.INTERNAL, f"forward: {e}"))
                continue
            compute = time.perf_counter() - start
            total, row = sum(s.rows for s, _, _ in batch), 0
            for step, queued, fut in batch:
                mine = {n: t[row:row + step.rows] for n, t in tensors.items()}
                fut.set_result(Result(mine, ft, total, start - queued, compute))
                row += step.rows
