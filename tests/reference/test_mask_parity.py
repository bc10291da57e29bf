"""Parity of the C++ `praxis-masks` tool with flex `create_block_mask` on the reference rules."""

import json
import os
import random
import subprocess
import threading
import time

import pytest
import torch

from praxis_ref.masks import (
    KIND_CLEAN,
    KIND_GLOBAL,
    KIND_NOISED,
    MaskCache,
    Slot,
    block_mask,
    chunk_causal_rule,
    decoder_slots,
    dense_mask,
    encoder_slots,
    expert_cross_rule,
    expert_query_tags,
    expert_self_rule,
    window_tags,
)

CPU = torch.device("cpu")
BLOCK_SIZES = (16, 32, 64, 128)
MAX_TOKENS = 3000


def reference(req):
    """(rule, q_len, kv_len) of a request, built from the reference module."""
    f = req.get("f", req.get("chunk_size"))
    if "tower" in req:
        if req["tower"] == "encoder":
            slots = encoder_slots(req["registers"], (req["anchor_h"], req["anchor_w"]), req["text_len"],
                                  req["k"], f, req["h"], req["w"])
        else:
            slots = decoder_slots(req["registers"], req["k"], f, req["h"] * req["ph"], req["w"] * req["pw"])
        tags = window_tags(slots, f, CPU)
        return chunk_causal_rule(tags), tags.length, tags.length
    kv = window_tags(tuple(Slot(*s) for s in req["slots"]), f, CPU)
    if req["rule"] == "chunk_causal":
        return chunk_causal_rule(kv), kv.length, kv.length
    q = expert_query_tags(req["q_chunks"], req["q_tokens_per_chunk"], f, CPU)
    if req["rule"] == "expert_self":
        return expert_self_rule(q), q.length, q.length
    return expert_cross_rule(q, kv, req["window"]), q.length, kv.length


