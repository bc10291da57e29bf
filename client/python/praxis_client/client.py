"""A client for praxis-serve: one denoising step per call, or a Session stream per robot."""
import dataclasses
import math
import queue
import random
import time
from typing import Dict, Iterable, Optional, Sequence

import grpc
import numpy as np

from praxis_client import _stubs

pb, pb_grpc = _stubs.load()

_WIRE_DTYPES = {"float32": pb.FLOAT32, "float16": pb.FLOAT16, "bfloat16": pb.BFLOAT16}
_NUMPY_DTYPES = {pb.FLOAT32: np.dtype("<f4"), pb.FLOAT16: np.dtype("<f2"),
                 pb.BFLOAT16: np.dtype("<u2"), pb.INT64: np.dtype("<i8")}
_STATUS_CODES = {c.value[0]: c for c in grpc.StatusCode}
_HEALTH = ("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")
_INITIAL_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 2.0
_MAX_RECEIVE_BYTES = 64 << 20  # per message; chunks are at most 1 MiB by default


class PraxisError(Exception):
    """A failed call: `code` is its grpc.StatusCode and `message` the server's text.

    INVALID_ARGUMENT messages start with the offending field ("text: ...", "frames_per_chunk: ...").
    """

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class RpcFailed(PraxisError):
    """The gRPC call ended with a non-OK status (from the server, or the transport's)."""


class StepFailed(PraxisError):
    """The server answered a step with a StepError (a failed Session step; the session goes on)."""


class ProtocolError(PraxisError):
    """The response stream broke the protocol (order, offsets or sizes); code DATA_LOSS."""

    def __init__(self, message: str):
        super().__init__(grpc.StatusCode.DATA_LOSS, message)


@dataclasses.dataclass
class StepResult:
    """One step's answer: the StepHeader, every tensor it announced, and the StepTrailer.

    `tensors` maps names (velocity, cond, tap.N, embeddings, positions) to numpy arrays, in header
    order: float32 for wire dtypes float32 and bfloat16 (exactly widened), float16 for float16,
    int64 for positions.
    """

    header: "pb.StepHeader"
    tensors: Dict[str, np.ndarray]
    trailer: "pb.StepTrailer"

    @property
    def layout_key(self) -> str:
        """The server's key of the step's window layout."""
        return self.header.layout_key

    @property
    def queue_us(self) -> int:
        """Microseconds the step waited for a batch."""
        return self.header.queue_us

    @property
    def compute_us(self) -> int:
        """Microseconds of the forward pass of the batch the step ran in."""
        return self.header.compute_us

    @property
    def total_us(self) -> int:
        """Microseconds from the server accepting the step to sending its trailer."""
        return self.trailer.total_us


_MAX_DIMS = 8  # the wire codec's limit; a header beyond it can only be hostile
_MAX_INT64 = (1 << 63) - 1


def _check_header(t: "pb.TensorHeader"):
    """ProtocolError unless `t` announces a known dtype and at most _MAX_DIMS non-negative
    dimensions whose exact byte size (Python integers: nothing wraps) equals its nbytes."""
    dtype = _NUMPY_DTYPES.get(t.dtype)
    if dtype is None:
        raise ProtocolError(f"{t.name}: unknown dtype {t.dtype}")
    shape = list(t.shape)
    if len(shape) > _MAX_DIMS or any(d < 0 for d in shape):
        raise ProtocolError(f"{t.name}: shape {shape} has a negative size or over {_MAX_DIMS} "
                            "dimensions")
    # As common/checked_math.h: a zero dimension does not excuse an overflow in the others.
    if math.prod(d for d in shape if d) * dtype.itemsize > _MAX_INT64:
        raise ProtocolError(f"{t.name}: shape {shape} is too large to hold")
    size = math.prod(shape) * dtype.itemsize
    if size != t.nbytes:
        raise ProtocolError(f"{t.name}: header announces {t.nbytes} bytes for shape {shape}, "
                            f"which holds {size}")


