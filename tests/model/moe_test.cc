// The MoE block's two dispatches (model/layers.h): the per-expert loop and the grouped matmuls
// with device-side offsets, against a dense oracle that runs every expert on every token, on the
// CPU in float32 and bf16; and the predicate that picks the grouped path on CUDA.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "model/layers.h"

namespace praxis::model {
namespace {

constexpr int64_t kExperts = 6, kDim = 32, kExpertDim = 16, kSharedDim = 24;
// The expert whose bias keeps it out of every top-k below kExperts: it always gets zero tokens.
constexpr int64_t kIdleExpert = 4;

MoeWeights RandomWeights(torch::ScalarType dt) {
  torch::manual_seed(11);
  MoeWeights w;
  w.router = torch::randn({kExperts, kDim}).to(dt);
  w.expert_bias = 0.1 * torch::randn({kExperts});
  w.expert_bias[kIdleExpert] = -100.0;
  w.gate_up = (torch::randn({kExperts, kDim, 2 * kExpertDim}) / 6).to(dt);
  w.down = (torch::randn({kExperts, kExpertDim, kDim}) / 4).to(dt);
  w.shared_gate_up = (torch::randn({kDim, 2 * kSharedDim}) / 6).to(dt);
  w.shared_down = (torch::randn({kSharedDim, kDim}) / 5).to(dt);
  return w;
}

// SwiGLU of x [N, dim] through fused gate_up [dim, 2·inner] and down [inner, dim], in float32.
torch::Tensor Expert(const torch::Tensor& x, const torch::Tensor& gate_up,
                     const torch::Tensor& down) {
  const auto gu = torch::matmul(x, gate_up.to(torch::kFloat32)).chunk(2, -1);
  return torch::matmul(torch::silu(gu[0]) * gu[1], down.to(torch::kFloat32));
}

// docs/model.md's MoE written densely: every expert on every token, weighted by a [N, E] matrix
// that is zero outside each token's top-k; float32 [N, dim]. Also returns the tokens per expert.
torch::Tensor DenseOracle(const torch::Tensor& x, const MoeWeights& w, int64_t top_k,
                          double routed_scale, std::vector<int64_t>* per_expert) {
  const torch::Tensor xf = x.reshape({-1, kDim}).to(w.gate_up.scalar_type()).to(torch::kFloat32);
  const torch::Tensor scores = torch::sigmoid(torch::matmul(xf, w.router.to(torch::kFloat32).t()));
  const torch::Tensor chosen = std::get<1>(torch::topk(scores + w.expert_bias, top_k, -1));
  const torch::Tensor picked = scores.gather(-1, chosen);
  const torch::Tensor weight =
      torch::zeros_like(scores).scatter(-1, chosen, picked / picked.sum(-1, true) * routed_scale);
  torch::Tensor out = Expert(xf, w.shared_gate_up, w.shared_down);
  per_expert->clear();
  for (int64_t e = 0; e < kExperts; ++e) {
    out += weight.select(1, e).unsqueeze(1) * Expert(xf, w.gate_up[e], w.down[e]);
    per_expert->push_back((weight.select(1, e) != 0).sum().item<int64_t>());
  }
  return out;
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat32) - b.to(torch::kFloat32)).abs().max().item<double>();
}

