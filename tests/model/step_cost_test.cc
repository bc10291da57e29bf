#include "model/step_cost.h"

#include <gtest/gtest.h>

#include <random>

#include "common/file_util.h"
#include "model/config.h"

namespace praxis::model {
namespace {

BackboneConfig Tiny() { return *LoadConfig(JoinPath(PRAXIS_SOURCE_DIR, "configs/tiny.json")); }

// The closed form must equal the mask library's own count, tag run by tag run, on both towers.
TEST(StepCostTest, PairsEqualAllowedPairsOnRandomLayouts) {
  const BackboneConfig c = Tiny();
  std::mt19937 rng(20261203);
  auto draw = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int i = 0; i < 60; ++i) {
    WindowLayout l{.registers = c.num_registers,
                   .anchor_h = draw(1, 5),
                   .anchor_w = draw(1, 5),
                   .text_len = draw(1, 9),
                   .k = draw(1, 4),
                   .f = draw(1, 3),
                   .h = draw(1, 4),
                   .w = draw(1, 4)};
    const StepCost s = ComputeStepCost(c, l, /*decode=*/true, 1);
    const MaskKey ek = EncoderMaskKey(l, c.flex_block_size);
    const MaskKey dk = DecoderMaskKey(l, c.ph(), c.pw(), c.flex_block_size);
    const TokenTags et = *WindowTags(ek.slots, ek.chunk_size);
    const TokenTags dt = *WindowTags(dk.slots, dk.chunk_size);
    ASSERT_EQ(s.encoder_tokens, et.length()) << ek.DebugString();
    ASSERT_EQ(s.decoder_tokens, dt.length()) << dk.DebugString();
    ASSERT_EQ(s.encoder_pairs, AllowedPairs(ChunkCausalRule(et), et, et)) << ek.DebugString();
    ASSERT_EQ(s.decoder_pairs, AllowedPairs(ChunkCausalRule(dt), dt, dt)) << dk.DebugString();
  }
}

TEST(StepCostTest, ScalesWithRowsAndDenseCountsEveryPair) {
  const BackboneConfig c = Tiny();
  const WindowLayout l{
      .anchor_h = 4, .anchor_w = 4, .text_len = 16, .k = 2, .f = 1, .h = 4, .w = 4};
  const StepCost one = ComputeStepCost(c, l, true, 1), eight = ComputeStepCost(c, l, true, 8);
  EXPECT_DOUBLE_EQ(eight.flops, 8 * one.flops);
  const StepCost dense = ComputeStepCost(c, l, true, 1, /*dense=*/true);
  EXPECT_EQ(dense.encoder_pairs, static_cast<double>(one.encoder_tokens) * one.encoder_tokens);
  EXPECT_GT(dense.flops, one.flops);
  const StepCost encoder_only = ComputeStepCost(c, l, false, 1);
  EXPECT_EQ(encoder_only.decoder_tokens, 0);
  EXPECT_LT(encoder_only.flops, one.flops);
}

}  // namespace
}  // namespace praxis::model
