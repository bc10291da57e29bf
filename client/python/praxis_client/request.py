"""StepRequests from numpy arrays, and the layout key a proxy routes them by."""
import operator
from typing import Optional, Sequence

import numpy as np

from praxis_client._proto import praxis_pb2 as pb

WIRE_DTYPES = {"float32": pb.FLOAT32, "float16": pb.FLOAT16, "bfloat16": pb.BFLOAT16}
OUTPUT_NAMES = ("velocity", "cond", "taps", "tap.N", "embeddings", "positions")
LAYOUT_HEADER = "x-praxis-layout"


def wire_tensor(a) -> "pb.Tensor":
    """`a` as a little-endian row-major Tensor: float16 stays float16, the rest becomes float32."""
    a = np.asarray(a)
    half = a.dtype.kind == "f" and a.dtype.itemsize == 2
    a = np.ascontiguousarray(a, dtype="<f2" if half else "<f4")
    return pb.Tensor(dtype=pb.FLOAT16 if half else pb.FLOAT32, shape=a.shape, data=a.tobytes())


def output_selection(outputs: Sequence[str]) -> "pb.OutputSelection":
    """The OutputSelection of names among OUTPUT_NAMES; ValueError naming `outputs` otherwise."""
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
            raise ValueError(f"outputs: expected {', '.join(OUTPUT_NAMES)}, got {name!r}")
    return o


def make_request(*, text, anchor, noised, timesteps, clean=None, frames_per_chunk: int = 1,
                 decode: bool = True, outputs: Sequence[str] = ("velocity",),
                 rope_shifts: Optional[Sequence[int]] = None, wire_dtype: str = "float32",
                 request_id: str = "", whole_answer: bool = True) -> "pb.StepRequest":
    """The StepRequest for one step; the arguments are those of Client.step.

    Only what cannot be encoded is checked here (ValueError for unknown outputs or wire dtypes);
    the server validates the rest and answers INVALID_ARGUMENT.
    """
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"wire_dtype: expected float32, bfloat16 or float16, got {wire_dtype!r}")
    r = pb.StepRequest(text=wire_tensor(text), anchor=wire_tensor(anchor),
                       noised=wire_tensor(noised), timesteps=wire_tensor(timesteps),
                       frames_per_chunk=operator.index(frames_per_chunk), decode=decode,
                       rope_shifts=list(rope_shifts or ()), outputs=output_selection(outputs),
                       wire_dtype=WIRE_DTYPES[wire_dtype], request_id=request_id,
                       whole_answer=whole_answer)
    if clean is not None:
        r.clean.CopyFrom(wire_tensor(clean))
    return r


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


def layout_metadata(request: "pb.StepRequest") -> tuple:
    """The x-praxis-layout metadata of `request`, or none when its shapes are malformed."""
    key = layout_key(request)
    return ((LAYOUT_HEADER, key),) if key else ()
