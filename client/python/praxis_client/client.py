"""A client for praxis-serve: one denoising step per call, or a Session stream per robot."""
import queue
import random
import time
from typing import Optional, Sequence

import grpc

from praxis_client import _channel, _health
from praxis_client._proto import praxis_pb2 as pb
from praxis_client._proto import praxis_pb2_grpc as pb_grpc
from praxis_client.errors import PraxisError, ProtocolError, rpc_failed
from praxis_client.request import LAYOUT_HEADER, layout_metadata, make_request
from praxis_client.response import StepAssembler, StepResult, assemble

_INITIAL_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 2.0
# What a call may be answered with and still be sent again (see Client).
_RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


class Client:
    """A connection to praxis-server (address "HOST:PORT").

    `timeout` bounds each call attempt, in seconds. TLS: `tls_ca` is a PEM file of root
    certificates (given, the channel uses TLS); `tls=True` uses TLS with gRPC's default roots
    instead; neither, plaintext. `tls_cert` and `tls_key` (PEM files, both or neither, with TLS)
    are the client certificate for servers started with --tls_client_ca; `tls_server_name` is the
    name the server's certificate is checked against, when not the address's host. `token` (or
    `token_file`, whose first line that is neither blank nor a # comment is the token) is sent as
    `authorization: Bearer <token>` on every call, for servers started with --auth_token_file.
    A call answered UNAVAILABLE (the server is warming up, draining or unreachable: the step was
    not computed), or CANCELLED from the far side (this client cancels none it retries; gRPC
    cancels the calls that reach a server, through a proxy, in the instant it shuts down), is
    retried with exponential backoff and jitter, `max_attempts` times in all: a step is a pure
    function of its request, so sending it again is safe.
    ValueError naming the argument for unusable arguments. Thread-safe; close() it, or use it as
    a context manager.
    """

    def __init__(self, address: str, timeout: float = 60.0, tls_ca: Optional[str] = None,
                 max_attempts: int = 3, *, tls: bool = False, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, tls_server_name: Optional[str] = None,
                 token: Optional[str] = None, token_file: Optional[str] = None):
        if max_attempts < 1:
            raise ValueError(f"max_attempts: expected >= 1, got {max_attempts}")
        self._auth = _channel.auth_metadata(token, token_file)
        self._channel = _channel.make_channel(address, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert,
                                              tls_key=tls_key, tls_server_name=tls_server_name)
        self._stub = pb_grpc.PraxisStub(self._channel)
        self._health = self._channel.unary_unary(
            _health.METHOD, request_serializer=_health.encode_request,
            response_deserializer=_health.decode_status)
        self.timeout = timeout
        self.max_attempts = max_attempts

    def step(self, *, text, anchor, noised, timesteps, clean=None, frames_per_chunk: int = 1,
             decode: bool = True, outputs: Sequence[str] = ("velocity",),
             rope_shifts: Optional[Sequence[int]] = None, wire_dtype: str = "float32",
             request_id: str = "", whole_answer: bool = True,
             timeout: Optional[float] = None) -> StepResult:
        """Runs one denoising step and returns its StepResult.

        Inputs are numpy arrays (float32 or float16 as given, anything else converted to float32):
        text [B, L, text_dim], anchor [B, C, 1, h, w], noised [B, C, K*F, h, w], clean
        [B, C, (K-1)*F, h, w] (given iff K > 1), timesteps [B, K] in [0, 1]. `outputs` lists
        "velocity", "cond", "taps" (all taps), "tap.N", "embeddings", "positions"; velocity needs
        decode=True. `rope_shifts` is None or 4 values (encoder anchor, text, video, decoder).

        `wire_dtype` is the dtype float outputs travel in: "float32", "float16" (returned as
        float16) or "bfloat16" (halves the bytes; returned as float32, exactly the bfloat16 values,
        i.e. float32 whose lower 16 bits are zero). Positions are int64 whatever the wire dtype.
        `whole_answer` asks for the answer in one message where it fits the server's chunk size
        (one gRPC message to read instead of a header, chunks and a trailer); either way the result
        is the same.

        Raises RpcFailed (INVALID_ARGUMENT naming the field for a malformed request), ProtocolError
        for a malformed answer.
        """
        request = make_request(text=text, anchor=anchor, noised=noised, timesteps=timesteps,
                               clean=clean, frames_per_chunk=frames_per_chunk, decode=decode,
                               outputs=outputs, rope_shifts=rope_shifts, wire_dtype=wire_dtype,
                               request_id=request_id, whole_answer=whole_answer)
        return self._retrying(lambda t: self._step_once(request, t), timeout)

    def info(self, timeout: Optional[float] = None) -> "pb.ModelInfo":
        """The server's ModelInfo: model, dtype, device, limits, output names, config JSON."""
        return self._retrying(lambda t: self._stub.GetModelInfo(
            pb.ModelInfoRequest(), timeout=t, metadata=self._auth or None), timeout)

    def health(self, service: str = "", timeout: Optional[float] = None) -> str:
        """The grpc.health.v1 status of `service` ("" for the whole server): "SERVING",
        "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN"; RpcFailed NOT_FOUND for an unknown one."""
        status = self._retrying(
            lambda t: self._health(service, timeout=t, metadata=self._auth or None), timeout)
        return _health.status_name(status)

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
                               metadata=self._auth + layout_metadata(request) or None)
        try:
            return assemble(call)
        except ProtocolError:
            call.cancel()
            raise

    def _retrying(self, attempt, timeout: Optional[float]):
        """attempt(timeout), retried on _RETRIED codes; grpc.RpcError becomes RpcFailed."""
        timeout = self.timeout if timeout is None else timeout
        backoff = _INITIAL_BACKOFF_S
        for n in range(1, self.max_attempts + 1):
            try:
                return attempt(timeout)
            except grpc.RpcError as e:
                if e.code() not in _RETRIED or n >= self.max_attempts:
                    raise rpc_failed(e) from None
            time.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, _MAX_BACKOFF_S)