def _decode(t: "pb.TensorHeader", data: bytearray) -> np.ndarray:
    """The tensor `t` announced, from its wire bytes; bfloat16 widened to float32."""
    _check_header(t)
    dtype = _NUMPY_DTYPES[t.dtype]
    shape = tuple(t.shape)
    if math.prod(shape) * dtype.itemsize != len(data):
        raise ProtocolError(f"{t.name}: {len(data)} bytes for shape {list(shape)} of "
                            f"{pb.DType.Name(t.dtype)}")
    a = np.frombuffer(data, dtype=dtype).reshape(shape)
    if t.dtype == pb.BFLOAT16:
        a = (a.astype("<u4") << 16).view("<f4")
    return a


class StepAssembler:
    """Rebuilds one step's StepResult from its StepResponse messages, checking the protocol.

    The order must be: a header; then for each tensor it announces, in order, chunks of that name
    whose offsets are contiguous from 0 and whose sizes add up to exactly its nbytes (a zero-byte
    tensor has no chunks); then a trailer. Each announced tensor must be one this client can hold
    (known dtype, non-negative shape whose exact byte size is its nbytes), checked on the header. Anything else raises ProtocolError; a StepError message
    raises StepFailed.
    """

    def __init__(self):
        self._header = None
        self._tensors: Dict[str, np.ndarray] = {}
        self._current = 0  # index into header.tensors of the tensor being filled
        self._buffer = bytearray()
        self._result: Optional[StepResult] = None

    def add(self, msg: "pb.StepResponse") -> bool:
        """Feeds the next message; True once the trailer has arrived."""
        if self._result is not None:
            raise ProtocolError("a message after the trailer")
        kind = msg.WhichOneof("kind")
        if kind == "error":
            raise StepFailed(_status_code(msg.error.code), msg.error.message)
        if kind is None:
            raise ProtocolError("an empty StepResponse")
        if kind == "header":
            if self._header is not None:
                raise ProtocolError("a second header")
            for t in msg.header.tensors:
                _check_header(t)
            self._header = msg.header
            return False
        if self._header is None:
            raise ProtocolError(f"a {kind} before the header")
        self._skip_empty()
        if kind == "chunk":
            self._add_chunk(msg.chunk)
            return False
        if self._current < len(self._header.tensors):
            t = self._header.tensors[self._current]
            raise ProtocolError(
                f"{t.name}: got {len(self._buffer)} of {t.nbytes} bytes before the trailer")
        self._result = StepResult(self._header, self._tensors, msg.trailer)
        return True

    def result(self) -> StepResult:
        """The StepResult, once add() returned True."""
        if self._result is None:
            raise ProtocolError("the stream ended without a trailer")
        return self._result

    def _add_chunk(self, c: "pb.TensorChunk"):
        if self._current >= len(self._header.tensors):
            raise ProtocolError(f"{c.name}: a chunk after every tensor was complete")
        t = self._header.tensors[self._current]
        if c.name != t.name:
            raise ProtocolError(f"chunk of {c.name} while {t.name} was incomplete")
        if c.offset != len(self._buffer):
            raise ProtocolError(f"{t.name}: chunk at offset {c.offset}, expected {len(self._buffer)}")
        if len(self._buffer) + len(c.data) > t.nbytes:
            raise ProtocolError(f"{t.name}: chunks exceed the announced {t.nbytes} bytes")
        self._buffer += c.data
        if len(self._buffer) == t.nbytes:
            self._finish()

    def _skip_empty(self):
        """Finishes the tensors of zero bytes that come next: they have no chunks."""
        while (self._current < len(self._header.tensors) and not self._buffer
               and self._header.tensors[self._current].nbytes == 0):
            self._finish()

    def _finish(self):
        t = self._header.tensors[self._current]
        self._tensors[t.name] = _decode(t, self._buffer)
        self._buffer = bytearray()
        self._current += 1


def assemble(messages: Iterable["pb.StepResponse"]) -> StepResult:
    """The StepResult of a whole Step stream; ProtocolError unless it ends right after a trailer."""
    assembler = StepAssembler()
    for msg in messages:
        assembler.add(msg)
    return assembler.result()


def _status_code(value: int) -> grpc.StatusCode:
    return _STATUS_CODES.get(value, grpc.StatusCode.UNKNOWN)


