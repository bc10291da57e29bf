"""The `backbone` section of a checkpoint's config.json (docs/model.md, "config.json").

Every key shown in docs/model.md is known; a key that is not is an error, at any depth. Keys marked
(assumed) there, plus `modulation_dtype` and `attention`, may be omitted and then take the defaults
below; every other key is required.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

DTYPES = ("float32", "bfloat16", "float16")
GELU_APPROXIMATIONS = ("tanh", "none")


class ConfigError(ValueError):
    """A config.json that does not describe a valid backbone."""


@dataclass(frozen=True)
class AttentionConfig:
    flex_block_size: int = 128


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int
    expert_dim: int
    shared_dim: int


@dataclass(frozen=True)
class VideoInConfig:
    c_in: int


@dataclass(frozen=True)
class TextInConfig:
    c_in: int


@dataclass(frozen=True)
class VideoOutConfig:
    c_out: int


@dataclass(frozen=True)
class EncoderConfig:
    depth: int
    ffn_dim: int
    moe_blocks: tuple[int, ...]
    tap_blocks: tuple[int, ...]
    video_in: VideoInConfig
    text_in: TextInConfig


@dataclass(frozen=True)
class DecoderConfig:
    depth: int
    ffn_dim: int
    moe_blocks: tuple[int, ...]
    unpatch_factor: tuple[int, int, int]
    video_in: VideoInConfig
    video_out: VideoOutConfig


@dataclass(frozen=True)
class BackboneConfig:
    dim: int
    num_heads: int
    num_kv_heads: int
    timestep_dim: int
    num_registers: int
    text_dim: int
    dtype: str
    moe: MoeConfig
    encoder: EncoderConfig
    decoder: DecoderConfig
    rope_theta: float = 10000.0
    qk_norm: bool = True
    norm_eps: float = 1e-6
    gelu_approximate: str = "tanh"
    routed_scale: float = 1.0
    text_position_offset: int = 1
    decoder_frame_block_offset: int = 2
    clean_timestep: float = 0.0
    modulation_dtype: str = "float32"
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def patch(self) -> tuple[int, int]:
        """(ph, pw) of the decoder's unpatch."""
        return (self.decoder.unpatch_factor[1], self.decoder.unpatch_factor[2])

    @property
    def latent_channels(self) -> int:
        """C: channels of the latents as the encoder sees them (patched)."""
        return self.encoder.video_in.c_in

    def to_dict(self) -> dict[str, Any]:
        """The `backbone` section as plain JSON values (tuples become lists)."""

        def plain(v: Any) -> Any:
            if dataclasses.is_dataclass(v):
                return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
            if isinstance(v, tuple):
                return [plain(x) for x in v]
            return v

        return plain(self)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _convert(cls: type, data: Any, where: str) -> Any:
    """Build dataclass `cls` from `data`, rejecting unknown and missing keys."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected an object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            raise ConfigError(f"{where}: unknown key '{key}'")
    kwargs: dict[str, Any] = {}
    hints = {name: f.type for name, f in fields.items()}
    for name, f in fields.items():
        path = f"{where}.{name}"
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{path}: missing required key")
            continue
        kwargs[name] = _value(hints[name], data[name], path)
    return cls(**kwargs)


_NESTED = {
    "AttentionConfig": AttentionConfig,
    "MoeConfig": MoeConfig,
    "VideoInConfig": VideoInConfig,
    "TextInConfig": TextInConfig,
    "VideoOutConfig": VideoOutConfig,
    "EncoderConfig": EncoderConfig,
    "DecoderConfig": DecoderConfig,
}


def _value(hint: str, v: Any, path: str) -> Any:
    if hint in _NESTED:
        return _convert(_NESTED[hint], v, path)
    if hint == "int":
        if not _is_int(v):
            raise ConfigError(f"{path}: expected an integer, got {v!r}")
        return v
    if hint == "float":
        if not (_is_int(v) or isinstance(v, float)):
            raise ConfigError(f"{path}: expected a number, got {v!r}")
        return float(v)
    if hint == "bool":
        if not isinstance(v, bool):
            raise ConfigError(f"{path}: expected true or false, got {v!r}")
        return v
    if hint == "str":
        if not isinstance(v, str):
            raise ConfigError(f"{path}: expected a string, got {v!r}")
        return v
    if hint.startswith("tuple[int"):
        if not isinstance(v, list) or not all(_is_int(x) for x in v):
            raise ConfigError(f"{path}: expected a list of integers, got {v!r}")
        return tuple(v)
    raise AssertionError(f"unhandled field type {hint} at {path}")


def _validate(c: BackboneConfig) -> None:
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(f"backbone: {msg}")

    for name in ("dim", "num_heads", "num_kv_heads", "timestep_dim", "text_dim"):
        need(getattr(c, name) > 0, f"{name} must be positive")
    need(c.num_registers >= 0, "num_registers must be >= 0")
    need(c.dim % c.num_heads == 0, "dim must be divisible by num_heads")
    need(c.head_dim % 2 == 0, "head_dim = dim / num_heads must be even")
    need(c.num_heads % c.num_kv_heads == 0, "num_heads must be divisible by num_kv_heads")
    need(c.dtype in DTYPES, f"dtype must be one of {DTYPES}")
    need(c.modulation_dtype in DTYPES, f"modulation_dtype must be one of {DTYPES}")
    need(c.gelu_approximate in GELU_APPROXIMATIONS, f"gelu_approximate must be one of {GELU_APPROXIMATIONS}")
    need(c.norm_eps > 0 and c.rope_theta > 0, "norm_eps and rope_theta must be positive")
    need(c.attention.flex_block_size > 0, "attention.flex_block_size must be positive")
    m = c.moe
    need(m.num_experts > 0 and 0 < m.top_k <= m.num_experts, "moe: need 0 < top_k <= num_experts")
    need(m.expert_dim > 0 and m.shared_dim > 0, "moe: expert_dim and shared_dim must be positive")
    for tower, t in (("encoder", c.encoder), ("decoder", c.decoder)):
        need(t.depth > 0 and t.ffn_dim > 0, f"{tower}: depth and ffn_dim must be positive")
        need(all(0 <= i < t.depth for i in t.moe_blocks), f"{tower}.moe_blocks out of range")
        need(len(set(t.moe_blocks)) == len(t.moe_blocks), f"{tower}.moe_blocks has duplicates")
        need(t.video_in.c_in > 0, f"{tower}.video_in.c_in must be positive")
    e, d = c.encoder, c.decoder
    need(all(0 <= i < e.depth for i in e.tap_blocks), "encoder.tap_blocks out of range")
    need(e.text_in.c_in == c.text_dim, "encoder.text_in.c_in must equal text_dim")
    need(len(d.unpatch_factor) == 3, "decoder.unpatch_factor must have 3 entries")
    need(d.unpatch_factor[0] == 1, "decoder.unpatch_factor[0] (time) must be 1")
    ph, pw = c.patch
    need(ph > 0 and pw > 0 and e.video_in.c_in % (ph * pw) == 0,
         "encoder.video_in.c_in must be divisible by unpatch_factor[1] * unpatch_factor[2]")
    need(d.video_in.c_in == e.video_in.c_in // (ph * pw),
         "decoder.video_in.c_in must equal encoder.video_in.c_in / (ph * pw)")
    need(d.video_out.c_out == d.video_in.c_in, "decoder.video_out.c_out must equal decoder.video_in.c_in")


def load_config(path_or_dict: str | os.PathLike | Mapping[str, Any]) -> BackboneConfig:
    """Parse config.json (a path to the file or to its checkpoint directory, or the parsed dict).

    Only the top-level `backbone` section is read; other top-level sections are ignored.
    Raises ConfigError on a missing `backbone`, an unknown or missing key, a wrong type, or an
    inconsistent value.
    """
    if isinstance(path_or_dict, Mapping):
        data = path_or_dict
    else:
        path = os.fspath(path_or_dict)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    if not isinstance(data, Mapping) or "backbone" not in data:
        raise ConfigError("config: missing top-level 'backbone' section")
    cfg = _convert(BackboneConfig, data["backbone"], "backbone")
    _validate(cfg)
    return cfg
