// The C++ backbone against the PyTorch reference's golden files, plus properties the reference
// cannot check for us: sparse == dense, chunk causality, batch invariance, mask reuse.

#include "model/backbone.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "model/checkpoint.h"
#include "model/cpu_kernels.h"
#include "model/layers.h"
#include "model/random_weights.h"
#include "model/step_runner.h"
#include "model/step_validation.h"
#include "wire/safetensors.h"

namespace praxis::model {
namespace {

using wire::SafetensorsFile;

// The tiny checkpoint and goldens written by tests/reference/make_tiny.py (a CTest fixture).
std::string TinyDir() {
  const char* dir = std::getenv("PRAXIS_TINY_DIR");
  return dir ? dir : "";
}

std::unique_ptr<VideoBackbone> LoadTiny(AttentionMode mode) {
  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(TinyDir() + "/model", CheckpointOptions{});
  EXPECT_TRUE(ckpt.ok()) << ckpt.status() << " (PRAXIS_TINY_DIR=" << TinyDir() << ")";
  if (!ckpt.ok()) return nullptr;
  auto model = VideoBackbone::Create(ckpt->config, ckpt->tensors, {.attention = mode});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

struct Golden {
  StepInputs inputs;
  std::unique_ptr<SafetensorsFile> outputs;
};

Golden ReadGolden(const std::string& name) {
  const std::string base = TinyDir() + "/goldens/case_" + name;
  auto in = SafetensorsFile::Open(base + ".inputs.safetensors");
  auto out = SafetensorsFile::Open(base + ".outputs.safetensors");
  EXPECT_TRUE(in.ok() && out.ok()) << base;
  Golden g;
  if (!in.ok() || !out.ok()) return g;
  auto get = [&](const char* n) { return (*in)->Get(n).value_or(torch::Tensor()); };
  g.inputs.text = get("text");
  g.inputs.anchor = get("anchor");
  g.inputs.clean = get("clean");
  g.inputs.noised = get("noised");
  g.inputs.timesteps = get("timesteps");
  const torch::Tensor shifts = get("rope_shifts");
  for (int i = 0; i < 4; ++i) g.inputs.rope_shifts[i] = shifts[i].item<int64_t>();
  g.inputs.frames_per_chunk = get("frames_per_chunk")[0].item<int64_t>();
  g.inputs.decode = get("decode")[0].item<int64_t>() != 0;
  g.outputs = *std::move(out);
  return g;
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e9;
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

class GoldenParityTest : public ::testing::TestWithParam<std::tuple<std::string, AttentionMode>> {};

TEST_P(GoldenParityTest, MatchesReferenceWithin1e4) {
  const auto& [name, mode] = GetParam();
  auto model = LoadTiny(mode);
  ASSERT_NE(model, nullptr);
  Golden g = ReadGolden(name);
  ASSERT_NE(g.outputs, nullptr);
  absl::StatusOr<BackboneOutput> out = model->Forward(g.inputs);
  ASSERT_TRUE(out.ok()) << out.status();
  auto want = [&](const std::string& n) { return *g.outputs->Get(n); };
  EXPECT_LE(MaxAbsDiff(out->cond, want("cond")), 1e-4);
  EXPECT_LE(MaxAbsDiff(out->features.embeddings, want("embeddings")), 1e-4);
  ASSERT_EQ(out->features.taps.size(), 2u);
  for (size_t i = 0; i < out->features.taps.size(); ++i) {
    EXPECT_LE(MaxAbsDiff(out->features.taps[i], want("tap." + std::to_string(i))), 1e-4) << i;
  }
  EXPECT_TRUE(torch::equal(out->features.positions, want("positions")));
  if (g.inputs.decode) {
    EXPECT_LE(MaxAbsDiff(out->velocity, want("velocity")), 1e-4);
  } else {
    EXPECT_FALSE(out->velocity.defined());
    EXPECT_FALSE(g.outputs->Get("velocity").ok());
  }
  EXPECT_EQ(out->features.clean_span.has_value(), g.inputs.clean.defined());
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenParityTest,
                         ::testing::Combine(::testing::Values("k1", "k3", "no_decode",
                                                              "rope_shifts", "batch2", "ragged"),
                                            ::testing::Values(AttentionMode::kSparse,
                                                              AttentionMode::kDense)),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) == AttentionMode::kSparse ? "_sparse"
                                                                                     : "_dense");
                         });

// Random step inputs for the tiny model (C = 16, text_dim 48).
StepInputs RandomStep(int64_t b, int64_t k, int64_t f, int64_t h, int64_t w, int64_t text_len,
                      uint64_t seed) {
  torch::manual_seed(seed);
  StepInputs in;
  in.text = torch::randn({b, text_len, 48});
  in.anchor = torch::randn({b, 16, 1, h, w});
  if (k > 1) in.clean = torch::randn({b, 16, (k - 1) * f, h, w});
  in.noised = torch::randn({b, 16, k * f, h, w});
  in.timesteps = torch::rand({b, k});
  in.frames_per_chunk = f;
  return in;
}

// The decoder's input tokens: coarse channel c·ph·pw + i·pw + j of pixel (row, col) is fine pixel
// (row·ph + i, col·pw + j), tokens frame-major; Patchify puts them back.
TEST(LayersTest, UnpatchTokensRegroupsChannelsIntoFinePixelsAndPatchifyUndoesIt) {
  const int64_t b = 2, c = 3, ph = 2, pw = 3, f = 2, h = 2, w = 4;
  const torch::Tensor x =
      torch::arange(b * c * ph * pw * f * h * w, torch::kFloat32).view({b, c * ph * pw, f, h, w});
  const torch::Tensor tokens = UnpatchTokens(x, ph, pw);
  ASSERT_EQ(tokens.sizes(), (std::vector<int64_t>{b, f * h * ph * w * pw, c}));
  const int64_t hh = h * ph, ww = w * pw;
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t ci = 0; ci < c; ++ci) {
      for (int64_t fi = 0; fi < f; ++fi) {
        for (int64_t r = 0; r < hh; ++r) {
          for (int64_t col = 0; col < ww; ++col) {
            const float want =
                x[bi][ci * ph * pw + (r % ph) * pw + col % pw][fi][r / ph][col / pw].item<float>();
            ASSERT_EQ(tokens[bi][(fi * hh + r) * ww + col][ci].item<float>(), want)
                << bi << " " << ci << " " << fi << " " << r << " " << col;
          }
        }
      }
    }
  }
  const torch::Tensor fine = tokens.view({b, f, hh, ww, c}).permute({0, 4, 1, 2, 3});
  EXPECT_TRUE(torch::equal(Patchify(fine, ph, pw), x));
}

