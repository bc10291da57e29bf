// The sync-free pieces of the CUDA forward (issue 14): the MoE block's grouped dispatch and the
// partial attention tiles through the memory-efficient kernel. Each is captured in a CUDA graph
// in the global capture mode, where a host synchronisation (a device-to-host copy, .item()) makes
// the capture throw: a capture that succeeds is the proof that the piece reads nothing on the
// host. Skipped without a CUDA device.

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <string>

#include "model/attention.h"
#include "model/layers.h"
#include "model/masks.h"
#include "tests/gpu/gpu_compare.h"

namespace praxis::model::gpu {
namespace {

// bf16 against bf16 or float32 through a few roundings: ||a - b|| / ||b||.
constexpr double kBf16Tolerance = 1e-2;

// Runs `forward` eagerly, then captures it in a CUDA graph on a side stream and replays it; the
// replay must equal the eager result bit for bit. Fails (and ends the capture) if capturing
// throws, as it does on a host synchronisation.
void ExpectCapturedEqualsEager(const std::function<torch::Tensor()>& forward,
                               const std::string& what) {
  torch::cuda::synchronize();  // the inputs were made on the default stream
  c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
  c10::cuda::CUDAStreamGuard guard(stream);
  const torch::Tensor eager = forward().clone();  // also warms cuBLAS and the allocator up
  stream.synchronize();
  at::cuda::CUDAGraph graph;
  torch::Tensor captured;
  try {
    graph.capture_begin();  // cudaStreamCaptureModeGlobal
    captured = forward();
    graph.capture_end();
  } catch (const c10::Error& e) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream.stream(), &broken);  // leave the stream usable for other tests
    if (broken != nullptr) cudaGraphDestroy(broken);
    FAIL() << what
           << ": capture failed (a host sync in the forward?): " << e.what_without_backtrace();
  }
  graph.replay();
  stream.synchronize();
  EXPECT_TRUE(torch::equal(captured, eager)) << what << ": replay differs from eager";
}

MoeWeights RandomMoe(int64_t experts, int64_t dim, int64_t expert_dim, torch::ScalarType dt) {
  torch::manual_seed(21);
  const auto on = [dt](const torch::Tensor& t) { return t.to(torch::kCUDA, dt); };
  MoeWeights w;
  w.router = on(torch::randn({experts, dim}) / 8);
  w.expert_bias = (0.1 * torch::randn({experts})).to(torch::kCUDA);
  w.expert_bias[0] = -100.0;  // an expert that gets no token
  w.gate_up = on(torch::randn({experts, dim, 2 * expert_dim}) / 16);
  w.down = on(torch::randn({experts, expert_dim, dim}) / 11);
  w.shared_gate_up = on(torch::randn({dim, 4 * expert_dim}) / 16);
  w.shared_down = on(torch::randn({2 * expert_dim, dim}) / 16);
  return w;
}

TEST(GpuSyncFreeTest, MoeTakesTheGroupedPathWhichMatchesTheLoopAndCaptures) {
  PRAXIS_SKIP_WITHOUT_CUDA();
  const int major = at::cuda::getCurrentDeviceProperties()->major;
  if (major != 9 && major != 10) GTEST_SKIP() << "the fused grouped matmul needs sm90 or sm100";
  // Praxis-1's routing at a reduced width: 64 experts, top-4.
  const MoeWeights w = RandomMoe(64, 256, 128, torch::kBFloat16);
  for (int64_t tokens : {1, 37, 600}) {
    const torch::Tensor x = torch::randn({2, tokens, 256}).to(torch::kCUDA, torch::kBFloat16);
    ASSERT_EQ(AutoMoeDispatch(x, w), MoeDispatch::kGrouped);
    const torch::Tensor grouped = Moe(x, w, 4, 2.5);
    const torch::Tensor loop = Moe(x, w, 4, 2.5, MoeDispatch::kLoop);
    const double d = RelativeL2(grouped.cpu().to(torch::kFloat64), loop.cpu().to(torch::kFloat64));
    EXPECT_LE(d, kBf16Tolerance) << tokens << " tokens";
    std::printf("[parity] moe grouped vs loop, %ld tokens: %.3g (tolerance %.3g)\n",
                static_cast<long>(tokens), d, kBf16Tolerance);
    ExpectCapturedEqualsEager([&] { return Moe(x, w, 4, 2.5); },
                              "moe " + std::to_string(tokens) + " tokens");
  }
  // float32 weights keep the loop (its host read of the counts): documented, not capturable.
  EXPECT_EQ(AutoMoeDispatch(torch::randn({1, 4, 256}, torch::kCUDA),
                            RandomMoe(8, 256, 128, torch::kFloat32)),
            MoeDispatch::kLoop);
}

