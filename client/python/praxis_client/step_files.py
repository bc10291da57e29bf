"""Step files as praxis-cli reads and writes them (safetensors), and synthetic step inputs.

Inputs (praxis-cli step --inputs, wire/step_file.h): tensors text, anchor, noised, timesteps, clean
(absent when K == 1) and optionally frames_per_chunk, a one-element integer tensor. Outputs
(praxis-cli step --out): every returned tensor by name (velocity, cond, tap.N, embeddings,
positions) and the metadata layout_key, queue_us, compute_us, batch_rows and noised_span
("start,length"). A bfloat16 wire dtype is written as float32 holding exactly the bfloat16
values (numpy has no bfloat16; praxis-cli writes BF16).
"""
import json
import os
from typing import Dict, List, Tuple

import numpy as np

from praxis_client.response import StepResult

REQUIRED_INPUTS = ("text", "anchor", "noised", "timesteps")


def _safetensors_numpy():
    try:
        from safetensors import numpy as st
    except ImportError as e:  # a dependency of the wheel; absent only in a bare source tree
        raise ImportError("praxis_client step files need safetensors (pip install safetensors)") \
            from e
    return st


def read_inputs(path: str, frames_per_chunk: int = 0) -> Dict[str, object]:
    """Client.step's input arguments from the safetensors file `path`; frames_per_chunk is the
    argument when positive, else the file's one-element tensor of that name. ValueError naming
    the missing tensor or frames_per_chunk."""
    st = _safetensors_numpy()
    try:
        tensors = st.load_file(path)
    except OSError as e:
        raise ValueError(f"inputs: cannot read {path}: "
                         f"{os.strerror(e.errno) if e.errno else e}") from None
    except Exception as e:  # safetensors' own error type for a malformed file
        raise ValueError(f"inputs: {path} is not a safetensors file: {e}") from None
    missing = [n for n in REQUIRED_INPUTS if n not in tensors]
    if missing:
        raise ValueError(f"{missing[0]}: no tensor of that name in {path}")
    inputs: Dict[str, object] = {n: tensors[n] for n in REQUIRED_INPUTS}
    if "clean" in tensors:
        inputs["clean"] = tensors["clean"]
    if frames_per_chunk <= 0:
        f = tensors.get("frames_per_chunk")
        if f is None or f.size != 1 or f.dtype.kind not in "iu":
            raise ValueError("frames_per_chunk: give --frames_per_chunk or a one-element integer "
                             f"tensor of that name in {path}")
        frames_per_chunk = int(f.reshape(-1)[0])
    inputs["frames_per_chunk"] = frames_per_chunk
    return inputs


def write_outputs(path: str, result: StepResult) -> List[str]:
    """Writes `result`'s tensors and header metadata to `path` as praxis-cli does; returns the
    tensor names, in the order the server sent them."""
    h = result.header
    metadata = {"layout_key": h.layout_key, "queue_us": str(h.queue_us),
                "compute_us": str(h.compute_us), "batch_rows": str(h.batch_rows),
                "noised_span": f"{h.noised_span.start},{h.noised_span.length}"}
    tensors = {name: np.ascontiguousarray(a) for name, a in result.tensors.items()}
    _safetensors_numpy().save_file(tensors, path, metadata=metadata)
    return list(result.tensors)


def parse_layout(text: str) -> Tuple[int, int, int, int, int]:
    """"text_len,h,w,K,F" as five positive integers; ValueError naming --layout otherwise."""
    parts = text.split(",")
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 5 or min(values) < 1:
        raise ValueError(
            f"--layout: expected five positive integers text_len,h,w,K,F, got {text!r}")
    return values


def model_widths(config_json: str) -> Tuple[int, int]:
    """(latent channels C, text_dim) of the server's model, from ModelInfo.config_json; ValueError
    naming the missing key."""
    try:
        backbone = json.loads(config_json)["backbone"]
        return int(backbone["encoder"]["video_in"]["c_in"]), int(backbone["text_dim"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"config_json: no backbone.encoder.video_in.c_in and backbone.text_dim "
                         f"({e!r})") from None


def synthetic_inputs(config_json: str, layout: Tuple[int, int, int, int, int], batch: int = 1,
                     seed: int = 0) -> Dict[str, object]:
    """Random step inputs of `layout` (text_len, h, w, K, F) for the model of `config_json`, as
    praxis-cli step --layout makes them (other random values: numpy's generator, not torch's)."""
    text_len, h, w, k, f = layout
    c, text_dim = model_widths(config_json)
    rng = np.random.default_rng(seed)
    inputs: Dict[str, object] = {
        "text": rng.standard_normal((batch, text_len, text_dim), dtype=np.float32),
        "anchor": rng.standard_normal((batch, c, 1, h, w), dtype=np.float32),
        "noised": rng.standard_normal((batch, c, k * f, h, w), dtype=np.float32),
        "timesteps": rng.random((batch, k), dtype=np.float32),
        "frames_per_chunk": f,
    }
    if k > 1:
        inputs["clean"] = rng.standard_normal((batch, c, (k - 1) * f, h, w), dtype=np.float32)
    return inputs