def _rpc_failed(e: grpc.RpcError) -> RpcFailed:
    return RpcFailed(e.code(), e.details() or "")


def _wire_tensor(a) -> "pb.Tensor":
    """`a` as a little-endian row-major Tensor: float16 stays float16, the rest becomes float32."""
    a = np.asarray(a)
    half = a.dtype.kind == "f" and a.dtype.itemsize == 2
    a = np.ascontiguousarray(a, dtype="<f2" if half else "<f4")
    return pb.Tensor(dtype=pb.FLOAT16 if half else pb.FLOAT32, shape=a.shape, data=a.tobytes())


def _output_selection(outputs: Sequence[str]) -> "pb.OutputSelection":
    if isinstance(outputs, str):
        outputs = [outputs]
    o = pb.OutputSelection()
    for name in outputs:
        if name in ("velocity", "cond", "embeddings", "positions"):
            setattr(o, name, True)
        elif name == "taps":
            o.all_taps = True
        elif name.startswith("tap.") and name[4:].isdigit():
            o.taps.append(int(name[4:]))
        else:
            raise ValueError("outputs: expected velocity, cond, taps, tap.N, embeddings or "
                             f"positions, got {name!r}")
    return o


def make_request(*, text, anchor, noised, timesteps, clean=None, frames_per_chunk: int = 1,
                 decode: bool = True, outputs: Sequence[str] = ("velocity",),
                 rope_shifts: Optional[Sequence[int]] = None, wire_dtype: str = "float32",
                 request_id: str = "") -> "pb.StepRequest":
    """The StepRequest for one step; the arguments are those of Client.step.

    Only what cannot be encoded is checked here (ValueError for unknown outputs or wire dtypes);
    the server validates the rest and answers INVALID_ARGUMENT.
    """
    if wire_dtype not in _WIRE_DTYPES:
        raise ValueError(f"wire_dtype: expected float32, bfloat16 or float16, got {wire_dtype!r}")
    r = pb.StepRequest(text=_wire_tensor(text), anchor=_wire_tensor(anchor),
                       noised=_wire_tensor(noised), timesteps=_wire_tensor(timesteps),
                       frames_per_chunk=frames_per_chunk, decode=decode,
                       rope_shifts=list(rope_shifts or ()), outputs=_output_selection(outputs),
                       wire_dtype=_WIRE_DTYPES[wire_dtype], request_id=request_id)
    if clean is not None:
        r.clean.CopyFrom(_wire_tensor(clean))
    return r


LAYOUT_HEADER = "x-praxis-layout"


def layout_key(request: "pb.StepRequest") -> str:
    """The server's layout key of `request` (the StepHeader's layout_key), from its shapes alone;
    "" when they are malformed. Sent as the x-praxis-layout header, on which a proxy can hash to
    send one layout's steps to one replica, where they batch together (deploy/affinity)."""
    text, anchor, noised = (list(t.shape) for t in (request.text, request.anchor, request.noised))
    f = request.frames_per_chunk
    shifts = list(request.rope_shifts) or [0, 0, 0, 0]
    if len(text) != 3 or len(anchor) != 5 or len(noised) != 5 or f <= 0 or len(shifts) != 4:
        return ""
    return (f"L{text[1]}_a{anchor[3]}x{anchor[4]}_K{noised[2] // f}_F{f}_g{noised[3]}x{noised[4]}"
            f"_{'dec' if request.decode else 'enc'}_rs{','.join(map(str, shifts))}")


def _layout_metadata(request: "pb.StepRequest") -> tuple:
    key = layout_key(request)
    return ((LAYOUT_HEADER, key),) if key else ()


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _auth_metadata(token: Optional[str], token_file: Optional[str]) -> tuple:
    """The authorization metadata for `token`, or the first non-blank line of `token_file`."""
    if token is None and token_file is not None:
        lines = [ln.strip() for ln in _read(token_file).decode("utf-8").splitlines()]
        token = next((ln for ln in lines if ln and not ln.startswith("#")), None)
        if token is None:
            raise ValueError(f"token_file: no token in {token_file}")
    if not token:
        return ()
    if not token.isprintable() or not token.isascii():
        raise ValueError("token: expected printable ASCII characters only")
    return (("authorization", f"Bearer {token}"),)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, i: int):
    n = shift = 0
    while True:
        if i >= len(data):
            raise ProtocolError("a truncated HealthCheckResponse")
        b = data[i]
        n |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not b & 0x80:
            return n, i


