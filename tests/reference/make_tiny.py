#!/usr/bin/env python3
"""Write a reproducible random checkpoint (config.json + model.safetensors) and golden cases.

    make_tiny.py --out DIR [--config configs/tiny.json] [--seed 0] [--goldens DIR]

The checkpoint is byte-identical across runs for the same config and seed. Every parameter is
drawn from a small random normal (norm weights too) so that a wrong use of any tensor shows up.
Golden cases (`--goldens`, meant for the tiny config) are pairs
`case_NAME.inputs.safetensors` / `case_NAME.outputs.safetensors` computed by the reference.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from praxis_ref.backbone import VideoBackbone  # noqa: E402
from praxis_ref.config import load_config  # noqa: E402

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "tiny.json")
# Smallest gap between the k-th and (k+1)-th biased router score any golden token may have, so that
# an implementation agreeing to ~1e-6 cannot select different experts than the reference.
MIN_ROUTING_MARGIN = 1e-4


_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}


def save_file(tensors: dict[str, torch.Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file deterministically: tensors in name order, metadata keys sorted.

    (The safetensors library writes `__metadata__` in hash order, so its bytes vary run to run.)
    """
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {k: metadata[k] for k in sorted(metadata)}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for data in blobs:
            f.write(data)


def _fan_in_normal(shape: tuple[int, ...], fan_in: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float32) / math.sqrt(fan_in)


