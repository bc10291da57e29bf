#!/usr/bin/env python3
"""A plain Python gRPC server of the PyTorch reference model, behind praxis-serve's API.

    python_server.py (--checkpoint DIR | --config configs/tiny.json [--seed 0]) [--threads 2]
        [--port 50051] [--port_file F] [--max_workers 16] [--max_concurrent_forwards 0]
        [--max_batch_size 1] [--max_chunk_bytes 1048576] [--dtype bfloat16] [--warmup 16,4,4,2,1]

The baseline of bench/compare_served.py: what a team would write in Python to serve the model,
measured against praxis-server on the same weights, load and thread count (issue 13). It is kept
plain on purpose: grpcio's standard thread-pool server, the reference `VideoBackbone`
(tests/reference/praxis_ref) under `torch.inference_mode()`, and by default one forward per request
run in the handler's own thread, with as many forwards at once as there are calls in flight.
Every thread that may run the model uses `--threads` intra-op threads (`torch.set_num_threads` in
each, since the setting is per thread under OpenMP), so one forward uses what one praxis-server
batch uses; concurrent forwards (8 callers) use more threads in all, as the plain server would.

Options that make it less plain, off by default:
  --max_concurrent_forwards=K  at most K forwards at once (1: one at a time, like praxis-server's
                               single model worker); the wait is reported as queue_us.
  --max_batch_size=N (N > 1)   a worker thread runs the queued requests of one layout together
                               as one forward of up to N rows (no waiting for a batch to fill:
                               what queued while the last forward ran goes into the next one).

Serves Praxis.Step, Praxis.Session, Praxis.GetModelInfo and grpc.health.v1.Health/Check, answering
as praxis-server does so that praxis-load, praxis-cli and praxis_client drive it unchanged: a
StepHeader (layout key, one TensorHeader per requested output in praxis-server's order, spans,
queue_us, compute_us, batch_rows, request_id), then each output's bytes little-endian in the wire
dtype in TensorChunks of whole elements at most --max_chunk_bytes long, then a StepTrailer.
Requests are checked for what the model needs (tensors present, dtypes, shapes, outputs) and
refused INVALID_ARGUMENT naming the field. Not served: TLS, tokens, reflection, metrics, and
praxis-server's resource limits (cost, tokens, queue and message bytes, input magnitudes) —
ModelInfo reports those limits as 0. Writes the port file ({"port", "metrics_port": null, "pid"},
atomically) once warmed up and serving, like praxis-server's --port_file; SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import threading
import time
from concurrent import futures

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_MAX_CHUNK_BYTES = 1 << 20  # praxis-server's --max_chunk_bytes default


def parse_args(argv=None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default="", help="checkpoint directory (config.json + safetensors)")
    p.add_argument("--config", default="", help="with no --checkpoint: config.json served with random "
                   "weights (tests/reference/make_tiny.py's random_model, not praxis-server's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights of --config")
    p.add_argument("--dtype", default="", choices=["", "float32", "bfloat16", "float16"],
                   help="parameter dtype; empty keeps the checkpoint's (as praxis-server --dtype)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=50051, help="0 picks a free port")
    p.add_argument("--port_file", default="", help="once serving, write {\"port\", \"pid\"} as JSON here")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads of every thread that runs the model; 0: the cores")
    p.add_argument("--max_workers", type=int, default=16,
                   help="gRPC handler threads: calls served at once (a Session holds one while open)")
    p.add_argument("--max_concurrent_forwards", type=int, default=0,
                   help="forwards at once when not batching; 0: no limit (one per call in flight)")
    p.add_argument("--max_batch_size", type=int, default=1,
                   help="rows of one forward; > 1 batches queued requests of one layout in a worker")
    p.add_argument("--max_chunk_bytes", type=int, default=DEFAULT_MAX_CHUNK_BYTES,
                   help="largest TensorChunk payload (>= 8)")
    p.add_argument("--warmup", default="16,4,4,2,1",
                   help="layout of one forward before serving: text_len,h,w,K,F; empty: none")
    a = p.parse_args(argv)
    if bool(a.checkpoint) == bool(a.config):
        p.error("expected exactly one of --checkpoint DIR and --config FILE")
    for flag, value, low in (("--threads", a.threads, 0), ("--max_workers", a.max_workers, 1),
                             ("--max_concurrent_forwards", a.max_concurrent_forwards, 0),
                             ("--max_batch_size", a.max_batch_size, 1),
                             ("--max_chunk_bytes", a.max_chunk_bytes, 8)):
        if value < low:
            p.error(f"{flag}: expected >= {low}, got {value}")
    if a.max_batch_size > 1 and a.max_concurrent_forwards not in (0, 1):
        p.error("--max_concurrent_forwards: batching runs one forward at a time; expected 0 or 1")
    if a.warmup:
        try:
            parse_layout(a.warmup)
        except ValueError as e:
            p.error(f"--warmup: {e}")
    return a


def parse_layout(text: str) -> tuple[int, int, int, int, int]:
    """(L, h, w, K, F) of "L,h,w,K,F"; ValueError unless five positive integers."""
    parts = text.split(",")
    if len(parts) != 5 or not all(s.strip().isdigit() and int(s) > 0 for s in parts):
        raise ValueError(f"expected five positive integers text_len,h,w,K,F, got {text!r}")
    return tuple(int(s) for s in parts)  # type: ignore[return-value]


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.threads > 0:
    # Before torch is imported: OpenMP reads these for threads that never call set_num_threads
    # (libgomp keeps the count per thread), so no thread of this process starts with all cores.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(ARGS.threads)

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "client", "python"))  # the source tree's client, not a wheel
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from praxis_client._proto import praxis_pb2 as pb  # noqa: E402  (stubs generated on first import)
from praxis_client._proto import praxis_pb2_grpc as pb_grpc  # noqa: E402
from praxis_client.request import layout_key  # noqa: E402
from praxis_ref.backbone import VideoBackbone, torch_dtype  # noqa: E402

# Wire dtype -> (torch dtype, numpy dtype of its little-endian bytes); bfloat16 travels as its
# 16-bit pattern, numpy having no bfloat16.
WIRE = {pb.FLOAT32: (torch.float32, "<f4"), pb.BFLOAT16: (torch.bfloat16, "<i2"),
        pb.FLOAT16: (torch.float16, "<f2"), pb.INT64: (torch.int64, "<i8")}
SERVING = b"\x08\x01"  # a grpc.health.v1.HealthCheckResponse{status: SERVING}, encoded by hand


class StepFailure(Exception):
    """A step refused or failed with a gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def invalid(message: str) -> StepFailure:
    """An INVALID_ARGUMENT failure."""
    return StepFailure(grpc.StatusCode.INVALID_ARGUMENT, message)


