// The fused CPU kernels against the ATen formulas they replace, the attention plan's two CPU paths
// (one dense call with the cached bias, and the tile groups) against dense SDPA, and the
// per-thread intra-op setting.

#include "model/cpu_kernels.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <numbers>
#include <thread>
#include <vector>

#include "model/attention.h"
#include "model/cpu_runtime.h"
#include "model/layers.h"
#include "model/masks.h"

namespace praxis::model {
namespace {

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat32) - b.to(torch::kFloat32)).abs().max().item<double>();
}

// The zero-centred RMS norm as SPEC §5 and the reference write it.
torch::Tensor AtenRmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  const torch::Tensor xf = x.to(torch::kFloat32);
  return (xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps) * (1.0 + w)).to(x.scalar_type());
}

TEST(CpuKernelsTest, RmsNormEqualsTheAtenFormulaInEveryDtype) {
  torch::manual_seed(0);
  // Rows of whole 16-lane vectors and with a partial last one.
  for (int64_t n : {48, 40}) {
    const torch::Tensor w = torch::randn({n});
    for (auto dt : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
      const torch::Tensor x = (3 * torch::randn({2, 37, n})).to(dt);
      const torch::Tensor got = cpu::RmsNorm(x, NormWeight(w), 1e-6);
      EXPECT_EQ(got.scalar_type(), dt);
      EXPECT_EQ(got.sizes(), x.sizes());
      // One rounding of the result in bf16/fp16 may land one unit apart.
      EXPECT_LE(MaxAbsDiff(got, AtenRmsNorm(x, w, 1e-6)), dt == torch::kFloat32 ? 1e-5 : 0.05)
          << dt << " " << n;
    }
  }
}

TEST(CpuKernelsTest, NormRopeHeadsEqualsNormThenRotaryThenTranspose) {
  torch::manual_seed(1);
  const int64_t b = 2, t = 19, h = 3;
  // Head dims with halves shorter than, not a multiple of, and a multiple of 16 lanes.
  for (int64_t hd : {16, 40, 64}) {
    // A strided view, as the heads are when sliced from the stacked q|k|v|gate projection.
    const torch::Tensor packed = torch::randn({b, t, 2 * h * hd + 5});
    const torch::Tensor x32 = packed.narrow(2, 5, h * hd).view({b, t, h, hd});
    const torch::Tensor w = torch::randn({hd});
    const RopeTables rope =
        MakeRopeTables(VideoPositions(1, t, 1, 7) * 31, hd, 10000.0, torch::kCPU);
    for (auto dt : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
      const torch::Tensor x = x32.to(dt);
      const torch::Tensor xf = x.to(torch::kFloat32);
      const torch::Tensor want = ApplyRope(AtenRmsNorm(xf, w, 1e-6), rope).transpose(1, 2);
      const torch::Tensor plain_want = ApplyRope(xf, rope).transpose(1, 2);
      // float32: a few ulps; 16 bits: one rounding of the result (relative to the largest value).
      const double tol = dt == torch::kFloat32 ? 1e-6 : (dt == torch::kBFloat16 ? 1.0 / 128 : 1e-3);
      auto relative = [](const torch::Tensor& got, const torch::Tensor& ref) {
        return MaxAbsDiff(got.to(torch::kFloat32), ref) / ref.abs().max().item<double>();
      };
      for (auto isa : {cpu::AttentionIsa::kBest, cpu::AttentionIsa::kPortable}) {
        const torch::Tensor got =
            cpu::NormRopeHeads(x, NormWeight(w), 1e-6, rope.cos, rope.sin, isa);
        EXPECT_TRUE(got.is_contiguous());
        EXPECT_EQ(got.scalar_type(), dt);
        EXPECT_EQ(got.sizes(), torch::IntArrayRef({b, h, t, hd}));
        EXPECT_LE(relative(got, want), tol) << "hd " << hd << " " << dt << " isa " << int(isa);
        // Without a norm weight: rotary only.
        const torch::Tensor plain = cpu::NormRopeHeads(x, {}, 1e-6, rope.cos, rope.sin, isa);
        EXPECT_LE(relative(plain, plain_want), tol)
            << "rotary only: hd " << hd << " " << dt << " isa " << int(isa);
      }
    }
  }
}

TEST(CpuKernelsTest, KernelsRefuseWhatTheyWereNotWrittenFor) {
  const torch::Tensor x = torch::randn({4, 8});
  EXPECT_THROW(cpu::RmsNorm(x, torch::ones({7}), 1e-6), c10::Error);
  EXPECT_THROW(cpu::RmsNorm(x, torch::ones({8}, torch::kBFloat16), 1e-6), c10::Error);
  const torch::Tensor odd = torch::randn({1, 2, 1, 5});
  EXPECT_THROW(cpu::NormRopeHeads(odd, {}, 1e-6, torch::ones({2, 5}), torch::ones({2, 5})),
               c10::Error);
}

TEST(CpuKernelsTest, SiluMulEqualsSiluTimesUpInEveryDtype) {
  torch::manual_seed(2);
  for (auto dt : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    // The gate and up halves of one projection: strided views. Values reach past exp's clamps.
    const torch::Tensor gu = (torch::randn({3, 45, 2 * 37}) * 40).to(dt);
    const auto halves = gu.chunk(2, -1);
    const torch::Tensor want =
        (torch::silu(halves[0].to(torch::kFloat32)) * halves[1].to(torch::kFloat32));
    const torch::Tensor got = cpu::SiluMul(halves[0], halves[1]);
    EXPECT_EQ(got.scalar_type(), dt);
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_EQ(got.sizes(), halves[0].sizes());
    // float32: a few ulps of the product; bf16/fp16: one rounding of the result (fp16's subnormal
    // results: half its smallest step).
    const double rel = dt == torch::kFloat32 ? 4e-7 : (dt == torch::kBFloat16 ? 8e-3 : 1e-3);
    const double floor = dt == torch::kFloat16 ? 3.1e-8 : 1e-37;
    const torch::Tensor excess = (got.to(torch::kFloat32) - want).abs() - rel * want.abs();
    const int64_t at = excess.flatten().argmax().item<int64_t>();
    EXPECT_LE(excess.max().item<double>(), floor)
        << dt << " gate " << halves[0].flatten()[at].item<float>() << " up "
        << halves[1].contiguous().flatten()[at].item<float>() << " got "
        << got.flatten()[at].item<float>() << " want " << want.flatten()[at].item<float>();
  }
  // A NaN gate stays NaN; infinities of the product are not turned into finite values.
  const torch::Tensor a = torch::tensor({NAN, -200.0f, 200.0f, 0.0f});
  const torch::Tensor y = cpu::SiluMul(a, torch::ones({4}));
  EXPECT_TRUE(std::isnan(y[0].item<float>()));
  EXPECT_FLOAT_EQ(y[1].item<float>(), 0.0f);
  EXPECT_FLOAT_EQ(y[2].item<float>(), 200.0f);
  EXPECT_FLOAT_EQ(y[3].item<float>(), 0.0f);
  const torch::Tensor nan_bf16 =
      cpu::SiluMul(a.to(torch::kBFloat16), torch::ones({4}, torch::kBFloat16));
  EXPECT_TRUE(std::isnan(nan_bf16[0].item<float>()));
}

// Each token's pairs added as one expert after another would add them (the slices in order).
TEST(CpuKernelsTest, AddRoutedRowsEqualsIndexAddInExpertOrder) {
  torch::manual_seed(3);
  const int64_t tokens = 300, experts = 6, top_k = 2;
  const cpu::ExpertRoutes r =
      cpu::RouteTopK(torch::randn({tokens, experts}), torch::zeros({experts}), top_k, 1.0);
  for (auto dt : {torch::kFloat32, torch::kBFloat16}) {
    const torch::Tensor y = torch::randn({tokens * top_k, 33}).to(dt);
    torch::Tensor out = torch::randn({tokens, 33});
    torch::Tensor want = out.clone();
    int64_t begin = 0;
    for (int64_t n : r.counts) {
      want.index_add_(
          0, r.tokens.narrow(0, begin, n),
          r.weights.narrow(0, begin, n).unsqueeze(1) * y.narrow(0, begin, n).to(torch::kFloat32));
      begin += n;
    }
    const torch::Tensor start = out.clone();
    EXPECT_TRUE(cpu::AddRoutedRows(out, r, y).is_same(out));
    EXPECT_LE(MaxAbsDiff(out, want), 1e-6) << dt;
    // With a residual (rows of a wider tensor) in its dtype: residual + the sum, rounded once; out
    // holds the sum without it.
    const torch::Tensor wide = torch::randn({tokens, 40}).to(dt);
    const torch::Tensor residual = wide.narrow(1, 0, 33);
    torch::Tensor again = start.clone();
    const torch::Tensor sum = cpu::AddRoutedRows(again, r, y, residual);
    EXPECT_EQ(sum.scalar_type(), dt);
    EXPECT_TRUE(sum.is_contiguous());
    EXPECT_TRUE(torch::equal(again, out));
    EXPECT_TRUE(torch::equal(sum, (residual.to(torch::kFloat32) + out).to(dt))) << dt;
  }
  torch::Tensor fresh = torch::zeros({tokens, 33});
  EXPECT_THROW(
      cpu::AddRoutedRows(fresh, r, torch::ones({tokens * top_k, 33}), torch::zeros({tokens, 32})),
      c10::Error);
  torch::Tensor wrong = torch::zeros({tokens + 1, 33});
  EXPECT_THROW(cpu::AddRoutedRows(wrong, r, torch::ones({tokens * top_k, 33})), c10::Error);
  cpu::ExpertRoutes bad = r;
  bad.places[5] = tokens * top_k;
  torch::Tensor out = torch::zeros({tokens, 33});
  EXPECT_THROW(cpu::AddRoutedRows(out, bad, torch::ones({tokens * top_k, 33})), c10::Error);
}

TEST(CpuKernelsTest, MaxAbsEqualsAtenAndNamesNonFiniteValues) {
  torch::manual_seed(7);
  for (auto dt : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    // Small, strided, and past the threads' grain (several partial results combined).
    for (const torch::Tensor& x :
         {torch::randn({3, 5}).to(dt), (100 * torch::randn({40, 30})).to(dt).t(),
          torch::randn({300001}).to(dt)}) {
      EXPECT_EQ(cpu::MaxAbs(x), x.abs().max().item<double>()) << dt << " " << x.sizes();
      torch::Tensor bad = x.contiguous().clone();
      bad.view({-1})[bad.numel() - 1] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_TRUE(std::isnan(cpu::MaxAbs(bad))) << dt;
      bad.view({-1})[0] = -std::numeric_limits<float>::infinity();
      EXPECT_EQ(cpu::MaxAbs(bad), std::numeric_limits<double>::infinity()) << dt;
    }
  }
  EXPECT_EQ(cpu::MaxAbs(torch::empty({0, 4})), 0.0);
}