// An encoder layout's plan, with several groups and partial tiles, on `device`.
AttentionPlan Plan(torch::Device device, torch::ScalarType dt, MaskRule* rule, int64_t* length) {
  const WindowLayout layout{
      .registers = 2, .anchor_h = 4, .anchor_w = 6, .text_len = 7, .k = 3, .f = 2, .h = 4, .w = 6};
  const MaskKey key = EncoderMaskKey(layout, 16);
  TokenTags tags = *WindowTags(key.slots, key.chunk_size);
  *rule = ChunkCausalRule(tags);
  *length = tags.length();
  // The head dim only picks TileAttention's tiles on the CPU; the groups serve any.
  return BuildAttentionPlan(*BuildBlockMask(*rule, tags, tags, 16), *rule, tags, tags, device, dt,
                            128);
}

TEST(GpuSyncFreeTest, PartialTilesRunTheEfficientKernelEqualDenseAndCapture) {
  PRAXIS_SKIP_WITHOUT_CUDA();
  for (const auto dt : {torch::kFloat32, torch::kBFloat16}) {
    for (const int64_t hd : {64}) {
      MaskRule rule;
      int64_t t = 0;
      const AttentionPlan plan = Plan(torch::kCUDA, dt, &rule, &t);
      ASSERT_FALSE(plan.dense_bias.defined()) << "no dense bias on CUDA";
      for (const AttentionPlan::Group& g : plan.groups) {
        if (g.partial_bias.defined()) {
          EXPECT_EQ(g.partial_bias.stride(0) % 16, 0) << "bias rows padded";
        }
      }
      torch::manual_seed(3);
      const torch::Tensor q = torch::randn({2, 4, t, hd}), k = torch::randn({2, 4, t, hd}),
                          v = torch::randn({2, 4, t, hd});
      const torch::Tensor all = torch::arange(t, torch::kInt64);
      const torch::Tensor want = DenseAttention(q, k, v, rule(all, all), 0.3).to(torch::kFloat64);
      const auto on = [dt](const torch::Tensor& x) { return x.to(torch::kCUDA, dt); };
      const torch::Tensor qd = on(q), kd = on(k), vd = on(v);
      const torch::Tensor got = SparseAttention(qd, kd, vd, plan, 0.3).cpu().to(torch::kFloat64);
      const std::string what =
          std::string(dt == torch::kFloat32 ? "fp32" : "bf16") + " hd " + std::to_string(hd);
      ASSERT_FALSE(got.isnan().any().item<bool>()) << what;
      const double d = dt == torch::kFloat32 ? ScaledMaxDiff(got, want) : RelativeL2(got, want);
      EXPECT_LE(d, dt == torch::kFloat32 ? 1e-4 : kBf16Tolerance) << what;
      std::printf("[parity] sparse attention %s vs dense cpu: %.3g\n", what.c_str(), d);
      ExpectCapturedEqualsEager([&] { return SparseAttention(qd, kd, vd, plan, 0.3); },
                                "attention " + what);
    }
  }
}

}  // namespace
}  // namespace praxis::model::gpu
