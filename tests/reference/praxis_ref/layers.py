"""The layers of the PyTorch reference backbone (praxis_ref/backbone.py): token layout and position
helpers, RoPE, modulation, and the modules a block is built of (norms, projections, gated attention,
SwiGLU, the MoE). Module attribute names are the checkpoint's (docs/model.md)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as Fn
from torch import Tensor, nn

from .config import BackboneConfig

FRAME_STRIDE = 129600
ROW_STRIDE = 360


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


class Projection(nn.Module):
    """Holds a `proj` submodule (the checkpoint names are `<key>.proj...`)."""

    def __init__(self, proj: nn.Module):
        super().__init__()
        self.proj = proj

    def forward(self, x: Tensor) -> Tensor:
        first = self.proj[0] if isinstance(self.proj, nn.Sequential) else self.proj
        return self.proj(x.to(first.weight.dtype))


class TextInputProjection(Projection):
    """fc1 (text_dim -> 4 dim), GELU, fc2 (4 dim -> dim), ZeroCenteredRMSNorm(dim) as proj.{0,1,2,3}."""

    def __init__(self, c_in: int, dim: int, approximate: str, eps: float):
        super().__init__(nn.Sequential(
            nn.Linear(c_in, 4 * dim), nn.GELU(approximate=approximate), nn.Linear(4 * dim, dim),
            ZeroCenteredRMSNorm(dim, eps)))


class DecoderOutputProjection(Projection):
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


def block_stack(cfg: BackboneConfig, depth: int, ffn_dim: int, moe_blocks, modulation: bool) -> nn.ModuleList:
    """A tower's `depth` blocks (layer indices from 1), MoE at `moe_blocks` (0-based)."""
    return nn.ModuleList(
        Block(cfg, i + 1, ffn_dim, i in set(moe_blocks), modulation) for i in range(depth))
