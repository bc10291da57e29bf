#pragma once

// The two towers of the backbone as functions of their weights, the step and a cached mask.
// Internal to model/: VideoBackbone is the public face.

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/layers.h"
#include "model/mask_cache.h"

namespace praxis::model {

// One block's tensors; the FFN tensors are either the dense (ffn_*) or the MoE ones.
struct BlockWeights {
  double scale = 1.0;  // 1 / sqrt(layer_index), layer_index counted from 1
  // Norm multipliers as NormWeight gives them (float32; norm1 and norm2 with `scale` folded in).
  torch::Tensor norm1, norm2, q_norm, k_norm;
  torch::Tensor out_w, out_b;
  // The q, k, v and gate projections stacked by output row ([H·hd | kvH·hd | kvH·hd | H]), with
  // the gate's bias (zeros for q, k, v).
  torch::Tensor qkvg_w, qkvg_b;
  torch::Tensor gate_b;  // the gate's bias alone, float32 [H]: the CPU adds it where it gates
  bool moe = false;
  torch::Tensor ffn_a, ffn_b, ffn_down;
  MoeWeights moe_w;
  torch::Tensor mod_w, mod_b;  // decoder only
};

// What both towers have: registers, time embedding, video input projection, the stack.
struct TowerWeights {
  torch::Tensor registers, freqs, phases, t_proj_w, t_proj_b, video_in_w, video_in_b;
  std::vector<BlockWeights> blocks;
};

struct EncoderWeights {
  TowerWeights tower;
  torch::Tensor text_fc1_w, text_fc1_b, text_fc2_w, text_fc2_b, text_norm;
  torch::Tensor enc_out_w, enc_out_b;
};

struct DecoderWeights {
  TowerWeights tower;
  torch::Tensor norm, out_w, out_b;
};

// All weights of a VideoBackbone, on its device.
struct BackboneWeights {
  EncoderWeights enc;
  DecoderWeights dec;
};

// The layout-dependent inputs of one tower run.
struct TowerContext {
  const BackboneConfig& config;
  const TowerMask& mask;
  RopeTables rope;
  AttentionMode mode;
};

// What the encoder returns: the conditioning, the block-0 input and the taps.
struct EncoderResult {
  torch::Tensor cond;        // [B, K·F, h, w, dim]
  torch::Tensor embeddings;  // [B, T, dim]
  std::vector<torch::Tensor> taps;
};

// The encoder's text tokens [B, L, dim] of `text` [B, L, text_dim]: a function of the text alone
// (what model/text_cache.h keeps per instruction).
torch::Tensor TextIn(const BackboneConfig& c, const EncoderWeights& w, const torch::Tensor& text);

// The encoder over [registers | anchor | text | noised | clean], given the text's tokens
// (TextIn); clean may be undefined.
EncoderResult RunEncoder(const EncoderWeights& w, const TowerContext& ctx,
                         const torch::Tensor& text_tokens, const torch::Tensor& anchor,
                         const torch::Tensor& clean, const torch::Tensor& noised,
                         const torch::Tensor& timesteps, int64_t frames_per_chunk);

// The decoder: velocity [B, C, K·F, h, w] of `noised`, modulated per token by `cond`.
torch::Tensor RunDecoder(const DecoderWeights& w, const TowerContext& ctx,
                         const torch::Tensor& noised, const torch::Tensor& cond,
                         const torch::Tensor& timesteps, int64_t frames_per_chunk);

}  // namespace praxis::model
