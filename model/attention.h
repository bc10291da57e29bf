#pragma once

// Attention under a chunk-causal mask, block-sparse (driven by the cached BlockMask) or dense.

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "model/cpu_kernels.h"
#include "model/masks.h"

namespace praxis::model {

// How the towers run attention: tile-sparse from the BlockMask, or SDPA with the dense mask (the
// reference path and fallback).
enum class AttentionMode : int8_t { kSparse = 0, kDense = 1 };

// A run of consecutive token indices [start, start + length): gathered as a view, never copied.
struct TokenRun {
  int64_t start = 0;
  int64_t length = 0;
};

// The work of one layout's attention, derived once from its BlockMask and cached with it. Query
// tiles with the same key-tile pattern form one group and run as one fused call; empty tiles are
// never touched; full tiles run unmasked; only partial tiles carry a mask. On the CPU, where every
// pair of a short layout costs less than the groups' calls, the plan also holds the dense additive
// bias and attention runs as one fused call. Immutable; its tensors live on the model's device.
// Built on the host (it reads the mask there); running it reads no device data on the host, so a
// CUDA forward under a plan can be captured in a CUDA graph.
struct AttentionPlan {
  struct Group {
    torch::Tensor q_index;           // int64 [rows]: the group's query tokens
    torch::Tensor full_kv_index;     // int64 [full cols]: keys of its full tiles (may be empty)
    torch::Tensor partial_kv_index;  // int64 [partial cols]: keys of its partial tiles
    // The same indices as runs where they are consecutive (length 0 where they are not, or empty).
    TokenRun q_run, full_kv_run, partial_kv_run;
    torch::Tensor partial_mask;  // bool [rows, partial cols]: allowed pairs in partial tiles
    // The same as an additive 0 / -inf mask in the model dtype; on CUDA a view of rows padded
    // to 16 elements (the memory-efficient kernel's bias alignment).
    torch::Tensor partial_bias;
    torch::Tensor partial_row_any;  // bool [rows]: the row has an allowed pair in partial tiles
  };
  std::vector<Group> groups;
  int64_t length = 0;
  // [T, T] additive 0 / -inf bias in the attention dtype; defined only for short layouts (below),
  // and never on CUDA (there the groups run; UseDense's costs are CPU measurements).
  torch::Tensor dense_bias;
  int64_t group_pairs = 0;  // query-key pairs the groups compute (full and partial tiles)
  // On the CPU at head dims up to TileAttentionMaxHeadDim: the query tiles and key segments for
  // cpu::TileAttention, which then runs the whole attention (the plan has no groups, no bias).
  cpu::AttentionTiles tiles;

  // Whether a batch of `rows` runs as one dense call: the groups' pairs plus a fixed cost per
  // group call (gathers, two kernels, a merge) against every pair of the layout.
  bool UseDense(int64_t rows) const;
  // Bytes of all index and mask tensors, padding included.
  int64_t nbytes() const;
};

// Groups the query tiles of `mask` by their (full, partial) key-tile pattern; `rule` gives the
// pairs inside partial tiles (evaluated on those tiles only); `dtype` is the attention dtype and
// `head_dim` its heads' width. On the CPU at head dims up to TileAttentionMaxHeadDim(dtype) the
// plan holds TileAttention's tiles instead, cut from the exact rectangles of the pairs `rule`
// allows between the tokens tagged `q_tags` and `kv_tags` (the tags `mask` was built from).
AttentionPlan BuildAttentionPlan(const BlockMask& mask, const MaskRule& rule,
                                 const TokenTags& q_tags, const TokenTags& kv_tags,
                                 torch::Device device, torch::ScalarType dtype, int64_t head_dim);

// k or v [B, kvH, T, hd] repeated to [B, heads, T, hd]: kv head j serves the heads/kvH consecutive
// query heads from j·heads/kvH. The input itself when kvH == heads.
torch::Tensor ExpandKvHeads(const torch::Tensor& kv, int64_t heads);

// The largest head dim at which the CPU runs cpu::TileAttention in `dtype` (64 in float32, 32 in
// fp16, and in bf16 256 where LibTorch's brgemm takes bf16 (cpu::HasBf16Brgemm), else 64; the
// environment variable PRAXIS_TILE_ATTENTION_MAX_HEAD_DIM, read once, overrides all for
// benchmarks: 0 = never).
int64_t TileAttentionMaxHeadDim(torch::ScalarType dtype);

// softmax(q·kᵀ·scale)·v for q [B, H, T, hd] and k, v [B, kvH, T, hd] (kvH divides H; on CUDA
// kvH == H) under `plan`; returns [B, H, T, hd] in q's dtype.
torch::Tensor SparseAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const AttentionPlan& plan, double scale);

// On the CPU, cpu::GateHeads(SparseAttention(q, k, v, plan, scale), gate, gate_bias) for gate
// logits [B, T, H] of q's dtype and their float32 bias [H] (or none): [B, T, H·hd], gated as
// TileAttention stores it where the plan has tiles.
torch::Tensor GatedSparseAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const AttentionPlan& plan, double scale,
                                   const torch::Tensor& gate, const torch::Tensor& gate_bias = {});

// The same with at::scaled_dot_product_attention and a dense bool mask [T, T].
torch::Tensor DenseAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& dense_mask, double scale);

}  // namespace praxis::model