TEST(CpuKernelsTest, RouterLogitsEqualTheFloat32Matmul) {
  torch::manual_seed(6);
  const torch::Tensor router = torch::randn({11, 40});  // a group of eight experts and a part
  for (auto dt : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    // Rows as Moe passes them, and a strided view of the same values.
    const torch::Tensor x = torch::randn({23, 40}).to(dt);
    const torch::Tensor strided = torch::cat({x, x}, 1).narrow(1, 40, 40);
    const torch::Tensor want = torch::matmul(x.to(torch::kFloat32), router.t());
    for (const torch::Tensor& rows : {x, strided}) {
      const torch::Tensor got = cpu::RouterLogits(rows, router.to(dt));
      EXPECT_EQ(got.scalar_type(), torch::kFloat32);
      // The same products summed in another order (router rounded to dt as the model's are).
      const torch::Tensor want_dt =
          torch::matmul(x.to(torch::kFloat32), router.to(dt).to(torch::kFloat32).t());
      EXPECT_LE(MaxAbsDiff(got, want_dt), 1e-5) << dt;
      if (dt == torch::kFloat32) {
        EXPECT_LE(MaxAbsDiff(got, want), 1e-5);
      }
    }
  }
  EXPECT_THROW(cpu::RouterLogits(torch::randn({3, 8}), torch::randn({4, 7})), c10::Error);
}

TEST(CpuKernelsTest, RouteTopKEqualsTopkThenAStableSortByExpert) {
  torch::manual_seed(5);
  const int64_t n = 37, e = 6;
  torch::Tensor logits = torch::randn({n, e});
  const torch::Tensor bias = 0.1 * torch::randn({e});
  bias[2] = -100.0;  // never chosen: an empty slice
  for (int64_t k : {1, 2, 3}) {
    const cpu::ExpertRoutes got = cpu::RouteTopK(logits, bias, k, 2.5);
    const torch::Tensor scores = torch::sigmoid(logits);
    const torch::Tensor chosen = std::get<1>(torch::topk(scores + bias, k, -1));
    const torch::Tensor weights = scores.gather(-1, chosen);
    const torch::Tensor want_w = (weights / weights.sum(-1, true) * 2.5).flatten();
    auto [sorted, order] = chosen.flatten().sort(/*stable=*/true, 0, false);
    EXPECT_TRUE(torch::equal(got.tokens, torch::div(order, k, "floor"))) << k;
    EXPECT_LE(MaxAbsDiff(got.weights, want_w.index_select(0, order)), 1e-6) << k;
    const torch::Tensor counts = torch::bincount(sorted, {}, e);
    EXPECT_EQ(got.counts,
              std::vector<int64_t>(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + e))
        << k;
    EXPECT_EQ(got.counts[2], 0) << k;
    // Each token's places in the sorted order, ascending: the inverse of the sort, per token.
    std::vector<int64_t> places(n * k);
    for (int64_t at = 0; at < n * k; ++at) places[order[at].item<int64_t>()] = at;
    for (int64_t t = 0; t < n; ++t) std::sort(places.begin() + t * k, places.begin() + (t + 1) * k);
    EXPECT_EQ(got.places, places) << k;
    EXPECT_EQ(got.top_k, k);
  }
  // Ties go to the lower expert.
  const cpu::ExpertRoutes tied =
      cpu::RouteTopK(torch::full({1, e}, 0.5), torch::zeros({e}), 2, 1.0);
  EXPECT_EQ(tied.counts, (std::vector<int64_t>{1, 1, 0, 0, 0, 0}));
  // A NaN logit ranks first, as in torch::topk; every token still gets top_k distinct experts.
  torch::Tensor nan_logits = torch::zeros({1, e});
  nan_logits[0][4] = std::numeric_limits<float>::quiet_NaN();
  const cpu::ExpertRoutes nan = cpu::RouteTopK(nan_logits, torch::zeros({e}), 2, 1.0);
  EXPECT_EQ(nan.counts, (std::vector<int64_t>{1, 0, 0, 0, 1, 0}));
  EXPECT_THROW(cpu::RouteTopK(logits, bias, e + 1, 1.0), c10::Error);
  EXPECT_THROW(cpu::RouteTopK(logits.to(torch::kBFloat16), bias, 1, 1.0), c10::Error);
}

TEST(CpuKernelsTest, GateHeadsEqualsTransposeTimesSigmoidInEveryDtype) {
  torch::manual_seed(4);
  const int64_t b = 2, h = 3, t = 11, hd = 16;
  for (auto dt : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    // o as the flash kernel returns it ([B, T, H, hd] in memory, seen as [B, H, T, hd]) and as
    // the tile groups fill it (contiguous [B, H, T, hd]); the gate a strided slice.
    const torch::Tensor o_bthd = torch::randn({b, t, h, hd}).to(dt).transpose(1, 2);
    const torch::Tensor o_bhtd = o_bthd.contiguous();
    const torch::Tensor packed = (4 * torch::randn({b, t, h + 7})).to(dt);
    const torch::Tensor gate = packed.narrow(2, 7, h);
    // The gate's bias, float32 per head, added to the logits (the projection ran without it).
    const torch::Tensor bias = 2 * torch::randn({h});
    for (const torch::Tensor& o : {o_bthd, o_bhtd}) {
      for (bool biased : {false, true}) {
        const torch::Tensor logits = gate.to(torch::kFloat32) + (biased ? bias : torch::zeros({h}));
        const torch::Tensor want =
            (o.to(torch::kFloat32).transpose(1, 2) * torch::sigmoid(logits).unsqueeze(-1))
                .reshape({b, t, h * hd});
        const torch::Tensor got = biased ? cpu::GateHeads(o, gate, bias) : cpu::GateHeads(o, gate);
        EXPECT_EQ(got.scalar_type(), dt);
        EXPECT_TRUE(got.is_contiguous());
        EXPECT_EQ(got.sizes(), want.sizes());
        // float32: an ulp or two of the product; bf16/fp16: one rounding of the result.
        const double rel = dt == torch::kFloat32 ? 1e-6 : (dt == torch::kBFloat16 ? 8e-3 : 1e-3);
        EXPECT_LE(((got.to(torch::kFloat32) - want).abs() - rel * want.abs()).max().item<double>(),
                  1e-7)
            << dt << " biased " << biased;
      }
    }
  }
  EXPECT_THROW(cpu::GateHeads(torch::randn({1, 2, 3, 4}), torch::randn({1, 3, 2}),
                              torch::randn({2}, torch::kBFloat16)),
               c10::Error);
  EXPECT_THROW(
      cpu::GateHeads(torch::randn({1, 2, 3, 4}), torch::randn({1, 3, 2}), torch::randn({3})),
      c10::Error);
  EXPECT_THROW(cpu::GateHeads(torch::randn({1, 2, 3, 4}), torch::randn({1, 3, 3})), c10::Error);
  EXPECT_THROW(
      cpu::GateHeads(torch::randn({1, 2, 3, 4}), torch::randn({1, 3, 2}, torch::kBFloat16)),
      c10::Error);
}

TEST(CpuKernelsTest, ModulateEqualsShiftPlusXTimesScaleInFloat32) {
  torch::manual_seed(5);
  const int64_t b = 2, kf = 2, h = 3, w = 4, ph = 2, pw = 2, dim = 24, regs = 3;
  for (auto dt : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    // The decoder's case: the fine-grid tokens of x [B, regs + tokens, dim] (a strided view) seen
    // on the coarse grid, and a shift and scale per coarse token broadcast over each patch.
    const torch::Tensor whole = torch::randn({b, regs + kf * h * ph * w * pw, dim}).to(dt);
    const torch::Tensor fine =
        whole.narrow(1, regs, kf * h * ph * w * pw).reshape({b, kf, h, ph, w, pw, dim});
    const torch::Tensor shift = torch::randn({b, kf, h, 1, w, 1, dim});
    const torch::Tensor scale = 1 + torch::randn({b, kf, h, 1, w, 1, dim});
    // The encoder's: one shift and scale per chunk, and a last-dim-strided x (made contiguous).
    const torch::Tensor chunks = torch::randn({b, kf, 5, 2 * dim}).to(dt).narrow(3, 0, dim);
    const torch::Tensor per_chunk = torch::randn({b, kf, 1, dim});
    const torch::Tensor transposed = torch::randn({b, dim, 7}).to(dt).transpose(1, 2);
    const torch::Tensor per_batch = torch::randn({b, 1, dim});
    const std::vector<std::array<torch::Tensor, 3>> cases = {{fine, shift, scale},
                                                             {chunks, per_chunk, 1 + per_chunk},
                                                             {transposed, per_batch, per_batch}};
    for (const auto& [x, sh, sc] : cases) {
      const torch::Tensor want = x.to(torch::kFloat32) * sc + sh;
      const torch::Tensor got = cpu::Modulate(x, sh, sc);
      EXPECT_EQ(got.scalar_type(), dt);
      EXPECT_TRUE(got.is_contiguous());
      EXPECT_EQ(got.sizes(), x.sizes());
      // float32: an ulp of the sum (a fused multiply-add may round once); others: one rounding.
      const double rel = dt == torch::kFloat32 ? 3e-7 : (dt == torch::kBFloat16 ? 4e-3 : 5e-4);
      EXPECT_LE(((got.to(torch::kFloat32) - want).abs() - rel * want.abs()).max().item<double>(),
                1e-6)
          << dt << " " << x.sizes();
      // Into a sequence's slice (x's sizes, rows apart by the sequence's stride): the same values
      // there, and the tokens around it untouched.
      const int64_t tokens = x.numel() / dim;
      torch::Tensor seq = torch::full({tokens + 2 * regs, dim}, 7.0).to(dt);
      const torch::Tensor slot = seq.narrow(0, regs, tokens).view(x.sizes());
      const torch::Tensor into = cpu::Modulate(x, sh, sc, slot);
      EXPECT_EQ(into.data_ptr(), slot.data_ptr());
      EXPECT_TRUE(torch::equal(slot, got)) << dt << " " << x.sizes();
      EXPECT_TRUE(torch::equal(seq.narrow(0, 0, regs), torch::full({regs, dim}, 7.0).to(dt)));
      EXPECT_TRUE(
          torch::equal(seq.narrow(0, regs + tokens, regs), torch::full({regs, dim}, 7.0).to(dt)));
    }
  }
  // out must be x's sizes and dtype with unit-stride rows.
  const torch::Tensor x8 = torch::randn({2, 8}), s8 = torch::randn({8});
  EXPECT_THROW(cpu::Modulate(x8, s8, s8, torch::empty({2, 9})), c10::Error);
  EXPECT_THROW(cpu::Modulate(x8, s8, s8, torch::empty({2, 8}, torch::kBFloat16)), c10::Error);
  EXPECT_THROW(cpu::Modulate(x8, s8, s8, torch::empty({8, 2}).t()), c10::Error);
  // The last dimension is never broadcast, and shift and scale are float32.
  EXPECT_THROW(cpu::Modulate(torch::randn({2, 8}), torch::randn({2, 1}), torch::randn({2, 8})),
               c10::Error);
  EXPECT_THROW(
      cpu::Modulate(torch::randn({2, 8}), torch::randn({8}, torch::kBFloat16), torch::randn({8})),
      c10::Error);
}