TEST(BackboneTest, SparseExecutorEqualsDensePathOnRandomLayouts) {
  auto sparse = LoadTiny(AttentionMode::kSparse);
  auto dense = LoadTiny(AttentionMode::kDense);
  ASSERT_TRUE(sparse && dense);
  const int64_t layouts[][5] = {
      {1, 1, 3, 5, 4}, {3, 2, 4, 6, 9}, {4, 1, 5, 3, 17}, {2, 3, 2, 7, 1}};
  for (const auto& l : layouts) {
    StepInputs in = RandomStep(2, l[0], l[1], l[2], l[3], l[4], 7);
    in.rope_shifts = {3, 1, 4, 1};
    auto a = sparse->Forward(in);
    auto b = dense->Forward(in);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_LE(MaxAbsDiff(a->velocity, b->velocity), 1e-5);
    EXPECT_LE(MaxAbsDiff(a->cond, b->cond), 1e-5);
    for (size_t i = 0; i < a->features.taps.size(); ++i) {
      EXPECT_LE(MaxAbsDiff(a->features.taps[i], b->features.taps[i]), 1e-5);
    }
  }
}

// Velocity of chunk j (F frames) of a [B, C, K·F, h, w] tensor.
torch::Tensor Chunk(const torch::Tensor& v, int64_t j, int64_t f) { return v.narrow(2, j * f, f); }

