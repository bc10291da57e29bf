#pragma once

// Attention under a chunk-causal mask, block-sparse (driven by the cached BlockMask) or dense.

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "model/masks.h"

namespace praxis::model {

// How the towers run attention: tile-sparse from the BlockMask, or SDPA with the dense mask (the
// reference path and fallback).
enum class AttentionMode : int8_t { kSparse = 0, kDense = 1 };

// The work of one layout's attention, derived once from its BlockMask and cached with it. Query
// tiles with the same key-tile pattern form one group and run as one fused call; empty tiles are
// never touched; full tiles run unmasked; only partial tiles carry a mask. Immutable; its tensors
// live on the model's device.
struct AttentionPlan {
  struct Group {
    torch::Tensor q_index;           // int64 [rows]: the group's query tokens
    torch::Tensor full_kv_index;     // int64 [full cols]: keys of its full tiles (may be empty)
    torch::Tensor partial_kv_index;  // int64 [partial cols]: keys of its partial tiles
    torch::Tensor partial_mask;      // bool [rows, partial cols]: allowed pairs in partial tiles
    torch::Tensor partial_bias;      // the same as an additive 0 / -inf mask in the model dtype
    torch::Tensor partial_row_any;   // bool [rows]: the row has an allowed pair in partial tiles
  };
  std::vector<Group> groups;
  int64_t length = 0;

  // Bytes of all index and mask tensors.
  int64_t nbytes() const;
};

// Groups the query tiles of `mask` by their (full, partial) key-tile pattern; `rule` gives the
// pairs inside partial tiles (evaluated on those tiles only); `dtype` is the attention dtype.
AttentionPlan BuildAttentionPlan(const BlockMask& mask, const MaskRule& rule, torch::Device device,
                                 torch::ScalarType dtype);

// softmax(q·kᵀ·scale)·v for q, k, v [B, H, T, hd] under `plan`; returns [B, H, T, hd] in q's dtype.
torch::Tensor SparseAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const AttentionPlan& plan, double scale);

// The same with at::scaled_dot_product_attention and a dense bool mask [T, T].
torch::Tensor DenseAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& dense_mask, double scale);

}  // namespace praxis::model
