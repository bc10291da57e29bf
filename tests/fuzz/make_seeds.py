#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

Run once by hand when a format changes (the venv has numpy and grpcio-tools):
    ~/.cache/praxis-serve/venv/bin/python tests/fuzz/make_seeds.py
Seeds are small: valid inputs of a few layouts, so the fuzzers start deep, plus a handful of
hostile ones that earlier bugs (issue 12) were made of, so a regression is found in seconds.
"""

import json
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fuzz" / "corpus"


def write(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def praxis_pb2():
    """The praxis.v1 messages, generated from proto/ into a temporary folder."""
    tmp = tempfile.mkdtemp()
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'proto'}",
                    f"--python_out={tmp}", "praxis/v1/praxis.proto"], check=True)
    sys.path.insert(0, tmp)
    from praxis.v1 import praxis_pb2 as pb  # noqa: E402
    return pb


def step_request_seeds():
    pb = praxis_pb2()
    rng = np.random.default_rng(0)
    dtypes = {"f32": (pb.FLOAT32, np.float32), "f16": (pb.FLOAT16, np.float16)}

    def tensor(shape, kind="f32", lo=-1.0, hi=1.0):
        code, np_type = dtypes[kind]
        values = rng.uniform(lo, hi, size=shape).astype(np_type)
        return pb.Tensor(dtype=code, shape=list(shape), data=values.tobytes())

    def request(b, k, f, h, w, length, kind="f32", decode=True):
        r = pb.StepRequest(frames_per_chunk=f, decode=decode)
        r.text.CopyFrom(tensor((b, length, 48), kind))
        r.anchor.CopyFrom(tensor((b, 16, 1, h, w), kind))
        if k > 1:
            r.clean.CopyFrom(tensor((b, 16, (k - 1) * f, h, w), kind))
        r.noised.CopyFrom(tensor((b, 16, k * f, h, w), kind))
        r.timesteps.CopyFrom(tensor((b, k), kind, 0.0, 1.0))
        r.outputs.velocity = decode
        r.outputs.cond = not decode
        r.outputs.all_taps = decode
        return r

    # Mode byte 0: the rest is a serialized request.
    layouts = {
        "valid_b1_k2_f1_3x4": request(1, 2, 1, 3, 4, 5),
        "valid_b1_k1_2x2_nodecode": request(1, 1, 1, 2, 2, 3, decode=False),
        "valid_b2_k2_f2_1x3_f16": request(2, 2, 2, 1, 3, 2, kind="f16"),
    }
    shifted = request(1, 2, 1, 2, 3, 4)
    shifted.rope_shifts.extend([1, 2, 3, 4])
    shifted.outputs.all_taps = False
    shifted.outputs.taps.extend([1, 0])
    shifted.wire_dtype = pb.BFLOAT16
    layouts["valid_rope_taps_bf16"] = shifted
    for name, r in layouts.items():
        write("step_request", name, b"\x00" + r.SerializeToString())
    # Hostile: shapes whose byte count wraps, a numel-0 giant, repeated taps (issue 12).
    for name, shape in {"wrap_2p62": [2**62], "wrap_2p31_2p31": [2**31, 2**31],
                        "zero_giant": [0, 2**40, 2**40]}.items():
        r = request(1, 2, 1, 3, 4, 5)
        r.noised.ClearField("shape")
        r.noised.shape.extend(shape)
        r.noised.data = b""
        write("step_request", name, b"\x00" + r.SerializeToString())
    r = request(1, 1, 1, 2, 2, 3)
    r.outputs.all_taps = False
    r.outputs.taps.extend([0] * 64)
    write("step_request", "repeated_taps", b"\x00" + r.SerializeToString())
    # Mode byte 1: the builder; all zeros is its smallest valid request, the others vary it.
    write("step_request", "builder_zero", b"\x01" + bytes(64))
    write("step_request", "builder_mixed", b"\x01" + bytes(range(1, 200)))


def config_seeds():
    for path in sorted((ROOT / "configs").glob("*.json")):
        write("config", path.name, path.read_text())
    tiny = json.loads((ROOT / "configs" / "tiny.json").read_text())

    def variant(name, edit):
        c = json.loads(json.dumps(tiny))
        edit(c["backbone"])
        write("config", name, json.dumps(c))

    variant("unpatch_2p32.json", lambda b: b["decoder"].update(unpatch_factor=[1, 2**32, 2**32]))
    variant("dim_2p40.json", lambda b: b.update(dim=2**40))
    variant("heads_zero.json", lambda b: b.update(num_heads=0))
    variant("negative_depth.json", lambda b: b["encoder"].update(depth=-1))
    variant("huge_unsigned.json", lambda b: b.update(dim=2**64 - 1))
    write("config", "deep.json", "[" * 2000 + "]" * 2000)
    write("config", "not_object.json", "[1, 2, 3]")


def safetensors_file(entries, data, metadata=None, header_len=None):
    header = dict(entries)
    if metadata is not None:
        header = {"__metadata__": metadata, **header}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    n = len(text) if header_len is None else header_len
    return struct.pack("<Q", n) + text + data


def safetensors_seeds():
    a = np.arange(6, dtype=np.float32).tobytes()
    b = np.arange(4, dtype=np.int64).tobytes()
    valid = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
             "b": {"dtype": "I64", "shape": [4], "data_offsets": [24, 56]}}
    write("safetensors", "valid_two", safetensors_file(valid, a + b, {"format": "pt"}))
    write("safetensors", "valid_bf16_scalar", safetensors_file(
        {"s": {"dtype": "BF16", "shape": [], "data_offsets": [0, 2]}}, b"\x80\x3f"))
    write("safetensors", "empty_header", safetensors_file({}, b""))
    overlap = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
               "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}}
    write("safetensors", "overlapping", safetensors_file(overlap, a))
    write("safetensors", "truncated", safetensors_file(valid, a))
    write("safetensors", "header_len_huge", safetensors_file(valid, a + b, header_len=2**63))
    write("safetensors", "shape_wraps", safetensors_file(
        {"a": {"dtype": "F32", "shape": [2**62, 4], "data_offsets": [0, 0]}}, b""))
    write("safetensors", "reversed", safetensors_file(
        {"a": {"dtype": "U8", "shape": [0], "data_offsets": [8, 0]}}, bytes(8)))


def main():
    if OUT.exists():
        shutil.rmtree(OUT)
    step_request_seeds()
    config_seeds()
    safetensors_seeds()
    for d in sorted(OUT.iterdir()):
        print(d.name, len(list(d.iterdir())), "seeds")


if __name__ == "__main__":
    main()