TEST(CpuKernelsTest, TimeModulationPiecesEqualTheirAtenOps) {
  torch::manual_seed(6);
  // Flow times of every dtype and a strided view; features in every projection dtype.
  const torch::Tensor freqs = torch::randn({24}) * 3, phases = torch::rand({24});
  const torch::Tensor times = torch::rand({2, 6}).narrow(1, 1, 3);
  for (auto t_dt : {torch::kFloat32, torch::kBFloat16}) {
    const torch::Tensor t = times.to(t_dt);
    const torch::Tensor want =
        0.5 *
        torch::cos(2.0 * std::numbers::pi * (t.to(torch::kFloat32).unsqueeze(-1) * freqs + phases));
    for (auto dt : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
      const torch::Tensor got = cpu::FourierFeatures(t, freqs, phases, dt);
      EXPECT_EQ(got.scalar_type(), dt);
      EXPECT_EQ(got.sizes(), (std::vector<int64_t>{2, 3, 24}));
      // float32: std::cos against ATen's vectorised cos (a few ulps of the angle's cosine); others:
      // that, rounded once.
      const double tol = dt == torch::kFloat32 ? 2e-6 : (dt == torch::kBFloat16 ? 2e-3 : 3e-4);
      EXPECT_LE((got.to(torch::kFloat32) - want).abs().max().item<double>(), tol) << dt;
    }
  }
  // The halves of a projection's output: exactly the split, converted, plus one.
  for (auto dt : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    const torch::Tensor mod = torch::randn({2, 3, 2 * 16}).to(dt);
    const auto [shift, scale] = cpu::ShiftAndScale(mod);
    const auto parts = mod.split(16, -1);
    EXPECT_TRUE(torch::equal(shift, parts[0].to(torch::kFloat32))) << dt;
    EXPECT_TRUE(torch::equal(scale, 1.0 + parts[1].to(torch::kFloat32))) << dt;
    EXPECT_EQ(shift.sizes(), (std::vector<int64_t>{2, 3, 16}));
  }
  EXPECT_THROW(cpu::ShiftAndScale(torch::randn({2, 7})), c10::Error);
  EXPECT_THROW(cpu::FourierFeatures(times, freqs, phases.narrow(0, 0, 5), torch::kFloat32),
               c10::Error);
}

// An encoder layout's CPU plan (float32 unless `dtype`) on a block size small enough that it has
// several groups (at a head dim above TileAttentionMaxHeadDim; TileAttention's tiles at or below
// it).
AttentionPlan Plan(const WindowLayout& layout, int64_t block, int64_t head_dim, MaskRule* rule_out,
                   int64_t* length, torch::ScalarType dtype = torch::kFloat32) {
  const MaskKey key = EncoderMaskKey(layout, block);
  TokenTags tags = *WindowTags(key.slots, key.chunk_size);
  const MaskRule rule = ChunkCausalRule(tags);
  const BlockMask mask = *BuildBlockMask(rule, tags, tags, block);
  *rule_out = rule;
  *length = tags.length();
  return BuildAttentionPlan(mask, rule, tags, tags, torch::kCPU, dtype, head_dim);
}

TEST(AttentionPlanTest, DenseCallAndTileGroupsBothEqualDenseSdpaWithSharedKvHeads) {
  torch::manual_seed(2);
  const WindowLayout layout{
      .registers = 2, .anchor_h = 2, .anchor_w = 3, .text_len = 5, .k = 3, .f = 2, .h = 2, .w = 3};
  MaskRule rule;
  int64_t t = 0;
  const AttentionPlan plan = Plan(layout, 8, 80, &rule, &t);
  ASSERT_TRUE(plan.dense_bias.defined()) << "a short layout keeps its dense bias";
  ASSERT_TRUE(plan.tiles.first.empty()) << "no TileAttention tiles above its head dims";
  ASSERT_GT(plan.groups.size(), 1u);
  // Head dim 80: there the CPU runs LibTorch's flash kernel, by groups or as one dense call
  // (TileAttention takes the small head dims; TileAttentionTest).
  ASSERT_GT(80, TileAttentionMaxHeadDim(torch::kFloat32));
  // bf16 never leaves to LibTorch's kernel a head that float32 keeps: without AMX that kernel's
  // bf16 products are no faster than our float32 FMAs, or slower (docs/benchmarks.md, stop 26).
  EXPECT_GE(TileAttentionMaxHeadDim(torch::kBFloat16), TileAttentionMaxHeadDim(torch::kFloat32));
  const torch::Tensor q = torch::randn({2, 4, t, 80});
  const torch::Tensor k = torch::randn({2, 2, t, 80});  // two query heads per kv head
  const torch::Tensor v = torch::randn({2, 2, t, 80});
  const torch::Tensor all = torch::arange(t, torch::kInt64);
  const torch::Tensor want =
      DenseAttention(q, ExpandKvHeads(k, 4), ExpandKvHeads(v, 4), rule(all, all), 0.25);
  AttentionPlan groups_only = plan;
  groups_only.dense_bias = torch::Tensor();
  EXPECT_LE(MaxAbsDiff(SparseAttention(q, k, v, groups_only, 0.25), want), 1e-5);
  AttentionPlan dense_only = plan;
  dense_only.group_pairs = t * t;  // makes the dense call the cheaper one at any batch
  ASSERT_TRUE(dense_only.UseDense(2));
  EXPECT_LE(MaxAbsDiff(SparseAttention(q, k, v, dense_only, 0.25), want), 1e-5);
}

// TileAttention's tiles are cut from the exact rectangles of allowed pairs: query tiles of at
// most 32 rows (float32 FMAs) or 64 (the bf16 brgemm) covering every row once, each holding only
// keys all its rows attend, every allowed pair in exactly one segment of its row's tile, a
// segment's mask (one row its tile's rows share) where it covers a key not attended or its lane
// padding, segments starting at even keys.
class TileSegmentsTest : public ::testing::TestWithParam<torch::ScalarType> {};

TEST_P(TileSegmentsTest, HoldExactlyTheAllowedPairsOfTheirRows) {
  const WindowLayout layout{.registers = 4,
                            .anchor_h = 6,
                            .anchor_w = 8,
                            .text_len = 31,  // odd: key runs that start at odd tokens
                            .k = 2,
                            .f = 1,
                            .h = 6,
                            .w = 8};  // the benchmarks' small layout, but for the text
  MaskRule rule;
  int64_t t = 0;
  const AttentionPlan plan = Plan(layout, 128, 64, &rule, &t, GetParam());
  const cpu::AttentionTiles& tiles = plan.tiles;
  const bool brgemm = GetParam() == torch::kBFloat16 && cpu::HasBf16Brgemm();
  const int64_t most = brgemm ? 64 : 32;
  ASSERT_LE(tiles.block, most);
  ASSERT_EQ(tiles.rows.size(), tiles.first.size());
  ASSERT_EQ(tiles.rows.front(), 0);
  ASSERT_EQ(tiles.rows.back(), t);
  const torch::Tensor all = torch::arange(t, torch::kInt64);
  const torch::Tensor allowed = rule(all, all).to(torch::kUInt8).contiguous();
  const uint8_t* a = allowed.data_ptr<uint8_t>();
  std::vector<int> covered(t * t, 0);
  int64_t computed = 0;
  for (int64_t i = 0; i + 1 < static_cast<int64_t>(tiles.first.size()); ++i) {
    const int64_t r0 = tiles.rows[i], rows = tiles.rows[i + 1] - r0;
    ASSERT_GT(rows, 0) << "tile " << i;
    ASSERT_LE(rows, tiles.block) << "tile " << i;
    for (int64_t e = tiles.first[i]; e < tiles.first[i + 1]; ++e) {
      const cpu::AttentionTiles::Segment& seg = tiles.segments[e];
      const int64_t row = cpu::AttentionTiles::MaskRow(seg.length);
      computed += rows * row;
      ASSERT_EQ(seg.start % 2, 0) << "tile " << i;
      ASSERT_LE(seg.length, cpu::AttentionTiles::kMaxSegmentTokens);
      bool unattended = row != seg.length;
      for (int64_t c = 0; c < seg.length; ++c) {
        unattended = unattended || a[r0 * t + seg.start + c] == 0;
      }
      ASSERT_EQ(seg.mask_at >= 0, unattended)
          << "tile " << i << ": a mask exactly where a key or the padding is not attended";
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < seg.length; ++c) {
          const uint8_t want = a[(r0 + r) * t + seg.start + c];
          const uint8_t got = seg.mask_at < 0 ? 1 : tiles.masks[seg.mask_at + c];
          ASSERT_EQ(got, want) << "tile " << i << " row " << r << " key " << seg.start + c;
          covered[(r0 + r) * t + seg.start + c] += got;
        }
      }
    }
  }
  for (int64_t x = 0; x < t * t; ++x)
    ASSERT_EQ(covered[x], a[x]) << "pair " << x / t << ", " << x % t;
  // 32- or 64-row tiles of the 16-key groups their rows attend computed 78-80 % allowed pairs at
  // the small layout (stop 51), the mask's own 128-token tiles 52 %; these only lose the padding.
  EXPECT_GE(static_cast<double>(allowed.sum().item<int64_t>()) / computed, 0.85);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TileSegmentsTest,
                         ::testing::Values(torch::kFloat32, torch::kBFloat16));

// softmax(q·kᵀ·scale)·v in float64 over the allowed pairs of `allowed` [T, T] (bool); a row with
// none is 0. q [B, H, T, hd], k, v [B, kvH, T, hd].
torch::Tensor MaskedAttentionOracle(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, const torch::Tensor& allowed,
                                    double scale) {
  const int64_t heads = q.size(1);
  const torch::Tensor kd = ExpandKvHeads(k, heads).to(torch::kFloat64);
  const torch::Tensor s = torch::matmul(q.to(torch::kFloat64), kd.transpose(-1, -2)) * scale;
  const torch::Tensor p = torch::softmax(s.masked_fill(allowed.logical_not(), -INFINITY), -1);
  return torch::matmul(p.nan_to_num(0.0), ExpandKvHeads(v, heads).to(torch::kFloat64));
}

