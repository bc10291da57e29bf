"""The wire half of bench/python_server.py: StepRequests decoded and checked as praxis-server checks
them (refusals INVALID_ARGUMENT naming the field), and one step's answer cut into StepResponses
(header, chunks of whole elements, trailer) as praxis-server cuts it. Knows nothing of the model
but the config fields it checks shapes against."""

from __future__ import annotations

import os
import sys
import time

import grpc
import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))  # the source tree's client, not a wheel
from praxis_client._proto import praxis_pb2 as pb  # noqa: E402  (stubs generated on first import)
from praxis_client.request import layout_key  # noqa: E402

# Wire dtype -> (torch dtype, numpy dtype of its little-endian bytes); bfloat16 travels as its
# 16-bit pattern, numpy having no bfloat16.
WIRE = {pb.FLOAT32: (torch.float32, "<f4"), pb.BFLOAT16: (torch.bfloat16, "<i2"),
        pb.FLOAT16: (torch.float16, "<f2"), pb.INT64: (torch.int64, "<i8")}


class StepFailure(Exception):
    """A step refused or failed with a gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def invalid(message: str) -> StepFailure:
    """An INVALID_ARGUMENT failure."""
    return StepFailure(grpc.StatusCode.INVALID_ARGUMENT, message)


def decode_tensor(t: "pb.Tensor", field: str) -> torch.Tensor:
    """The float32 (int64 stays int64) tensor of a wire Tensor; INVALID_ARGUMENT naming `field`."""
    if t.dtype not in WIRE:
        raise invalid(f"{field}.dtype: expected FLOAT32, BFLOAT16, FLOAT16 or INT64, got {t.dtype}")
    dtype, np_dtype = WIRE[t.dtype]
    shape = tuple(t.shape)
    if len(shape) > 8 or any(d < 0 for d in shape):
        raise invalid(f"{field}.shape: expected at most 8 non-negative sizes, got {list(shape)}")
    want = int(np.prod(shape, dtype=np.int64)) * np.dtype(np_dtype).itemsize
    if len(t.data) != want:
        raise invalid(f"{field}.data: expected {want} bytes for shape {list(shape)}, got {len(t.data)}")
    x = torch.from_numpy(np.frombuffer(t.data, dtype=np_dtype).reshape(shape).copy())
    if t.dtype == pb.BFLOAT16:
        x = x.view(torch.bfloat16)
    return x if dtype == torch.int64 else x.to(torch.float32)


def output_names(o: "pb.OutputSelection", decode: bool, n_taps: int) -> list[str]:
    """The requested outputs in praxis-server's answer order; INVALID_ARGUMENT as it refuses them."""
    if o.all_taps and o.taps:
        raise invalid("outputs.taps: expected none with all_taps, got a list")
    taps = list(range(n_taps)) if o.all_taps else []
    for t in o.taps:
        if not 0 <= t < n_taps:
            raise invalid(f"outputs.taps: expected indices in [0, {n_taps}), got {t}")
        if t in taps:
            raise invalid(f"outputs.taps: expected each index once, got {t} again")
        taps.append(t)
    if o.velocity and not decode:
        raise invalid("outputs.velocity: expected decode = true to get a velocity")
    names = (["velocity"] if o.velocity else []) + (["cond"] if o.cond else []) + \
        [f"tap.{t}" for t in taps] + (["embeddings"] if o.embeddings else []) + \
        (["positions"] if o.positions else [])
    if not names:
        raise invalid("outputs: expected at least one output, got none")
    return names


def expect_shape(x: torch.Tensor, field: str, want: tuple) -> None:
    """INVALID_ARGUMENT unless x's shape is `want` (None entries match any size >= 1)."""
    got = tuple(x.shape)
    if len(got) != len(want) or any(w is not None and g != w for g, w in zip(got, want)) or \
            any(g < 1 for g in got):
        shown = ", ".join("*" if w is None else str(w) for w in want)
        raise invalid(f"{field}: expected shape [{shown}] (sizes >= 1), got {list(got)}")


