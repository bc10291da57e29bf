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
dtype in TensorChunks of whole elements at most --max_chunk_bytes long, then a StepTrailer — or all
of them in one StepAnswer where the request asks (whole_answer) and the tensors fit one chunk.
Requests are checked for what the model needs (tensors present, dtypes, shapes, outputs) and
refused INVALID_ARGUMENT naming the field. Not served: TLS, tokens, reflection, metrics, and
praxis-server's resource limits (cost, tokens, queue and message bytes, input magnitudes) —
ModelInfo reports those limits as 0. Writes the port file ({"port", "metrics_port": null, "pid"},
atomically) once warmed up and serving, like praxis-server's --port_file; SIGTERM/SIGINT stop it.

Here: the command line, the service and main; the requests and answers are in
python_server_codec.py, the model, its forward and the batcher in python_server_model.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from concurrent import futures

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
    # Before torch is imported (here and by the siblings): OpenMP reads these for threads that never call set_num_threads
    # (libgomp keeps the count per thread), so no thread of this process starts with all cores.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(ARGS.threads)

import grpc  # noqa: E402
import torch  # noqa: E402

# The siblings put client/python and tests/reference on the path.
from python_server_codec import StepFailure, Step, Result, answer, pb  # noqa: E402
from python_server_model import Batcher, forward, load_model, use_threads  # noqa: E402
from praxis_client._proto import praxis_pb2_grpc as pb_grpc  # noqa: E402

SERVING = b"\x08\x01"  # a grpc.health.v1.HealthCheckResponse{status: SERVING}, encoded by hand


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
                        max_chunk_bytes=a.max_chunk_bytes, text_dim=model.cfg.text_dim,
                        latent_channels=model.cfg.latent_channels,
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
