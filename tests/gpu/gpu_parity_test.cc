// The CUDA path against the CPU (issue 14): every output of a step, same random weights (seed 0,
// model_loader's config path) and same SyntheticStep inputs. Skipped without a CUDA device; on one,
// run by scripts/gpu-check.sh. TF32 is off, so float32 is float32 on both sides.

#include <gtest/gtest.h>

#include <string>

#include "model/masks.h"
#include "tests/gpu/gpu_compare.h"
#include "wire/layout_key.h"
#include "wire/synthetic.h"

namespace praxis::model::gpu {
namespace {

// float32 on the GPU against float32 on the CPU: max |gpu - cpu| / max(1, max |cpu|).
constexpr double kFp32Tolerance = 1e-4;
// bf16 weights and activations on the GPU against float32 on the CPU: ||gpu - cpu|| / ||cpu||.
// bf16 keeps 8 bits of mantissa (2^-9 ~ 2e-3 per rounding); a few blocks compound it to ~1e-2.
constexpr double kBf16Tolerance = 3e-2;

// The tiny model's K = 2 layout (tests/server/server_test.cc's first).
constexpr WindowLayout kTinyLayout{
    .anchor_h = 3, .anchor_w = 4, .text_len = 5, .k = 2, .f = 1, .h = 3, .w = 4};
// configs/bench.json layouts: 440 encoder tokens (partial 128-token tiles only), and 1924 tokens
// with full tiles, K = 2 chunks of F = 2 frames.
constexpr WindowLayout kSmall{
    .anchor_h = 6, .anchor_w = 8, .text_len = 32, .k = 2, .f = 1, .h = 6, .w = 8};
constexpr WindowLayout kMedium{
    .anchor_h = 16, .anchor_w = 16, .text_len = 128, .k = 2, .f = 2, .h = 16, .w = 16};

struct Case {
  std::string config;  // empty: the embedded tiny model
  WindowLayout layout;
};

std::vector<Case> Cases() {
  return {
      {"", kTinyLayout}, {RepoConfig("bench.json"), kSmall}, {RepoConfig("bench.json"), kMedium}};
}

std::string Name(const Case& c) {
  return (c.config.empty() ? std::string("tiny ") : c.config + " ") +
         wire::LayoutKey(GeometryOf(c.layout), true, {});
}

TEST(GpuParityTest, Fp32OnCudaEqualsFp32OnCpuOnEveryOutput) {
  PRAXIS_SKIP_WITHOUT_CUDA();
  for (const Case& c : Cases()) {
    auto cpu = Load(c.config, "cpu", "float32");
    auto gpu = Load(c.config, "cuda", "float32");
    ASSERT_TRUE(cpu && gpu);
    const StepInputs in =
        wire::SyntheticInputs(cpu->config().step_dims(), GeometryOf(c.layout), 2, /*seed=*/3);
    ExpectOutputsClose(Outputs(*gpu, in), Outputs(*cpu, in), ScaledMaxDiff, kFp32Tolerance,
                       Name(c));
  }
}

TEST(GpuParityTest, Bf16OnCudaIsWithinBf16ToleranceOfFp32OnCpu) {
  PRAXIS_SKIP_WITHOUT_CUDA();
  for (const Case& c : Cases()) {
    auto cpu = Load(c.config, "cpu", "float32");
    auto gpu = Load(c.config, "cuda", "bfloat16");
    ASSERT_TRUE(cpu && gpu);
    const StepInputs in =
        wire::SyntheticInputs(cpu->config().step_dims(), GeometryOf(c.layout), 2, /*seed=*/4);
    ExpectOutputsClose(Outputs(*gpu, in), Outputs(*cpu, in), RelativeL2, kBf16Tolerance, Name(c));
  }
}

TEST(GpuParityTest, SparseAttentionEqualsDenseOnCuda) {
  PRAXIS_SKIP_WITHOUT_CUDA();
  for (const Case& c : Cases()) {
    auto sparse = Load(c.config, "cuda", "float32", AttentionMode::kSparse);
    auto dense = Load(c.config, "cuda", "float32", AttentionMode::kDense);
    ASSERT_TRUE(sparse && dense);
    const StepInputs in =
        wire::SyntheticInputs(sparse->config().step_dims(), GeometryOf(c.layout), 1, /*seed=*/5);
    ExpectOutputsClose(Outputs(*sparse, in), Outputs(*dense, in), ScaledMaxDiff, kFp32Tolerance,
                       Name(c));
  }
}

}  // namespace
}  // namespace praxis::model::gpu
