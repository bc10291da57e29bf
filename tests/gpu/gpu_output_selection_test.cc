// Only what is asked for, on CUDA (issues 13 and 14): BackboneStepRunner copies back exactly the
// outputs a batch asked for, each computed on the device to the host in pinned memory, the same as
// an all-outputs run of the same inputs copies back. Skipped without a CUDA device; on one, run by
// scripts/gpu-check.sh.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/masks.h"
#include "model/step_runner.h"
#include "tests/gpu/gpu_compare.h"
#include "wire/synthetic.h"

namespace praxis::model::gpu {
namespace {

TEST(GpuOutputSelectionTest, OnlyTheWantedOutputsComeBackPinnedAndEqual) {
  PRAXIS_SKIP_WITHOUT_CUDA();
  BackboneStepRunner runner(Load("", "cuda", "float32"));
  const WindowLayout layout{
      .anchor_h = 3, .anchor_w = 4, .text_len = 5, .k = 2, .f = 1, .h = 3, .w = 4};
  const StepInputs in =
      wire::SyntheticInputs(runner.config().step_dims(), GeometryOf(layout), 2, /*seed=*/6);
  const auto all =
      OutputSelection::All(static_cast<int>(runner.config().encoder.tap_blocks.size()));
  const BackboneOutput every = runner.Run(in, all).value();
  const OutputSelection wanted{.velocity = true, .taps = {1}, .positions = true};
  const BackboneOutput some = runner.Run(in, wanted).value();
  std::vector<std::string> names;
  for (const auto& [name, t] : NamedOutputs(some)) {
    names.push_back(name);
    EXPECT_TRUE(t.device().is_cpu()) << name;
    // The positions are made on the host from the layout (no device copy to speed up).
    EXPECT_TRUE(t.is_pinned() || name == "positions") << name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"velocity", "tap.1", "positions"}));
  // Close rather than equal: CUDA's atomic adds (MoE) need not repeat bit for bit between runs.
  EXPECT_TRUE(torch::allclose(some.velocity, every.velocity, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(some.features.taps[1], every.features.taps[1], 1e-5, 1e-6));
  EXPECT_TRUE(torch::equal(some.features.positions, every.features.positions));
}

}  // namespace
}  // namespace praxis::model::gpu
