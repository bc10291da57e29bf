#pragma once

// The stateless layers of the backbone (SPEC §5, docs/model.md): each is a function of its inputs
// and weights, so the towers hold plain tensors and the functions can be tested alone.

#include <torch/types.h>

#include <cstdint>

namespace praxis::model {

inline constexpr int64_t kFrameStride = 129600;
inline constexpr int64_t kRowStride = 360;

// y = x·Wᵀ + b in the weight's dtype (x is cast to it); `b` may be undefined. With `residual`
// (y's sizes, the weight's dtype), residual + y: on the CPU's brgemm added as the product's first
// sums, no pass of its own.
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b = {},
                     const torch::Tensor& residual = {});

// Zero-centred RMS norm: x·rsqrt(mean(x²) + eps)·(1 + weight) in float32, returned in x's dtype.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// The float32 multiplier RmsNormWith applies: (1 + weight)·scale, computed once at load (a block
// folds its 1/sqrt(layer) scale in).
torch::Tensor NormWeight(const torch::Tensor& weight, double scale = 1.0);

// x·rsqrt(mean(x²) + eps)·w for w = NormWeight(...), in float32, returned in x's dtype (the fused
// kernel of model/cpu_kernels.h on the CPU).
torch::Tensor RmsNormWith(const torch::Tensor& x, const torch::Tensor& w, double eps);

// x·scale + shift computed in `dtype`, returned in x's dtype; with `out` (x's sizes) written
// there, in out's dtype, and returned: a token sequence's slice, filled without a concatenation.
torch::Tensor Modulate(const torch::Tensor& x, const torch::Tensor& shift,
                       const torch::Tensor& scale, torch::ScalarType dtype,
                       const torch::Tensor& out = {});

// Fourier features of flow times t [...]: 0.5·cos(2π(t·freqs + phases)), float32 [..., d].
torch::Tensor FourierFeatures(const torch::Tensor& t, const torch::Tensor& freqs,
                              const torch::Tensor& phases);

// [B, C, F, h, w] latents to [B, F·h·w, C] tokens in frame-major order.
torch::Tensor VideoTokens(const torch::Tensor& x);

// [B, C·ph·pw, F, h, w] latents to the fine grid's tokens [B, F·(h·ph)·(w·pw), C] in
// frame-major order: channel c·ph·pw + i·pw + j of coarse pixel (row, col) is fine pixel
// (row·ph + i, col·pw + j). VideoTokens of the unpatched latents, in one copy instead of two.
torch::Tensor UnpatchTokens(const torch::Tensor& x, int64_t ph, int64_t pw);

// [B, C, F, h·ph, w·pw] to [B, C·ph·pw, F, h, w]: the inverse of UnpatchTokens' regrouping.
torch::Tensor Patchify(const torch::Tensor& x, int64_t ph, int64_t pw);

// start + f·kFrameStride + 1 + r·kRowStride + c for each token, frame-major, int64.
torch::Tensor VideoPositions(int64_t frames, int64_t h, int64_t w, int64_t start);

// Rotary tables of one layout: float32 [T, head_dim] (rotate-half layout), on the model's device.
struct RopeTables {
  torch::Tensor cos;
  torch::Tensor sin;
};

// Angles are computed in float64 from the int64 positions (they reach ~10^7), then stored float32.
RopeTables MakeRopeTables(const torch::Tensor& positions, int64_t head_dim, double theta,
                          torch::Device device);

// x·cos + rotate_half(x)·sin for x [B, T, heads, hd], in float32, returned in x's dtype.
torch::Tensor ApplyRope(const torch::Tensor& x, const RopeTables& rope);

// Dense SwiGLU: down(silu(x·Waᵀ)·(x·Wbᵀ)), no biases; with `residual` (x's sizes and dtype),
// residual + that, added as Linear adds one.
torch::Tensor SwiGlu(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b,
                     const torch::Tensor& down, const torch::Tensor& residual = {});

// Weights of one MoE feed-forward block.
struct MoeWeights {
  torch::Tensor router;          // [E, dim]
  torch::Tensor expert_bias;     // [E] float32
  torch::Tensor gate_up;         // [E, dim, 2·expert_dim]
  torch::Tensor down;            // [E, expert_dim, dim]
  torch::Tensor shared_gate_up;  // [dim, 2·shared_dim]
  torch::Tensor shared_down;     // [shared_dim, dim]
};

// How Moe runs the routed experts. kLoop: one matmul pair per expert over its slice of the
// expert-sorted tokens; it reads the experts' token counts on the host (a device sync on CUDA).
// kGrouped: two at::_grouped_mm calls with group offsets computed on the device; shapes never
// depend on the routing. kAuto: kGrouped on CUDA where GroupedMoeIsSyncFree, else kLoop (the
// measured CPU path, and CUDA operands that at::_grouped_mm would run through its host fallback).
enum class MoeDispatch : int8_t { kAuto = 0, kLoop = 1, kGrouped = 2 };

// Whether at::_grouped_mm (PyTorch 2.11) runs its fused CUTLASS kernel, with no host read of the
// offsets and so capturable in a CUDA graph, for this MoE block's operands on a CUDA device of
// compute capability major `cuda_major`: bf16 operands and output, sm90 or sm100, fewer than 1024
// experts, 16-byte aligned operands with a unit stride and 16-byte multiple row strides (so dim
// and expert_dim multiples of 8). `x` is the block input (Moe casts it to the weights' dtype).
// Pure: no device access (the CUDA capability is an argument, so the CPU tests can check it).
bool GroupedMoeIsSyncFree(const torch::Tensor& x, const MoeWeights& w, int cuda_major);

// The dispatch kAuto picks for `x` (in any dtype) on its device.
MoeDispatch AutoMoeDispatch(const torch::Tensor& x, const MoeWeights& w);

// Sigmoid-routed top-k experts plus the shared expert, with no capacity limit: a token's output
// never depends on its batch mates. Tokens are sorted by expert so each expert's tokens are one
// contiguous slice; `dispatch` chooses how the experts run over those slices (above). With a
// `residual` (x's shape) returns residual + the MoE's output in residual's dtype: on the CPU added
// as the experts' rows are combined, each element rounded once (else the output is rounded to the
// weights' dtype first, and the sum again).
torch::Tensor Moe(const torch::Tensor& x, const MoeWeights& w, int64_t top_k, double routed_scale,
                  MoeDispatch dispatch = MoeDispatch::kAuto, const torch::Tensor& residual = {});

}  // namespace praxis::model