_END = object()  # the request queue's end: half-closes the Session stream


class Session:
    """One Session stream: the consecutive steps of one robot, sent and answered one at a time.

    A step the server rejects raises StepFailed and the session goes on. A broken stream (its
    status, or a protocol error) raises that error from then on. A text equal to the one the
    server said it keeps (StepHeader.text_kept) is left out of the message: a robot's instruction
    crosses the wire once, not with every step. Not thread-safe (one robot, one control loop).
    close() it, or use it as a context manager.
    """

    def __init__(self, stub, timeout: Optional[float], metadata=None):
        self._requests = queue.SimpleQueue()
        self._call = stub.Session(iter(self._requests.get, _END), timeout=timeout,
                                  metadata=metadata)
        self._closed = False
        self._broken: Optional[PraxisError] = None
        self._kept_text = None  # what the server keeps for this session, per its last answer

    def step(self, **kwargs) -> StepResult:
        """One step: the arguments of Client.step, except timeout (the session's bounds it)."""
        if self._closed:
            raise ValueError("the session is closed")
        if self._broken is not None:
            raise self._broken
        request = make_request(**kwargs)
        kept, self._kept_text = self._kept_text, None  # a failed step sends its text next time
        left_out = kept is not None and request.text == kept
        if left_out:
            request.ClearField("text")
        self._requests.put(request)
        assembler = StepAssembler()
        try:
            for msg in self._call:
                if assembler.add(msg):
                    result = assembler.result()
                    if result.header.text_kept:
                        # A copy, not a view that would keep the whole request alive.
                        self._kept_text = kept if left_out else pb.Tensor()
                        if not left_out:
                            self._kept_text.CopyFrom(request.text)
                    return result
            self._broken = ProtocolError("the session ended mid-step")
        except ProtocolError as e:
            self._broken = e
            self._cancel()
        except grpc.RpcError as e:
            self._broken = rpc_failed(e)
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
            raise rpc_failed(e) from None

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