TEST(BackboneTest, ChunkCausalityThroughTheWholeBackbone) {
  auto model = LoadTiny(AttentionMode::kSparse);
  ASSERT_NE(model, nullptr);
  const int64_t k = 3, f = 2;
  const StepInputs base = RandomStep(1, k, f, 4, 5, 6, 11);
  const torch::Tensor v0 = model->Forward(base)->velocity;
  for (int64_t j = 0; j < k; ++j) {
    StepInputs in = base;
    in.noised = base.noised.clone();
    Chunk(in.noised, j, f).add_(1.0);
    const torch::Tensor v = model->Forward(in)->velocity;
    for (int64_t i = 0; i < k; ++i) {
      const bool changed = !torch::equal(Chunk(v, i, f), Chunk(v0, i, f));
      EXPECT_EQ(changed, i == j) << "noised chunk " << j << " vs velocity chunk " << i;
    }
  }
  for (int64_t j = 0; j < k - 1; ++j) {
    StepInputs in = base;
    in.clean = base.clean.clone();
    Chunk(in.clean, j, f).add_(1.0);
    const torch::Tensor v = model->Forward(in)->velocity;
    for (int64_t i = 0; i <= j; ++i) {
      EXPECT_TRUE(torch::equal(Chunk(v, i, f), Chunk(v0, i, f))) << "clean " << j << " chunk " << i;
    }
    EXPECT_FALSE(torch::equal(Chunk(v, j + 1, f), Chunk(v0, j + 1, f))) << "clean " << j;
  }
  StepInputs in = base;
  in.text = base.text + 1.0;
  const torch::Tensor v = model->Forward(in)->velocity;
  for (int64_t i = 0; i < k; ++i) EXPECT_FALSE(torch::equal(Chunk(v, i, f), Chunk(v0, i, f)));
}

// A 16-bit model computed in float32 (a CPU whose 16-bit GEMM is the slower one) is exactly the
// float32 model of its rounded weights, returns float32, and still says its own dtype; its float32
// bytes count against the float32 weight budget while it lives, and a model that would not fit
// stays in its dtype.
TEST(BackboneTest, ASixteenBitModelComputedInFloat32IsTheFloat32ModelOfItsWeights) {
  absl::StatusOr<Checkpoint> bf16 =
      LoadCheckpoint(TinyDir() + "/model", CheckpointOptions{.dtype = torch::kBFloat16});
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  BackboneConfig f32_config = bf16->config;
  f32_config.dtype = "float32";
  TensorMap f32_weights;
  int64_t f32_bytes = 0;
  for (const auto& [name, t] : bf16->tensors) {
    if (t.scalar_type() == torch::kBFloat16) f32_bytes += t.numel() * 4;
    f32_weights.emplace(name, t.to(torch::kFloat32));
  }
  auto reference = VideoBackbone::Create(f32_config, f32_weights, {});
  ASSERT_TRUE(reference.ok()) << reference.status();
  cpu::SetFloat32WeightBudget(f32_bytes);
  absl::Cleanup restore = [] { cpu::SetFloat32WeightBudget(int64_t{1} << 30); };
  auto converted =
      VideoBackbone::Create(bf16->config, bf16->tensors, {.cpu_float32_compute = true});
  auto over_budget =
      VideoBackbone::Create(bf16->config, bf16->tensors, {.cpu_float32_compute = true});
  auto kept = VideoBackbone::Create(bf16->config, bf16->tensors, {.cpu_float32_compute = false});
  ASSERT_TRUE(converted.ok() && over_budget.ok() && kept.ok());
  EXPECT_EQ((*converted)->dtype(), torch::kBFloat16);
  EXPECT_EQ((*converted)->compute_dtype(), torch::kFloat32);
  EXPECT_EQ((*over_budget)->compute_dtype(), torch::kBFloat16);  // the budget was held
  EXPECT_EQ((*kept)->compute_dtype(), torch::kBFloat16);

  const StepInputs in = RandomStep(2, 2, 2, 3, 4, 5, 11);
  auto want = (*reference)->Forward(in);
  auto got = (*converted)->Forward(in);
  auto rounded = (*kept)->Forward(in);
  ASSERT_TRUE(want.ok() && got.ok() && rounded.ok())
      << want.status() << got.status() << rounded.status();
  EXPECT_EQ(got->velocity.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(got->velocity, want->velocity));
  EXPECT_TRUE(torch::equal(got->cond, want->cond));
  EXPECT_EQ(rounded->velocity.scalar_type(), torch::kBFloat16);
  // Within bf16's rounding as a whole (stop 22: 2.3 % relative RMS for the reference's own bf16
  // step), not element by element: one rounding moved upstream once shifted one token of 96 by
  // 0.27 while the rest stayed at bf16's noise (a discrete choice, as the MoE router's, can flip).
  const torch::Tensor diff = rounded->velocity.to(torch::kFloat32) - want->velocity;
  EXPECT_LE(diff.pow(2).mean().sqrt().item<double>(),
            0.03 * want->velocity.pow(2).mean().sqrt().item<double>());

  converted->reset();  // gives its bytes back
  auto again = VideoBackbone::Create(bf16->config, bf16->tensors, {.cpu_float32_compute = true});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->compute_dtype(), torch::kFloat32);
}