def init_tensor(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Random float32 value of one checkpoint tensor, chosen by its name."""
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("t_embedding.freqs"):
        return torch.randn(shape, generator=g)
    if name.endswith("t_embedding.phases"):
        return torch.rand(shape, generator=g)
    if leaf == "expert_bias":
        return 0.1 * torch.randn(shape, generator=g)
    if leaf == "registers":
        return torch.randn(shape, generator=g)
    if leaf == "bias":
        return 0.1 * torch.randn(shape, generator=g)
    if len(shape) == 1:  # every 1-D weight is a ZeroCenteredRMSNorm weight
        return 0.1 * torch.randn(shape, generator=g)
    if name.endswith(("routed.gate_up_weight", "routed.down_weight")):
        return _fan_in_normal(shape, shape[1], g)  # [E, in, out]
    if name.endswith(("shared.gate_up", "shared.down")):
        return _fan_in_normal(shape, shape[0], g)  # [in, out]
    if name.endswith("modulation.weight"):
        return 0.5 * _fan_in_normal(shape, shape[1], g)  # keep 1 + scale_raw mostly positive
    return _fan_in_normal(shape, shape[1], g)  # [out, in]


def random_model(config_path: str, seed: int) -> VideoBackbone:
    model = VideoBackbone(load_config(config_path))
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, ref in model.checkpoint_state_dict().items():
        tensors[name] = init_tensor(name, tuple(ref.shape), g).to(model.expected_dtype(name))
    model.load_checkpoint_tensors(tensors)
    return model


def write_checkpoint(out: str, config_path: str, seed: int) -> None:
    os.makedirs(out, exist_ok=True)
    model = random_model(config_path, seed)
    with open(config_path, "rb") as f:
        config_bytes = f.read()
    with open(os.path.join(out, "config.json"), "wb") as f:
        f.write(config_bytes)
    tensors = {k: v.contiguous() for k, v in sorted(model.checkpoint_state_dict().items())}
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt", "seed": str(seed)})


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    chunks: int  # K
    frames: int  # F
    h: int
    w: int
    text: int  # L
    decode: bool = True
    rope_shifts: tuple[int, int, int, int] = (0, 0, 0, 0)
    timesteps: tuple[float, ...] | None = None  # per chunk, same for every row; random if None


CASES = (
    Case("k1", batch=1, chunks=1, frames=2, h=4, w=6, text=7),
    Case("k3", batch=1, chunks=3, frames=2, h=4, w=6, text=5, timesteps=(0.0, 0.5, 1.0)),
    Case("no_decode", batch=1, chunks=2, frames=2, h=4, w=6, text=6, decode=False),
    Case("rope_shifts", batch=1, chunks=2, frames=1, h=4, w=6, text=9, rope_shifts=(5, 7, 11, 13)),
    Case("batch2", batch=2, chunks=2, frames=1, h=4, w=6, text=8),
    Case("ragged", batch=1, chunks=2, frames=1, h=3, w=5, text=5),
)


def case_inputs(model: VideoBackbone, case: Case, seed: int) -> dict[str, torch.Tensor]:
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    b, k, f, c = case.batch, case.chunks, case.frames, cfg.latent_channels
    x = {
        "text": torch.randn(b, case.text, cfg.text_dim, generator=g),
        "anchor": torch.randn(b, c, 1, case.h, case.w, generator=g),
        "noised": torch.randn(b, c, k * f, case.h, case.w, generator=g),
    }
    if k > 1:
        x["clean"] = torch.randn(b, c, (k - 1) * f, case.h, case.w, generator=g)
    if case.timesteps is None:
        x["timesteps"] = torch.rand(b, k, generator=g)
    else:
        x["timesteps"] = torch.tensor(case.timesteps, dtype=torch.float32)[None].repeat(b, 1)
    x["rope_shifts"] = torch.tensor(case.rope_shifts, dtype=torch.int64)
    x["frames_per_chunk"] = torch.tensor([f], dtype=torch.int64)
    x["decode"] = torch.tensor([int(case.decode)], dtype=torch.int64)
    return x


def run_case(model: VideoBackbone, x: dict[str, torch.Tensor]):
    return model(
        x["text"], x["anchor"], x.get("clean"), x["noised"], x["timesteps"],
        frames_per_chunk=int(x["frames_per_chunk"][0]), decode=bool(x["decode"][0]),
        rope_shifts=tuple(int(s) for s in x["rope_shifts"]))


def case_outputs(out) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    ft = out.features
    y = {}
    if out.velocity is not None:
        y["velocity"] = out.velocity
    y["cond"] = out.cond
    for i, tap in enumerate(ft.taps):
        y[f"tap.{i}"] = tap
    y["embeddings"] = ft.embeddings
    y["positions"] = ft.positions
    meta = {
        "global_spans": json.dumps({k: list(v) for k, v in ft.global_spans.items()}),
        "noised_span": json.dumps(list(ft.noised_span)),
        "clean_span": json.dumps(list(ft.clean_span) if ft.clean_span else None),
        "frames_per_chunk": str(ft.frames_per_chunk),
        "tokens_per_frame": str(ft.tokens_per_frame),
        "n_chunks": str(ft.n_chunks),
    }
    return {k: v.contiguous() for k, v in y.items()}, meta


def write_goldens(goldens: str, model: VideoBackbone, base_seed: int) -> list[str]:
    os.makedirs(goldens, exist_ok=True)
    names = []
    for n, case in enumerate(CASES):
        for attempt in range(100):  # redraw inputs until no token sits on a routing tie
            x = case_inputs(model, case, base_seed + 1000 * n + attempt)
            for moe in model.moe_layers():
                moe.last_margin = None
            with torch.no_grad():
                out = run_case(model, x)
            margins = [m.last_margin for m in model.moe_layers() if m.last_margin is not None]
            if min(margins, default=1.0) >= MIN_ROUTING_MARGIN:
                break
        else:
            raise RuntimeError(f"case {case.name}: no inputs without a routing near-tie")
        y, meta = case_outputs(out)
        meta = {"case": case.name, "input_seed": str(base_seed + 1000 * n + attempt),
                "min_routing_margin": f"{min(margins, default=1.0):.3e}", **meta}
        save_file(x, os.path.join(goldens, f"case_{case.name}.inputs.safetensors"), metadata={"case": case.name})
        save_file(y, os.path.join(goldens, f"case_{case.name}.outputs.safetensors"), metadata=meta)
        names.append(case.name)
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="checkpoint directory to write (config.json + model.safetensors)")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="config.json to use (default configs/tiny.json)")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    p.add_argument("--goldens", help="directory for case_NAME.{inputs,outputs}.safetensors")
    args = p.parse_args(argv)
    if not args.out and not args.goldens:
        p.error("nothing to do: give --out and/or --goldens")
    torch.manual_seed(args.seed)
    if args.out:
        write_checkpoint(args.out, args.config, args.seed)
    if args.goldens:
        model = VideoBackbone.from_checkpoint(args.out) if args.out else random_model(args.config, args.seed)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one fixed reduction order for the goldens
        try:
            names = write_goldens(args.goldens, model.eval(), base_seed=args.seed + 1)
        finally:
            torch.set_num_threads(threads)
        print("goldens:", " ".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
