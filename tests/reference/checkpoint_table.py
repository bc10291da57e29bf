"""The checkpoint parameter names and shapes the reference must have, from docs/model.md: the
table written out for a config, and the name patterns the document lists."""

from __future__ import annotations

import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DOCS = os.path.join(ROOT, "docs", "model.md")


def expected_tensors(cfg) -> dict[str, tuple[tuple[int, ...], bool]]:
    """docs/model.md's table for `cfg`: checkpoint name -> (shape, always float32)."""
    d, td, r, hd = cfg.dim, cfg.timestep_dim, cfg.num_registers, cfg.head_dim
    m = cfg.moe
    out: dict[str, tuple[tuple[int, ...], bool]] = {}

    def tower(prefix, t, c_in):
        p = f"backbone.{prefix}."
        out[p + "registers"] = ((r, d), False)
        out[p + "t_embedding.freqs"] = ((td,), True)
        out[p + "t_embedding.phases"] = ((td,), True)
        out[p + "t_proj.VideoTensor.weight"] = ((2 * d, td), False)
        out[p + "t_proj.VideoTensor.bias"] = ((2 * d,), False)
        out[p + "input_projections.VideoTensor.proj.weight"] = ((d, c_in), False)
        out[p + "input_projections.VideoTensor.proj.bias"] = ((d,), False)
        for i in range(t.depth):
            b = f"{p}blocks.{i}."
            out[b + "norm1.weight"] = ((d,), False)
            out[b + "norm2.weight"] = ((d,), False)
            out[b + "mha.in_proj.q_weight"] = ((cfg.num_heads * hd, d), False)
            out[b + "mha.in_proj.k_weight"] = ((cfg.num_kv_heads * hd, d), False)
            out[b + "mha.in_proj.v_weight"] = ((cfg.num_kv_heads * hd, d), False)
            if cfg.qk_norm:
                out[b + "mha.q_norm.weight"] = ((hd,), False)
                out[b + "mha.k_norm.weight"] = ((hd,), False)
            out[b + "mha.gate.weight"] = ((cfg.num_heads, d), False)
            out[b + "mha.gate.bias"] = ((cfg.num_heads,), False)
            out[b + "mha.out_proj.weight"] = ((d, d), False)
            out[b + "mha.out_proj.bias"] = ((d,), False)
            if i in t.moe_blocks:
                out[b + "ffn.router.weight"] = ((m.num_experts, d), False)
                out[b + "ffn.expert_bias"] = ((m.num_experts,), True)
                out[b + "ffn.routed.gate_up_weight"] = ((m.num_experts, d, 2 * m.expert_dim), False)
                out[b + "ffn.routed.down_weight"] = ((m.num_experts, m.expert_dim, d), False)
                out[b + "ffn.shared.gate_up"] = ((d, 2 * m.shared_dim), False)
                out[b + "ffn.shared.down"] = ((m.shared_dim, d), False)
            else:
                out[b + "ffn.0.linear.a_weight"] = ((t.ffn_dim, d), False)
                out[b + "ffn.0.linear.b_weight"] = ((t.ffn_dim, d), False)
                out[b + "ffn.1.weight"] = ((d, t.ffn_dim), False)
            if prefix == "decoder":
                out[b + "modulation.weight"] = ((2 * d, d), False)
                out[b + "modulation.bias"] = ((2 * d,), False)

    e, dec = cfg.encoder, cfg.decoder
    tower("encoder", e, e.video_in.c_in)
    p = "backbone.encoder.input_projections.TextEncodingTensor.proj."
    out[p + "0.weight"] = ((4 * d, cfg.text_dim), False)
    out[p + "0.bias"] = ((4 * d,), False)
    out[p + "2.weight"] = ((d, 4 * d), False)
    out[p + "2.bias"] = ((d,), False)
    out[p + "3.weight"] = ((d,), False)
    out["backbone.encoder.output_projections.VideoTensor.proj.weight"] = ((d, d), False)
    out["backbone.encoder.output_projections.VideoTensor.proj.bias"] = ((d,), False)
    tower("decoder", dec, dec.video_in.c_in)
    p = "backbone.decoder.output_projections.VideoTensor.proj."
    out[p + "0.weight"] = ((d,), False)
    out[p + "1.weight"] = ((dec.video_out.c_out, d), False)
    out[p + "1.bias"] = ((dec.video_out.c_out,), False)
    return out


def docs_table_patterns() -> set[str]:
    """Name patterns (tower prefix removed, `{i}` for the block index) listed in docs/model.md."""
    text = open(DOCS, encoding="utf-8").read()
    table = text[text.index("## Checkpoint parameter names"):]
    names = set()
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`"):
            continue
        tokens = re.findall(r"`([^`]+)`", cells[1])
        first = tokens[0]
        stem = first.rsplit(".", 1)[0]
        names.add(first)
        for tok in tokens[1:]:
            if tok.startswith("."):
                names.add(stem + tok)
            elif "." in tok:
                names.add(tok)
            else:
                names.add(stem + "." + tok)
    return names
