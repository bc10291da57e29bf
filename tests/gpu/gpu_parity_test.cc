// The CUDA path against the CPU (issue 14): every output of a step, same random weights (seed 0,
// model_loader's config path) and same SyntheticStep inputs. Skipped without a CUDA device; on one,
// run by scripts/gpu-check.sh. TF32 is off, so float32 is float32 on both sides.

#include <gtest/gtest.h>

#include <string>

#include "model/masks.h"
#include "tests/gpu/gpu_compare.h"
#include "wire/synthetic.h"

namespace praxis::model::gpu {
namespace {

// float32 on the GPU against float32 on the CPU: max |gpu - cpu| / max(1, max |cpu|).
constexpr double kFp32Tolerance = 1e-4;
// bf16 weights and activations on the GPU against float32 on the CPU: ||gpu - cpu|| / ||cpu||.
// bf16 keeps 8 bits of mantissa (2^-9 ~ 2e-3 per rounding); a few blocks compound it to ~1e-2.
constexpr double kBf16Tolerance = 3e-2;

struct Case {
  std::string config;  // empty: the embedded tiny model
  WindowLayout layout;
};

std::vector<Case> Cases() {
  return {
      {"", kTinyLayout}, {RepoConfig("bench.json"), kSmall}, {RepoConfig("bench.json"), kMedium}};
}

std::string Name(const Case& c) { return CaseName(c.config, c.layout); }

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
