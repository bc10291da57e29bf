"""Independent PyTorch reference of the Praxis video backbone (docs/model.md), the numeric oracle.

Clarity over speed: dense boolean masks with scaled_dot_product_attention, a per-expert MoE loop.
Module attribute names are chosen so that `VideoBackbone.checkpoint_state_dict()` has exactly the
checkpoint parameter names of docs/model.md ("backbone.encoder." / "backbone.decoder." + table).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as Fn
from torch import Tensor, nn

from .config import BackboneConfig, load_config
from .masks import chunk_causal_rule, decoder_slots, dense_mask, encoder_slots, window_tags

FRAME_STRIDE = 129600
ROW_STRIDE = 360
PREFIX = "backbone."
FLOAT32_BUFFERS = ("t_embedding.freqs", "t_embedding.phases", "expert_bias")


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


# ----------------------------------------------------------------------------------------------
# Layout helpers


def video_tokens(x: Tensor) -> Tensor:
    """[B, C, F, h, w] -> [B, F*h*w, C] (frame-major)."""
    b, c = x.shape[:2]
    return x.permute(0, 2, 3, 4, 1).reshape(b, -1, c)


def unpatch(x: Tensor, patch: tuple[int, int]) -> Tensor:
    """[B, C*ph*pw, F, h, w] -> [B, C, F, h*ph, w*pw]; fine pixel (row*ph + i, col*pw + j)."""
    ph, pw = patch
    b, cp, f, h, w = x.shape
    c = cp // (ph * pw)
    return x.view(b, c, ph, pw, f, h, w).permute(0, 1, 4, 5, 2, 6, 3).reshape(b, c, f, h * ph, w * pw)


def patchify(x: Tensor, patch: tuple[int, int]) -> Tensor:
    """Exact inverse of `unpatch`: [B, C, F, H, W] -> [B, C*ph*pw, F, H/ph, W/pw]."""
    ph, pw = patch
    b, c, f, hh, ww = x.shape
    h, w = hh // ph, ww // pw
    return x.view(b, c, f, h, ph, w, pw).permute(0, 1, 4, 6, 2, 3, 5).reshape(b, c * ph * pw, f, h, w)


def video_positions(frames: int, height: int, width: int, start: int) -> Tensor:
    """start + f*FRAME_STRIDE + 1 + r*ROW_STRIDE + c, frame-major, int64 [frames*height*width]."""
    f = torch.arange(frames, dtype=torch.int64)[:, None, None]
    r = torch.arange(height, dtype=torch.int64)[None, :, None]
    c = torch.arange(width, dtype=torch.int64)[None, None, :]
    return (start + f * FRAME_STRIDE + 1 + r * ROW_STRIDE + c).reshape(-1)


def encoder_positions(
    num_registers: int,
    anchor_hw: tuple[int, int],
    num_text: int,
    noised_thw: tuple[int, int, int],
    num_clean_frames: int,
    shifts: tuple[int, int, int] = (0, 0, 0),
    text_position_offset: int = 1,
) -> Tensor:
    """Positions of [registers | anchor | text | noised | clean], int64 [tokens]."""
    s_anchor, s_text, s_video = shifts
    frames, h, w = noised_thw
    reg = torch.zeros(num_registers, dtype=torch.int64)
    anchor = video_positions(1, anchor_hw[0], anchor_hw[1], 0) + s_anchor
    text = FRAME_STRIDE + text_position_offset + torch.arange(num_text, dtype=torch.int64) + s_text
    noised = video_positions(frames, h, w, 2 * FRAME_STRIDE) + s_video
    clean = noised[: num_clean_frames * h * w]
    return torch.cat([reg, anchor, text, noised, clean])


def decoder_positions(
    num_registers: int, noised_thw: tuple[int, int, int], shift: int = 0, frame_block_offset: int = 2
) -> Tensor:
    """Positions of the decoder's [registers | noised] on the fine grid, int64 [tokens]."""
    frames, hh, ww = noised_thw
    reg = torch.zeros(num_registers, dtype=torch.int64)
    return torch.cat([reg, video_positions(frames, hh, ww, frame_block_offset * FRAME_STRIDE) + shift])


def rope_tables(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """float32 cos, sin [T, head_dim] (rotate-half layout); angles in float64 from int64 positions."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    inv_freq = torch.pow(torch.tensor(theta, dtype=torch.float64), -2.0 * i / head_dim)
    angle = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = torch.cos(angle), torch.sin(angle)
    return torch.cat([cos, cos], -1).to(torch.float32), torch.cat([sin, sin], -1).to(torch.float32)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, T, heads, hd]; x*cos + rotate_half(x)*sin in float32, cast back to x's dtype."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (xf * cos[None, :, None, :] + rotated * sin[None, :, None, :]).to(x.dtype)


def modulate(x: Tensor, shift: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """x*scale + shift computed in `dtype` (float32 by default), returned in x's dtype."""
    return (x.to(dtype) * scale.to(dtype) + shift.to(dtype)).to(x.dtype)


def linear(layer: nn.Linear, x: Tensor) -> Tensor:
    """nn.Linear in the parameter dtype (input cast to it)."""
    return layer(x.to(layer.weight.dtype))


# ----------------------------------------------------------------------------------------------
# Layers


class ZeroCenteredRMSNorm(nn.Module):
    """y = x * rsqrt(mean(x^2) + eps) * (1 + weight), in float32, returned in x's dtype."""

    def __init__(self, n: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(n))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight.float())
        return y.to(x.dtype)