// Its attention plans are float32's too: at head dim 64 a float16 model plans key groups and
// biases (TileAttention takes float16 only up to cpu::kNarrowHeadDim), the same model computed in
// float32 plans TileAttention's tiles, as the float32 model does.
TEST(BackboneTest, AModelComputedInFloat32PlansItsAttentionInFloat32) {
  absl::StatusOr<Checkpoint> tiny = LoadCheckpoint(TinyDir() + "/model", CheckpointOptions{});
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  BackboneConfig c = tiny->config;
  c.dtype = "float16";
  c.num_heads = c.num_kv_heads = 1;
  ASSERT_EQ(c.head_dim(), 64);
  const TensorMap weights = RandomWeights(c, 3);
  auto converted = VideoBackbone::Create(c, weights, {.cpu_float32_compute = true});
  auto kept = VideoBackbone::Create(c, weights, {.cpu_float32_compute = false});
  ASSERT_TRUE(converted.ok() && kept.ok());
  const StepInputs in = RandomStep(1, 2, 2, 3, 4, 5, 13);
  auto f32_plan = (*converted)->PlanLayout(in);
  auto f16_plan = (*kept)->PlanLayout(in);
  ASSERT_TRUE(f32_plan.ok() && f16_plan.ok());
  EXPECT_TRUE((*f32_plan)->enc_mask->plan.groups.empty());
  EXPECT_FALSE((*f16_plan)->enc_mask->plan.groups.empty());
  EXPECT_TRUE((*converted)->Forward(in).ok());
}

TEST(BackboneTest, RowOfABatchEqualsTheSameInputRunAlone) {
  auto model = LoadTiny(AttentionMode::kSparse);
  ASSERT_NE(model, nullptr);
  const StepInputs batch = RandomStep(4, 2, 2, 3, 4, 5, 3);
  auto all = model->Forward(batch);
  ASSERT_TRUE(all.ok());
  for (int64_t i = 0; i < 4; ++i) {
    StepInputs one = batch;
    for (torch::Tensor* t : {&one.text, &one.anchor, &one.clean, &one.noised, &one.timesteps}) {
      *t = t->narrow(0, i, 1);
    }
    auto solo = model->Forward(one);
    ASSERT_TRUE(solo.ok());
    EXPECT_LE(MaxAbsDiff(all->velocity.narrow(0, i, 1), solo->velocity), 1e-5) << i;
    EXPECT_LE(MaxAbsDiff(all->features.taps[1].narrow(0, i, 1), solo->features.taps[1]), 1e-5);
  }
}

TEST(BackboneTest, ALayoutSeenBeforeBuildsNothing) {
  auto model = LoadTiny(AttentionMode::kSparse);
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(model->Forward(RandomStep(1, 2, 1, 3, 3, 4, 1)).ok());
  const MaskCacheStats first = model->mask_cache().stats();
  EXPECT_EQ(first.misses, 2) << "one encoder and one decoder mask";
  EXPECT_EQ(model->plan_cache_stats().misses, 1);
  // Same layout, other rows and values: the plan is found, and with it its masks.
  ASSERT_TRUE(model->Forward(RandomStep(2, 2, 1, 3, 3, 4, 2)).ok());
  EXPECT_EQ(model->mask_cache().stats().misses, 2);
  EXPECT_EQ(model->mask_cache().stats().hits, first.hits);
  EXPECT_EQ(model->plan_cache_stats().misses, 1);
  EXPECT_EQ(model->plan_cache_stats().hits, 1);
  // Another rope shift is another plan (its rotary tables differ) over the same masks.
  StepInputs shifted = RandomStep(1, 2, 1, 3, 3, 4, 3);
  shifted.rope_shifts[2] = 7;
  ASSERT_TRUE(model->Forward(shifted).ok());
  EXPECT_EQ(model->plan_cache_stats().misses, 2);
  EXPECT_EQ(model->mask_cache().stats().misses, 2);
  EXPECT_EQ(model->mask_cache().stats().hits, first.hits + 2);
}

