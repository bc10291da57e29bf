#include "model/random_weights.h"

#include <cmath>
#include <string>

#include "absl/strings/match.h"
#include "model/checkpoint.h"

namespace praxis::model {

TensorMap RandomWeights(const BackboneConfig& config, uint64_t seed) {
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  TensorMap out;
  for (const auto& [name, spec] : ExpectedParameters(config)) {
    const auto opts = torch::TensorOptions().dtype(torch::kFloat32);
    torch::Tensor t;
    if (absl::EndsWith(name, ".phases")) {
      t = torch::rand(spec.shape, gen, opts);
    } else if (absl::EndsWith(name, ".freqs")) {
      t = torch::randn(spec.shape, gen, opts);
    } else if (spec.shape.size() == 1 || absl::EndsWith(name, "registers")) {
      t = 0.1 * torch::randn(spec.shape, gen, opts);  // norms, biases, expert bias, registers
    } else {
      // nn.Linear weights are [out, in]; the fused expert weights are [..., in, out].
      const bool in_first = absl::EndsWith(name, "gate_up") || absl::EndsWith(name, "down") ||
                            (absl::EndsWith(name, "_weight") && absl::StrContains(name, "routed"));
      const int64_t fan_in = in_first ? spec.shape[spec.shape.size() - 2] : spec.shape.back();
      t = torch::randn(spec.shape, gen, opts) / std::sqrt(static_cast<double>(fan_in));
    }
    out.emplace(name, t.to(spec.dtype));
  }
  return out;
}

}  // namespace praxis::model
