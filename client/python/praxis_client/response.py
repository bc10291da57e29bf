"""A step's answer: the StepResponse stream checked and reassembled into numpy arrays."""
import dataclasses
import math
from typing import Dict, Iterable, Optional

import numpy as np

from praxis_client._proto import praxis_pb2 as pb
from praxis_client.errors import ProtocolError, StepFailed, status_code

_NUMPY_DTYPES = {pb.FLOAT32: np.dtype("<f4"), pb.FLOAT16: np.dtype("<f2"),
                 pb.BFLOAT16: np.dtype("<u2"), pb.INT64: np.dtype("<i8")}
_MAX_DIMS = 8  # the wire codec's limit; a header beyond it can only be hostile
_MAX_INT64 = (1 << 63) - 1


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
    tensor has no chunks); then a trailer — as separate messages, or all in one StepAnswer (the
    request's whole_answer). Each announced tensor must be one this client can hold (known dtype,
    non-negative shape whose exact byte size is its nbytes), checked on the header. Anything else
    raises ProtocolError; a StepError message raises StepFailed.
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
            raise StepFailed(status_code(msg.error.code), msg.error.message)
        if kind is None:
            raise ProtocolError("an empty StepResponse")
        if kind == "answer":
            # The stream's messages in one, held to the same order and sizes.
            a = msg.answer
            if not a.HasField("header") or not a.HasField("trailer"):
                raise ProtocolError("an answer without its header or trailer")
            self._add_header(a.header)
            for c in a.chunks:
                self._add_chunk(c)
            return self._add_trailer(a.trailer)
        if kind == "header":
            self._add_header(msg.header)
            return False
        if self._header is None:
            raise ProtocolError(f"a {kind} before the header")
        if kind == "chunk":
            self._add_chunk(msg.chunk)
            return False
        return self._add_trailer(msg.trailer)

    def _add_header(self, h: "pb.StepHeader"):
        if self._header is not None:
            raise ProtocolError("a second header")
        for t in h.tensors:
            _check_header(t)
        self._header = h

    def _add_trailer(self, trailer: "pb.StepTrailer") -> bool:
        self._skip_empty()
        if self._current < len(self._header.tensors):
            t = self._header.tensors[self._current]
            raise ProtocolError(
                f"{t.name}: got {len(self._buffer)} of {t.nbytes} bytes before the trailer")
        self._result = StepResult(self._header, self._tensors, trailer)
        return True

    def result(self) -> StepResult:
        """The StepResult, once add() returned True."""
        if self._result is None:
            raise ProtocolError("the stream ended without a trailer")
        return self._result

    def _add_chunk(self, c: "pb.TensorChunk"):
        self._skip_empty()
        if self._current >= len(self._header.tensors):
            raise ProtocolError(f"{c.name}: a chunk after every tensor was complete")
        t = self._header.tensors[self._current]
        if c.name != t.name:
            raise ProtocolError(f"chunk of {c.name} while {t.name} was incomplete")
        if c.offset != len(self._buffer):
            raise ProtocolError(
                f"{t.name}: chunk at offset {c.offset}, expected {len(self._buffer)}")
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