TEST(TileAttentionTest, EqualsTheMaskedSoftmaxInEveryDtypeHeadDimAndTileShape) {
  torch::manual_seed(4);
  // Tiles follow the tag runs: short ones (of 13 and 6 rows), and runs of 79 and 35 rows, cut
  // into several tiles, their keys starting at odd tokens.
  const WindowLayout short_runs{
      .registers = 2, .anchor_h = 2, .anchor_w = 3, .text_len = 5, .k = 3, .f = 2, .h = 2, .w = 3};
  const WindowLayout long_runs{
      .registers = 2, .anchor_h = 2, .anchor_w = 3, .text_len = 71, .k = 2, .f = 1, .h = 5, .w = 7};
  for (const WindowLayout& layout : {short_runs, long_runs}) {
    const int64_t block = 8;  // the BlockMask's, which TileAttention's tiles do not follow
    MaskRule rule;
    int64_t t = 0;
    // The tiles do not depend on the head dim: one plan per dtype serves every hd below (bf16's
    // tiles taller where it takes the brgemm; every kernel runs any tiles).
    const AttentionPlan plan = Plan(layout, block, 16, &rule, &t);
    const AttentionPlan bf16_plan = Plan(layout, block, 16, &rule, &t, torch::kBFloat16);
    ASSERT_FALSE(plan.tiles.first.empty());
    EXPECT_TRUE(plan.groups.empty() && !plan.dense_bias.defined()) << "nothing else built";
    const torch::Tensor all = torch::arange(t, torch::kInt64);
    const torch::Tensor allowed = rule(all, all);
    for (int64_t hd : {16, 24, 40, 64}) {  // 40: a bf16 product depth that is not a multiple of 32
      // q as attention gets it from a projection: a transposed view with unit last stride.
      const torch::Tensor q = torch::randn({2, t, 4, hd}).transpose(1, 2);
      const torch::Tensor k = torch::randn({2, 2, t, hd});  // two query heads per kv head
      const torch::Tensor v = torch::randn({2, 2, t, hd});
      // Gate logits as attention gets them: a strided slice of the stacked projection.
      const torch::Tensor gate = (4 * torch::randn({2, t, 4 + 3})).narrow(2, 3, 4);
      const torch::Tensor gate_bias = 3 * torch::randn({4});
      const torch::Tensor want = MaskedAttentionOracle(q, k, v, allowed, 0.3);
      for (auto dt : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
        const double tol = dt == torch::kFloat32 ? 1e-5 : dt == torch::kHalf ? 5e-3 : 3e-2;
        const torch::Tensor qd = q.to(dt), kd = k.to(dt), vd = v.to(dt);
        const torch::Tensor want_d = MaskedAttentionOracle(qd, kd, vd, allowed, 0.3);
        const cpu::AttentionTiles& tiles = (dt == torch::kBFloat16 ? bf16_plan : plan).tiles;
        std::map<cpu::AttentionIsa, torch::Tensor> got;
        for (auto isa :
             {cpu::AttentionIsa::kBest, cpu::AttentionIsa::kAvx512, cpu::AttentionIsa::kPortable}) {
          got[isa] = cpu::TileAttention(qd, kd, vd, tiles, 0.3, isa);
          ASSERT_EQ(got[isa].scalar_type(), dt);
          EXPECT_LE(MaxAbsDiff(got[isa], dt == torch::kFloat32 ? want : want_d), tol)
              << "t " << t << " hd " << hd << " " << dt << " isa " << int(isa);
          // Gated as it is stored: GateHeads of the same output (16-bit: one rounding apart).
          const torch::Tensor gated = cpu::TileAttention(qd, kd, vd, tiles, 0.3, isa, gate.to(dt));
          EXPECT_LE(MaxAbsDiff(gated, cpu::GateHeads(got[isa], gate.to(dt))),
                    dt == torch::kFloat32 ? 1e-6 : 2e-2)
              << "gated: t " << t << " hd " << hd << " " << dt << " isa " << int(isa);
          // With the gate's bias, as attention passes it where the projection ran without it.
          const torch::Tensor biased =
              cpu::TileAttention(qd, kd, vd, tiles, 0.3, isa, gate.to(dt), gate_bias);
          EXPECT_LE(MaxAbsDiff(biased, cpu::GateHeads(got[isa], gate.to(dt), gate_bias)),
                    dt == torch::kFloat32 ? 1e-6 : 2e-2)
              << "biased: t " << t << " hd " << hd << " " << dt << " isa " << int(isa);
        }
        if (dt == torch::kBFloat16 && hd >= cpu::kBf16BrgemmMinHeadDim && cpu::HasBf16Brgemm()) {
          // The bf16 brgemm rounds p to bf16: its output differs from the float32 FMAs'.
          EXPECT_FALSE(torch::equal(got[cpu::AttentionIsa::kBest], got[cpu::AttentionIsa::kAvx512]))
              << "bf16 took the bf16 brgemm";
        }
      }
    }
  }
}

TEST(TileAttentionTest, LaterSegmentsFarAboveTheRowsMaxSoFar) {
  // One query tile of 8 rows over 600 keys in three segments (the last masked past its 88 keys),
  // the later segments' scores tens of nats above the first's: a softmax that runs later segments
  // against the row's max so far must notice and take theirs. The first segment's first 16 keys
  // score far below its others: a first segment run against their max must notice too.
  torch::manual_seed(8);
  const int64_t t = 8, keys = 600, hd = 64;
  cpu::AttentionTiles tiles;
  tiles.block = t;
  tiles.q_len = t;
  tiles.kv_len = keys;
  tiles.masks.assign(cpu::AttentionTiles::MaskRow(88), 0);
  std::fill_n(tiles.masks.begin(), 88, 1);
  tiles.segments = {{.start = 0, .length = 256},
                    {.start = 256, .length = 256},
                    {.start = 512, .length = 88, .mask_at = 0}};
  tiles.rows = {0, t};
  tiles.first = {0, 3};
  const torch::Tensor q = torch::randn({1, 2, t, hd});
  torch::Tensor k = torch::randn({1, 1, keys, hd});
  // Scores with std ~1 nat at scale 1: ~100 nats up over the first 16 (e^that overflows float32),
  // the second segment far below, the third ~100 nats above the first's.
  k.narrow(2, 0, 16).mul_(0.1);
  k.narrow(2, 16, 240).mul_(40);
  k.narrow(2, 512, 88).mul_(80);
  const torch::Tensor v = torch::randn({1, 1, keys, hd});
  const torch::Tensor allowed = torch::ones({t, keys}, torch::kBool);
  for (auto dt : {torch::kFloat32, torch::kBFloat16}) {
    const torch::Tensor qd = q.to(dt), kd = k.to(dt), vd = v.to(dt);
    const torch::Tensor want = MaskedAttentionOracle(qd, kd, vd, allowed, 0.125);
    // k and v also as views whose last stride is not 1 (only q's must be).
    const torch::Tensor kt = kd.transpose(2, 3).contiguous().transpose(2, 3);
    const torch::Tensor vt = vd.transpose(2, 3).contiguous().transpose(2, 3);
    // v as the model passes it: rows of a wider projection (read in place in float32).
    const torch::Tensor wide = torch::randn({1, keys, hd + 40}).to(dt);
    wide.narrow(2, 24, hd).copy_(vd[0][0]);
    const torch::Tensor vrows = wide.narrow(2, 24, hd).unsqueeze(1);
    for (auto isa :
         {cpu::AttentionIsa::kBest, cpu::AttentionIsa::kAvx512, cpu::AttentionIsa::kPortable}) {
      const double tol = dt == torch::kFloat32 ? 1e-5 : 3e-2;
      EXPECT_LE(MaxAbsDiff(cpu::TileAttention(qd, kd, vd, tiles, 0.125, isa), want), tol)
          << int(isa) << dt;
      EXPECT_LE(MaxAbsDiff(cpu::TileAttention(qd, kt, vt, tiles, 0.125, isa), want), tol)
          << int(isa) << dt << " strided k, v";
      EXPECT_LE(MaxAbsDiff(cpu::TileAttention(qd, kd, vrows, tiles, 0.125, isa), want), tol)
          << int(isa) << dt << " v rows of a wider tensor";
    }
  }
}

TEST(TileAttentionTest, RowsWithNoAllowedKeyAndTilesWithNoSegmentAreZero) {
  // Hand-made tiles over 20 tokens: tile 0 (rows 0-7) one segment of every key under a mask
  // that allows some, tile 1 (rows 8-11) the same segment under a mask that allows none, tile 2
  // (rows 12-15) no segment at all, tile 3 (rows 16-19) a full segment [0, 16).
  torch::manual_seed(6);
  const int64_t t = 20;
  cpu::AttentionTiles tiles;
  tiles.block = 8;
  tiles.q_len = tiles.kv_len = t;
  const int64_t row = cpu::AttentionTiles::MaskRow(t);
  const torch::Tensor some = torch::rand({t}) > 0.5;
  torch::Tensor allowed = torch::zeros({t, t}, torch::kBool);
  allowed.narrow(0, 0, 8).copy_(some.expand({8, t}));
  allowed.narrow(0, 16, 4).narrow(1, 0, 16).fill_(true);
  tiles.masks.assign(2 * row, 0);
  for (int64_t c = 0; c < t; ++c) tiles.masks[c] = some[c].item<bool>();
  tiles.segments = {{.start = 0, .length = t, .mask_at = 0},
                    {.start = 0, .length = t, .mask_at = row},
                    {.start = 0, .length = 16}};
  tiles.rows = {0, 8, 12, 16, 20};
  tiles.first = {0, 1, 2, 2, 3};
  // Head dim 64: wide enough for the bf16 brgemm.
  const torch::Tensor q = torch::randn({1, 2, t, 64}), k = torch::randn({1, 1, t, 64}),
                      v = torch::randn({1, 1, t, 64});
  const torch::Tensor want = MaskedAttentionOracle(q, k, v, allowed, 0.25);
  for (auto dt : {torch::kFloat32, torch::kBFloat16}) {  // bf16: the bf16 brgemm where present
    const torch::Tensor qd = q.to(dt), kd = k.to(dt), vd = v.to(dt);
    const torch::Tensor want_d =
        dt == torch::kFloat32 ? want : MaskedAttentionOracle(qd, kd, vd, allowed, 0.25);
    for (auto isa :
         {cpu::AttentionIsa::kBest, cpu::AttentionIsa::kAvx512, cpu::AttentionIsa::kPortable}) {
      const torch::Tensor got = cpu::TileAttention(qd, kd, vd, tiles, 0.25, isa);
      EXPECT_LE(MaxAbsDiff(got, want_d), dt == torch::kFloat32 ? 1e-5 : 3e-2) << int(isa) << dt;
      EXPECT_EQ(got.narrow(2, 8, 8).abs().max().item<float>(), 0.0f);
    }
  }
  EXPECT_THROW(cpu::TileAttention(q.narrow(2, 0, 16), k, v, tiles, 0.25), c10::Error)
      << "tiles of another layout";
  cpu::AttentionTiles unordered = tiles;
  unordered.rows = {0, 12, 8, 16, 20};
  EXPECT_THROW(cpu::TileAttention(q, k, v, unordered, 0.25), c10::Error) << "rows out of order";
  cpu::AttentionTiles longer = tiles;
  longer.block = 4;
  EXPECT_THROW(cpu::TileAttention(q, k, v, longer, 0.25), c10::Error) << "a tile past its block";
  EXPECT_THROW(
      cpu::TileAttention(q, k, v, tiles, 0.25, cpu::AttentionIsa::kBest, torch::randn({1, t, 3})),
      c10::Error)
      << "a gate of other heads";
}