// Runs both dispatches on several token counts and top_k values (experts with zero tokens
// included; at 700 tokens the CPU cuts the shared expert and the busiest routed ones into several
// pieces) and expects each within `tolerance` of the other and of the dense oracle.
void ExpectDispatchesAgree(torch::ScalarType dt, double tolerance) {
  const MoeWeights w = RandomWeights(dt);
  for (int64_t tokens : {1, 3, 17, 64, 700}) {
    for (int64_t top_k : {1, 2, 3}) {
      const torch::Tensor x = torch::randn({1, tokens, kDim}).to(dt);
      std::vector<int64_t> per_expert;
      const torch::Tensor want = DenseOracle(x, w, top_k, 1.5, &per_expert);
      ASSERT_EQ(per_expert[kIdleExpert], 0);
      const torch::Tensor loop = Moe(x, w, top_k, 1.5, MoeDispatch::kLoop);
      const torch::Tensor grouped = Moe(x, w, top_k, 1.5, MoeDispatch::kGrouped);
      ASSERT_EQ(grouped.sizes(), x.sizes());
      ASSERT_EQ(grouped.scalar_type(), dt);
      const double scale = want.abs().max().item<double>();
      EXPECT_LE(MaxAbsDiff(grouped, loop), tolerance * scale) << tokens << " tokens, k " << top_k;
      EXPECT_LE(MaxAbsDiff(grouped, want.view(x.sizes())), tolerance * scale)
          << tokens << " tokens, k " << top_k;
      EXPECT_LE(MaxAbsDiff(loop, want.view(x.sizes())), tolerance * scale)
          << tokens << " tokens, k " << top_k;
      // With a residual, both dispatches give residual + the MoE (the CPU's loop adds it as it
      // combines the experts' rows) in the residual's dtype.
      const torch::Tensor residual = torch::randn({1, tokens, kDim}).to(dt);
      const torch::Tensor want_sum = residual.to(torch::kFloat32) + want.view(x.sizes());
      for (MoeDispatch d : {MoeDispatch::kLoop, MoeDispatch::kGrouped}) {
        const torch::Tensor sum = Moe(x, w, top_k, 1.5, d, residual);
        ASSERT_EQ(sum.sizes(), x.sizes());
        ASSERT_EQ(sum.scalar_type(), dt);
        EXPECT_LE(MaxAbsDiff(sum, want_sum), tolerance * (scale + 4))
            << tokens << " tokens, k " << top_k;
      }
    }
  }
}

TEST(MoeTest, GroupedEqualsLoopAndTheDenseOracleInFloat32) {
  // Only the order of float32 sums differs (measured: 2e-7 of the output scale).
  ExpectDispatchesAgree(torch::kFloat32, 1e-6);
}

TEST(MoeTest, GroupedEqualsLoopAndTheDenseOracleInBf16) {
  // bf16 rounds the expert activations and the output (2^-8 relative each); the oracle keeps
  // float32 after the first rounding of x and the weights (measured: 7.5e-3 of the output scale).
  ExpectDispatchesAgree(torch::kBFloat16, 2e-2);
}

TEST(MoeTest, GroupedPathIsPickedOnlyWhereGroupedMatmulNeedsNoHostRead) {
  const MoeWeights bf16 = RandomWeights(torch::kBFloat16);
  const torch::Tensor x = torch::randn({2, 5, kDim});
  EXPECT_TRUE(GroupedMoeIsSyncFree(x, bf16, 9));
  EXPECT_TRUE(GroupedMoeIsSyncFree(x, bf16, 10));
  EXPECT_FALSE(GroupedMoeIsSyncFree(x, bf16, 8)) << "no fused grouped kernel before sm90";
  EXPECT_FALSE(GroupedMoeIsSyncFree(x, bf16, 12)) << "nor on sm120";
  EXPECT_FALSE(GroupedMoeIsSyncFree(x, RandomWeights(torch::kFloat32), 9)) << "bf16 only";
  EXPECT_FALSE(GroupedMoeIsSyncFree(torch::randn({2, 5, 36}), bf16, 9)) << "dim % 8";
  MoeWeights odd = bf16;
  odd.down = torch::randn({kExperts, 12, kDim}).to(torch::kBFloat16);
  EXPECT_FALSE(GroupedMoeIsSyncFree(x, odd, 9)) << "expert_dim % 8";
  MoeWeights shifted = bf16;
  const torch::Tensor buffer = torch::zeros({bf16.gate_up.numel() + 1}, torch::kBFloat16);
  shifted.gate_up = buffer.narrow(0, 1, bf16.gate_up.numel()).view(bf16.gate_up.sizes());
  EXPECT_FALSE(GroupedMoeIsSyncFree(x, shifted, 9)) << "16-byte aligned address";
  MoeWeights transposed = bf16;
  transposed.down = torch::randn({kExperts, kDim, kExpertDim}).to(torch::kBFloat16).transpose(1, 2);
  EXPECT_TRUE(GroupedMoeIsSyncFree(x, transposed, 9)) << "column-major operands are taken";
  MoeWeights strided = bf16;
  strided.down =
      torch::randn({kExperts, kExpertDim, 2 * kDim}).to(torch::kBFloat16).slice(2, 0, kDim, 2);
  EXPECT_FALSE(GroupedMoeIsSyncFree(x, strided, 9)) << "no unit stride";
  // The CPU keeps the measured loop.
  EXPECT_EQ(AutoMoeDispatch(x, bf16), MoeDispatch::kLoop);
}

}  // namespace
}  // namespace praxis::model
