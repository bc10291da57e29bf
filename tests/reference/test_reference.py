"""Sanity of the PyTorch reference backbone itself (it is the numeric oracle of the C++ model)."""

from __future__ import annotations

import json
import math
import os
import re
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import make_tiny  # noqa: E402
from checkpoint_table import docs_table_patterns, expected_tensors  # noqa: E402
from praxis_ref import backbone as bb  # noqa: E402
from praxis_ref import layers  # noqa: E402
from praxis_ref.config import ConfigError, load_config  # noqa: E402

TINY = os.path.join(ROOT, "configs", "tiny.json")


@pytest.fixture(scope="module")
def model() -> bb.VideoBackbone:
    return make_tiny.random_model(TINY, seed=0).eval()


def make_inputs(cfg, b=1, k=3, f=1, h=2, w=3, L=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    c = cfg.latent_channels
    return dict(
        text=torch.randn(b, L, cfg.text_dim, generator=g),
        anchor=torch.randn(b, c, 1, h, w, generator=g),
        clean=torch.randn(b, c, (k - 1) * f, h, w, generator=g) if k > 1 else None,
        noised=torch.randn(b, c, k * f, h, w, generator=g),
        timesteps=torch.rand(b, k, generator=g),
        frames_per_chunk=f,
    )


def run(model, x, **kw):
    with torch.no_grad():
        return model(x["text"], x["anchor"], x["clean"], x["noised"], x["timesteps"], x["frames_per_chunk"], **kw)


# ---------------------------------------------------------------------------------------------
# Names and shapes


def test_state_dict_matches_docs_table(model):
    got = model.checkpoint_state_dict()
    want = expected_tensors(model.cfg)
    assert set(got) == set(want)
    for name, (shape, f32) in want.items():
        assert tuple(got[name].shape) == shape, name
        assert got[name].dtype == torch.float32, name
        assert model.expected_dtype(name) == (torch.float32 if f32 else bb.torch_dtype(model.cfg.dtype))


def test_docs_table_lists_exactly_our_names(model):
    ours = {re.sub(r"^backbone\.(encoder|decoder)\.", "", n) for n in model.checkpoint_state_dict()}
    ours = {re.sub(r"blocks\.\d+\.", "blocks.{i}.", n) for n in ours}
    assert docs_table_patterns() == ours


def test_bf16_params_keep_float32_buffers():
    raw = json.load(open(TINY))
    raw["backbone"]["dtype"] = "bfloat16"
    m = bb.VideoBackbone(load_config(raw))
    for name, t in m.checkpoint_state_dict().items():
        assert t.dtype == m.expected_dtype(name), name
    assert m.encoder.t_embedding.freqs.dtype == torch.float32


# ---------------------------------------------------------------------------------------------
# Config


def test_all_repo_configs_load():
    for name in ("tiny.json", "bench.json", "praxis-1.json"):
        load_config(os.path.join(ROOT, "configs", name))


@pytest.mark.parametrize("path", [(), ("moe",), ("encoder",), ("encoder", "video_in"), ("attention",)])
def test_config_rejects_unknown_keys(path):
    raw = json.load(open(TINY))
    node = raw["backbone"]
    for p in path:
        node = node[p]
    node["bogus"] = 1
    with pytest.raises(ConfigError, match="bogus"):
        load_config(raw)


def test_config_ignores_other_sections_and_checks_consistency():
    raw = json.load(open(TINY))
    raw["action_expert"] = {"anything": 1}
    assert load_config(raw).dim == 64
    bad = json.loads(json.dumps(raw))
    bad["backbone"]["decoder"]["video_in"]["c_in"] = 8
    with pytest.raises(ConfigError, match="decoder.video_in.c_in"):
        load_config(bad)
    bad = json.loads(json.dumps(raw))
    del bad["backbone"]["dim"]
    with pytest.raises(ConfigError, match="dim"):
        load_config(bad)
    with pytest.raises(ConfigError, match="backbone"):
        load_config({"dim": 64})


# ---------------------------------------------------------------------------------------------
# Checkpoints and goldens


def test_make_tiny_is_byte_identical(tmp_path):
    make_tiny.main(["--out", str(tmp_path / "a")])
    make_tiny.main(["--out", str(tmp_path / "b")])
    a = (tmp_path / "a" / "model.safetensors").read_bytes()
    assert a == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert (tmp_path / "a" / "config.json").read_bytes() == open(TINY, "rb").read()
    assert len(a) < 4 << 20
    m = bb.VideoBackbone.from_checkpoint(tmp_path / "a")
    ref = make_tiny.random_model(TINY, seed=0)
    for k, v in ref.state_dict().items():
        assert torch.equal(m.state_dict()[k], v), k
    make_tiny.main(["--out", str(tmp_path / "c"), "--seed", "1"])
    assert (tmp_path / "c" / "model.safetensors").read_bytes() != a


def test_every_parameter_matters():
    m = make_tiny.random_model(TINY, seed=0)
    x = make_inputs(m.cfg, b=1, k=2, f=1, h=2, w=3)
    out = m(x["text"], x["anchor"], x["clean"], x["noised"], x["timesteps"], 1)
    loss = out.velocity.square().sum() + sum(t.square().sum() for t in out.features.taps) + out.cond.square().sum()
    loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, name


def test_checkpoint_loading_is_strict(tmp_path):
    from safetensors.torch import load_file

    make_tiny.main(["--out", str(tmp_path)])
    tensors = load_file(tmp_path / "model.safetensors")
    m = bb.VideoBackbone(load_config(TINY))
    m.load_checkpoint_tensors({**tensors, "action_expert.w": torch.zeros(1)})  # outside backbone: ignored
    with pytest.raises(ValueError, match="unknown tensor 'backbone.encoder.extra'"):
        m.load_checkpoint_tensors({**tensors, "backbone.encoder.extra": torch.zeros(1)})
    name = "backbone.decoder.blocks.1.ffn.expert_bias"
    with pytest.raises(ValueError, match="missing tensor"):
        m.load_checkpoint_tensors({k: v for k, v in tensors.items() if k != name})
    with pytest.raises(ValueError, match="dtype"):
        m.load_checkpoint_tensors({**tensors, name: tensors[name].to(torch.bfloat16)})
    with pytest.raises(ValueError, match="shape"):
        m.load_checkpoint_tensors({**tensors, name: torch.zeros(5)})


def test_sharded_checkpoint_loads(tmp_path):
    from safetensors.torch import load_file

    make_tiny.main(["--out", str(tmp_path / "one")])
    tensors = load_file(tmp_path / "one" / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    os.makedirs(tmp_path / "sharded")
    weight_map = {}
    for file, part in shards.items():
        make_tiny.save_file({n: tensors[n] for n in part}, str(tmp_path / "sharded" / file))
        weight_map.update({n: file for n in part})
    (tmp_path / "sharded" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "sharded" / "config.json").write_bytes(open(TINY, "rb").read())
    m = bb.VideoBackbone.from_checkpoint(tmp_path / "sharded")
    assert torch.equal(m.state_dict()["decoder.registers"], tensors["backbone.decoder.registers"])


def test_goldens(tmp_path):
    from safetensors import safe_open

    make_tiny.main(["--out", str(tmp_path / "ckpt"), "--goldens", str(tmp_path / "g")])
    files = sorted(os.listdir(tmp_path / "g"))
    assert files == sorted(f"case_{c.name}.{kind}.safetensors" for c in make_tiny.CASES for kind in ("inputs", "outputs"))
    m = bb.VideoBackbone.from_checkpoint(tmp_path / "ckpt")
    for case in make_tiny.CASES:
        with safe_open(str(tmp_path / "g" / f"case_{case.name}.inputs.safetensors"), "pt") as f:
            x = {k: f.get_tensor(k) for k in f.keys()}
        with safe_open(str(tmp_path / "g" / f"case_{case.name}.outputs.safetensors"), "pt") as f:
            y = {k: f.get_tensor(k) for k in f.keys()}
        assert ("clean" in x) == (case.chunks > 1)
        assert ("velocity" in y) == case.decode
        assert {"cond", "tap.0", "tap.1", "embeddings", "positions"} <= set(y)
        with torch.no_grad():
            out = make_tiny.run_case(m, x)
        if case.decode:
            torch.testing.assert_close(out.velocity, y["velocity"], rtol=1e-5, atol=1e-5)
        assert torch.equal(out.features.positions, y["positions"])
    # the token count of the ragged case is not a multiple of the block size
    with safe_open(str(tmp_path / "g" / "case_ragged.outputs.safetensors"), "pt") as f:
        assert f.get_slice("embeddings").get_shape()[1] % m.cfg.attention.flex_block_size != 0


# ---------------------------------------------------------------------------------------------
# Layout and positions


def test_patchify_inverts_unpatch():
    x = torch.randn(2, 3 * 2 * 4, 5, 3, 2)
    u = layers.unpatch(x, (2, 4))
    assert u.shape == (2, 3, 5, 6, 8)
    assert torch.equal(layers.patchify(u, (2, 4)), x)
    # fine pixel (row*ph + i, col*pw + j) of channel c comes from channel c*ph*pw + i*pw + j
    c, f, row, col, i, j = 1, 3, 2, 1, 1, 3
    assert u[0, c, f, row * 2 + i, col * 4 + j] == x[0, c * 8 + i * 4 + j, f, row, col]


def test_positions_hand_example():
    fs = layers.FRAME_STRIDE
    got = layers.encoder_positions(2, (2, 3), 2, (2, 2, 2), 1, (5, 7, 11), text_position_offset=1)
    want = [0, 0,
            6, 7, 8, 366, 367, 368,
            fs + 1 + 7, fs + 2 + 7,
            2 * fs + 12, 2 * fs + 13, 2 * fs + 372, 2 * fs + 373,
            3 * fs + 12, 3 * fs + 13, 3 * fs + 372, 3 * fs + 373,
            2 * fs + 12, 2 * fs + 13, 2 * fs + 372, 2 * fs + 373]
    assert got.dtype == torch.int64 and got.tolist() == want
    assert layers.decoder_positions(1, (2, 1, 2), 13, 2).tolist() == [0, 2 * fs + 14, 2 * fs + 15, 3 * fs + 14, 3 * fs + 15]


def test_forward_positions_and_spans(model):
    x = make_inputs(model.cfg, b=2, k=2, f=2, h=2, w=3, L=4)
    ft = run(model, x, rope_shifts=(1, 2, 3, 4)).features
    r = model.cfg.num_registers
    assert ft.global_spans == {"register": (0, r), "anchor": (r, 6), "text": (r + 6, 4)}
    assert ft.noised_span == (r + 10, 24) and ft.clean_span == (r + 34, 12)
    assert (ft.frames_per_chunk, ft.tokens_per_frame, ft.n_chunks) == (2, 6, 2)
    want = layers.encoder_positions(r, (2, 3), 4, (4, 2, 3), 2, (1, 2, 3))
    assert ft.positions.shape == (2, r + 46) and torch.equal(ft.positions[1], want)


def test_rope_is_relative():
    hd = 16
    q, k = torch.randn(1, 1, 1, hd), torch.randn(1, 1, 1, hd)
    def dot(pq, pk):
        c, s = layers.rope_tables(torch.tensor([pq, pk]), hd, 10000.0)
        return (layers.apply_rope(q, c[:1], s[:1]) * layers.apply_rope(k, c[1:], s[1:])).sum()
    torch.testing.assert_close(dot(1000, 990), dot(10, 0), rtol=1e-5, atol=1e-5)
    c, s = layers.rope_tables(torch.tensor([0]), hd, 10000.0)
    assert torch.equal(layers.apply_rope(q, c, s), q)


# ---------------------------------------------------------------------------------------------
# Layers against their formulas


def test_moe_matches_dense_formula(model):
    moe = model.encoder.blocks[1].ffn
    x = torch.randn(50, model.cfg.dim)
    with torch.no_grad():
        got = moe(x)
        scores = torch.sigmoid(x @ moe.router.weight.t())
        sel = torch.topk(scores + moe.expert_bias, moe.top_k).indices
        w = torch.zeros_like(scores).scatter(1, sel, scores.gather(1, sel))
        w = w / w.sum(1, keepdim=True)
        gu = torch.einsum("td,edf->tef", x, moe.routed.gate_up_weight)
        g, u = gu.chunk(2, -1)
        y = torch.einsum("tef,efd->ted", torch.nn.functional.silu(g) * u, moe.routed.down_weight)
        sg, su = (x @ moe.shared.gate_up).chunk(2, -1)
        want = (w[..., None] * y).sum(1) + (torch.nn.functional.silu(sg) * su) @ moe.shared.down
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_attention_matches_explicit_softmax(model):
    attn, cfg = model.encoder.blocks[0].mha, model.cfg
    t = 10
    u = torch.randn(1, t, cfg.dim)
    mask = torch.rand(t, t) > 0.4
    mask[:, 0] = True
    cos, sin = layers.rope_tables(torch.arange(t) * 1000, cfg.head_dim, cfg.rope_theta)
    with torch.no_grad():
        got = attn(u, cos, sin, mask)
        hd, h, kvh = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        q = attn.q_norm((u @ attn.in_proj.q_weight.t()).view(1, t, h, hd))
        k = attn.k_norm((u @ attn.in_proj.k_weight.t()).view(1, t, kvh, hd))
        v = (u @ attn.in_proj.v_weight.t()).view(1, t, kvh, hd)
        q, k = layers.apply_rope(q, cos, sin), layers.apply_rope(k, cos, sin)
        heads = []
        for i in range(h):
            j = i // (h // kvh)
            s = (q[0, :, i] @ k[0, :, j].t()) / math.sqrt(hd)
            p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
            gate = torch.sigmoid(u[0] @ attn.gate.weight[i] + attn.gate.bias[i])
            heads.append((p @ v[0, :, j]) * gate[:, None])
        want = attn.out_proj(torch.cat(heads, -1))[None]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Causality and batching


def chunk_of(velocity, j, f):
    return velocity[:, :, j * f:(j + 1) * f]


# "Unchanged" up to rounding: a perturbed chunk reroutes its tokens in the MoE, so the experts'
# matmuls see other row counts, and some CPU BLAS kernels (AMD EPYC here) then round differently
# (we saw 7e-7). A causality leak moves outputs by more than 1e-3.
UNCHANGED = 1e-5


def test_noised_chunk_only_changes_its_own_velocity(model):
    k, f = 3, 2
    x = make_inputs(model.cfg, k=k, f=f)
    base = run(model, x)
    for j in range(k):
        y = dict(x, noised=x["noised"].clone())
        y["noised"][:, :, j * f:(j + 1) * f] += 1.0
        out = run(model, y)
        for i in range(k):
            diff = (chunk_of(out.velocity, i, f) - chunk_of(base.velocity, i, f)).abs().max()
            assert (diff > 1e-3) if i == j else (diff <= UNCHANGED), (j, i, float(diff))
        torch.testing.assert_close(out.features.taps[1][:, base.features.clean_span[0]:],
                                   base.features.taps[1][:, base.features.clean_span[0]:], rtol=0, atol=0)


def test_clean_chunk_only_changes_later_chunks(model):
    k, f = 3, 1
    x = make_inputs(model.cfg, k=k, f=f)
    base = run(model, x)
    for j in range(k - 1):
        y = dict(x, clean=x["clean"].clone())
        y["clean"][:, :, j * f:(j + 1) * f] += 1.0
        out = run(model, y)
        for i in range(k):
            diff = (chunk_of(out.velocity, i, f) - chunk_of(base.velocity, i, f)).abs().max()
            assert (diff > 1e-3) if i > j else (diff <= UNCHANGED), (j, i, float(diff))


def test_batch_invariance(model):
    x = make_inputs(model.cfg, b=3, k=2, f=1, h=3, w=2)
    both = run(model, x, rope_shifts=(3, 1, 4, 1))
    for r in range(3):
        xr = {n: (v[r:r + 1] if isinstance(v, torch.Tensor) else v) for n, v in x.items()}
        one = run(model, xr, rope_shifts=(3, 1, 4, 1))
        torch.testing.assert_close(one.velocity, both.velocity[r:r + 1], rtol=1e-5, atol=1e-5)
        for a, b in zip(one.features.taps, both.features.taps):
            torch.testing.assert_close(a, b[r:r + 1], rtol=1e-5, atol=1e-5)


def test_decode_off_skips_velocity(model):
    x = make_inputs(model.cfg, k=1, f=2)
    off, on = run(model, x, decode=False), run(model, x)
    assert off.velocity is None and on.velocity.shape == x["noised"].shape
    assert off.features.clean_span is None
    torch.testing.assert_close(off.cond, on.cond, rtol=0, atol=0)