// What a CUDA graph captures is RunPlanned: it must find everything layout-derived in its plan
// (no mask lookup, nothing built) and give the forward's outputs, for any inputs of that layout.
TEST(BackboneTest, RunPlannedReadsOnlyItsPlanAndEqualsTheForward) {
  auto model = LoadTiny(AttentionMode::kSparse);
  ASSERT_NE(model, nullptr);
  const StepInputs first = RandomStep(2, 2, 1, 3, 3, 4, 1);
  absl::StatusOr<std::shared_ptr<const LayoutPlan>> plan = model->PlanLayout(first);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT((*plan)->nbytes(), 0);
  const MaskCacheStats planned = model->mask_cache().stats();
  for (uint64_t seed : {1, 2}) {
    const StepInputs in = RandomStep(2, 2, 1, 3, 3, 4, seed);
    const BackboneOutput run = model->RunPlanned(in, **plan);
    absl::StatusOr<BackboneOutput> forward = model->Forward(in);
    ASSERT_TRUE(forward.ok()) << forward.status();
    const auto got = NamedOutputs(run), want = NamedOutputs(*forward);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, want[i].first);
      EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << got[i].first << " seed " << seed;
    }
  }
  // The two Forward calls found the plan (no mask lookups); RunPlanned looked nothing up.
  EXPECT_EQ(model->mask_cache().stats().hits, planned.hits);
  EXPECT_EQ(model->mask_cache().stats().misses, planned.misses);
  EXPECT_EQ(model->plan_cache_stats().hits, 2);
  EXPECT_EQ(model->plan_cache_stats().misses, 1);
}

TEST(BackboneTest, InvalidInputsNameTheField) {
  auto model = LoadTiny(AttentionMode::kSparse);
  ASSERT_NE(model, nullptr);
  auto expect_error = [&](StepInputs in, const std::string& field) {
    auto out = model->Forward(in);
    ASSERT_FALSE(out.ok()) << field;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(out.status().message().substr(0, field.size()), field) << out.status();
  };
  const StepInputs good = RandomStep(1, 2, 1, 3, 3, 4, 1);
  StepInputs in = good;
  in.clean = torch::Tensor();
  expect_error(in, "clean");
  in = good;
  in.timesteps = good.timesteps + 2.0;
  expect_error(in, "timesteps");
  in.timesteps = torch::full_like(good.timesteps, -0.25);
  expect_error(in, "timesteps");
  in.timesteps = torch::full_like(good.timesteps, 1.5).to(torch::kBFloat16);
  expect_error(in, "timesteps");
  in.timesteps = torch::ones_like(good.timesteps);  // the range's ends are in it
  EXPECT_TRUE(model->Forward(in).ok());
  in.timesteps = torch::zeros_like(good.timesteps);
  EXPECT_TRUE(model->Forward(in).ok());
  in = good;
  in.text = torch::randn({1, 4, 47});
  expect_error(in, "text");
  in = good;
  in.noised = torch::randn({1, 16, 2, 360, 3});
  expect_error(in, "noised");
  in = good;
  in.frames_per_chunk = 3;
  expect_error(in, "frames_per_chunk");
  in = good;
  in.rope_shifts[3] = -1;
  expect_error(in, "rope_shifts[3]");
  in = good;
  in.anchor = good.anchor.clone();
  in.anchor[0][0][0][0][0] = std::nan("");
  expect_error(in, "anchor");
}