def use_threads(n: int) -> None:
    """Gives the calling thread n intra-op threads (0: leave torch's default)."""
    if n > 0:
        torch.set_num_threads(n)


# ------------------------------------------------------------------------------------------------
# Requests


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
        self.key = layout_key(r)  # the clients' function: one layout key per language


# ------------------------------------------------------------------------------------------------
# The model


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


class Result:
    """What one step's answer needs from the forward it ran in."""

    def __init__(self, tensors, features, rows: int, queue_s: float, compute_s: float):
        self.tensors, self.features, self.batch_rows = tensors, features, rows
        self.queue_s, self.compute_s = queue_s, compute_s


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


# ------------------------------------------------------------------------------------------------
# Answers


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
    """The StepResponses of one step: header, chunks of each output in order, trailer."""
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
    yield pb.StepResponse(header=h)
    for name, data, size in blobs:
        per = max_chunk_bytes // size * size  # whole elements, as praxis-server cuts them
        for off in range(0, len(data), per):
            yield pb.StepResponse(chunk=pb.TensorChunk(name=name, offset=off, data=data[off:off + per]))
    total_us = int((time.perf_counter() - accepted) * 1e6)
    yield pb.StepResponse(trailer=pb.StepTrailer(queue_us=queue_us, compute_us=compute_us,
                                                 total_us=total_us))


# ------------------------------------------------------------------------------------------------
# The service


