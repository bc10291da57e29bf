"""Independent PyTorch reference of the Praxis video backbone (docs/model.md), the numeric oracle.

Clarity over speed: dense boolean masks with scaled_dot_product_attention, a per-expert MoE loop.
Module attribute names are chosen so that `VideoBackbone.checkpoint_state_dict()` has exactly the
checkpoint parameter names of docs/model.md ("backbone.encoder." / "backbone.decoder." + table).
Here the towers and the backbone; their layers and the position helpers are in layers.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .config import BackboneConfig, load_config
from .layers import (DecoderOutputProjection, FourierTimestep, MoE, Projection,
                     TextInputProjection, block_stack, decoder_positions, encoder_positions, linear,
                     modulate, patchify, rope_tables, unpatch, video_tokens)
from .masks import chunk_causal_rule, decoder_slots, dense_mask, encoder_slots, window_tags

PREFIX = "backbone."
FLOAT32_BUFFERS = ("t_embedding.freqs", "t_embedding.phases", "expert_bias")


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


# ----------------------------------------------------------------------------------------------
# Towers


@dataclass
class EncoderFeatures:
    taps: list[Tensor]
    embeddings: Tensor
    positions: Tensor  # [B, T] int64
    global_spans: dict[str, tuple[int, int]]
    noised_span: tuple[int, int]
    clean_span: tuple[int, int] | None
    frames_per_chunk: int
    tokens_per_frame: int
    n_chunks: int


@dataclass
class BackboneOutput:
    velocity: Tensor | None  # [B, C, K*F, h, w]
    features: EncoderFeatures
    cond: Tensor  # [B, K*F, h, w, dim]


class _Tower(nn.Module):
    def __init__(self, cfg: BackboneConfig, c_in: int):
        super().__init__()
        self.cfg = cfg
        self.registers = nn.Parameter(torch.zeros(cfg.num_registers, cfg.dim))
        self.t_embedding = FourierTimestep(cfg.timestep_dim)
        self.t_proj = nn.ModuleDict({"VideoTensor": nn.Linear(cfg.timestep_dim, 2 * cfg.dim)})
        self.input_projections = nn.ModuleDict({"VideoTensor": Projection(nn.Linear(c_in, cfg.dim))})

    @property
    def dtype(self) -> torch.dtype:
        return self.registers.dtype

    def time_modulation(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """(shift, 1 + scale_raw), each [..., dim], from flow times t [...]."""
        mod = linear(self.t_proj["VideoTensor"], self.t_embedding(t))
        shift, scale_raw = mod.split(self.cfg.dim, dim=-1)
        mdt = torch_dtype(self.cfg.modulation_dtype)
        return shift.to(mdt), 1.0 + scale_raw.to(mdt)

    def modulate_chunks(self, tokens: Tensor, timesteps: Tensor, chunk_tokens: int) -> Tensor:
        """Modulate chunk k of tokens [B, K*chunk_tokens, dim] with timesteps[:, k]."""
        shift, scale = self.time_modulation(timesteps)  # [B, K, dim]
        shift = shift.repeat_interleave(chunk_tokens, dim=1)
        scale = scale.repeat_interleave(chunk_tokens, dim=1)
        return modulate(tokens, shift, scale, torch_dtype(self.cfg.modulation_dtype))

    def batch_registers(self, b: int) -> Tensor:
        return self.registers[None].expand(b, -1, -1)

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
        return cos.to(self.registers.device), sin.to(self.registers.device)


class EncoderTower(_Tower):
    """[registers | anchor | text | noised | clean] -> cond and EncoderFeatures."""

    def __init__(self, cfg: BackboneConfig):
        e = cfg.encoder
        super().__init__(cfg, e.video_in.c_in)
        self.tap_blocks = tuple(e.tap_blocks)
        self.input_projections["TextEncodingTensor"] = TextInputProjection(
            e.text_in.c_in, cfg.dim, cfg.gelu_approximate, cfg.norm_eps)
        self.output_projections = nn.ModuleDict({"VideoTensor": Projection(nn.Linear(cfg.dim, cfg.dim))})
        self.blocks = block_stack(cfg, e.depth, e.ffn_dim, e.moe_blocks, modulation=False)

    def forward(self, text: Tensor, anchor: Tensor, clean: Tensor | None, noised: Tensor,
                timesteps: Tensor, frames_per_chunk: int,
                rope_shifts: tuple[int, int, int] = (0, 0, 0)) -> tuple[Tensor, EncoderFeatures]:
        cfg, dev = self.cfg, self.registers.device
        b, _, kf, h, w = noised.shape
        f = frames_per_chunk
        k = kf // f
        assert kf == k * f and timesteps.shape == (b, k), "noised frames / timesteps / F mismatch"
        assert (clean is None) == (k == 1), "clean must be present iff K > 1"
        ah, aw = anchor.shape[-2:]
        video_in = self.input_projections["VideoTensor"]
        reg = self.batch_registers(b)
        a = video_in(video_tokens(anchor))
        txt = self.input_projections["TextEncodingTensor"](text)
        n = self.modulate_chunks(video_in(video_tokens(noised)), timesteps, f * h * w)
        parts = [reg, a, txt, n]
        if clean is not None:
            shift, scale = self.time_modulation(torch.full((b, 1), cfg.clean_timestep, device=dev))
            parts.append(modulate(video_in(video_tokens(clean)), shift, scale, torch_dtype(cfg.modulation_dtype)))
        x = torch.cat([p.to(self.dtype) for p in parts], dim=1)
        embeddings = x
        r, la, lt, ln = cfg.num_registers, ah * aw, text.shape[1], kf * h * w
        t_len = x.shape[1]
        positions = encoder_positions(r, (ah, aw), lt, (kf, h, w), (k - 1) * f, tuple(rope_shifts),
                                      cfg.text_position_offset)
        cos, sin = self.rope(positions)
        slots = encoder_slots(r, (ah, aw), lt, k, f, h, w)
        mask = dense_mask(chunk_causal_rule(window_tags(slots, f, dev)), t_len, t_len, dev)
        taps = {}
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, mask)
            if i in self.tap_blocks:
                taps[i] = x
        ns = r + la + lt
        cond = linear(self.output_projections["VideoTensor"].proj, x[:, ns:ns + ln]).reshape(b, kf, h, w, cfg.dim)
        features = EncoderFeatures(
            taps=[taps[i] for i in self.tap_blocks],
            embeddings=embeddings,
            positions=positions.to(dev)[None].expand(b, -1).contiguous(),
            global_spans={"register": (0, r), "anchor": (r, la), "text": (r + la, lt)},
            noised_span=(ns, ln),
            clean_span=(ns + ln, (k - 1) * f * h * w) if k > 1 else None,
            frames_per_chunk=f,
            tokens_per_frame=h * w,
            n_chunks=k,
        )
        return cond, features


class DecoderTower(_Tower):
    """[registers | noised] on the fine grid, modulated per token by cond -> velocity."""

    def __init__(self, cfg: BackboneConfig):
        d = cfg.decoder
        super().__init__(cfg, d.video_in.c_in)
        self.patch = cfg.patch
        self.output_projections = nn.ModuleDict(
            {"VideoTensor": DecoderOutputProjection(cfg.dim, d.video_out.c_out, cfg.norm_eps)})
        self.blocks = block_stack(cfg, d.depth, d.ffn_dim, d.moe_blocks, modulation=True)

    def forward(self, noised: Tensor, cond: Tensor, timesteps: Tensor, frames_per_chunk: int,
                rope_shift: int = 0) -> Tensor:
        cfg, dev = self.cfg, self.registers.device
        ph, pw = self.patch
        b, _, kf, h, w = noised.shape
        f = frames_per_chunk
        k = kf // f
        hh, ww = h * ph, w * pw
        r = cfg.num_registers
        mdt = torch_dtype(cfg.modulation_dtype)
        u = unpatch(noised, self.patch)
        v = self.modulate_chunks(self.input_projections["VideoTensor"](video_tokens(u)), timesteps, f * hh * ww)
        x = torch.cat([self.batch_registers(b), v.to(self.dtype)], dim=1)
        positions = decoder_positions(r, (kf, hh, ww), rope_shift, cfg.decoder_frame_block_offset)
        cos, sin = self.rope(positions)
        t_len = x.shape[1]
        mask = dense_mask(chunk_causal_rule(window_tags(decoder_slots(r, k, f, hh, ww), f, dev)), t_len, t_len, dev)
        for block in self.blocks:
            # Per-token Linear on the coarse grid, then repeated over each ph x pw patch.
            mod = linear(block.modulation, cond)  # [B, KF, h, w, 2 dim]
            mod = mod.repeat_interleave(ph, dim=2).repeat_interleave(pw, dim=3).reshape(b, kf * hh * ww, -1)
            shift, scale_raw = mod.split(cfg.dim, dim=-1)
            xv = modulate(x[:, r:], shift.to(mdt), 1.0 + scale_raw.to(mdt), mdt)
            x = block(torch.cat([x[:, :r], xv], dim=1), cos, sin, mask)
        y = self.output_projections["VideoTensor"](x[:, r:])  # [B, KF*H*W, C']
        y = y.reshape(b, kf, hh, ww, -1).permute(0, 4, 1, 2, 3)
        return patchify(y, self.patch)


# ----------------------------------------------------------------------------------------------
# Backbone and checkpoints


class VideoBackbone(nn.Module):
    """Encoder tower and decoder tower of one denoising step."""

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = EncoderTower(cfg)
        self.decoder = DecoderTower(cfg)
        dt = torch_dtype(cfg.dtype)
        for p in self.parameters():  # buffers (freqs, phases, expert_bias) stay float32
            p.data = p.data.to(dt)

    def forward(self, text: Tensor, anchor: Tensor, clean: Tensor | None, noised: Tensor,
                timesteps: Tensor, frames_per_chunk: int, decode: bool = True,
                rope_shifts: tuple[int, int, int, int] = (0, 0, 0, 0)) -> BackboneOutput:
        shifts = tuple(int(s) for s in rope_shifts)
        cond, features = self.encoder(text, anchor, clean, noised, timesteps, frames_per_chunk, shifts[:3])
        velocity = None
        if decode:
            velocity = self.decoder(noised, cond, timesteps, frames_per_chunk, shifts[3])
        return BackboneOutput(velocity=velocity, features=features, cond=cond)

    def checkpoint_state_dict(self) -> dict[str, Tensor]:
        """Checkpoint names ("backbone." + state_dict name) -> tensors."""
        return {PREFIX + k: v for k, v in self.state_dict().items()}

    def expected_dtype(self, name: str) -> torch.dtype:
        """dtype a checkpoint tensor must have (float32 buffers, else the parameter dtype)."""
        return torch.float32 if name.endswith(FLOAT32_BUFFERS) else torch_dtype(self.cfg.dtype)

    def moe_layers(self) -> list[MoE]:
        return [m for m in self.modules() if isinstance(m, MoE)]

    @classmethod
    def from_checkpoint(cls, directory: str | os.PathLike) -> "VideoBackbone":
        """Load config.json and model.safetensors (or shards + model.safetensors.index.json), strictly."""
        from safetensors.torch import load_file

        directory = os.fspath(directory)
        model = cls(load_config(os.path.join(directory, "config.json")))
        index = os.path.join(directory, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index, encoding="utf-8") as fh:
                files = sorted(set(json.load(fh)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        tensors: dict[str, Tensor] = {}
        for name in files:
            tensors.update(load_file(os.path.join(directory, name)))
        model.load_checkpoint_tensors(tensors)
        return model

    def load_checkpoint_tensors(self, tensors: dict[str, Tensor]) -> None:
        """Strict load: every backbone name present with its shape and dtype; keys outside ignored."""
        expected = self.checkpoint_state_dict()
        ours = {k: v for k, v in tensors.items() if k.startswith(PREFIX)}
        for name in sorted(ours):
            if name not in expected:
                raise ValueError(f"checkpoint: unknown tensor '{name}'")
        for name, ref in expected.items():
            if name not in ours:
                raise ValueError(f"checkpoint: missing tensor '{name}'")
            got = ours[name]
            if tuple(got.shape) != tuple(ref.shape):
                raise ValueError(f"checkpoint: '{name}' has shape {list(got.shape)}, expected {list(ref.shape)}")
            if got.dtype != self.expected_dtype(name):
                raise ValueError(f"checkpoint: '{name}' has dtype {got.dtype}, expected {self.expected_dtype(name)}")
        self.load_state_dict({k[len(PREFIX):]: v for k, v in ours.items()}, strict=True)