TEST(CpuRuntimeTest, IntraOpThreadsAreRaisedOnTheCallingThreadOnly) {
  DefaultToOneIntraOpThread();
  int worker = 0, other = 0;
  std::thread([&] {
    SetIntraOpThreadsOfThisThread(2);
    // The first parallel loop of a fused kernel (our binary's copy of ATen's lazy set-up) must
    // not reset it to the process default: it once did, and served steps ran on one core.
    (void)cpu::RmsNorm(torch::randn({64, 512}), torch::ones({512}), 1e-6);
    worker = at::get_num_threads();
  }).join();
  std::thread([&] { other = at::get_num_threads(); }).join();
  EXPECT_EQ(worker, 2);
  EXPECT_EQ(other, 1);
  EXPECT_EQ(at::get_num_threads(), 1);
}

// Runs `chooser` for `runs` runs of one unit of cost each, a run at n threads taking
// ms_per_run(n) milliseconds; returns how many ran at one thread.
int RunsAtOneThread(IntraOpThreadChooser& chooser, int runs,
                    const std::function<double(int)>& ms_per_run) {
  int at_one = 0;
  for (int i = 0; i < runs; ++i) {
    const int n = chooser.Next();
    at_one += n == 1;
    chooser.Record(1.0, absl::Milliseconds(ms_per_run(n)));
  }
  return at_one;
}

TEST(CpuRuntimeTest, ThreadChooserKeepsTheTeamWhereItIsFasterAndProbesLessAndLess) {
  IntraOpThreadChooser chooser(2, absl::Seconds(2));
  EXPECT_EQ(chooser.count(), 2);
  // Quiet cores: 2 threads 10 ms a run, 1 thread 16 ms. 20 000 runs = 200 s of model time, 100
  // windows of 2 s; after losing probes at windows 1, 3, 7 and 15, one per 8 windows.
  const int at_one = RunsAtOneThread(chooser, 20000, [](int n) { return n == 2 ? 10.0 : 16.0; });
  EXPECT_EQ(chooser.switches(), 0);
  EXPECT_GE(chooser.probes(), 12);
  EXPECT_LE(chooser.probes(), 16) << "probes that lose should back off";
  // A probe runs for 1/40 of a window (50 ms): 4 runs of 16 ms.
  EXPECT_LE(at_one, 4 * chooser.probes());
  EXPECT_EQ(chooser.count(), 2);
}

TEST(CpuRuntimeTest, ThreadChooserTakesOneThreadUnderABusyNeighbourAndComesBack) {
  IntraOpThreadChooser chooser(2, absl::Seconds(2));
  bool busy = false;
  // As measured with a busy process on one of two cores: the team 10x slower than one thread.
  const auto ms = [&](int n) { return busy ? (n == 2 ? 660.0 : 66.0) : (n == 2 ? 30.0 : 52.0); };
  RunsAtOneThread(chooser, 1000, ms);  // quiet, 30 s: settles on 2, its probes backed off
  EXPECT_EQ(chooser.switches(), 0);
  EXPECT_EQ(chooser.count(), 2);
  busy = true;
  // The first window wholly after the neighbour started runs at a tenth of the one before: the
  // chooser probes then (at most 2 windows of 4 runs, and the probe), not after its backed-off
  // wait (8 windows, 32 runs), and takes one thread.
  int runs = 0;
  for (; chooser.switches() == 0 && runs < 40; ++runs) RunsAtOneThread(chooser, 1, ms);
  EXPECT_LE(runs, 9);
  EXPECT_EQ(chooser.switches(), 1);
  const int at_one = RunsAtOneThread(chooser, 1000, ms);  // 66 s
  EXPECT_GE(at_one, 990) << "the team is tried again now and then, not kept";
  EXPECT_EQ(chooser.switches(), 1);
  busy = false;
  RunsAtOneThread(chooser, 1000, ms);
  EXPECT_EQ(chooser.count(), 2) << "the neighbour gone, a later probe takes the team back";
  EXPECT_EQ(chooser.switches(), 2);
}

TEST(CpuRuntimeTest, ThreadChooserStepsDownOneThreadPastABusyCoreOfMany) {
  IntraOpThreadChooser chooser(4, absl::Seconds(2));
  bool busy = false;
  // 4 cores: a run of n threads takes 40/n ms; with a busy process on one core, a team of 4
  // stalls at its barriers (100 ms) while 3 or fewer run on the free cores.
  const auto ms = [&](int n) { return busy && n == 4 ? 100.0 : 40.0 / n; };
  RunsAtOneThread(chooser, 3000, ms);
  EXPECT_EQ(chooser.count(), 4);
  EXPECT_EQ(chooser.switches(), 0);
  busy = true;
  RunsAtOneThread(chooser, 3000, ms);
  EXPECT_EQ(chooser.count(), 3) << "one thread fewer, not one thread";
  EXPECT_EQ(chooser.switches(), 1);
  busy = false;
  RunsAtOneThread(chooser, 6000, ms);
  EXPECT_EQ(chooser.count(), 4);
  EXPECT_EQ(chooser.switches(), 2);
}

// LibTorch's brgemm takes VNNI-packed bf16 wherever the CPU has bf16 dot products, AMX or not (its
// could_pack() says no on Zen 4): the probe behind HasBf16Brgemm must find it on every such CPU,
// or bf16 attention silently drops to float32 FMAs (1.7x slower at the bench layout on Zen 4).
TEST(CpuRuntimeTest, Bf16BrgemmWhereverTheCpuHasBf16DotProducts) {
  if (std::getenv("PRAXIS_BF16_BRGEMM") != nullptr) GTEST_SKIP() << "PRAXIS_BF16_BRGEMM is set";
  const CpuIsa isa = DetectCpuIsa();
  EXPECT_EQ(cpu::HasBf16Brgemm(), isa.avx512f && isa.avx512_bf16) << isa.model;
  EXPECT_EQ(isa.bf16_brgemm, cpu::HasBf16Brgemm());
}

TEST(CpuRuntimeTest, ReducedPrecisionWithoutItsUnitsIsCalledSlow) {
  bool slow = false;
  const CpuIsa bare{.model = "Old CPU", .avx512f = true};
  EXPECT_FALSE(HasUnitsFor(bare, torch::kBFloat16));
  EXPECT_NE(
      DescribeCpuForDtype(bare, torch::kBFloat16, 0, Float32Path::kMatmuls, &slow).find("emulated"),
      std::string::npos);
  EXPECT_TRUE(slow);
  DescribeCpuForDtype(bare, torch::kFloat16, 0, Float32Path::kNone, &slow);
  EXPECT_TRUE(slow);
  // Computed in float32 end to end, the emulated dtype costs nothing: not slow, and said so.
  const std::string converted =
      DescribeCpuForDtype(bare, torch::kBFloat16, 0, Float32Path::kModel, &slow);
  EXPECT_FALSE(slow) << converted;
  EXPECT_NE(converted.find("no hardware path here: the model is computed in float32 (its "
                           "bfloat16 weights converted at load)"),
            std::string::npos)
      << converted;
  EXPECT_NE(DescribeCpuForDtype(bare, torch::kFloat32, 1, Float32Path::kNone, &slow)
                .find("Old CPU [AVX-512]"),
            std::string::npos);
  EXPECT_FALSE(slow);
  CpuIsa zen4{.model = "AMD EPYC", .avx512f = true, .avx512_bf16 = true, .bf16_brgemm = true};
  EXPECT_TRUE(HasUnitsFor(zen4, torch::kBFloat16));
  const std::string zen4_bf16 =
      DescribeCpuForDtype(zen4, torch::kBFloat16, 2.7, Float32Path::kNone, &slow);
  EXPECT_NE(zen4_bf16.find("matmuls run on AVX512-BF16 (measured 2.70x float32's rate), "
                           "attention too at head dims from 16"),
            std::string::npos)
      << zen4_bf16;
  EXPECT_FALSE(slow);
  EXPECT_NE(zen4_bf16.find("; its Linears and SwiGLU layers on oneDNN's brgemm"), std::string::npos)
      << zen4_bf16;
  zen4.bf16_brgemm = false;  // a LibTorch whose brgemm takes no bf16
  EXPECT_NE(DescribeCpuForDtype(zen4, torch::kBFloat16, 2.7, Float32Path::kNone, &slow)
                .find("; attention runs float32 FMAs here"),
            std::string::npos);
  EXPECT_EQ(DescribeCpuForDtype(zen4, torch::kBFloat16, 2.7, Float32Path::kNone, &slow)
                .find("oneDNN's brgemm"),
            std::string::npos);  // its Linears and SwiGLU layers on LibTorch's GEMM
  zen4.float32_brgemm = true;
  EXPECT_NE(DescribeCpuForDtype(zen4, torch::kFloat32, 1, Float32Path::kNone, &slow)
                .find("float32, its Linears and SwiGLU layers on oneDNN's brgemm"),
            std::string::npos);
  const CpuIsa spr{
      .model = "Xeon", .avx512f = true, .avx512_bf16 = true, .amx_bf16 = true, .bf16_brgemm = true};
  EXPECT_NE(DescribeCpuForDtype(spr, torch::kBFloat16, 0, Float32Path::kNone, &slow)
                .find("matmuls run on AMX tiles, attention too"),
            std::string::npos);
  EXPECT_FALSE(slow);
}