class Step:
    """One decoded, checked StepRequest."""

    def __init__(self, r: "pb.StepRequest", cfg):
        for name in ("text", "anchor", "noised", "timesteps"):
            if not r.HasField(name):
                raise invalid(f"{name}: expected a tensor, got none")
        text, anchor = decode_tensor(r.text, "text"), decode_tensor(r.anchor, "anchor")
        noised, timesteps = decode_tensor(r.noised, "noised"), decode_tensor(r.timesteps, "timesteps")
        clean = decode_tensor(r.clean, "clean") if r.HasField("clean") else None
        for t, name in ((text, "text"), (anchor, "anchor"), (noised, "noised"), (clean, "clean"),
                        (timesteps, "timesteps")):
            if t is not None and t.dtype != torch.float32:
                raise invalid(f"{name}.dtype: expected FLOAT32, BFLOAT16 or FLOAT16, got INT64")
        f = r.frames_per_chunk
        if f < 1:
            raise invalid(f"frames_per_chunk: expected >= 1, got {f}")
        if len(r.rope_shifts) not in (0, 4):
            raise invalid(f"rope_shifts: expected 0 or 4 values, got {len(r.rope_shifts)}")
        self.outputs = output_names(r.outputs, r.decode, len(cfg.encoder.tap_blocks))
        self.wire = r.wire_dtype or pb.FLOAT32
        if self.wire not in (pb.FLOAT32, pb.BFLOAT16, pb.FLOAT16):
            raise invalid(f"wire_dtype: expected FLOAT32, BFLOAT16 or FLOAT16, got {self.wire}")
        c = cfg.latent_channels
        expect_shape(noised, "noised", (None, c, None, None, None))
        b, _, kf, h, w = noised.shape
        if kf % f:
            raise invalid(f"noised: expected frames K*F a multiple of frames_per_chunk {f}, got {kf}")
        k = kf // f
        expect_shape(text, "text", (b, None, cfg.text_dim))
        expect_shape(anchor, "anchor", (b, c, 1, None, None))
        expect_shape(timesteps, "timesteps", (b, k))
        if (clean is None) != (k == 1):
            raise invalid(f"clean: expected a tensor iff K > 1, K = {k}")
        if clean is not None:
            expect_shape(clean, "clean", (b, c, (k - 1) * f, h, w))
        self.inputs = {"text": text, "anchor": anchor, "clean": clean, "noised": noised,
                       "timesteps": timesteps}
        self.frames_per_chunk, self.decode = f, r.decode
        self.rope_shifts = tuple(r.rope_shifts) or (0, 0, 0, 0)
        self.rows = b
        self.request_id = r.request_id
        self.whole_answer = r.whole_answer
        self.key = layout_key(r)  # the clients' function: one layout key per language


class Result:
    """What one step's answer needs from the forward it ran in."""

    def __init__(self, tensors, features, rows: int, queue_s: float, compute_s: float):
        self.tensors, self.features, self.batch_rows = tensors, features, rows
        self.queue_s, self.compute_s = queue_s, compute_s


def span(s) -> "pb.Span":
    """A wire Span of (start, length)."""
    return pb.Span(start=s[0], length=s[1])


def wire_bytes(t: torch.Tensor, wire: int) -> tuple[int, bytes]:
    """(wire dtype, little-endian row-major bytes) of an output: floats in `wire`, int64 as is."""
    if not t.is_floating_point():
        return pb.INT64, t.contiguous().numpy().tobytes()
    c = t.to(WIRE[wire][0]).contiguous()
    if wire == pb.BFLOAT16:
        c = c.view(torch.int16)
    return wire, c.numpy().tobytes()


def answer(step: Step, r: Result, accepted: float, max_chunk_bytes: int):
    """The StepResponses of one step: header, chunks of each output in order, trailer; or, as
    praxis-server answers a request that asks (whole_answer) where the tensors fit one chunk, all
    of them in one StepAnswer."""
    ft = r.features
    queue_us, compute_us = int(r.queue_s * 1e6), int(r.compute_s * 1e6)
    h = pb.StepHeader(layout_key=step.key, request_id=step.request_id, queue_us=queue_us,
                      compute_us=compute_us, batch_rows=r.batch_rows,
                      frames_per_chunk=ft.frames_per_chunk, tokens_per_frame=ft.tokens_per_frame,
                      n_chunks=ft.n_chunks, register_span=span(ft.global_spans["register"]),
                      anchor_span=span(ft.global_spans["anchor"]),
                      text_span=span(ft.global_spans["text"]), noised_span=span(ft.noised_span))
    if ft.clean_span is not None:
        h.clean_span.CopyFrom(span(ft.clean_span))
    blobs = []
    for name in step.outputs:
        t = r.tensors[name]
        dtype, data = wire_bytes(t, step.wire)
        h.tensors.add(name=name, dtype=dtype, shape=list(t.shape), nbytes=len(data))
        blobs.append((name, data, np.dtype(WIRE[dtype][1]).itemsize))

    def chunks():
        for name, data, size in blobs:
            per = max_chunk_bytes // size * size  # whole elements, as praxis-server cuts them
            for off in range(0, len(data), per):
                yield pb.TensorChunk(name=name, offset=off, data=data[off:off + per])

    def trailer():
        total_us = int((time.perf_counter() - accepted) * 1e6)
        return pb.StepTrailer(queue_us=queue_us, compute_us=compute_us, total_us=total_us)

    if step.whole_answer and sum(len(data) for _, data, _ in blobs) <= max_chunk_bytes:
        yield pb.StepResponse(answer=pb.StepAnswer(header=h, chunks=list(chunks()), trailer=trailer()))
        return
    yield pb.StepResponse(header=h)
    for c in chunks():
        yield pb.StepResponse(chunk=c)
    yield pb.StepResponse(trailer=trailer())
