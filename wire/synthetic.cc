#include "wire/synthetic.h"

#include <ATen/CPUGeneratorImpl.h>

namespace praxis::wire {

StepInputs SyntheticInputs(const StepDims& dims, const StepGeometry& g, int64_t b, uint64_t seed,
                           torch::ScalarType dtype) {
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  const auto opts = torch::TensorOptions().dtype(dtype);
  const int64_t c = dims.latent_channels;
  auto randn = [&](torch::IntArrayRef shape) { return torch::randn(shape, gen, opts); };
  StepInputs in;
  in.text = randn({b, g.text_len, dims.text_dim});
  in.anchor = randn({b, c, 1, g.anchor_h, g.anchor_w});
  if (g.k > 1) in.clean = randn({b, c, (g.k - 1) * g.f, g.h, g.w});
  in.noised = randn({b, c, g.k * g.f, g.h, g.w});
  in.timesteps = torch::rand({b, g.k}, gen, torch::kFloat32);
  in.frames_per_chunk = g.f;
  return in;
}

}  // namespace praxis::wire
