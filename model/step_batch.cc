#include "model/step_batch.h"

#include <ATen/CPUGeneratorImpl.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace praxis::model {

WindowLayout StepLayout(const StepInputs& in) {
  return {.anchor_h = in.anchor.size(3),
          .anchor_w = in.anchor.size(4),
          .text_len = in.text.size(1),
          .k = in.noised.size(2) / in.frames_per_chunk,
          .f = in.frames_per_chunk,
          .h = in.noised.size(3),
          .w = in.noised.size(4)};
}

std::string LayoutKey(const StepInputs& in) {
  return LayoutKey(StepLayout(in), in.decode, in.rope_shifts);
}

std::string LayoutKey(const WindowLayout& l, bool decode,
                      const std::array<int64_t, 4>& rope_shifts) {
  return absl::StrCat("L", l.text_len, "_a", l.anchor_h, "x", l.anchor_w, "_K", l.k, "_F", l.f,
                      "_g", l.h, "x", l.w, decode ? "_dec" : "_enc", "_rs",
                      absl::StrJoin(rope_shifts, ","));
}

StepInputs SyntheticStep(const BackboneConfig& config, const WindowLayout& l, int64_t b,
                         uint64_t seed, torch::ScalarType dtype) {
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  const auto opts = torch::TensorOptions().dtype(dtype);
  const int64_t c = config.latent_channels();
  auto randn = [&](torch::IntArrayRef shape) { return torch::randn(shape, gen, opts); };
  StepInputs in;
  in.text = randn({b, l.text_len, config.text_dim});
  in.anchor = randn({b, c, 1, l.anchor_h, l.anchor_w});
  if (l.k > 1) in.clean = randn({b, c, (l.k - 1) * l.f, l.h, l.w});
  in.noised = randn({b, c, l.k * l.f, l.h, l.w});
  in.timesteps = torch::rand({b, l.k}, gen, torch::kFloat32);
  in.frames_per_chunk = l.f;
  return in;
}

StepInputs StackSteps(absl::Span<const StepInputs* const> steps) {
  StepInputs out = *steps.front();
  if (steps.size() == 1) return out;
  auto cat = [&](torch::Tensor StepInputs::*field) {
    std::vector<torch::Tensor> parts;
    parts.reserve(steps.size());
    for (const StepInputs* s : steps) parts.push_back(s->*field);
    return torch::cat(parts, 0);
  };
  out.text = cat(&StepInputs::text);
  out.anchor = cat(&StepInputs::anchor);
  out.noised = cat(&StepInputs::noised);
  out.timesteps = cat(&StepInputs::timesteps);
  if (out.clean.defined()) out.clean = cat(&StepInputs::clean);
  return out;
}

BackboneOutput SliceRows(const BackboneOutput& out, int64_t start, int64_t rows) {
  auto slice = [&](const torch::Tensor& t) { return t.defined() ? t.narrow(0, start, rows) : t; };
  BackboneOutput s = out;
  s.velocity = slice(out.velocity);
  s.cond = slice(out.cond);
  for (torch::Tensor& t : s.features.taps) t = slice(t);
  s.features.embeddings = slice(out.features.embeddings);
  s.features.positions = slice(out.features.positions);
  return s;
}

}  // namespace praxis::model