def _health_request(service: str) -> bytes:
    """A grpc.health.v1.HealthCheckRequest: field 1, the service name."""
    name = service.encode("utf-8")
    return b"\x0a" + _varint(len(name)) + name if name else b""


def _health_status(data: bytes) -> int:
    """Field 1 (status) of a grpc.health.v1.HealthCheckResponse; other fields are skipped."""
    status, i = 0, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
            if field == 1:
                status = value
        elif wire == 2:
            size, i = _read_varint(data, i)
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ProtocolError(f"HealthCheckResponse: wire type {wire} of field {field}")
    return status


class Client:
    """A connection to praxis-server (address "HOST:PORT").

    `timeout` bounds each call attempt, in seconds. `tls_ca` is a PEM file of root certificates:
    given, the channel uses TLS; None, plaintext. `tls_cert` and `tls_key` (PEM files, both or
    neither, with `tls_ca`) are the client certificate for servers started with --tls_client_ca.
    `token` (or `token_file`, whose first non-blank line is the token) is sent as
    `authorization: Bearer <token>` on every call, for servers started with --auth_token_file. A call answered UNAVAILABLE (the server is
    warming up, draining or unreachable: the step was not computed) is retried with exponential
    backoff and jitter, `max_attempts` times in all. Thread-safe; close() it, or use it as a
    context manager.
    """

    def __init__(self, address: str, timeout: float = 60.0, tls_ca: Optional[str] = None,
                 max_attempts: int = 3, *, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, token: Optional[str] = None,
                 token_file: Optional[str] = None):
        options = [("grpc.max_receive_message_length", _MAX_RECEIVE_BYTES),
                   ("grpc.max_send_message_length", -1)]
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key: expected both or neither")
        if tls_cert is not None and tls_ca is None:
            raise ValueError("tls_cert: a client certificate needs TLS; give tls_ca too")
        self._auth = _auth_metadata(token, token_file)
        if tls_ca is None:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca),
                private_key=_read(tls_key) if tls_key else None,
                certificate_chain=_read(tls_cert) if tls_cert else None)
            self._channel = grpc.secure_channel(address, creds, options=options)
        self._stub = pb_grpc.PraxisStub(self._channel)
        self._health = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=_health_request,
            response_deserializer=_health_status)
        self.timeout = timeout
        self.max_attempts = max_attempts

    def step(self, *, text, anchor, noised, timesteps, clean=None, frames_per_chunk: int = 1,
             decode: bool = True, outputs: Sequence[str] = ("velocity",),
             rope_shifts: Optional[Sequence[int]] = None, wire_dtype: str = "float32",
             request_id: str = "", timeout: Optional[float] = None) -> StepResult:
        """Runs one denoising step and returns its StepResult.

        Inputs are numpy arrays (float32 or float16 as given, anything else converted to float32):
        text [B, L, text_dim], anchor [B, C, 1, h, w], noised [B, C, K*F, h, w], clean
        [B, C, (K-1)*F, h, w] (given iff K > 1), timesteps [B, K] in [0, 1]. `outputs` lists
        "velocity", "cond", "taps" (all taps), "tap.N", "embeddings", "positions"; velocity needs
        decode=True. `rope_shifts` is None or 4 values (encoder anchor, text, video, decoder).

        `wire_dtype` is the dtype float outputs travel in: "float32", "float16" (returned as
        float16) or "bfloat16" (halves the bytes; returned as float32, exactly the bfloat16 values,
        i.e. float32 whose lower 16 bits are zero). Positions are int64 whatever the wire dtype.

        Raises RpcFailed (INVALID_ARGUMENT naming the field for a malformed request), ProtocolError
        for a malformed answer.
        """
        request = make_request(text=text, anchor=anchor, noised=noised, timesteps=timesteps,
                               clean=clean, frames_per_chunk=frames_per_chunk, decode=decode,
                               outputs=outputs, rope_shifts=rope_shifts, wire_dtype=wire_dtype,
                               request_id=request_id)
        return self._retrying(lambda t: self._step_once(request, t), timeout)

    def info(self, timeout: Optional[float] = None) -> "pb.ModelInfo":
        """The server's ModelInfo: model, dtype, device, limits, output names, config JSON."""
        return self._retrying(lambda t: self._stub.GetModelInfo(
            pb.ModelInfoRequest(), timeout=t, metadata=self._auth or None), timeout)

    def health(self, service: str = "", timeout: Optional[float] = None) -> str:
        """The grpc.health.v1 status of `service` ("" for the whole server): "SERVING",
        "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN"."""
        status = self._retrying(lambda t: self._health(service, timeout=t, metadata=self._auth or None),
                                timeout)
        return _HEALTH[status] if status < len(_HEALTH) else "UNKNOWN"

    def session(self, timeout: Optional[float] = None, layout: str = "") -> "Session":
        """Opens a Session stream for the consecutive steps of one robot.

        `timeout` bounds the whole session, in seconds; None, no deadline. `layout`, the
        layout_key() of the robot's steps, is sent as the x-praxis-layout header for routing.
        """
        return Session(self._stub, timeout,
                       self._auth + (((LAYOUT_HEADER, layout),) if layout else ()) or None)

    def close(self):
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _step_once(self, request: "pb.StepRequest", timeout: float) -> StepResult:
        call = self._stub.Step(request, timeout=timeout,
                               metadata=self._auth + _layout_metadata(request) or None)
        try:
            return assemble(call)
        except ProtocolError:
            call.cancel()
            raise

    def _retrying(self, attempt, timeout: Optional[float]):
        """attempt(timeout), retried on UNAVAILABLE; grpc.RpcError becomes RpcFailed."""
        timeout = self.timeout if timeout is None else timeout
        backoff = _INITIAL_BACKOFF_S
        for n in range(1, self.max_attempts + 1):
            try:
                return attempt(timeout)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or n >= self.max_attempts:
                    raise _rpc_failed(e) from None
            time.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, _MAX_BACKOFF_S)