class PraxisService(pb_grpc.PraxisServicer):
    """Praxis.Step, Session and GetModelInfo over the reference model."""

    def __init__(self, model, info: "pb.ModelInfo", a: argparse.Namespace):
        self.model, self.cfg, self.info = model, model.cfg, info
        self.threads, self.max_chunk_bytes = a.threads, a.max_chunk_bytes
        self.batcher = Batcher(model, a.max_batch_size, a.threads) if a.max_batch_size > 1 else None
        self.gate = threading.Semaphore(a.max_concurrent_forwards) if a.max_concurrent_forwards else None

    def run(self, r: "pb.StepRequest"):
        """The StepResponses of one request; StepFailure if refused or failed."""
        accepted = time.perf_counter()
        step = Step(r, self.cfg)
        queued = time.perf_counter()  # queue_us counts from here, as praxis-server's does
        if self.batcher is not None:
            result = self.batcher.submit(step, queued).result()
        else:
            if self.gate is not None:
                self.gate.acquire()
            try:
                start = time.perf_counter()
                try:
                    tensors, ft = forward(self.model, [step])
                except Exception as e:  # noqa: BLE001 — answered INTERNAL, the server goes on
                    raise StepFailure(grpc.StatusCode.INTERNAL, f"forward: {e}") from e
                result = Result(tensors, ft, step.rows, start - queued, time.perf_counter() - start)
            finally:
                if self.gate is not None:
                    self.gate.release()
        return answer(step, result, accepted, self.max_chunk_bytes)

    def Step(self, request, context):
        """One step: header, chunks, trailer; a refused or failed step ends with its status."""
        try:
            responses = self.run(request)
        except StepFailure as e:
            context.abort(e.code, e.message)
        yield from responses

    def Session(self, request_iterator, context):
        """Consecutive steps in order; a failed one is answered with a StepError, the stream goes on."""
        for request in request_iterator:
            try:
                responses = list(self.run(request))
            except StepFailure as e:
                responses = [pb.StepResponse(error=pb.StepError(
                    code=e.code.value[0], message=e.message, request_id=request.request_id))]
            yield from responses

    def GetModelInfo(self, request, context):
        """The model and its config.json; the limits praxis-server enforces are 0 (none here)."""
        return self.info


def model_info(model, config_json: str, name: str, a: argparse.Namespace) -> "pb.ModelInfo":
    """ModelInfo as praxis-server fills it, limits that are not enforced left 0."""
    n_taps = len(model.cfg.encoder.tap_blocks)
    return pb.ModelInfo(config_json=config_json, dtype=str(model.encoder.dtype).replace("torch.", ""),
                        device="cpu", model=name, max_batch_rows=a.max_batch_size,
                        max_chunk_bytes=a.max_chunk_bytes,
                        outputs=["velocity", "cond", "embeddings", "positions"] +
                        [f"tap.{i}" for i in range(n_taps)])


def warm_up(model, layout: str) -> None:
    """One forward of random inputs of `layout` (L,h,w,K,F), so the first call is not the slowest."""
    lt, h, w, k, f = parse_layout(layout)
    cfg, g = model.cfg, torch.Generator().manual_seed(0)
    c = cfg.latent_channels
    with torch.inference_mode():
        model(torch.randn(1, lt, cfg.text_dim, generator=g), torch.randn(1, c, 1, h, w, generator=g),
              torch.randn(1, c, (k - 1) * f, h, w, generator=g) if k > 1 else None,
              torch.randn(1, c, k * f, h, w, generator=g), torch.rand(1, k, generator=g),
              frames_per_chunk=f)


def write_port_file(path: str, port: int) -> None:
    """{"port", "metrics_port": null, "pid"} at `path`, atomically (PATH.tmp, then rename)."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"port": port, "metrics_port": None, "pid": os.getpid()}, f)
        f.write("\n")
    os.replace(path + ".tmp", path)


def main(a: argparse.Namespace) -> int:
    """Loads the model, warms it up, serves until SIGTERM or SIGINT."""
    use_threads(a.threads)
    try:
        model, config_json, name = load_model(a)
    except (OSError, ValueError) as e:
        sys.exit(f"python_server: cannot load the model: {e}")
    if a.warmup:
        warm_up(model, a.warmup)
    pool = futures.ThreadPoolExecutor(max_workers=a.max_workers, initializer=use_threads,
                                      initargs=(a.threads,))
    # No size limits on messages: praxis-server derives its own from the model; none here.
    server = grpc.server(pool, options=[("grpc.max_receive_message_length", -1),
                                        ("grpc.max_send_message_length", -1)])
    pb_grpc.add_PraxisServicer_to_server(PraxisService(model, model_info(model, config_json, name, a), a),
                                         server)
    health = grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
        "Check": grpc.unary_unary_rpc_method_handler(lambda req, ctx: SERVING,
                                                     request_deserializer=None,
                                                     response_serializer=None)})
    server.add_generic_rpc_handlers((health,))
    port = server.add_insecure_port(f"{a.host}:{a.port}")
    if port == 0:
        sys.exit(f"python_server: cannot listen on {a.host}:{a.port}")
    server.start()
    mode = (f"batching up to {a.max_batch_size} rows" if a.max_batch_size > 1 else
            f"{a.max_concurrent_forwards or 'any number of'} forward(s) at once")
    print(f"python_server: serving on {a.host}:{port} model {name} dtype {model.encoder.dtype} "
          f"threads {a.threads or torch.get_num_threads()} workers {a.max_workers} {mode}", flush=True)
    if a.port_file:
        write_port_file(a.port_file, port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    server.stop(grace=5).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
