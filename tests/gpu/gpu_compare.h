#pragma once

// What the GPU tests (issue 14) share: skipping without CUDA, loading one model on a device, and
// comparing every output of two steps with a stated tolerance.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/masks.h"
#include "model/model_loader.h"
#include "model/step.h"
#include "wire/layout_key.h"

namespace praxis::model::gpu {

// Skips the calling test unless LibTorch sees a CUDA device; with one, turns TF32 off so that
// float32 on the GPU is float32 (LibTorch allows TF32 in cuDNN by default).
#define PRAXIS_SKIP_WITHOUT_CUDA()                                      \
  do {                                                                  \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"; \
    at::globalContext().setAllowTF32CuBLAS(false);                      \
    at::globalContext().setAllowTF32CuDNN(false);                       \
  } while (0)

// The tiny model's K = 2 layout (tests/server/server_test.cc's first).
constexpr WindowLayout kTinyLayout{
    .anchor_h = 3, .anchor_w = 4, .text_len = 5, .k = 2, .f = 1, .h = 3, .w = 4};
// configs/bench.json layouts: 440 encoder tokens (partial 128-token tiles only), and 1924 tokens
// with full tiles, K = 2 chunks of F = 2 frames.
constexpr WindowLayout kSmall{
    .anchor_h = 6, .anchor_w = 8, .text_len = 32, .k = 2, .f = 1, .h = 6, .w = 8};
constexpr WindowLayout kMedium{
    .anchor_h = 16, .anchor_w = 16, .text_len = 128, .k = 2, .f = 2, .h = 16, .w = 16};

// "tiny <layout key>" or "<config path> <layout key>": a case in failure messages.
inline std::string CaseName(const std::string& config, const WindowLayout& layout) {
  return (config.empty() ? std::string("tiny") : config) + " " +
         wire::LayoutKey(GeometryOf(layout), true, {});
}

// A repository config: $PRAXIS_SOURCE_DIR/configs/NAME at run time (gpu-check.sh sets it on the
// device, where the checkout is elsewhere), else the source tree this test was built from.
inline std::string RepoConfig(const std::string& name) {
  const char* dir = std::getenv("PRAXIS_SOURCE_DIR");
  return std::string(dir != nullptr ? dir : PRAXIS_SOURCE_DIR) + "/configs/" + name;
}

// The model of `config_path` (empty: the embedded tiny model) with random weights of seed 0, in
// `dtype` (empty: the config's), on `device`; fails the test on error.
inline std::unique_ptr<VideoBackbone> Load(const std::string& config_path,
                                           const std::string& device, const std::string& dtype,
                                           AttentionMode attention = AttentionMode::kSparse) {
  ModelSource source;
  source.config_path = config_path;
  source.dtype = dtype;
  BackboneOptions options;
  options.device = torch::Device(device);
  options.attention = attention;
  absl::StatusOr<LoadedModel> loaded = LoadModel(source, options);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? std::move(loaded->model) : nullptr;
}

// Every output of `model` on `in`, by name, on the host in float64 (positions stay int64).
inline std::vector<std::pair<std::string, torch::Tensor>> Outputs(VideoBackbone& model,
                                                                  const StepInputs& in) {
  absl::StatusOr<BackboneOutput> out = model.Forward(in);
  EXPECT_TRUE(out.ok()) << out.status();
  std::vector<std::pair<std::string, torch::Tensor>> named;
  if (!out.ok()) return named;
  for (auto& [name, t] : NamedOutputs(*out)) {
    named.emplace_back(name, t.is_floating_point() ? t.cpu().to(torch::kFloat64) : t.cpu());
  }
  return named;
}

// max |a - b| / max(1, max |b|): the float32 parity measure (an absolute bound for outputs of
// unit scale, relative for larger ones).
inline double ScaledMaxDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(1.0, b.abs().max().item<double>());
  return (a - b).abs().max().item<double>() / scale;
}

// ||a - b|| / ||b||: the bf16 measure (METHOD: bf16 operands land between 1e-3 and 1e-2).
inline double RelativeL2(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(1e-30, b.norm().item<double>());
}

// Expects the same outputs, names and shapes in `got` as in `want`, each float output within
// `tolerance` by `measure` (int outputs equal); NaN never passes.
template <typename Measure>
void ExpectOutputsClose(const std::vector<std::pair<std::string, torch::Tensor>>& got,
                        const std::vector<std::pair<std::string, torch::Tensor>>& want,
                        Measure measure, double tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& [name, g] = got[i];
    const torch::Tensor& w = want[i].second;
    ASSERT_EQ(name, want[i].first) << what;
    ASSERT_EQ(g.sizes(), w.sizes()) << what << " " << name;
    if (!w.is_floating_point()) {
      EXPECT_TRUE(torch::equal(g, w)) << what << " " << name;
      continue;
    }
    const double d = measure(g, w);
    EXPECT_LE(d, tolerance) << what << " " << name;  // false for NaN
    // One line per output, which gpu-check.sh's summary gathers: the margin, not only pass/fail.
    std::printf("[parity] %s %s: %.3g (tolerance %.3g)\n", what.c_str(), name.c_str(), d,
                tolerance);
  }
}

}  // namespace praxis::model::gpu