// The same units can be the slow choice: a Xeon whose AMX is not enabled keeps AVX512-BF16, where
// LibTorch's bf16 matmuls measured 0.48-0.58x its float32 ones. The line says what was measured
// and where the work runs, and calls it slow only where the matmuls still run in that dtype.
TEST(CpuRuntimeTest, ReducedMatmulsMeasuredSlowerRunOnTheFloat32Gemm) {
  bool slow = false;
  const CpuIsa xeon{.model = "Xeon", .avx512f = true, .avx512_bf16 = true, .avx512_fp16 = true};
  const std::string model =
      DescribeCpuForDtype(xeon, torch::kBFloat16, 0.58, Float32Path::kModel, &slow);
  EXPECT_FALSE(slow) << model;
  EXPECT_NE(model.find("LibTorch's bfloat16 GEMM is the slower one here (measured 0.58x float32's "
                       "rate): the model is computed in float32"),
            std::string::npos)
      << model;
  const std::string bf16 =
      DescribeCpuForDtype(xeon, torch::kBFloat16, 0.58, Float32Path::kMatmuls, &slow);
  EXPECT_FALSE(slow) << bf16;
  EXPECT_NE(bf16.find("its matmuls run on the float32 GEMM"), std::string::npos) << bf16;
  const std::string forced =
      DescribeCpuForDtype(xeon, torch::kBFloat16, 0.58, Float32Path::kNone, &slow);
  EXPECT_TRUE(slow) << forced;
  EXPECT_NE(forced.find("--dtype=float32"), std::string::npos) << forced;
  DescribeCpuForDtype(xeon, torch::kFloat16, 1.5, Float32Path::kNone, &slow);
  EXPECT_FALSE(slow);
}

// The measurement: float32 against itself is 1; a dtype with units here gives a finite positive
// rate (its value is this machine's; docs/benchmarks.md records it), and the float32 GEMM is taken
// exactly where that rate is below 1.
TEST(CpuRuntimeTest, MeasuresTheMatmulSpeedupOfADtype) {
  EXPECT_EQ(MatmulSpeedup(torch::kFloat32), 1);
  EXPECT_FALSE(ReducedGemmInFloat32(torch::kFloat32));
  if (HasUnitsFor(DetectCpuIsa(), torch::kBFloat16)) {
    const double bf16 = MatmulSpeedup(torch::kBFloat16);
    EXPECT_GT(bf16, 0);
    EXPECT_TRUE(std::isfinite(bf16));
    EXPECT_EQ(MatmulSpeedup(torch::kBFloat16), bf16) << "measured once, then remembered";
    if (std::getenv("PRAXIS_REDUCED_GEMM_IN_FLOAT32") == nullptr) {
      EXPECT_EQ(ReducedGemmInFloat32(torch::kBFloat16), bf16 < 1);
    }
  }
}

// The float32 GEMM on 16-bit operands: products exact, sums in float32, one rounding to the 16-bit
// output, as LibTorch's own 16-bit GEMM; it keeps the weight's dtype, the bias and the leading
// shape, and an expert's slice of stacked weights gets its own float32 copy, not another's.
TEST(MatmulViaFloat32Test, EqualsTheSixteenBitGemmUpToSumOrder) {
  torch::manual_seed(11);
  for (const auto dt : {torch::kBFloat16, torch::kFloat16}) {
    const torch::Tensor x = torch::randn({2, 5, 96}).to(dt);
    const torch::Tensor w = torch::randn({40, 96}).to(dt);  // a Linear's [out, in]
    const torch::Tensor b = torch::randn({40}).to(dt);
    const torch::Tensor got = cpu::MatmulViaFloat32(x, w.t(), b);
    ASSERT_EQ(got.scalar_type(), dt);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 5, 40}));
    const torch::Tensor exact =
        torch::addmm(b.to(torch::kFloat64), x.reshape({10, 96}).to(torch::kFloat64),
                     w.t().to(torch::kFloat64))
            .view({2, 5, 40});
    const double ours = (got.to(torch::kFloat64) - exact).abs().max().item<double>();
    // One rounding to the 16-bit output: within a unit in its last place for |y| < 64.
    EXPECT_LE(ours, 64 * (dt == torch::kBFloat16 ? 1.0 / 256 : 1.0 / 2048)) << dt;
    // An expert's slice of stacked [E, in, out] weights: its own float32 copy, not another's.
    const torch::Tensor stacked = torch::randn({3, 96, 24}).to(dt);
    for (int64_t e = 0; e < 3; ++e) {
      const torch::Tensor y = cpu::MatmulViaFloat32(x, stacked[e]);
      const torch::Tensor ref =
          torch::matmul(x.to(torch::kFloat64), stacked[e].to(torch::kFloat64));
      EXPECT_LE((y.to(torch::kFloat64) - ref).abs().max().item<double>(),
                64 * (dt == torch::kBFloat16 ? 1.0 / 256 : 1.0 / 2048))
          << dt << " expert " << e;
    }
  }
}

// Over its byte budget a weight runs on LibTorch's 16-bit GEMM (bit for bit the same call), so the
// float32 copies never hold more than the server's --max_float32_weight_bytes.
TEST(MatmulViaFloat32Test, AWeightOverTheBudgetRunsOnTheSixteenBitGemm) {
  torch::manual_seed(12);
  const torch::Tensor x = torch::randn({3, 7, 32}).to(torch::kBFloat16);
  const torch::Tensor w = torch::randn({16, 32}).to(torch::kBFloat16);
  const torch::Tensor b = torch::randn({16}).to(torch::kBFloat16);
  cpu::SetFloat32WeightBudget(0);
  const torch::Tensor got = cpu::MatmulViaFloat32(x, w.t(), b);
  cpu::SetFloat32WeightBudget(int64_t{1} << 30);
  const torch::Tensor native = at::addmm(b, x.reshape({21, 32}), w.t()).view({3, 7, 16});
  EXPECT_TRUE(torch::equal(got, native));
  // Within the budget the same weight gets its copy: the float32 GEMM, one rounding at the end.
  const torch::Tensor within = cpu::MatmulViaFloat32(x, w.t(), b);
  const torch::Tensor exact =
      torch::addmm(b.to(torch::kFloat64), x.reshape({21, 32}).to(torch::kFloat64),
                   w.t().to(torch::kFloat64))
          .view({3, 7, 16});
  EXPECT_LE((within.to(torch::kFloat64) - exact).abs().max().item<double>(), 64.0 / 256);
}

// silu(x·gate)·(x·up)·down in float32 from bf16 values, the hidden rows rounded to bf16 once:
// what ExpertPieceInto and SwiGluPieceInto compute (gate and up [dim, inner]).
torch::Tensor GatedOracle(const torch::Tensor& x, const torch::Tensor& gate,
                          const torch::Tensor& up, const torch::Tensor& down) {
  const torch::Tensor xf = x.to(torch::kFloat32);
  const torch::Tensor hidden =
      torch::silu(xf.matmul(gate.to(torch::kFloat32))) * xf.matmul(up.to(torch::kFloat32));
  return hidden.to(torch::kBFloat16).to(torch::kFloat32).matmul(down.to(torch::kFloat32));
}