class FourierTimestep(nn.Module):
    """0.5 * cos(2 pi (t * freqs + phases)) with float32 buffers; [...] -> [..., dim] float32."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("freqs", torch.zeros(dim, dtype=torch.float32))
        self.register_buffer("phases", torch.zeros(dim, dtype=torch.float32))

    def forward(self, t: Tensor) -> Tensor:
        t = t.to(torch.float32)[..., None]
        return 0.5 * torch.cos(2.0 * math.pi * (t * self.freqs + self.phases))


class _Projection(nn.Module):
    """Holds a `proj` submodule (the checkpoint names are `<key>.proj...`)."""

    def __init__(self, proj: nn.Module):
        super().__init__()
        self.proj = proj

    def forward(self, x: Tensor) -> Tensor:
        first = self.proj[0] if isinstance(self.proj, nn.Sequential) else self.proj
        return self.proj(x.to(first.weight.dtype))


class TextInputProjection(_Projection):
    """fc1 (text_dim -> 4 dim), GELU, fc2 (4 dim -> dim), ZeroCenteredRMSNorm(dim) as proj.{0,1,2,3}."""

    def __init__(self, c_in: int, dim: int, approximate: str, eps: float):
        super().__init__(nn.Sequential(
            nn.Linear(c_in, 4 * dim), nn.GELU(approximate=approximate), nn.Linear(4 * dim, dim),
            ZeroCenteredRMSNorm(dim, eps)))


class DecoderOutputProjection(_Projection):
    """ZeroCenteredRMSNorm(dim) then Linear(dim, c_out), as proj.{0,1}."""

    def __init__(self, dim: int, c_out: int, eps: float):
        super().__init__(nn.Sequential(ZeroCenteredRMSNorm(dim, eps), nn.Linear(dim, c_out)))

    def forward(self, x: Tensor) -> Tensor:
        norm, lin = self.proj[0], self.proj[1]
        return linear(lin, norm(x))


class _QKVWeights(nn.Module):
    def __init__(self, dim: int, q_out: int, kv_out: int):
        super().__init__()
        self.q_weight = nn.Parameter(torch.zeros(q_out, dim))
        self.k_weight = nn.Parameter(torch.zeros(kv_out, dim))
        self.v_weight = nn.Parameter(torch.zeros(kv_out, dim))


class GatedAttention(nn.Module):
    """Grouped-query attention with qk norm, rotary, a sigmoid gate per head and an out projection."""

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.h, self.kvh, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.in_proj = _QKVWeights(cfg.dim, self.h * self.hd, self.kvh * self.hd)
        if cfg.qk_norm:
            self.q_norm = ZeroCenteredRMSNorm(self.hd, cfg.norm_eps)
            self.k_norm = ZeroCenteredRMSNorm(self.hd, cfg.norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.gate = nn.Linear(cfg.dim, self.h)
        self.out_proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, u: Tensor, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
        dt = self.in_proj.q_weight.dtype
        u = u.to(dt)
        b, t, _ = u.shape
        q = Fn.linear(u, self.in_proj.q_weight).view(b, t, self.h, self.hd)
        k = Fn.linear(u, self.in_proj.k_weight).view(b, t, self.kvh, self.hd)
        v = Fn.linear(u, self.in_proj.v_weight).view(b, t, self.kvh, self.hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = self.h // self.kvh  # kv head j serves query heads j*group .. j*group + group - 1
        q = q.transpose(1, 2)
        k = k.transpose(1, 2).repeat_interleave(group, dim=1)
        v = v.transpose(1, 2).repeat_interleave(group, dim=1)
        o = Fn.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # scale 1/sqrt(hd)
        o = o.transpose(1, 2)  # [B, T, H, hd]
        g = torch.sigmoid(self.gate(u))  # [B, T, H]
        o = o * g[..., None]
        return self.out_proj(o.reshape(b, t, self.h * self.hd))


class _ABWeights(nn.Module):
    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        self.a_weight = nn.Parameter(torch.zeros(ffn_dim, dim))  # gate
        self.b_weight = nn.Parameter(torch.zeros(ffn_dim, dim))  # up


class _SwiGLUIn(nn.Module):
    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        self.linear = _ABWeights(dim, ffn_dim)

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(self.linear.a_weight.dtype)
        return Fn.silu(Fn.linear(x, self.linear.a_weight)) * Fn.linear(x, self.linear.b_weight)


class SwiGLU(nn.Sequential):
    """Dense FFN down(silu(x Wa^T) * (x Wb^T)), no biases; names ffn.0.linear.{a,b}_weight, ffn.1."""

    def __init__(self, dim: int, ffn_dim: int):
        super().__init__(_SwiGLUIn(dim, ffn_dim), nn.Linear(ffn_dim, dim, bias=False))


class _RoutedExperts(nn.Module):
    def __init__(self, e: int, dim: int, expert_dim: int):
        super().__init__()
        self.gate_up_weight = nn.Parameter(torch.zeros(e, dim, 2 * expert_dim))
        self.down_weight = nn.Parameter(torch.zeros(e, expert_dim, dim))


class _SharedExpert(nn.Module):
    def __init__(self, dim: int, shared_dim: int):
        super().__init__()
        self.gate_up = nn.Parameter(torch.zeros(dim, 2 * shared_dim))
        self.down = nn.Parameter(torch.zeros(shared_dim, dim))


def _swiglu_expert(x: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    gate, up = (x @ gate_up).chunk(2, dim=-1)
    return (Fn.silu(gate) * up) @ down


class MoE(nn.Module):
    """Sigmoid-routed top-k experts plus one shared expert; no capacity limit."""

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        m = cfg.moe
        self.top_k, self.routed_scale = m.top_k, cfg.routed_scale
        self.router = nn.Linear(cfg.dim, m.num_experts, bias=False)
        self.register_buffer("expert_bias", torch.zeros(m.num_experts, dtype=torch.float32))
        self.routed = _RoutedExperts(m.num_experts, cfg.dim, m.expert_dim)
        self.shared = _SharedExpert(cfg.dim, m.shared_dim)
        self.last_margin: float | None = None  # smallest top-k selection margin of the last call

    def route(self, xs: Tensor) -> tuple[Tensor, Tensor]:
        """Expert indices [N, k] and combine weights [N, k] (float32) of tokens xs [N, dim]."""
        logits = xs.float() @ self.router.weight.float().t()
        scores = torch.sigmoid(logits)
        biased = scores + self.expert_bias
        ranked = torch.sort(biased, dim=-1, descending=True).values
        if ranked.shape[-1] > self.top_k and ranked.numel():
            self.last_margin = float((ranked[:, self.top_k - 1] - ranked[:, self.top_k]).min().detach())
        idx = torch.topk(biased, self.top_k, dim=-1).indices
        w = scores.gather(-1, idx)
        return idx, w / w.sum(-1, keepdim=True) * self.routed_scale

    def forward(self, x: Tensor) -> Tensor:
        dt = self.routed.gate_up_weight.dtype
        xs = x.reshape(-1, x.shape[-1]).to(dt)
        idx, w = self.route(xs)
        out = torch.zeros(xs.shape, dtype=torch.float32, device=xs.device)
        for e in range(self.routed.gate_up_weight.shape[0]):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            y = _swiglu_expert(xs[tok], self.routed.gate_up_weight[e], self.routed.down_weight[e])
            out.index_add_(0, tok, w[tok, slot, None] * y.float())
        out = out + _swiglu_expert(xs, self.shared.gate_up, self.shared.down).float()
        return out.to(dt).view(x.shape)


class Block(nn.Module):
    """Pre-norm block: x += attn(norm1(x) s); x += ffn(norm2(x) s), s = 1/sqrt(layer_index)."""

    def __init__(self, cfg: BackboneConfig, layer_index: int, ffn_dim: int, moe: bool, modulation: bool):
        super().__init__()
        self.scale = 1.0 / math.sqrt(layer_index)
        self.norm1 = ZeroCenteredRMSNorm(cfg.dim, cfg.norm_eps)
        self.mha = GatedAttention(cfg)
        self.norm2 = ZeroCenteredRMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = MoE(cfg) if moe else SwiGLU(cfg.dim, ffn_dim)
        if modulation:
            self.modulation = nn.Linear(cfg.dim, 2 * cfg.dim)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
        x = x + self.mha(self.norm1(x) * self.scale, cos, sin, mask)
        return x + self.ffn(self.norm2(x) * self.scale)


def _stack(cfg: BackboneConfig, depth: int, ffn_dim: int, moe_blocks, modulation: bool) -> nn.ModuleList:
    return nn.ModuleList(
        Block(cfg, i + 1, ffn_dim, i in set(moe_blocks), modulation) for i in range(depth))


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
        self.input_projections = nn.ModuleDict({"VideoTensor": _Projection(nn.Linear(c_in, cfg.dim))})

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
        self.output_projections = nn.ModuleDict({"VideoTensor": _Projection(nn.Linear(cfg.dim, cfg.dim))})
        self.blocks = _stack(cfg, e.depth, e.ffn_dim, e.moe_blocks, modulation=False)

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
        self.blocks = _stack(cfg, d.depth, d.ffn_dim, d.moe_blocks, modulation=True)

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
