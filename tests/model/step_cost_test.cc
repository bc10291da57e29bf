#include "model/step_cost.h"

#include <gtest/gtest.h>

#include <random>

#include "bench/gemm_record.h"
#include "common/file_util.h"
#include "model/backbone.h"
#include "model/config.h"
#include "model/cpu_kernels.h"
#include "model/cpu_runtime.h"
#include "model/random_weights.h"
#include "wire/synthetic.h"

namespace praxis::model {
namespace {

BackboneConfig Tiny() { return *LoadConfig(JoinPath(PRAXIS_SOURCE_DIR, "configs/tiny.json")); }

// A small window layout of random geometry (registers left 0: the config's).
WindowLayout RandomLayout(std::mt19937& rng) {
  auto draw = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  return {.anchor_h = draw(1, 5),
          .anchor_w = draw(1, 5),
          .text_len = draw(1, 9),
          .k = draw(1, 4),
          .f = draw(1, 3),
          .h = draw(1, 4),
          .w = draw(1, 4)};
}

// The closed form must equal the mask library's own count, tag run by tag run, on both towers.
TEST(StepCostTest, PairsEqualAllowedPairsOnRandomLayouts) {
  const BackboneConfig c = Tiny();
  std::mt19937 rng(20261203);
  for (int i = 0; i < 60; ++i) {
    WindowLayout l = RandomLayout(rng);
    l.registers = c.num_registers;
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

// step_bench's --gemm_bound times the attention's products as GEMMs over the allowed pairs: they
// must do exactly the attention FLOPs the cost counts, heads, rows and blocks included.
TEST(StepCostTest, AttentionProductsDoTheAttentionFlops) {
  BackboneConfig c = Tiny();  // 4 query heads
  std::mt19937 rng(20261207);
  for (int i = 0; i < 20; ++i) {
    const WindowLayout l = RandomLayout(rng);
    const int64_t rows = 1 + i % 3;
    const bool decode = i % 2 == 0;
    c.num_kv_heads = i % 4 < 2 ? 1 : 2;  // the query heads of a key head: one product's rows
    double flops = 0;
    for (const bench::GemmCall& call :
         bench::AttentionProducts(c, l, decode, rows, torch::kFloat32)) {
      ASSERT_EQ(call.op, "aten::bmm");
      flops += call.Flops();
    }
    EXPECT_DOUBLE_EQ(flops, ComputeStepCost(c, l, decode, rows).attention_flops);
  }
}

TEST(StepCostTest, ScalesWithRowsAndDenseCountsEveryPair) {
  const BackboneConfig c = Tiny();
  const WindowLayout l{
      .anchor_h = 4, .anchor_w = 4, .text_len = 16, .k = 2, .f = 1, .h = 4, .w = 4};
  const StepCost one = ComputeStepCost(c, l, true, 1), eight = ComputeStepCost(c, l, true, 8);
  EXPECT_DOUBLE_EQ(eight.flops, 8 * one.flops);
  EXPECT_DOUBLE_EQ(eight.attention_flops, 8 * one.attention_flops);
  const StepCost dense = ComputeStepCost(c, l, true, 1, /*dense=*/true);
  EXPECT_EQ(dense.encoder_pairs, static_cast<double>(one.encoder_tokens) * one.encoder_tokens);
  EXPECT_GT(dense.flops, one.flops);
  const StepCost encoder_only = ComputeStepCost(c, l, false, 1);
  EXPECT_EQ(encoder_only.decoder_tokens, 0);
  EXPECT_LT(encoder_only.flops, one.flops);
}

// The cost is what admission bounds a request's work by (SPEC §12), so it must count every matmul a
// forward runs: the GEMMs a real forward runs (LibTorch's, and the Linears' and SwiGLU pieces' on
// oneDNN's brgemm or BLAS's float GEMM; recorded on every thread)
// against the cost less its attention pairs. Never more, and within 1 %: the cost also counts the
// router's logits, which run on a kernel of ours, not LibTorch's GEMM (0.14 % of the tiny model's).
TEST(StepCostTest, CountsEveryGemmAForwardRuns) {
  BackboneConfig c = Tiny();
  auto model = *VideoBackbone::Create(c, RandomWeights(c, 0), {});
  // In bf16 too, kept in bf16 (each matmul on the float32 GEMM where its bf16 one is the slower).
  c.dtype = "bfloat16";
  auto bf16 = *VideoBackbone::Create(c, RandomWeights(c, 0), {.cpu_float32_compute = false});
  for (VideoBackbone* m : {model.get(), bf16.get()}) {
    for (const auto& [g, rows] :
         {std::pair<wire::StepGeometry, int64_t>{
              {.text_len = 8, .anchor_h = 3, .anchor_w = 4, .k = 2, .f = 1, .h = 3, .w = 4}, 1},
          {{.text_len = 5, .anchor_h = 2, .anchor_w = 2, .k = 3, .f = 2, .h = 2, .w = 3}, 3}}) {
      const StepInputs in = wire::SyntheticInputs(c.step_dims(), g, rows, /*seed=*/1);
      absl::Status s;
      const std::vector<bench::GemmCall> calls =
          bench::RecordGemms([&] { s = m->Forward(in).status(); });
      ASSERT_TRUE(s.ok()) << s;
      double recorded = 0;
      int sgemm_calls = 0, brgemm_calls = 0;
      for (const bench::GemmCall& call : calls) {
        recorded += call.Flops();
        sgemm_calls += call.op == "praxis::sgemm";
        brgemm_calls += call.op == "praxis::brgemm";
      }
      if (m == model.get() && cpu::HasFloat32Brgemm()) {
        // The experts' weights read in place, the dense layers' from their packs (made at load).
        EXPECT_GT(brgemm_calls, 0) << "no float32 SwiGLU piece on brgemm";
        EXPECT_EQ(sgemm_calls, 0) << "a float32 SwiGLU piece left on BLAS's sgemm";
      } else if (m == model.get() && cpu::Float32PiecesOnBlas()) {
        EXPECT_GT(sgemm_calls, 0) << "no float32 SwiGLU piece on pointers";
      }
      if (m == bf16.get() && cpu::HasBf16Brgemm() && !ReducedGemmInFloat32(torch::kBFloat16)) {
        EXPECT_GT(brgemm_calls, 0) << "no bf16 SwiGLU piece on brgemm";
      }
      const StepCost cost = ComputeStepCost(c, StepLayout(in), in.decode, rows);
      const double matmuls = cost.flops - cost.attention_flops;
      EXPECT_LE(recorded, matmuls) << calls.size() << " GEMM calls, " << m->dtype();
      EXPECT_GE(recorded, 0.99 * matmuls) << calls.size() << " GEMM calls, " << m->dtype();
    }
  }
}

}  // namespace
}  // namespace praxis::model