// Both forms, rows gathered or a run of them, float32 and bf16 outputs, on oneDNN's brgemm over
// the weights PackForBrgemm packed: the oracle's values in the rows asked for and nothing else
// written, for row counts off and on its 8-row padding and over several 32-row calls, widths in
// and off whole vectors; weights not packed, and every form it cannot take, refused untouched.
TEST(ExpertPieceTest, Bf16PiecesOnBrgemmEqualTheFloat32ProductsOfTheirBf16Values) {
  torch::manual_seed(15);
  const int64_t dim = 32, inner = 16, experts = 3;
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  const torch::Tensor x = torch::randn({90, dim}, bf16);
  const torch::Tensor gate_up = (torch::randn({experts, dim, 2 * inner}) / 4).to(torch::kBFloat16);
  const torch::Tensor down = (torch::randn({experts, inner, dim}) / 4).to(torch::kBFloat16);
  const auto gu0 = gate_up[0].chunk(2, -1);
  // A dense SwiGLU's Linear weights: a, b [inner, dim], down [dim, inner] (packed transposed).
  const torch::Tensor a = gu0[0].t().contiguous(), b = gu0[1].t().contiguous();
  const torch::Tensor down_linear = down[0].t().contiguous();
  const std::vector<int64_t> rows = {3, 7, 7, 0, 89};
  torch::Tensor out = torch::zeros({10, dim});
  EXPECT_FALSE(cpu::ExpertPieceInto(x, rows.data(), 0, 5, gate_up, down, 1, out, 2));  // unpacked
  const bool packed = cpu::PackForBrgemm(
      {{gate_up}, {down}, {gate_up[0]}, {down[0]}, {a, true}, {b, true}, {down_linear, true}});
  const bool taken = cpu::ExpertPieceInto(x, rows.data(), 0, 5, gate_up, down, 1, out, 2);
  if (!cpu::HasBf16Brgemm()) {
    EXPECT_FALSE(packed);
    EXPECT_FALSE(taken);
    GTEST_SKIP() << "no bf16 brgemm here: bf16 pieces run on LibTorch's ops";
  }
  ASSERT_TRUE(packed);
  ASSERT_TRUE(taken);
  const torch::Tensor picked = x.index_select(0, torch::tensor(rows, torch::kInt64));
  const auto gu = gate_up[1].chunk(2, -1);
  const torch::Tensor want = GatedOracle(picked, gu[0], gu[1], down[1]);
  EXPECT_LE(MaxAbsDiff(out.narrow(0, 2, 5), want), 1e-2 * want.abs().max().item<double>());
  EXPECT_EQ(out.narrow(0, 0, 2).abs().max().item<float>(), 0.0f);
  EXPECT_EQ(out.narrow(0, 7, 3).abs().max().item<float>(), 0.0f);

  // The shared expert's form (2-D weights, a run of rows) into bf16 rows: 8 rows (no padding),
  // 3 and 70 (padded, the last over three calls of 32, 32 and 8 rows).
  for (const int64_t count : {8, 3, 70}) {
    torch::Tensor out16 = torch::zeros({90, dim}, bf16);
    ASSERT_TRUE(cpu::ExpertPieceInto(x, nullptr, 4, count, gate_up[0], down[0], -1, out16, 4));
    const torch::Tensor want0 = GatedOracle(x.narrow(0, 4, count), gu0[0], gu0[1], down[0]);
    EXPECT_LE(MaxAbsDiff(out16.narrow(0, 4, count), want0), 2e-2 * want0.abs().max().item<double>())
        << count << " rows";
    EXPECT_EQ(out16.narrow(0, 0, 4).abs().max().item<float>(), 0.0f) << count;
    EXPECT_EQ(out16.narrow(0, 4 + count, 86 - count).abs().max().item<float>(), 0.0f) << count;
  }
  const torch::Tensor want0 = GatedOracle(x.narrow(0, 4, 3), gu0[0], gu0[1], down[0]);

  torch::Tensor dense = torch::zeros({20, dim}, bf16);
  ASSERT_TRUE(cpu::SwiGluPieceInto(x, 4, 3, a, b, down_linear, dense));
  EXPECT_LE(MaxAbsDiff(dense.narrow(0, 4, 3), want0), 2e-2 * want0.abs().max().item<double>());
  EXPECT_EQ(dense.narrow(0, 0, 4).abs().max().item<float>(), 0.0f);
  // With a bf16 residual: its rows plus the layer's float32 sums, rounded once.
  const torch::Tensor residual16 = torch::randn({20, dim}, bf16);
  torch::Tensor summed16 = torch::zeros({20, dim}, bf16);
  ASSERT_TRUE(cpu::SwiGluPieceInto(x, 4, 3, a, b, down_linear, summed16, residual16));
  const torch::Tensor want_sum = residual16.narrow(0, 4, 3).to(torch::kFloat32) + want0;
  EXPECT_LE(MaxAbsDiff(summed16.narrow(0, 4, 3), want_sum),
            2e-2 * want_sum.abs().max().item<double>());
  EXPECT_EQ(summed16.narrow(0, 7, 13).abs().max().item<float>(), 0.0f);

  // Widths off whole vectors and tiles: dim 40, inner 24 (products 48 and 40 wide, 40 and 24 deep).
  const torch::Tensor x40 = torch::randn({70, 40}, bf16);
  const torch::Tensor up40 = (torch::randn({40, 48}) / 4).to(torch::kBFloat16);
  const torch::Tensor down40 = (torch::randn({24, 40}) / 4).to(torch::kBFloat16);
  ASSERT_TRUE(cpu::PackForBrgemm({{up40}, {down40}}));
  torch::Tensor out40 = torch::zeros({70, 40});
  ASSERT_TRUE(cpu::ExpertPieceInto(x40, nullptr, 0, 70, up40, down40, -1, out40, 0));
  const auto gu40 = up40.chunk(2, -1);
  const torch::Tensor want40 = GatedOracle(x40, gu40[0], gu40[1], down40);
  EXPECT_LE(MaxAbsDiff(out40, want40), 1e-2 * want40.abs().max().item<double>());

  // One row is read as a row whatever its stride ([dim, 1]ᵀ: stride 1 on its size-1 dimension);
  // a run of rows that is not laid out as rows (an expanded one) is refused.
  const torch::Tensor one = x.narrow(0, 4, 1).as_strided({1, dim}, {1, 1});
  ASSERT_EQ(one.stride(0), 1);
  torch::Tensor out1 = torch::zeros({1, dim}, bf16);
  ASSERT_TRUE(cpu::ExpertPieceInto(one, nullptr, 0, 1, gate_up[0], down[0], -1, out1, 0));
  EXPECT_LE(MaxAbsDiff(out1, want0.narrow(0, 0, 1)), 2e-2 * want0.abs().max().item<double>());
  torch::Tensor out3 = torch::zeros({3, dim}, bf16);
  EXPECT_FALSE(cpu::ExpertPieceInto(x.narrow(0, 4, 1).expand({3, dim}), nullptr, 0, 3, gate_up[0],
                                    down[0], -1, out3, 0));
  EXPECT_EQ(out3.abs().max().item<float>(), 0.0f);

  // Refused, nothing written: a row out of range throws; other forms return false, and so do
  // weights not packed: over the budget, or with an odd inner dimension (brgemm multiplies pairs
  // of it), where no weight of the call is packed (all or none).
  const std::vector<int64_t> bad = {90};
  EXPECT_THROW(cpu::ExpertPieceInto(x, bad.data(), 0, 1, gate_up, down, 1, out, 0), c10::Error);
  const torch::Tensor before = out.clone();
  EXPECT_FALSE(
      cpu::ExpertPieceInto(x.to(torch::kFloat32), rows.data(), 0, 5, gate_up, down, 1, out, 0));
  EXPECT_FALSE(cpu::ExpertPieceInto(x, rows.data(), 0, 5, gate_up, down, experts, out, 0));
  EXPECT_FALSE(cpu::ExpertPieceInto(x, rows.data(), 0, 5, gate_up, down, 1, out, 6));
  torch::Tensor narrow_out = torch::zeros({10, dim - 1});
  EXPECT_FALSE(cpu::ExpertPieceInto(x, rows.data(), 0, 5, gate_up, down, 1, narrow_out, 0));
  const torch::Tensor odd_up = (torch::randn({dim, 2 * (inner + 1)}) / 4).to(torch::kBFloat16);
  const torch::Tensor odd_down = (torch::randn({inner + 1, dim}) / 4).to(torch::kBFloat16);
  EXPECT_FALSE(cpu::PackForBrgemm({{odd_up}, {odd_down}}));
  EXPECT_FALSE(cpu::ExpertPieceInto(x, rows.data(), 0, 5, odd_up, odd_down, -1, out, 0));
  const torch::Tensor even_up = odd_up.narrow(1, 0, 2 * inner).contiguous();
  EXPECT_FALSE(cpu::PackForBrgemm({{even_up}, {odd_down}}));  // even_up: not packed either
  EXPECT_FALSE(cpu::ExpertPieceInto(x, rows.data(), 0, 5, even_up, down[0], -1, out, 0));
  const torch::Tensor new_up = gate_up[2].clone(), new_down = down[2].clone();
  cpu::SetFloat32WeightBudget(0);
  const bool over = cpu::PackForBrgemm({{new_up}, {new_down}});
  cpu::SetFloat32WeightBudget(int64_t{1} << 30);
  EXPECT_FALSE(over);
  EXPECT_FALSE(cpu::ExpertPieceInto(x, rows.data(), 0, 5, new_up, new_down, -1, out, 0));
  EXPECT_TRUE(torch::equal(out, before));
  ASSERT_TRUE(cpu::PackForBrgemm({{new_up}, {new_down}}));
  ASSERT_TRUE(cpu::ExpertPieceInto(x, rows.data(), 0, 5, new_up, new_down, -1, out, 0));
  EXPECT_FALSE(torch::equal(out, before));
}

// The float32 form: any number of rows, on BLAS's float GEMM, the hidden rows never rounded: the
// float32 products within float32 rounding, straight into out's rows (of any row stride), and
// nothing else written, whatever the operands' leading dimensions; refused untouched where it
// cannot take them.
// cpu::BrgemmLinear against LibTorch's linear, on every row layout it reads in place: rows in
// runs that cross its tasks' and brgemm calls' bounds, with and without a bias; refused (nothing
// returned) for layouts and dtypes it does not take.
TEST(BrgemmLinearTest, EqualsLinearOnTheRowsItReadsInPlace) {
  torch::manual_seed(17);
  const int64_t k = 40, n = 24;
  const torch::Tensor w = torch::randn({n, k}) / 4, bias = torch::randn({n});
  const torch::Tensor by_columns = w.t().contiguous().t();  // VideoBackbone::Create's layout
  const torch::Tensor base = torch::randn({3, 90, k + 8});
  const std::vector<torch::Tensor> inputs = {
      base.narrow(2, 0, k).narrow(1, 0, 1).squeeze(1),  // 3 rows of a longer stride
      base.narrow(2, 0, k).narrow(1, 5, 77),            // runs of 77 rows, 3 runs
      base.view({3, 9, 10, k + 8}).narrow(3, 0, k),     // two dimensions of rows
      torch::randn({1, 1, k}),                          // one row
      torch::randn({200, k}),                           // 4 tasks, one of 8 rows
      torch::randn({4, 5, k}).transpose(0, 1),          // runs of 4 rows 5k apart, k apart
      // Rows that do not fold into runs, copied into rows first: read channel-major (as video
      // tokens are), two batch dimensions out of order, overlapping (expanded).
      torch::randn({k, 6}).t(),
      torch::randn({2, 3, 4, k}).permute({1, 0, 2, 3}),
      torch::randn({1, k}).expand({4, k}),
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (const torch::Tensor& b : {bias, torch::Tensor()}) {
      const torch::Tensor got = cpu::BrgemmLinear(inputs[i], by_columns, b);
      if (!cpu::HasFloat32Brgemm()) {
        EXPECT_FALSE(got.defined());
        continue;
      }
      ASSERT_TRUE(got.defined()) << "input " << i;
      const torch::Tensor want = torch::linear(inputs[i], w, b);
      EXPECT_EQ(got.sizes(), want.sizes());
      EXPECT_TRUE(got.is_contiguous());
      EXPECT_LE(MaxAbsDiff(got, want), 1e-5 * want.abs().max().item<double>()) << "input " << i;
      // With a residual of the output's sizes, contiguous or a transposed view (copied into rows):
      // added as C's first rows.
      std::vector<int64_t> out_sizes(want.sizes().begin(), want.sizes().end());
      const torch::Tensor residual = torch::randn(out_sizes);
      const torch::Tensor strided = residual.transpose(0, -1).contiguous().transpose(0, -1);
      for (const torch::Tensor& r : {residual, strided}) {
        const torch::Tensor summed = cpu::BrgemmLinear(inputs[i], by_columns, b, r);
        ASSERT_TRUE(summed.defined()) << "input " << i;
        EXPECT_LE(MaxAbsDiff(summed, want + residual), 1e-5 * want.abs().max().item<double>())
            << "input " << i;
      }
    }
  }
  // Refused: a weight laid out as its own rows (read transposed), bf16 rows over an unpacked
  // weight, a bias of another size, a residual of another size or dtype.
  const torch::Tensor x = torch::randn({6, k});
  EXPECT_FALSE(cpu::BrgemmLinear(x, w, bias).defined());
  EXPECT_FALSE(
      cpu::BrgemmLinear(x.to(torch::kBFloat16), by_columns.to(torch::kBFloat16), {}).defined());
  EXPECT_FALSE(cpu::BrgemmLinear(x, by_columns, torch::randn({n + 1})).defined());
  EXPECT_FALSE(cpu::BrgemmLinear(x, by_columns, bias, torch::randn({6, n + 1})).defined());
  EXPECT_FALSE(
      cpu::BrgemmLinear(x, by_columns, bias, torch::randn({6, n}, torch::kBFloat16)).defined());

  // bf16 over the weight's packed copy (made first, as at load): the float32 product of the bf16
  // values, bias included, rounded once; the same row layouts.
  const torch::Tensor w16 = w.to(torch::kBFloat16), b16 = bias.to(torch::kBFloat16);
  if (!cpu::HasBf16Brgemm()) {
    EXPECT_FALSE(cpu::PackForBrgemm({{w16, true}}));
    return;
  }
  ASSERT_TRUE(cpu::PackForBrgemm({{w16, true}}));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const torch::Tensor x16 = inputs[i].to(torch::kBFloat16);
    const torch::Tensor got = cpu::BrgemmLinear(x16, w16, b16);
    ASSERT_TRUE(got.defined()) << "input " << i;
    EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
    const torch::Tensor want =
        torch::linear(x16.to(torch::kFloat32), w16.to(torch::kFloat32), b16.to(torch::kFloat32));
    // One rounding to bf16 (8 significant bits) of sums of exact products.
    EXPECT_LE(MaxAbsDiff(got.to(torch::kFloat32), want), 1e-2 * want.abs().max().item<double>())
        << "input " << i;
    // A bf16 residual in the float32 sums, rounded with them once.
    const torch::Tensor residual = torch::randn(want.sizes()).to(torch::kBFloat16);
    const torch::Tensor summed = cpu::BrgemmLinear(x16, w16, b16, residual);
    ASSERT_TRUE(summed.defined()) << "input " << i;
    const torch::Tensor want_sum = want + residual.to(torch::kFloat32);
    EXPECT_LE(MaxAbsDiff(summed.to(torch::kFloat32), want_sum),
              1e-2 * want_sum.abs().max().item<double>())
        << "input " << i;
  }
}

