#pragma once

// Fused CPU kernels for the memory-bound steps of a block: each reads its input once and writes
// its output once, where the same math as ATen ops takes five to eight passes (and on small
// layouts most of a step's time). Float32 arithmetic whatever the storage dtype, as SPEC §5 asks.
// Stateless and thread-safe; they run on LibTorch's intra-op threads (at::parallel_for).

#include <torch/types.h>

namespace praxis::model::cpu {

// x · rsqrt(mean(x²) + eps) · weight over the last dimension. x: a CPU float tensor (float32,
// bfloat16 or float16) of any shape; weight: float32 [x.size(-1)], the model's (1 + w) already
// multiplied by any block scale. Returns a contiguous tensor of x's shape and dtype.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// Query or key heads into the layout attention reads: x [B, T, H, hd] (any strides, last one 1)
// is RMS-normalised over hd with `weight` (float32 [hd], the (1 + w); skipped when undefined),
// rotated with the rotate-half tables cos, sin (float32 [T, hd]) and written as a contiguous
// [B, H, T, hd] tensor of x's dtype.
torch::Tensor NormRopeHeads(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                            const torch::Tensor& cos, const torch::Tensor& sin);

// silu(a) · b elementwise (the SwiGLU gate), read and written in one pass: a, b CPU tensors of one
// shape and dtype, any strides (the gate and up halves of one projection are served as views).
// Returns a contiguous tensor of that shape and dtype.
torch::Tensor SiluMul(const torch::Tensor& a, const torch::Tensor& b);

// out[rows[i]] += weights[i] · y[i] for every row i of y: one expert's weighted outputs combined
// into the MoE's float32 sum. out: contiguous float32 [N, d]; rows: int64 [n], distinct (threads
// write rows concurrently) and each in [0, N); weights: float32 [n]; y: [n, d], any float dtype.
void AddWeightedRows(torch::Tensor& out, const torch::Tensor& rows, const torch::Tensor& weights,
                     const torch::Tensor& y);

// The gated attention output, in one pass: out[b, t, h·hd + i] = o[b, h, t, i] · sigmoid(gate[b, t,
// h]). o: CPU [B, H, T, hd], any strides with the last 1; gate: [B, T, H] logits, any strides and
// float dtype (sliced from the stacked projection). Returns a contiguous [B, T, H·hd] of o's dtype.
torch::Tensor GateHeads(const torch::Tensor& o, const torch::Tensor& gate);

}  // namespace praxis::model::cpu
