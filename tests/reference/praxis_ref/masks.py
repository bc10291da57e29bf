"""Reference attention masks of the chunk-causal window (seed masks-api-0.4.0)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

KIND_GLOBAL, KIND_NOISED, KIND_CLEAN = 0, 1, 2

MaskRule = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Slot:
    """A run of tokens of one kind: `frames` latent frames of `tokens_per_frame` tokens each."""

    kind: int
    frames: int
    tokens_per_frame: int


MaskKey = tuple[int | str | bool | tuple[Slot, ...], ...]


@dataclass
class TokenTags:
    """Per-token tags of one sequence, all int32 tensors of shape [tokens] on one device."""

    kind: Tensor
    chunk: Tensor
    frame: Tensor

    @property
    def length(self) -> int:
        """Number of tokens."""
        return int(self.kind.shape[0])


def window_tags(slots: tuple[Slot, ...], chunk_size: int, device: torch.device) -> TokenTags:
    """Tags of a window sequence laid out as `slots` in order."""
    kinds, chunks, frames = [], [], []
    for slot in slots:
        n = slot.frames * slot.tokens_per_frame
        kinds.append(torch.full((n,), slot.kind, dtype=torch.int32, device=device))
        if slot.kind == KIND_GLOBAL:
            f = torch.full((n,), -1, dtype=torch.int32, device=device)
            chunks.append(f)
            frames.append(f)
        else:
            f = torch.arange(slot.frames, dtype=torch.int32, device=device).repeat_interleave(slot.tokens_per_frame)
            chunks.append(torch.div(f, chunk_size, rounding_mode="floor"))
            frames.append(f)
    empty = torch.empty(0, dtype=torch.int32, device=device)
    cat = lambda parts: torch.cat(parts) if parts else empty
    return TokenTags(cat(kinds), cat(chunks), cat(frames))


def expert_query_tags(n_chunks: int, tokens_per_chunk: int, chunk_size: int, device: torch.device) -> TokenTags:
    """Tags of the action expert's queries: noised, chunk c, frame c * chunk_size."""
    chunk = torch.arange(n_chunks, dtype=torch.int32, device=device).repeat_interleave(tokens_per_chunk)
    kind = torch.full_like(chunk, KIND_NOISED)
    return TokenTags(kind, chunk, chunk * chunk_size)


def chunk_causal_rule(tags: TokenTags) -> MaskRule:
    """The teacher-forcing rule of the trunk towers over one sequence."""
    kind, chunk = tags.kind, tags.chunk

    def rule(q: Tensor, kv: Tensor) -> Tensor:
        qk, kk, qc, kc = kind[q], kind[kv], chunk[q], chunk[kv]
        to_global = kk == KIND_GLOBAL
        clean_q = (qk == KIND_CLEAN) & (kk == KIND_CLEAN) & (kc <= qc)
        noised_q = (qk == KIND_NOISED) & (((kk == KIND_NOISED) & (kc == qc)) | ((kk == KIND_CLEAN) & (kc < qc)))
        return to_global | clean_q | noised_q

    return rule


def expert_self_rule(q_tags: TokenTags) -> MaskRule:
    """Rule of the action expert's self attention: one block per chunk."""
    chunk = q_tags.chunk
    return lambda q, kv: chunk[q] == chunk[kv]


def expert_cross_rule(q_tags: TokenTags, kv_tags: TokenTags, window: int) -> MaskRule:
    """Rule of the action expert's cross attention."""
    q_chunk, q_frame = q_tags.chunk, q_tags.frame
    kind, chunk, frame = kv_tags.kind, kv_tags.chunk, kv_tags.frame

    def rule(q: Tensor, kv: Tensor) -> Tensor:
        kk, qf, kf = kind[kv], q_frame[q], frame[kv]
        clean = (kk == KIND_CLEAN) & (kf < qf) & (qf - kf <= window)
        noised = (kk == KIND_NOISED) & (chunk[kv] == q_chunk[q])
        return (kk == KIND_GLOBAL) | clean | noised

    return rule


def dense_mask(rule: MaskRule, q_len: int, kv_len: int, device: torch.device) -> Tensor:
    """Evaluate `rule` on the full grid: bool [q_len, kv_len], true where attention is allowed."""
    q = torch.arange(q_len, device=device)[:, None]
    kv = torch.arange(kv_len, device=device)[None, :]
    return rule(q, kv).expand(q_len, kv_len).to(torch.bool)


def block_mask(rule: MaskRule, q_len: int, kv_len: int, device: torch.device, block_size: int) -> BlockMask:
    """Build a flex `BlockMask` over [q_len, kv_len] tiles of `block_size` from `rule`."""
    return create_block_mask(
        lambda b, h, q, kv: rule(q, kv), None, None, q_len, kv_len, device=device, BLOCK_SIZE=block_size
    )


def encoder_slots(num_registers: int, anchor_hw: tuple[int, int], num_text: int, K: int, F: int, h: int, w: int) -> tuple[Slot, ...]:
    """Encoder layout [registers | anchor | text | noised | clean]."""
    slots = (
        Slot(KIND_GLOBAL, 1, num_registers),
        Slot(KIND_GLOBAL, 1, anchor_hw[0] * anchor_hw[1]),
        Slot(KIND_GLOBAL, 1, num_text),
        Slot(KIND_NOISED, K * F, h * w),
    )
    return slots + ((Slot(KIND_CLEAN, (K - 1) * F, h * w),) if K > 1 else ())


def decoder_slots(num_registers: int, K: int, F: int, H: int, W: int) -> tuple[Slot, ...]:
    """Decoder layout [registers | noised] on the fine grid."""
    return (Slot(KIND_GLOBAL, 1, num_registers), Slot(KIND_NOISED, K * F, H * W))


class MaskCache:
    """Small thread-safe LRU cache of built masks keyed by the caller's layout key."""

    def __init__(self, max_entries: int = 64):
        self.max_entries = max_entries
        self._entries: OrderedDict[MaskKey, BlockMask | Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[MaskKey, threading.Lock] = {}

    def get(self, key: MaskKey, build: Callable[[], BlockMask | Tensor]) -> BlockMask | Tensor:
        """Return the entry for `key`, building it once if missing."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            key_lock = self._building.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    return self._entries[key]
            try:
                value = build()
                with self._lock:
                    self._entries[key] = value
                    while len(self._entries) > self.max_entries:
                        self._entries.popitem(last=False)
            finally:
                with self._lock:
                    self._building.pop(key, None)
            return value