_END = object()  # the request queue's end: half-closes the Session stream


class Session:
    """One Session stream: the consecutive steps of one robot, sent and answered one at a time.

    A step the server rejects raises StepFailed and the session goes on. A broken stream (its
    status, or a protocol error) raises that error from then on. Not thread-safe (one robot, one
    control loop). close() it, or use it as a context manager.
    """

    def __init__(self, stub, timeout: Optional[float], metadata=None):
        self._requests = queue.SimpleQueue()
        self._call = stub.Session(iter(self._requests.get, _END), timeout=timeout,
                                  metadata=metadata)
        self._closed = False
        self._broken: Optional[PraxisError] = None

    def step(self, **kwargs) -> StepResult:
        """One step: the arguments of Client.step, except timeout (the session's bounds it)."""
        if self._closed:
            raise ValueError("the session is closed")
        if self._broken is not None:
            raise self._broken
        self._requests.put(make_request(**kwargs))
        assembler = StepAssembler()
        try:
            for msg in self._call:
                if assembler.add(msg):
                    return assembler.result()
            self._broken = ProtocolError("the session ended mid-step")
        except ProtocolError as e:
            self._broken = e
            self._cancel()
        except grpc.RpcError as e:
            self._broken = _rpc_failed(e)
        raise self._broken

    def close(self):
        """Half-closes the stream and waits for its end; RpcFailed for a non-OK final status."""
        if self._closed:
            return
        self._closed = True
        self._requests.put(_END)
        if self._broken is not None:
            return
        try:
            for _ in self._call:
                pass
        except grpc.RpcError as e:
            raise _rpc_failed(e) from None

    def _cancel(self):
        self._requests.put(_END)
        self._call.cancel()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        elif not self._closed:
            self._closed = True
            self._cancel()