// A product of few rows and a wide, deep weight (a text's tokens through its projection) is cut
// by columns into tasks for both threads: every block's columns of the weight, its packed copy,
// the bias and the residual land in y's own columns, the last block narrower than the rest.
TEST(BrgemmLinearTest, FewRowsCutByColumnsEqualLinear) {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  torch::manual_seed(18);
  const int64_t k = 1000, n = 300;  // 300 columns: blocks of 80, the last of 60
  const torch::Tensor w = torch::randn({n, k}) / 16, bias = torch::randn({n});
  const torch::Tensor by_columns = w.t().contiguous().t();
  const torch::Tensor w16 = w.to(torch::kBFloat16), b16 = bias.to(torch::kBFloat16);
  const bool bf16 = cpu::HasBf16Brgemm() && cpu::PackForBrgemm({{w16, true}});
  // 1000 deep: every product also runs as brgemm calls over blocks of its depth, the first one's
  // sums written (no bias or residual) or added onto C's, the rest added.
  for (const int64_t m : {5, 40, 100}) {
    for (const bool add : {true, false}) {
      const torch::Tensor x = torch::randn({m, k});
      const torch::Tensor b = add ? bias : torch::Tensor();
      const torch::Tensor residual = add ? torch::randn({m, n}) : torch::zeros({m, n});
      const std::string what = std::to_string(m) + (add ? " rows, bias and residual" : " rows");
      if (cpu::HasFloat32Brgemm()) {
        const torch::Tensor got =
            cpu::BrgemmLinear(x, by_columns, b, add ? residual : torch::Tensor());
        ASSERT_TRUE(got.defined()) << what;
        const torch::Tensor want = torch::linear(x, w, b) + residual;
        EXPECT_LE(MaxAbsDiff(got, want), 1e-5 * want.abs().max().item<double>()) << what;
      }
      if (!bf16) continue;
      const torch::Tensor x16 = x.to(torch::kBFloat16), r16 = residual.to(torch::kBFloat16);
      const torch::Tensor got =
          cpu::BrgemmLinear(x16, w16, add ? b16 : torch::Tensor(), add ? r16 : torch::Tensor());
      ASSERT_TRUE(got.defined()) << what;
      const torch::Tensor want = torch::linear(x16.to(torch::kFloat32), w16.to(torch::kFloat32),
                                               add ? b16.to(torch::kFloat32) : torch::Tensor()) +
                                 r16.to(torch::kFloat32);
      EXPECT_LE(MaxAbsDiff(got.to(torch::kFloat32), want), 1e-2 * want.abs().max().item<double>())
          << what;
    }
  }
  at::set_num_threads(threads);
}

TEST(ExpertPieceTest, Float32PiecesEqualTheirFloat32Products) {
  torch::manual_seed(16);
  const int64_t dim = 24, inner = 40, experts = 2;
  // Every operand a slice of a wider tensor: rows of x, weights and out longer than the GEMM's.
  const torch::Tensor x = torch::randn({300, dim + 5}).narrow(1, 0, dim);
  const torch::Tensor gate_up =
      (torch::randn({experts, dim, 2 * inner + 6}) / 4).narrow(2, 0, 2 * inner);
  const torch::Tensor down = (torch::randn({experts, inner, dim + 3}) / 4).narrow(2, 0, dim);
  std::vector<int64_t> rows(280);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>((i * 7) % 300);
  torch::Tensor wide = torch::zeros({290, dim + 8});
  torch::Tensor out = wide.narrow(1, 0, dim);
  const bool taken = cpu::ExpertPieceInto(x, rows.data(), 0, 280, gate_up, down, 1, out, 5);
  if (!cpu::Float32PiecesOnBlas()) {  // a LibTorch without BLAS's sgemm_: LibTorch's ops instead
    EXPECT_FALSE(taken);
    EXPECT_EQ(wide.abs().max().item<float>(), 0.0f);
    return;
  }
  auto oracle = [](const torch::Tensor& rows, const torch::Tensor& gate, const torch::Tensor& up,
                   const torch::Tensor& dn) {
    return (torch::silu(rows.matmul(gate)) * rows.matmul(up)).matmul(dn);
  };
  ASSERT_TRUE(taken);
  const auto gu = gate_up[1].chunk(2, -1);
  const torch::Tensor want =
      oracle(x.index_select(0, torch::tensor(rows, torch::kInt64)), gu[0], gu[1], down[1]);
  EXPECT_LE(MaxAbsDiff(out.narrow(0, 5, 280), want), 1e-5 * want.abs().max().item<double>());
  EXPECT_EQ(out.narrow(0, 0, 5).abs().max().item<float>(), 0.0f);
  EXPECT_EQ(out.narrow(0, 285, 5).abs().max().item<float>(), 0.0f);
  EXPECT_EQ(wide.narrow(1, dim, 8).abs().max().item<float>(), 0.0f);

  // A run of rows, and a dense SwiGLU's Linear weights (read transposed, rows longer than the
  // GEMM's), into contiguous rows.
  const auto gu0 = gate_up[0].chunk(2, -1);
  const torch::Tensor want0 = oracle(x.narrow(0, 10, 33), gu0[0], gu0[1], down[0]);
  torch::Tensor run = torch::zeros({300, dim});
  ASSERT_TRUE(cpu::ExpertPieceInto(x, nullptr, 10, 33, gate_up[0], down[0], -1, run, 10));
  EXPECT_LE(MaxAbsDiff(run.narrow(0, 10, 33), want0), 1e-5 * want0.abs().max().item<double>());
  auto linear = [](const torch::Tensor& w) {  // [k, n] as a Linear's [n, k] of longer rows
    torch::Tensor t = torch::zeros({w.size(1), w.size(0) + 7});
    t.narrow(1, 0, w.size(0)).copy_(w.t());
    return t.narrow(1, 0, w.size(0));
  };
  torch::Tensor dense = torch::zeros({300, dim});
  ASSERT_TRUE(
      cpu::SwiGluPieceInto(x, 10, 33, linear(gu0[0]), linear(gu0[1]), linear(down[0]), dense));
  EXPECT_LE(MaxAbsDiff(dense.narrow(0, 10, 33), want0), 1e-5 * want0.abs().max().item<double>());
  EXPECT_EQ(dense.narrow(0, 0, 10).abs().max().item<float>(), 0.0f);
  EXPECT_EQ(dense.narrow(0, 43, 257).abs().max().item<float>(), 0.0f);
  // The same Linear weights laid out column-major, as VideoBackbone::Create lays a float32
  // model's out where HasFloat32Brgemm (their [K, N] rows on brgemm; else on sgemm).
  auto column_major = [](const torch::Tensor& w) { return w.t().contiguous().t(); };
  torch::Tensor by_columns = torch::zeros({300, dim});
  ASSERT_TRUE(cpu::SwiGluPieceInto(x, 10, 33, column_major(gu0[0].t()), column_major(gu0[1].t()),
                                   column_major(down[0].t()), by_columns));
  EXPECT_LE(MaxAbsDiff(by_columns, dense), 1e-5 * want0.abs().max().item<double>());
  // With a residual (a dense block's x): its rows plus the layer's, as the down product's C;
  // refused where it is not of out's sizes.
  const torch::Tensor residual = torch::randn({300, dim});
  torch::Tensor summed = torch::zeros({300, dim});
  ASSERT_TRUE(cpu::SwiGluPieceInto(x, 10, 33, column_major(gu0[0].t()), column_major(gu0[1].t()),
                                   column_major(down[0].t()), summed, residual));
  EXPECT_LE(MaxAbsDiff(summed.narrow(0, 10, 33), residual.narrow(0, 10, 33) + want0),
            1e-5 * want0.abs().max().item<double>());
  EXPECT_EQ(summed.narrow(0, 0, 10).abs().max().item<float>(), 0.0f);
  EXPECT_FALSE(cpu::SwiGluPieceInto(x, 10, 33, linear(gu0[0]), linear(gu0[1]), linear(down[0]),
                                    summed, residual.narrow(0, 0, 299)));

  // One row, read as a row whatever its stride, into one row of out.
  const torch::Tensor one = x.narrow(0, 10, 1).as_strided({1, dim}, {1, 1});
  torch::Tensor out1 = torch::zeros({1, dim});
  ASSERT_TRUE(cpu::ExpertPieceInto(one, nullptr, 0, 1, gate_up[0], down[0], -1, out1, 0));
  EXPECT_LE(MaxAbsDiff(out1, want0.narrow(0, 0, 1)), 1e-5 * want0.abs().max().item<double>());

  // Refused, nothing written: rows not laid out as rows (an expanded one), bf16 weights under
  // float32 rows, a bf16 out, an expert past the stack; a row out of range throws.
  const torch::Tensor before = run.clone();
  EXPECT_FALSE(cpu::ExpertPieceInto(x.narrow(0, 4, 1).expand({3, dim}), nullptr, 0, 3, gate_up[0],
                                    down[0], -1, run, 0));
  EXPECT_FALSE(cpu::ExpertPieceInto(x, nullptr, 0, 4, gate_up.to(torch::kBFloat16),
                                    down.to(torch::kBFloat16), 0, run, 0));
  torch::Tensor out16 = torch::zeros({4, dim}, torch::kBFloat16);
  EXPECT_FALSE(cpu::ExpertPieceInto(x, nullptr, 0, 4, gate_up, down, 0, out16, 0));
  EXPECT_FALSE(cpu::ExpertPieceInto(x, nullptr, 0, 4, gate_up, down, experts, run, 0));
  EXPECT_TRUE(torch::equal(run, before));
  EXPECT_EQ(out16.abs().max().item<float>(), 0.0f);
  const std::vector<int64_t> bad = {300};
  EXPECT_THROW(cpu::ExpertPieceInto(x, bad.data(), 0, 1, gate_up, down, 0, run, 0), c10::Error);
}

#if defined(__x86_64__)
TEST(CpuRuntimeTest, DetectsThisCpu) {
  const CpuIsa isa = DetectCpuIsa();
  EXPECT_FALSE(isa.model.empty());
  // Every unit implies AVX-512 foundation on the CPUs that have them.
  if (isa.avx512_bf16 || isa.amx_bf16) {
    EXPECT_TRUE(isa.avx512f);
  }
}
#endif

}  // namespace
}  // namespace praxis::model