def run_tool(requests):
    """Send `requests` to the C++ tool as JSON lines; return its parsed responses in order."""
    binary = os.environ.get("PRAXIS_MASKS_BIN")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail(f"PRAXIS_MASKS_BIN must name the praxis-masks executable (got {binary!r})")
    stdin = "".join(json.dumps(r) + "\n" for r in requests)
    proc = subprocess.run([binary, "--stdin_jsonl"], input=stdin, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(requests), proc.stderr
    return [json.loads(line) for line in lines]


def assert_tiles_match(req, resp):
    """Compare one tool response with flex's BlockMask of the reference rule, tile by tile."""
    assert "error" not in resp, (req, resp)
    rule, q_len, kv_len = reference(req)
    bs = req["block_size"]
    assert (resp["q_len"], resp["kv_len"], resp["block_size"]) == (q_len, kv_len, bs), req
    ref = block_mask(rule, q_len, kv_len, CPU, bs)
    nq, nkv = -(-q_len // bs), -(-kv_len // bs)
    for name in ("kv", "full_kv"):
        counts = getattr(ref, f"{name}_num_blocks")[0, 0].tolist()
        indices = getattr(ref, f"{name}_indices")[0, 0].tolist()
        got_counts, got_indices = resp[f"{name}_num_blocks"], resp[f"{name}_indices"]
        assert len(got_counts) == nq and len(got_indices) == nq, (req, name)
        for i in range(nq):
            n = counts[i]
            assert got_counts[i] == n, (req, name, i, got_counts[i], n)
            assert len(got_indices[i]) == nkv, (req, name, i)
            assert got_indices[i][:n] == indices[i][:n], (req, name, i, got_indices[i][:n], indices[i][:n])


def random_grid(rng):
    """A latent grid (h, w) from 1x1 to 12x16, 1x1 more often than uniform."""
    return (1, 1) if rng.random() < 0.1 else (rng.randint(1, 12), rng.randint(1, 16))


ALIGNED_DECODERS = [
    {"tower": "decoder", "registers": 0, "anchor_h": 1, "anchor_w": 1, "text_len": 1, "k": k, "f": f,
     "h": h, "w": w, "ph": ph, "pw": pw, "block_size": bs, "dense": False}
    for (k, f, h, w, ph, pw), bs in zip(((2, 2, 8, 16, 1, 1), (1, 1, 4, 8, 2, 2), (4, 2, 4, 4, 1, 1), (3, 1, 1, 16, 1, 1)),
                                        (128, 64, 32, 16))
]


def random_encoder(rng):
    """A random encoder layout request of at most MAX_TOKENS tokens."""
    while True:
        k, f, h, w = rng.randint(1, 4), rng.randint(1, 3), *random_grid(rng)
        r, text, bs = rng.randint(0, 5), rng.randint(1, 40), rng.choice(BLOCK_SIZES)
        rest = r + h * w + (2 * k - 1) * f * h * w
        if rng.random() < 0.25 and 1 <= -rest % bs <= 40:
            text = -rest % bs
        if rest + text <= MAX_TOKENS:
            return {"tower": "encoder", "registers": r, "anchor_h": h, "anchor_w": w, "text_len": text,
                    "k": k, "f": f, "h": h, "w": w, "ph": 1, "pw": 1, "block_size": bs, "dense": False}


def random_decoder(rng):
    """A random decoder layout request of at most MAX_TOKENS tokens on the fine grid."""
    while True:
        k, f, h, w = rng.randint(1, 4), rng.randint(1, 3), *random_grid(rng)
        ph, pw, r = rng.choice((1, 1, 2)), rng.choice((1, 1, 2)), rng.randint(0, 5)
        if r + k * f * h * ph * w * pw <= MAX_TOKENS:
            return {"tower": "decoder", "registers": r, "anchor_h": h, "anchor_w": w, "text_len": 1,
                    "k": k, "f": f, "h": h, "w": w, "ph": ph, "pw": pw,
                    "block_size": rng.choice(BLOCK_SIZES), "dense": False}


def random_slots(rng, k, f):
    """Encoder-like slots [global | noised K*F | clean (K-1)*F] with random sizes."""
    hw = rng.randint(1, 40)
    slots = [[KIND_GLOBAL, 1, rng.randint(0, 60)], [KIND_NOISED, k * f, hw]]
    return slots + ([[KIND_CLEAN, (k - 1) * f, hw]] if k > 1 else [])


def slot_requests(rng):
    """Requests of the three rules in slots mode, windows 0..6."""
    reqs = []
    for _ in range(20):
        f = rng.randint(1, 3)
        kinds = [rng.choice((KIND_GLOBAL, KIND_NOISED, KIND_CLEAN)) for _ in range(rng.randint(1, 6))]
        slots = [[kd, 1 if kd == KIND_GLOBAL else rng.randint(1, 8), rng.randint(0 if kd == KIND_GLOBAL else 1, 50)]
                 for kd in kinds]
        reqs.append({"slots": slots, "chunk_size": f, "rule": "chunk_causal", "window": 0, "q_chunks": 1,
                     "q_tokens_per_chunk": 1, "block_size": rng.choice(BLOCK_SIZES), "dense": False})
    for rule in ("expert_self", "expert_cross"):
        for window in range(7):
            for _ in range(3):
                k, f = rng.randint(1, 4), rng.randint(1, 3)
                reqs.append({"slots": random_slots(rng, k, f), "chunk_size": f, "rule": rule, "window": window,
                             "q_chunks": k, "q_tokens_per_chunk": rng.randint(1, 40),
                             "block_size": rng.choice(BLOCK_SIZES), "dense": False})
    return reqs


def tiles_of_dense(dense, bs):
    """Brute-force tile classes of a dense mask: (partial, full) bool [nq, nkv]."""
    q_len, kv_len = dense.shape
    nq, nkv = -(-q_len // bs), -(-kv_len // bs)
    padded = torch.zeros(nq * bs, nkv * bs, dtype=torch.bool)
    padded[:q_len, :kv_len] = dense
    sums = padded.view(nq, bs, nkv, bs).sum(dim=(1, 3))
    return (sums > 0) & (sums < bs * bs), sums == bs * bs


def test_reference_block_mask_matches_brute_force():
    """The oracle's flex BlockMask agrees with tiles classified directly from its dense mask."""
    rng = random.Random(7)
    reqs = [random_encoder(rng) for _ in range(8)] + [random_decoder(rng) for _ in range(8)]
    reqs += slot_requests(rng)[::4]
    for req in reqs:
        rule, q_len, kv_len = reference(req)
        bs = req["block_size"]
        partial, full = tiles_of_dense(dense_mask(rule, q_len, kv_len, CPU), bs)
        ref = block_mask(rule, q_len, kv_len, CPU, bs)
        for name, want in (("kv", partial), ("full_kv", full)):
            counts = getattr(ref, f"{name}_num_blocks")[0, 0]
            indices = getattr(ref, f"{name}_indices")[0, 0]
            assert counts.tolist() == want.sum(dim=1).tolist(), (req, name)
            for i in range(want.shape[0]):
                want_idx = torch.nonzero(want[i]).flatten().tolist()
                assert indices[i, : counts[i]].tolist() == want_idx, (req, name, i)


def test_reference_rules_by_hand():
    """Spot checks of the rules on a tiny layout against the seed's wording."""
    tags = window_tags(encoder_slots(1, (1, 1), 1, 2, 1, 1, 1), 1, CPU)
    # tokens: reg, anchor, text, noised f0 (c0), noised f1 (c1), clean f0 (c0)
    assert tags.kind.tolist() == [0, 0, 0, 1, 1, 2]
    assert tags.chunk.tolist() == [-1, -1, -1, 0, 1, 0]
    assert tags.frame.tolist() == [-1, -1, -1, 0, 1, 0]
    want = [[1, 1, 1, 0, 0, 0]] * 3 + [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 1], [1, 1, 1, 0, 0, 1]]
    assert dense_mask(chunk_causal_rule(tags), 6, 6, CPU).int().tolist() == want
    kv = window_tags((Slot(KIND_GLOBAL, 1, 1), Slot(KIND_NOISED, 4, 1), Slot(KIND_CLEAN, 2, 1)), 2, CPU)
    q = expert_query_tags(2, 1, 2, CPU)
    assert q.frame.tolist() == [0, 2]
    cross = dense_mask(expert_cross_rule(q, kv, 1), 2, 7, CPU).int().tolist()
    assert cross == [[1, 1, 1, 0, 0, 0, 0], [1, 0, 0, 1, 1, 0, 1]]
    assert dense_mask(expert_self_rule(q), 2, 2, CPU).int().tolist() == [[1, 0], [0, 1]]


def test_reference_mask_cache():
    """MaskCache builds a key once under contention and evicts the least recently used."""
    cache, calls = MaskCache(max_entries=2), []

    def build():
        calls.append(1)
        time.sleep(0.05)
        return torch.ones(1)

    threads = [threading.Thread(target=cache.get, args=(("a",), build)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    cache.get(("b",), build)
    cache.get(("a",), build)
    cache.get(("c",), build)
    assert list(cache._entries) == [("a",), ("c",)] and len(calls) == 3


def test_cpp_encoder_layouts():
    """Encoder layouts: C++ BlockMask equals flex's, tile for tile."""
    rng = random.Random(1)
    reqs = [random_encoder(rng) for _ in range(64)]
    for req, resp in zip(reqs, run_tool(reqs)):
        assert_tiles_match(req, resp)


def test_cpp_decoder_layouts():
    """Decoder layouts: C++ BlockMask equals flex's, tile for tile."""
    rng = random.Random(2)
    reqs = [random_decoder(rng) for _ in range(64)] + ALIGNED_DECODERS
    for req, resp in zip(reqs, run_tool(reqs)):
        assert_tiles_match(req, resp)


def test_cpp_slot_rules():
    """The three rules in slots mode: C++ BlockMask equals flex's, tile for tile."""
    reqs = slot_requests(random.Random(3))
    for req, resp in zip(reqs, run_tool(reqs)):
        assert_tiles_match(req, resp)


def test_cpp_dense_masks():
    """Dense masks of small layouts equal the reference dense_mask."""
    rng = random.Random(4)
    reqs = [random_encoder(rng) for _ in range(20)] + [random_decoder(rng) for _ in range(20)]
    reqs = [r for r in reqs if reference(r)[1] <= 400][:4] + slot_requests(rng)[::8]
    for req in reqs:
        req["dense"] = True
    for req, resp in zip(reqs, run_tool(reqs)):
        assert_tiles_match(req, resp)
        rule, q_len, kv_len = reference(req)
        want = ["".join("1" if v else "0" for v in row) for row in dense_mask(rule, q_len, kv_len, CPU).tolist()]
        assert resp["dense"] == want, req


def test_cpp_invalid_requests():
    """Invalid requests get an error line and do not stop the stream."""
    good = {"tower": "decoder", "registers": 1, "anchor_h": 1, "anchor_w": 1, "text_len": 1, "k": 1, "f": 1,
            "h": 2, "w": 2, "ph": 1, "pw": 1, "block_size": 16, "dense": False}
    reqs = [dict(good, tower="middle"), dict(good, k=0), dict(good, f=0), dict(good, block_size=0),
            {"slots": [[0, 1, 4]], "chunk_size": 1, "rule": "bogus", "window": 0, "q_chunks": 1,
             "q_tokens_per_chunk": 1, "block_size": 16, "dense": False}, good]
    resps = run_tool(reqs)
    assert all("error" in r for r in resps[:-1]), resps
    assert_tiles_match(good, resps[-1])