// ValidateStep reports what its finite-value pass read: each input's max |value|, in
// wire::kInputFields' order, 0 for an absent one and for the timesteps (the server's magnitude
// limit reads these).
TEST(BackboneTest, ValidateStepReportsTheInputsMagnitudes) {
  auto model = LoadTiny(AttentionMode::kSparse);
  ASSERT_NE(model, nullptr);
  StepInputs in = RandomStep(1, 2, 1, 3, 3, 4, 1);
  in.text = in.text.clone();
  in.text[0][1][2] = -7.5;
  in.noised = in.noised.to(torch::kBFloat16);
  InputMagnitudes found;
  ASSERT_TRUE(ValidateStep(model->config(), in, &found).ok());
  EXPECT_EQ(found.max_abs[0], 7.5);
  for (size_t i = 0; i < found.max_abs.size(); ++i) {
    const wire::InputField& field = wire::kInputFields[i];
    const double want =
        field.tensor == &StepInputs::timesteps ? 0 : (in.*field.tensor).abs().max().item<double>();
    EXPECT_EQ(found.max_abs[i], want) << field.name;
  }
  in.clean = torch::Tensor();
  in.noised = in.noised.narrow(2, 0, 1);  // K = 1: no clean frames
  in.timesteps = in.timesteps.narrow(1, 0, 1);
  ASSERT_TRUE(ValidateStep(model->config(), in, &found).ok());
  EXPECT_EQ(found.max_abs[2], 0);
}

// The serving path checks each request once (ValidateStep before queueing), and the runner's
// ForwardValidated does not check the stacked batch again: a NaN that Forward refuses goes
// through BackboneStepRunner::Run and comes out in the embeddings (which hold the text tokens).
TEST(BackboneTest, ForwardValidatesButTheRunnerTrustsItsValidatedBatch) {
  auto model = LoadTiny(AttentionMode::kSparse);
  ASSERT_NE(model, nullptr);
  StepInputs in = RandomStep(1, 2, 1, 3, 3, 4, 1);
  in.text = in.text.clone();
  in.text[0][0][0] = std::nan("");
  EXPECT_EQ(model->Forward(in).status().code(), absl::StatusCode::kInvalidArgument);
  BackboneStepRunner runner(std::move(model));
  absl::StatusOr<BackboneOutput> out = runner.Run(in, {.embeddings = true});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(torch::isnan(out->features.embeddings).any().item<bool>());
  EXPECT_FALSE(out->cond.defined()) << "not asked for";
  EXPECT_FALSE(out->features.positions.defined()) << "not asked for";
}

// On the CPU the runner takes each run's intra-op thread count from its IntraOpThreadChooser:
// with a probe window shorter than any run, the first run fills a window on --threads and the
// second probes one thread. Without probes, or without a count of its own, it keeps to its own.
TEST(BackboneTest, TheRunnerProbesOneIntraOpThreadAfterAWindow) {
  const StepInputs in = RandomStep(1, 2, 1, 3, 3, 4, 1);
  std::vector<int> seen;
  std::thread([&] {  // the runner raises its thread's count: a thread of its own
    BackboneStepRunner runner(LoadTiny(AttentionMode::kSparse),
                              {.intra_op_threads = 2, .thread_probe_every = absl::Nanoseconds(1)});
    EXPECT_FALSE(runner.intra_op_threads().has_value()) << "before any run";
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(runner.Run(in, {.cond = true}).ok());
      seen.push_back(runner.intra_op_threads()->threads);
    }
  })
      .join();
  EXPECT_EQ(seen, (std::vector<int>{2, 1}));
  std::thread([&] {
    BackboneStepRunner fixed(LoadTiny(AttentionMode::kSparse),
                             {.intra_op_threads = 2, .thread_probe_every = absl::ZeroDuration()});
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(fixed.Run(in, {.cond = true}).ok());
    EXPECT_EQ(fixed.intra_op_threads()->threads, 2);
    EXPECT_EQ(fixed.intra_op_threads()->switches, 0);
    BackboneStepRunner unset(LoadTiny(AttentionMode::kSparse));
    ASSERT_TRUE(unset.Run(in, {.cond = true}).ok());
    EXPECT_FALSE(unset.intra_op_threads().has_value()) << "leaves the thread's count alone";
  }).join();
}

}  // namespace
}  // namespace praxis::model
